"""Where gpuscope may write and how much memory it may use: one place for every setting.

Settings come from the environment so that an MCP host can set them in its server entry:
  GPUSCOPE_CACHE_DIR            cache folder (default $XDG_CACHE_HOME/gpuscope, else ~/.cache/gpuscope)
  GPUSCOPE_MEMORY_LIMIT         DuckDB memory of the process's analysis instance (all open profiles together) and of
                                each ingest, e.g. '4GB' (default an eighth of RAM, <= 800 MB); beyond it DuckDB spills.
                                Each instance gets one thread per 64 MiB of it, at most DuckDB's own count
  GPUSCOPE_SQL_MEMORY_LIMIT     memory of the process that runs sql_query, e.g. '2GB' (default an eighth of RAM, <= 4 GB)
  GPUSCOPE_MAX_DECOMPRESSED_GB  largest decompressed .json.gz accepted, GB (default half of RAM)
  GPUSCOPE_CACHE_GB             size of the trace-store cache before least recently used stores go, GB (default 20)
Sizes accept a plain number of bytes or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb

from .errors import ProfileError
from .quote import quote_literal

_instances = itertools.count()
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 10**9  # no sysconf (not Linux/macOS): assume a small workstation


def parse_size(text: str, setting: str) -> int:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]i?[bB]?|[bB]?)\s*", text or "")
    unit = (m.group(2).lower() if m else "")
    if unit and not unit.endswith("b"):
        unit += "b"
    if not m or unit not in _UNITS:
        raise ProfileError(f"{setting}={text!r} is not a size. Write bytes or a number with a unit, e.g. 4GB or 512MiB.")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 64 * 2**20:
        raise ProfileError(f"{setting}={text!r} is below the minimum of 64 MiB.")
    return value


def _size_setting(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return parse_size(raw, name) if raw not in (None, "") else default


def cache_root() -> Path:
    """The per-user cache folder: stores, exports, the DuckDB extension copy, spill files."""
    explicit = os.environ.get("GPUSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuscope"


def private_dir(*parts: str) -> Path:
    """A folder under the cache that only this user can enter (created 0700)."""
    path = cache_root().joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ProfileError(f"gpuscope cannot create its cache folder {path} ({exc.strerror or exc}). Set "
                           "GPUSCOPE_CACHE_DIR (or XDG_CACHE_HOME) to a writable folder.") from None
    return path


def scratch_dir() -> Path:
    """This process's private scratch folder in the cache (spill files, preview databases, staged Kineto parts).
    Whatever a process leaves there when it is killed goes once it is gone (store.cleanup_stale_spill), which a
    folder in the system's temp directory would not."""
    return private_dir("spill", str(os.getpid()))


