"""Nsight Systems reader: real exports 2020-2026 and synthetic round trips through the fixture writer."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from conftest import DATA as SHARED_DATA, CountingSqlite
from gpuscope.fixtures.scenario import ApiCall, Device, Kernel, Marker, MemOp, Process, Scenario, Thread
from gpuscope.fixtures.writers import nsys as writer
from gpuscope.tools.analyses.iterations import iterations
from gpuscope.tools.analyses.marker_summary import marker_summary
from gpuscope.tools.analyses.ops_summary import ops_summary
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

DATA = SHARED_DATA / "nsys"


# ---------------------------------------------------------------------------------------------
# (a) real exports
# ---------------------------------------------------------------------------------------------
def real(name: str) -> Path:
    if not DATA.is_dir():
        pytest.skip(f"real profiles not available ({DATA})")
    return DATA / name


@pytest.fixture(scope="module")
def traces():
    if not DATA.is_dir():
        pytest.skip(f"real profiles not available ({DATA})")
    out = {p.name: load_trace(p) for p in sorted(DATA.glob("*.sqlite"))}
    yield out
    for t in out.values():
        t.close()


def raw(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# file: (kernels, streams, copies, sets, runtime rows, api calls, copy kinds)
FACTS = {
    "nsys2026.1_rtx3080_torch_tiny.sqlite": (2, 1, 1, 0, 9, 9, {"DtoH": 1}),
    "nsys2026.1_rtx4060ti_4streams_memcpy.sqlite": (4, 4, 12, 0, 45, 45, {"HtoD": 8, "DtoH": 4}),
    "nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite": (12, 10, 30, 17, 184, 184, None),
    "nsys2022.1_gtx1060_5streams_extrap.sqlite": (9, 5, 11, 1, 71, 71, None),
    "nsys_oldschema_4xA100_sampling_extrap.sqlite": (6, 1, 0, 0, 36, 18, {}),  # 18 eventClass-67 backtrace duplicates
}


@pytest.mark.real_data
@pytest.mark.parametrize("name", sorted(FACTS))
def test_real_counts(traces, name):
    t = traces[name]
    n_k, n_streams, n_copy, n_set, n_rt, n_api, kinds = FACTS[name]
    assert t.format == "nsys" and t.meta["format"] == "nsys"
    assert t.count("kernels") == n_k
    assert t.scalar("SELECT count(DISTINCT stream_id) FROM kernels") == n_streams
    assert t.scalar("SELECT count(*) FROM memops WHERE op = 'copy'") == n_copy
    assert t.scalar("SELECT count(*) FROM memops WHERE op = 'set'") == n_set
    assert raw(t.path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0] == n_rt
    assert t.count("api_calls") == n_api
    if kinds is not None:
        assert dict(t.sql("SELECT kind, count(*) FROM memops WHERE op = 'copy' GROUP BY kind")) == kinds
    assert not t.sql("SELECT name FROM api_calls WHERE regexp_matches(name, '_v[0-9]+$')")
    assert t.scalar("SELECT count(*) FROM api_calls WHERE name = 'cudaLaunchKernel'") >= 1
    assert t.scalar("SELECT count(*) FROM kernels WHERE dur_ns <> end_ns - start_ns") == 0
    assert ("absent", "cpu_ops: only PyTorch traces have CPU operators") in t.sql("SELECT key, value FROM trace_meta")
    assert int(t.meta["capture_end_ns"]) > int(t.meta["capture_start_ns"])


@pytest.mark.real_data
@pytest.mark.parametrize("name", sorted(FACTS))
def test_real_kernel_stats_match_raw_sqlite(traces, name):
    t = traces[name]
    want = raw(t.path, """SELECT s.value, count(*), sum(k.end - k.start), min(k.end - k.start), max(k.end - k.start)
                          FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName GROUP BY 1 ORDER BY 1""")
    got = t.sql("SELECT name, count(*), sum(dur_ns), min(dur_ns), max(dur_ns) FROM kernels GROUP BY 1 ORDER BY 1")
    assert [tuple(int(x) if not isinstance(x, str) else x for x in r) for r in got] == want
    linked = raw(t.path, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                            WHERE r.correlationId = k.correlationId AND r.globalTid / 16777216 = k.globalPid / 16777216 AND r.eventClass <> 67)""")
    assert t.scalar("SELECT count(*) FROM kernels WHERE launched") == linked[0][0]


