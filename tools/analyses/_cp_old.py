"""critical_path: the chain of host work, launches, GPU ops and synchronisations that bounds one step, its time
split by kind, and what-if re-evaluation of the graph with faster kernels.

Peer semantics: HTA's critical-path analysis (`critical_path_analysis`: a DAG of CPU ops, launches, kernels,
same-stream order and CUDA event syncs, longest path through one ProfilerStep). Differences, by design:

  * Graph. Nodes are intervals, each with a measured start S and end E (integer ns):
      - host: per thread (in thread order) the outermost API calls and the gaps between them (host time spent
        outside the runtime: CPU work; named after the innermost CPU op / annotation covering it);
      - a waiting call (`*Synchronize`, blocking `*Memcpy` without Async) is two nodes: its entry, and its return,
        which may start only when the GPU op it waits for has ended (the "awaited" op, see assumptions);
      - GPU: every kernel, copy and set, per (process, device, stream) in stream order.
    Edges: host order (end -> next start), launch (call start -> GPU op), stream order (end -> next start;
    start -> start + observed lag when ops on one stream overlap), event record -> event wait (end of the
    recorded op -> the waiting stream's next op), awaited op end -> sync return, and the window start (root) for
    nodes with no other predecessor.
  * Timing model (critical path method, not HTA's fixed edge weights): a node starts at
    ready + delay, ready = max over its incoming edges (predecessor end, or start + lag); delay = measured start
    - measured ready (launch overhead, GPU gap, ...) is kept fixed; duration is the measured one. With measured
    durations this reproduces every measured start exactly, so the critical path length equals the window span
    (window start to the latest end of anything in it). The critical path is the chain of binding predecessors
    from that last end back to the window start; everything off it has slack.
  * What-if: durations of the GPU ops matching a rule are divided by its speedup (rounded to ns) and the whole
    graph is re-evaluated in topological order (never by subtracting); a waiting call then returns when its
    awaited op ends, so host work after it moves too. Delays and host durations stay as measured.

The path's time is split by kind (each ns of the path in exactly one kind; denominator = path length):
cpu (host gaps and non-launch API calls), launch_overhead (launch/async-copy API time and the delay from the
launch call's start to its GPU op's start), gpu_compute (kernels), copy (copies and sets), communication
(NCCL/RCCL kernels), sync_wait (sync returns after the awaited op ended; event waits), idle_gap (GPU gaps between
ops on a stream, host time outside any recorded op on a thread other than the step's, the start before carried-in
work).
"""

from __future__ import annotations

import fnmatch
import re
import heapq
import statistics
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .api_summary import COPY_RE, LAUNCH_RE, SYNC_RE
from .comm_patterns import is_comm_sql
from .common import Window, capture_window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .requirements import require

MAX_NODES = 200_000  # graph nodes per window; beyond it the window end is moved earlier (truncated = true)
KINDS = ("cpu", "launch_overhead", "gpu_compute", "copy", "communication", "sync_wait", "idle_gap")
RECORD_RE = r"^(cuda|cu|hip)EventRecord"
WAIT_EVENT_RE = r"^(cuda|cu|hip)StreamWaitEvent$"
ASYNC_ISSUE_RE = r"^(cuda|cu|hip)(Memcpy|Memset)[A-Za-z0-9]*Async$"

# edge types (priority on equal ready times: a GPU-side dependency wins over the host)
ROOT, HOST, LAUNCH, STREAM, EVENT, WAIT = 0, 1, 2, 3, 4, 5
EDGE_NAMES = {ROOT: "window_start", HOST: "host_order", LAUNCH: "launch", STREAM: "stream_order", EVENT: "event_wait",
              WAIT: "sync_wait"}
DELAY_KIND = {ROOT: "idle_gap", HOST: "cpu", LAUNCH: "launch_overhead", STREAM: "idle_gap", EVENT: "sync_wait", WAIT: "sync_wait"}
FIN, START = 0, 1

ASSUMPTIONS = [
    "event record/wait: the trace model holds no CUDA/HIP event handles, so a *StreamWaitEvent call is paired with the "
    "latest *EventRecord call before it on the same thread; the recorded op is the last GPU op launched from that "
    "thread before the record, the waiting op the first GPU op launched from it after the wait (an edge only when "
    "their streams differ; dropped when the waiting op started before the recorded op ended)",
    "host synchronisation: a *Synchronize call waits for the latest-ending GPU op of its process that was launched "
    "before the call and ended before it returned (the stream or event waited on is not in the model); a blocking "
    "*Memcpy waits for its own copy",
    "host gaps between API calls are CPU work on the step's thread (the thread with most API calls in a caller "
    "window); on other threads only where a CPU op or annotation covers them (else idle_gap). The step's thread runs "
    "to the step's end; a caller window ends with its last event",
    "communication kernels are nodes of their own stream; collectives are not linked across ranks (single-profile graph)",
]


class Share(BaseModel):
    kind: str = Field(description="cpu, launch_overhead, gpu_compute, copy, communication, sync_wait or idle_gap")
    ns: int = Field(description="time of the critical path in this kind, ns")
    pct_of_path: float | None = Field(description="ns / critical path length, %")


class Contributor(BaseModel):
    name: str = Field(description="kernel, copy, API call or CPU op name (clipped)")
    kind: str = Field(description="kind of its time (see split)")
    lane: str = Field(description="'host pid/tid' or 'gpu pid/device/stream'")
    count: int = Field(description="instances on the path")
    ns: int = Field(description="their time on the path (durations; delays are in split only), ns")
    pct_of_path: float | None = Field(description="ns / critical path length, %")


class Segment(BaseModel):
    lane: str = Field(description="'host pid/tid' or 'gpu pid/device/stream'")
    start_ns: int = Field(description="where the path enters this lane (evaluated time), ns")
    end_ns: int = Field(description="where it leaves, ns")
    ns: int = Field(description="end_ns - start_ns, ns")
    nodes: int = Field(description="path nodes in this run")
    top: str = Field(description="longest node of the run")


