"""Which model answers which op: the families' op tables (one module per family) in one registry.

``model_for(name, input_dims, input_types, concrete_inputs)`` → :class:`OpModel` or ``None``.

    gemm.py         mm, addmm, bmm, baddbmm, _scaled_mm
    attention.py    SDPA and the flash / efficient / cuDNN attention ops, forward and backward
    conv.py         convolution forward and backward
    reduction.py    sum, mean, max, norm, cumsum, ...; softmax; MSE loss
    norm.py         layer / RMS / batch / group norm; batch and layer norm backward
    indexing.py     embedding, index_select, gather / scatter, cat, embedding backward
    pooling.py      max / average / adaptive pooling, forward and backward
    optimizers.py   _foreach_* list ops, fused Adam / AdamW / SGD
    elementwise.py  copies and casts; unary / binary / ternary elementwise ops, in place or not
    base.py         what they share: OpModel, argument access, bytes per dtype, type promotion

Each name is in one family's table (a name in two is refused at import); every name starting with ``_foreach_`` is an
optimizer list op."""
from __future__ import annotations

from typing import Any, Callable

from . import attention, conv, elementwise, gemm, indexing, norm, optimizers, pooling, reduction
from .base import Args, OpModel, Unmodelled

__all__ = ["model_for", "MODELLED_OPS"]

Model = Callable[[str, Args], OpModel]


def _registry() -> dict[str, Model]:
    ops: dict[str, Model] = {}
    for family in (gemm, attention, conv, reduction, norm, indexing, pooling, optimizers, elementwise):
        table = family.OPS
        if ops.keys() & table.keys():
            raise RuntimeError(f"perf models: {sorted(ops.keys() & table.keys())} in two families' tables")
        ops.update(table)
    return ops


_MODELS = _registry()
# The exact aten names a model answers (the _foreach_* list ops aside: any name with that prefix).
MODELLED_OPS: frozenset[str] = frozenset("aten::" + base for base in _MODELS)


def model_for(name: str, input_dims: Any, input_types: Any, concrete_inputs: Any = None) -> OpModel | None:
    """Perf model of one recorded op, or None (no model, or the record cannot be modelled exactly).

    ``input_dims`` / ``input_types`` / ``concrete_inputs`` are Kineto's 'Input Dims', 'Input type',
    'Concrete Inputs' — as JSON text (the ``cpu_ops`` columns) or already-parsed lists.
    """
    if not (name or "").startswith("aten::"):
        return None
    base = name.split("::", 1)[1]
    model = _MODELS.get(base) or (optimizers.foreach if base.startswith("_foreach_") else None)
    if model is None:
        return None
    try:
        return model(base, Args(input_dims, input_types, concrete_inputs))
    except (Unmodelled, ValueError, TypeError, IndexError, ZeroDivisionError):
        return None
