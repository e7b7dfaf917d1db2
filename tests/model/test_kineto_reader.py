"""PyTorch profiler (Kineto) reader: real traces, fixture round trips, bad input.

Facts about the real traces are recomputed here from the raw JSON (stdlib json/gzip, exact decimal
timestamps) rather than taken from the reader.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import DATA as SHARED_DATA
from gpuscope.fixtures.scenario import ApiCall, CpuOp, Device, Kernel, Marker, MemOp, Process, Scenario, Thread
from gpuscope.fixtures.writers import kineto as writer
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.names import short_name
from gpuscope.tools.model.trace import load_trace

DATA = SHARED_DATA / "pytorch"
REAL = sorted(DATA.glob("*.json.gz")) if DATA.is_dir() else []
GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset"}


# -- real traces ------------------------------------------------------------------------------------


def _raw(path: Path) -> dict:
    with gzip.open(path, "rb") as fh:
        return json.loads(fh.read(), parse_float=Decimal)


def _ns(v) -> int:
    return int((Decimal(v) * 1000).to_integral_value())


@pytest.fixture(scope="module", params=[p.name for p in REAL] or [pytest.param("none", marks=pytest.mark.skip("no shared/data/pytorch"))])
def real(request):
    path = DATA / request.param
    trace = load_trace(path)
    yield path.name, _raw(path), trace
    trace.close()


def test_real_trace_matches_raw_json(real):
    name, doc, trace = real
    ev = doc["traceEvents"]
    assert trace.format == "kineto" and trace.meta["format"] == "kineto"
    assert trace.count("native.events") == len(ev)
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    kinds = Counter(GPU_CATS[e["cat"]] for e in gpu)
    got = trace.scalar("SELECT [count(*) FILTER (WHERE op = 'copy'), count(*) FILTER (WHERE op = 'set')] FROM memops")
    assert (trace.count("kernels"), *got) == (kinds["kernel"], kinds["memcpy"], kinds["memset"])
    runtime = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime")]
    assert trace.count("api_calls") == len(runtime)
    assert trace.count("cpu_ops") == sum(e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function") for e in ev)
    assert trace.count("markers") == sum(e.get("ph") == "X" and e.get("cat") in ("user_annotation", "gpu_user_annotation") for e in ev)
    # GPU work without a launching runtime call in the trace, by correlation id
    corrs = {e["args"].get("correlation") for e in runtime}
    unlinked = sum(e["args"].get("correlation") not in corrs for e in gpu)
    assert trace.scalar("SELECT (SELECT count(*) FILTER (WHERE NOT launched) FROM kernels) + "
                        "(SELECT count(*) FILTER (WHERE NOT launched) FROM memops)") == unlinked
    if unlinked:
        assert any(f"{unlinked} of {len(gpu)} GPU operations" in w for w in trace.warnings)
    # exact integer ns: round(ts*1000) of the decimal text, and the device from args.device (not the pid)
    want = Counter((int(e["args"]["device"]), e["tid"], _ns(e["ts"]), _ns(e["dur"])) for e in gpu if e["cat"] in ("kernel", "Kernel"))
    assert Counter(trace.sql("SELECT device_id, stream_id, start_ns, dur_ns FROM kernels")) == want
    assert trace.scalar("SELECT count(*) FROM kernels WHERE launched AND (pid IS NULL OR tid IS NULL)") == 0
    props = {p["id"]: p["name"] for p in doc.get("deviceProperties", [])}
    devices = dict(trace.sql("SELECT device_id, name FROM devices"))
    assert {k: devices[k] for k in props} == props
    dist = doc.get("distributedInfo") or {}
    if dist.get("rank") is not None:
        assert trace.meta["rank"] == str(dist["rank"]) and trace.sql("SELECT rank FROM processes") == [(dist["rank"],)]
    cpu_pids = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_labels" and e["args"]["labels"] == "CPU"}
    assert {p for (p,) in trace.sql("SELECT pid FROM processes")} == cpu_pids
    lo = min(_ns(e["ts"]) for e in ev if e.get("ph") == "X")
    hi = max(_ns(e["ts"]) + _ns(e["dur"]) for e in ev if e.get("ph") == "X")
    assert (trace.meta_int("capture_start_ns"), trace.meta_int("capture_end_ns")) == (lo, hi)
    if "baseTimeNanoseconds" in doc:
        assert trace.meta["base_time_ns"] == str(doc["baseTimeNanoseconds"])


def test_real_trace_kernels_carry_the_process_group_and_collective_of_their_args(real):
    """kernels.communicator / .collective = the kernel event's args 'Process Group Name' / 'Collective name' (ROCm's
    ncclDevKernel_Generic and NVIDIA's NCCL kernels in the distributed traces), NULL where the args have none."""
    name, doc, trace = real
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")]
    want = Counter((e["tid"], _ns(e["ts"]), (e.get("args") or {}).get("Process Group Name"),
                    (e.get("args") or {}).get("Collective name")) for e in kernels)
    assert Counter(trace.sql("SELECT stream_id, start_ns, communicator, collective FROM kernels")) == want


