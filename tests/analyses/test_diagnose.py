"""diagnose: each one-cause scenario is diagnosed as that class first, with the right evidence; Amdahl bounds;
no-API abstention; every real profile under shared/data runs without error and stays under 20,000 characters."""
from __future__ import annotations

import pytest

from conftest import DATA
from gpuscope.fixtures import scenarios_diagnose as SD
from gpuscope.fixtures.truth import expressed
from gpuscope.fixtures.writers import nsys
from gpuscope.tools.analyses.diagnose import _amdahl, diagnose
from gpuscope.tools.model.trace import load_trace


@pytest.fixture(scope="module")
def traces(open_profile):
    """Each one-cause scenario opened in its own format (SD.FORMAT)."""
    return {name: open_profile(name, SD.FORMAT[name], scenarios=SD.SCENARIOS) for name in SD.SCENARIOS}


def _fields(f):
    return {(e.tool, e.field.split("[")[0]) for e in f.evidence}


@pytest.mark.parametrize("name", list(SD.SCENARIOS))
def test_scenario_class_first(traces, name):
    r = diagnose(traces[name])
    assert r.findings, r.verdict
    top = r.findings[0]
    assert top.bottleneck == SD.EXPECTED[name], [(f.bottleneck, f.share_pct) for f in r.findings]
    assert r.verdict.startswith(SD.EXPECTED[name])
    assert [f.rank for f in r.findings] == list(range(1, len(r.findings) + 1))
    assert all(a.time_at_stake_ns >= b.time_at_stake_ns for a, b in zip(r.findings, r.findings[1:]))
    assert len({f.bottleneck for f in r.findings}) == len(r.findings)  # duplicates merged
    assert r.rules and top.next_step and top.confidence_reason
    assert len(r.model_dump_json()) < 20_000
    # the denominator from the scenario itself (one GPU each): first to last GPU op
    sc = expressed(SD.SCENARIOS[name](), SD.FORMAT[name])
    ops = list(sc.kernels) + list(sc.memops)
    assert len({o.device_id for o in ops}) == 1
    assert r.gpu_span_ns == max(o.end_ns for o in ops) - min(o.start_ns for o in ops)
    for f in r.findings:  # share and Amdahl bounds from the stake and the named denominator (the GPU span)
        F = f.time_at_stake_ns / r.gpu_span_ns
        assert f.share_pct == pytest.approx(100 * F, abs=0.006)
        assert f.speedup_if_halved == pytest.approx(1 / (1 - F / 2), abs=0.001)
        assert f.speedup_if_removed == pytest.approx(1 / (1 - F), rel=1e-3)
        assert f"total_ns = {r.gpu_span_ns} ns" in f.denominator
        assert all(e.tool and e.field for e in f.evidence)
    # no communication kernels in these scenarios except comm_bound: said so, not a silent zero
    assert any(n.tool == "comm_summary" for n in r.not_applicable) == (name != "comm_bound")


def test_compute_evidence(traces):
    top = diagnose(traces["compute_bound"]).findings[0]
    # 2*4096^3 FLOP at 989.5 TFLOP/s = 138.9 µs per call of 1000 µs -> ~13.9 % of roof; headroom ~861 µs x 5
    assert ("roofline", "rows") in _fields(top)
    assert top.time_at_stake_ns == pytest.approx(5 * (1_000_000 - 2 * 4096 ** 3 / 989.5e12 * 1e9), rel=0.01)
    assert top.share_pct == pytest.approx(100 * top.time_at_stake_ns / 5_000_000, abs=0.01)
    assert "Nsight Compute" in top.next_step and "gemm_kernel" in top.next_step  # dominant kernel merged in
    assert ("top_kernels", "kernels") in _fields(top)


def test_memory_evidence(traces):
    top = diagnose(traces["memory_bound"]).findings[0]
    # 3 * 4 B * 2^24 = 201 MB at 3.35 TB/s = 60.1 µs of 600 µs per call
    assert top.time_at_stake_ns == pytest.approx(5 * (600_000 - 12 * (1 << 24) / 3.35e12 * 1e9), rel=0.01)
    assert "DRAM" in top.next_step


