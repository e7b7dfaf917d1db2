"""Host annotation ranges and their GPU projection, shared by marker_summary and iterations.

Ranges are the markers of kind 'push_pop', 'start_end' (NVTX, rocTX) and 'annotation' (PyTorch
record_function / ProfilerStep); instant marks and PyTorch's GPU-side 'gpu_annotation' copies are not
ranges. Every range gets a deterministic id `rid` (order: pid, tid, start, longer first, name, domain,
kind), so on one thread a range's enclosing ranges always have smaller ids.

Projection follows Nsight's `nvtx_gpu_proj_trace`: a GPU op (kernel, memcpy, memset) belongs to a range
when the host API call that launched it (same process, same correlation id) lies inside the range —
range.start <= call.start and call.end <= range.end — on the SAME thread. Work launched by other threads
(a DataLoader worker, PyTorch's autograd thread) is not projected; GPU ops without their launching call
in the profile cannot be projected. Nsight start/end ranges that end on another thread than they started
(NVTX_EVENTS.endGlobalTid) are left out of the projection, as nsys does.

Nesting: a range's parent is the tightest range on the same thread that encloses it
(parent.start <= start and end <= parent.end; of several, the latest-starting, then shortest one; of
identical intervals the first in rid order); the path is the parent chain joined with '/'.

Joins between ranges and API calls use one HUGEINT key per (thread, time): thread_index * 2^64 + ns,
so DuckDB runs containment as an inequality (IE) join instead of a per-thread nested loop. It does so only over
tables, in a statement naming no CTE (containment.py): `tables` makes the ranges, the linked GPU ops and the
projection's pairs temp tables of a cursor, and the tools read those.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

import duckdb
import numpy as np

from ..model.job import XT_COLUMNS
from ..model.quality import CORRELATION_IDS_UNIQUE
from ..model.trace import Trace
from .containment import SHIFT, temp_table_after, temp_tables
from .requirements import GPU, gap_text

RANGE_KINDS = ("push_pop", "start_end", "annotation")
RANGE_KINDS_SQL = ", ".join(f"'{k}'" for k in RANGE_KINDS)
PATH_DEPTH = 16                  # ancestors shown in a path at most (deeper chains are cut at the root side)


@dataclass(frozen=True)
class CrossThread:
    keys: tuple[tuple[int, int, int], ...]  # (pid, tid, start_ns) of ranges that ended on another thread
    note: str                               # how (or whether) such ranges can be recognised in this format


def cross_thread(trace: Trace) -> CrossThread:
    """Start/end ranges that ended on a different thread. Only Nsight exports record the ending thread
    (NVTX_EVENTS.endGlobalTid); the trace model has no column for it, so it is read from the native table."""
    return trace.memo(("projection.cross_thread",), lambda: _cross_thread(trace))


def _cross_thread(trace: Trace) -> CrossThread:
    if trace.format != "nsys":
        why = {"kineto": "PyTorch annotations begin and end on one thread",
               "rocpd": "rocpd records one thread per rocTX region, so a range ending on another thread cannot be recognised",
               "rpd": "legacy RPD records one thread per range"}.get(trace.format, "the format records one thread per range")
        return CrossThread((), why)
    cols = trace.native_columns("NVTX_EVENTS")
    if not XT_COLUMNS <= cols:
        return CrossThread((), "the export has no NVTX_EVENTS.endGlobalTid column "
                               "so start/end ranges ending on another thread cannot be recognised")
    rows = trace.sql(
        """SELECT DISTINCT ((globalTid >> 24) & 16777215)::BIGINT, (globalTid & 16777215)::BIGINT, start::BIGINT
           FROM native."NVTX_EVENTS"
           WHERE eventType IN (60, 71) AND endGlobalTid IS NOT NULL AND endGlobalTid <> globalTid""")
    return CrossThread(tuple((int(p), int(t), int(s)) for p, t, s in rows),
                       "Nsight start/end ranges whose end was recorded on another thread (NVTX_EVENTS.endGlobalTid)")


def calls_unique(traces: list[Trace]) -> bool:
    """Whether no two API calls of any of `traces` share a (pid, correlation id): trace_meta's correlation_ids_unique,
    written by the model check (quality.py)."""
    return all(t.meta.get(CORRELATION_IDS_UNIQUE) == "true" for t in traces)


def launch_sql(calls: str, keys: str, unique: bool) -> str:
    """The launching call of each (`keys`, correlation id) pair: of `calls` (columns `keys`, tid, correlation_id,
    start_ns, end_ns), those with a process, thread and correlation id, the first one of each pair by (start_ns,
    end_ns, tid) - calls equal in all three give the same row. A window, which spills (an arg_min of the call's
    columns ran out of memory at 10 M calls, op_tree.with_sql); where `unique` (calls_unique) every call is its pair's
    one and none is ranked: grouping 2 M calls took 1.1 s of a projection's 1.3 s."""
    rank = "" if unique else f"QUALIFY row_number() OVER (PARTITION BY {keys}, correlation_id ORDER BY start_ns, end_ns, tid) = 1"
    return f"""SELECT {keys}, correlation_id, tid, start_ns, end_ns FROM ({calls})
               WHERE correlation_id IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL {rank}"""


