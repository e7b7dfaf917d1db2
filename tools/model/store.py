"""The persistent trace store: each profile's trace model on disk, built once, reopened in milliseconds.

Layout under <cache>/stores/<version>/ (the cache folder: GPUSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/gpuscope):
  <key>/model.duckdb        the trace model tables, plus schema `native` with the profile tables a reader
                            copied while building it (text-bearing tables, Kineto events)
  <key>/native/<sha1>.duckdb a further native table (as table `t`), copied the first time sql_query or
                            describe_table asks for it: big numeric tables are only copied when wanted
  <key>/catalog.json        which native tables exist, where they are, gpuscope's own rocpd views
  <key>/info.json           the profile it was built from (path last seen, format, size); its mtime is the last use
  <key>.lock                held shared by every process reading the store; eviction needs it exclusively
  <key>.build               held exclusively while one process builds the store; the others wait for it

`key` is the profile's content identity (`content_key`), so a file rewritten in place, even with the same
size and mtime, gets a new store, while the same file reopened by any process finds its store. `version`
hashes the model code and the DuckDB version: a store written by other code is never read, only evicted.

A store is built in a temporary folder and renamed into place (atomic), so a reader never sees a half
store and a crash leaves only a temporary folder that the next process removes. When the cache folder
cannot be written (read-only or full disk) the model is built in memory instead, with a warning.

Two kinds of connection, never one doing both jobs:
  * the ingest connection writes model.duckdb. Only gpuscope's readers run on it, with the SQLite
    extension loaded to scan the profile; it is closed before anything else reads the store;
  * read-only access (tools through tools/model/hub.py, user SQL in the sandbox process) happens in DuckDB
    instances that never loaded an extension, with external access off and the configuration locked.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb

from .errors import ProfileError, shown_path
from .limits import cache_bytes, cache_root, connect, duckdb_config, private_dir  # noqa: F401 (cache_bytes: for callers)
from .quote import quote_ident
from .sqlite_source import scanner_config

log = logging.getLogger(__name__)

MODEL_FILE = "model.duckdb"
CATALOG_FILE = "catalog.json"
INFO_FILE = "info.json"
ANSWERS_DIR = "answers"

# Content identity: files up to WHOLE_FILE are hashed whole; larger ones by their first and last EDGE bytes
# (the SQLite header with its change counter and page count; the gzip trailer with CRC-32 and size) and
# SAMPLES blocks spread evenly between. Together with size and mtime this costs < 1 ms on a warm file.
WHOLE_FILE = 8 * 2**20
EDGE = 64 * 2**10
SAMPLES = 64
SAMPLE = 4096

_swept: set[Path] = set()  # version folders whose leftovers this process already cleaned


# The code that decides what a store holds (and how it is laid out); the rest of tools/model (hub, cache, job,
# cluster, limits ...) only reads stores, so changing it must not invalidate them.
STORE_CODE = ("schema.sql", "store.py", "trace.py", "detect.py", "quality.py", "names.py", "sqlite_source.py", "quote.py",
              "readers/*.py")


def _code_version() -> str:
    """A hash of everything that decides what a store holds: the model code and the DuckDB version."""
    here = Path(__file__).parent
    h = hashlib.sha1(duckdb.__version__.encode())
    for f in sorted(p for pattern in STORE_CODE for p in here.glob(pattern)):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


STORE_VERSION = _code_version()


def _answers_version() -> str:
    """A hash of all of gpuscope's analysis code: a saved answer is computed partly in Python (an interval union, a
    post-processing step) that its query text does not show, so any change to tools/ leaves old answers unread."""
    h = hashlib.sha1(STORE_VERSION.encode())
    for f in sorted(Path(__file__).parent.parent.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


ANSWERS_VERSION = _answers_version()


def stores_root() -> Path:
    return cache_root() / "stores"


def version_dir() -> Path:
    return stores_root() / STORE_VERSION


def content_key(path: Path, st: os.stat_result | None = None) -> str:
    """The identity of a profile's content (see WHOLE_FILE above for what is read). A SQLite profile's `-wal` or
    `-journal` is part of what it reads as, so their size and mtime count too."""
    from .sqlite_source import sidecar_identity

    st = st or os.stat(path)
    h = hashlib.blake2b(f"{st.st_size}:{st.st_mtime_ns}:{sidecar_identity(path)}".encode(), digest_size=16)
    with open(path, "rb") as fh:
        if st.st_size <= WHOLE_FILE:
            while chunk := fh.read(2**20):
                h.update(chunk)
        else:
            step = (st.st_size - 2 * EDGE) // (SAMPLES + 1)
            for offset, length in [(0, EDGE), *((EDGE + step * (i + 1), SAMPLE) for i in range(SAMPLES)),
                                   (st.st_size - EDGE, EDGE)]:
                fh.seek(offset)
                h.update(fh.read(length))
    return h.hexdigest()


def store_key(path: Path) -> str:
    return content_key(path)


def store_exists(path: Path) -> bool:
    """True when this content's store is built (a later open_store only reopens it)."""
    try:
        return (version_dir() / content_key(path)).is_dir()
    except OSError:
        return False


