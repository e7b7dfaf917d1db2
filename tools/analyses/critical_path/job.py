"""A job's critical-path graph: each rank's graph over the same step, on one timeline, joined at the collectives.
Point-to-point kernels (Send, Recv, SendRecv: the operation the profile records, else the kernel name) are never
joined: their peer rank is not in the model."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...model.errors import ProfileError
from ...model.trace import Trace
from ..collectives import KIND_LABELS, instances_sql, match_rule
from ..requirements import require
from ..stacked import frame
from .build import rank_graphs
from .graph import COLL, KINDS, STREAM, Graph
from .lanes import FIN, START, Lanes
from .result import CollectiveLinks, JobRank
from .window import choose_windows


def job_graph(traces: list[Trace], step, marker, pid, start_ns, end_ns):
    """One graph over the ranks of a job: each rank's graph as for one profile (same step index, on one timeline),
    joined at the collectives. Returns (graph, window start, choice, note, source, {"ranks", "collectives"})."""
    from ..rank_summary import job_ranks

    if pid is not None:
        raise ProfileError("pid selects a process of one profile; a job takes every rank: pass one rank's profile with "
                           "pid, or the job without it.")
    units = job_ranks(traces, [])
    for u in units:
        require(u.trace, "critical_path")
    # every rank's window and graph from a fixed number of statements over the job's stacked store
    scopes = [(u.order, None if (u.whole or u.pid is None) else int(u.pid)) for u in units]
    spans, choice, note, source = choose_windows(traces, scopes, step, marker, start_ns, end_ns)
    graphs: list[Graph] = rank_graphs(traces, [(part, p, ws, we, tid) for (part, _), (ws, we, tid, p) in zip(scopes, spans)])
    g, base, job = _join(traces, graphs, units)
    return g, base, choice, note + f"; the same window on each of {len(units)} ranks (clocks assumed aligned)", source, job


def _join(traces: list[Trace], graphs: list[Graph], units) -> tuple[Graph, int, dict]:
    base = min(g.base for g in graphs)
    P = np.cumsum([0] + [g.n - 1 for g in graphs])  # node i > 0 of rank graph r -> i + P[r]; every root -> 0
    LP = np.cumsum([0] + [len(g.lane_names) - 1 for g in graphs])
    n0 = int(P[-1]) + 1

    def cat(f, first):
        return np.concatenate([np.asarray([first], dtype=np.asarray(f(graphs[0])).dtype)] + [np.asarray(f(g))[1:] for g in graphs])

    S = cat(lambda g: g.S_meas + (g.base - base), 0)
    S[0] = 0
    d = cat(lambda g: g.d, 0)
    E = S + d
    kcode = cat(lambda g: g.kcode, KINDS.index("idle_gap"))
    lcode = np.concatenate([[0]] + [np.where(g.lcode[1:] == 0, 0, g.lcode[1:] + LP[r]) for r, g in enumerate(graphs)]).astype(np.int64)
    label = np.concatenate([np.asarray(["<window start>"], dtype=object)] + [g.label[1:].astype(object) for g in graphs])
    lane_names = ["window"] + [f"rank {u.rank} {x}" for u, g in zip(units, graphs) for x in g.lane_names[1:]]

    def nodes(r, i):
        return np.where(i == 0, 0, i + P[r])

    src = np.concatenate([nodes(r, g.src) for r, g in enumerate(graphs)])
    dst = np.concatenate([nodes(r, g.dst) for r, g in enumerate(graphs)])
    typ = np.concatenate([g.typ for g in graphs])
    anc = np.concatenate([g.anc for g in graphs])
    w = np.concatenate([g.w for g in graphs]).astype(np.int64)
    chain = np.concatenate([g.chain for g in graphs])
    seq = np.concatenate([g.eval.seq + P[r] for r, g in enumerate(graphs)])
    head = np.concatenate([g.eval.head for g in graphs])
    gops = pd.concat([g.gops[["name", "short_name", "is_comm", "communicator", "collective"]] for g in graphs], ignore_index=True)
    gop_nodes = np.concatenate([g.gop_nodes + P[r] for r, g in enumerate(graphs)]).astype(np.int64)
    rank_of = np.concatenate([np.full(len(g.gop_nodes), u.rank) for u, g in zip(units, graphs)])

    comm = gops["is_comm"].fillna(False).to_numpy(dtype=bool)
    inst, links = _instances(traces, pd.DataFrame({
        "rank": rank_of[comm], "node": gop_nodes[comm], "name": gops["name"].astype(str).to_numpy()[comm],
        "collective": _text(gops["collective"])[comm], "communicator": _text(gops["communicator"])[comm],
        "start_ns": S[gop_nodes[comm]], "dur_ns": d[gop_nodes[comm]]}))
    K = inst["node"].to_numpy(dtype=np.int64)
    of = inst["inst"].to_numpy(dtype=np.int64)
    nb = int(of.max()) + 1 if len(of) else 0
    last_of = inst.groupby("inst")["S"].max().to_numpy(dtype=np.int64) if nb else np.zeros(0, dtype=np.int64)
    last = last_of[of]
    # new nodes: each rank's transfer part (right after its arrival on its lane), then one barrier per instance
    X = n0 + np.arange(len(K), dtype=np.int64)
    B = n0 + len(K) + np.arange(nb, dtype=np.int64)
    n = n0 + len(K) + nb
    xend = np.maximum(E[K], last)
    clamped = int((last > E[K]).sum())
    wait = int((last - S[K]).sum())
    S, E, d = np.concatenate((S, last, last_of)), np.concatenate((E, xend, last_of)), np.concatenate((d, xend - last, np.zeros(nb, np.int64)))
    sync = KINDS.index("sync_wait")
    kcode = np.concatenate((kcode, kcode[K], np.full(nb, sync)))
    lcode = np.concatenate((lcode, lcode[K], np.zeros(nb, dtype=np.int64)))  # lane 0: not an execution lane (as the root)
    label = np.concatenate((label, label[K], inst.drop_duplicates("inst")["barrier"].to_numpy(dtype=object)))
    E[K], d[K] = S[K], 0
    kcode[K] = sync
    label[K] = label[K] + " (arrival)"
    xmap = np.full(n0, -1, dtype=np.int64)
    xmap[K] = X
    # what left the kernel now leaves its transfer part (a start -> start + lag edge keeps its target time)
    out = xmap[src] >= 0
    lag = out & (anc == START)
    w[lag] = np.maximum(0, w[lag] - (S[xmap[src[lag]]] - S[src[lag]]))
    src[out] = xmap[src[out]]
    gop_nodes = np.where(xmap[gop_nodes] >= 0, xmap[gop_nodes], gop_nodes)
    # every arrival -> its instance's barrier (0 ns, at the last arrival) -> every transfer part: 2 edges per rank
    src = np.concatenate((src, K, K, B[of]))
    dst = np.concatenate((dst, X, B[of], X))
    typ = np.concatenate((typ, np.full(len(K), STREAM, np.int8), np.full(2 * len(K), COLL, np.int8)))
    anc = np.concatenate((anc, np.full(3 * len(K), FIN, np.int8)))
    w = np.concatenate((w, np.zeros(3 * len(K), dtype=np.int64)))
    chain = np.concatenate((chain, np.ones(len(K), bool), np.zeros(2 * len(K), bool)))
    pos = np.empty(n0, dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    seq = np.concatenate((np.insert(seq, pos[K] + 1, X), B))  # a barrier is a lane of its own
    head = np.concatenate((np.insert(head, pos[K] + 1, False), np.ones(nb, bool)))
    o = np.lexsort((src, dst))
    src, dst, typ, anc, w, chain = src[o], dst[o], typ[o], anc[o], w[o], chain[o]
    # measured ready and fixed delay on the common timeline; skew can make a delay negative: it is clamped to 0
    ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ready, dst, np.where(anc == FIN, E[src], S[src] + w))
    ready[0] = 0
    delay = np.maximum(S - ready, 0)

    m = Graph()
    m.trace, m.base, m.ws, m.pid, m.job = None, base, 0, None, True
    m.truncated, m.we = any(g.truncated for g in graphs), max(g.we for g in graphs)
    m.n, m.nh, m.ng = n, sum(g.nh for g in graphs), sum(g.ng for g in graphs)
    for f in ("n_carried", "n_sync", "n_sync_by_id", "n_awaiting", "launch_dropped", "overlaps", "events_ok", "events_by_id",
              "events_dropped"):
        setattr(m, f, sum(getattr(g, f) for g in graphs))
    m.src, m.dst, m.typ, m.anc, m.w, m.chain, m.delay, m.d = src, dst, typ, anc, w, chain, delay, d
    m.kcode, m.lcode, m.label, m.lane_names, m.gops, m.gop_nodes = kcode, lcode, label, lane_names, gops, gop_nodes
    m.eval = Lanes(n, seq, head, src, dst, typ, anc, w, chain, delay)
    ranks = [JobRank(rank=u.rank, trace=u.trace.path.name, pid=u.pid, window_start_ns=g.base, nodes=g.n - 1)
             for u, g in zip(units, graphs)]
    links = CollectiveLinks(**links, edges=2 * len(K), wait_ns=wait, clamped_transfers=clamped)
    return m, base, {"ranks": ranks, "collectives": links}



def _instances(traces: list[Trace], comm: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The communication kernels of the rank graphs (rank, node, name, collective, communicator, start_ns, dur_ns on
    the job's timeline) numbered into instances by the shared rule (collectives.instances_sql; point-to-point kernels
    are counted, never linked): the linked kernels (node, rank, S, inst, barrier label), sorted by instance then rank,
    and the counts for CollectiveLinks. Two statements over the window's kernels, a DataFrame."""
    cte = "WITH " + instances_sql("SELECT rank, name::VARCHAR AS name, collective::VARCHAR AS collective, "
                                  "communicator::VARCHAR AS communicator, start_ns, dur_ns, node AS tie FROM cp_comm")
    linked = frame(traces, cte + """
        SELECT n.tie AS node, n.rank, n.start_ns AS S, n.coll, n.comm, n.seq,
               dense_rank() OVER (ORDER BY n.comm NULLS FIRST, n.name, n.seq) - 1 AS inst
        FROM n JOIN inst i ON n.comm IS NOT DISTINCT FROM i.comm AND n.name = i.name AND n.seq = i.seq
        WHERE i.complete ORDER BY inst, n.rank""", frames={"cp_comm": comm})
    (ranks, kernels, by_comm, missing, p2p, complete, incomplete), = frame(traces, cte + """
        SELECT rule.ranks, rule.kernels, rule.by_comm, rule.missing, rule.p2p_kernels,
               (SELECT count(*) FILTER (WHERE complete) FROM inst), (SELECT count(*) FILTER (WHERE NOT complete) FROM inst)
        FROM rule""", frames={"cp_comm": comm}).itertuples(index=False)
    kind = np.asarray(KIND_LABELS, dtype=object)[linked["coll"].to_numpy(dtype=np.int64)]
    key = np.where(linked["comm"].isna(), " (name order)", " communicator " + linked["comm"].astype(str))
    linked["barrier"] = "collective barrier " + kind + key + " #" + linked["seq"].astype(str)
    by_comm, complete = bool(by_comm), int(complete)
    return linked, {"ranks_with_comm": int(ranks), "collective_match": match_rule(int(kernels), by_comm),
                    "comm_kernels": int(kernels), "p2p_kernels": int(p2p),
                    "comm_kernels_with_communicator": int(kernels) - int(missing), "instances": complete,
                    "instances_by_communicator": complete if by_comm else 0,
                    "instances_by_name_order": 0 if by_comm else complete, "unlinked": int(incomplete)}


def _text(col: pd.Series) -> np.ndarray:
    """A text column of the rank graphs' ops as objects, NULL as None (how DuckDB reads a missing value)."""
    return col.astype(object).where(col.notna(), None).to_numpy(dtype=object)
