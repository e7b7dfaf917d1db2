"""HTTP transport security: loopback by default, a bearer token off loopback, DNS-rebinding and size checks.

Traffic goes to 127.0.0.1 only. The refusal of a non-loopback bind without a token runs the CLI with
socket binding disabled, so even a regression cannot open a port on another address.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gpuscope.fixtures import samples as H
from gpuscope.server.serve import MIN_TOKEN_CHARS, check_token, is_loopback, security_settings
from gpuscope.tools.model.errors import ProfileError

pytestmark = pytest.mark.anyio

TOKEN = "t0ken-for-tests-only-0123456789"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
NO_BIND = ("import socket, sys\n"
           "def refuse(*a, **k): sys.exit('BOUND ' + repr(a[1:]))\n"
           "socket.socket.bind = refuse\n"
           "from gpuscope.server.cli import main\n"
           "main(sys.argv[1:])\n")


def _python() -> str:
    python = H.VENV_BIN / "python"
    return str(python if python.exists() else sys.executable)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.org"])
def test_non_loopback_without_token_refuses_before_binding(host, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUSCOPE_TOKEN"}
    for extra_env in ({}, {"GPUSCOPE_TOKEN": ""}):
        out = subprocess.run([_python(), "-c", NO_BIND, "serve", "--http", "--host", host, "--port", "8765"],
                             env={**env, **extra_env}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (out.returncode, out.stderr)
        assert "BOUND" not in out.stderr and "Traceback" not in out.stderr
        assert f"refusing to serve HTTP on {host} without a token" in out.stderr
        assert "--token" in out.stderr and "GPUSCOPE_TOKEN" in out.stderr and "127.0.0.1" in out.stderr


def test_token_rules():
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.10") and is_loopback("::1") and is_loopback("[::1]")
    assert is_loopback("localhost") and not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert check_token("127.0.0.1", None) is None and check_token("localhost", TOKEN) == TOKEN
    assert check_token("0.0.0.0", TOKEN) == TOKEN
    for bad in ("short", "x" * (MIN_TOKEN_CHARS - 1), "has a space in it 0123456789", "caf\u00e9" * 5):
        with pytest.raises(ProfileError, match="at least"):
            check_token("127.0.0.1", bad)
    # A non-loopback bind accepts its own Host values besides the loopback names (DNS-rebinding check kept).
    s = security_settings("10.1.2.3")
    assert s.enable_dns_rebinding_protection and {"10.1.2.3:*", "127.0.0.1:*", "localhost:*"} <= set(s.allowed_hosts)
    assert "http://10.1.2.3:*" in s.allowed_origins and "evil.example:*" not in s.allowed_hosts
    assert "[fd00::5]:*" in security_settings("fd00::5").allowed_hosts
    assert socket.gethostname() + ":*" in security_settings("0.0.0.0").allowed_hosts


def test_serve_options_need_http(capsys):
    from gpuscope.server.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--token", TOKEN])
    assert exc.value.code == 2 and "--http" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ a live server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    exe = H.VENV_BIN / "gpuscope"
    if not exe.exists():
        pytest.skip("gpuscope console script not installed in .venv")
    port = _free_port()
    log = tmp_path / f"server-{port}.log"
    proc = subprocess.Popen([str(exe), "serve", "--http", "--port", str(port), *args], cwd=tmp_path,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**{k: v for k, v in os.environ.items() if k != "GPUSCOPE_TOKEN"}, **(env or {})})
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            assert time.monotonic() < deadline, "HTTP server did not start: " + log.read_text()
            time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _post(port: int, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body if body is not None else json.dumps(INIT).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _oversized(port: int, headers: dict[str, str], size: int = 5 * 2**20 + 1) -> int:
    """Status for a POST that declares `size` bytes: the server must answer before reading them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/mcp")
        for k, v in {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                     "Content-Length": str(size), **headers}.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * 65536)  # part of it only
        return conn.getresponse().status
    finally:
        conn.close()


def _rebinding_and_size_checks(port: int, auth: dict[str, str]) -> None:
    assert _post(port, auth)[0] == 200
    assert _post(port, {**auth, "Host": "evil.example:80"})[0] == 421
    assert _post(port, {**auth, "Origin": "http://evil.example"})[0] == 403
    assert _post(port, {**auth, "Origin": f"http://localhost:{port}"})[0] == 200
    assert _oversized(port, auth) == 413


async def test_loopback_without_token_keeps_rebinding_and_size_checks(anyio_backend, tmp_path):
    proc, port = _start(tmp_path)
    try:
        await anyio.to_thread.run_sync(_rebinding_and_size_checks, port, {})
    finally:
        _stop(proc)


@pytest.mark.parametrize("how", ["flag", "env"])
async def test_token_is_enforced(anyio_backend, tmp_path, profiles, how):
    proc, port = _start(tmp_path, *(["--token", TOKEN] if how == "flag" else []),
                        env={"GPUSCOPE_TOKEN": TOKEN} if how == "env" else None)
    try:
        for headers, error in [({}, None), ({"Authorization": f"Bearer {TOKEN}x"}, "invalid_token"),
                               ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "invalid_token"),
                               ({"Authorization": f"Basic {TOKEN}"}, None), ({"Authorization": "Bearer"}, "invalid_token")]:
            status, hdrs, body = await anyio.to_thread.run_sync(_post, port, headers)
            assert status == 401, (headers, status, body)
            challenge = {k.lower(): v for k, v in hdrs.items()}["www-authenticate"]
            assert challenge.startswith("Bearer") and (error is None or f'error="{error}"' in challenge), challenge
            assert b"jsonrpc" not in body                                      # nothing of MCP answered
        # No token, oversized body: refused before the body is read.
        assert await anyio.to_thread.run_sync(_oversized, port, {}) == 401
        await anyio.to_thread.run_sync(_rebinding_and_size_checks, port, {"Authorization": f"bearer {TOKEN}"})
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        with anyio.fail_after(30):
            async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as c:
                res = await c.call_tool("top_kernels", {"trace": str(profiles["nsys"]), "limit": 3})
                assert res.is_error is False and res.structured_content["kernels"][0]["name"] == "gemm_kernel"
    finally:
        _stop(proc)
