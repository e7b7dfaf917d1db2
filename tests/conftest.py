"""Shared test plumbing: where the real profiles live, and scenarios written as profiles and opened.

How a scenario becomes an opened trace (every step cached per session, every trace closed at the end):

    maker() -> Scenario                                  a zero-argument function from gpuscope.fixtures
      -> gpuscope.fixtures.writers.<fmt>.write(...)      one file per format, named <name><copy>[.<pid>]<SUFFIX[fmt]>
      -> gpuscope.tools.model.trace.load_trace(path)     the Trace the analyses take

    write_profile(name, fmt, pid=None, scenarios=None, copy="") -> Path
    open_profile(name, fmt, pid=None, scenarios=None, copy="")  -> Trace

`name` is looked up in `scenarios`, a mapping name -> maker (default: the catalog,
gpuscope.fixtures.catalog.SCENARIOS; a test file passes its own, e.g. scenarios_iterations.SCENARIOS,
or a module-level {"name": maker}). The cache is keyed by the maker itself, so makers must be
long-lived functions (module-level, or the values of a module-level dict), not lambdas made per call.
`fmt` is one of FORMATS, or "kineto_2021": the Kineto writer's 2021 (PyTorch 1.8-1.9) format, for the
tests that also run on it (scenario times in whole µs). `pid` selects the process of a Kineto trace (PyTorch writes one file per
process; None writes them all); the other formats hold every process and ignore it. `copy` names a
second, separate file of the same profile (e.g. "_again"). Profiles are cached by (maker, fmt, pid,
copy), so two test files asking for the same maker share one file and one opened trace.

Test modules import the constants and helpers (FORMATS, DATA, needs_data, real_files, scenario_cases)
with `from conftest import ...`: tests/ has no __init__.py, so pytest puts tests/ on sys.path for this file.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

# Stores, spill files and the extension copy go to a cache of the test session's own, never ~/.cache; subprocesses
# (the CLI, `gpuscope serve`, the SQL worker) inherit it. A caller's explicit GPUSCOPE_CACHE_DIR is kept.
# A cache made here is removed when the session ends: a full run builds ~3 GB of stores, and CI's disk is shared.
if "GPUSCOPE_CACHE_DIR" not in os.environ:
    os.environ["GPUSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpuscope-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GPUSCOPE_CACHE_DIR"], ignore_errors=True)

from gpuscope.fixtures import samples

FORMATS = ("nsys", "rocpd", "kineto")
SUFFIX = {"nsys": ".sqlite", "rocpd": "_results.db", "kineto": ".pt.trace.json", "kineto_2021": ".pt.trace.json"}
DATA = samples.SHARED_DATA  # the real profiles, ../shared/data (absent on some machines: tests skip)
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")


def real_files(*patterns: str) -> list[Path]:
    """The real profiles matching the glob patterns under DATA (e.g. "nsys/*.sqlite"), sorted; [] without DATA."""
    return sorted(p for pattern in patterns for p in DATA.glob(pattern)) if DATA.is_dir() else []


class CountingSqlite:
    """An sqlite3 connection whose cursors for SELECTs containing `marker` record how many rows each fetch returned
    (in `fetched`): shows a reader fetching a table a chunk at a time rather than whole."""

    def __init__(self, con, marker: str, fetched: list[int]):
        self.con, self.marker, self.fetched = con, marker, fetched

    def execute(self, sql, *args):
        cur = self.con.execute(sql, *args)
        return _CountingCursor(cur, self.fetched) if self.marker in sql else cur

    def __getattr__(self, name):
        return getattr(self.con, name)

    @property
    def text_factory(self):
        return self.con.text_factory

    @text_factory.setter
    def text_factory(self, factory):
        self.con.text_factory = factory


class _CountingCursor:
    def __init__(self, cur, fetched: list[int]):
        self.cur, self.fetched, self.description = cur, fetched, cur.description

    def fetchmany(self, n):
        rows = self.cur.fetchmany(n)
        self.fetched.append(len(rows))
        return rows

    def fetchall(self):
        rows = self.cur.fetchall()
        self.fetched.append(len(rows))
        return rows


def write_scenario(scenario, fmt: str, path: Path, pid: int | None = None) -> Path:
    """Write one Scenario as a profile of format `fmt` (Kineto: only process `pid`, or all when None)."""
    if fmt == "kineto_2021":
        importlib.import_module("gpuscope.fixtures.writers.kineto").write(scenario, path, pid, legacy=True)
        return path
    writer = importlib.import_module(f"gpuscope.fixtures.writers.{fmt}")
    writer.write(scenario, path, **({"pid": pid} if fmt == "kineto" else {}))
    return path


def scenario_cases(scenarios: Mapping[str, Callable], formats=FORMATS) -> list:
    """pytest params (name, fmt, pid): every scenario in every format, Kineto once per process."""
    out = []
    for name, make in scenarios.items():
        pids = [p.pid for p in make().processes]
        for fmt in formats:
            for pid in (pids if fmt == "kineto" else [None]):
                out.append(pytest.param(name, fmt, pid, id=f"{name}-{fmt}" + ("" if pid is None else f"-{pid}")))
    return out


@pytest.fixture(scope="session")
def write_profile(tmp_path_factory):
    from gpuscope.fixtures.catalog import SCENARIOS as CATALOG

    root = tmp_path_factory.mktemp("profiles")
    cache: dict[tuple, Path] = {}

    def write(name: str, fmt: str, pid: int | None = None, scenarios: Mapping[str, Callable] | None = None,
              copy: str = "") -> Path:
        maker = (CATALOG if scenarios is None else scenarios)[name]
        pid = pid if fmt.startswith("kineto") else None
        key = (maker, fmt, pid, copy)
        if key not in cache:
            folder = root / f"{len(cache):04d}"  # one folder per file: equal names from other sources never clash
            folder.mkdir()
            tag = "" if pid is None else f".{pid}"
            cache[key] = write_scenario(maker(), fmt, folder / f"{name}{copy}{tag}{SUFFIX[fmt]}", pid)
        return cache[key]

    return write


@pytest.fixture(scope="session")
def open_profile(write_profile):
    from gpuscope.tools.model.trace import load_trace

    traces: dict[Path, object] = {}

    def open_(name: str, fmt: str, pid: int | None = None, scenarios: Mapping[str, Callable] | None = None,
              copy: str = ""):
        path = write_profile(name, fmt, pid, scenarios, copy)  # cached: the same path for the same profile
        if path not in traces:
            traces[path] = load_trace(path)
        return traces[path]

    yield open_
    for trace in traces.values():
        trace.close()


# The hand-checkable sample profile (gpuscope.fixtures.samples) and the broken files, per session.
@pytest.fixture(scope="session")
def profiles(tmp_path_factory) -> dict[str, Path]:
    return samples.write_profiles(tmp_path_factory.mktemp("profiles"))


@pytest.fixture(scope="session")
def bad_inputs(tmp_path_factory, profiles) -> dict[str, tuple[Path, list]]:
    return samples.write_bad_inputs(tmp_path_factory.mktemp("bad"), profiles)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """The gpuscope CLI in this process: (exit code, stdout, stderr)."""
    from gpuscope.server.cli import main

    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def http_server(folder: Path, env: dict | None = None):
    """`gpuscope serve --http` on a free port, started and waited for (its log in folder/server.log), stopped on exit.
    Yields the MCP endpoint URL. Skips when the console script is not installed."""
    import socket
    import subprocess

    import anyio

    exe = samples.VENV_BIN / "gpuscope"
    if not exe.exists():
        pytest.skip("gpuscope console script not installed in .venv")
    port = free_port()
    log_path = folder / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(exe), "serve", "--http", "--port", str(port)], cwd=folder, stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    assert time.monotonic() < deadline, "HTTP server did not start: " + log_path.read_text()
                    await anyio.sleep(0.2)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def under_memory_limit(tmp_path: Path, profile: Path, child: str, limit: str = "64MiB", timeout: int = 600) -> str:
    """The last line `child` (python -c, the profile's path as argv[1]) prints under GPUSCOPE_MEMORY_LIMIT=limit over
    the profile's store, which a first process builds with the default limit (reading the profile is not what is
    tested; store_now: a large export would otherwise open as a pending trace, built only when asked)."""
    env = {**os.environ, "GPUSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    built = subprocess.run([sys.executable, "-c", "import sys; from gpuscope.tools.model.trace import load_trace; "
                            "load_trace(sys.argv[1], store_now=True).close()", str(profile)],
                           env=env, capture_output=True, text=True, timeout=timeout)
    assert built.returncode == 0, built.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", child, str(profile)], env={**env, "GPUSCOPE_MEMORY_LIMIT": limit},
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]