class LaneSlack(BaseModel):
    lane: str
    nodes: int = Field(description="graph nodes on this lane")
    on_path_ns: int = Field(description="time of the path on this lane, ns")
    last_end_ns: int = Field(description="end of the lane's last node (evaluated), ns")
    slack_ns: int = Field(description="path end - last_end_ns: how much later the lane could finish without lengthening "
                                      "the step, ns (0 for the lane holding the end event)")


class EndEvent(BaseModel):
    lane: str
    name: str
    end_ns: int = Field(description="evaluated end of the last node, ns (= window start + path length)")


class IterationChoice(BaseModel):
    index: int = Field(description="0-based step index within its series (iterations tool)")
    name: str
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    wall_ns: int = Field(description="host duration of the step range, ns")
    steps: int = Field(description="steps in the series")
    how: str = Field(description="'caller' (step=), or why this step was chosen")


class GraphStats(BaseModel):
    nodes: int = Field(description="graph nodes (host intervals, call entries/returns, GPU ops) plus the window start")
    host_nodes: int
    gpu_ops: int = Field(description="kernels, copies and sets in the graph (launched in the window, running in it, or "
                                     "carried in from before it)")
    carried_in_ops: int = Field(description="GPU ops that started before the window and ended inside it (counted from the window start)")
    edges: dict[str, int] = Field(description="edges by type: host_order, launch, stream_order, event_wait, sync_wait, window_start")
    event_pairs_inferred: int = Field(description="record -> wait pairs turned into cross-stream edges")
    event_pairs_dropped: int = Field(description="inferred pairs contradicted by the timing (waiting op started before the recorded op ended)")
    sync_calls: int = Field(description="waiting calls (synchronize, blocking copies) in the window")
    sync_calls_awaiting: int = Field(description="of those, calls with an awaited GPU op")
    launch_edges_dropped: int = Field(description="GPU ops that started before their launch call (clock skew): no launch edge")
    overlapping_stream_pairs: int = Field(description="consecutive ops of one stream that overlap (start -> start edge)")
    node_cap: int = Field(description="most nodes a window may have; beyond it the window end is moved earlier")


class WhatIfRule(BaseModel):
    name_contains: str | None = None
    name_glob: str | None = Field(None, description="glob over the kernel short name (e.g. 'gemm*')")
    speedup: float = Field(description="duration divisor (2.0 = twice as fast)")
    matched_ops: int = Field(description="GPU ops of the graph the rule matched")
    matched_on_path: int = Field(description="of those, ops on the baseline critical path")
    matched_ns: int = Field(description="summed measured duration of the matched ops, ns")


class WhatIf(BaseModel):
    rules: list[WhatIfRule]
    path_ns: int = Field(description="critical path length after re-evaluating the graph, ns")
    change_ns: int = Field(description="path_ns - baseline path_ns (negative = faster), ns")
    change_pct: float | None = Field(description="change_ns / baseline path_ns, %")
    path_moved: bool = Field(description="true when the new critical path runs through a different set of nodes")
    lanes_before: list[str] = Field(description="lanes of the baseline path, by time on it")
    lanes_after: list[str] = Field(description="lanes of the new path, by time on it")
    end_event: EndEvent
    split: list[Share]
    top_contributors: list[Contributor]


class CriticalPathResult(ToolResult):
    trace: str
    window: Window = Field(description="the analysed window; its end is the latest end of anything in the graph, which "
                                       "may pass the step's end when GPU work launched in the step runs past it")
    iteration: IterationChoice | None = Field(description="the step analysed; null for a caller window or the capture span")
    window_note: str
    path_ns: int = Field(description="critical path length = evaluated end of the last node - window start, ns")
    window_span_ns: int = Field(description="window span, ns; equals path_ns (the measured timeline is reproduced)")
    end_event: EndEvent
    split: list[Share] = Field(description="path time by kind; sums to path_ns (denominator of every pct_of_path)")
    top_contributors: list[Contributor] = Field(description="named durations on the path, largest first")
    segments: list[Segment] = Field(description="the path as runs on one lane, in time order")
    lanes: list[LaneSlack] = Field(description="lanes with their time on the path and their slack, most time on the path first "
                                               "(at most `limit`)")
    what_if: list[WhatIf] = Field(description="one entry per what_if scenario (all its rules applied together)")
    graph: GraphStats
    assumptions: list[str]
    truncated: bool = Field(description="true when the window was cut at node_cap nodes, or segments beyond `limit` were left out")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def _has(series: pd.Series, rx: str) -> pd.Series:
    """Regex search over a text column (groups made non-capturing: pandas warns about capturing ones)."""
    return series.astype(str).str.contains(re.sub(r"\((?!\?)", "(?:", rx), regex=True)


