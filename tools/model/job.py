"""A distributed job: many ranks' profiles, their stores built in parallel, queried as one relation.

Each rank's profile gets its own store (tools/model/store.py). Stores not yet built are built in parallel, one
process per core (`build_stores`), or on a Dask cluster when one is named (tools/model/cluster.py);
then every store is attached to the process's one DuckDB instance (tools/model/hub.py), and a question over all
ranks is one SQL statement over `union_sql(...)`: the same table of every store stacked with its position in
the job. No model is held in Python memory, and the instance's memory limit covers all ranks together.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from .errors import ProfileError, shown_path
from .quote import quote_ident
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
    return [open_trace(p) for p in paths] if in_lease() else [load_trace(p) for p in paths]


def union_sql(traces: list[Trace], table: str, columns: str, where: str = "TRUE") -> str:
    """`table` of every trace stacked, with column `part` = the trace's position in `traces`. `table`, `columns`
    and `where` are gpuscope's own SQL text (never from a profile); store names go through quote_ident."""
    parts = []
    for i, t in enumerate(traces):
        if t.store.in_memory:
            raise ProfileError(f"{t.path.name} is held in memory (the trace-store cache cannot be written), so it cannot be "
                               "queried together with the other ranks. Free disk space in the cache folder or set "
                               "GPUSCOPE_CACHE_DIR to a writable folder.")
        parts.append(f"SELECT {i} AS part, {columns} FROM {quote_ident(t.con.catalog)}.main.{table} WHERE {where}")
    return "\nUNION ALL\n".join(parts)


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
