"""perf_summary: hand-computed FLOPs/bytes/rates on a Kineto fixture, and agreement with TraceLens's
unified_perf_summary on the H100 Qwen1.5-0.5B and BERT-small traces (deliberate differences asserted)."""
from __future__ import annotations

import ast
import csv
import json

import pytest

from conftest import DATA
from gpuscope.fixtures.catalog import ELEM_ADD, GEMM_H, h100
from gpuscope.fixtures.scenario import ApiCall, CpuOp, Kernel, Process, Scenario, Thread
from gpuscope.tools.analyses.perf_summary import perf_summary
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

US = 1_000
P = T = 1000
BF16 = "c10::BFloat16"


def _scenario() -> Scenario:
    """Times in µs.
      aten::mm 1024³ bf16, two calls → GEMM kernels of 100 and 120 µs (mean 110)
      aten::add fp32 (1024)+(1024), alpha=1 → one kernel of 10 µs, launched twice concurrently [300,310],[305,312]: union 12
      aten::cat (TensorList: no model) → 5 µs
      one kernel with no launching call (not attributed to an op) → 7 µs
    """
    s = Scenario("perf", [h100(0)], [Process(P, "python")], [Thread(P, T, "python")])
    corr = [0]
    conc: dict = {}

    def op(name, a, b, ext, dims, types, ci):
        s.cpu_ops.append(CpuOp(P, T, a * US, b * US, name, ext, input_dims=dims, input_types=types))
        conc[("cpu_op", P, ext)] = {"Concrete Inputs": ci}

    def launch(a, ext, k, ka, kb, stream=7):
        corr[0] += 1
        s.api_calls.append(ApiCall(P, T, a * US, (a + 2) * US, "cudaLaunchKernel", corr[0], ext))
        s.kernels.append(Kernel(0, stream, ka * US, kb * US, k[0], k[1], P, corr[0]))

    mm = ([[1024, 1024], [1024, 1024]], [BF16, BF16], ["", ""])
    op("aten::mm", 10, 20, 1, *mm)
    launch(11, 1, GEMM_H, 100, 200)
    op("aten::mm", 30, 40, 2, *mm)
    launch(31, 2, GEMM_H, 210, 330)
    op("aten::add", 50, 60, 3, [[1024], [1024], []], ["float", "float", "Scalar"], ["", "", "1"])
    launch(51, 3, ELEM_ADD, 400, 410)
    launch(55, 3, ELEM_ADD, 405, 412, stream=13)
    op("aten::cat", 70, 80, 4, [[], []], ["TensorList", "Scalar"], ["", "0"])
    launch(71, 4, ELEM_ADD, 420, 425)
    s.kernels.append(Kernel(0, 7, 500 * US, 507 * US, ELEM_ADD[0], ELEM_ADD[1], P, None))
    s.options["kineto_args"] = conc
    return s


OWN = {"perf": _scenario}


@pytest.fixture(scope="module")
def fixture_trace(open_profile):
    return open_profile("perf", "kineto", scenarios=OWN)


