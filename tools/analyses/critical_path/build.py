"""One rank's critical-path graph, built from its profile: host nodes per thread, GPU ops per stream, and the edges
between them (host order, launches, stream order, event record -> wait, awaited op -> sync return, window start)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...model.trace import Trace
from ..api_summary import COPY_RE, LAUNCH_RE, SYNC_RE
from ..comm_patterns import is_comm_sql
from ..containment import SHIFT
from ..stacked import frame, run, stack, values
from .graph import EVENT, HOST, KINDS, LAUNCH, MAX_NODES, ROOT, STREAM, WAIT, Graph
from .lanes import FIN, START, Lanes

RECORD_RE = r"^(cuda|cu|hip)EventRecord"
WAIT_EVENT_RE = r"^(cuda|cu|hip)StreamWaitEvent$"
EVENT_SYNC_RE = r"^(cuda|cu|hip)EventSynchronize$"
ASYNC_ISSUE_RE = r"^(cuda|cu|hip)(Memcpy|Memset)[A-Za-z0-9]*Async$"
BUCKETS = 4096  # time slices of a window in _cut


def rank_graphs(traces: list[Trace], ranks: list[tuple]) -> list["RankGraph"]:
    """The graph of each rank (part: the profile's position in `traces`, pid or None for every process, window start
    and end, the step's thread or None) over its window: one profile, or every rank of a job read through its stacked
    store. Four statements however many ranks: the window cut (MAX_NODES), the API calls, the GPU ops, the names of
    the host gaps; each rank's rows are then built into its graph as for one profile."""
    if not ranks:
        return []
    # Times inside a graph are relative to its window start (base): pandas turns nullable integer columns into
    # float64, which is exact only below 2^53 ns, and rocpd clocks are absolute (~1.7e18 ns).
    cut = _cut(traces, ranks)
    ranks = [(part, pid, ws, cut.get(r, we), tid) for r, (part, pid, ws, we, tid) in enumerate(ranks)]
    win = values([(r, part, pid, ws, we) for r, (part, pid, ws, we, _) in enumerate(ranks)],
                 ("BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT"))
    calls = _by_rank(frame(traces, _calls_sql(traces, win)), len(ranks))
    gops = _by_rank(frame(traces, _gops_sql(traces, win)), len(ranks))
    graphs = [RankGraph(traces[part], ws, we, pid, tid, r in cut, calls[r], gops[r])
              for r, (part, pid, ws, we, tid) in enumerate(ranks)]
    names = _gap_names(traces, graphs, [part for part, *_ in ranks])
    for r, g in enumerate(graphs):
        g.finish(names.get(r, _NO_NAMES))
    return graphs


def _cut(traces: list[Trace], ranks: list[tuple]) -> dict[int, int]:
    """{rank: window end moved earlier} for the ranks whose graph could pass MAX_NODES: an API call makes at most 3 host
    nodes (gap, entry, return) and the GPU op it launches (even one starting after the window), an op 1.

    The new end is the earliest start t with more than MAX_NODES nodes starting at or before t. Found without sorting
    every event: their node counts are summed into BUCKETS equal time slices of the window (an aggregate), and only the
    events of the slice where the running count passes MAX_NODES are sorted."""
    win = values([(r, part, pid, ws, we) for r, (part, pid, ws, we, _) in enumerate(ranks)],
                 ("BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT"))
    parts = [f"""SELECT w.r, x.start_ns, (x.start_ns - w.ws) // w.width AS b, {nodes} AS w FROM ({stack(traces, table, 'pid, start_ns')}) x
                 JOIN win w ON x.part = w.part AND x.start_ns >= w.ws AND x.start_ns < w.we AND (w.pid IS NULL OR x.pid = w.pid)"""
             for table, nodes in (("api_calls", 3), ("kernels", 1), ("memops", 1))]
    rows = run(traces, f"""
        WITH win AS (SELECT r, part, pid, ws, we, (we - ws) // {BUCKETS} + 1 AS width FROM ({win}) v(r, part, pid, ws, we)),
        e AS NOT MATERIALIZED ({" UNION ALL ".join(parts)}),
        slices AS (SELECT r, b, sum(sum(w)) OVER (PARTITION BY r ORDER BY b ROWS UNBOUNDED PRECEDING) AS upto, sum(w) AS n
                   FROM e GROUP BY r, b),
        passing AS (SELECT r, min(b) AS b, arg_min(upto - n, b) AS before FROM slices WHERE upto > {MAX_NODES} GROUP BY r)
        SELECT r, min(start_ns) FILTER (WHERE nodes > {MAX_NODES}) FROM (
            SELECT e.r, e.start_ns, p.before + sum(e.w) OVER (PARTITION BY e.r ORDER BY e.start_ns ROWS UNBOUNDED PRECEDING) AS nodes
            FROM e JOIN passing p ON p.r = e.r AND p.b = e.b) GROUP BY r""")
    return {int(r): int(end) for r, end in rows}


def _calls_sql(traces: list[Trace], win: str) -> str:
    """Each rank's API calls in its window, with `outer`: a call starting before the running end of the earlier calls
    of its thread is nested in one. cid (the row's id) breaks ties in the model's order."""
    calls = stack(traces, "api_calls", "rowid AS cid, pid, tid, start_ns, end_ns, name, event_id",
                  "pid IS NOT NULL AND tid IS NOT NULL")
    return f"""
        WITH win(r, part, pid, ws, we) AS ({win})
        SELECT r, cid, pid, tid, start_ns - ws AS start_ns, end_ns - ws AS end_ns, name, event_id,
               prev_end IS NULL OR start_ns >= prev_end AS outer
        FROM (SELECT w.r, w.ws, c.cid, c.pid, c.tid, c.start_ns, c.end_ns, c.name, c.event_id,
                     max(c.end_ns) OVER (PARTITION BY w.r, c.pid, c.tid ORDER BY c.start_ns, c.end_ns DESC, c.cid
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
              FROM ({calls}) c JOIN win w ON c.part = w.part AND c.start_ns >= w.ws AND c.start_ns < w.we
                   AND (w.pid IS NULL OR c.pid = w.pid))
        ORDER BY r, pid, tid, start_ns, end_ns DESC, cid"""


def _gops_sql(traces: list[Trace], win: str) -> str:
    """Each rank's GPU ops running in its window or launched in it, with their launching call (the first of their
    correlation id in the process).

    The launching call is looked up only for the ops that can be kept (`cand`: running in the window, or with a call
    of their correlation id starting in it, as the launching call of an op launched in the window does): grouping
    every API call of the profile by correlation id cost most of the tool's first call, and ran out of DuckDB's
    memory on a 10 M-kernel export."""
    comm = is_comm_sql("g.name")
    kernels = stack(traces, "kernels", "'kernel' AS op, device_id, stream_id, start_ns, end_ns, name, short_name, pid, "
                                       "correlation_id, whole_graph, communicator, collective")
    memops = stack(traces, "memops", "op, device_id, stream_id, start_ns, end_ns, "
                                     "CASE WHEN op = 'set' THEN 'Memset' ELSE 'Memcpy ' || kind END, NULL, pid, correlation_id, false, "
                                     "NULL, NULL")
    calls = stack(traces, "api_calls", "rowid AS cid, pid, tid, start_ns, end_ns, correlation_id",
                  "correlation_id IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL")
    def running(w: str) -> str:
        return f"(g.start_ns >= {w}.ws AND g.start_ns < {w}.we) OR (g.start_ns < {w}.ws AND g.end_ns > {w}.ws)"
    return f"""
        WITH win(r, part, pid, ws, we) AS ({win}),
        g AS ({kernels} UNION ALL {memops}),
        issued AS (SELECT DISTINCT c.part, c.pid, c.correlation_id FROM ({calls}) c JOIN win w ON c.part = w.part
                   AND c.start_ns >= w.ws AND c.start_ns < w.we),
        cand AS (SELECT w.r, w.ws, w.we, g.* FROM g JOIN win w ON g.part = w.part AND (w.pid IS NULL OR g.pid = w.pid)
                 LEFT JOIN issued i ON i.part = g.part AND i.pid = g.pid AND i.correlation_id = g.correlation_id
                 WHERE {running('w')} OR i.part IS NOT NULL),
        l AS (SELECT part, pid, correlation_id, arg_min(cid, (start_ns, end_ns, cid)) AS lcid, min(start_ns) AS call_start_ns,
                     arg_min(tid, (start_ns, end_ns, cid)) AS call_tid
              FROM ({calls}) c SEMI JOIN (SELECT DISTINCT part, pid, correlation_id FROM cand) k USING (part, pid, correlation_id)
              GROUP BY part, pid, correlation_id)
        -- the stream as text, '?' when unknown: it only names lanes and compares, and no number can stand for an unknown
        -- stream (any BIGINT may be one; a nullable integer column would reach pandas as float64, exact below 2^53 only)
        SELECT g.r, g.op, g.device_id, coalesce(g.stream_id::VARCHAR, '?') AS stream_id, g.start_ns - g.ws AS start_ns,
               g.end_ns - g.ws AS end_ns, g.name, coalesce(g.short_name, g.name) AS short_name, g.pid,
               l.lcid IS NOT NULL AS linked, l.lcid, coalesce(l.call_start_ns - g.ws, g.start_ns - g.ws) AS call_start_ns,
               coalesce(l.call_tid, -1) AS call_tid, g.op = 'kernel' AND NOT g.whole_graph AND {comm} AS is_comm,
               g.whole_graph AS is_whole, g.communicator, g.collective
        FROM cand g LEFT JOIN l ON l.part = g.part AND l.pid = g.pid AND l.correlation_id = g.correlation_id
        WHERE {running('g')} OR (l.call_start_ns >= g.ws AND l.call_start_ns < g.we)
        ORDER BY g.r, g.pid, g.device_id, g.stream_id NULLS FIRST, g.start_ns, g.end_ns, g.name"""


def _gap_names(traces: list[Trace], graphs: list["RankGraph"], parts: list[int]) -> dict[int, pd.Series]:
    """{rank: names by host row}: the innermost CPU op (else annotation range) of the thread covering each gap's
    midpoint, for every rank's gaps in one statement."""
    probes = [g.gap_probes().assign(r=r, part=parts[r]) for r, g in enumerate(graphs)]
    probes = [p for p in probes if len(p)]
    if not probes:
        return {}
    probe = pd.concat(probes, ignore_index=True)
    # Each probed thread gets a key k, and times become k * 2^64 + t, so that "covers the midpoint on the same thread"
    # is two inequalities alone: an IEJoin. Matched on (part, pid, tid) as well, DuckDB hashed the thread and compared
    # every probe with every op of its thread: 250,000 ops on one thread ran for minutes. (No CTE: containment.py.)
    probe["k"] = probe.groupby(["part", "pid", "tid"], sort=False).ngroup()
    threads = probe[["part", "pid", "tid", "k"]].drop_duplicates()
    ops = stack(traces, "cpu_op_ranges", "pid, tid, start_ns, end_ns, name, 0 AS pri")
    ranges = stack(traces, "markers", "pid, tid, start_ns, end_ns, name, 1 AS pri",
                   "kind IN ('push_pop', 'start_end', 'annotation') AND pid IS NOT NULL")
    found = frame(traces, f"""
        SELECT p.r, p.i, arg_max(o.name, (-o.pri, o.start_ns, -o.end_ns)) AS name
        FROM (SELECT r, i, k::HUGEINT * {SHIFT} + t AS kt FROM _cp_probe) p
        JOIN (SELECT o.name, o.pri, o.start_ns, o.end_ns, th.k::HUGEINT * {SHIFT} + o.start_ns AS ks,
                     th.k::HUGEINT * {SHIFT} + o.end_ns AS ke
              FROM ({ops} UNION ALL {ranges}) o JOIN _cp_thread th ON th.part = o.part AND th.pid = o.pid AND th.tid = o.tid) o
          ON o.ks <= p.kt AND p.kt < o.ke
        GROUP BY p.r, p.i""", frames={"_cp_probe": probe, "_cp_thread": threads})
    return {int(r): pd.Series(g["name"].to_numpy(dtype=object), index=g["i"].to_numpy()) for r, g in found.groupby("r")}


def _by_rank(df: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    """The rows of each rank 0..n-1 (`df` sorted by column r), each as the rank's own query would return them: DuckDB
    gives a column a nullable dtype only when the rows hold a NULL, and text columns of no rows the object dtype."""
    r = df["r"].to_numpy()
    bounds = np.searchsorted(r, np.arange(n + 1))
    body = df.drop(columns="r")
    out = []
    for k in range(n):
        part = body.iloc[bounds[k]:bounds[k + 1]].reset_index(drop=True)
        for c in part.columns:
            dt = part[c].dtype
            if isinstance(dt, pd.api.extensions.ExtensionDtype) and dt.name in _NULLABLE and not part[c].isna().any():
                part[c] = part[c].astype(_NULLABLE[dt.name])
            elif not len(part) and pd.api.types.is_string_dtype(dt) and dt != object:
                part[c] = part[c].astype(object)
        out.append(part)
    return out


_NO_NAMES = pd.Series(dtype=object)  # a rank none of whose host gaps is covered
_NULLABLE = {"Int64": "int64", "Int32": "int32", "Int16": "int16", "Int8": "int8", "boolean": "bool"}


class RankGraph(Graph):
    def __init__(self, trace: Trace, ws: int, we: int, pid: int | None, main_tid: int | None, truncated: bool,
                 calls: pd.DataFrame, gops: pd.DataFrame) -> None:
        """The graph of one rank over [ws, we) (`we` already cut at MAX_NODES when `truncated`) from its API calls and
        GPU ops as rank_graphs reads them (times relative to ws); finish() completes it."""
        self.trace, self.base, self.ws, self.pid = trace, ws, ws, pid
        self.truncated, self.we = truncated, we
        calls["outer_cid"] = calls["cid"].where(calls["outer"]).ffill().fillna(-1).astype("int64")
        calls["sync"] = _has(calls["name"], SYNC_RE) | (_has(calls["name"], COPY_RE) & ~_has(calls["name"], "Async"))
        self.ws, we = 0, we - ws
        self.main = (pid, main_tid) if main_tid is not None else self._busiest_thread(calls)
        # a step's thread runs until the step's end; a caller window ends with its last event
        self.trailing = main_tid is not None
        self._inputs = (calls, gops) + self._host(calls, we)

    def gap_probes(self) -> pd.DataFrame:
        """Row i, process, thread and midpoint (absolute ns) of each host gap, to be named after what covers it."""
        host = self._inputs[2]
        gaps = host[host["role"] == "gap"]
        return pd.DataFrame({"i": gaps.index, "pid": gaps["pid"].astype("int64"), "tid": gaps["tid"].astype("int64"),
                             "t": ((gaps["S"] + gaps["E"]) // 2).astype("int64") + self.base})

    def finish(self, gap_names: pd.Series) -> None:
        """Name the host gaps (by host row, the name of what covers its midpoint) and build the graph."""
        calls, gops, host, self.n_sync, waits = self._inputs
        del self._inputs
        self._name_gaps(host, gap_names)
        self._build(host, gops, calls, waits)


    # -- data ---------------------------------------------------------------------------------------------

    def _df(self, query: str, params: list) -> pd.DataFrame:
        cur = self.trace.con.cursor()
        try:
            return cur.execute(query, params).df()
        finally:
            cur.close()

    def _busiest_thread(self, calls: pd.DataFrame):
        if calls.empty:
            return None
        c = calls.groupby(["pid", "tid"]).size().sort_values(ascending=False, kind="stable")
        return tuple(int(x) for x in c.index[0])

    def _host(self, calls: pd.DataFrame, we: int):
        """Host nodes (DataFrame) per thread: gaps, single calls, entry/return of waiting calls."""
        outer = calls[calls["outer"]].copy()
        sync_any = calls.groupby("outer_cid")["sync"].any()
        outer["wait"] = outer["cid"].map(sync_any).fillna(False).astype(bool)
        outer["k"] = outer.groupby(["pid", "tid"]).cumcount()
        parts = []
        # calls: one node, or entry + return for waiting calls
        single = outer[~outer["wait"]]
        parts.append(pd.DataFrame({"pid": single["pid"], "tid": single["tid"], "pos": 3 * single["k"] + 1,
                                   "S": single["start_ns"], "E": single["end_ns"], "name": single["name"], "role": "call",
                                   "cid": single["cid"]}))
        waits = outer[outer["wait"]]
        parts.append(pd.DataFrame({"pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 1,
                                   "S": waits["start_ns"], "E": waits["start_ns"], "name": waits["name"], "role": "entry",
                                   "cid": waits["cid"]}))
        parts.append(pd.DataFrame({"pid": waits["pid"], "tid": waits["tid"], "pos": 3 * waits["k"] + 2,
                                   "S": waits["start_ns"], "E": waits["end_ns"], "name": waits["name"], "role": "return",
                                   "cid": waits["cid"]}))
        # gaps: before each call (from the previous call's end, or the window start), and after the last on the step's thread
        prev_end = outer.groupby(["pid", "tid"])["end_ns"].shift(1, fill_value=self.ws).astype("int64")
        gap = outer.assign(gs=prev_end, ge=outer["start_ns"])
        gap = gap[gap["ge"] > gap["gs"]]
        parts.append(pd.DataFrame({"pid": gap["pid"], "tid": gap["tid"], "pos": 3 * gap["k"],
                                   "S": gap["gs"], "E": gap["ge"], "name": "", "role": "gap", "cid": -1}))
        if self.main is not None and self.trailing:
            mp, mt = self.main
            last = outer[(outer["pid"] == mp) & (outer["tid"] == mt)].tail(1)
            last_end = int(last["end_ns"].iloc[0]) if len(last) else self.ws
            if we > last_end:
                parts.append(pd.DataFrame({"pid": [mp], "tid": [mt], "pos": [3 * len(outer[(outer["pid"] == mp) & (outer["tid"] == mt)])],
                                           "S": [last_end], "E": [we], "name": [""], "role": ["gap"], "cid": [-1]}))
        host = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else pd.DataFrame(
            columns=["pid", "tid", "pos", "S", "E", "name", "role", "cid"])
        host["lane"], self.host_lanes = _lane_codes(host[["pid", "tid"]], "host {}/{}")
        host = host.sort_values(["lane", "pos"], kind="stable").reset_index(drop=True)
        host[["S", "E", "pos", "cid"]] = host[["S", "E", "pos", "cid"]].astype("int64")
        return host, int(len(waits)), waits

    def _name_gaps(self, host: pd.DataFrame, names: pd.Series) -> None:
        """Gap name = innermost CPU op (else annotation range) of the thread covering the gap's midpoint (`names`, by
        host row: rank_graphs reads them); kind."""
        gaps = host[host["role"] == "gap"]
        host["gkind"] = "cpu"
        if gaps.empty:
            return
        host.loc[gaps.index, "name"] = names.reindex(gaps.index).fillna("<host: no op recorded>")
        main = (host["pid"] == (self.main[0] if self.main else None)) & (host["tid"] == (self.main[1] if self.main else None))
        covered = host.index.isin(names.index)
        host.loc[gaps.index[~(main.loc[gaps.index] | covered[gaps.index.to_numpy()])], "gkind"] = "idle_gap"

    # -- structure ----------------------------------------------------------------------------------------

    def _build(self, host: pd.DataFrame, gops: pd.DataFrame, calls: pd.DataFrame, waits: pd.DataFrame) -> None:
        ws = self.ws
        nh, ng = len(host), len(gops)
        n = 1 + nh + ng
        self.n, self.nh, self.ng = n, nh, ng
        gi = np.arange(1 + nh, n)
        S = np.empty(n, dtype=np.int64)
        E = np.empty(n, dtype=np.int64)
        S[0] = E[0] = ws
        S[1:1 + nh], E[1:1 + nh] = host["S"].to_numpy(), host["E"].to_numpy()
        carried = (gops["start_ns"] < ws).to_numpy()
        self.n_carried = int(carried.sum())
        S[gi] = np.where(carried, ws, gops["start_ns"].to_numpy())
        E[gi] = gops["end_ns"].to_numpy()
        E[gi] = np.maximum(E[gi], S[gi])
        # kinds as their KINDS index, chosen with integer arrays (no string per node)
        kc = {k: i for i, k in enumerate(KINDS)}
        kcode = np.empty(n, dtype=np.int64)
        name = np.empty(n, dtype=object)
        kcode[0], name[0] = kc["idle_gap"], "<window start>"
        role = host["role"].to_numpy()
        hn = host["name"].to_numpy()
        launchy = _has(host["name"], LAUNCH_RE, ASYNC_ISSUE_RE, RECORD_RE, WAIT_EVENT_RE)
        kcode[1:1 + nh] = np.where(role == "gap", np.where(host["gkind"].to_numpy() == "idle_gap", kc["idle_gap"], kc["cpu"]),
                                   np.where(role == "return", kc["sync_wait"],
                                            np.where(launchy.to_numpy(), kc["launch_overhead"], kc["cpu"])))
        name[1:1 + nh] = hn
        op = gops["op"].to_numpy()
        comm = gops["is_comm"].fillna(False).to_numpy(dtype=bool)
        whole = gops["is_whole"].fillna(False).to_numpy(dtype=bool)
        kcode[gi] = np.where(op == "kernel", np.where(whole, kc["graph_whole"], np.where(comm, kc["communication"], kc["gpu_compute"])),
                             kc["copy"])
        name[gi] = gops["name"].to_numpy()
        # lanes: 0 the window start, then host threads, then GPU streams (each numbered in the order of its name)
        key, gpu_lanes = _lane_codes(pd.DataFrame({"pid": gops["pid"].astype("Int64"), "dev": gops["device_id"],
                                                   "stream": gops["stream_id"]}), "gpu {}/{}/{}")
        nl = len(self.host_lanes)
        self.lane_names = ["window", *self.host_lanes, *gpu_lanes]
        self.lcode = np.concatenate(([0], 1 + host["lane"].to_numpy(dtype=np.int64), 1 + nl + key))
        self.S_meas, self.E_meas, self.name, self.kcode = S, E, name, kcode
        self.label = np.where(pd.isna(name) | (name == ""), "<host>", name)
        self.gops = gops
        self.d = (E - S).astype(np.int64)
        self.d[1 + np.flatnonzero(role == "entry")] = 0

        src, dst, typ, anc, w, chain = [], [], [], [], [], []

        def add(s, t, ty, a=FIN, ww=None, ch=False):
            s, t = np.asarray(s, dtype=np.int64), np.asarray(t, dtype=np.int64)
            src.append(s), dst.append(t), typ.append(np.full(len(s), ty, dtype=np.int8)), anc.append(np.full(len(s), a, dtype=np.int8))
            w.append(np.zeros(len(s), dtype=np.int64) if ww is None else np.asarray(ww, dtype=np.int64))
            chain.append(np.full(len(s), ch))

        # host order (a chain per thread: host rows are sorted by lane, then position)
        hl = host["lane"].to_numpy()
        same = np.flatnonzero(hl[1:] == hl[:-1]) if nh > 1 else np.array([], dtype=np.int64)
        add(1 + same, 2 + same, HOST, ch=True)
        # waiting calls: awaited op -> return node
        ent = host[host["role"].isin(["call", "entry"])]
        node_of_cid = pd.Series(1 + ent.index.to_numpy(), index=ent["cid"].to_numpy())
        ret = host[host["role"] == "return"]
        ret_node = pd.Series(1 + ret.index.to_numpy(), index=ret["cid"].to_numpy())
        # launch: outermost call containing the launching call -> op
        outer_of = pd.Series(calls["outer_cid"].to_numpy(), index=calls["cid"].to_numpy()) if len(calls) else pd.Series(dtype="float64")
        lc = gops["lcid"].map(outer_of)
        call_node = lc.map(node_of_cid)
        has = call_node.notna().to_numpy()
        cn = call_node.to_numpy(dtype="float64")
        ok = has & (S[gi] >= np.where(has, S[np.nan_to_num(cn, nan=0).astype(np.int64)], 0)) & ~carried
        self.launch_dropped = int((has & ~carried & ~ok).sum())
        add(cn[ok].astype(np.int64), gi[ok], LAUNCH, START)
        # stream order (a chain per stream)
        order = np.lexsort((gi, E[gi], S[gi], key))
        ks = key[order]
        pairs = np.flatnonzero(ks[1:] == ks[:-1]) if ng > 1 else np.array([], dtype=np.int64)
        a_, b_ = gi[order[pairs]], gi[order[pairs + 1]]
        overl = E[a_] > S[b_]
        self.overlaps = int(overl.sum())
        add(a_[~overl], b_[~overl], STREAM, ch=True)
        add(a_[overl], b_[overl], STREAM, START, S[b_[overl]] - S[a_[overl]], ch=True)
        seq = np.concatenate((np.arange(1, 1 + nh), gi[order]))
        head = np.concatenate((np.r_[True, hl[1:] != hl[:-1]] if nh else np.zeros(0, dtype=bool),
                               np.r_[True, ks[1:] != ks[:-1]] if ng else np.zeros(0, dtype=bool)))
        # sync returns: the awaited op
        records, lk = self._records(calls, gops, gi)
        a_w, r_w = self._awaited(waits, gops, gi, lc, E, ret_node, self._event_syncs(calls, records))
        self.n_awaiting = len(a_w)
        add(a_w, r_w, WAIT)
        # cross-stream events
        self.events_ok, self.events_by_id, self.events_dropped = self._events(calls, records, lk, add)
        # root for nodes without predecessors
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        has_pred = np.zeros(n, dtype=bool)
        has_pred[dst_a] = True
        orphans = np.flatnonzero(~has_pred)
        orphans = orphans[orphans != 0]
        add(np.zeros(len(orphans), dtype=np.int64), orphans, ROOT)
        src_a, dst_a = np.concatenate(src), np.concatenate(dst)
        typ_a, anc_a, w_a, ch_a = np.concatenate(typ), np.concatenate(anc), np.concatenate(w), np.concatenate(chain)
        # edges sorted by destination (then source): the binding-edge tie-break prefers the lower index
        o = np.lexsort((src_a, dst_a))
        self.src, self.dst, self.typ, self.anc, self.w = src_a[o], dst_a[o], typ_a[o], anc_a[o], w_a[o]
        # measured ready and fixed delay
        anchor = np.where(self.anc == FIN, E[self.src], S[self.src] + self.w)
        ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ready, self.dst, anchor)
        ready[0] = ws
        # return nodes start when the later of entry and awaited op ends
        rn = 1 + np.flatnonzero(role == "return")
        S[rn] = np.maximum(S[rn], ready[rn])
        self.d[rn] = E[rn] - S[rn]
        delay = S - ready
        if not (delay >= 0).all():
            bad = np.flatnonzero(delay < 0)[:5]
            raise AssertionError(f"dependency edge ends after its successor starts: {[(int(i), self.name[i], int(S[i]), int(ready[i])) for i in bad]}")
        self.delay = delay
        self.chain, self.gop_nodes, self.job = ch_a[o], gi, False
        self.eval = Lanes(n, seq, head, self.src, self.dst, self.typ, self.anc, self.w, self.chain, delay)

    def _event_syncs(self, calls: pd.DataFrame, records: pd.DataFrame) -> pd.Series:
        """Recorded op node per waiting (outermost) call that synchronises with an event named in the profile."""
        es = calls[_has(calls["name"], EVENT_SYNC_RE)]
        got = self._by_event(es[["pid", "start_ns", "event_id", "outer_cid"]], records).dropna(subset=["rec"])
        return pd.Series(got["rec"].to_numpy(dtype=np.int64), index=got["outer_cid"].to_numpy()).groupby(level=0).max()

    def _awaited(self, waits: pd.DataFrame, gops: pd.DataFrame, gi: np.ndarray, outer: pd.Series, E: np.ndarray,
                 ret_node: pd.Series, event_rec: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """(awaited op node, return node) per waiting call. An event sync whose event the profile names waits for that
        event's recorded op (when it ended before the call returned); a blocking copy (a call that launched ops itself
        and is no *Synchronize) for the latest-ending op it launched that ended before it returned; any other waiting
        call for the latest-ending op of its process launched before the call and ended before it returned (on equal
        ends the first op in graph order)."""
        none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.n_sync_by_id = 0
        if waits.empty or gops.empty:
            return none
        ev = waits["cid"].map(event_rec)
        known = ev.notna().to_numpy() & (E[np.nan_to_num(ev.to_numpy(dtype="float64"), nan=0).astype(np.int64)] <= waits["end_ns"].to_numpy())
        by_id = (ev.to_numpy(dtype="float64")[known].astype(np.int64), ret_node.loc[waits["cid"].to_numpy()[known]].to_numpy(dtype=np.int64))
        self.n_sync_by_id = int(known.sum())
        waits = waits[~known]
        ops = pd.DataFrame({"j": np.arange(len(gops)), "outer": outer.to_numpy(dtype="float64"), "end": E[gi],
                            "issued": gops["call_start_ns"].to_numpy(dtype=np.int64),
                            "pid": gops["pid"].to_numpy(dtype="float64")})
        wt = pd.DataFrame({"cid": waits["cid"].to_numpy(dtype=np.int64), "pid": waits["pid"].to_numpy(dtype="float64"),
                           "st": waits["start_ns"].to_numpy(dtype=np.int64), "en": waits["end_ns"].to_numpy(dtype=np.int64),
                           "synchronize": waits["name"].str.lower().str.endswith("synchronize").to_numpy(dtype=bool)})
        own = ops.dropna(subset=["outer"]).astype({"outer": "int64"}).merge(wt, left_on="outer", right_on="cid")
        own_mode = wt["cid"].isin(own["cid"]) & ~wt["synchronize"]
        own = own[own["cid"].isin(wt.loc[own_mode, "cid"]) & (own["end"] <= own["en"])]
        own = own.sort_values(["cid", "end", "j"], ascending=[True, False, True]).drop_duplicates("cid")
        got = [own[["j", "cid"]]]
        for p, grp in wt[~own_mode].groupby("pid"):
            o = ops[ops["pid"] == p].sort_values(["end", "j"], ascending=[True, False])
            if o.empty:
                continue
            end, issued, j = o["end"].to_numpy(), o["issued"].to_numpy(), o["j"].to_numpy()
            st, en = grp["st"].to_numpy(), grp["en"].to_numpy()
            idx = np.searchsorted(end, en, side="right") - 1
            # step back over ops launched after the call started (launched meanwhile from another thread)
            while True:
                bad = np.flatnonzero((idx >= 0) & (issued[np.maximum(idx, 0)] >= st))
                if not len(bad):
                    break
                idx[bad] -= 1
            hit = idx >= 0
            got.append(pd.DataFrame({"j": j[idx[hit]], "cid": grp["cid"].to_numpy()[hit]}))
        pairs = pd.concat(got, ignore_index=True)
        return (np.concatenate((by_id[0], gi[pairs["j"].to_numpy(dtype=np.int64)])),
                np.concatenate((by_id[1], ret_node.loc[pairs["cid"].to_numpy()].to_numpy(dtype=np.int64))))

    def _records(self, calls: pd.DataFrame, gops: pd.DataFrame, gi: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(event record calls with their recorded op, linked ops by launch time). The recorded op is the last GPU op
        launched from the recording thread before the record (the stream recorded on is not in the model)."""
        linked = gops.assign(node=gi)[gops["linked"].to_numpy(dtype=bool) & (gops["start_ns"] >= self.ws).to_numpy()]
        lk = pd.DataFrame({"pid": linked["pid"].astype("int64"), "tid": linked["call_tid"].astype("int64"),
                           "cs": linked["call_start_ns"].astype("int64"), "node": linked["node"],
                           "device_id": linked["device_id"], "stream_id": linked["stream_id"]}).sort_values("cs")
        rec = calls[_has(calls["name"], RECORD_RE)]
        r = pd.DataFrame({"pid": rec["pid"].astype("int64"), "tid": rec["tid"].astype("int64"), "rs": rec["start_ns"].astype("int64"),
                          "event_id": rec["event_id"].astype("float64")}).sort_values("rs")
        r = pd.merge_asof(r, lk.rename(columns={"node": "rec", "device_id": "rd", "stream_id": "rst"}), left_on="rs", right_on="cs",
                          by=["pid", "tid"], allow_exact_matches=False, direction="backward").drop(columns="cs")
        return r, lk

    @staticmethod
    def _by_event(calls: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
        """For calls naming an event (event_id), the latest record of that event in the process before the call."""
        c = calls.dropna(subset=["event_id"]).sort_values("start_ns")
        r = records.dropna(subset=["event_id"])
        if c.empty or r.empty:
            return c.iloc[:0].assign(rs=pd.Series(dtype="float64"), rtid=pd.Series(dtype="float64"), rec=pd.Series(dtype="float64"),
                                     rd=pd.Series(dtype="float64"), rst=pd.Series(dtype="float64"))
        c = c.astype({"pid": "int64", "start_ns": "int64", "event_id": "float64"})
        return pd.merge_asof(c, r.rename(columns={"tid": "rtid"}), left_on="start_ns", right_on="rs", by=["pid", "event_id"],
                             allow_exact_matches=False, direction="backward").dropna(subset=["rs"])

    def _events(self, calls, records, lk, add) -> tuple[int, int, int]:
        """(pairs, of them paired by event id, pairs dropped). A wait naming an event (Nsight) is paired with the latest
        record of that event in its process; any other wait with the latest record before it on its thread."""
        wai = calls[_has(calls["name"], WAIT_EVENT_RE)]
        if records.empty or wai.empty or lk.empty:
            return 0, 0, 0
        w = pd.DataFrame({"pid": wai["pid"].astype("int64"), "tid": wai["tid"].astype("int64"),
                          "start_ns": wai["start_ns"].astype("int64"), "event_id": wai["event_id"].astype("float64"),
                          "k": np.arange(len(wai))})
        by_id = self._by_event(w, records).assign(by_id=True)
        rest = w[~w["k"].isin(by_id["k"])].sort_values("start_ns")
        order = pd.merge_asof(rest, records.drop(columns="event_id").assign(rtid=records["tid"]), left_on="start_ns", right_on="rs",
                              by=["pid", "tid"], allow_exact_matches=False, direction="backward").dropna(subset=["rs"])
        w = pd.concat([by_id.drop(columns="event_id"), order.drop(columns="event_id").assign(by_id=False)], ignore_index=True)
        w = w.dropna(subset=["rec"]).sort_values("start_ns")
        if w.empty:
            return 0, 0, 0
        w = pd.merge_asof(w, lk.rename(columns={"node": "wt", "device_id": "wd", "stream_id": "wst"}),
                          left_on="start_ns", right_on="cs", by=["pid", "tid"], allow_exact_matches=False, direction="forward")
        w = w.dropna(subset=["wt"])
        w = w[(w["rd"] != w["wd"]) | (w["rst"] != w["wst"])]
        a, b = w["rec"].to_numpy(dtype=np.int64), w["wt"].to_numpy(dtype=np.int64)
        good = self.E_meas[a] <= self.S_meas[b]
        pairs = pd.DataFrame({"a": a[good], "b": b[good], "by_id": w["by_id"].to_numpy(dtype=bool)[good]})
        pairs = pairs.sort_values("by_id", ascending=False).drop_duplicates(["a", "b"])
        add(pairs["a"].to_numpy(), pairs["b"].to_numpy(), EVENT)
        return len(pairs), int(pairs["by_id"].sum()), int((~good).sum())


def _has(series: pd.Series, *rx: str) -> pd.Series:
    """Whether any of the regexes finds a match in each value of a text column (as text), run once per distinct
    value (a few hundred API names for millions of calls) and spread back by the values' codes."""
    codes, distinct = pd.factorize(series, use_na_sentinel=False)
    pattern = "|".join("(?:" + re.sub(r"\((?!\?)", "(?:", x) + ")" for x in rx)
    hit = pd.Series(distinct).astype(str).str.contains(pattern, regex=True).to_numpy(dtype=bool)
    return pd.Series(hit[codes], index=series.index)



def _lane_codes(keys: pd.DataFrame, fmt: str) -> tuple[np.ndarray, list[str]]:
    """A lane number per row and the lane names, numbered in the order of the names: names are formatted once per
    lane, never per row."""
    if keys.empty:
        return np.zeros(0, dtype=np.int64), []
    group = keys.groupby(list(keys.columns), sort=False, dropna=False).ngroup().to_numpy()
    names = [fmt.format(*row) for row in keys.drop_duplicates().itertuples(index=False)]
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.asarray(names, dtype=object), kind="stable")] = np.arange(len(names))
    return rank[group], sorted(names)