def connect_locked(file: Path, memory_limit: int | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection on a store file in a fresh DuckDB instance that can reach nothing else."""
    con = connect(str(file), {**duckdb_config(memory_limit), "allow_community_extensions": "false"}, read_only=True)
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


# -- locks ---------------------------------------------------------------------------------------------
def _flock(path: Path, mode: int) -> int | None:
    """An fd holding flock `mode` on `path`; None when LOCK_NB was asked and the lock is taken. Eviction
    deletes lock files, so a lock taken on a file that was meanwhile unlinked is retried on the new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


class Lease:
    """A shared hold on a store folder: while any process holds one, eviction leaves the store alone."""

    def __init__(self, fd: int | None):
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Store:
    """One profile's trace model: a folder in the cache, or (fallback) an in-memory database."""

    def __init__(self, key: str, folder: Path | None, lease: Lease, memory: duckdb.DuckDBPyConnection | None = None,
                 native: NativeCatalog | None = None, built: bool = False, warning: str | None = None):
        self.key = key
        self.folder = folder
        self.lease = lease
        self.memory = memory      # the in-memory model when the cache could not be written
        self._native = native     # its catalog (on disk it is catalog.json)
        self.built = built        # True when this open built the store (False: reopened)
        self.warning = warning
        self._copy_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @property
    def in_memory(self) -> bool:
        return self.folder is None

    @property
    def model_file(self) -> Path:
        if self.folder is None:
            raise ProfileError("This profile's model is held in memory because gpuscope could not write its cache "
                               f"folder {shown_path(stores_root())}; this needs the on-disk store. Free disk space there "
                               "or set GPUSCOPE_CACHE_DIR to a writable folder with room, then open the profile again.")
        return self.folder / MODEL_FILE

    def catalog(self) -> NativeCatalog:
        if self._native is None:
            self._native = NativeCatalog.from_json(json.loads((self.model_file.parent / CATALOG_FILE).read_text()))
        return self._native

    # -- answers ---------------------------------------------------------------------------------------
    # Figures the tools memoize that depend only on the profile (Trace.memo with persist=...) are kept beside
    # the model, so a new process's first question is read, not recomputed: top_kernels over 10 M kernels is
    # seconds of scanning, its answer a few kB. The key is the tool's own query text and parameters, so a
    # changed query never meets an old answer.
    def _answer_file(self, key: str) -> Path | None:
        if self.folder is None:
            return None
        digest = hashlib.sha256(f"{ANSWERS_VERSION}:{key}".encode("utf-8", "surrogatepass")).hexdigest()
        return self.folder / ANSWERS_DIR / (digest + ".json")

    def load_answer(self, key: str) -> tuple[bool, Any]:
        """(True, value) when an answer to `key` was saved, else (False, None)."""
        f = self._answer_file(key)
        if f is None:
            return False, None
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            return False, None
        if not isinstance(doc, dict) or doc.get("key") != key:
            return False, None
        return True, doc.get("value")

    def save_answer(self, key: str, value: Any) -> None:
        """Save a JSON-able answer (atomically; silently not when the cache cannot be written)."""
        f = self._answer_file(key)
        if f is None:
            return
        tmp = f.with_name(f".{uuid.uuid4().hex}.tmp")
        try:
            f.parent.mkdir(mode=0o700, exist_ok=True)
            tmp.write_text(json.dumps({"key": key, "value": value}))
            os.replace(tmp, f)
        except (OSError, TypeError, ValueError) as exc:
            log.debug("answer not saved in %s (%s)", f.parent, exc)
            tmp.unlink(missing_ok=True)

    # -- native tables ---------------------------------------------------------------------------------
    def native_file(self, table: str) -> Path:
        return self.model_file.parent / "native" / (hashlib.sha1(table.encode("utf-8", "surrogatepass")).hexdigest() + ".duckdb")

    def copy_native(self, profile: Path, table: str) -> Path:
        """native/<sha1>.duckdb holding `table` of the SQLite profile as table t, made once (by any process). A copy
        through sqlite3 also holds the table issues: the cells it had to change, as data_issues rows."""
        target = self.native_file(table)
        with self._guard:
            lock = self._copy_locks.setdefault(table, threading.Lock())
        with lock:
            if target.exists():
                return target
            target.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = target.with_name(f".{uuid.uuid4().hex}.tmp")
            from .sqlite_source import attach_scanner, copy_lenient, open_sqlite

            con = connect(str(tmp), {**duckdb_config(), **scanner_config()})
            try:
                try:
                    attach_scanner(con, profile, "src")
                    con.execute(f"CREATE TABLE t AS SELECT * FROM src.{quote_ident(table)}")
                except duckdb.OutOfMemoryException:
                    raise  # not a cell the scanner refused: the sqlite3 copy would not need less
                except duckdb.Error:  # no extension, invalid UTF-8 or mixed types: the lenient reader copes
                    con.execute("DROP TABLE IF EXISTS t")
                    sqlite = open_sqlite(profile)
                    try:
                        repairs = copy_lenient(con, sqlite, table, "t")
                    finally:
                        sqlite.close()
                    con.execute("CREATE TABLE issues (table_name VARCHAR, action VARCHAR, rows BIGINT, reason VARCHAR)")
                    if repairs:
                        con.executemany("INSERT INTO issues VALUES (?, ?, ?, ?)", repairs)
            except BaseException:
                con.close()
                _remove_db(tmp)
                raise
            con.close()
            os.replace(tmp, target)  # another process may have made the same copy: either is whole
            return target

    def close(self) -> None:
        self.lease.release()
        if self.memory is not None:
            self.memory.close()


Builder = Callable[[duckdb.DuckDBPyConnection], NativeCatalog]


def open_store(profile: Path, fmt: str, build: Builder) -> Store:
    """The store of `profile`: reopened when it exists, else built once by `build` (which writes the model
    through the connection it gets and returns the native catalog), with other processes waiting meanwhile."""
    st = os.stat(profile)
    key = content_key(profile, st)
    try:
        try:
            base = private_dir("stores", STORE_VERSION)
        except ProfileError as exc:  # the cache folder cannot be created
            raise _DiskProblem(str(exc)) from None
        _sweep(base)
        folder = base / key
        while True:
            if folder.is_dir():
                lease = _flock(base / f"{key}.lock", fcntl.LOCK_SH)
                if folder.is_dir():  # not evicted between the check and the lock
                    _touch(folder)
                    return Store(key, folder, Lease(lease))
                os.close(lease)  # type: ignore[arg-type]
            builder = _flock(base / f"{key}.build", fcntl.LOCK_EX)
            try:
                if folder.is_dir():
                    continue  # another process built it while we waited
                _build(folder, profile, fmt, st, build)
            finally:
                os.close(builder)  # type: ignore[arg-type]
            lease = _flock(base / f"{key}.lock", fcntl.LOCK_SH)
            if folder.is_dir():
                _touch(folder)
                store = Store(key, folder, Lease(lease), built=True)
                try:
                    evict(keep={key})
                except OSError:  # eviction is housekeeping: a folder it cannot read must not fail the open
                    pass
                return store
            os.close(lease)  # type: ignore[arg-type]  # evicted at once (cache limit below one store): build again
    except _DiskProblem as problem:
        return _in_memory(key, profile, build, problem.reason)
    except OSError as exc:  # e.g. lock files on a cache that became read-only: read the profile into memory instead
        if not disk_problem(exc):
            raise
        return _in_memory(key, profile, build, str(exc))


class _DiskProblem(Exception):
    def __init__(self, reason: str):
        self.reason = reason


_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")


def disk_problem(exc: BaseException) -> bool:
    """True when `exc` says the cache folder cannot be written (as opposed to a problem with the profile)."""
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return True
    return isinstance(exc, (OSError, duckdb.Error)) and any(w in str(exc) for w in _DISK_WORDS)


def _build(folder: Path, profile: Path, fmt: str, st: os.stat_result, build: Builder) -> None:
    tmp = folder.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        try:
            tmp.mkdir(mode=0o700)
            con = connect(str(tmp / MODEL_FILE), {**duckdb_config(), **scanner_config(fmt)})
        except ProfileError as exc:  # no spill folder
            raise _DiskProblem(str(exc)) from None
        except (OSError, duckdb.Error) as exc:
            if disk_problem(exc):
                raise _DiskProblem(str(exc)) from None
            raise
        try:
            catalog = build(con)
            con.execute("CHECKPOINT")
        except BaseException as exc:
            if disk_problem(exc):
                raise _DiskProblem(str(exc)) from None
            raise
        finally:
            con.close()
        try:
            (tmp / CATALOG_FILE).write_text(json.dumps(catalog.to_json()))
            (tmp / INFO_FILE).write_text(json.dumps({"profile": str(profile), "format": fmt, "profile_bytes": st.st_size,
                                                     "built_unix_s": round(time.time(), 3), "version": STORE_VERSION}))
            os.rename(tmp, folder)
        except OSError as exc:
            raise _DiskProblem(str(exc)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _in_memory(key: str, profile: Path, build: Builder, reason: str) -> Store:
    con = connect(":memory:", duckdb_config(spill=False))
    try:
        catalog = build(con)
    except BaseException:
        con.close()
        raise
    warning = (f"gpuscope could not write its trace store under {shown_path(stores_root())} ({reason}); this profile's "
               "model is held in memory for this process only (reopening reads the profile again, sql_query is "
               "unavailable). Free disk space there or set GPUSCOPE_CACHE_DIR to a writable folder.")
    return Store(key, None, Lease(None), memory=con, native=catalog, built=True, warning=warning)


def _touch(folder: Path) -> None:
    try:
        os.utime(folder / INFO_FILE)
    except OSError:  # a read-only cache still serves its stores
        pass


# -- job stacks: one DuckDB file per set of rank stores (tools/model/job.py), managed with the stores ----------------
JOBS_DIR = ".jobs"  # a dot folder inside the version folder: never mistaken for a store folder


def job_stack_file(key: str) -> Path:
    return version_dir() / JOBS_DIR / f"{key}.duckdb"


def job_stack_lease(file: Path) -> Lease:
    """A shared hold on a job stack (taken before it is looked for or built): eviction leaves it alone meanwhile."""
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Lease(_flock(file.with_suffix(".lock"), fcntl.LOCK_SH))


def write_job_info(file: Path, profiles: list[Path]) -> None:
    """What `gpuscope cache list` shows for a job stack: its first rank and the rank count, the ranks' bytes."""
    total = 0
    for prof in profiles:
        try:
            total += prof.stat().st_size
        except OSError:
            pass
    shown = f"{profiles[0]} (+{len(profiles) - 1} more ranks)" if len(profiles) > 1 else str(profiles[0])
    _atomic_json(file.with_suffix(".json"), {"profile": shown, "format": "job", "profile_bytes": total, "ranks": len(profiles)})


def touch_job(file: Path) -> None:
    try:
        os.utime(file.with_suffix(".json"))
    except OSError:
        pass


def _atomic_json(target: Path, data: dict) -> None:
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, target)


# -- the whole cache: list, evict, clear -------------------------------------------------------------------
@dataclass
class StoreEntry:
    key: str
    folder: Path
    version: str
    current: bool            # written by this gpuscope (False: another version; never read, evicted first)
    profile: str
    format: str
    profile_bytes: int
    store_bytes: int
    last_used_unix_s: float
    in_use: bool


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def list_stores() -> list[StoreEntry]:
    """Every store in the cache, least recently used first."""
    entries = []
    root = stores_root()
    if not root.is_dir():
        return []
    for vdir in root.iterdir():
        if not vdir.is_dir():
            continue
        for folder in vdir.iterdir():
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            try:
                info = json.loads((folder / INFO_FILE).read_text())
                used = (folder / INFO_FILE).stat().st_mtime
            except (OSError, ValueError):
                info, used = {}, 0.0
            probe = _flock(vdir / f"{folder.name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
            if probe is not None:
                os.close(probe)
            entries.append(StoreEntry(key=folder.name, folder=folder, version=vdir.name, current=vdir.name == STORE_VERSION,
                                      profile=str(info.get("profile", "?")), format=str(info.get("format", "?")),
                                      profile_bytes=int(info.get("profile_bytes", 0)), store_bytes=_folder_bytes(folder),
                                      last_used_unix_s=used, in_use=probe is None))
        jobs = vdir / JOBS_DIR
        for file in sorted(jobs.glob("*.duckdb")) if jobs.is_dir() else []:
            try:
                info = json.loads(file.with_suffix(".json").read_text())
                used = file.with_suffix(".json").stat().st_mtime
            except (OSError, ValueError):
                info, used = {}, 0.0
            probe = _flock(file.with_suffix(".lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if probe is not None:
                os.close(probe)
            try:
                size = file.stat().st_size
            except OSError:
                continue
            entries.append(StoreEntry(key=file.stem, folder=file, version=vdir.name, current=vdir.name == STORE_VERSION,
                                      profile=str(info.get("profile", "?")), format="job",
                                      profile_bytes=int(info.get("profile_bytes", 0)), store_bytes=size,
                                      last_used_unix_s=used, in_use=probe is None))
    return sorted(entries, key=lambda e: (e.current, e.last_used_unix_s))


def remove_store(entry: StoreEntry) -> bool:
    """Delete one store (or job stack) unless a process holds it; True when it was deleted."""
    if entry.format == "job":
        lock = entry.folder.with_suffix(".lock")
        fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        try:
            for f in (entry.folder, entry.folder.with_suffix(".json"), Path(f"{entry.folder}.wal"), lock):
                f.unlink(missing_ok=True)
        finally:
            os.close(fd)
        return True
    lock = entry.folder.parent / f"{entry.key}.lock"
    fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        return False
    try:
        shutil.rmtree(entry.folder, ignore_errors=True)
        lock.unlink(missing_ok=True)
        (entry.folder.parent / f"{entry.key}.build").unlink(missing_ok=True)
    finally:
        os.close(fd)
    return True


def evict(keep: set[str] = frozenset(), limit: int | None = None) -> list[StoreEntry]:
    """Delete least recently used stores (other versions first) until the cache fits GPUSCOPE_CACHE_GB.
    Stores in use by any process and those in `keep` stay. Returns what was deleted."""
    limit = cache_bytes() if limit is None else limit
    entries = list_stores()
    total = sum(e.store_bytes for e in entries)
    removed = []
    for e in entries:
        if total <= limit:
            break
        if e.key in keep or e.in_use:
            continue
        if remove_store(e):
            total -= e.store_bytes
            removed.append(e)
    for vdir in stores_root().iterdir() if stores_root().is_dir() else []:
        if vdir.is_dir() and vdir.name != STORE_VERSION and not any(p.is_dir() and p.name != JOBS_DIR for p in vdir.iterdir()) \
                and not any((vdir / JOBS_DIR).glob("*.duckdb")):
            shutil.rmtree(vdir, ignore_errors=True)  # an emptied folder of an older version
    return removed


def clear() -> tuple[list[StoreEntry], list[StoreEntry]]:
    """Delete every store no process holds; returns (deleted, kept because in use)."""
    deleted, kept = [], []
    for e in list_stores():
        (deleted if remove_store(e) else kept).append(e)
    evict(limit=2**62)  # drops emptied version folders
    cleanup_stale_spill()
    return deleted, kept


def iter_leftovers(base: Path) -> Iterator[Path]:
    from .sqlite_source import _alive

    for entry in base.iterdir():
        if entry.name.startswith(".tmp-"):
            pid = entry.name.split("-")[1]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                yield entry


def _sweep(base: Path) -> None:
    """Remove temporary folders of builds whose process died (a crash or kill -9 mid-ingest), once per process."""
    if base in _swept:
        return
    _swept.add(base)
    for entry in iter_leftovers(base):
        shutil.rmtree(entry, ignore_errors=True)
    cleanup_stale_spill()


def cleanup_stale_spill() -> None:
    """Spill folders and private SQLite copies of processes that are gone."""
    from .sqlite_source import _alive, cleanup_private_copies

    base = cache_root() / "spill"
    if base.is_dir():
        for entry in base.iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid() and not _alive(int(entry.name)):
                shutil.rmtree(entry, ignore_errors=True)
    cleanup_private_copies()


def _remove_db(db: Path) -> None:
    for f in (db, Path(f"{db}.wal")):
        f.unlink(missing_ok=True)
