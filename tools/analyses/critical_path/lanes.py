"""Vectorised longest-path evaluation of a critical-path graph: lanes (chains) plus cross-lane edges, in rounds."""

from __future__ import annotations

import numpy as np

from ...model.errors import ProfileError

FIN, START = 0, 1  # an edge leaves its source's end, or its start (+ a lag)


class Lanes:
    """Longest-path evaluation of a DAG made of lanes (chains: a host thread, a GPU stream) plus cross-lane edges,
    vectorised. Node 0 is the root (value 0); `seq` lists every other node once, lane by lane in chain order
    (`head` marks each lane's first node), and every node but a lane head has exactly one chain edge, from the node
    before it in `seq`. Model: S[i] = max over incoming edges e of (S[src] + k_e) + delay[i], F = S + d, with
    k_e = d[src] (an end -> start edge, FIN) or min(w_e, d[src]) (a start -> start + lag edge, START).

    Why it is exact: along a lane with chain weights c_t = k_t + delay_t and Q_t = c_head+1 + ... + c_t (Q_head =
    delay_head), S_t = max(S_t-1 + k_t, X_t) + delay_t (X_t = max over cross edges) unrolls to
    S_t = Q_t + max_{u <= t}(X_u + delay_u - Q_u), a running maximum. The schedule (built once, independent of d) cuts
    every lane into runs whose cross predecessors all lie in earlier runs; one round evaluates all runs that became
    ready together (Kahn's algorithm over runs), so the Python loop is over rounds (about the number of lane
    switches on the deepest dependency chain: syncs and event hops), never over nodes. tests/analyses/test_critical_path.py
    checks it against a plain node-by-node longest path on random DAGs."""

    NEG = -(1 << 62)

    def __init__(self, n: int, seq: np.ndarray, head: np.ndarray, src: np.ndarray, dst: np.ndarray, typ: np.ndarray,
                 anc: np.ndarray, w: np.ndarray, chain: np.ndarray, delay: np.ndarray) -> None:
        self.n, self.seq, self.src, self.dst, self.typ, self.anc, self.w, self.delay = n, seq, src, dst, typ, anc, w, delay
        if len(dst) > 1 and (np.diff(dst) < 0).any():
            raise AssertionError("edges must be sorted by destination")
        # the chain edge into each seq position (-1 at lane heads)
        ce = np.flatnonzero(chain)
        pos = np.full(n, -1, dtype=np.int64)
        pos[seq] = np.arange(len(seq))
        cin = np.full(len(seq), -1, dtype=np.int64)
        cin[pos[dst[ce]]] = ce
        if not ((cin >= 0) == ~head).all() or not (src[ce] == seq[pos[dst[ce]] - 1]).all():
            raise AssertionError("chain edges must join consecutive nodes of a lane")
        self.cin, self.head = cin, head
        self.hstart = np.flatnonzero(head)
        self.hlen = np.diff(np.append(self.hstart, len(seq)))
        self._schedule(pos, np.flatnonzero(~chain))

    def _schedule(self, pos: np.ndarray, xe: np.ndarray) -> None:
        n, seq, head = self.n, self.seq, self.head
        xs, xd = self.src[xe], self.dst[xe]
        lane_lo = self.hstart
        lane_hi = lane_lo + self.hlen
        # cross edges between seq positions (the root's are satisfied from the start), by source position, so the
        # out-edges of a run [lo, hi) are one slice
        nonroot = xs != 0
        ps, pd_ = pos[xs[nonroot]], pos[xd[nonroot]]
        o = np.argsort(ps, kind="stable")
        odst = pd_[o]
        optr = np.searchsorted(ps[o], np.arange(len(seq) + 1))
        pend = np.bincount(pd_, minlength=len(seq))  # cross predecessors not yet evaluated, per position
        blocked = np.flatnonzero(pend > 0)  # positions that wait for a cross predecessor (sorted)
        nb = len(blocked)
        ptr, jb, jend = lane_lo.copy(), np.searchsorted(blocked, lane_lo), np.searchsorted(blocked, lane_hi)
        runs_lo, runs_len, rb = [], [], [0]
        while True:
            act = np.flatnonzero(ptr < lane_hi)
            if not len(act):
                break
            # per active lane, the first still-blocked position: a galloping scan over its blocked positions
            stop, nj = lane_hi[act], jend[act]
            if nb:
                stop, nj = stop.copy(), nj.copy()
                cur, lim, todo, width = jb[act], jend[act], np.arange(len(act)), 4
                while len(todo):
                    c, lm = cur[todo], lim[todo]
                    idx = c[:, None] + np.arange(width)
                    blk = (idx < lm[:, None]) & (pend[blocked[np.minimum(idx, nb - 1)]] > 0)
                    anyb = blk.any(axis=1)
                    if anyb.any():
                        j = c[anyb] + blk[anyb].argmax(axis=1)
                        nj[todo[anyb]], stop[todo[anyb]] = j, blocked[j]
                    more = ~anyb & (c + width < lm)
                    if not more.any():
                        break
                    cur[todo[more]] = c[more] + width
                    todo, width = todo[more], width * 2
            lo = ptr[act]
            ln = stop - lo
            run = ln > 0
            if not run.all():
                if not run.any():
                    raise ProfileError("the dependency graph has a cycle (timestamps contradict each other); pass a "
                                       "narrower window.")
                lo, ln = lo[run], ln[run]
            runs_lo.append(lo), runs_len.append(ln), rb.append(rb[-1] + int(ln.sum()))
            if len(lo) == 1:
                done = odst[optr[lo[0]]:optr[lo[0] + ln[0]]]
            else:
                cnt = optr[lo + ln] - optr[lo]
                done = odst[np.repeat(optr[lo] - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))]
            if len(done):
                np.subtract.at(pend, done, 1)
            ptr[act], jb[act] = stop, nj
        # The plan. sched: seq positions in evaluation order (round by round, run by run); per round the bounds of its
        # slices in the flat arrays below, each index local to its round, so the loop does no index arithmetic.
        z = np.zeros(0, dtype=np.int64)
        lo = np.concatenate(runs_lo) if runs_lo else z
        ln = np.concatenate(runs_len) if runs_len else z
        starts = np.concatenate(([0], np.cumsum(ln)[:-1])) if len(ln) else z
        rb = np.asarray(rb, dtype=np.int64)
        hb = np.concatenate(([0], np.cumsum([len(x) for x in runs_lo]))).astype(np.int64)
        self.sched = np.repeat(lo - starts, ln) + np.arange(int(ln.sum()))
        self.snodes = seq[self.sched]
        run_round = np.repeat(np.arange(len(rb) - 1), np.diff(hb))
        sid = np.repeat(np.arange(len(ln)), ln)  # run of each sched element
        self.hloc = starts - rb[run_round]  # run heads, local
        self.sidl = sid - hb[run_round][sid]  # run of each element, local
        # runs that continue a lane: carry the running maximum of the node before them
        carry = ~head[lo] if len(lo) else np.zeros(0, dtype=bool)
        self.cloc, self.cprev = self.hloc[carry], lo[carry] - 1
        cb = np.searchsorted(np.flatnonzero(carry), hb)
        # cross edges by the evaluation rank of their destination, grouped per destination
        rank = np.empty(n, dtype=np.int64)
        rank[self.snodes] = np.arange(len(self.snodes))
        xr = rank[xd]
        o = np.argsort(xr, kind="stable")
        self.xe, xr = xe[o], xr[o]
        self.srcx = self.src[self.xe]
        xb = np.searchsorted(xr, rb)
        first = np.flatnonzero(np.diff(xr, prepend=-1) != 0) if len(xr) else z
        grank = xr[first]
        gb = np.searchsorted(grank, rb)
        g_round = np.repeat(np.arange(len(rb) - 1), np.diff(gb))
        self.gloc, self.gsl = grank - rb[g_round], first - xb[g_round]
        # nodes without a cross edge take their run's running maximum
        nocross = np.ones(len(self.snodes), dtype=bool)
        nocross[grank] = False
        nc = np.flatnonzero(nocross)
        nb_ = np.searchsorted(nc, rb)
        n_round = np.repeat(np.arange(len(rb) - 1), np.diff(nb_))
        self.nloc, self.nsid = nc - rb[n_round], self.sidl[nc]
        self.plan = list(zip(*(x.tolist() for x in (rb[:-1], rb[1:], xb[:-1], xb[1:], gb[:-1], gb[1:], hb[:-1], hb[1:],
                                                        cb[:-1], cb[1:], nb_[:-1], nb_[1:]))))
        self.rounds = len(self.plan)

    def evaluate(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(S, F, bind): bind[i] = the edge that sets S[i] (the latest; on equal times the higher edge type, then the
        lower edge index), -1 for the root."""
        src, NEG = self.src, self.NEG
        k = np.where(self.anc == FIN, d[src], np.minimum(self.w, d[src]))
        # Q: per lane running sum of chain weight + delay, in seq order
        c = self.delay[self.seq] + np.where(self.cin >= 0, k[np.maximum(self.cin, 0)], 0)
        cs = np.cumsum(c)
        Q = cs - np.repeat(cs[self.hstart] - c[self.hstart], self.hlen)
        Qs = Q[self.sched]
        dq = self.delay[self.snodes] - Qs
        cnode, cq = self.seq[self.cprev], Q[self.cprev]
        kx, srcx, snodes = k[self.xe], self.srcx, self.snodes
        gloc, gsl, hloc, cloc, nloc, nsid = self.gloc, self.gsl, self.hloc, self.cloc, self.nloc, self.nsid
        S = np.zeros(self.n, dtype=np.int64)
        for a, b, ea, eb, g0, g1, h0, h1, c0, c1, n0, n1 in self.plan:
            Y = np.full(b - a, NEG, dtype=np.int64)
            if eb > ea:
                Y[gloc[g0:g1]] = np.maximum.reduceat(S[srcx[ea:eb]] + kx[ea:eb], gsl[g0:g1])
            Y += dq[a:b]
            if c1 > c0:
                cl = cloc[c0:c1]
                Y[cl] = np.maximum(Y[cl], S[cnode[c0:c1]] - cq[c0:c1])
            if n1 > n0:
                Y[nloc[n0:n1]] = Y[hloc[h0:h1]][nsid[n0:n1]]
            if h1 - h0 > 1:  # several runs: lift each run above all values of the run before it
                hl = hloc[h0:h1]
                mn, mx = np.minimum.reduceat(Y, hl), np.maximum.reduceat(Y, hl)
                off = np.concatenate(([0], np.cumsum(mx[:-1] - mn[1:] + 1)))[self.sidl[a:b]]
                S[snodes[a:b]] = np.maximum.accumulate(Y + off) - off + Qs[a:b]
            else:
                S[snodes[a:b]] = np.maximum.accumulate(Y) + Qs[a:b]
        F = S + d
        # binding edge: among edges reaching S - delay, the highest type, then the lowest index
        at = S[src] + k
        cand = np.flatnonzero(at == S[self.dst] - self.delay[self.dst])
        m = len(src)
        score = self.typ[cand].astype(np.int64) * m + (m - 1 - cand)
        grp = np.flatnonzero(np.diff(self.dst[cand], prepend=-1) != 0)
        best = np.maximum.reduceat(score, grp) if len(cand) else score
        bind = np.full(self.n, -1, dtype=np.int64)
        bind[self.dst[cand[grp]]] = m - 1 - best % m
        return S, F, bind

