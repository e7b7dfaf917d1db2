"""rocpd (rocprofv3 schema 3.x) and legacy RPD readers, and the rocpd fixture writer.

Synthetic rocpd databases come from fixtures/writers/rocpd.py; expected model rows are derived
from the Scenario here, independently of the reader. The real legacy RPD file is checked against
plain sqlite3 queries on the raw file.
"""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from conftest import DATA, CountingSqlite
from gpuscope.fixtures.scenario import ApiCall, Device, Kernel, Marker, MemOp, Process, Scenario, Thread
from gpuscope.fixtures.writers import rocpd as writer
from gpuscope.tools.model.detect import detect
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.readers import rocpd
from gpuscope.tools.model.trace import load_trace

RPD = DATA / "rocpd_legacy" / "rpd_v2_matmul_result.rpd"
OFF = writer.TIME_OFFSET_NS
MI300X = dict(vendor="AMD", name="AMD Instinct MI300X", sm_count=304, memory_bytes=205_822_885_888,
              clock_hz=2_100_000_000, compute_major=9, compute_minor=42)


def rich_scenario() -> Scenario:
    """Two GPUs, two processes with overlapping correlation ids, concurrent streams, linked and
    unlinked kernels, a zero-length kernel, copies in every GPU direction, rocTX and RCCL."""
    api = [
        ApiCall(100, 101, 1_000, 1_400, "cudaLaunchKernel", 1),
        ApiCall(100, 101, 1_500, 1_900, "cudaLaunchKernel", 2),
        ApiCall(100, 102, 2_000, 2_300, "cudaLaunchKernel", 3),
        ApiCall(100, 101, 2_500, 2_800, "cudaMemcpyAsync", 4),
        ApiCall(100, 101, 3_000, 3_200, "cudaMemcpyAsync", 5),
        ApiCall(100, 101, 3_300, 3_500, "cudaMemcpyAsync", 6),
        ApiCall(100, 101, 9_000, 12_000, "cudaStreamSynchronize", 7),
        ApiCall(100, 102, 3_600, 3_900, "ncclAllReduce", 8),
        ApiCall(200, 201, 1_000, 1_300, "cudaLaunchKernel", 1),  # same correlation id, other process
    ]
    kernels = [
        Kernel(0, 0, 4_000, 7_000, "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >(int, float*)",
               "vectorized_elementwise_kernel", 100, 1, grid=(120, 1, 1), block=(256, 1, 1), registers_per_thread=24,
               static_shared_bytes=0, dynamic_shared_bytes=0),
        Kernel(0, 3, 4_500, 6_500, "void (anonymous namespace)::softmax_warp_forward<float, 10>(float*, float const*, int)",
               "softmax_warp_forward", 100, 2, grid=(64, 2, 3), block=(128, 2, 1), registers_per_thread=64,
               static_shared_bytes=4096, dynamic_shared_bytes=2048),
        Kernel(1, 5, 5_000, 5_000, "Cijk_Alik_Bljk_HHS_BH_MT128x128x32", "Cijk_Alik_Bljk_HHS_BH_MT128x128x32", 100, 3,
               grid=(7, 782, 1), block=(256, 1, 1), registers_per_thread=128, static_shared_bytes=32768),
        Kernel(1, 5, 7_000, 8_000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 9001),  # launch not in the profile
        Kernel(1, 0, 8_000, 8_500, "gemm_kernel", "gemm_kernel", 200, 1, grid=(2, 2, 1), block=(64, 4, 1)),
    ]
    memops = [
        MemOp(0, 0, 3_000, 3_800, "copy", "HtoD", 1 << 20, 100, 4),
        MemOp(0, 3, 8_000, 8_400, "copy", "DtoH", 4096, 100, 5),
        MemOp(1, 5, 8_100, 8_300, "copy", "DtoD", 65536, 100, 6, src_device_id=1, dst_device_id=0),
        MemOp(0, 0, 9_000, 9_100, "copy", "HtoD", 8, 100, 9002),
    ]
    markers = [
        Marker(100, 101, 500, 12_500, "train_step", kind="push_pop"),
        Marker(100, 102, 1_900, 4_000, "data loader", kind="start_end"),
        Marker(100, 101, 2_400, 2_400, "checkpoint", kind="mark"),
    ]
    return Scenario(
        "rocpd_rich",
        devices=[Device(0, **MI300X), Device(1, **MI300X)],
        processes=[Process(100, "python train.py", hostname="mi300-node"), Process(200, "worker", hostname="mi300-node")],
        threads=[Thread(100, 101, "python"), Thread(100, 102, "pt_loader"), Thread(200, 201, "worker")],
        api_calls=api, kernels=kernels, memops=memops, markers=markers,
    )


