"""`gpuscope install claude|cursor`: register the MCP server with a host and copy the skills.

Claude Code: through `claude mcp add` when `claude` is on PATH, else by merging the JSON file
Claude Code reads (`<project>/.mcp.json` for project scope, `~/.claude.json` for user scope).
Cursor: merge `<project>/.cursor/mcp.json`. Every merge keeps the user's other servers and keys,
is idempotent, and refuses to touch a file that is not valid JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuscope.tools.model.errors import ProfileError

SERVER_NAME = "gpuscope"


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


def install_claude(scope: str = "project", project: str | Path = ".", claude: str | None = None) -> list[str]:
    if scope not in ("project", "user"):
        raise ProfileError("--scope must be project or user.")
    project = Path(project).expanduser().resolve()
    if scope == "project" and not project.is_dir():
        raise ProfileError(f"Project directory {project} does not exist.")
    cmd = server_command()
    claude = claude if claude is not None else shutil.which("claude")
    lines: list[str] = []
    config = project / ".mcp.json" if scope == "project" else Path.home() / ".claude.json"
    if claude:
        if scope == "project" and config.exists():
            _read_json(config)  # `claude mcp add` would fail or clobber; say why first
        # Remove our own earlier registration (if any) so `add` is idempotent; other servers are untouched.
        subprocess.run([claude, "mcp", "remove", "--scope", scope, SERVER_NAME], cwd=project if project.is_dir() else Path.home(),
                       capture_output=True, text=True, timeout=60)
        add = [claude, "mcp", "add", "--scope", scope, SERVER_NAME, "--", cmd, "serve"]
        res = subprocess.run(add, cwd=project if project.is_dir() else Path.home(), capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise ProfileError(f"`{' '.join(add)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
        lines.append(f"ran: {' '.join(add)}  (in {project})")
    else:
        lines.append(merge_server(config, {"type": "stdio", "command": cmd, "args": ["serve"], "env": {}}))
        lines.append("(`claude` not on PATH: wrote the configuration file directly)")
    dest = project / ".claude" / "skills" if scope == "project" else Path.home() / ".claude" / "skills"
    lines += copy_skills(dest)
    return lines


def install_cursor(project: str | Path = ".") -> list[str]:
    project = Path(project).expanduser().resolve()
    if not project.is_dir():
        raise ProfileError(f"Project directory {project} does not exist.")
    return [merge_server(project / ".cursor" / "mcp.json", {"command": server_command(), "args": ["serve"]})]


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
                   help="Claude Code scope: project (.mcp.json in --project) or user (default project)")
    p.add_argument("--project", default=".", help="project directory (default: current directory)")


def run_cli(args) -> None:
    if args.host == "claude":
        lines = install_claude(args.scope, args.project)
    else:
        lines = install_cursor(args.project)
    print("\n".join(lines))
