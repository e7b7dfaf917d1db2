"""A job's critical-path graph: each rank's graph over the same step, on one timeline, joined at the collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...model.errors import ProfileError
from ...model.trace import Trace
from ..requirements import require
from .build import RankGraph
from .graph import COLL, KINDS, STREAM, Graph
from .lanes import FIN, START, Lanes
from .result import CollectiveLinks, JobRank
from .window import choose_window


def job_graph(traces: list[Trace], step, marker, pid, start_ns, end_ns):
    """One graph over the ranks of a job: each rank's graph as for one profile (same step index, on one timeline),
    joined at the collectives. Returns (graph, window start, choice, note, source, {"ranks", "collectives"})."""
    from ..rank_summary import job_ranks

    if pid is not None:
        raise ProfileError("pid selects a process of one profile; a job takes every rank: pass one rank's profile with "
                           "pid, or the job without it.")
    units = job_ranks(traces, [])
    graphs: list[Graph] = []
    for u in units:
        require(u.trace, "critical_path")
        upid = None if (u.whole or u.pid is None) else int(u.pid)
        at = step if not graphs or choice is None else choice.index  # the first rank's step on every rank
        ws, we, tid, p, ch, nt, src = choose_window(u.trace, at, marker, upid, start_ns, end_ns)
        if not graphs:
            choice, note, source = ch, nt, src
        graphs.append(RankGraph(u.trace, ws, we, p, tid))
    g, base, job = _join(graphs, units)
    return g, base, choice, note + f"; the same window on each of {len(units)} ranks (clocks assumed aligned)", source, job


def _join(graphs: list[Graph], units) -> tuple[Graph, int, dict]:
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
    gops = pd.concat([g.gops[["name", "short_name", "is_comm"]] for g in graphs], ignore_index=True)
    gop_nodes = np.concatenate([g.gop_nodes + P[r] for r, g in enumerate(graphs)]).astype(np.int64)
    rank_of = np.concatenate([np.full(len(g.gop_nodes), u.rank) for u, g in zip(units, graphs)])

    # collective instances: the k-th communication kernel of one name on each rank with communication kernels
    comm = pd.DataFrame({"rank": rank_of, "node": gop_nodes, "name": gops["name"].astype(str).to_numpy(),
                         "S": S[gop_nodes], "E": E[gop_nodes]})[gops["is_comm"].fillna(False).to_numpy(dtype=bool)]
    comm = comm.sort_values(["rank", "S", "E", "node"], kind="stable")
    comm["k"] = comm.groupby(["rank", "name"]).cumcount()
    nr = int(comm["rank"].nunique())
    size = comm.groupby(["name", "k"])["rank"].transform("size").to_numpy()
    linked = comm[size == nr] if nr > 1 else comm.iloc[:0]
    linked = linked.assign(inst=linked.groupby(["name", "k"]).ngroup()).sort_values(["inst", "rank"], kind="stable")
    K = linked["node"].to_numpy(dtype=np.int64)
    last = linked.groupby("inst")["S"].transform("max").to_numpy(dtype=np.int64)
    X = n0 + np.arange(len(K), dtype=np.int64)  # the transfer parts: new nodes, each right after its arrival on its lane
    n = n0 + len(K)
    xend = np.maximum(E[K], last)
    clamped = int((last > E[K]).sum())
    wait = int((last - S[K]).sum())
    S, E, d = np.concatenate((S, last)), np.concatenate((E, xend)), np.concatenate((d, xend - last))
    kcode, lcode, label = np.concatenate((kcode, kcode[K])), np.concatenate((lcode, lcode[K])), np.concatenate((label, label[K]))
    E[K], d[K] = S[K], 0
    kcode[K] = KINDS.index("sync_wait")
    label[K] = label[K] + " (arrival)"
    xmap = np.full(n0, -1, dtype=np.int64)
    xmap[K] = X
    # what left the kernel now leaves its transfer part (a start -> start + lag edge keeps its target time)
    out = xmap[src] >= 0
    lag = out & (anc == START)
    w[lag] = np.maximum(0, w[lag] - (S[xmap[src[lag]]] - S[src[lag]]))
    src[out] = xmap[src[out]]
    gop_nodes = np.where(xmap[gop_nodes] >= 0, xmap[gop_nodes], gop_nodes)
    a = K.reshape(-1, nr) if len(K) else np.zeros((0, max(nr, 1)), dtype=np.int64)
    b = X.reshape(-1, nr) if len(K) else a
    other = ~np.eye(a.shape[1], dtype=bool)
    cs = np.broadcast_to(a[:, :, None], (len(a), a.shape[1], a.shape[1]))[:, other]
    cd = np.broadcast_to(b[:, None, :], (len(b), b.shape[1], b.shape[1]))[:, other]
    src = np.concatenate((src, K, cs.ravel()))
    dst = np.concatenate((dst, X, cd.ravel()))
    typ = np.concatenate((typ, np.full(len(K), STREAM, np.int8), np.full(cs.size, COLL, np.int8)))
    anc = np.concatenate((anc, np.full(len(K) + cs.size, FIN, np.int8)))
    w = np.concatenate((w, np.zeros(len(K) + cs.size, dtype=np.int64)))
    chain = np.concatenate((chain, np.ones(len(K), bool), np.zeros(cs.size, bool)))
    pos = np.empty(n0, dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    seq = np.insert(seq, pos[K] + 1, X)
    head = np.insert(head, pos[K] + 1, False)
    o = np.lexsort((src, dst))
    src, dst, typ, anc, w, chain = src[o], dst[o], typ[o], anc[o], w[o], chain[o]
    # measured ready and fixed delay on the common timeline; skew can make a delay negative: it is clamped to 0
    ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ready, dst, np.where(anc == FIN, E[src], S[src] + w))
    ready[0] = 0
    delay = np.maximum(S - ready, 0)

    m = object.__new__(Graph)
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
    links = CollectiveLinks(ranks_with_comm=nr, instances=len(K) // max(nr, 1), unlinked=int(comm.groupby(["name", "k"]).ngroups) - len(K) // max(nr, 1),
                            edges=int(cs.size), wait_ns=wait, clamped_transfers=clamped)
    return m, base, {"ranks": ranks, "collectives": links}

