"""The Claude Code plugin files: valid JSON, version from the package, paths that exist."""

from __future__ import annotations

import json
from pathlib import Path

from gpuscope import __version__

REPO = Path(__file__).resolve().parents[2]


def test_plugin_manifest():
    plugin = json.loads((REPO / ".claude-plugin" / "plugin.json").read_text())
    assert plugin["name"] == "gpuscope" and plugin["version"] == __version__ and plugin["description"]
    assert (REPO / plugin["skills"]).is_dir()
    assert (REPO / plugin["mcpServers"]).is_file()


def test_marketplace():
    market = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text())
    assert market["name"] and market["owner"]["name"]
    (entry,) = market["plugins"]
    assert entry["name"] == "gpuscope" and entry["version"] == __version__
    assert (REPO / entry["source"] / ".claude-plugin" / "plugin.json").is_file()


def test_root_mcp_json():
    servers = json.loads((REPO / ".mcp.json").read_text())["mcpServers"]
    entry = servers["gpuscope"]
    assert entry["command"] == "${CLAUDE_PLUGIN_ROOT}/.venv/bin/gpuscope" and entry["args"] == ["serve"]
    # `make install` creates exactly this script (the venv lives at the repo root).
    assert "VENV := .venv" in (REPO / "Makefile").read_text()