def test_real_trace_native_args_are_the_files_args(real):
    name, doc, trace = real
    if len(doc["traceEvents"]) > 20_000:
        pytest.skip("checked on the smaller traces")
    rows = trace.sql("SELECT ph, name, args FROM native.events ORDER BY idx")
    for (ph, ev_name, args), e in zip(rows, json.loads(json.dumps(doc["traceEvents"], default=float))):
        assert (ph, ev_name) == (e.get("ph"), e.get("name"))
        assert (json.loads(args) if args else {}) == (e.get("args") or {})


MODEL_TABLES = ("trace_meta", "devices", "processes", "threads", "kernels", "memops", "api_calls", "markers", "cpu_ops",
                "memory_events", "data_issues")


def _fingerprint(trace) -> dict:
    """Every row of native.events (with its idx) and of the model tables, as hashes; with their rowids where the reader
    inserts in event order (the other tables come from parallel DISTINCT/UNION, in no set order)."""
    out = {"events": trace.sql("SELECT count(*), sum(hash(idx, ph, cat, name, pid, tid, ts_ns, dur_ns, args, time_issue)) "
                               "FROM native.events")}
    for t in MODEL_TABLES:
        rowid = "rowid, " if t in ("kernels", "memops", "api_calls", "cpu_ops", "memory_events") else ""
        out[t] = trace.sql(f"SELECT count(*), sum(hash({rowid}x)) FROM {t} x")
    return out


@pytest.mark.parametrize("name", [p.name for p in REAL[:4]] + ["fixture"])
def test_parts_read_like_the_whole_array(name, tmp_path, monkeypatch):
    """The traceEvents array cut into many parts (read by one thread each) gives the same events in the same order,
    and the same model, as the array read whole - on real traces and on a fixture holding every event kind."""
    path = DATA / name if name != "fixture" else writer.write(_scenario("parts", rank=1), tmp_path / "parts.pt.trace.json")
    if not path.exists():
        pytest.skip("no shared/data/pytorch")
    from gpuscope.tools.model.readers import kineto

    got = {}
    for parts in (1, 7):
        monkeypatch.setattr(kineto, "_parts", lambda size, threads, n=parts: 1 if threads == 1 else n)
        monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / f"cache{parts}"))
        trace = load_trace(path)
        try:
            got[parts] = _fingerprint(trace)
        finally:
            trace.close()
    assert got[7] == got[1] and got[1]["events"][0][0] > 0


def test_a_cut_inside_a_string_reads_the_array_whole(tmp_path, monkeypatch):
    """Names holding '}, {' put cuts inside strings: the reader notices (a part is not JSON) and reads it whole."""
    from gpuscope.tools.model.readers import kineto

    s = _scenario("cuts", rank=1)
    for k in s.kernels:
        k.name = 'void odd<x}, {"ph": "X"}, {y>(float*)'
    path = writer.write(s, tmp_path / "cuts.pt.trace.json")
    monkeypatch.setattr(kineto, "_parts", lambda size, threads: 1 if threads == 1 else 7)
    monkeypatch.setattr(kineto, "_BOUNDARY", re.compile(rb"\}, \{"))  # finds the cuts inside the names too
    staged, stage = [], kineto._stage
    monkeypatch.setattr(kineto, "_stage", lambda *a: staged.append(a[-1]) or stage(*a))  # a[-1]: threads
    trace = load_trace(path)
    try:
        assert len(staged) == 2 and staged[1] == 1  # parts, then the array whole
        assert trace.sql("SELECT DISTINCT name FROM kernels") == [('void odd<x}, {"ph": "X"}, {y>(float*)',)]
        assert trace.count("kernels") == len(s.kernels)
    finally:
        trace.close()


