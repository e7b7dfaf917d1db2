"""gpu_timeline: where each GPU's time goes — computation, exposed communication, exposed memcpy, idle.

TraceLens's definitions (`GPUEventAnalyser`), computed per device (and per process when several
processes share one device), plus an all-device merge (TraceLens's PyTorch path merges every GPU of
a trace into one timeline):
  * communication = kernels whose name matches the communication patterns (comm_patterns.py);
  * memcpy = memory copies (and ROCm copy kernels `MEMORY_COPY_*`, `__amd_rocclr_copyBuffer*`);
  * computation = every other kernel AND memsets;
  * COMP, COMM, MEMCPY, ALL = interval unions (streams ignored; touching intervals join);
  * total = last end − first start of ALL; exposed comm = |COMM − COMP|; exposed memcpy =
    |MEMCPY − COMP − COMM|; busy = |ALL|; idle = total − busy;
    computation + exposed_comm + exposed_memcpy + idle = total, exactly (integer ns).
Plus HTA's communication/computation overlap |COMM ∩ COMP| / |COMM| and HTA's per-stream idle
breakdown (`get_idle_time_breakdown`): each idle gap of a stream is `host_wait` when the op after it
was launched (its API call started) after the stream drained, else `kernel_wait` when the gap is
shorter than the threshold (HTA: consecutive_kernel_delay, 30 µs as the code applies it), else `other`;
gaps before ops whose launch is not in the profile are `launch_unknown` (HTA drops such ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .comm_patterns import comm_patterns as active_patterns
from .comm_patterns import is_comm_sql
from .common import (GpuTimeSplit, ToolResult, WholeGraphTime, Window, data_issue_notes, data_issues_field, pct, resolve_selection,
                     skipped_note, split_gpu_time, whole_graph_time)
from .intervals import Union
from .requirements import require
from .stacked import reach_sql, union_measures_sql, union_stats_from_reach_sql

ROCM_COPY_KERNEL = r"^(MEMORY_COPY_|__amd_rocclr_copyBuffer)"
DEFAULT_KERNEL_WAIT_THRESHOLD_NS = 30_000
COMP, COMM, MEMCPY, GRAPH = 0, 1, 2, 3  # op classes (integer codes, so they can partition interval unions)
# GRAPH: whole-graph replays (Nsight --cuda-graph-trace=graph), whose kernels are not traced: counted in computation
# (as GPU work that is not known communication), and measured on their own so that every figure can say how much.


def timeline_ops_sql(trace: Trace, where: str, lo: int, hi: int, include_unlinked: bool,
                     patterns: list[str] | None) -> str:
    """GPU ops overlapping the window, clipped to it, with class `cls` (COMP / COMM / MEMCPY), the kernels' recorded
    `collective` (comm_patterns.collective_index_sql) and an `owner` partition (the device's only process, or each process when several share the device)."""
    comm = is_comm_sql("name", patterns)
    linked = "" if include_unlinked else " AND launched"
    # A kernel's class follows from its name: the patterns run once per distinct name (a profile has few), not per kernel.
    return f"""
        WITH named AS (
            SELECT name, CASE WHEN {comm} THEN {COMM} WHEN regexp_matches(name, '{ROCM_COPY_KERNEL}') THEN {MEMCPY}
                              ELSE {COMP} END AS name_cls
            FROM (SELECT DISTINCT name FROM kernels)),
        ops AS (
            SELECT device_id, pid, tid, stream_id, correlation_id, launched, name, short_name, collective,
                   greatest(start_ns, {lo}) AS start_ns, least(end_ns, {hi}) AS end_ns,
                   CASE WHEN whole_graph THEN {GRAPH} ELSE name_cls END AS cls
            FROM kernels JOIN named USING (name) WHERE {where}{linked}
            UNION ALL
            SELECT device_id, pid, tid, stream_id, correlation_id, launched,
                   CASE WHEN op = 'set' THEN 'memset' ELSE 'memcpy ' || kind END, CASE WHEN op = 'set' THEN 'memset' ELSE 'memcpy ' || kind END,
                   NULL, greatest(start_ns, {lo}), least(end_ns, {hi}), CASE WHEN op = 'copy' THEN {MEMCPY} ELSE {COMP} END
            FROM memops WHERE {where}{linked}),
        owners AS (SELECT device_id, count(DISTINCT pid) AS n, min(pid) AS only_pid FROM ops GROUP BY device_id)
        SELECT ops.*, CASE WHEN owners.n <= 1 THEN owners.only_pid ELSE ops.pid END AS owner
        FROM ops JOIN owners USING (device_id)"""


class Timeline(BaseModel):
    device_id: int | None = Field(description="GPU; null for the all-device merge")
    device_name: str | None = None
    pid: int | None = Field(description="process owning the work (null: unknown, or the all-device merge)")
    rank: int | None = Field(None, description="distributed rank of that process when the profile states it")
    ops: int = Field(description="GPU operations with non-zero duration in the selection")
    comm_ops: int = Field(description="of which communication kernels")
    memcpy_ops: int = Field(description="of which memory copies")
    unlinked_ops: int = Field(description="ops (in `ops`) whose launching host call is not in the profile")
    unlinked_op_time_ns: int = Field(description="summed duration of those ops, ns")
    first_ns: int = Field(description="start of the first GPU op of the selection, ns")
    last_ns: int = Field(description="end of the last GPU op of the selection, ns")
    total_ns: int = Field(description="TraceLens total_time: last_ns - first_ns, ns (the denominator of every pct_of_total)")
    computation_ns: int = Field(description="|COMP|: union of non-communication kernels and memsets, ns (whole-graph "
                                "replays included: see whole_graph_ns)")
    computation_pct_of_total: float | None
    exposed_comm_ns: int = Field(description="|COMM - COMP|: communication time not hidden under computation, ns")
    exposed_comm_pct_of_total: float | None
    exposed_memcpy_ns: int = Field(description="|MEMCPY - COMP - COMM|: copy time hidden under neither, ns")
    exposed_memcpy_pct_of_total: float | None
    busy_ns: int = Field(description="|ALL|: union of every GPU op, ns (= computation + exposed comm + exposed memcpy)")
    busy_pct_of_total: float | None
    idle_ns: int = Field(description="total_ns - busy_ns: no GPU op running, ns")
    idle_pct_of_total: float | None
    total_comm_ns: int = Field(description="|COMM|: union of communication kernels, ns")
    total_comm_pct_of_total: float | None
    total_memcpy_ns: int = Field(description="|MEMCPY|: union of memory copies, ns")
    total_memcpy_pct_of_total: float | None
    comm_comp_overlap_ns: int = Field(description="|COMM ∩ COMP|: communication running under computation, ns")
    comm_comp_overlap_pct_of_comm: float | None = Field(
        description="HTA comp_comm_overlap_pctg = |COMM ∩ COMP| / |COMM|, %; null when there is no communication. "
                    "COMP includes memsets here (HTA leaves them out; differs only when a memset overlaps communication)")
    whole_graph_ops: int = Field(0, description="of ops, CUDA graph replays traced whole (Nsight --cuda-graph-trace="
                                 "graph): their kernels, possibly communication, are not in the export")
    whole_graph_ns: int = Field(0, description="|GRAPH|: union of those replays, ns; part of computation_ns (its "
                                "contents unknown: communication inside is not in total_comm_ns)")


class StreamIdle(BaseModel):
    device_id: int
    pid: int | None = Field(description="owner of the device (as in the timelines)")
    stream_id: int | None
    ops: int = Field(description="ops with non-zero duration on the stream")
    first_ns: int
    last_ns: int
    busy_ns: int = Field(description="union of the stream's ops, ns")
    idle_ns: int = Field(description="sum of the gaps between the stream's ops (first to last op), ns")
    gaps: int = Field(description="number of idle gaps")
    host_wait_ns: int = Field(description="gaps where the next op's launch call started after the stream drained (CPU-bound), ns")
    kernel_wait_ns: int = Field(description="other gaps shorter than kernel_wait_threshold_ns (launched in time; back-to-back overhead), ns")
    other_ns: int = Field(description="other gaps at least kernel_wait_threshold_ns long (e.g. waiting on events/other streams), ns")
    launch_unknown_ns: int = Field(description="gaps before an op whose launch is not in the profile (host_wait undecidable), ns")
    host_wait_pct_of_stream_idle: float | None
    kernel_wait_pct_of_stream_idle: float | None
    other_pct_of_stream_idle: float | None
    launch_unknown_pct_of_stream_idle: float | None


class GpuTimelineResult(ToolResult):
    trace: str
    window: Window = Field(description="the time window the ops were taken from (ops clipped to it)")
    include_unlinked: bool = Field(description="true: all GPU ops; false: only ops whose host launch is in the profile "
                                               "(TraceLens's default, include_unlinked_kernels=False)")
    comm_patterns: list[str] = Field(description="regexes (case-insensitive) over kernel names that counted as communication")
    definitions: str
    timelines: list[Timeline] = Field(description="one per device (per device and process when processes share a device)")
    all_devices: Timeline | None = Field(None, description="every selected GPU merged into one timeline, as TraceLens's PyTorch path "
                                                           "does; only when there are several timelines")
    kernel_wait_threshold_ns: int = Field(description="HTA consecutive_kernel_delay used for the per-stream split, ns")
    streams: list[StreamIdle] = Field(description="HTA per-stream idle breakdown, most idle first")
    truncated: bool = Field(description="true when streams were cut to `limit`")
    whole_graph: WholeGraphTime | None = Field(None, description="CUDA graph replays traced whole in the selection, "
                                               "counted in computation; null when there are none")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


DEFINITIONS = ("TraceLens gpu_timeline: computation=|COMP| (non-communication kernels + memsets), exposed_comm=|COMM-COMP|, "
               "exposed_memcpy=|MEMCPY-COMP-COMM|, idle=total-|ALL|, total=first to last GPU op of the selection; "
               "computation+exposed_comm+exposed_memcpy+idle=total. Unions ignore streams; touching intervals join. CUDA graph "
               "replays traced whole (Nsight --cuda-graph-trace=graph; contents unknown, possibly communication) count in "
               "COMP; whole_graph_ns is their union.")


def gpu_timeline(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    include_unlinked: bool = True,
    comm_patterns: list[str] | None = None,
    kernel_wait_threshold_ns: int = DEFAULT_KERNEL_WAIT_THRESHOLD_NS,
    limit: int = 32,
) -> GpuTimelineResult:
    require(trace, "gpu_timeline")
    if kernel_wait_threshold_ns < 0:
        raise ProfileError(f"kernel_wait_threshold_ns must be >= 0 (got {kernel_wait_threshold_ns}); HTA uses 30000 ns.")
    patterns = active_patterns(comm_patterns)
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 200))
    where, params = sel.where(time_mode="overlap")
    ops = timeline_ops_sql(trace, where, window.start_ns, window.end_ns, include_unlinked, comm_patterns)
    params2 = params * 2
    by_key = split_measures(trace, f"SELECT device_id, owner, cls, start_ns, end_ns FROM ({ops})", params2, ("device_id", "owner"))
    if not by_key:
        what = "" if include_unlinked else " with their host launch in the profile (include_unlinked=False)"
        raise ProfileError(f"no GPU operation{what} in the selection (device/time window); widen it. trace_info lists devices and spans."
                           + skipped_note(trace, ("kernels", "memops")))
    per_stream = _streams(trace, ops, params2, kernel_wait_threshold_ns)
    counts: dict[tuple, tuple] = {}
    for k, st in per_stream.items():  # ops, comm ops, memcpy ops, unlinked ops, unlinked time, whole-graph ops per (device, owner)
        prev = counts.get(k[:2], (0, 0, 0, 0, 0, 0))
        counts[k[:2]] = tuple(a + b for a, b in zip(prev, (st.union.ops, *st.counts)))
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    ranks = dict(trace.sql("SELECT pid, rank FROM processes WHERE rank IS NOT NULL"))
    keys = sorted(by_key, key=lambda k: tuple(-1 if v is None else v for v in k))
    timelines = []
    for key in keys:
        n = counts.get(key, (0, 0, 0, 0, 0, 0))
        timelines.append(_timeline(by_key[key], key[0], names.get(key[0]), key[1], ranks.get(key[1]), n))
    all_devices = None
    if len(keys) > 1:
        every = split_measures(trace, f"SELECT 0 AS whole, cls, start_ns, end_ns FROM ({ops})", params2, ("whole",))
        tot = tuple(sum(t[i] for t in counts.values()) for i in range(6))
        all_devices = _timeline(every[(0,)], None, None, None, None, tot)
    streams, truncated = _stream_idle(per_stream, limit)
    whole = whole_graph_time(trace, where + ("" if include_unlinked else " AND launched"), params,
                             "computation (timelines[].computation_ns; their union is whole_graph_ns)", window.start_ns, window.end_ns)
    return GpuTimelineResult(
        data_issues=data_issue_notes(trace, ("kernels", "memops", "api_calls")),
        trace=str(trace.path), window=window, include_unlinked=include_unlinked, comm_patterns=patterns,
        definitions=DEFINITIONS, timelines=timelines, all_devices=all_devices,
        kernel_wait_threshold_ns=int(kernel_wait_threshold_ns), streams=streams, truncated=truncated, whole_graph=whole,
        hint="; ".join(h for h in (f"only the {limit} most idle streams are shown; raise limit (max 200) or pass device="
                                   if truncated else None, whole.note if whole else None) if h) or None,
    )


