"""compare_traces: a before/after fixture pair (one kernel 2x slower, one new, one removed) in three
formats with exact expected deltas; the real cross-platform Qwen pair (H100 vs MI300X) runs."""

from __future__ import annotations

import pytest

from conftest import DATA
from gpuscope.fixtures import truth as T
from gpuscope.fixtures import scenarios_compare as SC
from gpuscope.fixtures.scenarios_compare import EXPECTED_KERNELS, EXPECTED_OPS, GROSS_NS, compare_pair
from gpuscope.fixtures.writers import kineto, rocpd
from gpuscope.tools.analyses.compare_traces import compare_traces
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

QWEN = [DATA / "pytorch" / f"{p}_qwen1.5-0.5b_infer_tracelens.json.gz" for p in ("nv_h100", "amd_mi300x")]
needs_qwen = pytest.mark.skipif(not all(p.is_file() for p in QWEN), reason="../shared/data Qwen pair is not present")
SIDES = {"compare_baseline": lambda: compare_pair()[0], "compare_candidate": lambda: compare_pair()[1]}


@pytest.fixture(scope="module")
def pair(open_profile):
    """pair(fmt_b, fmt_c) -> [baseline opened as fmt_b, candidate opened as fmt_c]."""
    return lambda fmt_b, fmt_c: [open_profile(side, fmt, scenarios=SIDES) for side, fmt in zip(SIDES, (fmt_b, fmt_c))]


def _span_and_busy(s):
    iv = [(k.start_ns, k.end_ns) for k in s.kernels]
    return max(e for _, e in iv) - min(b for b, _ in iv), T.busy_ns(iv), sum(e - b for b, e in iv)


@pytest.mark.parametrize("fmts", [("nsys", "nsys"), ("kineto", "kineto"), ("rocpd", "rocpd"), ("nsys", "kineto")])
def test_known_regression(pair, fmts):
    b, c = pair(*fmts)
    res = compare_traces(b, c)
    sb, sc = compare_pair()
    totals = {t.figure: t for t in res.totals}
    for side, s in (("baseline_ns", sb), ("candidate_ns", sc)):
        span, busy, summed = _span_and_busy(s)
        assert getattr(totals["gpu_span_ns"], side) == span
        assert getattr(totals["busy_ns"], side) == busy
        assert getattr(totals["computation_ns"], side) == busy
        assert getattr(totals["idle_ns"], side) == span - busy
        assert getattr(totals["summed_kernel_time_ns"], side) == summed
        assert getattr(totals["total_comm_ns"], side) == 0 == getattr(totals["exposed_comm_ns"], side)  # no NCCL kernels
        assert getattr(totals["total_memcpy_ns"], side) == T.busy_ns([(m.start_ns, m.end_ns) for m in s.memops if m.op == "copy"])
    assert totals["busy_ns"].delta_ns == 2 * (100 + 30 - 10) * 1000
    assert not res.platform.cross_platform and res.platform.memory_bandwidth_ratio is None

    k = {e.key: e for e in res.kernels.entries}
    assert {n: (e.status, e.delta_ns) for n, e in k.items()} == EXPECTED_KERNELS
    assert res.kernels.gross_change_ns == GROSS_NS
    assert res.kernels.counts["unchanged"] == 1  # the elementwise add
    assert k["gemm_kernel"].change_pct == 100.0
    assert k["gemm_kernel"].pct_of_gross_change == round(100 * 200_000 / GROSS_NS, 2)
    assert [e.key for e in res.kernels.entries] == ["gemm_kernel", "reduce_kernel", "softmax_warp_forward"]

    if fmts != ("kineto", "kineto"):  # Nsight/rocpd hold no PyTorch cpu_ops: ops are not compared
        assert res.ops is None and any("cpu_ops" in n for n in res.notes)
        return
    assert res.ops is not None
    o = {e.key: e for e in res.ops.entries}
    assert {n: (e.status, e.delta_ns) for n, e in o.items()} == EXPECTED_OPS
    assert res.ops.gross_change_ns == GROSS_NS
    assert o["aten::mm"].input_dims is not None


def test_full_name_and_device_pair(pair):
    b, c = pair("nsys", "nsys")
    res = compare_traces(b, c, match="name", device=[0, 0], limit=1)
    assert res.devices == [0, 0]
    assert res.kernels.matched_by == "kernel name"
    assert len(res.kernels.entries) == 1 and res.kernels.truncated
    assert res.kernels.remainder_entries == 2
    assert res.kernels.remainder_delta_ns == 60_000 - 20_000
    assert any("2 more changed entries" in n and "limit" in n for n in res.notes)  # truncation hint
    with pytest.raises(ProfileError):
        compare_traces(b, c, device=3)
    with pytest.raises(ProfileError):
        compare_traces(b, c, match="bogus")