def with_sql(trace: Trace, gops: str | None = None) -> str:
    """A WITH clause defining
       thr(pid, tid, k)                          threads of ranges and API calls, numbered from 0;
       rng(rid, pid, tid, start_ns, end_ns, dur_ns, name, domain, kind, source, cross_thread, ks, ke);
       call(pid, correlation_id, ks, ke)         the launching API call of each (pid, correlation id), keyed;
       gop(op_id, op, device_id, stream_id, start_ns, end_ns, dur_ns, pid, ks, ke)
           linked GPU ops (kernel/copy/set) with the keys of their launching API call; read from `gops`, an
           op_tree.Launchers table (the same ops and calls), where the caller has one, instead of grouping every API
           call by correlation id again; from `gops`, only those launched on a thread with ranges (the others are in
           no pair: an export without ranges copies none of its millions of GPU ops) and keyed by the temp table
           _proj_thr (`thr`, made first by `tables`: as a CTE, DuckDB guessed its few threads larger than the GPU
           ops and hashed the ops, out of a 64 MiB limit at 2 M). Without `gops` it joins the temp table _proj_call
           (`call`, made first by `tables`).
    A containment join of rng and gop below this clause is planned without IEJoin, quadratic in the ranges of a
    thread (containment.py): join them as `tables` does, over temp tables."""
    keys = cross_thread(trace).keys
    xt = (" UNION ALL ".join(f"SELECT {p}::BIGINT AS pid, {t}::BIGINT AS tid, {s}::BIGINT AS start_ns" for p, t, s in keys)
          if keys else "SELECT NULL::BIGINT AS pid, NULL::BIGINT AS tid, NULL::BIGINT AS start_ns WHERE FALSE")
    return f"""
    WITH thr AS (
        SELECT pid, tid, (row_number() OVER (ORDER BY pid, tid) - 1)::HUGEINT AS k FROM (
            SELECT DISTINCT pid, tid FROM markers WHERE kind IN ({RANGE_KINDS_SQL}) AND pid IS NOT NULL AND tid IS NOT NULL
            UNION SELECT DISTINCT pid, tid FROM api_calls WHERE pid IS NOT NULL AND tid IS NOT NULL)),
    xt AS ({xt}),
    rng AS (
        SELECT row_number() OVER (ORDER BY m.pid, m.tid, m.start_ns, m.end_ns DESC, m.name, m.domain, m.kind) AS rid,
               m.pid, m.tid, m.start_ns, m.end_ns, m.dur_ns, m.name, coalesce(m.domain, '') AS domain, m.kind, m.source,
               m.kind = 'start_end' AND EXISTS (SELECT 1 FROM xt WHERE xt.pid = m.pid AND xt.tid = m.tid AND xt.start_ns = m.start_ns)
                   AS cross_thread,
               thr.k * {SHIFT} + m.start_ns AS ks, thr.k * {SHIFT} + m.end_ns AS ke
        FROM markers m JOIN thr ON thr.pid = m.pid AND thr.tid = m.tid
        WHERE m.kind IN ({RANGE_KINDS_SQL})),
    launch AS ({launch_sql("SELECT pid, tid, correlation_id, start_ns, end_ns FROM api_calls", "pid", calls_unique([trace]))}),
    call AS (
        SELECT l.pid, l.correlation_id, thr.k * {SHIFT} + l.start_ns AS ks, thr.k * {SHIFT} + l.end_ns AS ke
        FROM launch l JOIN thr ON thr.pid = l.pid AND thr.tid = l.tid),
    gop AS ({_gop_sql(gops)})
    """


