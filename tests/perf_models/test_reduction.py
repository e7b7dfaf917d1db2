"""Reduction, softmax and MSE loss models (reduction.py)."""
from __future__ import annotations

from perf_model_cases import BF16, F32, F16, m


def test_reduce_dims_from_concrete_inputs():
    x = [16, 559, 1024]
    r = m("aten::mean", [x, [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""])
    n = 16 * 559 * 1024
    assert r.params["n_out"] == 16 * 559
    assert r.bytes_total == n * 4 + 16 * 559 * 4
    r = m("aten::sum", [[10, 512, 7, 7], [], [], []], [BF16, "ScalarList", "Scalar", ""], ["", "(-1, -2)", "False", ""])
    assert r.params["shape_out"] == [10, 512]
    r = m("aten::sum", [[4, 5]], [F32])                     # full reduction
    assert r.params["n_out"] == 1 and r.bytes_total == 20 * 4 + 4
    r = m("aten::sum", [[4, 5], [], [], []], ["bool", "ScalarList", "Scalar", ""], ["", "[1]", "False", ""])
    assert r.params["dtype_out"] == "long int" and r.bytes_total == 20 + 4 * 8
    r = m("aten::amax", [[4, 5], [], []], [BF16, "ScalarList", "Scalar"], ["", "[]", "False"])
    assert r.params["n_out"] == 1
    r = m("aten::max", [[4, 5], [], []], [F32, "Scalar", "Scalar"], ["", "1", "False"])
    assert r.bytes_written == 4 * 4 + 4 * 8                 # values + int64 indices
    r = m("aten::cumsum", [[4, 5], [], []], [F16, "Scalar", ""], ["", "1", ""])
    assert r.params["n_out"] == 20
    # unparsable dim → no model (never a silent 1)
    assert m("aten::sum", [[4, 5], [], []], [F32, "ScalarList", "Scalar"], ["", "dims?", "False"]) is None


def test_softmax_family():
    r = m("aten::_softmax", [[2, 8, 128, 128], [], []], [F16, "Scalar", "Scalar"], ["", "-1", "True"])
    n = 2 * 8 * 128 * 128
    assert r.flops == 5 * n and r.bytes_read == n * 2 and r.bytes_written == n * 4  # half_to_float
    r = m("aten::_softmax_backward_data", [[4, 4], [4, 4], [], []], [F32, F32, "Scalar", "Scalar"], ["", "", "-1", "6"])
    assert r.bytes_total == 3 * 16 * 4


def test_mse_loss_and_backward():
    n = 10 * 1000
    r = m("aten::mse_loss_backward", [[], [10, 1000], [10, 1000], [], [10, 1000]], [BF16] * 3 + ["Scalar", BF16],
          ["", "", "", "1", ""])
    assert r.flops == 3 * n and r.bytes_read == 2 + 2 * n * 2 and r.bytes_written == n * 2
    r = m("aten::mse_loss", [[10, 1000], [10, 1000], []], [BF16, BF16, "Scalar"], ["", "", "1"])
    assert r.flops == 3 * n and r.bytes_read == 2 * n * 2 and r.bytes_written == 2        # mean: one element
    r = m("aten::mse_loss", [[10, 1000], [10, 1000], []], [BF16, BF16, "Scalar"], ["", "", "0"])
    assert r.flops == 2 * n and r.bytes_written == n * 2
    assert m("aten::mse_loss", [[10, 1000], [10, 1000], []], [BF16, BF16, "Scalar"], ["", "", ""]) is None
