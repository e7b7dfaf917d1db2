"""Op attribution on catalog scenarios: a graph launch owns all its kernels, launches from a second
thread go to that thread's op, and every GPU op is attributed exactly once. Expected values come
from the scenario: the innermost cpu_op on the launching thread enclosing the launching call."""

from __future__ import annotations

from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.truth import expressed, merge
from gpuscope.tools.analyses import ops_summary


def expected_by_op(scenario) -> dict[str, tuple[int, int, int]]:
    """op name -> (calls that launched GPU work, GPU ops, direct time = per-call union summed)."""
    calls = {(a.pid, a.correlation_id): a for a in scenario.api_calls}
    per_call: dict[tuple, list] = {}
    for op in list(scenario.kernels) + list(scenario.memops):
        call = calls.get((op.pid, op.correlation_id))
        if call is None:
            continue
        enclosing = [o for o in scenario.cpu_ops
                     if o.pid == call.pid and o.tid == call.tid and o.start_ns <= call.start_ns < o.end_ns]
        launcher = max(enclosing, key=lambda o: (o.start_ns, -(o.end_ns - o.start_ns)))
        per_call.setdefault((launcher.name, launcher.start_ns, launcher.tid), []).append((op.start_ns, op.end_ns))
    out: dict[str, list[int]] = {}
    for (name, _, _), ivs in per_call.items():
        row = out.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += len(ivs)
        row[2] += sum(e - s for s, e in merge(ivs))
    return {k: tuple(v) for k, v in out.items()}


def got_by_op(trace) -> dict[str, tuple[int, int, int]]:
    res = ops_summary(trace, group_by="name", limit=500)
    return {r.name: (r.count, r.gpu_op_count, r.total_direct_kernel_time_ns) for r in res.rows if r.launcher_kind == "cpu_op"}


def test_graph_launch_owns_all_its_kernels(open_profile):
    scenario = SCENARIOS["graph_launch"]()
    got = got_by_op(open_profile("graph_launch", "kineto"))
    want = expected_by_op(scenario)
    assert got == want
    graph_ops = sum(1 for k in scenario.kernels if k.correlation_id == 2)
    assert graph_ops == 20 and got["CUDAGraph::replay"][:2] == (1, 20)


def test_second_thread_launches_go_to_that_threads_op(open_profile):
    scenario = SCENARIOS["concurrent_streams"]()
    got = got_by_op(open_profile("concurrent_streams", "kineto"))
    assert got == expected_by_op(scenario)
    # The copy issued from thread 1001 lands on that thread's aten::copy_, not on the
    # long aten::item of thread 1000 that encloses it in time.
    second = [o for o in scenario.cpu_ops if o.tid == 1001]
    assert second and got["aten::copy_"][0] == sum(1 for o in scenario.cpu_ops if o.name == "aten::copy_")


def test_each_gpu_op_attributed_once(open_profile):
    for name in ("graph_launch", "concurrent_streams", "unlinked_kernels"):
        res = ops_summary(open_profile(name, "kineto"), group_by="name", limit=500)
        assert sum(r.gpu_op_count for r in res.rows) == res.totals.gpu_ops, name
        s = expressed(SCENARIOS[name](), "kineto")  # the total from the scenario, not from the tool
        assert res.totals.gpu_ops == len(s.kernels) + len(s.memops) > 0, name
