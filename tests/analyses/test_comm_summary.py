"""comm_summary: communication kernels by collective and name, overlap with compute, message sizes,
NCCL ranges and MPI tables — against plain-Python figures from the scenarios in all three formats,
and on the real distributed traces under shared/data."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import DATA, needs_data, real_files, scenario_cases
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.catalog import SCENARIOS as CATALOG
from gpuscope.fixtures.scenarios_timeline import SCENARIOS
from gpuscope.tools.analyses.comm_patterns import DEFAULT_PATTERNS
from gpuscope.tools.analyses.comm_summary import comm_summary
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

COMM_RX = re.compile("|".join(f"(?:{p})" for p in DEFAULT_PATTERNS), re.I)
MAKERS = {**SCENARIOS, "concurrent_streams": CATALOG["concurrent_streams"]}


@pytest.fixture(scope="module")
def open_case(open_profile):
    return lambda name, fmt, pid=None: open_profile(name, fmt, pid, scenarios=MAKERS)


def collective(name: str) -> str:
    n = name.lower()
    for label, rx in (("AllReduce", "all_?reduce|cross_device_reduce"), ("Broadcast", "broadcast")):
        if re.search(rx, n):
            return label
    return "Other"


def expected(name: str, fmt: str, pid: int | None, makers=SCENARIOS):
    s = T.expressed(makers[name](), fmt, pid)
    ops = [o for o in [*s.kernels, *s.memops] if o.end_ns > o.start_ns]
    pids_of = {}
    for o in ops:
        pids_of.setdefault(o.device_id, set()).add(o.pid)
    owner = lambda o: next(iter(pids_of[o.device_id])) if len(pids_of[o.device_id]) == 1 else o.pid  # noqa: E731
    is_comm = lambda o: hasattr(o, "short_name") and bool(COMM_RX.search(o.name))  # noqa: E731
    is_comp = lambda o: (hasattr(o, "short_name") and not COMM_RX.search(o.name)) or getattr(o, "op", None) == "set"  # noqa: E731
    devices, colls, kernels = {}, {}, {}
    for key in sorted({(o.device_id, owner(o)) for o in ops}):
        mine = [o for o in ops if (o.device_id, owner(o)) == key]
        comm = [o for o in mine if is_comm(o)]
        if not comm:
            continue
        cm = T.merge([(o.start_ns, o.end_ns) for o in comm])
        cp = T.merge([(o.start_ns, o.end_ns) for o in mine if is_comp(o)])
        every = T.merge([(o.start_ns, o.end_ns) for o in mine])
        ov = T.overlap_ns(cm, cp)
        devices[key] = dict(comm_kernels=len(comm), unlinked_comm_kernels=sum(not T.is_linked(s, o) for o in comm),
                            comm_summed_ns=sum(o.end_ns - o.start_ns for o in comm), comm_wall_ns=T.length(cm),
                            gpu_span_ns=every[-1][1] - every[0][0], overlap_with_compute_ns=ov, exposed_comm_ns=T.length(cm) - ov)
        for c in {collective(o.name) for o in comm}:
            mine_c = [o for o in comm if collective(o.name) == c]
            d = [o.end_ns - o.start_ns for o in mine_c]
            colls[(*key, c)] = dict(count=len(d), total_ns=sum(d), wall_ns=busy(mine_c), min_ns=min(d), max_ns=max(d))
        for n in {o.short_name for o in comm}:
            mine_n = [o for o in comm if o.short_name == n]
            d = [o.end_ns - o.start_ns for o in mine_n]
            kernels[(*key, n)] = dict(count=len(d), total_ns=sum(d), max_ns=max(d), streams=sorted({o.stream_id for o in mine_n}))
    return devices, colls, kernels


def busy(ops) -> int:
    return T.busy_ns([(o.start_ns, o.end_ns) for o in ops])


@pytest.mark.parametrize("name,fmt,pid", scenario_cases(SCENARIOS))
def test_scenarios(open_case, name, fmt, pid):
    r = comm_summary(open_case(name, fmt, pid))
    devices, colls, kernels = expected(name, fmt, pid)
    assert r.matched and "multimem_all_reduce" in r.comm_patterns
    assert {(d.device_id, d.pid): {k: getattr(d, k) for k in devices[(d.device_id, d.pid)]} for d in r.devices} == devices
    for d in r.devices:
        assert d.overlap_pct_of_comm_wall == round(100 * d.overlap_with_compute_ns / d.comm_wall_ns, 2)
        assert d.overlap_with_compute_ns + d.exposed_comm_ns == d.comm_wall_ns
    assert {(c.device_id, c.pid, c.collective): {k: getattr(c, k) for k in colls[(c.device_id, c.pid, c.collective)]}
            for c in r.collectives} == colls
    assert {(k.device_id, k.pid, k.name): {f: getattr(k, f) for f in kernels[(k.device_id, k.pid, k.name)]}
            for k in r.kernels} == kernels
    s = T.expressed(SCENARIOS[name](), fmt, pid)
    # NCCL ranges: the NVTX/rocTX/record_function range named ncclAllReduce, one per rank in the file
    n_ranges = sum(m.name.startswith("nccl") for m in s.markers)
    assert sum(g.count for g in r.nccl_ranges) == n_ranges
    if name == "comm_overlap":
        ranks = len(s.processes)
        if fmt == "kineto":  # one linked NCCL kernel per rank carries the record_param_comms args
            assert [(m.source, m.collective_name, m.dtype, m.group_size, m.calls, m.in_bytes_total, m.max_in_bytes, m.comm_time_ns)
                    for m in r.messages] == [("kernel args", "allreduce", "Float", 2, 1, 4 << 20, 4 << 20, (200 + 30 * (pid - 5000)) * 1000)]
        else:
            assert r.messages == [] and any("Kineto" in n for n in r.notes)
        if fmt == "nsys":
            got = {(m.name, m.table): (m.calls, m.ranks, m.total_ns, m.bytes_total, m.recv_bytes_total) for m in r.mpi}
            assert got == {("MPI_Allreduce", "collective"): (2, 2, 2 * 28_000, 8192, 8192),
                           ("MPI_Send", "p2p"): (2, 2, 5_000 + 6_000, 1024 + 2048, None)}
        else:
            assert r.mpi == []
        assert ranks == (1 if fmt == "kineto" else 2)


def with_pid(s, old: int, new: int):
    """The scenario with process `old` renamed `new` in every row."""
    return dataclasses.replace(s, **{f.name: [dataclasses.replace(x, pid=new) if getattr(x, "pid", None) == old else x for x in v]
                                     for f in dataclasses.fields(s) if isinstance(v := getattr(s, f.name), list)})


@pytest.mark.parametrize("fmt,pid", [("rocpd", None), ("kineto", -(2**62))])
def test_any_pid_is_a_key(open_profile, fmt, pid):
    """A process id is any BIGINT: -2^62, which the split's partition ids once took for NULL, is a process of its own
    (its comm kernel counted under it, not under an unknown owner)."""
    makers = {"shared_device_pid": lambda: with_pid(SCENARIOS["shared_device"](), 6001, -(2**62))}
    r = comm_summary(open_profile("shared_device_pid", fmt, pid, scenarios=makers))
    devices = expected("shared_device_pid", fmt, pid, makers)[0]
    assert -(2**62) in {k[1] for k in devices} and None not in {k[1] for k in devices}
    assert {(d.device_id, d.pid): {k: getattr(d, k) for k in devices[(d.device_id, d.pid)]} for d in r.devices} == devices


def test_record_param_comms_fallback(tmp_path):
    """Without NCCL kernel args the record_param_comms CPU ops give the sizes (host side, no device)."""
    from gpuscope.fixtures.writers import kineto

    s = SCENARIOS["comm_overlap"]()
    s.options["kineto_args"] = {k: v for k, v in s.options["kineto_args"].items() if k[0] == "cpu_op"}
    trace = load_trace(kineto.write(s, tmp_path / "rpc.pt.trace.json", pid=5001))
    try:
        r = comm_summary(trace)
        assert [(m.source, m.device_id, m.collective_name, m.calls, m.in_nelems_total, m.in_bytes_total, m.comm_time_ns)
                for m in r.messages] == [("record_param_comms", None, "allreduce", 1, 1 << 20, 4 << 20, None)]
        assert comm_summary(trace, start_ns=900_000).messages == []  # the op lies before the window
    finally:
        trace.close()


def test_no_communication(open_case):
    r = comm_summary(open_case("concurrent_streams", "nsys"))
    assert not r.matched and r.devices == [] and r.collectives == [] and r.kernels == []
    assert "nccl" in r.message and "comm_patterns" in r.message


def test_limit_and_errors(open_case):
    trace = open_case("comm_overlap", "nsys")
    r = comm_summary(trace, limit=1)
    assert r.truncated and r.hint and len([k for k in r.kernels if k.device_id == 0]) == 1
    assert r.kernels[0].name == "ncclDevKernel_AllReduce_Sum_f32_RING_LL" and r.kernels[0].count == 2
    with pytest.raises(ProfileError, match="device 5"):
        comm_summary(trace, device=5)
    with pytest.raises(ProfileError, match="pattern"):
        comm_summary(trace, comm_patterns=["[unclosed"])


# -- real profiles -------------------------------------------------------------------------------------------------


def real(name: str):
    from gpuscope.tools.model.cache import open_trace

    path = DATA / "pytorch" / name
    if not path.exists():
        pytest.skip("shared/data is absent")
    return open_trace(path)


def test_real_ddp():
    t = real("nv_a100_ddp_cnn_train_2rank_r0_hta.json.gz")
    r = comm_summary(t)
    assert [(c.collective, c.count) for c in r.collectives] == [("AllReduce", 15), ("Broadcast", 6)]
    assert {k.name: k.streams for k in r.kernels} == {"ncclKernel_AllReduce_RING_LL_Sum_float": [40],
                                                      "ncclKernel_Broadcast_RING_LL_Sum_int8_t": [40]}
    d = r.devices[0]
    assert d.comm_summed_ns == t.scalar("SELECT sum(dur_ns) FROM kernels WHERE name LIKE 'nccl%'")
    assert {(m.collective_name, m.dtype): m.calls for m in r.messages} == {("allreduce", "Float"): 15, ("broadcast", "Float"): 3,
                                                                          ("broadcast", "Long"): 3}


def test_real_rccl_unlinked():
    r = comm_summary(real("amd_mi300x_resnet_actckpt_train_8rank_r0_tracelens.json.gz"))
    assert [(k.name, k.count, k.streams) for k in r.kernels] == [("ncclDevKernel_Generic", 17, [4])]
    assert r.devices[0].unlinked_comm_kernels == 5
    # ROCm's Generic kernel names no collective: the kernel args' 'Collective name' does for 12 of them (6 allreduce,
    # 6 broadcast); the 5 without args (the unlinked ones) stay Other. The kernel group, of several types, takes its name's
    assert {c.collective: c.count for c in r.collectives} == {"AllReduce": 6, "Broadcast": 6, "Other": 5}
    assert r.kernels[0].collective == "Other"


@pytest.mark.parametrize("rank", [0, 1])
def test_real_encdec_pair(rank):
    r = comm_summary(real(f"nv_encdec_train_128rank_sampled_r{rank}_hta.json.gz"))
    assert r.matched and r.devices[0].rank == rank and r.collectives
    assert r.messages == [] and r.notes  # the sub-sampled traces keep no collective args


@needs_data
@pytest.mark.parametrize("path", real_files("pytorch/*.json.gz", "nsys/*.sqlite", "rocpd_legacy/*"), ids=lambda p: p.name)
def test_real_profiles(path):
    from gpuscope.tools.model.cache import open_trace

    try:
        trace = open_trace(path)
    except ProfileError:
        pytest.skip("the profile itself is refused by the reader")
    if trace.count("kernels") == 0:
        with pytest.raises(ProfileError):
            comm_summary(trace)
        return
    r = comm_summary(trace)
    assert r.matched == bool(r.devices)
    # against the kernels table with a plain name match (NCCL / RCCL), not the tool's pattern list
    nccl = "(lower(name) LIKE '%nccl%' OR lower(name) LIKE '%rccl%')"
    assert r.matched == bool(trace.scalar(f"SELECT count(*) FROM kernels WHERE {nccl}"))
    for d in r.devices:
        assert d.comm_summed_ns == trace.scalar(f"SELECT sum(dur_ns) FROM kernels WHERE {nccl} AND device_id = ?",
                                                [d.device_id]), d.device_id
        assert d.overlap_with_compute_ns + d.exposed_comm_ns == d.comm_wall_ns <= d.comm_summed_ns


# -- NCCL payloads (Nsight): bus bandwidth -------------------------------------------------------------------------


def _bw_key(g):
    return (g.pid, g.collective, g.comm_id, g.message_bytes)


def test_nccl_bandwidth_exact(open_profile):
    """Every group against the fixture's own nccl-tests arithmetic (exact fractions, rounded as the tool rounds)."""
    from gpuscope.fixtures import scenarios_nccl as N
    from gpuscope.tools.analyses.nccl_bandwidth import TIME_NOTE

    s = N.nccl_payloads()
    want = N.expected_bandwidth(s)
    r = comm_summary(open_profile("nccl_payloads", "nsys", scenarios=N.SCENARIOS), limit=200)
    got = {_bw_key(g): g for g in r.bandwidth}
    assert set(got) == set(want) and not r.truncated
    gb = lambda v: None if v is None else round(float(v), 3)  # noqa: E731
    for key, w in want.items():
        g = got[key]
        assert (g.calls, g.timed_calls, g.gpu_time_ns, g.n_ranks) == (w["calls"], w["timed_calls"], w["gpu_time_ns"], w["n_ranks"]), key
        assert (g.algbw_gb_per_s, g.busbw_gb_per_s) == (gb(w["algbw"]), gb(w["busbw"])), key
        assert (g.missing is None) == (w["algbw"] is not None and w["busbw"] is not None), key
    # the figures spelled out for rank 0 (pid 7000): 2 x 8 MiB all-reduces in 60 + 68 µs on 4 ranks, ...
    world = f"{N.WORLD:#x}"
    ar = got[(7000, "AllReduce", world, 8 << 20)]
    assert (ar.alg_bytes_per_call, ar.gpu_time_ns, ar.algbw_gb_per_s, ar.busbw_factor, ar.busbw_gb_per_s) == (
        8_388_608, 128_000, 131.072, 1.5, 196.608)
    ag = got[(7000, "AllGather", world, 1 << 20)]  # S = 1 MiB per rank x 4 ranks, 32 µs
    assert (ag.alg_bytes_per_call, ag.algbw_gb_per_s, ag.busbw_gb_per_s) == (4_194_304, 131.072, 98.304)
    rs = got[(7000, "ReduceScatter", f"{N.PAIR:#x}", 2 << 20)]  # 2 MiB per rank x 2 ranks, 40 µs
    assert (rs.n_ranks, rs.alg_bytes_per_call, rs.algbw_gb_per_s, rs.busbw_gb_per_s) == (2, 4_194_304, 104.858, 52.429)
    bc = got[(7000, "Broadcast", world, 1 << 20)]
    assert (bc.algbw_gb_per_s, bc.busbw_gb_per_s) == (65.536, 65.536)
    orphan = got[(7000, "AllReduce", f"{N.ORPHAN:#x}", 2 << 20)]  # algbw needs no n; busbw does
    assert (orphan.algbw_gb_per_s, orphan.busbw_gb_per_s) == (104.858, None) and "before the capture" in orphan.missing
    assert got[(7000, "AllGather", f"{N.ORPHAN:#x}", 1 << 20)].algbw_gb_per_s is None  # S = size x n: unknown
    send = got[(7000, "Send", f"{N.PAIR:#x}", 1 << 19)]
    assert (send.timed_calls, send.algbw_gb_per_s, send.device_id) == (0, None, None) and "ncclGroupEnd" in send.missing
    assert got[(7001, "AllReduce", world, 8 << 20)].rank == 2 and ar.rank == 0 and ar.device_id == 0
    assert TIME_NOTE in r.notes and not any("message sizes" in n for n in r.notes) and r.data_issues == []