@needs_qwen
def test_real_cross_platform_pair():
    b, c = (load_trace(p) for p in QWEN)
    try:
        res = compare_traces(b, c)
        assert res.platform.cross_platform
        assert "H100" in res.platform.baseline_device and "MI300X" in res.platform.candidate_device
        assert res.platform.memory_bandwidth_ratio and res.platform.matrix_ratios.get("bf16")
        assert len(res.model_dump_json()) < 20_000
        assert res.ops is not None and res.ops.entries
        deltas = [abs(e.delta_ns) for e in res.ops.entries]
        assert deltas == sorted(deltas, reverse=True)
        assert any((e.bound or "").split(" ")[0] in ("memory", "compute") and e.expected_ratio for e in res.ops.entries)
        for e in res.ops.entries:
            if e.expected_ratio and e.measured_ratio:
                r = e.measured_ratio / e.expected_ratio
                assert e.off_expected == (not (1 / 1.5 <= r <= 1.5))
        tot = {t.figure: t for t in res.totals}
        assert tot["busy_ns"].baseline_ns > 0 and tot["busy_ns"].candidate_ns > 0
        assert any("cross-platform" in n for n in res.notes)
    finally:
        b.close()
        c.close()


def test_cli_compare(pair, capsys):
    import json

    from gpuscope.server.cli import main

    b, c = pair("kineto", "kineto")
    main(["compare-traces", str(b.path), str(c.path), "--device", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["devices"] == [0, 0]
    assert {e["key"]: e["delta_ns"] for e in out["kernels"]["entries"]}["gemm_kernel"] == 200_000


def test_cross_platform_fixture(tmp_path):
    """H100 (Kineto CUDA) vs MI300X (Kineto ROCm), same ops: the expected ratios come from the datasheet figures written in
    the scenario module; the GEMM 3x slower where 0.757x is expected is flagged, the add at the bandwidth ratio is not."""
    b, c = (load_trace(kineto.write(s, tmp_path / f"{s.name}.pt.trace.json")) for s in SC.cross_platform_pair())
    try:
        res = compare_traces(b, c)
    finally:
        b.close()
        c.close()
    p = res.platform
    assert p.cross_platform and "H100" in p.baseline_device and "MI300X" in p.candidate_device
    assert p.memory_bandwidth_ratio == SC.XP_EXPECTED_BW_RATIO
    assert p.matrix_ratios["bf16"] == SC.XP_EXPECTED_BF16_RATIO
    assert res.ops is not None
    o = {e.key: e for e in res.ops.entries}
    assert set(o) == set(SC.XP_EXPECTED)
    gross = SC.XP_STEPS * sum(abs(cu - bu) for *_, bu, cu in SC.XP_OPS.values()) * 1000
    assert res.ops.gross_change_ns == gross
    for op, (status, bound, exp, measured, off) in SC.XP_EXPECTED.items():
        e = o[op]
        _, _, _, bu, cu = SC.XP_OPS[op]
        assert e.status == status and e.bound.split(" ")[0] == bound
        assert e.delta_ns == SC.XP_STEPS * (cu - bu) * 1000
        assert e.pct_of_gross_change == round(100 * e.delta_ns / gross, 2)
        assert e.expected_ratio == exp and e.measured_ratio == measured and e.off_expected is off
    # kernels: vendor libraries differ -> the GEMMs are new/removed; the shared elementwise kernel has no bound
    k = {e.key: e for e in res.kernels.entries}
    assert k["gemm_kernel"].status == "removed"
    assert k["vectorized_elementwise_kernel"].bound == "bound unknown"
    assert k["vectorized_elementwise_kernel"].expected_ratio is None and k["vectorized_elementwise_kernel"].off_expected is None
    assert any("cross-platform" in n for n in res.notes)


def test_cross_platform_without_ops_says_why(pair, tmp_path):
    """Nsight H100 baseline vs an MI300X rocpd candidate: no PyTorch ops, so no entry can get an expected ratio; the note says so."""
    from gpuscope.fixtures.catalog import amd_mi300x

    b, _ = pair("nsys", "nsys")
    c = load_trace(rocpd.write(amd_mi300x(), tmp_path / "mi_results.db"))
    try:
        res = compare_traces(b, c)
    finally:
        c.close()
    assert res.platform.cross_platform and res.ops is None
    assert all(e.off_expected is None for e in res.kernels.entries)
    assert any("expected ratio" in n and "roofline" in n for n in res.notes)