def _gop_sql(gops: str | None) -> str:
    if gops is not None:
        return f"""
        SELECT g.gop_id AS op_id, g.op, g.device_id, g.stream_id, g.start_ns, g.end_ns, g.dur_ns, g.pid,
               thr.k * {SHIFT} + g.call_start_ns AS ks, thr.k * {SHIFT} + g.call_end_ns AS ke
        FROM {gops} g JOIN _proj_thr thr ON thr.pid = g.pid AND thr.tid = g.call_tid
        SEMI JOIN (SELECT DISTINCT pid, tid FROM markers WHERE kind IN ({RANGE_KINDS_SQL})) r ON r.pid = g.pid AND r.tid = g.call_tid
        WHERE g.linked"""
    # No `correlation_id IS NOT NULL` on the ops (the join drops NULL ids): with it DuckDB guesses the ops at a fifth
    # of their number and hashes them, not the narrower calls (step_choice.choice_tables).
    return """
        SELECT o.op_id, o.op, o.device_id, o.stream_id, o.start_ns, o.end_ns, o.dur_ns, o.pid, c.ks, c.ke
        FROM (SELECT rowid * 2 AS op_id, 'kernel' AS op, device_id, stream_id, start_ns, end_ns, dur_ns, pid, correlation_id
              FROM kernels
              UNION ALL
              SELECT rowid * 2 + 1, op, device_id, stream_id, start_ns, end_ns, dur_ns, pid, correlation_id FROM memops) o
        JOIN _proj_call c ON c.pid = o.pid AND c.correlation_id = o.correlation_id"""


# The projection's pairs, from the temp tables of `tables`: a statement naming no CTE but this one (named once, so
# inlined), so the containment join is an IEJoin.
PAIRS = """
    WITH prj AS (
        SELECT r.rid, g.op_id, g.op, g.device_id, g.start_ns, g.end_ns, g.dur_ns
        FROM _proj_rng r JOIN _proj_gop g ON r.ks <= g.ks AND g.ke <= r.ke
        WHERE NOT r.cross_thread)"""


@contextmanager
def tables(cur: duckdb.DuckDBPyConnection, trace: Trace, want: tuple[str, ...] = ("rng", "gop", "prj"),
           gops: str | None = None) -> Iterator[None]:
    """For the block, temp tables of `cur` (a cursor of trace.con) named _proj_<name> for each name in `want`:
       _proj_rng, _proj_gop  with_sql's rng and gop (gop from `gops` where given, see with_sql);
       _proj_prj(rid, op_id, op, device_id, start_ns, end_ns, dur_ns)  every (range, GPU op) pair of the projection
                             (cross-thread ranges excluded), joined as an IEJoin (needs rng and gop).
    Temp tables belong to the cursor's connection, so concurrent tool calls never share them."""
    w = with_sql(trace, gops)
    with ExitStack() as made:
        if "rng" in want or "prj" in want:
            made.enter_context(temp_tables(cur, w, {"_proj_rng": "rng"}))
        if "gop" in want or "prj" in want:
            made.enter_context(temp_table_after(cur, w, "_proj_gop", "gop", {"_proj_call": "call"} if gops is None else {"_proj_thr": "thr"}))
        if "prj" in want:
            made.enter_context(temp_tables(cur, PAIRS, {"_proj_prj": "prj"}))
        yield