def test_nccl_bandwidth_filters(open_profile):
    from gpuscope.fixtures import scenarios_nccl as N

    trace = open_profile("nccl_payloads", "nsys", scenarios=N.SCENARIOS)
    dev1 = comm_summary(trace, device=1, limit=200).bandwidth
    assert dev1 and {g.pid for g in dev1} == {7001} and all(g.timed_calls == g.calls for g in dev1)
    # calls whose range starts in [150 µs, 450 µs): the second all-reduce, the all-gather and the broadcast of each rank
    window = comm_summary(trace, start_ns=150_000, end_ns=450_000, limit=200).bandwidth
    assert sorted((g.pid, g.collective, g.calls) for g in window) == sorted(
        (p, c, 1) for p in (7000, 7001) for c in ("AllReduce", "AllGather", "Broadcast"))
    assert len(comm_summary(trace, limit=3).bandwidth) == 3


def test_nccl_bandwidth_damage_is_reported(tmp_path):
    """Payloads that cannot be decoded leave their calls out of the figures and say so in data_issues."""
    from gpuscope.fixtures import scenarios_nccl as N
    from gpuscope.fixtures.writers import nsys

    s = N.nccl_payloads()
    first = min(i for i, (op, _) in s.options["nccl_payloads"].items() if op == "AllReduce")
    s.options["raw_values"] = {("marker", first): {"binaryData": b"\x00" * 12}}
    trace = load_trace(nsys.write(s, tmp_path / "broken.sqlite"))
    try:
        r = comm_summary(trace, limit=200)
        ar = next(g for g in r.bandwidth if (g.pid, g.collective, g.message_bytes) == (7000, "AllReduce", 8 << 20))
        assert (ar.calls, ar.gpu_time_ns) == (1, 68_000)
        assert any(n.startswith("1 nccl_calls row skipped: NCCL payload is shorter") for n in r.data_issues)
    finally:
        trace.close()
