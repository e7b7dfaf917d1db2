"""Attention models (attention.py): causal pairs, SDPA and flash / efficient kernels' ops, forward and backward."""
from __future__ import annotations

from perf_model_cases import BF16, F32, F16, m
from gpuscope.tools.perf_models import causal_pairs


def test_causal_pairs_conventions():
    assert causal_pairs(5, 5, "top_left") == causal_pairs(5, 5, "bottom_right") == 15
    # decode: 1 query, 10 keys. bottom-right: the query sees all 10 keys; top-left: only key 0.
    assert causal_pairs(1, 10, "bottom_right") == 10
    assert causal_pairs(1, 10, "top_left") == 1
    # brute force
    for nq in range(1, 9):
        for nkv in range(1, 9):
            br = sum(1 for i in range(nq) for j in range(nkv) if j <= i + nkv - nq)
            tl = sum(1 for i in range(nq) for j in range(nkv) if j <= i)
            assert causal_pairs(nq, nkv, "bottom_right") == br
            assert causal_pairs(nq, nkv, "top_left") == tl


SDPA_T = [BF16, BF16, BF16, "Scalar", "Scalar", "Scalar", "Scalar"]


def test_sdpa_flash_noncausal_bf16():
    r = m("aten::_scaled_dot_product_flash_attention", [[1, 8, 141, 64]] * 3 + [[]] * 4, SDPA_T,
          ["", "", "", "0.", "False", "False", "0.125"])
    assert r.flops == 1 * 8 * (2 * 141 * 141 * 64 + 2 * 141 * 141 * 64)
    assert r.bytes_total == 4 * 1 * 8 * 141 * 64 * 2
    assert r.model == "sdpa_fwd_flash"


def test_sdpa_dtype_aware_bytes_fp32():
    # TraceLens hard-codes 2 bytes per element; fp32 SDPA moves twice that.
    r = m("aten::_scaled_dot_product_efficient_attention", [[2, 4, 128, 64]] * 3 + [[]] * 5,
          [F32] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar"], ["", "", "", "", "True", "0.0", "False", ""])
    assert r.bytes_total == 4 * 2 * 4 * 128 * 64 * 4
    assert r.flops == 2 * 4 * 4 * 128 * 128 * 64


def test_flash_attention_forward_decode_causal_gqa():
    # _flash_attention_forward layout (B, N, H, d); N_Q=1 ≠ N_KV=100 causal: TraceLens raises.
    # Bottom-right alignment: the single query sees all 100 keys → S = 100.
    # GQA: 16 query heads, 2 K/V heads.
    dims = [[2, 1, 16, 128], [2, 100, 2, 128], [2, 100, 2, 128], [], [], [], [], [], [], []]
    types = [BF16, BF16, BF16, "", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    conc = ["", "", "", "", "", "1", "100", "0.0", "True", "False"]
    r = m("aten::_flash_attention_forward", dims, types, conc)
    S = 100
    assert r.flops == 2 * 16 * (2 * S * 128 + 2 * S * 128)
    assert r.bytes_read == (2 * 16 * 1 * 128 + 2 * 2 * 100 * 128 * 2) * 2
    assert r.bytes_written == 2 * 16 * 1 * 128 * 2
    assert r.params["H_KV"] == 2 and any("bottom-right" in n for n in r.notes)


def test_efficient_attention_mask_types():
    dims = [[1, 4, 2, 32], [1, 6, 2, 32], [1, 6, 2, 32]] + [[]] * 7
    types = [F16] * 3 + [""] * 3 + ["Scalar"] * 4
    base = ["", "", "", "", "", "", "4", "6", "0.0"]
    tl = m("aten::_efficient_attention_forward", dims, types, base + ["1"])
    br = m("aten::_efficient_attention_forward", dims, types, base + ["2"])
    none = m("aten::_efficient_attention_forward", dims, types, base + ["0"])
    # top-left 1+2+3+4 = 10; bottom-right 3+4+5+6 = 18; none 24
    per = 2 * 2 * (32 + 32)
    assert (tl.flops, br.flops, none.flops) == (10 * per, 18 * per, 24 * per)


def test_sdpa_flash_backward():
    B, H, N, d = 2, 4, 64, 32
    dims = [[B, H, N, d]] * 5 + [[B, H, N]] + [[]] * 9
    types = [BF16] * 5 + [F32] + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "long int", "long int", "Scalar"]
    conc = [""] * 8 + ["64", "64", "0.0", "True", "", "", ""]
    r = m("aten::_scaled_dot_product_flash_attention_backward", dims, types, conc)
    S = N * (N + 1) // 2
    assert r.flops == 2 * B * H * S * (3 * d + 2 * d)
    assert r.bytes_read == 5 * B * H * N * d * 2          # dO, Q, K, V, O
    assert r.bytes_written == 3 * B * H * N * d * 2       # dQ, dK, dV


def test_varlen_attention_is_not_guessed():
    dims = [[100, 4, 64], [100, 4, 64], [100, 4, 64], [3], [3], [], [], [], [], []]
    types = [BF16] * 3 + ["int", "int"] + ["Scalar"] * 5
    assert m("aten::_flash_attention_forward", dims, types, [""] * 5 + ["60", "60", "0.0", "True", "False"]) is None
