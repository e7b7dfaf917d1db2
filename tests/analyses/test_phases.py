"""phases: scenario profiles whose phases are known by construction (fixtures/scenarios_phases.py),
written in all three formats, with every per-phase figure recomputed from the Scenario in plain
Python (exact integer ns); PerfAdvisor's phase mistakes pinned; every real profile runs."""

from __future__ import annotations

import importlib
import sqlite3
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import DATA, FORMATS
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.catalog import US
from gpuscope.fixtures.scenarios_phases import PHASE_SCENARIOS
from gpuscope.tools.analyses.iterations import iterations
from gpuscope.tools.analyses.phases import phases
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError

phases_module = importlib.import_module("gpuscope.tools.analyses.phases")  # the package re-exports the function under this name

REAL = sorted(p for sub in ("nsys", "pytorch", "rocpd_legacy") for p in (DATA / sub).glob("*")
              if p.is_file() and p.suffix in (".sqlite", ".gz", ".rpd")) if DATA.is_dir() else []


@lru_cache(maxsize=None)
def built(name: str):
    return PHASE_SCENARIOS[name]()


MAKERS = {name: (lambda name=name: built(name)[0]) for name in PHASE_SCENARIOS}  # the scenario, not its truth


@pytest.fixture(scope="module")
def open_phase(open_profile):
    return lambda name, fmt: open_profile(name, fmt, scenarios=MAKERS)


