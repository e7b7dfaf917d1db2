"""roofline: each op (or caller-rated kernel) against the roofs of the GPU it ran on, and what reaching a
fraction of its roof would save end to end.

Rows
  * PyTorch profiles (no `kernel_flops`): one row per op signature, straight from perf_summary (direct
    kernel time, analytic FLOPs / bytes per call of tools/perf_models; not re-derived here);
  * any format, with `kernel_flops={"<kernel name substring>": {"gflop_per_call", "bytes_per_call",
    "dtype"[, "unit"]}}`: one row per kernel name containing the substring (case-insensitive), time =
    Σ kernel durations; only kernels the caller supplies work for are rows. With `kernel_flops` the op rows
    are not produced (the two would count the same GPU time twice).

Roofs (datasheet peaks of tools/hardware for the profiled device; never guessed)
  * compute roof P, per row: 'matrix' models (gemm, gemm_scaled, sdpa_*, conv_*) use the tensor-core peak of
    the first input's dtype (bf16 -> tflops_bf16_matrix, fp16 -> tflops_fp16_matrix, fp8 -> tflops_fp8_matrix,
    int8 -> tops_int8_matrix, fp64 -> tflops_fp64_matrix) except fp32, which uses the vector tflops_fp32
    (PyTorch leaves TF32 off for matmul by default; pass dtype='tf32' to rate against tflops_tf32_matrix);
    'vector' models (elementwise, reduce, norm, softmax, ...) use the peak of the type the arithmetic runs in
    (at::opmath_type: fp32 for fp32/fp16/bf16/fp8 storage -> tflops_fp32; fp64 -> tflops_fp64). Integer vector
    ops have no datasheet peak: not rated. `dtype=` replaces the row dtype for every row.
  * memory roof B = memory_bandwidth_bytes_per_s (DRAM; perfect-cache bytes, as perf_summary).
  * ridge = P / B (FLOP/byte); AI = FLOPs / bytes; attainable = min(P, AI x B);
    bound = 'compute' if AI >= ridge else 'memory';
    roofline time = max(FLOPs / P, bytes / B) per call (= work / attainable);
    % of roof = roofline time / measured time x 100 (= achieved / attainable; TraceLens 'Pct Roofline');
    headroom = measured - roofline time. Ops with 0 FLOPs (copies) are rated against the memory roof only.
Differences from TraceLens: TraceLens rates against measured "max achievable" peaks from an arch JSON and
uses the vector_<dtype> peak for bf16/fp16 elementwise; here datasheet peaks, and the opmath (fp32) vector
peak for half-precision vector ops (the H100 datasheet gives no bf16/fp16 vector figure).

Impact: for each rated row and target t in 20/50/80 % of its binding roof, the time it would take
(roofline time / t) and the saving (measured - that, 0 when already at or above t), as % of the device's
GPU busy time (union of kernels + copies/sets) and of its GPU span (first GPU op start -> last end). It
assumes the saved time is not hidden by overlap: an upper bound on the end-to-end gain.
"""

from __future__ import annotations

import io
import math
from typing import Any, Mapping

import numpy as np
from pydantic import BaseModel, Field

from ..hardware import peaks_for_device
from ..model.errors import ProfileError
from ..model.trace import Trace
from ..perf_models.dtypes import normalize_dtype
from .common import ALL_TABLES, Window, clip_name, data_issue_notes, data_issues_field, pct, sig, resolve_selection, ToolResult
from .intervals import unions
from .requirements import require

TARGETS = (20, 50, 80)
PLOTS_HINT = "pip install 'gpuscope[plots]'"
PEAKS_HINT = ("pass peaks={'<device name as the profile writes it>': {'base': '<model key, e.g. h100-sxm5>'}} or its "
              "own figures ({'memory_bandwidth_bytes_per_s': ..., 'tflops_bf16_matrix': ..., ...}) per call, or put "
              "the same object in ~/.config/gpuscope/peaks.json ($GPUSCOPE_PEAKS)")
MATRIX_MODELS = ("gemm", "sdpa", "conv", "flash", "attention")