def _open(name: str):
    if not (DATA / name).exists():
        pytest.skip("no shared/data/pytorch")
    return load_trace(DATA / name)


def test_real_trace_facts_from_readme():
    t = _open("amd_mi300x_resnet_actckpt_train_8rank_r0_tracelens.json.gz")
    assert any("968 of 3653 GPU operations" in w for w in t.warnings)
    assert (t.meta["rank"], t.meta["world_size"], t.meta["distributed_backend"]) == ("0", "8", "nccl")
    assert t.sql("SELECT count(*), min(stream_id), max(stream_id) FROM kernels WHERE short_name = 'ncclDevKernel_Generic'") == [(17, 4, 4)]
    assert t.sql("SELECT DISTINCT api FROM api_calls") == [("hip",)]
    assert t.scalar("SELECT vendor FROM devices WHERE device_id = 2") == "AMD"
    t = _open("amd_mi300x_qwen1.5-0.5b_infer_tracelens.json.gz")
    # deviceProperties lists id 0; the GPU events say device 2 (HSA agent id): same model, so it is named
    assert t.sql("SELECT device_id, name, sm_count FROM devices ORDER BY 1") == [(0, "AMD Instinct MI300X VF", 304), (2, "AMD Instinct MI300X VF", 304)]
    assert any("HSA agent id" in w for w in t.warnings)
    assert t.meta["product_version"] == "HIP runtime 6.4.43483"
    t = _open("amd_mi250_minitoy_train_rocm6.2_hta.json.gz")
    assert t.sql("SELECT DISTINCT d.device_id, d.name, d.compute_capability, d.warp_size FROM devices d JOIN kernels USING (device_id)") == [
        (2, "AMD Radeon Graphics", "9.0", 64)]
    assert t.scalar("SELECT count(grid_x) FROM kernels") == 0  # no grid on any kernel: NULL, not 0
    t = _open("nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz")
    assert t.sql("SELECT name, vendor, compute_capability FROM devices") == [("NVIDIA H100 80GB HBM3", "NVIDIA", "9.0")]
    assert any("509 of 1707 GPU operations" in w for w in t.warnings)
    assert t.meta["product_version"] == "CUDA runtime 12.4"
    # sub-µs GPU ops keep their ns (HTA's µs rounding made 285 of them zero or negative)
    assert t.scalar("SELECT count(*) FROM (SELECT dur_ns FROM kernels UNION ALL SELECT dur_ns FROM memops) WHERE dur_ns < 1000") == 184
    for rank in (0, 1):
        t = _open(f"nv_encdec_train_128rank_sampled_r{rank}_hta.json.gz")
        assert (t.meta["rank"], t.meta["world_size"]) == (str(rank), "128")
        assert t.sql("SELECT device_id, name FROM devices") == [(rank, None)]  # no deviceProperties: unknown, said so
        assert any("no deviceProperties" in w for w in t.warnings) and any("no flow (ac2g) events" in w for w in t.warnings)
        assert t.scalar("SELECT count(*) FILTER (WHERE NOT launched) FROM kernels") == 0  # linked without flows
    t = _open("nv_a100_alexnet_small_hta.json.gz")
    assert t.meta["timestamp_format"] == "absolute epoch microseconds" and "base_time_ns" not in t.meta
    assert t.scalar("SELECT name FROM devices WHERE device_id = 0") == "NVIDIA A100-PG509-200"


# -- fixture round trips ---------------------------------------------------------------------------


H100 = Device(0)
MI300X = Device(0, name="AMD Instinct MI300X", vendor="AMD", sm_count=304, memory_bytes=205_822_885_888, compute_major=9, compute_minor=4)
GEMM = "void gemm_kernel<float, 128>(float const*, float const*, float*, int, int, int)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"


