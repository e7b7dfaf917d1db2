"""Shared fixtures: catalog scenarios written as profiles (cached per session) and opened traces.

    write_profile(scenario_name, fmt, pid=None) -> Path   fmt: 'nsys' | 'rocpd' | 'kineto'
    open_profile(scenario_name, fmt, pid=None) -> Trace   (opened once per session, closed at the end)

`pid` selects the process of a Kineto trace (PyTorch writes one file per process); the other
formats hold every process and ignore it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from gpuscope.fixtures import samples

FORMATS = ("nsys", "rocpd", "kineto")
SUFFIX = {"nsys": ".sqlite", "rocpd": "_results.db", "kineto": ".pt.trace.json"}


def write_scenario(scenario, fmt: str, path: Path, pid: int | None = None) -> Path:
    writer = importlib.import_module(f"gpuscope.fixtures.writers.{fmt}")
    if fmt == "kineto":
        writer.write(scenario, path, pid=pid)
    else:
        writer.write(scenario, path)
    return path


@pytest.fixture(scope="session")
def write_profile(tmp_path_factory):
    from gpuscope.fixtures.catalog import SCENARIOS

    root = tmp_path_factory.mktemp("profiles")
    cache: dict[tuple, Path] = {}

    def write(scenario_name: str, fmt: str, pid: int | None = None) -> Path:
        pid = pid if fmt == "kineto" else None
        key = (scenario_name, fmt, pid)
        if key not in cache:
            tag = "" if pid is None else f".pid{pid}"
            cache[key] = write_scenario(SCENARIOS[scenario_name](), fmt, root / f"{scenario_name}{tag}{SUFFIX[fmt]}", pid)
        return cache[key]

    return write


@pytest.fixture(scope="session")
def open_profile(write_profile):
    from gpuscope.tools.model.trace import load_trace

    traces: dict[tuple, object] = {}

    def open_(scenario_name: str, fmt: str, pid: int | None = None):
        pid = pid if fmt == "kineto" else None
        key = (scenario_name, fmt, pid)
        if key not in traces:
            traces[key] = load_trace(write_profile(scenario_name, fmt, pid))
        return traces[key]

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
