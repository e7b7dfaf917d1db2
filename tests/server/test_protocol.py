"""The MCP surface as a host sees it: tool list, schemas, annotations, results, sizes and errors.

In-process `mcp.Client(server)` for most checks; one stdio subprocess per launch command
(`gpuscope serve`, `python -m gpuscope`) and one streamable-HTTP run prove the real transports.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import anyio
import duckdb

import pytest
from mcp import Client, StdioServerParameters

from gpuscope.server.app import server
from gpuscope.tools.model.limits import memory_limit_bytes


from conftest import http_server
from gpuscope.fixtures import samples as H
DEVICE0_GEMM_TOTAL_NS, DEVICE0_KERNEL_TOTAL_NS, DEVICE0_KERNELS = H.DEVICE0_GEMM_TOTAL_NS, H.DEVICE0_KERNEL_TOTAL_NS, H.DEVICE0_KERNELS
SHARED_DATA, TOTAL_KERNELS, VENV_BIN = H.SHARED_DATA, H.TOTAL_KERNELS, H.VENV_BIN
assert_message, make_scenario, real_profiles = H.assert_message, H.make_scenario, H.real_profiles

pytestmark = pytest.mark.anyio

TOOLS = {"list_traces", "trace_info", "top_kernels", "gap_histogram", "sql_query", "list_tables", "describe_table",
         "phases", "api_summary", "marker_summary", "iterations", "critical_path",
         "memcpy_summary", "stream_summary", "gpu_timeline", "comm_summary", "rank_summary", "straggler_summary", "comm_job_summary",
         "ops_summary", "perf_summary", "graph_summary", "call_stack", "replay_spec", "roofline", "get_guide",
         "diagnose", "compare_traces", "check_regression", "memory_timeline"}
TOOLS |= {"remote_context"}
MAX_RESULT_CHARS = 20_000
FORMATS = ["nsys", "rocpd", "kineto", "kineto_gz"]


@pytest.fixture
async def client(anyio_backend):
    async with Client(server) as c:
        yield c


def _text(res) -> str:
    return "\n".join(getattr(c, "text", "") for c in res.content)


async def _ok(client, tool: str, args: dict) -> dict:
    res = await client.call_tool(tool, args)
    assert res.is_error is False, f"{tool}({args}) failed: {_text(res)}"
    sc = res.structured_content
    assert isinstance(sc, dict)
    assert _text(res).strip(), f"{tool} returned no text content"
    size = len(json.dumps(sc))
    assert size < MAX_RESULT_CHARS, f"{tool}({args}) structured result is {size} characters"
    return sc


async def _err(client, tool: str, args: dict) -> str:
    res = await client.call_tool(tool, args)
    assert res.is_error is True, f"{tool}({args}) should fail, got {res.structured_content}"
    assert res.structured_content is None
    text = _text(res)
    assert text.strip()
    return text


# ---------------------------------------------------------------------------------------- listing


async def test_tool_list_annotations_and_schemas(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for name, t in tools.items():
        a = t.annotations
        assert a is not None, name
        assert (a.read_only_hint, a.idempotent_hint, a.open_world_hint, a.destructive_hint) == (True, True, False, False), name
        assert t.output_schema is not None and t.output_schema.get("type") == "object", name
        assert t.input_schema.get("type") == "object", name
        props = t.input_schema["properties"]
        assert "ctx" not in props, name
        assert t.description and len(t.description.encode()) <= 2048, name
        if name == "remote_context":
            continue  # every argument is optional: settings come from clusters.toml and/or arguments
        first = {"list_traces": "path", "rank_summary": "traces", "straggler_summary": "traces", "comm_job_summary": "traces", "get_guide": "topic",
                 "compare_traces": "baseline"}.get(name, "trace")
        assert first in t.input_schema.get("required", []), name
        assert props[first]["type"] == ("array" if name in ("rank_summary", "straggler_summary", "comm_job_summary") else "string")
    tk = tools["top_kernels"].input_schema["properties"]
    assert tk["limit"]["maximum"] == 200 and tk["limit"]["minimum"] == 1
    assert set(tk["sort_by"]["enum"]) == {"total", "count", "avg", "max"}
    assert set(tk["group_by"]["enum"]) == {"short_name", "name"}
    assert tools["sql_query"].input_schema["properties"]["limit"]["maximum"] == 1000
    assert tools["list_traces"].input_schema["properties"]["limit"]["maximum"] == 500
    gh = tools["gap_histogram"].input_schema["properties"]
    assert gh["top_gaps"]["minimum"] == 0 and gh["top_gaps"]["maximum"] == 50
    # Output schemas describe the documented fields.
    assert {"kernels", "devices", "truncated", "window"} <= set(tools["top_kernels"].output_schema["properties"])
    assert {"profiles", "window", "truncated"} <= set(tools["gap_histogram"].output_schema["properties"])
    assert {"columns", "rows", "row_count", "truncated", "hint"} <= set(tools["sql_query"].output_schema["properties"])


async def test_instructions(client):
    text = client.instructions
    assert len(text.encode("utf-8")) <= 2048
    # The entry tools and the guides are named; every tool and prompt named there exists.
    assert "skill://" in text
    tools = {t.name for t in (await client.list_tools()).tools}
    prompts = {p.name for p in (await client.list_prompts()).prompts}
    named = set(re.findall(r"\b[a-z]+_[a-z_]+\b", text)) - {"pct_of_device_busy_time"}
    assert named and named <= tools | prompts, named - tools - prompts
    assert {"list_traces", "trace_info", "diagnose", "compare_traces", "get_guide",
            "analyze_trace", "delegate_profiling"} <= set(re.findall(r"\w+", text))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_both_protocol_modes(anyio_backend, mode, profiles):
    async with Client(server, mode=mode) as c:
        assert c.instructions
        assert {t.name for t in (await c.list_tools()).tools} == TOOLS
        sc = await _ok(c, "trace_info", {"trace": str(profiles["nsys"])})
        assert sc["counts"]["kernels"] == TOTAL_KERNELS


# ---------------------------------------------------------------------------------------- results


@pytest.mark.parametrize("fmt", FORMATS)
async def test_every_tool_on_fixture(client, profiles, fmt):
    path = str(profiles[fmt])
    scenario = make_scenario(amd=(fmt == "rocpd"))

    info = await _ok(client, "trace_info", {"trace": path})
    assert info["format"] == ("kineto" if fmt.startswith("kineto") else fmt)
    assert info["counts"]["kernels"] == len(scenario.kernels)
    assert info["counts"]["memcpy"] == 1
    cap = info["capture"]
    assert cap["end_ns"] > cap["start_ns"] and cap["span_ns"] == cap["end_ns"] - cap["start_ns"]
    devs = {d["device_id"]: d for d in info["devices"]}
    assert {0, 1} <= set(devs)
    assert devs[0]["kernels"] == DEVICE0_KERNELS and devs[1]["kernels"] == 1
    assert 0 < devs[0]["busy_ns"] <= devs[0]["gpu_last_ns"] - devs[0]["gpu_first_ns"]
    assert {c["tool"] for c in info["capabilities"] if c["available"]} >= {"top_kernels", "gap_histogram", "sql_query"}
    assert [p["pid"] for p in info["processes"]] == [4242]

    top = await _ok(client, "top_kernels", {"trace": path})
    assert top["kernels"], "no kernel groups"
    d0 = next(d for d in top["devices"] if d["device_id"] == 0)
    g0 = [k for k in top["kernels"] if k["device_id"] == 0]
    assert d0["kernel_count"] == DEVICE0_KERNELS
    assert d0["summed_kernel_time_ns"] == DEVICE0_KERNEL_TOTAL_NS
    assert sum(k["total_ns"] for k in g0) + d0["remainder_total_ns"] == d0["summed_kernel_time_ns"]
    assert sum(k["count"] for k in g0) + d0["remainder_count"] == d0["kernel_count"]
    assert g0[0]["name"] == "gemm_kernel" and g0[0]["count"] == 3 and g0[0]["total_ns"] == DEVICE0_GEMM_TOTAL_NS
    assert abs(sum(k["pct_of_device_kernel_time"] for k in g0) - 100) < 0.1
    assert all(k["min_ns"] <= k["median_ns"] <= k["max_ns"] for k in top["kernels"])
    assert top["truncated"] is False
    assert d0["kernel_busy_ns"] == DEVICE0_KERNEL_TOTAL_NS  # one stream: no overlap

    gaps = await _ok(client, "gap_histogram", {"trace": path})
    p0 = next(p for p in gaps["profiles"] if p["device_id"] == 0)
    assert p0["gap_count"] == sum(b["count"] for b in p0["buckets"])
    assert p0["idle_in_gpu_span_ns"] == sum(b["total_ns"] for b in p0["buckets"])
    assert p0["busy_ns"] + p0["idle_in_gpu_span_ns"] == p0["gpu_span_ns"]
    assert [b["bucket"] for b in p0["buckets"]][0] == "<10us"
    biggest = p0["largest_gaps"][0]
    assert 5_000_000 <= biggest["gap_ns"] < 10_000_000
    assert biggest["before"]["name"].startswith("gemm") and biggest["after"]["name"].startswith("softmax")
    assert any("StreamSynchronize" in c["name"] for c in biggest["host_calls"]), biggest

    q = await _ok(client, "sql_query", {"trace": path, "sql": "SELECT count(*) AS n FROM kernels WHERE device_id = 0"})
    assert q["columns"] == ["n"] and q["rows"] == [[DEVICE0_KERNELS]] and q["truncated"] is False

    tables = await _ok(client, "list_tables", {"trace": path})
    model = {t["table"]: t["rows"] for t in tables["model_tables"]}
    assert model["kernels"] == len(scenario.kernels)
    assert {"kernels", "memops", "api_calls", "markers", "devices", "trace_meta"} <= set(model)
    if fmt in ("nsys", "rocpd"):
        assert tables["native_tables"], "SQLite profiles expose their native tables"

    desc = await _ok(client, "describe_table", {"trace": path, "table": "kernels"})
    cols = {c["name"]: c for c in desc["columns"]}
    assert {"start_ns", "end_ns", "dur_ns", "name", "short_name", "device_id"} <= set(cols)
    assert cols["start_ns"]["description"], "model columns carry their meaning"
    assert desc["rows"] == len(scenario.kernels) and 0 < len(desc["sample"]) <= 3
    if tables["native_tables"]:
        native = tables["native_tables"][0]["table"]
        nd = await _ok(client, "describe_table", {"trace": path, "table": native})
        assert nd["columns"]

    listing = await _ok(client, "list_traces", {"path": str(Path(path).parent)})
    found = {Path(t["path"]).name: t for t in listing["traces"]}
    assert Path(path).name in found and found[Path(path).name]["format"] == info["format"]


async def test_text_content_carries_the_facts(client, profiles):
    res = await client.call_tool("top_kernels", {"trace": str(profiles["nsys"]), "limit": 2})
    text = _text(res)
    assert "gemm_kernel" in text and f"{DEVICE0_GEMM_TOTAL_NS:,}" in text
    assert res.structured_content["truncated"] is True and res.structured_content["hint"]


async def test_filters(client, profiles):
    path = str(profiles["nsys"])
    one = await _ok(client, "top_kernels", {"trace": path, "device": 1})
    assert {k["device_id"] for k in one["kernels"]} == {1}
    named = await _ok(client, "top_kernels", {"trace": path, "name_contains": "RELU", "group_by": "name"})
    assert [k["short_name"] for k in named["kernels"]] == ["relu_kernel"]
    by_count = await _ok(client, "top_kernels", {"trace": path, "sort_by": "count", "device": 0})
    assert by_count["kernels"][0]["count"] == 3
    per_stream = await _ok(client, "gap_histogram", {"trace": path, "per_stream": True, "include_memops": False})
    assert {(p["device_id"], p["stream_id"]) for p in per_stream["profiles"]} == {(0, 7), (1, 9)}


async def test_progress_reported_while_loading(client, profiles, tmp_path):
    fresh = tmp_path / "fresh.sqlite"  # a path the cache has not seen
    shutil.copyfile(profiles["nsys"], fresh)
    seen = []

    async def on_progress(p, total, msg):
        seen.append((p, total, msg))

    res = await client.call_tool("trace_info", {"trace": str(fresh)}, progress_callback=on_progress)
    assert res.is_error is False
    assert seen and seen[-1][0] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------- sizes


async def test_default_results_fit_on_fixture(client, profiles):
    for fmt in FORMATS:
        path = str(profiles[fmt])
        for tool, args in [("trace_info", {}), ("top_kernels", {}), ("gap_histogram", {}), ("list_tables", {}),
                           ("describe_table", {"table": "kernels"}), ("sql_query", {"sql": "SELECT * FROM kernels"})]:
            await _ok(client, tool, {"trace": path, **args})


async def test_max_sql_result_fits(client, profiles):
    sc = await _ok(client, "sql_query", {"trace": str(profiles["nsys"]), "limit": 1000,
                                         "sql": "SELECT repeat('x', 390) AS a, repeat('y', 390) AS b, range AS i FROM range(5000)"})
    assert sc["truncated"] is True and sc["hint"]


@pytest.mark.real_data
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
async def test_default_results_fit_on_real_profiles(client):
    listing = await _ok(client, "list_traces", {"path": str(SHARED_DATA)})
    assert len(listing["traces"]) >= 10
    for path in real_profiles():
        info = await client.call_tool("trace_info", {"trace": str(path)})
        if info.is_error and path.suffix == ".rpd":  # legacy RPD may be refused — with a message, never a crash
            assert "Error executing tool trace_info:" in _text(info) and len(_text(info)) > 40, (path, _text(info))
            continue
        assert info.is_error is False, f"{path.name}: {_text(info)}"
        size = len(json.dumps(info.structured_content))
        assert size < MAX_RESULT_CHARS, f"trace_info on {path.name}: {size} characters"
        caps = {c["tool"]: c["available"] for c in info.structured_content["capabilities"]}
        for tool in ("top_kernels", "gap_histogram", "list_tables"):
            if tool in caps and not caps[tool]:
                continue
            await _ok(client, tool, {"trace": str(path)})


# ---------------------------------------------------------------------------------------- errors


BAD_FILE_CASES = ["missing", "directory", "text", "text_with_sqlite_suffix", "truncated_sqlite", "truncated_sqlite_head",
                  "unrelated_sqlite", "corrupt_json_gz", "truncated_json_gz", "truncated_json", "json_not_a_trace",
                  "empty", "empty_json", "nsys_rep_garbage"]


@pytest.mark.parametrize("case", BAD_FILE_CASES)
async def test_bad_files_are_tool_errors(client, bad_inputs, case):
    path, words = bad_inputs[case]
    for tool in ("trace_info", "top_kernels"):
        text = await _err(client, tool, {"trace": str(path)})
        assert text.startswith(f"Error executing tool {tool}: "), "a crash hides the message: " + text
        assert_message(text, words)
        if case != "missing":
            assert path.name in text


async def test_bad_requests_are_tool_errors(client, profiles):
    path = str(profiles["nsys"])
    text = await _err(client, "describe_table", {"trace": path, "table": "no_such_table"})
    assert_message(text, ["unknown table", "no_such_table", "list_tables"])
    text = await _err(client, "sql_query", {"trace": path, "sql": "SELECT bogus_column FROM kernels"})
    assert_message(text, ["bogus_column", "describe_table"])
    text = await _err(client, "sql_query", {"trace": path, "sql": "DROP TABLE kernels"})
    assert_message(text, ["SELECT"])
    text = await _err(client, "top_kernels", {"trace": path, "start_ns": 10**15, "end_ns": 10**15 + 1000})
    assert_message(text, ["outside the capture", "trace_info"])
    text = await _err(client, "gap_histogram", {"trace": path, "start_ns": -(10**12), "end_ns": -(10**12) + 5})
    assert_message(text, ["outside the capture"])
    text = await _err(client, "top_kernels", {"trace": path, "start_ns": 2_000_000, "end_ns": 1_000_000})
    assert_message(text, ["end_ns", "start_ns"])
    for tool in ("top_kernels", "gap_histogram"):
        text = await _err(client, tool, {"trace": path, "device": 99})
        assert_message(text, ["device 99", "does not exist", "trace_info"])
    text = await _err(client, "top_kernels", {"trace": path, "name_contains": "no_kernel_has_this_name"})
    assert_message(text, ["no kernel matches"])
    text = await _err(client, "list_traces", {"path": path + ".nope"})
    assert_message(text, ["no such folder"])


@pytest.mark.parametrize("tool,args", [
    ("top_kernels", {"limit": 0}), ("top_kernels", {"limit": 201}), ("sql_query", {"sql": "SELECT 1", "limit": 0}),
    ("gap_histogram", {"top_gaps": -1}), ("top_kernels", {"sort_by": "fastest"}), ("list_traces", {"limit": 0}),
])
async def test_schema_validation_errors(client, profiles, tool, args):
    key = "path" if tool == "list_traces" else "trace"
    text = await _err(client, tool, {key: str(profiles["nsys"]), **args})
    bad = next(iter(args)) if "sql" not in args else "limit"
    assert bad in text, text
    assert any(w in text.lower() for w in ("greater than", "less than", "input should be", "validation")), text


async def test_missing_argument_and_unknown_tool(client):
    text = await _err(client, "trace_info", {})
    assert "trace" in text and ("required" in text.lower() or "missing" in text.lower())
    text = await _err(client, "no_such_tool", {})
    assert "no_such_tool" in text


# ---------------------------------------------------------------------------------------- transports


def _stdio_env() -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1"}


async def _exercise(c: Client, profile: Path) -> None:
    assert c.instructions and len(c.instructions.encode()) <= 2048
    assert {t.name for t in (await c.list_tools()).tools} == TOOLS
    res = await c.call_tool("top_kernels", {"trace": str(profile), "limit": 3})
    assert res.is_error is False, _text(res)
    assert res.structured_content["kernels"][0]["name"] == "gemm_kernel"
    res = await c.call_tool("trace_info", {"trace": str(profile) + ".missing"})
    assert res.is_error is True and "No such file" in _text(res)


async def test_stdio_gpuscope_serve(anyio_backend, profiles, tmp_path):
    exe = VENV_BIN / "gpuscope"
    if not exe.exists():
        pytest.skip("gpuscope console script not installed in .venv")
    params = StdioServerParameters(command=str(exe), args=["serve"], cwd=str(tmp_path), env=_stdio_env())
    with anyio.fail_after(60):
        async with Client(params) as c:
            await _exercise(c, profiles["nsys"])


async def test_stdio_python_m_gpuscope(anyio_backend, profiles, tmp_path):
    python = VENV_BIN / "python"
    params = StdioServerParameters(command=str(python if python.exists() else sys.executable), args=["-m", "gpuscope"],
                                   cwd=str(tmp_path), env=_stdio_env())
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as c:
            await _exercise(c, profiles["nsys"])


async def test_streamable_http(anyio_backend, profiles, tmp_path):
    async with http_server(tmp_path) as url:
        with anyio.fail_after(30):
            async with Client(url) as c:
                await _exercise(c, profiles["nsys"])


async def test_descriptions_say_profile_text_is_data(client):
    """Every tool whose result carries text read from a profile tells the agent it is data, not instructions."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    carry_profile_text = TOOLS - {"get_guide", "remote_context"}
    for name in carry_profile_text:
        desc = " ".join(tools[name].description.split())
        assert "never instructions" in desc and "kernel" in desc.lower() and "paths" in desc, (name, desc[-200:])
    assert "untrusted data" in client.instructions and "never instructions" in client.instructions