def _scenario(name: str, device: Device = H100, t0: int = 1_000_000, step: int = 10_000, options: dict | None = None,
              rank: int | None = None) -> Scenario:
    """Two launches, a copy, a memset, a sync, an annotation; times are t0 + multiples of `step`."""
    pid, s = 4242, Scenario(name, [device, Device(1)] if device is H100 else [device], [Process(4242, "python train.py", rank=rank)],
                            [Thread(4242, 4242, "python"), Thread(4242, 4250, "pt_autograd_0")], options=dict(options or {}))
    t = lambda k: t0 + k * step  # noqa: E731
    s.markers.append(Marker(pid, 4242, t(0), t(40), "ProfilerStep#1"))
    for i, (name_, tid) in enumerate([(GEMM, 4242), (ADD, 4250)]):
        s.cpu_ops.append(CpuOp(pid, tid, t(1 + 4 * i), t(4 + 4 * i), "aten::mm", 10 + i, [[64, 64], [64, 64]], ["float", "float"]))
        s.api_calls.append(ApiCall(pid, tid, t(2 + 4 * i), t(3 + 4 * i), "cudaLaunchKernel", 100 + i, 10 + i))
        s.kernels.append(Kernel(0, 7 + 6 * i, t(10 + 5 * i), t(14 + 5 * i), name_, "", pid, 100 + i, grid=(128, 2, 1),
                                block=(256, 1, 1), registers_per_thread=64, static_shared_bytes=1024, dynamic_shared_bytes=2048))
    s.cpu_ops.append(CpuOp(pid, 4242, t(20), t(23), "aten::copy_", 12))
    s.api_calls.append(ApiCall(pid, 4242, t(21), t(22), "cudaMemcpyAsync", 102, 12))
    s.memops.append(MemOp(0, 7, t(24), t(26), "copy", "HtoD", 1 << 20, pid, 102))
    s.api_calls.append(ApiCall(pid, 4242, t(27), t(28), "cudaMemsetAsync", 103))
    s.memops.append(MemOp(0, 7, t(29), t(30), "set", "memset", 4096, pid, 103, src_kind="Device", dst_kind="Device"))
    s.api_calls.append(ApiCall(pid, 4242, t(31), t(39), "cudaStreamSynchronize", 104))
    return s


def _check_round_trip(s: Scenario, path: Path, pid: int | None = None, legacy: bool = False) -> object:
    writer.write(s, path, pid, legacy=legacy)
    trace = load_trace(path)
    pid = s.processes[0].pid if pid is None else pid
    amd, tb = bool(s.options.get("kineto_amd")), legacy
    legacy = legacy or bool(s.options.get("kineto_legacy"))
    missing = int(s.options.get("kineto_amd_missing_grid", 0)) if amd else 0
    calls = {a.correlation_id: a for a in s.api_calls if a.pid == pid}
    hip = lambda n: "hip" + n[4:] if amd and n.startswith("cuda") else n  # noqa: E731
    kernels = [k for k in s.kernels if k.pid == pid]

    def launch(op):
        call = calls.get(op.correlation_id) if op.correlation_id is not None else None
        return (pid, call.tid if call else None, call is not None)

    def launch_cfg(i, k):
        if missing and i % missing == missing - 1:
            return (None,) * 6
        return (*k.grid, *k.block)

    def comm(k):  # the process group and operation of an NCCL kernel's args, as written
        a = s.options.get("kineto_args", {}).get(("kernel", pid, k.correlation_id), {})
        return (a.get("Process Group Name"), a.get("Collective name"))

    want = sorted((k.device_id, k.stream_id, k.start_ns, k.end_ns, k.end_ns - k.start_ns, k.name, short_name(k.name), *launch_cfg(i, k),
                   k.registers_per_thread, k.static_shared_bytes + k.dynamic_shared_bytes, None, k.correlation_id, k.graph_id,
                   *launch(k), False, *comm(k)) for i, k in enumerate(kernels))
    assert sorted(trace.sql("SELECT * FROM kernels")) == want
    want = sorted((m.device_id, m.stream_id, m.start_ns, m.end_ns, m.end_ns - m.start_ns, m.op, m.kind, m.bytes,
                   m.src_kind if m.op == "copy" else None, m.dst_kind, m.src_device_id, m.dst_device_id, m.correlation_id, *launch(m))
                  for m in s.memops if m.pid == pid)
    assert sorted(trace.sql("SELECT * FROM memops")) == want
    want = sorted((a.pid, a.tid, a.start_ns, a.end_ns, a.end_ns - a.start_ns, hip(a.name),
                   "hip" if amd else "cuda_driver" if a.name.startswith("cuLaunch") else "cuda_runtime", a.correlation_id, a.external_id, None)
                  for a in calls.values())
    assert sorted(trace.sql("SELECT * FROM api_calls")) == want
    want = sorted((m.pid, m.tid, m.start_ns, m.end_ns, m.end_ns - m.start_ns, m.name, "", "annotation", "pytorch", None, None)
                  for m in s.markers if m.pid == pid)
    assert sorted(trace.sql("SELECT * FROM markers")) == want
    want = sorted((o.pid, o.tid, o.start_ns, o.end_ns, o.end_ns - o.start_ns, o.name, "cpu_op", o.external_id, None,
                   json.dumps(o.input_dims), json.dumps(o.input_types)) for o in s.cpu_ops if o.pid == pid)
    assert sorted(trace.sql("SELECT * EXCLUDE (input_strides, concrete_inputs, args) FROM cpu_ops")) == want
    assert trace.sql("SELECT DISTINCT input_strides, concrete_inputs FROM cpu_ops") in ([], [(None, None)])
    want = sorted((d.device_id, d.name, d.vendor, True, d.sm_count, d.memory_bytes, None, None, f"{d.compute_major}.{d.compute_minor}",
                   64 if d.vendor == "AMD" else 32, None) for d in s.devices if d.compute)
    assert sorted(trace.sql("SELECT * FROM devices")) == want
    proc = next(p for p in s.processes if p.pid == pid)
    assert trace.sql("SELECT * FROM processes") == [(pid, proc.name, proc.rank, None)]
    assert sorted(trace.sql("SELECT * FROM threads")) == sorted((t.pid, t.tid, t.name) for t in s.threads if t.pid == pid)
    rows = [o for o in [*kernels, *s.memops, *calls.values(), *s.markers, *s.cpu_ops] if o.pid == pid]
    if rows:
        assert (trace.meta_int("capture_start_ns"), trace.meta_int("capture_end_ns")) == (
            min(r.start_ns for r in rows), max(r.end_ns for r in rows))
    assert trace.meta["format_version"] == ("" if legacy and not tb else "1")
    n_unlinked = sum(not launch(o)[2] for o in [*kernels, *s.memops] if o.pid == pid)
    assert any(f"{n_unlinked} of" in w for w in trace.warnings) == bool(n_unlinked)
    return trace


