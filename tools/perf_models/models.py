"""Analytic FLOPs / bytes models of PyTorch (aten) CPU ops from their Kineto record.

``model_for(name, input_dims, input_types, concrete_inputs)`` → :class:`OpModel` or ``None``.

Conventions (the "useful work" of the operator, not what a kernel happens to do):
- FLOPs: a multiply-add is 2 FLOPs; elementwise ops count the listed ops per *output* element
  (1 unless stated in ``formula``); pure data movement (copy, cast, gather) is 0 FLOPs.
- Bytes: perfect cache — every tensor the op reads is read once, every tensor it writes is
  written once, each with its own dtype (no single "bpe" for the whole op).  Python scalars are
  kernel arguments (0 bytes); 0-dim tensors are 1 element.
- Any dtype whose size is unknown makes the byte fields ``None`` (never NaN); FLOPs stay valid.
- Ops whose shapes are not recorded, or whose arguments cannot be parsed, give ``None`` — never a
  guess.  Non-leaf composites (``aten::linear``, ``aten::matmul``) are not modelled: model their
  leaf children (addmm / mm / bmm), which carry the real shapes.
- Causal attention counts the unmasked score elements exactly.  Alignment of the mask when
  N_Q ≠ N_KV: bottom-right (FlashAttention-2, ``_flash_attention_*``, ``_scaled_dot_product_flash_*``,
  xformers mask type 2) or top-left (PyTorch ``is_causal`` = ``tril`` semantics: composite SDPA,
  efficient / cuDNN SDPA, xformers mask type 1); the one used is stated in ``notes``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from .dtypes import (accumulate_dtype, bytes_per_element, dtype_from_concrete, is_bool,
                     is_complex, is_floating, normalize_dtype)

__all__ = ["OpModel", "model_for", "causal_pairs", "MODELLED_OPS"]


@dataclass(frozen=True)
class OpModel:
    model: str                      # model family, e.g. 'gemm', 'sdpa_fwd_flash'
    flops: int
    bytes_read: int | None
    bytes_written: int | None
    formula: str                    # one line, human-readable
    notes: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)

    @property
    def bytes_total(self) -> int | None:
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written

    @property
    def flops_per_byte(self) -> float | None:
        bt = self.bytes_total
        return None if not bt else self.flops / bt

    def to_dict(self) -> dict:
        return {"model": self.model, "flops": self.flops, "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written, "bytes_total": self.bytes_total,
                "formula": self.formula, "notes": list(self.notes), "params": dict(self.params)}


class _Unmodelled(Exception):
    """Raised inside a model when the record cannot be modelled exactly; model_for returns None."""


# ----------------------------------------------------------------------------- argument access

def _load(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return []
        try:
            out = json.loads(s)
        except ValueError:
            raise _Unmodelled("unparsable JSON")
        return list(out) if isinstance(out, (list, tuple)) else []
    raise _Unmodelled("unsupported argument container")


_NON_TENSOR_TYPES = {"scalar", "scalarlist", "tensorlist", "genericlist", "", "device", "layout",
                     "scalartype", "memoryformat", "string", "none"}


class _Args:
    def __init__(self, dims, types, conc):
        self.dims = _load(dims)
        self.types = _load(types)
        self.conc = _load(conc)
        self.n = max(len(self.dims), len(self.types))

    def type(self, i) -> str:
        return self.types[i] if i < len(self.types) and isinstance(self.types[i], str) else ""

    def shape(self, i) -> list[int] | None:
        d = self.dims[i] if i < len(self.dims) else None
        if isinstance(d, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in d):
            return list(d)
        return None

    def is_tensor(self, i) -> bool:
        if i >= self.n:
            return False
        t = normalize_dtype(self.type(i))
        return t is not None and t not in _NON_TENSOR_TYPES and self.shape(i) is not None

    def tensor(self, i, what="tensor") -> list[int]:
        if not self.is_tensor(i):
            raise _Unmodelled(f"argument {i} ({what}) is not a recorded tensor")
        return self.shape(i)

    def c(self, i) -> str:
        v = self.conc[i] if i < len(self.conc) else ""
        return v if isinstance(v, str) else ("" if v is None else str(v))

    def is_scalar(self, i) -> bool:
        return i < self.n and normalize_dtype(self.type(i)) == "scalar"


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _bpe(dtype: str) -> int | None:
    return bytes_per_element(dtype)


class _Bytes:
    """Accumulates read/written bytes; any unknown dtype poisons the sum to None."""

    def __init__(self):
        self.r: int | None = 0
        self.w: int | None = 0
        self.unknown: list[str] = []

    def read(self, n: int, dtype: str):
        b = _bpe(dtype)
        if b is None:
            self.unknown.append(dtype)
            self.r = None
        elif self.r is not None:
            self.r += n * b

    def write(self, n: int, dtype: str):
        b = _bpe(dtype)
        if b is None:
            self.unknown.append(dtype)
            self.w = None
        elif self.w is not None:
            self.w += n * b

    def notes(self) -> tuple[str, ...]:
        if not self.unknown:
            return ()
        return (f"bytes unknown: no element size for dtype(s) {sorted(set(map(repr, self.unknown)))}",)


def _parse_bool(s: str, default: bool | None = None) -> bool | None:
    s = (s or "").strip().lower()
    if s in ("true", "1"):
        return True
    if s in ("false", "0"):
        return False
    return default


def _parse_float(s: str, default: float | None = None) -> float | None:
    try:
        return float(s)
    except (TypeError, ValueError):
        return default


_INT_LIST = re.compile(r"^[\[\(]?\s*(-?\d+(\s*,\s*-?\d+)*)?\s*,?\s*[\]\)]?$")


def _parse_int_list(s: str) -> list[int] | None:
    """'[-1, -2]', '(0, 1)', '-1', '[]' → ints; '' / 'None' → None; anything else raises."""
    s = (s or "").strip()
    if s == "" or s.lower() == "none":
        return None
    if not _INT_LIST.match(s):
        raise _Unmodelled(f"unparsable int list {s!r}")
    return [int(x) for x in re.findall(r"-?\d+", s)]


def _broadcast(shapes: Sequence[Sequence[int]]) -> list[int]:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(nd):
        size = 1
        for s in shapes:
            j = len(s) - nd + k
            if j < 0:
                continue
            d = s[j]
            if d != 1:
                if size not in (1, d):
                    raise _Unmodelled(f"shapes {shapes} do not broadcast")
                size = d
        out.append(size)
    return out


# ----------------------------------------------------------------------------- type promotion

def _category(dtype: str) -> int:
    if is_bool(dtype):
        return 0
    if is_complex(dtype):
        return 3
    if is_floating(dtype):
        return 2
    return 1


def _promote(tensors: list[tuple[str, int]], scalar_kinds: list[int]) -> str:
    """torch.result_type for (dtype, ndim) tensors plus Python scalars (category 1 int, 2 float, 3 complex).

    Dimensioned tensors win; 0-dim tensors and scalars participate only if of a higher category.
    """
    dim = [d for d, nd in tensors if nd > 0]
    zero = [d for d, nd in tensors if nd == 0]

    def best(ds):
        # widest within highest category
        cat = max(_category(d) for d in ds)
        cands = [d for d in ds if _category(d) == cat]
        return max(cands, key=lambda d: _bpe(d) or 0)

    res = best(dim) if dim else (best(zero) if zero else None)
    if res is None:
        return "float" if max(scalar_kinds, default=2) >= 2 else "long int"
    if zero and _category(best(zero)) > _category(res):
        res = best(zero)
    top_scalar = max(scalar_kinds, default=-1)
    if top_scalar > _category(res):
        res = {1: "long int", 2: "float", 3: "c10::complex<float>"}[top_scalar]
    return res


def _scalar_kind(s: str) -> int:
    s = (s or "").strip()
    if s in ("True", "False"):
        return 0
    if re.fullmatch(r"-?\d+", s):
        return 1
    if "j" in s or "(" in s:
        return 3
    return 2


# ----------------------------------------------------------------------------- GEMM

def _gemm_out_dtype(a: _Args, default: str, out_shape: list[int], first_extra: int, dtype_pos: int | None,
                    full_len: int | None) -> tuple[str, str | None]:
    """Output dtype: an explicit ``out_dtype`` ScalarType (``mm.dtype`` overloads) or an ``out=`` tensor."""
    if dtype_pos is not None and a.n == full_len and a.is_scalar(dtype_pos):
        dt = dtype_from_concrete(a.c(dtype_pos))
        if dt:
            return dt, f"output dtype {dt} from out_dtype argument"
    for i in range(first_extra, a.n):
        if a.is_tensor(i) and a.shape(i) == out_shape:
            return a.type(i), f"output dtype {a.type(i)} from out= tensor"
    return default, None


def _gemm(name: str, a: _Args) -> OpModel:
    base = name
    notes: list[str] = []
    bias_shape = None
    if base in ("mm", "addmm"):
        off = 1 if base == "addmm" else 0
        A, B = a.tensor(off, "mat1"), a.tensor(off + 1, "mat2")
        if len(A) != 2 or len(B) != 2 or A[1] != B[0]:
            raise _Unmodelled("mm shapes")
        batch, M, K, N = 1, A[0], A[1], B[1]
        if base == "addmm":
            bias_shape = a.tensor(0, "bias")
        out_shape = [M, N]
        dt_out, why = _gemm_out_dtype(a, a.type(off), out_shape, off + 2, off + 2 if base == "mm" else 3,
                                      3 if base == "mm" else 6)
    else:  # bmm / baddbmm
        off = 1 if base == "baddbmm" else 0
        A, B = a.tensor(off, "batch1"), a.tensor(off + 1, "batch2")
        if len(A) != 3 or len(B) != 3 or A[2] != B[1] or A[0] != B[0]:
            raise _Unmodelled("bmm shapes")
        batch, M, K, N = A[0], A[1], A[2], B[2]
        if base == "baddbmm":
            bias_shape = a.tensor(0, "bias")
        out_shape = [batch, M, N]
        dt_out, why = _gemm_out_dtype(a, a.type(off), out_shape, off + 2, off + 2 if base == "bmm" else 3,
                                      3 if base == "bmm" else 6)
    if why:
        notes.append(why)
    else:
        notes.append("output dtype = mat1 dtype (aten GEMM rule; no out_dtype recorded)")
    flops = 2 * batch * M * N * K
    by = _Bytes()
    by.read(batch * M * K, a.type(off))
    by.read(batch * K * N, a.type(off + 1))
    by.write(batch * M * N, dt_out)
    formula = "2·B·M·N·K"
    if bias_shape is not None:
        flops += batch * M * N
        by.read(_numel(bias_shape), a.type(0))
        formula += " + B·M·N (bias add)"
        notes.append(f"bias {bias_shape} read once; beta/alpha scaling not counted")
    return OpModel("gemm", flops, by.r, by.w,
                   f"{formula}; bytes = A·bpeA + B·bpeB + C·bpeOut (+ bias)",
                   tuple(notes) + by.notes(),
                   {"B": batch, "M": M, "N": N, "K": K, "bias": bias_shape is not None,
                    "dtype_A": a.type(off), "dtype_B": a.type(off + 1), "dtype_out": dt_out})


def _scaled_mm(a: _Args) -> OpModel:
    # _scaled_mm(mat1, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum)
    A, B = a.tensor(0, "mat1"), a.tensor(1, "mat2")
    if len(A) != 2 or len(B) != 2 or A[1] != B[0]:
        raise _Unmodelled("_scaled_mm shapes")
    M, K, N = A[0], A[1], B[1]
    notes = []
    dt_out = dtype_from_concrete(a.c(6)) if a.n > 6 else None
    if dt_out:
        notes.append(f"output dtype {dt_out} from out_dtype argument")
    else:
        dt_out = a.type(0)
        notes.append("no out_dtype recorded: output dtype = mat1 dtype (PyTorch default)")
    by = _Bytes()
    by.read(M * K, a.type(0))
    by.read(K * N, a.type(1))
    for i in (2, 3, 5):
        if a.is_tensor(i):
            by.read(_numel(a.shape(i)), a.type(i))
    flops = 2 * M * N * K
    bias = a.is_tensor(4)
    if bias:
        by.read(_numel(a.shape(4)), a.type(4))
        flops += M * N
    by.write(M * N, dt_out)
    return OpModel("gemm_scaled", flops, by.r, by.w,
                   "2·M·N·K (+ M·N bias); bytes = A + B + scales (+ bias) + C·bpe(out_dtype)",
                   tuple(notes) + ("scaling multiplies (per tensor/row) not counted as FLOPs",) + by.notes(),
                   {"B": 1, "M": M, "N": N, "K": K, "bias": bias, "dtype_A": a.type(0),
                    "dtype_B": a.type(1), "dtype_out": dt_out})


# ----------------------------------------------------------------------------- attention

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
            raise _Unmodelled("attention tensor rank")
        return _numel(shape[:-3]), shape[-3], shape[-2], shape[-1]
    if len(shape) != 4:
        raise _Unmodelled("attention tensor rank (B, N, H, d expected)")
    return shape[0], shape[2], shape[1], shape[3]


def _attention(name: str, a: _Args) -> OpModel:
    layout, bwd, qi, di, ci, mi, bi, cqi, default_align, model = _ATTN[name]
    if cqi is not None and a.is_tensor(cqi):
        raise _Unmodelled("variable-length attention: per-sequence lengths are not recorded")
    if name in ("_flash_attention_forward", "_flash_attention_backward"):
        for wi in ((11, 12) if not bwd else (15, 16)):
            w = a.c(wi).strip()
            if w not in ("", "-1", "None"):
                raise _Unmodelled("sliding-window attention not modelled")
    q, k, v = a.tensor(qi, "query"), a.tensor(qi + 1, "key"), a.tensor(qi + 2, "value")
    B, Hq, Nq, dqk = _bhnd(q, layout)
    Bk, Hkv, Nkv, dk = _bhnd(k, layout)
    Bv, Hv, Nv, dv = _bhnd(v, layout)
    if Bk != B or Bv != B or dk != dqk or Nv != Nkv or Hv != Hkv or Hkv == 0 or Hq % Hkv:
        raise _Unmodelled("inconsistent q/k/v shapes")
    notes = []
    align = default_align
    causal = False
    if ci is not None:
        causal = bool(_parse_bool(a.c(ci), False))
    if mi is not None:
        mt = a.c(mi).strip()
        if mt not in ("", "0"):
            if mt == "1":
                causal, align = True, "top_left"
            elif mt == "2":
                causal, align = True, "bottom_right"
            else:
                raise _Unmodelled(f"unknown custom_mask_type {mt!r}")
    pairs = causal_pairs(Nq, Nkv, align) if causal else Nq * Nkv
    if causal:
        notes.append(f"causal mask aligned {align.replace('_', '-')}: {pairs} of {Nq}·{Nkv} scores unmasked "
                     f"(exact count, not N_Q·N_KV/2)")
    if Hq != Hkv:
        notes.append(f"GQA: {Hq} query heads share {Hkv} K/V heads")
    dropout = _parse_float(a.c(di), 0.0) if di is not None else 0.0
    if dropout:
        notes.append(f"dropout p={dropout} not counted in FLOPs")
    notes.append("softmax FLOPs and the logsumexp (B·H·N_Q fp32) traffic are not counted")
    by = _Bytes()
    by.read(B * Hkv * Nkv * dqk, a.type(qi + 1))
    by.read(B * Hkv * Nkv * dv, a.type(qi + 2))
    by.read(B * Hq * Nq * dqk, a.type(qi))
    if bi is not None and a.is_tensor(bi):
        by.read(_numel(a.shape(bi)), a.type(bi))
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


# ----------------------------------------------------------------------------- convolution

def _conv_out(x: list[int], w: list[int], stride, padding, dilation, transposed, out_pad, groups) -> list[int]:
    sp = len(x) - 2
    if sp < 1 or len(w) != len(x):
        raise _Unmodelled("conv ranks")

    def rep(v, name):
        if v is None:
            raise _Unmodelled(f"conv {name} not recorded")
        if len(v) == 1:
            return v * sp
        if len(v) != sp:
            raise _Unmodelled(f"conv {name} length")
        return v

    stride, dilation = rep(stride, "stride"), rep(dilation, "dilation")
    out_pad = rep(out_pad, "output_padding") if transposed else [0] * sp
    if padding == "same":
        return [x[0], w[0]] + list(x[2:])
    padding = [0] * sp if padding == "valid" else rep(padding, "padding")
    ks = w[2:]
    if transposed:
        sp_out = [(x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ks[i] - 1) + out_pad[i] + 1
                  for i in range(sp)]
        c_out = w[1] * groups
    else:
        sp_out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(sp)]
        c_out = w[0]
    return [x[0], c_out] + sp_out


def _pad_arg(s: str):
    s = (s or "").strip().strip("'\"")
    if s in ("same", "valid"):
        return s
    return _parse_int_list(s)


def _conv_fwd(name: str, a: _Args) -> OpModel:
    # (x, w, bias?, stride, padding, dilation, transposed, output_padding, groups) for convolution/_convolution;
    # conv{1,2,3}d: (x, w, bias, stride, padding, dilation, groups);
    # cudnn_convolution: (x, w, padding, stride, dilation, groups, ...);
    # miopen_convolution: (x, w, bias, padding, stride, dilation, groups, ...)
    x, w = a.tensor(0, "input"), a.tensor(1, "weight")
    if name in ("convolution", "_convolution"):
        has_b, st, pd, dl = True, a.c(3), a.c(4), a.c(5)
        tr = bool(_parse_bool(a.c(6), False))
        op, groups = a.c(7), a.c(8)
    elif name in ("conv1d", "conv2d", "conv3d"):
        has_b, st, pd, dl, tr, op, groups = True, a.c(3), a.c(4), a.c(5), False, "", a.c(6)
    elif name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        # (input, weight, bias, stride, padding, output_padding, groups, dilation)
        has_b, st, pd, op, groups, dl, tr = True, a.c(3), a.c(4), a.c(5), a.c(6), a.c(7), True
    elif name == "cudnn_convolution":
        has_b, pd, st, dl, groups, tr, op = False, a.c(2), a.c(3), a.c(4), a.c(5), False, ""
    elif name == "cudnn_convolution_transpose":
        # (self, weight, padding, output_padding, stride, dilation, groups, ...)
        has_b, pd, op, st, dl, groups, tr = False, a.c(2), a.c(3), a.c(4), a.c(5), a.c(6), True
    else:  # miopen_convolution
        has_b, pd, st, dl, groups, tr, op = True, a.c(3), a.c(4), a.c(5), a.c(6), False, ""
    g = int(groups) if re.fullmatch(r"\s*\d+\s*", groups or "") else None
    if g is None:
        raise _Unmodelled("conv groups not recorded")
    dil = _parse_int_list(dl) if dl.strip() else [1]
    out = _conv_out(x, w, _parse_int_list(st), _pad_arg(pd), dil, tr, _parse_int_list(op) if tr else None, g)
    if any(d <= 0 for d in out):
        raise _Unmodelled("non-positive conv output size")
    bias = has_b and a.is_tensor(2) and len(a.shape(2)) == 1
    macs = (_numel(x) if tr else _numel(out)) * _numel(w[1:])
    flops = 2 * macs + (_numel(out) if bias else 0)
    by = _Bytes()
    by.read(_numel(x), a.type(0))
    by.read(_numel(w), a.type(1))
    if bias:
        by.read(_numel(a.shape(2)), a.type(2))
    by.write(_numel(out), a.type(0))
    notes = ["bias detected from the recorded bias tensor" if bias else "no bias tensor recorded"]
    return OpModel("conv_fwd", flops, by.r, by.w,
                   ("2·prod(x)·prod(w[1:])" if tr else "2·prod(out)·prod(w[1:])") + (" + prod(out) (bias)" if bias else "")
                   + "; bytes = x + w (+ bias) read, out written",
                   tuple(notes) + by.notes(),
                   {"input": x, "weight": w, "output": out, "bias": bias, "transposed": tr, "groups": g})


def _conv_bwd(a: _Args) -> OpModel:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #                      output_padding, groups, output_mask)
    dy, x, w = a.tensor(0, "grad_output"), a.tensor(1, "input"), a.tensor(2, "weight")
    tr = bool(_parse_bool(a.c(7), False))
    mask = [_parse_bool(t) for t in re.findall(r"True|False|1|0", a.c(10))] or [True, True, True]
    if len(mask) != 3 or None in mask:
        raise _Unmodelled("output_mask")
    macs = (_numel(x) if tr else _numel(dy)) * _numel(w[1:])
    flops = 0
    by = _Bytes()
    parts = []
    if mask[0]:
        flops += 2 * macs
        by.read(_numel(dy), a.type(0)); by.read(_numel(w), a.type(2)); by.write(_numel(x), a.type(1))
        parts.append("dX")
    if mask[1]:
        flops += 2 * macs
        by.read(_numel(dy), a.type(0)); by.read(_numel(x), a.type(1)); by.write(_numel(w), a.type(2))
        parts.append("dW")
    if mask[2]:
        flops += _numel(dy)
        by.read(_numel(dy), a.type(0)); by.write(dy[1], a.type(0))
        parts.append("dBias")
    return OpModel("conv_bwd", flops, by.r, by.w,
                   "2·MACs per computed dX/dW + prod(dY) for dBias; each gradient reads dY once",
                   (f"gradients computed (output_mask): {', '.join(parts) or 'none'}",) + by.notes(),
                   {"grad_output": dy, "input": x, "weight": w, "output_mask": mask, "transposed": tr})


# ----------------------------------------------------------------------------- elementwise

_UNARY = {"abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
          "sigmoid", "tanh", "silu", "gelu", "relu", "relu6", "sin", "cos", "tan", "erf", "erfc", "erfinv", "sign",
          "sgn", "floor", "ceil", "round", "trunc", "frac", "bitwise_not", "logical_not", "hardtanh", "leaky_relu",
          "elu", "selu", "celu", "softplus", "mish", "hardswish", "hardsigmoid", "nan_to_num", "clamp_min",
          "clamp_max", "square", "isnan", "isinf", "isfinite", "logit", "threshold", "asin", "acos", "atan",
          "sinh", "cosh", "asinh", "acosh", "atanh", "digamma", "lgamma", "signbit", "positive", "angle"}
_BINARY = {"add", "sub", "mul", "div", "rsub", "true_divide", "floor_divide", "maximum", "minimum", "fmax", "fmin",
           "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
           "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "fmod", "remainder", "atan2",
           "hypot", "xlogy", "copysign", "threshold_backward", "sigmoid_backward", "tanh_backward",
           "gelu_backward", "silu_backward", "hardswish_backward", "hardsigmoid_backward", "leaky_relu_backward",
           "elu_backward"}
_TERNARY = {"where": 1, "addcmul": 3, "addcdiv": 3, "lerp": 3, "masked_fill": 1, "clamp": 1, "clip": 1}
_BOOL_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
             "isnan", "isinf", "isfinite", "signbit"}
_FLOAT_OUT = {"div", "true_divide", "sqrt", "rsqrt", "exp", "log", "sigmoid", "tanh", "sin", "cos", "reciprocal",
              "erf", "log1p", "expm1", "exp2", "log2", "log10", "atan2"}
_ZERO_FLOP = {"fill", "zero", "clone", "contiguous"}


def _elementwise(base: str, inplace: bool, a: _Args) -> OpModel:
    if base in ("pow",):
        n_in = 2 if a.is_tensor(1) else 1
        fpe = 1
    elif base in _UNARY:
        n_in, fpe = 1, 1
    elif base in _BINARY:
        n_in, fpe = 2, 1
    elif base in _TERNARY:
        n_in, fpe = 3, _TERNARY[base]
    elif base in ("fill", "zero"):
        n_in, fpe = 1, 0
    else:  # clone
        n_in, fpe = 1, 0
    if base == "where" and not a.is_tensor(0):
        raise _Unmodelled("where(condition) without tensors")
    in_idx = [i for i in range(min(n_in, a.n)) if a.is_tensor(i)]
    if not in_idx or in_idx[0] != 0:
        if base == "rsub" or base == "where":
            pass
        if not in_idx:
            raise _Unmodelled("no tensor inputs")
    shapes = [a.shape(i) for i in in_idx]
    out_shape = a.shape(0) if inplace else _broadcast(shapes)
    if inplace and _broadcast(shapes + [out_shape]) != out_shape:
        raise _Unmodelled("in-place op output does not match self")
    n_out = _numel(out_shape)
    # output dtype
    out_dtype = None
    why = None
    for i in range(n_in, a.n):
        if a.is_tensor(i) and a.shape(i) == out_shape:
            out_dtype, why = a.type(i), "out= tensor"
            break
    if out_dtype is None:
        if inplace:
            out_dtype = a.type(0)
        elif base in _BOOL_OUT:
            out_dtype = "bool"
        else:
            tens = [(a.type(i), len(a.shape(i))) for i in in_idx]
            if base == "where":
                tens = [t for i, t in zip(in_idx, tens) if i != 0]
            if base == "masked_fill":
                tens = tens[:1]
            scal = [_scalar_kind(a.c(i)) for i in range(1, min(n_in, a.n)) if a.is_scalar(i)]
            if base == "where":
                scal = [_scalar_kind(a.c(i)) for i in (1, 2) if a.is_scalar(i)]
            out_dtype = _promote(tens, scal) if tens else a.type(0)
            if base in _FLOAT_OUT and _category(out_dtype) < 2:
                out_dtype = "float"
    by = _Bytes()
    if base not in ("fill", "zero"):
        for i in in_idx:
            by.read(_numel(a.shape(i)), a.type(i))
    elif base == "fill" and a.is_tensor(1):
        by.read(1, a.type(1))
    by.write(n_out, out_dtype)
    notes = []
    if inplace:
        notes.append("in-place: self read and written")
    if why:
        notes.append(f"output dtype from {why}")
    kind = {1: "unary", 2: "binary", 3: "ternary"}[max(1, len(in_idx))]
    fl = fpe * n_out
    return OpModel(f"elementwise_{kind}", fl, by.r, by.w,
                   f"{fpe}·n_out FLOPs (n_out = broadcast numel {n_out}); bytes = Σ inputs·bpe + n_out·bpe_out",
                   tuple(notes) + by.notes(),
                   {"shapes_in": shapes, "shape_out": out_shape, "dtypes_in": [a.type(i) for i in in_idx],
                    "dtype_out": out_dtype})


def _copy(base: str, a: _Args) -> OpModel:
    notes = ["data movement: 0 FLOPs"]
    if base == "copy_":
        dst, src = a.tensor(0, "self"), a.tensor(1, "src")
        n_out, n_in, dt_in, dt_out = _numel(dst), _numel(src), a.type(1), a.type(0)
    else:
        x = a.tensor(0, "self")
        n_in = n_out = _numel(x)
        dt_in = a.type(0)
        dt_out = None
        if base == "_to_copy":
            dt_out = dtype_from_concrete(a.c(1)) if a.n > 1 else None
        else:  # to: to.dtype(self, dtype, ...), to.device(self, device, dtype, ...), to.other(self, other, ...)
            if a.is_tensor(1):
                dt_out = a.type(1)
            else:
                for i in (1, 2):
                    if a.is_scalar(i) and re.fullmatch(r"\d+", a.c(i).strip() or "x"):
                        dt_out = dtype_from_concrete(a.c(i))
                        break
            notes.append("aten::to without a dtype/device change is a no-op; apply only to ops with GPU work")
        if dt_out is None:
            dt_out = dt_in
            notes.append("no target dtype recorded: same dtype as input (device/layout change or copy)")
    by = _Bytes()
    by.read(n_in, dt_in)
    by.write(n_out, dt_out)
    if normalize_dtype(dt_in) != normalize_dtype(dt_out):
        notes.append(f"cast {dt_in} → {dt_out}")
    return OpModel("copy", 0, by.r, by.w, "0 FLOPs; bytes = n_src·bpe_src + n_dst·bpe_dst",
                   tuple(notes) + by.notes(), {"n": n_out, "dtype_in": dt_in, "dtype_out": dt_out})


# ----------------------------------------------------------------------------- reductions

# name → (dim index, keepdim index, dtype index, flops/elem, number of outputs, output dtype rule)
_REDUCE = {
    "sum": (1, 2, 3, 1, 1, "sum"), "nansum": (1, 2, 3, 1, 1, "sum"), "mean": (1, 2, 3, 1, 1, "same"),
    "nanmean": (1, 2, 3, 1, 1, "same"), "prod": (1, 2, 3, 1, 1, "sum"),
    "amax": (1, 2, None, 1, 1, "same"), "amin": (1, 2, None, 1, 1, "same"),
    "max": (1, 2, None, 1, 2, "values_indices"), "min": (1, 2, None, 1, 2, "values_indices"),
    "argmax": (1, 2, None, 1, 1, "long"), "argmin": (1, 2, None, 1, 1, "long"),
    "any": (1, 2, None, 1, 1, "bool"), "all": (1, 2, None, 1, 1, "bool"),
    "logsumexp": (1, 2, None, 3, 1, "same"),
    "norm": (2, 3, 4, 2, 1, "same"), "linalg_vector_norm": (2, 3, 4, 2, 1, "same"),
    "std": (1, 3, None, 3, 1, "same"), "var": (1, 3, None, 3, 1, "same"),
    "std_mean": (1, 3, None, 3, 2, "same"), "var_mean": (1, 3, None, 3, 2, "same"),
    "cumsum": (1, None, 2, 1, 1, "scan"), "cumprod": (1, None, 2, 1, 1, "scan"),
}


def _reduce(base: str, a: _Args) -> OpModel:
    di, ki, ti, fpe, n_outs, rule = _REDUCE[base]
    x = a.tensor(0, "self")
    if base in ("max", "min") and a.is_tensor(1):
        return _elementwise("maximum" if base == "max" else "minimum", False, a)
    n_in = _numel(x)
    notes = []
    if rule == "scan":
        dim = _parse_int_list(a.c(1))
        if not dim or len(dim) != 1:
            raise _Unmodelled("scan dim")
        out_shape = list(x)
    else:
        full = a.n <= di or (a.type(di) in ("", "Scalar") and base in ("sum", "mean", "prod", "nansum") and a.n == 2)
        if base in ("norm",) and a.n == 2:
            full = True
        dims = None if full else _parse_int_list(a.c(di))
        if full and base in ("max", "min"):
            n_outs = 1
        if full or dims is None or dims == []:
            if not full and dims is None and base in ("max", "min"):
                raise _Unmodelled("max/min dim not recorded")
            dims = list(range(len(x)))
            notes.append("full reduction (no dim)")
        keep = bool(_parse_bool(a.c(ki), False)) if (ki is not None and not full) else False
        nd = max(len(x), 1)
        red = set()
        for d in dims:
            if not -nd <= d < nd:
                raise _Unmodelled("dim out of range")
            red.add(d % nd)
        out_shape = [1 if i in red else s for i, s in enumerate(x)] if keep else \
            [s for i, s in enumerate(x) if i not in red]
        notes.append(f"reduced dims {sorted(red)}, keepdim={keep}")
    n_out = _numel(out_shape)
    dt_in = a.type(0)
    dt_out = dtype_from_concrete(a.c(ti)) if ti is not None and a.n > ti else None
    if dt_out is None:
        if rule in ("sum", "scan") and _category(dt_in) < 2:
            dt_out = "long int"
        elif rule == "long":
            dt_out = "long int"
        elif rule == "bool":
            dt_out = "bool"
        else:
            dt_out = dt_in
    by = _Bytes()
    by.read(n_in, dt_in)
    by.write(n_out, dt_out)
    if rule == "values_indices" and n_outs == 2:
        by.write(n_out, "long int")
        notes.append("values and int64 indices written")
    elif n_outs == 2:
        by.write(n_out, dt_out)
    return OpModel("reduce", fpe * n_in, by.r, by.w,
                   f"{fpe}·n_in FLOPs; bytes = n_in·bpe_in + n_out·bpe_out (n_out from dim/keepdim)",
                   tuple(notes) + by.notes(),
                   {"n_in": n_in, "n_out": n_out, "shape_out": out_shape, "dtype_in": dt_in, "dtype_out": dt_out})


# ----------------------------------------------------------------------------- softmax / norms / gather

def _softmax(base: str, a: _Args) -> OpModel:
    if base.endswith("_backward_data"):
        # (grad_output, output, dim, input_dtype)
        gy, y = a.tensor(0, "grad_output"), a.tensor(1, "output")
        n = _numel(gy)
        dt_out = dtype_from_concrete(a.c(3)) or a.type(0)
        by = _Bytes()
        by.read(n, a.type(0)); by.read(_numel(y), a.type(1)); by.write(n, dt_out)
        return OpModel("softmax_bwd", 4 * n, by.r, by.w,
                       "4·n FLOPs (dY·Y, row sum, sub, mul); bytes = dY + Y read, dX written", by.notes(),
                       {"n": n, "dtype_out": dt_out})
    x = a.tensor(0, "self")
    n = _numel(x)
    dt_out = None
    if base in ("_softmax", "_log_softmax"):
        if _parse_bool(a.c(2), False):
            dt_out = "float"
    else:
        dt_out = dtype_from_concrete(a.c(2))
    dt_out = dt_out or a.type(0)
    by = _Bytes()
    by.read(n, a.type(0)); by.write(n, dt_out)
    return OpModel("softmax", 5 * n, by.r, by.w,
                   "5·n FLOPs (max, sub, exp, sum, div/log-sub per element); bytes = n·bpe_in + n·bpe_out",
                   by.notes(), {"n": n, "dtype_in": a.type(0), "dtype_out": dt_out})


def _norm(base: str, a: _Args) -> OpModel:
    x = a.tensor(0, "input")
    N = _numel(x)
    dt = a.type(0)
    acc = accumulate_dtype(dt)
    by = _Bytes()
    notes = []
    if base in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
        ns = _parse_int_list(a.c(1))
        if ns is None:
            wi = 2
            if not a.is_tensor(wi):
                raise _Unmodelled("normalized_shape not recorded")
            ns = a.shape(wi)
        C = _numel(ns)
        if C == 0 or N % C:
            raise _Unmodelled("normalized_shape")
        rows = N // C
        w = a.is_tensor(2)
        b = base in ("layer_norm", "native_layer_norm") and a.is_tensor(3)
        by.read(N, dt)
        if w:
            by.read(C, a.type(2))
        if b:
            by.read(C, a.type(3))
        by.write(N, dt)
        if base.startswith("rms") or base == "_fused_rms_norm":
            fpe = 3 + int(w)
            formula = f"{fpe}·N (square+accumulate, scale by rstd{', γ' if w else ''})"
            if base == "_fused_rms_norm":
                by.write(rows, acc)
                notes.append("rstd per row written in the accumulation dtype")
            model = "rms_norm"
        else:
            fpe = 6 + int(w) + int(b)
            formula = f"{fpe}·N (mean 1, variance 3, normalise 2{', γ 1' if w else ''}{', β 1' if b else ''})"
            by.write(2 * rows, acc)
            notes.append(f"mean and rstd per row ({rows} rows) written in {acc}")
            model = "layer_norm"
        return OpModel(model, fpe * N, by.r, by.w, formula + "; bytes = x + γ/β read, y (+ row stats) written",
                       tuple(notes) + by.notes(), {"N": N, "C": C, "rows": rows, "affine": w, "bias": b, "dtype": dt})
    if base == "native_group_norm" or base == "group_norm":
        if base == "group_norm":
            # (input, num_groups, weight, bias, eps, cudnn_enabled)
            G = int(a.c(1)) if re.fullmatch(r"\d+", a.c(1).strip() or "x") else None
            wi, bi = 2, 3
        else:
            # (input, weight, bias, N, C, HxW, group, eps)
            G = int(a.c(6)) if re.fullmatch(r"\d+", a.c(6).strip() or "x") else None
            wi, bi = 1, 2
        if G is None or len(x) < 2:
            raise _Unmodelled("group_norm groups")
        C = x[1]
        w, b = a.is_tensor(wi), a.is_tensor(bi)
        by.read(N, dt)
        if w:
            by.read(C, a.type(wi))
        if b:
            by.read(C, a.type(bi))
        by.write(N, dt)
        by.write(2 * x[0] * G, acc)
        fpe = 6 + int(w) + int(b)
        return OpModel("group_norm", fpe * N, by.r, by.w,
                       f"{fpe}·N (mean 1, variance 3, normalise 2, affine); bytes = x + γ/β read, y + mean/rstd (N·G) written",
                       by.notes(), {"N": N, "C": C, "groups": G, "dtype": dt})
    # batch norm family: (input, weight, bias, running_mean, running_var, training, momentum, eps[, cudnn])
    if len(x) < 2:
        raise _Unmodelled("batch_norm input rank")
    C = x[1]
    training = False if base == "_native_batch_norm_legit_no_training" else _parse_bool(a.c(5))
    if base == "_native_batch_norm_legit" and a.n == 6:   # no-stats overload (input, w, b, training, momentum, eps)
        training = _parse_bool(a.c(3))
    if training is None:
        raise _Unmodelled("batch_norm training flag")
    w, b = a.is_tensor(1), a.is_tensor(2)
    rm = a.is_tensor(3) and a.n > 6
    by.read(N, dt)
    if w:
        by.read(C, a.type(1))
    if b:
        by.read(C, a.type(2))
    if training:
        fpe = 6 + int(w) + int(b)
        by.write(2 * C, acc)
        notes.append("training: batch statistics (save_mean/save_invstd) written")
        if rm:
            by.read(C, a.type(3)); by.read(C, a.type(4)); by.write(C, a.type(3)); by.write(C, a.type(4))
            notes.append("running mean/var read and updated")
    else:
        fpe = 2 + int(w) + int(b)
        if rm:
            by.read(C, a.type(3)); by.read(C, a.type(4))
        notes.append("inference: uses running statistics")
    by.write(N, dt)
    return OpModel("batch_norm", fpe * N, by.r, by.w,
                   f"{fpe}·N ({'mean 1, variance 3, ' if training else ''}normalise 2, affine); bytes = x + γ/β/stats read, y (+stats) written",
                   tuple(notes) + by.notes(), {"N": N, "C": C, "training": training, "dtype": dt})


def _gather(base: str, a: _Args) -> OpModel:
    by = _Bytes()
    if base == "embedding":
        W, idx = a.tensor(0, "weight"), a.tensor(1, "indices")
        if len(W) != 2:
            raise _Unmodelled("embedding weight rank")
        n_out = _numel(idx) * W[1]
        by.read(_numel(idx), a.type(1)); by.read(n_out, a.type(0)); by.write(n_out, a.type(0))
        return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = indices + gathered rows read, rows written",
                       ("only the gathered rows of the table are read",) + by.notes(),
                       {"n_out": n_out, "dtype": a.type(0)})
    # index_select(self, dim, index)
    x, idx = a.tensor(0, "self"), a.tensor(2, "index")
    d = _parse_int_list(a.c(1))
    if not d or len(d) != 1:
        raise _Unmodelled("index_select dim")
    nd = max(len(x), 1)
    dim = d[0] % nd
    out = list(x)
    if out:
        out[dim] = _numel(idx)
    n_out = _numel(out)
    by.read(_numel(idx), a.type(2)); by.read(n_out, a.type(0)); by.write(n_out, a.type(0))
    return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = index + selected slices read, output written",
                   by.notes(), {"n_out": n_out, "dtype": a.type(0)})


# ----------------------------------------------------------------------------- normalisation backward

def _mask3(s: str) -> list[bool]:
    """output_mask '[True, True, False]' → 3 bools; not recorded / unparsable → unmodelled (never a default)."""
    mask = [_parse_bool(t) for t in re.findall(r"True|False|1|0", s or "")]
    if len(mask) != 3 or None in mask:
        raise _Unmodelled("output_mask not recorded")
    return mask


def _batch_norm_bwd(base: str, a: _Args) -> OpModel:
    if base in ("native_batch_norm_backward", "batch_norm_backward"):
        # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
        #                            train, eps, output_mask); batch_norm_backward(..., update, eps, output_mask, reserve)
        dyi, xi = 0, 1
        train = _parse_bool(a.c(7))
        if train is None:
            raise _Unmodelled("batch_norm_backward training flag not recorded")
        mask = _mask3(a.c(9))
        ri = 10 if base == "batch_norm_backward" else None
    else:
        # cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean, save_var,
        #                           epsilon, reserveSpace); miopen_batch_norm_backward(... epsilon): training-mode
        # gradients from the saved batch statistics, all three gradients computed
        dyi, xi, train, mask = 1, 0, True, [True, True, True]
        ri = 8 if base == "cudnn_batch_norm_backward" else None
    dy, x = a.tensor(dyi, "grad_output"), a.tensor(xi, "input")
    if len(x) < 2 or dy != x:
        raise _Unmodelled("batch_norm_backward shapes")
    N, C = _numel(x), x[1]
    dX, dW, dB = mask
    w = a.is_tensor(2)
    if (dW or dB) and not w:
        raise _Unmodelled("weight/bias gradient requested without a recorded weight")
    # FLOPs/element: x−μ 1 (dX in training, or dW); Σdy 1 (dB, or dX in training); Σdy·(x−μ) 2 (same as x−μ);
    # dX = (dy − mean(dy) − (x−μ)·k)·(invstd·γ) 4 in training, dy·(invstd·γ) 1 in inference; per-channel O(C) not counted
    need_xmu = dW or (train and dX)
    need_sdy = dB or (train and dX)
    fpe = int(need_xmu) + int(need_sdy) + 2 * int(need_xmu) + ((4 if train else 1) if dX else 0)
    by = _Bytes()
    notes = []
    if dX or dW or dB:
        by.read(N, a.type(dyi))
    if need_xmu:
        by.read(N, a.type(xi))
    if dX and w:
        by.read(C, a.type(2))
    if train:
        si, ii = 5, 6
        if need_xmu:
            for i, what in ((si, "save_mean"), (ii, "save_invstd")):
                if not a.is_tensor(i) or _numel(a.shape(i)) != C:
                    raise _Unmodelled(f"{what} not recorded")
                by.read(C, a.type(i))
        notes.append("training: gradients through the batch statistics (saved mean / invstd read)")
    else:
        if dX or dW:
            if not a.is_tensor(4) or (dW and not a.is_tensor(3)):
                raise _Unmodelled("running statistics not recorded")
            by.read(C, a.type(4))
            if dW:
                by.read(C, a.type(3))
        notes.append("inference: running statistics are constants (dX = dy·γ·invstd)")
    if ri is not None and a.is_tensor(ri):
        by.read(_numel(a.shape(ri)), a.type(ri))
        notes.append(f"reserve space {a.shape(ri)} read")
    if dX:
        by.write(N, a.type(xi))
    if dW:
        by.write(C, a.type(2))
    if dB:
        by.write(C, a.type(2))
    parts = [p for p, on in (("dX", dX), ("dγ", dW), ("dβ", dB)) if on]
    notes.append(f"gradients computed (output_mask): {', '.join(parts) or 'none'}")
    return OpModel("batch_norm_bwd", fpe * N, by.r, by.w,
                   f"{fpe}·N (x−μ 1, Σdy 1, Σdy·(x−μ) 2, dX {4 if train else 1} per element, each if needed); "
                   "bytes = dy (+ x, γ, stats) read, dX (+ dγ, dβ) written",
                   tuple(notes) + by.notes(), {"N": N, "C": C, "training": train, "output_mask": mask,
                                               "dtype": a.type(xi)})


def _layer_norm_bwd(a: _Args) -> OpModel:
    # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
    dy, x = a.tensor(0, "grad_out"), a.tensor(1, "input")
    mean, rstd = a.tensor(3, "mean"), a.tensor(4, "rstd")
    if dy != x:
        raise _Unmodelled("layer_norm_backward shapes")
    mask = _mask3(a.c(7))
    N, rows = _numel(x), _numel(mean)
    if rows == 0 or N % rows or _numel(rstd) != rows:
        raise _Unmodelled("layer_norm_backward statistics shape")
    C = N // rows
    ns = _parse_int_list(a.c(2))
    if ns is not None and _numel(ns) != C:
        raise _Unmodelled("normalized_shape inconsistent with mean/rstd")
    dX, dW, dB = mask
    w, b = a.is_tensor(5), a.is_tensor(6)
    if (dW and not w) or (dB and not (b or w)):
        raise _Unmodelled("weight/bias gradient requested without a recorded weight/bias")
    # FLOPs/element: x̂ = (x−μ)·rstd 2 (dX or dγ); g = dy·γ 1 (dX with γ); Σg, Σg·x̂ 3 (dX);
    # dX = rstd·(g − mean(g) − x̂·mean(g·x̂)) 4; dγ = Σdy·x̂ 2; dβ = Σdy 1
    fpe = 2 * int(dX or dW) + (int(w) + 3 + 4) * int(dX) + 2 * int(dW) + int(dB)
    by = _Bytes()
    if dX or dW or dB:
        by.read(N, a.type(0))
    if dX or dW:
        by.read(N, a.type(1)); by.read(rows, a.type(3)); by.read(rows, a.type(4))
    if dX and w:
        by.read(C, a.type(5))
    if dX:
        by.write(N, a.type(1))
    if dW:
        by.write(C, a.type(5))
    if dB:
        by.write(C, a.type(6) if b else a.type(5))
    parts = [p for p, on in (("dX", dX), ("dγ", dW), ("dβ", dB)) if on]
    return OpModel("layer_norm_bwd", fpe * N, by.r, by.w,
                   f"{fpe}·N (x̂ 2, γ·dy 1, row sums 3, dX 4, dγ 2, dβ 1 per element, each if computed); "
                   "bytes = dy (+ x, mean/rstd per row, γ) read, dX (+ dγ, dβ) written",
                   (f"gradients computed (output_mask): {', '.join(parts) or 'none'}",) + by.notes(),
                   {"N": N, "C": C, "rows": rows, "affine": w, "output_mask": mask, "dtype": a.type(1)})


# ----------------------------------------------------------------------------- pooling

def _pool_ints(s: str, sp: int, what: str, empty_ok: bool = False) -> list[int] | None:
    v = _parse_int_list(s)
    if v is None:
        raise _Unmodelled(f"pool {what} not recorded")
    if not v:
        if empty_ok:
            return None
        raise _Unmodelled(f"pool {what} empty")
    if len(v) == 1:
        v = v * sp
    if len(v) != sp:
        raise _Unmodelled(f"pool {what} length")
    return v


def _pool_out(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch pooling_output_shape (ceil mode: the last window must start inside the input or left padding)."""
    o = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def _window_taps(n: int, o_n: int, k: int, s: int, p: int, d: int) -> int:
    """Σ over outputs of the window positions that fall inside the input (padding taps are skipped)."""
    return sum(1 for o in range(o_n) for j in range(k) if 0 <= o * s - p + j * d < n)


