"""list_traces: the profiles under a folder, with format, size and a one-line description."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from ..model.detect import FORMAT_NAMES, detect
from ..model.errors import ProfileError, shown_path
from .common import ToolResult

CANDIDATE_SUFFIXES = (".sqlite", ".db", ".rpd", ".json", ".gz", ".nsys-rep", ".qdrep")
MAX_SCAN = 5000


class TraceEntry(BaseModel):
    path: str
    format: str | None = Field(description="nsys | rocpd | rpd | kineto | nsys-rep; null when not a readable profile")
    size_bytes: int
    summary: str = Field(description="one line: what the file is, or why it cannot be read")


class ListTracesResult(ToolResult):
    folder: str
    traces: list[TraceEntry]
    skipped: int = Field(description="candidate files that are not profiles gpuscope reads")
    truncated: bool
    hint: str | None = None


def list_traces(path: str, limit: int = 100, recursive: bool = True) -> ListTracesResult:
    try:
        root = Path(path).expanduser().resolve()
        exists = root.exists()
    except (OSError, RuntimeError, ValueError) as exc:
        # a parent folder that cannot be entered, a symbolic link loop (RuntimeError), a NUL byte in the
        # path (ValueError), ~user for a user that does not exist (RuntimeError)
        raise ProfileError(f"cannot look at {shown_path(path)}: {getattr(exc, 'strerror', None) or exc}. "
                           "Pass a folder you can read.") from None
    if not exists:
        raise ProfileError(f"No such folder: {shown_path(root)}. Pass a folder that holds profiles.")
    files = [root] if root.is_file() else _candidates(root, recursive)
    entries, skipped = [], 0
    for f in files:
        try:
            found = detect(f)
            summary = ("Nsight Systems report; gpuscope exports it to SQLite with nsys when nsys is installed"
                       if found.format == "nsys-rep" else FORMAT_NAMES.get(found.format, found.format))
            entries.append(TraceEntry(path=str(f), format=found.format, size_bytes=f.stat().st_size,
                                      summary=summary + _peek(f, found.format)))
        except ProfileError as exc:
            skipped += 1
            if root.is_file():
                entries.append(TraceEntry(path=str(f), format=None, size_bytes=f.stat().st_size, summary=str(exc)))
    entries.sort(key=lambda e: e.path)
    limit = max(1, min(int(limit), 500))
    # The scan stops at MAX_SCAN candidate files; say so rather than present a partial list as whole.
    scan_capped = len(files) >= MAX_SCAN
    truncated = len(entries) > limit or scan_capped
    hint = None
    if scan_capped:
        hint = f"the scan stopped after {MAX_SCAN} candidate files, so more profiles may exist; list a sub-folder"
    elif truncated:
        hint = f"{len(entries)} profiles found; raise limit or list a sub-folder"
    return ListTracesResult(folder=str(root), traces=entries[:limit], skipped=skipped, truncated=truncated, hint=hint)


def _candidates(root: Path, recursive: bool) -> list[Path]:
    out: list[Path] = []
    try:
        # Listed up front in both modes: os.walk skips a folder it cannot read without a word, which
        # would present an unreadable folder as one without profiles.
        top = os.listdir(root)
        walker = os.walk(root) if recursive else [(str(root), [], top)]
    except OSError as exc:
        raise ProfileError(f"cannot list {root}: {exc.strerror or exc}. Pass a folder you can read.") from None
    for folder, dirs, names in walker:
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__", ".venv")]
        for n in names:
            if n.endswith(CANDIDATE_SUFFIXES) and not n.endswith((".tar.gz",)):
                out.append(Path(folder) / n)
                if len(out) >= MAX_SCAN:
                    return out
    return out


def _peek(path: Path, fmt: str) -> str:
    """A cheap content hint without loading the profile (counts come from trace_info). Only real tables are
    counted: a profile's views are SQL written by whoever made the file (rocpd's per-process tables are summed)."""
    if fmt not in ("nsys", "rocpd", "rpd"):
        return ""
    import sqlite3

    from ..model.detect import ROCPD_SUFFIXED
    from ..model.quote import quote_ident
    from ..model.sqlite_source import connect_readonly, readable_tables

    target, what = {"nsys": ("CUPTI_ACTIVITY_KIND_KERNEL", "kernels"), "rocpd": ("rocpd_kernel_dispatch", "kernel dispatches"),
                    "rpd": ("rocpd_op", "GPU ops")}[fmt]
    try:
        con = connect_readonly(path)
        try:
            tables = [t for t in readable_tables(con)
                      if t == target or ((m := ROCPD_SUFFIXED.fullmatch(t)) is not None and m.group(1) == target)]
            if not tables:
                return f", no {what} table"
            n = sum(con.execute(f"SELECT count(*) FROM {quote_ident(t)}").fetchone()[0] for t in tables)
        finally:
            con.close()
        return f", {n} {what}"
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # SQLite's message on a damaged page may not decode
        return f", {what} not counted ({exc}); trace_info reports what can be read"
