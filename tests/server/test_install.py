"""`gpuscope install claude|cursor`: JSON merge path (no `claude` on PATH), idempotent, keeps user servers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuscope.server import install
from gpuscope.server.cli import main

REPO = Path(__file__).resolve().parents[2]
USER = {"mcpServers": {"mine": {"command": "/usr/bin/my-server", "args": ["--x"]}}, "other": {"keep": True}}


def _run_cli(argv, project: Path, monkeypatch, capsys) -> str:
    monkeypatch.setenv("PATH", str(project / "empty-bin"))  # no `claude` here
    main(["install", *argv, "--project", str(project)])
    return capsys.readouterr().out


def test_claude_project_merge_twice(tmp_path, monkeypatch, capsys):
    (tmp_path / ".mcp.json").write_text(json.dumps(USER))
    out1 = _run_cli(["claude"], tmp_path, monkeypatch, capsys)
    first = (tmp_path / ".mcp.json").read_text()
    out2 = _run_cli(["claude", "--scope", "project"], tmp_path, monkeypatch, capsys)
    assert "added" in out1 and "unchanged" in out2 and "not on PATH" in out1
    data = json.loads((tmp_path / ".mcp.json").read_text())
    assert (tmp_path / ".mcp.json").read_text() == first
    assert data["mcpServers"]["mine"] == USER["mcpServers"]["mine"] and data["other"] == {"keep": True}
    entry = data["mcpServers"]["gpuscope"]
    assert entry["args"] == ["serve"] and Path(entry["command"]).is_absolute() and entry["command"].endswith("gpuscope")
    assert entry["alwaysLoad"] is True  # headless sessions wait for the server instead of starting without it
    skills = sorted(p.name for p in (REPO / "skills").iterdir() if (p / "SKILL.md").is_file())
    for name in skills:
        assert (tmp_path / ".claude" / "skills" / name / "SKILL.md").is_file()


def test_claude_user_scope_merges_claude_json(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({"numStartups": 3, "mcpServers": {"mine": {"command": "x"}}}))
    monkeypatch.setenv("HOME", str(home))
    _run_cli(["claude", "--scope", "user"], tmp_path, monkeypatch, capsys)
    _run_cli(["claude", "--scope", "user"], tmp_path, monkeypatch, capsys)
    data = json.loads((home / ".claude.json").read_text())
    assert data["numStartups"] == 3 and set(data["mcpServers"]) == {"mine", "gpuscope"}
    assert not (tmp_path / ".mcp.json").exists()


def test_cursor_merge_twice(tmp_path, monkeypatch, capsys):
    (tmp_path / ".cursor").mkdir()
    (tmp_path / ".cursor" / "mcp.json").write_text(json.dumps(USER))
    _run_cli(["cursor"], tmp_path, monkeypatch, capsys)
    out = _run_cli(["cursor"], tmp_path, monkeypatch, capsys)
    assert "unchanged" in out
    data = json.loads((tmp_path / ".cursor" / "mcp.json").read_text())
    assert set(data["mcpServers"]) == {"mine", "gpuscope"} and data["other"] == {"keep": True}
    assert data["mcpServers"]["gpuscope"]["args"] == ["serve"]


def test_cursor_fresh_project(tmp_path, monkeypatch, capsys):
    _run_cli(["cursor"], tmp_path, monkeypatch, capsys)
    assert set(json.loads((tmp_path / ".cursor" / "mcp.json").read_text())["mcpServers"]) == {"gpuscope"}
    # Cursor reads Agent Skills from .cursor/skills: the same files as the repository's skills/.
    src = Path(__file__).resolve().parents[2] / "skills"
    for name in ("perf-analysis", "trace-analysis", "remote-slurm", "profile-capture"):
        assert (tmp_path / ".cursor" / "skills" / name / "SKILL.md").read_bytes() == (src / name / "SKILL.md").read_bytes()


def test_cursor_user_scope(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / ".cursor").mkdir(parents=True)
    (home / ".cursor" / "mcp.json").write_text(json.dumps(USER))
    monkeypatch.setenv("HOME", str(home))
    for _ in range(2):
        _run_cli(["cursor", "--scope", "user"], tmp_path, monkeypatch, capsys)
    data = json.loads((home / ".cursor" / "mcp.json").read_text())
    assert set(data["mcpServers"]) == {"mine", "gpuscope"} and data["other"] == {"keep": True}
    assert (home / ".cursor" / "skills" / "trace-analysis" / "SKILL.md").is_file()
    assert not (tmp_path / ".cursor").exists()


@pytest.mark.parametrize("host,rel", [("claude", ".mcp.json"), ("cursor", ".cursor/mcp.json")])
def test_invalid_json_refused_and_untouched(tmp_path, monkeypatch, capsys, host, rel):
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        _run_cli([host], tmp_path, monkeypatch, capsys)
    assert exc.value.code == 2
    assert "not valid JSON" in capsys.readouterr().err and path.read_text() == "{not json"


@pytest.mark.parametrize("content,says", [(b"\xff\xfe{}", "not UTF-8"), (b"[1]", "does not hold a JSON object")])
def test_unusable_config_refused_and_untouched(tmp_path, monkeypatch, capsys, content, says):
    path = tmp_path / ".cursor" / "mcp.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        _run_cli(["cursor"], tmp_path, monkeypatch, capsys)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err and path.read_bytes() == content


def test_claude_on_path_is_used(tmp_path, monkeypatch):
    """With a (fake) `claude` on PATH, install runs `claude mcp remove` then `claude mcp add-json --scope project` (add
    cannot set alwaysLoad)."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "claude"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(0o755)
    lines = install.install_claude("project", tmp_path, claude=str(fake))
    calls = log.read_text().splitlines()
    assert calls[0] == "mcp remove --scope project gpuscope"
    assert calls[1].startswith("mcp add-json --scope project gpuscope {")
    entry = json.loads(calls[1].split(" gpuscope ", 1)[1])
    assert entry["args"] == ["serve"] and entry["command"].endswith("gpuscope") and entry["alwaysLoad"] is True
    assert lines[0].startswith("ran:")


