"""call_stack: chains checked against the raw Kineto JSON (real H100 traces) and a hand-built scenario."""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import DATA as SHARED_DATA
from gpuscope.fixtures.scenario import ApiCall, CpuOp, Device, Kernel, Marker, Process, Scenario, Thread
from gpuscope.tools.analyses.call_stack import call_stack
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace as _load


@contextmanager
def load_trace(path):
    tr = _load(path)
    try:
        yield tr
    finally:
        tr.close()

DATA = SHARED_DATA / "pytorch"
BERT = DATA / "nv_h100_bert-small_infer_tracelens.json.gz"
QWEN = DATA / "nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz"
US = 1000
GEMM = ("void gemm_kernel<128>(Params)", "gemm_kernel")


def _raw_chain(path: Path, kernel_sub: str) -> tuple[list[str], int]:
    """Independent derivation: the longest kernel containing `kernel_sub`, its runtime call (same correlation),
    then every cpu_op / python_function / user_annotation on that thread whose [ts, ts+dur] holds the call's
    start, outermost first."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel" and kernel_sub in e["name"]]
    k = max(ks, key=lambda e: e["dur"])
    corr = k["args"]["correlation"]
    rt = min((e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") == corr),
             key=lambda e: e["ts"])
    enc = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function", "user_annotation")
           and e["pid"] == rt["pid"] and e["tid"] == rt["tid"] and e["ts"] <= rt["ts"] < e["ts"] + e["dur"]]
    enc.sort(key=lambda e: (e["ts"], -e["dur"]))
    return [e["name"] for e in enc] + [rt["name"], k["name"]], round(k["dur"] * 1000)


@pytest.mark.skipif(not BERT.exists(), reason="shared/data traces absent")
@pytest.mark.parametrize("path,sub", [(BERT, "cutlass_80_tensorop_bf16_s16816gemm"), (QWEN, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")])
def test_real_gemm_chain_matches_raw_json(path, sub):
    want, dur = _raw_chain(path, sub)
    with load_trace(path) as tr:
        r = call_stack(tr, kernel=sub, depth=200)
    assert [lv.name for lv in r.chain[:-1]] + [r.chain[-1].name] == [n if len(n) <= 160 else n[:159] + "…" for n in want]
    assert r.chain[-1].kind == "kernel" and r.chain[-1].dur_ns == dur
    assert r.chain[-2].kind == "api_call" and r.chain[-3].kind == "cpu_op"
    assert r.op is not None and r.op.name == r.chain[-3].name and r.launcher_kind == "cpu_op"
    assert r.chain_truncated == 0 and r.module_path and r.innermost_python_frame
    assert r.instance_rule.startswith("longest")


@pytest.mark.skipif(not BERT.exists(), reason="shared/data traces absent")
def test_real_bert_details():
    with load_trace(BERT) as tr:
        r = call_stack(tr, kernel="cutlass_80_tensorop_bf16_s16816gemm")
        assert r.module_path == "BertLMHeadModel_0/BertOnlyMLMHead_0/BertLMPredictionHead_0/Linear_25"
        assert r.model_code_frame == "transformers/models/bert/modeling_bert.py(786): forward"
        addmm = r.chain[-3]
        assert addmm.name == "aten::addmm" and addmm.input_dims == [[30522], [141, 512], [512, 30522], [], []]
        assert addmm.input_types[:3] == ["c10::BFloat16"] * 3
        frame = next(lv for lv in r.chain if lv.kind == "python_frame" and lv.file == "torch/nn/modules/linear.py")
        assert frame.line == 124 and frame.function == "forward"
        assert [lv.kind for lv in r.subtree] == ["cpu_op", "kernel"] and r.subtree_totals.kernel_time_ns == 41280
        # depth cuts the chain at the root side; op mode; errors
        short = call_stack(tr, kernel="cutlass_80_tensorop_bf16_s16816gemm", depth=4)
        assert [lv.kind for lv in short.chain] == ["cpu_op", "cpu_op", "api_call", "kernel"] and short.truncated
        assert short.chain_truncated == len(r.chain) - 4
        first = call_stack(tr, kernel="Kernel2", instance=0)
        assert first.instance == 0 and first.instances == 22  # raw JSON: 22 kernel events contain "kernel2" (case-insensitive)
        m = call_stack(tr, op="nn.Module: BertAttention_0", depth=3, limit=5)
        assert m.op.kind == "module" and m.op.module == "BertAttention_0" and len(m.subtree) == 5 and m.truncated
        assert m.subtree_totals.kernels > 0
        with pytest.raises(ProfileError, match="no kernel name contains"):
            call_stack(tr, kernel="no_such_kernel_xyz")
        with pytest.raises(ProfileError, match="Close names"):
            call_stack(tr, op="aten::addmmm")
        with pytest.raises(ProfileError, match="exactly one"):
            call_stack(tr)
        with pytest.raises(ProfileError, match="out of range"):
            call_stack(tr, kernel="Kernel2", instance=99)


def nested() -> Scenario:
    """fwd annotation [0, 400] > aten::linear [10, 100] > {aten::t [12, 20], aten::addmm [30, 90] → GEMM [150, 200]}
       aten::linear [200, 300] > aten::addmm [210, 290] → GEMM [320, 330] (first execution, shorter)."""
    P = T = 7
    s = Scenario("nested", [Device(0)], [Process(P)], [Thread(P, T)])
    s.markers.append(Marker(P, T, 0, 400 * US, "fwd"))
    s.cpu_ops += [CpuOp(P, T, 10 * US, 100 * US, "aten::linear", 1, [[4, 8], [16, 8], [16]], ["float"] * 3),
                  CpuOp(P, T, 12 * US, 20 * US, "aten::t", 2, [[16, 8]], ["float"]),
                  CpuOp(P, T, 30 * US, 90 * US, "aten::addmm", 3, [[16], [4, 8], [8, 16], [], []],
                        ["float", "float", "float", "Scalar", "Scalar"]),
                  CpuOp(P, T, 200 * US, 300 * US, "aten::linear", 4, [[2, 8], [16, 8], [16]], ["float"] * 3),
                  CpuOp(P, T, 210 * US, 290 * US, "aten::addmm", 5, [[16], [2, 8], [8, 16], [], []],
                        ["float", "float", "float", "Scalar", "Scalar"])]
    s.api_calls += [ApiCall(P, T, 40 * US, 45 * US, "cudaLaunchKernel", 1, 3),
                    ApiCall(P, T, 220 * US, 225 * US, "cudaLaunchKernel", 2, 5)]
    s.kernels += [Kernel(0, 7, 150 * US, 200 * US, GEMM[0], GEMM[1], P, 1, grid=(4, 2, 1), block=(256, 1, 1)),
                  Kernel(0, 7, 320 * US, 330 * US, GEMM[0], GEMM[1], P, 2, grid=(2, 2, 1), block=(256, 1, 1))]
    s.options["kineto_args"] = {
        ("cpu_op", P, 3): {"Input Strides": [[1], [8, 1], [1, 8], [], []], "Concrete Inputs": ["", "", "", "1", "2"]},
        ("cpu_op", P, 5): {"Input Strides": [[1], [8, 1], [1, 8], [], []], "Concrete Inputs": ["", "", "", "1", "1"]}}
    return s


@pytest.fixture(scope="module")
def nested_trace(open_profile):
    return open_profile("nested", "kineto", scenarios={"nested": nested})


def test_fixture_chain(nested_trace):
    r = call_stack(nested_trace, kernel="gemm_kernel")
    assert r.instances == 2 and r.instance == 0  # the 50 µs execution is the longest
    assert [(lv.kind, lv.name, lv.start_ns, lv.dur_ns) for lv in r.chain] == [
        ("annotation", "fwd", 0, 400 * US), ("cpu_op", "aten::linear", 10 * US, 90 * US),
        ("cpu_op", "aten::addmm", 30 * US, 60 * US), ("api_call", "cudaLaunchKernel", 40 * US, 5 * US),
        ("kernel", GEMM[0], 150 * US, 50 * US)]
    assert r.chain[2].input_dims == [[16], [4, 8], [8, 16], [], []]
    assert r.module_path is None and "with_stack=True" in r.hint
    assert [(lv.level, lv.kind, lv.name) for lv in r.subtree] == [(1, "kernel", GEMM[0])]
    second = call_stack(nested_trace, kernel="gemm", instance=1)
    assert second.chain[1].start_ns == 200 * US and second.chain[-1].dur_ns == 10 * US
    op = call_stack(nested_trace, op="aten::linear")  # default: the call with the most GPU time → the first
    assert op.instance == 0 and [lv.name for lv in op.chain] == ["fwd", "aten::linear"]
    assert [(lv.level, lv.kind, lv.name) for lv in op.subtree] == [
        (1, "cpu_op", "aten::t"), (1, "cpu_op", "aten::addmm"), (2, "kernel", GEMM[0])]
    assert op.subtree_totals.kernel_time_ns == 50 * US and op.subtree_totals.host_nodes == 2
    assert call_stack(nested_trace, op="aten::linear", instance=-1).op.start_ns == 200 * US


def test_nsys_chain_is_nvtx_ranges(tmp_path):
    from gpuscope.fixtures.writers import nsys

    path = tmp_path / "nested.sqlite"
    nsys.write(nested(), path)  # the Nsight writer keeps the 'fwd' range, drops the cpu ops
    with load_trace(path) as tr:
        r = call_stack(tr, kernel="gemm")
        assert [(lv.kind, lv.name) for lv in r.chain] == [("range", "fwd"), ("api_call", "cudaLaunchKernel"), ("kernel", GEMM[0])]
        assert r.chain[0].dur_ns == 400 * US and r.chain[1].start_ns == 40 * US
        assert "with_stack=True" in r.hint and r.op is None
        with pytest.raises(ProfileError, match="no PyTorch CPU operators.*torch.profiler.profile"):
            call_stack(tr, op="aten::addmm")
