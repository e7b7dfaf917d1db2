"""Normalisation models (norm.py): layer / RMS / batch / group norm and the batch / layer norm backward."""
from __future__ import annotations

from perf_model_cases import BF16, F32, m
from gpuscope.tools.perf_models import model_for


def test_layer_norm_rms_norm_batch_group_norm():
    # layer_norm (1,141,512) bf16 with γ, β: read x + γ + β, write y + mean/rstd per row (fp32)
    r = m("aten::native_layer_norm", [[1, 141, 512], [], [512], [512], []],
          [BF16, "ScalarList", BF16, BF16, "Scalar"], ["", "[512]", "", "", "1e-12"])
    N = 141 * 512
    assert r.flops == 8 * N
    assert r.bytes_read == N * 2 + 2 * 512 * 2
    assert r.bytes_written == N * 2 + 2 * 141 * 4
    r = m("aten::_fused_rms_norm", [[8, 1024], [], [1024], []], [BF16, "ScalarList", BF16, "Scalar"], ["", "[1024]", "", ""])
    assert r.flops == 4 * 8 * 1024 and r.bytes_written == 8 * 1024 * 2 + 8 * 4
    r = m("aten::native_batch_norm", [[10, 512, 7, 7], [512], [512], [512], [512], [], [], []],
          [BF16] * 5 + ["Scalar"] * 3, ["", "", "", "", "", "True", "0.1", "1e-05"])
    N = 10 * 512 * 49
    assert r.flops == 8 * N
    assert r.bytes_read == N * 2 + 512 * 2 * 2 + 512 * 2 * 2    # x, γ, β, running mean/var
    assert r.bytes_written == N * 2 + 2 * 512 * 4 + 2 * 512 * 2  # y, save_mean/invstd fp32, running stats
    r = m("aten::native_group_norm", [[2, 32, 8, 8], [32], [32], [], [], [], [], []],
          [F32, F32, F32, "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"], ["", "", "", "2", "32", "64", "8", "1e-5"])
    assert r.bytes_written == 2 * 32 * 64 * 4 + 2 * 2 * 8 * 4


BN_BWD_T = [BF16] * 5 + [F32, F32, "Scalar", "Scalar", "ScalarList"]


def _bn_bwd(mask, train="True", types=BN_BWD_T):
    x = [2, 4, 3, 3]
    return m("aten::native_batch_norm_backward", [x, x, [4], [4], [4], [4], [4], [], [], []], types,
             [""] * 7 + [train, "1e-05", mask])


def test_native_batch_norm_backward_training_all_grads():
    N, C = 2 * 4 * 3 * 3, 4                                   # 72 elements, 4 channels
    r = _bn_bwd("[True, True, True]")
    # x−μ 1, Σdy 1, Σdy·(x−μ) 2, dX 4 per element
    assert r.flops == (1 + 1 + 2 + 4) * N == 576
    assert r.bytes_read == N * 2 + N * 2 + C * 2 + 2 * C * 4 == 328      # dy, x (bf16), γ, save_mean/invstd fp32
    assert r.bytes_written == N * 2 + C * 2 + C * 2 == 160               # dX, dγ, dβ
    assert r.model == "batch_norm_bwd"


def test_native_batch_norm_backward_masks_and_inference():
    N, C = 72, 4
    r = _bn_bwd("[True, False, False]")                      # dX alone still needs both reductions in training
    assert r.flops == 8 * N and r.bytes_written == N * 2
    r = _bn_bwd("[False, False, True]")                      # dβ = Σdy only: dy read, nothing else
    assert r.flops == N and r.bytes_read == N * 2 and r.bytes_written == C * 2
    types = [BF16] * 3 + [F32, F32] + BN_BWD_T[5:]
    r = _bn_bwd("[True, False, False]", train="False", types=types)   # dX = dy·γ·invstd(running_var)
    assert r.flops == N and r.bytes_read == N * 2 + C * 2 + C * 4 and r.bytes_written == N * 2


def test_batch_norm_backward_missing_args_is_none():
    assert _bn_bwd("") is None                                # output_mask not recorded (never a default)
    assert _bn_bwd("[True, True, True]", train="") is None    # training flag not recorded
    x = [2, 4, 3, 3]                                          # cudnn: dims only, no stats recorded
    assert m("aten::cudnn_batch_norm_backward", [x, x, [4], [], [], [], [], [], []],
             [F32, F32, F32, "", "", "", "", "Scalar", ""]) is None


def test_cudnn_and_miopen_batch_norm_backward():
    # (input, grad_output, weight, running_mean, running_var, save_mean, save_var, eps[, reserveSpace])
    x, N, C = [2, 4, 3, 3], 72, 4
    dims = [x, x, [C], [C], [C], [C], [C], [], [0]]
    types = [F32] * 7 + ["Scalar", "unsigned char"]
    r = m("aten::cudnn_batch_norm_backward", dims, types, [""] * 7 + ["1e-05", ""])
    assert r.flops == 8 * N
    assert r.bytes_read == 2 * N * 4 + C * 4 + 2 * C * 4 == 624         # dy, x, γ, saved stats; empty reserve
    assert r.bytes_written == N * 4 + 2 * C * 4 == 320
    r2 = m("aten::miopen_batch_norm_backward", dims[:8], types[:8], [""] * 7 + ["1e-05"])
    assert (r2.flops, r2.bytes_read, r2.bytes_written) == (r.flops, r.bytes_read, r.bytes_written)


def test_native_layer_norm_backward():
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask); 3 rows of 8
    dims = [[3, 8], [3, 8], [], [3, 1], [3, 1], [8], [8], []]
    types = [F32, F32, "ScalarList", F32, F32, F32, F32, "ScalarList"]
    r = m("aten::native_layer_norm_backward", dims, types, ["", "", "[8]", "", "", "", "", "[True, True, True]"])
    N = 24
    # x̂ 2 + γ·dy 1 + row sums 3 + dX 4 + dγ 2 + dβ 1 = 13 per element
    assert r.flops == 13 * N == 312
    assert r.bytes_read == (N + N + 3 + 3 + 8) * 4 == 248
    assert r.bytes_written == (N + 8 + 8) * 4 == 160
    r = m("aten::native_layer_norm_backward", dims, types, ["", "", "[8]", "", "", "", "", "[True, False, False]"])
    assert r.flops == (2 + 1 + 3 + 4) * N and r.bytes_written == N * 4
    # the encoder/decoder trace records no Concrete Inputs: output_mask unknown → no model
    assert m("aten::native_layer_norm_backward", dims, types, [""] * 8) is None
    assert model_for("aten::native_layer_norm_backward", dims, types, None) is None
