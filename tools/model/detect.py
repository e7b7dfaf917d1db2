"""Format detection by content fingerprint (never by file extension alone)."""

from __future__ import annotations

import errno
import gzip
import os
import re
import sqlite3
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import ProfileError, shown_path
from .quote import quote_ident
from .sqlite_source import connect_readonly, readable_tables

SQLITE_MAGIC = b"SQLite format 3\x00"
# rocpd's physical tables carry a per-process UUID suffix: rocpd_kernel_dispatch_0191e7b2_3c4d_7a8b_9c0d_123456789abc.
ROCPD_SUFFIXED = re.compile(r"(rocpd_[a-z_]+?)_[0-9a-fA-F]{8}_[0-9a-fA-F]{4}_[0-9a-fA-F]{4}_[0-9a-fA-F]{4}_[0-9a-fA-F]{12}")


def unsuffixed(name: str) -> str:
    """A rocpd table's name without its process's UUID suffix (rocpd_string_<uuid> -> rocpd_string); others as they are."""
    m = ROCPD_SUFFIXED.fullmatch(name)
    return m.group(1) if m else name
GZIP_MAGIC = b"\x1f\x8b"


def gzip_isize(fh) -> int:
    """ISIZE, the last 4 bytes of a gzip file open in `fh`: what its last member decompresses to, modulo 4 GiB (all a
    trailer states; a file shorter than 4 bytes gives what it has). Leaves `fh` at its start."""
    fh.seek(max(os.fstat(fh.fileno()).st_size - 4, 0))
    isize = int.from_bytes(fh.read(4), "little")
    fh.seek(0)
    return isize

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


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))
MAX_PATH_CHARS = 4096


def user_path(path: str | Path) -> Path:
    """The path as the user wrote it with `~` expanded, or a ProfileError for text no file system can hold
    (empty, a NUL, thousands of characters) or a `~user` this machine does not know."""
    text = str(path)
    if not text.strip():
        raise ProfileError("No profile path given. Pass the path of a .sqlite, .db/.rpd or .json(.gz) profile.")
    if "\x00" in text:
        shown = shown_path(text.replace("\x00", "\\x00"))
        raise ProfileError(f"The path {shown} contains a NUL character, which no file name can hold. "
                           "Pass the profile's path as text.")
    if len(text) > MAX_PATH_CHARS:
        raise ProfileError(f"The path is {len(text)} characters long ({shown_path(text)}); no file system accepts paths over "
                           f"{MAX_PATH_CHARS}. Pass the profile's real path.")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~name of no known user, or no home folder at all
        user = text[1:].split("/", 1)[0]
        raise ProfileError(f"{shown_path(text)} starts with ~{user}, but this machine knows no home folder "
                           f"{'of user ' + repr(user) if user else 'for the current user'}. Pass the full path.") from None


def regular_file(path: str | Path) -> Path:
    """The resolved path of a regular file, or a ProfileError saying what the path is instead.

    Checked before anything opens the file: reading a FIFO blocks for ever, a device never ends,
    and a symlink loop makes path resolution fail deep inside a library."""
    text = str(path)
    expanded = user_path(text)
    try:
        resolved = expanded.resolve(strict=True)
        st = os.stat(resolved)
    except RuntimeError:  # Python < 3.13 reports a symlink loop this way
        raise ProfileError(f"{shown_path(text)} is a symbolic link that loops back on itself. Pass the profile's real path.") from None
    except FileNotFoundError:
        dangling = os.path.lexists(text)
        raise ProfileError(f"{'The symbolic link ' if dangling else 'No such file: '}{shown_path(text)}"
                           f"{' points to a file that does not exist' if dangling else ''}. Check the path; "
                           "list_traces(folder) shows the profiles in a folder.") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProfileError(f"{shown_path(text)} is a symbolic link that loops back on itself. Pass the profile's real path.") from None
        raise ProfileError(f"Cannot read {shown_path(text)}: {exc.strerror or exc}. Check the path and its permissions.") from None
    if stat.S_ISDIR(st.st_mode):
        raise ProfileError(f"{shown_path(resolved)} is a folder, not a profile. Call list_traces on it to see the profiles in it.")
    for test, what in _KINDS:
        if test(st.st_mode):
            raise ProfileError(f"{shown_path(resolved)} is {what}, not a regular file; gpuscope reads profiles only from regular "
                               "files. Copy the profile to a file and pass that path.")
    if not stat.S_ISREG(st.st_mode):
        raise ProfileError(f"{shown_path(resolved)} is not a regular file. Pass the path of a profile file.")
    return resolved