# normalized precision key -> (matrix field, vector field)
_PREC_FIELDS = {
    "bf16": ("tflops_bf16_matrix", "tflops_fp32"),
    "fp16": ("tflops_fp16_matrix", "tflops_fp32"),
    "fp32": ("tflops_fp32", "tflops_fp32"),
    "tf32": ("tflops_tf32_matrix", "tflops_fp32"),
    "fp64": ("tflops_fp64_matrix", "tflops_fp64"),
    "fp8": ("tflops_fp8_matrix", "tflops_fp32"),
    "fp4": ("tflops_fp4_matrix", "tflops_fp32"),
    "int8": ("tops_int8_matrix", None),
}
_ALIASES = {
    "bfloat16": "bf16", "bf16": "bf16", "half": "fp16", "float16": "fp16", "fp16": "fp16",
    "float": "fp32", "float32": "fp32", "fp32": "fp32", "tf32": "tf32", "double": "fp64", "float64": "fp64",
    "fp64": "fp64", "fp8": "fp8", "int8": "int8", "signed char": "int8", "unsigned char": "int8", "uint8": "int8",
    "fp4": "fp4", "float4_e2m1fn_x2": "fp4",
}


def precision(dtype: str | None) -> str | None:
    """'bf16' / 'fp16' / 'fp32' / 'tf32' / 'fp64' / 'fp8' / 'fp4' / 'int8' for a Kineto or short dtype name."""
    k = normalize_dtype(dtype)
    if not k:
        return None
    if k.startswith("float8") or k.startswith("fp8"):
        return "fp8"
    return _ALIASES.get(k)


class RoofRow(BaseModel):
    source: str = Field(description="'op' (PyTorch op signature, perf_summary) or 'kernel' (kernel name, caller-supplied work)")
    name: str = Field(description="op name or kernel name (clipped)")
    signature: dict[str, str | None] | None = Field(None, description="op rows: input_dims / input_types / concrete_inputs / input_strides")
    matched_by: str | None = Field(None, description="kernel rows: the kernel_flops key that matched")
    model: str | None = Field(description="perf model family ('gemm', 'elementwise_binary', ...) or 'caller'")
    unit: str | None = Field(description="'matrix' (tensor cores) or 'vector' compute roof")
    dtype: str | None = Field(description="precision the compute roof is chosen for (bf16, fp16, fp32, tf32, fp8, int8, fp64)")
    count: int = Field(description="calls / kernel executions")
    total_time_ns: int = Field(description="measured time, ns (op: Σ direct kernel time; kernel: Σ durations)")
    mean_time_ns: float = Field(description="measured time per call, ns")
    gflop_per_call: float | None = Field(description="work per call, 10^9 FLOPs")
    bytes_per_call: float | None = Field(description="DRAM bytes per call (perfect cache)")
    arithmetic_intensity: float | None = Field(description="FLOPs / byte")
    compute_roof_field: str | None = Field(description="peaks field used as compute roof, e.g. 'tflops_bf16_matrix'")
    compute_roof_tflops: float | None = Field(description="compute roof P, 10^12 FLOP/s")
    memory_roof_tb_per_s: float | None = Field(description="memory roof B, 10^12 bytes/s")
    ridge_flops_per_byte: float | None = Field(description="P / B, FLOP/byte")
    attainable_tflops: float | None = Field(description="min(P, AI x B), 10^12 FLOP/s")
    achieved_tflops: float | None = Field(description="FLOPs per call / mean time, 10^12 FLOP/s")
    achieved_tb_per_s: float | None = Field(description="bytes per call / mean time, 10^12 bytes/s")
    bound: str | None = Field(description="'compute' if AI >= ridge else 'memory' (0-FLOP ops: 'memory')")
    pct_of_roof: float | None = Field(description="roofline time / measured time, % (= achieved / attainable); the binding roof")
    roofline_time_ns: float | None = Field(description="per call: max(FLOPs / P, bytes / B), ns")
    headroom_ns: float | None = Field(description="per call: measured - roofline time, ns")
    total_headroom_ns: int | None = Field(description="total_time_ns - count x roofline_time_ns, rounded to ns")
    rated: bool = Field(description="false: not rated (no model, unknown bytes, no peak for the dtype); see why")
    why_not_rated: str | None = None
    notes: list[str] = Field(default_factory=list)


