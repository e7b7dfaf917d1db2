"""Analytic FLOPs / bytes models of PyTorch aten ops (pure functions over Kineto op records)."""
from .dtypes import bytes_per_element, dtype_from_concrete
from .models import MODELLED_OPS, OpModel, causal_pairs, model_for

__all__ = ["OpModel", "model_for", "causal_pairs", "bytes_per_element", "dtype_from_concrete", "MODELLED_OPS"]
