"""roofline: hand-computed roofs on a Kineto H100 fixture (a compute-bound GEMM, a memory-bound add),
caller-supplied kernel work on an Nsight fixture, unknown GPU, the optional plot, and the H100 Qwen trace
against TraceLens's GEMM.csv."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from gpuscope.fixtures.catalog import ELEM_ADD, GEMM_H, h100
from gpuscope.fixtures.scenario import ApiCall, CpuOp, Device, Kernel, Process, Scenario, Thread
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.tools.analyses.roofline import roofline, roofline_plot
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

US = 1_000
P = T = 1000
BF16 = "c10::BFloat16"
BW = 3.35e12            # H100 SXM5 datasheet bandwidth, bytes/s
BF16_MATRIX = 989.5e12  # tflops_bf16_matrix
FP32 = 67e12            # tflops_fp32 (vector)
N = 2048
E = 1 << 20


def _scenario(device: Device) -> Scenario:
    """aten::mm 2048³ bf16: two calls of 100 µs; aten::add fp32 2^20 + 2^20: one 10 µs kernel;
    aten::cat (no model): 5 µs. GPU busy 215 µs, span [100, 425] µs = 325 µs."""
    s = Scenario("roof", [device], [Process(P, "python")], [Thread(P, T, "python")])
    corr = [0]
    conc: dict = {}

    def op(name, a, b, ext, dims, types, ci):
        s.cpu_ops.append(CpuOp(P, T, a * US, b * US, name, ext, input_dims=dims, input_types=types))
        conc[("cpu_op", P, ext)] = {"Concrete Inputs": ci}

    def launch(a, ext, k, ka, kb):
        corr[0] += 1
        s.api_calls.append(ApiCall(P, T, a * US, (a + 2) * US, "cudaLaunchKernel", corr[0], ext))
        s.kernels.append(Kernel(device.device_id, 7, ka * US, kb * US, k[0], k[1], P, corr[0]))

    mm = ([[N, N], [N, N]], [BF16, BF16], ["", ""])
    op("aten::mm", 10, 20, 1, *mm)
    launch(11, 1, GEMM_H, 100, 200)
    op("aten::mm", 30, 40, 2, *mm)
    launch(31, 2, GEMM_H, 210, 310)
    op("aten::add", 50, 60, 3, [[E], [E], []], ["float", "float", "Scalar"], ["", "", "1"])
    launch(51, 3, ELEM_ADD, 400, 410)
    op("aten::cat", 70, 80, 4, [[], []], ["TensorList", "Scalar"], ["", "0"])
    launch(71, 4, ELEM_ADD, 420, 425)
    s.options["kineto_args"] = conc
    return s


OWN = {"roof": lambda: _scenario(h100(0))}


@pytest.fixture(scope="module")
def h100_trace(open_profile):
    return open_profile("roof", "kineto", scenarios=OWN)


def test_compute_and_memory_bound_hand_computed(h100_trace):
    r = roofline(h100_trace)
    assert r.peaks_known and r.peaks_model == "h100-sxm5" and r.device_id == 0
    assert r.memory_bandwidth_bytes_per_s == BW
    assert (r.gpu_busy_ns, r.gpu_span_ns) == (215_000, 325_000)
    rows = {x.name: x for x in r.rows}
    mm, add, cat = rows["aten::mm"], rows["aten::add"], rows["aten::cat"]

    flops, nbytes = 2 * N**3, 3 * N * N * 2
    assert mm.unit == "matrix" and mm.dtype == "bf16" and mm.compute_roof_field == "tflops_bf16_matrix"
    assert mm.arithmetic_intensity == pytest.approx(flops / nbytes, rel=1e-5)              # 682.67 FLOP/B
    assert mm.ridge_flops_per_byte == pytest.approx(BF16_MATRIX / BW, rel=1e-5)            # 295.37
    assert mm.bound == "compute"
    assert mm.attainable_tflops == pytest.approx(989.5)
    assert mm.achieved_tflops == pytest.approx(flops / 100e-6 / 1e12, rel=1e-5)             # 171.8
    roof_ns = flops / BF16_MATRIX * 1e9                                                     # 17.362 µs
    assert mm.roofline_time_ns == pytest.approx(roof_ns, rel=1e-5)
    assert mm.pct_of_roof == pytest.approx(100 * roof_ns / 100_000, rel=1e-5)               # 17.36 %
    assert mm.headroom_ns == pytest.approx(100_000 - roof_ns, rel=1e-5)
    assert mm.total_headroom_ns == round(2 * (100_000 - roof_ns))

    aflops, abytes = E, 3 * E * 4
    assert add.unit == "vector" and add.compute_roof_field == "tflops_fp32" and add.compute_roof_tflops == 67
    assert add.arithmetic_intensity == pytest.approx(1 / 12, rel=1e-5)
    assert add.ridge_flops_per_byte == pytest.approx(FP32 / BW, rel=1e-5)                   # 20
    assert add.bound == "memory"
    assert add.attainable_tflops == pytest.approx(aflops / abytes * BW / 1e12, rel=1e-5)    # 0.279
    aroof = abytes / BW * 1e9                                                               # 3.756 µs
    assert add.roofline_time_ns == pytest.approx(aroof, rel=1e-5)
    assert add.pct_of_roof == pytest.approx(100 * aroof / 10_000, rel=1e-5)                 # 37.56 %
    assert add.achieved_tb_per_s == pytest.approx(abytes / 10e-6 / 1e12, rel=1e-5)
    assert add.headroom_ns == pytest.approx(10_000 - aroof, rel=1e-5)

    assert not cat.rated and "no perf model" in cat.why_not_rated and r.not_rated == 1 and r.not_rated_time_ns == 5_000
    assert [x.name for x in r.rows] == ["aten::mm", "aten::add", "aten::cat"]               # by total headroom

    # impact: mm at 80 % of its roof takes 2·roof/0.8, saving the rest of its 200 µs
    imp = {i.name: i for i in r.impact}
    assert [i.name for i in r.impact] == ["aten::mm", "aten::add"]
    t80 = 2 * roof_ns / 0.8
    assert imp["aten::mm"].at_pct["80"]["time_ns"] == round(t80)  # modelled times are whole ns
    assert imp["aten::mm"].at_pct["80"]["saving_ns"] == round(200_000 - t80)
    assert imp["aten::mm"].at_pct["80"]["saving_pct_of_gpu_busy"] == pytest.approx(100 * (200_000 - t80) / 215_000, abs=1e-3)
    assert imp["aten::mm"].at_pct["80"]["saving_pct_of_gpu_span"] == pytest.approx(100 * (200_000 - t80) / 325_000, abs=1e-3)
    assert imp["aten::add"].at_pct["20"]["saving_ns"] == 0                                   # already at 37.6 %
    assert imp["aten::add"].at_pct["50"]["saving_ns"] == round(10_000 - aroof / 0.5)


def test_dtype_override_and_limit(h100_trace):
    r = roofline(h100_trace, dtype="fp8")
    mm = next(x for x in r.rows if x.name == "aten::mm")
    assert mm.compute_roof_field == "tflops_fp8_matrix" and mm.compute_roof_tflops == 1979
    r = roofline(h100_trace, limit=1)
    assert r.truncated and r.remainder_rows == 2 and len(r.rows) == 1
    with pytest.raises(ProfileError, match="dtype"):
        roofline(h100_trace, dtype="int3")


def test_unknown_gpu_no_guessing(tmp_path):
    dev = Device(0, name="Acme Tensorbox 9", vendor="Acme", sm_count=7, memory_bytes=8 << 30,
                 memory_bandwidth_bytes_per_s=100_000_000_000, compute_major=1, compute_minor=0)
    tr = load_trace(kineto.write(_scenario(dev), tmp_path / "u.pt.trace.json"))
    try:
        r = roofline(tr)
        assert not r.peaks_known and r.peaks_model is None and r.memory_bandwidth_bytes_per_s is None
        assert "unknown GPU" in r.message and "Acme Tensorbox 9" in r.message
        assert "peaks=" in r.message and "peaks.json" in r.message
        assert all(not x.rated and x.pct_of_roof is None for x in r.rows) and r.impact == []
        # a per-call peaks entry makes it rated
        r = roofline(tr, peaks={"Acme Tensorbox 9": {"base": "h100-sxm5"}})
        assert r.peaks_known and next(x for x in r.rows if x.name == "aten::mm").bound == "compute"
    finally:
        tr.close()


def test_kernel_flops_on_nsight(tmp_path):
    path = tmp_path / "roof.sqlite"
    tr = load_trace(nsys.write(_scenario(h100(0)), path) or path)
    try:
        with pytest.raises(ProfileError, match="kernel_flops"):
            roofline(tr)
        flops, nbytes = 2 * N**3, 3 * N * N * 2
        r = roofline(tr, kernel_flops={"GEMM_KERNEL": {"gflop_per_call": flops / 1e9, "bytes_per_call": nbytes, "dtype": "bf16"},
                                       "nonexistent": {"gflop_per_call": 1, "bytes_per_call": 1, "dtype": "bf16"}})
        assert r.unmatched_kernel_flops == ["nonexistent"]
        [k] = r.rows
        assert k.source == "kernel" and k.matched_by == "GEMM_KERNEL" and k.name == GEMM_H[0]
        assert (k.count, k.total_time_ns) == (2, 200_000)
        assert k.compute_roof_field == "tflops_bf16_matrix" and k.bound == "compute"
        assert k.pct_of_roof == pytest.approx(100 * flops / BF16_MATRIX / 100e-6, rel=1e-5)
        # vector unit + fp32 on the add kernel: memory-bound
        r = roofline(tr, kernel_flops={"CUDAFunctor_add": {"gflop_per_call": E / 1e9, "bytes_per_call": 12 * E,
                                                           "dtype": "fp32", "unit": "vector"}})
        [a] = r.rows
        assert a.count == 2 and a.compute_roof_field == "tflops_fp32" and a.bound == "memory"
        with pytest.raises(ProfileError, match="lacks"):
            roofline(tr, kernel_flops={"gemm": {"gflop_per_call": 1}})
        with pytest.raises(ProfileError, match="matches no|no kernel"):
            roofline(tr, kernel_flops={"zzz": {"gflop_per_call": 1, "bytes_per_call": 1, "dtype": "bf16"}})
    finally:
        tr.close()


def test_plot(h100_trace):
    r = roofline(h100_trace, plot=True)
    if importlib.util.find_spec("matplotlib") is None:
        assert "gpuscope[plots]" in r.plot_note
        assert roofline_plot(r) is None
        pytest.skip("matplotlib not installed (optional extra gpuscope[plots])")
    png = roofline_plot(r)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_matplotlib_import_at_module_load():
    import subprocess
    import sys
    code = ("import sys, gpuscope.tools.analyses.roofline; "
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
QWEN = DATA / "pytorch" / "nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz"
QWEN_GEMM = DATA / "pytorch" / "reference_csvs" / "tracelens_h100_qwen1.5-0.5b" / "GEMM.csv"


def test_h100_qwen_top_gemm_vs_tracelens():
    if not (QWEN.exists() and QWEN_GEMM.exists()):
        pytest.skip("shared TraceLens reference data absent")
    with QWEN_GEMM.open(newline="") as fh:
        tl = list(csv.DictReader(fh))
    top = max(tl, key=lambda row: float(row["Kernel Time (µs)_sum"]))
    tr = load_trace(QWEN)
    try:
        r = roofline(tr, limit=500)
    finally:
        tr.close()
    assert r.peaks_model == "h100-sxm5" and r.peaks_confidence == "exact"
    dims = top["Input Dims_first"].replace("'", '"')
    ours = [x for x in r.rows if x.name == top["name"] and x.signature["input_dims"].replace(" ", "") == dims.replace(" ", "")]
    assert len(ours) == 1
    g = ours[0]
    assert g.achieved_tflops == pytest.approx(float(top["TFLOPS/s_mean"]), rel=1e-3)
    assert g.compute_roof_field == "tflops_bf16_matrix" and g.compute_roof_tflops == 989.5 and g.bound == "compute"
    assert g.pct_of_roof == pytest.approx(100 * g.achieved_tflops / 989.5, rel=1e-5)