def test_fixture_hand_computed(fixture_trace):
    r = perf_summary(fixture_trace)
    assert [x.name for x in r.rows] == ["aten::mm", "aten::add", "aten::cat"]     # by total kernel time
    mm, add, cat = r.rows
    assert (mm.count, mm.total_kernel_time_ns, mm.mean_kernel_time_ns) == (2, 220_000, 110_000)
    assert mm.model == "gemm" and mm.category == "GEMM"
    assert mm.gflops_per_call == pytest.approx(2 * 1024**3 / 1e9)               # 2.147483648
    assert mm.bytes_per_call == 3 * 1024 * 1024 * 2
    assert mm.mb_per_call == pytest.approx(6.291456)                              # 10^6-byte MB
    assert mm.flops_per_byte == pytest.approx(2 * 1024**3 / (6 * 1024**2), rel=1e-5)   # 341.33
    assert mm.achieved_tflops_per_s == pytest.approx(19.5226, rel=1e-5)          # 2.147483648e9 / 110e-6 / 1e12
    assert mm.achieved_tb_per_s == pytest.approx(0.0571951, rel=1e-5)            # 6291456 / 110e-6 / 1e12
    # concurrent launches of one call: direct time is the union (12 µs), not the sum (17 µs)
    assert (add.count, add.total_kernel_time_ns) == (1, 12_000)
    assert add.concrete_inputs == '["", "", "1"]' or json.loads(add.concrete_inputs) == ["", "", "1"]
    assert add.gflops_per_call == pytest.approx(1024 / 1e9) and add.bytes_per_call == 3 * 1024 * 4
    assert add.achieved_tflops_per_s == pytest.approx(1024 / 12e-6 / 1e12, rel=1e-5)
    assert not cat.modelled and cat.gflops_per_call is None and cat.achieved_tflops_per_s is None
    t = r.totals
    assert (t.signatures, t.op_calls, t.attributed_kernel_time_ns) == (3, 4, 237_000)
    assert (t.modelled_kernel_time_ns, t.unmodelled_ops, t.unmodelled_time_ns) == (232_000, 1, 5_000)
    assert t.unmodelled_names == ["aten::cat"]
    assert t.modelled_pct_of_attributed_kernel_time == pytest.approx(100 * 232 / 237, abs=1e-4)
    assert t.modelled_gflop == pytest.approx((2 * 2 * 1024**3 + 1024) / 1e9)
    assert (t.not_op_attributed_gpu_ops, t.not_op_attributed_time_ns) == (1, 7_000)
    assert not r.truncated


def test_fixture_filters_and_limit(fixture_trace):
    r = perf_summary(fixture_trace, limit=1)
    assert r.truncated and r.remainder_rows == 2 and r.remainder_kernel_time_ns == 17_000 and "limit" in r.hint
    assert [x.name for x in perf_summary(fixture_trace, category="gemm").rows] == ["aten::mm"]
    assert [x.name for x in perf_summary(fixture_trace, name_contains="ADD").rows] == ["aten::add"]
    with pytest.raises(ProfileError, match="categories present"):
        perf_summary(fixture_trace, category="SDPA_fwd")
    with pytest.raises(ProfileError, match="no op name contains"):
        perf_summary(fixture_trace, name_contains="zzz")
    # time window: only the second mm call's kernel starts in [205 µs, 350 µs)
    r = perf_summary(fixture_trace, start_ns=205 * US, end_ns=350 * US)
    assert [(x.name, x.count, x.total_kernel_time_ns) for x in r.rows] == [("aten::mm", 1, 120_000)]


def test_profiles_without_cpu_ops_are_refused(tmp_path):
    from gpuscope.fixtures.writers import nsys

    tr = load_trace(nsys.write(_scenario(), tmp_path / "perf.sqlite") or tmp_path / "perf.sqlite")
    try:
        with pytest.raises(ProfileError, match="record_shapes=True") as e:
            perf_summary(tr)
        assert "roofline" in str(e.value)
    finally:
        tr.close()


# ----------------------------------------------------------------------------- TraceLens

TRACES = {"qwen": ("nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz", "tracelens_h100_qwen1.5-0.5b"),
          "bert": ("nv_h100_bert-small_infer_tracelens.json.gz", "tracelens_h100_bert-small")}
# Composite ops TraceLens models with their subtree kernel time; we attribute to the launching leaf.
WRAPPER_LEAF = {"aten::_scaled_dot_product_flash_attention": "aten::_flash_attention_forward",
                "aten::layer_norm": "aten::native_layer_norm"}


def _t(x):
    return tuple(_t(i) for i in x) if isinstance(x, (list, tuple)) else x


@pytest.fixture(scope="module", params=sorted(TRACES))
def compared(request):
    fname, d = TRACES[request.param]
    if not (DATA / "pytorch" / fname).exists():
        pytest.skip("shared TraceLens reference data absent")
    tr = load_trace(DATA / "pytorch" / fname)
    r = perf_summary(tr, limit=500)
    tr.close()
    with (DATA / "pytorch" / "reference_csvs" / d / "unified_perf_summary.csv").open(newline="") as fh:
        tl = list(csv.DictReader(fh))
    return request.param, r, tl


def _key(name, dims, types, conc, strides):
    return (name, _t(dims), _t(types), _t(conc), _t(strides))


