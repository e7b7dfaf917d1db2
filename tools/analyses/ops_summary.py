"""ops_summary: GPU time per host operator (TraceLens `ops_summary` / `ops_summary_by_category` /
`ops_unique_args` / `kernel_summary`), with the attribution of op_tree.py.

Every GPU op (kernel, memcpy, memset) has exactly one launcher (op_tree.py): the innermost PyTorch cpu_op
around its launching API call, else the API call itself ('runtime'/'graph'), else '<unattributed>'
(no launching call in the profile). For Nsight/rocpd profiles (no cpu_ops) the launcher is the innermost
NVTX/rocTX/annotation range around the launching call on the same thread (projection.py), else the
kernel's base name. Per launcher instance (one op call):
  direct time   = |union| of the GPU ops it launched itself (concurrent ones not double counted), ns;
  subtree time  = |union| of the GPU ops launched inside it, descendants included, ns (Kineto only;
                  equals direct time for ranges/kernel groups, where nesting is not modelled);
  Count         = instances of the name that launched GPU work in the selection.
Rows sum the instances of a name. TraceLens names: total_direct_kernel_time_ms,
total_subtree_kernel_time_ms, Count (count), Categories (categories), Percentage (%)
(pct_of_attributed_kernel_time: direct / Σ direct of every attributed row — NOT of wall time) and
Cumulative Percentage (%) (cumulative_pct). Added: pct_of_gpu_busy (denominator: Σ over selected devices of
the union of all their GPU ops, unlinked included) and pct_of_gpu_span (Σ over selected devices of last end
− first start of their GPU ops), an '<unattributed>' row, communication launchers as rows, host duration
and launch delays. Graph replays (graph_summary.py's definition) are named: per row graph_gpu_ops and
graph_kernel_time_ns (Σ durations of the row's kernels that ran inside CUDA/HIP graph replays), per kernel row
in_graph_count, and totals; all null when the profile holds no graph replay. They add fields, never change others.

Deliberate differences from TraceLens (each pinned in tests/analyses/test_ops_summary.py):
  * communication launchers (NCCL/RCCL kernels) are rows, category 'communication' when the op name has
    no category of its own (TraceLens drops them: include_nccl=False);
  * GPU ops without a launching call are a row '<unattributed>' (TraceLens drops them), with
    pct_of_attributed_kernel_time null; pass include_unlinked=False to hide it;
  * categories: flash/efficient/cudnn attention leaves → SDPA_fwd/SDPA_bwd; softmax → reduce;
    cat/stack/index_select/embedding/gather/index/fill_/zero_/arange → elementwise (TraceLens: 'other');
    the cudnn_*/miopen_*/mkldnn_*/thnn_*/slow_conv*/_convolution* families by rule (family_category), where
    TraceLens lists a few names and leaves e.g. cudnn_convolution_backward_input in 'other'; totals state the
    GPU time still left in 'other' and its share, so a gap in the map shows;
  * launch delays: GPU ops that started before their call returned (host-synchronous calls) or before the
    previous op on their stream ended are left out of the medians and counted (delay_excluded_gpu_ops);
  * a launch that overhangs its cpu_op's end still belongs to the op (TraceLens drops it when >= 1 µs);
  * times are integer ns from the trace (TraceLens carries float µs).
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator, Literal

import duckdb
import numpy as np
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.quote import quote_ident, quote_literal
from ..model.trace import VALUE, Trace, cursor_dicts
from .common import (ALL_TABLES, CONTAINS_SQL, Window, clip_name, contains_pattern, data_issue_notes, data_issues_field, pct,
                     resolve_selection, ToolResult)
from .comm_patterns import comm_patterns
from .graph_summary import GRAPH_KERNELS_CTE, graph_kernel_count
from .intervals import unions_on
from .op_tree import Kept, gop_kinds_sql, gops_sql, launchers, names as name_table
from .projection import INNERMOST, RANGE_KINDS_SQL, calls_unique, tables as projection_tables
from .requirements import require
from .stacked import union_stats_sql

# -- categories (TraceLens PerfModel/torch_op_mapping.py, categorize_torch_op, + §12 fixes) -------------
_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "trtllm::cublas_scaled_mm",
         "bitsandbytes::int8_linear_matmul", "tex_ts::te_gemm_ts", "vllm::gemm_with_dynamic_quant", "aiter::gemm_a4w4")
_SDPA_FWD = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention", "FlashAttnFunc", "flash_attn::_flash_attn_forward",
             "flash_attn::_flash_attn_varlen_forward", "flash_attn_3::fwd", "vllm::unified_attention_with_output",
             "EvoformerAttention", "aten::_efficient_attention_forward",
             # fix: leaves under the SDPA wrappers (TraceLens: 'other')
             "aten::_flash_attention_forward", "aten::_cudnn_attention_forward")
_SDPA_BWD = ("aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
             "aten::_scaled_dot_product_cudnn_attention_backward", "FlashAttnFuncBackward", "flash_attn::_flash_attn_backward",
             "flash_attn::_flash_attn_varlen_backward", "flash_attn_3::bwd", "aten::_efficient_attention_backward",
             "aten::_flash_attention_backward", "aten::_cudnn_attention_backward")
_CONV_FWD = ("aten::convolution", "aten::_convolution", "aten::miopen_convolution", "aten::cudnn_convolution",
             "ConvBias_", "ConvBiasReLU_")
_CONV_BWD = ("aten::convolution_backward", "ConvBias_Backward", "ConvBiasReLU_Backward")
_NORMS = ("batch_norm", "layer_norm", "group_norm", "instance_norm")
_NORM_FWD = tuple(f"aten::{p}{n}" for n in _NORMS for p in ("", "native_", "miopen_", "cudnn_", "_")) + (
    "aten::_fused_rms_norm", "aten::rms_norm", "aten::_batch_norm_impl_index")
_NORM_BWD = tuple(f"{n}_backward" for n in _NORM_FWD) + ("aten::native_batch_norm_backward",)
_ELEMENTWISE = tuple(f"aten::{n}" for n in (
    "copy", "copy_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "sigmoid", "rsqrt", "silu", "neg", "pow",
    "div", "div_", "mul", "mul_", "add", "add_", "sigmoid_backward", "threshold_backward", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d")) + (
    "LigerSiLUMulFunction",)
_REDUCE = tuple(f"aten::{n}" for n in ("sum", "mean", "max", "min", "norm", "linalg_norm", "std", "var", "logsumexp",
                                        "cumsum", "cumprod", "amin", "amax"))
# fix (§12): ops TraceLens leaves in 'other'
_FIX_REDUCE = ("aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
               "aten::_log_softmax_backward_data")
_FIX_ELEMENTWISE = ("aten::cat", "aten::stack", "aten::index_select", "aten::embedding", "aten::gather", "aten::index",
                    "aten::fill_", "aten::zero_", "aten::arange", "aten::embedding_dense_backward")

OP_CATEGORIES: dict[str, str] = {}
for _names, _cat in ((_GEMM, "GEMM"), (_SDPA_FWD, "SDPA_fwd"), (_SDPA_BWD, "SDPA_bwd"), (_CONV_FWD, "CONV_fwd"),
                     (_CONV_BWD, "CONV_bwd"), (_NORM_FWD, "NORM_fwd"), (_NORM_BWD, "NORM_bwd"),
                     (_ELEMENTWISE, "elementwise"), (_REDUCE, "reduce"), (_FIX_REDUCE, "reduce"),
                     (_FIX_ELEMENTWISE, "elementwise")):
    for _n in _names:
        OP_CATEGORIES.setdefault(_n, _cat)

# TraceLens's own (unfixed) assignment of the names changed above, for comparisons.
TRACELENS_UNMAPPED = set(_FIX_REDUCE) | set(_FIX_ELEMENTWISE) | {
    "aten::_flash_attention_forward", "aten::_flash_attention_backward", "aten::_cudnn_attention_forward",
    "aten::_cudnn_attention_backward"}


# Backend op families: cuDNN, MIOpen, oneDNN (mkldnn), the pre-1.11 THNN kernels and their slow_conv
# successors, and the convolution dispatch layers (_convolution, _convolution_double_backward, ...).
# TraceLens lists a few of their names; the family rule covers every member: the op kind comes from the
# name, the direction from 'backward' in it. Members of no known kind (cudnn_rnn, cudnn_grid_sampler, ...)
# fall through to the rules below.
_FAMILY = re.compile(r"^aten::(cudnn_|miopen_|mkldnn_|thnn_|slow_conv|_nnpack_|_?conv_depthwise|_?convolution)")
_FAMILY_KINDS = (("CONV", re.compile(r"conv")), ("NORM", re.compile(r"(batch|layer|group|instance|rms)_norm")),
                 ("GEMM", re.compile(r"linear|matmul|(^|_)b?mm(_|$)")), ("SDPA", re.compile(r"attention")))


def family_category(name: str) -> str | None:
    """Category of a backend-family op (see _FAMILY), or None when the name is no family member of a known kind."""
    if not _FAMILY.match(name):
        return None
    rest = name[len("aten::"):]
    for kind, rx in _FAMILY_KINDS:
        if rx.search(rest):
            return kind if kind == "GEMM" else f"{kind}_{'bwd' if 'backward' in rest else 'fwd'}"
    return None


def op_category(name: str, first_kernel: str | None, all_comm: bool) -> str:
    """Category of one launcher instance: registry, then the backend-family rule, then name regexes,
    then communication, then the first kernel's name (TraceLens fallback), else 'other'."""
    cat = OP_CATEGORIES.get(name) or family_category(name)
    if cat:
        return cat
    if name.startswith("triton"):
        return "triton"
    if name.startswith("record_param_comms"):
        return "record_param_comms"
    if all_comm:
        return "communication"
    k = first_kernel or ""
    if k.startswith("void at::native"):
        for key in ("elementwise", "reduce", "multi_tensor_apply"):
            if key in k:
                return key
    return "other"