def test_round_trip_modern(tmp_path):
    t = _check_round_trip(_scenario("modern", rank=3), tmp_path / "modern.pt.trace.json")
    assert t.meta["base_time_ns"] == str(writer.BASE_TIME_NS) and t.meta["rank"] == "3"
    assert t.meta["product_version"] == "CUDA runtime 12.4"
    assert t.sql("SELECT DISTINCT short_name FROM kernels ORDER BY 1") == [("gemm_kernel",), ("vectorized_elementwise_kernel",)]
    # the raw view: one row per event; cpu_op args put back together; non-numeric pids ('Spans') NULL
    assert t.scalar("SELECT count(*) FROM native.events WHERE cat = 'Trace' AND pid IS NULL") == 1
    args = json.loads(t.scalar("SELECT args FROM native.events WHERE cat = 'cpu_op' ORDER BY idx LIMIT 1"))
    assert args["Input Dims"] == [[64, 64], [64, 64]] and args["External id"] == 10 and "Ev Idx" in args
    assert json.loads(t.scalar("SELECT args FROM cpu_ops ORDER BY start_ns LIMIT 1")) == {"Record function id": 0, "Ev Idx": 0}


def test_round_trip_gzip_legacy_and_amd(tmp_path):
    _check_round_trip(_scenario("gz"), tmp_path / "gz.pt.trace.json.gz")
    t = _check_round_trip(_scenario("legacy", t0=1_682_725_898_236_567_000, step=3_000, options={"kineto_legacy": True}),
                          tmp_path / "legacy.json")
    assert t.scalar("SELECT count(*) FROM native.events WHERE cat IN ('Kernel', 'Runtime', 'Operator', 'Memcpy', 'Memset')") > 0
    assert "base_time_ns" not in t.meta and any("no flow" in w for w in t.warnings) is False
    t = _check_round_trip(_scenario("amd", MI300X, options={"kineto_amd": True, "kineto_amd_missing_grid": 2}), tmp_path / "amd.json")
    # GPU pid = HSA agent id (2) but args.device says 0: the device comes from args.device
    assert t.sql("SELECT DISTINCT pid FROM native.events WHERE cat = 'kernel'") == [(2,)]
    assert t.sql("SELECT DISTINCT device_id FROM kernels") == [(0,)]
    assert t.meta["product_version"].startswith("HIP runtime")


