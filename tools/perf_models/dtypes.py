"""Bytes per element for the dtype strings Kineto writes in ``Input type``.

Kineto writes C++ type names: ``float``, ``double``, ``c10::Half``, ``c10::BFloat16``,
``c10::Float8_e4m3fn`` ..., ``bool``, ``long int``, ``c10::complex<float>`` ... .  Unknown strings
(``Scalar``, ``ScalarList``, ``TensorList``, ``''``, new types) give ``None`` — never NaN, never a
guess.  Lookup is case-insensitive and ignores a ``c10::`` / ``at::`` / ``std::`` prefix and spaces.
"""
from __future__ import annotations

import re

_BPE = {
    # floating point
    "double": 8, "float64": 8,
    "float": 4, "float32": 4,
    "half": 2, "float16": 2,
    "bfloat16": 2,
    # 8-bit floats (one byte each)
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float8_e8m0": 1, "fp8": 1,
    # packed 4-bit float pair: one byte holds two values, bytes are per *stored element*
    "float4_e2m1fn_x2": 1,
    # integers
    "bool": 1,
    "signed char": 1, "int8": 1, "qint8": 1,
    "unsigned char": 1, "uint8": 1, "quint8": 1, "quint4x2": 1, "quint2x4": 1,
    "short": 2, "short int": 2, "int16": 2, "unsigned short": 2, "uint16": 2,
    "int": 4, "int32": 4, "unsigned int": 4, "uint32": 4, "qint32": 4,
    "long": 8, "long int": 8, "long long": 8, "long long int": 8, "int64": 8,
    "unsigned long": 8, "unsigned long int": 8, "uint64": 8,
    # complex
    "complex<half>": 4, "complex32": 4,
    "complex<float>": 8, "complex64": 8,
    "complex<double>": 16, "complex128": 16,
}

_PREFIX = re.compile(r"\b(?:c10|at|std)::")


def normalize_dtype(s: object) -> str | None:
    """Canonical lower-case key for a Kineto type string, or None when ``s`` is not a string."""
    if not isinstance(s, str):
        return None
    k = _PREFIX.sub("", s.strip()).lower()
    k = re.sub(r"\s*([<>,])\s*", r"\1", k)
    k = re.sub(r"\s+", " ", k)
    if k.startswith("torch."):
        k = k[6:]
    return k


def bytes_per_element(dtype: object) -> int | None:
    """Bytes per element of a Kineto ``Input type`` string; None when unknown (never NaN)."""
    k = normalize_dtype(dtype)
    if not k:
        return None
    return _BPE.get(k)


def is_floating(dtype: object) -> bool:
    k = normalize_dtype(dtype) or ""
    return k in {"double", "float64", "float", "float32", "half", "float16", "bfloat16"} or k.startswith("float8") or k.startswith("float4") or k == "fp8"


def is_complex(dtype: object) -> bool:
    return (normalize_dtype(dtype) or "").startswith("complex")


def is_bool(dtype: object) -> bool:
    return normalize_dtype(dtype) == "bool"


def is_fp8(dtype: object) -> bool:
    k = normalize_dtype(dtype) or ""
    return k.startswith("float8") or k == "fp8"


def accumulate_dtype(dtype: str) -> str:
    """CUDA accumulation type (``at::acc_type``): half/bf16/fp8 → float, double stays double."""
    k = normalize_dtype(dtype) or ""
    return "double" if k in ("double", "float64") else "float"


# c10::ScalarType enum values as recorded in Concrete Inputs for dtype arguments (``out_dtype=``,
# ``dtype=``).  Values from c10/core/ScalarType.h (stable since 2.1).
SCALAR_TYPE_ENUM = {
    0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int",
    5: "c10::Half", 6: "float", 7: "double", 8: "c10::complex<c10::Half>",
    9: "c10::complex<float>", 10: "c10::complex<double>", 11: "bool", 12: "c10::qint8",
    13: "c10::quint8", 14: "c10::qint32", 15: "c10::BFloat16", 16: "c10::quint4x2",
    17: "c10::quint2x4", 23: "c10::Float8_e5m2", 24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz", 26: "c10::Float8_e4m3fnuz", 27: "unsigned short",
    28: "unsigned int", 29: "unsigned long", 44: "c10::Float8_e8m0fnu",
    45: "c10::Float4_e2m1fn_x2",
}

_NAME_TO_TYPE = {
    "torch.float32": "float", "torch.float": "float", "torch.float16": "c10::Half",
    "torch.half": "c10::Half", "torch.bfloat16": "c10::BFloat16", "torch.float64": "double",
    "torch.double": "double", "torch.int64": "long int", "torch.long": "long int",
    "torch.int32": "int", "torch.int": "int", "torch.int16": "short int", "torch.int8": "signed char",
    "torch.uint8": "unsigned char", "torch.bool": "bool",
    "torch.float8_e4m3fn": "c10::Float8_e4m3fn", "torch.float8_e5m2": "c10::Float8_e5m2",
    "torch.float8_e4m3fnuz": "c10::Float8_e4m3fnuz", "torch.float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
}


def dtype_from_concrete(value: object) -> str | None:
    """Kineto type string for a recorded ScalarType argument ('15', 15, 'torch.bfloat16'); None if absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return SCALAR_TYPE_ENUM.get(value)
    if isinstance(value, str):
        v = value.strip()
        if re.fullmatch(r"\d+", v):
            return SCALAR_TYPE_ENUM.get(int(v))
        return _NAME_TO_TYPE.get(v.lower())
    return None
