"""Many clients at once: 8 HTTP clients and 4 stdio clients call the tools concurrently on several profiles; every
call answers, and every answer equals the serial answer to the same call."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import http_server
from gpuscope.fixtures import samples as H

pytestmark = pytest.mark.anyio

CALLS_PER_CLIENT = 24


def _calls(profiles: dict) -> list[tuple[str, dict]]:
    out = []
    for fmt in profiles:
        p = str(profiles[fmt])
        out += [("trace_info", {"trace": p}), ("top_kernels", {"trace": p}), ("gap_histogram", {"trace": p}),
                ("sql_query", {"trace": p, "sql": "SELECT device_id, count(*), sum(dur_ns) FROM kernels GROUP BY 1 ORDER BY 1"}),
                ("gpu_timeline", {"trace": p}), ("list_tables", {"trace": p}), ("diagnose", {"trace": p}),
                ("stream_summary", {"trace": p})]
    return out


def _comparable(res) -> str:
    sc = dict(res.structured_content or {})
    sc.pop("open_seconds", None)
    return json.dumps(sc, sort_keys=True, default=str)


async def _run_clients(connect, n_clients: int, calls: list, serial: dict[int, str]) -> None:
    failures: list[str] = []

    async def client(k: int) -> None:
        async with connect() as c:
            for j in range(CALLS_PER_CLIENT):
                i = (k * 7 + j) % len(calls)
                tool, args = calls[i]
                res = await c.call_tool(tool, args)
                if res.is_error:
                    failures.append(f"{tool}: {res.content[0].text[:200]}")
                elif _comparable(res) != serial[i]:
                    failures.append(f"{tool} differs from the serial answer")

    async with anyio.create_task_group() as tg:
        for k in range(n_clients):
            tg.start_soon(client, k)
    assert not failures, failures[:5]


async def _serial(connect, calls) -> dict[int, str]:
    out = {}
    async with connect() as c:
        for i, (tool, args) in enumerate(calls):
            res = await c.call_tool(tool, args)
            assert not res.is_error, res.content[0].text
            out[i] = _comparable(res)
    return out


def _copies(profiles: dict, n: int) -> dict:
    """n distinct profile files: the samples, then copies of them under other names (new files, new stores)."""
    import shutil

    out = dict(profiles)
    for i in range(n - len(profiles)):
        fmt = list(profiles)[i % len(profiles)]
        src = profiles[fmt]
        dst = src.with_name(f"copy{i}_{src.name}")
        shutil.copy(src, dst)
        out[f"{fmt}_copy{i}"] = dst
    return out


@pytest.mark.parametrize("cache_traces,n_profiles", [(None, 3), ("1", 8)], ids=["default-cache", "one-open-profile"])
async def test_eight_http_clients(anyio_backend, tmp_path, cache_traces, n_profiles):
    """With GPUSCOPE_CACHE_TRACES=1 every call evicts another client's profile: leases must keep it open under the
    running call (before leases: 74 'internal error' of 216 calls)."""
    profiles = _copies(H.write_profiles(tmp_path / "p"), n_profiles)
    calls = _calls(profiles)
    if n_profiles > 3:
        calls.append(("compare_traces", {"baseline": str(profiles["nsys"]), "candidate": str(profiles["nsys_copy0"])}))
    env = {"GPUSCOPE_CACHE_TRACES": cache_traces} if cache_traces else {}
    async with http_server(tmp_path, env) as url:
        with anyio.fail_after(240):
            serial = await _serial(lambda: Client(url), calls)
            await _run_clients(lambda: Client(url), 8, calls, serial)


async def test_four_stdio_clients(anyio_backend, tmp_path):
    profiles = H.write_profiles(tmp_path / "p")
    calls = _calls(profiles)
    python = H.VENV_BIN / "python"
    params = StdioServerParameters(command=str(python if python.exists() else sys.executable), args=["-m", "gpuscope"],
                                   cwd=str(tmp_path), env=dict(os.environ))
    with anyio.fail_after(240):
        serial = await _serial(lambda: Client(params, mode="legacy"), calls)
        await _run_clients(lambda: Client(params, mode="legacy"), 4, calls, serial)