_KERNEL_RULES = (
    ("SDPA_bwd", r"(flash|fmha|attention).*(bwd|backward)|(bwd|backward).*(flash|fmha)"),
    ("SDPA_fwd", r"flash|fmha|attention"),
    ("GEMM", r"gemm|xmma|cublas|Cijk_|cutlass.*(gemm|wmma|tensorop)|matmul"),
    ("CONV_fwd", r"conv"),
    ("NORM_fwd", r"norm"),
    ("reduce", r"reduce|softmax"),
    ("elementwise", r"elementwise|copy|fill|CatArray|index"),
)


WHOLE_GRAPH_CATEGORY = "CUDA graph (contents not traced)"


def kernel_category(name: str, is_comm: bool, op: str, whole_graph: bool = False) -> str:
    """Category of one GPU op from its name (profiles without cpu_ops). A whole-graph replay (Nsight
    --cuda-graph-trace=graph) is its own category: the kernels inside, computation or communication, are unknown."""
    if whole_graph:
        return WHOLE_GRAPH_CATEGORY
    if is_comm:
        return "communication"
    if op == "copy":
        return "memcpy"
    if op == "set":
        return "memset"
    for cat, rx in _KERNEL_RULES:
        if re.search(rx, name, re.I):
            return cat
    return "other"


# -- results ------------------------------------------------------------------------------------------

class OpRow(BaseModel):
    name: str = Field(description="launcher name: cpu_op (Kineto), NVTX/rocTX range or kernel base name (Nsight/rocpd), "
                                  "runtime call (no enclosing cpu_op), or '<unattributed>'")
    launcher_kind: str = Field(description="'cpu_op', 'range', 'kernel', 'runtime', 'graph' or 'unattributed'")
    count: int = Field(description="TraceLens Count: launcher instances with GPU work in the selection")
    gpu_op_count: int = Field(description="GPU ops (kernels, copies, sets) launched directly")
    total_direct_kernel_time_ns: int = Field(description="Σ over instances of |union of directly launched GPU ops|, ns")
    total_direct_kernel_time_ms: float = Field(description="same in ms (TraceLens column name)")
    total_subtree_kernel_time_ns: int = Field(description="Σ over instances of |union of GPU ops launched inside them|, ns")
    total_subtree_kernel_time_ms: float
    categories: list[str] = Field(description="TraceLens Categories: sorted set of the instances' op categories")
    pct_of_attributed_kernel_time: float | None = Field(
        description="TraceLens 'Percentage (%)': direct / Σ direct of all attributed rows, %; null for '<unattributed>'")
    cumulative_pct: float | None = Field(description="TraceLens 'Cumulative Percentage (%)' in row order, %")
    pct_of_gpu_busy: float | None = Field(description="direct / GPU busy time (see totals.gpu_busy_ns), %")
    pct_of_gpu_span: float | None = Field(description="direct / GPU span (see totals.gpu_span_ns), %")
    cpu_time_ns: int | None = Field(description="Σ host duration of the launcher instances (cpu_op/range/API call), ns")
    cpu_time_mean_ns: float | None
    launch_delay_median_ns: float | None = Field(description="median of GPU start − launching call end, ns (includes queueing), "
                                                             "over the linked GPU ops not in delay_excluded_gpu_ops")
    queue_free_delay_median_ns: float | None = Field(
        description="median of GPU start − max(call end, previous op end on its stream: device, process, stream id), ns "
                    "(launch latency without queueing), "
                    "over the same GPU ops")
    graph_gpu_ops: int | None = Field(None, description="GPU ops of the row that ran inside CUDA/HIP graph replays "
                                      "(graph_summary); null when the profile holds no graph replay")
    graph_kernel_time_ns: int | None = Field(None, description="Σ durations of those kernels (summed, not a union), ns")
    delay_excluded_gpu_ops: int = Field(
        description="linked GPU ops left out of both delay medians: they started before their launching call returned (the "
                    "call was host-synchronous: a pageable or synchronous copy, a launch that blocked) or before the previous "
                    "op on their stream ended, so the difference is negative and no delay")


