"""NCCL's NVTX payloads in Nsight exports → nccl_calls: every field as the fixture wrote it, the kernel each call
launched, damaged payloads counted in data_issues, and the note when an export has NCCL ranges but no payloads."""

from __future__ import annotations

import shutil
import sqlite3
import struct

import pytest

from conftest import needs_data, real_files
from gpuscope.fixtures.scenarios_nccl import SCENARIOS, nccl_payloads
from gpuscope.fixtures.scenarios_timeline import comm_overlap
from gpuscope.fixtures.writers import nsys as writer
from gpuscope.tools.model.readers.nccl_payloads import AMBIGUOUS_SCHEMA, TOO_SHORT, UNKNOWN_SCHEMA
from gpuscope.tools.model.trace import load_trace

COLUMNS = {"NCCL communicator ID": "comm_id", "Message size [bytes]": "bytes", "No. of ranks": "nranks", "Rank": "rank",
           "CUDA device": "cuda_device", "Peer rank": "peer", "Root": "root", "Reduction operation": "reduce_op"}
FIELDS = list(COLUMNS.values())


def written(s) -> list[tuple]:
    """nccl_calls rows as the fixture wrote them: range, name, schema id, payload fields, kernel launched inside."""
    rows = []
    for i, (op, values) in s.options["nccl_payloads"].items():
        m = s.markers[i]
        v = {COLUMNS[k]: x for k, x in values.items()}
        v["comm_id"] = f"{v['comm_id']:#x}"
        if "reduce_op" in v:
            v["reduce_op"] = writer.NCCL_REDOPS[v["reduce_op"]]
        k = s.options["nccl_kernel_of"].get(i)
        kern = s.kernels[k] if k is not None else None
        rows.append((m.pid, m.tid, m.start_ns, m.end_ns, m.name, writer.NVTX_STATIC_SCHEMA + writer.NCCL_SCHEMAS[op][0],
                     *(v.get(c) for c in FIELDS), 0 if kern is None else 1,
                     *((kern.device_id, kern.stream_id, kern.start_ns, kern.end_ns) if kern else (None,) * 4)))
    return sorted(rows, key=lambda r: (r[0], r[2]))


def test_every_field_decoded(open_profile):
    s = nccl_payloads()
    t = open_profile("nccl_payloads", "nsys", scenarios=SCENARIOS)
    got = t.sql(f"""SELECT pid, tid, start_ns, end_ns, name, schema_id, {', '.join(FIELDS)}, kernels_launched, device_id, stream_id,
                           kernel_start_ns, kernel_end_ns FROM nccl_calls ORDER BY pid, start_ns""")
    assert got == written(s)
    assert len(got) == 2 * 11 and t.sql("SELECT * FROM data_issues WHERE table_name = 'nccl_calls'") == []
    # the payload-less group ranges stay markers only; every NCCL range is a marker
    assert t.scalar("SELECT count(*) FROM markers WHERE domain = 'NCCL'") == 2 * 13
    assert t.scalar("SELECT count(*) FROM nccl_calls WHERE dur_ns <> end_ns - start_ns") == 0


def _damaged(tmp_path, edit=None):
    """The scenario with three payloads broken at write time, and optionally an SQL edit of the written file."""
    s = nccl_payloads()
    idx = sorted(s.options["nccl_payloads"])
    allreduce = [i for i in idx if s.options["nccl_payloads"][i][0] == "AllReduce"]
    short_header = b"\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00"
    unknown = struct.pack("<QQQQ", 1, writer.NVTX_STATIC_SCHEMA + 99, 24, 32) + bytes(24)
    good = writer.nccl_payload("AllReduce", {"NCCL communicator ID": 1, "Message size [bytes]": 8, "Reduction operation": 0})
    short_payload = good[:16] + struct.pack("<Q", 8) + good[24:40]  # says 8 payload bytes; the op field lies at 16..20
    s.options["raw_values"] = {("marker", allreduce[0]): {"binaryData": short_header},
                               ("marker", allreduce[1]): {"binaryData": unknown},
                               ("marker", allreduce[2]): {"binaryData": short_payload}}
    path = writer.write(s, tmp_path / "damaged.sqlite")
    if edit:
        with sqlite3.connect(path) as conn:
            conn.execute(edit)
        conn.close()
    return s, load_trace(path)