def test_round_trip_2021_format(tmp_path):
    """The TensorBoard-plugin era layout (PyTorch 1.8-1.9): ProfilerStep#N under 'Operator' is a step
    annotation, 'external id' in lower case (0 = none), string tids, 'stream N' GPU tids."""
    s = _scenario("tb", t0=1_620_000_000_000_000_000, step=3_000)
    t = _check_round_trip(s, tmp_path / "tb.pt.trace.json", legacy=True)
    assert t.sql("SELECT cat, count(*) FROM native.events WHERE ph = 'X' GROUP BY 1 ORDER BY 1") == [
        ("Kernel", 2), ("Memcpy", 1), ("Memset", 1), ("Operator", 4), ("Runtime", 5), ("Trace", 1)]
    assert t.scalar("SELECT count(*) FROM native.events WHERE name = 'ProfilerStep#1' AND cat = 'Operator'") == 1
    assert t.sql("SELECT DISTINCT tid FROM native.events WHERE cat = 'Kernel'") == [(None,)]  # "stream 7": text
    args = json.loads(t.scalar("SELECT args FROM native.events WHERE cat = 'Runtime' AND name = 'cudaMemsetAsync'"))
    assert args["external id"] == 0 and "External id" not in args
    assert t.sql("SELECT name, external_id FROM api_calls ORDER BY start_ns") == [
        ("cudaLaunchKernel", 10), ("cudaLaunchKernel", 11), ("cudaMemcpyAsync", 12), ("cudaMemsetAsync", None),
        ("cudaStreamSynchronize", None)]
    assert t.scalar("SELECT count(*) FROM native.events WHERE ph IN ('s', 'f') AND cat = 'async' AND name = 'launch'") == 8


def test_round_trip_sub_microsecond_and_zero_length(tmp_path):
    s = _scenario("subus", t0=5_000_123, step=333)  # times like 5000.456 µs, durations of 333 ns
    s.kernels.append(Kernel(0, 7, 5_000_999, 5_000_999, "void empty_kernel<float>(float*)", "", 4242, 100))
    s.kernels.append(Kernel(1, 9, 5_001_001, 5_001_002, "copy_kernel", "", 4242, None))  # unlinked, 1 ns, other GPU
    t = _check_round_trip(s, tmp_path / "subus.json")
    assert t.sql("SELECT min(dur_ns), max(dur_ns) FROM kernels") == [(0, 1332)]


def test_round_trip_graph_launch_and_unlinked(tmp_path):
    s = _scenario("graph")
    s.api_calls.append(ApiCall(4242, 4242, 3_000_000, 3_000_020, "cudaGraphLaunch", 500, None))
    for i in range(50):
        s.kernels.append(Kernel(0, 7, 3_000_100 + 40 * i, 3_000_130 + 40 * i, GEMM if i % 2 else ADD, "", 4242, 500, graph_id=9))
    s.kernels.append(Kernel(0, 7, 900_000, 900_500, ADD, "", 4242, 77))  # launched before the trace: unmatched id
    s.memops.append(MemOp(0, 7, 900_600, 900_700, "copy", "PtoP", 256, 4242, None, src_device_id=1, dst_device_id=0))
    t = _check_round_trip(s, tmp_path / "graph.json")
    assert t.sql("SELECT count(*), count(DISTINCT tid) FROM kernels WHERE correlation_id = 500 AND launched") == [(50, 1)]
    assert any("2 of 56 GPU operations" in w for w in t.warnings)


def test_round_trip_one_process_of_many_and_empty(tmp_path):
    s = _scenario("two")
    s.processes.append(Process(5151, "worker", rank=1))
    s.threads.append(Thread(5151, 5151, "worker"))
    s.api_calls.append(ApiCall(5151, 5151, 1_010_000, 1_011_000, "cudaLaunchKernel", 100))  # same correlation id as pid 4242
    s.kernels.append(Kernel(1, 7, 1_200_000, 1_300_000, GEMM, "", 5151, 100))
    _check_round_trip(s, tmp_path / "p4242.json")
    t = _check_round_trip(s, tmp_path / "p5151.json", pid=5151)
    assert t.sql("SELECT pid, tid, launched FROM kernels") == [(5151, 5151, True)]
    empty = Scenario("empty", [H100], [Process(7, "idle")], [Thread(7, 7, "idle")])
    t = _check_round_trip(empty, tmp_path / "empty.json")
    assert t.count("kernels") == 0 and "capture_start_ns" not in t.meta
    absent = dict(t.sql("SELECT split_part(value, ':', 1), value FROM trace_meta WHERE key = 'absent'"))
    assert {"kernels", "memops", "markers", "api_calls", "cpu_ops", "capture span"} <= set(absent)


