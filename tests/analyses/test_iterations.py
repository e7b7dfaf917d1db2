"""iterations on scenarios written as Nsight, rocpd and Kineto files, against figures computed from the
scenario in plain Python; plus every real profile under ../shared/data."""

from __future__ import annotations

import statistics

import pytest

from conftest import FORMATS, needs_data, real_files, under_memory_limit
from gpuscope.fixtures import scenarios_iterations as SI
from gpuscope.fixtures.truth import expressed, merge, time_shift
from gpuscope.tools.analyses.iterations import iterations
from gpuscope.tools.analyses.step_choice import WARMUP_FACTOR
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace



@pytest.fixture(scope="module")
def opened(open_profile):
    """opened(name, fmt) -> (the scenario as that format expresses it, the opened trace)."""
    return lambda name, fmt: (expressed(SI.SCENARIOS[name](), fmt), open_profile(name, fmt, scenarios=SI.SCENARIOS))


def step_truth(s, step) -> dict:
    """Per device: projected ops (launching call inside the step on its thread) and window figures (every op of
    the process overlapping the step, clipped)."""
    calls = {(a.pid, a.correlation_id): a for a in s.api_calls}
    ops = [*s.kernels, *s.memops]
    out: dict[int, dict] = {}
    for op in ops:
        if op.pid != step.pid:
            continue
        a = calls.get((op.pid, op.correlation_id))
        proj = a is not None and a.tid == step.tid and step.start_ns <= a.start_ns and a.end_ns <= step.end_ns
        cs, ce = max(op.start_ns, step.start_ns), min(op.end_ns, step.end_ns)
        inwin = ce > cs or (op.start_ns == op.end_ns and step.start_ns <= op.start_ns < step.end_ns)
        if not (proj or inwin):
            continue
        d = out.setdefault(op.device_id, {"prj": [], "win": []})
        if proj:
            d["prj"].append(op)
        if inwin:
            d["win"].append((op, cs, ce))
    wall = step.end_ns - step.start_ns
    res = {}
    for dev, d in out.items():
        busy = sum(e - b for b, e in merge([(c, e) for _, c, e in d["win"]]))
        res[dev] = {"projected_ops": len(d["prj"]), "projected_kernels": sum(hasattr(o, "short_name") for o in d["prj"]),
                    "projected_busy_ns": sum(e - b for b, e in merge([(o.start_ns, o.end_ns) for o in d["prj"]])),
                    "window_kernels": sum(hasattr(o, "short_name") for o, _, _ in d["win"]),
                    "window_busy_ns": busy, "window_idle_ns": wall - busy}
    return res


def warmup_truth(walls: list[int]) -> list[int]:
    warm = []
    for i in range(len(walls) - 2):
        if walls[i] > WARMUP_FACTOR * statistics.median(walls[i + 1:]):
            warm.append(i)
        else:
            break
    return warm if len(walls) >= 3 else []


def check_steps(res, s, steps, shift):
    assert [(st.name, st.start_ns, st.end_ns) for st in res.steps] == [(m.name, m.start_ns + shift, m.end_ns + shift) for m in steps]
    for st, m in zip(res.steps, steps):
        want = step_truth(s, m)
        assert st.wall_ns == m.end_ns - m.start_ns
        assert {d.device_id: d.model_dump(exclude={"device_id", "window_busy_pct_of_wall"}) for d in st.devices} == want
        assert st.window_kernels == sum(w["window_kernels"] for w in want.values())
        assert st.projected_kernels == sum(w["projected_kernels"] for w in want.values())
    walls = [m.end_ns - m.start_ns for m in steps]
    (sm,) = res.summaries
    assert sm.steps == len(walls) and sm.wall_total_ns == sum(walls)
    assert sm.wall_median_ns == statistics.median(walls) and sm.wall_min_ns == min(walls) and sm.wall_max_ns == max(walls)
    assert sm.wall_mean_ns == pytest.approx(statistics.fmean(walls), abs=0.05)
    assert sm.wall_std_ns == pytest.approx(statistics.stdev(walls), abs=0.05)
    assert sm.wall_cv == pytest.approx(statistics.stdev(walls) / statistics.fmean(walls), abs=1e-4)
    assert sm.slowest.index == walls.index(max(walls)) and sm.fastest.index == walls.index(min(walls))
    warm = warmup_truth(walls)
    assert sm.warmup_steps == warm and [st.warmup for st in res.steps] == [i in warm for i in range(len(walls))]
    steady = walls[len(warm):]
    assert sm.steady_steps == len(steady) and sm.steady_median_ns == statistics.median(steady)
    return sm