class ShapeRow(BaseModel):
    name: str
    category: str
    input_dims: str | None = Field(description="JSON list of input shapes")
    input_types: str | None = Field(description="JSON list of input dtypes")
    count: int = Field(description="op instances with this signature (TraceLens operation_count)")
    direct_total_ns: int = Field(description="Σ direct time, ns (TraceLens total_direct_kernel_time_sum)")
    direct_mean_ns: float
    direct_median_ns: float
    direct_std_ns: float | None = Field(description="sample std (n-1); null for one instance")
    direct_min_ns: int
    direct_max_ns: int
    subtree_total_ns: int
    pct_of_attributed_kernel_time: float | None
    cumulative_pct: float | None
    kernels: list[dict] = Field(description="GPU ops launched by these instances: name (clipped), stream, count, total_ns, mean_ns")


class CategoryRow(BaseModel):
    category: str = Field(description="TraceLens 'op category' (with the documented fixes)")
    count: int = Field(description="launcher instances (Nsight/rocpd: GPU ops)")
    total_direct_kernel_time_ns: int
    total_direct_kernel_time_ms: float
    pct_of_attributed_kernel_time: float | None = Field(description="TraceLens 'Percentage (%)'")
    cumulative_pct: float | None
    pct_of_gpu_busy: float | None
    pct_of_gpu_span: float | None


class KernelRow(BaseModel):
    parent_category: str = Field(description="TraceLens 'Parent op category'")
    parent_op: str = Field(description="TraceLens 'Parent cpu_op' (launcher name)")
    kernel_name: str = Field(description="full kernel name (clipped)")
    stream_id: int | None
    device_id: int
    count: int
    total_ns: int = Field(description="Σ kernel durations, ns (TraceLens 'Kernel duration (µs)_sum', here ns)")
    mean_ns: float
    min_ns: int
    max_ns: int
    pct_of_kernel_time: float | None = Field(description="total / Σ duration of all kernels in the selection, % (TraceLens 'Percent of kernels time (%)')")
    pct_of_gpu_span: float | None = Field(description="total / GPU span, % (TraceLens divides by the linked-only span)")
    in_graph_count: int | None = Field(None, description="executions inside CUDA/HIP graph replays; null when the profile "
                                       "holds no graph replay")


class Totals(BaseModel):
    gpu_ops: int = Field(description="GPU ops in the selection")
    attributed_kernel_time_ns: int | None = Field(description="Σ direct time of all attributed rows (Percentage denominator), "
                                                  "ns; null for group_by='kernels', whose rows share summed_kernel_time_ns")
    unattributed_gpu_ops: int = Field(description="GPU ops without a launching call in the profile")
    unattributed_time_ns: int = Field(description="|union| of those GPU ops, ns")
    runtime_launched_gpu_ops: int = Field(description="GPU ops whose launching call has no enclosing cpu_op/range")
    comm_gpu_ops: int = Field(description="communication kernels (TraceLens drops their launchers)")
    gpu_busy_ns: int = Field(description="Σ over devices of the union of all their GPU ops in the selection, ns")
    gpu_span_ns: int = Field(description="Σ over devices of last end − first start of their GPU ops, ns")
    summed_kernel_time_ns: int = Field(description="Σ kernel durations (kernels only), ns")
    delay_excluded_gpu_ops: int = Field(description="GPU ops left out of the launch-delay medians (see the rows' field)")
    other_category_direct_ns: int = Field(
        description="GPU time of the launchers no category rule matched (category 'other'): Σ per launcher instance of "
                    "|union of its GPU ops in that category|, ns")
    graph_kernels: int | None = Field(None, description="kernels in the selection that ran inside CUDA/HIP graph replays "
                                      "(graph_summary); null when the profile holds no graph replay")
    graph_kernel_time_ns: int | None = Field(None, description="Σ durations of those kernels (part of summed_kernel_time_ns), ns")
    other_category_pct_of_categorised_gpu_time: float | None = Field(
        description="other_category_direct_ns / the same sum over every category of the attributed launchers "
                    "(the by-category rows' total without '<unattributed>'), %: how much GPU time the category map misses")


class OpsSummaryResult(ToolResult):
    trace: str
    group_by: str
    attribution: str = Field(description="how GPU ops were attributed: 'cpu_op' (PyTorch op tree) or 'range' (NVTX/rocTX, then kernel name)")
    window: Window
    filters: dict[str, int | str | bool | None]
    totals: Totals
    rows: list[OpRow] | list[ShapeRow] | list[CategoryRow] | list[KernelRow]
    truncated: bool
    remainder_rows: int = Field(description="rows beyond the limit")
    remainder_direct_ns: int = Field(description="direct time (kernels: summed time) of the rows beyond the limit, ns")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


# -- computation --------------------------------------------------------------------------------------
#
# The frame (one row per GPU op with its launcher instance) is a table kept in DuckDB per profile (op_tree.Kept);
# each call selects from it with a WHERE clause and aggregates in SQL, so Python receives the rows shown and totals.

@dataclass(frozen=True)
class Frame:
    """Every GPU op with its launcher instance (_build_frame): table `table`, columns gop_id, op, device_id, stream_id,
    start_ns, end_ns, dur_ns, name_id, is_comm, launcher_id, launcher_kind, lname_id (launcher name), launcher_dur_ns,
    inst (launcher instance), category, launch_delay_ns, queue_free_delay_ns, in_graph; a Selection adds delay_excluded and
    graph_dur_ns, cheaper to derive where read than to write for every GPU op. Names are ids of table `names` (op_tree.Launchers: id order is name order); a cpu_op launcher's
    input_dims/types are its cpu_ops row's (launcher_id). `subtree`: op_tree's (op_id, gop_id) pairs, None without cpu_ops."""

    table: str
    names: str
    subtree: str | None
    attribution: str
    keep: tuple  # the Kept tables live as long as this object


@dataclass(frozen=True)
class Selection:
    """The frame's GPU ops a call selected: `sql` is a parenthesised subquery taking `params`."""

    frame: Frame
    where: str
    params: list

    @property
    def sql(self) -> str:
        # A linked GPU op (any launcher kind but unattributed) without a launch delay was left out of the delays.
        return (f"(SELECT *, launch_delay_ns IS NULL AND launcher_kind <> 'unattributed' AS delay_excluded, "
                f"CASE WHEN in_graph THEN dur_ns ELSE 0 END AS graph_dur_ns FROM {self.frame.table} WHERE {self.where})")

    def narrow(self, cond: str, params: list | None = None) -> "Selection":
        return Selection(self.frame, f"{self.where} AND {cond}", self.params + list(params or []))


