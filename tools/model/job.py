"""A distributed job: many ranks' profiles, their stores built in parallel, queried as one relation.

Each rank's profile gets its own store (tools/model/store.py). Stores not yet built are built in parallel, one
process per core (`build_stores`), or on a Dask cluster when one is named (tools/model/cluster.py). Then the tables
the job analyses read are stacked once into one DuckDB file for the job (`job_stack`: every row with the rank
profile's position, stores attached 64 at a time while it is built), and a question over all ranks is one SQL
statement over `union_sql(...)`: one scan of the stacked table, whatever the number of ranks. The ranks' own
stores are not kept attached: each attached store costs the shared DuckDB instance (tools/model/hub.py) about
0.5 MB of its memory limit, and a UNION ALL of one subquery per rank pins a block per rank and table (1,000 ranks
ran out of a 1 GB limit). No model is held in Python memory.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from .errors import ProfileError, shown_path
from .quote import quote_ident, quote_literal
from .trace import Trace

# Below this many stores to build, the cost of starting worker processes (an interpreter and imports each,
# about a second) exceeds what they save.
MIN_PARALLEL = 4
GLOB_CHARS = set("*?[")
Progress = Callable[[float, str], None]


def expand(items: Iterable[str | Path]) -> list[Path]:
    """Profiles named by `items`: files, folders (every profile directly inside, detected by content) and glob
    patterns (e.g. 'run/rank*.json.gz'), in the order given."""
    from .detect import detect, user_path

    out: list[Path] = []
    for item in items:
        path = user_path(item)
        text = str(path)
        try:
            if GLOB_CHARS & set(text) and not path.exists():
                found = sorted(Path(p) for p in glob.glob(text))
                if not found:
                    raise ProfileError(f"no file matches {shown_path(text)}; check the pattern (e.g. 'run/rank*.json.gz').")
                out += found
            elif path.is_dir():
                found = []
                for p in sorted(path.iterdir()):
                    if p.is_file():
                        try:
                            detect(p)
                        except ProfileError:
                            continue
                        found.append(p)
                if not found:
                    raise ProfileError(f"{shown_path(path)} holds no profile (Nsight SQLite, rocpd, Kineto JSON); pass the "
                                       "folder of the per-rank profiles, or their paths.")
                out += found
            else:
                out.append(path)
        except OSError as exc:  # a name too long for the file system, a folder that cannot be listed ...
            raise ProfileError(f"Cannot read {shown_path(text)}: {exc.strerror or exc}. Check the path and its "
                               "permissions.") from None
    return out  # duplicates stay: the analyses refuse a rank given twice rather than count it once silently


def names_job(item: str | Path) -> bool:
    """True when `item` names several profiles at once: a folder, or a glob pattern that is not itself a file's name."""
    from .detect import user_path

    path = user_path(item)
    try:
        return path.is_dir() or (bool(GLOB_CHARS & set(str(path))) and not path.exists())
    except OSError:  # a name too long for the file system ...: opening it as a profile reports the problem
        return False


def _build_one(path: str) -> tuple[str, str | None, float]:
    """Worker: build (or find) the store of one profile. Returns (path, error message or None, seconds)."""
    from .trace import load_trace

    t0 = time.perf_counter()
    try:
        load_trace(Path(path), store_now=True).close()
    except ProfileError as exc:
        return path, str(exc), time.perf_counter() - t0
    return path, None, time.perf_counter() - t0


