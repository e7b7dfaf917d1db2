"""Read SQLite profiles (Nsight exports, rocpd databases) into DuckDB.

Bulk numeric tables are scanned by DuckDB's SQLite extension, which ships on PyPI
(`duckdb-extension-sqlite`) and loads offline: a 2 M-kernel export ingests ~6x faster than
copying rows through Python. The extension rejects invalid UTF-8 (real Nsight exports contain
it) and type-mismatched cells (legacy RPD stores '' in integer columns), so text-bearing tables go
through Python's sqlite3 with lenient decoding instead. When the extension cannot be loaded at
all, every table takes the sqlite3 path: slower, same result.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pandas as pd

from .errors import ProfileError

log = logging.getLogger(__name__)

_EXTENSION_FILE: Path | None | bool = False  # False: not looked for yet; None: unavailable


def _extension_file() -> Path | None:
    """The sqlite scanner binary, copied once under the name DuckDB derives its entry point from."""
    global _EXTENSION_FILE
    if _EXTENSION_FILE is not False:
        return _EXTENSION_FILE  # type: ignore[return-value]
    _EXTENSION_FILE = None
    try:
        import duckdb_extension_sqlite  # type: ignore

        pkg = Path(duckdb_extension_sqlite.__file__).parent
        found = sorted(pkg.glob(f"extensions/v{duckdb.__version__}/*.duckdb_extension"))
        if not found:
            return None
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuscope" / "duckdb" / duckdb.__version__
        target = cache / "sqlite_scanner.duckdb_extension"
        if not target.exists() or target.stat().st_size != found[0].stat().st_size:
            cache.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(found[0], tmp)
            os.replace(tmp, target)
        _EXTENSION_FILE = target
    except Exception as exc:  # any failure means: use the sqlite3 path
        log.info("DuckDB sqlite extension unavailable (%s); using sqlite3 copies", exc)
    return _EXTENSION_FILE  # type: ignore[return-value]


def lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def open_sqlite(path: Path) -> sqlite3.Connection:
    """Read-only, immutable-safe sqlite3 connection with lenient text decoding."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        conn.text_factory = lenient_text
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(
            f"{path} is not a readable SQLite database ({exc}). If it is a profile, it may be truncated or "
            "still being written; re-export it (e.g. `nsys export --type sqlite`) and try again."
        ) from None
    return conn


class SqliteSource:
    """A profile's SQLite tables, attached to a DuckDB connection as catalog `native` when possible."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path):
        self.con = con
        self.path = path
        self.sqlite = open_sqlite(path)
        rows = self.sqlite.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table','view')"
        ).fetchall()
        self.objects = {name: typ for name, typ in rows}
        self._columns: dict[str, list[str]] = {}
        self._copied: set[str] = set()
        self.attached = False
        ext = _extension_file()
        if ext is not None:
            try:
                con.execute(f"LOAD '{ext}'")
                con.execute(f"ATTACH '{_sql_str(str(path))}' AS native (TYPE sqlite, READ_ONLY)")
                self.attached = True
            except duckdb.Error as exc:
                log.info("sqlite extension could not attach %s (%s); using sqlite3 copies", path, exc)

    # -- schema probing -------------------------------------------------------------------------
    def has(self, table: str) -> bool:
        return table in self.objects

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            if not self.has(table):
                self._columns[table] = []
            else:
                info = self.sqlite.execute(f'PRAGMA table_info("{table}")').fetchall()
                self._columns[table] = [r[1] for r in info]
        return self._columns[table]

    def has_column(self, table: str, column: str) -> bool:
        return column in self.columns(table)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run a small SQLite-dialect query through sqlite3 (lenient text)."""
        return self.sqlite.execute(sql, params).fetchall()

    # -- relations for DuckDB SQL ---------------------------------------------------------------
    def relation(self, table: str, *, text: bool = False) -> str:
        """A DuckDB relation name holding `table`'s rows.

        text=True forces the lenient sqlite3 copy (use it for tables with free text that may hold
        invalid UTF-8, and for small tables where it costs nothing).
        """
        if not self.has(table):
            raise KeyError(table)
        if self.attached and not text and self.objects[table] == "table":
            return f'native."{table}"'
        return self._copy(table)

    def _copy(self, table: str) -> str:
        target = f'"_src_{table}"'
        if table not in self._copied:
            cur = self.sqlite.execute(f'SELECT * FROM "{table}"')
            cols = [d[0] for d in cur.description]
            df = pd.DataFrame.from_records(cur.fetchall(), columns=cols)
            df = df.apply(_normalise_column)
            # Declared SQLite types decide the DuckDB types, so empty or all-NULL columns keep them.
            declared = {r[1]: r[2] for r in self.sqlite.execute(f'PRAGMA table_info("{table}")').fetchall()}
            select = ", ".join(f'TRY_CAST("{c}" AS {t}) AS "{c}"' if (t := _duck_type(declared.get(c, ""))) else f'"{c}"'
                               for c in cols)
            name = f"_df_{abs(hash(table))}"
            self.con.register(name, df)
            self.con.execute(f"CREATE TEMP TABLE {target} AS SELECT {select or '*'} FROM {name}")
            self.con.unregister(name)
            self._copied.add(table)
        return target

    def close(self) -> None:
        self.sqlite.close()


def _normalise_column(series: pd.Series) -> pd.Series:
    """SQLite cells are dynamically typed: make each column one DuckDB-friendly type."""
    if series.dtype != object:
        return series
    kinds = {type(v) for v in series.dropna().head(10000)}
    if kinds <= {int}:
        return pd.array(series, dtype="Int64")
    if kinds <= {int, float}:
        return pd.to_numeric(series, errors="coerce")
    if kinds and kinds <= {bytes}:
        return series
    return series.map(lambda v: None if v is None else (v if isinstance(v, str) else str(v)))


def _duck_type(declared: str) -> str | None:
    """SQLite type affinity rules, mapped onto DuckDB types (None: untyped, keep what the cells hold)."""
    d = declared.upper()
    if not d:
        return None
    if "INT" in d:
        return "BIGINT"
    if any(k in d for k in ("REAL", "FLOA", "DOUB")):
        return "DOUBLE"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT", "JSON")):
        return "VARCHAR"
    if "BLOB" in d:
        return "BLOB"
    return "VARCHAR"


def _sql_str(value: str) -> str:
    return value.replace("'", "''")