@pytest.mark.parametrize("fmt", FORMATS)
def test_training_loop(opened, fmt):
    s, trace = opened("training_loop", fmt)
    shift = time_shift(s, fmt)
    res = iterations(trace)
    assert res.choice.how == "auto" and res.choice.pattern == "train_step_<N>"
    assert "shallowest" in res.choice.reason
    alts = {a.pattern: a for a in res.alternatives}
    # forward covers as much GPU work but sits deeper; layers and data waits cover little
    assert alts["forward"].min_depth == 2 and alts["layer_<N>"].instances == 10
    assert alts["data_wait_<N>"].coverage_pct_of_gpu_work == 0.0
    steps = sorted((m for m in s.markers if m.name.startswith("train_step_")), key=lambda m: m.start_ns)
    sm = check_steps(res, s, steps, shift)
    assert sm.warmup_steps == [0] and sm.steady_steps == 4
    st1 = res.steps[1]
    # single-device series: top-level figures are device 0's; the autograd thread's backward kernels and the
    # unlinked kernel are in the window figure only
    d0 = st1.devices[0]
    assert st1.gpu_busy_in_window_ns == d0.window_busy_ns and st1.gpu_idle_in_window_ns == d0.window_idle_ns
    assert st1.projected_kernels == 3 and st1.window_kernels == 6
    # coverage of the chosen group, by hand: main-thread work / all launched work
    main = sum(8 + 8 + (400 if i == 0 else 200 + 5 * i) for i in range(5))
    assert alts["forward"].coverage_pct_of_gpu_work == round(100 * main / (main + 5 * 180), 2)


@pytest.mark.parametrize("fmt", FORMATS + ("kineto_2021",))
def test_profiler_steps_two_devices(opened, fmt):
    s, trace = opened("profiler_steps", fmt)
    shift = time_shift(s, fmt)
    res = iterations(trace)
    assert res.choice.how == "ProfilerStep" and res.choice.pattern == "ProfilerStep#<N>"
    steps = sorted((m for m in s.markers if m.name.startswith("ProfilerStep")), key=lambda m: m.start_ns)
    check_steps(res, s, steps, shift)
    # the series uses two devices: per-step totals are only given per device
    assert all(st.gpu_busy_in_window_ns is None and st.gpu_busy_projected_ns is None for st in res.steps)
    assert [len(st.devices) for st in res.steps] == [1, 1, 2, 1]
    # 2021 traces write every record_function range as an 'Operator': only ProfilerStep#N is known to be a range
    assert [a.pattern for a in res.alternatives] == ([] if fmt == "kineto_2021" else ["optimizer"])
    # device filter keeps device 1 only
    res1 = iterations(trace, device=1)
    assert [[d.device_id for d in st.devices] for st in res1.steps] == [[], [], [1], []]


@pytest.mark.parametrize("fmt", FORMATS)
def test_marker_parameter_and_errors(opened, fmt):
    s, trace = opened("training_loop", fmt)
    shift = time_shift(s, fmt)
    for marker in ("forward", "layer_<N>", "layer_*"):
        res = iterations(trace, marker=marker)
        assert res.choice.how == "caller"
    res = iterations(trace, marker="layer_<N>")
    assert len(res.steps) == 10 and res.summaries[0].steps == 10
    res = iterations(trace, marker="train_step_3")
    assert [st.name for st in res.steps] == ["train_step_3"] and "too few steps" in res.summaries[0].warmup_note
    res = iterations(trace, start_ns=3_000_000 + shift, end_ns=6_500_000 + shift)
    assert [st.name for st in res.steps] == ["train_step_1", "train_step_2", "train_step_3"]
    assert [st.index for st in res.steps] == [0, 1, 2]
    res = iterations(trace, limit=2)
    assert res.truncated and len(res.steps) == 2 and res.summaries[0].steps == 5
    with pytest.raises(ProfileError, match="no annotation range matches marker"):
        iterations(trace, marker="nope")
    with pytest.raises(ProfileError, match="process 7 has no annotation ranges"):
        iterations(trace, pid=7)


def test_no_markers_and_no_repeats(tmp_path):
    from gpuscope.fixtures import scenarios_marker_summary as SM
    from gpuscope.fixtures.writers import nsys

    path = nsys.write(SM.no_markers(), tmp_path / "none.sqlite")
    with pytest.raises(ProfileError, match="no annotation ranges.*NVTX_EVENTS.*--trace=cuda,nvtx"):
        iterations(load_trace(path))
    s = SM.marker_tree()
    s.markers = [m for m in s.markers if m.name in ("block", "data_wait")]  # 'block' nests in itself: 1 outermost
    path = nsys.write(s, tmp_path / "once.sqlite")
    with pytest.raises(ProfileError, match="no annotation range repeats"):
        iterations(load_trace(path))


REAL = real_files("nsys/*.sqlite", "pytorch/*.json.gz")