def test_damaged_payloads_counted(tmp_path):
    s, t = _damaged(tmp_path)
    try:
        assert t.sql("SELECT action, rows, reason FROM data_issues WHERE table_name = 'nccl_calls' ORDER BY reason") == [
            ("skipped", 2, TOO_SHORT), ("skipped", 1, UNKNOWN_SCHEMA)]
        assert t.count("nccl_calls") == len(s.options["nccl_payloads"]) - 3
        assert t.count("markers") == len(s.markers)  # the ranges themselves are kept
    finally:
        t.close()


def test_ambiguous_schema(tmp_path):
    """A schema id listed with two layouts: its payloads are not guessed at."""
    sid = writer.NVTX_STATIC_SCHEMA + writer.NCCL_SCHEMAS["AllGather"][0]
    s, t = _damaged(tmp_path, "INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId, schemaId, idx, type, name, offset) "
                              f"VALUES (1, {sid}, 1, 22, 'Message size [bytes]', 12)")
    try:
        n_gather = sum(op == "AllGather" for op, _ in s.options["nccl_payloads"].values())
        assert ("skipped", n_gather, AMBIGUOUS_SCHEMA) in t.sql(
            "SELECT action, rows, reason FROM data_issues WHERE table_name = 'nccl_calls'")
        assert t.scalar("SELECT count(*) FROM nccl_calls WHERE name = 'ncclAllGather'") == 0
    finally:
        t.close()


def test_ranges_without_payloads(tmp_path, open_profile):
    """NCCL ranges but no blobs (export without --include-blobs, or NCCL < 2.19): said in trace_meta, no issue."""
    t = open_profile("comm_overlap", "nsys", scenarios={"comm_overlap": comm_overlap})
    absent = [v for (v,) in t.sql("SELECT value FROM trace_meta WHERE key = 'absent' AND value LIKE 'nccl_calls:%'")]
    assert len(absent) == 1 and "--include-blobs=true" in absent[0] and t.count("nccl_calls") == 0
    s = comm_overlap()
    s.options["nsys_meta_table"] = "EXPORT_META_DATA"  # 2022-era export: NVTX_EVENTS has no binaryData column
    old = load_trace(writer.write(s, tmp_path / "old.sqlite"))
    try:
        absent = [v for (v,) in old.sql("SELECT value FROM trace_meta WHERE key = 'absent' AND value LIKE 'nccl_calls:%'")]
        assert len(absent) == 1 and "no binaryData column" in absent[0]
    finally:
        old.close()


def test_profile_file_untouched(tmp_path, write_profile):
    path = write_profile("nccl_payloads", "nsys", scenarios=SCENARIOS)
    before = path.read_bytes()
    copy = shutil.copy(path, tmp_path / "again.sqlite")
    load_trace(copy).close()
    assert path.read_bytes() == before and (tmp_path / "again.sqlite").read_bytes() == before


@needs_data
@pytest.mark.parametrize("path", real_files("nsys/*.sqlite"), ids=lambda p: p.name)
def test_real_exports(path):
    """Every NCCL-domain payload of a real export is decoded or counted; none of shared/data has any yet."""
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(NVTX_EVENTS)")]
        blobs = conn.execute(
            "SELECT count(*) FROM NVTX_EVENTS e JOIN NVTX_EVENTS d ON d.eventType = 75 AND d.text = 'NCCL' "
            "AND d.domainId = e.domainId AND (d.globalTid >> 24) = (e.globalTid >> 24) "
            "WHERE e.eventType IN (59, 60, 70, 71) AND e.binaryData IS NOT NULL").fetchone()[0] if "binaryData" in cols else 0
    finally:
        conn.close()
    if not blobs:
        pytest.skip(f"{path.name} has no NCCL payload blobs")
    t = load_trace(path)
    try:
        issues = t.scalar("SELECT coalesce(sum(rows), 0) FROM data_issues WHERE table_name = 'nccl_calls'")
        assert t.count("nccl_calls") + issues == blobs
    finally:
        t.close()


