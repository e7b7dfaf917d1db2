"""Optimizer models (optimizers.py): _foreach_* list ops and fused Adam / AdamW."""
from __future__ import annotations

from perf_model_cases import F32, m
from gpuscope.tools.perf_models import model_for


def test_foreach_and_fused_adam_sum_over_lists():
    shapes = [[10, 10], [5]]
    r = model_for("aten::_foreach_add_", [shapes, shapes, []], [[F32, F32], [F32, F32], "Scalar"], ["", "", "1"])
    assert r.flops == 105 and r.bytes_read == 2 * 105 * 4 and r.bytes_written == 105 * 4
    # Kineto writes [] for TensorList shapes → no model rather than zeros
    assert m("aten::_foreach_add_", [[], [], []], ["TensorList", "TensorList", "Scalar"], ["", "", "-0.001"]) is None
    lists = [shapes, shapes, shapes, shapes, [], [[], []]]
    types = [[F32, F32]] * 4 + [[], [F32, F32]] + ["Scalar"] * 9
    conc = [""] * 6 + ["0.001", "0.9", "0.999", "0.01", "1e-8", "False", "False", "", ""]
    r = model_for("aten::_fused_adamw_", lists + [[]] * 9, types, conc)
    assert r.flops == 14 * 105                    # 13 + 1 (decoupled weight decay)
    assert r.bytes_read == 4 * 105 * 4 + 2 * 4    # p, g, m, v + 2 steps
    assert r.bytes_written == 3 * 105 * 4 + 2 * 4
