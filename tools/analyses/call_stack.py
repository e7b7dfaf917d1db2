"""call_stack: where in the model code one kernel (or one op call) comes from, and what runs below it.

Target:
  kernel=<substring>  the kernel executions whose full or base name contains it (case-insensitive);
  op=<name>           the host nodes with that exact name (PyTorch cpu_op, Python frame, nn.Module scope or
                      record_function annotation); a unique case-insensitive substring match is accepted.
Instance: `instance=None` (default) picks the LONGEST instance — for a kernel the execution with the largest
GPU duration, for an op the call with the most GPU time launched inside it (ties: longer host duration, then
earlier start). `instance=n` picks the n-th by start time (0 = first, -1 = last).

Chain (PyTorch traces): the enclosing host nodes from the outermost one down, from op_tree.node_parents()
(Python frames 'file.py(line): func', nn.Module scopes 'nn.Module: X_0', annotations, cpu ops), ending at
the kernel's launcher (op_tree.launchers(): innermost cpu_op around the launching API call), then the
launching API call and the kernel itself. Nsight / rocpd profiles have no cpu ops: the chain is the
NVTX/rocTX ranges on the launching thread that enclose the launching call (the projection rule of
projection.py), then the API call and the kernel.

Subtree: below the op (the launcher, in kernel mode) in depth-first start order, nodes and the GPU ops each
node launched directly, at most `depth` levels below the op and `limit` entries; the totals cover the whole
subtree (GPU ops whose launching call starts inside the op on its thread).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from .common import ALL_TABLES, CONTAINS_SQL, clip_name, contains_pattern, data_issue_notes, data_issues_field, ToolResult
from .op_tree import launchers, node_parents
from .projection import with_sql as projection_sql
from .requirements import require

Kind = Literal["python_frame", "module", "annotation", "cpu_op", "range", "api_call", "kernel", "memcpy", "memset"]
_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
_STACK_HINT = ("Python frames and nn.Module scopes need a PyTorch profile recorded with "
               "torch.profiler.profile(with_stack=True, record_shapes=True) (with_modules=True for module scopes).")


def parse_json(text: Any) -> Any:
    if text is None or (isinstance(text, float) and pd.isna(text)):
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


class Level(BaseModel):
    level: int = Field(description="position: 0 = outermost shown level (chain) or the op itself (subtree)")
    kind: Kind = Field(description="python_frame | module (nn.Module scope) | annotation (record_function) | cpu_op | "
                                   "range (NVTX/rocTX) | api_call | kernel | memcpy | memset")
    name: str = Field(description="node name (long kernel names clipped)")
    start_ns: int = Field(description="start, ns on the profile timeline (GPU ops: GPU start)")
    dur_ns: int = Field(description="duration, ns")
    file: str | None = Field(None, description="python_frame: source file")
    line: int | None = Field(None, description="python_frame: line number")
    function: str | None = Field(None, description="python_frame: function name")
    module: str | None = Field(None, description="module: the nn.Module instance name, e.g. 'BertAttention_0'")
    input_dims: list | None = Field(None, description="cpu_op: input shapes as recorded (record_shapes=True)")
    input_types: list | None = Field(None, description="cpu_op: input dtypes / kinds as recorded ('c10::BFloat16', 'Scalar', ...)")
    concrete_inputs: list | None = Field(None, description="cpu_op: recorded scalar input values ('' for tensors)")
    device_id: int | None = Field(None, description="GPU ops: device")
    stream_id: int | None = Field(None, description="GPU ops: stream")
    tid: int | None = Field(None, description="host nodes: thread id")


class Totals(BaseModel):
    gpu_ops: int = Field(description="GPU ops (kernels, copies, sets) launched inside the op, whole subtree")
    kernels: int = Field(description="kernels among them")
    kernel_time_ns: int = Field(description="summed kernel duration of the subtree, ns")
    gpu_time_ns: int = Field(description="summed duration of all its GPU ops (kernels + copies + sets), ns")
    host_nodes: int = Field(description="host nodes (ops, frames, annotations) below the op, whole subtree")


class CallStackResult(ToolResult):
    trace: str
    target: str = Field(description="'kernel' or 'op'")
    query: str = Field(description="the kernel substring or op name asked for")
    matched_names: list[str] = Field(description="distinct names matching the query (first 10, clipped)")
    instances: int = Field(description="executions/calls matching the query")
    instance: int = Field(description="index (by start time) of the instance shown")
    instance_rule: str = Field(description="how the instance was chosen")
    launcher_kind: str | None = Field(None, description="kernel mode: 'cpu_op' | 'runtime' | 'graph' | 'unlinked' (op_tree.py)")
    chain: list[Level] = Field(description="outermost → innermost: frames/modules/annotations/ops (or NVTX ranges), "
                                           "then (kernel mode) the launching API call and the kernel")
    chain_truncated: int = Field(description="outermost levels left out because of `depth`")
    module_path: str | None = Field(None, description="nn.Module scopes of the chain joined with '/'")
    innermost_python_frame: str | None = Field(None, description="the deepest Python frame with a file:line in the chain, 'file(line): func'")
    model_code_frame: str | None = Field(None, description="the deepest Python frame outside torch/ (the model's own code), 'file(line): func'")
    call_stack_arg: str | None = Field(None, description="the op's 'Call stack' arg when the profile stores stacks that way")
    op: Level | None = Field(None, description="the op whose subtree is listed (kernel mode: the launcher cpu_op)")
    subtree: list[Level] = Field(description="depth-first below the op; `level` = depth below it (GPU ops one below their launcher)")
    subtree_totals: Totals | None = None
    truncated: bool = Field(description="true when the chain or subtree was cut by depth/limit")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def call_stack(trace: Trace, *, kernel: str | None = None, op: str | None = None, instance: int | None = None,
               depth: int = 30, limit: int = 20) -> CallStackResult:
    if (kernel is None) == (op is None):
        raise ProfileError("give exactly one of kernel (a kernel name substring) or op (a host op name), e.g. "
                           "call_stack(kernel='gemm') or call_stack(op='aten::mm') (CLI: --kernel gemm / --op aten::mm).")
    depth = max(1, min(int(depth), 200))
    limit = max(1, min(int(limit), 500))
    has_ops = trace.count("cpu_ops") > 0
    if op is not None:
        require(trace, "call_stack.op", "Use kernel=<name substring> instead (the chain then shows the NVTX/rocTX ranges). "
                + _STACK_HINT)
        return _op_mode(trace, op, instance, depth, limit)
    return _kernel_mode(trace, kernel, instance, depth, limit, has_ops)


# -- host nodes ------------------------------------------------------------------------------------------

def _nodes(trace: Trace) -> pd.DataFrame:
    """Every host node with its parent: index (node, row). Memoized."""
    def build():
        par = node_parents(trace)
        cur = trace.con.cursor()
        try:  # columnar fetches: no Python object per row on the way
            a = cur.execute("""SELECT rowid AS row, pid, tid, start_ns, dur_ns, name, category, input_dims, input_types,
                                      concrete_inputs, args FROM cpu_ops""").df()
            b = cur.execute("SELECT rowid AS row, pid, tid, start_ns, dur_ns, name FROM markers WHERE kind = 'annotation'").df()
        finally:
            cur.close()
        a["node"] = "cpu_ops"
        b["node"], b["category"] = "markers", "annotation"
        n = pd.concat([a, b], ignore_index=True).merge(par, on=["node", "row"], how="left")
        n["key"] = list(zip(n["node"], n["row"]))
        n["parent_key"] = [None if pd.isna(r) else (pn, int(r)) for pn, r in zip(n["parent_node"], n["parent_row"])]
        n = n.set_index("key", drop=False)
        children: dict = {}
        for k, p, s in sorted(zip(n["key"], n["parent_key"], n["start_ns"]), key=lambda x: x[2]):
            if p is not None:
                children.setdefault(p, []).append(k)
        return n, children
    return trace.memo(("call_stack.nodes",), build)


def _level(r: Any, i: int) -> Level:
    name = str(r["name"])
    cat = r["category"]
    lv = Level(level=i, kind="cpu_op", name=clip_name(name), start_ns=int(r["start_ns"]), dur_ns=int(r["dur_ns"]),
               tid=None if pd.isna(r["tid"]) else int(r["tid"]))
    if cat == "annotation":
        lv.kind = "annotation"
    elif cat == "python_function":
        if name.startswith("nn.Module: "):
            lv.kind, lv.module = "module", name[len("nn.Module: "):]
        else:
            lv.kind = "python_frame"
            m = _FRAME.match(name)
            if m:
                lv.file, lv.line, lv.function = m["file"], int(m["line"]), m["func"]
    else:
        lv.input_dims = parse_json(r["input_dims"])
        lv.input_types = parse_json(r["input_types"])
        lv.concrete_inputs = parse_json(r["concrete_inputs"])
    return lv


def _gop_level(g: Any, i: int) -> Level:
    kind = {"kernel": "kernel", "copy": "memcpy", "set": "memset"}[g["op"]]
    return Level(level=i, kind=kind, name=clip_name(str(g["name"])), start_ns=int(g["start_ns"]), dur_ns=int(g["dur_ns"]),
                 device_id=int(g["device_id"]), stream_id=None if pd.isna(g["stream_id"]) else int(g["stream_id"]))


def _ancestors(nodes: pd.DataFrame, key) -> list:
    out, seen = [], set()
    while key is not None and key not in seen:
        seen.add(key)
        out.append(key)
        key = nodes.at[key, "parent_key"]
    return out[::-1]


def _chain_summary(levels: list[Level]) -> tuple[str | None, str | None, str | None]:
    mods = [lv.module for lv in levels if lv.kind == "module"]
    frames = [lv for lv in levels if lv.kind == "python_frame" and lv.file]
    model = [lv for lv in frames if not lv.file.startswith("torch/") and "/torch/" not in lv.file]
    return ("/".join(mods) if mods else None), (frames[-1].name if frames else None), (model[-1].name if model else None)


def _subtree(trace: Trace, nodes: pd.DataFrame, children: dict, key, depth: int, limit: int) -> tuple[list[Level], Totals, bool]:
    L = launchers(trace)
    root = nodes.loc[[key]].iloc[0]
    # The GPU ops launched by the cpu_ops of the subtree (the walk below visits every node of it), by launcher.
    by_launcher: dict[int, list[dict]] = {}
    if key[0] == "cpu_ops":
        ops, stack = [], [key]
        while stack:
            k = stack.pop()
            if k[0] == "cpu_ops":
                ops.append(int(k[1]))
            stack.extend(children.get(k, []))
        cur = trace.con.cursor()
        try:
            for g in cursor_dicts(cur, f"""SELECT launcher_id, op, name, start_ns, dur_ns, device_id, stream_id, call_start_ns
                                           FROM {L.gops} WHERE launcher_id IN (SELECT unnest(?::BIGINT[]))
                                           ORDER BY start_ns, gop_id""", [ops]):
                by_launcher.setdefault(g["launcher_id"], []).append(g)
        finally:
            cur.close()
    out: list[Level] = []
    cut = False
    count_nodes = 0

    def visit(k, lvl):
        nonlocal cut, count_nodes
        if k != key:
            count_nodes += 1
            if lvl <= depth and len(out) < limit:
                out.append(_level(nodes.loc[[k]].iloc[0], lvl))
            else:
                cut = True
        items = [(int(nodes.at[c, "start_ns"]), 1, c) for c in children.get(k, [])]
        if k[0] == "cpu_ops":
            items += [(int(g["call_start_ns"]), 0, g) for g in by_launcher.get(k[1], [])]
        for _, is_node, item in sorted(items, key=lambda x: (x[0], x[1])):
            if is_node:
                visit(item, lvl + 1)
            elif lvl + 1 <= depth and len(out) < limit:
                out.append(_gop_level(item, lvl + 1))
            else:
                cut = True

    visit(key, 0)
    s, e = int(root["start_ns"]), int(root["start_ns"]) + int(root["dur_ns"])
    n, nk, kt, t = trace.sql(f"""
        SELECT count(*), count(*) FILTER (WHERE op = 'kernel'), coalesce(sum(dur_ns) FILTER (WHERE op = 'kernel'), 0)::BIGINT,
               coalesce(sum(dur_ns), 0)::BIGINT
        FROM {L.gops} WHERE pid = ? AND call_tid = ? AND call_start_ns >= ? AND call_start_ns < ?""",
                             [_int(root["pid"]), _int(root["tid"]), s, e])[0]
    return out, Totals(gpu_ops=n, kernels=nk, kernel_time_ns=kt, gpu_time_ns=t, host_nodes=count_nodes), cut


def _int(v) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _pick(df: pd.DataFrame, instance: int | None, longest_cols: list[str], what: str) -> tuple[int, str]:
    """df sorted by start; returns (position, rule)."""
    n = len(df)
    if instance is None:
        order = df.reset_index(drop=True).sort_values(longest_cols + ["start_ns"], ascending=[False] * len(longest_cols) + [True],
                                                      kind="stable")
        return int(order.index[0]), _rule(None, n, what)
    return int(instance) % n, _rule(instance, n, what)


def _rule(instance: int | None, n: int, what: str) -> str:
    if instance is None:
        return f"longest: the {what} (instance=None); pass instance=n for the n-th by start time"
    i = int(instance)
    if not -n <= i < n:
        raise ProfileError(f"instance {instance} is out of range: {n} instances match (valid 0..{n - 1}, or -1 for the last).")
    return "n-th by start time (instance given)"


# -- kernel mode -----------------------------------------------------------------------------------------

def _kernel_mode(trace: Trace, kernel: str, instance: int | None, depth: int, limit: int, has_ops: bool) -> CallStackResult:
    require(trace, "call_stack")
    L = launchers(trace)
    match = f"gop_id IN (SELECT rowid * 2 FROM kernels WHERE name {CONTAINS_SQL} OR short_name {CONTAINS_SQL})"
    pat = [contains_pattern(kernel)] * 2
    n = trace.scalar(f"SELECT count(*) FROM {L.gops} WHERE {match}", pat)
    if not n:
        names = [r[0] for r in trace.sql("SELECT short_name FROM kernels GROUP BY 1 ORDER BY sum(dur_ns) DESC")]
        close = difflib.get_close_matches(kernel, names, n=5, cutoff=0.3) or names[:5]
        raise ProfileError(f"no kernel name contains {kernel!r}. Kernels with the most time or closest names: {close}. "
                           "top_kernels lists them; the match is a case-insensitive substring of the full or base name.")
    rule = _rule(instance, n, "execution with the largest GPU duration")
    # instance None: the longest execution (earliest of equals); else the n-th by (start, id)
    order = "start_ns, gop_id" if instance is not None else "dur_ns DESC, start_ns, gop_id"
    g = trace.sql_dicts(f"SELECT * FROM {L.gops} WHERE {match} ORDER BY {order} LIMIT 1 OFFSET ?",
                        pat + [int(instance) % n if instance is not None else 0])[0]
    pos = int(instance) % n if instance is not None else trace.scalar(
        f"SELECT count(*) FROM {L.gops} WHERE {match} AND (start_ns < ? OR (start_ns = ? AND gop_id < ?))",
        pat + [g["start_ns"], g["start_ns"], g["gop_id"]])
    sel_names = trace.sql(f"SELECT name FROM {L.gops} WHERE {match} GROUP BY name ORDER BY min(start_ns), min(gop_id)", pat)
    names = list(dict.fromkeys(clip_name(r[0], 120) for r in sel_names))
    chain: list[Level] = []
    hint = None
    op_level, subtree, totals, cut, stack_arg = None, [], None, False, None
    if has_ops and g["linked"]:
        nodes, children = _nodes(trace)
        if g["launcher_kind"] == "cpu_op":
            key = ("cpu_ops", int(g["launcher_id"]))
        else:  # no enclosing cpu_op: innermost node enclosing the call start on its thread
            cand = nodes[(nodes["pid"] == g["pid"]) & (nodes["tid"] == g["call_tid"]) & (nodes["start_ns"] <= g["call_start_ns"])
                         & (nodes["start_ns"] + nodes["dur_ns"] > g["call_start_ns"])]
            key = None if cand.empty else cand.sort_values(["depth", "start_ns"]).index[-1]
        if key is not None:
            keys = _ancestors(nodes, key)
            chain = [_level(nodes.loc[[k]].iloc[0], 0) for k in keys]
            if g["launcher_kind"] == "cpu_op":
                op_level = chain[-1]
                subtree, totals, cut = _subtree(trace, nodes, children, key, depth, limit)
                stack_arg = _stack_arg(nodes.at[key, "args"])
        if not any(lv.kind == "python_frame" for lv in chain):
            hint = "the chain holds no Python frames. " + _STACK_HINT
    elif g["linked"]:
        chain = _ranges(trace, g)
        hint = (f"{trace.format_name} profiles carry no Python stacks: the chain is the NVTX/rocTX ranges around the launching "
                "call. " + _STACK_HINT)
    else:
        hint = ("this kernel's launching API call is not in the profile (unlinked), so nothing on the host can be tied to it; "
                "pick another instance or record the runtime API (CUDA/HIP activity).")
    if g["linked"]:
        chain.append(Level(level=0, kind="api_call", name=str(g["call_name"]), start_ns=int(g["call_start_ns"]),
                           dur_ns=int(g["call_end_ns"] - g["call_start_ns"]), tid=int(g["call_tid"])))
    chain.append(_gop_level(g, 0))
    chain, dropped = _cut_chain(chain, depth)
    mp, frame, model_frame = _chain_summary(chain)
    truncated = bool(dropped or cut)
    if truncated:
        hint = ((hint + " ") if hint else "") + "output cut: raise depth (chain levels and subtree depth, max 200) or limit (subtree entries, max 500)."
    return CallStackResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), target="kernel", query=kernel, matched_names=names[:10], instances=n, instance=pos,
        instance_rule=rule, launcher_kind=str(g["launcher_kind"]), chain=chain, chain_truncated=dropped, module_path=mp,
        innermost_python_frame=frame, model_code_frame=model_frame, call_stack_arg=stack_arg, op=op_level, subtree=subtree, subtree_totals=totals,
        truncated=truncated, hint=hint)


def _stack_arg(args: Any) -> str | None:
    a = parse_json(args)
    if isinstance(a, dict) and a.get("Call stack"):
        return str(a["Call stack"])[:4000]
    return None


def _cut_chain(chain: list[Level], depth: int) -> tuple[list[Level], int]:
    dropped = max(0, len(chain) - depth)
    chain = chain[dropped:]
    for i, lv in enumerate(chain):
        lv.level = i
    return chain, dropped


def _ranges(trace: Trace, g: Any) -> list[Level]:
    rows = trace.sql_dicts(f"""{projection_sql(trace)}
        SELECT start_ns, dur_ns, name, tid FROM rng
        WHERE pid = ? AND tid = ? AND start_ns <= ? AND ? <= end_ns AND NOT cross_thread
        ORDER BY start_ns, end_ns DESC, rid""",
        [int(g["pid"]), int(g["call_tid"]), int(g["call_start_ns"]), int(g["call_end_ns"])])
    return [Level(level=0, kind="range", name=r["name"], start_ns=r["start_ns"], dur_ns=r["dur_ns"], tid=r["tid"]) for r in rows]


# -- op mode ---------------------------------------------------------------------------------------------

def resolve_op_name(names: list[str], op: str) -> str:
    """Exact name, else a unique case-insensitive substring match; ProfileError listing close names otherwise."""
    if op in names:
        return op
    sub = sorted({n for n in names if op.lower() in n.lower()})
    if len(sub) == 1:
        return sub[0]
    close = difflib.get_close_matches(op, names, n=8, cutoff=0.4)
    shown = list(dict.fromkeys(close + sub))[:10]
    raise ProfileError(f"no op named {op!r}" + (f" ({len(sub)} names contain it)" if sub else "") +
                       f". Close names: {shown or sorted(set(names))[:10]}. ops_summary lists the ops with GPU time.")


def _launched_ns(trace: Trace, calls: pd.DataFrame) -> np.ndarray:
    """Per host call (pid, tid, start_ns, dur_ns): summed duration of the GPU ops whose launching call starts inside it
    on its thread, ns. Running sums over each thread's GPU ops by call start, read by two ASOF lookups per call: an
    op named 100,000 times costs a sort, not 100,000 scans of every GPU op."""
    L = launchers(trace)
    cur = trace.con.cursor()
    try:
        cur.register("_cs_calls", pd.DataFrame({"i": np.arange(len(calls)), "pid": calls["pid"].to_numpy(), "tid": calls["tid"].to_numpy(),
                                                 "s": calls["start_ns"].to_numpy(np.int64),
                                                 "e": calls["start_ns"].to_numpy(np.int64) + calls["dur_ns"].to_numpy(np.int64)}))
        got = cur.execute(f"""
            WITH t AS (SELECT g.pid, g.call_tid AS tid, g.call_start_ns AS t, sum(g.dur_ns) AS d
                       FROM {L.gops} g SEMI JOIN (SELECT DISTINCT pid, tid FROM _cs_calls) q ON q.pid = g.pid AND q.tid = g.call_tid
                       WHERE g.call_start_ns IS NOT NULL GROUP BY ALL),
                 c AS (SELECT pid, tid, t, sum(d) OVER (PARTITION BY pid, tid ORDER BY t) AS cum FROM t),
                 hi AS (SELECT q.i, coalesce(c.cum, 0) AS cum FROM _cs_calls q ASOF LEFT JOIN c ON c.pid = q.pid AND c.tid = q.tid AND c.t < q.e),
                 lo AS (SELECT q.i, coalesce(c.cum, 0) AS cum FROM _cs_calls q ASOF LEFT JOIN c ON c.pid = q.pid AND c.tid = q.tid AND c.t < q.s)
            SELECT hi.i, (hi.cum - lo.cum)::BIGINT AS ns FROM hi JOIN lo USING (i)""").fetchnumpy()
    finally:
        cur.close()
    out = np.zeros(len(calls), dtype=np.int64)
    out[np.asarray(got["i"], dtype=np.int64)] = np.asarray(got["ns"], dtype=np.int64)
    return out


def _op_mode(trace: Trace, op: str, instance: int | None, depth: int, limit: int) -> CallStackResult:
    nodes, children = _nodes(trace)
    name = resolve_op_name(list(dict.fromkeys(nodes["name"].astype(str))), op)
    sel = nodes[nodes["name"] == name].sort_values(["start_ns", "row"], kind="stable")
    sel = sel.assign(gpu_ns=_launched_ns(trace, sel)).reset_index(drop=True)
    pos, rule = _pick(sel, instance, ["gpu_ns", "dur_ns"], "call with the most GPU time launched inside it")
    key = (sel.at[pos, "node"], int(sel.at[pos, "row"]))
    keys = _ancestors(nodes, key)
    chain = [_level(nodes.loc[[k]].iloc[0], 0) for k in keys]
    op_level = chain[-1].model_copy()
    chain, dropped = _cut_chain(chain, depth)
    subtree, totals, cut = _subtree(trace, nodes, children, key, depth, limit)
    mp, frame, model_frame = _chain_summary(chain)
    hint = None if any(lv.kind == "python_frame" for lv in chain) else "the chain holds no Python frames. " + _STACK_HINT
    truncated = bool(dropped or cut)
    if truncated:
        hint = ((hint + " ") if hint else "") + "output cut: raise depth (chain levels and subtree depth, max 200) or limit (subtree entries, max 500)."
    return CallStackResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), target="op", query=op, matched_names=[clip_name(name, 120)], instances=len(sel), instance=pos,
        instance_rule=rule, chain=chain, chain_truncated=dropped, module_path=mp, innermost_python_frame=frame, model_code_frame=model_frame,
        call_stack_arg=_stack_arg(nodes.at[key, "args"]) if key[0] == "cpu_ops" else None, op=op_level, subtree=subtree,
        subtree_totals=totals, truncated=truncated, hint=hint)
