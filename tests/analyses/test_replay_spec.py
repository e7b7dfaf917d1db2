"""replay_spec: signatures, inputs and kernel times checked against the raw Kineto JSON and a hand-built scenario."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict

import pytest

from gpuscope.tools.analyses.replay_spec import replay_spec
from gpuscope.tools.model.errors import ProfileError

from test_call_stack import GEMM, QWEN, US, load_trace, nested, nested_trace  # noqa: F401  (fixture re-export)


def test_fixture_spec(nested_trace):
    r = replay_spec(nested_trace, op="aten::addmm")
    assert r.signatures_total == 2 and r.shapes_index == 0 and r.torch_op == "torch.ops.aten.addmm"
    assert [s.input_dims for s in r.signatures] == [[[16], [4, 8], [8, 16], [], []], [[16], [2, 8], [8, 16], [], []]]
    assert [s.kernel_time_total_ns for s in r.signatures] == [50 * US, 10 * US]
    assert [(i.kind, i.dtype, i.shape, i.strides, i.contiguous, i.value) for i in r.inputs] == [
        ("tensor", "torch.float32", [16], [1], True, None), ("tensor", "torch.float32", [4, 8], [8, 1], True, None),
        ("tensor", "torch.float32", [8, 16], [1, 8], False, None), ("scalar", None, None, None, None, 1),
        ("scalar", None, None, None, None, 2)]
    assert r.calls == 1 and r.kernel_time_per_call_mean_ns == 50 * US and r.kernel_time_total_ns == 50 * US
    assert r.host_time_per_call_mean_ns == 60 * US and r.device_name == "NVIDIA H100 80GB HBM3"
    assert [(k.name, k.op, k.grid, k.block, k.calls_per_op_call) for k in r.kernels] == [
        (GEMM[0], "kernel", [4, 2, 1], [256, 1, 1], 1.0)]
    assert r.call_stack_instance == 0
    assert "TEMPLATE" in r.snippet and "torch.ops.aten.addmm" in r.snippet
    assert "torch.empty_strided((8, 16), (1, 8), dtype=torch.float32" in r.snippet
    compile(r.snippet, "<snippet>", "exec")
    other = replay_spec(nested_trace, op="aten::addmm", shapes_index=1)
    assert other.inputs[1].shape == [2, 8] and other.kernel_time_per_call_max_ns == 10 * US and other.call_stack_instance == 1
    assert other.inputs[4].value == 1
    cpu_only = replay_spec(nested_trace, op="aten::t")
    assert cpu_only.kernel_time_total_ns == 0 and cpu_only.kernels == [] and "no kernels" in cpu_only.hint
    assert not cpu_only.input_strides_recorded and "contiguous" in cpu_only.hint
    with pytest.raises(ProfileError, match="Close names.*aten::addmm"):
        replay_spec(nested_trace, op="aten::addmn")
    with pytest.raises(ProfileError, match="out of range"):
        replay_spec(nested_trace, op="aten::addmm", shapes_index=5)


@pytest.mark.skipif(not QWEN.exists(), reason="shared/data traces absent")
def test_real_qwen_mm_against_raw_json():
    # independent: group aten::mm events by (dims, types, strides, concrete); kernel time = kernels whose runtime call
    # (same correlation) starts inside the op on its thread.
    ev = json.loads(gzip.decompress(QWEN.read_bytes()))["traceEvents"]
    rt = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ks = [e for e in ev if e.get("cat") == "kernel"]
    mms = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    per = {}
    for m in mms:
        t = 0
        for k in ks:
            c = rt.get(k["args"].get("correlation"))
            if c and c["tid"] == m["tid"] and m["ts"] <= c["ts"] < m["ts"] + m["dur"]:
                t += round(k["dur"] * 1000)
        per[id(m)] = t
    groups = defaultdict(list)
    for m in mms:
        a = m["args"]
        groups[json.dumps([a.get("Input Dims"), a.get("Input type"), a.get("Input Strides"), a.get("Concrete Inputs")])].append(per[id(m)])
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    with load_trace(QWEN) as tr:
        r = replay_spec(tr, op="aten::mm")
        assert r.signatures_total == len(groups)
        top = json.loads(ranked[0][0])
        assert [s.calls for s in r.signatures] == [len(v) for _, v in ranked]
        assert r.inputs[0].shape == top[0][0] and r.inputs[1].shape == top[0][1] and r.inputs[1].strides == top[2][1]
        assert r.inputs[0].dtype == "torch.bfloat16" and r.inputs[0].contiguous and not r.inputs[1].contiguous
        assert r.kernel_time_total_ns == pytest.approx(sum(ranked[0][1]), abs=len(ranked[0][1]))  # ns rounding per kernel
        assert r.kernel_time_per_call_median_ns == pytest.approx(statistics.median(ranked[0][1]), abs=2)
        gemm = [k for k in r.kernels if k.op == "kernel"]
        assert len(gemm) == 1 and gemm[0].name.startswith("sm90_xmma_gemm_bf16bf16") and gemm[0].grid and gemm[0].block
        assert r.device_name == "NVIDIA H100 80GB HBM3"
        compile(r.snippet, "<snippet>", "exec")
        with pytest.raises(ProfileError, match="aten::matmul"):
            replay_spec(tr, op="aten::matmull")


def test_profile_text_cannot_add_code_to_the_snippet():
    """Op names, recorded types and device names are profile data: a newline in one must not start a line of code
    in the reproducer an agent may run."""
    import ast

    from gpuscope.tools.analyses.replay_spec import ReplayInput, _snippet

    evil = "aten::mm'\nimport os; os.system('touch /tmp/pwned')  #\r\u2028x"
    inputs = [ReplayInput(index=0, kind="scalar", recorded_type="Scalar\nos.system('id')", value=1),
              ReplayInput(index=1, kind="none")]
    safe = _snippet("aten::mm", "torch.ops.aten.mm", inputs, "H100", 10.0)
    hostile = _snippet(evil, None, inputs, "GPU\nimport socket", 10.0)
    assert len(ast.parse(hostile).body) == len(ast.parse(safe).body)
    assert "os.system" not in "\n".join(line.split("#", 1)[0] for line in hostile.splitlines())
    assert not any(line.lstrip().startswith(("import os", "import socket")) for line in hostile.splitlines())