@pytest.mark.real_data
def test_real_versions_devices_and_drift(traces):
    modern = traces["nsys2026.1_rtx3080_torch_tiny.sqlite"]
    assert (modern.meta["format_version"], modern.meta["product_version"]) == ("3.24.14", "2026.1.1.204")
    assert modern.sql("SELECT name, is_compute, sm_count, memory_bandwidth_bytes_per_s, clock_hz, compute_capability FROM devices") == [
        ("NVIDIA GeForce RTX 3080", True, 68, 760_080_000_000, 1_710_000_000, "8.6")]
    assert modern.sql("SELECT bytes, src_kind, dst_kind FROM memops") == [(4, "Device", "Pinned")]
    assert modern.sql("SELECT DISTINCT pid, tid FROM kernels") == [(91186, 91186)]
    assert "python" in modern.sql("SELECT name FROM processes WHERE pid = 91186")[0][0]

    win = traces["nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite"]  # non-UTF-8 metadata, no ENUM tables
    assert (win.meta["format_version"], win.meta["product_version"]) == ("2.9.1", "2022.1.1.61")
    assert win.sql("SELECT device_id, name, is_compute, sm_count FROM devices ORDER BY 1") == [
        (0, "GeForce GTX 1060 with Max-Q Design", True, 10), (1, "Intel(R) HD Graphics 630", False, None),
        (2, "Microsoft Basic Render Driver", False, None)]
    assert any("2 non-CUDA adapters" in w for w in win.warnings)
    assert any("built-in copy-kind map" in w for w in win.warnings)
    assert win.sql("SELECT DISTINCT pid, tid FROM api_calls") == [(24620, 23120)]  # Windows: main tid != pid
    assert win.sql("SELECT count(*), min(domain), max(domain), min(kind) FROM markers") == [
        (76, "de.tu-darmstadt.parallel.extra_prof", "de.tu-darmstadt.parallel.extra_prof", "push_pop")]
    assert win.scalar("SELECT count(*) FROM markers WHERE name = 'main'") == 1
    with pytest.raises(sqlite3.OperationalError):  # the file really holds invalid UTF-8
        sqlite3.connect(f"file:{win.path}?mode=ro", uri=True).execute("SELECT value FROM EXPORT_META_DATA").fetchall()

    five = traces["nsys2022.1_gtx1060_5streams_extrap.sqlite"]
    assert five.scalar("SELECT count(*) FROM kernels WHERE NOT launched") == 2
    assert any(w == "2 kernels have no launching API call in the profile" for w in five.warnings)
    assert ("absent", "markers") in [(k, v.split(":")[0]) for k, v in five.sql("SELECT key, value FROM trace_meta WHERE key = 'absent'")]

    old = traces["nsys_oldschema_4xA100_sampling_extrap.sqlite"]
    assert old.meta["format_version"] == "" and any("no META_DATA_EXPORT" in w for w in old.warnings)
    assert old.sql("SELECT count(*), min(name), min(sm_count), max(sm_count), min(memory_bandwidth_bytes_per_s), min(clock_hz), "
                   "bool_and(is_compute) FROM devices") == [(4, "A100-PCIE-40GB", 108, 108, 1_555_200_000_000, 1_410_000_000, True)]
    assert old.sql("SELECT DISTINCT device_id FROM kernels") == [(0,)]
    assert old.count("memops") == 0 and any(v.startswith("memops:") for v in old.sql("SELECT value FROM trace_meta WHERE key='absent'")[0])
    assert old.meta["capture_span_source"].startswith("first to last event")
    assert (int(old.meta["capture_start_ns"]), int(old.meta["capture_end_ns"])) == raw(
        old.path, "SELECT min(start), max(end) FROM OSRT_API")[0]


# ---------------------------------------------------------------------------------------------
# (b) synthetic round trips
# ---------------------------------------------------------------------------------------------
def base_scenario(**options) -> Scenario:
    """Two processes on two GPUs whose correlation ids and stream ids coincide, plus a display adapter."""
    devices = [Device(0), Device(1, name="NVIDIA A100-SXM4-80GB", sm_count=108, memory_bytes=85_899_345_920,
                                  memory_bandwidth_bytes_per_s=2_039_000_000_000, clock_hz=1_410_000_000, compute_major=8),
               Device(2, name="Intel(R) UHD Graphics 770", vendor="Intel", compute=False)]
    procs = [Process(1000, "python", rank=0, hostname="node7"), Process(2000, "trainer", rank=1, hostname="node7")]
    threads = [Thread(1000, 1000, "python"), Thread(1000, 1001, "worker"), Thread(2000, 2000, "trainer")]
    api, kernels, memops = [], [], []
    for pid, dev, t0 in ((1000, 0, 1_000_000), (2000, 1, 1_000_500)):  # same correlation ids in both processes
        for i in range(3):
            s = t0 + i * 100_000
            api.append(ApiCall(pid, pid, s, s + 5_000, "cudaLaunchKernel", correlation_id=10 + i))
            kernels.append(Kernel(dev, 7, s + 20_000, s + 20_000 + 1_000 * (i + 1) + pid, f"void gemm<{i}>(float*)", "gemm",
                                  pid, 10 + i, grid=(4, 2, 1), block=(256, 1, 1), registers_per_thread=40 + i,
                                  static_shared_bytes=1024, dynamic_shared_bytes=i * 512, graph_id=i or None))
        api.append(ApiCall(pid, pid, t0 + 400_000, t0 + 450_000, "cudaMemcpyAsync", correlation_id=20))
        memops.append(MemOp(dev, 7, t0 + 410_000, t0 + 420_000, "copy", "HtoD", 1 << 20, pid, 20))
        api.append(ApiCall(pid, pid, t0 + 460_000, t0 + 470_000, "cudaMemsetAsync", correlation_id=21))
        memops.append(MemOp(dev, 8, t0 + 461_000, t0 + 462_000, "set", "memset", 4096, pid, 21, src_kind="Device"))
        api.append(ApiCall(pid, pid, t0 + 500_000, t0 + 600_000, "cudaDeviceSynchronize", correlation_id=22))
    api.append(ApiCall(1000, 1001, 1_700_000, 1_701_000, "cudaMemcpyAsync", correlation_id=30))
    memops.append(MemOp(0, 9, 1_700_500, 1_702_000, "copy", "DtoH", 256, 1000, 30, src_kind="Device", dst_kind="Pageable"))
    api.append(ApiCall(1000, 1001, 1_710_000, 1_711_000, "cudaMemcpyPeerAsync", correlation_id=31))
    memops.append(MemOp(0, 9, 1_710_500, 1_712_000, "copy", "PtoP", 512, 1000, 31, src_kind="Device", dst_kind="Device",
                        src_device_id=0, dst_device_id=1))
    api.append(ApiCall(1000, 1001, 1_720_000, 1_721_000, "cuMemcpyHtoDAsync", correlation_id=32))
    memops.append(MemOp(0, 9, 1_720_500, 1_722_000, "copy", "HtoD", 64, 1000, 32, src_kind="Managed", dst_kind="Managed"))
    memops.append(MemOp(0, 9, 1_730_000, 1_731_000, "copy", "DtoD", 64, 1000, 33, src_kind="Device", dst_kind="Device"))  # no API call
    markers = [Marker(1000, 1000, 900_000, 1_800_000, "step"), Marker(1000, 1000, 950_000, 1_100_000, "fwd", domain="app"),
               Marker(1000, 1001, 1_650_000, 1_750_000, "copy-phase", kind="start_end"),
               Marker(1000, 1000, 1_200_000, 1_200_000, "checkpoint", kind="mark"),
               Marker(2000, 2000, 990_000, 1_500_000, "rank1", domain="NCCL")]  # domain id 1 in both processes
    return Scenario("two_proc", devices, procs, threads, api, kernels, memops, markers,
                    options={"capture_start_ns": 0, "capture_end_ns": 2_000_000, **options})