def test_legacy_category_aliases(tmp_path):
    """Pre-2022 names, the gpu_user_Annotation typo, string pids and tids, 2021 arg spellings ('external id',
    'Input dims') and a ProfilerStep under 'Operator', in one hand-written trace."""
    ev = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 10, "tid": "11", "ts": 90, "dur": 50,
         "args": {"External id": 9, "Input dims": []}},
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 10, "tid": "11", "ts": 100, "dur": 10,
         "args": {"External id": 1, "Input dims": [[2, 3], [2, 3]], "Trace name": "PyTorch Profiler"}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel_v7000", "pid": "10", "tid": "11", "ts": 102, "dur": 3,
         "args": {"correlation": 5, "external id": 1, "external ts": 100}},
        {"ph": "X", "cat": "Kernel", "name": "kernel", "pid": 0, "tid": 7, "ts": 120, "dur": 2, "args": {"device": 0, "stream": 7, "correlation": 5}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 125, "dur": 0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_user_Annotation", "name": "fwd", "pid": 0, "tid": 7, "ts": 119, "dur": 9, "args": {}},
        {"ph": "s", "id": 5, "pid": 10, "tid": 11, "ts": 102, "cat": "async", "name": "launch"},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    t = load_trace(path)
    assert t.sql("SELECT name, api, pid, tid, correlation_id, external_id FROM api_calls") == [
        ("cudaLaunchKernel", "cuda_runtime", 10, 11, 5, 1)]
    assert t.sql("SELECT name, kind, pid, tid, start_ns, end_ns FROM markers WHERE kind = 'annotation'") == [
        ("ProfilerStep#5", "annotation", 10, 11, 90_000, 140_000)]
    assert t.sql("SELECT name, input_dims, args FROM cpu_ops") == [("aten::add", "[[2, 3], [2, 3]]", '{"Trace name":"PyTorch Profiler"}')]
    assert t.sql("SELECT device_id, pid, tid, launched, short_name FROM kernels") == [(0, 10, 11, True, "kernel")]
    assert t.sql("SELECT op, kind, correlation_id, launched FROM memops") == [("set", "memset", None, False)]
    assert t.sql("SELECT kind, device_id, stream_id, pid FROM markers WHERE kind <> 'annotation'") == [("gpu_annotation", 0, 7, None)]
    assert t.sql("SELECT category, external_id FROM cpu_ops") == [("cpu_op", 1)]
    assert t.sql("SELECT pid FROM processes") == [(10,)]
    assert t.sql("SELECT device_id, name FROM devices") == [(0, None)]



@pytest.mark.parametrize("first", [5, 3])
def test_a_gpu_pid_takes_its_most_frequent_device_a_tie_the_first_in_the_file(tmp_path, first):
    """A GPU op without args.device takes the device its pid's other ops name most often; between two named as often,
    the one the file names first (whatever order the reader's tables hold the ops in)."""
    other = 8 - first
    named = [first, other, other, first, 9]  # 5 and 3 twice each, 9 once
    ev = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10 * (i + 1), "dur": 5,
           "args": {"device": d, "stream": 7}} for i, d in enumerate(named)]
    ev.append({"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 100, "dur": 5, "args": {"stream": 7}})
    path = tmp_path / "tie.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    t = load_trace(path)
    assert t.sql("SELECT device_id FROM kernels WHERE name = 'orphan'") == [(first,)]
    assert t.sql("SELECT device_id FROM kernels WHERE name <> 'orphan' ORDER BY start_ns") == [(d,) for d in named]
    t.close()

# -- bad input ---------------------------------------------------------------------------------------


def _corrupt(data: bytes) -> bytes:
    mid = len(data) // 2  # past the first 4 KB that format detection decompresses
    return data[:mid] + bytes(b ^ 0x5A for b in data[mid:mid + 64]) + data[mid + 64:]


@pytest.mark.parametrize("case", ["corrupt_gzip", "corrupt_gzip_head", "truncated_gzip", "truncated_json", "no_trace_events", "empty_events",
                                  "events_not_list", "events_not_objects", "top_level_string"])
def test_bad_input_is_a_profile_error(tmp_path, case):
    good = json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2}]})
    path = tmp_path / f"{case}.json"
    data = {
        "corrupt_gzip": lambda: _corrupt(gzip.compress(good.encode() + b" " * 200_000 + json.dumps(list(range(50_000))).encode())),
        "corrupt_gzip_head": lambda: gzip.compress(good.encode())[:10] + b"\x00garbage" * 50,
        "truncated_gzip": lambda: gzip.compress(good.encode() * 50)[:-30],
        "truncated_json": lambda: good[:-20].encode(),
        "no_trace_events": lambda: b'{"schemaVersion": 1, "deviceProperties": []}',
        "empty_events": lambda: b'{"traceEvents": []}',
        "events_not_list": lambda: b'{"traceEvents": {"a": 1}}',
        "events_not_objects": lambda: b'{"traceEvents": [1, 2, 3]}',
        "top_level_string": lambda: b'["x", "y"]',
    }[case]()
    if "gzip" in case:
        path = path.with_suffix(".json.gz")
    path.write_bytes(data)
    with pytest.raises(ProfileError) as err:
        load_trace(path)
    msg = str(err.value)
    assert str(path.name) in msg and "Traceback" not in msg and len(msg) > 60


