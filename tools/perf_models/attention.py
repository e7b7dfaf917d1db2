"""Attention: SDPA and the flash / efficient / cuDNN kernels' ops, forward and backward; causal pairs counted exactly."""
from __future__ import annotations

from .base import OpModel, Unmodelled, Args, Bytes, numel, parse_bool, parse_float


def causal_pairs(n_q: int, n_kv: int, align: str = "bottom_right") -> int:
    """Number of unmasked (query, key) pairs of a causal mask.

    top_left:     query i (0-based) sees keys j ≤ i                    (torch.tril, PyTorch is_causal)
    bottom_right: query i sees keys j ≤ i + (n_kv − n_q)               (FlashAttention-2 ≥ 2.1)
    Equal lengths: both give n·(n+1)/2.
    """
    off = 0 if align == "top_left" else n_kv - n_q
    # Σ_{i=0}^{n_q-1} clamp(i + 1 + off, 0, n_kv)
    a = 1 + off
    total = 0
    lo_i = max(0, 1 - a)                    # first i with a+i ≥ 1
    hi_i = min(n_q - 1, n_kv - 1 - a)       # last i with a+i ≤ n_kv-1
    if hi_i >= lo_i:
        cnt = hi_i - lo_i + 1
        total += cnt * (2 * a + lo_i + hi_i) // 2
    first_full = max(0, n_kv - a)           # first i with a+i ≥ n_kv
    if first_full < n_q:
        total += (n_q - first_full) * n_kv
    return total


# (layout, fwd/bwd, index of q, dropout index, causal index or None, mask-type index or None,
#  bias index or None, cum_seq_q index or None, default alignment, model name)
_ATTN = {
    "scaled_dot_product_attention": ("BHND", False, 0, 4, 5, None, 3, None, "top_left", "sdpa_fwd"),
    "_scaled_dot_product_flash_attention": ("BHND", False, 0, 3, 4, None, None, None, "bottom_right", "sdpa_fwd_flash"),
    "_scaled_dot_product_flash_attention_for_cpu": ("BHND", False, 0, 3, 4, None, 5, None, "top_left", "sdpa_fwd_flash_cpu"),
    "_scaled_dot_product_efficient_attention": ("BHND", False, 0, 5, 6, None, 3, None, "top_left", "sdpa_fwd_efficient"),
    "_scaled_dot_product_cudnn_attention": ("BHND", False, 0, 5, 6, None, 3, None, "top_left", "sdpa_fwd_cudnn"),
    "_flash_attention_forward": ("BNHD", False, 0, 7, 8, None, None, 3, "bottom_right", "flash_attention_fwd"),
    "_efficient_attention_forward": ("BNHD", False, 0, 8, None, 9, 3, 4, "top_left", "efficient_attention_fwd"),
    "_scaled_dot_product_flash_attention_backward": ("BHND", True, 1, 10, 11, None, None, None, "bottom_right", "sdpa_bwd_flash"),
    "_scaled_dot_product_efficient_attention_backward": ("BHND", True, 1, 9, 11, None, 4, None, "top_left", "sdpa_bwd_efficient"),
    "_scaled_dot_product_cudnn_attention_backward": ("BHND", True, 1, 13, 14, None, 8, 9, "top_left", "sdpa_bwd_cudnn"),
    "_flash_attention_backward": ("BNHD", True, 1, 10, 11, None, None, 6, "bottom_right", "flash_attention_bwd"),
    "_efficient_attention_backward": ("BNHD", True, 1, 11, None, 14, 4, 6, "top_left", "efficient_attention_bwd"),
}


def _bhnd(shape: list[int], layout: str) -> tuple[int, int, int, int]:
    if layout == "BHND":
        if len(shape) < 3:
            if len(shape) == 2:
                return 1, 1, shape[0], shape[1]
            raise Unmodelled("attention tensor rank")
        return numel(shape[:-3]), shape[-3], shape[-2], shape[-1]
    if len(shape) != 4:
        raise Unmodelled("attention tensor rank (B, N, H, d expected)")
    return shape[0], shape[2], shape[1], shape[3]


