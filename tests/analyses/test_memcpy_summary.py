"""memcpy_summary: copies and sets per device, direction and memory kinds, checked against plain-Python
figures from the scenario (fixtures/scenarios_memcpy_summary.py) in every format, and on real files."""

from __future__ import annotations

import gzip
import importlib
import json
import sqlite3

import pytest

from gpuscope.fixtures import truth as T
from gpuscope.fixtures.samples import SHARED_DATA, real_profiles
from gpuscope.fixtures.scenarios_memcpy_summary import memcpy_mix, memcpy_truth
from gpuscope.tools.analyses.memcpy_summary import memcpy_summary
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

FORMATS = ("nsys", "rocpd", "kineto")
SUFFIX = {"nsys": ".sqlite", "rocpd": "_results.db", "kineto": ".pt.trace.json"}
DATA = SHARED_DATA
REAL = real_profiles()
US, MiB = 1000, 1 << 20
# Only Nsight exports state the DRAM bandwidth (rocpd agents and Kineto deviceProperties do not).
STATES_BANDWIDTH = {"nsys": True, "rocpd": False, "kineto": False}


def pct(part, whole):
    return None if not whole else round(100.0 * part / whole, 2)


def canonical_api(name):
    return None if name is None else ("cuda" + name[3:] if name.startswith("hip") else name)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    root = tmp_path_factory.mktemp("memcpy")
    traces = {}

    def get(fmt: str):
        if fmt not in traces:
            writer = importlib.import_module(f"gpuscope.fixtures.writers.{fmt}")
            path = root / f"memcpy_mix{SUFFIX[fmt]}"
            writer.write(memcpy_mix(), path, pid=20000) if fmt == "kineto" else writer.write(memcpy_mix(), path)
            traces[fmt] = load_trace(path)
        return traces[fmt]

    yield get
    for t in traces.values():
        t.close()


def expected(fmt: str, s=None):
    s = T.expressed(s or memcpy_mix(), fmt, 20000 if fmt == "kineto" else None)
    bw = {d.device_id: (d.memory_bandwidth_bytes_per_s if STATES_BANDWIDTH[fmt] else None) for d in s.devices}
    return s, memcpy_truth(s, fmt, bw)


def key_of(g):
    return (g.device_id, g.op, g.direction, g.src_kind, g.dst_kind, g.link)


@pytest.mark.parametrize("fmt", FORMATS)
def test_groups_and_devices_match_truth(own, fmt):
    s, exp = expected(fmt)
    r = memcpy_summary(own(fmt))
    got = {key_of(g): g for g in r.groups}
    assert set(got) == set(exp["groups"])
    for key, e in exp["groups"].items():
        g = got[key]
        for f in ("count", "bytes", "work_ns", "wall_ns", "zero_duration_count", "overlapped_by_kernels_ns", "exposed_ns",
                  "pageable", "traffic_factor"):
            assert getattr(g, f) == e[f], (key, f)
        assert g.gb_per_s_over_wall == pytest.approx(e["gb_per_s_over_wall"], rel=5e-4)
        assert g.gb_per_s_over_work == pytest.approx(e["bytes"] / e["work_ns"], rel=5e-4)
        if e["pct_of_reference_bandwidth"] is None:
            assert g.pct_of_reference_bandwidth is None and g.reference_note
        else:
            assert g.pct_of_reference_bandwidth == pytest.approx(e["pct_of_reference_bandwidth"], abs=0.006)
    # groups of a device sorted by wall time
    for dev in {g.device_id for g in r.groups}:
        walls = [g.wall_ns for g in r.groups if g.device_id == dev]
        assert walls == sorted(walls, reverse=True)
    devs = {d.device_id: d for d in r.devices}
    assert set(devs) == set(exp["devices"])
    for dev, e in exp["devices"].items():
        for f, v in e.items():
            assert getattr(devs[dev], f) == v, (dev, f)
        d = devs[dev]
        assert d.copy_exposed_ns == d.copy_wall_ns - d.copy_overlapped_by_kernels_ns
        assert d.copy_overlap_pct_of_copy_wall == pct(d.copy_overlapped_by_kernels_ns, d.copy_wall_ns)
        assert (d.memory_bandwidth_gb_per_s is None) == (not STATES_BANDWIDTH[fmt])
        assert (d.memory_bandwidth_note is None) == STATES_BANDWIDTH[fmt]


