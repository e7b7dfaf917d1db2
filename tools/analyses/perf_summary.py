"""perf_summary: achieved FLOP/s and bytes/s per PyTorch op signature (TraceLens `unified_perf_summary`).

Rows are op signatures: cpu_op name + Input Dims + Input type + Concrete Inputs + Input Strides (TraceLens's
grouping; strides are part of it because a layout change changes the kernel).
GPU work is attributed as in ops_summary.py (op_tree.py launchers, reused — not re-implemented): each
cpu_op instance owns the GPU ops (kernels, copies, sets) launched directly inside it, and its time is
  direct kernel time = |union| of those GPU ops, ns (TraceLens 'Kernel Time (µs)': direct, union).
The work per call comes from the analytic models in tools/perf_models (`model_for`): FLOPs (a
multiply-add is 2) and bytes read + written once each (perfect cache), each tensor with its own dtype.
  achieved TFLOP/s = flops per call / mean direct kernel time  (= Σ flops / Σ time of the signature);
  achieved TB/s    = bytes per call / mean direct kernel time;
  arithmetic intensity = flops / bytes, FLOP/byte.
Bytes are reported in bytes and in MB = 10^6 bytes (TraceLens's 'Data Moved (MB)' is MiB = 2^20 bytes).

Differences from TraceLens (documented; pinned in tests/analyses/test_perf_summary.py):
  * TraceLens's 'TFLOPS/s_mean' is the mean over calls of per-call flops / per-call time; here the rate is
    flops per call / mean time (time-weighted; the two differ by well under 1 % on steady ops);
  * the model differences of tools/perf_models (causal SDPA counts N(N+1)/2 score pairs, copies do 0 FLOPs,
    `aten::mean` dims parsed, layer norm statistics per row);
  * GPU time belongs to the innermost cpu_op that launched it (direct time), so composite wrappers TraceLens
    models with their subtree time (`aten::_scaled_dot_product_flash_attention`, `aten::layer_norm`) appear as
    their leaves (`aten::_flash_attention_forward`, `aten::native_layer_norm`) with the same kernel time;
  * GPU ops launched outside any cpu_op (runtime/graph launches, unlinked) are not rows; they are counted in
    the summary (`not_op_attributed_*`);
  * times are integer ns from the trace (TraceLens carries float µs).
"""

from __future__ import annotations

import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from ..perf_models import model_for
from .common import (ALL_TABLES, CONTAINS_SQL, Window, clip_name, contains_pattern, data_issue_notes, data_issues_field, pct, sig,
                     resolve_selection, ToolResult)
from .ops_summary import busy_by_device, call_cursor, instances, selected_frame
from .requirements import require

MB = 1_000_000  # 10^6 bytes


class PerfRow(BaseModel):
    name: str = Field(description="cpu_op name, e.g. 'aten::mm'")
    category: str = Field(description="op category (ops_summary categories: GEMM, SDPA_fwd, elementwise, reduce, ...)")
    input_dims: str | None = Field(description="JSON list of input shapes (grouping key)")
    input_types: str | None = Field(description="JSON list of input dtypes (grouping key)")
    concrete_inputs: str | None = Field(description="JSON list of scalar inputs (grouping key)")
    input_strides: str | None = Field(description="JSON list of input strides (grouping key, as TraceLens: layout changes speed)")
    count: int = Field(description="op calls with this signature that launched GPU work in the selection")
    total_kernel_time_ns: int = Field(description="Σ over calls of direct kernel time (union of the GPU ops each call launched), ns")
    mean_kernel_time_ns: float = Field(description="total_kernel_time_ns / count, ns")
    pct_of_attributed_kernel_time: float | None = Field(description="total / Σ total of all signatures in the selection, %")
    modelled: bool = Field(description="whether a perf model covers this op (false: time only, figures null)")
    model: str | None = Field(description="perf model family, e.g. 'gemm', 'sdpa_fwd_flash', 'elementwise'")
    formula: str | None = Field(description="one-line FLOPs/bytes formula of the model")
    notes: list[str] = Field(default_factory=list, description="model caveats (e.g. causal mask alignment)")
    gflops_per_call: float | None = Field(description="model FLOPs per call / 1e9 (multiply-add = 2 FLOPs)")
    bytes_per_call: int | None = Field(description="model bytes read + written per call (perfect cache); null when a dtype size is unknown")
    mb_per_call: float | None = Field(description="bytes_per_call / 10^6 (decimal MB; TraceLens's 'MB' column is MiB)")
    flops_per_byte: float | None = Field(description="arithmetic intensity: FLOPs / bytes per call, FLOP/byte")
    achieved_tflops_per_s: float | None = Field(description="FLOPs per call / mean kernel time, 10^12 FLOP/s")
    achieved_tb_per_s: float | None = Field(description="bytes per call / mean kernel time, 10^12 bytes/s")


