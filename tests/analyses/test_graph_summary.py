"""graph_summary: replays, kernels per replay, replay wall vs summed and busy kernel time, gaps inside replays and
replay variance, exact to the ns against fixtures/scenarios_graph_summary.py (truth from the scenario, not the
engine) in every format; Triton name classification; top_kernels / ops_summary graph fields; the refusal where a
profile holds no graph replay; and consistency on the real profiles."""

from __future__ import annotations

import pytest

from conftest import FORMATS, needs_data, real_files
from gpuscope.fixtures import scenarios_graph_summary as G
from gpuscope.fixtures.truth import expressed, time_shift
from gpuscope.tools import analyses as A
from gpuscope.tools.analyses.graph_summary import GRAPH_KERNELS_CTE, split_fused, triton_parts
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

US = 1_000
CASES = [pytest.param(name, fmt, id=f"{name}-{fmt}") for name in ("graph_replays", "graph_replays_no_ids") for fmt in FORMATS]


def _scenario(name: str, fmt: str):
    s = expressed(G.SCENARIOS[name](), fmt)
    return G.without_graph_ids(s) if fmt == "rocpd" else s  # the rocpd writer (schema 3.0.0) writes no graph ids


def _by_key(res) -> dict:
    return {(g.device_id, frozenset(k.name for k in g.top_kernels)): g for g in res.graphs}


@pytest.mark.parametrize("name,fmt", CASES)
def test_graphs_match_the_scenario(open_profile, name, fmt):
    s = _scenario(name, fmt)
    shift = time_shift(s, fmt)
    res = A.graph_summary(open_profile(name, fmt, None, G.SCENARIOS), kernel_limit=50)
    truth = G.graph_truth(s)
    got = _by_key(res)
    assert set(got) == set(truth)
    for key, w in truth.items():
        g = got[key]
        assert g.identified_by == ("graph_id" if w["graph_id"] is not None else "kernel_names"), key
        assert g.graph_id == w["graph_id"] and g.pid == w["pid"]
        assert g.launch_api == ("hipGraphLaunch" if fmt == "rocpd" else "cudaGraphLaunch")
        assert (g.replays, g.kernels, g.kernels_per_replay_min, g.kernels_per_replay_median, g.kernels_per_replay_max) == \
            (w["replays"], w["kernels"], w["n_min"], w["n_median"], w["n_max"]), key
        assert (g.wall_ns, g.work_ns, g.busy_ns, g.gap_ns) == (w["wall"], w["work"], w["busy"], w["gap"]), key
        assert (g.replay_wall_min_ns, g.replay_wall_median_ns, g.replay_wall_max_ns) == (w["w_min"], w["w_median"], w["w_max"])
        assert (g.replay_gap_min_ns, g.replay_gap_median_ns, g.replay_gap_max_ns) == (w["g_min"], w["g_median"], w["g_max"])
        if w["w_std"] is None:
            assert g.replay_wall_std_ns is None
        else:
            assert g.replay_wall_std_ns == pytest.approx(w["w_std"], abs=0.1)
        assert g.launch_to_first_kernel_median_ns == w["launch_median"]
        assert (g.first_replay_start_ns, g.last_replay_end_ns) == (w["first"] + shift, w["last"] + shift)
        assert {k.name: (k.count, k.total_ns) for k in g.top_kernels} == w["top"]
        assert sum(k.total_ns for k in g.top_kernels) == g.work_ns and not g.kernels_truncated
    # per device: graph kernels and their time against all kernels
    for d in res.devices:
        ks = [k for k in s.kernels if k.device_id == d.device_id]
        gk = [k for k in G.graph_kernels(s) if k.device_id == d.device_id]
        assert (d.kernels, d.summed_kernel_time_ns) == (len(ks), sum(k.end_ns - k.start_ns for k in ks))
        assert (d.graph_kernels, d.graph_kernel_time_ns) == (len(gk), sum(k.end_ns - k.start_ns for k in gk))
        assert d.graph_kernels_without_replay == 0
    assert not res.truncated and res.definitions["replay"]