def _build_in_processes(paths: list[str], workers: int, progress: Progress) -> list[tuple[str, str | None, float]]:
    """Fresh interpreters (`python -m gpuscope.tools.model.job`), each building a share of the stores and reporting
    one JSON line per profile. Not multiprocessing: its spawn mode re-imports the caller's __main__ (a script
    without a main guard would run again), and fork would copy this process's DuckDB instances and threads."""
    from . import lifecycle

    shares = [paths[i::workers] for i in range(workers)]
    # stderr to files, not pipes: a child that logs a lot would block on a full pipe nobody reads until the end
    errs = [tempfile.TemporaryFile(mode="w+") for share in shares if share]
    children = [subprocess.Popen([sys.executable, "-m", __name__, *share], stdout=subprocess.PIPE, stderr=err, text=True)
                for share, err in zip([s for s in shares if s], errs)]
    unregister = [lifecycle.on_shutdown(c.kill) for c in children]
    results: list[tuple[str, str | None, float]] = []
    try:
        import selectors

        sel = selectors.DefaultSelector()
        for c in children:
            sel.register(c.stdout, selectors.EVENT_READ, c)
        open_pipes = len(children)
        while open_pipes:
            for key, _ in sel.select():
                line = key.fileobj.readline()
                if not line:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                path, err, secs = json.loads(line)
                results.append((path, err, secs))
                progress(len(results) / len(paths), f"built store {len(results)}/{len(paths)}: {Path(path).name}")
        for c, err_file in zip(children, errs):
            err_file.seek(0)
            err = err_file.read()
            if c.wait() != 0:
                done = {r[0] for r in results}
                for p in c.args[3:]:
                    if p not in done:
                        results.append((p, f"the worker building it failed ({err.strip().splitlines()[-1:] or ['no output']})", 0.0))
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
        for u in unregister:
            u()
        for err_file in errs:
            err_file.close()
    return results


def missing_stores(paths: list[Path]) -> list[Path]:
    """The profiles whose store is not built yet (cheap: a content key and a folder check each)."""
    from .detect import regular_file
    from .store import content_key, version_dir

    out = []
    for p in paths:
        try:
            resolved = regular_file(p)
            if not (version_dir() / content_key(resolved)).is_dir():
                out.append(resolved)
        except (ProfileError, OSError):
            out.append(Path(p))  # opening it reports the problem with the usual message
    return out


def build_stores(paths: list[Path], progress: Progress = lambda f, m: None, workers: int | None = None,
                 cluster: str | None = None) -> dict[str, float]:
    """Build the stores of `paths` that do not exist yet, in parallel: worker processes sized to the cores, or
    on the Dask cluster `cluster` names (tools/model/cluster.py; started only when a store is missing).
    Returns seconds per profile built. Raises one ProfileError naming every rank that could not be read."""
    todo = missing_stores(paths)
    if not todo:
        return {}
    if cluster:
        from .cluster import build_on_dask, cluster_client

        with cluster_client(cluster, workers) as client:
            results = build_on_dask(client, [str(p) for p in todo], progress)
    elif len(todo) < MIN_PARALLEL:
        results = []
        for i, p in enumerate(todo):
            results.append(_build_one(str(p)))
            progress((i + 1) / len(todo), f"built store {i + 1}/{len(todo)}: {p.name}")
    else:
        results = _build_in_processes([str(p) for p in todo], workers or min(len(todo), os.cpu_count() or 1), progress)
    failed = [(p, err) for p, err, _ in results if err]
    if failed:
        shown = "; ".join(f"{Path(p).name}: {err}" for p, err in failed[:3])
        more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        raise ProfileError(f"{len(failed)} of {len(paths)} rank profiles could not be read{more}: {shown}")
    return {p: secs for p, _, secs in results}


def open_job(items: Iterable[str | Path], progress: Progress = lambda f, m: None, cluster: str | None = None) -> list[Trace]:
    """Every rank's trace, stores built in parallel first (on `cluster`, default env GPUSCOPE_DASK_CLUSTER, else local
    worker processes). Inside `cache.leases()` (every MCP and CLI call) they come through the cache and are held by the
    lease; outside one, the caller owns them (Trace.close, or garbage collection): through the cache, a job of more
    ranks than GPUSCOPE_CACHE_TRACES would have its first ranks closed while the last ones open."""
    from .cache import in_lease, open_trace
    from .trace import load_trace

    paths = expand(items)
    if not paths:
        raise ProfileError("no profiles given: pass one profile per rank, a folder of them, or a glob pattern.")
    build_stores(paths, progress, cluster=cluster or os.environ.get("GPUSCOPE_DASK_CLUSTER") or None)
    # the job is read through its stacked store: a rank's store is not kept attached (one already open stays so)
    traces = [open_trace(p, attached=False) if in_lease() else load_trace(p, attached=False) for p in paths]
    if len(traces) > 1 and not any(t.store.in_memory for t in traces):
        job_stack(traces, progress)
    return traces


