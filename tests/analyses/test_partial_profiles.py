"""Partial profiles (runtime-only Nsight export, rocpd with HIP API regions only, kernels without their launches,
annotations only, Kineto with CPU operators only): every per-profile tool answers what it can, with exact figures
from the scenario, or refuses naming the missing table and the capture flag; trace_info's capabilities predict which."""

from __future__ import annotations

import pytest

from gpuscope.fixtures import scenarios_partial as P
from gpuscope.fixtures import truth as T
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError

US = 1_000
CASES = [pytest.param(name, fmt, id=f"{name}-{fmt}") for name, fmts in P.FORMATS_OF.items() for fmt in fmts]

# Where each format keeps each kind of data and the flag that records it (Nsight CLI --trace, rocprofv3 tracing
# options, torch.profiler arguments), as a refusal must name them.
WHERE = {
    "nsys": {"kernels": ("CUPTI_ACTIVITY_KIND_KERNEL", "nsys profile --trace=cuda"),
             "memops": ("CUPTI_ACTIVITY_KIND_MEMCPY", "nsys profile --trace=cuda"),
             "api_calls": ("CUPTI_ACTIVITY_KIND_RUNTIME", "nsys profile --trace=cuda"),
             "markers": ("NVTX_EVENTS", "--trace=cuda,nvtx"),
             "op_shapes": ("only PyTorch profiler traces hold operators", "record_shapes=True"),
             "cpu_ops": ("only PyTorch profiler traces hold operators", "ProfilerActivity.CPU")},
    "rocpd": {"kernels": ("rocpd_kernel_dispatch", "rocprofv3 --kernel-trace"),
              "memops": ("rocpd_memory_copy", "rocprofv3 --memory-copy-trace"),
              "api_calls": ("rocpd_region", "rocprofv3 --hip-trace"),
              "markers": ("rocpd_region", "rocprofv3 --marker-trace"),
              "op_shapes": ("only PyTorch profiler traces hold operators", "record_shapes=True"),
              "cpu_ops": ("only PyTorch profiler traces hold operators", "ProfilerActivity.CPU")},
    "kineto": {"kernels": ("'kernel' events", "ProfilerActivity.CUDA"),
               "memops": ("'gpu_memcpy'", "ProfilerActivity.CUDA"),
               "api_calls": ("'cuda_runtime'", "ProfilerActivity.CUDA"),
               "markers": ("user_annotation", "record_function"),
               "op_shapes": ("'Input Dims'", "record_shapes=True"),
               "cpu_ops": ("'cpu_op' events", "ProfilerActivity.CPU")},
}
# What each tool cannot do without (any one kind of a group suffices), as its documentation states it.
NEEDS = {
    "top_kernels": [("kernels",)], "gap_histogram": [("kernels", "memops")], "gpu_timeline": [("kernels", "memops")],
    "stream_summary": [("kernels", "memops")], "phases": [("kernels", "memops")], "compare_traces": [("kernels", "memops")],
    "diagnose": [("kernels", "memops", "api_calls")], "rank_summary": [], "memcpy_summary": [("memops",)],
    "api_summary": [("api_calls",)], "marker_summary": [("markers",)], "iterations": [("markers",)],
    "comm_summary": [("kernels",)], "ops_summary": [("kernels", "memops")], "call_stack": [("kernels",)],
    "call_stack.op": [("cpu_ops",)], "perf_summary": [("cpu_ops",), ("kernels", "memops")],
    "roofline": [("kernels", "memops"), ("cpu_ops",)], "replay_spec": [("cpu_ops",)], "sql_query": [],
}


def _call(tool: str, t):
    if tool == "compare_traces":
        return A.compare_traces(t, t)
    if tool == "rank_summary":
        return A.rank_summary([t])
    if tool == "call_stack":
        return A.call_stack(t, kernel="gemm")
    if tool == "call_stack.op":
        return A.call_stack(t, op="aten::mm")
    if tool == "replay_spec":
        return A.replay_spec(t, op="aten::mm")
    if tool == "sql_query":
        return A.sql_query(t, "SELECT count(*) FROM api_calls")
    return getattr(A, tool)(t)