# interval sets whose union lengths give the split (stacked.union_measures_sql): COMP (whole-graph replays included),
# COMM, MEMCPY, COMP ∪ COMM, GRAPH, ALL (the last id holds every class)
SPLIT_SETS = {0: (COMP, GRAPH), 1: (COMM,), 2: (MEMCPY,), 3: (COMP, GRAPH, COMM), 4: (GRAPH,), 5: (COMP, GRAPH, COMM, MEMCPY)}


def split_measures(trace: Trace, intervals: str, params: list, partition: tuple[str, ...]) -> dict[tuple, GpuTimeSplit]:
    """Per partition of `intervals` (columns: partition, cls, start_ns, end_ns), the TraceLens split of its time:
    one statement, memoized on the trace."""
    def compute() -> dict[tuple, GpuTimeSplit]:
        n = len(partition)
        rows = trace.sql(union_measures_sql(intervals, ", ".join(partition), SPLIT_SETS), params)
        return {tuple(r[:n]): split_gpu_time(*(int(v) for v in (*r[n:n + 4], r[n + 5], r[n + 6], r[n + 7])),
                                             whole_graph=int(r[n + 4])) for r in rows}
    return trace.memo(("split_measures", intervals, tuple(params), partition), compute)


def _timeline(sp: GpuTimeSplit, device_id, device_name, pid, rank, n) -> Timeline:
    first, last, total, busy = sp.first_ns, sp.last_ns, sp.span_ns, sp.busy_ns
    computation, total_comm, total_mem = sp.computation_ns, sp.comm_ns, sp.memcpy_ns
    exposed_comm, exposed_mem, overlap = sp.exposed_comm_ns, sp.exposed_memcpy_ns, sp.comm_comp_overlap_ns
    idle = total - busy
    return Timeline(
        device_id=device_id, device_name=device_name, pid=pid, rank=rank,
        ops=int(n[0]), comm_ops=int(n[1]), memcpy_ops=int(n[2]), unlinked_ops=int(n[3]), unlinked_op_time_ns=int(n[4]),
        first_ns=first, last_ns=last, total_ns=total,
        computation_ns=computation, computation_pct_of_total=pct(computation, total, 4),
        exposed_comm_ns=exposed_comm, exposed_comm_pct_of_total=pct(exposed_comm, total, 4),
        exposed_memcpy_ns=exposed_mem, exposed_memcpy_pct_of_total=pct(exposed_mem, total, 4),
        busy_ns=busy, busy_pct_of_total=pct(busy, total, 4), idle_ns=idle, idle_pct_of_total=pct(idle, total, 4),
        total_comm_ns=total_comm, total_comm_pct_of_total=pct(total_comm, total, 4),
        total_memcpy_ns=total_mem, total_memcpy_pct_of_total=pct(total_mem, total, 4),
        comm_comp_overlap_ns=overlap, comm_comp_overlap_pct_of_comm=pct(overlap, total_comm, 4),
        whole_graph_ops=int(n[5]), whole_graph_ns=sp.whole_graph_ns,
    )