# A job's analyses read these tables of every rank: copied once into the job's stacked store (JobStack), with
# `_part` = the rank profile's position in the job. Four derived tables ride along: each profile's row counts
# (stacked.prime), the args of Kineto NCCL kernels (comm_job_summary's messages), the Nsight start/end ranges that
# ended on another thread (the step choice leaves them out of the GPU projection) and the CPU operators (critical_path
# names its host gaps after them; not the Python functions), so the large tables they come from (cpu_ops,
# native.events, native.NVTX_EVENTS) are not copied whole and no rank's own store is read.
STACKED_TABLES = ("kernels", "memops", "processes", "api_calls", "markers", "nccl_calls", "devices", "data_issues")
DERIVED_TABLES = ("kind_counts", "comm_args", "nvtx_cross_thread", "cpu_op_ranges")
EMPTY_DERIVED = {"kind_counts": "kind VARCHAR, n BIGINT", "comm_args": "name VARCHAR, ts_ns BIGINT, tid BIGINT, args VARCHAR",
                 "nvtx_cross_thread": "pid BIGINT, tid BIGINT, start_ns BIGINT",
                 "cpu_op_ranges": "pid BIGINT, tid BIGINT, start_ns BIGINT, end_ns BIGINT, name VARCHAR"}
# NVTX_EVENTS columns that record the thread a start/end range ended on (Nsight exports since ~2021)
XT_COLUMNS = frozenset({"endGlobalTid", "globalTid", "eventType", "start"})
# Stores attached at once while a job's stacked store is built: each costs DuckDB about 0.5 MB of its memory limit
# while attached, so a batch bounds the memory however many ranks the job has.
STACK_BATCH = 64
MAX_STACKS = 4  # stacked stores kept attached in this process (a compare_traces call holds two)
STACK_VERSION = "3"  # 2: nvtx_cross_thread; 3: cpu_op_ranges


def empty_sql(table: str) -> str:
    """An empty relation with the columns of derived `table`."""
    cols = ", ".join(f"NULL::{typ} AS {col}" for col, typ in (d.split() for d in EMPTY_DERIVED[table].split(", ")))
    return f"SELECT {cols} WHERE FALSE"


def source_sql(table: str, catalog: str, fmt: str, nvtx_columns: frozenset | set = frozenset()) -> str | None:
    """`table` of one store (catalog: its quoted catalog name) as a SELECT; None when the store has no such rows
    (comm_args of a profile that is not Kineto, nvtx_cross_thread of one that is not Nsight or whose NVTX_EVENTS,
    with columns `nvtx_columns`, does not record the ending thread)."""
    if table == "kind_counts":
        from ..analyses.requirements import KINDS  # the count queries the tools' requirements use

        parts = []
        for kind, k in KINDS.items():
            sql = k.count_sql.replace("SELECT count(*) FROM ", f"SELECT '{kind}' AS kind, count(*) AS n FROM {catalog}.main.", 1)
            parts.append(sql)
        parts += [f"SELECT 'launched_{t}', count(*) FROM {catalog}.main.{t} WHERE launched" for t in ("kernels", "memops")]
        return " UNION ALL ".join(parts)
    if table == "comm_args":
        if fmt != "kineto":
            return None
        return (f"SELECT name, ts_ns, tid, args FROM {catalog}.native.events "
                "WHERE cat = 'kernel' AND args LIKE '%Collective name%'")
    if table == "cpu_op_ranges":
        return (f"SELECT pid, tid, start_ns, end_ns, name FROM {catalog}.main.cpu_ops "
                "WHERE category = 'cpu_op' AND pid IS NOT NULL AND tid IS NOT NULL")
    if table == "nvtx_cross_thread":
        if fmt != "nsys" or not XT_COLUMNS <= set(nvtx_columns):
            return None
        return f"""SELECT DISTINCT ((globalTid >> 24) & 16777215)::BIGINT AS pid, (globalTid & 16777215)::BIGINT AS tid,
                          start::BIGINT AS start_ns
                   FROM {catalog}.native."NVTX_EVENTS"
                   WHERE eventType IN (60, 71) AND endGlobalTid IS NOT NULL AND endGlobalTid <> globalTid"""
    schema_table = table if "." in table else f"main.{table}"
    return f"SELECT * FROM {catalog}.{schema_table}"