class PerfTotals(BaseModel):
    signatures: int = Field(description="op signatures with GPU work in the selection (after category/name filters)")
    op_calls: int = Field(description="op calls with GPU work in the selection")
    attributed_kernel_time_ns: int = Field(description="Σ direct kernel time of all op calls in the selection, ns")
    modelled_signatures: int
    modelled_op_calls: int
    modelled_kernel_time_ns: int = Field(description="Σ direct kernel time of calls with a perf model, ns")
    modelled_pct_of_attributed_kernel_time: float | None = Field(description="modelled / attributed kernel time, %")
    modelled_gflop: float = Field(description="Σ over modelled calls of model FLOPs / 1e9")
    modelled_bytes: int | None = Field(description="Σ over modelled calls of model bytes (null when a signature has unknown bytes)")
    modelled_achieved_tflops_per_s: float | None = Field(description="modelled_gflop / modelled kernel time, 10^12 FLOP/s")
    unmodelled_signatures: int
    unmodelled_ops: int = Field(description="op calls without a perf model (time only)")
    unmodelled_time_ns: int = Field(description="Σ direct kernel time of those calls, ns")
    unmodelled_names: list[str] = Field(description="names of the unmodelled ops, by kernel time (at most 25)")
    not_op_attributed_gpu_ops: int = Field(description="GPU ops in the selection launched outside any cpu_op (runtime/graph launch or no launching call); not rows")
    not_op_attributed_time_ns: int = Field(description="|union| of those GPU ops per device, ns")


class PerfSummaryResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | str | None]
    totals: PerfTotals
    rows: list[PerfRow] = Field(description="signatures sorted by total kernel time, descending")
    truncated: bool
    remainder_rows: int = Field(description="signatures beyond the limit")
    remainder_kernel_time_ns: int = Field(description="kernel time of the signatures beyond the limit, ns")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def perf_summary(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    category: str | None = None,
    name_contains: str | None = None,
    limit: int = 15,
) -> PerfSummaryResult:
    require(trace, "perf_summary", "For Nsight/rocpd profiles, use roofline with kernel_flops (FLOPs/bytes per kernel name, "
            "from you) or ops_summary / top_kernels for time only.")
    _, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 500))
    g = selected_frame(trace, device, start_ns, end_ns)
    with call_cursor(trace) as cur:
        other = g.narrow("launcher_kind <> 'cpu_op'")
        other_n = cur.execute(f"SELECT count(*) FROM {other.sql}", other.params).fetchone()[0]
        other_t = busy_by_device(cur, other) if other_n else 0
        g = g.narrow("launcher_kind = 'cpu_op'")
        if not cur.execute(f"SELECT EXISTS (SELECT 1 FROM {g.sql})", g.params).fetchone()[0]:
            raise ProfileError("no GPU op in the selection was launched from inside a PyTorch cpu_op; ops_summary shows "
                               "what launched them.")
        inst, inst_params = instances(cur, g, subtree=False)
        # The instances named, with their cpu_op's shapes, scalar inputs and strides.
        named = f"""SELECT i.*, n.name, coalesce(c.input_dims, '') AS dims, coalesce(c.input_types, '') AS types,
                           coalesce(c.concrete_inputs, '') AS conc, coalesce(c.input_strides, '') AS strides
                    FROM {inst} i JOIN {g.frame.names} n ON n.id = i.name_id LEFT JOIN cpu_ops c ON c.rowid = i.launcher_id"""
        conds, params = ["TRUE"], list(inst_params)
        if category:
            conds.append("lower(category) = lower(?)")
            params.append(category)
            if not cur.execute(f"SELECT EXISTS (SELECT 1 FROM {inst} WHERE lower(category) = lower(?))", inst_params + [category]).fetchone()[0]:
                cats = [r[0] for r in cur.execute(f"SELECT DISTINCT category FROM {inst} ORDER BY 1", inst_params).fetchall()]
                raise ProfileError(f"no op of category {category!r} in the selection; categories present: {cats}.")
        if name_contains:
            conds.append(f"name {CONTAINS_SQL}")
            params.append(contains_pattern(name_contains))
            if not cur.execute(f"SELECT EXISTS (SELECT 1 FROM ({named}) WHERE {' AND '.join(conds)})", params).fetchone()[0]:
                raise ProfileError(f"no op name contains {name_contains!r} in the selection; call perf_summary without it to see the names.")
        # Signatures: name, category, shapes, dtypes, scalar inputs and strides (cpu_ops columns of the launcher)
        df = pd.DataFrame(cursor_dicts(cur, f"""
            SELECT name, category, dims, types, conc, strides, count(*) AS count, sum(direct_ns)::BIGINT AS total
            FROM ({named}) WHERE {' AND '.join(conds)}
            GROUP BY ALL ORDER BY total DESC, name, category, dims, types, conc, strides""", params),
            columns=["name", "category", "dims", "types", "conc", "strides", "count", "total"])
    attributed = int(df["total"].sum())

    rows: list[PerfRow] = []
    mod_sigs = mod_calls = mod_t = 0
    mod_flops = 0
    mod_bytes: int | None = 0
    un_sigs = un_calls = un_t = 0
    un_names: dict[str, int] = {}
    for r in df.itertuples():
        mod = model_for(r.name, r.dims or None, r.types or None, r.conc or None)
        count, total = int(r.count), int(r.total)
        mean = total / count
        if mod is None:
            un_sigs += 1
            un_calls += count
            un_t += total
            un_names[r.name] = un_names.get(r.name, 0) + total
        else:
            mod_sigs += 1
            mod_calls += count
            mod_t += total
            mod_flops += mod.flops * count
            bt = mod.bytes_total
            mod_bytes = None if (mod_bytes is None or bt is None) else mod_bytes + bt * count
        if len(rows) < limit:
            bt = mod.bytes_total if mod else None
            secs = mean * 1e-9
            rows.append(PerfRow(
                name=clip_name(r.name), category=r.category, input_dims=r.dims or None, input_types=r.types or None,
                concrete_inputs=r.conc or None, input_strides=r.strides or None, count=count, total_kernel_time_ns=total,
                mean_kernel_time_ns=round(mean, 3), pct_of_attributed_kernel_time=pct(total, attributed, 4),
                modelled=mod is not None, model=mod.model if mod else None, formula=mod.formula if mod else None,
                notes=list(mod.notes) if mod else [],
                gflops_per_call=mod.flops / 1e9 if mod else None, bytes_per_call=bt,
                mb_per_call=bt / MB if bt is not None else None,
                flops_per_byte=sig(mod.flops / bt) if mod and bt else None,
                achieved_tflops_per_s=sig(mod.flops / secs / 1e12) if mod and secs > 0 else None,
                achieved_tb_per_s=sig(bt / secs / 1e12) if bt is not None and secs > 0 else None))
    rest = df.iloc[limit:]
    totals = PerfTotals(
        signatures=len(df), op_calls=int(df["count"].sum()), attributed_kernel_time_ns=attributed,
        modelled_signatures=mod_sigs, modelled_op_calls=mod_calls, modelled_kernel_time_ns=mod_t,
        modelled_pct_of_attributed_kernel_time=pct(mod_t, attributed, 4), modelled_gflop=mod_flops / 1e9,
        modelled_bytes=mod_bytes if mod_sigs else None,
        modelled_achieved_tflops_per_s=sig(mod_flops / (mod_t * 1e-9) / 1e12) if mod_t else None,
        unmodelled_signatures=un_sigs, unmodelled_ops=un_calls, unmodelled_time_ns=un_t,
        unmodelled_names=[n for n, _ in sorted(un_names.items(), key=lambda kv: (-kv[1], kv[0]))][:25],
        not_op_attributed_gpu_ops=int(other_n), not_op_attributed_time_ns=int(other_t))
    truncated = len(rest) > 0
    return PerfSummaryResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), window=window,
        filters={"device": device, "category": category, "name_contains": name_contains},
        totals=totals, rows=rows, truncated=truncated, remainder_rows=len(rest),
        remainder_kernel_time_ns=int(rest["total"].sum()),
        hint=(f"{len(rest)} more signatures beyond limit={limit}; raise limit (max 500) or filter with "
              "category/name_contains/device/time window" if truncated else
              ("unmodelled ops are listed with time only; totals.unmodelled_names names them" if un_sigs else None)))
