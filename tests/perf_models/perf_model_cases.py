"""Shorthands of the perf model tests: dtype names as Kineto writes them, and `m`, one op record through model_for."""
from __future__ import annotations

import json

from gpuscope.tools.perf_models import OpModel, model_for

BF16, F32, F16 = "c10::BFloat16", "float", "c10::Half"
MiB = 2 ** 20


def m(name, dims, types, conc=None) -> OpModel | None:
    conc = conc if conc is not None else [""] * len(dims)
    return model_for(name, json.dumps(dims), json.dumps(types), json.dumps(conc))