def critical_path(
    trace: Trace,
    *,
    step: int | None = None,
    marker: str | None = None,
    pid: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    what_if: list[dict] | None = None,
    limit: int = 20,
) -> CriticalPathResult:
    """`what_if`: a list of rules {"name_contains": "gemm" | "name_glob": "gemm*", "speedup": 2.0}, applied together
    as one scenario; a list of such lists evaluates several scenarios."""
    require(trace, "critical_path")
    limit = max(1, min(int(limit), 200))
    scenarios = _parse_what_if(what_if)
    ws, we, main_tid, pid, choice, note, source = _window(trace, step, marker, pid, start_ns, end_ns)
    g = _Graph(trace, ws, we, pid, main_tid)
    base = g.evaluate(g.d)
    path = g.path(base)
    path_ns = int(base.F[path.end])  # graph times are relative to the window start
    win_end = ws + path_ns
    split = g.split(base, path)
    assert sum(split.values()) == path_ns, (split, path_ns)
    outcomes = []
    for rules in scenarios:
        d2, info = g.scaled(rules, path)
        ev = g.evaluate(d2)
        p2 = g.path(ev)
        n2 = int(ev.F[p2.end])
        s2 = g.split(ev, p2)
        assert sum(s2.values()) == n2
        outcomes.append(WhatIf(
            rules=info, path_ns=n2, change_ns=n2 - path_ns, change_pct=pct(n2 - path_ns, path_ns),
            path_moved=set(p2.nodes) != set(path.nodes), lanes_before=g.path_lanes(base, path), lanes_after=g.path_lanes(ev, p2),
            end_event=g.end_event(ev, p2), split=_shares(s2, n2), top_contributors=g.contributors(ev, p2, n2, limit=8)))
    segments = g.segments(base, path)
    truncated = g.truncated or len(segments) > limit
    return CriticalPathResult(
        data_issues=data_issue_notes(trace, ("api_calls", "kernels", "memops", "cpu_ops", "markers")),
        trace=str(trace.path), window=Window(start_ns=ws, end_ns=win_end, span_ns=win_end - ws, source=source),
        iteration=choice, window_note=note + (f"; cut at {MAX_NODES} graph nodes: the window ends at {g.we} ns" if g.truncated else ""),
        path_ns=path_ns, window_span_ns=win_end - ws, end_event=g.end_event(base, path),
        split=_shares(split, path_ns), top_contributors=g.contributors(base, path, path_ns, limit=limit),
        segments=segments[:limit], lanes=g.lanes(base, path)[:limit], what_if=outcomes, graph=g.stats(), assumptions=ASSUMPTIONS,
        truncated=truncated,
        hint=(f"{len(segments) - limit} more path segments than limit={limit}; raise limit (max 200)" if len(segments) > limit
              else "the window was cut at the node cap: pass a narrower start_ns/end_ns" if g.truncated else None))


# ---------------------------------------------------------------------------------------------- inputs


def _parse_what_if(what_if: Any) -> list[list[dict]]:
    if not what_if:
        return []
    if not isinstance(what_if, list):
        raise ProfileError("what_if must be a list of rules such as [{\"name_contains\": \"gemm\", \"speedup\": 2.0}] "
                           "(or a list of such lists, one per scenario).")
    groups = what_if if all(isinstance(x, list) for x in what_if) else [what_if]
    out = []
    for group in groups:
        rules = []
        for r in group:
            if not isinstance(r, dict):
                raise ProfileError(f"what_if rule {r!r} is not an object; write {{\"name_contains\": \"gemm\", \"speedup\": 2.0}}.")
            unknown = set(r) - {"name_contains", "name_glob", "speedup"}
            if unknown:
                raise ProfileError(f"what_if rule {r!r}: unknown keys {sorted(unknown)}; use name_contains or name_glob, and speedup.")
            if bool(r.get("name_contains")) == bool(r.get("name_glob")):
                raise ProfileError(f"what_if rule {r!r}: give exactly one of name_contains (substring, case-insensitive) "
                                   "or name_glob (glob over the kernel short name).")
            try:
                sp = float(r.get("speedup", 0))
            except (TypeError, ValueError):
                sp = 0.0
            if not sp > 0 or sp == float("inf"):
                raise ProfileError(f"what_if rule {r!r}: speedup must be a positive number (2.0 = twice as fast, 1.0 = unchanged).")
            rules.append({"name_contains": r.get("name_contains"), "name_glob": r.get("name_glob"), "speedup": sp})
        if rules:
            out.append(rules)
    return out