def expected(sc: Scenario) -> dict[str, list[tuple]]:
    o = sc.options
    off = o.get("nsys_time_offset_ns", 0)
    old = bool(o.get("nsys_old_schema"))
    modern = not old and o.get("nsys_meta_table") != "EXPORT_META_DATA"
    calls = {(a.pid, a.correlation_id): a for a in sc.api_calls}
    link = lambda pid, corr: calls.get((pid, corr)) if corr is not None else None  # noqa: E731
    kernels = []
    for k in sc.kernels:
        a = link(k.pid, k.correlation_id)
        kernels.append((k.device_id, k.stream_id, k.start_ns + off, k.end_ns + off, k.end_ns - k.start_ns, k.name, k.short_name,
                        *k.grid, *k.block, k.registers_per_thread, k.static_shared_bytes, k.dynamic_shared_bytes, k.correlation_id,
                        k.graph_id if modern else None, k.pid, a.tid if a else None, a is not None, False,
                        None, None))  # no NCCL payloads here: no communicator or collective (test_nccl_payloads.py)
    memops = []
    for m in sc.memops:
        a = link(m.pid, m.correlation_id)
        managed = m.src_kind == m.dst_kind == "Managed"
        src = None if m.op == "set" else m.src_kind
        memops.append((m.device_id, m.stream_id, m.start_ns + off, m.end_ns + off, m.end_ns - m.start_ns, m.op, m.kind, m.bytes,
                       "Managed" if managed else src, m.dst_kind, m.src_device_id, m.dst_device_id, m.correlation_id,
                       m.pid, a.tid if a else None, a is not None))
    api = [(a.pid, a.tid, a.start_ns + off, a.end_ns + off, a.end_ns - a.start_ns, a.name,
            "cuda_runtime" if a.name.startswith("cuda") else "cuda_driver", a.correlation_id, None, a.event_id) for a in sc.api_calls]
    markers = [(m.pid, m.tid, m.start_ns + off, (m.start_ns if m.kind == "mark" else m.end_ns) + off,
                0 if m.kind == "mark" else m.end_ns - m.start_ns, m.name, m.domain, m.kind, "nvtx", None, None) for m in sc.markers]
    devices = [(d.device_id, d.name, "NVIDIA" if d.compute else d.vendor, d.compute,
                *((d.sm_count, d.memory_bytes, d.memory_bandwidth_bytes_per_s, d.clock_hz, f"{d.compute_major}.{d.compute_minor}", 32)
                  if d.compute else (None,) * 6)) for d in sc.devices]
    pids = {p.pid for p in sc.processes} | {x.pid for x in [*sc.api_calls, *sc.kernels, *sc.memops, *sc.markers, *sc.threads]}
    procs = {p.pid: p for p in sc.processes}
    processes = [(pid, None if old or pid not in procs else procs[pid].name, procs[pid].rank if pid in procs else None,
                  None if old or pid not in procs else procs[pid].hostname) for pid in pids]
    names = {(t.pid, t.tid): t.name for t in sc.threads}
    tids = set(names) | {(x.pid, x.tid) for x in [*sc.api_calls, *sc.markers]}
    threads = [(pid, tid, names.get((pid, tid))) for pid, tid in tids]
    return {k: sorted(v, key=repr) for k, v in dict(kernels=kernels, memops=memops, api_calls=api, markers=markers,
                                                      devices=devices, processes=processes, threads=threads).items()}


