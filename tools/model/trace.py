"""The shared trace object: one DuckDB connection holding the trace model of one profile."""

from __future__ import annotations

import importlib
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb

from .detect import FORMAT_NAMES, Detected, detect
from .errors import ProfileError
from .quality import check_model

SCHEMA_SQL = (Path(__file__).parent / "schema.sql").read_text()
MODEL_TABLES = ("trace_meta", "devices", "processes", "threads", "kernels", "memops", "api_calls", "markers", "cpu_ops",
                "data_issues")

Progress = Callable[[float, str], None]
MEMO_ENTRIES = 256  # memoized figures kept per open profile


def _no_progress(fraction: float, message: str) -> None:
    return None


@dataclass
class Trace:
    """An opened profile. Tools query `con` (via `sql`); the model tables are documented in schema.sql."""

    path: Path
    format: str
    con: duckdb.DuckDBPyConnection
    open_seconds: float
    meta: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)

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
        return self.memo(("count", table), lambda: int(self.scalar(f"SELECT count(*) FROM {table}")))

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """Cache a figure that depends only on the (immutable) profile, e.g. per-device busy time."""
        with self.lock:
            if key in self._memo:
                return self._memo[key]
        value = compute()
        with self.lock:
            # Bounded: a long-running server sees many distinct filters; the oldest answers go first.
            while len(self._memo) >= MEMO_ENTRIES:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = value
        return value

    def meta_int(self, key: str) -> int | None:
        value = self.meta.get(key)
        return int(value) if value not in (None, "") else None

    def close(self) -> None:
        self.con.close()


def load_trace(path: Path, progress: Progress = _no_progress) -> Trace:
    """Detect the format, run its reader and return the populated trace model (uncached)."""
    path = Path(path).expanduser().resolve()
    found: Detected = detect(path)
    if found.format == "nsys-rep":
        from .nsys_rep import export_nsys_rep

        path = export_nsys_rep(path, progress)
        found = detect(path)
    t0 = time.perf_counter()
    con = duckdb.connect(":memory:")
    try:
        con.execute(SCHEMA_SQL)
        reader = importlib.import_module(f"{__package__}.readers.{found.format}")
        progress(0.0, f"reading {FORMAT_NAMES.get(found.format, found.format)}")
        reader.load(con, path, progress, found)
        _finalise(con)
        # From here on the connection only answers queries: no file access, no ATTACH/COPY/LOAD,
        # and no SET to undo that (sql_query relies on it).
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except ProfileError:
        con.close()
        raise
    except duckdb.Error as exc:
        con.close()
        raise ProfileError(
            f"{path} could not be read as a {FORMAT_NAMES.get(found.format, found.format)}: {exc}. "
            "The file may be truncated or from an unsupported version."
        ) from None
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        # Readers page through the SQLite file lazily, so a damaged page deep inside only shows up mid-read.
        con.close()
        raise ProfileError(
            f"{path} could not be read as a {FORMAT_NAMES.get(found.format, found.format)}: {exc}. "
            "The file is damaged (truncated, or copied while still being written); re-export or copy it again."
        ) from None
    except BaseException:
        con.close()
        raise
    meta_rows = con.execute("SELECT key, value FROM trace_meta").fetchall()
    meta = {k: v for k, v in meta_rows if k != "warning"}
    warnings = [v for k, v in meta_rows if k == "warning"]
    progress(1.0, "ready")
    return Trace(path=path, format=found.format, con=con, open_seconds=time.perf_counter() - t0, meta=meta, warnings=warnings)


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
