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
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from .common import ALL_TABLES, CONTAINS_SQL, clip_name, contains_pattern, data_issue_notes, data_issues_field, ToolResult
from .op_tree import HostNodes, launchers, node_parents
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

@dataclass(frozen=True)
class _Tree:
    """op_tree.node_parents' host nodes (position i) with each node's children: positions first[i]:first[i + 1] of
    `child`, in start order (of equal starts, cpu_ops before markers, each by rowid)."""

    n: HostNodes
    first: np.ndarray
    child: np.ndarray

    def children(self, i: int) -> np.ndarray:
        return self.child[self.first[i]:self.first[i + 1]]


def _nodes(trace: Trace) -> _Tree:
    """Memoized: the host nodes and their children, as arrays (no Python object per node but its name)."""
    def build():
        n = node_parents(trace)
        has = np.flatnonzero(n.parent >= 0)
        # positions are in (table, rowid) order, so a stable sort by (parent, start) keeps that order among equal starts
        order = has[np.lexsort((n.start_ns[has], n.parent[has]))]
        first = np.searchsorted(n.parent[order], np.arange(len(n.row) + 1))
        return _Tree(n, first, order)
    return trace.memo(("call_stack.nodes",), build)


def _nan_int(v) -> int | None:
    return None if v != v else int(v)


def _level(n: HostNodes, i: int, lvl: int) -> Level:
    """The node at position i; a cpu_op's recorded inputs are filled by _details."""
    name = str(n.name[i])
    cat = n.category[i]
    lv = Level(level=lvl, kind="cpu_op", name=clip_name(name), start_ns=int(n.start_ns[i]), dur_ns=int(n.dur_ns[i]),
               tid=_nan_int(n.tid[i]))
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
    return lv


def _details(trace: Trace, n: HostNodes, levels: list[tuple[Level, int]]) -> None:
    """Fill input_dims / input_types / concrete_inputs of the cpu_op levels (Level, position), read in one query."""
    want = [(lv, int(n.row[i])) for lv, i in levels if lv.kind == "cpu_op"]
    if not want:
        return
    got = {r[0]: r[1:] for r in trace.sql("SELECT rowid, input_dims, input_types, concrete_inputs FROM cpu_ops "
                                          "WHERE rowid IN (SELECT unnest(?::BIGINT[]))", [sorted({r for _, r in want})])}
    for lv, r in want:
        dims, types, concrete = got[r]
        lv.input_dims, lv.input_types, lv.concrete_inputs = parse_json(dims), parse_json(types), parse_json(concrete)


def _gop_level(g: Any, i: int) -> Level:
    kind = {"kernel": "kernel", "copy": "memcpy", "set": "memset"}[g["op"]]
    return Level(level=i, kind=kind, name=clip_name(str(g["name"])), start_ns=int(g["start_ns"]), dur_ns=int(g["dur_ns"]),
                 device_id=int(g["device_id"]), stream_id=None if g["stream_id"] is None else int(g["stream_id"]))


def _ancestors(n: HostNodes, i: int) -> list[int]:
    out, seen = [], set()
    while i >= 0 and i not in seen:
        seen.add(i)
        out.append(i)
        i = int(n.parent[i])
    return out[::-1]


def _chain(trace: Trace, n: HostNodes, keys: list[int]) -> list[Level]:
    chain = [_level(n, i, 0) for i in keys]
    _details(trace, n, list(zip(chain, keys)))
    return chain


def _chain_summary(levels: list[Level]) -> tuple[str | None, str | None, str | None]:
    mods = [lv.module for lv in levels if lv.kind == "module"]
    frames = [lv for lv in levels if lv.kind == "python_frame" and lv.file]
    model = [lv for lv in frames if not lv.file.startswith("torch/") and "/torch/" not in lv.file]
    return ("/".join(mods) if mods else None), (frames[-1].name if frames else None), (model[-1].name if model else None)