class Impact(BaseModel):
    name: str
    source: str
    row: int | None = Field(description="index of this op/kernel in `rows` (its signature is there); null when beyond limit")
    bound: str
    pct_of_roof_now: float
    total_time_ns: int = Field(description="measured total, ns")
    at_pct: dict[str, dict[str, int | float | None]] = Field(
        description="per target ('20','50','80' % of the binding roof): time_ns (total at that fraction), saving_ns "
                    "(measured - time_ns, 0 if already there), saving_pct_of_gpu_busy, saving_pct_of_gpu_span")


class RooflineResult(ToolResult):
    trace: str
    window: Window
    device_id: int
    device_name: str | None
    peaks_known: bool = Field(description="false: unknown GPU; nothing is rated (see message)")
    peaks_model: str | None = Field(None, description="peaks table entry the device matched, e.g. 'h100-sxm5'")
    peaks_confidence: str | None = None
    peaks_notes: list[str] = Field(default_factory=list, description="partition scaling, discrepancies with the profile")
    memory_bandwidth_bytes_per_s: float | None = None
    roof_choice: str = Field(description="how the compute roof is chosen per row")
    gpu_busy_ns: int = Field(description="union of kernels + copies/sets on the device, ns (impact denominator)")
    gpu_span_ns: int = Field(description="first GPU op start -> last GPU op end on the device, ns (impact denominator)")
    rows: list[RoofRow] = Field(description="rated rows by total headroom, then not-rated rows by time")
    impact: list[Impact] = Field(description="rated rows ranked by the saving at 80 % of the binding roof")
    not_rated: int = Field(description="rows not rated (listed in rows with why_not_rated)")
    not_rated_time_ns: int
    unmatched_kernel_flops: list[str] = Field(default_factory=list, description="kernel_flops keys matching no kernel")
    truncated: bool
    remainder_rows: int
    message: str | None = None
    plot_note: str | None = None
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def _pick_device(trace: Trace, device: int | None) -> int:
    if device is not None:
        return int(device)
    devs = [r[0] for r in trace.sql(
        "SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memops) ORDER BY 1")]
    if not devs:
        raise ProfileError(f"{trace.path.name} holds no GPU kernels or copies; there is nothing to rate.")
    if len(devs) > 1:
        raise ProfileError(f"the profile has GPU work on devices {devs}; a roofline is per GPU: pass device=<one of them>.")
    return int(devs[0])


def _unit(model: str | None, given: str | None = None) -> str:
    if given in ("matrix", "vector"):
        return given
    m = (model or "").lower()
    return "matrix" if any(m.startswith(p) or p in m for p in MATRIX_MODELS) else "vector"


def _first_dtype(types_json: str | None) -> str | None:
    import json
    try:
        types = json.loads(types_json or "[]")
    except ValueError:
        return None
    for t in types:
        if precision(t):
            return t
    return None


