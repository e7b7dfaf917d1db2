"""2021-era PyTorch traces (Kineto of PyTorch 1.8-1.9: 'Operator'/'Runtime'/'Kernel'/'Memcpy' categories, lower-case
'external id', integer absolute µs) give the same exact figures as the current format: steps from ProfilerStep#N,
op categories of the cuDNN/THNN families, launch delays without the host-synchronous copies, API counts.

Expected figures are computed here from fixtures/scenarios_legacy.py's Scenario, not by the engine.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import median

import pytest

from conftest import DATA, needs_data
from gpuscope.fixtures import scenarios_legacy as SL
from gpuscope.fixtures.scenario import Kernel
from gpuscope.fixtures.writers import kineto as writer
from gpuscope.tools.analyses.api_summary import api_summary
from gpuscope.tools.analyses.iterations import iterations
from gpuscope.tools.analyses.ops_summary import ops_summary
from gpuscope.tools.model.quality import LAUNCH_BEFORE_CALL
from gpuscope.tools.model.trace import load_trace

S = SL.resnet50_2021()
# the 2021 format at absolute epoch times; the current one relative to baseTimeNanoseconds
CASES = {"kineto_2021": "resnet50_2021", "kineto": "resnet50_relative"}
CATEGORY = {  # by family rule or registry, written out by hand
    "aten::copy_": "elementwise", "aten::cudnn_convolution": "CONV_fwd", "aten::cudnn_batch_norm": "NORM_fwd",
    "aten::thnn_conv2d_forward": "CONV_fwd", "aten::add_": "elementwise",
    "aten::cudnn_convolution_backward_input": "CONV_bwd", "aten::cudnn_convolution_backward_weight": "CONV_bwd",
    "aten::cudnn_batch_norm_backward": "NORM_bwd", "aten::thnn_conv2d_backward": "CONV_bwd",
}


@pytest.fixture(scope="module")
def opened(open_profile):
    """opened(fmt) -> (the Scenario, the trace written in that format)."""
    return lambda fmt: (SL.SCENARIOS[CASES[fmt]](), open_profile(CASES[fmt], fmt, scenarios=SL.SCENARIOS))


def union(intervals):
    total, reach = 0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total, reach = total + b - a, b
        elif b > reach:
            total, reach = total + b - reach, b
    return total


def expected_ops(S):
    """name -> (instances, GPU ops, direct ns, launch delays, queue-free delays, excluded) from the Scenario."""
    calls = {a.correlation_id: a for a in S.api_calls}
    gpu = sorted([*S.kernels, *S.memops], key=lambda o: (o.start_ns, o.end_ns))
    prev, rows = {}, {}
    for o in gpu:
        call = calls[o.correlation_id]
        op = max((c for c in S.cpu_ops if c.tid == call.tid and c.start_ns <= call.start_ns < c.end_ns),
                 key=lambda c: (c.start_ns, c.start_ns - c.end_ns))
        ready = max(call.end_ns, prev.get(o.stream_id, call.end_ns))
        prev[o.stream_id] = o.end_ns
        r = rows.setdefault(op.name, {"inst": {}, "ld": [], "qf": [], "excluded": 0})
        r["inst"].setdefault(op.external_id, []).append((o.start_ns, o.end_ns))
        if o.start_ns < call.end_ns or o.start_ns < ready:
            r["excluded"] += 1
        else:
            r["ld"].append(o.start_ns - call.end_ns)
            r["qf"].append(o.start_ns - ready)
    return {n: (len(r["inst"]), sum(map(len, r["inst"].values())), sum(union(v) for v in r["inst"].values()),
                r["ld"], r["qf"], r["excluded"]) for n, r in rows.items()}


@pytest.mark.parametrize("fmt", CASES)
def test_steps_from_profiler_step_operators(opened, fmt):
    S, trace = opened(fmt)
    res = iterations(trace)
    assert res.choice.how == "ProfilerStep" and res.choice.pattern == "ProfilerStep#<N>"
    steps = sorted((m for m in S.markers if m.name.startswith("ProfilerStep#")), key=lambda m: m.start_ns)
    assert [(st.name, st.start_ns, st.wall_ns) for st in res.steps] == [
        (m.name, m.start_ns, m.end_ns - m.start_ns) for m in steps]
    assert [st.wall_ns for st in res.steps] == [w * 1000 for w in SL.WALLS_US]
    sm = res.summaries[0]
    assert (sm.steps, sm.wall_total_ns, sm.wall_min_ns, sm.wall_max_ns) == (5, 10_100_000, 1_950_000, 2_100_000)
    # each step's GPU work was launched inside it: 2 copies + 8 kernels, 8 of them kernels
    assert all(st.projected_kernels == 8 for st in res.steps)


@pytest.mark.parametrize("fmt", CASES)
def test_ops_categories_and_delays(opened, fmt):
    S, trace = opened(fmt)
    res = ops_summary(trace, limit=50)
    want = expected_ops(S)
    got = {r.name: r for r in res.rows}
    assert set(got) == set(want) == set(CATEGORY)
    for name, (count, n, direct, ld, qf, excluded) in want.items():
        r = got[name]
        assert (r.count, r.gpu_op_count, r.total_direct_kernel_time_ns, r.categories) == (count, n, direct, [CATEGORY[name]]), name
        assert r.delay_excluded_gpu_ops == excluded, name
        assert r.launch_delay_median_ns == (median(ld) if ld else None), name
        assert r.queue_free_delay_median_ns == (median(qf) if qf else None), name
    # the input batch copies ran inside their cudaMemcpyAsync calls: GPU start - call end = -870 µs, left out
    copy = got["aten::copy_"]
    assert (copy.gpu_op_count, copy.delay_excluded_gpu_ops, copy.launch_delay_median_ns) == (10, 5, 3_000.0)
    assert all(r.launch_delay_median_ns >= 0 and r.queue_free_delay_median_ns >= 0 for r in res.rows)
    t = res.totals
    assert (t.delay_excluded_gpu_ops, t.other_category_direct_ns, t.other_category_pct_of_categorised_gpu_time) == (5, 0, 0.0)
    cats = {c.category: c.total_direct_kernel_time_ns for c in ops_summary(trace, group_by="category").rows}
    assert cats["CONV_bwd"] == 5 * (200 + 220 + 70) * 1000 and cats["CONV_fwd"] == 5 * (180 + 60) * 1000
    assert cats["NORM_fwd"] == 5 * 40_000 and cats["NORM_bwd"] == 5 * 50_000


@pytest.mark.parametrize("fmt", CASES)
def test_api_counts_and_launches(opened, fmt):
    S, trace = opened(fmt)
    res = api_summary(trace, limit=50)
    want = {}
    for a in S.api_calls:
        n, total = want.get(a.name, (0, 0))
        want[a.name] = (n + 1, total + a.end_ns - a.start_ns)
    assert {g.name: (g.count, g.total_ns) for g in res.apis} == want
    assert want["cudaLaunchKernel"][0] == 40 and want["cudaMemcpyAsync"][0] == 10
    dev = next(r for r in res.launches if r.stream_id is None)
    assert (dev.kernels, dev.unlinked_kernels, dev.launch_calls, dev.kernels_started_before_call_returned) == (40, 0, 40, 0)
    assert dev.launch_latency.count == 40 and dev.launch_latency.median_ns >= 0
    assert trace.sql("SELECT * FROM data_issues") == []
    # the model check names the host-synchronous calls
    assert any(w.startswith("5 GPU operations (kernels, copies, sets) started before their launching call returned "
                            "(cudaMemcpyAsync 5)") for w in trace.warnings)


def test_gpu_op_before_its_call_loses_the_link(tmp_path):
    """A GPU op that starts before the call carrying its correlation id (a wrong pairing) is unlinked and counted."""
    late = max((a for a in S.api_calls if a.name == "cudaStreamSynchronize"), key=lambda a: a.start_ns)
    bad = Kernel(0, 7, 50_000, 60_000, "void stray_kernel<float>(float*)", "stray_kernel", SL.PID, late.correlation_id)
    path = writer.write(replace(S, kernels=[*S.kernels, bad]), tmp_path / "stray.pt.trace.json", legacy=True)
    trace = load_trace(path)
    try:
        assert trace.sql("SELECT * FROM data_issues") == [("kernels", "repaired", 1, LAUNCH_BEFORE_CALL)]
        assert trace.sql("SELECT launched, correlation_id, tid FROM kernels WHERE start_ns = 50000") == [(False, None, None)]
        rows = {r.name: r for r in ops_summary(trace, limit=50).rows}
        assert (rows["<unattributed>"].gpu_op_count, rows["<unattributed>"].launch_delay_median_ns) == (1, None)
    finally:
        trace.close()


@needs_data
def test_real_trace_delays_are_integer_and_never_negative():
    """nv_a100_alexnet_small_hta: integer absolute µs (2023 Kineto). 7 of its 16 pageable HtoD copies run inside their
    cudaMemcpyAsync calls; before the fix their negative differences entered the medians, and queue-free medians were
    off by float64 rounding of epoch ns (2432, 1024, -14080 ns)."""
    trace = load_trace(DATA / "pytorch" / "nv_a100_alexnet_small_hta.json.gz")
    try:
        rows = {r.name: r for r in ops_summary(trace, limit=50).rows}
        assert (rows["aten::copy_"].gpu_op_count, rows["aten::copy_"].delay_excluded_gpu_ops) == (16, 7)
        assert sum(r.delay_excluded_gpu_ops for r in rows.values()) == 16
        for r in rows.values():
            for v in (r.launch_delay_median_ns, r.queue_free_delay_median_ns):
                assert v is None or (v >= 0 and v % 500 == 0), r.name  # whole µs, or the mean of two
    finally:
        trace.close()
