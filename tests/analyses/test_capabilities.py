"""trace_info's capability table predicts what each tool does: an available tool answers, an unavailable
one refuses with a ProfileError (comm_summary: finds no communication). Every per-profile tool is listed."""

from __future__ import annotations

import pytest

from conftest import FORMATS
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.truth import expressed
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError

CALLS = {
    "top_kernels": A.top_kernels, "gap_histogram": A.gap_histogram, "gpu_timeline": A.gpu_timeline,
    "stream_summary": A.stream_summary, "phases": A.phases, "diagnose": A.diagnose, "memcpy_summary": A.memcpy_summary,
    "api_summary": A.api_summary, "marker_summary": A.marker_summary, "iterations": A.iterations, "critical_path": A.critical_path,
    "ops_summary": A.ops_summary, "graph_summary": A.graph_summary, "perf_summary": A.perf_summary, "replay_spec": None, "roofline": None,
}
# Catalog scenarios that between them turn each data-dependent capability on and off: markers that repeat or
# not, no copies, no kernels, two GPUs, operators with shapes (Kineto only), communication kernels. (A profile
# with no GPU work at all is refused by every GPU tool: see test_bad_input.)
COVER = ["concurrent_streams", "two_gpus_one_process", "no_kernels", "graph_launch", "unlinked_kernels", "amd_mi300x",
         "legacy_kineto", "zero_length_kernels", "multi_process"]
# Tools that take no single profile, or take no questions about one: not in the table.
NOT_PER_PROFILE = {"list_traces", "get_guide", "remote_context", "list_tables", "describe_table", "trace_info"}


def _answers(tool: str, t) -> bool:
    try:
        if tool == "roofline":  # per GPU: the caller names the device on multi-GPU profiles
            A.roofline(t, device=t.sql("SELECT min(device_id) FROM kernels")[0][0])
        elif tool == "replay_spec":
            A.replay_spec(t, op=t.sql("SELECT name FROM cpu_ops WHERE category = 'cpu_op' AND input_dims IS NOT NULL "
                                      "ORDER BY dur_ns DESC LIMIT 1")[0][0])
        else:
            CALLS[tool](t)
        return True
    except (ProfileError, IndexError):  # IndexError: no operator to name, i.e. nothing to replay
        return False


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", COVER)
def test_capabilities_predict_the_tools(open_profile, name, fmt):
    t = open_profile(name, fmt)
    caps = {c.tool: c for c in A.trace_info(t).capabilities}
    for tool in CALLS:
        assert caps[tool].available == _answers(tool, t), (tool, caps[tool].reason)
        assert (caps[tool].reason is None) == caps[tool].available
    try:
        found = bool(A.comm_summary(t).collectives)
    except ProfileError:  # no kernels at all
        found = False
    assert caps["comm_summary"].available == found
    # and from the scenario itself, not from any tool: kernels, copies/sets, communication kernels, PyTorch ops
    s = expressed(SCENARIOS[name](), fmt)
    assert caps["top_kernels"].available == bool(s.kernels)
    assert caps["memcpy_summary"].available == bool(s.memops)
    graph_calls = {(a.pid, a.correlation_id) for a in s.api_calls if "graphlaunch" in a.name.lower()}
    assert caps["graph_summary"].available == any(k.graph_id is not None or (k.pid, k.correlation_id) in graph_calls
                                                  for k in s.kernels)
    assert caps["comm_summary"].available == any("nccl" in k.name.lower() or "rccl" in k.name.lower() for k in s.kernels)
    if fmt != "kineto":  # Nsight / rocpd profiles hold no PyTorch operators
        assert not caps["replay_spec"].available and not caps["perf_summary"].available


def test_every_per_profile_tool_is_listed(open_profile):
    from gpuscope.server.app import server  # tests may import the MCP layer; tools/ never does

    import anyio

    async def names():
        return {t.name for t in await server.list_tools()}

    listed = {c.tool.split(".")[0] for c in A.trace_info(open_profile("concurrent_streams", "nsys")).capabilities}
    assert listed == anyio.run(names) - NOT_PER_PROFILE
