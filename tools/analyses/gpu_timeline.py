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

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .comm_patterns import comm_patterns as active_patterns
from .comm_patterns import is_comm_sql
from .common import (GpuTimeSplit, ToolResult, WholeGraphTime, Window, data_issue_notes, data_issues_field, pct, resolve_selection,
                     skipped_note, split_gpu_time, whole_graph_time)
from .intervals import INT64_MIN, NULL_KEY, Keys, Union, grown, reach_by_part, time_chunks
from .requirements import require

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
    by_key, every, per_stream = _measure(trace, ops, params * 2, kernel_wait_threshold_ns)
    if not by_key:
        what = "" if include_unlinked else " with their host launch in the profile (include_unlinked=False)"
        raise ProfileError(f"no GPU operation{what} in the selection (device/time window); widen it. trace_info lists devices and spans."
                           + skipped_note(trace, ("kernels", "memops")))
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
        tot = tuple(sum(t[i] for t in counts.values()) for i in range(6))
        all_devices = _timeline(every, None, None, None, None, tot)
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


# interval sets whose union lengths give the split: COMP (whole-graph replays included), COMM, MEMCPY, COMP ∪ COMM,
# GRAPH, ALL (the last id holds every class)
SPLIT_SETS = {0: (COMP, GRAPH), 1: (COMM,), 2: (MEMCPY,), 3: (COMP, GRAPH, COMM), 4: (GRAPH,), 5: (COMP, GRAPH, COMM, MEMCPY)}


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


def split_measures(trace: Trace, intervals: str, params: list, partition: tuple[str, ...]) -> dict[tuple, GpuTimeSplit]:
    """Per partition of `intervals` (columns: partition, integers or NULL; cls, start_ns, end_ns), the TraceLens split
    of its time: one pass over the intervals in time order (memoized on the trace)."""
    def compute() -> dict[tuple, GpuTimeSplit]:
        keys = ", ".join(f"coalesce({c}, {NULL_KEY}) AS {c}" for c in partition)
        sql = f"SELECT {keys}, cls, start_ns, end_ns FROM ({intervals}) WHERE end_ns > start_ns ORDER BY start_ns, end_ns"
        ids, sets = Keys(partition), _SetUnions()
        cur = trace.con.cursor()
        try:
            for ch in time_chunks(cur, sql, params, dict.fromkeys((*partition, "cls", "start_ns", "end_ns"), 0)):
                part = ids(ch)
                o = np.argsort(part, kind="stable")
                sets.add(part[o], ch["start_ns"][o], ch["end_ns"][o], ch["cls"][o])
        finally:
            cur.close()
        return {k: sets.split(i) for k, i in ids.ids.items()}
    return trace.memo(_split_key(intervals, params, partition), compute)


def _split_key(intervals: str, params: list, partition: tuple[str, ...]) -> tuple:
    return ("split_measures", intervals, tuple(params), partition)


def _measure(trace: Trace, ops: str, params: list, threshold: int
             ) -> tuple[dict[tuple, GpuTimeSplit], GpuTimeSplit | None, dict[tuple, _Stream]]:
    """The TraceLens split per (device, owner) and of every op together, and per stream (device, owner, stream) its
    union, op counts and HTA idle categories: one pass over the ops in time order (memoized on the trace; the
    per-device split also as split_measures' answer, which comm_summary asks for).

    DuckDB sorts the non-empty ops by (start, end) (cheap: the tables are stored in time order); numpy then follows
    every partition at once through the sorted chunks (intervals.time_chunks, intervals.reach_by_part): a union adds
    max(0, end - max(start, reach)) per op, where reach is the latest end before it in its partition (stacked.py's
    formula), for each class set of SPLIT_SETS and for each stream. A stream's idle gap [reach, start) is decided by
    the ops starting exactly at the gap's end (its start group, whole in one chunk) with their earliest launch-call
    start; any op without a launch in the profile makes it launch_unknown. Only those ops meet the API calls, in one
    statement at the end over the gaps collected in a temp table (so the join's size follows the gaps, and no sort
    waits on it: the two together did not fit a 64 MiB DuckDB limit). Memory follows the chunk, not the profile."""
    def compute():
        sql = f"""
            SELECT device_id, coalesce(owner, {NULL_KEY}) AS owner, coalesce(stream_id, {NULL_KEY}) AS stream_id, cls,
                   launched::INTEGER AS launched, pid, tid, correlation_id, start_ns, end_ns
            FROM ({ops}) WHERE end_ns > start_ns ORDER BY start_ns, end_ns"""
        cols = {"device_id": 0, "owner": 0, "stream_id": 0, "cls": 0, "launched": 0, "pid": None, "tid": None,
                "correlation_id": None, "start_ns": 0, "end_ns": 0}
        gaps = trace.con.cursor()
        try:
            m = _Measure(threshold, gaps)
            cur = trace.con.cursor()
            try:
                for ch in time_chunks(cur, sql, params, cols):
                    m.add(ch)
            finally:
                cur.close()  # before the launch join: the sorted ops' memory goes back first
            return m.result()
        finally:
            gaps.execute("DROP TABLE IF EXISTS temp.main._tl_gap_ops")
            gaps.close()
    found = trace.memo(("gpu_timeline.measure", ops, tuple(params), threshold), compute)
    trace.memo(_split_key(f"SELECT device_id, owner, cls, start_ns, end_ns FROM ({ops})", params, ("device_id", "owner")),
               lambda: found[0])
    return found


