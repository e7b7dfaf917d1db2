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
from ..model.limits import memory_limit_bytes
from ..model.trace import Trace
from .comm_patterns import comm_patterns as active_patterns
from .comm_patterns import is_comm_sql
from .common import (GpuTimeSplit, ToolResult, WholeGraphTime, Window, data_issue_notes, data_issues_field, pct, resolve_selection,
                     skipped_note, split_gpu_time, whole_graph_time)
from .intervals import INT64_MIN, Keys, Union, grown, part_order, reach_by_part, time_chunks
from .owners import owner_of, owner_sql, profile_unowned
from .requirements import require

ROCM_COPY_KERNEL = r"^(MEMORY_COPY_|__amd_rocclr_copyBuffer)"
DEFAULT_KERNEL_WAIT_THRESHOLD_NS = 30_000
COMP, COMM, MEMCPY, GRAPH = 0, 1, 2, 3  # op classes (integer codes, so they can partition interval unions)
# GRAPH: whole-graph replays (Nsight --cuda-graph-trace=graph), whose kernels are not traced: counted in computation
# (as GPU work that is not known communication), and measured on their own so that every figure can say how much.


def _named_sql(patterns: list[str] | None) -> str:
    """CTE `named`: each kernel name's class (COMM / MEMCPY / COMP). A kernel's class follows from its name: the
    patterns run once per distinct name (a profile has few), not per kernel."""
    return f"""named AS (
            SELECT name, CASE WHEN {is_comm_sql("name", patterns)} THEN {COMM}
                              WHEN regexp_matches(name, '{ROCM_COPY_KERNEL}') THEN {MEMCPY} ELSE {COMP} END AS name_cls
            FROM (SELECT DISTINCT name FROM kernels))"""


def timeline_ops_sql(trace: Trace, where: str, lo: int, hi: int, include_unlinked: bool,
                     patterns: list[str] | None) -> str:
    """GPU ops overlapping the window, clipped to it, with class `cls` (COMP / COMM / MEMCPY), the kernels' recorded
    `collective` (comm_patterns.collective_index_sql) and their `owner` (owners.py: the op's process, else its stream's
    or its device's only process)."""
    linked = "" if include_unlinked else " AND launched"
    return f"""
        WITH {_named_sql(patterns)},
        ops AS (
            SELECT device_id, pid, tid, stream_id, correlation_id, launched, name, short_name, collective,
                   greatest(start_ns, {lo}) AS start_ns, least(end_ns, {hi}) AS end_ns,
                   CASE WHEN whole_graph THEN {GRAPH} ELSE name_cls END AS cls
            FROM kernels JOIN named USING (name) WHERE {where}{linked}
            UNION ALL
            SELECT device_id, pid, tid, stream_id, correlation_id, launched,
                   CASE WHEN op = 'set' THEN 'memset' ELSE 'memcpy ' || kind END, CASE WHEN op = 'set' THEN 'memset' ELSE 'memcpy ' || kind END,
                   NULL, greatest(start_ns, {lo}), least(end_ns, {hi}), CASE WHEN op = 'copy' THEN {MEMCPY} ELSE {COMP} END
            FROM memops WHERE {where}{linked})
        SELECT ops.*, {owner_sql(trace, "ops")} AS owner FROM ops"""


class Timeline(BaseModel):
    device_id: int | None = Field(description="GPU; null for the all-device merge")
    device_name: str | None = None
    pid: int | None = Field(description="process owning the work: the ops' process, else their stream's or device's only "
                                        "one (owners.py; null: none, or the all-device merge)")
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
    by_key, every, per_stream = _measure(trace, where, params, window.start_ns, window.end_ns, include_unlinked, comm_patterns,
                                         kernel_wait_threshold_ns)
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
        ids, sets = Keys(partition), _SetUnions()
        sql = f"SELECT {ids.select_sql()}, cls, start_ns, end_ns FROM ({intervals}) WHERE end_ns > start_ns ORDER BY start_ns, end_ns"
        cur = trace.con.cursor()
        try:
            for ch in time_chunks(cur, sql, params, dict.fromkeys((*ids.arrays, "cls", "start_ns", "end_ns"), 0)):
                part = ids(ch)
                o = part_order(part)
                sets.add(part[o], ch["start_ns"][o], ch["end_ns"][o], ch["cls"][o])
        finally:
            cur.close()
        return {k: sets.split(i) for k, i in ids.ids.items()}
    return trace.memo(_split_key(intervals, params, partition), compute)


