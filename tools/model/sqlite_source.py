"""Read SQLite profiles (Nsight exports, rocpd databases) into the store, treating the file as hostile.

Bulk numeric tables are scanned by DuckDB's SQLite extension, which ships on PyPI
(`duckdb-extension-sqlite`) and loads offline: a 2 M-kernel export ingests ~6x faster than
copying rows through Python. The extension rejects invalid UTF-8 (real Nsight exports contain
it) and type-mismatched cells (legacy RPD stores '' in integer columns), so text-bearing tables go
through Python's sqlite3 with lenient decoding instead. When the extension cannot be loaded at
all, every table takes the sqlite3 path: slower, same result.

What a profile cannot do to us:
  * only real tables are read. Views and triggers hold SQL written by whoever made the file, and
    virtual tables run module code, so they are never queried (the DuckDB scanner would parse and
    run a view's SQL the moment it is named); names reach SQL only through quote_ident;
  * nothing is created, locked or changed beside the profile. sqlite3 opens it `immutable`; the
    DuckDB scanner cannot take URI flags and would create `-wal`/`-shm` files next to a WAL-mode
    database (or trip over a hot journal), so such files are scanned from a private copy;
  * the sqlite3 connection has an authorizer that allows reading and nothing else (no ATTACH).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sqlite3
import stat
import threading
import urllib.parse
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pandas as pd

from .errors import ProfileError, shown_path
from .limits import cache_root, private_dir
from .quality import native_table_name, record
from .quote import quote_ident, quote_literal

log = logging.getLogger(__name__)

_EXTENSION_FILE: Path | None | bool = False  # False: not looked for yet; None: unavailable
SQLITE_FORMATS = ("nsys", "rocpd", "rpd")  # the profile formats read from a SQLite file, through this module
SQLITE_HEADER = 100
SIDECARS = ("-wal", "-journal")

# sqlite3 authorizer: reading is all a profile connection may do.
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_ALLOWED_PRAGMAS = {"table_info", "table_xinfo"}


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
        cache = private_dir("duckdb", duckdb.__version__)
        target = cache / "sqlite_scanner.duckdb_extension"
        if not target.exists() or target.stat().st_size != found[0].stat().st_size:
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(found[0], tmp)
            os.replace(tmp, target)
        _EXTENSION_FILE = target
    except Exception as exc:  # any failure means: use the sqlite3 path
        log.info("DuckDB sqlite extension unavailable (%s); using sqlite3 copies", exc)
    return _EXTENSION_FILE  # type: ignore[return-value]


def lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    if action in _ALLOWED_ACTIONS or (action == sqlite3.SQLITE_PRAGMA and arg1 in _ALLOWED_PRAGMAS):
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def connect_readonly(path: Path) -> sqlite3.Connection:
    """sqlite3 connection that reads `path` as SQLite itself would see it, and can do nothing else.

    `immutable=1` makes SQLite skip locking and journal/WAL handling, so no `-shm`/`-wal` file ever
    appears beside the profile; a profile whose committed state lives partly in a `-wal` (or whose
    `-journal` must be rolled back) is read from its recovered private image instead. The URI is
    percent-encoded so `?` or `#` in a path stay part of it."""
    uri = "file:" + urllib.parse.quote(str(readable_image(path))) + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.set_authorizer(_authorize)
    return conn


def open_sqlite(path: Path) -> sqlite3.Connection:
    """connect_readonly with lenient text decoding, checked to be a readable database."""
    try:
        conn = connect_readonly(path)
        conn.text_factory = lenient_text
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(
            f"{shown_path(path)} is not a readable SQLite database ({exc}). If it is a profile, it may be truncated or "
            "still being written; re-export it (e.g. `nsys export --type sqlite`) and try again."
        ) from None
    return conn


def readable_tables(conn: sqlite3.Connection) -> list[str]:
    """The profile's ordinary tables: no views, no virtual tables, no SQLite internals."""
    rows = conn.execute("SELECT name, coalesce(sql, '') FROM sqlite_master WHERE type = 'table'").fetchall()
    return [name for name, sql in rows
            if isinstance(name, str) and not name.lower().startswith("sqlite_")
            and not sql.lstrip().upper().startswith("CREATE VIRTUAL")]


