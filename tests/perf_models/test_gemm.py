"""GEMM models (gemm.py): mm / addmm / bmm / baddbmm FLOPs and bytes per dtype, FP8 _scaled_mm."""
from __future__ import annotations

import pytest

from perf_model_cases import BF16, F32, F16, MiB, m


def test_mm_bf16():
    r = m("aten::mm", [[8944, 1024], [1024, 2816]], [BF16, BF16])
    assert r.flops == 2 * 8944 * 2816 * 1024
    assert r.bytes_read == (8944 * 1024 + 1024 * 2816) * 2
    assert r.bytes_written == 8944 * 2816 * 2
    assert r.bytes_total == 74457088 and r.bytes_total / MiB == pytest.approx(71.0078125)
    assert r.model == "gemm"


def test_addmm_bias_and_bmm_baddbmm():
    r = m("aten::addmm", [[512], [141, 512], [512, 512], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"],
          ["", "", "", "1", "1"])
    assert r.flops == 2 * 141 * 512 * 512 + 141 * 512
    assert r.bytes_total == (141 * 512 + 512 * 512 + 141 * 512 + 512) * 2
    r = m("aten::bmm", [[4, 8, 16], [4, 16, 32]], [F32, F32])
    assert r.flops == 4 * 2 * 8 * 32 * 16
    assert r.bytes_total == 4 * (8 * 16 + 16 * 32 + 8 * 32) * 4
    r = m("aten::baddbmm", [[4, 8, 32], [4, 8, 16], [4, 16, 32], [], []], [F16] * 3 + ["Scalar"] * 2)
    assert r.flops == 4 * 2 * 8 * 32 * 16 + 4 * 8 * 32
    assert r.bytes_total == (4 * 8 * 32 + 4 * (8 * 16 + 16 * 32) + 4 * 8 * 32) * 2


def test_mixed_precision_gemm_output_dtype_from_args():
    # TraceLens assumes output dtype = input dtype; mm.dtype(self, mat2, out_dtype=float) writes fp32.
    r = m("aten::mm", [[64, 128], [128, 256], []], [F16, F16, "Scalar"], ["", "", "6"])
    assert r.bytes_written == 64 * 256 * 4                   # fp32 output
    assert r.bytes_read == (64 * 128 + 128 * 256) * 2
    # mm.out with an fp32 out tensor
    r = m("aten::mm", [[64, 128], [128, 256], [64, 256]], [BF16, BF16, F32])
    assert r.bytes_written == 64 * 256 * 4


def test_matmul_and_linear_are_not_leaf_models():
    assert m("aten::matmul", [[2, 3], [3, 4]], [F32, F32]) is None
    assert m("aten::linear", [[2, 3], [4, 3], [4]], [F32, F32, F32]) is None


def test_scaled_mm_fp8_out_dtype():
    # (A, B, scale_a, scale_b, bias, scale_result, out_dtype=bf16(15), use_fast_accum)
    dims = [[128, 256], [256, 512], [], [], [], [], [], []]
    types = ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F32, F32, "", "", "Scalar", "Scalar"]
    dims[2] = dims[3] = []
    r = m("aten::_scaled_mm", dims, types, ["", "", "", "", "", "", "15", "False"])
    assert r.flops == 2 * 128 * 512 * 256
    # A, B 1 byte each; two 0-dim fp32 scales 4 bytes each; bf16 output
    assert r.bytes_read == 128 * 256 + 256 * 512 + 4 + 4
    assert r.bytes_written == 128 * 512 * 2
    # no out_dtype → fp8 output (PyTorch default = mat1 dtype), bias present → + M·N FLOPs
    types2 = list(types); dims2 = list(dims); dims2[4] = [512]; types2[4] = BF16
    r = m("aten::_scaled_mm", dims2, types2, [""] * 6 + ["", "False"])
    assert r.bytes_written == 128 * 512 * 1
    assert r.flops == 2 * 128 * 512 * 256 + 128 * 512
    assert r.bytes_read == 128 * 256 + 256 * 512 + 8 + 512 * 2
