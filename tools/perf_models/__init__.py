"""Analytic FLOPs / bytes models of PyTorch (aten) CPU ops from their Kineto record: ``model_for`` (models.py, which
lists the families, one module each).

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
from .attention import causal_pairs
from .base import OpModel
from .dtypes import bytes_per_element, dtype_from_concrete
from .models import MODELLED_OPS, model_for

__all__ = ["OpModel", "model_for", "causal_pairs", "bytes_per_element", "dtype_from_concrete", "MODELLED_OPS"]