DEVICE_COLS = "device_id, name, vendor, is_compute, sm_count, memory_bytes, memory_bandwidth_bytes_per_s, clock_hz, compute_capability, warp_size"


def roundtrip(sc: Scenario, tmp_path: Path):
    path = writer.write(sc, tmp_path / f"{sc.name}.sqlite")
    t = load_trace(path)
    want = expected(sc)
    for table, rows in want.items():
        got = t.sql(f"SELECT {DEVICE_COLS if table == 'devices' else '*'} FROM {table}")
        assert sorted(got, key=repr) == rows, table
    assert t.count("cpu_ops") == 0
    return t


VARIANTS = {
    "modern": {},
    "2022_no_enums": {"nsys_meta_table": "EXPORT_META_DATA", "nsys_no_enums": True},
    "modern_no_enums": {"nsys_no_enums": True},
    "old_schema": {"nsys_old_schema": True},
    "textid_only": {"nvtx_textid_only": True},
    "non_utf8": {"non_utf8": True},
    "negative_times": {"nsys_time_offset_ns": -1_500_000},
    "2022_non_utf8": {"nsys_meta_table": "EXPORT_META_DATA", "nsys_no_enums": True, "non_utf8": True},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_roundtrip(variant, tmp_path):
    sc = base_scenario(**VARIANTS[variant])
    t = roundtrip(sc, tmp_path)
    meta = t.sql("SELECT key, value FROM trace_meta")
    if variant == "old_schema":
        assert t.meta["format_version"] == "" and any("no PROCESSES table" in w for w in t.warnings)
        assert t.meta["capture_span_source"].startswith("first to last")
        assert (int(t.meta["capture_start_ns"]), int(t.meta["capture_end_ns"])) == (900_000, 1_800_000)
    else:
        era = "2022" if "2022" in variant else "modern"
        assert (t.meta["product_version"], t.meta["format_version"]) == writer.VERSIONS[era]
        off = sc.options.get("nsys_time_offset_ns", 0)
        if era == "modern":  # 2022-era exports state no session clock: the writer omits a shifted span
            assert (int(t.meta["capture_start_ns"]), int(t.meta["capture_end_ns"])) == (off, 2_000_000 + off)
        if t.meta["capture_span_source"].startswith("ANALYSIS_DETAILS"):  # start 0 assumed only without a session clock, and said
            assert ("taken as 0" in t.meta["capture_span_source"]) == (era == "2022")
    assert ("warning", "TARGET_INFO_GPU lists 1 non-CUDA adapter (Intel(R) UHD Graphics 770): listed with is_compute=false") in meta
    assert ("warning", "1 memory copies have no launching API call in the profile") in meta
    assert any(w.startswith("no ENUM_CUDA_MEMCPY_OPER") for w in t.warnings) == bool(
        sc.options.get("nsys_no_enums") or sc.options.get("nsys_old_schema"))
    if "non_utf8" in variant:
        conn = sqlite3.connect(t.path)
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("SELECT text FROM NVTX_EVENTS").fetchall()
        conn.close()
        # the writer's one EXPORT_USER value of cp1252 bytes, read with the export's metadata, is counted
        from gpuscope.tools.model.sqlite_source import NOT_UTF8

        meta_table = "META_DATA_EXPORT" if era == "modern" else "EXPORT_META_DATA"
        assert (f'native."{meta_table}"', "repaired", 1, f'"value": {NOT_UTF8}') in t.sql("SELECT * FROM data_issues")
    t.close()


def test_roundtrip_negative_times_are_kept(tmp_path):
    t = roundtrip(base_scenario(nsys_time_offset_ns=-1_500_000), tmp_path)
    assert t.scalar("SELECT min(start_ns) FROM api_calls") == -500_000
    assert t.scalar("SELECT count(*) FROM kernels WHERE start_ns < 0") == 6


def test_edge_cases_zero_length_unlaunched_and_open_range(tmp_path):
    sc = base_scenario()
    d = sc.kernels[0]
    sc.kernels += [dataclasses.replace(d, start_ns=1_300_000, end_ns=1_300_000, correlation_id=11),  # zero length, shares a launch
                   dataclasses.replace(d, start_ns=1_310_000, end_ns=1_320_000, correlation_id=999),  # no such call
                   dataclasses.replace(d, start_ns=1_330_000, end_ns=1_340_000, correlation_id=None)]
    t = roundtrip(sc, tmp_path)
    assert t.scalar("SELECT count(*) FROM kernels WHERE dur_ns = 0") == 1
    assert t.scalar("SELECT count(*) FROM kernels WHERE NOT launched") == 2
    assert "2 kernels have no launching API call in the profile" in t.warnings
    # An unterminated range (end NULL) is kept with end = start and a warning.
    conn = sqlite3.connect(t.path)
    conn.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE text = 'step'")
    conn.commit()
    conn.close()
    t2 = load_trace(t.path)
    assert t2.sql("SELECT end_ns - start_ns FROM markers WHERE name = 'step'") == [(0,)]
    assert any("1 NVTX ranges never ended" in w for w in t2.warnings)


def test_repeated_correlation_ids_do_not_duplicate_kernels(tmp_path):
    path = writer.write(base_scenario(), tmp_path / "dup.sqlite")
    conn = sqlite3.connect(path)  # a second call of process 1000 on thread 1001 reusing correlation id 10
    conn.execute("""INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT start + 1, end + 1, eventClass, globalTid + 1, correlationId, nameId,
                    returnValue, callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = 10 AND (globalTid & 16777215) = 1000""")
    # and an NVTX range 'late' on thread 1001 around that second call (a copy of 'copy-phase', the range of that thread)
    conn.execute("CREATE TEMP TABLE late AS SELECT * FROM NVTX_EVENTS WHERE text = 'copy-phase'")
    conn.execute("UPDATE late SET start = 1000000, end = 1010000, text = 'late', eventId = (SELECT max(eventId) + 1 FROM NVTX_EVENTS)")
    conn.execute("INSERT INTO NVTX_EVENTS SELECT * FROM late")
    conn.commit()
    conn.close()
    t = load_trace(path)
    assert t.count("kernels") == 6 and t.count("memops") == 8
    assert t.sql("SELECT tid FROM kernels WHERE pid = 1000 AND correlation_id = 10") == [(1000,)]
    assert any("repeats correlation ids" in w for w in t.warnings)
    # The model check says the calls share an id, so the tools rank a pair's calls and take its first: every GPU op once
    # (the kernel of id 10 is not counted per call), launched by the thread of the earlier call.
    assert t.meta["correlation_ids_unique"] == "false"
    r = ops_summary(t, group_by="kernels", limit=100)
    sc = base_scenario()
    assert r.totals.gpu_ops == len(sc.kernels) + len(sc.memops) and sum(row.count for row in r.rows) == len(sc.kernels)
    assert r.totals.summed_kernel_time_ns == sum(k.end_ns - k.start_ns for k in sc.kernels)
    # The NVTX projection ranks them the same way: the kernel of id 10 belongs to the range 'fwd' around the first call
    # on thread 1000, not to 'late' around the second one on thread 1001.
    k10 = next(k for k in sc.kernels if k.pid == 1000 and k.correlation_id == 10)
    rows = {m.name: m for m in marker_summary(t).markers}
    assert (rows["fwd"].gpu_ops, rows["fwd"].gpu_kernels, rows["fwd"].gpu_work_ns) == (1, 1, k10.end_ns - k10.start_ns)
    assert (rows["late"].count, rows["late"].gpu_ops) == (1, 0)
    assert load_trace(writer.write(base_scenario(), tmp_path / "unique.sqlite")).meta["correlation_ids_unique"] == "true"


def test_runtime_only_and_kernel_less(tmp_path):
    sc = base_scenario()
    sc.kernels, sc.memops, sc.markers = [], [], []
    t = roundtrip(sc, tmp_path)
    absent = {v.split(":")[0] for k, v in t.sql("SELECT key, value FROM trace_meta WHERE key = 'absent'")}
    assert absent == {"kernels", "memops", "markers", "cpu_ops", "memory_events"}
    assert t.count("api_calls") == len(sc.api_calls)
    # GPU-only (no RUNTIME table): kernels load, all unlinked, api_calls absent.
    sc = base_scenario()
    sc.api_calls = []
    t = roundtrip(sc, tmp_path)
    assert t.scalar("SELECT count(*) FROM kernels WHERE launched") == 0
    assert any(v.startswith("api_calls:") for (v,) in t.sql("SELECT value FROM trace_meta WHERE key = 'absent'"))


def test_file_is_not_modified_and_bad_input(tmp_path):
    path = writer.write(base_scenario(), tmp_path / "x.sqlite")
    before = path.read_bytes()
    load_trace(path).close()
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE StringIds")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileError):
        load_trace(path)


def test_scale_writer_truth(tmp_path):
    truth = writer.write_scale(tmp_path / "scale.sqlite", n_kernels=20_000, seed=3)
    t = load_trace(tmp_path / "scale.sqlite")
    assert t.count("kernels") == truth["n_kernels"] == 20_000
    assert t.scalar("SELECT count(*) FROM kernels WHERE launched") == 20_000
    got = {n: {"count": c, "total_ns": int(s), "min_ns": lo, "max_ns": hi}
           for n, c, s, lo, hi in t.sql("SELECT name, count(*), sum(dur_ns), min(dur_ns), max(dur_ns) FROM kernels GROUP BY 1")}
    assert got == truth["per_name"]
    assert re.fullmatch(r"kernel_\d\d", t.scalar("SELECT min(short_name) FROM kernels"))


def test_scale_writer_steps(tmp_path):
    # nvtx_every=8: a range around each block of 8 launches (the last block holds the 3 left), which iterations takes
    # as the steps; each step launched its block's kernels.
    truth = writer.write_scale(tmp_path / "steps.sqlite", n_kernels=2_003, seed=5, nvtx_every=8)
    r = iterations(load_trace(tmp_path / "steps.sqlite"), limit=1000)
    assert truth["n_ranges"] == 251 and (r.choice.how, r.choice.pattern) == ("auto", "layer_<N>")
    assert [s.projected_kernels for s in r.steps] == [8] * 250 + [3] and r.summaries[0].steps == 251


def test_nsys_rep_export_and_cache(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"NSYS report bytes")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUSCOPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ProfileError, match=re.escape(f"nsys export --type sqlite --output {tmp_path / 'run.sqlite'} {rep}")):
        load_trace(rep)
    # A stand-in `nsys` that "exports" a fixture and counts its calls.
    source = writer.write(base_scenario(), tmp_path / "export.sqlite")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "nsys"
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\nopen({str(tmp_path / 'calls')!r}, 'a').write('x')\n"
                    f"shutil.copy({str(source)!r}, sys.argv[sys.argv.index('--output') + 1])\n")
    fake.chmod(0o755)
    for _ in range(2):
        t = load_trace(rep)
        assert t.count("kernels") == 6 and t.path.parent == tmp_path / "cache" / "gpuscope" / "exports"
        t.close()
    assert (tmp_path / "calls").read_text().count("x") == 1  # the second open reused the export
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".sqlite") == ["export.sqlite"]  # nothing next to the report


