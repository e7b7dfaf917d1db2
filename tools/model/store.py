"""One profile's trace model on disk, and the only connections that may read it.

A store is a private folder under <cache>/stores/:
  model.duckdb             the trace model tables, plus schema `native` with the profile tables a
                           reader copied while building it (text-bearing tables, Kineto events)
  native/<sha1>.duckdb     a further native table (as table `t`), copied the first time sql_query or
                           describe_table asks for it: big numeric tables are only copied when wanted
  catalog.json             which native tables exist, where they are, gpuscope's own rocpd views

Two kinds of connection, never one doing both jobs:
  * the ingest connection writes model.duckdb. Only gpuscope's readers run on it, with the SQLite
    extension loaded to scan the profile; it is closed before anything else reads the store;
  * read-only connections (tools here, user SQL in the sandbox process) open the finished file in a
    fresh DuckDB instance that never loaded an extension, with external access off and the
    configuration locked: no statement on them can open another file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from . import lifecycle
from .errors import ProfileError, shown_path
from .limits import cache_root, duckdb_config, private_dir
from .quote import quote_ident

MODEL_FILE = "model.duckdb"
_swept = False  # stale stores of dead processes are removed once per process
CATALOG_FILE = "catalog.json"


def connect_locked(file: Path, memory_limit: int | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection on a store file in a fresh DuckDB instance that can reach nothing else."""
    con = duckdb.connect(str(file), read_only=True, config={**duckdb_config(memory_limit), "allow_community_extensions": "false"})
    lock_down(con)
    return con


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file access, no extension loading, and no SET to undo either. (Set after connecting: DuckDB refuses
    a temp_directory given in the same config as enable_external_access=false.)"""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@dataclass
class NativeCatalog:
    """The profile's own tables as sql_query sees them under `native`."""

    tables: list[str] = field(default_factory=list)          # every table of the profile, in its own spelling
    in_model: list[str] = field(default_factory=list)        # already in model.duckdb (schema native)
    rows: dict[str, int | None] = field(default_factory=dict)  # row counts where known without a scan
    views: dict[str, list[str]] = field(default_factory=dict)  # gpuscope-defined views: name -> tables they stack
    source: str = "sqlite"                                    # 'sqlite' (copied on demand) or 'model' (all in the model)

    def resolve(self, name: str) -> str | None:
        """The catalog's spelling of a table or view name (SQL identifiers are case-insensitive)."""
        low = name.lower()
        return next((t for t in [*self.tables, *self.views] if t.lower() == low), None)

    def to_json(self) -> dict:
        return {"tables": self.tables, "in_model": self.in_model, "rows": self.rows, "views": self.views, "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> "NativeCatalog":
        return cls(**data)


class Store:
    """The folder holding one profile's trace model."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.model_file = folder / MODEL_FILE
        self._copy_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @classmethod
    def create(cls) -> "Store":
        """A new, empty store private to this process (removed by close)."""
        global _swept
        if not _swept:
            _swept = True
            cleanup_stale()
            # The server's signal path exits without running finalizers: remove this process's stores then.
            lifecycle.on_shutdown(_remove_own)
        base = private_dir("stores")
        folder = base / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        folder.mkdir(mode=0o700)
        return cls(folder)

    def ingest_connection(self) -> duckdb.DuckDBPyConnection:
        try:
            return duckdb.connect(str(self.model_file), config=duckdb_config())
        except duckdb.Error as exc:
            raise ProfileError(f"gpuscope cannot write its trace store in {shown_path(self.folder)} ({exc}). Free disk "
                               "space there or set GPUSCOPE_CACHE_DIR to a writable folder with room.") from None

    def read_only(self) -> duckdb.DuckDBPyConnection:
        return connect_locked(self.model_file)

    # -- native tables ---------------------------------------------------------------------------------
    def save_catalog(self, catalog: NativeCatalog) -> None:
        (self.folder / CATALOG_FILE).write_text(json.dumps(catalog.to_json()))

    def native_file(self, table: str) -> Path:
        return self.folder / "native" / (hashlib.sha1(table.encode("utf-8", "surrogatepass")).hexdigest() + ".duckdb")

    def copy_native(self, profile: Path, table: str) -> Path:
        """native/<sha1>.duckdb holding `table` of the SQLite profile as table t, made once."""
        target = self.native_file(table)
        with self._guard:
            lock = self._copy_locks.setdefault(table, threading.Lock())
        with lock:
            if target.exists():
                return target
            target.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = target.with_name(f".{uuid.uuid4().hex}.tmp")
            from .sqlite_source import attach_scanner, copy_lenient, open_sqlite

            con = duckdb.connect(str(tmp), config=duckdb_config())
            private = None
            try:
                try:
                    private = attach_scanner(con, profile, "src")
                    con.execute(f"CREATE TABLE t AS SELECT * FROM src.{quote_ident(table)}")
                except duckdb.Error:  # no extension, invalid UTF-8 or mixed types: the lenient reader copes
                    con.execute("DROP TABLE IF EXISTS t")
                    sqlite = open_sqlite(profile)
                    try:
                        copy_lenient(con, sqlite, table, "t")
                    finally:
                        sqlite.close()
            except BaseException:
                con.close()
                _remove(tmp)
                raise
            finally:
                if private is not None:
                    private.unlink(missing_ok=True)
            con.close()
            os.replace(tmp, target)
            return target

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _remove(db: Path) -> None:
    for f in (db, Path(f"{db}.wal")):
        f.unlink(missing_ok=True)


def _remove_own() -> None:
    pid = str(os.getpid())
    for sub in ("stores", "spill"):
        base = cache_root() / sub
        for entry in (base.glob(f"{pid}-*") if sub == "stores" else [base / pid]):
            shutil.rmtree(entry, ignore_errors=True)


def cleanup_stale() -> None:
    """Remove stores and spill folders of processes that are gone (a crash or kill -9 leaves them)."""
    from .sqlite_source import _alive, cleanup_private_copies

    for sub in ("stores", "spill"):
        base = cache_root() / sub
        if not base.is_dir():
            continue
        for entry in base.iterdir():
            pid = entry.name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)
    cleanup_private_copies()
