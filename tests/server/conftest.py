"""Shared helpers for the server, CLI and error-handling tests.

`make_scenario()` builds one small, hand-checkable profile scenario; `write_profiles(folder)`
writes it in every format the fixture writers support; `write_bad_inputs(folder, good)` writes
the broken files every layer must refuse with a ProfileError / isError result.

tests/analyses/* load this file by path (see `load_helpers` there), so keep it importable
without pytest fixtures from elsewhere.
"""

from __future__ import annotations

import gzip
import random
import sqlite3
from pathlib import Path

import pytest

from gpuscope.fixtures.scenario import ApiCall, CpuOp, Device, Kernel, Marker, MemOp, Process, Scenario, Thread

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
SHARED_DATA = REPO.parent / "shared" / "data"

PID, TID = 4242, 4243

# (device, stream, full name, short name, duration ns, idle gap after it ns)
KERNEL_PLAN = [
    (0, 7, "void gemm_kernel<float, 128>(float const*, float const*, float*, int)", "gemm_kernel", 40_000, 2_000),
    (0, 7, "void relu_kernel<float>(float*, int)", "relu_kernel", 5_000, 50_000),
    (0, 7, "void gemm_kernel<float, 128>(float const*, float const*, float*, int)", "gemm_kernel", 42_000, 3_000),
    (0, 7, "void relu_kernel<float>(float*, int)", "relu_kernel", 6_000, 500_000),
    (0, 7, "void gemm_kernel<float, 128>(float const*, float const*, float*, int)", "gemm_kernel", 38_000, 5_000_000),
    (0, 7, "void softmax_kernel<float>(float*, int)", "softmax_kernel", 12_000, 1_000),
    (1, 9, "void gemm_kernel<float, 128>(float const*, float const*, float*, int)", "gemm_kernel", 20_000, 0),
]
DEVICE0_GEMM_TOTAL_NS = 40_000 + 42_000 + 38_000
DEVICE0_KERNEL_TOTAL_NS = DEVICE0_GEMM_TOTAL_NS + 5_000 + 6_000 + 12_000
DEVICE0_KERNELS = 6
TOTAL_KERNELS = 7


def make_scenario(amd: bool = False) -> Scenario:
    """One process, two GPUs; gemm dominates device 0; gaps of 1 us .. 5 ms; all times multiples of 1 us."""
    if amd:
        devices = [Device(i, name="AMD Instinct MI300X", vendor="AMD", sm_count=304, memory_bytes=205_822_885_888,
                          memory_bandwidth_bytes_per_s=5_300_000_000_000, clock_hz=2_100_000_000,
                          compute_major=9, compute_minor=4) for i in (0, 1)]
    else:
        devices = [Device(0), Device(1)]
    api: list[ApiCall] = []
    kernels: list[Kernel] = []
    memops: list[MemOp] = []
    cpu_ops: list[CpuOp] = []
    corr = ext = 1
    t = 1_000_000  # host clock
    # One pinned HtoD copy before the first kernel.
    api.append(ApiCall(PID, TID, t, t + 4_000, "cudaMemcpyAsync", corr, ext))
    cpu_ops.append(CpuOp(PID, TID, t - 1_000, t + 5_000, "aten::copy_", ext, [[1024, 256]], ["float"]))
    memops.append(MemOp(0, 7, t + 10_000, t + 30_000, "copy", "HtoD", 1 << 20, PID, corr))
    corr += 1
    ext += 1
    gpu_t = t + 40_000
    t += 10_000
    for dev, stream, name, short, dur, gap in KERNEL_PLAN:
        if dev == 1:
            gpu_t_dev = t + 20_000
        else:
            gpu_t_dev = max(gpu_t, t + 10_000)
        api.append(ApiCall(PID, TID, t, t + 3_000, "cudaLaunchKernel", corr, ext))
        cpu_ops.append(CpuOp(PID, TID, t - 1_000, t + 4_000, f"aten::{short.split('_')[0]}", ext))
        kernels.append(Kernel(dev, stream, gpu_t_dev, gpu_t_dev + dur, name, short, PID, corr,
                              grid=(64, 1, 1), block=(256, 1, 1)))
        corr += 1
        ext += 1
        t += 6_000
        if dev == 0:
            gpu_t = gpu_t_dev + dur + gap
            if gap >= 500_000:  # the host waits on the GPU through the long gaps
                api.append(ApiCall(PID, TID, t, gpu_t - 2_000, "cudaStreamSynchronize", corr))
                corr += 1
                t = gpu_t - 1_000
    end = max(k.end_ns for k in kernels) + 10_000
    markers = [Marker(PID, TID, 990_000, end, "train_step")]
    return Scenario(
        name="gpuscope-small-amd" if amd else "gpuscope-small",
        devices=devices,
        processes=[Process(PID, "python", rank=0)],
        threads=[Thread(PID, TID, "python")],
        api_calls=api, kernels=kernels, memops=memops, markers=markers, cpu_ops=cpu_ops,
        options={"kineto_amd": True} if amd else {},
    )