def _split_key(intervals: str, params: list, partition: tuple[str, ...]) -> tuple:
    return ("split_measures", intervals, tuple(params), partition)


def _measure(trace: Trace, where: str, params: list, lo: int, hi: int, include_unlinked: bool, patterns: list[str] | None,
             threshold: int) -> tuple[dict[tuple, GpuTimeSplit], GpuTimeSplit | None, dict[tuple, _Stream]]:
    """The TraceLens split per (device, owner) and of every op together, and per stream (device, owner, stream) its
    union, op counts and HTA idle categories: one pass over the ops in time order (memoized on the trace; the
    per-device split also as split_measures' answer over timeline_ops_sql, which comm_summary asks for).

    DuckDB sorts the ops by (start, end) (cheap: the tables are stored in time order) carrying four integers per op
    (_op_rows_sql), and numpy drops the empty ones: the sort holds every op at once, so its width sets the tool's
    peak memory (ten columns, filtered in SQL, took the process from ~1.0 to 1.3-1.5 GB at 10 M kernels, with 3-4x
    the statement's CPU). numpy then follows every partition at once through the sorted chunks
    (intervals.time_chunks, intervals.reach_by_part): a union adds max(0, end - max(start, reach)) per op, where
    reach is the latest end before it in its partition (stacked.py's formula), for each class set of SPLIT_SETS and
    for each stream. A stream's idle gap [reach, start) is decided by the ops starting exactly at the
    gap's end (its start group, whole in one chunk) with their earliest launch-call start; any op without a launch in
    the profile makes it launch_unknown. Only those ops meet their rows again (for the launch keys) and the API
    calls, in statements at the end over the gaps collected in a temp table (so the joins' size follows the gaps, and
    no sort waits on them). Memory follows the chunk, not the profile."""
    ops = timeline_ops_sql(trace, where, lo, hi, include_unlinked, patterns)
    linked = "" if include_unlinked else " AND launched"

    def compute():
        keys = _stream_codes(trace, where + linked, params)
        sql = f"""
            SELECT o.start_ns, o.end_ns, s.code * 8 + o.cl AS k, o.ref
            FROM ({_op_rows_sql(where, lo, hi, include_unlinked, patterns)}) o
            JOIN _tl_streams s ON o.device_id = s.device_id AND o.pid IS NOT DISTINCT FROM s.pid
                              AND o.stream_id IS NOT DISTINCT FROM s.stream_id
            ORDER BY o.start_ns, o.end_ns"""
        gaps = trace.con.cursor()
        try:
            m = _Measure(threshold, gaps, keys)
            cur = trace.con.cursor()
            try:
                cur.register("_tl_streams", keys.frame)
                for ch in time_chunks(cur, sql, params * 2, {"start_ns": 0, "end_ns": 0, "k": 0, "ref": 0}):
                    m.add(ch)
            finally:
                cur.close()  # before the launch join: the sorted ops' memory goes back first
            return m.result()
        finally:
            gaps.execute("DROP TABLE IF EXISTS temp.main._tl_gap_ops")
            gaps.close()
    found = trace.memo(("gpu_timeline.measure", ops, tuple(params), threshold), compute)
    trace.memo(_split_key(f"SELECT device_id, owner, cls, start_ns, end_ns FROM ({ops})", params * 2, ("device_id", "owner")),
               lambda: found[0])
    return found