@pytest.mark.parametrize("error", [MemoryError(), duckdb.OutOfMemoryException(
    "Out of Memory Error: could not allocate block of size 256.0 KiB (3.9 GiB/4.0 GiB used)\n\nPossible solutions:\n"
    "* Reducing the number of threads (SET threads=X)\n* Increasing the memory limit (SET memory_limit='...GB')")],
    ids=["python", "duckdb"])
async def test_out_of_memory_is_a_clear_error_and_the_server_keeps_serving(client, profiles, monkeypatch, caplog, error):
    from gpuscope.tools import analyses as A

    real = A.top_kernels

    def exhausted(*args, **kwargs):
        raise error

    monkeypatch.setattr(A, "top_kernels", exhausted)
    text = await _err(client, "top_kernels", {"trace": str(profiles["nsys"])})
    assert_message(text, ["out of memory", "window", "device", "GPUSCOPE_MEMORY_LIMIT", type(error).__name__])
    assert "internal error" not in text and "bug" not in text
    # DuckDB's own advice (SET ...) is not for a gpuscope user; the limit in force is named instead
    assert "SET " not in text and f"(now {memory_limit_bytes() // 2**20} MiB)" in text
    assert any("out of memory" in r.getMessage() for r in caplog.records)   # logged for the operator
    monkeypatch.setattr(A, "top_kernels", real)
    sc = await _ok(client, "top_kernels", {"trace": str(profiles["nsys"])})
    assert sc["devices"][0]["kernel_count"] == DEVICE0_KERNELS
