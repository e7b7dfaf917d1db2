"""critical_path's result: the path, its split, segments, lanes, what-if scenarios and (jobs) the ranks and collectives."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..common import Window, data_issues_field, ToolResult


class Share(BaseModel):
    kind: str = Field(description="cpu, launch_overhead, gpu_compute, copy, communication, graph_whole (a CUDA graph "
                      "replay traced whole: contents unknown, possibly communication; re-capture with nsys "
                      "--cuda-graph-trace=node), sync_wait or idle_gap")
    ns: int = Field(description="time of the critical path in this kind, ns")
    pct_of_path: float | None = Field(description="ns / critical path length, %")


class Contributor(BaseModel):
    name: str = Field(description="kernel, copy, API call or CPU op name (clipped)")
    kind: str = Field(description="kind of its time (see split)")
    lane: str = Field(description="'host pid/tid' or 'gpu pid/device/stream' (stream '?' when the profile does not say)")
    count: int = Field(description="instances on the path")
    ns: int = Field(description="their time on the path (durations; delays are in split only), ns")
    pct_of_path: float | None = Field(description="ns / critical path length, %")


class Segment(BaseModel):
    lane: str = Field(description="'host pid/tid' or 'gpu pid/device/stream' (stream '?' when the profile does not say)")
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
    nodes: int = Field(description="graph nodes (host intervals, call entries/returns, GPU ops) plus the window start (a job "
                                   "adds a transfer part per linked kernel and a barrier per collective instance)")
    host_nodes: int
    gpu_ops: int = Field(description="kernels, copies and sets in the graph (launched in the window, running in it, or "
                                     "carried in from before it)")
    carried_in_ops: int = Field(description="GPU ops that started before the window and ended inside it (counted from the window start)")
    edges: dict[str, int] = Field(description="edges by type: host_order, launch, stream_order, event_wait, sync_wait, window_start "
                                              "(a job adds collective: arrival -> barrier -> transfer parts)")
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
    hint: str | None = Field(None, description="set when name_contains holds glob characters (matched literally)")


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
    ranks_with_comm: int = Field(description="ranks with collective kernels in their window (point-to-point ones not counted)")
    collective_match: str = Field(description="how kernels were matched into instances, the rule straggler_summary uses "
                                              "(collectives.py): 'communicator' (every collective kernel's communicator is "
                                              "recorded: Nsight NCCL payload, Kineto 'Process Group Name'; the k-th kernel of a "
                                              "(communicator, kernel name) on each rank holding that communicator), 'name_order' "
                                              "(some kernel records none: the k-th kernel of a name on each rank with collective "
                                              "kernels, which joins kernels of different communicators running under one name) "
                                              "or 'none' (no collective kernel). No mix of the two: a kernel without its "
                                              "communicator would shift the order of that communicator's later kernels; "
                                              "'communicator+name_order' is no longer reported")
    comm_kernels: int = Field(description="collective kernels in the ranks' windows (every communication kernel but the "
                                          "point-to-point ones, p2p_kernels)")
    p2p_kernels: int = Field(description="point-to-point kernels (Send, Recv, SendRecv: the recorded operation, "
                                         "kernels.collective, else the kernel name) in the ranks' windows: never "
                                         "joined across ranks (the peer rank is not in the model); each stays on its stream "
                                         "as communication with its measured duration")
    comm_kernels_with_communicator: int = Field(description="of comm_kernels, those whose communicator the profile records")
    instances: int = Field(description="collective instances linked across ranks (one barrier node each)")
    instances_by_communicator: int = Field(description="of instances, matched by (communicator, kernel name, sequence number "
                                                       "on the rank): all of them under collective_match 'communicator', else 0")
    instances_by_name_order: int = Field(description="of instances, matched by (kernel name, sequence number on the rank): "
                                                     "all of them under collective_match 'name_order', else 0")
    unlinked: int = Field(description="instances missing on some rank of their communicator (or, by name order, on some rank "
                                      "with collective kernels), or held by one rank of the job: each rank's kernel stays whole")
    edges: int = Field(description="collective edges added: each linked kernel's arrival -> its instance's barrier and the "
                                   "barrier -> its transfer part (2 per rank and instance)")
    wait_ns: int = Field(description="measured collective wait summed over ranks and instances: last arrival - the "
                                     "rank's own arrival, ns (off the path unless split says sync_wait)")
    clamped_transfers: int = Field(description="transfer parts clamped to 0 ns because the last arrival came after the "
                                               "rank's own kernel end (clock skew between ranks, or kernels matched to the "
                                               "wrong instance by name order)")


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

