"""The shared trace object: one profile's trace model in its store, read through a locked connection.

The first answer need not wait for the store. Opening a large Nsight export (or Kineto trace) that has no store yet returns
a *pending* Trace at once: the first access to its model (con, meta, store, ...) builds or reopens the store
as before, waiting for it. top_kernels asks `trace.preview()` first: while the store is not built, that is
a small in-memory model holding exactly what top_kernels reads, filled from the export in one scan
(readers/nsys.py, readers/kineto.py `preview`), and the store's build then starts in a background thread, so the next question
finds it built (or waits for it). Every preview answer equals the stored one (tests/model/test_preview.py);
an export the preview cannot match exactly, or any failure making it, is answered from the store instead.
A failed background build raises its error at the next access to the model, like a failed open."""

from __future__ import annotations

import importlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb

from .detect import FORMAT_NAMES, GZIP_MAGIC, Detected, detect, gzip_isize, regular_file
from .errors import NoPreview, ProfileError, shown_path
from .hub import ModelConnection, hub
from .quality import check_model
from .limits import connect, duckdb_config, memory_limit_now, preview_memory_limit_bytes
from .quote import quote_ident
from .sqlite_source import SQLITE_FORMATS, scanner_config
from .store import Lease, NativeCatalog, Store, disk_problem, lock_down, open_store, store_exists, store_key

log = logging.getLogger(__name__)
SCHEMA_SQL = (Path(__file__).parent / "schema.sql").read_text()
MODEL_TABLES = ("trace_meta", "devices", "processes", "threads", "kernels", "memops", "api_calls", "markers", "cpu_ops",
                "nccl_calls", "memory_events", "os_memory_levels", "data_issues")

Progress = Callable[[float, str], None]
MEMO_ENTRIES = 256  # memoized figures kept per open profile
PREVIEW_HOLD_S = 60.0  # the store's build waits this long at most for a preview answer to be given


def _no_progress(fraction: float, message: str) -> None:
    return None