@pytest.mark.real_data
@pytest.mark.parametrize("options, reference", [
    ({}, "nsys2026.1_rtx4060ti_4streams_memcpy.sqlite"),
    ({"nsys_meta_table": "EXPORT_META_DATA", "nsys_no_enums": True}, "nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite"),
    ({"nsys_old_schema": True}, "nsys_oldschema_4xA100_sampling_extrap.sqlite"),
])
def test_writer_ddl_matches_real_exports(tmp_path, options, reference):
    path = writer.write(base_scenario(**options), tmp_path / "w.sqlite")
    info = lambda p, t: raw(p, f'SELECT name, type, "notnull", pk FROM pragma_table_info(\'{t}\')')  # noqa: E731
    ref = real(reference)
    shared = {r[0] for r in raw(path, "SELECT name FROM sqlite_master")} & {r[0] for r in raw(ref, "SELECT name FROM sqlite_master")}
    assert len(shared) >= 6
    for table in sorted(shared):
        assert info(path, table) == info(ref, table), table
    tables = {r[0] for r in raw(path, "SELECT name FROM sqlite_master")}
    assert ("ENUM_CUDA_MEMCPY_OPER" in tables) == (not options)
    assert ("PROCESSES" in tables) == ("nsys_old_schema" not in options)


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"])
def test_a_lenient_copy_holds_a_chunk_of_rows_at_a_time(tmp_path, monkeypatch, table):
    """Tables read through sqlite3 for their free text (NVTX_EVENTS, the memory-usage table: millions of rows in long
    captures) are fetched LENIENT_CHUNK_ROWS rows at a time, not whole; the copy equals a copy made in one chunk
    (invalid UTF-8 text included), column types too."""
    import duckdb

    from gpuscope.fixtures.catalog import SCENARIOS
    from gpuscope.tools.model import sqlite_source

    path = writer.write(SCENARIOS["non_utf8"](), tmp_path / "t.sqlite")
    fetched: list[int] = []
    src = sqlite_source.open_sqlite(path)  # decodes invalid UTF-8 as the readers do
    n = src.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    assert n > 3
    con = duckdb.connect()
    whole = sqlite_source.copy_lenient(con, src, table, "whole")
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", 2)
    fetched.clear()
    assert sqlite_source.copy_lenient(con, CountingSqlite(src, "SELECT *", fetched), table, "chunks") == whole
    assert max(fetched) == 2 and sum(fetched) == n
    # the scenario's one NVTX text of invalid UTF-8 (a thread-naming range) is counted, in either copy
    assert whole == ([('native."NVTX_EVENTS"', "repaired", 1, f'"text": {sqlite_source.NOT_UTF8}')] if table == "NVTX_EVENTS" else [])
    assert con.execute("DESCRIBE whole").fetchall() == con.execute("DESCRIBE chunks").fetchall()
    assert con.execute("SELECT * FROM whole").fetchall() == con.execute("SELECT * FROM chunks").fetchall()