def expected(sc: Scenario) -> dict[str, list[tuple]]:
    api = {(a.pid, a.correlation_id): a for a in sc.api_calls if a.end_ns > a.start_ns}
    gpu = {d.device_id for d in sc.devices}
    out: dict[str, list[tuple]] = {"kernels": [], "memops": [], "api_calls": [], "markers": []}
    for k in sc.kernels:
        a = api.get((k.pid, k.correlation_id))
        out["kernels"].append((
            k.device_id, k.stream_id, k.start_ns + OFF, k.end_ns + OFF, k.end_ns - k.start_ns, k.name, k.short_name,
            *k.grid, *k.block, k.registers_per_thread, k.static_shared_bytes, k.dynamic_shared_bytes,
            k.correlation_id, None, k.pid, a.tid if a else None, a is not None, False, None, None))  # rocpd: no communicator, collective
    for m in sc.memops:
        a = api.get((m.pid, m.correlation_id))
        src_gpu, dst_gpu = m.kind in ("DtoH", "DtoD"), m.kind in ("HtoD", "DtoD")
        peer = m.kind == "DtoD"
        out["memops"].append((
            m.device_id, m.stream_id, m.start_ns + OFF, m.end_ns + OFF, m.end_ns - m.start_ns, "copy", m.kind, m.bytes,
            "Device" if src_gpu else None, "Device" if dst_gpu else None,
            m.src_device_id if peer else None, m.dst_device_id if peer else None,
            m.correlation_id, m.pid, a.tid if a else None, a is not None))
    for a in api.values():
        family = "rccl" if a.name.startswith("nccl") else "hip"
        out["api_calls"].append((a.pid, a.tid, a.start_ns + OFF, a.end_ns + OFF, a.end_ns - a.start_ns,
                                 writer.hip_name(a.name), family, a.correlation_id, None, None))
    for m in sc.markers:
        end = m.start_ns if m.kind == "mark" else m.end_ns
        out["markers"].append((m.pid, m.tid, m.start_ns + OFF, end + OFF, end - m.start_ns, m.name, "", m.kind, "roctx", None, None))
    assert gpu
    return {k: sorted(v, key=repr) for k, v in out.items()}


def rows(trace, table: str) -> list[tuple]:
    return sorted(trace.sql(f"SELECT * FROM {table}"), key=repr)


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    sc = rich_scenario()
    path = writer.write(sc, tmp_path_factory.mktemp("rocpd") / "rich_results.db")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    trace = load_trace(path)
    yield sc, path, trace
    trace.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "the reader modified the profile"


def test_rocpd_damaged_pages_refused(rich, tmp_path):
    """A page overwritten anywhere in the file either still loads or raises ProfileError: SQLite
    reports damage only when a reader reaches the page (sqlite3.DatabaseError mid-read), and a
    damaged schema page gives an error message that is not valid UTF-8."""
    _, path, _ = rich
    data = path.read_bytes()
    refused = 0
    for offset in range(4096, len(data), 4096):
        broken = tmp_path / f"damaged_{offset}.db"
        broken.write_bytes(data[:offset] + b"\xff" * 512 + data[offset + 512:])
        try:
            load_trace(broken).close()
        except ProfileError as exc:
            refused += 1
            assert broken.name in str(exc)
    assert refused, "no damaged page was noticed"