def needs_recovery(path: Path) -> str | None:
    """Why `path` cannot be read in place as SQLite would read it (None: it can).

    Read `immutable`, a WAL-mode database misses the transactions still in its `-wal`, and one with a hot
    `-journal` shows half-written pages; the DuckDB scanner, which takes no URI flags, would instead create
    `-wal`/`-shm` files beside the profile or stumble on the journal."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(SQLITE_HEADER)
    except OSError:
        return None
    if len(header) >= 20 and 2 in (header[18], header[19]):
        return "the database is in WAL mode"
    for sidecar in SIDECARS:
        if os.path.lexists(f"{path}{sidecar}"):
            return f"a {sidecar} file lies beside it"
    return None


def sidecar_identity(path: Path) -> str:
    """Size and mtime of the `-wal`/`-journal` beside `path` (they hold committed or to-be-undone pages,
    so they are part of the profile's content)."""
    parts = []
    for sidecar in SIDECARS:
        try:
            st = os.stat(f"{path}{sidecar}")
            parts.append(f"{sidecar}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    return ";".join(parts)


# Recovered images made by this process: (path, identity) -> private file. A few, as one tool call
# may open the same profile through sqlite3 and the scanner.
_IMAGES: "OrderedDict[tuple[str, str], Path]" = OrderedDict()
_IMAGES_LOCK = threading.Lock()
MAX_IMAGES = 8


def readable_image(path: Path) -> Path:
    """`path` itself when it can be read in place, else a private recovered copy of it.

    The copy takes the database with its `-wal` or `-journal` into the private cache and lets SQLite do
    there what it does when it opens a database: replay the committed WAL frames (an invalid frame ends the
    log, as in SQLite) or roll back a hot journal; then the copy is switched to rollback-journal mode, so
    it reads `immutable` like any other profile. Nothing beside the profile is created or changed."""
    reason = needs_recovery(path)
    if reason is None:
        return path
    try:
        st = os.stat(path)
    except OSError:
        return path
    key = (str(path), f"{st.st_size}:{st.st_mtime_ns}:{sidecar_identity(path)}")
    with _IMAGES_LOCK:
        if key in _IMAGES and _IMAGES[key].exists():
            _IMAGES.move_to_end(key)
            return _IMAGES[key]
        image = _recover(path, reason)
        _IMAGES[key] = image
        while len(_IMAGES) > MAX_IMAGES:
            _drop_image(_IMAGES.popitem(last=False)[1])
    return image


def _recover(path: Path, reason: str) -> Path:
    folder = private_dir("tmp")
    target = folder / f"{os.getpid()}-{uuid.uuid4().hex}.sqlite"
    try:
        shutil.copyfile(path, target)
        for sidecar in SIDECARS:
            if os.path.isfile(f"{path}{sidecar}"):
                shutil.copyfile(f"{path}{sidecar}", f"{target}{sidecar}")
        conn = sqlite3.connect(str(target))
        try:
            conn.set_authorizer(_authorize_recovery)
            conn.execute("PRAGMA journal_mode=DELETE").fetchall()  # checkpoints and removes the copied -wal
        finally:
            conn.close()
    except OSError as exc:
        _drop_image(target)
        raise ProfileError(f"gpuscope could not copy {shown_path(path)} into its cache {shown_path(folder)} "
                           f"({exc.strerror or exc}); free disk space there or set GPUSCOPE_CACHE_DIR to a folder "
                           "with room.") from None
    except sqlite3.DatabaseError as exc:
        _drop_image(target)
        raise ProfileError(f"{shown_path(path)} is not a readable SQLite database: {reason}, and SQLite could not "
                           f"recover it ({exc}). Re-export the profile (e.g. `nsys export --type sqlite`) and try "
                           "again.") from None
    log.info("%s: %s; reading a recovered private copy", path, reason)
    return target


def _authorize_recovery(action: int, arg1, arg2, db_name, trigger) -> int:
    """The recovery connection may switch the journal mode of its own copy and read; nothing else."""
    if action == sqlite3.SQLITE_PRAGMA and arg1 == "journal_mode":
        return sqlite3.SQLITE_OK
    return _authorize(action, arg1, arg2, db_name, trigger)


def _drop_image(image: Path) -> None:
    for suffix in ("", *SIDECARS, "-shm"):
        Path(f"{image}{suffix}").unlink(missing_ok=True)


@atexit.register
def _drop_all_images() -> None:
    with _IMAGES_LOCK:
        while _IMAGES:
            _drop_image(_IMAGES.popitem()[1])


def scanner_config(fmt: str | None = None) -> dict[str, str]:
    """Settings for a DuckDB instance that reads a profile of format `fmt` (None: a SQLite profile), which LOADs the
    scanner (attach_scanner) where it is a SQLite file; none for another format. DuckDB checks an extension's signature
    on every LOAD, a SHA-256 of the 35 MB binary: 0.11 s of each preview and each build of every SQLite profile. The
    file it would check is our copy of the installed package's binary, in folders that only this user can write, so
    the check cannot tell anything that their permissions do not: there it is skipped. Where any folder from the cache
    down to the file is writable by others (a cache on a shared folder), or not ours, LOAD checks the signature. The
    instances given this never run SQL from a profile or a user and never load anything else (autoload is off)."""
    ext = _extension_file() if fmt is None or fmt in SQLITE_FORMATS else None
    if ext is None:
        return {}
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        for item in (ext, *ext.parents[:3]):  # <cache>/duckdb/<version>/sqlite_scanner.duckdb_extension
            st = os.stat(item, follow_symlinks=False)
            if uid is None or st.st_uid != uid or st.st_mode & 0o022 or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                return {}
    except OSError:
        return {}
    return {"allow_unsigned_extensions": "true"}


def attach_scanner(con: duckdb.DuckDBPyConnection, path: Path, alias: str) -> None:
    """Attach `path` (its readable image) read-only through the SQLite extension as catalog `alias`.
    Raises duckdb.Error when the extension is unavailable."""
    ext = _extension_file()
    if ext is None:
        raise duckdb.IOException("the DuckDB sqlite extension is not available")
    con.execute(f"LOAD {quote_literal(str(ext))}")
    con.execute(f"ATTACH {quote_literal(str(readable_image(path)))} AS {quote_ident(alias)} (TYPE sqlite, READ_ONLY)")


class SqliteSource:
    """A profile's SQLite tables while a reader builds the trace model in the store.

    `relation(t)` names a table the reader can scan in SQL: the profile attached as catalog `src`
    when the extension is available, else (and always for text=True) a lenient copy that lands in
    the store as `native."t"`, where sql_query and the tools find it later."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path):
        self.con = con
        self.path = path
        self.sqlite = open_sqlite(path)
        self.tables = readable_tables(self.sqlite)
        self._lower = {t.lower(): t for t in self.tables}
        self._columns: dict[str, list[str]] = {}
        self.copied: set[str] = set()
        self._recorded: dict[tuple[str, str, str], int] = {}  # _record_most's counts so far
        self.attached = False
        try:
            attach_scanner(con, path, "src")
            self.attached = True
        except duckdb.Error as exc:
            log.info("sqlite extension could not attach %s (%s); using sqlite3 copies", path, exc)
        con.execute("CREATE SCHEMA IF NOT EXISTS native")

    # -- schema probing -------------------------------------------------------------------------
    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            self._columns[table] = ([r[1] for r in self.sqlite.execute(f"PRAGMA table_info({quote_ident(table)})")]
                                    if self.has(table) else [])
        return self._columns[table]

    def has_column(self, table: str, column: str) -> bool:
        return column in self.columns(table)

    def query(self, sql: str, params: tuple = (), *, table: str) -> list[tuple]:
        """Run a small SQLite-dialect query through sqlite3 (lenient text) whose result columns hold cells of `table`.
        Cells that were not valid UTF-8 are counted in data_issues under native."table", per column as the query names
        it (_record_most)."""
        with counting_utf8(self.sqlite) as utf8:
            cur = self.sqlite.execute(sql, params)
            rows = cur.fetchall()
        counts, rows = utf8.take([d[0] for d in cur.description or ()], rows)
        shown = native_table_name(table)
        self._record_most([(shown, "repaired", n, f"{quote_ident(c)[:80]}: {NOT_UTF8}") for c, n in counts.items()])
        return rows

    def restart(self) -> None:
        """The reader deleted the data_issues rows of every table but the copies (it reads the profile again): what its
        queries counted is counted again as they run again."""
        copies = {native_table_name(t) for t in self.copied}
        self._recorded = {k: n for k, n in self._recorded.items() if k[0] in copies}

    def _record_most(self, rows: list[tuple[str, str, int, str]]) -> None:
        """Record data_issues rows so that each (table, action, reason) counts the most rows any one read reported: the
        queries of a table (and its copy, which reads every row) may read the same rows, and each counts what it read."""
        for table, action, n, reason in rows:
            key = (table, action, reason)
            have = self._recorded.get(key, 0)
            if n > have:
                record(self.con, [(table, action, n - have, reason)])
                self._recorded[key] = n

    # -- relations for DuckDB SQL ---------------------------------------------------------------
    def relation(self, table: str, *, text: bool = False) -> str:
        """A DuckDB relation name holding `table`'s rows.

        text=True copies the table into the store (native."table") instead of scanning it in place: use it for tables
        with free text that may hold invalid UTF-8, and for small tables where it costs nothing. The copy goes through
        the scanner, and through sqlite3 only where the scanner refuses a cell (invalid UTF-8, a blob in a TEXT column,
        text in an INTEGER one): on the real profiles and every scenario the two copies are equal wherever the scanner
        accepts the table, and the sqlite3 one took 24 s for 3 M NVTX ranges."""
        if not self.has(table):
            raise KeyError(table)
        if self.attached and not text:
            return f"src.{quote_ident(table)}"
        return self.copy(table)

    def copy(self, table: str, *, lenient: bool = False) -> str:
        """Copy `table` into the store as native."table" (once) and return that name. Cells a sqlite3 copy had to change
        are counted in data_issues under that name."""
        target = f"native.{quote_ident(table)}"
        if table in self.copied:
            return target
        if self.attached and not lenient:
            try:
                self.con.execute(f"CREATE TABLE {target} AS SELECT * FROM src.{quote_ident(table)}")
                self.copied.add(table)
                return target
            except duckdb.OutOfMemoryException:
                raise  # not a cell the scanner refused: the sqlite3 copy would need more memory, not less
            except duckdb.Error as exc:  # invalid UTF-8 or mixed types: the lenient path reads it
                log.info("scanner copy of %s failed (%s); copying through sqlite3", table, exc)
                self.con.execute(f"DROP TABLE IF EXISTS {target}")
        self._record_most(copy_lenient(self.con, self.sqlite, table, target))
        self.copied.add(table)
        return target

    def close(self) -> None:
        self.sqlite.close()
        if self.attached:
            try:
                self.con.execute("DETACH src")
            except duckdb.Error:
                pass


# Rows a lenient copy holds in Python at a time: NVTX_EVENTS and the memory-usage table, read this way for their free
# text, hold millions of rows, and a whole table fetched at once took gigabytes.
LENIENT_CHUNK_ROWS = 100_000

# What a lenient copy changes in a cell, as data_issues reasons (the column's name is put in front).
NOT_UTF8 = "text that is not valid UTF-8: the invalid bytes read as U+FFFD"
BLOB_AS_TEXT = "a blob in a column of text: kept as the text of its Python bytes literal (b'...')"
FRACTION_ROUNDED = "a fractional value in an integer column: rounded to an integer"
NOT_A_NUMBER = "a value that is not a number in a column of numbers: read as NULL"
NUMBER_AS_BLOB = "a number in a blob column: kept as the bytes of its text"


def not_of_type(duck: str) -> str:
    return f"a value that does not convert to {duck} (e.g. '' in an integer column): read as NULL"


class _Decoded(str):
    """Text whose bytes were not UTF-8, decoded with U+FFFD in their place (marked so that a reader can count it)."""


class Utf8Repairs:
    """sqlite3 text_factory decoding as lenient_text does and marking the cells it had to repair: after each fetch,
    `take` says how many rows of each column held one and unmarks them (rows are looked at only after a repair)."""

    def __init__(self) -> None:
        self.repaired = self._seen = 0

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.repaired += 1
            return _Decoded(raw.decode("utf-8", errors="replace"))

    def take(self, columns: list[str], rows: list[tuple]) -> tuple[dict[str, int], list[tuple]]:
        """(rows holding a repaired cell, per column; the rows with plain strings: DuckDB cannot scan the marked ones)."""
        if self.repaired == self._seen:
            return {}, rows
        self._seen = self.repaired
        counts = {c: n for c, values in zip(columns, zip(*rows)) if (n := sum(type(v) is _Decoded for v in values))}
        return counts, [tuple(str(v) if type(v) is _Decoded else v for v in r) for r in rows]


@contextmanager
def counting_utf8(sqlite: sqlite3.Connection):
    """The connection's text decoded by a Utf8Repairs (yielded) for the block, as before after it."""
    repairs, saved = Utf8Repairs(), sqlite.text_factory
    sqlite.text_factory = repairs
    try:
        yield repairs
    finally:
        sqlite.text_factory = saved


def copy_lenient(con: duckdb.DuckDBPyConnection, sqlite: sqlite3.Connection, table: str, target: str) -> list[tuple[str, str, int, str]]:
    """CREATE TABLE target from a SQLite table read through sqlite3, LENIENT_CHUNK_ROWS rows at a time, declared types
    kept. A column whose first 10,000 values that are not NULL are all blobs stays BLOB, whatever its declared type (a
    TEXT column holding blobs); a column without a declared type takes the type of its cells when the table is one
    chunk, else text, so that no later chunk can hold a cell the first chunk's type refuses.

    Returns what the copy changed as data_issues rows (table native."table", 'repaired', rows, '"column": reason'):
    per column, the rows whose cell was not valid UTF-8, was a blob in a text column, did not cast to the declared
    type (NULL), was a fraction in an integer column (rounded), was not a number among numbers (NULL) or was a number
    in a blob column (the bytes of its text)."""
    with counting_utf8(sqlite) as utf8:
        repaired = _copy_chunks(con, sqlite, table, target, utf8)
    shown = native_table_name(table)
    return [(shown, "repaired", n, f"{quote_ident(column)[:80]}: {reason}") for (column, reason), n in repaired.items() if n]


def _copy_chunks(con, sqlite, table: str, target: str, utf8: Utf8Repairs) -> dict[tuple[str, str], int]:
    cur = sqlite.execute(f"SELECT * FROM {quote_ident(table)}")
    cols = [d[0] for d in cur.description]
    # Declared SQLite types decide the DuckDB types, so empty or all-NULL columns keep them.
    declared = {r[1]: r[2] for r in sqlite.execute(f"PRAGMA table_info({quote_ident(table)})").fetchall()}
    repaired: dict[tuple[str, str], int] = {}
    number_text = NumberText(sqlite)

    def count(column: str, reason: str, n: int) -> None:
        repaired[(column, reason)] = repaired.get((column, reason), 0) + int(n)

    rows = cur.fetchmany(LENIENT_CHUNK_ROWS)
    chunked = len(rows) == LENIENT_CHUNK_ROWS
    # Which columns hold only blobs is decided as for a whole read (their first 10,000 values that are not NULL), asked
    # of SQLite when there are more chunks: NVTX_EVENTS.binaryData is NULL on every range but NCCL's, which may all
    # come after the first chunk.
    blobs = _blob_columns(sqlite, table, cols) if chunked else None
    select = kept_blob = casts = None
    while True:
        decoded, rows = utf8.take(cols, rows)
        for c, n in decoded.items():
            count(c, NOT_UTF8, n)
        df = _frame(rows, cols)
        if select is None:
            # A column declared TEXT may hold blobs (Nsight's NVTX_EVENTS.binaryData): cast to text, the bytes would
            # come back escaped, so a column of blobs only stays BLOB.
            kept_blob = {c: (blobs[c] if chunked else _blobs_only(df.iloc[:, i])) for i, c in enumerate(cols)}
            casts = {c: t for c in cols
                     if (t := ("BLOB" if kept_blob[c] else duck_type(declared.get(c, ""))) if (chunked or not kept_blob[c]) else None)}
            select = ", ".join(
                f"TRY_CAST({quote_ident(c)} AS {casts[c]}) AS {quote_ident(c)}" if c in casts
                else f"{quote_ident(c)}::VARCHAR AS {quote_ident(c)}" if chunked
                else quote_ident(c)
                for c in cols) or "*"
            verb = f"CREATE TABLE {target} AS"
        else:
            verb = f"INSERT INTO {target}"
        for i, c in enumerate(cols):
            series, changed = _normalise_column(df.iloc[:, i], kept_blob[c] or casts.get(c) == "BLOB", number_text)
            df[c] = series
            for reason, n in changed:
                count(c, reason, n)
        name = f"_df_{uuid.uuid4().hex}"
        con.register(name, df)
        try:
            for c, reason, n in _cast_losses(con, name, df, casts):
                count(c, reason, n)
            con.execute(f"{verb} SELECT {select} FROM {name}")
        finally:
            con.unregister(name)
        if len(rows) < LENIENT_CHUNK_ROWS:
            return repaired
        rows = cur.fetchmany(LENIENT_CHUNK_ROWS)
        if not rows:
            return repaired


def _frame(rows: list[tuple], cols: list[str]) -> pd.DataFrame:
    """The chunk as a DataFrame. pandas' own inference turns integers with a NULL among them into floats (2**56 + 1
    read as 2**56): such a column is taken again from the rows as objects, which _normalise_column types exactly
    (every column as objects took the 3 M-range NVTX_EVENTS copy 10 % longer)."""
    df = pd.DataFrame.from_records(rows, columns=cols)
    for i, c in enumerate(cols):
        if pd.api.types.is_float_dtype(df.dtypes.iloc[i]):
            values = [r[i] for r in rows]
            if any(type(v) is int for v in values):
                df[c] = pd.Series(values, dtype=object, index=df.index)
    return df


def _cast_losses(con, name: str, df: pd.DataFrame, casts: dict[str, str]) -> list[tuple[str, str, int]]:
    """Per column of the chunk: cells TRY_CAST turns into NULL, and fractions a cast to BIGINT rounds (DuckDB rounds
    3.5 and '3.5' to 4)."""
    checks = []
    for c, t in casts.items():
        if t == "VARCHAR":  # every cell is text or a number by now: none is lost
            continue
        q, text = quote_ident(c), not pd.api.types.is_numeric_dtype(df[c].dtype)  # object or pandas' str
        if text or (t == "BIGINT" and pd.api.types.is_float_dtype(df[c].dtype)):  # a float beyond 64 bits: NULL
            checks.append((c, not_of_type(t), f"{q} IS NOT NULL AND TRY_CAST({q} AS {t}) IS NULL"))
        if t == "BIGINT" and (text or pd.api.types.is_float_dtype(df[c].dtype)):
            checks.append((c, FRACTION_ROUNDED, f"TRY_CAST({q} AS DOUBLE) <> TRY_CAST({q} AS BIGINT)"))
    if not checks:
        return []
    counts = con.execute("SELECT " + ", ".join(f"count(*) FILTER (WHERE {w})" for _, _, w in checks) + f" FROM {name}").fetchone()
    return [(c, reason, n) for (c, reason, _), n in zip(checks, counts) if n]


class NumberText:
    """A number's text as SQLite's own CAST gives it: str() of an integer, SQLite's rendering of a REAL (15 significant
    digits, '1.0e+20', 'Inf' in SQLite 3.40, where Python writes '1e+20' and 'inf'), asked of the connection that read
    it once per distinct value. Only numbers found in a blob column come here: damage, counted."""

    def __init__(self, sqlite: sqlite3.Connection) -> None:
        self.sqlite, self._floats = sqlite, {}

    def __call__(self, v) -> str:
        if not isinstance(v, float):
            return str(v)
        if v not in self._floats:
            self._floats[v] = self.sqlite.execute("SELECT CAST(? AS TEXT)", (v,)).fetchone()[0]
        return self._floats[v]


def _normalise_column(series: pd.Series, blob: bool, number_text) -> tuple[pd.Series, list[tuple[str, int]]]:
    """SQLite cells are dynamically typed: make each column one DuckDB-friendly type. Also returns what that changed,
    as (reason, cells): blobs turned into text in a column of text, and values that are not numbers read as NULL in
    a column of numbers (the kind of a column is decided on its first 10,000 values). In a column read as BLOB, a
    text or a number is kept as the bytes of its text (a number's text by `number_text`, NumberText: SQLite's own CAST
    to BLOB; DuckDB reads a column of bytes and text as BLOB) and a number counted."""
    if blob and pd.api.types.is_numeric_dtype(series.dtype):  # numbers only (pandas typed them): TRY_CAST would NULL them
        kept = series.notna()
        return (pd.Series([number_text(v) if k else None for v, k in zip(series.tolist(), kept.tolist())], dtype=object,
                          index=series.index),
                [(NUMBER_AS_BLOB, int(kept.sum()))])
    if series.dtype != object:
        return series, []
    if blob:
        numbers = 0

        def as_blob(v):
            nonlocal numbers
            if v is None or isinstance(v, (bytes, str)):
                return v
            numbers += 1
            return number_text(v)

        return series.map(as_blob), [(NUMBER_AS_BLOB, numbers)]
    kinds = {type(v) for v in series.dropna().head(10000)}
    if kinds <= {int}:
        try:
            return pd.array(series, dtype="Int64"), []
        except (OverflowError, TypeError, ValueError):  # beyond int64 (or not an integer) further down: keep the text
            pass
    elif kinds <= {int, float}:
        numbers = pd.to_numeric(series, errors="coerce")
        return numbers, [(NOT_A_NUMBER, int(series.notna().sum() - numbers.notna().sum()))]
    blobs = 0

    def text(v):
        nonlocal blobs
        if v is None or isinstance(v, str):
            return v
        blobs += isinstance(v, bytes)
        return str(v)

    return series.map(text), [(BLOB_AS_TEXT, blobs)]


def _blob_columns(sqlite: sqlite3.Connection, table: str, cols: list[str]) -> dict[str, bool]:
    """Per column: its first 10,000 values that are not NULL are all blobs (and there is one)."""
    out = {}
    for c in cols:
        n, blobs = sqlite.execute(f"SELECT count(*), coalesce(sum(typeof(v) = 'blob'), 0) FROM (SELECT {quote_ident(c)} AS v "
                                  f"FROM {quote_ident(table)} WHERE {quote_ident(c)} IS NOT NULL LIMIT 10000)").fetchone()
        out[c] = n > 0 and blobs == n
    return out


def _blobs_only(series: pd.Series) -> bool:
    if series.dtype != object:
        return False
    kinds = {type(v) for v in series.dropna().head(10000)}
    return bool(kinds) and kinds <= {bytes}


def duck_type(declared: str) -> str | None:
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


def cleanup_private_copies() -> None:
    """Remove recovered images (and their -wal/-shm) left by processes that died."""
    folder = cache_root() / "tmp"
    if not folder.is_dir():
        return
    for f in folder.glob("*.sqlite*"):
        pid = f.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
