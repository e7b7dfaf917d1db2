"""No tool's SQL asks DuckDB for a quadratic join (tools/analyses/containment.py).

Every statement the tools run on a set of fixtures (op trees, annotations, NVTX ranges, copies, syncs; Nsight and
PyTorch) is captured and EXPLAINed. A join DuckDB can only run by comparing every row with every row fails the
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

import pytest

from conftest import write_scenario
from gpuscope.tools import analyses as A
from gpuscope.tools.model import hub
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

TOOLS = ["trace_info", "top_kernels", "gap_histogram", "memcpy_summary", "stream_summary", "marker_summary", "iterations",
         "api_summary", "gpu_timeline", "comm_summary", "phases", "ops_summary", "perf_summary", "diagnose", "graph_summary",
         "memory_timeline", "roofline", "critical_path", "call_stack"]
CASES = [("catalog", "concurrent_streams"), ("catalog", "graph_launch"), ("scenarios_ops_summary", None),
         ("scenarios_marker_summary", None), ("scenarios_api_summary", None), ("scenarios_iterations", None)]
# Known and still open: step_choice's range depth (a self-join of `rng` inside steps_sql's CTE chain, which names
# `rng` several times) plans as a piecewise merge join; quadratic in the ranges of one thread, not in kernels.
KNOWN = {("rid > rid", "ks >= ks", "ke <= ke")}
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


@pytest.fixture
def captured(monkeypatch):
    queries = []
    plain = hub.ModelConnection.cursor

    class Recording:
        def __init__(self, cur):
            self._cur = cur

        def execute(self, query, params=None):
            if query.lstrip().upper().startswith(("SELECT", "WITH")):  # planned where it runs (its temp tables exist)
                explain = "EXPLAIN (FORMAT json) " + query
                res = self._cur.execute(explain) if params is None else self._cur.execute(explain, params)
                queries.append((query, json.loads(res.fetchall()[0][1])))
            return self._cur.execute(query) if params is None else self._cur.execute(query, params)

        def __getattr__(self, name):
            return getattr(self._cur, name)

    monkeypatch.setattr(hub.ModelConnection, "cursor", lambda self: Recording(plain(self)))
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
        bad = []
        assert captured
        for query, plan in captured:
            found = []
            for node in plan:
                _quadratic(node, found)
            bad += [(join, conds, " ".join(query.split())[:160]) for join, conds in found if conds not in KNOWN | ONE_ROW_PER_KEY]
        assert not bad, bad
    finally:
        trace.close()