# -- rocpd v3 round trip ---------------------------------------------------------------------------


def test_rocpd_round_trip_activity(rich):
    sc, _, trace = rich
    want = expected(sc)
    for table in ("kernels", "memops", "api_calls", "markers"):
        assert rows(trace, table) == want[table], table


def test_rocpd_devices_processes_threads(rich):
    sc, _, trace = rich
    assert rows(trace, "devices") == [
        (d.device_id, d.name, "AMD", True, d.sm_count, d.memory_bytes, None, d.clock_hz, "gfx942", 64, None)
        for d in sc.devices
    ]
    assert rows(trace, "processes") == [(p.pid, p.name, None, p.hostname) for p in sc.processes]
    assert rows(trace, "threads") == sorted((t.pid, t.tid, t.name) for t in sc.threads)


def test_rocpd_meta_and_warnings(rich):
    sc, _, trace = rich
    assert trace.format == "rocpd"
    assert trace.meta["format"] == "rocpd" and trace.meta["format_version"] == "3"
    assert trace.meta_int("capture_start_ns") == 500 + OFF and trace.meta_int("capture_end_ns") == 12_500 + OFF
    assert "init" in trace.meta["capture_span_source"]
    assert any(w.startswith("1 of 5 kernel dispatches are not linked") for w in trace.warnings), trace.warnings
    absent = {v.split(":")[0] for (v,) in trace.sql("SELECT value FROM trace_meta WHERE key = 'absent'")}
    assert {"cpu_ops", "memory_bandwidth"} <= absent and "kernels" not in absent and "markers" not in absent


def test_rocpd_links_within_process(rich):
    _, _, trace = rich
    # correlation id 1 exists in both processes: each kernel must take its own process's thread
    got = trace.sql("SELECT pid, tid FROM kernels WHERE correlation_id = 1 ORDER BY pid")
    assert got == [(100, 101), (200, 201)]


def test_rocpd_rccl_region_is_api_not_marker(rich):
    _, _, trace = rich
    assert trace.sql("SELECT api FROM api_calls WHERE name = 'ncclAllReduce'") == [("rccl",)]
    assert not trace.sql("SELECT * FROM markers WHERE name LIKE '%nccl%'")


def test_rocpd_views_return_what_was_inserted(rich):
    sc, path, _ = rich
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_kernel_dispatch%'")}
        assert len(names) == 1 and next(iter(names)).startswith("rocpd_kernel_dispatch_")
        assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(sc.kernels)
        assert con.execute("SELECT count(*) FROM memory_copies").fetchone()[0] == len(sc.memops)
        regions = con.execute("SELECT category, count(*) FROM regions GROUP BY 1").fetchall()
        assert dict(regions) == {"HIP_RUNTIME_API_EXT": 8, "RCCL_API": 1, "MARKER_CORE_RANGE_API": 2}
        # grid is stored in work-items, as rocprofv3 does
        assert con.execute("SELECT grid_x, workgroup_x FROM kernels WHERE name = 'gemm_kernel'").fetchone() == (128, 64)
        assert con.execute("SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'").fetchone() == ("3",)
        assert {r[0] for r in con.execute("SELECT DISTINCT guid FROM rocpd_event")} == {
            con.execute("SELECT value FROM rocpd_metadata WHERE tag = 'guid'").fetchone()[0]}
    finally:
        con.close()