def selected_frame(trace: Trace, device: int | None, start_ns: int | None, end_ns: int | None) -> Selection:
    """The attributed GPU ops (see _build_frame) on `device` that start inside [start_ns, end_ns)."""
    conds, params = ["TRUE"], []
    for cond, v in (("device_id = ?", device), ("start_ns >= ?", start_ns), ("start_ns < ?", end_ns)):
        if v is not None:
            conds.append(cond)
            params.append(int(v))
    sel = Selection(_frame(trace), " AND ".join(conds), params)
    if not trace.scalar(f"SELECT EXISTS (SELECT 1 FROM {sel.sql})", sel.params):
        raise ProfileError("no GPU op starts in the selection (device / time window). Widen it; trace_info lists devices and spans.")
    return sel


def _frame(trace: Trace) -> Frame:
    return trace.memo(("ops_summary.frame",), lambda: _build_frame(trace))


@contextmanager
def call_cursor(trace: Trace) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor for one tool call; the temp tables it made are dropped at the end."""
    cur = trace.con.cursor()
    try:
        yield cur
    finally:
        try:
            for (t,) in cur.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall():
                cur.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(t)}")
        finally:
            cur.close()


def _build_frame(trace: Trace) -> Frame:
    """The launchers of op_tree.py as ops_summary counts them. With cpu_ops: the launcher instance is the cpu_op, else
    the launching call (pid, thread, start: a graph launch owns all its GPU ops), else the GPU op itself. Without: the
    innermost NVTX/rocTX/annotation range around the launching call (projection.py), else the GPU op, named by its
    kernel's base name. GPU ops without a launching call are '<unattributed>'. Instance ids: class in the top bits, the
    id below (ids are row numbers, far below 2^60)."""
    has_ops = trace.count("cpu_ops") > 0
    kept = Kept(trace, "frame")
    cur = kept.cur
    graphs = graph_kernel_count(trace) > 0
    if graphs:
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _ops_graph AS WITH {GRAPH_KERNELS_CTE} SELECT DISTINCT kid * 2 AS gop_id FROM graph_kids")
    in_graph = "g.op = 'kernel' AND g.gop_id IN (SELECT gop_id FROM _ops_graph)" if graphs else "false"
    common = f"""g.gop_id, g.op, g.device_id, g.stream_id, g.start_ns, g.end_ns, g.dur_ns, g.name_id, g.is_comm, g.whole_graph,
                 g.launcher_id, {in_graph} AS in_graph, g.start_ns - g.call_end_ns AS launch,
                 g.start_ns - CASE WHEN g.prev_end_ns > g.call_end_ns THEN g.prev_end_ns ELSE g.call_end_ns END AS qf"""
    if has_ops:
        attribution = "cpu_op"
        L = launchers(trace)
        names, keep = L.names, L
        cur.execute(f"""CREATE OR REPLACE TEMP TABLE _ops_base AS SELECT {common},
            CASE g.launcher_kind WHEN 'unlinked' THEN 'unattributed' ELSE g.launcher_kind END AS launcher_kind,
            g.launcher_name_id AS lname_id, g.launcher_start_ns, g.launcher_end_ns,
            CASE WHEN g.launcher_kind = 'cpu_op' THEN g.launcher_id
                 WHEN g.launcher_kind IN ('runtime', 'graph')
                     THEN (2::BIGINT << 60) + dense_rank() OVER (ORDER BY g.pid, g.call_tid, g.call_start_ns)
                 ELSE (3::BIGINT << 60) + g.gop_id END AS inst
            FROM {L.table} g""")
        # Category of an instance: op_category of its name, the name of its first GPU op by (start, id) and whether
        # all its GPU ops are communication; computed once per distinct combination.
        cur.execute("""CREATE OR REPLACE TEMP TABLE _ops_ic AS
            SELECT inst, f.n AS n, f.k AS k, c, f.kd AS kd FROM (
                SELECT inst, arg_min({'n': lname_id, 'k': name_id, 'kd': launcher_kind}, (start_ns, gop_id)) AS f,
                       bool_and(is_comm) AS c
                FROM _ops_base GROUP BY inst)""")

        def cat(name, first_kernel, comm, kd):
            return "unattributed" if kd == "unattributed" else kd if kd in ("runtime", "graph") else op_category(name, first_kernel, comm)
        match = _categories(cur, "_ops_ic", ("n", "k", "c", "kd"), cat, "i", L.names, ("n", "k"))
        src = f"_ops_base JOIN (SELECT i.inst, _ops_cat.category FROM _ops_ic i JOIN _ops_cat ON {match}) USING (inst)"
        _frame_table(cur, kept.names["frame"], "", src)
    else:
        attribution = "range"
        # Without an op tree each GPU op is classified by its own name. Without ranges the frame is the one reader of the
        # launcher rows (op_tree.gops_sql): they are read as a subquery, not written as a table first. With ranges the
        # projection reads them too, so they are written once (_ops_gops) and read by both: the GPU ops met their calls
        # once per reader before, and the projection's meeting ran out of a 128 MiB limit at 2 M ops and 250,000 ranges.
        n = name_table(trace)
        names, keep = n.table, n
        match = _categories(cur, f"({gop_kinds_sql(names)})", ("name_id", "is_comm", "op", "whole_graph"), kernel_category, "g",
                            names, ("name_id",))
        ranged = trace.scalar(f"SELECT EXISTS (SELECT 1 FROM markers WHERE kind IN ({RANGE_KINDS_SQL}))")
        gops = gops_sql(n.table, unique=calls_unique([trace]))
        src = f"({gops})"
        if ranged:
            cur.execute(f"CREATE OR REPLACE TEMP TABLE _ops_gops AS {gops}")
            src = "_ops_gops"
        # per projected GPU op, its innermost range
        inner = (f"WITH inn AS ({INNERMOST}) SELECT inn.gop_id, r.rid, r.name, r.start_ns, r.end_ns FROM inn JOIN _proj_rng r USING (rid)"
                 if ranged else "SELECT NULL::BIGINT AS gop_id, NULL::BIGINT AS rid, NULL::VARCHAR AS name, NULL::BIGINT AS start_ns, "
                                "NULL::BIGINT AS end_ns WHERE false")
        with projection_tables(cur, trace, gops=src) if ranged else nullcontext():
            _frame_table(cur, kept.names["frame"], "", f"""(
                SELECT {common},
                    CASE WHEN r.rid IS NOT NULL THEN 'range' WHEN g.launcher_kind IN ('runtime', 'graph') THEN 'kernel'
                         WHEN g.launcher_kind = 'unlinked' THEN 'unattributed' ELSE g.launcher_kind END AS launcher_kind,
                    CASE WHEN r.rid IS NOT NULL THEN rn.id WHEN g.launcher_kind IN ('runtime', 'graph')
                         THEN coalesce(g.short_name_id, g.name_id) ELSE g.launcher_name_id END AS lname_id,
                    CASE WHEN r.rid IS NOT NULL THEN r.start_ns WHEN g.launcher_kind IN ('runtime', 'graph') THEN NULL
                         ELSE g.launcher_start_ns END AS launcher_start_ns,
                    CASE WHEN r.rid IS NOT NULL THEN r.end_ns WHEN g.launcher_kind IN ('runtime', 'graph') THEN NULL
                         ELSE g.launcher_end_ns END AS launcher_end_ns,
                    CASE WHEN r.rid IS NOT NULL THEN (1::BIGINT << 60) + r.rid ELSE (3::BIGINT << 60) + g.gop_id END AS inst,
                    _ops_cat.category
                FROM {src} g LEFT JOIN ({inner}) r USING (gop_id)
                LEFT JOIN {names} rn ON rn.name = r.name JOIN _ops_cat ON {match})""")
    for t in ("_ops_base", "_ops_ic", "_ops_cat", "_ops_graph", "_ops_gops"):
        cur.execute(f"DROP TABLE IF EXISTS temp.main.{t}")
    return Frame(table=kept.names["frame"], names=names, subtree=L.subtree if has_ops else None, attribution=attribution,
                 keep=(kept, keep))


def _frame_table(cur, table: str, with_clause: str, src: str) -> None:
    """Table `table` (the frame) from `src`: the GPU ops with their launcher columns, inst and category, plus the launch
    delays. A GPU op that started before its call returned (the host was inside a synchronous call: a pageable copy, a
    launch that blocked), or before the previous op on its stream ended, has a negative difference, which is no delay:
    it is left out (delay_excluded). One statement: the frame is the only copy of the GPU ops it writes."""
    cur.execute(f"""CREATE TABLE {table} AS {with_clause}
        SELECT b.gop_id, b.op, b.device_id, b.stream_id, b.start_ns, b.end_ns, b.dur_ns, b.name_id, b.is_comm, b.launcher_id,
               b.launcher_kind, b.lname_id, b.launcher_end_ns - b.launcher_start_ns AS launcher_dur_ns, b.inst,
               b.category, CASE WHEN b.bad THEN NULL ELSE b.launch END AS launch_delay_ns,
               CASE WHEN b.bad THEN NULL ELSE b.qf END AS queue_free_delay_ns, b.in_graph
        FROM (SELECT *, coalesce(launch < 0, false) OR coalesce(qf < 0, false) AS bad FROM {src}) b""")


def _categories(cur, table: str, cols: tuple[str, ...], fn, alias: str, names: str, ids: tuple[str, ...]) -> str:
    """Temp table _ops_cat: each distinct combination of `cols` in `table` with category = fn(*cols), fn called once per
    combination (a few hundred distinct ops or kernel names among millions of rows); the columns `ids` are name ids of
    table `names`, which fn gets as the names. Returns the join condition of a row of alias `alias` to its combination."""
    c = ", ".join(cols)
    cur.execute(f"CREATE OR REPLACE TEMP TABLE _ops_cat_d AS SELECT row_number() OVER () AS combo, * FROM (SELECT DISTINCT {c} FROM {table})")
    named = ", ".join(f"(SELECT name FROM {names} WHERE id = d.{x})" if x in ids else f"d.{x}" for x in cols)
    combos = cur.execute(f"SELECT combo, {named} FROM _ops_cat_d d").fetchall()
    values = ", ".join(f"({r[0]}, {quote_literal(fn(*r[1:]))})" for r in combos) or "(NULL, NULL)"
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE _ops_cat AS
        SELECT d.* EXCLUDE (combo), v.category FROM _ops_cat_d d JOIN (VALUES {values}) v(combo, category) USING (combo)""")
    cur.execute("DROP TABLE temp.main._ops_cat_d")
    return " AND ".join(f"{alias}.{x} IS NOT DISTINCT FROM _ops_cat.{x}" for x in cols)


