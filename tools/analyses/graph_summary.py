"""graph_summary: what each CUDA/HIP graph (and torch.compile region captured in one) does inside, per device.

Graph kernel: a kernel that carries a graph id (Nsight `graphId`, captured with `--cuda-graph-trace=node`; Kineto
`graph id`; rocpd `graph_exec_id`, schema >= 3.0.2) or whose launching API call (the earliest call of the same
process with the kernel's correlation id, as op_tree.py links them) is a graph launch (`cudaGraphLaunch`,
`cuGraphLaunch`, `hipGraphLaunch`: name matching /graph.?launch/i).

Replay: the graph kernels of one device that share (process, correlation id), i.e. the kernels one graph-launch
call ran (a graph launch owns all N kernels carrying its correlation id). Graph kernels without a correlation id
cannot be assigned to a replay; they are counted (`graph_kernels_without_replay`), never dropped silently.

Graph: replays of one device and process with the same graph id (the smallest graph id among the replay's kernels,
so child-graph nodes fold into the launched graph); where no kernel carries a graph id (older Kineto, rocpd < 3.0.2),
replays that ran the same multiset of kernel base names are taken as one graph (`identified_by='kernel_names'`).

Per replay (all integer ns):
  wall  = last kernel end - first kernel start;
  work  = Σ kernel durations (concurrent kernels counted twice, as summed kernel time always is);
  busy  = |union of the replay's kernel intervals|;
  gaps  = wall - busy: idle GPU time inside the replay (launch bubbles, dependencies, host-side nodes).
Per graph: sums over replays plus min/median/max/sample std-dev of replay wall time, kernels per replay, and the
top kernels inside the graph by summed time. Shares name their denominators in the field descriptions.

torch.compile / Triton: kernels whose base name starts with `triton_` are listed with the Inductor kind from the
name prefix (poi pointwise, red reduction, per persistent-reduction, tem template, for foreach) and the fused ops
the name spells after `fused_`; `launching_op` is the PyTorch CPU op whose External id the launching call carries
(Kineto only).

Graphs traced whole: Nsight's default `--cuda-graph-trace=graph` records each graph launch as one
CUPTI_ACTIVITY_KIND_GRAPH_TRACE row (first node start to last node end) and no kernel inside it; the model holds
it as one kernels row with whole_graph = true. Such a replay has its launch, wall time, variance across replays and
launch-to-start delay, but no kernels, work, busy time or gaps: those figures are null and the result says to
re-capture with `--cuda-graph-trace=node`.

No graph replay in the profile is an explicit refusal naming why (a format or schema without graph ids, no API calls
to link launches), never a table of zeros.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.names import GRAPH_LAUNCH_RX
from ..model.trace import VALUE, Trace
from .common import Window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .requirements import gap_text, present, require


# Kernels of graph replays, by kernels.rowid: the one definition top_kernels and ops_summary use too. A (process,
# correlation id) is a graph launch when its first call is; only pairs with some graph-launch call can be, so the
# window ranks just their calls (over every call it took 0.57 s of top_kernels' 0.99 s CPU at 2 M kernels).
GRAPH_KERNELS_CTE = f"""
    graph_names AS (SELECT name FROM (SELECT DISTINCT name FROM api_calls) WHERE regexp_matches(name, '{GRAPH_LAUNCH_RX}', 'i')),
    graph_pairs AS (
        SELECT DISTINCT pid, correlation_id FROM api_calls SEMI JOIN graph_names USING (name)
        WHERE correlation_id IS NOT NULL AND pid IS NOT NULL),
    graph_calls AS (
        SELECT pid, correlation_id FROM (
            SELECT a.pid, a.correlation_id, a.name,
                   row_number() OVER (PARTITION BY a.pid, a.correlation_id ORDER BY a.start_ns, a.end_ns, a.name) AS k
            FROM api_calls a SEMI JOIN graph_pairs g ON g.pid = a.pid AND g.correlation_id = a.correlation_id)
        WHERE k = 1 AND regexp_matches(name, '{GRAPH_LAUNCH_RX}', 'i')),
    graph_kids AS (
        SELECT rowid AS kid FROM kernels WHERE graph_id IS NOT NULL
        UNION SELECT k.rowid FROM kernels k JOIN graph_calls c ON c.pid = k.pid AND c.correlation_id = k.correlation_id)"""

DEFINITIONS = {
    "graph_kernel": "a kernel with a graph id (Nsight graphId, Kineto 'graph id', rocpd graph_exec_id) or launched by a "
                    "graph-launch call (cudaGraphLaunch / cuGraphLaunch / hipGraphLaunch) matched by process + correlation id",
    "replay": "the graph kernels of one device sharing (process, correlation id): the kernels one graph-launch call ran",
    "graph": "replays of one device and process with the same graph id (smallest among the replay's kernels); without "
             "graph ids, replays running the same multiset of kernel base names (identified_by='kernel_names')",
    "replay_wall_ns": "last kernel end - first kernel start of a replay (a whole-graph trace row: its end - start), ns",
    "traced_whole": "Nsight --cuda-graph-trace=graph: each replay is one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row without the "
                    "kernels inside; kernel counts, work, busy and gap figures are null (re-capture with "
                    "--cuda-graph-trace=node)",
    "replay_work_ns": "summed kernel durations of a replay (concurrent kernels counted twice), ns",
    "replay_busy_ns": "union of a replay's kernel intervals, ns",
    "replay_gap_ns": "replay_wall_ns - replay_busy_ns: GPU idle time inside the replay, ns",
    "launch_to_first_kernel_ns": "first kernel start - graph-launch call start, per replay (null without the call), ns",
    "triton_kind": "Inductor kernel kind from the name prefix: triton_poi pointwise, triton_red reduction, triton_per "
                   "persistent-reduction, triton_tem template, triton_for foreach, else unknown",
    "fused_ops": "the name after 'fused_' (Inductor descriptive_names='original_aten'), split into aten op names: "
                 "best effort (known multi-word names such as _to_copy or native_layer_norm kept whole); fused_text is "
                 "the authoritative text",
}


class GraphKernel(BaseModel):
    name: str = Field(description="kernel base name (clipped)")
    count: int = Field(description="executions inside this graph's replays")
    per_replay: float = Field(description="count / replays")
    total_ns: int = Field(description="summed duration, ns")
    avg_ns: float = Field(description="mean duration, ns")
    min_ns: int
    max_ns: int
    pct_of_graph_work: float | None = Field(description="total_ns / the graph's work_ns (summed kernel time of its replays), %")
    triton_kind: str | None = Field(None, description="Inductor kind for triton_* kernels (see definitions), else null")


class GraphRow(BaseModel):
    device_id: int
    pid: int | None = Field(description="process that launched the replays")
    graph: str = Field(description="'graph <id>' or 'kernels <hash>' (replays identified by their kernel-name multiset)")
    graph_id: int | None = Field(description="graph id from the profile; null when identified by kernel names")
    identified_by: str = Field(description="'graph_id' or 'kernel_names'")
    launch_api: str | None = Field(description="the graph-launch call's name (most frequent), null when not in the profile")
    traced_whole: bool = Field(description="true when the profile holds each replay only as one whole-graph execution "
                               "(Nsight --cuda-graph-trace=graph): the kernel, work, busy and gap figures are then null")
    replays: int = Field(description="graph launches (replays) with kernels on this device")
    kernels: int | None = Field(description="kernel executions over all replays; null when traced_whole")
    kernels_per_replay_min: int | None
    kernels_per_replay_median: float | None
    kernels_per_replay_max: int | None
    wall_ns: int = Field(description="Σ replay wall time (first kernel start to last kernel end per replay), ns")
    work_ns: int | None = Field(description="Σ kernel durations over the replays, ns; null when traced_whole")
    busy_ns: int | None = Field(description="Σ per replay of the union of its kernel intervals, ns; null when traced_whole")
    gap_ns: int | None = Field(description="wall_ns - busy_ns: idle time inside replays, ns; null when traced_whole")
    gap_pct_of_wall: float | None = Field(description="gap_ns / wall_ns, %")
    work_pct_of_wall: float | None = Field(description="work_ns / wall_ns, %; > 100 when kernels of a replay overlap")
    pct_of_device_kernel_time: float | None = Field(description="work_ns (wall_ns when traced_whole) / summed kernel time "
                                                    "of the device (all kernels rows, whole-graph executions included), %")
    replay_wall_min_ns: int
    replay_wall_median_ns: float
    replay_wall_max_ns: int
    replay_wall_std_ns: float | None = Field(description="sample std-dev (n-1) of replay wall time, ns; null for one replay")
    replay_wall_cv_pct: float | None = Field(description="replay_wall_std_ns / mean replay wall time, %")
    replay_gap_min_ns: int | None
    replay_gap_median_ns: float | None
    replay_gap_max_ns: int | None
    launch_to_first_kernel_median_ns: float | None = Field(description="median over replays of first kernel start - "
                                                                       "launch call start, ns; null without the calls")
    first_replay_start_ns: int = Field(description="first kernel start of the first replay, ns on the profile timeline")
    last_replay_end_ns: int = Field(description="last kernel end of the last replay, ns")
    top_kernels: list[GraphKernel] = Field(description="kernels inside the graph by summed time (kernel_limit)")
    kernels_truncated: bool = Field(description="true when the graph ran more distinct kernels than kernel_limit")
    remainder_kernel_names: int = Field(description="distinct kernel names beyond kernel_limit")
    remainder_kernel_ns: int = Field(description="their summed duration, ns")


class DeviceGraphTotals(BaseModel):
    device_id: int
    device_name: str | None
    kernels: int = Field(description="kernels rows on the device in the selection (graph or not; whole-graph executions "
                                     "included)")
    summed_kernel_time_ns: int = Field(description="Σ durations of those rows, ns")
    graph_kernels: int = Field(description="kernels rows that ran in graph replays (whole-graph executions included)")
    graph_kernel_time_ns: int = Field(description="Σ durations of the graph kernels, ns")
    graph_pct_of_device_kernel_time: float | None = Field(description="graph_kernel_time_ns / summed_kernel_time_ns, %")
    graphs: int = Field(description="distinct graphs")
    replays: int = Field(description="replays of all graphs")
    graph_kernels_without_replay: int = Field(description="graph kernels without a correlation id: in the graph totals, "
                                                          "in no replay")
    whole_graph_executions: int = Field(description="of graph_kernels, whole-graph executions (Nsight "
                                                    "--cuda-graph-trace=graph rows, no kernels inside recorded)")
    whole_graph_time_ns: int = Field(description="their summed duration (part of graph_kernel_time_ns), ns")


class TritonKernel(BaseModel):
    device_id: int
    name: str = Field(description="kernel base name (clipped)")
    kind: str = Field(description="pointwise, reduction, persistent-reduction, template, foreach or unknown (definitions)")
    fused_text: str | None = Field(description="name text after 'fused_' without the kernel index; null when absent")
    fused_ops: list[str] = Field(description="fused_text split into op names (best effort, see definitions)")
    count: int
    total_ns: int = Field(description="summed duration, ns")
    pct_of_device_kernel_time: float | None = Field(description="total_ns / summed kernel time of the device, %")
    in_graph_count: int = Field(description="executions inside graph replays")
    in_graph_ns: int = Field(description="summed duration of those, ns")
    launching_op: str | None = Field(description="most frequent PyTorch CPU op linked to the launching call by External id "
                                                 "(Kineto); null when the profile links none")


class GraphSummaryResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | None]
    definitions: dict[str, str] = Field(description="how graph kernels, replays and graphs are identified; each figure")
    devices: list[DeviceGraphTotals]
    graphs: list[GraphRow] = Field(description="per device, graphs by Σ replay wall time")
    truncated: bool = Field(description="true when some device had more graphs than `limit`")
    remainder_graphs: int = Field(description="graphs beyond the limit (all devices)")
    remainder_wall_ns: int = Field(description="their Σ replay wall time, ns")
    triton_kernels: list[TritonKernel] = Field(description="torch.compile (Inductor) Triton kernels by summed time")
    triton_truncated: bool = Field(description="true when more triton_* kernel names exist than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


# -- Triton names ---------------------------------------------------------------------------------------

TRITON_KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent-reduction", "tem": "template", "for": "foreach"}
_TRITON_RX = re.compile(r"^triton_([a-z]+)_(.*)$")
# Multi-word aten op names Inductor writes into kernel names; anything else splits at '_'.
_MULTI = {"_to_copy", "to_copy", "_softmax", "_log_softmax", "log_softmax", "_unsafe_view", "unsafe_view",
          "native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
          "native_group_norm", "native_group_norm_backward", "layer_norm", "batch_norm", "group_norm", "rms_norm",
          "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
          "native_dropout", "native_dropout_backward", "convolution_backward", "threshold_backward", "sigmoid_backward",
          "tanh_backward", "gelu_backward", "silu_backward", "hardswish_backward", "leaky_relu_backward",
          "_softmax_backward_data", "_log_softmax_backward_data", "embedding_dense_backward", "scatter_add",
          "scatter_reduce", "index_put", "index_select", "index_add", "clamp_min", "clamp_max", "var_mean", "new_zeros",
          "new_ones", "new_empty", "full_like", "zeros_like", "ones_like", "empty_like", "rand_like", "randn_like",
          "scalar_tensor", "constant_pad_nd", "avg_pool2d", "avg_pool2d_backward", "max_pool2d_with_indices",
          "max_pool2d_with_indices_backward", "upsample_nearest2d", "upsample_bilinear2d", "masked_fill", "bitwise_not",
          "bitwise_and", "bitwise_or", "bitwise_xor", "logical_not", "logical_and", "logical_or", "nll_loss_forward",
          "nll_loss_backward", "_scaled_mm", "addmm", "native_dropout", "split_with_sizes", "slice_scatter",
          "select_scatter", "as_strided", "as_strided_scatter", "_unsafe_index", "_unsafe_index_put", "cumsum",
          "sort", "topk", "argmax", "argmin", "amax", "amin", "mean", "logsumexp", "squeeze", "unsqueeze"}


def triton_parts(name: str) -> tuple[str, str | None, list[str]] | None:
    """(kind, fused text, fused op names) of an Inductor kernel name such as 'triton_red_fused__to_copy_mean_1', or
    None when the name is not a triton_* kernel."""
    m = _TRITON_RX.match(name)
    if not m:
        return None
    kind = TRITON_KINDS.get(m.group(1), "unknown")
    rest = re.sub(r"_\d+$", "", m.group(2))  # the kernel index Inductor appends
    if not rest.startswith("fused_"):
        return kind, None, []
    text = rest[len("fused_"):]
    return kind, text, split_fused(text)


def split_fused(text: str) -> list[str]:
    """'_to_copy_add_native_layer_norm' -> ['_to_copy', 'add', 'native_layer_norm'] (greedy longest known name)."""
    tokens, out, i = text.split("_"), [], 0
    while i < len(tokens):
        for j in range(len(tokens), i, -1):
            cand = "_".join(tokens[i:j])
            if cand in _MULTI:
                out.append(cand)
                i = j
                break
        else:
            if tokens[i] == "" and i + 1 < len(tokens):  # a leading '_' belongs to the next word
                out.append("_" + tokens[i + 1])
                i += 2
            else:
                if tokens[i]:
                    out.append(tokens[i])
                i += 1
    return out


# -- presence -------------------------------------------------------------------------------------------

def graph_kernel_count(trace: Trace) -> int:
    """Kernels of graph replays in the whole profile (memoized, also in the store: top_kernels asks it first)."""
    return trace.memo(("graph_summary.count", GRAPH_KERNELS_CTE), lambda: _graph_kernel_count(trace), persist=VALUE)


def _graph_kernel_count(trace: Trace) -> int:
    # Most profiles have neither a graph id nor a graph-launch call, which the column statistics and the names'
    # dictionary tell at once; the CTE scans every call and kernel even then (0.29 s CPU at 2 M kernels).
    if not trace.scalar(f"""WITH {GRAPH_KERNELS_CTE}
                            SELECT EXISTS (SELECT 1 FROM kernels WHERE graph_id IS NOT NULL) OR EXISTS (SELECT 1 FROM graph_names)"""):
        return 0
    return int(trace.scalar(f"WITH {GRAPH_KERNELS_CTE} SELECT count(*) FROM graph_kids"))


def graph_rowids(trace: Trace) -> list[int]:
    """kernels.rowid of every graph kernel (memoized)."""
    return trace.memo(("graph_summary.rowids",), lambda: [r[0] for r in trace.sql(
        f"WITH {GRAPH_KERNELS_CTE} SELECT kid FROM graph_kids ORDER BY kid")])


def absent_reason(trace: Trace) -> str | None:
    """Why this profile holds no graph replay (the data the tool would need and how to capture it), or None."""
    if present(trace)["kernels"] == 0 or graph_kernel_count(trace):
        return None
    launches = int(trace.scalar(  # one regex per distinct name, not per call
        f"""SELECT coalesce(sum(n), 0) FROM (SELECT name, count(*) AS n FROM api_calls GROUP BY name)
            WHERE regexp_matches(name, '{GRAPH_LAUNCH_RX}', 'i')"""))
    parts = [f"no CUDA/HIP graph replay in this {trace.format_name}: no kernel carries a graph id and no kernel was "
             "launched by a cudaGraphLaunch/hipGraphLaunch call"]
    if trace.format == "nsys":
        parts.append("graph kernels would carry graphId in CUPTI_ACTIVITY_KIND_KERNEL (nsys 2025+ exports) or share "
                     "the correlation id of their cudaGraphLaunch call, and graphs traced whole would be rows of "
                     "CUPTI_ACTIVITY_KIND_GRAPH_TRACE; re-capture with "
                     "`nsys profile --trace=cuda --cuda-graph-trace=node` to see inside graphs")
    elif trace.format == "rocpd":
        parts.append("graph kernels would carry graph_exec_id in rocpd_kernel_dispatch (rocpd schema 3.0.2+) or share "
                     "the correlation id of their hipGraphLaunch region; re-capture with "
                     "`rocprofv3 --kernel-trace --hip-trace --output-format rocpd` to see inside graphs")
    elif trace.format == "rpd":
        parts.append("legacy RPD records no graph ids; kernels would need their hipGraphLaunch call in rocpd_api: "
                     "re-capture with `rocprofv3 --kernel-trace --hip-trace --output-format rocpd`")
    elif trace.format == "kineto":
        parts.append("kernels would carry 'graph id' (recent PyTorch) or share the correlation id of a "
                     "cudaGraphLaunch/hipGraphLaunch 'cuda_runtime' event; capture the graph replays inside the "
                     "profiler's active steps")
    if launches:
        parts.append(f"{launches} graph-launch API calls are in the profile, but none has kernels linked to it")
    if present(trace)["api_calls"] == 0:
        parts.append("and without host API calls launches cannot be linked: " + gap_text(trace, ("api_calls",)))
    return "; ".join(parts) + "."


# -- the analysis ---------------------------------------------------------------------------------------

def graph_summary(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    limit: int = 10,
    kernel_limit: int = 8,
) -> GraphSummaryResult:
    require(trace, "graph_summary")
    why = absent_reason(trace)
    if why:
        raise ProfileError(f"{trace.path.name}: {why} top_kernels and ops_summary cover kernels launched one by one.")
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 100))
    kernel_limit = max(1, min(int(kernel_limit), 50))
    where, params = sel.where("k")
    # Replays are selected whole: a replay belongs to the window when its first kernel starts inside it.
    rwhere, rparams = sel.where("r")
    replays = f"""
        WITH {GRAPH_KERNELS_CTE},
        launch AS (
            SELECT pid, correlation_id, arg_min(name, (start_ns, end_ns)) AS call_name, min(start_ns) AS call_start
            FROM api_calls WHERE correlation_id IS NOT NULL AND pid IS NOT NULL GROUP BY pid, correlation_id),
        gk AS (
            SELECT k.rowid AS kid, k.device_id, k.start_ns, k.end_ns, k.dur_ns, k.short_name, k.pid, k.correlation_id,
                   k.graph_id, k.whole_graph, l.call_name, l.call_start
            FROM kernels k SEMI JOIN graph_kids g ON g.kid = k.rowid
            LEFT JOIN launch l ON l.pid = k.pid AND l.correlation_id = k.correlation_id
            WHERE k.correlation_id IS NOT NULL),
        rk AS (
            SELECT *, max(end_ns) OVER (PARTITION BY device_id, pid, correlation_id ORDER BY start_ns, end_ns, kid
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM gk),
        r0 AS (
            SELECT device_id, pid, correlation_id, min(graph_id) AS graph_id, any_value(call_name) AS call_name,
                   min(call_start) AS call_start, count(*) AS n, bool_or(whole_graph) AS whole, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   sum(dur_ns)::BIGINT AS work,
                   sum(greatest(0, end_ns - greatest(start_ns, coalesce(reach, start_ns))))::BIGINT AS busy,
                   md5(string_agg(short_name, chr(31) ORDER BY short_name)) AS sig
            FROM rk GROUP BY device_id, pid, correlation_id),
        r AS (
            SELECT *, end_ns - start_ns AS wall,
                   CASE WHEN graph_id IS NOT NULL THEN 'graph ' || graph_id ELSE 'kernels ' || left(sig, 12) END AS gkey
            FROM r0),
        rs AS (SELECT * FROM r WHERE {rwhere})"""
    query = replays + """
        SELECT device_id, pid, gkey, any_value(graph_id) AS graph_id, mode(call_name) AS call_name,
               count(*) AS replays, sum(n)::BIGINT AS kernels, min(n) AS n_min, median(n) AS n_med, max(n) AS n_max,
               sum(wall)::BIGINT AS wall, sum(work)::BIGINT AS work, sum(busy)::BIGINT AS busy,
               min(wall) AS w_min, median(wall) AS w_med, max(wall) AS w_max, stddev_samp(wall) AS w_std, avg(wall) AS w_avg,
               min(wall - busy) AS g_min, median(wall - busy) AS g_med, max(wall - busy) AS g_max,
               median(start_ns - call_start) AS l_med, min(start_ns) AS first_start, max(end_ns) AS last_end,
               bool_or(whole) AS whole,
               row_number() OVER (PARTITION BY device_id ORDER BY sum(wall) DESC, gkey, pid) AS rnk
        FROM rs GROUP BY device_id, pid, gkey
        ORDER BY device_id, rnk"""
    graphs = trace.memo(("graph_summary.graphs", query, tuple(rparams)), lambda: trace.sql_dicts(query, rparams))
    # Top kernels inside each graph: the same replays, their kernels grouped by base name.
    kq = replays + """
        SELECT rs.device_id, rs.pid, rs.gkey, k.short_name, count(*) AS n, sum(k.dur_ns)::BIGINT AS total,
               avg(k.dur_ns) AS avg, min(k.dur_ns) AS mn, max(k.dur_ns) AS mx,
               row_number() OVER (PARTITION BY rs.device_id, rs.pid, rs.gkey ORDER BY sum(k.dur_ns) DESC, k.short_name) AS rnk
        FROM rs JOIN gk k ON k.device_id = rs.device_id AND k.pid IS NOT DISTINCT FROM rs.pid
                          AND k.correlation_id = rs.correlation_id
        GROUP BY rs.device_id, rs.pid, rs.gkey, k.short_name"""
    kernel_rows = trace.memo(("graph_summary.kernels", kq, tuple(rparams)), lambda: trace.sql_dicts(kq, rparams))
    dq = f"""
        WITH {GRAPH_KERNELS_CTE}
        SELECT k.device_id, count(*) AS n, sum(k.dur_ns)::BIGINT AS total,
               count(g.kid) AS gn, coalesce(sum(k.dur_ns) FILTER (WHERE g.kid IS NOT NULL), 0)::BIGINT AS gtotal,
               count(g.kid) FILTER (WHERE k.correlation_id IS NULL) AS orphan,
               count(g.kid) FILTER (WHERE k.whole_graph) AS whole_n,
               coalesce(sum(k.dur_ns) FILTER (WHERE g.kid IS NOT NULL AND k.whole_graph), 0)::BIGINT AS whole_total
        FROM kernels k LEFT JOIN graph_kids g ON g.kid = k.rowid
        WHERE {where} GROUP BY k.device_id ORDER BY k.device_id"""
    dev_rows = trace.memo(("graph_summary.devices", dq, tuple(params)), lambda: trace.sql_dicts(dq, params))
    if not graphs:
        raise ProfileError("no graph replay starts in the selection (device / time window), though the profile has "
                           "graph replays: widen it, or call graph_summary without filters; trace_info lists spans.")
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    dev_total = {d["device_id"]: int(d["total"]) for d in dev_rows}
    by_graph: dict[tuple, list[dict]] = {}
    for kr in kernel_rows:
        by_graph.setdefault((kr["device_id"], kr["pid"], kr["gkey"]), []).append(kr)
    rows, rem_n, rem_wall, truncated = [], 0, 0, False
    for g in graphs:
        if g["rnk"] > limit:
            truncated, rem_n, rem_wall = True, rem_n + 1, rem_wall + int(g["wall"])
            continue
        whole = bool(g["whole"])
        # A whole-graph row is the replay's only record: no kernel inside it, so nothing to count or take a union of.
        ks = [] if whole else sorted(by_graph.get((g["device_id"], g["pid"], g["gkey"]), []), key=lambda r: r["rnk"])
        shown, rest = ks[:kernel_limit], ks[kernel_limit:]
        wall, work, busy = int(g["wall"]), int(g["work"]), int(g["busy"])
        std = None if g["w_std"] is None else round(float(g["w_std"]), 1)
        inner = (lambda v: None) if whole else (lambda v: v)  # noqa: E731
        rows.append(GraphRow(
            device_id=g["device_id"], pid=g["pid"], graph=g["gkey"], graph_id=g["graph_id"],
            identified_by="graph_id" if g["graph_id"] is not None else "kernel_names", launch_api=g["call_name"],
            traced_whole=whole, replays=int(g["replays"]), kernels=inner(int(g["kernels"])),
            kernels_per_replay_min=inner(int(g["n_min"])), kernels_per_replay_median=inner(float(g["n_med"])),
            kernels_per_replay_max=inner(int(g["n_max"])),
            wall_ns=wall, work_ns=inner(work), busy_ns=inner(busy), gap_ns=inner(wall - busy),
            gap_pct_of_wall=inner(pct(wall - busy, wall)), work_pct_of_wall=inner(pct(work, wall)),
            pct_of_device_kernel_time=pct(wall if whole else work, dev_total.get(g["device_id"])),
            replay_wall_min_ns=int(g["w_min"]), replay_wall_median_ns=float(g["w_med"]), replay_wall_max_ns=int(g["w_max"]),
            replay_wall_std_ns=std, replay_wall_cv_pct=pct(std, g["w_avg"]) if std is not None else None,
            replay_gap_min_ns=inner(int(g["g_min"])), replay_gap_median_ns=inner(float(g["g_med"])),
            replay_gap_max_ns=inner(int(g["g_max"])),
            launch_to_first_kernel_median_ns=None if g["l_med"] is None else float(g["l_med"]),
            first_replay_start_ns=int(g["first_start"]), last_replay_end_ns=int(g["last_end"]),
            top_kernels=[GraphKernel(
                name=clip_name(k["short_name"]), count=int(k["n"]), per_replay=round(k["n"] / g["replays"], 3),
                total_ns=int(k["total"]), avg_ns=round(float(k["avg"]), 1), min_ns=int(k["mn"]), max_ns=int(k["mx"]),
                pct_of_graph_work=pct(k["total"], work), triton_kind=(triton_parts(k["short_name"]) or (None,))[0])
                for k in shown],
            kernels_truncated=bool(rest), remainder_kernel_names=len(rest),
            remainder_kernel_ns=sum(int(k["total"]) for k in rest)))
    per_dev: dict[int, dict] = {}
    for g in graphs:
        d = per_dev.setdefault(g["device_id"], {"graphs": 0, "replays": 0})
        d["graphs"] += 1
        d["replays"] += int(g["replays"])
    devices = [DeviceGraphTotals(
        device_id=d["device_id"], device_name=names.get(d["device_id"]), kernels=int(d["n"]),
        summed_kernel_time_ns=int(d["total"]), graph_kernels=int(d["gn"]), graph_kernel_time_ns=int(d["gtotal"]),
        graph_pct_of_device_kernel_time=pct(d["gtotal"], d["total"]),
        graphs=per_dev.get(d["device_id"], {}).get("graphs", 0), replays=per_dev.get(d["device_id"], {}).get("replays", 0),
        graph_kernels_without_replay=int(d["orphan"]), whole_graph_executions=int(d["whole_n"]),
        whole_graph_time_ns=int(d["whole_total"])) for d in dev_rows]
    triton, triton_truncated = _triton(trace, where, params, dev_total, limit)
    hints = []
    whole_n = sum(d.whole_graph_executions for d in devices)
    if whole_n:
        hints.append(f"{whole_n} graph launches were traced whole (nsys --cuda-graph-trace=graph, the default): per-kernel "
                     "detail inside graphs (kernels per replay, work, busy time, gaps, top kernels) is absent; re-capture "
                     "with `nsys profile --trace=cuda --cuda-graph-trace=node` to see inside them")
    if truncated:
        hints.append(f"{rem_n} more graphs beyond limit={limit}; raise limit (max 100) or filter by device/time window")
    if any(r.kernels_truncated for r in rows):
        hints.append(f"some graphs ran more kernel names than kernel_limit={kernel_limit}; raise kernel_limit (max 50)")
    if triton_truncated:
        hints.append("more triton_* kernels than limit; top_kernels with name_contains='triton_' lists them all")
    return GraphSummaryResult(
        data_issues=data_issue_notes(trace, ("kernels", "api_calls")),
        trace=str(trace.path), window=window, filters={"device": device}, definitions=DEFINITIONS, devices=devices,
        graphs=rows, truncated=truncated, remainder_graphs=rem_n, remainder_wall_ns=rem_wall, triton_kernels=triton,
        triton_truncated=triton_truncated, hint="; ".join(hints) or None)


def _triton(trace: Trace, where: str, params: list, dev_total: dict[int, int], limit: int) -> tuple[list[TritonKernel], bool]:
    """Triton (torch.compile) kernels of the selection, by summed time; launching op via the call's External id."""
    q = f"""
        WITH {GRAPH_KERNELS_CTE},
        launch AS (
            SELECT pid, correlation_id, arg_min(external_id, (start_ns, end_ns)) AS ext
            FROM api_calls WHERE correlation_id IS NOT NULL AND pid IS NOT NULL GROUP BY pid, correlation_id),
        ops AS (SELECT pid, external_id, any_value(name) AS name FROM cpu_ops
                WHERE category = 'cpu_op' AND external_id IS NOT NULL GROUP BY pid, external_id),
        t AS (SELECT k.device_id, k.short_name, k.dur_ns, g.kid IS NOT NULL AS in_graph, o.name AS op
              FROM kernels k LEFT JOIN graph_kids g ON g.kid = k.rowid
              LEFT JOIN launch l ON l.pid = k.pid AND l.correlation_id = k.correlation_id
              LEFT JOIN ops o ON o.pid = k.pid AND o.external_id = l.ext
              WHERE {where} AND starts_with(k.short_name, 'triton_'))
        SELECT device_id, short_name, count(*) AS n, sum(dur_ns)::BIGINT AS total,
               count(*) FILTER (WHERE in_graph) AS gn, coalesce(sum(dur_ns) FILTER (WHERE in_graph), 0)::BIGINT AS gtotal,
               mode(op) AS op,
               row_number() OVER (ORDER BY sum(dur_ns) DESC, device_id, short_name) AS rnk
        FROM t GROUP BY device_id, short_name ORDER BY rnk"""
    rows = trace.memo(("graph_summary.triton", q, tuple(params)), lambda: trace.sql_dicts(q, params))
    out = []
    for r in rows[:limit]:
        kind, text, ops = triton_parts(r["short_name"]) or ("unknown", None, [])
        out.append(TritonKernel(
            device_id=r["device_id"], name=clip_name(r["short_name"]), kind=kind, fused_text=text, fused_ops=ops,
            count=int(r["n"]), total_ns=int(r["total"]), pct_of_device_kernel_time=pct(r["total"], dev_total.get(r["device_id"])),
            in_graph_count=int(r["gn"]), in_graph_ns=int(r["gtotal"]), launching_op=r["op"]))
    return out, len(rows) > limit