def _window(trace: Trace, step, marker, pid, start_ns, end_ns):
    """(ws, we, main thread or None, pid or None, IterationChoice or None, note, window source)."""
    if start_ns is not None or end_ns is not None:
        if step is not None or marker is not None:
            raise ProfileError("give either a step (step=, marker=) or a time window (start_ns/end_ns), not both.")
        _, w = resolve_selection(trace, None, None, start_ns, end_ns)
        return w.start_ns, w.end_ns, None, pid, None, "the caller's time window", w.source
    from .iterations import iterations

    try:
        it = iterations(trace, marker=marker, pid=pid, limit=None)
    except ProfileError as exc:
        if step is not None or marker is not None:
            raise
        w = capture_window(trace)
        return (w.start_ns, w.end_ns, None, pid, None,
                f"no iteration steps ({str(exc).split('. ')[0]}); the whole capture span is analysed: pass start_ns/end_ns "
                "for one step", w.source)
    s0 = it.summaries[0]
    series = [s for s in it.steps if (s.pid, s.tid) == (s0.pid, s0.tid)]
    if step is not None:
        if not 0 <= step < len(series):
            raise ProfileError(f"step={step} does not exist: the series '{it.choice.pattern}' (process {s0.pid}, thread "
                               f"{s0.tid}) has steps 0..{len(series) - 1}.")
        chosen, how = series[step], f"caller (step={step})"
    else:
        steady = [s for s in series if not s.warmup] or series
        ranked = sorted(steady, key=lambda s: (s.wall_ns, s.index))
        chosen = ranked[(len(ranked) - 1) // 2]
        how = (f"the median-length steady step ({len(steady)} steady of {len(series)}; warm-up "
               f"{s0.warmup_steps or 'none'}; median wall {statistics.median([s.wall_ns for s in steady]):.0f} ns)")
    choice = IterationChoice(index=chosen.index, name=chosen.name, pid=chosen.pid, tid=chosen.tid, start_ns=chosen.start_ns,
                             end_ns=chosen.end_ns, wall_ns=chosen.wall_ns, steps=len(series), how=how)
    note = (f"step {chosen.index} of '{it.choice.pattern}' ({it.choice.how}: {it.choice.reason}); GPU work launched in "
            "the step is followed past the step's end")
    return chosen.start_ns, chosen.end_ns, chosen.tid, chosen.pid, choice, note, f"iteration step {chosen.index}"


# ---------------------------------------------------------------------------------------------- the graph


class _Eval:
    __slots__ = ("S", "F", "bind", "d")

    def __init__(self, S, F, bind, d):
        self.S, self.F, self.bind, self.d = S, F, bind, d


class _Path:
    __slots__ = ("end", "nodes", "entered")

    def __init__(self, end, nodes, entered):
        self.end, self.nodes, self.entered = end, nodes, entered


class _Graph:
    def __init__(self, trace: Trace, ws: int, we: int, pid: int | None, main_tid: int | None) -> None:
        # Times inside the graph are relative to the window start (base): pandas turns nullable integer columns into
        # float64, which is exact only below 2^53 ns, and rocpd clocks are absolute (~1.7e18 ns).
        self.trace, self.base, self.ws, self.pid = trace, ws, ws, pid
        self.truncated = False
        we = self._cap(we)
        self.we = we
        calls = self._calls(we)
        gops = self._gops(we)
        self.ws, we = 0, we - ws
        self.main = (pid, main_tid) if main_tid is not None else self._busiest_thread(calls)
        # a step's thread runs until the step's end; a caller window ends with its last event
        self.trailing = main_tid is not None
        host, self.n_sync, wait_of = self._host(calls, we)
        self._build(host, gops, calls, wait_of)

    # -- data ---------------------------------------------------------------------------------------------

    def _pid_sql(self, col: str = "pid") -> tuple[str, list]:
        return (f" AND {col} = ?", [self.pid]) if self.pid is not None else ("", [])

    def _df(self, query: str, params: list) -> pd.DataFrame:
        cur = self.trace.con.cursor()
        try:
            return cur.execute(query, params).df()
        finally:
            cur.close()

    def _cap(self, we: int) -> int:
        p, pp = self._pid_sql()
        n = self.trace.scalar(f"""SELECT (SELECT count(*) FROM api_calls WHERE start_ns >= ? AND start_ns < ?{p})
                                       + (SELECT count(*) FROM kernels WHERE start_ns >= ? AND start_ns < ?{p})
                                       + (SELECT count(*) FROM memops WHERE start_ns >= ? AND start_ns < ?{p})""",
                              [self.ws, we, *pp] * 3)
        if 3 * int(n or 0) <= MAX_NODES:
            return we
        self.truncated = True
        return int(self.trace.scalar(f"""SELECT start_ns FROM (
                SELECT start_ns FROM api_calls WHERE start_ns >= ? AND start_ns < ?{p}
                UNION ALL SELECT start_ns FROM kernels WHERE start_ns >= ? AND start_ns < ?{p}
                UNION ALL SELECT start_ns FROM memops WHERE start_ns >= ? AND start_ns < ?{p})
            ORDER BY start_ns LIMIT 1 OFFSET ?""", [self.ws, we, *pp] * 3 + [MAX_NODES // 3]))

    def _calls(self, we: int) -> pd.DataFrame:
        p, pp = self._pid_sql()
        df = self._df(f"""SELECT rowid AS cid, pid, tid, start_ns - ? AS start_ns, end_ns - ? AS end_ns, name FROM api_calls
                          WHERE start_ns >= ? AND start_ns < ? AND pid IS NOT NULL AND tid IS NOT NULL{p}
                          ORDER BY pid, tid, start_ns, end_ns DESC, rowid""", [self.base, self.base, self.ws, we, *pp])
        # outermost calls per thread: a call starting before the running end of the earlier calls is nested in one
        prev = df.groupby(["pid", "tid"], sort=False)["end_ns"].transform(
            lambda s: s.cummax().shift(1, fill_value=np.iinfo(np.int64).min))
        df["outer"] = ~(df["start_ns"] < prev)
        df["outer_cid"] = df["cid"].where(df["outer"]).ffill().fillna(-1).astype("int64")
        df["sync"] = _has(df["name"], SYNC_RE) | (
            _has(df["name"], COPY_RE) & ~df["name"].str.contains("Async", regex=False))
        return df

    def _gops(self, we: int) -> pd.DataFrame:
        p, pp = self._pid_sql("g.pid")
        comm = is_comm_sql("g.name")
        return self._df(f"""
            WITH g AS (
                SELECT 'kernel' AS op, device_id, stream_id, start_ns, end_ns, name, short_name, pid, correlation_id FROM kernels
                UNION ALL
                SELECT op, device_id, stream_id, start_ns, end_ns,
                       CASE WHEN op = 'set' THEN 'Memset' ELSE 'Memcpy ' || kind END, NULL, pid, correlation_id FROM memops),
            l AS (SELECT pid, correlation_id, arg_min(rowid, (start_ns, end_ns, rowid)) AS lcid, min(start_ns) AS call_start_ns,
                         arg_min(tid, (start_ns, end_ns, rowid)) AS call_tid
                  FROM api_calls WHERE correlation_id IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
                  GROUP BY pid, correlation_id)
            SELECT g.op, g.device_id, coalesce(g.stream_id, -1) AS stream_id, g.start_ns - ? AS start_ns, g.end_ns - ? AS end_ns,
                   g.name, coalesce(g.short_name, g.name) AS short_name, g.pid, l.lcid IS NOT NULL AS linked, l.lcid,
                   coalesce(l.call_start_ns - ?, g.start_ns - ?) AS call_start_ns, coalesce(l.call_tid, -1) AS call_tid,
                   g.op = 'kernel' AND {comm} AS is_comm
            FROM g LEFT JOIN l ON l.pid = g.pid AND l.correlation_id = g.correlation_id
            WHERE ((g.start_ns >= ? AND g.start_ns < ?) OR (g.start_ns < ? AND g.end_ns > ?)
                   OR (l.call_start_ns >= ? AND l.call_start_ns < ?)){p}
            ORDER BY g.pid, g.device_id, stream_id, g.start_ns, g.end_ns, g.name""",
                        [self.base] * 4 + [self.ws, we, self.ws, self.ws, self.ws, we, *pp])

    def _busiest_thread(self, calls: pd.DataFrame):
        if calls.empty:
            return None
        c = calls.groupby(["pid", "tid"]).size().sort_values(ascending=False, kind="stable")
        return tuple(int(x) for x in c.index[0])

    def _host(self, calls: pd.DataFrame, we: int):
        """Host nodes (DataFrame) per thread: gaps, single calls, entry/return of waiting calls."""
        outer = calls[calls["outer"]].copy()
        sync_any = calls.groupby("outer_cid")["sync"].any()
        outer["wait"] = outer["cid"].map(sync_any).fillna(False).astype(bool)
        outer["k"] = outer.groupby(["pid", "tid"]).cumcount()
        lane = outer["pid"].astype(str) + "/" + outer["tid"].astype(str)
        outer["lane"] = "host " + lane
        parts = []
        # calls: one node, or entry + return for waiting calls
        single = outer[~outer["wait"]]
        parts.append(pd.DataFrame({"lane": single["lane"], "pid": single["pid"], "tid": single["tid"], "pos": 3 * single["k"] + 1,
                                   "S": single["start_ns"], "E": single["end_ns"], "name": single["name"], "role": "call",
                                   "cid": single["cid"]}))
        waits = outer[outer["wait"]]
        parts.append(pd.DataFrame({"lane": waits["lane"], "pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 1,
                                   "S": waits["start_ns"], "E": waits["start_ns"], "name": waits["name"], "role": "entry",
                                   "cid": waits["cid"]}))
        parts.append(pd.DataFrame({"lane": waits["lane"], "pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 2,
                                   "S": waits["start_ns"], "E": waits["end_ns"], "name": waits["name"], "role": "return",
                                   "cid": waits["cid"]}))
        # gaps: before each call (from the previous call's end, or the window start), and after the last on the step's thread
        prev_end = outer.groupby(["pid", "tid"])["end_ns"].shift(1, fill_value=self.ws).astype("int64")
        gap = outer.assign(gs=prev_end, ge=outer["start_ns"])
        gap = gap[gap["ge"] > gap["gs"]]
        parts.append(pd.DataFrame({"lane": gap["lane"], "pid": gap["pid"], "tid": gap["tid"], "pos": 3 * gap["k"],
                                   "S": gap["gs"], "E": gap["ge"], "name": "", "role": "gap", "cid": -1}))
        if self.main is not None and self.trailing:
            mp, mt = self.main
            last = outer[(outer["pid"] == mp) & (outer["tid"] == mt)].tail(1)
            last_end = int(last["end_ns"].iloc[0]) if len(last) else self.ws
            if we > last_end:
                parts.append(pd.DataFrame({"lane": [f"host {mp}/{mt}"], "pid": [mp], "tid": [mt], "pos": [3 * len(outer[(outer["pid"] == mp) & (outer["tid"] == mt)])],
                                           "S": [last_end], "E": [we], "name": [""], "role": ["gap"], "cid": [-1]}))
        host = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else pd.DataFrame(
            columns=["lane", "pid", "tid", "pos", "S", "E", "name", "role", "cid"])
        host = host.sort_values(["lane", "pos"], kind="stable").reset_index(drop=True)
        host[["S", "E", "pos", "cid"]] = host[["S", "E", "pos", "cid"]].astype("int64")
        self._name_gaps(host)
        return host, int(len(waits)), waits

    def _name_gaps(self, host: pd.DataFrame) -> None:
        """Gap name = innermost CPU op (else annotation range) of the thread covering the gap's midpoint; kind."""
        gaps = host[host["role"] == "gap"]
        host["gkind"] = "cpu"
        if gaps.empty:
            return
        probe = pd.DataFrame({"i": gaps.index, "pid": gaps["pid"].astype("int64"), "tid": gaps["tid"].astype("int64"),
                              "t": ((gaps["S"] + gaps["E"]) // 2).astype("int64") + self.base})
        cur = self.trace.con.cursor()
        try:
            cur.register("_cp_probe", probe)
            rows = cur.execute("""
                WITH o AS (SELECT pid, tid, start_ns, end_ns, name, 0 AS pri FROM cpu_ops WHERE category = 'cpu_op'
                           UNION ALL SELECT pid, tid, start_ns, end_ns, name, 1 FROM markers
                           WHERE kind IN ('push_pop', 'start_end', 'annotation') AND pid IS NOT NULL)
                SELECT p.i, arg_max(o.name, (-o.pri, o.start_ns, -o.end_ns)) FROM _cp_probe p
                JOIN o ON o.pid = p.pid AND o.tid = p.tid AND o.start_ns <= p.t AND p.t < o.end_ns GROUP BY p.i""").fetchall()
            cur.unregister("_cp_probe")
        finally:
            cur.close()
        names = dict(rows)
        host.loc[gaps.index, "name"] = [names.get(i, "<host: no op recorded>") for i in gaps.index]
        main = (host["pid"] == (self.main[0] if self.main else None)) & (host["tid"] == (self.main[1] if self.main else None))
        covered = host.index.isin(list(names))
        host.loc[gaps.index[~(main.loc[gaps.index] | covered[gaps.index.to_numpy()])], "gkind"] = "idle_gap"

    # -- structure ----------------------------------------------------------------------------------------

    def _build(self, host: pd.DataFrame, gops: pd.DataFrame, calls: pd.DataFrame, waits: pd.DataFrame) -> None:
        ws = self.ws
        nh, ng = len(host), len(gops)
        n = 1 + nh + ng
        self.n, self.nh, self.ng = n, nh, ng
        gi = np.arange(1 + nh, n)
        S = np.empty(n, dtype=np.int64)
        E = np.empty(n, dtype=np.int64)
        S[0] = E[0] = ws
        S[1:1 + nh], E[1:1 + nh] = host["S"].to_numpy(), host["E"].to_numpy()
        carried = (gops["start_ns"] < ws).to_numpy()
        self.n_carried = int(carried.sum())
        S[gi] = np.where(carried, ws, gops["start_ns"].to_numpy())
        E[gi] = gops["end_ns"].to_numpy()
        E[gi] = np.maximum(E[gi], S[gi])
        kind = np.empty(n, dtype=object)
        name = np.empty(n, dtype=object)
        lane = np.empty(n, dtype=object)
        kind[0], name[0], lane[0] = "idle_gap", "<window start>", "window"
        role = host["role"].to_numpy()
        hn = host["name"].to_numpy()
        launchy = _has(host["name"], LAUNCH_RE) | _has(host["name"], ASYNC_ISSUE_RE) | \
            _has(host["name"], RECORD_RE) | _has(host["name"], WAIT_EVENT_RE)
        kind[1:1 + nh] = np.where(role == "gap", host["gkind"].to_numpy(),
                                  np.where(role == "return", "sync_wait", np.where(launchy.to_numpy(), "launch_overhead", "cpu")))
        name[1:1 + nh] = hn
        lane[1:1 + nh] = host["lane"].to_numpy()
        op = gops["op"].to_numpy()
        kind[gi] = np.where(op == "kernel", np.where(gops["is_comm"].fillna(False).to_numpy(dtype=bool), "communication", "gpu_compute"), "copy")
        name[gi] = gops["name"].to_numpy()
        glane = ("gpu " + gops["pid"].astype("Int64").astype(str) + "/" + gops["device_id"].astype(str) + "/"
                 + gops["stream_id"].astype(str)).to_numpy()
        lane[gi] = glane
        self.S_meas, self.E_meas, self.kind, self.name, self.lane = S, E, kind, name, lane
        self.gops = gops
        self.d = (E - S).astype(np.int64)
        self.d[1 + np.flatnonzero(role == "entry")] = 0

        src, dst, typ, anc, w = [], [], [], [], []

        def add(s, t, ty, a=FIN, ww=None):
            s, t = np.asarray(s, dtype=np.int64), np.asarray(t, dtype=np.int64)
            src.append(s), dst.append(t), typ.append(np.full(len(s), ty, dtype=np.int8)), anc.append(np.full(len(s), a, dtype=np.int8))
            w.append(np.zeros(len(s), dtype=np.int64) if ww is None else np.asarray(ww, dtype=np.int64))

        # host order
        hl = host["lane"].to_numpy()
        same = np.flatnonzero(hl[1:] == hl[:-1]) if nh > 1 else np.array([], dtype=np.int64)
        add(1 + same, 2 + same, HOST)
        # waiting calls: awaited op -> return node
        ent = host[host["role"].isin(["call", "entry"])]
        node_of_cid = pd.Series(1 + ent.index.to_numpy(), index=ent["cid"].to_numpy())
        ret = host[host["role"] == "return"]
        ret_node = pd.Series(1 + ret.index.to_numpy(), index=ret["cid"].to_numpy())
        # launch: outermost call containing the launching call -> op
        outer_of = pd.Series(calls["outer_cid"].to_numpy(), index=calls["cid"].to_numpy()) if len(calls) else pd.Series(dtype="float64")
        lc = gops["lcid"].map(outer_of)
        call_node = lc.map(node_of_cid)
        has = call_node.notna().to_numpy()
        cn = call_node.to_numpy(dtype="float64")
        ok = has & (S[gi] >= np.where(has, S[np.nan_to_num(cn, nan=0).astype(np.int64)], 0)) & ~carried
        self.launch_dropped = int((has & ~carried & ~ok).sum())
        add(cn[ok].astype(np.int64), gi[ok], LAUNCH, START)
        # stream order
        key = (gops["pid"].astype("Int64").astype(str) + "/" + gops["device_id"].astype(str) + "/" + gops["stream_id"].astype(str)).to_numpy()
        order = np.lexsort((gi, E[gi], S[gi], key))
        ks = key[order]
        pairs = np.flatnonzero(ks[1:] == ks[:-1]) if ng > 1 else np.array([], dtype=np.int64)
        a_, b_ = gi[order[pairs]], gi[order[pairs + 1]]
        overl = E[a_] > S[b_]
        self.overlaps = int(overl.sum())
        add(a_[~overl], b_[~overl], STREAM)
        add(a_[overl], b_[overl], STREAM, START, S[b_[overl]] - S[a_[overl]])
        # sync returns: the awaited op
        self.n_awaiting = 0
        if len(waits):
            issued = gops["call_start_ns"].to_numpy(dtype=np.int64)  # the op's own start when unlinked
            g_end = E[gi]
            g_pid = gops["pid"].to_numpy()
            g_outer = lc.to_numpy(dtype="float64")
            srcs, dsts = [], []
            for cid, p, st, en, nm in zip(waits["cid"], waits["pid"], waits["start_ns"], waits["end_ns"], waits["name"]):
                own = g_outer == cid
                if own.any() and not nm.lower().endswith("synchronize"):
                    cand = own & (g_end <= en)
                else:
                    cand = (g_pid == p) & (issued < st) & (g_end <= en)
                if cand.any():
                    j = np.flatnonzero(cand)[np.argmax(g_end[cand])]
                    srcs.append(gi[j]), dsts.append(int(ret_node[cid]))
            self.n_awaiting = len(srcs)
            add(srcs, dsts, WAIT)
        # cross-stream events
        self.events_ok, self.events_dropped = self._events(calls, gops, gi, add)
        # root for nodes without predecessors
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        has_pred = np.zeros(n, dtype=bool)
        has_pred[dst_a] = True
        orphans = np.flatnonzero(~has_pred)
        orphans = orphans[orphans != 0]
        add(np.zeros(len(orphans), dtype=np.int64), orphans, ROOT)
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        typ_a, anc_a, w_a = np.concatenate(typ), np.concatenate(anc), np.concatenate(w)
        # incoming CSR sorted by destination
        o = np.lexsort((src_a, dst_a))
        self.src, self.dst, self.typ, self.anc, self.w = src_a[o], dst_a[o], typ_a[o], anc_a[o], w_a[o]
        self.ptr = np.searchsorted(self.dst, np.arange(n + 1))
        # measured ready and fixed delay
        anchor = np.where(self.anc == FIN, E[self.src], S[self.src] + self.w)
        ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ready, self.dst, anchor)
        ready[0] = ws
        delay = S - ready
        # return nodes start when the later of entry and awaited op ends
        rn = 1 + np.flatnonzero(role == "return")
        S[rn] = np.maximum(S[rn], ready[rn])
        self.d[rn] = E[rn] - S[rn]
        delay = S - ready
        if not (delay >= 0).all():
            bad = np.flatnonzero(delay < 0)[:5]
            raise AssertionError(f"dependency edge ends after its successor starts: {[(int(i), self.name[i], int(S[i]), int(ready[i])) for i in bad]}")
        self.delay = delay
        self.order = self._topo()

    def _events(self, calls, gops, gi, add) -> tuple[int, int]:
        rec = calls[_has(calls["name"], RECORD_RE)][["pid", "tid", "start_ns"]]
        wai = calls[_has(calls["name"], WAIT_EVENT_RE)][["pid", "tid", "start_ns"]]
        linked = gops.assign(node=gi)[gops["linked"].to_numpy(dtype=bool) & (gops["start_ns"] >= self.ws).to_numpy()]
        if rec.empty or wai.empty or linked.empty:
            return 0, 0
        linked = linked.assign(call_tid=linked["call_tid"].astype("int64"), cs=linked["call_start_ns"].astype("int64"),
                               pid=linked["pid"].astype("int64"))
        lk = linked.sort_values("cs")[["pid", "call_tid", "cs", "node", "device_id", "stream_id"]].rename(columns={"call_tid": "tid"})
        w = wai.sort_values("start_ns").astype({"pid": "int64", "tid": "int64", "start_ns": "int64"})
        r = rec.sort_values("start_ns").astype({"pid": "int64", "tid": "int64", "start_ns": "int64"}).rename(columns={"start_ns": "rs"})
        w = pd.merge_asof(w, r.assign(rk=r["rs"]), left_on="start_ns", right_on="rs", by=["pid", "tid"],
                          allow_exact_matches=False, direction="backward").dropna(subset=["rs"])
        if w.empty:
            return 0, 0
        w["rs"] = w["rs"].astype("int64")
        w = pd.merge_asof(w.sort_values("rs"), lk.rename(columns={"node": "rec", "device_id": "rd", "stream_id": "rst"}),
                          left_on="rs", right_on="cs", by=["pid", "tid"], allow_exact_matches=False, direction="backward")
        w = w.drop(columns="cs").dropna(subset=["rec"]).sort_values("start_ns")
        w = pd.merge_asof(w, lk.rename(columns={"node": "wt", "device_id": "wd", "stream_id": "wst"}),
                          left_on="start_ns", right_on="cs", by=["pid", "tid"], allow_exact_matches=False, direction="forward")
        w = w.dropna(subset=["wt"])
        w = w[(w["rd"] != w["wd"]) | (w["rst"] != w["wst"])]
        a, b = w["rec"].to_numpy(dtype=np.int64), w["wt"].to_numpy(dtype=np.int64)
        good = self.E_meas[a] <= self.S_meas[b]
        pairs = pd.DataFrame({"a": a[good], "b": b[good]}).drop_duplicates()
        add(pairs["a"].to_numpy(), pairs["b"].to_numpy(), EVENT)
        return len(pairs), int((~good).sum())

    def _topo(self) -> list[int]:
        """Kahn's algorithm, ready nodes taken by (measured start, node id): the forward pass's order."""
        n = self.n
        indeg = np.bincount(self.dst, minlength=n).tolist()
        o = np.argsort(self.src, kind="stable")
        out_dst = self.dst[o].tolist()
        optr = np.searchsorted(self.src[o], np.arange(n + 1)).tolist()
        S = self.S_meas.tolist()
        heap = [(S[i], i) for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, i = heapq.heappop(heap)
            order.append(i)
            for j in out_dst[optr[i]:optr[i + 1]]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, (S[j], j))
        if len(order) != n:
            raise ProfileError("the dependency graph has a cycle (timestamps contradict each other); pass a narrower window.")
        return order

    # -- evaluation ---------------------------------------------------------------------------------------

    def evaluate(self, d: np.ndarray) -> _Eval:
        """Forward pass in topological order: S = max over incoming edges + fixed delay, F = S + duration."""
        n = self.n
        S, F, bind = [0] * n, [0] * n, [-1] * n
        S[0] = F[0] = self.ws
        src, typ, anc, w = self.src.tolist(), self.typ.tolist(), self.anc.tolist(), self.w.tolist()
        ptr, delay, dd = self.ptr.tolist(), self.delay.tolist(), d.tolist()
        for i in self.order:
            if i == 0:
                continue
            best, bt, be = None, -1, -1
            for e in range(ptr[i], ptr[i + 1]):
                p = src[e]
                if anc[e] == FIN:
                    a = F[p]
                else:
                    lag = w[e]
                    a = S[p] + (lag if lag <= dd[p] else dd[p])
                t = typ[e]
                if best is None or a > best or (a == best and t > bt):
                    best, bt, be = a, t, e
            s = best + delay[i]
            S[i], F[i], bind[i] = s, s + dd[i], be
        return _Eval(np.asarray(S, dtype=np.int64), np.asarray(F, dtype=np.int64), bind, d)

    def path(self, ev: _Eval) -> _Path:
        F = ev.F
        last = int(F.max())
        cands = np.flatnonzero(F == last)
        # the end event: of the nodes ending last, the one evaluated last (latest start, then highest id)
        end = int(cands[np.lexsort((cands, ev.S[cands]))][-1])
        nodes, entered = [], []
        i, how = end, FIN
        while i != 0:
            nodes.append(i), entered.append(how)
            e = ev.bind[i]
            how = int(self.anc[e])
            i = int(self.src[e])
        return _Path(end, nodes, entered)

    def _contrib(self, ev: _Eval, path: _Path):
        """Per path node: (node, duration part ns, delay ns, delay kind)."""
        out = []
        for k, (i, how) in enumerate(zip(path.nodes, path.entered)):
            e = ev.bind[i]
            dk = DELAY_KIND[int(self.typ[e])]
            if how == FIN:
                dur = int(ev.d[i])
            else:  # entered at its start (+ lag of the edge from its successor)
                succ = path.nodes[k - 1]
                be = ev.bind[succ]
                dur = int(min(self.w[be], ev.d[i]))
            out.append((i, dur, int(self.delay[i]), dk))
        return out

    def split(self, ev: _Eval, path: _Path) -> dict[str, int]:
        tot = dict.fromkeys(KINDS, 0)
        for i, dur, dl, dk in self._contrib(ev, path):
            tot[self.kind[i]] += dur
            tot[dk] += dl
        return tot

    def contributors(self, ev: _Eval, path: _Path, length: int, limit: int) -> list[Contributor]:
        acc: dict[tuple, list] = {}
        for i, dur, _, _ in self._contrib(ev, path):
            if dur <= 0:
                continue
            key = (self.name[i] or "<host>", self.kind[i], self.lane[i])
            a = acc.setdefault(key, [0, 0])
            a[0] += 1
            a[1] += dur
        rows = sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))[:limit]
        return [Contributor(name=clip_name(k[0]), kind=k[1], lane=k[2], count=v[0], ns=v[1], pct_of_path=pct(v[1], length))
                for k, v in rows]

    def segments(self, ev: _Eval, path: _Path) -> list[Segment]:
        out: list[Segment] = []
        best: list[int] = []
        contrib = self._contrib(ev, path)
        # time order: the path was collected backwards
        for (i, dur, dl, _), how in reversed(list(zip(contrib, path.entered))):
            lo = self.base + int(ev.S[i]) - dl
            hi = self.base + (int(ev.F[i]) if how == FIN else int(ev.S[i]) + dur)
            ln = self.lane[i]
            if out and out[-1].lane == ln:
                s = out[-1]
                s.end_ns, s.ns, s.nodes = hi, hi - s.start_ns, s.nodes + 1
                if dur > best[-1]:
                    s.top, best[-1] = clip_name(self.name[i] or "<host>"), dur
            else:
                out.append(Segment(lane=ln, start_ns=lo, end_ns=hi, ns=hi - lo, nodes=1, top=clip_name(self.name[i] or "<host>")))
                best.append(dur)
        return out

    def path_lanes(self, ev: _Eval, path: _Path) -> list[str]:
        t: dict[str, int] = {}
        for i, dur, dl, _ in self._contrib(ev, path):
            t[self.lane[i]] = t.get(self.lane[i], 0) + dur + dl
        return [k for k, _ in sorted(t.items(), key=lambda kv: (-kv[1], kv[0]))]

    def lanes(self, ev: _Eval, path: _Path) -> list[LaneSlack]:
        end = int(ev.F[path.end])
        on: dict[str, int] = {}
        for i, dur, dl, _ in self._contrib(ev, path):
            on[self.lane[i]] = on.get(self.lane[i], 0) + dur + dl
        df = pd.DataFrame({"lane": self.lane[1:], "F": ev.F[1:]})
        g = df.groupby("lane")["F"].agg(["size", "max"])
        rows = [LaneSlack(lane=ln, nodes=int(r["size"]), on_path_ns=on.get(ln, 0), last_end_ns=self.base + int(r["max"]),
                          slack_ns=end - int(r["max"])) for ln, r in g.iterrows()]
        return sorted(rows, key=lambda x: (-x.on_path_ns, x.slack_ns, x.lane))

    def end_event(self, ev: _Eval, path: _Path) -> EndEvent:
        i = path.end
        return EndEvent(lane=self.lane[i], name=clip_name(self.name[i] or "<host>"), end_ns=self.base + int(ev.F[i]))

    def scaled(self, rules: list[dict], path: _Path) -> tuple[np.ndarray, list[WhatIfRule]]:
        d = self.d.copy()
        names = self.gops["name"].astype(str)
        shorts = self.gops["short_name"].astype(str)
        gi = np.arange(1 + self.nh, self.n)
        on_path = set(path.nodes)
        info = []
        for r in rules:
            if r["name_contains"]:
                t = r["name_contains"].lower()
                hit = (names.str.lower().str.contains(t, regex=False) | shorts.str.lower().str.contains(t, regex=False)).to_numpy()
            else:
                hit = shorts.map(lambda s: fnmatch.fnmatchcase(s, r["name_glob"])).to_numpy(dtype=bool)
            nodes = gi[hit]
            info.append(WhatIfRule(name_contains=r["name_contains"], name_glob=r["name_glob"], speedup=r["speedup"],
                                   matched_ops=int(hit.sum()), matched_on_path=sum(1 for x in nodes.tolist() if x in on_path),
                                   matched_ns=int(self.d[nodes].sum())))
            d[nodes] = np.rint(d[nodes] / r["speedup"]).astype(np.int64)
        return d, info

    def stats(self) -> GraphStats:
        counts = np.bincount(self.typ, minlength=6)
        return GraphStats(
            nodes=self.n, host_nodes=self.nh, gpu_ops=self.ng, carried_in_ops=self.n_carried,
            edges={EDGE_NAMES[t]: int(counts[t]) for t in (HOST, LAUNCH, STREAM, EVENT, WAIT, ROOT)},
            event_pairs_inferred=self.events_ok, event_pairs_dropped=self.events_dropped, sync_calls=self.n_sync,
            sync_calls_awaiting=self.n_awaiting, launch_edges_dropped=self.launch_dropped,
            overlapping_stream_pairs=self.overlaps, node_cap=MAX_NODES)


def _shares(split: dict[str, int], length: int) -> list[Share]:
    return [Share(kind=k, ns=v, pct_of_path=pct(v, length)) for k, v in split.items()]
