"""Elementwise and copy models (elementwise.py): broadcast, type promotion, in-place forms, casts."""
from __future__ import annotations

from perf_model_cases import BF16, F32, F16, m


def test_binary_broadcast_and_promotion():
    r = m("aten::mul", [[16, 559, 1024], [16, 559, 1]], [F32, F32])
    n = 16 * 559 * 1024
    assert r.flops == n and r.bytes_total == n * 4 + 16 * 559 * 4 + n * 4
    # bf16 tensor * fp32 0-dim tensor → bf16 (0-dim same category does not promote)
    r = m("aten::mul", [[4, 4], []], [BF16, F32])
    assert r.params["dtype_out"] == BF16 and r.bytes_total == 16 * 2 + 4 + 16 * 2
    # int tensor + python float → float32 output
    r = m("aten::add", [[10], [], []], ["long int", "Scalar", "Scalar"], ["", "0.5", "1"])
    assert r.params["dtype_out"] == "float" and r.bytes_total == 10 * 8 + 10 * 4
    # comparisons write bool; bool bytes are known (TraceLens: NaN)
    r = m("aten::eq", [[8, 8], [8, 8]], [F16, F16])
    assert r.bytes_total == 64 * 2 * 2 + 64 * 1


def test_ternary_where_and_inplace():
    r = m("aten::where", [[4, 1], [1, 8], [4, 8]], ["bool", F32, F32])
    assert r.flops == 32 and r.bytes_total == 4 * 1 + 8 * 4 + 32 * 4 + 32 * 4
    r = m("aten::add_", [[1, 141, 512], [1, 141, 512], []], [BF16, BF16, "Scalar"], ["", "", "1"])
    assert r.bytes_total == 3 * 72192 * 2


def test_unary_short_and_complex_known_bytes():
    assert m("aten::neg", [[100]], ["short int"]).bytes_total == 100 * 2 * 2
    assert m("aten::neg", [[100]], ["c10::complex<float>"]).bytes_total == 100 * 8 * 2
    r = m("aten::neg", [[100]], ["c10::WeirdType"])
    assert r.flops == 100 and r.bytes_total is None and r.bytes_read is None   # never NaN


def test_copy_and_casts():
    r = m("aten::copy_", [[16, 559, 1024], [16, 559, 1024], []], [F32, BF16, "Scalar"], ["", "", "False"])
    n = 16 * 559 * 1024
    assert r.flops == 0 and r.bytes_read == n * 2 and r.bytes_written == n * 4
    r = m("aten::_to_copy", [[10, 10], [], [], [], [], [], []], [BF16, "Scalar", "", "", "", "Scalar", ""],
          ["", "6", "", "", "", "False", ""])
    assert r.bytes_read == 200 and r.bytes_written == 400
    r = m("aten::to", [[10, 10], [], [], [], []], [F32, "Scalar", "Scalar", "Scalar", ""], ["", "15", "False", "False", ""])
    assert r.bytes_read == 400 and r.bytes_written == 200
