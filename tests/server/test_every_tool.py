"""Every single-profile tool, with default arguments, through the MCP server: on the sample profile
in every format and on every real profile under ../shared/data. Each call either answers within
the 20,000-character budget or is an isError result whose text says what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from gpuscope.fixtures.samples import real_profiles
from gpuscope.server.app import server

pytestmark = pytest.mark.anyio

REAL = real_profiles()
SINGLE_PROFILE_TOOLS = ["trace_info", "top_kernels", "gap_histogram", "memcpy_summary", "stream_summary",
                        "marker_summary", "iterations", "critical_path", "api_summary", "gpu_timeline", "comm_summary", "phases", "graph_summary", "ops_summary", "perf_summary", "roofline", "diagnose", "memory_timeline",
                        "list_tables"]
# A refusal must say what is missing or what to pass instead.
MISSING_WORDS = ("no ", "not ", "lacks", "without", "absent", "cannot", "pass ")


async def _check_all(client: Client, path: Path) -> dict[str, int | str]:
    sizes: dict[str, int | str] = {}
    for tool in SINGLE_PROFILE_TOOLS:
        res = await client.call_tool(tool, {"trace": str(path)})
        if res.is_error:
            text = res.content[0].text
            assert any(w in text.lower() for w in MISSING_WORDS), f"{tool} on {path.name}: unhelpful error {text!r}"
            assert "Traceback" not in text and text.strip() != f"Error executing tool {tool}", text
            sizes[tool] = "refused"
            continue
        size = len(json.dumps(res.structured_content))
        assert size < 20_000, f"{tool} on {path.name}: {size} characters"
        sizes[tool] = size
    return sizes


async def test_every_tool_on_every_fixture_format(anyio_backend, profiles):
    async with Client(server) as client:
        for fmt, path in profiles.items():
            sizes = await _check_all(client, path)
            # The sample profile has kernels, copies, API calls and an NVTX range in every format.
            for tool in ("trace_info", "top_kernels", "gap_histogram", "stream_summary", "api_summary", "gpu_timeline", "phases"):
                assert sizes[tool] != "refused", (fmt, tool)


@pytest.mark.skipif(not REAL, reason="../shared/data is not present")
async def test_every_tool_on_every_real_profile(anyio_backend):
    async with Client(server) as client:
        for path in REAL:
            sizes = await _check_all(client, path)
            for tool in ("trace_info", "top_kernels", "gap_histogram", "stream_summary", "gpu_timeline", "comm_summary", "phases"):
                assert sizes[tool] != "refused", (path.name, tool)


async def test_rank_summary_through_mcp(anyio_backend, profiles):
    async with Client(server) as client:
        res = await client.call_tool("rank_summary", {"traces": [str(profiles["nsys"])]})
        assert not res.is_error, res.content[0].text
        assert res.structured_content["ranks"]
        res = await client.call_tool("rank_summary", {"traces": [str(profiles["nsys"]), str(profiles["nsys"])]})
        assert res.is_error and "given twice" in res.content[0].text


async def test_critical_path_over_a_job_folder_through_mcp(anyio_backend, tmp_path):
    from gpuscope.fixtures.scenarios_job import PID0, job
    from gpuscope.fixtures.writers import kineto

    s = job(2, 1, 3, deps=True)
    for r in range(2):
        kineto.write(s, tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r)
    async with Client(server) as client:
        res = await client.call_tool("critical_path", {"trace": str(tmp_path)})
        assert not res.is_error, res.content[0].text
        assert res.structured_content["collectives"]["instances"] == 1
        assert [x["rank"] for x in res.structured_content["ranks"]] == [0, 1]