def ops_summary(
    trace: Trace,
    *,
    group_by: Literal["name", "shapes", "category", "kernels"] = "name",
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    include_unlinked: bool = True,
    name_contains: str | None = None,
    limit: int = 20,
) -> OpsSummaryResult:
    require(trace, "ops_summary")
    if group_by not in ("name", "shapes", "category", "kernels"):
        raise ProfileError(f"group_by must be 'name', 'shapes', 'category' or 'kernels', not {group_by!r}.")
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 500))
    filters = {"device": device, "include_unlinked": include_unlinked, "name_contains": name_contains}
    device, start_ns, end_ns = (None if v is None else int(v) for v in (device, start_ns, end_ns))
    include_unlinked = bool(include_unlinked)
    # The answer depends on the profile, the arguments and the communication patterns (GPUSCOPE_COMM_PATTERNS decides
    # is_comm) only: kept in the store, so a repeated call, in this process or a later one, neither builds the frame
    # nor aggregates it again.
    patterns = tuple(comm_patterns())
    a = trace.memo(("ops_summary", group_by, device, start_ns, end_ns, include_unlinked, name_contains, limit, patterns),
                   lambda: _answer(trace, group_by, device, start_ns, end_ns, include_unlinked, name_contains, limit, patterns),
                   persist=VALUE)
    rem_n = a["remainder_rows"]
    truncated = rem_n > 0
    return OpsSummaryResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), group_by=group_by, attribution=a["attribution"], window=window, filters=filters,
        totals=Totals.model_validate(a["totals"]), rows=[_ROW[group_by].model_validate(r) for r in a["rows"]], truncated=truncated,
        remainder_rows=rem_n, remainder_direct_ns=a["remainder_direct_ns"],
        hint=(f"{rem_n} more rows beyond limit={limit}; raise limit (max 500) or filter with name_contains/device/time window"
              if truncated else None))


_ROW = {"name": OpRow, "shapes": ShapeRow, "category": CategoryRow, "kernels": KernelRow}