def _adaptive_taps(n: int, o_n: int) -> int:
    """Σ over outputs of the adaptive window length: [⌊o·n/o_n⌋, ⌈(o+1)·n/o_n⌉)."""
    return sum(-(-((o + 1) * n) // o_n) - (o * n) // o_n for o in range(o_n))


_POOL_SP = {"max_pool2d": 2, "max_pool2d_with_indices": 2, "max_pool3d_with_indices": 3,
            "max_pool2d_with_indices_backward": 2, "max_pool3d_with_indices_backward": 3,
            "avg_pool2d": 2, "avg_pool3d": 3, "avg_pool2d_backward": 2, "avg_pool3d_backward": 3,
            "adaptive_avg_pool2d": 2, "_adaptive_avg_pool2d": 2, "adaptive_avg_pool3d": 3, "_adaptive_avg_pool3d": 3,
            "_adaptive_avg_pool2d_backward": 2, "_adaptive_avg_pool3d_backward": 3,
            "adaptive_max_pool2d": 2, "adaptive_max_pool3d": 3,
            "adaptive_max_pool2d_backward": 2, "adaptive_max_pool3d_backward": 3}


def _pool(base: str, a: _Args) -> OpModel:
    sp = _POOL_SP[base]
    bwd = base.endswith("_backward")
    xi = 1 if bwd else 0
    x = a.tensor(xi, "self")
    if len(x) not in (sp + 1, sp + 2):
        raise _Unmodelled("pool input rank")
    planes, ins = _numel(x[:-sp]), x[-sp:]
    adaptive = "adaptive" in base
    is_max = "max" in base
    notes = []
    if adaptive:
        if bwd:
            outs = a.tensor(0, "grad_output")[-sp:]
        else:
            outs = _pool_ints(a.c(1), sp, "output_size")
        if len(outs) != sp or any(o <= 0 for o in outs):
            raise _Unmodelled("adaptive pool output size")
        taps = [_adaptive_taps(n, o) for n, o in zip(ins, outs)]
        params = {"output_size": outs}
    else:
        # max: (self, kernel_size, stride, padding, dilation, ceil_mode) — backward: (grad_output, self, ...same)
        # avg: (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        o = xi + 1
        ks = _pool_ints(a.c(o), sp, "kernel_size")
        st = _pool_ints(a.c(o + 1), sp, "stride", empty_ok=True) or ks
        pd = _pool_ints(a.c(o + 2), sp, "padding")
        dl = _pool_ints(a.c(o + 3), sp, "dilation") if is_max else [1] * sp
        ceil = _parse_bool(a.c(o + 4 if is_max else o + 3))
        if ceil is None:
            raise _Unmodelled("pool ceil_mode not recorded")
        outs = [_pool_out(n, k, s, p, d, ceil) for n, k, s, p, d in zip(ins, ks, st, pd, dl)]
        if any(v <= 0 for v in outs):
            raise _Unmodelled("non-positive pool output size")
        taps = [_window_taps(n, on, k, s, p, d) for n, on, k, s, p, d in zip(ins, outs, ks, st, pd, dl)]
        params = {"kernel_size": ks, "stride": st, "padding": pd, "dilation": dl, "ceil_mode": ceil, "output": outs}
    n_in, n_out = planes * _numel(ins), planes * _numel(outs)
    visited = planes * math.prod(taps)
    by = _Bytes()
    dt = a.type(xi)
    if bwd:
        dy = a.tensor(0, "grad_output")
        if _numel(dy) != n_out:
            raise _Unmodelled("grad_output does not match the pooled output shape")
        by.read(n_out, a.type(0))
        if is_max:
            ii = 2 if adaptive else 7
            by.read(n_out, a.type(ii) if a.is_tensor(ii) else "long int")
            # max backward: every dY element is added once at its argmax (self is read for its shape only)
            flops, formula = n_out, "n_out FLOPs (dY added at the argmax); bytes = dY + int64 indices read, dX written"
        else:
            # avg backward: dY/divisor spread over each window (same taps as forward)
            flops, formula = visited + n_out, ("Σ window taps + n_out FLOPs (divide, spread over the window); "
                                               "bytes = dY read, dX written")
        by.write(n_in, dt)
        notes.append("self is read for its shape only")
    else:
        by.read(n_in, dt)
        by.write(n_out, dt)
        if is_max:
            # max: one compare per in-bounds window tap; indices written (int64) except by max_pool2d
            flops = visited
            formula = "Σ in-bounds window taps FLOPs (compare); bytes = x read, y (+ int64 indices) written"
            if base != "max_pool2d":
                by.write(n_out, "long int")
                notes.append("int64 indices written")
        else:
            # avg: one add per in-bounds window tap + one divide per output
            flops = visited + n_out
            formula = "Σ in-bounds window taps (add) + n_out (divide) FLOPs; bytes = x read, y written"
    notes.append(f"{visited} in-bounds window taps over {n_out} outputs (padding taps skipped)")
    return OpModel("pool_bwd" if bwd else "pool", flops, by.r, by.w, formula, tuple(notes) + by.notes(),
                   {"input": x, "n_in": n_in, "n_out": n_out, "taps": visited, "dtype": dt, **params})


# ----------------------------------------------------------------------------- data movement / scatter / loss

def _cat(a: _Args) -> OpModel:
    # cat(Tensor[] tensors, int dim=0) / cat.out(tensors, dim, out): 0 FLOPs; bytes = Σ inputs read + output written
    tl = _tensor_list(a, 0)
    if tl is None:
        raise _Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    shapes, dts = tl
    if dts is None:
        # Kineto records the list's type as 'TensorList' without element dtypes: bytes (the whole model) unknown
        raise _Unmodelled("tensor-list element dtypes not recorded")
    live = [(s, dt) for s, dt in zip(shapes, dts) if s != [0]]      # legacy: 1-D empty tensors are skipped
    if not live or any(len(s) != len(live[0][0]) or not s for s, _ in live):
        raise _Unmodelled("cat shapes")
    nd = len(live[0][0])
    d = _parse_int_list(a.c(1))
    if d is not None:
        if len(d) != 1 or not -nd <= d[0] < nd:
            raise _Unmodelled("cat dim")
        dim = d[0] % nd
        if any(s[i] != live[0][0][i] for s, _ in live for i in range(nd) if i != dim):
            raise _Unmodelled("cat shapes do not match outside dim")
    n = sum(_numel(s) for s, _ in live)
    dt_out = a.type(2) if a.is_tensor(2) else _promote([(dt, nd) for _, dt in live], [])
    by = _Bytes()
    for s, dt in live:
        by.read(_numel(s), dt)
    by.write(n, dt_out)
    return OpModel("copy", 0, by.r, by.w, "0 FLOPs; bytes = Σ inputs·bpe_i + Σ numel·bpe_out",
                   ("data movement: 0 FLOPs",) + by.notes(),
                   {"tensors": len(live), "n": n, "dtypes_in": [dt for _, dt in live], "dtype_out": dt_out})


def _scatter_gather(base: str, a: _Args) -> OpModel:
    by = _Bytes()
    if base == "gather":
        # gather(self, dim, index, sparse_grad): 0 FLOPs; bytes = index + gathered elements read, out (= index shape) written
        a.tensor(0, "self")
        idx = a.tensor(2, "index")
        n = _numel(idx)
        by.read(n, a.type(2)); by.read(n, a.type(0)); by.write(n, a.type(0))
        return OpModel("gather", 0, by.r, by.w, "0 FLOPs; bytes = index + gathered elements read, output written",
                       ("only the gathered elements of self are read",) + by.notes(), {"n_out": n, "dtype": a.type(0)})
    # scatter_add(self, dim, index, src) / scatter(self, dim, index, src|value[, reduce]):
    # FLOPs = numel(index) for add/reduce, 0 for plain scatter; bytes = self read + index + src (index-shaped) read, self written
    x, idx = a.tensor(0, "self"), a.tensor(2, "index")
    n_idx = _numel(idx)
    reduce = base.startswith("scatter_add") or a.n > 4
    if a.n > 4 and not a.c(4).strip():
        raise _Unmodelled("scatter reduce argument not recorded")
    by.read(_numel(x), a.type(0))
    by.read(n_idx, a.type(2))
    if a.is_tensor(3):
        if _numel(a.shape(3)) < n_idx:
            raise _Unmodelled("scatter src smaller than index")
        by.read(n_idx, a.type(3))
    by.write(_numel(x), a.type(0))
    return OpModel("scatter", n_idx if reduce else 0, by.r, by.w,
                   f"{'numel(index)' if reduce else '0'} FLOPs; bytes = self + index + src (index-shaped) read, self written",
                   (("in-place: self read and written",) if base.endswith("_") else ("output = copy of self, scattered into",))
                   + by.notes(), {"n_index": n_idx, "n_self": _numel(x), "dtype": a.type(0)})


def _embedding_bwd(a: _Args) -> OpModel:
    # embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    gy, idx = a.tensor(0, "grad_output"), a.tensor(1, "indices")
    nw = a.c(2).strip()
    if not re.fullmatch(r"\d+", nw or "x"):
        raise _Unmodelled("num_weights not recorded")
    pad = _parse_int_list(a.c(3))
    scale = _parse_bool(a.c(4))
    if pad is None or len(pad) != 1 or scale is None:
        raise _Unmodelled("padding_idx / scale_grad_by_freq not recorded")
    if pad[0] >= 0:
        raise _Unmodelled("padding_idx set: the rows skipped depend on the index values")
    n_idx = _numel(idx)
    if not gy or _numel(gy) != n_idx * gy[-1]:
        raise _Unmodelled("grad_output does not match indices")
    D, V = gy[-1], int(nw)
    # FLOPs = n_idx·D adds (each dY row accumulated into its weight row) (+ n_idx·D scale by 1/freq);
    # bytes = dY + indices read, the full V×D weight gradient written
    flops = n_idx * D * (2 if scale else 1)
    by = _Bytes()
    by.read(n_idx * D, a.type(0)); by.read(n_idx, a.type(1)); by.write(V * D, a.type(0))
    return OpModel("embedding_bwd", flops, by.r, by.w,
                   f"{'2' if scale else ''}{'·' if scale else ''}n_idx·D FLOPs; bytes = dY + indices read, V·D weight gradient written",
                   ("index sort / de-duplication work not counted",) + (("scale_grad_by_freq: 1 multiply per element",) if scale else ())
                   + by.notes(), {"n_idx": n_idx, "D": D, "num_weights": V, "dtype": a.type(0)})


def _mse_loss(base: str, a: _Args) -> OpModel:
    if base == "mse_loss_backward":
        # mse_loss_backward(grad_output, self, target, reduction[, grad_input out]): dX = norm·(x − t)·dy
        gy, x, t = a.tensor(0, "grad_output"), a.tensor(1, "self"), a.tensor(2, "target")
        out = _broadcast([gy, x, t])
        n = _numel(out)
        dt = a.type(4) if a.is_tensor(4) and a.shape(4) == out else _promote([(a.type(1), len(x)), (a.type(2), len(t))], [])
        by = _Bytes()
        by.read(_numel(gy), a.type(0)); by.read(_numel(x), a.type(1)); by.read(_numel(t), a.type(2))
        by.write(n, dt)
        # 3·n FLOPs (sub, ·norm, ·dy); bytes = dy + x + target read, dX written
        return OpModel("elementwise_ternary", 3 * n, by.r, by.w,
                       "3·n FLOPs (sub, ·norm, ·dY); bytes = dY + self + target read, dX written", by.notes(),
                       {"shape_out": out, "dtype_out": dt})
    # mse_loss(self, target, reduction): 2·n FLOPs (sub, square) + n (sum) unless reduction='none';
    # bytes = self + target read, n (none) or 1 (mean/sum) element written
    x, t = a.tensor(0, "self"), a.tensor(1, "target")
    red = a.c(2).strip()
    if red not in ("0", "1", "2"):
        raise _Unmodelled("mse_loss reduction not recorded")
    out = _broadcast([x, t])
    n = _numel(out)
    dt = _promote([(a.type(0), len(x)), (a.type(1), len(t))], [])
    by = _Bytes()
    by.read(_numel(x), a.type(0)); by.read(_numel(t), a.type(1))
    by.write(n if red == "0" else 1, dt)
    fl = 2 * n + (0 if red == "0" else n)
    return OpModel("elementwise_binary" if red == "0" else "reduce", fl, by.r, by.w,
                   f"{'2' if red == '0' else '3'}·n FLOPs (sub, square{'' if red == '0' else ', sum'}); "
                   f"bytes = self + target read, {'n' if red == '0' else '1'} element(s) written",
                   (f"reduction = {({'0': 'none', '1': 'mean', '2': 'sum'})[red]}",) + by.notes(),
                   {"n": n, "reduction": red, "dtype_out": dt})


# ----------------------------------------------------------------------------- optimizers

def _tensor_list(a: _Args, i: int) -> tuple[list[list[int]], list[str] | None] | None:
    d = a.dims[i] if i < len(a.dims) else None
    if not (isinstance(d, list) and d and all(isinstance(s, list) and all(isinstance(x, int) for x in s) for s in d)):
        return None
    t = a.types[i] if i < len(a.types) else None
    dts = list(t) if isinstance(t, list) and len(t) == len(d) else None
    return d, dts


_FOREACH_FPE = {"add": 1, "sub": 1, "mul": 1, "div": 1, "maximum": 1, "minimum": 1, "clamp_min": 1, "clamp_max": 1,
                "neg": 1, "sqrt": 1, "rsqrt": 1, "exp": 1, "log": 1, "abs": 1, "reciprocal": 1, "sign": 1,
                "sigmoid": 1, "pow": 1, "addcmul": 3, "addcdiv": 3, "lerp": 3, "norm": 2, "copy": 0, "zero": 0}


def _foreach(base: str, a: _Args) -> OpModel:
    op = base[len("_foreach_"):]
    inplace = op.endswith("_")
    op = op.rstrip("_")
    if op not in _FOREACH_FPE:
        raise _Unmodelled("foreach op")
    lists = [(i, tl) for i in range(a.n) if (tl := _tensor_list(a, i)) is not None]
    if not lists or lists[0][0] != 0:
        raise _Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    shapes0, dts0 = lists[0][1]
    numels = [_numel(s) for s in shapes0]
    n = sum(numels)
    by = _Bytes()

    def rw(kind, shapes, dts):
        for j, s in enumerate(shapes):
            dt = dts[j] if dts else "TensorList"
            (by.read if kind == "r" else by.write)(_numel(s), dt)

    for k, (i, (shapes, dts)) in enumerate(lists):
        if op == "zero" or (op == "copy" and k == 0):
            continue
        rw("r", shapes, dts)
    if op == "norm":
        for _ in shapes0:
            by.write(1, (dts0 or ["float"])[0] if dts0 else "TensorList")
    else:
        rw("w", shapes0, dts0)
    fpe = _FOREACH_FPE[op]
    return OpModel("foreach", fpe * n, by.r, by.w,
                   f"{fpe}·Σnumel FLOPs over {len(numels)} tensors; bytes = Σ list tensors read + results written",
                   (("in-place",) if inplace else ()) + by.notes(), {"tensors": len(numels), "numel": n})


def _fused_optimizer(base: str, a: _Args) -> OpModel:
    lists = [(i, tl) for i in range(a.n) if (tl := _tensor_list(a, i)) is not None]
    if not lists or lists[0][0] != 0:
        raise _Unmodelled("tensor-list shapes not recorded (Kineto writes [] for TensorList)")
    params, dts = lists[0][1]
    n = sum(_numel(s) for s in params)
    by = _Bytes()
    notes = []
    if base in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"):
        # (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2, weight_decay, ...)
        wd = _parse_float(a.c(9), None)
        fpe = 13 + ((1 if "adamw" in base else 2) if wd else 0)
        written = [0, 2, 3]
        amsgrad_list = [tl for i, tl in lists if i == 4 and tl[0]]
        if amsgrad_list:
            written.append(4)
            fpe += 1
        for i, (shapes, dtl) in lists:
            if i == 5:   # state_steps: one element each
                for j, _ in enumerate(shapes):
                    by.read(1, dtl[j] if dtl else "TensorList"); by.write(1, dtl[j] if dtl else "TensorList")
                continue
            for j, s in enumerate(shapes):
                dt = dtl[j] if dtl else "TensorList"
                by.read(_numel(s), dt)
                if i in written:
                    by.write(_numel(s), dt)
        notes.append(f"≈{fpe} FLOPs/element (moment updates, bias correction, sqrt, divide, step"
                     f"{', weight decay' if wd else ''})")
        model = "fused_adam"
    else:  # _fused_sgd_(params, grads, momentum_buffer_list, weight_decay, momentum, lr, ...)
        wd, mom = _parse_float(a.c(3), None), _parse_float(a.c(4), None)
        fpe = 2 + (2 if wd else 0) + (3 if mom else 0)
        for i, (shapes, dtl) in lists:
            for j, s in enumerate(shapes):
                dt = dtl[j] if dtl else "TensorList"
                by.read(_numel(s), dt)
                if i in (0, 2):
                    by.write(_numel(s), dt)
        model = "fused_sgd"
    return OpModel(model, fpe * n, by.r, by.w,
                   f"{fpe}·Σnumel(params); bytes = Σ state lists read, params and optimizer state written",
                   tuple(notes) + by.notes(), {"tensors": len(params), "numel": n})


# ----------------------------------------------------------------------------- dispatch

MODELLED_OPS: frozenset[str] = frozenset()


def _dispatch(name: str, a: _Args) -> OpModel | None:
    base = name.split("::", 1)[1] if name.startswith("aten::") else None
    if base is None:
        return None
    if base in ("mm", "addmm", "bmm", "baddbmm"):
        return _gemm(base, a)
    if base == "_scaled_mm":
        return _scaled_mm(a)
    if base in _ATTN:
        return _attention(base, a)
    if base in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
                "miopen_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                "cudnn_convolution_transpose"):
        return _conv_fwd(base, a)
    if base == "convolution_backward":
        return _conv_bwd(a)
    if base in ("copy_", "to", "_to_copy"):
        return _copy(base, a)
    if base in _REDUCE:
        return _reduce(base, a)
    if base in ("softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
                "_log_softmax_backward_data"):
        return _softmax(base, a)
    if base in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "batch_norm",
                "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm"):
        return _norm(base, a)
    if base in ("native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward",
                "miopen_batch_norm_backward"):
        return _batch_norm_bwd(base, a)
    if base == "native_layer_norm_backward":
        return _layer_norm_bwd(a)
    if base in ("embedding", "index_select"):
        return _gather(base, a)
    if base == "embedding_dense_backward":
        return _embedding_bwd(a)
    if base in _POOL_SP:
        return _pool(base, a)
    if base in ("cat", "_cat"):
        return _cat(a)
    if base in ("gather", "scatter", "scatter_", "scatter_add", "scatter_add_"):
        return _scatter_gather(base, a)
    if base in ("mse_loss", "mse_loss_backward"):
        return _mse_loss(base, a)
    if base.startswith("_foreach_"):
        return _foreach(base, a)
    if base in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw", "_fused_sgd_", "_fused_sgd"):
        return _fused_optimizer(base, a)
    inplace = base.endswith("_") and not base.startswith("_")
    core = base[:-1] if inplace else base
    if core in _UNARY or core in _BINARY or core in _TERNARY or core in ("pow", "fill", "zero", "clone"):
        if core in ("fill", "zero"):
            inplace = True
        return _elementwise(core, inplace, a)
    return None


def model_for(name: str, input_dims: Any, input_types: Any, concrete_inputs: Any = None) -> OpModel | None:
    """Perf model of one recorded op, or None (no model, or the record cannot be modelled exactly).

    ``input_dims`` / ``input_types`` / ``concrete_inputs`` are Kineto's 'Input Dims', 'Input type',
    'Concrete Inputs' — as JSON text (the ``cpu_ops`` columns) or already-parsed lists.
    """
    try:
        a = _Args(input_dims, input_types, concrete_inputs)
        return _dispatch(name or "", a)
    except (_Unmodelled, ValueError, TypeError, IndexError, ZeroDivisionError):
        return None


MODELLED_OPS = frozenset(
    ["aten::" + n for n in ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "convolution", "_convolution",
                            "conv1d", "conv2d", "conv3d", "cudnn_convolution", "miopen_convolution",
                            "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                            "cudnn_convolution_transpose", "convolution_backward", "copy_", "to", "_to_copy",
                            "softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
                            "_log_softmax_backward_data", "layer_norm", "native_layer_norm", "rms_norm",
                            "_fused_rms_norm", "batch_norm", "native_batch_norm", "cudnn_batch_norm",
                            "miopen_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                            "group_norm", "native_group_norm", "embedding", "index_select", "_fused_adam_",
                            "_fused_adamw_", "_fused_sgd_", "fill_", "zero_", "clone", "pow", "pow_",
                            "native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward",
                            "miopen_batch_norm_backward", "native_layer_norm_backward", "embedding_dense_backward",
                            "cat", "_cat", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_",
                            "mse_loss", "mse_loss_backward")]
    + ["aten::" + n for n in _POOL_SP]
    + ["aten::" + n for n in _ATTN] + ["aten::" + n for n in _REDUCE]
    + ["aten::" + n for n in _UNARY | _BINARY | set(_TERNARY)]
    + ["aten::" + n + "_" for n in _UNARY | _BINARY | set(_TERNARY)]
)