def test_hand_figures_nsys(own):
    """Figures of the scenario by hand (µs): device 0's copies run 110-150, 160-200 (two streams), 300-350,
    360-380, 400-410, 420-440, 450-455, 500-510 (+ a zero-length one) = 195 µs of wall time; kernels run
    140-240, 370-400 and 463-473, so 10 + 40 + 10 = 60 µs of it is hidden behind computation."""
    r = memcpy_summary(own("nsys"))
    d0 = r.devices[0]
    assert (d0.copy_count, d0.copy_wall_ns, d0.copy_overlapped_by_kernels_ns, d0.copy_exposed_ns) == (10, 195 * US, 60 * US, 135 * US)
    assert d0.copy_work_ns == (40 + 20 + 30 + 50 + 20 + 10 + 20 + 5 + 10) * US  # 205 µs: the 160-200 copies overlap
    assert (d0.set_count, d0.set_wall_ns, d0.set_work_ns, d0.set_overlapped_by_kernels_ns) == (2, 5 * US, 6 * US, 2 * US)
    assert (d0.pageable_copy_count, d0.pageable_copy_bytes, d0.pageable_copy_work_ns) == (2, MiB + 512 * 1024, 70 * US)
    groups = {(g.device_id, g.direction, g.src_kind, g.dst_kind): g for g in r.groups}
    htod = groups[(0, "HtoD", "Pinned", "Device")]  # 8 MiB 110-150, 4 MiB 160-180, 256 KiB 500-510 (unlinked)
    assert (htod.count, htod.bytes, htod.wall_ns, htod.overlapped_by_kernels_ns) == (3, 12 * MiB + 256 * 1024, 70 * US, 30 * US)
    assert htod.gb_per_s_over_wall == round((12 * MiB + 256 * 1024) / (70 * US), 3)  # 183.5 GB/s, 3 decimals
    # DtoD on the H100: read + write, 2 x 16 MiB in 10 µs against 3352.32 GB/s
    dtod = groups[(0, "DtoD", "Device", "Device")]
    assert dtod.link == "device_memory" and dtod.traffic_factor == 2 and dtod.reference_gb_per_s == 3352.32
    assert dtod.pct_of_reference_bandwidth == round(100 * 2 * 16 * MiB / (10 * US) / 3352.32, 2)
    peer = groups[(0, "PtoP", "Device", "Device")]
    assert peer.link == "peer" and peer.reference_gb_per_s is None and "peer_link_gb_per_s" in peer.reference_note
    sets = groups[(0, "memset", None, "Device")]
    assert (sets.count, sets.wall_ns, sets.work_ns, sets.traffic_factor) == (2, 5 * US, 6 * US, 1)
    assert sets.pct_of_reference_bandwidth == round(100 * 3 * MiB / (5 * US) / 3352.32, 2)
    zero = groups[(0, "DtoH", "Device", "Pinned")]
    assert zero.zero_duration_count == 1 and zero.count == 2
    assert any("pageable host memory" in n and "device 0: 2 copies" in n for n in r.notes)
    # device 1: its stream 7 is its own; the A100's bandwidth is its own
    d1 = r.devices[1]
    assert (d1.copy_count, d1.copy_wall_ns, d1.kernel_busy_ns, d1.copy_overlapped_by_kernels_ns) == (1, 40 * US, 25 * US, 0)
    assert d1.memory_bandwidth_gb_per_s == 1555.2


