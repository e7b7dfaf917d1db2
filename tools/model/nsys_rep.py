"""Turn an Nsight Systems report (.nsys-rep / .qdrep) into the SQLite export the reader understands.

The export goes to a per-user cache, never next to the user's file (profiles are read-only inputs);
its name carries the report's size and mtime, so an unchanged report is exported once.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from . import lifecycle
from .errors import ProfileError
from .limits import cache_root


def cache_dir() -> Path:
    return cache_root() / "exports"


def export_path(path: Path) -> Path:
    st = path.stat()
    return cache_dir() / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}.sqlite"


def _export(nsys: str, tmp: Path, path: Path) -> subprocess.CompletedProcess:
    """Run `nsys export`; the child is killed if the server stops meanwhile (lifecycle) or after an hour."""
    child = subprocess.Popen([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    unregister = lifecycle.on_shutdown(child.kill)
    try:
        out, err = child.communicate(timeout=3600)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    finally:
        unregister()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def export_nsys_rep(path: Path, progress=lambda fraction, message: None) -> Path:
    path = Path(path)
    target = export_path(path)
    if target.exists() and target.stat().st_size > 0:
        return target
    nsys = shutil.which("nsys")
    if nsys is None:
        suggested = path.with_suffix(".sqlite")
        raise ProfileError(
            f"{path} is an Nsight Systems report; gpuscope reads its SQLite export, and `nsys` is not on PATH here. "
            f"Run `nsys export --type sqlite --output {shlex.quote(str(suggested))} {shlex.quote(str(path))}` "
            f"where Nsight Systems is installed, then open {suggested}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.sqlite")  # nsys appends .sqlite unless present
    progress(0.0, f"exporting {path.name} with nsys")
    try:
        proc = _export(nsys, tmp, path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise ProfileError(f"`nsys export` could not convert {path} ({exc}). Export it manually with "
                           f"`nsys export --type sqlite --output {shlex.quote(str(target))} {shlex.quote(str(path))}`.") from None
    if proc.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ProfileError(f"`nsys export` failed on {path} (exit {proc.returncode}: {detail[0]}). The report may be truncated "
                           "or from a newer Nsight Systems than the installed `nsys`; export it with a matching version.")
    os.replace(tmp, target)
    return target
