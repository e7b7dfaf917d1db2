"""GEMM: mm, addmm, bmm, baddbmm and _scaled_mm (FP8)."""
from __future__ import annotations

from .base import OpModel, Unmodelled, Args, Bytes, numel
from .dtypes import dtype_from_concrete


def _gemm_out_dtype(a: Args, default: str, out_shape: list[int], first_extra: int, dtype_pos: int | None,
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


def _gemm(name: str, a: Args) -> OpModel:
    base = name
    notes: list[str] = []
    bias_shape = None
    if base in ("mm", "addmm"):
        off = 1 if base == "addmm" else 0
        A, B = a.tensor(off, "mat1"), a.tensor(off + 1, "mat2")
        if len(A) != 2 or len(B) != 2 or A[1] != B[0]:
            raise Unmodelled("mm shapes")
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
            raise Unmodelled("bmm shapes")
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
    by = Bytes()
    by.read(batch * M * K, a.type(off))
    by.read(batch * K * N, a.type(off + 1))
    by.write(batch * M * N, dt_out)
    formula = "2·B·M·N·K"
    if bias_shape is not None:
        flops += batch * M * N
        by.read(numel(bias_shape), a.type(0))
        formula += " + B·M·N (bias add)"
        notes.append(f"bias {bias_shape} read once; beta/alpha scaling not counted")
    return OpModel("gemm", flops, by.r, by.w,
                   f"{formula}; bytes = A·bpeA + B·bpeB + C·bpeOut (+ bias)",
                   tuple(notes) + by.notes(),
                   {"B": batch, "M": M, "N": N, "K": K, "bias": bias_shape is not None,
                    "dtype_A": a.type(off), "dtype_B": a.type(off + 1), "dtype_out": dt_out})


def _scaled_mm(a: Args) -> OpModel:
    # _scaled_mm(mat1, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum)
    A, B = a.tensor(0, "mat1"), a.tensor(1, "mat2")
    if len(A) != 2 or len(B) != 2 or A[1] != B[0]:
        raise Unmodelled("_scaled_mm shapes")
    M, K, N = A[0], A[1], B[1]
    notes = []
    dt_out = dtype_from_concrete(a.c(6)) if a.n > 6 else None
    if dt_out:
        notes.append(f"output dtype {dt_out} from out_dtype argument")
    else:
        dt_out = a.type(0)
        notes.append("no out_dtype recorded: output dtype = mat1 dtype (PyTorch default)")
    by = Bytes()
    by.read(M * K, a.type(0))
    by.read(K * N, a.type(1))
    for i in (2, 3, 5):
        if a.is_tensor(i):
            by.read(numel(a.shape(i)), a.type(i))
    flops = 2 * M * N * K
    bias = a.is_tensor(4)
    if bias:
        by.read(numel(a.shape(4)), a.type(4))
        flops += M * N
    by.write(M * N, dt_out)
    return OpModel("gemm_scaled", flops, by.r, by.w,
                   "2·M·N·K (+ M·N bias); bytes = A + B + scales (+ bias) + C·bpe(out_dtype)",
                   tuple(notes) + ("scaling multiplies (per tensor/row) not counted as FLOPs",) + by.notes(),
                   {"B": 1, "M": M, "N": N, "K": K, "bias": bias, "dtype_A": a.type(0),
                    "dtype_B": a.type(1), "dtype_out": dt_out})


# aten base name -> its model, for models.py's registry
OPS = {**{b: _gemm for b in ("mm", "addmm", "bmm", "baddbmm")}, "_scaled_mm": lambda base, a: _scaled_mm(a)}
