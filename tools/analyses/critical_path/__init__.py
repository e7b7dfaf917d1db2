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
    assumed aligned), joined at the collectives. Instances follow the one rule straggler_summary uses too
    (collectives.py): where every collective kernel records its communicator (kernels.communicator: Nsight NCCL
    payloads, Kineto 'Process Group Name'), the k-th kernel of one (communicator, kernel name) on each rank holding that
    communicator; where some kernel records none, the k-th kernel of one name on each rank with collective kernels,
    for every kernel (a kernel without its communicator would shift the order of its communicator's later kernels),
    and the result says which: collectives.collective_match. Point-to-point kernels (Send, Recv, SendRecv:
    comm_patterns.POINT_TO_POINT, from the recorded operation kernels.collective, else the kernel name) are never
    joined: a pipeline stage sends to one neighbour and receives from another, and the peer is not recorded, so
    they stay on their stream with their measured duration (collectives.p2p_kernels). Each rank's kernel is split into its arrival (start, 0 ns) and its transfer part
    [the instance's last arrival, its end]; every arrival is an edge to the instance's barrier node (0 ns), the barrier
    an edge to every transfer part: 2 edges per rank, not one per pair of ranks. The path therefore runs through the
    last-arriving rank's chain; what-if re-evaluates the joined graph, so a faster kernel on the straggler moves every
    rank's transfer and everything after it.
  * Evaluation is numpy (lanes.Lanes): each thread and stream is a chain whose start times are a running maximum, and
    a schedule built once per graph evaluates chain runs in rounds, one per lane switch of the deepest dependency
    chain (host sync -> GPU -> host ...), so cost is O(nodes + edges) plus ~10-20 us per round.

The path's time is split by kind (each ns of the path in exactly one kind; denominator = path length):
cpu (host gaps and non-launch API calls), launch_overhead (launch/async-copy API time and the delay from the
launch call's start to its GPU op's start), gpu_compute (kernels), copy (copies and sets), communication
(NCCL/RCCL kernels), graph_whole (CUDA graph replays traced whole, Nsight --cuda-graph-trace=graph: the kernels inside,
computation or communication, are not in the export; re-capture with --cuda-graph-trace=node to split them), sync_wait (sync returns after the awaited op ended; event waits), idle_gap (GPU gaps between
ops on a stream, host time outside any recorded op on a thread other than the step's, the start before carried-in
work).

The package, one part a module: window.py (which step), build.py (one rank's graph from its profile), job.py (ranks
joined at their collectives), lanes.py (the vectorised longest-path evaluation), graph.py (path, split, segments, lanes
and what-if scaling of a built graph), result.py (the result models); this module runs the tool.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...model.errors import ProfileError
from ...model.trace import Trace
from ..common import Window, data_issue_notes, pct
from ..requirements import require
from .build import rank_graphs
from .graph import KINDS, MAX_NODES
from .job import job_graph
from .result import CriticalPathResult, Share, WhatIf
from .window import choose_windows

__all__ = ["KINDS", "CriticalPathResult", "critical_path"]

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
    "a collective instance (the rule straggler_summary uses too) = the k-th kernel of one (communicator, kernel name) on "
    "each rank holding that communicator in the window, where every collective kernel records its communicator "
    "(kernels.communicator; Nsight: the NCCL payload's communicator id of the call that launched the kernel; Kineto: the "
    "kernel's 'Process Group Name'); where some kernel records none, the k-th kernel of one name on each rank with "
    "collective kernels, for every kernel, since a kernel left out of its communicator's count would shift the order of "
    "the later ones (collectives.collective_match says which; by name order, collectives of different communicators "
    "under one kernel name are joined wrongly). Instances missing on a rank, or held by one rank of the "
    "job, are left unlinked. On each rank its kernel is split into the arrival (its start, 0 ns) and the transfer part "
    "[the instance's last arrival, its end]; every arrival is an edge to the instance's barrier (0 ns, at the last "
    "arrival) and the barrier to every transfer part, so the path runs through the last-arriving rank and the others' waits [arrival, last arrival] "
    "are off the path (on it only as sync_wait where a wait binds). A transfer part that would end before the last "
    "arrival (clock skew) is clamped to 0 ns (collectives.clamped_transfers)",
    "point-to-point kernels (Send, Recv, SendRecv: the operation the profile records, kernels.collective: Nsight NCCL "
    "call, Kineto 'Collective name'; else the kernel name, so a ROCm ncclDevKernel_Generic without a recorded operation "
    "counts as a collective) are never joined across ranks: the rank they send to or receive from is not in the profile, so "
    "each stays on its rank's stream as communication with its measured duration, a wait for its peer included "
    "(collectives.p2p_kernels)",
]


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
        g, ws, choice, note, source, job = job_graph(trace, step, marker, pid, start_ns, end_ns)
        traces = trace
    else:
        require(trace, "critical_path")
        ((ws, we, main_tid, pid),), choice, note, source = choose_windows([trace], [(0, pid)], step, marker, start_ns, end_ns)
        g, = rank_graphs([trace], [(0, pid, ws, we, main_tid)])
        traces = [trace]
    if not len(g.src):  # only the window start: no host call or GPU op in the window
        raise ProfileError(f"no API call or GPU operation starts or runs in the window [{ws}, {g.we}) ns, so there is no path "
                           "to follow; widen the window or pick a step (trace_info gives the capture span).")
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



def _shares(split: dict[str, int], length: int) -> list[Share]:
    return [Share(kind=k, ns=v, pct_of_path=pct(v, length)) for k, v in split.items()]
