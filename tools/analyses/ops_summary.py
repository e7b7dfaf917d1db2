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
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import ALL_TABLES, Window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .graph_summary import graph_kernel_count, graph_rowids
from .op_tree import launchers, union_ns
from .projection import innermost_ranges
from .requirements import require

UNATTRIBUTED = "<unattributed>"

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
        description="median of GPU start − max(call end, previous op end on the stream), ns (launch latency without queueing), "
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
    attributed_kernel_time_ns: int = Field(description="Σ direct time of all attributed rows (Percentage denominator), ns")
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

def selected_frame(trace: Trace, device: int | None, start_ns: int | None, end_ns: int | None):
    """The attributed GPU ops (see _frame) on `device` that start inside [start_ns, end_ns)."""
    g, sub, attribution = _frame(trace)
    m = np.ones(len(g), dtype=bool)
    if device is not None:
        m &= (g["device_id"] == device).to_numpy()
    if start_ns is not None:
        m &= (g["start_ns"] >= start_ns).to_numpy()
    if end_ns is not None:
        m &= (g["start_ns"] < end_ns).to_numpy()
    g = g[m]
    if g.empty:
        raise ProfileError("no GPU op starts in the selection (device / time window). Widen it; trace_info lists devices and spans.")
    return g, sub, attribution