def test_launch_evidence(traces):
    r = diagnose(traces["launch_bound"])
    top = r.findings[0]
    ev = {e.field: e.value for e in top.evidence}
    assert ev["launches[device].tiny_pct_of_single_kernel_launches"] == 100.0
    assert top.time_at_stake_ns == r.gpu_span_ns - 200 * 1000  # idle = span - 200 kernels of 1 µs
    assert top.share_pct > 75
    assert "slow" not in top.title and top.confidence == "medium"


def test_slow_first_launches_are_not_called_per_launch_overhead(traces):
    # 3 launch calls of 5 ms issuing 2 µs kernels: the idle is start-up cost (module loading), not launch rate.
    r = diagnose(traces["first_launch"])
    top = r.findings[0]
    ev = {e.field: e.value for e in top.evidence}
    assert top.bottleneck == "launch_overhead" and top.confidence == "low"
    assert ev["launches[device].api_duration.median_ns"] == 5_000_000
    assert "launch calls themselves are slow (median 5.0 ms" in top.title
    assert "warm-up" in top.next_step
    assert top.time_at_stake_ns == r.gpu_span_ns - 3 * 2_000


def test_sync_evidence(traces):
    r = diagnose(traces["sync_bound"])
    top = r.findings[0]
    assert "cudaDeviceSynchronize" in top.title
    assert any("synchronize" in e.field and e.value == 10 * 104_000 for e in top.evidence)
    assert top.time_at_stake_ns == r.gpu_span_ns - 10 * 100_000


def test_comm_evidence(traces):
    r = diagnose(traces["comm_bound"])
    top = r.findings[0]
    ev = {e.field: e.value for e in top.evidence}
    assert ev["timelines[device_id=0].exposed_comm_ns"] == 5 * 400_000 == top.time_at_stake_ns
    assert any(e.tool == "comm_summary" for e in top.evidence)
    # NCCL is not a 'dominant compute kernel'; the GEMM (1/5 of the busy time) is not dominant either
    assert all(f.bottleneck != "compute" for f in r.findings)


def test_dominant_kernel_without_rating_says_so(tmp_path):
    """The compute-bound scenario without its PyTorch ops (Nsight): one kernel is all the GPU time, but nothing can say
    whether it is compute- or memory-bound -> class 'other' that says so, never a guessed 'compute'."""
    tr = load_trace(nsys.write(SD.compute_bound(), tmp_path / "noops.sqlite"))
    try:
        r = diagnose(tr)
    finally:
        tr.close()
    top = r.findings[0]
    assert top.bottleneck == "other" and top.confidence == "low"
    assert "cannot be judged" in top.title and "gemm_kernel" in top.title
    assert top.time_at_stake_ns == 5 * 1_000_000  # five 1000 µs kernels
    assert "Nsight Compute" in top.next_step
    assert all(f.bottleneck not in ("compute", "memory") for f in r.findings)
    assert any(n.tool == "roofline" for n in r.not_applicable)


@pytest.mark.parametrize("fmt, tool, other", [("nsys", "Nsight Compute", "rocprof-compute"),
                                               ("rocpd", "rocprof-compute", "Nsight Compute")])
def test_next_step_names_the_vendors_kernel_profiler(open_profile, fmt, tool, other):
    # amd_mi300x is an AMD device in every format; concurrent_streams an NVIDIA H100.
    name = "concurrent_streams" if fmt == "nsys" else "amd_mi300x"
    steps = [f.next_step for f in diagnose(open_profile(name, fmt)).findings if "profile kernel" in f.next_step]
    assert steps and all(tool in s and other not in s for s in steps)