@dataclass(frozen=True)
class _Stream:
    union: Union                                # the stream's ops, first/last, busy time and gaps
    counts: tuple[int, int, int, int, int]      # comm ops, memcpy ops, unlinked ops, unlinked op time ns, whole-graph ops
    idle: tuple[int, int, int, int]             # idle ns: host_wait, kernel_wait, other, launch_unknown


def _streams(trace: Trace, ops: str, params: list, threshold: int) -> dict[tuple, _Stream]:
    """Per stream (device, owner, stream): its union, op counts and HTA idle categories, in one statement over the
    ops (memoized on the trace), so the first call reads and sorts them once.

    The stream's gaps come from its union (stacked.reach_sql): the ops starting exactly at a gap's end (the ops of
    the gap end's start group, where the group's least reach is the gap start) decide its category with their
    earliest launch-call start (any op without a launch in the profile makes it launch_unknown). Only those ops meet
    the API calls, so the join's size follows the gaps, not the ops."""
    def compute() -> dict[tuple, _Stream]:
        part = "device_id, owner, stream_id"
        cat = f"CASE WHEN unknown THEN 3 WHEN launch_ns > gs THEN 0 WHEN ge - gs < {int(threshold)} THEN 1 ELSE 2 END"
        sums = ", ".join(f"coalesce(sum(ge - gs) FILTER (WHERE {cat} = {c}), 0)::BIGINT AS c{c}" for c in range(4))
        same = " AND ".join(f"s.{c} IS NOT DISTINCT FROM c.{c}" for c in ("device_id", "owner", "stream_id"))
        counts = (f"count(*) FILTER (WHERE cls = {COMM}) AS comm_ops, count(*) FILTER (WHERE cls = {MEMCPY}) AS memcpy_ops, "
                  "count(*) FILTER (WHERE NOT launched) AS unlinked, "
                  "coalesce(sum(end_ns - start_ns) FILTER (WHERE NOT launched), 0)::BIGINT AS unlinked_ns, "
                  f"count(*) FILTER (WHERE cls = {GRAPH}) AS graph_ops")
        rows = trace.sql(f"""
            WITH r AS MATERIALIZED (
                SELECT *, min(reach_ns) OVER (PARTITION BY {part}, start_ns) AS group_reach
                FROM ({reach_sql(f"SELECT {part}, pid, tid, correlation_id, launched, cls, start_ns, end_ns FROM ({ops})", part)})),
            s AS ({union_stats_from_reach_sql('r', part, counts)}),
            ga AS (SELECT device_id, owner, stream_id, group_reach AS gs, start_ns AS ge,
                          CASE WHEN launched THEN (SELECT min(a.start_ns) FROM api_calls a
                                                   WHERE a.pid = r.pid AND a.tid = r.tid AND a.correlation_id = r.correlation_id)
                          END AS launch_ns
                   FROM r WHERE start_ns > group_reach),
            g AS (SELECT device_id, owner, stream_id, gs, ge, bool_or(launch_ns IS NULL) AS unknown, min(launch_ns) AS launch_ns
                  FROM ga GROUP BY ALL),
            c AS (SELECT device_id, owner, stream_id, {sums} FROM g GROUP BY ALL)
            SELECT s.*, coalesce(c.c0, 0), coalesce(c.c1, 0), coalesce(c.c2, 0), coalesce(c.c3, 0)
            FROM s LEFT JOIN c ON {same}""", params)
        out = {}
        for r in rows:
            k = tuple(r[:3])
            n, first, last, work, busy, gaps, *rest = (int(v) for v in r[3:])
            out[k] = _Stream(Union(key=k, ops=n, first_ns=first, last_ns=last, work_ns=work, busy_ns=busy, gaps=gaps),
                             tuple(rest[:5]), tuple(rest[5:]))
        return out
    return trace.memo(("gpu_timeline.streams", ops, tuple(params), threshold), compute)


def _stream_idle(found: dict[tuple, _Stream], limit: int) -> tuple[list[StreamIdle], bool]:
    out = []
    for k, st in found.items():
        u = st.union
        hw, kw, ot, un = st.idle
        idle = u.idle_ns
        out.append(StreamIdle(
            device_id=k[0], pid=k[1], stream_id=k[2], ops=u.ops, first_ns=u.first_ns, last_ns=u.last_ns, busy_ns=u.busy_ns,
            idle_ns=idle, gaps=u.gaps, host_wait_ns=hw, kernel_wait_ns=kw, other_ns=ot, launch_unknown_ns=un,
            host_wait_pct_of_stream_idle=pct(hw, idle), kernel_wait_pct_of_stream_idle=pct(kw, idle),
            other_pct_of_stream_idle=pct(ot, idle), launch_unknown_pct_of_stream_idle=pct(un, idle)))
    out.sort(key=lambda r: (-r.idle_ns, r.device_id, -1 if r.stream_id is None else r.stream_id))
    return out[:limit], len(out) > limit