def test_pcie_copies_never_compared_with_dram(own):
    """PerfAdvisor's mistake: HtoD/DtoH % of HBM bandwidth. Without a host-link figure, host copies have no
    reference at all (even where the DRAM bandwidth is known); with one, they are compared with it."""
    r = memcpy_summary(own("nsys"))
    for g in r.groups:
        if g.link == "host":
            assert g.reference_gb_per_s is None and g.pct_of_reference_bandwidth is None and g.reference_note
            assert "host link" in g.reference
    assert any("host_link_gb_per_s" in n for n in r.notes)
    r = memcpy_summary(own("nsys"), host_link_gb_per_s=25, peer_link_gb_per_s=300)
    for g in r.groups:
        if g.link == "host" and g.wall_ns:
            assert g.reference_gb_per_s == 25
            assert g.pct_of_reference_bandwidth == round(100 * g.bytes / g.wall_ns / 25, 2)
        if g.link == "peer":
            assert g.pct_of_reference_bandwidth == round(100 * 32 * MiB / (20 * US) / 300, 2)
    assert not any("host_link_gb_per_s" in n for n in r.notes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_largest_transfers(own, fmt):
    s, exp = expected(fmt)
    shift = T.time_shift(s, fmt)
    r = memcpy_summary(own(fmt), top=5)
    want = exp["largest"][:5]
    assert [(t.device_id, t.direction, t.bytes, t.dur_ns, t.start_ns, t.stream_id) for t in r.largest] == \
        [(w["m"].device_id, w["m"].kind, w["m"].bytes, w["m"].end_ns - w["m"].start_ns, w["m"].start_ns + shift, w["m"].stream_id)
         for w in want]
    assert [canonical_api(t.api_call) for t in r.largest] == [canonical_api(w["api_call"]) for w in want]
    assert r.largest[0].gb_per_s == round(32 * MiB / (20 * US), 3)  # 1677.722 GB/s
    by_time = memcpy_summary(own(fmt), top=2, largest_by="time").largest
    assert [t.dur_ns for t in by_time] == [50 * US, 40 * US]  # the pageable HtoD, then an 8 MiB HtoD
    unlinked = [t for t in memcpy_summary(own(fmt), top=20).largest if t.bytes == 256 * 1024]
    assert len(unlinked) == 1 and unlinked[0].api_call is None


def test_rocpd_peer_copy_and_unknown_host_kind(own):
    """rocpd writes a peer copy as DtoD between two agents (still 'peer', not DRAM) and records no
    pinned/pageable kind: that is stated, not guessed."""
    r = memcpy_summary(own("rocpd"))
    peer = [g for g in r.groups if g.link == "peer"]
    assert len(peer) == 1 and peer[0].direction == "DtoD" and peer[0].bytes == 32 * MiB
    host = [g for g in r.groups if g.link == "host"]
    assert host and all(g.host_kind_known is False and not g.pageable for g in host)
    assert r.devices[0].host_kind_unknown_copy_count == 8
    assert any("pinned or pageable" in n for n in r.notes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_filters(own, fmt):
    s, _ = expected(fmt)
    shift = T.time_shift(s, fmt)
    t = own(fmt)
    r = memcpy_summary(t, device=1)
    assert [d.device_id for d in r.devices] == [1] and {g.device_id for g in r.groups} == {1}
    r = memcpy_summary(t, stream=7)
    assert sum(g.count for g in r.groups) == sum(1 for m in s.memops if m.stream_id == 7)
    assert r.devices[0].kernel_busy_ns == T.busy_ns([(k.start_ns, k.end_ns) for k in s.kernels if k.device_id == 0])
    # the window selects operations starting in it, counted whole
    lo, hi = 150 * US, 400 * US
    r = memcpy_summary(t, start_ns=lo + shift, end_ns=hi + shift)
    inside = [m for m in s.memops if lo <= m.start_ns < hi]
    assert sum(g.count for g in r.groups) == len(inside)
    assert sum(g.work_ns for g in r.groups) == sum(m.end_ns - m.start_ns for m in inside)


def test_bad_requests(own, open_profile):
    t = own("nsys")
    with pytest.raises(ProfileError, match="device 9 does not exist"):
        memcpy_summary(t, device=9)
    with pytest.raises(ProfileError, match="empty time window"):
        memcpy_summary(t, start_ns=10, end_ns=10)
    with pytest.raises(ProfileError, match="host_link_gb_per_s must be a positive"):
        memcpy_summary(t, host_link_gb_per_s=0)
    with pytest.raises(ProfileError, match="largest_by"):
        memcpy_summary(t, largest_by="speed")
    with pytest.raises(ProfileError, match="no memory copy or set matches"):
        memcpy_summary(t, stream=99)
    with pytest.raises(ProfileError, match="records no memory copies or sets.*no CUPTI_ACTIVITY_KIND_MEMCPY"):
        memcpy_summary(open_profile("graph_launch", "nsys"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["two_gpus_one_process", "no_kernels", "concurrent_streams"])
def test_catalog_scenarios(open_profile, name, fmt):
    from gpuscope.fixtures.catalog import SCENARIOS

    base = SCENARIOS[name]()
    pid = base.processes[0].pid if fmt == "kineto" else None
    s = T.expressed(base, fmt, pid)
    bw = {d.device_id: (d.memory_bandwidth_bytes_per_s if STATES_BANDWIDTH[fmt] else None) for d in s.devices}
    exp = memcpy_truth(s, fmt, bw)
    r = memcpy_summary(open_profile(name, fmt, pid))
    got = {key_of(g): g for g in r.groups}
    assert set(got) == set(exp["groups"])
    for key, e in exp["groups"].items():
        assert (got[key].count, got[key].bytes, got[key].wall_ns, got[key].overlapped_by_kernels_ns) == \
            (e["count"], e["bytes"], e["wall_ns"], e["overlapped_by_kernels_ns"])
    for d in r.devices:
        for f, v in exp["devices"][d.device_id].items():
            assert getattr(d, f) == v, (name, d.device_id, f)


# -- real profiles -------------------------------------------------------------------------------

@pytest.mark.skipif(not REAL, reason="../shared/data is not present")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_files_run(path):
    try:
        trace = open_trace(path)
    except ProfileError:
        return  # the reader refuses it (tested elsewhere)
    try:
        r = memcpy_summary(trace, top=5)
    except ProfileError as exc:
        assert "records no memory copies or sets" in str(exc)
        assert trace.count("memops") == 0
        return
    for g in r.groups:
        assert 0 <= g.overlapped_by_kernels_ns <= g.wall_ns <= g.work_ns
        if g.link == "host":
            assert g.pct_of_reference_bandwidth is None  # no host link given: never DRAM
    for d in r.devices:
        assert d.copy_exposed_ns + d.copy_overlapped_by_kernels_ns == d.copy_wall_ns


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")
def test_real_4streams_memcpy_against_raw_sqlite():
    """RTX 4060 Ti: 8 HtoD + 4 DtoH pinned copies of 100 MB; figures from the raw CUPTI table."""
    path = DATA / "nsys" / "nsys2026.1_rtx4060ti_4streams_memcpy.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    raw = con.execute("""SELECT o.label, sk.label, dk.label, m.bytes, m.start, m."end" FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                         JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind JOIN ENUM_CUDA_MEM_KIND sk ON sk.id = m.srcKind
                         JOIN ENUM_CUDA_MEM_KIND dk ON dk.id = m.dstKind""").fetchall()
    kernels = con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    con.close()
    r = memcpy_summary(open_trace(path))
    names = {"Host-to-Device": "HtoD", "Device-to-Host": "DtoH"}
    for label, direction in names.items():
        rows = [x for x in raw if x[0] == label]
        g = next(g for g in r.groups if g.direction == direction)
        assert (g.src_kind, g.dst_kind) == (rows[0][1], rows[0][2])
        assert g.count == len(rows) and g.bytes == sum(x[3] for x in rows)
        assert g.work_ns == sum(x[5] - x[4] for x in rows)
        assert g.wall_ns == T.busy_ns([(x[4], x[5]) for x in rows])
        assert g.gb_per_s_over_wall == pytest.approx(g.bytes / g.wall_ns, rel=5e-4)
    d = r.devices[0]
    assert d.kernel_busy_ns == T.busy_ns(kernels)
    assert d.copy_wall_ns == T.busy_ns([(x[4], x[5]) for x in raw])


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")
def test_real_kineto_pageable_copies_flagged():
    """nv_encdec rank 0 issues pageable HtoD/DtoH copies: counted and flagged from the raw JSON."""
    path = DATA / "pytorch" / "nv_encdec_train_128rank_sampled_r0_hta.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    pageable = [e for e in events if e.get("cat") == "gpu_memcpy" and "Pageable" in e.get("name", "")]
    r = memcpy_summary(open_trace(path))
    assert r.devices[0].pageable_copy_count == len(pageable) > 0
    assert r.devices[0].pageable_copy_bytes == sum(e["args"]["bytes"] for e in pageable)
    assert any("pageable host memory" in n for n in r.notes)


def test_limit_and_top(own):
    r = memcpy_summary(own("nsys"), limit=2, top=0)
    assert r.truncated and r.hint and r.largest == []
    assert [g.device_id for g in r.groups] == [0, 0, 1]
    assert r.devices[0].remainder_groups == len(memcpy_summary(own("nsys")).groups) - 1 - 2
    assert r.devices[0].copy_count == 10  # device totals still cover every group


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")
def test_real_tiny_copy_bandwidth_is_not_rounded_to_zero():
    """RTX 3080 `torch.zeros(16).sum()`: one 4-byte DtoH copy of 1632 ns = 0.002451 GB/s, not 0."""
    r = memcpy_summary(open_trace(DATA / "nsys" / "nsys2026.1_rtx3080_torch_tiny.sqlite"))
    (g,) = r.groups
    assert (g.direction, g.bytes, g.wall_ns) == ("DtoH", 4, 1632)
    assert g.gb_per_s_over_wall == 0.002451
    assert r.largest[0].api_call is not None
