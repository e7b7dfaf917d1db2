"""A critical-path graph once built (one rank, or ranks joined): evaluation, the path, and what the result reports of it."""

from __future__ import annotations

import fnmatch

import numpy as np
import pandas as pd

from ..common import clip_name, pct
from .lanes import FIN
from .result import Contributor, EndEvent, GraphStats, LaneSlack, Segment, WhatIfRule

MAX_NODES = 500_000  # graph nodes per window (~0.4 GB of graph at the cap); beyond it the window end is moved earlier (truncated = true)
KINDS = ("cpu", "launch_overhead", "gpu_compute", "copy", "communication", "graph_whole", "sync_wait", "idle_gap")
# edge types (priority on equal ready times: a GPU-side dependency wins over the host; COLL, jobs only: a rank's arrival
# at a collective -> the instance's barrier -> each rank's transfer part)
ROOT, HOST, LAUNCH, STREAM, EVENT, WAIT, COLL = 0, 1, 2, 3, 4, 5, 6
EDGE_NAMES = {ROOT: "window_start", HOST: "host_order", LAUNCH: "launch", STREAM: "stream_order", EVENT: "event_wait",
              WAIT: "sync_wait", COLL: "collective"}
DELAY_KIND = {ROOT: "idle_gap", HOST: "cpu", LAUNCH: "launch_overhead", STREAM: "idle_gap", EVENT: "sync_wait", WAIT: "sync_wait",
              COLL: "sync_wait"}
DELAY_CODE = np.array([KINDS.index(DELAY_KIND[t]) for t in range(7)], dtype=np.int64)


class _Eval:
    __slots__ = ("S", "F", "bind", "d")

    def __init__(self, S, F, bind, d):
        self.S, self.F, self.bind, self.d = S, F, bind, d


class _Path:
    __slots__ = ("end", "nodes", "entered")

    def __init__(self, end, nodes, entered):
        self.end, self.nodes, self.entered = end, nodes, entered