def test_rocpd_no_kernels(tmp_path):
    sc = Scenario(
        "rocpd_no_kernels", devices=[Device(0, **MI300X)], processes=[Process(7)], threads=[Thread(7, 7)],
        api_calls=[ApiCall(7, 7, 100, 200, "cudaMemcpyAsync", 1), ApiCall(7, 7, 300, 300, "cudaGetDevice", 2)],
        memops=[MemOp(0, 0, 150, 250, "copy", "HtoD", 64, 7, 1), MemOp(0, 0, 260, 270, "set", "memset", 64, 7, None)],
    )
    trace = load_trace(writer.write(sc, tmp_path / "nok.db"))
    assert trace.count("kernels") == 0 and trace.count("memops") == 1 and trace.count("api_calls") == 1
    absent = [v for (v,) in trace.sql("SELECT value FROM trace_meta WHERE key = 'absent'")]
    assert any(a.startswith("kernels:") for a in absent) and any(a.startswith("markers:") for a in absent)
    assert any("zero-length API calls" in w for w in trace.warnings)
    trace.close()


def test_rocpd_host_to_host_copy_and_no_api_tracing(tmp_path):
    sc = Scenario(
        "rocpd_h2h", devices=[Device(0, **MI300X)], processes=[Process(7)], threads=[Thread(7, 7)],
        kernels=[Kernel(0, 0, 10, 20, "k", "k", 7, None)],
        memops=[MemOp(0, 0, 30, 40, "copy", "HtoH", 64, 7, None), MemOp(0, 0, 50, 60, "copy", "DtoH", 64, 7, None)],
    )
    trace = load_trace(writer.write(sc, tmp_path / "h2h.db"))
    assert trace.sql("SELECT kind FROM memops") == [("DtoH",)]
    assert any("host-to-host" in w for w in trace.warnings)
    assert any("--hip-trace" in w for w in trace.warnings)
    k = trace.sql("SELECT correlation_id, launched, tid FROM kernels")
    assert k[0][0] >= writer.UNLINKED_STACK_BASE and k[0][1:] == (False, None)
    trace.close()


def test_rocpd_sidecar_warning(tmp_path):
    sc = rich_scenario()
    path = writer.write(sc, tmp_path / "killed_results.db")
    path.with_name(path.name + "-journal").write_bytes(b"")
    trace = load_trace(path)
    assert any("-journal" in w and "killed" in w for w in trace.warnings)
    trace.close()