def test_figures_by_hand(open_profile):
    """The scenario's own arithmetic (µs): graph A replays 93/106/119 wall, 93/96/99 work, gaps 0/10/20; graph B
    replays overlap (wall 25, work 35, busy 25) or not (wall 35, work 25, gap 10)."""
    res = A.graph_summary(open_profile("graph_replays", "nsys", None, G.SCENARIOS))
    a, b = sorted(res.graphs, key=lambda g: g.device_id)
    assert (a.graph, a.replays, a.kernels_per_replay_median) == ("graph 1", 3, 5.0)
    assert (a.wall_ns, a.work_ns, a.busy_ns, a.gap_ns) == (318 * US, 288 * US, 288 * US, 30 * US)
    assert (a.replay_wall_min_ns, a.replay_wall_median_ns, a.replay_wall_max_ns) == (93 * US, 106 * US, 119 * US)
    assert a.replay_wall_std_ns == 13 * US and a.launch_to_first_kernel_median_ns == 30 * US
    assert a.gap_pct_of_wall == round(100 * 30 / 318, 2)
    assert (b.graph, b.replays, b.wall_ns, b.work_ns, b.busy_ns, b.gap_ns) == ("graph 2", 2, 60 * US, 60 * US, 50 * US, 10 * US)
    assert b.work_pct_of_wall == 100.0 and b.replay_gap_max_ns == 10 * US
    assert [k.triton_kind for k in a.top_kernels if k.name.startswith("triton_")] != []


@pytest.mark.parametrize("fmt", FORMATS)
def test_window_and_device_select_whole_replays(open_profile, fmt):
    t = open_profile("graph_replays", fmt, None, G.SCENARIOS)
    shift = time_shift(G.SCENARIOS["graph_replays"](), fmt)
    one = A.graph_summary(t, device=1)
    assert [g.device_id for g in one.graphs] == [1] and [d.device_id for d in one.devices] == [1]
    # the window holds the first kernel of replays 1 and 2 of graph A only
    win = A.graph_summary(t, start_ns=1_500 * US + shift, end_ns=3_500 * US + shift)
    (a,) = win.graphs
    assert (a.replays, a.wall_ns) == (2, (106 + 119) * US)
    with pytest.raises(ProfileError, match="no graph replay starts in the selection"):
        A.graph_summary(t, start_ns=7_000 * US + shift, end_ns=7_300 * US + shift)


@pytest.mark.parametrize("fmt", FORMATS)
def test_limits_say_what_was_left_out(open_profile, fmt):
    res = A.graph_summary(open_profile("graph_replays", fmt, None, G.SCENARIOS), limit=1, kernel_limit=2)
    a = next(g for g in res.graphs if g.device_id == 0)
    assert a.kernels_truncated and a.remainder_kernel_names == 3 and len(a.top_kernels) == 2
    assert sum(k.total_ns for k in a.top_kernels) + a.remainder_kernel_ns == a.work_ns
    assert res.triton_truncated and len(res.triton_kernels) == 1 and "kernel_limit" in res.hint
    assert not res.truncated  # one graph per device


@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_kernels(open_profile, fmt):
    s = _scenario("graph_replays", fmt)
    res = A.graph_summary(open_profile("graph_replays", fmt, None, G.SCENARIOS), limit=20)
    got = {t.name: t for t in res.triton_kernels}
    names = {k.short_name for k in s.kernels if k.short_name.startswith("triton_")}
    assert set(got) == names
    graph = {id(k) for k in G.graph_kernels(s)}
    for n in names:
        ks = [k for k in s.kernels if k.short_name == n]
        ing = [k for k in ks if id(k) in graph]
        assert (got[n].count, got[n].total_ns) == (len(ks), sum(k.end_ns - k.start_ns for k in ks)), n
        assert (got[n].in_graph_count, got[n].in_graph_ns) == (len(ing), sum(k.end_ns - k.start_ns for k in ing)), n
    assert got["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1"].kind == "reduction"
    assert got["triton_per_fused_native_layer_norm_2"].fused_ops == ["native_layer_norm"]
    assert got["triton_tem_fused_mm_3"].kind == "template"
    solo = got["triton_poi_fused_mul_sigmoid_4"]
    assert (solo.kind, solo.fused_ops, solo.in_graph_count) == ("pointwise", ["mul", "sigmoid"], 0)
    # Kineto links the launch to Inductor's record_function op by External id; the other formats hold no operators
    if fmt == "kineto":
        assert solo.launching_op == "triton_poi_fused_mul_sigmoid_4"
        assert got["triton_poi_fused_add_0"].launching_op == "CUDAGraph::replay"
    else:
        assert all(t.launching_op is None for t in res.triton_kernels)