def _subtree(trace: Trace, tree: _Tree, key: int, depth: int, limit: int) -> tuple[list[Level], Totals, bool]:
    L = launchers(trace)
    n = tree.n
    # The GPU ops launched by the cpu_ops of the subtree (the walk below visits every node of it), by launcher.
    by_launcher: dict[int, list[dict]] = {}
    if not n.is_marker[key]:
        ops, stack = [], [key]
        while stack:
            k = stack.pop()
            if not n.is_marker[k]:
                ops.append(int(n.row[k]))
            stack.extend(tree.children(k).tolist())
        cur = trace.con.cursor()
        try:
            for g in cursor_dicts(cur, f"""SELECT g.launcher_id, g.op, n.name, g.start_ns, g.dur_ns, g.device_id, g.stream_id,
                                                  g.call_start_ns
                                           FROM {L.table} g JOIN {L.names} n ON n.id = g.name_id
                                           WHERE g.launcher_id IN (SELECT unnest(?::BIGINT[])) ORDER BY g.start_ns, g.gop_id""", [ops]):
                by_launcher.setdefault(g["launcher_id"], []).append(g)
        finally:
            cur.close()
    out: list[Level] = []
    shown: list[tuple[Level, int]] = []
    cut = False
    count_nodes = 0

    def visit(k, lvl):
        nonlocal cut, count_nodes
        if k != key:
            count_nodes += 1
            if lvl <= depth and len(out) < limit:
                out.append(_level(n, k, lvl))
                shown.append((out[-1], k))
            else:
                cut = True
        items = [(int(n.start_ns[c]), 1, c) for c in tree.children(k).tolist()]
        if not n.is_marker[k]:
            items += [(int(g["call_start_ns"]), 0, g) for g in by_launcher.get(int(n.row[k]), [])]
        for _, is_node, item in sorted(items, key=lambda x: (x[0], x[1])):
            if is_node:
                visit(item, lvl + 1)
            elif lvl + 1 <= depth and len(out) < limit:
                out.append(_gop_level(item, lvl + 1))
            else:
                cut = True

    visit(key, 0)
    _details(trace, n, shown)
    s, e = int(n.start_ns[key]), int(n.start_ns[key]) + int(n.dur_ns[key])
    cnt, nk, kt, t = trace.sql(f"""
        SELECT count(*), count(*) FILTER (WHERE op = 'kernel'), coalesce(sum(dur_ns) FILTER (WHERE op = 'kernel'), 0)::BIGINT,
               coalesce(sum(dur_ns), 0)::BIGINT
        FROM {L.table} WHERE pid = ? AND call_tid = ? AND call_start_ns >= ? AND call_start_ns < ?""",
                               [_nan_int(n.pid[key]), _nan_int(n.tid[key]), s, e])[0]
    return out, Totals(gpu_ops=cnt, kernels=nk, kernel_time_ns=kt, gpu_time_ns=t, host_nodes=count_nodes), cut


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
    n = trace.scalar(f"SELECT count(*) FROM {L.table} WHERE {match}", pat)
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
        f"SELECT count(*) FROM {L.table} WHERE {match} AND (start_ns < ? OR (start_ns = ? AND gop_id < ?))",
        pat + [g["start_ns"], g["start_ns"], g["gop_id"]])
    sel_names = trace.sql(f"SELECT n.name FROM {L.table} g JOIN {L.names} n ON n.id = g.name_id WHERE {match} "
                          "GROUP BY n.name ORDER BY min(g.start_ns), min(g.gop_id)", pat)
    names = list(dict.fromkeys(clip_name(r[0], 120) for r in sel_names))
    chain: list[Level] = []
    hint = None
    op_level, subtree, totals, cut, stack_arg = None, [], None, False, None
    if has_ops and g["linked"]:
        tree = _nodes(trace)
        nodes = tree.n
        if g["launcher_kind"] == "cpu_op":  # cpu_ops rows come first, by rowid
            key = int(np.searchsorted(nodes.row[:int((~nodes.is_marker).sum())], int(g["launcher_id"])))
        else:  # no enclosing cpu_op: innermost node enclosing the call start on its thread (deepest, then latest start,
            # then last in (table, rowid) order)
            c = np.flatnonzero((nodes.pid == g["pid"]) & (nodes.tid == g["call_tid"]) & (nodes.start_ns <= g["call_start_ns"])
                               & (nodes.start_ns + nodes.dur_ns > g["call_start_ns"]))
            key = None if not len(c) else int(c[np.lexsort((nodes.start_ns[c], nodes.depth[c]))][-1])
        if key is not None:
            keys = _ancestors(nodes, key)
            chain = _chain(trace, nodes, keys)
            if g["launcher_kind"] == "cpu_op":
                op_level = chain[-1]
                subtree, totals, cut = _subtree(trace, tree, key, depth, limit)
                stack_arg = _stack_arg(_args(trace, nodes, key))
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