_INT64_MAX = np.iinfo(np.int64).max
_SET_CLASSES = [np.asarray(cs) for cs in SPLIT_SETS.values()]


class _SetUnions:
    """Per partition id, the union length of each class set of SPLIT_SETS, and the first start and last end of
    every op, from chunks of rows sorted by (partition id, start, end)."""

    def __init__(self):
        self.busy = np.zeros((len(SPLIT_SETS), 0), dtype=np.int64)
        self.reach = np.zeros((len(SPLIT_SETS), 0), dtype=np.int64)  # the last set's: the last end so far
        self.first = np.zeros(0, dtype=np.int64)

    def add(self, part: np.ndarray, start: np.ndarray, end: np.ndarray, cls: np.ndarray) -> None:
        if not part.size:
            return
        n = int(part[-1]) + 1
        self.busy, self.reach, self.first = grown(self.busy, n, 0), grown(self.reach, n, INT64_MIN), grown(self.first, n, _INT64_MAX)
        for i, cs in enumerate(_SET_CLASSES):
            m = np.isin(cls, cs)
            if not m.any():
                continue
            p, s, e = part[m], start[m], end[m]
            r, f = reach_by_part(p, e, self.reach[i])
            self.busy[i, p[f]] += np.add.reduceat(np.maximum(0, e - np.maximum(s, r)), f)
        f = np.concatenate(([0], np.flatnonzero(part[1:] != part[:-1]) + 1))
        self.first[part[f]] = np.minimum(self.first[part[f]], start[f])

    def split(self, i: int) -> GpuTimeSplit:
        u = [int(v) for v in self.busy[:, i]]
        return split_gpu_time(u[0], u[1], u[2], u[3], u[5], int(self.first[i]), int(self.reach[-1, i]), whole_graph=u[4])


IDLE_BATCH = 4_000_000  # op positions whose gaps one launch-lookup statement takes
_STREAM_SUMS = ("ops", "work", "busy", "gaps", "comm", "memcpy", "unlinked", "unlinked_ns", "graph")