def _frame(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Every GPU op with its launcher instance (`inst`), launcher name/kind/category; memoized."""
    return trace.memo(("ops_summary.frame",), lambda: _build_frame(trace))


def _build_frame(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    L = launchers(trace)
    g = L.gops.copy(deep=False)  # copy-on-write: the memoized launchers stay as they are, no column is duplicated
    has_ops = trace.count("cpu_ops") > 0
    g["launcher_kind"] = g["launcher_kind"].astype(object)
    if not has_ops:
        attribution = "range"
        rng = innermost_ranges(trace)
        g = g.merge(rng, how="left", on="gop_id")
        inr = g["rid"].notna()
        g.loc[inr, "launcher_kind"] = "range"
        g.loc[inr, "launcher_name"] = g.loc[inr, "range_name"]
        g.loc[inr, "launcher_start_ns"] = g.loc[inr, "range_start_ns"]
        g.loc[inr, "launcher_end_ns"] = g.loc[inr, "range_end_ns"]
        k = g["launcher_kind"].isin(["runtime", "graph"])
        g.loc[k, "launcher_kind"] = "kernel"
        short = pd.DataFrame(trace.sql("SELECT rowid * 2, short_name FROM kernels"), columns=["gop_id", "short_name"])
        short = g.loc[k, ["gop_id"]].merge(short, how="left", on="gop_id")["short_name"].to_numpy()
        g.loc[k, "launcher_name"] = np.where(pd.isna(short), g.loc[k, "name"].to_numpy(), short)
        g.loc[k, "launcher_start_ns"] = np.nan
        g.loc[k, "launcher_end_ns"] = np.nan
    else:
        attribution = "cpu_op"
        g["rid"] = np.nan
    g["inst"] = _instance_ids(g)
    kind = g["launcher_kind"].to_numpy()
    g.loc[kind == "unlinked", "launcher_name"] = UNATTRIBUTED
    g.loc[kind == "unlinked", "launcher_kind"] = "unattributed"
    g["category"] = _op_categories(g) if has_ops else _kernel_categories(g)
    _delays(g)
    g["in_graph"] = False
    if graph_kernel_count(trace):
        g["in_graph"] = (g["op"] == "kernel").to_numpy() & np.isin(g["gop_id"].to_numpy(), np.asarray(graph_rowids(trace), dtype=np.int64) * 2)
    g["graph_dur_ns"] = np.where(g["in_graph"], g["dur_ns"], 0)
    # Every call groups, filters and sorts by these: as categoricals (categories in sorted order, so a sort by
    # them is a sort by the text) they are integer codes, not hashed strings, once per profile.
    for col in ("launcher_name", "launcher_kind", "category", "name", "op"):
        g[col] = pd.Categorical(g[col])
    sub = L.subtree if has_ops else pd.DataFrame({"op_id": pd.Series(dtype="int64"), "gop_id": pd.Series(dtype="int64")})
    return g, sub, attribution


def _instance_ids(g: pd.DataFrame) -> np.ndarray:
    """One integer per launcher instance, numbered in order of first appearance: the cpu_op (cpu_ops.rowid), the
    range (rid), the launching call (pid, thread, start: a graph launch owns all its GPU ops), else the GPU op
    itself. Built arithmetically: class in the top bits, the id below (ids are row numbers, far below 2^60)."""
    kind = g["launcher_kind"].to_numpy()
    call = np.isin(kind, ["runtime", "graph"])
    calls = np.zeros(len(g), dtype=np.int64)
    if call.any():
        calls[call] = g.loc[call].groupby(["pid", "call_tid", "call_start_ns"], sort=False, dropna=False).ngroup().to_numpy()
    key = np.where(kind == "cpu_op", g["launcher_id"].to_numpy(dtype=np.int64),
                   np.where(kind == "range", (1 << 60) + g["rid"].fillna(0).to_numpy().astype(np.int64),
                            np.where(call, (2 << 60) + calls, (3 << 60) + g["gop_id"].to_numpy(dtype=np.int64))))
    return pd.factorize(key)[0]


def _per_distinct(cols: list[np.ndarray], fn) -> np.ndarray:
    """fn(*values) for every row of `cols`, called once per distinct combination (categories repeat: a few hundred
    distinct ops or kernel names among millions of rows) and mapped back by integer codes."""
    codes, uniques = zip(*(pd.factorize(c, use_na_sentinel=False) for c in cols))
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, u in zip(codes, uniques):
        key = key * len(u) + c
    combo, first, back = np.unique(key, return_index=True, return_inverse=True)
    values = np.array([fn(*(col[i] for col in cols)) for i in first], dtype=object)
    return values[back]


def _op_categories(g: pd.DataFrame) -> np.ndarray:
    """Category of every GPU op's launcher instance (op_category of its name, the name of its first GPU op by
    (start, id) and whether all its GPU ops are communication), per GPU op."""
    inst = g["inst"].to_numpy()
    order = np.lexsort((g["gop_id"].to_numpy(), g["start_ns"].to_numpy()))
    first = order[np.unique(inst[order], return_index=True)[1]]  # per instance (0..n-1), its earliest GPU op
    all_comm = np.bincount(inst, weights=~g["is_comm"].to_numpy(dtype=bool), minlength=len(first)) == 0
    kind = g["launcher_kind"].to_numpy(dtype=object)[first]

    def cat(name, first_kernel, comm, kd):
        return "unattributed" if kd == "unattributed" else kd if kd in ("runtime", "graph") else op_category(name, first_kernel, comm)
    cats = _per_distinct([g["launcher_name"].to_numpy(dtype=object)[first], g["name"].to_numpy(dtype=object)[first],
                          all_comm, kind], cat)
    return cats[inst]


def _kernel_categories(g: pd.DataFrame) -> np.ndarray:
    return _per_distinct([g["name"].to_numpy(dtype=object), g["is_comm"].to_numpy(dtype=bool), g["op"].to_numpy(dtype=object),
                          g["whole_graph"].to_numpy(dtype=bool)], kernel_category)


def _delays(g: pd.DataFrame) -> None:
    """launch_delay_ns, queue_free_delay_ns (NA where not measurable) and delay_excluded per GPU op.

    Integer arithmetic: Kineto traces before 2024 hold absolute epoch ns (~1.6e18), past the 2^53 up to which
    float64 keeps every integer, so a float difference is off by up to 256 ns. A GPU op that starts before its
    call returned (the host was inside a synchronous call: a pageable copy, a launch that blocked), or before
    the previous op on its stream ended, has a negative difference, which is no delay: it is left out."""
    start, call_end = g["start_ns"].astype("Int64"), g["call_end_ns"].astype("Int64")
    prev_end = g["prev_end_ns"].astype("Int64")
    launch = start - call_end
    queue_free = start - call_end.mask((prev_end > call_end).fillna(False), prev_end)
    bad = (launch < 0).fillna(False) | (queue_free < 0).fillna(False)
    g["delay_excluded"] = bad.to_numpy(dtype=bool)
    g["launch_delay_ns"] = launch.mask(bad)
    g["queue_free_delay_ns"] = queue_free.mask(bad)


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
    g, sub, attribution = selected_frame(trace, device, start_ns, end_ns)
    totals = _totals(g, graph_kernel_count(trace) > 0)
    if name_contains:
        g = g[g["launcher_name"].str.contains(name_contains, case=False, regex=False)]
        if g.empty:
            raise ProfileError(f"no launcher name contains {name_contains!r} in the selection; call ops_summary without it to see the names.")
    filters = {"device": device, "include_unlinked": include_unlinked, "name_contains": name_contains}
    if group_by == "kernels":
        rows, rem_n, rem_t = _kernel_rows(g, totals, include_unlinked, limit)
    else:
        if not include_unlinked:
            g = g[g["launcher_kind"] != "unattributed"]
        inst = _instances(g, sub)
        if group_by == "name":
            rows, rem_n, rem_t = _name_rows(g, inst, totals, limit)
        elif group_by == "category":
            rows, rem_n, rem_t = _category_rows(g, inst, totals, attribution, limit)
        else:
            rows, rem_n, rem_t = _shape_rows(g, inst, totals, limit)
    truncated = rem_n > 0
    return OpsSummaryResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), group_by=group_by, attribution=attribution, window=window, filters=filters,
        totals=totals, rows=rows, truncated=truncated, remainder_rows=rem_n, remainder_direct_ns=rem_t,
        hint=(f"{rem_n} more rows beyond limit={limit}; raise limit (max 500) or filter with name_contains/device/time window"
              if truncated else None))


def _totals(g: pd.DataFrame, graphs: bool) -> Totals:
    busy = union_ns(g["device_id"].to_numpy(), g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
    span = g.groupby("device_id").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    per, cat, kind = _per_instance_category(g)
    categorised = per[kind != "unattributed"]
    other = int(per[cat == "other"].sum())
    un = g[g["launcher_kind"] == "unattributed"]
    un_t = int(union_ns(np.zeros(len(un), dtype=np.int64), un["start_ns"].to_numpy(), un["end_ns"].to_numpy()).sum()) if len(un) else 0
    return Totals(gpu_ops=len(g), attributed_kernel_time_ns=0, unattributed_gpu_ops=len(un), unattributed_time_ns=un_t,
                  runtime_launched_gpu_ops=int(g["launcher_kind"].isin(["runtime", "graph"]).sum()),
                  comm_gpu_ops=int(g["is_comm"].sum()), gpu_busy_ns=int(busy.sum()),
                  gpu_span_ns=int((span["hi"] - span["lo"]).sum()),
                  summed_kernel_time_ns=int(g.loc[g["op"] == "kernel", "dur_ns"].sum()),
                  delay_excluded_gpu_ops=int(g["delay_excluded"].sum()), other_category_direct_ns=other,
                  graph_kernels=int(g["in_graph"].sum()) if graphs else None,
                  graph_kernel_time_ns=int(g["graph_dur_ns"].sum()) if graphs else None,
                  other_category_pct_of_categorised_gpu_time=pct(other, int(categorised.sum()), 4))


def _per_instance_category(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (launcher instance, category) present in `g`: |union of its GPU ops|, the category and the launcher kind.
    The key is integer: instance * number of categories + category code."""
    codes, cats = pd.factorize(g["category"])
    key = g["inst"].to_numpy(dtype=np.int64) * len(cats) + codes
    per = union_ns(key, g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
    first = np.unique(key, return_index=True)[1]  # same order as per's index (sorted keys)
    return per.to_numpy(), np.asarray(cats, dtype=object)[codes[first]], g["launcher_kind"].to_numpy(dtype=object)[first]


def _instances(g: pd.DataFrame, sub: pd.DataFrame) -> pd.DataFrame:
    """One row per launcher instance: name, kind, category, direct/subtree time, host duration, op count."""
    ids = g["inst"].to_numpy()
    direct = union_ns(ids, g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
    # The launcher columns are the same on every GPU op of an instance (category too where there is an op tree;
    # without one an instance is a range, and it takes the category of its first GPU op in frame order).
    uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
    cols = {"name": "launcher_name", "kind": "launcher_kind", "category": "category", "launcher_id": "launcher_id",
            "lstart": "launcher_start_ns", "lend": "launcher_end_ns", "input_dims": "input_dims", "input_types": "input_types"}
    inst = g[list(cols.values())].iloc[first].rename(columns={c: k for k, c in cols.items()})  # dtypes kept
    inst.index = pd.Index(uniq, name="inst")
    inst["gpu_ops"] = counts
    inst["direct_ns"] = direct.to_numpy(dtype=np.int64)
    inst["subtree_ns"] = inst["direct_ns"]
    ops = inst[inst["kind"] == "cpu_op"]
    if len(ops) and len(sub):
        pairs = sub[sub["op_id"].isin(ops["launcher_id"])].merge(g[["gop_id", "start_ns", "end_ns"]], on="gop_id")
        st = union_ns(pairs["op_id"].to_numpy(), pairs["start_ns"].to_numpy(), pairs["end_ns"].to_numpy())
        inst.loc[ops.index, "subtree_ns"] = st.reindex(ops["launcher_id"]).fillna(0).astype("int64").to_numpy()
    inst["cpu_ns"] = inst["lend"] - inst["lstart"]
    inst["attributed"] = inst["kind"] != "unattributed"
    return inst


def _pcts(direct: pd.Series, attributed: pd.Series) -> tuple[list, list]:
    denom = float(direct[attributed].sum())
    out, cum, run = [], [], 0.0
    for d, a in zip(direct, attributed):
        if not a:
            out.append(None)
            cum.append(None)
            continue
        run += float(d)
        out.append(pct(d, denom, 4))
        cum.append(pct(run, denom, 4))
    return out, cum


def _nn(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else v


def _finish(df: pd.DataFrame, limit: int, value: str = "direct_ns") -> tuple[pd.DataFrame, int, int]:
    shown, rest = df.iloc[:limit], df.iloc[limit:]
    return shown, len(rest), int(rest[value].sum())


def _name_rows(g, inst, totals, limit):
    delays = g.groupby(["launcher_name", "launcher_kind"]).agg(
        n_ops=("gop_id", "size"), ld=("launch_delay_ns", "median"), qf=("queue_free_delay_ns", "median"),
        excluded=("delay_excluded", "sum"), gops=("in_graph", "sum"), gns=("graph_dur_ns", "sum"))
    # sorted set of categories per row, from the distinct (name, kind, category) triples (a few per name)
    trip = g[["launcher_name", "launcher_kind", "category"]].drop_duplicates().sort_values("category", kind="stable")
    delays["cats"] = trip.groupby(["launcher_name", "launcher_kind"])["category"].agg(list)
    df = inst.groupby(["name", "kind"]).agg(
        count=("direct_ns", "size"), direct_ns=("direct_ns", "sum"), subtree_ns=("subtree_ns", "sum"),
        cpu_ns=("cpu_ns", "sum"), cpu_n=("cpu_ns", "count"),
        attributed=("attributed", "first"))
    df = df.join(delays.rename_axis(["name", "kind"]))
    df = df.reset_index().sort_values(["direct_ns", "name"], ascending=[False, True], kind="stable")
    totals.attributed_kernel_time_ns = int(df.loc[df["attributed"], "direct_ns"].sum())
    p, c = _pcts(df["direct_ns"], df["attributed"])
    df["p"], df["c"] = p, c
    shown, rem_n, rem_t = _finish(df, limit)
    graphs = totals.graph_kernels is not None
    rows = [OpRow(
        name=clip_name(r.name), launcher_kind=r.kind, count=int(r.count), gpu_op_count=int(r.n_ops),
        total_direct_kernel_time_ns=int(r.direct_ns), total_direct_kernel_time_ms=round(r.direct_ns / 1e6, 6),
        total_subtree_kernel_time_ns=int(r.subtree_ns), total_subtree_kernel_time_ms=round(r.subtree_ns / 1e6, 6),
        categories=list(r.cats), pct_of_attributed_kernel_time=_nn(r.p), cumulative_pct=_nn(r.c),
        pct_of_gpu_busy=pct(r.direct_ns, totals.gpu_busy_ns, 4), pct_of_gpu_span=pct(r.direct_ns, totals.gpu_span_ns, 4),
        cpu_time_ns=int(r.cpu_ns) if r.cpu_n else None, cpu_time_mean_ns=round(r.cpu_ns / r.cpu_n, 1) if r.cpu_n else None,
        launch_delay_median_ns=None if pd.isna(r.ld) else float(r.ld),
        queue_free_delay_median_ns=None if pd.isna(r.qf) else float(r.qf), delay_excluded_gpu_ops=int(r.excluded),
        graph_gpu_ops=int(r.gops) if graphs else None, graph_kernel_time_ns=int(r.gns) if graphs else None,
    ) for r in shown.itertuples()]
    return rows, rem_n, rem_t


def _category_rows(g, inst, totals, attribution, limit):
    if attribution == "cpu_op":
        df = inst.groupby("category").agg(count=("direct_ns", "size"), direct_ns=("direct_ns", "sum"),
                                          attributed=("attributed", "first"))
    else:  # no op tree: each GPU op is classified by its kernel name; direct = union per (range instance, category)
        u, cat, kind = _per_instance_category(g)
        per = pd.DataFrame({"category": cat, "direct_ns": u, "attributed": kind != "unattributed"})
        df = per.groupby("category").agg(direct_ns=("direct_ns", "sum"), attributed=("attributed", "any"))
        df["count"] = g.groupby("category").size()
    df = df.reset_index().sort_values(["direct_ns", "category"], ascending=[False, True], kind="stable")
    totals.attributed_kernel_time_ns = int(df.loc[df["attributed"], "direct_ns"].sum())
    p, c = _pcts(df["direct_ns"], df["attributed"])
    df["p"], df["c"] = p, c
    shown, rem_n, rem_t = _finish(df, limit)
    return [CategoryRow(category=r.category, count=int(r.count), total_direct_kernel_time_ns=int(r.direct_ns),
                        total_direct_kernel_time_ms=round(r.direct_ns / 1e6, 6), pct_of_attributed_kernel_time=_nn(r.p),
                        cumulative_pct=_nn(r.c), pct_of_gpu_busy=pct(r.direct_ns, totals.gpu_busy_ns, 4),
                        pct_of_gpu_span=pct(r.direct_ns, totals.gpu_span_ns, 4)) for r in shown.itertuples()], rem_n, rem_t


def _shape_rows(g, inst, totals, limit):
    inst = inst.copy()
    inst["dims"] = inst["input_dims"].fillna("")
    inst["types"] = inst["input_types"].fillna("")
    keys = ["name", "category", "dims", "types"]
    df = inst.reset_index().groupby(keys).agg(
        count=("direct_ns", "size"), direct_ns=("direct_ns", "sum"), mean=("direct_ns", "mean"),
        median=("direct_ns", "median"), std=("direct_ns", "std"), mn=("direct_ns", "min"), mx=("direct_ns", "max"),
        subtree_ns=("subtree_ns", "sum"), attributed=("attributed", "first"), insts=("inst", list))
    df = df.reset_index().sort_values(["direct_ns", "name"], ascending=[False, True], kind="stable")
    totals.attributed_kernel_time_ns = int(df.loc[df["attributed"], "direct_ns"].sum())
    p, c = _pcts(df["direct_ns"], df["attributed"])
    df["p"], df["c"] = p, c
    shown, rem_n, rem_t = _finish(df, limit)
    # The GPU ops of every shown row in one join (a per-row isin over all ops is quadratic: seconds on big traces).
    shown = shown.reset_index(drop=True)
    members = shown[["insts"]].explode("insts").reset_index().rename(columns={"index": "row", "insts": "inst"})
    members["inst"] = members["inst"].astype(g["inst"].dtype)
    ks = (g.merge(members, on="inst").groupby(["row", "name", "stream_id"], dropna=False)
          .agg(count=("dur_ns", "size"), total=("dur_ns", "sum"), first=("start_ns", "min")).reset_index()
          .sort_values(["row", "first", "name"], kind="stable"))
    by_row: dict[int, list] = {}
    for k in ks.itertuples():
        if len(by_row.setdefault(k.row, [])) < 12:
            by_row[k.row].append({"name": clip_name(k.name, 96), "stream": None if pd.isna(k.stream_id) else int(k.stream_id),
                                  "count": int(k.count), "total_ns": int(k.total), "mean_ns": round(k.total / k.count, 1)})
    rows = []
    for r in shown.itertuples():
        kernels = by_row.get(r.Index, [])
        rows.append(ShapeRow(name=clip_name(r.name), category=r.category, input_dims=r.dims or None, input_types=r.types or None,
                             count=int(r.count), direct_total_ns=int(r.direct_ns), direct_mean_ns=round(float(r.mean), 1),
                             direct_median_ns=float(r.median), direct_std_ns=None if pd.isna(r.std) else round(float(r.std), 1),
                             direct_min_ns=int(r.mn), direct_max_ns=int(r.mx), subtree_total_ns=int(r.subtree_ns),
                             pct_of_attributed_kernel_time=_nn(r.p), cumulative_pct=_nn(r.c), kernels=kernels))
    return rows, rem_n, rem_t


def _kernel_rows(g, totals, include_unlinked, limit):
    k = g[g["op"] == "kernel"]
    denom = int(k["dur_ns"].sum())
    if not include_unlinked:
        k = k[k["launcher_kind"] != "unattributed"]
    df = k.groupby(["category", "launcher_name", "name", "stream_id", "device_id"], dropna=False).agg(
        count=("dur_ns", "size"), total=("dur_ns", "sum"), mean=("dur_ns", "mean"), mn=("dur_ns", "min"),
        mx=("dur_ns", "max"), gn=("in_graph", "sum")).reset_index().sort_values(["total", "launcher_name"], ascending=[False, True], kind="stable")
    shown, rem_n, rem_t = _finish(df, limit, "total")
    return [KernelRow(parent_category=r.category, parent_op=clip_name(r.launcher_name), kernel_name=clip_name(r.name),
                      stream_id=None if pd.isna(r.stream_id) else int(r.stream_id), device_id=int(r.device_id),
                      count=int(r.count), total_ns=int(r.total), mean_ns=round(float(r.mean), 1), min_ns=int(r.mn),
                      max_ns=int(r.mx), pct_of_kernel_time=pct(r.total, denom, 4),
                      pct_of_gpu_span=pct(r.total, totals.gpu_span_ns, 4),
                      in_graph_count=int(r.gn) if totals.graph_kernels is not None else None)
            for r in shown.itertuples()], rem_n, rem_t
