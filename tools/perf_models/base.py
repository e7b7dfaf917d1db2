"""The parts every op model shares: the OpModel result, the Unmodelled refusal, access to a Kineto record's
arguments (Args), byte accounting per dtype (Bytes), argument parsing and torch's type promotion."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from .dtypes import bytes_per_element, is_bool, is_complex, is_floating, normalize_dtype


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


class Unmodelled(Exception):
    """Raised inside a model when the record cannot be modelled exactly; model_for returns None."""


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
            raise Unmodelled("unparsable JSON")
        return list(out) if isinstance(out, (list, tuple)) else []
    raise Unmodelled("unsupported argument container")


_NON_TENSOR_TYPES = {"scalar", "scalarlist", "tensorlist", "genericlist", "", "device", "layout",
                     "scalartype", "memoryformat", "string", "none"}


class Args:
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
            raise Unmodelled(f"argument {i} ({what}) is not a recorded tensor")
        return self.shape(i)

    def c(self, i) -> str:
        v = self.conc[i] if i < len(self.conc) else ""
        return v if isinstance(v, str) else ("" if v is None else str(v))

    def is_scalar(self, i) -> bool:
        return i < self.n and normalize_dtype(self.type(i)) == "scalar"


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


class Bytes:
    """Accumulates read/written bytes; any unknown dtype poisons the sum to None."""

    def __init__(self):
        self.r: int | None = 0
        self.w: int | None = 0
        self.unknown: list[str] = []

    def read(self, n: int, dtype: str):
        self.r = self._add(self.r, n, dtype)

    def write(self, n: int, dtype: str):
        self.w = self._add(self.w, n, dtype)

    def _add(self, total: int | None, n: int, dtype: str) -> int | None:
        b = bytes_per_element(dtype)
        if b is None:
            self.unknown.append(dtype)
            return None
        return None if total is None else total + n * b

    def notes(self) -> tuple[str, ...]:
        if not self.unknown:
            return ()
        return (f"bytes unknown: no element size for dtype(s) {sorted(set(map(repr, self.unknown)))}",)


def parse_bool(s: str, default: bool | None = None) -> bool | None:
    s = (s or "").strip().lower()
    if s in ("true", "1"):
        return True
    if s in ("false", "0"):
        return False
    return default


def parse_float(s: str, default: float | None = None) -> float | None:
    try:
        return float(s)
    except (TypeError, ValueError):
        return default


_INT_LIST = re.compile(r"^[\[\(]?\s*(-?\d+(\s*,\s*-?\d+)*)?\s*,?\s*[\]\)]?$")


def parse_int_list(s: str) -> list[int] | None:
    """'[-1, -2]', '(0, 1)', '-1', '[]' → ints; '' / 'None' → None; anything else raises."""
    s = (s or "").strip()
    if s == "" or s.lower() == "none":
        return None
    if not _INT_LIST.match(s):
        raise Unmodelled(f"unparsable int list {s!r}")
    return [int(x) for x in re.findall(r"-?\d+", s)]


def broadcast(shapes: Sequence[Sequence[int]]) -> list[int]:
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
                    raise Unmodelled(f"shapes {shapes} do not broadcast")
                size = d
        out.append(size)
    return out


def category(dtype: str) -> int:
    if is_bool(dtype):
        return 0
    if is_complex(dtype):
        return 3
    if is_floating(dtype):
        return 2
    return 1


def promote(tensors: list[tuple[str, int]], scalar_kinds: list[int]) -> str:
    """torch.result_type for (dtype, ndim) tensors plus Python scalars (category 1 int, 2 float, 3 complex).

    Dimensioned tensors win; 0-dim tensors and scalars participate only if of a higher category.
    """
    dim = [d for d, nd in tensors if nd > 0]
    zero = [d for d, nd in tensors if nd == 0]

    def best(ds):
        # widest within highest category
        cat = max(category(d) for d in ds)
        cands = [d for d in ds if category(d) == cat]
        return max(cands, key=lambda d: bytes_per_element(d) or 0)

    res = best(dim) if dim else (best(zero) if zero else None)
    if res is None:
        return "float" if max(scalar_kinds, default=2) >= 2 else "long int"
    if zero and category(best(zero)) > category(res):
        res = best(zero)
    top_scalar = max(scalar_kinds, default=-1)
    if top_scalar > category(res):
        res = {1: "long int", 2: "float", 3: "c10::complex<float>"}[top_scalar]
    return res


def scalar_kind(s: str) -> int:
    s = (s or "").strip()
    if s in ("True", "False"):
        return 0
    if re.fullmatch(r"-?\d+", s):
        return 1
    if "j" in s or "(" in s:
        return 3
    return 2


def tensor_list(a: Args, i: int) -> tuple[list[list[int]], list[str] | None] | None:
    d = a.dims[i] if i < len(a.dims) else None
    if not (isinstance(d, list) and d and all(isinstance(s, list) and all(isinstance(x, int) for x in s) for s in d)):
        return None
    t = a.types[i] if i < len(a.types) else None
    dts = list(t) if isinstance(t, list) and len(t) == len(d) else None
    return d, dts
