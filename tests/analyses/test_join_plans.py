"""No tool's SQL asks DuckDB for a quadratic join (tools/analyses/containment.py).

Every statement the tools run on a set of fixtures (op trees, annotations, NVTX ranges, copies, syncs; Nsight and
PyTorch) is captured and EXPLAINed (queries, and the temp tables made from a query), on a profile's model and over
a job's stacked stores. A join DuckDB can only run by comparing every row with every row fails the
test: a BLOCKWISE_NL_JOIN (a LEFT JOIN whose ON clause tests one side alone, or any non-comparison condition) or a
PIECEWISE_MERGE_JOIN on two or more inequalities (a containment join planned below a materialized CTE, where
DuckDB cannot use its IEJoin), or a HASH_JOIN with two or more inequalities beside its keys (a containment join
matched on the thread as well: DuckDB hashes the thread and compares every pair of rows within it). On a 1.25 M-event trace such joins made api_summary, ops_summary, diagnose and
call_stack run for minutes. Plans are read, not timed: the fixtures are small, and merge_join_threshold = 0
(limits.py) makes DuckDB plan them as it would plan large profiles.
"""

from __future__ import annotations

import importlib
import json
import re
import statistics

import pytest

from conftest import write_scenario
from gpuscope.fixtures.scenarios_iterations import many_ranges
from gpuscope.fixtures.truth import time_shift
from gpuscope.tools import analyses as A
from gpuscope.tools.analyses import projection
from gpuscope.tools.model import hub
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

TOOLS = ["trace_info", "top_kernels", "gap_histogram", "memcpy_summary", "stream_summary", "marker_summary", "iterations",
         "api_summary", "gpu_timeline", "comm_summary", "phases", "ops_summary", "perf_summary", "diagnose", "graph_summary",
         "memory_timeline", "roofline", "critical_path", "call_stack"]
CASES = [("catalog", "concurrent_streams"), ("catalog", "graph_launch"), ("scenarios_ops_summary", None),
         ("scenarios_marker_summary", None), ("scenarios_api_summary", None), ("scenarios_iterations", None)]
# Hash joins with inequalities beside a key whose build side holds one row per key (linear): stream_summary's sweep
# joins each device's levels with that device's top level and the start of its first period there; critical_path
# joins each rank's calls with the rank's one window.
ONE_ROW_PER_KEY = {("device_id = device_id", "max_start < t", "top > level"), ("device_id = device_id", "t > max_start", "level < top"),
                   ("CAST(part AS BIGINT) = part", "start_ns >= ws", "start_ns < we"),
                   ("part = CAST(part AS BIGINT)", "ws <= start_ns", "we > start_ns")}


def _scenarios():
    out = []
    for module, only in CASES:
        s = importlib.import_module(f"gpuscope.fixtures.{module}").SCENARIOS
        out += [(module, name) for name in s if only in (None, name)]
    return out


def _quadratic(node, found):
    name = node.get("name", "").strip()
    info = node.get("extra_info", {})
    conds = info.get("Conditions") or info.get("Condition") or []
    conds = [" ".join(c.split()) for c in ([conds] if isinstance(conds, str) else conds)]
    inequalities = [c for c in conds if re.search(r"[<>]", c) and "<>" not in c]
    if name == "BLOCKWISE_NL_JOIN" or (name == "PIECEWISE_MERGE_JOIN" and len(conds) >= 2) or (
            name == "HASH_JOIN" and len(inequalities) >= 2):
        found.append((name, tuple(conds)))
    for child in node.get("children", []):
        _quadratic(child, found)


def _bad(captured) -> list:
    """(join, conditions, query) of every quadratic join in the captured plans."""
    bad = []
    assert captured
    for query, plan in captured:
        found = []
        for node in plan:
            _quadratic(node, found)
        bad += [(join, conds, " ".join(query.split())[:160]) for join, conds in found if conds not in ONE_ROW_PER_KEY]
    return bad