def _fake_claude(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "bin" / "claude"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)
    return fake


def test_claude_hang_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """A `claude` that never returns (login prompt, update, ...) is stopped, with its children, and explained."""
    fake = _fake_claude(tmp_path, "sleep 30 &\nsleep 30\n")  # the background child keeps the pipes open
    monkeypatch.setattr(install, "CLAUDE_TIMEOUT_S", 1)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["install", "claude", "--project", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "did not finish within 1 s" in err and "--no-claude-cli" in err and "Traceback" not in err
    assert not (tmp_path / ".mcp.json").exists()


def test_claude_failure_and_missing_binary_are_clear(tmp_path):
    fake = _fake_claude(tmp_path, 'case "$2" in add-json) echo "boom: no such scope" >&2; exit 3;; esac\n')
    with pytest.raises(install.ProfileError, match="failed \\(3\\): boom"):
        install.install_claude("project", tmp_path, claude=str(fake))
    with pytest.raises(install.ProfileError, match="Cannot run"):
        install.install_claude("project", tmp_path, claude=str(tmp_path / "no-such-claude"))


def test_no_claude_cli_merges_even_with_claude_on_path(tmp_path, monkeypatch, capsys):
    log = tmp_path / "calls.log"
    fake = _fake_claude(tmp_path, f'echo "$@" >> {log}\n')
    (tmp_path / ".mcp.json").write_text(json.dumps(USER))
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    for _ in range(2):
        main(["install", "claude", "--no-claude-cli", "--project", str(tmp_path)])
    out = capsys.readouterr().out
    assert not log.exists() and "--no-claude-cli" in out and "unchanged" in out
    data = json.loads((tmp_path / ".mcp.json").read_text())
    assert set(data["mcpServers"]) == {"mine", "gpuscope"} and data["other"] == {"keep": True}


def test_user_scope_copies_skills_to_home(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    project = tmp_path / "proj"
    project.mkdir()
    _run_cli(["claude", "--scope", "user"], project, monkeypatch, capsys)
    assert (home / ".claude" / "skills" / "remote-slurm" / "SKILL.md").is_file()
    assert not (project / ".claude").exists() and not (project / ".mcp.json").exists()


def test_malformed_claude_project_file_refused_before_running_claude(tmp_path):
    log = tmp_path / "calls.log"
    fake = _fake_claude(tmp_path, f'echo "$@" >> {log}\n')
    (tmp_path / ".mcp.json").write_text("{oops")
    with pytest.raises(install.ProfileError, match="not valid JSON"):
        install.install_claude("project", tmp_path, claude=str(fake))
    assert not log.exists() and (tmp_path / ".mcp.json").read_text() == "{oops"


@pytest.mark.skipif(shutil.which("claude") is None, reason="Claude Code (`claude`) not installed")
@pytest.mark.parametrize("scope,extra_keys,says", [
    ("project", False, "ran: "), ("user", True, "ran: "),
    # `claude mcp add --scope project` rewrites .mcp.json with mcpServers only, so install merges it itself.
    ("project", True, "would drop the other top-level keys"),
])
def test_real_claude_twice_keeps_user_servers(tmp_path, monkeypatch, capsys, scope, extra_keys, says):
    """Through the real `claude`, in a throw-away HOME: twice, valid JSON, the user's servers and keys kept."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    project = tmp_path / "proj"
    project.mkdir()
    config = project / ".mcp.json" if scope == "project" else home / ".claude.json"
    user = USER if extra_keys else {"mcpServers": USER["mcpServers"]}
    config.write_text(json.dumps(user))
    for _ in range(2):
        main(["install", "claude", "--scope", scope, "--project", str(project)])
    assert says in capsys.readouterr().out
    data = json.loads(config.read_text())
    assert data["mcpServers"]["mine"] == USER["mcpServers"]["mine"] and data.get("other") == user.get("other")
    assert data["mcpServers"]["gpuscope"]["args"] == ["serve"]
    assert data["mcpServers"]["gpuscope"]["command"] == install.server_command()
    skills = (project if scope == "project" else home) / ".claude" / "skills"
    assert (skills / "trace-analysis" / "SKILL.md").is_file()