def test_round_trip_communicator_and_collective(tmp_path):
    """A job's NCCL kernels with the args PyTorch records (fixtures/scenarios_job.py: all-reduces of tensor-parallel
    groups 'tp0'/'tp1', point-to-point sends of group 'pp'), one rank's all-reduce without a process group: each
    kernel's communicator and collective as its args wrote them, NULL for the gemms."""
    from gpuscope.fixtures.scenarios_job import PID0, job

    s = job(4, 2, 2, tp_groups=2, p2p=True)
    args = s.options["kineto_args"]
    dropped = next(k for k, a in args.items() if k[1] == PID0 + 1 and a["Collective name"] == "allreduce")
    args[dropped] = {a: v for a, v in args[dropped].items() if a != "Process Group Name"}
    for r in range(4):
        pid = PID0 + r
        writer.write(s, tmp_path / f"rank{r}.json", pid)
        t = load_trace(tmp_path / f"rank{r}.json")
        want = sorted((k.start_ns, k.name, args.get(("kernel", pid, k.correlation_id), {}).get("Process Group Name"),
                       args.get(("kernel", pid, k.correlation_id), {}).get("Collective name"))
                      for k in s.kernels if k.pid == pid)
        assert t.sql("SELECT start_ns, name, communicator, collective FROM kernels ORDER BY start_ns, name") == want
        assert {c for *_, c in want} == {None, "allreduce", "send"}
        t.close()


def test_running_out_of_memory_while_building_says_so(tmp_path, monkeypatch):
    """DuckDB out of memory in the model's SQL (it happened at GPUSCOPE_MEMORY_LIMIT=80MiB with 250k kernels): the
    error names the memory and the setting, not the fallback parser's 'cannot take its layout or values'."""
    import duckdb

    from gpuscope.tools.model.readers import kineto

    def out_of_memory(con, top):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block of size 256.0 KiB")

    monkeypatch.setattr(kineto, "_build", out_of_memory)
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUSCOPE_MEMORY_LIMIT", "80MiB")
    path = writer.write(_scenario("oom"), tmp_path / "oom.pt.trace.json")
    with pytest.raises(ProfileError) as err:
        load_trace(path)
    text = str(err.value)
    assert "ran out of memory" in text and "building the trace model" in text and "GPUSCOPE_MEMORY_LIMIT (now 80 MiB)" in text
    assert "layout" not in text


def test_communicator_and_collective_only_from_names_in_the_args(tmp_path):
    """A process group or collective that is not a non-empty string or an integer names nothing: NULL, not its JSON."""
    def kernel(i, pg, coll):
        return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic(x)", "pid": 0, "tid": 7, "ts": 10 * i, "dur": 5,
                "args": {"device": 0, "stream": 7, "correlation": i, "Process Group Name": pg, "Collective name": coll}}

    cases = [({"a": 1}, ["send"]), (3, None), ("", "recv"), ("tp0", True)]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": [kernel(i + 1, *c) for i, c in enumerate(cases)]}))
    t = load_trace(path)
    assert t.sql("SELECT communicator, collective FROM kernels ORDER BY start_ns") == [
        (None, None), ("3", None), (None, "recv"), ("tp0", None)]
    t.close()