def _rate(row: dict, peaks, bw: float | None, dtype_override: str | None) -> RoofRow:
    """Fill the roofline figures of one row (dict with name, count, total, flops, bytes, model, unit, dtype)."""
    count, total = row["count"], row["total"]
    mean = total / count
    flops, nbytes = row.get("flops"), row.get("bytes")
    unit = _unit(row.get("model"), row.get("unit"))
    raw_dt = dtype_override or row.get("dtype")
    prec = precision(raw_dt)
    base = dict(source=row["source"], name=clip_name(row["name"]), signature=row.get("signature"),
                matched_by=row.get("matched_by"), model=row.get("model"), unit=unit, dtype=prec or raw_dt, count=count,
                total_time_ns=total, mean_time_ns=round(mean, 3),
                gflop_per_call=None if flops is None else flops / 1e9, bytes_per_call=nbytes,
                memory_roof_tb_per_s=None if bw is None else bw / 1e12, notes=list(row.get("notes", [])))
    secs = mean * 1e-9
    base["achieved_tflops"] = sig(flops / secs / 1e12) if flops is not None and secs > 0 else None
    base["achieved_tb_per_s"] = sig(nbytes / secs / 1e12) if nbytes is not None and secs > 0 else None
    base["arithmetic_intensity"] = sig(flops / nbytes) if flops is not None and nbytes else None

    def no(why: str) -> RoofRow:
        return RoofRow(**base, compute_roof_field=None, compute_roof_tflops=None, ridge_flops_per_byte=None,
                       attainable_tflops=None, bound=None, pct_of_roof=None, roofline_time_ns=None, headroom_ns=None,
                       total_headroom_ns=None, rated=False, why_not_rated=why)

    if flops is None:
        return no(row.get("why") or "no perf model for this op (time only)")
    if nbytes is None or nbytes <= 0:
        return no("bytes per call unknown (a dtype without an element size)")
    if peaks is None or not bw:
        return no("no peaks for this device")
    if mean <= 0:
        return no("zero measured time")
    field = peak = None
    if flops > 0:
        if prec is None:
            seen = raw_dt or (row.get("signature") or {}).get("input_types")
            return no(f"no compute roof: input dtype(s) {seen} have no datasheet {unit} peak (integer/bool vector ops are not rated)")
        fields = _PREC_FIELDS[prec]
        field = fields[0] if unit == "matrix" else fields[1]
        if field is None:
            return no(f"no compute roof: the datasheet gives no {unit} peak for {prec}")
        peak_v = peaks.value(field)
        if not peak_v:
            return no(f"no compute roof: peaks field {field} is not known for this GPU ({PEAKS_HINT})")
        peak = float(peak_v) * 1e12
        if unit == "vector" and prec in ("bf16", "fp16", "fp8", "fp4"):
            base["notes"].append(f"vector op on {prec} storage computes in fp32 (at::opmath_type): roof = tflops_fp32")
        if unit == "matrix" and prec == "fp32" and not dtype_override:
            base["notes"].append("fp32 GEMM rated against the vector fp32 peak (TF32 off by default); dtype='tf32' rates against tflops_tf32_matrix")
    t_mem = nbytes / bw
    t_cmp = flops / peak if peak else 0.0
    roof_s = max(t_mem, t_cmp)
    ai = flops / nbytes
    ridge = peak / bw if peak else None
    attain = min(peak, ai * bw) if peak else None
    bound = "compute" if (ridge is not None and ai >= ridge) else "memory"
    if flops == 0:
        base["notes"].append("0 FLOPs: rated against the memory roof only")
    head = mean - roof_s * 1e9
    if roof_s > secs:
        base["notes"].append("above the roof (> 100 %): the model's work overstates what reached DRAM (cache reuse) "
                             "or the peak is below what this device reached")
    return RoofRow(**base, compute_roof_field=field, compute_roof_tflops=None if peak is None else peak / 1e12,
                   ridge_flops_per_byte=sig(ridge), attainable_tflops=sig(attain / 1e12) if attain is not None else None,
                   bound=bound, pct_of_roof=sig(100 * roof_s / secs), roofline_time_ns=round(roof_s * 1e9, 3),
                   headroom_ns=round(head, 3), total_headroom_ns=round(total - roof_s * 1e9 * count), rated=True, why_not_rated=None)


def _op_rows(trace: Trace, device: int) -> list[dict]:
    from .perf_summary import perf_summary

    ps = perf_summary(trace, device=device, limit=500)
    out = []
    for x in ps.rows:
        out.append(dict(
            source="op", name=x.name, count=x.count, total=x.total_kernel_time_ns,
            signature={"input_dims": x.input_dims, "input_types": x.input_types,
                       "concrete_inputs": x.concrete_inputs, "input_strides": x.input_strides},
            model=x.model, flops=None if x.gflops_per_call is None else x.gflops_per_call * 1e9,
            bytes=x.bytes_per_call, dtype=_first_dtype(x.input_types), notes=x.notes))
    if ps.truncated:
        out.append(dict(source="op", name=f"({ps.remainder_rows} more signatures beyond 500)", count=ps.remainder_rows,
                        total=ps.remainder_kernel_time_ns, model=None, flops=None, bytes=None,
                        why="beyond perf_summary's 500-signature limit"))
    return out