def cursor_dicts(cur, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of `query` on `cur` as dicts (for statements that read the cursor's temp tables)."""
    res = cur.execute(query, params) if params is not None else cur.execute(query)
    cols = [d[0] for d in res.description]
    return [dict(zip(cols, row)) for row in res.fetchall()]


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
        self._held: list[tuple[Store, ModelConnection | None]] = [(self.store, self.con)]
        self._finalizer = weakref.finalize(self, _release_all, self._held)

    # -- a store still to be built (see the module docstring) ----------------------------------------------
    @classmethod
    def pending(cls, path: Path, fmt: str, progress: Progress) -> "Trace":
        """A Trace whose store is opened (built if need be) at the first access to its model."""
        trace = cls.__new__(cls)
        trace.__dict__.update(path=path, format=fmt, lock=threading.Lock(), _memo={}, _held=[], _progress=progress, _carried=[],
                              _opening=threading.Lock(), _preview=None, _builder=None, _failure=None, _closed=False)
        trace._finalizer = weakref.finalize(trace, _release_all, trace._held)
        return trace

    def __getattr__(self, name: str) -> Any:
        # Reached only for a field not set yet: the model of a pending Trace.
        if name in _STORE_FIELDS and "_opening" in self.__dict__:
            self._settle()
            return self.__dict__[name]
        raise AttributeError(name)

    @property
    def ready(self) -> bool:
        """True once the model is open (always, except for a pending Trace whose store is still being built)."""
        return "store" in self.__dict__

    def follow(self, progress: Progress) -> None:
        """Report the pending store's build to this caller (the latest tool call that opened the profile)."""
        if not self.ready:
            self.__dict__["_progress"] = progress

    def _settle(self) -> None:
        with self._opening:
            if self.ready:
                return
            if self._failure is not None:
                raise self._failure
            try:
                opened = load_trace(self.path, lambda f, m: self._progress(f, m), store_now=True)
            except ProfileError as exc:  # the profile's content does not change: neither will the answer
                self.__dict__["_failure"] = exc
                raise
            opened._finalizer.detach()
            self._held.append((opened.store, opened.con))
            if self._closed:
                _release_all(self._held)
            for name in _STORE_FIELDS:
                self.__dict__[name] = getattr(opened, name)
            # The preview's stored-kind answers (top_kernels' rows, busy time, graph count) equal the store's: keep them.
            for key, value, codec in self._carried:
                self.store.save_answer(repr(key), codec.encode(value))
                with self.lock:
                    if len(self._memo) < MEMO_ENTRIES:
                        self._memo[key] = value
            self._carried.clear()
            self.__dict__["_preview"] = None  # later answers come from the store; the preview goes with its last user

    def preview(self, names: bool = True, streams: bool = True) -> "Trace":
        """The model to answer top_kernels from now: this trace's, or while its store is not built, a preview of
        the export (module docstring) - after which the store's build goes on in the background. The preview answers
        one question: without `names` or `streams` it may leave kernels.name or stream_id out (readers/nsys.py)."""
        if self.ready or "_opening" not in self.__dict__:
            return self
        with self._opening:
            if self.ready or self._failure is not None:
                return self
            if self._preview is None:
                self.__dict__["_preview"] = _preview_trace(self.path, self.format, self._progress, names, streams) or self
                if self._preview is not self:
                    self._preview.__dict__["_carry"] = self._carried
            # Used once: the next question waits for the store. The build starts when this answer is given (the
            # caller drops the preview), so that the two neither share the CPU nor hold memory together.
            view, self.__dict__["_preview"] = self._preview, self
            if self._builder is None and view is not self:
                # The preview's in-memory model is freed by the builder once the answer is given, not on the answering
                # caller's thread as the view goes (freeing it was part of the first answer's time).
                answered, held, lock, late = threading.Event(), view._held, threading.Lock(), []
                view._finalizer.detach()

                def dropped() -> None:
                    with lock:
                        answered.set()
                        if late:  # the builder stopped waiting for this answer: free the preview here
                            _release_all(held)

                weakref.finalize(view, dropped)
                self.__dict__["_builder"] = threading.Thread(target=self._build_quietly, args=(answered, held, lock, late),
                                                             name="gpuscope-store-build")
                self._builder.start()
        return view

    def _build_quietly(self, answered: threading.Event, held: list, lock: threading.Lock, late: list) -> None:
        answered.wait(PREVIEW_HOLD_S)
        with lock:
            free = answered.is_set()
            if not free:
                late.append(True)
        if free:
            _release_all(held)
        try:
            self._settle()
        except BaseException:  # raised again to whoever next reads the model
            pass
        finally:
            # What the preview left for this build (a Kineto trace's staged parts) goes, whoever built the store.
            drop = getattr(importlib.import_module(f"{__package__}.readers.{self.format}"), "drop_staged", None)
            if drop is not None:
                drop(self.path)

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
            return cursor_dicts(cur, query, params)
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
                carry = self.__dict__.get("_carry")
                if carry is not None:  # a preview's answer, kept for the store it equals
                    carry.append((key, value, persist))
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
        self.__dict__["_closed"] = True
        self._finalizer()


_STORE_FIELDS = ("con", "open_seconds", "store", "native", "meta", "warnings")


def _release_all(held: list[tuple[Store, ModelConnection | None]]) -> None:
    while held:
        _release(*held.pop())


def _release(store: Store, con: ModelConnection | None = None) -> None:
    try:
        if con is not None:
            con.release()
    finally:
        store.close()


def load_trace(path: Path, progress: Progress = _no_progress, attached: bool = True, store_now: bool = False) -> Trace:
    """Detect the format, open its store (building it on the first open of this content) and read it (uncached).
    attached=False: the store is let go once its metadata is read, and attached again on first use (a job's ranks
    are read through its stacked store; done here, before any other thread can hold the Trace).
    A large Nsight export or Kineto trace without a store gives a pending Trace (module docstring) unless `store_now`."""
    path = regular_file(path)
    found: Detected = detect(path)
    if found.format == "nsys-rep":
        from .nsys_rep import export_nsys_rep

        path = export_nsys_rep(path, progress)
        found = detect(path)
    if not store_now and found.format in PREVIEW_GATES and not store_exists(path) and PREVIEW_GATES[found.format](path):
        return Trace.pending(path, found.format, progress)
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


def _large_nsys(path: Path) -> bool:
    """True when the export's kernel table is large enough for a preview to pay (readers/nsys.py)."""
    from .readers.nsys import KERNEL, PREVIEW_MIN_KERNELS
    from .sqlite_source import open_sqlite

    try:
        sqlite = open_sqlite(path)
        try:
            return int(sqlite.execute(f"SELECT coalesce(max(rowid), 0) FROM {quote_ident(KERNEL)}").fetchone()[0]) >= PREVIEW_MIN_KERNELS
        finally:
            sqlite.close()
    except (ProfileError, sqlite3.Error, TypeError, ValueError):  # no kernel table, a damaged file: the build says what
        return False


def _large_kineto(path: Path) -> bool:
    """True for a trace large enough for a preview to pay (readers/kineto.py): by its size, or for a .json.gz by
    what it decompresses to as its gzip trailer says (ISIZE: the last member's size modulo 4 GiB, so a compressed
    file of that size counts as large by itself). A wrong trailer only decides whether a preview is tried."""
    from .readers.kineto import PREVIEW_MIN_BYTES

    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != GZIP_MAGIC or size >= PREVIEW_MIN_BYTES:
                return size >= PREVIEW_MIN_BYTES
            return gzip_isize(fh) >= PREVIEW_MIN_BYTES
    except OSError:  # the build says what
        return False


# The formats whose reader has a `preview`, each with its test that a preview pays for this file.
PREVIEW_GATES: dict[str, Callable[[Path], bool]] = {"nsys": _large_nsys, "kineto": _large_kineto}


def preview_connection(fmt: str) -> duckdb.DuckDBPyConnection:
    """The in-memory DuckDB instance a preview of a `fmt` profile is read into. Less than the usual limit (the rest
    spills to the private cache): top_kernels' interval union then fetches the kernels beside it, and a 10 M-kernel
    preview at the full limit took the process past 1.8 GB."""
    return connect(":memory:", {**duckdb_config(preview_memory_limit_bytes()), **scanner_config(fmt)})


def _preview_trace(path: Path, fmt: str, progress: Progress, names: bool = True, streams: bool = True) -> Trace | None:
    """A Trace over an in-memory preview model of `path` (its reader's `preview`), or None where there is none.
    Without `names` or `streams` the reader may leave kernels.name or stream_id out (the one question reads neither)."""
    preview = importlib.import_module(f"{__package__}.readers.{fmt}").preview

    progress(0.0, "answering from the export while its store is built")
    con = preview_connection(fmt)
    try:
        con.execute(SCHEMA_SQL)
        preview(con, path, names, streams)
        meta_rows = con.execute("SELECT key, value FROM trace_meta").fetchall()
        lock_down(con)
    except (NoPreview, ProfileError, duckdb.Error, sqlite3.Error, OSError) as exc:
        log.info("no preview of %s (%s); answering from its store", path, exc)
        con.close()
        return None
    store = Store(store_key(path), None, Lease(None), memory=con, native=NativeCatalog(source="model"), built=True)
    return Trace(path=path, format=fmt, con=ModelConnection(con, "memory"), open_seconds=0.0, store=store,
                 native=store.catalog(), meta={k: v for k, v in meta_rows if k != "warning"},
                 warnings=[v for k, v in meta_rows if k == "warning"])


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
        raise ProfileError(f"{shown_path(path)} needs more memory to read than gpuscope may use: raise {memory_limit_now()} "
                           "in the server's environment, e.g. to twice that, or analyse a shorter capture.") from None
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
