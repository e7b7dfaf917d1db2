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
    graph is re-evaluated (never by subtracting); a waiting call then returns when its
    awaited op ends, so host work after it moves too. Delays and host durations stay as measured.
  * Job (several ranks; HTA has no cross-rank path): each rank's graph over the same step, on one timeline (clocks
    assumed aligned), joined at the collectives: the k-th communication kernel of a name on each rank is one instance,
    split per rank into its arrival (start, 0 ns) and its transfer part [the instance's last arrival, its end], with
    an edge from every rank's arrival to every other rank's transfer part. The path therefore runs through the
    last-arriving rank's chain; what-if re-evaluates the joined graph, so a faster kernel on the straggler moves every
    rank's transfer and everything after it.
  * Evaluation is numpy (_Lanes): each thread and stream is a chain whose start times are a running maximum, and
    a schedule built once per graph evaluates chain runs in rounds, one per lane switch of the deepest dependency
    chain (host sync -> GPU -> host ...), so cost is O(nodes + edges) plus ~10-20 us per round.

The path's time is split by kind (each ns of the path in exactly one kind; denominator = path length):
cpu (host gaps and non-launch API calls), launch_overhead (launch/async-copy API time and the delay from the
launch call's start to its GPU op's start), gpu_compute (kernels), copy (copies and sets), communication
(NCCL/RCCL kernels), graph_whole (CUDA graph replays traced whole, Nsight --cuda-graph-trace=graph: the kernels inside,
computation or communication, are not in the export; re-capture with --cuda-graph-trace=node to split them), sync_wait (sync returns after the awaited op ended; event waits), idle_gap (GPU gaps between
ops on a stream, host time outside any recorded op on a thread other than the step's, the start before carried-in
work).
"""

from __future__ import annotations

import fnmatch
import re
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

MAX_NODES = 500_000  # graph nodes per window (~0.4 GB of graph at the cap); beyond it the window end is moved earlier (truncated = true)
KINDS = ("cpu", "launch_overhead", "gpu_compute", "copy", "communication", "graph_whole", "sync_wait", "idle_gap")
RECORD_RE = r"^(cuda|cu|hip)EventRecord"
WAIT_EVENT_RE = r"^(cuda|cu|hip)StreamWaitEvent$"
EVENT_SYNC_RE = r"^(cuda|cu|hip)EventSynchronize$"
ASYNC_ISSUE_RE = r"^(cuda|cu|hip)(Memcpy|Memset)[A-Za-z0-9]*Async$"

# edge types (priority on equal ready times: a GPU-side dependency wins over the host; COLL: a rank's arrival at a
# collective -> every other rank's transfer part, jobs only)
ROOT, HOST, LAUNCH, STREAM, EVENT, WAIT, COLL = 0, 1, 2, 3, 4, 5, 6
EDGE_NAMES = {ROOT: "window_start", HOST: "host_order", LAUNCH: "launch", STREAM: "stream_order", EVENT: "event_wait",
              WAIT: "sync_wait", COLL: "collective"}
DELAY_KIND = {ROOT: "idle_gap", HOST: "cpu", LAUNCH: "launch_overhead", STREAM: "idle_gap", EVENT: "sync_wait", WAIT: "sync_wait",
              COLL: "sync_wait"}
DELAY_CODE = np.array([KINDS.index(DELAY_KIND[t]) for t in range(7)], dtype=np.int64)
FIN, START = 0, 1

ASSUMPTIONS = [
    "event record/wait: where the profile names the event (Nsight CUDA event trace: api_calls.event_id) a "
    "*StreamWaitEvent call is paired with the latest *EventRecord of that event in its process (graph.event_pairs_by_id); "
    "otherwise (Kineto, rocpd) with the latest *EventRecord call before it on the same thread. The recorded op is the "
    "last GPU op launched from the recording thread before the record (the recorded stream is not in the model), the "
    "waiting op the first GPU op launched from the waiting thread after the wait (an edge only when their streams "
    "differ; dropped when the waiting op started before the recorded op ended)",
    "host synchronisation: an event sync whose event the profile names waits for that event's recorded op "
    "(graph.sync_calls_by_event_id); any other *Synchronize call for the latest-ending GPU op of its process that was "
    "launched before the call and ended before it returned (the stream waited on is not in the model); a blocking "
    "*Memcpy waits for its own copy",
    "host gaps between API calls are CPU work on the step's thread (the thread with most API calls in a caller "
    "window); on other threads only where a CPU op or annotation covers them (else idle_gap). The step's thread runs "
    "to the step's end; a caller window ends with its last event",
    "communication kernels are nodes of their own stream; collectives are not linked across ranks (single-profile graph)",
]
JOB_ASSUMPTIONS = [
    *ASSUMPTIONS[:-1],
    "job (several ranks): each rank's graph is built as for one profile over the same step (the index chosen on the "
    "first rank, or the caller's start_ns/end_ns on every rank), on one timeline: the ranks' clocks are assumed aligned",
    "a collective instance = the k-th communication kernel of one name on each rank (in the window; instances missing on "
    "a rank with communication kernels are left unlinked); on each rank its kernel is split into the arrival (its start, "
    "0 ns) and the transfer part [the instance's last arrival, its end], and every rank's arrival is an edge to every "
    "rank's transfer part, so the path runs through the last-arriving rank and the others' waits [arrival, last arrival] "
    "are off the path (on it only as sync_wait where a wait binds). A transfer part that would end before the last "
    "arrival (clock skew) is clamped to 0 ns (collectives.clamped_transfers)",
]


class Share(BaseModel):
    kind: str = Field(description="cpu, launch_overhead, gpu_compute, copy, communication, graph_whole (a CUDA graph "
                      "replay traced whole: contents unknown, possibly communication; re-capture with nsys "
                      "--cuda-graph-trace=node), sync_wait or idle_gap")
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
    edges: dict[str, int] = Field(description="edges by type: host_order, launch, stream_order, event_wait, sync_wait, window_start "
                                              "(a job adds collective: arrival -> other ranks' transfer parts)")
    event_pairs_inferred: int = Field(description="record -> wait pairs turned into cross-stream edges")
    event_pairs_by_id: int = Field(description="of event_pairs_inferred, pairs matched by the event id the profile records "
                                               "(Nsight); the rest by call order (see assumptions)")
    event_pairs_dropped: int = Field(description="inferred pairs contradicted by the timing (waiting op started before the recorded op ended)")
    sync_calls: int = Field(description="waiting calls (synchronize, blocking copies) in the window")
    sync_calls_by_event_id: int = Field(description="of sync_calls_awaiting, event syncs whose awaited op is the recorded op "
                                                    "of the event the profile names (Nsight)")
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


class JobRank(BaseModel):
    rank: int
    trace: str = Field(description="profile file name")
    pid: int | None
    window_start_ns: int = Field(description="the rank's window start (its step's start), ns")
    nodes: int = Field(description="graph nodes of this rank")


class CollectiveLinks(BaseModel):
    ranks_with_comm: int = Field(description="ranks with communication kernels in their window")
    instances: int = Field(description="collective instances linked across those ranks")
    unlinked: int = Field(description="instances missing on some rank (left unlinked: each rank's kernel stays whole)")
    edges: int = Field(description="arrival -> transfer edges added between ranks")
    wait_ns: int = Field(description="measured collective wait summed over ranks and instances: last arrival - the "
                                     "rank's own arrival, ns (off the path unless split says sync_wait)")
    clamped_transfers: int = Field(description="transfer parts clamped to 0 ns because the last arrival came after the "
                                               "rank's own kernel end (clock skew between ranks)")


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
    ranks: list[JobRank] | None = Field(None, description="job only (trace names a folder or glob of per-rank profiles): "
                                                         "the ranks, each with its own window; lanes are prefixed 'rank N'")
    collectives: CollectiveLinks | None = Field(None, description="job only: how collectives were linked across ranks")
    truncated: bool = Field(description="true when the window was cut at node_cap nodes, or segments beyond `limit` were left out")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def _has(series: pd.Series, rx: str) -> pd.Series:
    """Regex search over a text column, run once per distinct name (a few hundred API names for millions of calls)."""
    text = series.astype(str)
    names = pd.Series(text.unique())
    return text.isin(names[names.str.contains(re.sub(r"\((?!\?)", "(?:", rx), regex=True)])


def critical_path(
    trace: Trace | list[Trace],
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
    as one scenario; a list of such lists evaluates several scenarios. A list of profiles is a job (one per rank, or
    one holding several ranks): the ranks' graphs are joined at their collectives (see JOB_ASSUMPTIONS)."""
    limit = max(1, min(int(limit), 200))
    scenarios = _parse_what_if(what_if)
    job: dict[str, Any] = {}
    if isinstance(trace, list):
        g, ws, choice, note, source, job = _job_graph(trace, step, marker, pid, start_ns, end_ns)
        traces = trace
    else:
        require(trace, "critical_path")
        ws, we, main_tid, pid, choice, note, source = _window(trace, step, marker, pid, start_ns, end_ns)
        g = _Graph(trace, ws, we, pid, main_tid)
        traces = [trace]
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
            path_moved=not np.array_equal(np.sort(p2.nodes), np.sort(path.nodes)), lanes_before=g.path_lanes(base, path), lanes_after=g.path_lanes(ev, p2),
            end_event=g.end_event(ev, p2), split=_shares(s2, n2), top_contributors=g.contributors(ev, p2, n2, limit=8)))
    segments, n_segments = g.segments(base, path, limit)
    truncated = g.truncated or n_segments > limit
    tables = ("api_calls", "kernels", "memops", "cpu_ops", "markers")
    return CriticalPathResult(
        data_issues=[f"{t.path.name}: {x}" if job else x for t in traces for x in data_issue_notes(t, tables)],
        trace=", ".join(str(t.path) for t in traces), window=Window(start_ns=ws, end_ns=win_end, span_ns=win_end - ws, source=source),
        iteration=choice, window_note=note + (f"; cut at {MAX_NODES} graph nodes: the window ends at {g.we} ns" if g.truncated else ""),
        path_ns=path_ns, window_span_ns=win_end - ws, end_event=g.end_event(base, path),
        split=_shares(split, path_ns), top_contributors=g.contributors(base, path, path_ns, limit=limit),
        segments=segments, lanes=g.lanes(base, path)[:limit], what_if=outcomes, graph=g.stats(),
        assumptions=JOB_ASSUMPTIONS if job else ASSUMPTIONS, ranks=job.get("ranks"), collectives=job.get("collectives"),
        truncated=truncated,
        hint=(f"{n_segments - limit} more path segments than limit={limit}; raise limit (max 200)" if n_segments > limit
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


def _job_graph(traces: list[Trace], step, marker, pid, start_ns, end_ns):
    """One graph over the ranks of a job: each rank's graph as for one profile (same step index, on one timeline),
    joined at the collectives. Returns (graph, window start, choice, note, source, {"ranks", "collectives"})."""
    from .rank_summary import job_ranks

    if pid is not None:
        raise ProfileError("pid selects a process of one profile; a job takes every rank: pass one rank's profile with "
                           "pid, or the job without it.")
    units = job_ranks(traces, [])
    graphs: list[_Graph] = []
    for u in units:
        require(u.trace, "critical_path")
        upid = None if (u.whole or u.pid is None) else int(u.pid)
        at = step if not graphs or choice is None else choice.index  # the first rank's step on every rank
        ws, we, tid, p, ch, nt, src = _window(u.trace, at, marker, upid, start_ns, end_ns)
        if not graphs:
            choice, note, source = ch, nt, src
        graphs.append(_Graph(u.trace, ws, we, p, tid))
    g, base, job = _join(graphs, units)
    return g, base, choice, note + f"; the same window on each of {len(units)} ranks (clocks assumed aligned)", source, job


def _join(graphs: list[_Graph], units) -> tuple[_Graph, int, dict]:
    base = min(g.base for g in graphs)
    P = np.cumsum([0] + [g.n - 1 for g in graphs])  # node i > 0 of rank graph r -> i + P[r]; every root -> 0
    LP = np.cumsum([0] + [len(g.lane_names) - 1 for g in graphs])
    n0 = int(P[-1]) + 1

    def cat(f, first):
        return np.concatenate([np.asarray([first], dtype=np.asarray(f(graphs[0])).dtype)] + [np.asarray(f(g))[1:] for g in graphs])

    S = cat(lambda g: g.S_meas + (g.base - base), 0)
    S[0] = 0
    d = cat(lambda g: g.d, 0)
    E = S + d
    kcode = cat(lambda g: g.kcode, KINDS.index("idle_gap"))
    lcode = np.concatenate([[0]] + [np.where(g.lcode[1:] == 0, 0, g.lcode[1:] + LP[r]) for r, g in enumerate(graphs)]).astype(np.int64)
    label = np.concatenate([np.asarray(["<window start>"], dtype=object)] + [g.label[1:].astype(object) for g in graphs])
    lane_names = ["window"] + [f"rank {u.rank} {x}" for u, g in zip(units, graphs) for x in g.lane_names[1:]]

    def nodes(r, i):
        return np.where(i == 0, 0, i + P[r])

    src = np.concatenate([nodes(r, g.src) for r, g in enumerate(graphs)])
    dst = np.concatenate([nodes(r, g.dst) for r, g in enumerate(graphs)])
    typ = np.concatenate([g.typ for g in graphs])
    anc = np.concatenate([g.anc for g in graphs])
    w = np.concatenate([g.w for g in graphs]).astype(np.int64)
    chain = np.concatenate([g.chain for g in graphs])
    seq = np.concatenate([g.eval.seq + P[r] for r, g in enumerate(graphs)])
    head = np.concatenate([g.eval.head for g in graphs])
    gops = pd.concat([g.gops[["name", "short_name", "is_comm"]] for g in graphs], ignore_index=True)
    gop_nodes = np.concatenate([g.gop_nodes + P[r] for r, g in enumerate(graphs)]).astype(np.int64)
    rank_of = np.concatenate([np.full(len(g.gop_nodes), u.rank) for u, g in zip(units, graphs)])

    # collective instances: the k-th communication kernel of one name on each rank with communication kernels
    comm = pd.DataFrame({"rank": rank_of, "node": gop_nodes, "name": gops["name"].astype(str).to_numpy(),
                         "S": S[gop_nodes], "E": E[gop_nodes]})[gops["is_comm"].fillna(False).to_numpy(dtype=bool)]
    comm = comm.sort_values(["rank", "S", "E", "node"], kind="stable")
    comm["k"] = comm.groupby(["rank", "name"]).cumcount()
    nr = int(comm["rank"].nunique())
    size = comm.groupby(["name", "k"])["rank"].transform("size").to_numpy()
    linked = comm[size == nr] if nr > 1 else comm.iloc[:0]
    linked = linked.assign(inst=linked.groupby(["name", "k"]).ngroup()).sort_values(["inst", "rank"], kind="stable")
    K = linked["node"].to_numpy(dtype=np.int64)
    last = linked.groupby("inst")["S"].transform("max").to_numpy(dtype=np.int64)
    X = n0 + np.arange(len(K), dtype=np.int64)  # the transfer parts: new nodes, each right after its arrival on its lane
    n = n0 + len(K)
    xend = np.maximum(E[K], last)
    clamped = int((last > E[K]).sum())
    wait = int((last - S[K]).sum())
    S, E, d = np.concatenate((S, last)), np.concatenate((E, xend)), np.concatenate((d, xend - last))
    kcode, lcode, label = np.concatenate((kcode, kcode[K])), np.concatenate((lcode, lcode[K])), np.concatenate((label, label[K]))
    E[K], d[K] = S[K], 0
    kcode[K] = KINDS.index("sync_wait")
    label[K] = label[K] + " (arrival)"
    xmap = np.full(n0, -1, dtype=np.int64)
    xmap[K] = X
    # what left the kernel now leaves its transfer part (a start -> start + lag edge keeps its target time)
    out = xmap[src] >= 0
    lag = out & (anc == START)
    w[lag] = np.maximum(0, w[lag] - (S[xmap[src[lag]]] - S[src[lag]]))
    src[out] = xmap[src[out]]
    gop_nodes = np.where(xmap[gop_nodes] >= 0, xmap[gop_nodes], gop_nodes)
    a = K.reshape(-1, nr) if len(K) else np.zeros((0, max(nr, 1)), dtype=np.int64)
    b = X.reshape(-1, nr) if len(K) else a
    other = ~np.eye(a.shape[1], dtype=bool)
    cs = np.broadcast_to(a[:, :, None], (len(a), a.shape[1], a.shape[1]))[:, other]
    cd = np.broadcast_to(b[:, None, :], (len(b), b.shape[1], b.shape[1]))[:, other]
    src = np.concatenate((src, K, cs.ravel()))
    dst = np.concatenate((dst, X, cd.ravel()))
    typ = np.concatenate((typ, np.full(len(K), STREAM, np.int8), np.full(cs.size, COLL, np.int8)))
    anc = np.concatenate((anc, np.full(len(K) + cs.size, FIN, np.int8)))
    w = np.concatenate((w, np.zeros(len(K) + cs.size, dtype=np.int64)))
    chain = np.concatenate((chain, np.ones(len(K), bool), np.zeros(cs.size, bool)))
    pos = np.empty(n0, dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    seq = np.insert(seq, pos[K] + 1, X)
    head = np.insert(head, pos[K] + 1, False)
    o = np.lexsort((src, dst))
    src, dst, typ, anc, w, chain = src[o], dst[o], typ[o], anc[o], w[o], chain[o]
    # measured ready and fixed delay on the common timeline; skew can make a delay negative: it is clamped to 0
    ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ready, dst, np.where(anc == FIN, E[src], S[src] + w))
    ready[0] = 0
    delay = np.maximum(S - ready, 0)

    m = object.__new__(_Graph)
    m.trace, m.base, m.ws, m.pid, m.job = None, base, 0, None, True
    m.truncated, m.we = any(g.truncated for g in graphs), max(g.we for g in graphs)
    m.n, m.nh, m.ng = n, sum(g.nh for g in graphs), sum(g.ng for g in graphs)
    for f in ("n_carried", "n_sync", "n_sync_by_id", "n_awaiting", "launch_dropped", "overlaps", "events_ok", "events_by_id",
              "events_dropped"):
        setattr(m, f, sum(getattr(g, f) for g in graphs))
    m.src, m.dst, m.typ, m.anc, m.w, m.chain, m.delay, m.d = src, dst, typ, anc, w, chain, delay, d
    m.kcode, m.lcode, m.label, m.lane_names, m.gops, m.gop_nodes = kcode, lcode, label, lane_names, gops, gop_nodes
    m.eval = _Lanes(n, seq, head, src, dst, typ, anc, w, chain, delay)
    ranks = [JobRank(rank=u.rank, trace=u.trace.path.name, pid=u.pid, window_start_ns=g.base, nodes=g.n - 1)
             for u, g in zip(units, graphs)]
    links = CollectiveLinks(ranks_with_comm=nr, instances=len(K) // max(nr, 1), unlinked=int(comm.groupby(["name", "k"]).ngroups) - len(K) // max(nr, 1),
                            edges=int(cs.size), wait_ns=wait, clamped_transfers=clamped)
    return m, base, {"ranks": ranks, "collectives": links}


# ---------------------------------------------------------------------------------------------- the graph


class _Eval:
    __slots__ = ("S", "F", "bind", "d")

    def __init__(self, S, F, bind, d):
        self.S, self.F, self.bind, self.d = S, F, bind, d


class _Path:
    __slots__ = ("end", "nodes", "entered")

    def __init__(self, end, nodes, entered):
        self.end, self.nodes, self.entered = end, nodes, entered


class _Lanes:
    """Longest-path evaluation of a DAG made of lanes (chains: a host thread, a GPU stream) plus cross-lane edges,
    vectorised. Node 0 is the root (value 0); `seq` lists every other node once, lane by lane in chain order
    (`head` marks each lane's first node), and every node but a lane head has exactly one chain edge, from the node
    before it in `seq`. Model: S[i] = max over incoming edges e of (S[src] + k_e) + delay[i], F = S + d, with
    k_e = d[src] (an end -> start edge, FIN) or min(w_e, d[src]) (a start -> start + lag edge, START).

    Why it is exact: along a lane with chain weights c_t = k_t + delay_t and Q_t = c_head+1 + ... + c_t (Q_head =
    delay_head), S_t = max(S_t-1 + k_t, X_t) + delay_t (X_t = max over cross edges) unrolls to
    S_t = Q_t + max_{u <= t}(X_u + delay_u - Q_u), a running maximum. The schedule (built once, independent of d) cuts
    every lane into runs whose cross predecessors all lie in earlier runs; one round evaluates all runs that became
    ready together (Kahn's algorithm over runs), so the Python loop is over rounds (about the number of lane
    switches on the deepest dependency chain: syncs and event hops), never over nodes. tests/analyses/test_critical_path.py
    checks it against a plain node-by-node longest path on random DAGs."""

    NEG = -(1 << 62)

    def __init__(self, n: int, seq: np.ndarray, head: np.ndarray, src: np.ndarray, dst: np.ndarray, typ: np.ndarray,
                 anc: np.ndarray, w: np.ndarray, chain: np.ndarray, delay: np.ndarray) -> None:
        self.n, self.seq, self.src, self.dst, self.typ, self.anc, self.w, self.delay = n, seq, src, dst, typ, anc, w, delay
        if len(dst) > 1 and (np.diff(dst) < 0).any():
            raise AssertionError("edges must be sorted by destination")
        # the chain edge into each seq position (-1 at lane heads)
        ce = np.flatnonzero(chain)
        pos = np.full(n, -1, dtype=np.int64)
        pos[seq] = np.arange(len(seq))
        cin = np.full(len(seq), -1, dtype=np.int64)
        cin[pos[dst[ce]]] = ce
        if not ((cin >= 0) == ~head).all() or not (src[ce] == seq[pos[dst[ce]] - 1]).all():
            raise AssertionError("chain edges must join consecutive nodes of a lane")
        self.cin, self.head = cin, head
        self.hstart = np.flatnonzero(head)
        self.hlen = np.diff(np.append(self.hstart, len(seq)))
        self._schedule(pos, np.flatnonzero(~chain))

    def _schedule(self, pos: np.ndarray, xe: np.ndarray) -> None:
        n, seq, head = self.n, self.seq, self.head
        xs, xd = self.src[xe], self.dst[xe]
        lane_lo = self.hstart
        lane_hi = lane_lo + self.hlen
        # cross edges between seq positions (the root's are satisfied from the start), by source position, so the
        # out-edges of a run [lo, hi) are one slice
        nonroot = xs != 0
        ps, pd_ = pos[xs[nonroot]], pos[xd[nonroot]]
        o = np.argsort(ps, kind="stable")
        odst = pd_[o]
        optr = np.searchsorted(ps[o], np.arange(len(seq) + 1))
        pend = np.bincount(pd_, minlength=len(seq))  # cross predecessors not yet evaluated, per position
        blocked = np.flatnonzero(pend > 0)  # positions that wait for a cross predecessor (sorted)
        nb = len(blocked)
        ptr, jb, jend = lane_lo.copy(), np.searchsorted(blocked, lane_lo), np.searchsorted(blocked, lane_hi)
        runs_lo, runs_len, rb = [], [], [0]
        while True:
            act = np.flatnonzero(ptr < lane_hi)
            if not len(act):
                break
            # per active lane, the first still-blocked position: a galloping scan over its blocked positions
            stop, nj = lane_hi[act], jend[act]
            if nb:
                stop, nj = stop.copy(), nj.copy()
                cur, lim, todo, width = jb[act], jend[act], np.arange(len(act)), 4
                while len(todo):
                    c, lm = cur[todo], lim[todo]
                    idx = c[:, None] + np.arange(width)
                    blk = (idx < lm[:, None]) & (pend[blocked[np.minimum(idx, nb - 1)]] > 0)
                    anyb = blk.any(axis=1)
                    if anyb.any():
                        j = c[anyb] + blk[anyb].argmax(axis=1)
                        nj[todo[anyb]], stop[todo[anyb]] = j, blocked[j]
                    more = ~anyb & (c + width < lm)
                    if not more.any():
                        break
                    cur[todo[more]] = c[more] + width
                    todo, width = todo[more], width * 2
            lo = ptr[act]
            ln = stop - lo
            run = ln > 0
            if not run.all():
                if not run.any():
                    raise ProfileError("the dependency graph has a cycle (timestamps contradict each other); pass a "
                                       "narrower window.")
                lo, ln = lo[run], ln[run]
            runs_lo.append(lo), runs_len.append(ln), rb.append(rb[-1] + int(ln.sum()))
            if len(lo) == 1:
                done = odst[optr[lo[0]]:optr[lo[0] + ln[0]]]
            else:
                cnt = optr[lo + ln] - optr[lo]
                done = odst[np.repeat(optr[lo] - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))]
            if len(done):
                np.subtract.at(pend, done, 1)
            ptr[act], jb[act] = stop, nj
        # The plan. sched: seq positions in evaluation order (round by round, run by run); per round the bounds of its
        # slices in the flat arrays below, each index local to its round, so the loop does no index arithmetic.
        z = np.zeros(0, dtype=np.int64)
        lo = np.concatenate(runs_lo) if runs_lo else z
        ln = np.concatenate(runs_len) if runs_len else z
        starts = np.concatenate(([0], np.cumsum(ln)[:-1])) if len(ln) else z
        rb = np.asarray(rb, dtype=np.int64)
        hb = np.concatenate(([0], np.cumsum([len(x) for x in runs_lo]))).astype(np.int64)
        self.sched = np.repeat(lo - starts, ln) + np.arange(int(ln.sum()))
        self.snodes = seq[self.sched]
        run_round = np.repeat(np.arange(len(rb) - 1), np.diff(hb))
        sid = np.repeat(np.arange(len(ln)), ln)  # run of each sched element
        self.hloc = starts - rb[run_round]  # run heads, local
        self.sidl = sid - hb[run_round][sid]  # run of each element, local
        # runs that continue a lane: carry the running maximum of the node before them
        carry = ~head[lo] if len(lo) else np.zeros(0, dtype=bool)
        self.cloc, self.cprev = self.hloc[carry], lo[carry] - 1
        cb = np.searchsorted(np.flatnonzero(carry), hb)
        # cross edges by the evaluation rank of their destination, grouped per destination
        rank = np.empty(n, dtype=np.int64)
        rank[self.snodes] = np.arange(len(self.snodes))
        xr = rank[xd]
        o = np.argsort(xr, kind="stable")
        self.xe, xr = xe[o], xr[o]
        self.srcx = self.src[self.xe]
        xb = np.searchsorted(xr, rb)
        first = np.flatnonzero(np.diff(xr, prepend=-1) != 0) if len(xr) else z
        grank = xr[first]
        gb = np.searchsorted(grank, rb)
        g_round = np.repeat(np.arange(len(rb) - 1), np.diff(gb))
        self.gloc, self.gsl = grank - rb[g_round], first - xb[g_round]
        # nodes without a cross edge take their run's running maximum
        nocross = np.ones(len(self.snodes), dtype=bool)
        nocross[grank] = False
        nc = np.flatnonzero(nocross)
        nb_ = np.searchsorted(nc, rb)
        n_round = np.repeat(np.arange(len(rb) - 1), np.diff(nb_))
        self.nloc, self.nsid = nc - rb[n_round], self.sidl[nc]
        self.plan = list(zip(*(x.tolist() for x in (rb[:-1], rb[1:], xb[:-1], xb[1:], gb[:-1], gb[1:], hb[:-1], hb[1:],
                                                        cb[:-1], cb[1:], nb_[:-1], nb_[1:]))))
        self.rounds = len(self.plan)

    def evaluate(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(S, F, bind): bind[i] = the edge that sets S[i] (the latest; on equal times the higher edge type, then the
        lower edge index), -1 for the root."""
        src, NEG = self.src, self.NEG
        k = np.where(self.anc == FIN, d[src], np.minimum(self.w, d[src]))
        # Q: per lane running sum of chain weight + delay, in seq order
        c = self.delay[self.seq] + np.where(self.cin >= 0, k[np.maximum(self.cin, 0)], 0)
        cs = np.cumsum(c)
        Q = cs - np.repeat(cs[self.hstart] - c[self.hstart], self.hlen)
        Qs = Q[self.sched]
        dq = self.delay[self.snodes] - Qs
        cnode, cq = self.seq[self.cprev], Q[self.cprev]
        kx, srcx, snodes = k[self.xe], self.srcx, self.snodes
        gloc, gsl, hloc, cloc, nloc, nsid = self.gloc, self.gsl, self.hloc, self.cloc, self.nloc, self.nsid
        S = np.zeros(self.n, dtype=np.int64)
        for a, b, ea, eb, g0, g1, h0, h1, c0, c1, n0, n1 in self.plan:
            Y = np.full(b - a, NEG, dtype=np.int64)
            if eb > ea:
                Y[gloc[g0:g1]] = np.maximum.reduceat(S[srcx[ea:eb]] + kx[ea:eb], gsl[g0:g1])
            Y += dq[a:b]
            if c1 > c0:
                cl = cloc[c0:c1]
                Y[cl] = np.maximum(Y[cl], S[cnode[c0:c1]] - cq[c0:c1])
            if n1 > n0:
                Y[nloc[n0:n1]] = Y[hloc[h0:h1]][nsid[n0:n1]]
            if h1 - h0 > 1:  # several runs: lift each run above all values of the run before it
                hl = hloc[h0:h1]
                mn, mx = np.minimum.reduceat(Y, hl), np.maximum.reduceat(Y, hl)
                off = np.concatenate(([0], np.cumsum(mx[:-1] - mn[1:] + 1)))[self.sidl[a:b]]
                S[snodes[a:b]] = np.maximum.accumulate(Y + off) - off + Qs[a:b]
            else:
                S[snodes[a:b]] = np.maximum.accumulate(Y) + Qs[a:b]
        F = S + d
        # binding edge: among edges reaching S - delay, the highest type, then the lowest index
        at = S[src] + k
        cand = np.flatnonzero(at == S[self.dst] - self.delay[self.dst])
        m = len(src)
        score = self.typ[cand].astype(np.int64) * m + (m - 1 - cand)
        grp = np.flatnonzero(np.diff(self.dst[cand], prepend=-1) != 0)
        best = np.maximum.reduceat(score, grp) if len(cand) else score
        bind = np.full(self.n, -1, dtype=np.int64)
        bind[self.dst[cand[grp]]] = m - 1 - best % m
        return S, F, bind


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
        """The window end, moved earlier when the graph could pass MAX_NODES: an API call makes at most 3 host nodes
        (gap, entry, return) and the GPU op it launches (even one starting after the window), an op 1."""
        p, pp = self._pid_sql()
        events = f"""SELECT start_ns, 3 AS w FROM api_calls WHERE start_ns >= ? AND start_ns < ?{p}
                     UNION ALL SELECT start_ns, 1 FROM kernels WHERE start_ns >= ? AND start_ns < ?{p}
                     UNION ALL SELECT start_ns, 1 FROM memops WHERE start_ns >= ? AND start_ns < ?{p}"""
        args = [self.ws, we, *pp] * 3
        if int(self.trace.scalar(f"SELECT coalesce(sum(w), 0) FROM ({events})", args)) <= MAX_NODES:
            return we
        self.truncated = True
        return int(self.trace.scalar(f"""SELECT min(start_ns) FROM (
                SELECT start_ns, sum(w) OVER (ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS nodes FROM ({events}))
            WHERE nodes > ?""", args + [MAX_NODES]))

    def _calls(self, we: int) -> pd.DataFrame:
        p, pp = self._pid_sql()
        # outermost calls per thread: a call starting before the running end of the earlier calls is nested in one
        df = self._df(f"""SELECT cid, pid, tid, start_ns - ? AS start_ns, end_ns - ? AS end_ns, name, event_id,
                                 prev_end IS NULL OR start_ns >= prev_end AS outer
                          FROM (SELECT rowid AS cid, pid, tid, start_ns, end_ns, name, event_id,
                                       max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC, rowid
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                                FROM api_calls
                                WHERE start_ns >= ? AND start_ns < ? AND pid IS NOT NULL AND tid IS NOT NULL{p})
                          ORDER BY pid, tid, start_ns, end_ns DESC, cid""", [self.base, self.base, self.ws, we, *pp])
        df["outer_cid"] = df["cid"].where(df["outer"]).ffill().fillna(-1).astype("int64")
        df["sync"] = _has(df["name"], SYNC_RE) | (
            _has(df["name"], COPY_RE) & ~df["name"].str.contains("Async", regex=False))
        return df

    def _gops(self, we: int) -> pd.DataFrame:
        p, pp = self._pid_sql("g.pid")
        comm = is_comm_sql("g.name")
        return self._df(f"""
            WITH g AS (
                SELECT 'kernel' AS op, device_id, stream_id, start_ns, end_ns, name, short_name, pid, correlation_id, whole_graph
                FROM kernels
                UNION ALL
                SELECT op, device_id, stream_id, start_ns, end_ns,
                       CASE WHEN op = 'set' THEN 'Memset' ELSE 'Memcpy ' || kind END, NULL, pid, correlation_id, false FROM memops),
            l AS (SELECT pid, correlation_id, arg_min(rowid, (start_ns, end_ns, rowid)) AS lcid, min(start_ns) AS call_start_ns,
                         arg_min(tid, (start_ns, end_ns, rowid)) AS call_tid
                  FROM api_calls WHERE correlation_id IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
                  GROUP BY pid, correlation_id)
            SELECT g.op, g.device_id, coalesce(g.stream_id, -1) AS stream_id, g.start_ns - ? AS start_ns, g.end_ns - ? AS end_ns,
                   g.name, coalesce(g.short_name, g.name) AS short_name, g.pid, l.lcid IS NOT NULL AS linked, l.lcid,
                   coalesce(l.call_start_ns - ?, g.start_ns - ?) AS call_start_ns, coalesce(l.call_tid, -1) AS call_tid,
                   g.op = 'kernel' AND NOT g.whole_graph AND {comm} AS is_comm, g.whole_graph AS is_whole
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
        parts = []
        # calls: one node, or entry + return for waiting calls
        single = outer[~outer["wait"]]
        parts.append(pd.DataFrame({"pid": single["pid"], "tid": single["tid"], "pos": 3 * single["k"] + 1,
                                   "S": single["start_ns"], "E": single["end_ns"], "name": single["name"], "role": "call",
                                   "cid": single["cid"]}))
        waits = outer[outer["wait"]]
        parts.append(pd.DataFrame({"pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 1,
                                   "S": waits["start_ns"], "E": waits["start_ns"], "name": waits["name"], "role": "entry",
                                   "cid": waits["cid"]}))
        parts.append(pd.DataFrame({"pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 2,
                                   "S": waits["start_ns"], "E": waits["end_ns"], "name": waits["name"], "role": "return",
                                   "cid": waits["cid"]}))
        # gaps: before each call (from the previous call's end, or the window start), and after the last on the step's thread
        prev_end = outer.groupby(["pid", "tid"])["end_ns"].shift(1, fill_value=self.ws).astype("int64")
        gap = outer.assign(gs=prev_end, ge=outer["start_ns"])
        gap = gap[gap["ge"] > gap["gs"]]
        parts.append(pd.DataFrame({"pid": gap["pid"], "tid": gap["tid"], "pos": 3 * gap["k"],
                                   "S": gap["gs"], "E": gap["ge"], "name": "", "role": "gap", "cid": -1}))
        if self.main is not None and self.trailing:
            mp, mt = self.main
            last = outer[(outer["pid"] == mp) & (outer["tid"] == mt)].tail(1)
            last_end = int(last["end_ns"].iloc[0]) if len(last) else self.ws
            if we > last_end:
                parts.append(pd.DataFrame({"pid": [mp], "tid": [mt], "pos": [3 * len(outer[(outer["pid"] == mp) & (outer["tid"] == mt)])],
                                           "S": [last_end], "E": [we], "name": [""], "role": ["gap"], "cid": [-1]}))
        host = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else pd.DataFrame(
            columns=["pid", "tid", "pos", "S", "E", "name", "role", "cid"])
        host["lane"], self.host_lanes = _lane_codes(host[["pid", "tid"]], "host {}/{}")
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
        kind[0], name[0] = "idle_gap", "<window start>"
        role = host["role"].to_numpy()
        hn = host["name"].to_numpy()
        launchy = _has(host["name"], LAUNCH_RE) | _has(host["name"], ASYNC_ISSUE_RE) | \
            _has(host["name"], RECORD_RE) | _has(host["name"], WAIT_EVENT_RE)
        kind[1:1 + nh] = np.where(role == "gap", host["gkind"].to_numpy(),
                                  np.where(role == "return", "sync_wait", np.where(launchy.to_numpy(), "launch_overhead", "cpu")))
        name[1:1 + nh] = hn
        op = gops["op"].to_numpy()
        comm = gops["is_comm"].fillna(False).to_numpy(dtype=bool)
        whole = gops["is_whole"].fillna(False).to_numpy(dtype=bool)
        kind[gi] = np.where(op == "kernel", np.where(whole, "graph_whole", np.where(comm, "communication", "gpu_compute")), "copy")
        name[gi] = gops["name"].to_numpy()
        # lanes: 0 the window start, then host threads, then GPU streams (each numbered in the order of its name)
        key, gpu_lanes = _lane_codes(pd.DataFrame({"pid": gops["pid"].astype("Int64"), "dev": gops["device_id"],
                                                   "stream": gops["stream_id"]}), "gpu {}/{}/{}")
        nl = len(self.host_lanes)
        self.lane_names = ["window", *self.host_lanes, *gpu_lanes]
        self.lcode = np.concatenate(([0], 1 + host["lane"].to_numpy(dtype=np.int64), 1 + nl + key))
        self.S_meas, self.E_meas, self.kind, self.name = S, E, kind, name
        self.kcode = pd.Index(KINDS).get_indexer(kind)
        self.label = np.where(pd.isna(name) | (name == ""), "<host>", name)
        self.gops = gops
        self.d = (E - S).astype(np.int64)
        self.d[1 + np.flatnonzero(role == "entry")] = 0

        src, dst, typ, anc, w, chain = [], [], [], [], [], []

        def add(s, t, ty, a=FIN, ww=None, ch=False):
            s, t = np.asarray(s, dtype=np.int64), np.asarray(t, dtype=np.int64)
            src.append(s), dst.append(t), typ.append(np.full(len(s), ty, dtype=np.int8)), anc.append(np.full(len(s), a, dtype=np.int8))
            w.append(np.zeros(len(s), dtype=np.int64) if ww is None else np.asarray(ww, dtype=np.int64))
            chain.append(np.full(len(s), ch))

        # host order (a chain per thread: host rows are sorted by lane, then position)
        hl = host["lane"].to_numpy()
        same = np.flatnonzero(hl[1:] == hl[:-1]) if nh > 1 else np.array([], dtype=np.int64)
        add(1 + same, 2 + same, HOST, ch=True)
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
        # stream order (a chain per stream)
        order = np.lexsort((gi, E[gi], S[gi], key))
        ks = key[order]
        pairs = np.flatnonzero(ks[1:] == ks[:-1]) if ng > 1 else np.array([], dtype=np.int64)
        a_, b_ = gi[order[pairs]], gi[order[pairs + 1]]
        overl = E[a_] > S[b_]
        self.overlaps = int(overl.sum())
        add(a_[~overl], b_[~overl], STREAM, ch=True)
        add(a_[overl], b_[overl], STREAM, START, S[b_[overl]] - S[a_[overl]], ch=True)
        seq = np.concatenate((np.arange(1, 1 + nh), gi[order]))
        head = np.concatenate((np.r_[True, hl[1:] != hl[:-1]] if nh else np.zeros(0, dtype=bool),
                               np.r_[True, ks[1:] != ks[:-1]] if ng else np.zeros(0, dtype=bool)))
        # sync returns: the awaited op
        records, lk = self._records(calls, gops, gi)
        a_w, r_w = self._awaited(waits, gops, gi, lc, E, ret_node, self._event_syncs(calls, records))
        self.n_awaiting = len(a_w)
        add(a_w, r_w, WAIT)
        # cross-stream events
        self.events_ok, self.events_by_id, self.events_dropped = self._events(calls, records, lk, add)
        # root for nodes without predecessors
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        has_pred = np.zeros(n, dtype=bool)
        has_pred[dst_a] = True
        orphans = np.flatnonzero(~has_pred)
        orphans = orphans[orphans != 0]
        add(np.zeros(len(orphans), dtype=np.int64), orphans, ROOT)
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        typ_a, anc_a, w_a, ch_a = np.concatenate(typ), np.concatenate(anc), np.concatenate(w), np.concatenate(chain)
        # edges sorted by destination (then source): the binding-edge tie-break prefers the lower index
        o = np.lexsort((src_a, dst_a))
        self.src, self.dst, self.typ, self.anc, self.w = src_a[o], dst_a[o], typ_a[o], anc_a[o], w_a[o]
        # measured ready and fixed delay
        anchor = np.where(self.anc == FIN, E[self.src], S[self.src] + self.w)
        ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ready, self.dst, anchor)
        ready[0] = ws
        # return nodes start when the later of entry and awaited op ends
        rn = 1 + np.flatnonzero(role == "return")
        S[rn] = np.maximum(S[rn], ready[rn])
        self.d[rn] = E[rn] - S[rn]
        delay = S - ready
        if not (delay >= 0).all():
            bad = np.flatnonzero(delay < 0)[:5]
            raise AssertionError(f"dependency edge ends after its successor starts: {[(int(i), self.name[i], int(S[i]), int(ready[i])) for i in bad]}")
        self.delay = delay
        self.chain, self.gop_nodes, self.job = ch_a[o], gi, False
        self.eval = _Lanes(n, seq, head, self.src, self.dst, self.typ, self.anc, self.w, self.chain, delay)

    def _event_syncs(self, calls: pd.DataFrame, records: pd.DataFrame) -> pd.Series:
        """Recorded op node per waiting (outermost) call that synchronises with an event named in the profile."""
        es = calls[_has(calls["name"], EVENT_SYNC_RE)]
        got = self._by_event(es[["pid", "start_ns", "event_id", "outer_cid"]], records).dropna(subset=["rec"])
        return pd.Series(got["rec"].to_numpy(dtype=np.int64), index=got["outer_cid"].to_numpy()).groupby(level=0).max()

    def _awaited(self, waits: pd.DataFrame, gops: pd.DataFrame, gi: np.ndarray, outer: pd.Series, E: np.ndarray,
                 ret_node: pd.Series, event_rec: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """(awaited op node, return node) per waiting call. An event sync whose event the profile names waits for that
        event's recorded op (when it ended before the call returned); a blocking copy (a call that launched ops itself
        and is no *Synchronize) for the latest-ending op it launched that ended before it returned; any other waiting
        call for the latest-ending op of its process launched before the call and ended before it returned (on equal
        ends the first op in graph order)."""
        none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.n_sync_by_id = 0
        if waits.empty or gops.empty:
            return none
        ev = waits["cid"].map(event_rec)
        known = ev.notna().to_numpy() & (E[np.nan_to_num(ev.to_numpy(dtype="float64"), nan=0).astype(np.int64)] <= waits["end_ns"].to_numpy())
        by_id = (ev.to_numpy(dtype="float64")[known].astype(np.int64), ret_node.loc[waits["cid"].to_numpy()[known]].to_numpy(dtype=np.int64))
        self.n_sync_by_id = int(known.sum())
        waits = waits[~known]
        ops = pd.DataFrame({"j": np.arange(len(gops)), "outer": outer.to_numpy(dtype="float64"), "end": E[gi],
                            "issued": gops["call_start_ns"].to_numpy(dtype=np.int64),
                            "pid": gops["pid"].to_numpy(dtype="float64")})
        wt = pd.DataFrame({"cid": waits["cid"].to_numpy(dtype=np.int64), "pid": waits["pid"].to_numpy(dtype="float64"),
                           "st": waits["start_ns"].to_numpy(dtype=np.int64), "en": waits["end_ns"].to_numpy(dtype=np.int64),
                           "synchronize": waits["name"].str.lower().str.endswith("synchronize").to_numpy(dtype=bool)})
        own = ops.dropna(subset=["outer"]).astype({"outer": "int64"}).merge(wt, left_on="outer", right_on="cid")
        own_mode = wt["cid"].isin(own["cid"]) & ~wt["synchronize"]
        own = own[own["cid"].isin(wt.loc[own_mode, "cid"]) & (own["end"] <= own["en"])]
        own = own.sort_values(["cid", "end", "j"], ascending=[True, False, True]).drop_duplicates("cid")
        got = [own[["j", "cid"]]]
        for p, grp in wt[~own_mode].groupby("pid"):
            o = ops[ops["pid"] == p].sort_values(["end", "j"], ascending=[True, False])
            if o.empty:
                continue
            end, issued, j = o["end"].to_numpy(), o["issued"].to_numpy(), o["j"].to_numpy()
            st, en = grp["st"].to_numpy(), grp["en"].to_numpy()
            idx = np.searchsorted(end, en, side="right") - 1
            # step back over ops launched after the call started (launched meanwhile from another thread)
            while True:
                bad = np.flatnonzero((idx >= 0) & (issued[np.maximum(idx, 0)] >= st))
                if not len(bad):
                    break
                idx[bad] -= 1
            hit = idx >= 0
            got.append(pd.DataFrame({"j": j[idx[hit]], "cid": grp["cid"].to_numpy()[hit]}))
        pairs = pd.concat(got, ignore_index=True)
        return (np.concatenate((by_id[0], gi[pairs["j"].to_numpy(dtype=np.int64)])),
                np.concatenate((by_id[1], ret_node.loc[pairs["cid"].to_numpy()].to_numpy(dtype=np.int64))))

    def _records(self, calls: pd.DataFrame, gops: pd.DataFrame, gi: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(event record calls with their recorded op, linked ops by launch time). The recorded op is the last GPU op
        launched from the recording thread before the record (the stream recorded on is not in the model)."""
        linked = gops.assign(node=gi)[gops["linked"].to_numpy(dtype=bool) & (gops["start_ns"] >= self.ws).to_numpy()]
        lk = pd.DataFrame({"pid": linked["pid"].astype("int64"), "tid": linked["call_tid"].astype("int64"),
                           "cs": linked["call_start_ns"].astype("int64"), "node": linked["node"],
                           "device_id": linked["device_id"], "stream_id": linked["stream_id"]}).sort_values("cs")
        rec = calls[_has(calls["name"], RECORD_RE)]
        r = pd.DataFrame({"pid": rec["pid"].astype("int64"), "tid": rec["tid"].astype("int64"), "rs": rec["start_ns"].astype("int64"),
                          "event_id": rec["event_id"].astype("float64")}).sort_values("rs")
        r = pd.merge_asof(r, lk.rename(columns={"node": "rec", "device_id": "rd", "stream_id": "rst"}), left_on="rs", right_on="cs",
                          by=["pid", "tid"], allow_exact_matches=False, direction="backward").drop(columns="cs")
        return r, lk

    @staticmethod
    def _by_event(calls: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
        """For calls naming an event (event_id), the latest record of that event in the process before the call."""
        c = calls.dropna(subset=["event_id"]).sort_values("start_ns")
        r = records.dropna(subset=["event_id"])
        if c.empty or r.empty:
            return c.iloc[:0].assign(rs=pd.Series(dtype="float64"), rtid=pd.Series(dtype="float64"), rec=pd.Series(dtype="float64"),
                                     rd=pd.Series(dtype="float64"), rst=pd.Series(dtype="float64"))
        c = c.astype({"pid": "int64", "start_ns": "int64", "event_id": "float64"})
        return pd.merge_asof(c, r.rename(columns={"tid": "rtid"}), left_on="start_ns", right_on="rs", by=["pid", "event_id"],
                             allow_exact_matches=False, direction="backward").dropna(subset=["rs"])

    def _events(self, calls, records, lk, add) -> tuple[int, int, int]:
        """(pairs, of them paired by event id, pairs dropped). A wait naming an event (Nsight) is paired with the latest
        record of that event in its process; any other wait with the latest record before it on its thread."""
        wai = calls[_has(calls["name"], WAIT_EVENT_RE)]
        if records.empty or wai.empty or lk.empty:
            return 0, 0, 0
        w = pd.DataFrame({"pid": wai["pid"].astype("int64"), "tid": wai["tid"].astype("int64"),
                          "start_ns": wai["start_ns"].astype("int64"), "event_id": wai["event_id"].astype("float64"),
                          "k": np.arange(len(wai))})
        by_id = self._by_event(w, records).assign(by_id=True)
        rest = w[~w["k"].isin(by_id["k"])].sort_values("start_ns")
        order = pd.merge_asof(rest, records.drop(columns="event_id").assign(rtid=records["tid"]), left_on="start_ns", right_on="rs",
                              by=["pid", "tid"], allow_exact_matches=False, direction="backward").dropna(subset=["rs"])
        w = pd.concat([by_id.drop(columns="event_id"), order.drop(columns="event_id").assign(by_id=False)], ignore_index=True)
        w = w.dropna(subset=["rec"]).sort_values("start_ns")
        if w.empty:
            return 0, 0, 0
        w = pd.merge_asof(w, lk.rename(columns={"node": "wt", "device_id": "wd", "stream_id": "wst"}),
                          left_on="start_ns", right_on="cs", by=["pid", "tid"], allow_exact_matches=False, direction="forward")
        w = w.dropna(subset=["wt"])
        w = w[(w["rd"] != w["wd"]) | (w["rst"] != w["wst"])]
        a, b = w["rec"].to_numpy(dtype=np.int64), w["wt"].to_numpy(dtype=np.int64)
        good = self.E_meas[a] <= self.S_meas[b]
        pairs = pd.DataFrame({"a": a[good], "b": b[good], "by_id": w["by_id"].to_numpy(dtype=bool)[good]})
        pairs = pairs.sort_values("by_id", ascending=False).drop_duplicates(["a", "b"])
        add(pairs["a"].to_numpy(), pairs["b"].to_numpy(), EVENT)
        return len(pairs), int(pairs["by_id"].sum()), int((~good).sum())

    # -- evaluation ---------------------------------------------------------------------------------------

    def evaluate(self, d: np.ndarray) -> _Eval:
        """Forward pass: S = max over incoming edges + fixed delay, F = S + duration (see _Lanes)."""
        S, F, bind = self.eval.evaluate(d)
        return _Eval(S, F, bind, d)

    def path(self, ev: _Eval) -> _Path:
        F = ev.F
        last = int(F.max())
        cands = np.flatnonzero(F == last)
        # the end event: of the nodes ending last, the one evaluated last (latest start, then highest id)
        end = int(cands[np.lexsort((cands, ev.S[cands]))][-1])
        # follow the binding edges back to the root by pointer doubling (log(path length) passes over the nodes)
        up = np.where(ev.bind >= 0, self.src[np.maximum(ev.bind, 0)], 0)
        nodes = np.array([end], dtype=np.int64)
        while not (nodes == 0).any():
            nodes = np.concatenate((nodes, up[nodes]))
            up = up[up]
        nodes = nodes[:int(np.argmax(nodes == 0))]
        entered = np.concatenate(([FIN], self.anc[ev.bind[nodes[:-1]]])).astype(np.int8) if len(nodes) else np.zeros(0, np.int8)
        return _Path(end, nodes, entered)

    def _contrib(self, ev: _Eval, path: _Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per path node (end first): node, duration part ns, delay ns, delay kind code."""
        nodes = path.nodes
        b = ev.bind[nodes]
        dk = DELAY_CODE[self.typ[b]]
        succ = np.concatenate(([0], b[:-1]))  # the binding edge of the next node on the path (entered at its start)
        dur = np.where(path.entered == FIN, ev.d[nodes], np.minimum(self.w[succ], ev.d[nodes]))
        return nodes, dur, self.delay[nodes], dk

    def split(self, ev: _Eval, path: _Path) -> dict[str, int]:
        nodes, dur, dl, dk = self._contrib(ev, path)
        tot = np.zeros(len(KINDS), dtype=np.int64)
        np.add.at(tot, self.kcode[nodes], dur)
        np.add.at(tot, dk, dl)
        return {k: int(v) for k, v in zip(KINDS, tot)}

    def contributors(self, ev: _Eval, path: _Path, length: int, limit: int) -> list[Contributor]:
        nodes, dur, _, _ = self._contrib(ev, path)
        keep = dur > 0
        df = pd.DataFrame({"name": self.label[nodes[keep]], "kind": np.asarray(KINDS)[self.kcode[nodes[keep]]],
                           "lane": self._lane(nodes[keep]), "ns": dur[keep]})
        g = df.groupby(["name", "kind", "lane"])["ns"].agg(["size", "sum"]).reset_index()
        g = g.sort_values(["sum", "name", "kind", "lane"], ascending=[False, True, True, True]).head(limit)
        return [Contributor(name=clip_name(r.name), kind=r.kind, lane=r.lane, count=int(r.size), ns=int(r.sum),
                            pct_of_path=pct(int(r.sum), length)) for r in g.itertuples(index=False)]

    def segments(self, ev: _Eval, path: _Path, limit: int) -> tuple[list[Segment], int]:
        """The first `limit` runs of the path on one lane, in time order, and how many runs there are."""
        nodes, dur, dl, _ = (x[::-1] for x in self._contrib(ev, path))  # time order: the path was collected backwards
        fin = path.entered[::-1] == FIN
        lo = self.base + ev.S[nodes] - dl
        hi = self.base + np.where(fin, ev.F[nodes], ev.S[nodes] + dur)
        lc = self.lcode[nodes]
        first = np.flatnonzero(np.diff(lc, prepend=-1) != 0)
        last = np.append(first[1:], len(nodes)) - 1
        run = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(nodes))))
        top = pd.Series(dur).groupby(run).idxmax().to_numpy()[:limit]  # the first longest node of each run
        out = [Segment(lane=self.lane_names[lc[f]], start_ns=int(lo[f]), end_ns=int(hi[l]), ns=int(hi[l] - lo[f]), nodes=int(l - f + 1),
                       top=clip_name(self.label[nodes[t]])) for f, l, t in zip(first[:limit], last[:limit], top)]
        return out, len(first)

    def _on_path(self, ev: _Eval, path: _Path) -> np.ndarray:
        nodes, dur, dl, _ = self._contrib(ev, path)
        on = np.zeros(len(self.lane_names), dtype=np.int64)
        np.add.at(on, self.lcode[nodes], dur + dl)
        return on

    def path_lanes(self, ev: _Eval, path: _Path) -> list[str]:
        on = self._on_path(ev, path)
        used = np.flatnonzero(np.isin(np.arange(len(on)), self.lcode[path.nodes]))
        return [self.lane_names[i] for i in sorted(used.tolist(), key=lambda i: (-on[i], self.lane_names[i]))]

    def lanes(self, ev: _Eval, path: _Path) -> list[LaneSlack]:
        end = int(ev.F[path.end])
        on = self._on_path(ev, path)
        codes = self.lcode[1:]
        size = np.bincount(codes, minlength=len(on))
        last = np.full(len(on), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, codes, ev.F[1:])
        rows = [LaneSlack(lane=self.lane_names[i], nodes=int(size[i]), on_path_ns=int(on[i]), last_end_ns=self.base + int(last[i]),
                          slack_ns=end - int(last[i])) for i in np.flatnonzero(size)]
        return sorted(rows, key=lambda x: (-x.on_path_ns, x.slack_ns, x.lane))

    def _lane(self, nodes: np.ndarray) -> np.ndarray:
        return np.asarray(self.lane_names, dtype=object)[self.lcode[nodes]]

    def end_event(self, ev: _Eval, path: _Path) -> EndEvent:
        i = path.end
        return EndEvent(lane=self.lane_names[self.lcode[i]], name=clip_name(self.label[i]), end_ns=self.base + int(ev.F[i]))

    def scaled(self, rules: list[dict], path: _Path) -> tuple[np.ndarray, list[WhatIfRule]]:
        d = self.d.copy()
        names = self.gops["name"].astype(str)
        shorts = self.gops["short_name"].astype(str)
        gi = self.gop_nodes
        info = []
        for r in rules:
            if r["name_contains"]:
                t = r["name_contains"].lower()
                hit = (names.str.lower().str.contains(t, regex=False) | shorts.str.lower().str.contains(t, regex=False)).to_numpy()
            else:
                hit = shorts.str.match(fnmatch.translate(r["name_glob"])).to_numpy(dtype=bool)
            nodes = gi[hit]
            info.append(WhatIfRule(name_contains=r["name_contains"], name_glob=r["name_glob"], speedup=r["speedup"],
                                   matched_ops=int(hit.sum()), matched_on_path=int(np.isin(nodes, path.nodes).sum()),
                                   matched_ns=int(self.d[nodes].sum())))
            d[nodes] = np.rint(d[nodes] / r["speedup"]).astype(np.int64)
        return d, info

    def stats(self) -> GraphStats:
        counts = np.bincount(self.typ, minlength=7)
        return GraphStats(
            nodes=self.n, host_nodes=self.nh, gpu_ops=self.ng, carried_in_ops=self.n_carried,
            edges={EDGE_NAMES[t]: int(counts[t]) for t in (HOST, LAUNCH, STREAM, EVENT, WAIT, ROOT, *((COLL,) if self.job else ()))},
            event_pairs_inferred=self.events_ok, event_pairs_by_id=self.events_by_id, event_pairs_dropped=self.events_dropped,
            sync_calls=self.n_sync, sync_calls_by_event_id=self.n_sync_by_id,
            sync_calls_awaiting=self.n_awaiting, launch_edges_dropped=self.launch_dropped,
            overlapping_stream_pairs=self.overlaps, node_cap=MAX_NODES)


def _lane_codes(keys: pd.DataFrame, fmt: str) -> tuple[np.ndarray, list[str]]:
    """A lane number per row and the lane names, numbered in the order of the names: names are formatted once per
    lane, never per row."""
    if keys.empty:
        return np.zeros(0, dtype=np.int64), []
    group = keys.groupby(list(keys.columns), sort=False, dropna=False).ngroup().to_numpy()
    names = [fmt.format(*row) for row in keys.drop_duplicates().itertuples(index=False)]
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.asarray(names, dtype=object), kind="stable")] = np.arange(len(names))
    return rank[group], sorted(names)


def _shares(split: dict[str, int], length: int) -> list[Share]:
    return [Share(kind=k, ns=v, pct_of_path=pct(v, length)) for k, v in split.items()]