def _nvtx_columns(con, catalog: str) -> frozenset:
    """The columns of native.NVTX_EVENTS in attached store `catalog` (unquoted), empty without that table."""
    return frozenset(c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = 'native' "
        "AND table_name = 'NVTX_EVENTS'", [catalog]).fetchall())


class JobStack:
    """One DuckDB file holding STACKED_TABLES and DERIVED_TABLES of several stores, each row with `_part` (the
    store's position when it was built). Built once per ordered set of stores (by any process) and attached once."""

    def __init__(self, file: Path, members: dict[str, int], lease):
        self.file = file
        self.members = members  # store model file -> _part
        self.lease = lease      # shared hold on the file while attached here: cache eviction leaves it alone
        from .hub import hub

        self.catalog = hub().attach(file)

    def close(self) -> None:
        from .hub import hub

        hub().detach(self.file)
        self.lease.release()


_stacks: "dict[str, JobStack]" = {}       # stack file -> its JobStack, oldest first
_member_of: "dict[str, JobStack]" = {}    # store model file -> the newest stack holding it
_stacks_lock = threading.Lock()


def job_stack(traces: list[Trace], progress: Progress = lambda f, m: None) -> JobStack:
    """The stacked store of `traces` (in this order), built when missing: stores attached STACK_BATCH at a time to a
    build connection of their own, each table copied with one INSERT per batch; written to a temporary file and
    renamed, so a concurrent builder or a crash leaves no half-built stack behind."""
    from .limits import connect, duckdb_config
    from .store import evict, job_stack_file, job_stack_lease, touch_job, write_job_info

    files = [str(t.store.model_file) for t in traces]
    key = hashlib.sha1("\n".join([STACK_VERSION, *files]).encode()).hexdigest()
    target = job_stack_file(key)
    with _stacks_lock:
        found = _stacks.get(str(target))
        if found is not None:
            touch_job(target)
            return found
        lease = job_stack_lease(target)
        built = False
        if not target.is_file():
            built = True
            tmp = target.with_name(f"{key}.{os.getpid()}.{threading.get_ident()}.tmp")
            con = connect(str(tmp), duckdb_config())
            try:
                created: set[str] = set()
                for start in range(0, len(traces), STACK_BATCH):
                    batch = traces[start:start + STACK_BATCH]
                    names = [quote_ident(f"s{j}") for j in range(len(batch))]
                    for name, t in zip(names, batch):
                        con.execute(f"ATTACH {quote_literal(str(t.store.model_file))} AS {name} (READ_ONLY)")
                    nvtx = [_nvtx_columns(con, f"s{j}") if t.format == "nsys" else frozenset() for j, t in enumerate(batch)]
                    for table in STACKED_TABLES + DERIVED_TABLES:
                        parts = [f"SELECT {start + j} AS _part, * FROM ({sql})" for j, (name, t) in enumerate(zip(names, batch))
                                 if (sql := source_sql(table, name, t.format, nvtx[j])) is not None]
                        if parts:
                            verb = f"INSERT INTO {table} " if table in created else f"CREATE TABLE {table} AS "
                            con.execute(verb + " UNION ALL ".join(parts))
                            created.add(table)
                    for name in names:
                        con.execute(f"DETACH {name}")
                    progress(min(1.0, (start + len(batch)) / len(traces)),
                             f"stacked {start + len(batch)}/{len(traces)} ranks into one job store")
                for table in DERIVED_TABLES:
                    if table not in created:
                        con.execute(f"CREATE TABLE {table} (_part INTEGER, {EMPTY_DERIVED[table]})")
                con.close()
                write_job_info(target, [Path(t.path) for t in traces])
                os.replace(tmp, target)
            except BaseException:
                con.close()
                tmp.unlink(missing_ok=True)
                lease.release()
                raise
        touch_job(target)
        stack = JobStack(target, {f: i for i, f in enumerate(files)}, lease)
        _stacks[str(target)] = stack
        for f in files:
            _member_of[f] = stack
        while len(_stacks) > MAX_STACKS:
            old = _stacks.pop(next(iter(_stacks)))
            for f in [f for f, st in _member_of.items() if st is old]:
                del _member_of[f]
            old.close()
        if built:
            evict(keep={key})  # the cache size limit (GPUSCOPE_CACHE_GB) counts job stacks too
        return stack


