"""The one DuckDB instance through which this process's tools read every open store.

One instance rather than one per profile, so that all open profiles (a 1,000-rank job included) share one
`memory_limit` and one buffer pool: the process's DuckDB memory stays under GPUSCOPE_MEMORY_LIMIT however
many profiles are open, and a query over several ranks' stores is one SQL statement. Stores are ATTACHed
read-only. The instance loads no extension and can reach no file outside the stores folder: external access
is off with the stores and spill folders as the only allowed directories, and the configuration is locked.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import duckdb

from .limits import connect, duckdb_config
from .quote import quote_ident, quote_literal
from .store import lock_down, stores_root

_hubs: dict[tuple[int, str], "Hub"] = {}
_guard = threading.Lock()


class Hub:
    def __init__(self, root: Path):
        self.root = root
        config = duckdb_config()
        self.con = connect(":memory:", {**config, "allow_community_extensions": "false"})
        # The spill folder must be allowed too: without it DuckDB cannot spill and fails at memory_limit.
        allowed = ", ".join(quote_literal(d.rstrip(os.sep) + os.sep) for d in (str(root), config["temp_directory"]))
        self.con.execute(f"SET allowed_directories = [{allowed}]")
        lock_down(self.con)
        self._attached: dict[str, list] = {}  # store file -> [catalog alias, users]
        self._names = itertools.count()
        self._lock = threading.Lock()

    def attach(self, file: Path) -> str:
        """The catalog name of `file` in this instance (attached on first use, counted per user)."""
        key = str(file.resolve())
        with self._lock:
            entry = self._attached.get(key)
            if entry is None:
                alias = f"store{next(self._names)}"
                self.con.execute(f"ATTACH {quote_literal(key)} AS {quote_ident(alias)} (READ_ONLY)")
                entry = self._attached[key] = [alias, 0]
            entry[1] += 1
            return entry[0]

    def detach(self, file: Path) -> None:
        key = str(file.resolve())
        with self._lock:
            entry = self._attached.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._attached[key]
                try:
                    self.con.execute(f"DETACH {quote_ident(entry[0])}")
                except duckdb.Error:  # the process is shutting down
                    pass

    def attached(self) -> int:
        return len(self._attached)


def hub() -> Hub:
    """This process's hub for the current cache folder (tests switch folders; a forked child gets its own)."""
    root = stores_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = (os.getpid(), str(root.resolve()))
    with _guard:
        found = _hubs.get(key)
        if found is None:
            found = _hubs[key] = Hub(Path(key[1]))
        return found


class ModelConnection:
    """What tools get as `trace.con`: cursors on a shared instance whose default catalog is one profile's model.

    A store on disk is attached on first use and can be let go (`release`) while the Trace stays open: a job of
    1,000 ranks is read through its stacked tables (tools/model/job.py), and every attached store costs the
    instance about 0.5 MB of its memory limit, so its ranks' stores are not kept attached."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog: str | None = None, file: Path | None = None,
                 owner: Hub | None = None):
        self._con = con
        self._catalog = catalog
        self._file = file    # the store attached on demand (None: `catalog` is the instance's own, e.g. 'memory')
        self._owner = owner  # the hub `con` belongs to (tests switch cache folders, and with them hubs)
        self._lock = threading.Lock()

    @classmethod
    def of_store(cls, owner: Hub, file: Path) -> "ModelConnection":
        return cls(owner.con, file=file, owner=owner)

    @property
    def catalog(self) -> str:
        with self._lock:
            if self._catalog is None:
                self._catalog = self._owner.attach(self._file)
            return self._catalog

    def release(self) -> None:
        """Detach the store (attached again on the next use)."""
        with self._lock:
            if self._owner is not None and self._catalog is not None:
                self._catalog = None
                self._owner.detach(self._file)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self._con.cursor()
        cur.execute(f"USE {quote_ident(self.catalog)}")
        return cur

    def execute(self, query: str, params=None) -> duckdb.DuckDBPyConnection:
        cur = self.cursor()
        return cur.execute(query, params) if params is not None else cur.execute(query)
