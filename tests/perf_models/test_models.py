"""The registry (models.py): which model answers which op, unmodelled ops, the unmodelled time on real traces, and
agreement with TraceLens's per-category sheets on the two H100 traces (deliberate differences asserted and explained)."""
from __future__ import annotations

import ast
import csv

import pytest

from conftest import DATA
from perf_model_cases import BF16, F32, MiB, m
from gpuscope.tools.perf_models import MODELLED_OPS, model_for


def test_each_name_goes_to_its_family():
    # copy_ is a copy (the cast counted per dtype), not the in-place form of an elementwise op
    r = m("aten::copy_", [[4, 8], [4, 8]], [BF16, F32])
    assert (r.model, r.flops, r.bytes_read, r.bytes_written) == ("copy", 0, 32 * 4, 32 * 2)
    # norm is a reduction (2 FLOPs per input element); _foreach_norm a list op, by its prefix
    r = m("aten::norm", [[4, 8], [], [], []], [F32, "Scalar", "ScalarList", "Scalar"], ["", "2", "[1]", "False"])
    assert (r.model, r.flops, r.bytes_written) == ("reduce", 2 * 32, 4 * 4)
    r = model_for("aten::_foreach_norm", [[[4, 8], [5]]], [[F32, F32]], [""])
    assert (r.model, r.flops, r.bytes_read, r.bytes_written) == ("foreach", 2 * 37, 37 * 4, 2 * 4)  # one norm per tensor


def test_modelled_ops_are_the_names_a_model_answers():
    # fill and zero write in place under either name; _fused_adam as _fused_adam_: listed as they are answered
    for name in ("aten::fill", "aten::fill_", "aten::zero", "aten::zero_", "aten::_fused_adam", "aten::mm", "aten::_to_copy"):
        assert name in MODELLED_OPS
    r = m("aten::fill", [[4, 8], []], [F32, "Scalar"], ["", "0"])
    assert (r.flops, r.bytes_read, r.bytes_written) == (0, 0, 32 * 4)
    assert m("aten::zero", [[4, 8]], [F32]).bytes_written == 32 * 4
    assert "aten::view" not in MODELLED_OPS and m("aten::view", [[2, 3], []], [F32, "ScalarList"]) is None
    assert "aten::_foreach_add_" not in MODELLED_OPS  # every _foreach_ name: a prefix, not a list


def test_unmodelled_ops_return_none():
    assert m("aten::view", [[2, 3], []], [F32, "ScalarList"]) is None
    assert m("aten::cat", [[], []], ["TensorList", "Scalar"]) is None
    assert model_for("aten::mm", "not json", "[]", "[]") is None
    assert model_for("aten::mm", "[[2, 3]]", '["float"]', "[]") is None


RESNET = "amd_mi300x_resnet_actckpt_train_8rank_r0_tracelens.json.gz"
ALEXNET = "nv_a100_alexnet_small_hta.json.gz"


def _unmodelled(fname):
    from gpuscope.tools.analyses.perf_summary import perf_summary
    from gpuscope.tools.model.trace import load_trace
    p = DATA / "pytorch" / fname
    if not p.exists():
        pytest.skip("shared trace data absent")
    tr = load_trace(p)
    try:
        return perf_summary(tr, limit=500)
    finally:
        tr.close()


def test_real_trace_unmodelled_time_drops_mi300x_resnet():
    r = _unmodelled(RESNET)
    t = r.totals
    comm = sum(x.total_kernel_time_ns for x in r.rows if x.name == "record_param_comms")
    compute = t.attributed_kernel_time_ns - comm
    un = t.unmodelled_time_ns - comm
    # before these models: 3,307,503 ns of 21,195,357 ns compute time unmodelled (15.6 %; 73.85 % with the RCCL
    # record_param_comms); batch-norm backward, max-pool fwd/bwd, mse_loss_backward now carry models
    assert un / compute < 0.01
    assert t.unmodelled_time_ns / t.attributed_kernel_time_ns < 0.70
    for name in ("aten::native_batch_norm_backward", "aten::max_pool2d_with_indices",
                 "aten::max_pool2d_with_indices_backward", "aten::mse_loss_backward"):
        rows = [x for x in r.rows if x.name == name]
        assert rows and all(x.modelled and x.bytes_per_call for x in rows), name
    # what is left: communication, and TensorList ops whose shapes / element dtypes Kineto did not record
    assert set(t.unmodelled_names) <= {"record_param_comms", "aten::_foreach_add_", "aten::cat"}


def test_real_trace_a100_alexnet_records_no_shapes():
    # The A100 AlexNet trace records no 'Input Dims' at all: every op (even addmm / cudnn_convolution, which
    # have models) stays unmodelled; its unmodelled share cannot drop without guessing shapes.
    r = _unmodelled(ALEXNET)
    assert all(x.input_dims is None for x in r.rows)
    assert r.totals.unmodelled_time_ns == r.totals.attributed_kernel_time_ns