def _op_rows_sql(where: str, lo: int, hi: int, include_unlinked: bool, patterns: list[str] | None) -> str:
    """timeline_ops_sql's ops as _measure sorts them: the stream's keys (device_id, pid, stream_id; joined to a stream
    code before the sort), `cl` = class * 2 + launched, the clipped times, and `ref` = rowid * 2 (+1 for memops),
    which finds the row's launch keys again for the few ops that start an idle gap."""
    linked = "" if include_unlinked else " AND launched"
    return f"""
        WITH {_named_sql(patterns)}
        SELECT device_id, pid, stream_id, (CASE WHEN whole_graph THEN {GRAPH} ELSE name_cls END) * 2 + launched::INTEGER AS cl,
               greatest(start_ns, {lo}) AS start_ns, least(end_ns, {hi}) AS end_ns, kernels.rowid * 2 AS ref
        FROM kernels JOIN named USING (name) WHERE {where}{linked}
        UNION ALL
        SELECT device_id, pid, stream_id, CASE WHEN op = 'copy' THEN {MEMCPY} ELSE {COMP} END * 2 + launched::INTEGER,
               greatest(start_ns, {lo}), least(end_ns, {hi}), rowid * 2 + 1
        FROM memops WHERE {where}{linked}"""


# the launch keys of the op `ref` (_op_rows_sql) names
_REF_KEYS = """(SELECT rowid * 2 AS ref, start_ns, pid, tid, correlation_id FROM kernels
               UNION ALL SELECT rowid * 2 + 1, start_ns, pid, tid, correlation_id FROM memops)"""


class _StreamCodes:
    """The streams (device, owner, stream) of a selection, numbered: `frame` maps each (device_id, pid, stream_id) of
    the ops to its stream's code; `keys[code]` is the stream's key (None for NULL). `unowned`: owners.profile_unowned."""

    def __init__(self, rows: list[tuple], unowned: dict[tuple, int | None]):
        codes: dict[tuple, int] = {}
        cols = [[], [], [], []]
        for d, p, s in rows:
            c = codes.setdefault((d, owner_of(unowned, d, s, p), s), len(codes))
            for col, v in zip(cols, (d, p, s, c)):
                col.append(v)
        self.keys = list(codes)
        self.frame = pd.DataFrame({"device_id": pd.array(cols[0], dtype="Int64"), "pid": pd.array(cols[1], dtype="Int64"),
                                   "stream_id": pd.array(cols[2], dtype="Int64"), "code": pd.array(cols[3], dtype="Int64")})


def _stream_codes(trace: Trace, where: str, params: list) -> _StreamCodes:
    parts = " UNION ".join(f"SELECT DISTINCT device_id, pid, stream_id FROM {t} WHERE {where}" for t in ("kernels", "memops"))
    return _StreamCodes(trace.sql(parts, params * 2), profile_unowned(trace))


_INT64_MAX = np.iinfo(np.int64).max
# per class set of SPLIT_SETS, whether each class (COMP..GRAPH) is in it: a lookup by class code, not np.isin
_SET_MEMBERS = [np.isin(np.arange(4), cs) for cs in SPLIT_SETS.values()]


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
        present = np.bincount(cls, minlength=4) > 0
        # a set holding the same classes of this chunk as one measured before it, from the same reach, gets the same
        # figures (e.g. COMP, COMP + COMM and ALL where a chunk has only computation): copied, not measured again
        done: dict[tuple, tuple] = {}  # those classes -> (reach before, busy added, reach after)
        for i, members in enumerate(_SET_MEMBERS):
            mine = tuple(members & present)
            if not any(mine):
                continue
            seen = done.get(mine)
            if seen is not None and np.array_equal(self.reach[i], seen[0]):
                self.busy[i] += seen[1]
                self.reach[i] = seen[2]
                continue
            m = members[cls]
            p, s, e = (part, start, end) if m.all() else (part[m], start[m], end[m])
            before = self.reach[i].copy()
            r, f = reach_by_part(p, e, self.reach[i])
            added = np.zeros(self.busy.shape[1], dtype=np.int64)  # every partition so far: a chunk may hold fewer
            added[p[f]] = np.add.reduceat(np.maximum(0, e - np.maximum(s, r)), f)
            self.busy[i] += added
            done.setdefault(mine, (before, added, self.reach[i].copy()))
        f = np.concatenate(([0], np.flatnonzero(part[1:] != part[:-1]) + 1))
        self.first[part[f]] = np.minimum(self.first[part[f]], start[f])

    def first_part(self) -> "_SetUnions":
        """A copy holding partition 0's figures only."""
        out = _SetUnions()
        out.busy, out.reach, out.first = self.busy[:, :1].copy(), self.reach[:, :1].copy(), self.first[:1].copy()
        return out

    def split(self, i: int) -> GpuTimeSplit:
        u = [int(v) for v in self.busy[:, i]]
        return split_gpu_time(u[0], u[1], u[2], u[3], u[5], int(self.first[i]), int(self.reach[-1, i]), whole_graph=u[4])


