"""replay_spec: a self-contained description of one op signature, for a standalone kernel reproducer.

Calls of a PyTorch cpu_op with the given name are grouped by signature = (Input Dims, Input type, Input
Strides, Concrete Inputs) exactly as recorded (record_shapes=True). Signatures are ranked by total kernel
time; `shapes_index` picks one (0 = the most expensive).

Kernel time of a call = summed duration of the kernels launched inside it (its op-tree subtree, nested aten
ops included: op_tree.launchers().subtree), ns. Copies/sets launched inside are counted separately.

The `snippet` is a TEMPLATE generated from profile metadata only: argument order follows the recorded inputs,
tensors are built with torch.empty_strided (random or zero contents), scalars come from Concrete Inputs when
recorded. Check it against the op's schema (torch.ops.aten.<op>.default._schema) before trusting timings.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from .call_stack import parse_json, resolve_op_name
from .common import ALL_TABLES, clip_name, data_issue_notes, data_issues_field, ToolResult
from .op_tree import launchers
from .requirements import require

# Kineto 'Input type' strings → torch dtypes
DTYPES = {
    "float": "torch.float32", "double": "torch.float64", "c10::Half": "torch.float16", "c10::BFloat16": "torch.bfloat16",
    "long int": "torch.int64", "long": "torch.int64", "int64_t": "torch.int64", "int": "torch.int32",
    "short int": "torch.int16", "short": "torch.int16", "signed char": "torch.int8", "unsigned char": "torch.uint8",
    "bool": "torch.bool", "c10::complex<float>": "torch.complex64", "c10::complex<double>": "torch.complex128",
    "c10::complex<c10::Half>": "torch.complex32", "c10::Float8_e4m3fn": "torch.float8_e4m3fn",
    "c10::Float8_e5m2": "torch.float8_e5m2", "c10::Float8_e4m3fnuz": "torch.float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "torch.float8_e5m2fnuz", "unsigned int": "torch.uint32", "unsigned long": "torch.uint64",
}
_FLOATS = {"torch.float32", "torch.float64", "torch.float16", "torch.bfloat16", "torch.complex64", "torch.complex128"}


class ReplayInput(BaseModel):
    index: int = Field(description="position in the recorded inputs (= argument position of the op)")
    kind: str = Field(description="'tensor' | 'scalar' | 'scalar_list' | 'tensor_list' | 'none' | 'other'")
    recorded_type: str | None = Field(None, description="'Input type' as the profile writes it")
    dtype: str | None = Field(None, description="tensors: torch dtype name, e.g. torch.bfloat16")
    shape: list | None = Field(None, description="tensors: shape; tensor_list: list of shapes")
    strides: list | None = Field(None, description="tensors: strides in elements as recorded (null when not recorded)")
    contiguous: bool | None = Field(None, description="tensors: strides equal the contiguous strides of the shape (null: unknown)")
    value: Any = Field(None, description="scalars: the recorded concrete value (parsed when numeric/list, else the text)")


class ReplayKernel(BaseModel):
    name: str = Field(description="kernel name (clipped at 200 characters)")
    op: str = Field(description="'kernel' | 'copy' | 'set'")
    calls_per_op_call: float = Field(description="executions per call of the op (count / calls)")
    mean_ns: float = Field(description="mean duration, ns")
    total_ns: int = Field(description="summed duration over the signature's calls, ns")
    grid: list[int] | None = Field(None, description="most frequent grid [x,y,z] (blocks)")
    block: list[int] | None = Field(None, description="most frequent block [x,y,z] (threads)")


class SignatureRow(BaseModel):
    shapes_index: int = Field(description="index to pass as shapes_index")
    input_dims: Any = None
    input_types: Any = None
    calls: int
    kernel_time_total_ns: int = Field(description="summed kernel time of the calls, ns")


class ReplaySpecResult(ToolResult):
    trace: str
    op: str = Field(description="op name as recorded")
    torch_op: str | None = Field(None, description="dispatcher handle, e.g. torch.ops.aten.addmm (null: not a namespace::name op)")
    device_name: str | None = Field(None, description="GPU the kernels ran on")
    shapes_index: int
    signatures_total: int = Field(description="distinct signatures of this op")
    signatures: list[SignatureRow] = Field(description="the signatures ranked by total kernel time (first `limit`)")
    inputs: list[ReplayInput]
    input_strides_recorded: bool = Field(description="false when the profile holds no 'Input Strides' (strides then assumed contiguous in the snippet)")
    calls: int = Field(description="calls of the op with this signature")
    kernel_time_per_call_mean_ns: float
    kernel_time_per_call_median_ns: float
    kernel_time_per_call_min_ns: int
    kernel_time_per_call_max_ns: int
    kernel_time_total_ns: int
    host_time_per_call_mean_ns: float = Field(description="mean host duration of the op call, ns")
    kernels: list[ReplayKernel] = Field(description="GPU ops launched inside the calls, in launch order of the first call")
    call_stack_instance: int = Field(description="call_stack(op=..., instance=n) index of this signature's most expensive call")
    snippet: str = Field(description="TEMPLATE Python reproducer; check it against the op schema before use")
    truncated: bool
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def _contig(shape: list) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return out[::-1]


def _value(text: Any) -> Any:
    """A recorded concrete input: '' (a tensor slot) is no value; else parse_json."""
    return None if text is None or text == "" else parse_json(text)


def _inputs(dims, types, strides, concrete) -> list[ReplayInput]:
    dims, types = dims or [], types or []
    n = max(len(dims), len(types))
    out = []
    for i in range(n):
        d = dims[i] if i < len(dims) else None
        t = types[i] if i < len(types) else None
        s = strides[i] if isinstance(strides, list) and i < len(strides) else None
        c = concrete[i] if isinstance(concrete, list) and i < len(concrete) else None
        inp = ReplayInput(index=i, kind="other", recorded_type=t)
        if t in DTYPES:
            inp.kind, inp.dtype, inp.shape = "tensor", DTYPES[t], list(d or [])
            if isinstance(s, list) and len(s) == len(inp.shape):
                inp.strides = [int(x) for x in s]
                inp.contiguous = all(a == b for a, b, n_ in zip(inp.strides, _contig(inp.shape), inp.shape) if n_ != 1)
        elif t == "Scalar":
            inp.kind, inp.value = "scalar", _value(c)
        elif t == "ScalarList":
            inp.kind, inp.value = "scalar_list", _value(c) if c not in (None, "") else d
        elif t == "TensorList":
            inp.kind, inp.shape = "tensor_list", d
        elif t in ("", None) and not d:
            inp.kind = "none"
        else:
            inp.value = _value(c)
        out.append(inp)
    return out


def _snippet(op: str, handle: str | None, inputs: list[ReplayInput], device_name: str | None, per_call: float) -> str:
    lines = ["# TEMPLATE generated by gpuscope.replay_spec from profile metadata — CHECK before use:",
             "# argument order/meaning, dtypes, scalar values and the overload against",
             f"# {handle or 'the op'}.default._schema; tensor contents are random/zero, not the profiled data.",
             f"# profiled on {repr(device_name) if device_name else 'an unknown GPU'}: {per_call:.0f} ns of kernel time per call (mean).",
             "import torch", "", "dev = 'cuda'", "args = []"]
    for inp in inputs:
        if inp.kind == "tensor":
            st = inp.strides if inp.strides is not None else _contig(inp.shape)
            fill = ".normal_()" if inp.dtype in _FLOATS else (".zero_()" if inp.dtype in ("torch.bool",) or "float8" in (inp.dtype or "")
                                                              else ".random_(0, 8)")
            lines.append(f"args.append(torch.empty_strided({tuple(inp.shape)!r}, {tuple(st)!r}, dtype={inp.dtype}, device=dev){fill})"
                         f"  # input {inp.index}")
        elif inp.kind == "tensor_list":
            shapes = inp.shape if isinstance(inp.shape, list) else []
            lines.append(f"args.append([torch.randn(tuple(s), device=dev) for s in {shapes!r}])"
                         f"  # input {inp.index}: list dtype not recorded, check")
        elif inp.kind in ("scalar", "scalar_list"):
            note = "" if inp.value is not None else "  # value not recorded: fill in"
            lines.append(f"args.append({inp.value!r}){note}  # input {inp.index} ({inp.recorded_type!r})")
        elif inp.kind == "none":
            lines.append(f"args.append(None)  # input {inp.index}")
        else:
            lines.append(f"args.append({inp.value!r})  # input {inp.index}: recorded type {inp.recorded_type!r}, check")
    if handle:
        lines += [f"fn = {handle}  # {op!r}"]
    else:
        lines += [f"fn = None  # {op!r} is not a dispatcher op name: replace with the Python callable"]
    lines += ["for _ in range(3):", "    fn(*args)  # warm-up", "torch.cuda.synchronize()",
              "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)",
              "start.record()", "for _ in range(20):", "    fn(*args)", "end.record()", "torch.cuda.synchronize()",
              "print(f'{start.elapsed_time(end) / 20 * 1e6:.0f} ns per call (includes launch gaps)')"]
    return "\n".join(lines)


def replay_spec(trace: Trace, *, op: str, shapes_index: int = 0, limit: int = 10) -> ReplaySpecResult:
    require(trace, "replay_spec")
    limit = max(1, min(int(limit), 100))
    names = [r[0] for r in trace.sql("SELECT DISTINCT name FROM cpu_ops WHERE category = 'cpu_op' ORDER BY 1")]
    name = resolve_op_name(names, op)
    L = launchers(trace)
    cur = trace.con.cursor()
    try:
        # The op's calls, each with the summed duration of the kernels launched inside it (op_tree subtree pairs).
        cur.execute(f"""CREATE OR REPLACE TEMP TABLE _rs_calls AS
            SELECT c.*, row_number() OVER (ORDER BY c.start_ns, c.op_id) - 1 AS call_index,
                   coalesce(k.kt, 0)::BIGINT AS kt
            FROM (SELECT rowid AS op_id, start_ns, dur_ns, coalesce(input_dims, '') AS dims, coalesce(input_types, '') AS types,
                         coalesce(input_strides, '') AS strides, coalesce(concrete_inputs, '') AS concrete
                  FROM cpu_ops WHERE category = 'cpu_op' AND name = ?) c
            LEFT JOIN (SELECT p.op_id, sum(g.dur_ns) AS kt FROM {L.subtree} p JOIN {L.table} g USING (gop_id)
                       WHERE g.op = 'kernel' AND p.op_id IN (SELECT rowid FROM cpu_ops WHERE category = 'cpu_op' AND name = ?)
                       GROUP BY p.op_id) k USING (op_id)""", [name, name])
        keys = ["dims", "types", "strides", "concrete"]
        sig = pd.DataFrame(cursor_dicts(cur, """
            SELECT dims, types, strides, concrete, count(*) AS calls, sum(kt)::BIGINT AS kt, min(start_ns) AS first
            FROM _rs_calls GROUP BY ALL ORDER BY kt DESC, calls DESC, first, min(call_index)"""),
            columns=keys + ["calls", "kt", "first"])
        n = len(sig)
        if not -n <= int(shapes_index) < n:
            raise ProfileError(f"shapes_index {shapes_index} is out of range: {name!r} has {n} distinct signatures (0..{n - 1}).")
        si = int(shapes_index) % n
        s = sig.iloc[si]
        mine_sql = "SELECT * FROM _rs_calls WHERE dims = ? AND types = ? AND strides = ? AND concrete = ?"
        mp = [s[k] for k in keys]
        # The calls of the signature, summarised in SQL (a signature can hold every call of the op).
        mine = cursor_dicts(cur, f"""
            SELECT count(*) AS calls, avg(kt) AS kt_mean, median(kt) AS kt_median, min(kt) AS kt_min, max(kt) AS kt_max,
                   sum(kt)::BIGINT AS kt_total, avg(dur_ns) AS host_mean, arg_min(call_index, (-kt, start_ns, call_index)) AS best
            FROM ({mine_sql})""", mp)[0]
        inputs = _inputs(parse_json(s["dims"] or None), parse_json(s["types"] or None), parse_json(s["strides"] or None),
                         parse_json(s["concrete"] or None))
        # The GPU ops launched inside these calls, per name in order of first appearance (call, launch, start), with the
        # most frequent launch configuration (smallest of equals) of the kernels.
        cur.execute(f"""CREATE OR REPLACE TEMP TABLE _rs_ops AS
            SELECT g.gop_id, g.op, n.name, g.dur_ns, g.device_id, p.op_id, g.call_start_ns, g.start_ns
            FROM {L.subtree} p JOIN {L.table} g USING (gop_id) JOIN {L.names} n ON n.id = g.name_id WHERE p.op_id IN (SELECT op_id FROM ({mine_sql}))""", mp)
        kern = cursor_dicts(cur, """
            SELECT o.name, arg_min(o.op, (o.op_id, o.call_start_ns, o.start_ns)) AS op, count(*) AS n, avg(o.dur_ns) AS mean,
                   sum(o.dur_ns)::BIGINT AS total, min((o.op_id, o.call_start_ns, o.start_ns)) AS first,
                   (SELECT [c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z] FROM _rs_ops q JOIN kernels c ON c.rowid * 2 = q.gop_id
                    WHERE q.name = o.name AND q.op = 'kernel' AND c.grid_x IS NOT NULL AND c.grid_y IS NOT NULL AND c.grid_z IS NOT NULL
                          AND c.block_x IS NOT NULL AND c.block_y IS NOT NULL AND c.block_z IS NOT NULL
                    GROUP BY ALL ORDER BY count(*) DESC, 1 LIMIT 1) AS cfg
            FROM _rs_ops o GROUP BY o.name ORDER BY first""")
        dev_row = cur.execute("SELECT device_id FROM _rs_ops GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1").fetchall()
    finally:
        cur.close()
    kernels = []
    for k in kern:
        cfg = k["cfg"] if k["op"] == "kernel" else None
        kernels.append(ReplayKernel(
            name=clip_name(k["name"], 200), op=str(k["op"]), calls_per_op_call=round(k["n"] / mine["calls"], 3),
            mean_ns=round(float(k["mean"]), 1), total_ns=int(k["total"]),
            grid=None if cfg is None else [int(x) for x in cfg[:3]], block=None if cfg is None else [int(x) for x in cfg[3:]]))
    p = dev_row
    dev = None
    if len(p):
        d = int(p[0][0])
        r = trace.sql("SELECT name FROM devices WHERE device_id = ?", [d])
        dev = r[0][0] if r else None
    else:
        r = trace.sql("SELECT name FROM devices WHERE is_compute ORDER BY device_id LIMIT 1")
        dev = r[0][0] if r else None
    handle = None
    if "::" in name:
        ns, _, base = name.partition("::")
        if ns.isidentifier() and base.isidentifier():
            handle = f"torch.ops.{ns}.{base}"
    hints = []
    if not s["strides"]:
        hints.append("the profile records no input strides: the snippet assumes contiguous tensors")
    if mine["kt_total"] == 0:
        hints.append("these calls launched no kernels (a CPU-side or view op); pick an op with GPU time (ops_summary group_by='shapes')")
    if n > limit:
        hints.append(f"{n - limit} more signatures beyond limit={limit}")
    return ReplaySpecResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), op=name, torch_op=handle, device_name=dev, shapes_index=si, signatures_total=n,
        signatures=[SignatureRow(shapes_index=i, input_dims=parse_json(r.dims or None), input_types=parse_json(r.types or None),
                                 calls=int(r.calls), kernel_time_total_ns=int(r.kt)) for i, r in enumerate(sig.iloc[:limit].itertuples())],
        inputs=inputs, input_strides_recorded=bool(s["strides"]), calls=int(mine["calls"]),
        kernel_time_per_call_mean_ns=round(float(mine["kt_mean"]), 1), kernel_time_per_call_median_ns=float(mine["kt_median"]),
        kernel_time_per_call_min_ns=int(mine["kt_min"]), kernel_time_per_call_max_ns=int(mine["kt_max"]),
        kernel_time_total_ns=int(mine["kt_total"]), host_time_per_call_mean_ns=round(float(mine["host_mean"]), 1),
        kernels=kernels, call_stack_instance=int(mine["best"]),
        snippet=_snippet(name, handle, inputs, dev, float(mine["kt_mean"])), truncated=n > limit,
        hint="; ".join(hints) or None)