def write_profiles(folder: Path) -> dict[str, Path]:
    """The scenario in every format: keys 'nsys', 'rocpd', 'kineto' (.json), 'kineto_gz' (.json.gz)."""
    from gpuscope.fixtures.writers import kineto, nsys, rocpd

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    out["nsys"] = Path(nsys.write(make_scenario(), folder / "small.sqlite") or folder / "small.sqlite")
    out["rocpd"] = Path(rocpd.write(make_scenario(amd=True), folder / "small_rocpd.db") or folder / "small_rocpd.db")
    out["kineto"] = Path(kineto.write(make_scenario(), folder / "small_trace.json") or folder / "small_trace.json")
    out["kineto_gz"] = Path(kineto.write(make_scenario(), folder / "small_trace.json.gz") or folder / "small_trace.json.gz")
    assert out["kineto_gz"].read_bytes()[:2] == b"\x1f\x8b"
    return out


# Bad inputs: name -> (path, key words the error message must contain, case-insensitive; a tuple
# entry means "any of these").
def write_bad_inputs(folder: Path, good: dict[str, Path]) -> dict[str, tuple[Path, list]]:
    folder.mkdir(parents=True, exist_ok=True)
    bad: dict[str, tuple[Path, list]] = {}
    bad["missing"] = (folder / "does_not_exist.sqlite", ["no such file"])
    sub = folder / "a_folder"
    sub.mkdir(exist_ok=True)
    bad["directory"] = (sub, ["folder", "list_traces"])
    text = folder / "notes.txt"
    text.write_text("kernel times look slow, check later\n" * 20)
    bad["text"] = (text, ["not a profile", ("nsight", "supported")])
    text_sqlite = folder / "notes.sqlite"  # extension lies: content decides
    text_sqlite.write_text("this is not a database\n")
    bad["text_with_sqlite_suffix"] = (text_sqlite, ["not a profile"])

    data = good["nsys"].read_bytes()
    trunc = folder / "truncated.sqlite"
    trunc.write_bytes(data[: len(data) // 2])
    bad["truncated_sqlite"] = (trunc, [("truncated", "corrupt", "malformed")])
    trunc_head = folder / "truncated_head.sqlite"
    trunc_head.write_bytes(data[:200])  # header only: not even the schema page
    bad["truncated_sqlite_head"] = (trunc_head, [("truncated", "corrupt", "malformed")])
    plain = folder / "plain.sqlite"
    con = sqlite3.connect(plain)
    con.execute("CREATE TABLE recipes (name TEXT, minutes INTEGER)")
    con.execute("INSERT INTO recipes VALUES ('bread', 240)")
    con.commit()
    con.close()
    bad["unrelated_sqlite"] = (plain, [("not a profile", "no nsight")])

    raw_json = good["kineto"].read_bytes()
    corrupt_gz = folder / "corrupt.json.gz"
    corrupt_gz.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + random.Random(0).randbytes(300))
    bad["corrupt_json_gz"] = (corrupt_gz, ["gzip", ("corrupt", "truncated")])
    trunc_gz = folder / "truncated.json.gz"
    gz_bytes = gzip.compress(raw_json)
    trunc_gz.write_bytes(gz_bytes[: len(gz_bytes) // 2])
    bad["truncated_json_gz"] = (trunc_gz, [("corrupt", "truncated")])
    trunc_json = folder / "truncated.json"
    trunc_json.write_bytes(raw_json[: len(raw_json) // 2])
    bad["truncated_json"] = (trunc_json, [("truncated", "incomplete", "invalid", "not valid")])
    not_trace = folder / "config.json"
    not_trace.write_text('{"learning_rate": 0.001, "epochs": 3}')
    bad["json_not_a_trace"] = (not_trace, [("trace", "kineto", "pytorch")])

    rep = folder / "report.nsys-rep"  # binary report: needs `nsys export`; garbage here, and nsys may be absent
    rep.write_bytes(b"\x00NSYS-REPORT-NOT-REALLY\x00" + random.Random(1).randbytes(200))
    bad["nsys_rep_garbage"] = (rep, ["nsys"])

    empty = folder / "empty.sqlite"
    empty.write_bytes(b"")
    bad["empty"] = (empty, ["empty", "0 bytes"])
    empty_json = folder / "empty.json"
    empty_json.write_bytes(b"")
    bad["empty_json"] = (empty_json, ["empty", "0 bytes"])
    return bad


ACTION_WORDS = ("re-export", "re-capture", "re-run", "re-profile", "copy", "check", "pass ", "call ", "list_traces",
                "trace_info", "export", "use ", "supported", "allowed", "widen", "list_tables", "describe_table", "must", "pass a")


def assert_message(msg: str, words: list) -> None:
    """`msg` contains every key word (a tuple: any of them), says what to do, and shows no traceback."""
    low = msg.lower()
    for w in words:
        options = w if isinstance(w, tuple) else (w,)
        assert any(o.lower() in low for o in options), f"expected {options} in error message: {msg!r}"
    assert any(a in low for a in ACTION_WORDS), f"error message does not say what to do: {msg!r}"
    assert "traceback" not in low, msg


@pytest.fixture(scope="session")
def profiles(tmp_path_factory) -> dict[str, Path]:
    return write_profiles(tmp_path_factory.mktemp("profiles"))


@pytest.fixture(scope="session")
def bad_inputs(tmp_path_factory, profiles) -> dict[str, tuple[Path, list]]:
    return write_bad_inputs(tmp_path_factory.mktemp("bad"), profiles)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def real_profiles() -> list[Path]:
    """Real profiles under ../shared/data (empty when the folder is absent)."""
    if not SHARED_DATA.is_dir():
        return []
    out = []
    for sub, pattern in (("nsys", "*.sqlite"), ("pytorch", "*.json.gz"), ("rocpd_legacy", "*.rpd")):
        out += sorted((SHARED_DATA / sub).glob(pattern))
    return out