# Per projected GPU op (gop_id = gop.op_id), the rid of the innermost range it belongs to (the largest: on one thread an
# enclosing range has a smaller one), over the temp tables of `tables`.
INNERMOST = "SELECT op_id AS gop_id, max(rid) AS rid FROM _proj_prj GROUP BY op_id"


def projection_absent_reason(trace: Trace) -> str | None:
    """Why no GPU projection can be made for this profile, or None when it can."""
    if trace.count("api_calls") == 0:
        return "GPU work cannot be tied to the ranges that launched it: " + gap_text(trace, ("api_calls",))
    if trace.count("kernels") + trace.count("memops") == 0:
        return "there is no GPU work to project: " + gap_text(trace, GPU)
    linked = trace.memo(("projection.linked",), lambda: int(trace.scalar(
        "SELECT (SELECT count(*) FROM kernels WHERE launched) + (SELECT count(*) FROM memops WHERE launched)")))
    if linked == 0:
        return "no GPU op has its launching API call in the profile (correlation ids do not match), so none can be projected"
    return None


@dataclass(frozen=True)
class Tree:
    """Nesting of all ranges, indexed by rid - 1."""

    rid: np.ndarray      # 1..n
    parent: np.ndarray   # rid of the parent, 0 for top-level ranges
    depth: np.ndarray    # number of enclosing ranges on the same thread (0 = top level)
    path: np.ndarray     # object array: 'root/.../name'


def tree(trace: Trace) -> Tree:
    return trace.memo(("projection.tree",), lambda: _tree(trace))


def _tree(trace: Trace) -> Tree:
    cur = trace.con.cursor()
    try:
        # The ranges as a temp table, then a self-join naming no CTE (containment.py). Of the three conditions the
        # IEJoin works on the first two (rid order, then ends); on one thread an earlier rid starts no later, so
        # p.ks <= c.ks is implied there and ranges of other threads fail c.ke <= p.ke.
        with tables(cur, trace, ("rng",)):
            data = cur.execute("""
                WITH par AS (SELECT c.rid, max(p.rid) AS parent, count(*) AS depth
                             FROM _proj_rng c JOIN _proj_rng p ON p.rid < c.rid AND c.ke <= p.ke AND p.ks <= c.ks GROUP BY c.rid)
                SELECT r.rid, coalesce(par.parent, 0) AS parent, coalesce(par.depth, 0) AS depth, r.name
                FROM _proj_rng r LEFT JOIN par USING (rid) ORDER BY r.rid""").fetchnumpy()
    finally:
        cur.close()
    rid = np.asarray(data["rid"], dtype=np.int64)
    parent = np.asarray(data["parent"], dtype=np.int64)
    names = np.asarray(data["name"], dtype=object)
    path = names.copy()
    up = parent.copy()
    for _ in range(PATH_DEPTH - 1):  # one vectorised step per nesting level, not per range
        has = up > 0
        if not has.any():
            break
        path[has] = names[up[has] - 1] + "/" + path[has]
        up[has] = parent[up[has] - 1]
    if (up > 0).any():
        path[up > 0] = "…/" + path[up > 0]
    return Tree(rid=rid, parent=parent, depth=np.asarray(data["depth"], dtype=np.int64), path=path)


_DIGITS = r"[0-9]+"


def normalised_sql(column: str = "name") -> str:
    """SQL: the name with every run of digits replaced by '<N>' ('ProfilerStep#17' -> 'ProfilerStep#<N>')."""
    return f"regexp_replace({column}, '{_DIGITS}', '<N>', 'g')"