class Graph:
    """Nodes (measured S/E, duration d, fixed delay, kind, lane, label) and edges sorted by destination; `eval` runs
    the longest path. build.RankGraph builds one from a profile, job.job_graph joins several."""

    def evaluate(self, d: np.ndarray) -> _Eval:
        """Forward pass: S = max over incoming edges + fixed delay, F = S + duration (see Lanes)."""
        S, F, bind = self.eval.evaluate(d)
        return _Eval(S, F, bind, d)

    def path(self, ev: _Eval) -> _Path:
        F = ev.F
        last = int(F.max())
        cands = np.flatnonzero(F == last)
        # the end event: of the nodes ending last, the one evaluated last (latest start, then highest id)
        end = int(cands[np.lexsort((cands, ev.S[cands]))][-1])
        # follow the binding edges back to the root by pointer doubling (log(path length) passes over the nodes)
        up = np.where(ev.bind >= 0, self.src[np.maximum(ev.bind, 0)], 0)
        nodes = np.array([end], dtype=np.int64)
        while not (nodes == 0).any():
            nodes = np.concatenate((nodes, up[nodes]))
            up = up[up]
        nodes = nodes[:int(np.argmax(nodes == 0))]
        entered = np.concatenate(([FIN], self.anc[ev.bind[nodes[:-1]]])).astype(np.int8) if len(nodes) else np.zeros(0, np.int8)
        return _Path(end, nodes, entered)

    def _contrib(self, ev: _Eval, path: _Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per path node (end first): node, duration part ns, delay ns, delay kind code."""
        nodes = path.nodes
        b = ev.bind[nodes]
        dk = DELAY_CODE[self.typ[b]]
        succ = np.concatenate(([0], b[:-1]))  # the binding edge of the next node on the path (entered at its start)
        dur = np.where(path.entered == FIN, ev.d[nodes], np.minimum(self.w[succ], ev.d[nodes]))
        return nodes, dur, self.delay[nodes], dk

    def split(self, ev: _Eval, path: _Path) -> dict[str, int]:
        nodes, dur, dl, dk = self._contrib(ev, path)
        tot = np.zeros(len(KINDS), dtype=np.int64)
        np.add.at(tot, self.kcode[nodes], dur)
        np.add.at(tot, dk, dl)
        return {k: int(v) for k, v in zip(KINDS, tot)}

    def contributors(self, ev: _Eval, path: _Path, length: int, limit: int) -> list[Contributor]:
        nodes, dur, _, _ = self._contrib(ev, path)
        keep = dur > 0
        df = pd.DataFrame({"name": self.label[nodes[keep]], "kind": np.asarray(KINDS)[self.kcode[nodes[keep]]],
                           "lane": self._lane(nodes[keep]), "ns": dur[keep]})
        g = df.groupby(["name", "kind", "lane"])["ns"].agg(["size", "sum"]).reset_index()
        g = g.sort_values(["sum", "name", "kind", "lane"], ascending=[False, True, True, True]).head(limit)
        return [Contributor(name=clip_name(r.name), kind=r.kind, lane=r.lane, count=int(r.size), ns=int(r.sum),
                            pct_of_path=pct(int(r.sum), length)) for r in g.itertuples(index=False)]

    def segments(self, ev: _Eval, path: _Path, limit: int) -> tuple[list[Segment], int]:
        """The first `limit` runs of the path on one lane, in time order, and how many runs there are. A job's collective
        barriers (0 ns, lane 0) are no lane's work: the path runs from the last arrival's lane to a transfer part's."""
        nodes, dur, dl, _ = (x[::-1] for x in self._contrib(ev, path))  # time order: the path was collected backwards
        fin = path.entered[::-1] == FIN
        lane = self.lcode[nodes] != 0
        nodes, dur, dl, fin = nodes[lane], dur[lane], dl[lane], fin[lane]
        lo = self.base + ev.S[nodes] - dl
        hi = self.base + np.where(fin, ev.F[nodes], ev.S[nodes] + dur)
        lc = self.lcode[nodes]
        first = np.flatnonzero(np.diff(lc, prepend=-1) != 0)
        last = np.append(first[1:], len(nodes)) - 1
        run = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(nodes))))
        top = pd.Series(dur).groupby(run).idxmax().to_numpy()[:limit]  # the first longest node of each run
        out = [Segment(lane=self.lane_names[lc[f]], start_ns=int(lo[f]), end_ns=int(hi[l]), ns=int(hi[l] - lo[f]), nodes=int(l - f + 1),
                       top=clip_name(self.label[nodes[t]])) for f, l, t in zip(first[:limit], last[:limit], top)]
        return out, len(first)

    def _on_path(self, ev: _Eval, path: _Path) -> np.ndarray:
        nodes, dur, dl, _ = self._contrib(ev, path)
        on = np.zeros(len(self.lane_names), dtype=np.int64)
        np.add.at(on, self.lcode[nodes], dur + dl)
        return on

    def path_lanes(self, ev: _Eval, path: _Path) -> list[str]:
        on = self._on_path(ev, path)
        used = np.flatnonzero(np.isin(np.arange(len(on)), self.lcode[path.nodes]))
        used = used[used != 0]  # lane 0 holds the root and a job's collective barriers
        return [self.lane_names[i] for i in sorted(used.tolist(), key=lambda i: (-on[i], self.lane_names[i]))]

    def lanes(self, ev: _Eval, path: _Path) -> list[LaneSlack]:
        end = int(ev.F[path.end])
        on = self._on_path(ev, path)
        codes = self.lcode[1:]
        size = np.bincount(codes, minlength=len(on))
        last = np.full(len(on), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, codes, ev.F[1:])
        rows = [LaneSlack(lane=self.lane_names[i], nodes=int(size[i]), on_path_ns=int(on[i]), last_end_ns=self.base + int(last[i]),
                          slack_ns=end - int(last[i])) for i in np.flatnonzero(size[1:]) + 1]
        return sorted(rows, key=lambda x: (-x.on_path_ns, x.slack_ns, x.lane))

    def _lane(self, nodes: np.ndarray) -> np.ndarray:
        return np.asarray(self.lane_names, dtype=object)[self.lcode[nodes]]

    def end_event(self, ev: _Eval, path: _Path) -> EndEvent:
        i = path.end
        return EndEvent(lane=self.lane_names[self.lcode[i]], name=clip_name(self.label[i]), end_ns=self.base + int(ev.F[i]))

    def scaled(self, rules: list[dict], path: _Path) -> tuple[np.ndarray, list[WhatIfRule]]:
        d = self.d.copy()
        names = self.gops["name"].astype(str)
        shorts = self.gops["short_name"].astype(str)
        gi = self.gop_nodes
        info = []
        for r in rules:
            if r["name_contains"]:
                t = r["name_contains"].lower()
                hit = (names.str.lower().str.contains(t, regex=False) | shorts.str.lower().str.contains(t, regex=False)).to_numpy()
            else:
                hit = shorts.str.match(fnmatch.translate(r["name_glob"])).to_numpy(dtype=bool)
            nodes = gi[hit]
            info.append(WhatIfRule(name_contains=r["name_contains"], name_glob=r["name_glob"], speedup=r["speedup"],
                                   matched_ops=int(hit.sum()), matched_on_path=int(np.isin(nodes, path.nodes).sum()),
                                   matched_ns=int(self.d[nodes].sum()), hint=_glob_hint(r["name_contains"])))
            d[nodes] = np.rint(d[nodes] / r["speedup"]).astype(np.int64)
        return d, info

    def stats(self) -> GraphStats:
        counts = np.bincount(self.typ, minlength=7)
        return GraphStats(
            nodes=self.n, host_nodes=self.nh, gpu_ops=self.ng, carried_in_ops=self.n_carried,
            edges={EDGE_NAMES[t]: int(counts[t]) for t in (HOST, LAUNCH, STREAM, EVENT, WAIT, ROOT, *((COLL,) if self.job else ()))},
            event_pairs_inferred=self.events_ok, event_pairs_by_id=self.events_by_id, event_pairs_dropped=self.events_dropped,
            sync_calls=self.n_sync, sync_calls_by_event_id=self.n_sync_by_id,
            sync_calls_awaiting=self.n_awaiting, launch_edges_dropped=self.launch_dropped,
            overlapping_stream_pairs=self.overlaps, node_cap=MAX_NODES)


def _glob_hint(contains: str | None) -> str | None:
    """A substring holding glob characters is almost always a glob meant as one ('*' matches names with a literal '*')."""
    if contains and any(c in contains for c in "*?["):
        return (f"name_contains {contains!r} is a plain substring, matched literally; for a glob over short names pass "
                f"name_glob instead (CLI: --what-if 'glob:{contains}=K')")
    return None