def test_other_domain_reusing_the_schema_id(tmp_path):
    """Static schema ids are per domain: another domain's schema 2^24+4 with another layout changes nothing."""
    sid = writer.NVTX_STATIC_SCHEMA + writer.NCCL_SCHEMAS["AllGather"][0]
    s, t = _damaged(tmp_path, "INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId, schemaId, idx, type, name, offset) "
                              f"VALUES (7, {sid}, 1, 22, 'Message size [bytes]', 12)")
    try:
        n_gather = sum(op == "AllGather" for op, _ in s.options["nccl_payloads"].values())
        assert t.scalar("SELECT count(*) FROM nccl_calls WHERE name = 'ncclAllGather' AND bytes = 1048576") == n_gather
        assert t.scalar("SELECT sum(rows) FROM data_issues WHERE table_name = 'nccl_calls'") == 3
    finally:
        t.close()


def test_nccl_2_24_layouts(tmp_path):
    """NCCL 2.19-2.24 payloads: no communicator id, broadcast/send/recv sizes named "Bytes", init payload
    {rank, nranks, device}. Sizes decode; n cannot be tied to a communicator, so busbw needing it is null."""
    from gpuscope.tools.analyses.comm_summary import comm_summary

    s = nccl_payloads()
    s.options["nccl_schemas"] = "2.24"
    t = load_trace(writer.write(s, tmp_path / "nccl224.sqlite"))
    try:
        want = [(r[0], r[2], r[4], r[7], r[8]) for r in written(s)]  # pid, start, name, bytes, nranks
        assert t.sql("SELECT pid, start_ns, name, bytes, nranks FROM nccl_calls ORDER BY pid, start_ns") == want
        assert t.scalar("SELECT count(*) FROM nccl_calls WHERE comm_id IS NOT NULL") == 0
        assert t.sql("SELECT DISTINCT reduce_op FROM nccl_calls WHERE reduce_op IS NOT NULL") == [("Sum",)]
        bw = {(g.pid, g.collective, g.message_bytes): g for g in comm_summary(t, limit=200).bandwidth}
        ar = bw[(7000, "AllReduce", 8 << 20)]
        assert (ar.n_ranks, ar.algbw_gb_per_s, ar.busbw_gb_per_s) == (None, 131.072, None)
        assert "names no communicator" in ar.missing
        bc = bw[(7000, "Broadcast", 1 << 20)]
        assert (bc.algbw_gb_per_s, bc.busbw_gb_per_s, bc.missing) == (65.536, 65.536, None)
        ag = bw[(7000, "AllGather", 1 << 20)]  # WORLD's and ORPHAN's all-gathers: one group without communicator ids
        assert (ag.calls, ag.gpu_time_ns, ag.algbw_gb_per_s) == (2, 42_000, None)
    finally:
        t.close()


def test_kernels_carry_the_communicator_and_collective_of_their_call(open_profile):
    """kernels.communicator / .collective: the payload's communicator and the call's name (without 'nccl') of the
    one NCCL call that launched the kernel, as the fixture wrote them; the SendRecv kernel launched by ncclGroupEnd
    (no payload) and the gemm carry neither."""
    s = nccl_payloads()
    t = open_profile("nccl_payloads", "nsys", scenarios=SCENARIOS)
    by_kernel = {k: i for i, k in s.options["nccl_kernel_of"].items()}
    expected = []
    for j, k in enumerate(s.kernels):
        i = by_kernel.get(j)
        op, values = s.options["nccl_payloads"][i] if i is not None else (None, {})
        comm = values.get("NCCL communicator ID")
        expected.append((k.pid, k.device_id, k.start_ns, k.name, None if comm is None else f"{comm:#x}",
                         s.markers[i].name.removeprefix("nccl") if i is not None else None))
    got = t.sql("SELECT pid, device_id, start_ns, name, communicator, collective FROM kernels ORDER BY pid, start_ns")
    assert got == sorted(expected, key=lambda r: (r[0], r[2]))
    assert t.scalar("SELECT count(*) FROM kernels WHERE collective IS NOT NULL") == 2 * 7