def _answer(trace: Trace, group_by: str, device: int | None, start_ns: int | None, end_ns: int | None, include_unlinked: bool,
            name_contains: str | None, limit: int, patterns: tuple[str, ...]) -> dict:
    """ops_summary's rows, totals and remainder, as JSON (model_dump)."""
    g = selected_frame(trace, device, start_ns, end_ns)
    with call_cursor(trace) as cur:
        # The totals depend on the device and window only: one computation for every group_by and filter.
        totals = Totals.model_validate(trace.memo(("ops_summary.totals", device, start_ns, end_ns, patterns),
                                                  lambda: _totals(cur, g, graph_kernel_count(trace) > 0).model_dump(), persist=VALUE))
        if name_contains:
            g = g.narrow(f"lname_id IN (SELECT id FROM {g.frame.names} WHERE name {CONTAINS_SQL})", [contains_pattern(name_contains)])
            if not cur.execute(f"SELECT EXISTS (SELECT 1 FROM {g.sql})", g.params).fetchone()[0]:
                raise ProfileError(f"no launcher name contains {name_contains!r} in the selection; call ops_summary without it to see the names.")
        if group_by == "kernels":
            rows, rem_n, rem_t = _kernel_rows(cur, g, totals, include_unlinked, limit)
        else:
            if not include_unlinked:
                g = g.narrow("launcher_kind <> 'unattributed'")
            inst = instances(cur, g, subtree=group_by != "category")
            if group_by == "name":
                rows, rem_n, rem_t = _name_rows(cur, g, inst, totals, limit)
            elif group_by == "category":
                rows, rem_n, rem_t = _category_rows(cur, g, inst, totals, limit)
            else:
                rows, rem_n, rem_t = _shape_rows(cur, g, inst, totals, limit)
    return {"attribution": g.frame.attribution, "totals": totals.model_dump(), "rows": [r.model_dump() for r in rows],
            "remainder_rows": rem_n, "remainder_direct_ns": rem_t}


def busy_by_device(cur, g: Selection) -> int:
    """Σ over devices of the union of the selection's GPU ops, ns."""
    return sum(u.busy_ns for u in unions_on(cur, f"SELECT device_id, start_ns, end_ns FROM {g.sql}", g.params, ("device_id",)).values())


# Instance class 3 is one GPU op (no launching call, or no range around its call): its union is its length, and the
# window functions of a union would sort millions of one-row partitions for nothing.
ONE_OP = "inst >= (3::BIGINT << 60)"


def union_per_instance(g: Selection, partition: str) -> tuple[str, list]:
    """SQL and parameters: per `partition` (inst first, then columns fixed within an instance or splitting it), busy_ns =
    the length of the union of its selected GPU ops (partitions of zero-length ops only: 0 or absent)."""
    union = union_stats_sql(f"SELECT {partition}, start_ns, end_ns FROM {g.sql} WHERE NOT {ONE_OP}", partition)
    return (f"SELECT {partition}, busy_ns FROM ({union}) "
            f"UNION ALL SELECT {partition}, greatest(end_ns - start_ns, 0) FROM {g.sql} WHERE {ONE_OP}", g.params + g.params)


def _totals(cur, g: Selection, graphs: bool) -> Totals:
    a = cursor_dicts(cur, f"""
        SELECT count(*) AS n, count(*) FILTER (WHERE launcher_kind = 'unattributed') AS un,
               count(*) FILTER (WHERE launcher_kind IN ('runtime', 'graph')) AS rt, count(*) FILTER (WHERE is_comm) AS comm,
               coalesce(sum(dur_ns) FILTER (WHERE op = 'kernel'), 0)::BIGINT AS kt, count(*) FILTER (WHERE delay_excluded) AS dx,
               count(*) FILTER (WHERE in_graph) AS gk, coalesce(sum(graph_dur_ns), 0)::BIGINT AS gns
        FROM {g.sql}""", g.params)[0]
    span = cur.execute(f"SELECT coalesce(sum(hi - lo), 0)::BIGINT FROM (SELECT max(end_ns) AS hi, min(start_ns) AS lo FROM {g.sql} "
                       "WHERE device_id IS NOT NULL GROUP BY device_id)", g.params).fetchone()[0]
    un_t = sum(u.busy_ns for u in unions_on(cur, f"SELECT 0 AS k, start_ns, end_ns FROM {g.sql} WHERE launcher_kind = 'unattributed'",
                                             g.params, ("k",)).values())
    # Σ per (launcher instance, category) of the union of its GPU ops in that category
    per, params = union_per_instance(g, "inst, category, launcher_kind")
    other, categorised = cur.execute(f"""
        SELECT coalesce(sum(busy_ns) FILTER (WHERE category = 'other'), 0)::BIGINT,
               coalesce(sum(busy_ns) FILTER (WHERE launcher_kind <> 'unattributed'), 0)::BIGINT
        FROM ({per})""", params).fetchone()
    return Totals(gpu_ops=a["n"], attributed_kernel_time_ns=None, unattributed_gpu_ops=a["un"], unattributed_time_ns=un_t,
                  runtime_launched_gpu_ops=a["rt"], comm_gpu_ops=a["comm"], gpu_busy_ns=busy_by_device(cur, g),
                  gpu_span_ns=int(span), summed_kernel_time_ns=int(a["kt"]), delay_excluded_gpu_ops=a["dx"],
                  other_category_direct_ns=int(other), graph_kernels=a["gk"] if graphs else None,
                  graph_kernel_time_ns=int(a["gns"]) if graphs else None,
                  other_category_pct_of_categorised_gpu_time=pct(int(other), int(categorised), 4))