def test_free_text_tables_go_through_sqlite3_only_where_the_scanner_refuses_them(tmp_path, monkeypatch):
    """NVTX_EVENTS, StringIds and the other tables copied for their free text go through DuckDB's scanner (3 M NVTX
    ranges: 24 s through sqlite3); only a table whose cells the scanner refuses (here invalid UTF-8 in NVTX text) is
    read through sqlite3. The markers are the scenario's either way."""
    from gpuscope.fixtures.catalog import SCENARIOS
    from gpuscope.tools.model import sqlite_source
    from gpuscope.tools.model.trace import load_trace

    through_sqlite3, copy_lenient = [], sqlite_source.copy_lenient
    monkeypatch.setattr(sqlite_source, "copy_lenient",
                        lambda con, sq, table, target: through_sqlite3.append(table) or copy_lenient(con, sq, table, target))
    for name, lenient in (("concurrent_streams", set()), ("non_utf8", {"NVTX_EVENTS"})):
        scenario = SCENARIOS[name]()
        monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / name))
        through_sqlite3.clear()
        trace = load_trace(writer.write(scenario, tmp_path / f"{name}.sqlite"), store_now=True)
        assert set(through_sqlite3) == lenient, name
        assert trace.count("markers") == len(scenario.markers) > 0
        trace.close()


