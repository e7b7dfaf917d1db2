"""Index-driven data movement models (indexing.py): embedding, index_select, cat, gather / scatter, embedding backward."""
from __future__ import annotations

from perf_model_cases import BF16, F32, m
from gpuscope.tools.perf_models import model_for


def test_embedding_and_index_select():
    r = m("aten::embedding", [[30522, 512], [1, 141], [], [], []], [BF16, "long int", "Scalar", "Scalar", "Scalar"])
    assert r.flops == 0 and r.bytes_read == 141 * 8 + 141 * 512 * 2 and r.bytes_written == 141 * 512 * 2
    r = m("aten::index_select", [[100, 64], [], [7]], [F32, "Scalar", "long int"], ["", "0", ""])
    assert r.bytes_read == 7 * 8 + 7 * 64 * 4 and r.bytes_written == 7 * 64 * 4


def test_cat_bytes_only():
    # per-tensor dtypes recorded: read 6 fp32 + 12 bf16, write 18 in the promoted dtype (fp32)
    r = model_for("aten::cat", [[[2, 3], [4, 3]], []], [[F32, BF16], "Scalar"], ["", "0"])
    assert r.flops == 0 and r.bytes_read == 6 * 4 + 12 * 2 and r.bytes_written == 18 * 4
    r = model_for("aten::cat", [[[16, 16, 559, 32], [16, 16, 559, 32]], []], [[BF16, BF16], "Scalar"], ["", "-1"])
    n = 16 * 16 * 559 * 32
    assert r.bytes_read == 2 * n * 2 and r.bytes_written == 2 * n * 2
    # legacy empty 1-D tensors are skipped
    r = model_for("aten::cat", [[[0], [3, 2]], []], [[F32, F32], "Scalar"], ["", "0"])
    assert r.bytes_total == 2 * 6 * 4


def test_cat_missing_arguments_are_none():
    # Kineto writes 'TensorList' with no element dtypes: the bytes (the whole model) are unknown → no model
    assert model_for("aten::cat", [[[2, 3], [4, 3]], []], ["TensorList", "Scalar"], ["", "0"]) is None
    assert m("aten::cat", [[], []], ["TensorList", "Scalar"], ["", "0"]) is None          # shapes not recorded
    assert model_for("aten::cat", [[[2, 3], [4, 4]], []], [[F32, F32], "Scalar"], ["", "0"]) is None  # mismatch


def test_gather_scatter_add():
    r = m("aten::gather", [[50], [], [1000], []], [F32, "Scalar", "long int", "Scalar"], ["", "0", "", "False"])
    assert r.flops == 0 and r.bytes_read == 1000 * 8 + 1000 * 4 and r.bytes_written == 1000 * 4
    r = m("aten::scatter_add_", [[50], [], [1000], [1000]], [F32, "Scalar", "long int", F32], ["", "0", "", ""])
    assert r.flops == 1000
    assert r.bytes_read == 50 * 4 + 1000 * 8 + 1000 * 4 and r.bytes_written == 50 * 4
    assert m("aten::scatter_add_", [[50], [], [], [1000]], [F32, "Scalar", "", F32], ["", "0", "", ""]) is None


def test_embedding_dense_backward():
    # (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    dims = [[4, 6, 16], [4, 6], [], [], []]
    types = [F32, "long int", "Scalar", "Scalar", "Scalar"]
    r = m("aten::embedding_dense_backward", dims, types, ["", "", "100", "-1", "False"])
    assert r.flops == 24 * 16
    assert r.bytes_read == 24 * 16 * 4 + 24 * 8 and r.bytes_written == 100 * 16 * 4
    assert m("aten::embedding_dense_backward", dims, types, ["", "", "", "-1", "False"]) is None    # num_weights
    assert m("aten::embedding_dense_backward", dims, types, ["", "", "100", "0", "False"]) is None  # data-dependent