def instances(cur, g: Selection, subtree: bool = True) -> tuple[str, list]:
    """A subquery and its parameters: one row per launcher instance in the selection: inst, name_id (its launcher name,
    an id of the frame's names), kind, category, launcher_id, cpu_ns (host duration; all of its first GPU op by (start, id): the
    same on every GPU op of an instance where there is an op tree; without one an instance is a range, and it takes the
    category of its first GPU op), gpu_ops, direct_ns (|union| of its GPU ops), subtree_ns (cpu_ops with `subtree`:
    |union| of the selected GPU ops launched inside it; else direct_ns), attributed.
    The instances of several GPU ops are aggregated into temp table _ops_inst of `cur`; those of one GPU op (class 3:
    millions in an export without ranges) are their frame rows, read where the subquery is read, never copied."""
    sub = g.frame.subtree if subtree else None
    if sub is None:
        subtree_ns, sub_join = "i.direct_ns", ""
    else:
        # The launchers of the selection's cpu_op instances: an instance's kind is that of each of its GPU ops.
        pairs = (f"SELECT p.op_id, s.start_ns, s.end_ns FROM {sub} p JOIN {g.sql} s USING (gop_id) "
                 f"WHERE p.op_id IN (SELECT launcher_id FROM {g.sql} WHERE launcher_kind = 'cpu_op')")
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _ops_sub AS SELECT op_id, busy_ns FROM ({union_stats_sql(pairs, 'op_id')})",
                    g.params + g.params)
        subtree_ns = "CASE WHEN i.kind = 'cpu_op' THEN coalesce(s.busy_ns, 0) ELSE i.direct_ns END"
        sub_join = "LEFT JOIN _ops_sub s ON s.op_id = i.launcher_id"
    # Each instance's union is a table of its own, and its first GPU op a window, not an arg_min of a struct: in one
    # statement, with the aggregate, 2.5 M cpu_ops each launching a kernel ran out of a 400 MB limit (one run of one,
    # with the window two of three) instead of spilling; so, none of three. Faster too there: 10.7 s, not 14.0.
    direct, params = union_per_instance(g, "inst")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE _ops_direct AS {direct}", params)
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE _ops_inst AS
        SELECT i.* EXCLUDE (cpu_ns), ({subtree_ns})::BIGINT AS subtree_ns, i.cpu_ns, i.kind <> 'unattributed' AS attributed
        FROM (SELECT inst, f.name_id AS name_id, f.kind AS kind, f.category AS category, f.launcher_id AS launcher_id,
                     f.cpu_ns AS cpu_ns, gpu_ops, coalesce(u.busy_ns, 0)::BIGINT AS direct_ns
              FROM (SELECT inst, count(*) OVER (PARTITION BY inst) AS gpu_ops,
                           {{'name_id': lname_id, 'kind': launcher_kind, 'category': category,
                             'launcher_id': launcher_id, 'cpu_ns': launcher_dur_ns}} AS f
                    FROM {g.sql} WHERE NOT {ONE_OP}
                    QUALIFY row_number() OVER (PARTITION BY inst ORDER BY start_ns, gop_id) = 1) i
              LEFT JOIN _ops_direct u USING (inst)) i
        {sub_join}""", g.params)
    cur.execute("DROP TABLE temp.main._ops_direct")
    # A one-op instance is never a cpu_op's (class 3): its subtree is its direct time.
    return (f"""(SELECT * FROM _ops_inst UNION ALL
                 SELECT inst, lname_id, launcher_kind, category, launcher_id, 1, greatest(end_ns - start_ns, 0)::BIGINT AS d, d,
                        launcher_dur_ns, launcher_kind <> 'unattributed'
                 FROM {g.sql} WHERE {ONE_OP})""", list(g.params))


def _ranked(cur, grouped: str, params: list, order: str, limit: int, value: str = "direct_ns",
            attributed: str | None = "attributed") -> tuple[list[dict], int, int, int]:
    """The first `limit` rows of `grouped` in `order`, each with cum_attr (running Σ `value` over the attributed rows so
    far); the rows beyond the limit (count, Σ value) and Σ value of the attributed rows."""
    att = attributed or "true"
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE _ops_rows AS
        SELECT *, row_number() OVER (ORDER BY {order}) AS pos,
               sum(CASE WHEN {att} THEN {value} ELSE 0 END) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING) AS cum_attr
        FROM ({grouped})""", params)
    shown = cursor_dicts(cur, f"SELECT * FROM _ops_rows WHERE pos <= {int(limit)} ORDER BY pos")
    rem_n, rem_t, total = cur.execute(f"""SELECT count(*) FILTER (WHERE pos > {int(limit)}),
        coalesce(sum({value}) FILTER (WHERE pos > {int(limit)}), 0)::BIGINT,
        coalesce(sum({value}) FILTER (WHERE {att}), 0)::BIGINT FROM _ops_rows""").fetchone()
    return shown, int(rem_n), int(rem_t), int(total)


def _pcts(r: dict, denom: int) -> tuple[float | None, float | None]:
    """TraceLens Percentage and Cumulative Percentage of an attributed row (None for '<unattributed>')."""
    if not r["attributed"]:
        return None, None
    return pct(r["direct_ns"], float(denom), 4), pct(r["cum_attr"], float(denom), 4)


def _round(x: float, digits: int) -> float:
    """numpy's rounding (half to even of x * 10^digits), which the host time means have always used (not Python's
    round, which rounds the exact binary value: 14646.45 gives 14646.5 there, 14646.4 here)."""
    return float(np.round(x, digits))


def _nf(v) -> float | None:
    return None if v is None else float(v)


def _name_rows(cur, g, inst, totals, limit):
    grouped = f"""
        SELECT n.name, i.* EXCLUDE (name_id), d.* EXCLUDE (name_id, kind) FROM (
            SELECT name_id, kind, count(*) AS count, sum(direct_ns)::BIGINT AS direct_ns, sum(subtree_ns)::BIGINT AS subtree_ns,
                   sum(cpu_ns)::BIGINT AS cpu_ns, count(cpu_ns) AS cpu_n, bool_or(attributed) AS attributed
            FROM {inst[0]} WHERE name_id IS NOT NULL GROUP BY name_id, kind) i
        JOIN (SELECT lname_id AS name_id, launcher_kind AS kind, count(*) AS n_ops, median(launch_delay_ns) AS ld,
                     median(queue_free_delay_ns) AS qf, count(*) FILTER (WHERE delay_excluded) AS excluded,
                     count(*) FILTER (WHERE in_graph) AS gops, sum(graph_dur_ns)::BIGINT AS gns,
                     list_sort(list(DISTINCT category)) AS cats
              FROM {g.sql} WHERE lname_id IS NOT NULL GROUP BY ALL) d USING (name_id, kind)
        JOIN {g.frame.names} n ON n.id = i.name_id"""
    shown, rem_n, rem_t, denom = _ranked(cur, grouped, inst[1] + g.params, "direct_ns DESC, name, kind", limit)
    totals.attributed_kernel_time_ns = denom
    graphs = totals.graph_kernels is not None
    rows = []
    for r in shown:
        p, c = _pcts(r, denom)
        d, n = r["direct_ns"], r["cpu_n"]
        rows.append(OpRow(
            name=clip_name(r["name"]), launcher_kind=r["kind"], count=r["count"], gpu_op_count=r["n_ops"],
            total_direct_kernel_time_ns=d, total_direct_kernel_time_ms=round(d / 1e6, 6),
            total_subtree_kernel_time_ns=r["subtree_ns"], total_subtree_kernel_time_ms=round(r["subtree_ns"] / 1e6, 6),
            categories=list(r["cats"]), pct_of_attributed_kernel_time=p, cumulative_pct=c,
            pct_of_gpu_busy=pct(d, totals.gpu_busy_ns, 4), pct_of_gpu_span=pct(d, totals.gpu_span_ns, 4),
            cpu_time_ns=int(r["cpu_ns"]) if n else None, cpu_time_mean_ns=_round(r["cpu_ns"] / n, 1) if n else None,
            launch_delay_median_ns=_nf(r["ld"]), queue_free_delay_median_ns=_nf(r["qf"]), delay_excluded_gpu_ops=r["excluded"],
            graph_gpu_ops=r["gops"] if graphs else None, graph_kernel_time_ns=r["gns"] if graphs else None))
    return rows, rem_n, rem_t