def test_rocpd_schema4_refused(tmp_path):
    path = writer.write(rich_scenario(), tmp_path / "v4.db")
    con = sqlite3.connect(path)
    table = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_kernel_dispatch_%'").fetchone()[0]
    con.execute(f'ALTER TABLE "{table}" ADD COLUMN track_id INTEGER')
    con.execute("DROP VIEW rocpd_kernel_dispatch")
    con.execute(f'CREATE VIEW rocpd_kernel_dispatch AS SELECT * FROM "{table}"')
    meta = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_metadata_%'").fetchone()[0]
    con.execute(f"UPDATE \"{meta}\" SET value = '4.0.0' WHERE tag = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(ProfileError, match="4.0.0.*not support"):
        load_trace(path)


def test_rocpd_partial_database_refused(tmp_path):
    path = tmp_path / "handmade.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE rocpd_string (id INTEGER PRIMARY KEY, string TEXT)")
    con.execute("CREATE TABLE rocpd_kernel_dispatch (id INTEGER PRIMARY KEY, start INTEGER, \"end\" INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(ProfileError) as err:
        load_trace(path)
    msg = str(err.value)
    assert "rocpd_metadata" in msg and "--output-format rocpd" in msg and "Traceback" not in msg


def test_rocpd_missing_tables_refused(tmp_path):
    path = tmp_path / "half.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE rocpd_metadata (id INTEGER PRIMARY KEY, tag TEXT, value TEXT)")
    con.execute("INSERT INTO rocpd_metadata (tag, value) VALUES ('schema_version', '3')")
    con.execute("CREATE TABLE rocpd_kernel_dispatch (id INTEGER PRIMARY KEY, start INTEGER, \"end\" INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(ProfileError, match="incomplete rocpd database.*rocpd_string"):
        load_trace(path)


# -- detection and legacy RPD -----------------------------------------------------------------------


def test_detect_distinguishes_rocpd_from_rpd(rich):
    _, path, _ = rich
    assert detect(path).format == "rocpd"
    if RPD.exists():
        assert detect(RPD).format == "rpd"


@pytest.fixture(scope="module")
def rpd():
    if not RPD.exists():
        pytest.skip(f"real data not present ({RPD})")
    trace = load_trace(RPD)
    raw = sqlite3.connect(f"file:{RPD}?mode=ro", uri=True)
    yield trace, raw
    raw.close()
    trace.close()


def _ops(raw, where: str) -> list[tuple]:
    return raw.execute(
        f"""SELECT o.gpuId, o.start, o."end" FROM rocpd_op o JOIN rocpd_string t ON t.id = o.opType_id
            WHERE {where} ORDER BY o.start, o.id"""
    ).fetchall()


@pytest.mark.real_data
def test_rpd_counts_match_raw_file(rpd):
    trace, raw = rpd
    assert trace.format == "rpd" and trace.meta["format"] == "rpd" and trace.meta["format_version"] == "2"
    assert any("legacy RPD" in w and "--output-format rocpd" in w for w in trace.warnings)
    kernels = _ops(raw, "t.string = 'KernelExecution'")
    assert len(kernels) == 29
    assert trace.sql('SELECT device_id, start_ns, end_ns FROM kernels ORDER BY start_ns') == kernels
    copies = _ops(raw, "t.string LIKE 'Copy%' OR t.string = 'FillBuffer'")
    assert trace.sql("SELECT device_id, start_ns, end_ns FROM memops ORDER BY start_ns") == copies
    assert trace.sql("SELECT kind, count(*), sum(bytes) FROM memops GROUP BY 1 ORDER BY 1") == [
        ("DtoH", 53, 296), ("HtoD", 2, 2_032_000_000), ("memset", 1, None)]
    hip = raw.execute("SELECT count(*) FROM rocpd_api a JOIN rocpd_string s ON s.id = a.apiName_id WHERE s.string LIKE 'hip%'").fetchone()[0]
    assert trace.count("api_calls") == hip == 120
    assert trace.sql("SELECT DISTINCT device_id FROM devices") == raw.execute("SELECT DISTINCT gpuId FROM rocpd_op").fetchall()
    assert trace.sql("SELECT pid FROM processes") == raw.execute("SELECT DISTINCT pid FROM rocpd_api").fetchall()


@pytest.mark.real_data
def test_rpd_linking_and_launch_parameters(rpd):
    trace, raw = rpd
    linked = raw.execute(
        """SELECT x.api_id, a.tid, o.start FROM rocpd_api_ops x JOIN rocpd_op o ON o.id = x.op_id
           JOIN rocpd_api a ON a.id = x.api_id JOIN rocpd_string t ON t.id = o.opType_id
           WHERE t.string = 'KernelExecution' ORDER BY o.start"""
    ).fetchall()
    assert trace.sql("SELECT correlation_id, tid, start_ns FROM kernels WHERE launched ORDER BY start_ns") == linked
    # every correlation id of a kernel is an API call in the model
    assert trace.scalar("SELECT count(*) FROM kernels k LEFT JOIN api_calls a USING (correlation_id) WHERE a.name IS NULL") == 0
    # hipExtModuleLaunchKernel grids are global work sizes: the model holds workgroups
    gx, gy, wx, wy = raw.execute(
        """SELECT k.gridX, k.gridY, k.workgroupX, k.workgroupY FROM rocpd_kernelapi k JOIN rocpd_api a ON a.id = k.api_ptr_id
           JOIN rocpd_string s ON s.id = a.apiName_id WHERE s.string = 'hipExtModuleLaunchKernel'"""
    ).fetchone()
    assert trace.sql("SELECT grid_x, grid_y, block_x FROM kernels WHERE short_name LIKE 'Cijk%'") == [(-(-gx // wx), -(-gy // wy), wx)]
    # '' in integer columns is absence, never zero
    assert trace.scalar("SELECT count(*) FROM kernels WHERE registers_per_thread IS NOT NULL") == 0
    assert trace.scalar("SELECT count(*) FROM api_calls WHERE name LIKE '%writeRows%'") == 0


def test_rocpd_merged_processes_join_on_guid(tmp_path):
    """Two per-process databases merged into one file: ids restart per process (same dispatch,
    event, agent and stack ids), so every join must also match guid."""
    a = rich_scenario()
    b = Scenario(
        "rocpd_rank1", devices=a.devices, processes=[Process(300, "rank1", hostname="mi300-node")],
        threads=[Thread(300, 301, "rank1")],
        api_calls=[ApiCall(300, 301, 1_000, 1_400, "cudaLaunchKernel", 1), ApiCall(300, 301, 2_000, 2_200, "cudaMemcpyAsync", 2)],
        kernels=[Kernel(1, 0, 4_000, 4_100, "rank1_kernel", "rank1_kernel", 300, 1)],
        memops=[MemOp(1, 0, 5_000, 5_100, "copy", "DtoH", 16, 300, 2)],
        markers=[Marker(300, 301, 100, 6_000, "rank1 step")],
    )
    pa, pb = writer.write(a, tmp_path / "a.db"), writer.write(b, tmp_path / "b.db")
    con = sqlite3.connect(pa)
    con.execute("ATTACH ? AS b", (str(pb),))
    for name, ddl in con.execute("SELECT name, sql FROM b.sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_%'").fetchall():
        con.execute(ddl)
        con.execute(f'INSERT INTO main."{name}" SELECT * FROM b."{name}"')
    con.commit()
    con.close()
    trace = load_trace(pa)
    want_a, want_b = expected(a), expected(b)
    for table in ("kernels", "memops", "api_calls", "markers"):
        assert rows(trace, table) == sorted(want_a[table] + want_b[table], key=repr), table
    assert trace.count("devices") == 2 and trace.count("processes") == 3
    trace.close()


def test_rocpd_guids_that_no_table_suffix_spells_still_join_as_text(tmp_path):
    """The reader joins on integer keys for the guids its table suffixes spell. A row with any other guid makes it start
    over on the guid text, so the joins match what rocpd's own views match: a file whose every row carries a guid
    unlike its suffix loads whole, and a dispatch whose guid alone differs names no agent of its process."""
    sc = rich_scenario()
    path = writer.write(sc, tmp_path / "renamed.db")
    con = sqlite3.connect(path)
    tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_%'")
              if "guid" in [c[1] for c in con.execute(f'PRAGMA table_info("{n}")')]]
    for name in tables:
        con.execute(f'UPDATE "{name}" SET guid = \'00000000-0000-0000-0000-000000000000\'')
    con.commit()
    con.close()
    trace = load_trace(path)
    want = expected(sc)
    for table in ("kernels", "memops", "api_calls", "markers"):
        assert rows(trace, table) == want[table], table
    assert trace.count("data_issues") == 0
    trace.close()

    path = writer.write(sc, tmp_path / "one_row.db")
    con = sqlite3.connect(path)
    table = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_kernel_dispatch_%'").fetchone()[0]
    start = con.execute(f'SELECT start FROM "{table}" WHERE id = 1').fetchone()[0]
    con.execute(f"UPDATE \"{table}\" SET guid = 'another-process' WHERE id = 1")
    con.commit()
    con.close()
    trace = load_trace(path)
    assert rows(trace, "kernels") == [r for r in want["kernels"] if r[2] != start]
    assert trace.sql("SELECT * FROM data_issues") == [("kernels", "skipped", 1, rocpd.UNKNOWN_AGENT)]
    trace.close()


def test_rocpd_merged_processes_beyond_the_keyed_limit_join_as_text(tmp_path, monkeypatch):
    """A file merging more processes than MAX_KEYED_GUIDS joins on the guid text from the start: the same rows."""
    keyed = []
    init = rocpd._Tables.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        keyed.append(self.key_type)

    monkeypatch.setattr(rocpd._Tables, "__init__", spy)
    monkeypatch.setattr(rocpd, "MAX_KEYED_GUIDS", 0)
    sc = rich_scenario()
    trace = load_trace(writer.write(sc, tmp_path / "text_keys.db"))
    want = expected(sc)
    for table in ("kernels", "memops", "api_calls", "markers"):
        assert rows(trace, table) == want[table], table
    assert keyed == ["VARCHAR"]
    trace.close()


def test_rocpd_mistyped_cells_fall_back_to_lenient_read(tmp_path):
    """A cell whose type contradicts its column (here '' in an INTEGER column) stops DuckDB's
    native scanner; the reader then reads through sqlite3 and treats the cell as absent."""
    sc = rich_scenario()
    path = writer.write(sc, tmp_path / "mistyped.db")
    con = sqlite3.connect(path)
    table = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_kernel_dispatch_%'").fetchone()[0]
    con.execute(f"UPDATE \"{table}\" SET stream_id = '' WHERE id = 1")
    con.commit()
    con.close()
    trace = load_trace(path)
    want = expected(sc)["kernels"]
    got = rows(trace, "kernels")
    assert len(got) == len(want)
    assert [r[1] for r in got if r[2] == sc.kernels[0].start_ns + OFF] == [None]
    assert [r for r in got if r[2] != sc.kernels[0].start_ns + OFF] == [r for r in want if r[2] != sc.kernels[0].start_ns + OFF]
    trace.close()


def test_running_out_of_memory_is_not_retried_through_sqlite3(tmp_path, monkeypatch):
    """DuckDB out of memory while reading (a 10 M-kernel database at the default limit) is not a cell the scanner
    refused: the reader does not start over on sqlite3 copies, which held whole tables in Python (13 GB of RSS for
    that database, then the same failure). The error names the memory and its setting, with the limit in force."""
    import duckdb

    from gpuscope.tools.model.readers import rocpd as reader

    tries = []

    def out_of_memory(con, path, progress, tb, sidecars):
        tries.append(tb.lenient)
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block of size 256.0 KiB")

    monkeypatch.setattr(reader, "_load", out_of_memory)
    monkeypatch.setenv("GPUSCOPE_MEMORY_LIMIT", "96MiB")
    path = writer.write(rich_scenario(), tmp_path / "oom.db")
    with pytest.raises(ProfileError) as err:
        load_trace(path)
    assert tries == [False]
    assert "more memory" in str(err.value) and "GPUSCOPE_MEMORY_LIMIT (now 96 MiB)" in str(err.value)


def test_rpd_running_out_of_memory_is_not_retried_through_sqlite3(tmp_path, monkeypatch):
    """The same for a legacy RPD file: a native read that runs out of memory is not read again through sqlite3."""
    import duckdb

    from gpuscope.fixtures.writers import rpd as rpd_writer
    from gpuscope.tools.model.sqlite_source import SqliteSource

    reads, relation, copy = [], SqliteSource.relation, SqliteSource.copy

    def native_out_of_memory(self, table, *, text=False):
        reads.append((table, text))
        if table == "rocpd_op" and not text:
            raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block of size 256.0 KiB")
        return relation(self, table, text=text)

    def copied(self, table, *, lenient=False):
        reads.append((table, True))
        return copy(self, table, lenient=lenient)

    monkeypatch.setattr(SqliteSource, "relation", native_out_of_memory)
    monkeypatch.setattr(SqliteSource, "copy", copied)
    path = rpd_writer.write(rich_scenario(), tmp_path / "oom.rpd")
    with pytest.raises(ProfileError) as err:
        load_trace(path)
    assert ("rocpd_op", False) in reads and ("rocpd_op", True) not in reads
    assert "more memory" in str(err.value) and "GPUSCOPE_MEMORY_LIMIT" in str(err.value)


def test_a_million_kernels_fit_a_small_memory_limit(tmp_path, monkeypatch):
    """1,000,000 dispatches, each launched by its own hipLaunchKernel, build under GPUSCOPE_MEMORY_LIMIT=256MiB: every
    kernel kept and linked, per-name figures equal to the generator's. The kernels insert used to join the dispatches'
    events and their launches in one statement sorted by start: out of memory here, and at the default limit with
    10 M kernels."""
    truth = writer.write_scale(tmp_path / "scale.db", 1_000_000)
    monkeypatch.setenv("GPUSCOPE_MEMORY_LIMIT", "256MiB")
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    trace = load_trace(tmp_path / "scale.db", store_now=True)
    got = trace.sql("SELECT name, count(*), sum(dur_ns)::BIGINT, min(dur_ns), max(dur_ns), count(*) FILTER (WHERE launched) "
                    "FROM kernels GROUP BY 1")
    assert {r[0]: tuple(r[1:]) for r in got} == {
        name: (v["count"], v["total_ns"], v["min_ns"], v["max_ns"], v["count"]) for name, v in truth["per_name"].items()}
    assert sum(v["count"] for v in truth["per_name"].values()) == truth["n_kernels"]
    trace.close()


def test_marker_texts_are_fetched_a_chunk_at_a_time(tmp_path, monkeypatch):
    """rocTX texts (rocpd_event.extdata, read through sqlite3 for their free text) are fetched LENIENT_CHUNK_ROWS
    events at a time, not all at once: a capture may hold millions of ranges. The markers are the scenario's."""
    from gpuscope.tools.model import sqlite_source

    fetched, open_sqlite = [], sqlite_source.open_sqlite
    monkeypatch.setattr(sqlite_source, "open_sqlite", lambda path: CountingSqlite(open_sqlite(path), "extdata", fetched))
    monkeypatch.setattr(sqlite_source, "LENIENT_CHUNK_ROWS", 2)
    sc = rich_scenario()
    trace = load_trace(writer.write(sc, tmp_path / "markers.db"))
    assert rows(trace, "markers") == sorted(expected(sc)["markers"], key=repr)
    assert sum(fetched) == len(sc.markers) > 2 and max(fetched) == 2
    trace.close()


def test_rocpd_marker_text_that_is_not_utf8_is_read_and_counted(tmp_path):
    """rocTX texts live in rocpd_event.extdata, read through sqlite3: a message holding bytes that are not UTF-8 names
    its marker with U+FFFD in their place, and the reader counts the repaired row in data_issues."""
    sc = rich_scenario()
    path = writer.write(sc, tmp_path / "latin1.db")
    con = sqlite3.connect(path)
    table = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_event_%'").fetchone()[0]
    changed = con.execute(f"""UPDATE "{table}" SET extdata = CAST(CAST('{{"message": "data loader' AS BLOB) || x'ff' ||
                                                                    CAST('"}}' AS BLOB) AS TEXT)
                              WHERE json_extract(extdata, '$.message') = 'data loader'""").rowcount
    con.commit()
    con.close()
    assert changed == 1
    trace = load_trace(path)
    assert trace.sql("SELECT name FROM markers WHERE start_ns = ?", [1_900 + OFF]) == [("data loader\ufffd",)]
    assert trace.count("markers") == len(sc.markers)
    assert trace.sql("SELECT * FROM data_issues") == [
        (f'native."{table}"', "repaired", 1, '"extdata": text that is not valid UTF-8: the invalid bytes read as U+FFFD')]
    trace.close()
