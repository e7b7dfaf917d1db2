"""The shared trace object: one profile's trace model in its store, read through a locked connection."""

from __future__ import annotations

import importlib
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb

from .detect import FORMAT_NAMES, Detected, detect, regular_file
from .errors import ProfileError, shown_path
from .hub import ModelConnection, hub
from .quality import check_model
from .store import NativeCatalog, Store, disk_problem, lock_down, open_store

SCHEMA_SQL = (Path(__file__).parent / "schema.sql").read_text()
MODEL_TABLES = ("trace_meta", "devices", "processes", "threads", "kernels", "memops", "api_calls", "markers", "cpu_ops",
                "nccl_calls", "memory_events", "data_issues")
SQLITE_FORMATS = ("nsys", "rocpd", "rpd")

Progress = Callable[[float, str], None]
MEMO_ENTRIES = 256  # memoized figures kept per open profile


def _no_progress(fraction: float, message: str) -> None:
    return None


@dataclass(frozen=True)
class Codec:
    """How a memoized value becomes JSON (encode) and comes back (decode), for Trace.memo(persist=...)."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


# Rows as sql_dicts returns them (lists of dicts of JSON scalars and lists) are JSON already, as are plain values.
ROWS = Codec(encode=lambda rows: rows, decode=lambda rows: list(rows))
VALUE = Codec(encode=lambda v: v, decode=lambda v: v)


@dataclass
class Trace:
    """An opened profile. Tools query `con` (via `sql`); the model tables are documented in schema.sql.

    `con` reads the model from the process's shared DuckDB instance (tools/model/hub.py), read-only with
    external access off and its configuration locked: nothing run on it can change the model or reach
    another file."""

    path: Path
    format: str
    con: ModelConnection
    open_seconds: float
    store: Store
    native: NativeCatalog
    meta: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # A Trace dropped without close() (tests, one-shot CLI calls) still lets go of its store.
        self._finalizer = weakref.finalize(self, _release, self.store, self.con)

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES.get(self.format, self.format)

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[tuple]:
        """Run one query on a private cursor (tools run on worker threads) and fetch all rows."""
        cur = self.con.cursor()
        try:
            return cur.execute(query, params).fetchall() if params is not None else cur.execute(query).fetchall()
        finally:
            cur.close()

    def sql_dicts(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.cursor()
        try:
            res = cur.execute(query, params) if params is not None else cur.execute(query)
            cols = [d[0] for d in res.description]
            return [dict(zip(cols, row)) for row in res.fetchall()]
        finally:
            cur.close()

    def scalar(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> Any:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def count(self, table: str) -> int:
        """Rows of a table named by gpuscope's own code (a model table or e.g. native.events), memoized."""
        return self.memo(("count", table), lambda: int(self.scalar(f"SELECT count(*) FROM {table}")))

    def memo(self, key: Any, compute: Callable[[], Any], persist: Codec | None = None) -> Any:
        """Cache a figure that depends only on the (immutable) profile, e.g. per-device busy time. With `persist`
        (how to turn the value into JSON and back) it is also kept in the store for every later process."""
        with self.lock:
            if key in self._memo:
                return self._memo[key]
        found = False
        if persist is not None:
            found, saved = self.store.load_answer(repr(key))
            if found:
                try:
                    value = persist.decode(saved)
                except (TypeError, ValueError, KeyError, IndexError):  # not what this code writes: recompute
                    found = False
        if not found:
            value = compute()
            if persist is not None:
                self.store.save_answer(repr(key), persist.encode(value))
        with self.lock:
            # Bounded: a long-running server sees many distinct filters; the oldest answers go first.
            while len(self._memo) >= MEMO_ENTRIES:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = value
        return value

    def meta_int(self, key: str) -> int | None:
        value = self.meta.get(key)
        return int(value) if value not in (None, "") else None

    # -- the profile's own tables ------------------------------------------------------------------------
    def native_tables(self) -> set[str]:
        """Native tables the tools' connection can read (those copied into the model store)."""
        return set(self.native.in_model)

    def native_columns(self, table: str) -> set[str]:
        return {r[0] for r in self.sql(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'native' "
            "AND table_name = ?", [table])}

    def close(self) -> None:
        self._finalizer()


def _release(store: Store, con: ModelConnection | None = None) -> None:
    try:
        if con is not None:
            con.release()
    finally:
        store.close()