def _category_rows(cur, g, inst, totals, limit):
    if g.frame.attribution == "cpu_op":
        grouped = f"""SELECT category, count(*) AS count, sum(direct_ns)::BIGINT AS direct_ns, bool_or(attributed) AS attributed
                      FROM {inst[0]} GROUP BY category"""
        params = inst[1]
    else:  # no op tree: each GPU op is classified by its kernel name; direct = union per (range instance, category)
        per, per_params = union_per_instance(g, "inst, category")
        grouped = f"""
            SELECT category, count AS count, direct_ns, attributed FROM (
                SELECT k.category, sum(coalesce(u.busy_ns, 0))::BIGINT AS direct_ns, bool_or(k.attributed) AS attributed
                FROM (SELECT inst, category, bool_or(launcher_kind <> 'unattributed') AS attributed FROM {g.sql} GROUP BY ALL) k
                LEFT JOIN ({per}) u USING (inst, category) GROUP BY k.category)
            JOIN (SELECT category, count(*) AS count FROM {g.sql} GROUP BY category) USING (category)"""
        params = g.params + per_params + g.params
    shown, rem_n, rem_t, denom = _ranked(cur, grouped, params, "direct_ns DESC, category", limit)
    totals.attributed_kernel_time_ns = denom
    rows = []
    for r in shown:
        p, c = _pcts(r, denom)
        d = r["direct_ns"]
        rows.append(CategoryRow(category=r["category"], count=r["count"], total_direct_kernel_time_ns=d,
                                total_direct_kernel_time_ms=round(d / 1e6, 6), pct_of_attributed_kernel_time=p, cumulative_pct=c,
                                pct_of_gpu_busy=pct(d, totals.gpu_busy_ns, 4), pct_of_gpu_span=pct(d, totals.gpu_span_ns, 4)))
    return rows, rem_n, rem_t


def _shape_rows(cur, g, inst, totals, limit):
    # The instances with their cpu_op's shapes (none for other launchers: launcher_id -1 is no row).
    shaped = f"""SELECT i.*, coalesce(c.input_dims, '') AS dims, coalesce(c.input_types, '') AS types
                 FROM {inst[0]} i LEFT JOIN cpu_ops c ON c.rowid = i.launcher_id WHERE i.name_id IS NOT NULL"""
    grouped = f"""
        SELECT n.name, s.* FROM (
            SELECT name_id, category, dims, types, count(*) AS count,
                   sum(direct_ns)::BIGINT AS direct_ns, avg(direct_ns) AS mean, median(direct_ns) AS median,
                   stddev_samp(direct_ns) AS std, min(direct_ns) AS mn, max(direct_ns) AS mx, sum(subtree_ns)::BIGINT AS subtree_ns,
                   bool_or(attributed) AS attributed
            FROM ({shaped}) GROUP BY ALL) s JOIN {g.frame.names} n ON n.id = s.name_id"""
    shown, rem_n, rem_t, denom = _ranked(cur, grouped, inst[1], "direct_ns DESC, name, category, dims, types", limit)
    totals.attributed_kernel_time_ns = denom
    # The GPU ops of every shown row in one join: per (row, kernel name, stream) count, Σ duration and first start.
    ks = cursor_dicts(cur, f"""
        SELECT pos, name, stream_id, count, total FROM (
            SELECT pos, n.name, stream_id, count, total,
                   row_number() OVER (PARTITION BY pos ORDER BY first, n.name, stream_id NULLS LAST) AS k
            FROM (SELECT r.pos, s.name_id, s.stream_id, count(*) AS count, sum(s.dur_ns)::BIGINT AS total, min(s.start_ns) AS first
                  FROM (SELECT * FROM _ops_rows WHERE pos <= {int(limit)}) r
                  JOIN ({shaped}) i ON i.name_id = r.name_id AND i.category = r.category AND i.dims = r.dims AND i.types = r.types
                  JOIN {g.sql} s USING (inst)
                  GROUP BY r.pos, s.name_id, s.stream_id) JOIN {g.frame.names} n ON n.id = name_id)
        WHERE k <= 12 ORDER BY pos, k""", inst[1] + g.params)
    by_row: dict[int, list] = {}
    for k in ks:
        by_row.setdefault(k["pos"], []).append({"name": clip_name(k["name"], 96), "stream": k["stream_id"], "count": k["count"],
                                                "total_ns": k["total"], "mean_ns": round(k["total"] / k["count"], 1)})
    rows = []
    for r in shown:
        p, c = _pcts(r, denom)
        rows.append(ShapeRow(name=clip_name(r["name"]), category=r["category"], input_dims=r["dims"] or None,
                             input_types=r["types"] or None, count=r["count"], direct_total_ns=r["direct_ns"],
                             direct_mean_ns=round(float(r["mean"]), 1), direct_median_ns=float(r["median"]),
                             direct_std_ns=None if r["std"] is None else round(float(r["std"]), 1),
                             direct_min_ns=r["mn"], direct_max_ns=r["mx"], subtree_total_ns=r["subtree_ns"],
                             pct_of_attributed_kernel_time=p, cumulative_pct=c, kernels=by_row.get(r["pos"], [])))
    return rows, rem_n, rem_t


def _kernel_rows(cur, g, totals, include_unlinked, limit):
    k = g.narrow("op = 'kernel'")
    denom = int(cur.execute(f"SELECT coalesce(sum(dur_ns), 0)::BIGINT FROM {k.sql}", k.params).fetchone()[0])
    if not include_unlinked:
        k = k.narrow("launcher_kind <> 'unattributed'")
    grouped = f"""
        SELECT category, ln.name AS launcher_name, kn.name AS name, stream_id, device_id, count, total, mean, mn, mx, gn FROM (
            SELECT category, lname_id, name_id, stream_id, device_id, count(*) AS count, sum(dur_ns)::BIGINT AS total,
                   avg(dur_ns) AS mean, min(dur_ns) AS mn, max(dur_ns) AS mx, count(*) FILTER (WHERE in_graph) AS gn
            FROM {k.sql} GROUP BY ALL)
        LEFT JOIN {g.frame.names} ln ON ln.id = lname_id LEFT JOIN {g.frame.names} kn ON kn.id = name_id"""
    shown, rem_n, rem_t, _ = _ranked(
        cur, grouped, k.params, "total DESC, launcher_name NULLS LAST, category NULLS LAST, name NULLS LAST, "
        "stream_id NULLS LAST, device_id NULLS LAST", limit, value="total", attributed=None)
    graphs = totals.graph_kernels is not None
    return [KernelRow(parent_category=r["category"], parent_op=clip_name(r["launcher_name"]), kernel_name=clip_name(r["name"]),
                      stream_id=r["stream_id"], device_id=r["device_id"], count=r["count"], total_ns=r["total"],
                      mean_ns=round(float(r["mean"]), 1), min_ns=r["mn"], max_ns=r["mx"], pct_of_kernel_time=pct(r["total"], denom, 4),
                      pct_of_gpu_span=pct(r["total"], totals.gpu_span_ns, 4), in_graph_count=r["gn"] if graphs else None)
            for r in shown], rem_n, rem_t
