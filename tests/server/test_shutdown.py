"""The server exits within seconds on SIGTERM/SIGINT, also while a tool call is running, and stops its children.

A sql_query cross join that would run until the 10 s query limit keeps a worker thread busy; the
signal arrives while it runs (no answer sent yet) and the process must be gone within EXIT_LIMIT_S.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from gpuscope.fixtures import samples as H
from gpuscope.tools.model import lifecycle

EXIT_LIMIT_S = 3.0
BUSY_S = 2.0  # how long the call has been running when the signal arrives
SLOW_SQL = "SELECT count(*) FROM range(100000000) a, range(100000) b WHERE (a.range * b.range) % 7 = 3"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _call(trace: Path) -> dict:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sql_query", "arguments": {"trace": str(trace), "sql": SLOW_SQL}}}


def _gpuscope() -> str:
    exe = H.VENV_BIN / "gpuscope"
    if not exe.exists():
        pytest.skip("gpuscope console script not installed in .venv")
    return str(exe)


def _exit_time(proc: subprocess.Popen, sig: int) -> float:
    assert proc.poll() is None, "the server ended before the signal"
    start = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return float("inf")
    return time.monotonic() - start


def _stdio_busy(argv: list[str], profile: Path, tmp_path: Path) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path,
                            stderr=(tmp_path / "stderr.log").open("wb"))
    for message in (INIT, INITIALIZED, _call(profile)):
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        if message is INIT:
            assert json.loads(proc.stdout.readline())["id"] == 1
    time.sleep(BUSY_S)
    return proc


def _sql_workers(server_pid: int) -> list[int]:
    """Live sql_query worker processes whose parent is the server."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == server_pid and b"gpuscope.tools.sandbox.worker" in cmd and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _is_worker(pid: int) -> bool:
    try:
        return b"gpuscope.tools.sandbox.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stdio_exits_mid_query(profiles, tmp_path, sig, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(cache))
    proc = _stdio_busy([_gpuscope(), "serve"], profiles["nsys"], tmp_path)
    workers = _sql_workers(proc.pid)
    assert workers, "the query is not running in a worker process"
    took = _exit_time(proc, sig)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(map(_is_worker, workers)):
        time.sleep(0.1)
    assert not any(map(_is_worker, workers)), "a SQL worker outlived the server"
    # The store is the persistent cache (kept for the next process); only half-built ones must not stay.
    assert list((cache / "stores").glob("*/*/model.duckdb")), "the profile's store was not kept for reuse"
    assert not list((cache / "stores").glob(f"*/.tmp-{proc.pid}-*")), "a half-built store was left behind"
    answered = proc.stdout.read().decode()
    assert took < EXIT_LIMIT_S, f"exit took {took:.1f} s; stderr: {(tmp_path / 'stderr.log').read_text()[-2000:]}"
    assert '"id":2' not in answered.replace(" ", ""), "the query had finished: the test did not catch a busy server"
    assert proc.returncode == 128 + sig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_http_exits_mid_query(profiles, tmp_path, sig):
    port = _free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen([_gpuscope(), "serve", "--http", "--port", str(port)], cwd=tmp_path,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/mcp"
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

        def post(message: dict, session: str | None = None):
            extra = {"mcp-session-id": session} if session else {}
            return urllib.request.urlopen(urllib.request.Request(url, json.dumps(message).encode(), {**headers, **extra}),
                                          timeout=30)

        with post(INIT) as r:
            session = r.headers["mcp-session-id"]
            r.read()
        post(INITIALIZED, session).close()
        answers: list[str] = []

        def call():
            try:
                with post(_call(profiles["nsys"]), session) as r:
                    answers.append(r.read().decode())
            except Exception as exc:  # the server going away mid-answer is the expected outcome
                answers.append(f"cut: {exc}")

        threading.Thread(target=call, daemon=True).start()
        time.sleep(BUSY_S)
        assert not answers, "the query had finished: the test did not catch a busy server"
        took = _exit_time(proc, sig)
        assert took < EXIT_LIMIT_S, f"exit took {took:.1f} s; log: {log.read_text()[-2000:]}"
        assert proc.returncode == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A server started from Python with a child registered the way the engine registers its subprocesses.
WITH_CHILD = """
import subprocess, sys
from gpuscope.tools.model import lifecycle
from gpuscope.server.app import run
child = subprocess.Popen(["sleep", "60"])
open(sys.argv[1], "w").write(str(child.pid))
def stop_child():
    child.kill()
    open(sys.argv[1] + ".stopped", "w").write("yes")
lifecycle.on_shutdown(stop_child)
run()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see the child")
def test_signal_stops_registered_children(profiles, tmp_path):
    python = H.VENV_BIN / "python"
    marker = tmp_path / "child.pid"
    proc = _stdio_busy([str(python if python.exists() else sys.executable), "-c", WITH_CHILD, str(marker)],
                       profiles["nsys"], tmp_path)
    child = int(marker.read_text())
    assert _alive(child)
    assert _exit_time(proc, signal.SIGTERM) < EXIT_LIMIT_S
    assert (tmp_path / "child.pid.stopped").read_text() == "yes"
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived the server"
        time.sleep(0.1)


def test_lifecycle_runs_each_callback_once_newest_first():
    ran: list[str] = []
    lifecycle.on_shutdown(lambda: ran.append("first"))
    forget = lifecycle.on_shutdown(lambda: ran.append("forgotten"))
    lifecycle.on_shutdown(lambda: 1 / 0)          # a failing callback does not stop the others
    lifecycle.on_shutdown(lambda: ran.append("last"))
    forget()
    lifecycle.shutdown()
    lifecycle.shutdown()
    assert ran == ["last", "first"]


def test_stdin_closed_still_ends_cleanly(profiles, tmp_path):
    """The ordinary end (the host closes stdin) is unchanged: exit status 0."""
    proc = subprocess.Popen([_gpuscope(), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=tmp_path)
    out, _ = proc.communicate((json.dumps(INIT) + "\n").encode(), timeout=60)
    assert proc.returncode == 0 and json.loads(out.decode().splitlines()[0])["id"] == 1