def clipped(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


def expected_phase(s, lo: int, hi: int, last: bool) -> dict:
    """Figures of the phase [lo, hi) from the scenario alone: clipped union, counts of ops starting inside."""
    inside = (lambda t: lo <= t <= hi) if last else (lambda t: lo <= t < hi)
    busy = sum(clipped(a, b, lo, hi) for a, b in T.merge([(o.start_ns, o.end_ns) for o in [*s.kernels, *s.memops]]))
    by_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k in s.kernels:
        t = clipped(k.start_ns, k.end_ns, lo, hi)
        if t or inside(k.start_ns):
            by_name[k.short_name][0] += inside(k.start_ns)
            by_name[k.short_name][1] += t
    top = sorted(((n, c, t) for n, (c, t) in by_name.items()), key=lambda x: (-x[2], -x[1], x[0]))
    return {
        "busy_ns": busy, "idle_ns": hi - lo - busy,
        "kernel_count": sum(inside(k.start_ns) for k in s.kernels),
        "copy_count": sum(inside(m.start_ns) for m in s.memops if m.op == "copy"),
        "kernel_time_ns": sum(clipped(k.start_ns, k.end_ns, lo, hi) for k in s.kernels),
        "copy_time_ns": sum(clipped(m.start_ns, m.end_ns, lo, hi) for m in s.memops if m.op == "copy"),
        "top": top,
    }


CASES = [pytest.param(n, f, id=f"{n}-{f}") for n in PHASE_SCENARIOS for f in FORMATS]


@pytest.mark.parametrize("name,fmt", CASES)
def test_phases_match_scenario(open_phase, name, fmt):
    s, exp = built(name)
    s = T.expressed(s, fmt)
    shift = T.time_shift(s, fmt)
    res = phases(open_phase(name, fmt), limit=10)
    bounds = [p.start_ns - shift for p in res.phases] + [res.phases[-1].end_ns - shift]
    assert bounds == exp["bounds"]
    assert [p.label for p in res.phases] == exp["labels"]
    assert res.gpu_first_ns - shift == exp["bounds"][0] and res.gpu_last_ns - shift == exp["bounds"][-1]
    assert res.busy_ns == sum(p.busy_ns for p in res.phases)
    if "iterations" in exp:
        assert [p.iterations for p in res.phases] == exp["iterations"]
    for i, p in enumerate(res.phases):
        lo, hi = bounds[i], bounds[i + 1]
        want = expected_phase(s, lo, hi, i == len(res.phases) - 1)
        assert p.duration_ns == hi - lo
        for key in ("busy_ns", "idle_ns", "kernel_count", "copy_count", "kernel_time_ns", "copy_time_ns"):
            assert getattr(p, key) == want[key], (i, key)
        assert p.busy_pct_of_phase == round(100 * want["busy_ns"] / (hi - lo), 2)
        assert [(k.name, k.count, k.time_in_phase_ns) for k in p.top_kernels] == want["top"][:10]


def test_init_boundary_comes_from_the_iteration_marker(open_phase):
    """Step 0's first gemm starts 2 µs after the setup kernels; the marker, not an idle gap, places it."""
    res = phases(open_phase("phases_train", "nsys"))
    assert res.iteration_markers is not None and res.iteration_markers.name == "ProfilerStep#<N>"
    assert res.iteration_markers.count == 20 and res.iteration_markers.with_gpu_work == 20
    assert "iteration" in res.phases[1].start_source
    assert res.phases[0].label == "init" and res.phases[2].label == "teardown"
    assert res.phases[2].dominant.name == "memcpy DtoH"
    assert res.phases[1].dominant.name == "gemm_kernel"



@pytest.mark.parametrize("fmt", FORMATS)
def test_iterations_come_from_the_iterations_tool(open_phase, fmt):
    """Steps nested in an outer range (the old per-phases rule took only top-level ranges and found none):
    phases uses the `iterations` tool's choice, and each step's first GPU op on the device."""
    t = open_phase("phases_nested_steps", fmt)
    it = iterations(t)
    res = phases(t)
    assert it.choice.pattern == "train_step_<N>" and len(it.steps) == 20
    assert res.iteration_markers is not None and res.iteration_markers.name == it.choice.pattern
    assert res.iteration_markers.count == 20 and res.iteration_markers.with_gpu_work == 20
    assert "iteration" in res.phases[1].start_source
    s, exp = built("phases_nested_steps")
    s = T.expressed(s, fmt)
    shift = T.time_shift(s, fmt)
    assert res.phases[1].start_ns - shift == exp["bounds"][1]


def test_submillisecond_bins(open_phase):
    """A 351 µs capture is binned finely (PerfAdvisor floors bins at 50 ms: one bin, no phases)."""
    res = phases(open_phase("phases_submillisecond", "kineto"))
    assert res.gpu_span_ns == 351 * US
    assert res.bin_width_ns == -(-351 * US // 400) and res.bins == 400
    assert len(res.phases) == 3


def test_single_phase_profile(open_phase):
    res = phases(open_phase("phases_single", "rocpd"))
    assert len(res.phases) == 1
    p = res.phases[0]
    assert p.label == "steady" and "one phase" in p.label_reason
    assert res.iteration_markers.name == "train_step_<N>" and p.iterations == 30


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_phases_one_covers_everything_with_real_figures(open_phase, fmt):
    """PerfAdvisor's max_phases=1 gave an empty window with zero metrics."""
    s, exp = built("phases_train")
    s = T.expressed(s, fmt)
    shift = T.time_shift(s, fmt)
    res = phases(open_phase("phases_train", fmt), max_phases=1)
    assert len(res.phases) == 1 and res.cost_by_phase_count == res.cost_by_phase_count[:1]
    p = res.phases[0]
    lo, hi = exp["bounds"][0], exp["bounds"][-1]
    assert (p.start_ns - shift, p.end_ns - shift) == (lo, hi)
    want = expected_phase(s, lo, hi, True)
    assert p.busy_ns == want["busy_ns"] > 0 and p.kernel_count == len(s.kernels) == want["kernel_count"]
    assert p.copy_count == len(s.memops)
    assert "max_phases=1" in p.label_reason
    assert 0 < p.busy_pct_of_phase <= 100


def test_boundary_straddling_op_counts_once(open_phase):
    """A window starting inside a gemm: the part before the window is not counted; with max_phases
    forcing several phases, per-phase clipped times add up to the total exactly (no double count)."""
    s, _ = built("phases_train")
    gemm = next(k for k in s.kernels if k.short_name == "gemm_kernel")
    start = gemm.start_ns + 100 * US
    res = phases(open_phase("phases_train", "nsys"), start_ns=start, max_phases=6)
    assert res.gpu_first_ns == start
    first = res.phases[0]
    assert first.start_ns == start
    total_k = sum(clipped(k.start_ns, k.end_ns, start, res.gpu_last_ns) for k in s.kernels)
    assert sum(p.kernel_time_ns for p in res.phases) == total_k
    assert sum(p.busy_ns for p in res.phases) == res.busy_ns
    assert all(p.busy_pct_of_phase <= 100 for p in res.phases)


def test_idle_stretch_is_a_phase_labelled_idle(open_phase):
    res = phases(open_phase("phases_idle_stretch", "kineto"))
    idle = res.phases[1]
    assert idle.label == "idle" and idle.busy_ns == 0 and idle.kernel_count == 0
    assert idle.busy_pct_of_phase == 0.0 and idle.dominant.name == "idle"
    assert [p.label for p in res.phases] == ["steady", "idle", "steady"]


def test_bad_requests(open_phase):
    t = open_phase("phases_train", "nsys")
    with pytest.raises(ProfileError, match="max_phases"):
        phases(t, max_phases=0)
    with pytest.raises(ProfileError, match="device 5"):
        phases(t, device=5)
    s, exp = built("phases_train")
    # a window inside the capture holding no GPU activity: the idle gap before the teardown
    lo = (exp["bounds"][2] - 90 * US)
    with pytest.raises(ProfileError, match="no GPU activity"):
        phases(t, start_ns=lo, end_ns=lo + 50 * US)


# ---------------------------------------------------------------------------------------------- real


def _raw_union(path: Path, device: int) -> tuple[int, int, int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        iv = []
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            if t in tables:
                iv += con.execute(f"SELECT start, end FROM {t} WHERE deviceId = ?", [device]).fetchall()
    finally:
        con.close()
    m = T.merge(iv)
    return m[0][0], m[-1][1], sum(e - s for s, e in m)


@pytest.mark.skipif(not REAL, reason="../shared/data is not present")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_profiles(path):
    try:
        trace = open_trace(path)
    except ProfileError:
        pytest.skip("the reader refuses this file")
    try:
        res = phases(trace)
    except ProfileError as exc:  # refusing is allowed, with a message
        assert str(exc)
        return
    ps = res.phases
    assert 1 <= len(ps) <= res.max_phases
    assert ps[0].start_ns == res.gpu_first_ns and ps[-1].end_ns == res.gpu_last_ns
    assert all(a.end_ns == b.start_ns for a, b in zip(ps, ps[1:]))
    assert all(p.duration_ns > 0 and 0 <= p.busy_ns <= p.duration_ns for p in ps)
    assert sum(p.busy_ns for p in ps) == res.busy_ns
    n_kernels = trace.scalar("SELECT count(*) FROM kernels WHERE device_id = ? AND start_ns >= ? AND start_ns <= ?",
                             [res.device_id, res.gpu_first_ns, res.gpu_last_ns])
    assert sum(p.kernel_count for p in ps) == n_kernels
    one = phases(trace, max_phases=1).phases
    assert len(one) == 1 and one[0].busy_ns == res.busy_ns and one[0].kernel_count == n_kernels
    if path.suffix == ".sqlite":
        first, last, busy = _raw_union(path, res.device_id)
        assert (res.gpu_first_ns, res.gpu_last_ns, res.busy_ns) == (first, last, busy)


def test_the_ops_stay_in_duckdb(tmp_path, monkeypatch):
    """Memory does not grow with the profile: every figure is computed in DuckDB, so no statement of phases hands
    Python more rows than (bins + 1) × (features + 1) (the per-bin shares), far fewer than the device's ops."""
    from gpuscope.fixtures.writers import nsys
    from gpuscope.tools.model.hub import ModelConnection
    from gpuscope.tools.model.trace import load_trace

    n = 20_000
    path = tmp_path / "scale.sqlite"
    nsys.write_scale(path, n_kernels=n)
    trace = load_trace(path)
    fetched: list[int] = []

    class Counting:  # a cursor that counts the rows it hands over
        def __init__(self, cur):
            self._cur = cur

        def execute(self, *a):
            self._cur.execute(*a)
            return self

        def fetchall(self):
            rows = self._cur.fetchall()
            fetched.append(len(rows))
            return rows

        def fetchnumpy(self):
            cols = self._cur.fetchnumpy()
            fetched.append(max((len(v) for v in cols.values()), default=0))
            return cols

        def __getattr__(self, name):
            return getattr(self._cur, name)

    cursor = ModelConnection.cursor
    monkeypatch.setattr(ModelConnection, "cursor", lambda self: Counting(cursor(self)))
    try:
        res = phases(trace)
    finally:
        monkeypatch.undo()
        trace.close()
    assert sum(p.kernel_count for p in res.phases) == n
    assert max(fetched) <= (res.bins + 1) * (len(res.features) + 1) < n