def _args(trace: Trace, n: HostNodes, i: int) -> str | None:
    return trace.scalar("SELECT args FROM cpu_ops WHERE rowid = ?", [int(n.row[i])])


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


def _launched_ns(trace: Trace, pid: np.ndarray, tid: np.ndarray, start_ns: np.ndarray, dur_ns: np.ndarray) -> np.ndarray:
    """Per host call (pid, tid, start_ns, dur_ns): summed duration of the GPU ops whose launching call starts inside it
    on its thread, ns. Running sums over each thread's GPU ops by call start, read by two ASOF lookups per call: an
    op named 100,000 times costs a sort, not 100,000 scans of every GPU op."""
    L = launchers(trace)
    cur = trace.con.cursor()
    try:
        cur.register("_cs_calls", pd.DataFrame({"i": np.arange(len(pid)), "pid": pd.Series(pid).astype("Int64"),
                                                 "tid": pd.Series(tid).astype("Int64"), "s": start_ns, "e": start_ns + dur_ns}))
        got = cur.execute(f"""
            WITH t AS (SELECT g.pid, g.call_tid AS tid, g.call_start_ns AS t, sum(g.dur_ns) AS d
                       FROM {L.table} g SEMI JOIN (SELECT DISTINCT pid, tid FROM _cs_calls) q ON q.pid = g.pid AND q.tid = g.call_tid
                       WHERE g.call_start_ns IS NOT NULL GROUP BY ALL),
                 c AS (SELECT pid, tid, t, sum(d) OVER (PARTITION BY pid, tid ORDER BY t) AS cum FROM t),
                 hi AS (SELECT q.i, coalesce(c.cum, 0) AS cum FROM _cs_calls q ASOF LEFT JOIN c ON c.pid = q.pid AND c.tid = q.tid AND c.t < q.e),
                 lo AS (SELECT q.i, coalesce(c.cum, 0) AS cum FROM _cs_calls q ASOF LEFT JOIN c ON c.pid = q.pid AND c.tid = q.tid AND c.t < q.s)
            SELECT hi.i, (hi.cum - lo.cum)::BIGINT AS ns FROM hi JOIN lo USING (i)""").fetchnumpy()
    finally:
        cur.close()
    out = np.zeros(len(pid), dtype=np.int64)
    out[np.asarray(got["i"], dtype=np.int64)] = np.asarray(got["ns"], dtype=np.int64)
    return out


def _op_mode(trace: Trace, op: str, instance: int | None, depth: int, limit: int) -> CallStackResult:
    tree = _nodes(trace)
    n = tree.n
    name = resolve_op_name(list(dict.fromkeys(n.name.tolist())), op)
    pos_ = np.flatnonzero(n.name == name)
    pos_ = pos_[np.lexsort((n.row[pos_], n.start_ns[pos_]))]  # by (start, rowid); positions break ties (cpu_ops first)
    sel = pd.DataFrame({"start_ns": n.start_ns[pos_], "dur_ns": n.dur_ns[pos_],
                        "gpu_ns": _launched_ns(trace, n.pid[pos_], n.tid[pos_], n.start_ns[pos_], n.dur_ns[pos_])})
    pos, rule = _pick(sel, instance, ["gpu_ns", "dur_ns"], "call with the most GPU time launched inside it")
    key = int(pos_[pos])
    keys = _ancestors(n, key)
    chain = _chain(trace, n, keys)
    op_level = chain[-1].model_copy()
    chain, dropped = _cut_chain(chain, depth)
    subtree, totals, cut = _subtree(trace, tree, key, depth, limit)
    mp, frame, model_frame = _chain_summary(chain)
    hint = None if any(lv.kind == "python_frame" for lv in chain) else "the chain holds no Python frames. " + _STACK_HINT
    truncated = bool(dropped or cut)
    if truncated:
        hint = ((hint + " ") if hint else "") + "output cut: raise depth (chain levels and subtree depth, max 200) or limit (subtree entries, max 500)."
    return CallStackResult(
        data_issues=data_issue_notes(trace, ALL_TABLES),
        trace=str(trace.path), target="op", query=op, matched_names=[clip_name(name, 120)], instances=len(sel), instance=pos,
        instance_rule=rule, chain=chain, chain_truncated=dropped, module_path=mp, innermost_python_frame=frame, model_code_frame=model_frame,
        call_stack_arg=None if n.is_marker[key] else _stack_arg(_args(trace, n, key)), op=op_level, subtree=subtree,
        subtree_totals=totals, truncated=truncated, hint=hint)