def _kernel_rows(trace: Trace, device: int, kernel_flops: Mapping[str, Mapping[str, Any]]) -> tuple[list[dict], list[str]]:
    groups = trace.sql("SELECT name, count(*), sum(dur_ns)::BIGINT FROM kernels WHERE device_id = ? GROUP BY name", [device])
    rows, unmatched, owner = [], [], {}
    for key, spec in kernel_flops.items():
        if not isinstance(spec, Mapping):
            raise ProfileError(f"kernel_flops[{key!r}] must be an object {{'gflop_per_call', 'bytes_per_call', 'dtype'}}.")
        missing = [f for f in ("gflop_per_call", "bytes_per_call", "dtype") if spec.get(f) is None]
        if missing:
            raise ProfileError(f"kernel_flops[{key!r}] lacks {missing}: give gflop_per_call (10^9 FLOPs per launch), "
                               "bytes_per_call (DRAM bytes per launch) and dtype ('bf16', 'fp16', 'fp32', 'tf32', 'fp8', 'int8', 'fp64').")
        try:
            gf, by = float(spec["gflop_per_call"]), float(spec["bytes_per_call"])
        except (TypeError, ValueError):
            raise ProfileError(f"kernel_flops[{key!r}]: gflop_per_call and bytes_per_call must be numbers.") from None
        if not (math.isfinite(gf) and math.isfinite(by)) or gf < 0 or by <= 0:
            raise ProfileError(f"kernel_flops[{key!r}]: gflop_per_call must be a finite number >= 0 and bytes_per_call a finite number > 0.")
        unit = spec.get("unit")
        if unit is not None and unit not in ("matrix", "vector"):
            raise ProfileError(f"kernel_flops[{key!r}]: unit must be 'matrix' or 'vector'.")
        hits = [g for g in groups if key.lower() in (g[0] or "").lower()]
        if not hits:
            unmatched.append(key)
        for name, n, total in hits:
            if name in owner:
                raise ProfileError(f"kernel {clip_name(name, 120)!r} matches two kernel_flops keys ({owner[name]!r}, {key!r}); "
                                   "make the substrings specific to one kernel.")
            owner[name] = key
            rows.append(dict(source="kernel", name=name, matched_by=key, count=int(n), total=int(total), model="caller",
                             unit=unit or "matrix", flops=gf * 1e9, bytes=by, dtype=str(spec["dtype"]),
                             notes=[] if unit else ["unit not given: rated against the matrix (tensor-core) roof"]))
    return rows, unmatched