def _has(s, kind: str) -> bool:
    if kind == "op_shapes":
        return any(o.input_dims for o in s.cpu_ops)
    return bool(getattr(s, kind))


@pytest.mark.parametrize("name,fmt", CASES)
def test_each_tool_answers_or_names_the_missing_table_and_flag(open_profile, name, fmt):
    s = T.expressed(P.SCENARIOS[name](), fmt)
    if fmt != "kineto":  # Nsight and rocpd profiles hold no PyTorch operators
        s.cpu_ops = []
    t = open_profile(name, fmt, None, P.SCENARIOS)
    caps = {c.tool: c for c in A.trace_info(t).capabilities}
    for tool, groups in NEEDS.items():
        lacking = [g for g in groups if not any(_has(s, k) for k in g)]
        try:
            res = _call(tool, t)
            answered = True
        except ProfileError as exc:
            answered, msg = False, str(exc)
        if tool == "comm_summary" and answered:  # it answers "no communication" when no kernel matches the patterns
            answered = bool(res.collectives)
            msg = caps[tool].reason
        assert caps[tool].available == answered, (tool, caps[tool].reason)
        if lacking:
            assert not answered, tool
            for group in lacking:
                for kind in group:
                    table, flag = WHERE[fmt][kind]
                    assert table in msg and flag in msg, (tool, kind, msg)
            assert caps[tool].reason in msg, tool  # the capability's reason is the refusal itself
        elif tool not in ("comm_summary", "iterations"):  # the two with rules beyond the data they need
            assert answered, (tool, msg)


def _api(name: str, fmt: str, open_profile):
    s = T.expressed(P.SCENARIOS[name](), fmt)
    return s, open_profile(name, fmt, None, P.SCENARIOS)


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_runtime_only_api_summary_is_exact(open_profile, fmt):
    s, t = _api("runtime_only", fmt, open_profile)
    res = A.api_summary(t, limit=200)
    assert {(a.pid, a.name): (a.count, a.total_ns) for a in res.apis} == P.api_truth(s)
    want = P.blocked_truth(s)
    got = {(th.pid, th.tid): th for th in res.blocked_threads}
    assert set(got) == set(want)
    for key, w in want.items():
        cats = got[key].blocked_by_category_ns
        assert (got[key].blocked_ns, cats["synchronize"], cats["blocking_copy"], cats["event_query_spin"]) == \
            (w["blocked"], w["synchronize"], w["blocking_copy"], w["event_query_spin"]), key
    assert res.launches is None
    launches = next(a for a in res.absent if a.startswith("launches"))
    pageable = next(a for a in res.absent if a.startswith("pageable_async_copy"))
    assert WHERE[fmt]["kernels"][0] in launches and WHERE[fmt]["kernels"][1] in launches
    assert WHERE[fmt]["memops"][0] in pageable


