"""`gpuscope install claude|cursor`: register the MCP server with a host and copy the skills.

Claude Code: through `claude mcp add-json` when `claude` is on PATH, else by merging the JSON file
Claude Code reads (`<project>/.mcp.json` for project scope, `~/.claude.json` for user scope).
Cursor: merge `<project>/.cursor/mcp.json` (or `~/.cursor/mcp.json`) and copy the skills into the
`skills/` folder beside it. Every merge keeps the user's other servers and keys, is idempotent, and
refuses to touch a file that is not valid JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from gpuscope.tools.model.errors import ProfileError

SERVER_NAME = "gpuscope"
CLAUDE_TIMEOUT_S = 60  # per `claude mcp ...` call


def server_command() -> str:
    """Absolute path of this environment's `gpuscope` console script."""
    here = Path(sys.executable).parent / "gpuscope"
    if here.exists():
        return str(here.absolute())
    found = shutil.which("gpuscope")
    if found:
        return str(Path(found).absolute())
    raise ProfileError("Cannot find the `gpuscope` console script next to this Python; run `make install` first.")


def skills_source() -> Path:
    return Path(__file__).resolve().parent.parent / "skills"


def merge_server(path: Path, entry: dict, key: str = "mcpServers") -> str:
    """Set `<key>.gpuscope = entry` in the JSON file at `path`, keeping everything else. Returns what happened."""
    data = _read_json(path) if path.exists() else {}
    if data is None:
        data = {}
    elif not isinstance(data, dict) or not isinstance(data.get(key, {}), dict):
        raise ProfileError(f"{path} does not hold a JSON object with an object `{key}`; refusing to overwrite it.")
    servers = data.setdefault(key, {})
    if servers.get(SERVER_NAME) == entry:
        return f"{path}: {SERVER_NAME} already registered (unchanged)"
    verb = "updated" if SERVER_NAME in servers else "added"
    servers[SERVER_NAME] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".gpuscope-tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return f"{path}: {SERVER_NAME} {verb}"


def copy_skills(dest: Path) -> list[str]:
    src = skills_source()
    names = sorted(d.name for d in src.iterdir() if (d / "SKILL.md").is_file()) if src.is_dir() else []
    if not names:
        return [f"no skills found under {src} (nothing copied)"]
    for name in names:
        shutil.copytree(src / name, dest / name, dirs_exist_ok=True)
    return [f"skills copied to {dest}: {', '.join(names)}"]