@pytest.fixture
def captured(monkeypatch):
    """The plans of the statements run on a trace's cursor or on a cursor of the shared instance (a job's)."""
    queries = []
    plain = hub.ModelConnection.cursor

    class Recording:
        def __init__(self, cur):
            self._cur = cur

        def execute(self, query, params=None):
            # planned where it runs (its temp tables exist)
            if query.lstrip().upper().startswith(("SELECT", "WITH", "CREATE OR REPLACE TEMP TABLE")):
                explain = "EXPLAIN (FORMAT json) " + query
                res = self._cur.execute(explain) if params is None else self._cur.execute(explain, params)
                queries.append((query, json.loads(res.fetchall()[0][1])))
            return self._cur.execute(query) if params is None else self._cur.execute(query, params)

        def __getattr__(self, name):
            return getattr(self._cur, name)

    class Instance:  # the shared instance, whose cursors run a job's statements (job.job_sql, job_df)
        def __init__(self, con):
            self._con = con

        def cursor(self):
            return Recording(self._con.cursor())

        def __getattr__(self, name):
            return getattr(self._con, name)

    monkeypatch.setattr(hub.ModelConnection, "cursor", lambda self: Recording(plain(self)))
    shared = hub.hub()
    monkeypatch.setattr(shared, "con", Instance(shared.con))
    return queries


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
@pytest.mark.parametrize("module,name", _scenarios())
def test_no_tool_plans_a_quadratic_join(tmp_path, captured, module, name, fmt):
    scenario = importlib.import_module(f"gpuscope.fixtures.{module}").SCENARIOS[name]()
    trace = load_trace(write_scenario(scenario, fmt, tmp_path / (name + (".json" if fmt == "kineto" else ".sqlite"))))
    try:
        for tool in TOOLS:
            kw = {}
            if tool == "call_stack":
                ops = trace.sql("SELECT name FROM cpu_ops GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1")
                if not ops:
                    continue
                kw = {"op": ops[0][0]}
            try:
                getattr(A, tool)(trace, **kw)
            except ProfileError:
                pass
        bad = _bad(captured)
        assert not bad, bad
    finally:
        trace.close()


def _depths(s) -> dict[str, int]:
    """Fewest enclosing ranges (same thread, start <= start and end <= end) of a range of each name pattern, by
    comparing every pair of the scenario's ranges (a small scenario)."""
    out: dict[str, int] = {}
    for c in s.markers:
        n = sum(p is not c and p.tid == c.tid and p.start_ns <= c.start_ns and c.end_ns <= p.end_ns for p in s.markers)
        pattern = re.sub("[0-9]+", "<N>", c.name)
        out[pattern] = min(out.get(pattern, n), n)
    return out