def read_head(path: Path, n: int) -> bytes:
    """The first n bytes, opened so that a file swapped for a FIFO after the check cannot block."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(f"{shown_path(path)} is not a regular file; gpuscope reads profiles only from regular files.")
        return os.read(fd, n)
    finally:
        os.close(fd)


def detect(path: Path) -> Detected:
    """Identify a profile file, or raise ProfileError saying what it is and what to do."""
    path = regular_file(path)
    try:
        head = read_head(path, 64)
    except OSError as exc:
        raise ProfileError(f"Cannot read {shown_path(path)}: {exc.strerror}. Check the path and its permissions.") from None
    if not head:
        raise ProfileError(f"{shown_path(path)} is empty (0 bytes). Re-capture or re-export the profile.")
    if head.startswith(SQLITE_MAGIC):
        return Detected(_sqlite_format(path))
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as fh:
                inner = _json_start(fh.read, path)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(f"{shown_path(path)} is a corrupt or truncated gzip file ({exc}). Copy the trace again.") from None
        if inner is not None:
            return _kineto(path, inner, compressed=True)
        raise ProfileError(f"{shown_path(path)} is gzip-compressed but does not contain JSON; gpuscope reads gzipped PyTorch profiler traces (.json.gz). "
                           "Check what it holds (`gunzip -c FILE | head -c 200`) and pass the profile itself.")
    if head.removeprefix(UTF8_BOM).lstrip(JSON_WS)[:1] in (b"", b"{", b"["):
        try:
            with open(path, "rb") as fh:
                start = _json_start(fh.read, path)
        except OSError as exc:
            raise ProfileError(f"Cannot read {shown_path(path)}: {exc.strerror}. Check the path and its permissions.") from None
        if start is not None:
            return _kineto(path, start, compressed=False)
    if path.suffix in (".nsys-rep", ".qdrep"):
        return Detected("nsys-rep")
    raise ProfileError(
        f"{shown_path(path)} is not a profile gpuscope can read. Supported: Nsight Systems SQLite exports "
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
            raise ProfileError(f"{shown_path(path)} holds nothing but whitespace: it is not a profile. Re-capture or re-export the trace.")
        skipped += len(chunk)
        if skipped > JSON_LEAD_MAX:
            raise ProfileError(f"{shown_path(path)} starts with more than {JSON_LEAD_MAX >> 20} MiB of whitespace, so it is not a profile "
                               "gpuscope reads. Remove the leading blank space, or export the trace again.")
        chunk = read(JSON_PEEK)
    if body[:1] not in (b"{", b"["):
        return None
    return body + read(JSON_PEEK - len(body)) if len(body) < JSON_PEEK else body
KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')


def _kineto(path: Path, start: bytes, compressed: bool) -> Detected:
    """A JSON file is taken for a Kineto trace when its first MiB names a Kineto key (or is too big to tell),
    or is the Chrome trace format's bare array of events (objects with a "ph" phase key)."""
    bare_events = start.startswith(b"[") and re.match(rb'\[\s*\{[^{}]*"ph"\s*:', start) is not None
    if any(k in start for k in KINETO_KEYS) or bare_events or len(start) >= JSON_PEEK:
        return Detected("kineto", compressed=compressed)
    raise ProfileError(f"{shown_path(path)} is JSON but not a PyTorch profiler trace (no traceEvents). Export one with "
                       "torch.profiler's `prof.export_chrome_trace('trace.json')` or on_trace_ready=tensorboard_trace_handler.")


def _sqlite_format(path: Path) -> str:
    try:
        conn = connect_readonly(path)
        try:
            names = set(readable_tables(conn))
            version = None
            meta = sorted(n for n in names if n == "rocpd_metadata" or n.startswith("rocpd_metadata_"))
            if meta:
                try:
                    row = conn.execute(f"SELECT value FROM {quote_ident(meta[0])} WHERE tag='schema_version'").fetchone()
                    version = str(row[0]) if row else None
                except sqlite3.Error:
                    version = None
        finally:
            conn.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        # A damaged schema page makes SQLite's own error message carry raw bytes, which Python fails to decode.
        raise ProfileError(f"{shown_path(path)} looks like SQLite but cannot be read ({exc}); it may be truncated or corrupt. Re-export it.") from None
    if "StringIds" in names and any(n.startswith(("CUPTI_", "NVTX_EVENTS", "TARGET_INFO_", "OSRT_API")) for n in names):
        return "nsys"
    rocpd = {unsuffixed(n) for n in names}
    if "rocpd_kernel_dispatch" in rocpd and version is not None and version.split(".")[0] in ("3", "4"):
        return "rocpd"
    if "rocpd_op" in names and "rocpd_api" in names:
        return "rpd"
    if "rocpd_kernel_dispatch" in rocpd or "rocpd_string" in rocpd:
        raise ProfileError(
            f"{shown_path(path)} has rocpd tables but no rocpd_metadata schema_version 3 (found {version!r}); it looks like a "
            "partial or hand-made database. Re-run rocprofv3 with `--output-format rocpd`."
        )
    if "KERN" in names:
        raise ProfileError(f"{shown_path(path)} is a rocprof v1/v2 results.db, which gpuscope does not read. Re-profile with `rocprofv3 --sys-trace --output-format rocpd`.")
    if {"HIP", "OPS", "STR_TABLE"} <= names:
        raise ProfileError(f"{shown_path(path)} is a Hygon hipprof database, which gpuscope does not read.")
    if "StringIds" in names:
        raise ProfileError(f"{shown_path(path)} is an Nsight Systems export without any CUDA, NVTX or OS-runtime tables: there is nothing to analyse. Re-capture with `nsys profile -t cuda,nvtx,osrt`.")
    raise ProfileError(
        f"{shown_path(path)} is a SQLite database but not a profile gpuscope knows (no Nsight StringIds/CUPTI tables, no rocpd "
        "tables). Pass an Nsight Systems export (`nsys export --type sqlite report.nsys-rep`) or a rocprofv3 database "
        "(`rocprofv3 --sys-trace --output-format rocpd`)."
    )