def roofline(
    trace: Trace,
    *,
    device: int | None = None,
    kernel_flops: Mapping[str, Mapping[str, Any]] | None = None,
    peaks: Mapping[str, Any] | None = None,
    dtype: str | None = None,
    limit: int = 8,
    plot: bool = False,
) -> RooflineResult:
    limit = max(1, min(int(limit), 500))
    if dtype is not None and precision(dtype) is None:
        raise ProfileError(f"dtype {dtype!r} is not one of bf16, fp16, fp32, tf32, fp64, fp8, fp4, int8.")
    require(trace, "roofline.kernel_flops" if kernel_flops else "roofline",
            "" if kernel_flops else "Or supply the work per kernel: kernel_flops={'<kernel name substring>': {'gflop_per_call': "
            "..., 'bytes_per_call': ..., 'dtype': 'bf16'}} (top_kernels lists the kernel names).")
    dev = _pick_device(trace, device)
    _, window = resolve_selection(trace, dev, None, None, None)
    name = dict(trace.sql("SELECT device_id, name FROM devices")).get(dev)
    pk = peaks_for_device(trace, dev, overrides=peaks or None)  # the loader validates it (ProfileError on a non-object)
    bw = float(pk.value("memory_bandwidth_bytes_per_s")) if pk is not None and pk.value("memory_bandwidth_bytes_per_s") else None

    u = unions(trace, "SELECT device_id, start_ns, end_ns FROM kernels WHERE device_id = ? UNION ALL "
                      "SELECT device_id, start_ns, end_ns FROM memops WHERE device_id = ?", [dev, dev], ("device_id",))
    uu = u.get((dev,))
    busy, span = (uu.busy_ns, uu.span_ns) if uu else (0, 0)

    unmatched: list[str] = []
    if kernel_flops:
        raw, unmatched = _kernel_rows(trace, dev, kernel_flops)
        if not raw:
            raise ProfileError(f"no kernel on device {dev} matches any kernel_flops key {list(kernel_flops)}; "
                               "top_kernels lists the kernel names (match is a case-insensitive substring).")
    else:
        raw = _op_rows(trace, dev)
    rated_rows = [_rate(r, pk, bw, dtype) for r in raw]
    rated = sorted([r for r in rated_rows if r.rated], key=lambda r: (-(r.total_headroom_ns or 0), r.name))
    unrated = sorted([r for r in rated_rows if not r.rated], key=lambda r: (-r.total_time_ns, r.name))

    impact = []
    for index, r in enumerate(rated):
        at = {}
        for t in TARGETS:
            tt = r.count * r.roofline_time_ns / (t / 100)
            sv = max(0.0, r.total_time_ns - tt)
            at[str(t)] = {"time_ns": round(tt), "saving_ns": round(sv),
                          "saving_pct_of_gpu_busy": pct(sv, busy, 3), "saving_pct_of_gpu_span": pct(sv, span, 3)}
        impact.append(Impact(name=r.name, source=r.source, row=index if index < limit else None, bound=r.bound,
                             pct_of_roof_now=r.pct_of_roof, total_time_ns=r.total_time_ns, at_pct=at))
    impact.sort(key=lambda i: (-(i.at_pct["80"]["saving_ns"] or 0), i.name))

    all_rows = rated + unrated
    shown = all_rows[:limit]
    message = None
    if pk is None:
        message = (f"unknown GPU: no peaks for device {dev} ({name!r}); nothing is rated (no guessing). To rate it, "
                   f"{PEAKS_HINT}.")
    res = RooflineResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), window=window, device_id=dev, device_name=name, peaks_known=pk is not None,
        peaks_model=pk.entry.key if pk else None, peaks_confidence=pk.confidence if pk else None,
        peaks_notes=(list(pk.notes) + list(pk.discrepancies)) if pk else [],
        memory_bandwidth_bytes_per_s=bw,
        roof_choice=("matrix models (gemm, sdpa, conv; caller kernels unless unit='vector'): tensor-core peak of the "
                     "input dtype (fp32: vector tflops_fp32, TF32 off by default); vector models: tflops_fp32 for "
                     "fp32/bf16/fp16/fp8 storage (opmath fp32), tflops_fp64 for fp64; memory roof: datasheet DRAM bandwidth"
                     + (f"; dtype={dtype!r} forced for every row" if dtype else "")),
        gpu_busy_ns=int(busy), gpu_span_ns=int(span), rows=shown, impact=impact[:limit],
        not_rated=len(unrated), not_rated_time_ns=sum(r.total_time_ns for r in unrated),
        unmatched_kernel_flops=unmatched, truncated=len(all_rows) > limit, remainder_rows=max(0, len(all_rows) - limit),
        message=message,
        hint=(f"{len(all_rows) - limit} more rows beyond limit={limit}; raise limit (max 500)" if len(all_rows) > limit else None))
    if plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            res.plot_note = f"plot needs matplotlib: {PLOTS_HINT}"
        else:
            res.plot_note = "PNG from roofline_plot(result)" if rated else "nothing rated: no plot"
    return res


def roofline_plot(result: RooflineResult) -> bytes | None:
    """PNG of the rated rows on the device's roofs (log-log), or None when matplotlib is absent or nothing is rated
    (result.plot_note says which)."""
    rated = [r for r in result.rows if r.rated and (r.arithmetic_intensity or 0) > 0 and r.achieved_tflops]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        result.plot_note = f"plot needs matplotlib: {PLOTS_HINT}"
        return None
    if not rated or not result.memory_bandwidth_bytes_per_s:
        result.plot_note = "nothing rated: no plot"
        return None
    bw = result.memory_bandwidth_bytes_per_s / 1e12
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=100)
    ais = [r.arithmetic_intensity for r in rated]
    lo, hi = min(ais + [r.ridge_flops_per_byte or 1 for r in rated]) / 4, max(ais + [r.ridge_flops_per_byte or 1 for r in rated]) * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    for field, peak in sorted({(r.compute_roof_field, r.compute_roof_tflops) for r in rated if r.compute_roof_tflops}):
        ax.plot(xs, np.minimum(peak, xs * bw), label=f"{field} {peak:g} TFLOP/s, {bw:g} TB/s")
    for r in rated:
        ax.scatter([r.arithmetic_intensity], [r.achieved_tflops], s=20 + 200 * r.total_time_ns / max(1, max(x.total_time_ns for x in rated)))
        ax.annotate(r.name[:40], (r.arithmetic_intensity, r.achieved_tflops), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"roofline: device {result.device_id} {result.device_name or ''} ({result.peaks_model})")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