CSV_DIR = DATA / "pytorch" / "reference_csvs"
SHEETS = [("tracelens_h100_qwen1.5-0.5b", s) for s in
          ("GEMM", "SDPA_fwd", "BinaryElementwise", "UnaryElementwise", "Reduce_fwd")] + \
         [("tracelens_h100_bert-small", s) for s in ("GEMM", "SDPA_fwd", "BinaryElementwise", "Normalization")]


def _rows():
    out = []
    for d, s in SHEETS:
        p = CSV_DIR / d / f"{s}.csv"
        if not p.exists():
            continue
        with p.open(newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                out.append(pytest.param(row, id=f"{d.split('_')[-1]}-{s}-{i}-{row['name']}"))
    return out


def _deliberate_difference(row, mod):
    """Return (flops, bytes) TraceLens would report under its own convention, when ours differs on
    purpose, after asserting the documented reason; None when we must agree."""
    dims = ast.literal_eval(row["Input Dims_first"])
    name = row["name"]
    tl_flops = round(float(row["GFLOPS_first"]) * 1e9)
    tl_bytes = round(float(row["Data Moved (MB)_first"]) * MiB)
    if name == "aten::_scaled_dot_product_flash_attention" and mod.params["causal"]:
        # TraceLens halves N_Q·N_KV; the exact causal count is N(N+1)/2 (diagonal included).
        B, H, N, d = dims[0]
        assert mod.flops == B * H * 4 * d * (N * (N + 1) // 2)
        assert tl_flops == B * H * 4 * d * N * N // 2
        return tl_flops, mod.bytes_total
    if name == "aten::copy_":
        # A copy/cast does no arithmetic: 0 FLOPs (TraceLens counts 1 per element).
        assert mod.flops == 0 and tl_flops == mod.params["n"]
        return tl_flops, mod.bytes_total
    if name == "aten::mean":
        # TraceLens cannot parse the '[-1]' dim string → output numel 1; keepdim over (16, 559, 1024)
        # gives 16·559 outputs.
        assert mod.params["n_out"] == 16 * 559 and tl_bytes == mod.bytes_read + 4
        return mod.flops, mod.bytes_read + 4
    if name in ("aten::layer_norm", "aten::native_layer_norm"):
        # TraceLens borrows batch-norm bookkeeping: 5N + 6C FLOPs, and 6 C-sized stats tensors in the
        # input dtype.  LayerNorm reads γ, β (C each) and writes mean/rstd per *row* (141) in fp32;
        # FLOPs: mean 1 + variance 3 + normalise 2 + γ 1 + β 1 per element.
        N, C = 141 * 512, 512
        assert tl_flops == 5 * N + 6 * C and mod.flops == 8 * N
        assert tl_bytes == 2 * N * 2 + 6 * C * 2
        assert mod.bytes_total == 2 * N * 2 + 2 * C * 2 + 2 * 141 * 4
        return tl_flops, tl_bytes
    return None


@pytest.mark.skipif(not CSV_DIR.exists(), reason="shared TraceLens reference data absent")
@pytest.mark.parametrize("row", _rows())
def test_agrees_with_tracelens_sheets(row):
    dims = ast.literal_eval(row["Input Dims_first"])
    types = ast.literal_eval(row["Input type_first"])
    conc = ast.literal_eval(row["Concrete Inputs_first"])
    mod = model_for(row["name"], list(dims), list(types), list(conc))
    assert mod is not None, row["name"]
    tl_gflops = float(row["GFLOPS_first"])
    tl_mib = float(row["Data Moved (MB)_first"])
    flops, byts = mod.flops, mod.bytes_total
    diff = _deliberate_difference(row, mod)
    if diff is not None:
        flops, byts = diff
    assert flops / 1e9 == pytest.approx(tl_gflops, rel=1e-3)
    assert byts / MiB == pytest.approx(tl_mib, rel=1e-3)          # 'Data Moved (MB)' is MiB
    if tl_mib:
        assert flops / byts == pytest.approx(float(row["FLOPS/Byte_first"]), rel=1e-3)


@pytest.mark.skipif(not CSV_DIR.exists(), reason="shared TraceLens reference data absent")
def test_tracelens_data_moved_is_mebibytes():
    # H100 Qwen mm 8944×1024×2816 bf16: 74,457,088 bytes; TraceLens prints 71.0078125 "MB" = bytes / 2^20.
    r = m("aten::mm", [[8944, 1024], [1024, 2816]], [BF16, BF16])
    with (CSV_DIR / "tracelens_h100_qwen1.5-0.5b" / "GEMM.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert float(row["Data Moved (MB)_first"]) == r.bytes_total / 2 ** 20
    assert r.bytes_total / 1e6 == pytest.approx(74.457088)