def test_a_blob_column_empty_in_the_first_chunk_stays_blob(tmp_path, monkeypatch):
    """NVTX_EVENTS.binaryData (declared TEXT) is NULL on every range but NCCL's, which may come after the first chunk
    of a lenient copy: the column is still BLOB and the payloads byte for byte, as in a copy made in one chunk."""
    import duckdb

    from gpuscope.tools.model import sqlite_source

    path = tmp_path / "t.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE t (id INTEGER, text TEXT, binaryData TEXT)")
    payloads = [bytes([i, 0, 255, 92, 120]) for i in range(3)]  # NUL, 0xff and a backslash-x among them
    src.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, f"range {i}", None) for i in range(5)]
                    + [(5 + i, "nccl", p) for i, p in enumerate(payloads)])
    src.commit()
    con = duckdb.connect()
    sqlite_source.copy_lenient(con, src, "t", "whole")
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", 2)
    sqlite_source.copy_lenient(con, src, "t", "chunks")
    for table in ("whole", "chunks"):
        assert con.execute(f"SELECT typeof(binaryData) FROM {table} WHERE id = 5").fetchone()[0] == "BLOB", table
        assert [r[0] for r in con.execute(f"SELECT binaryData FROM {table} WHERE id >= 5 ORDER BY id").fetchall()] == payloads
    assert con.execute("SELECT * FROM whole ORDER BY id").fetchall() == con.execute("SELECT * FROM chunks ORDER BY id").fetchall()


@pytest.mark.parametrize("chunk_rows", [100_000, 2])
def test_a_lenient_copy_counts_every_cell_it_changes(tmp_path, monkeypatch, chunk_rows):
    """A table the scanner refuses is copied through sqlite3, which must change some cells: text that is not UTF-8, a
    blob in a text column, a value its declared type cannot hold (NULL), a fraction in an integer column (rounded), a
    number in a blob column (the bytes of its text). Each is counted per column, whether the table is copied in one
    chunk or two rows at a time; the rest is kept."""
    import duckdb

    from gpuscope.tools.model import sqlite_source

    path = tmp_path / "t.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE t (id INTEGER, n INTEGER, x REAL, label TEXT, payload BLOB)")
    src.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [
        (1, 5, 1.5, "a", b"\x00"),
        (2, "", 2.0, "b", None),                    # '' in an integer column
        (3, "abc", "oops", "bad", None),            # text in integer and real columns; label made invalid UTF-8 below
        (4, 3.5, None, b"\x00\xff", 12),            # a fraction in an integer column; a blob in a text column; a number in a blob one
        (5, "7", 4.0, "c", "text"),                 # '7' is an integer: SQLite stores 7; text in a blob column: its bytes
        (6, "99999999999999999999", 5.0, "d", None)])  # beyond 64 bits: SQLite stores a REAL
    src.execute("UPDATE t SET label = CAST(x'41ff42' AS TEXT) WHERE id = 3")
    src.commit()
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", chunk_rows)
    con = duckdb.connect()
    got = sqlite_source.copy_lenient(con, sqlite_source.open_sqlite(path), "t", "copy")
    shown = 'native."t"'
    assert sorted(got) == sorted([
        (shown, "repaired", 3, f'"n": {sqlite_source.not_of_type("BIGINT")}'),
        (shown, "repaired", 1, f'"n": {sqlite_source.FRACTION_ROUNDED}'),
        (shown, "repaired", 1, f'"x": {sqlite_source.not_of_type("DOUBLE")}'),
        (shown, "repaired", 1, f'"label": {sqlite_source.NOT_UTF8}'),
        (shown, "repaired", 1, f'"label": {sqlite_source.BLOB_AS_TEXT}'),
        (shown, "repaired", 1, f'"payload": {sqlite_source.NUMBER_AS_BLOB}')])
    assert con.execute("SELECT id, n, x, label, payload FROM copy ORDER BY id").fetchall() == [
        (1, 5, 1.5, "a", b"\x00"), (2, None, 2.0, "b", None), (3, None, None, "A\ufffdB", None),
        (4, 4, None, "b'\\x00\\xff'", b"12"), (5, 7, 4.0, "c", b"text"), (6, None, 5.0, "d", None)]


def test_a_lenient_copy_counts_text_after_ten_thousand_numbers(tmp_path):
    """A column's kind is decided on its first 10,000 values: numbers there, a later text cell is read as NULL, and
    counted once."""
    import duckdb

    from gpuscope.tools.model import sqlite_source

    path = tmp_path / "t.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE t (id INTEGER, v REAL)")
    src.executemany("INSERT INTO t VALUES (?, ?)", [(i, i + 0.5 if i % 2 else i) for i in range(10_000)] + [(10_000, "late")])
    src.commit()
    con = duckdb.connect()
    got = sqlite_source.copy_lenient(con, sqlite_source.open_sqlite(path), "t", "copy")
    assert got == [('native."t"', "repaired", 1, f'"v": {sqlite_source.NOT_A_NUMBER}')]
    assert con.execute("SELECT count(v), sum(v) FROM copy").fetchone() == (10_000, sum(i + 0.5 if i % 2 else i for i in range(10_000)))