class _Measure:
    """_measure's running figures: per stream, per (device, owner) and over every op."""

    def __init__(self, threshold: int, gaps):
        self.threshold = int(threshold)
        self.gaps = gaps  # a cursor whose temp table collects the streams' gaps with the ops starting them
        self.seen = 0  # rows of the chunks before (row positions plus it: gap ids unique over chunks)
        gaps.execute("CREATE OR REPLACE TEMP TABLE _tl_gap_ops (gap BIGINT, sid BIGINT, gs BIGINT, ge BIGINT, "
                     "lost BOOLEAN, pid BIGINT, tid BIGINT, correlation_id BIGINT)")
        self.streams = Keys(("device_id", "owner", "stream_id"))
        self.devs: dict[tuple, int] = {}            # (device, owner) -> id
        self.dev_of = np.zeros(0, dtype=np.int64)   # stream id -> (device, owner) id
        self.st = {k: np.zeros(0, dtype=np.int64) for k in _STREAM_SUMS}
        self.st_first = np.zeros(0, dtype=np.int64)
        self.st_reach = np.zeros(0, dtype=np.int64)
        self.dev_sets, self.all_sets = _SetUnions(), _SetUnions()

    def add(self, ch: dict) -> None:
        sid = self.streams(ch)
        for key in list(self.streams.ids)[self.dev_of.size:]:  # new streams
            self.dev_of = np.append(self.dev_of, self.devs.setdefault(key[:2], len(self.devs)))
        start, end, cls = ch["start_ns"], ch["end_ns"], ch["cls"]
        self._streams(sid, start, end, cls, ch)
        did = self.dev_of[sid]
        o = np.argsort(did, kind="stable")
        self.dev_sets.add(did[o], start[o], end[o], cls[o])
        self.all_sets.add(np.zeros(start.size, dtype=np.int64), start, end, cls)

    def _streams(self, sid, start, end, cls, ch) -> None:
        """Add a chunk (rows in time order; `sid` their stream ids) to the per-stream figures."""
        n = len(self.streams.ids)
        self.st = {k: grown(v, n, 0) for k, v in self.st.items()}
        self.st_first, self.st_reach = grown(self.st_first, n, _INT64_MAX), grown(self.st_reach, n, INT64_MIN)
        o = np.argsort(sid, kind="stable")
        p, s, e, c = sid[o], start[o], end[o], cls[o]
        r, f = reach_by_part(p, e, self.st_reach)
        ups = p[f]
        sums = lambda v: np.add.reduceat(v.astype(np.int64), f)  # noqa: E731 (exact int64 sums per stream)
        gap = (s > r) & (r > INT64_MIN)
        unl = ch["launched"][o] == 0
        st = self.st
        st["ops"][ups] += np.diff(np.append(f, p.size))
        st["work"][ups] += sums(e - s)
        st["busy"][ups] += sums(np.maximum(0, e - np.maximum(s, r)))
        st["gaps"][ups] += sums(gap)
        st["comm"][ups] += sums(c == COMM)
        st["memcpy"][ups] += sums(c == MEMCPY)
        st["graph"][ups] += sums(c == GRAPH)
        st["unlinked"][ups] += sums(unl)
        st["unlinked_ns"][ups] += sums(np.where(unl, e - s, 0))
        self.st_first[ups] = np.minimum(self.st_first[ups], s[f])
        # start groups: a stream's ops starting at one time (whole in this chunk); a gap precedes the group when it
        # precedes the group's first op. The ops of such groups go to the temp table with their gap; one not
        # launched, or without the keys to find its call (lost), makes its gap launch_unknown.
        base, self.seen = self.seen, self.seen + p.size
        new = np.ones(p.size, dtype=bool)
        new[1:] = (p[1:] != p[:-1]) | (s[1:] != s[:-1])
        group = np.cumsum(new) - 1
        g = np.flatnonzero(new)
        is_gap = gap[g]
        if not is_gap.any():
            return
        rows = np.flatnonzero(is_gap[group])
        first = g[group[rows]]  # each row's group's first row: the gap's end and start
        k = ch["pid_null"][o] | ch["tid_null"][o] | ch["correlation_id_null"][o]
        df = pd.DataFrame({"gap": base + first, "sid": p[rows], "gs": r[first], "ge": s[rows],
                           "lost": unl[rows] | k[rows], "pid": ch["pid"][o][rows], "tid": ch["tid"][o][rows],
                           "correlation_id": ch["correlation_id"][o][rows]})
        self.gaps.register("_tl_chunk", df)
        self.gaps.execute("INSERT INTO _tl_gap_ops SELECT * FROM _tl_chunk")
        self.gaps.unregister("_tl_chunk")

    def _idle(self) -> dict[int, list[int]]:
        """Per stream id, its idle time per HTA category (c0..c3 of _Stream.idle) from the collected gaps: the
        gap-starting ops meet the earliest call of their keys (the calls of those keys only: a semi join), a batch
        of gaps per statement (IDLE_BATCH ops' positions), so the join's memory follows the batch."""
        cat = f"CASE WHEN unknown THEN 3 WHEN launch_ns > gs THEN 0 WHEN ge - gs < {self.threshold} THEN 1 ELSE 2 END"
        sums = ", ".join(f"coalesce(sum(ge - gs) FILTER (WHERE {cat} = {c}), 0)::BIGINT" for c in range(4))
        keys = "a.pid = o.pid AND a.tid = o.tid AND a.correlation_id = o.correlation_id"
        out: dict[int, list[int]] = {}
        for lo in range(0, self.seen, IDLE_BATCH):
            rows = self.gaps.execute(f"""
                WITH o AS (SELECT * FROM _tl_gap_ops WHERE gap >= {lo} AND gap < {lo + IDLE_BATCH}),
                l AS (SELECT pid, tid, correlation_id, min(start_ns) AS launch_ns
                      FROM api_calls a SEMI JOIN o ON {keys} GROUP BY ALL)
                SELECT sid, {sums}
                FROM (SELECT o.gap, any_value(o.sid) AS sid, any_value(o.gs) AS gs, any_value(o.ge) AS ge,
                             bool_or(o.lost OR a.launch_ns IS NULL) AS unknown, min(a.launch_ns) AS launch_ns
                      FROM o LEFT JOIN l a ON {keys}
                      GROUP BY o.gap)
                GROUP BY sid""").fetchall()
            for r in rows:
                acc = out.setdefault(int(r[0]), [0, 0, 0, 0])
                for k in range(4):
                    acc[k] += int(r[k + 1])
        return out

    def result(self) -> tuple[dict[tuple, GpuTimeSplit], GpuTimeSplit | None, dict[tuple, _Stream]]:
        devs = {k: self.dev_sets.split(d) for k, d in self.devs.items()}
        every = self.all_sets.split(0) if self.devs else None
        st = {k: v.tolist() for k, v in self.st.items()}
        idle = self._idle()
        streams = {}
        for k, i in self.streams.ids.items():
            u = Union(key=k, ops=st["ops"][i], first_ns=int(self.st_first[i]), last_ns=int(self.st_reach[i]),
                      work_ns=st["work"][i], busy_ns=st["busy"][i], gaps=st["gaps"][i])
            streams[k] = _Stream(u, tuple(st[c][i] for c in ("comm", "memcpy", "unlinked", "unlinked_ns", "graph")),
                                 tuple(idle.get(i, (0, 0, 0, 0))))
        return devs, every, streams


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
