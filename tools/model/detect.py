"""Format detection by content fingerprint (never by file extension alone)."""

from __future__ import annotations

import gzip
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import ProfileError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"

# What each format is called in outputs.
FORMAT_NAMES = {
    "nsys": "Nsight Systems SQLite export",
    "rocpd": "rocprofv3 rocpd database",
    "rpd": "legacy rocmProfileData (RPD) database",
    "kineto": "PyTorch profiler (Kineto) trace",
}


@dataclass(frozen=True)
class Detected:
    format: str          # 'nsys' | 'rocpd' | 'rpd' | 'kineto'
    compressed: bool = False  # gzip-compressed JSON


def detect(path: Path) -> Detected:
    """Identify a profile file, or raise ProfileError saying what it is and what to do."""
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as exc:  # e.g. a parent folder without search permission
        raise ProfileError(f"Cannot read {path}: {exc.strerror or exc}. Check the path and its permissions.") from None
    if not exists:
        raise ProfileError(f"No such file: {path}. Pass the path of a profile; list_traces(folder) shows the profiles in a folder.")
    if is_dir:
        raise ProfileError(f"{path} is a folder, not a profile. Call list_traces('{path}') to see the profiles in it.")
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise ProfileError(f"Cannot read {path}: {exc.strerror}. Check the path and its permissions.") from None
    if not head:
        raise ProfileError(f"{path} is empty (0 bytes). Re-capture or re-export the profile.")
    if head.startswith(SQLITE_MAGIC):
        return Detected(_sqlite_format(path))
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as fh:
                inner = _json_start(fh.read, path)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(f"{path} is a corrupt or truncated gzip file ({exc}). Copy the trace again.") from None
        if inner is not None:
            return _kineto(path, inner, compressed=True)
        raise ProfileError(f"{path} is gzip-compressed but does not contain JSON; gpuscope reads gzipped PyTorch profiler traces (.json.gz).")
    if head.removeprefix(UTF8_BOM).lstrip(JSON_WS)[:1] in (b"", b"{", b"["):
        try:
            with open(path, "rb") as fh:
                start = _json_start(fh.read, path)
        except OSError as exc:
            raise ProfileError(f"Cannot read {path}: {exc.strerror}. Check the path and its permissions.") from None
        if start is not None:
            return _kineto(path, start, compressed=False)
    if path.suffix in (".nsys-rep", ".qdrep"):
        return Detected("nsys-rep")
    raise ProfileError(
        f"{path} is not a profile gpuscope can read. Supported: Nsight Systems SQLite exports "
        "(`nsys export --type sqlite report.nsys-rep`), rocprofv3 rocpd databases (`--output-format rocpd`) "
        "and PyTorch profiler traces (.json / .json.gz)."
    )


JSON_PEEK = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"
JSON_WS = b" \t\n\r"
# Whitespace accepted before a JSON document: as much as the Kineto reader's fast path reads ahead for
# the keys before traceEvents. Real traces have none; a file that is mostly blank is refused, not read on.
JSON_LEAD_MAX = 64 << 20


def _json_start(read, path: Path) -> bytes | None:
    """Up to JSON_PEEK bytes of a JSON document from its first '{' or '[' on, after an optional UTF-8
    BOM and any whitespace (skipped in JSON_PEEK chunks, at most JSON_LEAD_MAX bytes); None when the
    content starts with anything else."""
    chunk = read(JSON_PEEK).removeprefix(UTF8_BOM)
    skipped = 0
    while True:
        body = chunk.lstrip(JSON_WS)
        if body:
            break
        if not chunk:
            raise ProfileError(f"{path} holds nothing but whitespace: it is not a profile. Re-capture or re-export the trace.")
        skipped += len(chunk)
        if skipped > JSON_LEAD_MAX:
            raise ProfileError(f"{path} starts with more than {JSON_LEAD_MAX >> 20} MiB of whitespace, so it is not a profile "
                               "gpuscope reads. Remove the leading blank space, or export the trace again.")
        chunk = read(JSON_PEEK)
    if body[:1] not in (b"{", b"["):
        return None
    return body + read(JSON_PEEK - len(body)) if len(body) < JSON_PEEK else body
KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')


def _kineto(path: Path, start: bytes, compressed: bool) -> Detected:
    """A JSON file is taken for a Kineto trace when its first MiB names a Kineto key (or is too big to tell)."""
    if any(k in start for k in KINETO_KEYS) or len(start) >= JSON_PEEK:
        return Detected("kineto", compressed=compressed)
    raise ProfileError(f"{path} is JSON but not a PyTorch profiler trace (no traceEvents). Export one with "
                       "torch.profiler's `prof.export_chrome_trace('trace.json')` or on_trace_ready=tensorboard_trace_handler.")


def _sqlite_format(path: Path) -> str:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
            version = None
            if "rocpd_metadata" in names:
                try:
                    row = conn.execute("SELECT value FROM rocpd_metadata WHERE tag='schema_version'").fetchone()
                    version = str(row[0]) if row else None
                except sqlite3.Error:
                    version = None
        finally:
            conn.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        # A damaged schema page makes SQLite's own error message carry raw bytes, which Python fails to decode.
        raise ProfileError(f"{path} looks like SQLite but cannot be read ({exc}); it may be truncated or corrupt. Re-export it.") from None
    if "StringIds" in names and any(n.startswith(("CUPTI_", "NVTX_EVENTS", "TARGET_INFO_", "OSRT_API")) for n in names):
        return "nsys"
    if "rocpd_kernel_dispatch" in names and version is not None and version.split(".")[0] in ("3", "4"):
        return "rocpd"
    if "rocpd_op" in names and "rocpd_api" in names:
        return "rpd"
    if "rocpd_kernel_dispatch" in names or "rocpd_string" in names:
        raise ProfileError(
            f"{path} has rocpd tables but no rocpd_metadata schema_version 3 (found {version!r}); it looks like a "
            "partial or hand-made database. Re-run rocprofv3 with `--output-format rocpd`."
        )
    if "KERN" in names:
        raise ProfileError(f"{path} is a rocprof v1/v2 results.db, which gpuscope does not read. Re-profile with `rocprofv3 --sys-trace --output-format rocpd`.")
    if {"HIP", "OPS", "STR_TABLE"} <= names:
        raise ProfileError(f"{path} is a Hygon hipprof database, which gpuscope does not read.")
    if "StringIds" in names:
        raise ProfileError(f"{path} is an Nsight Systems export without any CUDA, NVTX or OS-runtime tables: there is nothing to analyse. Re-capture with `nsys profile -t cuda,nvtx,osrt`.")
    raise ProfileError(
        f"{path} is a SQLite database but not a profile gpuscope knows (no Nsight StringIds/CUPTI tables, no rocpd "
        "tables). Pass an Nsight Systems export (`nsys export --type sqlite report.nsys-rep`) or a rocprofv3 database "
        "(`rocprofv3 --sys-trace --output-format rocpd`)."
    )
