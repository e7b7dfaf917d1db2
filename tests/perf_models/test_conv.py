"""Convolution models (conv.py): forward with and without bias, transposed and grouped, backward masks."""
from __future__ import annotations

from perf_model_cases import BF16, F32, m


CONV_T = [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]


def test_convolution_no_bias_resnet_shape():
    dims = [[10, 256, 14, 14], [512, 256, 3, 3]] + [[]] * 7
    r = m("aten::convolution", dims, CONV_T, ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"])
    out = 10 * 512 * 7 * 7                                 # (14 + 2 - 2 - 1)//2 + 1 = 7
    assert r.params["output"] == [10, 512, 7, 7]
    assert r.flops == 2 * out * 256 * 9
    assert r.bytes_total == (10 * 256 * 14 * 14 + 512 * 256 * 9 + out) * 2


def test_convolution_with_bias_is_modelled():
    # TraceLens: bias flag = len(Input Dims)==3, never true for the 9-arg record → bias ignored.
    dims = [[1, 3, 8, 8], [4, 3, 3, 3], [4]] + [[]] * 6
    types = [F32, F32, F32] + CONV_T[3:]
    r = m("aten::convolution", dims, types, ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"])
    out = 1 * 4 * 6 * 6
    assert r.flops == 2 * out * 27 + out
    assert r.bytes_total == (3 * 64 + 4 * 27 + 4 + out) * 4
    assert r.params["bias"] is True


def test_conv_transposed_and_groups():
    dims = [[1, 8, 4, 4], [8, 2, 3, 3], []] + [[]] * 6
    r = m("aten::convolution", dims, [F32, F32] + CONV_T[2:],
          ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "2"])
    # out = (4-1)*2 - 2 + 2 + 1 + 1 = 8 ; C_out = 2*2 = 4 ; MACs = prod(x)·prod(w[1:])
    assert r.params["output"] == [1, 4, 8, 8]
    assert r.flops == 2 * (8 * 16) * (2 * 9)


def test_convolution_backward_mask():
    dims = [[10, 512, 7, 7], [10, 512, 7, 7], [512, 512, 3, 3]] + [[]] * 8
    types = [BF16] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"]
    conc = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    r = m("aten::convolution_backward", dims, types, conc)
    macs = 10 * 512 * 49 * 512 * 9
    assert r.flops == 2 * 2 * macs
    n = 10 * 512 * 49
    w = 512 * 512 * 9
    assert r.bytes_read == (n + w + n + n) * 2 and r.bytes_written == (n + w) * 2
