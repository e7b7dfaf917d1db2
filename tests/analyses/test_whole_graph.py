"""Whole-graph CUDA graph replays (Nsight --cuda-graph-trace=graph: one kernels row per replay, whole_graph = true, the
kernels inside not in the export) are never silently counted as computation by the tools that split computation from
communication: each names them as their own kind or category, or states how many ns of its computation figure they
are, with the advice to re-capture with --cuda-graph-trace=node. Exact against fixtures/scenarios_graph_summary.py's
graph_replays_whole (truth from the scenario: each replay spans its graph kernels' first start to last end)."""

from __future__ import annotations

from gpuscope.fixtures import scenarios_graph_summary as G
from gpuscope.fixtures.truth import merge, time_shift
from gpuscope.tools import analyses as A
from gpuscope.tools.analyses.ops_summary import WHOLE_GRAPH_CATEGORY

ADVICE = "--cuda-graph-trace=node"


def _replays(s) -> dict[int, list[tuple[int, int]]]:
    """device -> [(start, end)] of every whole-graph replay the Nsight writer writes."""
    by: dict[tuple, list] = {}
    for k in G.graph_kernels(s):
        by.setdefault((k.device_id, k.pid, k.correlation_id), []).append(k)
    out: dict[int, list] = {}
    for (dev, _, _), ks in by.items():
        out.setdefault(dev, []).append((min(k.start_ns for k in ks), max(k.end_ns for k in ks)))
    return out


def _open(open_profile):
    return open_profile("graph_replays_whole", "nsys", None, G.SCENARIOS)


def test_gpu_timeline_comm_summary_and_diagnose_state_the_replays(open_profile):
    s = G.graph_replays_whole()
    t = _open(open_profile)
    replays = _replays(s)
    n_all, ns_all = sum(len(v) for v in replays.values()), sum(e - b for v in replays.values() for b, e in v)
    assert (n_all, ns_all) == (5, 318_000 + 60_000)  # by hand: 93 + 106 + 119 us on GPU 0, 25 + 35 us on GPU 1
    tl = A.gpu_timeline(t)
    for row in tl.timelines:
        mine = replays[row.device_id]
        assert row.whole_graph_ops == len(mine)
        assert row.whole_graph_ns == sum(e - b for b, e in merge(mine))
        assert row.whole_graph_ns <= row.computation_ns and row.total_comm_ns == 0
    assert (tl.whole_graph.replays, tl.whole_graph.time_ns) == (n_all, ns_all)
    assert "computation" in tl.whole_graph.counted_as and ADVICE in tl.whole_graph.note and ADVICE in tl.hint
    cs = A.comm_summary(t)
    assert not cs.matched and (cs.whole_graph.replays, cs.whole_graph.time_ns) == (n_all, ns_all)
    assert ADVICE in cs.message and cs.whole_graph.note in cs.notes
    dg = A.diagnose(t)
    dev = dg.device_id
    assert (dg.whole_graph.replays, dg.whole_graph.time_ns) == (len(replays[dev]), sum(e - b for b, e in replays[dev]))
    assert any(ADVICE in x for x in dg.not_judged)
    assert any(n.tool == "comm_summary" and "traced whole" in n.reason for n in dg.not_applicable)
    cap = next(c for c in A.trace_info(t).capabilities if c.tool == "comm_summary")
    assert not cap.available and f"{n_all} CUDA graph replays" in cap.reason and ADVICE in cap.reason


def test_ops_summary_and_critical_path_give_replays_their_own_category(open_profile):
    s = G.graph_replays_whole()
    shift = time_shift(s, "nsys")
    t = _open(open_profile)
    rows = {r.name: r for r in A.ops_summary(t).rows}
    for gid in (1, 2):
        r = rows[f"CUDA graph {gid}"]
        assert r.categories == [WHOLE_GRAPH_CATEGORY]
    # the window holds replay 0 of graph 1 only: its 93 us are on the path as graph_whole, none as gpu_compute
    (b, e), = [x for x in _replays(s)[0] if x[0] < 1_100_000]
    cp = A.critical_path(t, start_ns=900_000 + shift, end_ns=1_200_000 + shift)
    split = {x.kind: x.ns for x in cp.split}
    assert split["graph_whole"] == e - b == 93_000
    assert split["gpu_compute"] == 0 and split["communication"] == 0
    assert cp.top_contributors[0].kind == "graph_whole"


def test_job_tools_state_the_replays(open_profile):
    s = G.graph_replays_whole()
    t = _open(open_profile)
    replays = _replays(s)
    rs = A.rank_summary([t])
    (row,) = rs.ranks
    assert row.whole_graph_ns == sum(sum(e - b for b, e in merge(v)) for v in replays.values()) == 378_000
    assert {d.device_id: d.whole_graph_ns for d in row.per_device} == {d: sum(e - b for b, e in merge(v)) for d, v in replays.items()}
    assert any("compute_ns includes 378000 ns" in n and ADVICE in n for n in row.notes)
    for res in (A.straggler_summary([t]), A.comm_job_summary([t])):
        assert any("5 CUDA graph replays (378000 ns, summed over ranks)" in n and ADVICE in n for n in res.notes)