def test_dominant_kernel_stake_is_its_wall_time_not_summed_time(open_profile):
    """concurrent_streams: gemm_kernel instances overlap each other on two streams; the time at stake is the union
    of its instances (what removing it could give back), computed here from the scenario, not the summed time."""
    from gpuscope.fixtures.catalog import SCENARIOS as CAT

    s = CAT["concurrent_streams"]()
    ivs = sorted((k.start_ns, k.end_ns) for k in s.kernels if k.short_name == "gemm_kernel" and k.device_id == 0)
    wall, cur_s, cur_e = 0, None, None
    for a, b in ivs:
        if cur_e is None or a > cur_e:
            wall += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    wall += cur_e - cur_s
    summed = sum(b - a for a, b in ivs)
    assert wall < summed  # the scenario really overlaps them
    r = diagnose(open_profile("concurrent_streams", "nsys"))
    f = next(f for f in r.findings if "gemm_kernel" in f.title)
    assert f.time_at_stake_ns == wall
    assert {e.field: e.value for e in f.evidence}["kernels[gemm_kernel].total_ns"] == summed


def test_dominant_kernel_merged_only_into_its_op(traces):
    """compute_bound: the GEMM launched by the rated aten::mm is merged into the compute finding (one finding, both
    tools' evidence), not a second finding."""
    r = diagnose(traces["compute_bound"])
    assert [f.bottleneck for f in r.findings].count("compute") == 1
    ev = {e.tool for e in r.findings[0].evidence}
    assert {"roofline", "top_kernels", "op_tree"} <= ev
    assert any(e.tool == "op_tree" and e.value == "aten::mm" for e in r.findings[0].evidence)


def test_amdahl():
    assert _amdahl(0.5) == (round(1 / 0.75, 3), 2.0)
    assert _amdahl(1.0) == (2.0, None)
    assert _amdahl(None) == (None, None)


def test_no_api_calls_abstains(tmp_path):
    s = SD.sync_bound()
    s.api_calls, s.cpu_ops = [], []
    for k in s.kernels:
        k.correlation_id = None
    tr = load_trace(nsys.write(s, tmp_path / "noapi.sqlite"))
    try:
        r = diagnose(tr)
    finally:
        tr.close()
    idle = [f for f in r.findings if "idle" in f.title]
    assert idle and idle[0].bottleneck == "other" and idle[0].confidence == "low"
    assert "cannot be told apart" in idle[0].title
    assert any(n.tool == "api_summary" for n in r.not_applicable)


def test_busy_gpu_needs_no_api_summary(tmp_path):
    """api_summary's figures only explain GPU idle time: on a GPU idle under IDLE_MIN_PCT of its span it is not run,
    so a profile it would refuse (no API calls) gets no not_applicable entry for it, and no idle finding."""
    s = SD.sync_bound()
    s.api_calls, s.cpu_ops = [], []
    t = s.kernels[0].start_ns
    for k in s.kernels:  # back to back: no idle time at all
        k.correlation_id = None
        k.start_ns, k.end_ns, t = t, t + (k.end_ns - k.start_ns), t + (k.end_ns - k.start_ns)
    tr = load_trace(nsys.write(s, tmp_path / "busy_noapi.sqlite"))
    try:
        r = diagnose(tr)
    finally:
        tr.close()
    assert r.gpu_busy_ns == r.gpu_span_ns == sum(k.end_ns - k.start_ns for k in s.kernels)
    assert not any(n.tool == "api_summary" for n in r.not_applicable)
    assert not any("idle" in f.title for f in r.findings)


def test_window_skips_roofline(traces):
    r = diagnose(traces["compute_bound"], start_ns=0, end_ns=10**12)
    assert any(n.tool == "roofline" for n in r.not_applicable)


REAL = sorted(p for p in DATA.rglob("*") if p.suffix in (".sqlite", ".rpd", ".gz", ".db")) if DATA.is_dir() else []


@pytest.mark.skipif(not REAL, reason="shared/data not present")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_profiles(path):
    tr = load_trace(path)
    try:
        r = diagnose(tr)
    finally:
        tr.close()
    assert len(r.model_dump_json()) < 20_000
    assert r.verdict
    for f in r.findings:
        assert f.share_pct is None or 2.0 <= f.share_pct <= 100.0
