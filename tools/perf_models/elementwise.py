"""Elementwise ops (unary, binary, ternary, in place or not) and copies / casts."""
from __future__ import annotations

import re

from .base import OpModel, Unmodelled, Args, Bytes, numel, broadcast, category, promote, scalar_kind
from .dtypes import dtype_from_concrete, normalize_dtype


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


def elementwise(base: str, inplace: bool, a: Args) -> OpModel:
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
        raise Unmodelled("where(condition) without tensors")
    in_idx = [i for i in range(min(n_in, a.n)) if a.is_tensor(i)]
    if not in_idx or in_idx[0] != 0:
        if base == "rsub" or base == "where":
            pass
        if not in_idx:
            raise Unmodelled("no tensor inputs")
    shapes = [a.shape(i) for i in in_idx]
    out_shape = a.shape(0) if inplace else broadcast(shapes)
    if inplace and broadcast(shapes + [out_shape]) != out_shape:
        raise Unmodelled("in-place op output does not match self")
    n_out = numel(out_shape)
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
            scal = [scalar_kind(a.c(i)) for i in range(1, min(n_in, a.n)) if a.is_scalar(i)]
            if base == "where":
                scal = [scalar_kind(a.c(i)) for i in (1, 2) if a.is_scalar(i)]
            out_dtype = promote(tens, scal) if tens else a.type(0)
            if base in _FLOAT_OUT and category(out_dtype) < 2:
                out_dtype = "float"
    by = Bytes()
    if base not in ("fill", "zero"):
        for i in in_idx:
            by.read(numel(a.shape(i)), a.type(i))
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


def _copy(base: str, a: Args) -> OpModel:
    notes = ["data movement: 0 FLOPs"]
    if base == "copy_":
        dst, src = a.tensor(0, "self"), a.tensor(1, "src")
        n_out, n_in, dt_in, dt_out = numel(dst), numel(src), a.type(1), a.type(0)
    else:
        x = a.tensor(0, "self")
        n_in = n_out = numel(x)
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
    by = Bytes()
    by.read(n_in, dt_in)
    by.write(n_out, dt_out)
    if normalize_dtype(dt_in) != normalize_dtype(dt_out):
        notes.append(f"cast {dt_in} → {dt_out}")
    return OpModel("copy", 0, by.r, by.w, "0 FLOPs; bytes = n_src·bpe_src + n_dst·bpe_dst",
                   tuple(notes) + by.notes(), {"n": n_out, "dtype_in": dt_in, "dtype_out": dt_out})


def _ops() -> dict:
    """aten base name -> its model, for models.py's registry: the copies, each elementwise name and its in-place form
    (a trailing '_', for names not starting with '_'); fill and zero write in place under either name."""
    ops = {b: _copy for b in ("copy_", "to", "_to_copy")}
    for core in sorted(_UNARY | _BINARY | set(_TERNARY) | {"pow", "fill", "zero", "clone"}):
        ops[core] = (lambda base, a, core=core: elementwise(core, core in ("fill", "zero"), a))
        if not core.startswith("_"):
            ops[core + "_"] = (lambda base, a, core=core: elementwise(core, True, a))
    return ops


OPS = _ops()