def _attention(name: str, a: Args) -> OpModel:
    layout, bwd, qi, di, ci, mi, bi, cqi, default_align, model = _ATTN[name]
    if cqi is not None and a.is_tensor(cqi):
        raise Unmodelled("variable-length attention: per-sequence lengths are not recorded")
    if name in ("_flash_attention_forward", "_flash_attention_backward"):
        for wi in ((11, 12) if not bwd else (15, 16)):
            w = a.c(wi).strip()
            if w not in ("", "-1", "None"):
                raise Unmodelled("sliding-window attention not modelled")
    q, k, v = a.tensor(qi, "query"), a.tensor(qi + 1, "key"), a.tensor(qi + 2, "value")
    B, Hq, Nq, dqk = _bhnd(q, layout)
    Bk, Hkv, Nkv, dk = _bhnd(k, layout)
    Bv, Hv, Nv, dv = _bhnd(v, layout)
    if Bk != B or Bv != B or dk != dqk or Nv != Nkv or Hv != Hkv or Hkv == 0 or Hq % Hkv:
        raise Unmodelled("inconsistent q/k/v shapes")
    notes = []
    align = default_align
    causal = False
    if ci is not None:
        causal = bool(parse_bool(a.c(ci), False))
    if mi is not None:
        mt = a.c(mi).strip()
        if mt not in ("", "0"):
            if mt == "1":
                causal, align = True, "top_left"
            elif mt == "2":
                causal, align = True, "bottom_right"
            else:
                raise Unmodelled(f"unknown custom_mask_type {mt!r}")
    pairs = causal_pairs(Nq, Nkv, align) if causal else Nq * Nkv
    if causal:
        notes.append(f"causal mask aligned {align.replace('_', '-')}: {pairs} of {Nq}·{Nkv} scores unmasked "
                     f"(exact count, not N_Q·N_KV/2)")
    if Hq != Hkv:
        notes.append(f"GQA: {Hq} query heads share {Hkv} K/V heads")
    dropout = parse_float(a.c(di), 0.0) if di is not None else 0.0
    if dropout:
        notes.append(f"dropout p={dropout} not counted in FLOPs")
    notes.append("softmax FLOPs and the logsumexp (B·H·N_Q fp32) traffic are not counted")
    by = Bytes()
    by.read(B * Hkv * Nkv * dqk, a.type(qi + 1))
    by.read(B * Hkv * Nkv * dv, a.type(qi + 2))
    by.read(B * Hq * Nq * dqk, a.type(qi))
    if bi is not None and a.is_tensor(bi):
        by.read(numel(a.shape(bi)), a.type(bi))
        notes.append(f"attention bias/mask {a.shape(bi)} read once at its logical size")
    P = B * Hq * pairs
    params = {"B": B, "N_Q": Nq, "H_Q": Hq, "N_KV": Nkv, "H_KV": Hkv, "d_h_qk": dqk, "d_h_v": dv,
              "causal": causal, "mask_alignment": align if causal else None, "dropout": dropout,
              "dtype": a.type(qi)}
    if not bwd:
        flops = 2 * P * dqk + 2 * P * dv
        by.write(B * Hq * Nq * dv, a.type(qi))
        formula = "2·B·H_Q·S·d_qk (QKᵀ) + 2·B·H_Q·S·d_v (PV), S = unmasked scores; bytes = Q+K+V (+bias) read, O written"
    else:
        # recompute QKᵀ, dV = PᵀdO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q
        g = Hq // Hkv
        flops = 2 * P * (3 * dqk + 2 * dv) + B * Hkv * Nkv * (g - 1) * (dqk + dv)
        by.read(B * Hq * Nq * dv, a.type(0))        # dO
        by.read(B * Hq * Nq * dv, a.type(qi))       # O (for D = rowsum(dO∘O))
        by.write(B * Hq * Nq * dqk, a.type(qi))     # dQ
        by.write(B * Hkv * Nkv * dqk, a.type(qi + 1))
        by.write(B * Hkv * Nkv * dv, a.type(qi + 2))
        formula = ("2·B·H_Q·S·(3·d_qk + 2·d_v) (recompute QKᵀ, dV, dP, dQ, dK) + GQA head-sum B·H_KV·N_KV·(g−1)·(d_qk+d_v); "
                   "bytes = Q,K,V,O,dO read, dQ,dK,dV written")
        notes.append("attention-bias gradient (if any) not counted")
    return OpModel(model, flops, by.r, by.w, formula, tuple(notes) + by.notes(), params)


# aten base name -> its model, for models.py's registry
OPS = {b: _attention for b in _ATTN}