def _median_steady(walls: list[int]) -> int:
    """The step critical_path takes by default: the median-length step after the warm-up (the iterations rule)."""
    warm = 0
    while warm < len(walls) - 2 and walls[warm] > 1.5 * statistics.median(walls[warm + 1:]):
        warm += 1
    ranked = sorted(range(warm, len(walls)), key=lambda i: (walls[i], i))
    return ranked[(len(ranked) - 1) // 2]


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
def test_many_ranges_on_one_thread(tmp_path, captured, fmt):
    """Thousands of ranges on one thread, nesting and overlapping without nesting: the step choice (range depth, GPU
    work inside each range) and the step figures join them as IEJoins, for one profile and for a job, and choose
    the steps the fixture wrote."""
    suffix = ".json" if fmt == "kineto" else ".sqlite"
    s = many_ranges()
    shift = time_shift(s, fmt)
    steps = sorted((m for m in s.markers if m.name.startswith("step_")), key=lambda m: m.start_ns)
    walls = [m.end_ns - m.start_ns for m in steps]
    trace = load_trace(write_scenario(s, fmt, tmp_path / ("one" + suffix)))
    ranks = [load_trace(write_scenario(many_ranges(300, pid=4000 + r), fmt, tmp_path / f"rank{r}{suffix}")) for r in range(2)]
    try:
        res = A.iterations(trace, limit=None)
        assert res.choice.how == "auto" and res.choice.pattern == "step_<N>"
        assert [(x.name, x.start_ns, x.end_ns) for x in res.steps] == [(m.name, m.start_ns + shift, m.end_ns + shift) for m in steps]
        assert res.summaries[0].warmup_steps == [0]
        assert all(x.projected_kernels == x.window_kernels == 4 for x in res.steps)
        # 'wait_<N>' starts while a prefetch range is open but ends after it: inside the next step only
        depth = _depths(many_ranges(4))
        assert depth["wait_<N>"] == 1 and depth["load_<N>"] == 2 and depth["prefetch_<N>"] == 0
        n = len(steps)
        assert {(a.pattern, a.instances, a.min_depth) for a in res.alternatives} == {
            (p, {"layer_<N>": 3 * n, "fwd": n, "opt": n}.get(p, n - 1), depth[p])
            for p in ("layer_<N>", "fwd", "opt", "prefetch_<N>", "load_<N>", "wait_<N>")}
        cp = A.critical_path(trace)
        assert cp.iteration.index == _median_steady(walls) and cp.iteration.steps == n
        # a job: every rank's steps in one choice (rank_summary, critical_path's other ranks)
        rank_walls = [m.end_ns - m.start_ns for m in sorted(
            (m for m in many_ranges(300).markers if m.name.startswith("step_")), key=lambda m: m.start_ns)]
        job = A.critical_path(ranks)
        assert job.iteration.index == _median_steady(rank_walls)
        rs = A.rank_summary(ranks)
        assert [(it.step, it.min_wall_ns, it.max_wall_ns) for it in rs.iterations] == [
            (f"step_{i}", w, w) for i, w in enumerate(rank_walls)][:len(rs.iterations)]
        assert rs.iterations
        bad = _bad(captured)
        assert not bad, bad
    finally:
        for t in (trace, *ranks):
            t.close()


def _projected(s, name: str) -> tuple[int, int]:
    """(kernels, summed kernel ns) launched inside the ranges named `name`: every (range, launching call) pair compared
    (one thread), each kernel counted once."""
    import numpy as np
    calls = {(c.pid, c.correlation_id): c for c in s.api_calls}
    ks = [(calls[(k.pid, k.correlation_id)], k.end_ns - k.start_ns) for k in s.kernels]
    cs = np.array([c.start_ns for c, _ in ks])
    ce = np.array([c.end_ns for c, _ in ks])
    rs = np.array([m.start_ns for m in s.markers if m.name == name])[:, None]
    re_ = np.array([m.end_ns for m in s.markers if m.name == name])[:, None]
    inside = ((rs <= cs) & (ce <= re_)).any(axis=0)
    return int(inside.sum()), int(sum(d for (_, d), hit in zip(ks, inside) if hit))


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
def test_many_ranges_projected(tmp_path, captured, fmt):
    """Thousands of ranges on one thread and the GPU work launched inside them: the tools over the NVTX/annotation
    projection (marker_summary, phases, call_stack, ops_summary's innermost_ranges) join ranges and launching calls as IEJoins, and
    marker_summary's figures are the fixture's."""
    s = many_ranges()
    trace = load_trace(write_scenario(s, fmt, tmp_path / ("one" + (".json" if fmt == "kineto" else ".sqlite"))))
    try:
        ms = A.marker_summary(trace, sort_by="count", limit=5)
        assert ms.ranges == len(s.markers) and ms.names == len({m.name for m in s.markers})
        assert ms.projection.projected_ops == len(s.kernels)  # every kernel is launched inside its step
        depth = {"layer_0": 2, "layer_1": 2, "layer_2": 2, "fwd": 1, "opt": 1}
        assert {r.name for r in ms.markers} == set(depth)
        for r in ms.markers:
            assert (r.count, r.min_depth) == (len(steps := [m for m in s.markers if m.name == r.name]), depth[r.name])
            assert (r.gpu_kernels, r.gpu_work_ns) == _projected(s, r.name), r.name
            assert r.cpu_total_ns == sum(m.end_ns - m.start_ns for m in steps)
        A.phases(trace)
        stack = A.call_stack(trace, kernel="gemm")
        assert [lv.name for lv in stack.chain if lv.kind in ("range", "annotation")] == ["step_0", "opt"]
        # ops_summary's ranges (without CPU operators): the innermost range of each kernel's launching call
        cur = trace.con.cursor()
        with projection.tables(cur, trace):
            inner = dict(cur.execute(f"SELECT r.name, count(*) FROM ({projection.INNERMOST}) JOIN _proj_rng r USING (rid) "
                                     "GROUP BY r.name").fetchall())
        cur.close()
        assert inner == {n: len(s.kernels) // 4 for n in ("layer_0", "layer_1", "layer_2", "opt")}
        if fmt == "nsys":  # attributed to those ranges (Kineto's cpu_ops are the launchers there)
            ops = A.ops_summary(trace, limit=10)
            assert {r.name: r.count for r in ops.rows} == {n: len(s.kernels) // 4 for n in ("layer_0", "layer_1", "layer_2", "opt")}
        bad = _bad(captured)
        assert not bad, bad
    finally:
        trace.close()