def release_stacks() -> None:
    """Detach every job stack this process holds, so that the cache may evict them (`gpuscope cache clear` in
    another process, the size limit); the next job question attaches its stack again."""
    with _stacks_lock:
        while _stacks:
            _stacks.pop(next(iter(_stacks))).close()
        _member_of.clear()


def union_sql(traces: list[Trace], table: str, columns: str, where: str = "TRUE", only: set[int] | None = None) -> str:
    """`table` of every trace (of the positions in `only`, when given) with column `part` = the trace's position in
    `traces`, read from the job's stacked store (job_stack; built on first use): one scan per stacked store, whatever
    the number of ranks. `table` is one of STACKED_TABLES or DERIVED_TABLES; `table`, `columns` and `where` are
    gpuscope's own SQL text (never from a profile); catalog names go through quote_ident."""
    picked = [(i, t) for i, t in enumerate(traces) if only is None or i in only]
    for _, t in picked:
        if t.store.in_memory:
            raise ProfileError(f"{t.path.name} is held in memory (the trace-store cache cannot be written), so it cannot be "
                               "queried together with the other ranks. Free disk space in the cache folder or set "
                               "GPUSCOPE_CACHE_DIR to a writable folder.")
    with _stacks_lock:
        holders = [_member_of.get(str(t.store.model_file)) for t in traces]
    if any(h is None for h in holders):
        stack = job_stack(traces)
        holders = [stack] * len(traces)
    by_stack: dict[int, tuple[JobStack, list[tuple[int, int]]]] = {}
    for i, t in picked:
        st = holders[i]
        by_stack.setdefault(id(st), (st, []))[1].append((st.members[str(t.store.model_file)], i))
    if not by_stack:  # `only` picked no trace: an empty relation of the same columns
        return f"SELECT NULL::BIGINT AS part, {columns} FROM {quote_ident(holders[0].catalog)}.main.{table} WHERE FALSE"
    selects = []
    for st, pairs in by_stack.values():
        mapping = ", ".join(f"({local}, {i})" for local, i in pairs)
        selects.append(f"""SELECT m.part, x.* EXCLUDE (_part) FROM (
            SELECT _part, {columns} FROM {quote_ident(st.catalog)}.main.{table} WHERE {where}) x
            JOIN (VALUES {mapping}) m(_part, part) ON x._part = m._part""")
    return "\nUNION ALL\n".join(selects)


def job_df(query: str, params: list | dict | None = None, frames: dict | None = None, source=None):
    """Run one query over the job's stores as a pandas DataFrame; `frames`: DataFrames the query reads by name
    (registered on its cursor only); `source`: a connection to run it on instead (one profile's model)."""
    from .hub import hub

    cur = (source or hub().con).cursor()
    try:
        for name, df in (frames or {}).items():
            cur.register(name, df)
        return cur.execute(query, params).df()
    finally:
        cur.close()


def job_sql(traces: list[Trace], query: str, params: list | None = None) -> list[tuple]:
    """Run one query over several traces' stores (they share the process's DuckDB instance)."""
    from .hub import hub

    cur = hub().con.cursor()
    try:
        return cur.execute(query, params).fetchall() if params is not None else cur.execute(query).fetchall()
    finally:
        cur.close()


if __name__ == "__main__":  # a store-building worker of _build_in_processes
    for arg in sys.argv[1:]:
        print(json.dumps(_build_one(arg)), flush=True)
