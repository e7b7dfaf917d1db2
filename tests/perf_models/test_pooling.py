"""Pooling models (pooling.py): max / average / adaptive, forward and backward."""
from __future__ import annotations

from perf_model_cases import BF16, F32, m
from gpuscope.tools.perf_models import model_for


POOL_T = [BF16, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"]


def test_max_pool2d_with_indices_resnet_stem_shape():
    # 7×7 input, k=3, s=2, p=1 → 4×4; taps per output row/col: -1,0,1→2; 1,2,3→3; 3,4,5→3; 5,6,7→2 → 10
    r = m("aten::max_pool2d_with_indices", [[2, 3, 7, 7], [], [], [], [], []], POOL_T,
          ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False"])
    assert r.params["output"] == [4, 4]
    assert r.flops == 6 * 10 * 10 == 600                      # one compare per in-bounds tap
    assert r.bytes_read == 6 * 49 * 2 == 588
    assert r.bytes_written == 6 * 16 * 2 + 6 * 16 * 8 == 960  # values (bf16) + int64 indices
    r = m("aten::max_pool2d", [[2, 3, 7, 7], [], [], [], [], []], POOL_T,
          ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False"])
    assert r.flops == 600 and r.bytes_written == 6 * 16 * 2  # no indices


def test_max_pool2d_ceil_mode_dilation_default_stride():
    # 7 wide, k=2, s=[] (= k), ceil → 4 outputs (last window 6..7 has 1 in-bounds tap): 7 taps; floor → 3, 6 taps
    c = m("aten::max_pool2d_with_indices", [[1, 1, 7, 7]] + [[]] * 5, [F32] + POOL_T[1:],
          ["", "[2]", "[]", "[0]", "[1]", "True"])
    f = m("aten::max_pool2d_with_indices", [[1, 1, 7, 7]] + [[]] * 5, [F32] + POOL_T[1:],
          ["", "[2]", "[]", "[0]", "[1]", "False"])
    assert c.params["output"] == [4, 4] and c.flops == 7 * 7
    assert f.params["output"] == [3, 3] and f.flops == 6 * 6
    # dilation 2, k=3, s=1: (7 − 2·2 − 1) + 1 = 3 outputs, all 3 taps in bounds → 9 per dim
    d = m("aten::max_pool2d_with_indices", [[1, 1, 7, 7]] + [[]] * 5, [F32] + POOL_T[1:],
          ["", "[3, 3]", "[1, 1]", "[0, 0]", "[2, 2]", "False"])
    assert d.params["output"] == [3, 3] and d.flops == 81


def test_max_pool2d_backward():
    dims = [[2, 3, 4, 4], [2, 3, 7, 7], [], [], [], [], [], [2, 3, 4, 4]]
    types = [BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "long int"]
    r = m("aten::max_pool2d_with_indices_backward", dims, types,
          ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False", ""])
    assert r.flops == 96                                      # one add per dY element
    assert r.bytes_read == 96 * 2 + 96 * 8 and r.bytes_written == 6 * 49 * 2


def test_avg_pool2d_and_backward():
    # 5 wide, k=3, s=2, p=1 → 3 outputs; in-bounds taps 2 + 3 + 2 = 7 per dim → 49 per plane, 2 planes
    r = m("aten::avg_pool2d", [[1, 2, 5, 5]] + [[]] * 6, [F32, "ScalarList", "ScalarList", "ScalarList", "Scalar",
                                                        "Scalar", ""], ["", "[3, 3]", "[2, 2]", "[1, 1]", "False", "True", ""])
    assert r.flops == 2 * 49 + 2 * 9 == 116                   # adds + one divide per output
    assert r.bytes_read == 50 * 4 and r.bytes_written == 18 * 4
    dims = [[1, 2, 3, 3], [1, 2, 5, 5]] + [[]] * 6
    types = [F32, F32, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", ""]
    conc = ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "False", "True", ""]
    r = m("aten::avg_pool2d_backward", dims, types, conc)
    assert r.flops == 116 and r.bytes_read == 18 * 4 and r.bytes_written == 50 * 4
    bad = [[1, 2, 2, 2]] + dims[1:]                           # dY does not match the pooled shape
    assert m("aten::avg_pool2d_backward", bad, types, conc) is None


def test_adaptive_avg_pool2d_and_backward():
    # 7→3 windows [0,3) [2,5) [4,7): 9 taps; 5→2 windows [0,3) [2,5): 6 taps; 4 planes
    r = m("aten::_adaptive_avg_pool2d", [[1, 4, 7, 5], []], [BF16, "ScalarList"], ["", "[3, 2]"])
    assert r.flops == 4 * 9 * 6 + 4 * 6 == 240
    assert r.bytes_read == 140 * 2 and r.bytes_written == 24 * 2
    r = m("aten::_adaptive_avg_pool2d_backward", [[1, 4, 3, 2], [1, 4, 7, 5]], [BF16, BF16])
    assert r.flops == 240 and r.bytes_read == 24 * 2 and r.bytes_written == 140 * 2


def test_pool_missing_arguments_are_none():
    x = [[2, 3, 7, 7], [], [], [], [], []]
    assert m("aten::max_pool2d_with_indices", x, POOL_T, ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", ""]) is None
    assert m("aten::max_pool2d_with_indices", x, POOL_T, ["", "", "[2, 2]", "[1, 1]", "[1, 1]", "False"]) is None
    assert model_for("aten::max_pool2d_with_indices", x, POOL_T, None) is None     # A100 traces: no Concrete Inputs
    assert m("aten::_adaptive_avg_pool2d", [[1, 4, 7, 5], []], [BF16, "ScalarList"], ["", ""]) is None
    assert m("aten::avg_pool2d", [[1, 2, 5, 5]] + [[]] * 6, [F32] + ["ScalarList"] * 3 + ["Scalar", "Scalar", ""],
             ["", "[3, 3]", "[2, 2]", "[1, 1]", "", "True", ""]) is None