def _run_claude(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a `claude mcp ...` command with no stdin and a time limit; a hang or a missing binary is a clear error."""
    hint = ("Run the command yourself, or rerun `gpuscope install claude` with --no-claude-cli to write the "
            "configuration file directly.")
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as exc:
        raise ProfileError(f"Cannot run `{argv[0]}`: {exc.strerror or exc}. {hint}") from None
    try:
        out, err = proc.communicate(timeout=CLAUDE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Kill the whole process group: a child holding our pipes open would otherwise block us forever.
        try:
            if hasattr(os, "killpg"):
                os.killpg(proc.pid, signal.SIGKILL)
            else:  # pragma: no cover - Windows
                proc.kill()
        except ProcessLookupError:
            pass
        proc.communicate()
        raise ProfileError(f"`{' '.join(argv)}` did not finish within {CLAUDE_TIMEOUT_S} s and was stopped (is "
                           f"`claude` waiting for a login, an update or a prompt?). {hint}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def claude_entry(cmd: str) -> dict:
    """Our server's entry in a Claude Code config. alwaysLoad: since 2.1.144 headless sessions (`claude -p`, the SDK)
    wait only ~2 s for stdio servers before the first turn, and gpuscope imports DuckDB, numpy and pandas before it
    can list its tools (2.5 s on a quiet 2-core machine): without it a first prompt often runs with no gpuscope tool.
    alwaysLoad makes Claude Code wait for the server (up to its 5 s connect limit) and list our tools up front."""
    return {"type": "stdio", "command": cmd, "args": ["serve"], "env": {}, "alwaysLoad": True}


def install_claude(scope: str = "project", project: str | Path = ".", claude: str | None = None,
                   use_cli: bool = True) -> list[str]:
    if scope not in ("project", "user"):
        raise ProfileError("--scope must be project or user.")
    project = Path(project).expanduser().resolve()
    if scope == "project" and not project.is_dir():
        raise ProfileError(f"Project directory {project} does not exist.")
    cmd = server_command()
    if not use_cli:
        claude = None
    elif claude is None:
        claude = shutil.which("claude")
    lines: list[str] = []
    config = project / ".mcp.json" if scope == "project" else Path.home() / ".claude.json"
    note = "(`claude` not on PATH: wrote the configuration file directly)" if use_cli \
        else "(--no-claude-cli: wrote the configuration file directly)"
    if claude and scope == "project" and config.exists():
        data = _read_json(config)  # `claude mcp add` would fail or clobber an unparsable file; say why first
        if isinstance(data, dict) and set(data) - {"mcpServers"}:
            # `claude mcp add --scope project` (2.1) rewrites .mcp.json with mcpServers only: merge it ourselves.
            claude = None
            note = f"(`claude mcp add` would drop the other top-level keys of {config.name}: merged it directly)"
    if claude:
        # Remove our own earlier registration (if any) so `add` is idempotent; other servers are untouched.
        cwd = project if project.is_dir() else Path.home()
        _run_claude([claude, "mcp", "remove", "--scope", scope, SERVER_NAME], cwd)
        add = [claude, "mcp", "add-json", "--scope", scope, SERVER_NAME, json.dumps(claude_entry(cmd))]
        res = _run_claude(add, cwd)
        if res.returncode != 0:
            raise ProfileError(f"`{' '.join(add)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
        lines.append(f"ran: {' '.join(add)}" + (f"  (in {project})" if scope == "project" else ""))
    else:
        lines.append(merge_server(config, claude_entry(cmd)))
        lines.append(note)
    dest = project / ".claude" / "skills" if scope == "project" else Path.home() / ".claude" / "skills"
    lines += copy_skills(dest)
    return lines


def install_cursor(project: str | Path = ".", scope: str = "project") -> list[str]:
    """Cursor reads `.cursor/mcp.json` and Agent Skills in `.cursor/skills/` (project), or both under `~/.cursor` (user)."""
    if scope not in ("project", "user"):
        raise ProfileError("--scope must be project or user.")
    base = Path.home() / ".cursor"
    if scope == "project":
        project = Path(project).expanduser().resolve()
        if not project.is_dir():
            raise ProfileError(f"Project directory {project} does not exist.")
        base = project / ".cursor"
    lines = [merge_server(base / "mcp.json", {"command": server_command(), "args": ["serve"]})]
    return lines + copy_skills(base / "skills")


def _read_json(path: Path) -> object:
    """The JSON in `path` (None when the file is blank); a file we cannot parse is refused, never overwritten."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path} is not UTF-8 text ({exc.reason}); refusing to touch it. Fix or move it first.") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON ({exc}); refusing to touch it. Fix or move it first.") from None


# -- CLI glue (wired in server/cli.py) --

def add_arguments(p) -> None:
    p.add_argument("host", choices=["claude", "cursor"], help="which MCP host to register with")
    p.add_argument("--scope", choices=["project", "user"], default="project",
                   help="project (files in --project) or user (your home: ~/.claude.json, ~/.cursor); default project")
    p.add_argument("--project", default=".", help="project directory (default: current directory)")
    p.add_argument("--no-claude-cli", dest="use_cli", action="store_false",
                   help="Claude Code: merge the JSON file directly even when `claude` is on PATH")


def run_cli(args) -> None:
    if args.host == "claude":
        lines = install_claude(args.scope, args.project, use_cli=getattr(args, "use_cli", True))
    else:
        lines = install_cursor(args.project, args.scope)
    print("\n".join(lines))