def test_agrees_with_tracelens_unified_perf_summary(compared):
    which, r, tl = compared
    assert not r.truncated
    ours = {_key(x.name, *(json.loads(v or "[]") for v in (x.input_dims, x.input_types, x.concrete_inputs, x.input_strides))): x
            for x in r.rows}
    checked = rate_checked = 0
    for row in tl:
        kt_ns = float(row["Kernel Time (µs)_mean"]) * 1e3
        if row["name"] in WRAPPER_LEAF:
            # deliberate: the leaf launched the kernels; same calls, same kernel time
            leaf = [x for x in r.rows if x.name == WRAPPER_LEAF[row["name"]] and x.count == int(row["operation_count"])
                    and x.mean_kernel_time_ns == pytest.approx(kt_ns, rel=1e-4)]
            assert len(leaf) == 1, row["name"]
            continue
        k = _key(row["name"], *(ast.literal_eval(row[c]) for c in ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")))
        o = ours[k]
        checked += 1
        assert o.count == int(row["operation_count"])
        assert o.mean_kernel_time_ns == pytest.approx(kt_ns, rel=1e-4)        # TraceLens: float32 µs (±7e-5)
        assert o.total_kernel_time_ns == pytest.approx(float(row["Kernel Time (µs)_sum"]) * 1e3, rel=1e-4)
        if row["has_perf_model"] != "True":
            continue
        assert o.modelled
        tl_flops = float(row["GFLOPS"]) * 1e9
        tl_bytes = float(row["Data Moved (MB)"]) * 2**20                     # TraceLens 'MB' is MiB
        assert o.bytes_per_call == pytest.approx(tl_bytes, rel=1e-3)
        if row["name"] == "aten::copy_":
            # deliberate: a copy does no arithmetic (TraceLens counts 1 FLOP per element)
            assert o.gflops_per_call == 0 and o.achieved_tflops_per_s == 0 and tl_flops > 0
        else:
            assert o.gflops_per_call * 1e9 == pytest.approx(tl_flops, rel=1e-3)
            # rate = flops per call / mean kernel time: TraceLens's figures give the same within 0.1 %
            assert o.achieved_tflops_per_s == pytest.approx(tl_flops / (kt_ns * 1e-9) / 1e12, rel=1e-3)
            # TraceLens's TFLOPS/s_mean is the mean of per-call rates: differs slightly (documented)
            assert o.achieved_tflops_per_s == pytest.approx(float(row["TFLOPS/s_mean"]), rel=1e-2)
            rate_checked += 1
        assert o.achieved_tb_per_s == pytest.approx(tl_bytes / (kt_ns * 1e-9) / 1e12, rel=1e-3)
        assert o.achieved_tb_per_s == pytest.approx(float(row["TB/s_mean"]), rel=1e-2)
    assert checked >= (12 if which == "bert" else 30) and rate_checked >= 5


def test_tracelens_deliberate_differences(compared):
    which, r, _ = compared
    if which == "qwen":
        sdpa = next(x for x in r.rows if x.name == "aten::_flash_attention_forward")
        # exact causal count N(N+1)/2 score pairs: 16·16·4·64·(559·560/2) vs TraceLens's N²/2 (10.239377408 GF)
        assert sdpa.gflops_per_call * 1e9 == 16 * 16 * 4 * 64 * (559 * 560 // 2)
        mean = next(x for x in r.rows if x.name == "aten::mean")
        assert mean.bytes_per_call == 16 * 559 * 1024 * 4 + 16 * 559 * 4     # keepdim over the last dim
    else:
        ln = next(x for x in r.rows if x.name == "aten::native_layer_norm")
        N, C = 141 * 512, 512
        assert ln.gflops_per_call * 1e9 == 8 * N                               # TraceLens: 5N + 6C
        assert ln.bytes_per_call == 2 * N * 2 + 2 * C * 2 + 2 * 141 * 4          # mean/rstd per row, fp32


def test_tracelens_summary_totals(compared):
    which, r, _ = compared
    t = r.totals
    assert t.modelled_kernel_time_ns + t.unmodelled_time_ns == t.attributed_kernel_time_ns
    assert t.modelled_pct_of_attributed_kernel_time > (90 if which == "qwen" else 99)
    assert "aten::_local_scalar_dense" in t.unmodelled_names
