"""The Claude Code plugin files: valid JSON, version from the package, paths that exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.skipif(shutil.which("sh") is None or sys.platform == "win32", reason="needs a POSIX sh")
def test_root_mcp_json(tmp_path):
    """The same .mcp.json serves the installed plugin (Claude Code sets CLAUDE_PLUGIN_ROOT in the server's
    environment) and Claude Code opened inside this checkout (a project server, run from the project root). No
    ${...} placeholder: outside a plugin Claude Code would warn of a missing variable and run /.claude-plugin/..."""
    servers = json.loads((REPO / ".mcp.json").read_text())["mcpServers"]
    entry = servers["gpuscope"]
    assert entry["command"] == "sh" and "${" not in json.dumps(entry)
    assert (REPO / ".claude-plugin" / "serve.sh").is_file()
    root = tmp_path / "plugin"
    (root / ".claude-plugin").mkdir(parents=True)
    (root / ".claude-plugin" / "serve.sh").write_text('echo "launcher in $(pwd)" "$@"\n')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    as_plugin = subprocess.run(["sh", *entry["args"]], env={**env, "CLAUDE_PLUGIN_ROOT": str(root)}, cwd=tmp_path,
                               capture_output=True, text=True, timeout=30)
    as_project = subprocess.run(["sh", *entry["args"]], env=env, cwd=root, capture_output=True, text=True, timeout=30)
    assert as_plugin.stdout.strip() == f"launcher in {tmp_path}" and as_project.stdout.strip() == f"launcher in {root}"
    # The launcher prefers the venv `make install` creates at the plugin root.
    assert "VENV := .venv" in (REPO / "Makefile").read_text()
    assert '"$root/.venv/bin/gpuscope" serve' in (REPO / ".claude-plugin" / "serve.sh").read_text()


@pytest.mark.skipif(shutil.which("sh") is None or sys.platform == "win32", reason="needs a POSIX sh")
def test_launcher_uses_venv_then_path_then_explains(tmp_path):
    script = (REPO / ".claude-plugin" / "serve.sh").read_text()
    root = tmp_path / "plugin"
    (root / ".claude-plugin").mkdir(parents=True)
    (root / ".claude-plugin" / "serve.sh").write_text(script)
    env = {"PATH": os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())}
    if any((Path(p) / "gpuscope").exists() for p in env["PATH"].split(os.pathsep)):
        pytest.skip("a gpuscope is installed system-wide")
    run = lambda: subprocess.run(["sh", str(root / ".claude-plugin" / "serve.sh")], env=env, capture_output=True,
                                 text=True, timeout=30)
    res = run()  # nothing installed: a clear message, not a bare "not found"
    assert res.returncode == 127 and "make install" in res.stderr and str(root) in res.stderr
    fake = "#!/bin/sh\necho {} \"$@\"\n"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gpuscope").write_text(fake.format("from-path"))
    (bindir / "gpuscope").chmod(0o755)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    assert run().stdout.strip() == "from-path serve"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "gpuscope").write_text(fake.format("from-venv"))
    (root / ".venv" / "bin" / "gpuscope").chmod(0o755)
    assert run().stdout.strip() == "from-venv serve"