@needs_data
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_profiles(path):
    trace = open_trace(path)
    try:
        res = iterations(trace)
    except ProfileError as exc:
        assert "iterations needs data" in str(exc) or "no annotation range repeats" in str(exc)
        return
    assert res.steps  # an answer, not a refusal: at least one step
    for st in res.steps:
        assert st.wall_ns == st.end_ns - st.start_ns
        for d in st.devices:
            assert 0 <= d.window_busy_ns <= st.wall_ns
    if trace.scalar("SELECT count(*) FROM markers WHERE name LIKE 'ProfilerStep#%'"):
        assert res.choice.how == "ProfilerStep"
        assert sum(s.steps for s in res.summaries) == trace.scalar(
            "SELECT count(*) FROM markers WHERE name LIKE 'ProfilerStep#%' AND kind = 'annotation'")


SMALL_MEMORY_CHILD = """
import json, sys
from gpuscope.tools.analyses.gpu_timeline import gpu_timeline
from gpuscope.tools.analyses.iterations import iterations
from gpuscope.tools.analyses.marker_summary import marker_summary
from gpuscope.tools.analyses.phases import phases
from gpuscope.tools.analyses.api_summary import api_summary
from gpuscope.tools.analyses.critical_path import critical_path
from gpuscope.tools.analyses.ops_summary import ops_summary
from gpuscope.tools.model.cache import open_trace
t = open_trace(sys.argv[1])
it = iterations(t, limit=3)
ms = marker_summary(t, limit=50)
ph = phases(t)
tl = gpu_timeline(t).timelines[0]
dev = api_summary(t).launches[0]
cp = critical_path(t)
ops = ops_summary(t, limit=16)
print(json.dumps({"ops": [ops.attribution, ops.totals.gpu_ops, ops.totals.unattributed_gpu_ops, ops.totals.gpu_busy_ns,
                          ops.totals.summed_kernel_time_ns, {r.name: [r.count, r.gpu_op_count] for r in ops.rows}],"critical_path": [cp.path_ns > 0, cp.path_ns == cp.window_span_ns, sum(x.ns for x in cp.split) == cp.path_ns],
                  "timeline": [tl.ops, tl.busy_ns],"steps": it.summaries[0].steps, "wall_ns": it.summaries[0].wall_total_ns,
                  "listed_projected": [s.projected_kernels for s in it.steps],
                  "ranges": ms.ranges, "projected_ops": ms.projection.projected_ops,
                  "per_name": {m.name: [m.count, m.gpu_kernels] for m in ms.markers},
                  "phase_markers": ph.iteration_markers.count,
                  "launches": [dev.stream_id, dev.kernels, dev.launch_calls, dev.unlinked_kernels]}))
"""


def test_heavy_tools_fit_a_small_memory_limit(tmp_path):
    """2 M kernels with an NVTX range around every 8 launches (250,000 steps), iterations, marker_summary, phases,
    gpu_timeline, api_summary, critical_path and ops_summary under DuckDB's smallest limit (64 MiB) over the built
    store: they spill. When the GPU ops met their launching calls and those calls their threads in one statement, that
    ran the first three out of memory here (and iterations at 190 MiB); so did iterations' per-step unions, a window
    over the step/op pairs straight from their join, and gpu_timeline's launch lookup of the idle gaps in batches of
    4 M op positions whatever the limit. api_summary and critical_path ran out of it on two DuckDB threads (each
    statement's per-thread buffers), and answer on the one thread a 64 MiB limit now gets: all kernels linked to
    their launches. ops_summary's projection met the GPU ops with their calls again after its frame's launcher rows
    had, and ran out of a 128 MiB limit here: those rows are now written once and read by both."""
    import json

    from gpuscope.fixtures.writers import nsys

    n = 2_000_000
    path = tmp_path / "steps.sqlite"
    truth = nsys.write_scale(path, n_kernels=n, nvtx_every=8)
    got = json.loads(under_memory_limit(tmp_path, path, SMALL_MEMORY_CHILD))
    steps = truth["n_ranges"]
    assert got == {
        "timeline": [n, truth["kernel_busy_ns"]], "steps": steps, "wall_ns": truth["ranges_wall_ns"], "listed_projected": [8, 8, 8],
        "ranges": steps, "projected_ops": n,
        # range j is 'layer_<j % 16>' around launches 8j .. 8j + 7
        "per_name": {f"layer_{i}": [len(range(i, steps, 16)), 8 * len(range(i, steps, 16))] for i in range(16)},
        "phase_markers": steps,
        "launches": [None, n, n, 0],
        # every kernel's launching call lies in one range: each range owns its 8 kernels
        "ops": ["range", n, 0, truth["kernel_busy_ns"], sum(v["total_ns"] for v in truth["per_name"].values()),
                {f"layer_{i}": [len(range(i, steps, 16)), 8 * len(range(i, steps, 16))] for i in range(16)}],
        # the path reproduces the measured window and its split by kind sums to it (critical_path's own invariants:
        # its window is cut at the node cap, so no writer figure gives its length)
        "critical_path": [True, True, True]}