def memory_limit_bytes() -> int:
    """DuckDB memory_limit of each open profile's connections."""
    # The process stays 0.4-0.6 GB above DuckDB's limit when a 10 M-kernel query fills it (Python, and what DuckDB
    # allocates outside its buffer pool: a quantile's values, ...). At 1 GB the first api_summary over a 10 M-kernel
    # store peaked at 1.48-1.63 GB in ten runs, eight of them past the 1.5 GB the server is to stay under; at 800 MB at
    # 1.24-1.31 GB, with the 10 M build and the larger first calls a tenth to a quarter slower (they spill more).
    return _size_setting("GPUSCOPE_MEMORY_LIMIT", min(physical_memory_bytes() // 8, 8 * 10**8))


def memory_limit_now() -> str:
    """'GPUSCOPE_MEMORY_LIMIT (now 800 MiB)': the limit in force, set or default, for advice after running out."""
    return f"GPUSCOPE_MEMORY_LIMIT (now {memory_limit_bytes() // 2**20} MiB)"


def preview_memory_limit_bytes() -> int:
    """DuckDB memory_limit of a preview's in-memory model (model/trace.py), five eighths of the limit (500 MB by
    default): at half of 800 MB the 1.25 M-event Kineto trace's preview spilled and answered 0.16 s later."""
    return memory_limit_bytes() * 5 // 8


def sql_memory_limit_bytes() -> int:
    """Address-space ceiling of the sql_query process (DuckDB there gets 3/4 of it)."""
    return _size_setting("GPUSCOPE_SQL_MEMORY_LIMIT", max(min(physical_memory_bytes() // 8, 4 * 10**9), 1 * 10**9))


def max_decompressed_bytes() -> int:
    raw = os.environ.get("GPUSCOPE_MAX_DECOMPRESSED_GB")
    if raw in (None, ""):
        return physical_memory_bytes() // 2
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ProfileError(f"GPUSCOPE_MAX_DECOMPRESSED_GB={raw!r} is not a positive number of GB (1 GB = 1e9 bytes).")
    return int(value * 1e9)


def cache_bytes() -> int:
    raw = os.environ.get("GPUSCOPE_CACHE_GB")
    if raw in (None, ""):
        return 20 * 10**9
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ProfileError(f"GPUSCOPE_CACHE_GB={raw!r} is not a number of GB (1 GB = 1e9 bytes); 0 keeps only stores in use.")
    return int(value * 1e9)


# Memory each DuckDB thread gets: a statement's hash tables and sort buffers cost per thread before any data spills.
# With 2 threads, ops_summary, api_summary and critical_path ran out of a 64 MiB limit within 0.2-0.5 s at 2 M
# kernels, whatever their joins (and ops_summary out of 96 MiB at 2, 5 and 10 M); on one thread all three answer there.
THREAD_MEMORY_BYTES = 64 * 2**20


def duckdb_threads(memory_limit: int) -> int:
    """Threads of a DuckDB instance under `memory_limit`: one per THREAD_MEMORY_BYTES of it, at most as many as DuckDB
    would start with (its count of the cores this process may use)."""
    return max(1, min(_duckdb_default_threads(), memory_limit // THREAD_MEMORY_BYTES))


@functools.cache
def _duckdb_default_threads() -> int:
    con = duckdb.connect()
    try:
        return int(con.execute("SELECT current_setting('threads')").fetchone()[0])
    finally:
        con.close()


def duckdb_config(memory_limit: int | None = None, spill: bool = True) -> dict[str, str]:
    """Settings every gpuscope DuckDB instance starts with: bounded memory, threads that fit in it, spill to the
    private cache."""
    memory_limit = memory_limit or memory_limit_bytes()
    config = {
        "memory_limit": f"{memory_limit // 2**20}MiB",
        "threads": str(duckdb_threads(memory_limit)),
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
        # A join on two inequalities (the op tree's "inside the same thread's op" keys) is an IEJoin whatever the
        # optimizer estimates: below this many estimated rows on a side DuckDB picks a piecewise merge join instead,
        # and its estimate for the tree's CTEs is ~0 rows, which made 250,000 ops on one thread a quadratic join that
        # did not finish in minutes (ops_summary, diagnose, call_stack on a 1.25 M-event trace).
        "merge_join_threshold": "0",
        # jemalloc (DuckDB's allocator on Linux) keeps freed pages for a while before the OS gets them back, so pages
        # one statement freed (or a preview just closed) still counted while the next allocated its own. Background
        # threads purge them as they age, and a free of 64 MiB at once (DuckDB's default: 512) flushes them. A 10 M-kernel
        # store build peaked at 1,083-1,247 MB in five runs, against 1,219-1,549 MB in seven without (a cold open with
        # its first answer: 1,201-1,349 against 1,219-1,597 MB), in the same time; 2 M-kernel first calls took as long.
        "allocator_background_threads": "true",
        "allocator_bulk_deallocation_flush_threshold": "64MiB",
    }
    if spill:
        # A folder per instance, not per process: DuckDB names its spill files the same in every instance, so two
        # instances of one process (the hub and a build behind a preview) sharing a folder overwrote each other's
        # spilled blocks and read back wrong rows. DuckDB creates the folder on first spill and removes it on close;
        # the process's folder goes when the process is gone (store.cleanup_stale_spill).
        config["temp_directory"] = str(scratch_dir() / f"db{next(_instances)}")
    return config


def connect(database: str, config: dict[str, str], read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A new DuckDB instance (every gpuscope instance is made here), with DuckDB's progress bar off. The Python client
    turns the bar on for a connection made where __main__ has no file (python -c, a REPL, a notebook) and draws it on
    fd 1 once a statement runs for 2 s: the JSON-RPC stream of a stdio server started that way, or the CSV a command
    writes. It is a setting of the connection (DuckDB refuses it in `config`); the cursors made from it start off."""
    con = duckdb.connect(database, read_only=read_only, config=config)
    con.execute("SET enable_progress_bar = false")
    return con


@contextmanager
def setting(con, name: str, value: bool | int | str) -> Iterator[None]:
    """DuckDB setting `name` (one of ours, never text from a profile) at `value` for the block, then back at the value
    it had before it, which a caller further out may have set: a reader that drops insertion order for its whole
    build keeps it for the one insert that needs it."""
    before = con.execute(f"SELECT current_setting({quote_literal(name)})").fetchone()[0]
    con.execute(f"SET {name} = {_setting_sql(value)}")
    try:
        yield
    except BaseException:
        try:
            con.execute(f"SET {name} = {_setting_sql(before)}")
        except Exception:  # a connection the error left unusable: the error says more than this would
            pass
        raise
    con.execute(f"SET {name} = {_setting_sql(before)}")


def _setting_sql(value: bool | int | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(int(value)) if isinstance(value, int) else quote_literal(value)