@pytest.mark.parametrize("chunk_rows", [100_000, 2])
def test_a_lenient_copy_keeps_64_bit_integers_beside_nulls(tmp_path, monkeypatch, chunk_rows):
    """Nsight's globalTid-like ids pass 2**53; in a column with NULLs (NVTX_EVENTS.endGlobalTid) pandas' own inference
    made them floats, and 2**56 + 1 came back as 2**56. A lenient copy keeps every integer exact."""
    import duckdb

    from gpuscope.tools.model import sqlite_source

    path = tmp_path / "t.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE t (id INTEGER, tid INTEGER, text TEXT)")
    values = [2**56 + 1, None, 2**62 + 7, None, -(2**60) - 3]
    src.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, v, "x") for i, v in enumerate(values)])
    src.execute("UPDATE t SET text = CAST(x'ff' AS TEXT) WHERE id = 0")  # what sends NVTX_EVENTS this way
    src.commit()
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", chunk_rows)
    con = duckdb.connect()
    sqlite_source.copy_lenient(con, sqlite_source.open_sqlite(path), "t", "copy")
    assert [r[0] for r in con.execute("SELECT tid FROM copy ORDER BY id").fetchall()] == values
    assert con.execute("SELECT typeof(tid) FROM copy LIMIT 1").fetchone()[0] == "BIGINT"


@pytest.mark.parametrize("chunk_rows", [100_000, 2])
def test_a_lenient_copy_keeps_a_blob_column_of_numbers(tmp_path, monkeypatch, chunk_rows):
    """A BLOB column holding only numbers (pandas types it as numbers) is not cast to NULL: each is kept as the bytes
    of its text, as SQLite's CAST gives (a REAL as SQLite writes it, not as Python does: '1.0e+20', not '1e+20'), and
    counted. The same for numbers among blobs."""
    import duckdb

    from gpuscope.tools.model import sqlite_source

    path = tmp_path / "t.sqlite"
    src = sqlite3.connect(path)
    src.execute("CREATE TABLE t (id INTEGER, payload BLOB)")
    src.execute("CREATE TABLE u (id INTEGER, payload BLOB)")
    numbers = [12, 13, 2.5, None, 1e20, 0.1 + 0.2, 2**60 + 1, float("inf")]
    src.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(numbers, 1)))
    src.executemany("INSERT INTO u VALUES (?, ?)", [(1, b"\x01"), (2, b"\x02"), (3, 1e20)])
    src.commit()
    want = src.execute("SELECT CAST(payload AS BLOB) FROM t ORDER BY id").fetchall()
    assert want[4] == (b"1.0e+20",)  # SQLite's text, not Python's str()
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", chunk_rows)
    con = duckdb.connect()
    got = sqlite_source.copy_lenient(con, sqlite_source.open_sqlite(path), "t", "copy")
    assert got == [('native."t"', "repaired", 7, f'"payload": {sqlite_source.NUMBER_AS_BLOB}')]
    assert con.execute("SELECT payload FROM copy ORDER BY id").fetchall() == want
    got = sqlite_source.copy_lenient(con, sqlite_source.open_sqlite(path), "u", "copy_u")
    assert got == [('native."u"', "repaired", 1, f'"payload": {sqlite_source.NUMBER_AS_BLOB}')]
    assert con.execute("SELECT payload FROM copy_u ORDER BY id").fetchall() == [(b"\x01",), (b"\x02",), (b"1.0e+20",)]


def test_ten_million_kernels_build_under_a_128_mib_limit(tmp_path, monkeypatch):
    """10,000,000 kernels, each launched by its own cudaLaunchKernel, build under GPUSCOPE_MEMORY_LIMIT=128MiB: every
    kernel kept and linked, per-name figures equal to the generator's. The kernels insert joins every kernel with its
    launching call; DuckDB hashed the side it estimates smaller, the scanned kernels (their max rowid - 1, one below
    the calls' count), every column of them, and ran out of memory here (112 MiB is enough for the calls' side)."""
    truth = writer.write_scale(tmp_path / "scale.sqlite", n_kernels=10_000_000)
    monkeypatch.setenv("GPUSCOPE_MEMORY_LIMIT", "128MiB")
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    trace = load_trace(tmp_path / "scale.sqlite", store_now=True)
    try:
        got = trace.sql("SELECT name, count(*), sum(dur_ns)::BIGINT, min(dur_ns), max(dur_ns), count(*) FILTER (WHERE launched) "
                        "FROM kernels GROUP BY 1")
        assert {r[0]: tuple(r[1:]) for r in got} == {
            name: (v["count"], v["total_ns"], v["min_ns"], v["max_ns"], v["count"]) for name, v in truth["per_name"].items()}
        assert sum(v["count"] for v in truth["per_name"].values()) == truth["n_kernels"]
    finally:
        trace.close()