@pytest.mark.parametrize("name,kind,text,ops", [
    ("triton_poi_fused_add_0", "pointwise", "add", ["add"]),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "reduction", "_to_copy_add_mean_mul_pow_rsqrt",
     ["_to_copy", "add", "mean", "mul", "pow", "rsqrt"]),
    ("triton_per_fused__softmax_12", "persistent-reduction", "_softmax", ["_softmax"]),
    ("triton_per_fused_native_layer_norm_native_layer_norm_backward_3", "persistent-reduction",
     "native_layer_norm_native_layer_norm_backward", ["native_layer_norm", "native_layer_norm_backward"]),
    ("triton_tem_fused_addmm_relu_7", "template", "addmm_relu", ["addmm", "relu"]),
    ("triton_for_fused_cat_0", "foreach", "cat", ["cat"]),
    ("triton_poi_fused__unknown_op_5", "pointwise", "_unknown_op", ["_unknown", "op"]),
    ("triton_xyz_fused_add_0", "unknown", "add", ["add"]),
    ("triton_poi_3", "pointwise", None, []),
])
def test_triton_name_classification(name, kind, text, ops):
    assert triton_parts(name) == (kind, text, ops)


def test_not_triton():
    assert triton_parts("void gemm_kernel<float>(float*)") is None and triton_parts("_triton_poi_fused_add_0") is None
    assert split_fused("") == [] and split_fused("clamp_min_add") == ["clamp_min", "add"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_top_kernels_and_ops_summary_name_graph_time(open_profile, fmt):
    s = _scenario("graph_replays", fmt)
    t = open_profile("graph_replays", fmt, None, G.SCENARIOS)
    graph = {id(k) for k in G.graph_kernels(s)}
    tk = A.top_kernels(t, limit=50)
    for grp in tk.kernels:
        ks = [k for k in s.kernels if k.device_id == grp.device_id and k.short_name == grp.name]
        ing = [k for k in ks if id(k) in graph]
        assert (grp.count, grp.in_graph_count, grp.graph_ns) == (len(ks), len(ing), sum(k.end_ns - k.start_ns for k in ing))
    for d in tk.devices:
        ing = [k for k in s.kernels if k.device_id == d.device_id and id(k) in graph]
        assert (d.graph_kernels, d.graph_kernel_time_ns) == (len(ing), sum(k.end_ns - k.start_ns for k in ing))
    ops = A.ops_summary(t, limit=100)
    ing = [k for k in s.kernels if id(k) in graph]
    assert (ops.totals.graph_kernels, ops.totals.graph_kernel_time_ns) == (len(ing), sum(k.end_ns - k.start_ns for k in ing))
    assert sum(r.graph_kernel_time_ns for r in ops.rows) == ops.totals.graph_kernel_time_ns
    by_kernel = A.ops_summary(t, group_by="kernels", limit=100)
    assert sum(r.in_graph_count for r in by_kernel.rows) == len(ing)
    if fmt == "kineto":
        replay = next(r for r in ops.rows if r.name == "CUDAGraph::replay")
        assert (replay.graph_gpu_ops, replay.graph_kernel_time_ns) == (len(ing), ops.totals.graph_kernel_time_ns)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_graph_replays_is_refused_with_the_reason(open_profile, fmt):
    t = open_profile("concurrent_streams", fmt)
    with pytest.raises(ProfileError) as exc:
        A.graph_summary(t)
    msg = str(exc.value)
    assert "no CUDA/HIP graph replay" in msg
    where = {"nsys": "CUPTI_ACTIVITY_KIND_KERNEL", "rocpd": "graph_exec_id", "kineto": "'graph id'"}[fmt]
    assert where in msg, msg
    cap = next(c for c in A.trace_info(t).capabilities if c.tool == "graph_summary")
    assert not cap.available and cap.reason in msg
    # the other tools leave their graph fields null there: absent, not zero
    tk = A.top_kernels(t)
    assert all(k.in_graph_count is None and k.graph_ns is None for k in tk.kernels)
    assert all(d.graph_kernels is None for d in tk.devices)
    assert A.ops_summary(t).totals.graph_kernel_time_ns is None


def _unlinked_graph_launches():
    """concurrent_streams plus two cudaGraphLaunch calls whose correlation ids no kernel carries."""
    from dataclasses import replace

    from gpuscope.fixtures.catalog import SCENARIOS
    from gpuscope.fixtures.scenario import ApiCall

    s = SCENARIOS["concurrent_streams"]()
    c = s.api_calls[0]
    top = max(a.correlation_id for a in s.api_calls) + max((k.correlation_id or 0 for k in s.kernels), default=0)
    extra = [ApiCall(c.pid, c.tid, c.start_ns + i, c.start_ns + i + 1, "cudaGraphLaunch", top + 1 + i) for i in range(2)]
    return replace(s, api_calls=[*s.api_calls, *extra])


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
def test_graph_launch_calls_without_kernels_are_counted_in_the_refusal(open_profile, fmt):
    t = open_profile("unlinked_graph_launches", fmt, scenarios={"unlinked_graph_launches": _unlinked_graph_launches})
    with pytest.raises(ProfileError, match="2 graph-launch API calls are in the profile, but none has kernels linked"):
        A.graph_summary(t)
    assert all(d.graph_kernels is None for d in A.top_kernels(t).devices)


def test_catalog_graph_launch_is_one_replay(open_profile):
    """The catalog's single cudaGraphLaunch of 20 kernels: one replay whose figures add up."""
    for fmt in FORMATS:
        res = A.graph_summary(open_profile("graph_launch", fmt))
        (g,) = res.graphs
        assert (g.replays, g.kernels, g.replay_wall_std_ns) == (1, 20, None)
        assert g.busy_ns + g.gap_ns == g.wall_ns and g.work_ns == res.devices[0].graph_kernel_time_ns


def _whole_truth():
    """Replays of graph_replays as Nsight traces them whole: one interval per (device, process, launch), from the
    scenario alone; and the kernels launched one by one."""
    s = G.graph_replays()
    graph = {id(k) for k in G.graph_kernels(s)}
    execs: dict[tuple, list] = {}
    for k in G.graph_kernels(s):
        execs.setdefault((k.device_id, k.pid, k.correlation_id), []).append(k)
    spans = {key: (min(k.start_ns for k in ks), max(k.end_ns for k in ks), min(k.graph_id for k in ks))
             for key, ks in execs.items()}
    return s, [k for k in s.kernels if id(k) not in graph], spans


def test_graphs_traced_whole(open_profile):
    """nsys --cuda-graph-trace=graph: GRAPH_TRACE rows become replays with launches, wall time and its variance exact
    to the ns; the per-kernel figures are null and the hint names the re-capture."""
    s, _, spans = _whole_truth()
    shift = time_shift(s, "nsys")
    t = open_profile("graph_replays_whole", "nsys", None, G.SCENARIOS)
    assert int(t.scalar("SELECT count(*) FROM kernels WHERE whole_graph")) == len(spans) == 5
    res = A.graph_summary(t)
    truth = {(dev, w["graph_id"]): w for (dev, _), w in G.graph_truth(s).items()}
    assert {(g.device_id, g.graph_id) for g in res.graphs} == set(truth) == {(0, 1), (1, 2)}
    for g in res.graphs:
        w = truth[(g.device_id, g.graph_id)]
        assert g.traced_whole and g.graph == f"graph {g.graph_id}" and g.launch_api == "cudaGraphLaunch"
        assert (g.replays, g.wall_ns, g.replay_wall_min_ns, g.replay_wall_median_ns, g.replay_wall_max_ns) == \
            (w["replays"], w["wall"], w["w_min"], w["w_median"], w["w_max"])
        assert g.replay_wall_std_ns == (None if w["w_std"] is None else pytest.approx(w["w_std"], abs=0.1))
        assert g.launch_to_first_kernel_median_ns == w["launch_median"]
        assert (g.first_replay_start_ns, g.last_replay_end_ns) == (w["first"] + shift, w["last"] + shift)
        assert (g.kernels, g.kernels_per_replay_median, g.work_ns, g.busy_ns, g.gap_ns, g.replay_gap_max_ns) == (None,) * 6
        assert g.top_kernels == [] and not g.kernels_truncated
    # by hand (µs): graph A replays 93 / 106 / 119 wall; graph B 25 / 35
    a, b = sorted(res.graphs, key=lambda g: g.device_id)
    assert (a.replays, a.wall_ns, b.replays, b.wall_ns) == (3, 318 * US, 2, 60 * US)
    for d in res.devices:
        mine = [v for (dev, _, _), v in spans.items() if dev == d.device_id]
        assert (d.whole_graph_executions, d.whole_graph_time_ns) == (len(mine), sum(e - b for b, e, _ in mine))
        assert (d.graph_kernels, d.graph_kernel_time_ns) == (d.whole_graph_executions, d.whole_graph_time_ns)
    assert "--cuda-graph-trace=node" in res.hint and "per-kernel detail" in res.hint
    assert any("traced whole" in w and "--cuda-graph-trace=node" in w for w in t.warnings)


def test_graph_trace_rows_next_to_their_kernels_are_left_out(tmp_path):
    """An export holding both a launch's GRAPH_TRACE row and its kernels keeps the kernels: GPU time counted once."""
    from dataclasses import replace

    from gpuscope.fixtures.writers import nsys

    s = G.graph_replays()
    path = nsys.write(replace(s, options={**s.options, "nsys_graph_trace": "both"}), tmp_path / "both.sqlite")
    t = load_trace(path)
    try:
        assert int(t.scalar("SELECT count(*) FROM kernels WHERE whole_graph")) == 0
        assert int(t.scalar("SELECT count(*) FROM kernels")) == len(s.kernels)
        assert any("5 rows of CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in w for w in t.warnings)
        assert {g.graph: g.kernels for g in A.graph_summary(t).graphs} == {"graph 1": 15, "graph 2": 4}
    finally:
        t.close()


def test_graphs_traced_whole_are_gpu_work(open_profile):
    """Whole-graph executions count as GPU work in gpu_timeline's busy time and in top_kernels / ops_summary, named as
    graph time; exact against the union of the scenario's intervals."""
    from gpuscope.fixtures.truth import merge

    s, plain, spans = _whole_truth()
    t = open_profile("graph_replays_whole", "nsys", None, G.SCENARIOS)
    tl = A.gpu_timeline(t)
    for row in tl.timelines:
        iv = [(k.start_ns, k.end_ns) for k in plain if k.device_id == row.device_id]
        iv += [(b, e) for (dev, _, _), (b, e, _) in spans.items() if dev == row.device_id]
        assert row.busy_ns == sum(e - b for b, e in merge(iv)), row.device_id
    tk = A.top_kernels(t, limit=50)
    graph_rows = {(k.device_id, k.name): k for k in tk.kernels if k.name.startswith("CUDA graph ")}
    assert set(graph_rows) == {(0, "CUDA graph 1"), (1, "CUDA graph 2")}
    for (dev, name), k in graph_rows.items():
        mine = [e - b for (d, _, _), (b, e, gid) in spans.items() if d == dev and f"CUDA graph {gid}" == name]
        assert (k.count, k.total_ns, k.in_graph_count, k.graph_ns) == (len(mine), sum(mine), len(mine), sum(mine))
    assert all(k.in_graph_count == 0 for k in tk.kernels if not k.name.startswith("CUDA graph "))
    ops = A.ops_summary(t, limit=100)
    whole = sum(e - b for b, e, _ in spans.values())
    assert (ops.totals.graph_kernels, ops.totals.graph_kernel_time_ns) == (len(spans), whole)


def test_cli_and_json(capsys, write_profile):
    from gpuscope.server.cli import main

    path = write_profile("graph_replays", "nsys", None, G.SCENARIOS)
    try:
        main(["graph-summary", str(path), "--kernel-limit", "3"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr().out
    assert code in (0, None) and out.startswith("## CUDA graphs") and "graph 1" in out
    try:
        main(["graph-summary", str(path), "--json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    import json

    data = json.loads(capsys.readouterr().out)
    assert {g["graph"] for g in data["graphs"]} == {"graph 1", "graph 2"}


REAL = real_files("nsys/*.sqlite", "pytorch/*.json.gz", "rocpd_legacy/*.rpd")


@needs_data
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_profiles_are_consistent(path):
    """On every real profile: graph_summary answers and its figures agree with a direct SQL count of graph kernels,
    or refuses, and then no kernel of the profile is a graph kernel and trace_info says the same."""
    t = load_trace(path)
    try:
        direct = t.sql(f"""WITH {GRAPH_KERNELS_CTE}
            SELECT count(*), coalesce(sum(k.dur_ns), 0) FROM kernels k SEMI JOIN graph_kids g ON g.kid = k.rowid""")[0]
        cap = next(c for c in A.trace_info(t).capabilities if c.tool == "graph_summary")
        try:
            res = A.graph_summary(t, limit=100)
        except ProfileError as exc:
            assert direct == (0, 0) and not cap.available and cap.reason in str(exc)
            return
        assert cap.available
        assert sum(d.graph_kernels for d in res.devices) == direct[0]
        assert sum(d.graph_kernel_time_ns for d in res.devices) == direct[1]
        orphans = sum(d.graph_kernels_without_replay for d in res.devices)
        assert sum(g.kernels for g in res.graphs) + orphans == direct[0] or res.truncated
        for g in res.graphs:
            assert g.busy_ns + g.gap_ns == g.wall_ns and g.busy_ns <= g.work_ns
            assert g.kernels_per_replay_min <= g.kernels_per_replay_median <= g.kernels_per_replay_max
    finally:
        t.close()