def idle_batch() -> int:
    """Op positions whose gaps one launch-lookup statement takes: 4 M under the default memory limit, fewer under a
    smaller one (~64 B of the limit per position). At 10 M kernels a batch of 4 M positions (~1.3 M gaps) ran out
    of a 128 MiB limit and one of 2 M fitted."""
    return max(1 << 18, min(4_000_000, memory_limit_bytes() // 64))
_STREAM_SUMS = ("ops", "work", "busy", "gaps", "comm", "memcpy", "unlinked", "unlinked_ns", "graph")


class _Measure:
    """_measure's running figures: per stream, per (device, owner) and over every op."""

    def __init__(self, threshold: int, gaps, codes: _StreamCodes):
        self.threshold = int(threshold)
        self.gaps = gaps  # a cursor whose temp table collects the streams' gaps with the ops starting them
        self.seen = 0  # rows of the chunks before (row positions plus it: gap ids unique over chunks)
        gaps.execute("CREATE OR REPLACE TEMP TABLE _tl_gap_ops (gap BIGINT, sid BIGINT, gs BIGINT, ge BIGINT, "
                     "unlaunched BOOLEAN, ref BIGINT)")
        self.codes = codes
        self.sid_of = np.full(len(codes.keys), -1, dtype=np.int64)  # stream code -> stream id, in order of first op
        self.streams: dict[tuple, int] = {}          # (device, owner, stream) -> stream id
        self.devs: dict[tuple, int] = {}            # (device, owner) -> id
        self.dev_of = np.zeros(0, dtype=np.int64)   # stream id -> (device, owner) id
        self.st = {k: np.zeros(0, dtype=np.int64) for k in _STREAM_SUMS}
        self.st_first = np.zeros(0, dtype=np.int64)
        self.st_reach = np.zeros(0, dtype=np.int64)
        # every op together: while one (device, owner) has been seen, its own figures (the same rows in the same order);
        # its own _SetUnions from the chunk that brings a second one, starting from the first one's figures
        self.dev_sets, self.all_sets = _SetUnions(), None

    def add(self, ch: dict) -> None:
        keep = ch["end_ns"] > ch["start_ns"]  # empty ops neither fill nor split gaps (here, not in the sort's SQL:
        if not keep.all():                    # a filter there doubled the statement's CPU and memory at 10 M kernels)
            ch = {c: v[keep] for c, v in ch.items()}
            if not keep.any():
                return
        k = ch["k"]
        code = k >> 3
        fresh = self.sid_of[code] < 0
        if fresh.any():  # streams met for the first time, numbered in order of their first op
            u, at = np.unique(code[fresh], return_index=True)
            for c in u[np.argsort(at)].tolist():
                key = self.codes.keys[c]
                self.sid_of[c] = self.streams.setdefault(key, len(self.streams))
                self.dev_of = np.append(self.dev_of, self.devs.setdefault(key[:2], len(self.devs)))
        sid = self.sid_of[code]
        start, end, cls = ch["start_ns"], ch["end_ns"], (k >> 1) & 3
        self._streams(sid, start, end, cls, (k & 1) == 0, ch["ref"])
        did = self.dev_of[sid]
        o = part_order(did)
        if self.all_sets is None and len(self.devs) > 1:
            self.all_sets = self.dev_sets.first_part()
        self.dev_sets.add(did[o], start[o], end[o], cls[o])
        if self.all_sets is not None:
            self.all_sets.add(np.zeros(start.size, dtype=np.int64), start, end, cls)

    def _streams(self, sid, start, end, cls, unlaunched, ref) -> None:
        """Add a chunk (rows in time order; `sid` their stream ids) to the per-stream figures."""
        n = len(self.streams)
        self.st = {k: grown(v, n, 0) for k, v in self.st.items()}
        self.st_first, self.st_reach = grown(self.st_first, n, _INT64_MAX), grown(self.st_reach, n, INT64_MIN)
        o = part_order(sid)
        p, s, e, c = sid[o], start[o], end[o], cls[o]
        r, f = reach_by_part(p, e, self.st_reach)
        ups = p[f]
        sums = lambda v: np.add.reduceat(v.astype(np.int64), f)  # noqa: E731 (exact int64 sums per stream)
        gap = (s > r) & (r > INT64_MIN)
        unl = unlaunched[o]
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
        # launched, or without the keys to find its call (NULL: the join misses), makes its gap launch_unknown.
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
        # numpy arrays as they are: a DataFrame would first copy them into one block
        self.gaps.register("_tl_chunk", {"gap": base + first, "sid": p[rows], "gs": r[first], "ge": s[rows],
                                         "unlaunched": unl[rows], "ref": ref[o][rows]})
        self.gaps.execute("INSERT INTO _tl_gap_ops SELECT * FROM _tl_chunk")
        self.gaps.unregister("_tl_chunk")

    def _idle(self) -> dict[int, list[int]]:
        """Per stream id, its idle time per HTA category (c0..c3 of _Stream.idle) from the collected gaps: the
        gap-starting ops find their launch keys (their rows by `ref`, among the rows starting in the batch's time
        range) and meet the calls of those keys in one join (the ops are its build side), whose earliest start per
        gap decides it, a batch of gaps per statement (idle_batch() ops' positions), so the join's memory follows the
        batch. Grouping the calls per key first (a semi join, then a GROUP BY, then the join) took ~1.5x the CPU."""
        cat = f"CASE WHEN unknown THEN 3 WHEN launch_ns > gs THEN 0 WHEN ge - gs < {self.threshold} THEN 1 ELSE 2 END"
        sums = ", ".join(f"coalesce(sum(ge - gs) FILTER (WHERE {cat} = {c}), 0)::BIGINT" for c in range(4))
        keys = "a.pid = o.pid AND a.tid = o.tid AND a.correlation_id = o.correlation_id"
        out: dict[int, list[int]] = {}
        batch = idle_batch()
        for lo in range(0, self.seen, batch):
            t0, t1 = self.gaps.execute(f"SELECT min(ge), max(ge) FROM _tl_gap_ops WHERE gap >= {lo} AND gap < {lo + batch}"
                                       ).fetchone()
            if t0 is None:
                continue
            rows = self.gaps.execute(f"""
                WITH g AS (SELECT * FROM _tl_gap_ops WHERE gap >= {lo} AND gap < {lo + batch}),
                o AS (SELECT g.gap, g.sid, g.gs, g.ge, g.unlaunched, r.pid, r.tid, r.correlation_id
                      FROM g JOIN (SELECT * FROM {_REF_KEYS} WHERE start_ns BETWEEN {int(t0)} AND {int(t1)}) r USING (ref))
                SELECT sid, {sums}
                FROM (SELECT o.gap, any_value(o.sid) AS sid, any_value(o.gs) AS gs, any_value(o.ge) AS ge,
                             bool_or(o.unlaunched OR a.start_ns IS NULL) AS unknown, min(a.start_ns) AS launch_ns
                      FROM o LEFT JOIN api_calls a ON {keys}
                      GROUP BY o.gap)
                GROUP BY sid""").fetchall()
            for r in rows:
                acc = out.setdefault(int(r[0]), [0, 0, 0, 0])
                for k in range(4):
                    acc[k] += int(r[k + 1])
        return out

    def result(self) -> tuple[dict[tuple, GpuTimeSplit], GpuTimeSplit | None, dict[tuple, _Stream]]:
        devs = {k: self.dev_sets.split(d) for k, d in self.devs.items()}
        every = (self.all_sets or self.dev_sets).split(0) if self.devs else None
        st = {k: v.tolist() for k, v in self.st.items()}
        idle = self._idle()
        streams = {}
        for k, i in self.streams.items():
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