def test_runtime_only_figures_by_hand(open_profile):
    """The scenario's own arithmetic, in µs: main thread 3 step syncs + a 95 µs cudaMemcpy + a 315 µs device sync;
    the worker a 680 µs event sync, a 4-call query loop (1000 -> 1011 µs) and a 280 µs stream sync."""
    s, t = _api("runtime_only", "nsys", open_profile)
    step_syncs = [a.end_ns - a.start_ns for a in s.api_calls if a.tid == 2000 and a.name == "cudaStreamSynchronize"]
    want = P.blocked_truth(s)
    assert want[(2000, 2000)] == {"synchronize": sum(step_syncs) + 315 * US, "blocking_copy": 95 * US, "event_query_spin": 0,
                                  "blocked": sum(step_syncs) + 410 * US}
    assert want[(2000, 2001)] == {"synchronize": 960 * US, "blocking_copy": 0, "event_query_spin": 11 * US, "blocked": 971 * US}
    counts = P.api_truth(s)
    assert counts[(2000, "cudaLaunchKernel")][0] == 16 and counts[(2000, "cudaEventQuery")] == (4, 8 * US)


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_runtime_only_diagnose_is_host_side(open_profile, fmt):
    s, t = _api("runtime_only", fmt, open_profile)
    res = A.diagnose(t)
    assert res.scope == "host_only" and res.findings == [] and res.device_id is None and res.gpu_span_ns is None
    want = P.blocked_truth(s)
    blocked = {(f.pid, f.tid): f.time_ns for f in res.host_findings if f.kind == "host_blocked"}
    assert blocked == {k: w["blocked"] for k, w in want.items() if w["blocked"]}
    api = P.api_truth(s)
    lead = max(api.items(), key=lambda kv: kv[1][1])
    (f,) = [f for f in res.host_findings if f.kind == "api_time"]
    assert (f.pid, f.time_ns) == (lead[0][0], lead[1][1]) and lead[0][1] in f.title
    assert f.share_pct == round(100 * lead[1][1] / sum(tot for (_, tot) in api.values()), 2)
    assert [x.rank for x in res.host_findings] == list(range(1, len(res.host_findings) + 1))
    assert sorted((x.time_ns for x in res.host_findings), reverse=True) == [x.time_ns for x in res.host_findings]
    (gap,) = res.not_judged
    for kind in ("kernels", "memops"):
        assert all(w in gap for w in WHERE[fmt][kind]), gap
    assert "host only" in res.verdict and WHERE[fmt]["kernels"][1] in res.verdict
    assert {n.tool for n in res.not_applicable} >= {"gpu_timeline", "top_kernels", "memcpy_summary"}


def test_runtime_only_rank_summary_leaves_gpu_figures_unknown(open_profile):
    _, t = _api("runtime_only", "nsys", open_profile)
    (row,) = A.rank_summary([t]).ranks
    assert row.busy_ns is None and row.gpu_span_ns is None and row.kernels == 0
    assert any("CUPTI_ACTIVITY_KIND_KERNEL" in n and "nsys profile --trace=cuda" in n for n in row.notes)


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_nvtx_only_steps_are_host_ranges(open_profile, fmt):
    _, t = _api("nvtx_only", fmt, open_profile)
    res = A.iterations(t)
    assert [st.wall_ns for st in res.steps] == [w * US for w in P.NVTX_STEP_WALL_US]
    assert res.summaries[0].warmup_steps == [0]  # 1900 µs > 1.5 x median(700, 720, 690) µs
    assert all(st.gpu_busy_in_window_ns is None and st.window_kernels == 0 for st in res.steps)
    assert "projection absent" in res.projection
    ms = {m.name: m for m in A.marker_summary(t, limit=50).markers}
    assert (ms["forward"].count, ms["forward"].cpu_total_ns) == (4, 4 * 350 * US)


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_kernels_only_gpu_figures_without_launches(open_profile, fmt):
    s, t = _api("kernels_only", fmt, open_profile)
    res = A.top_kernels(t, limit=200)
    want = T.top_kernels_truth(s)["groups"]
    assert {(k.device_id, k.name): (k.count, k.total_ns) for k in res.kernels} == \
        {key: (w["count"], w["total_ns"]) for key, w in want.items()}
    info = A.trace_info(t)
    assert (info.unlinked_gpu_ops, info.unlinked_gpu_time_ns) == T.unlinked(s) == (len(s.kernels) + len(s.memops),
                                                                                    sum(o.end_ns - o.start_ns for o in [*s.kernels, *s.memops]))
    d = A.diagnose(t)
    assert d.scope == "gpu" and any("host-side findings" in g and WHERE[fmt]["api_calls"][0] in g for g in d.not_judged)