def load_trace(path: Path, progress: Progress = _no_progress, attached: bool = True) -> Trace:
    """Detect the format, open its store (building it on the first open of this content) and read it (uncached).
    attached=False: the store is let go once its metadata is read, and attached again on first use (a job's ranks
    are read through its stacked store; done here, before any other thread can hold the Trace)."""
    path = regular_file(path)
    found: Detected = detect(path)
    if found.format == "nsys-rep":
        from .nsys_rep import export_nsys_rep

        path = export_nsys_rep(path, progress)
        found = detect(path)
    t0 = time.perf_counter()
    try:
        store = open_store(path, found.format, lambda con: _ingest(con, path, found, progress))
    except OSError as exc:
        raise ProfileError(f"Cannot read {shown_path(path)}: {exc.strerror or exc}. Check the path and its permissions.") from None
    con = None
    try:
        if store.in_memory:
            lock_down(store.memory)
            con = ModelConnection(store.memory, "memory")
        else:
            con = ModelConnection.of_store(hub(), store.model_file)
        cur = con.cursor()
        meta_rows = cur.execute("SELECT key, value FROM trace_meta").fetchall()
        cur.close()
        native = store.catalog()
        if not attached:
            con.release()
    except BaseException:
        _release(store, con)
        raise
    meta = {k: v for k, v in meta_rows if k != "warning"}
    warnings = [v for k, v in meta_rows if k == "warning"] + ([store.warning] if store.warning else [])
    progress(1.0, "ready")
    return Trace(path=path, format=found.format, con=con, open_seconds=time.perf_counter() - t0, store=store,
                 native=native, meta=meta, warnings=warnings)


def _ingest(con: duckdb.DuckDBPyConnection, path: Path, found: Detected, progress: Progress) -> NativeCatalog:
    """Run the format's reader on the store's read-write connection (the store closes it)."""
    name = FORMAT_NAMES.get(found.format, found.format)
    try:
        con.execute(SCHEMA_SQL)
        reader = importlib.import_module(f"{__package__}.readers.{found.format}")
        progress(0.0, f"reading {name}")
        reader.load(con, path, progress, found)
        _finalise(con)
        return _native_catalog(con, path, found.format)
    except ProfileError:
        raise
    except duckdb.OutOfMemoryException:
        raise ProfileError(f"{shown_path(path)} needs more memory to read than gpuscope may use. Raise GPUSCOPE_MEMORY_LIMIT "
                           "(e.g. GPUSCOPE_MEMORY_LIMIT=16GB) or analyse a shorter capture.") from None
    except duckdb.Error as exc:
        if disk_problem(exc):
            raise  # the store's folder, not the profile: the store falls back to memory
        raise ProfileError(
            f"{shown_path(path)} could not be read as a {name}: {_first_line(exc)}. "
            "The file may be truncated or from an unsupported version."
        ) from None
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        # Readers page through the SQLite file lazily, so a damaged page deep inside only shows up mid-read.
        raise ProfileError(
            f"{shown_path(path)} could not be read as a {name}: {exc}. "
            "The file is damaged (truncated, or copied while still being written); re-export or copy it again."
        ) from None
    except MemoryError:
        raise ProfileError(f"{shown_path(path)} is too large to read within this machine's memory. Analyse a shorter "
                           "capture, or raise GPUSCOPE_MEMORY_LIMIT if the machine has more to give.") from None


def _native_catalog(con: duckdb.DuckDBPyConnection, path: Path, fmt: str) -> NativeCatalog:
    in_model = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'native' UNION "
        "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND schema_name = 'native' "
        "ORDER BY 1").fetchall()]
    if fmt not in SQLITE_FORMATS:
        return NativeCatalog(tables=in_model, in_model=in_model, source="model")
    from .sqlite_source import open_sqlite, readable_tables

    sqlite = open_sqlite(path)
    try:
        tables = sorted(readable_tables(sqlite))
    finally:
        sqlite.close()
    views: dict[str, list[str]] = {}
    if fmt == "rocpd":
        from .readers.rocpd import logical_tables

        views = logical_tables(tables)
    return NativeCatalog(tables=tables, in_model=[t for t in in_model if t in tables], views=views)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _finalise(con: duckdb.DuckDBPyConnection) -> None:
    """Checks every reader must pass, and facts derived the same way for every format."""
    check_model(con)
    have = {k for (k,) in con.execute("SELECT DISTINCT key FROM trace_meta").fetchall()}
    if "capture_start_ns" not in have:
        lo, hi = con.execute(
            """SELECT min(s), max(e) FROM (
                 SELECT min(start_ns) s, max(end_ns) e FROM kernels UNION ALL
                 SELECT min(start_ns), max(end_ns) FROM memops UNION ALL
                 SELECT min(start_ns), max(end_ns) FROM api_calls UNION ALL
                 SELECT min(start_ns), max(end_ns) FROM markers UNION ALL
                 SELECT min(start_ns), max(end_ns) FROM cpu_ops)"""
        ).fetchone()
        if lo is not None:
            con.execute(
                "INSERT INTO trace_meta VALUES ('capture_start_ns', ?), ('capture_end_ns', ?), ('capture_span_source', 'first to last event of any kind')",
                [str(lo), str(hi)],
            )
