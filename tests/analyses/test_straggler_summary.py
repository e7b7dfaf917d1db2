"""straggler_summary and multi-rank jobs: exact figures for N = 2, 8 and 64 ranks with a known straggler and
known collective skew (fixtures/scenarios_job.py computes them from its constants, not from the engine); a job of
two communicator kinds under one kernel name (fixtures/scenarios_comm_groups.py) matched by communicator where the
profile records it and by name order where it does not; point-to-point kernels left out; real profiles."""

from __future__ import annotations

import pytest
from mcp import Client

from conftest import DATA
from gpuscope.fixtures.catalog import NCCL
from gpuscope.fixtures.scenarios_comm_groups import KINDS, communicator, tp_dp_job
from gpuscope.fixtures.scenarios_comm_groups import expected as tp_dp_expected
from gpuscope.fixtures.scenarios_job import PID0, TAIL_US, US, compute_us, expected, job, write_job
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.server.app import server
from gpuscope.tools import analyses as A
from gpuscope.tools.model import cache, job as jobs
from gpuscope.tools.model.cache import leases
from gpuscope.tools.model.errors import ProfileError

STEPS = 3
needs_data = pytest.mark.skipif(not (DATA / "pytorch").is_dir(), reason="../shared/data real profiles are not present")


def _write_ranks(folder, n: int, straggler: int):
    folder.mkdir(parents=True, exist_ok=True)
    s = job(n, straggler, STEPS)
    return [kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]


def _check(res, n: int, straggler: int, by_communicator: bool = True) -> None:
    """Kineto records each all-reduce's process group ('0' for steps 0 and 1, '1' for step 2: numbered per group);
    Nsight without NCCL payloads records none (matched by name order, numbered by step)."""
    e = expected(n, straggler, STEPS, by_communicator)
    got = sorted(res.collectives, key=lambda c: (c.communicator or "", c.seq))
    assert [(c.communicator, c.seq, c.ranks, c.last_rank, c.skew_ns, c.median_wait_ns, c.min_dur_ns, c.max_dur_ns)
            for c in got] == [
        (c["communicator"], c["seq"], n, c["last_rank"], c["skew_ns"], c["median_wait_ns"], c["min_dur_ns"], c["max_dur_ns"])
        for c in e["collectives"]]
    assert res.collective_match == ("communicator" if by_communicator else "name_order") and res.p2p_kernels == 0
    assert res.ranks_found == n and res.ranks_with_comm == n
    assert res.collectives_compared == STEPS and res.collectives_skipped == 0
    assert res.total_skew_ns == sum(c["skew_ns"] for c in e["collectives"])
    assert {r.rank: r.times_last for r in res.ranks} == {r: t for r, t in e["times_last"].items()
                                                         if r in {x.rank for x in res.ranks}}
    assert res.straggler is not None and res.straggler.rank == straggler
    assert res.straggler.times_last == STEPS
    gemm = next(k for k in res.straggler.top_kernels if k.name == "gemm_kernel")
    assert gemm.total_ns == e["straggler_gemm_total_ns"] and gemm.count == STEPS


@pytest.mark.parametrize("n,straggler", [(2, 1), (8, 5), (64, 37)])
def test_straggler_found_exactly_across_per_rank_profiles(tmp_path, n, straggler):
    _write_ranks(tmp_path / "run", n, straggler)
    progress = []
    with leases():
        traces = jobs.open_job([str(tmp_path / "run")], lambda f, m: progress.append(m))
        res = A.straggler_summary(traces, limit=1024)
    _check(res, n, straggler)
    assert len([m for m in progress if m.startswith("built store")]) == n  # one per rank whose store was built
    assert progress[-1].startswith(f"stacked {n}/{n} ranks")  # then the ranks stacked into one job store
    # Parallel builds: reopening needs no build at all.
    assert jobs.missing_stores(sorted((tmp_path / "run").iterdir())) == []


def test_straggler_in_one_nsight_file_holding_every_rank(tmp_path):
    path = nsys.write(job(8, 3, STEPS), tmp_path / "job.sqlite")
    with leases():
        res = A.straggler_summary(jobs.open_job([str(path)]))
    _check(res, 8, 3, by_communicator=False)
    assert [n for n in res.notes if "record no communicator" in n] == [
        "24 of 24 collective kernels record no communicator (Nsight Systems SQLite export: Nsight records it from NCCL's "
        "NVTX payloads (NCCL 2.19 or later, exported with --include-blobs=true), for kernels one NCCL call launched), so "
        "collectives are matched by kernel name order across every rank with communication: where ranks run several "
        "communicators (tensor-, data-, pipeline-parallel groups) under one kernel name, an instance can join kernels "
        "of different communicators and its last rank and skew are then wrong"]


def test_rank_summary_over_a_glob_of_64_ranks_names_the_same_straggler(tmp_path, monkeypatch):
    """64 ranks while the cache keeps only 4 open: leases keep every rank open for the call."""
    _write_ranks(tmp_path / "run", 64, 37)
    monkeypatch.setattr(cache, "MAX_TRACES", 4)
    with leases():
        res = A.rank_summary(jobs.open_job([str(tmp_path / "run" / "rank*.pt.trace.json")]))
    assert res.ranks_found == 64 and res.world_size == 64
    assert res.straggler is not None and res.straggler.rank == 37
    cache.clear()


def test_one_rank_has_no_straggler(tmp_path):
    """A collective held by one rank compares nothing: no instance, no straggler, and a note saying why."""
    paths = _write_ranks(tmp_path / "run", 1, 0)
    with leases():
        res = A.straggler_summary(jobs.open_job(paths))
    assert res.straggler is None and res.collectives_compared == 0 and res.collectives == []
    assert res.collectives_skipped == STEPS and res.total_skew_ns is None
    assert f"{STEPS} collective instances are held by one rank only (no other member of their communicator is among " \
           "the profiles given): nothing to compare them with" in res.notes


def test_ranks_without_communication_say_so(tmp_path, write_profile):
    path = write_profile("no_kernels", "kineto")
    with leases():
        res = A.straggler_summary(jobs.open_job([path]))
    assert res.collectives == [] and res.straggler is None and res.total_skew_ns is None
    assert any("no rank has communication kernels" in n for n in res.notes)


def test_unmatched_names_and_empty_folders_are_clear_errors(tmp_path):
    with pytest.raises(ProfileError, match="no file matches"):
        jobs.expand([str(tmp_path / "rank*.json")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="holds no profile"):
        jobs.expand([str(tmp_path / "empty")])
    (tmp_path / "bad.pt.trace.json").write_text('{"traceEvents": [')
    good = _write_ranks(tmp_path / "run", 4, 1)
    with pytest.raises(ProfileError, match=r"1 of 5 rank profiles could not be read.*bad\.pt\.trace\.json"):
        jobs.build_stores([*good, tmp_path / "bad.pt.trace.json"])


@pytest.mark.anyio
async def test_straggler_summary_through_mcp_with_a_folder(anyio_backend, tmp_path):
    _write_ranks(tmp_path / "run", 8, 5)
    async with Client(server) as client:
        res = await client.call_tool("straggler_summary", {"traces": [str(tmp_path / "run")]})
        assert not res.is_error, res.content[0].text
        assert res.structured_content["straggler"]["rank"] == 5
        res = await client.call_tool("rank_summary", {"traces": [str(tmp_path / "run")]})
        assert not res.is_error and res.structured_content["straggler"]["rank"] == 5


# -- communicators sharing one kernel name: TP groups {0-3} {4-7}, DP pairs {r, r + 4}, straggler rank 5 ----------

def _tp_dp(tmp_path, fmt: str) -> list[str]:
    """fixtures/scenarios_comm_groups.py's job: Kineto one file per rank (process group in the NCCL kernels' args),
    Nsight one file with every rank (NCCL payloads), or either without its communicators (Kineto args without the
    process group, Nsight without NCCL ranges)."""
    return write_job(tp_dp_job(8, 4, 5, STEPS, nccl_ranges=fmt == "nsys"), fmt, tmp_path)


def _recorded(fmt: str) -> dict[str, str]:
    """The generator's communicator names -> the communicator as the profile records it (Nsight: the hex id)."""
    names = {communicator(kind, r, 4) for kind in KINDS for r in range(8)}
    return {name: hex(cid) if fmt == "nsys" else name for name, cid in names}


def _rows(res):
    return sorted((c.communicator or "", c.seq, c.ranks, c.last_rank, c.skew_ns, c.median_wait_ns, c.min_dur_ns,
                   c.max_dur_ns) for c in res.collectives)


def _want_rows(e, fmt: str):
    names = _recorded(fmt)
    return sorted((names.get(c["communicator"], ""), c["seq"], c["ranks"], c["last_rank"], c["skew_ns"],
                   c["median_wait_ns"], c["min_dur_ns"], c["max_dur_ns"]) for c in e["collectives"])


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "kineto_no_group", "nsys_no_payloads"])
def test_collectives_match_by_communicator_where_recorded(tmp_path, fmt):
    """By communicator (Kineto process group, Nsight NCCL payload) each TP all-reduce is compared across its TP group
    and each DP all-reduce across its pair: 2 x 2 TP + 4 DP instances per step, the straggler last 9 times of 9, group
    0's slowest (rank 2) 6 times. By name order (no communicator recorded) the k-th all-reduce of every rank is one
    instance of 8 ranks: rank 2 wins every TP tie with rank 5, rank 4 (lowest of group 1) every DP instance, and the
    straggler is never named. Figures from the generator (fixtures/scenarios_comm_groups.expected), exact ns."""
    by_comm = fmt in ("kineto", "nsys")
    e = tp_dp_expected(8, 4, 5, STEPS, by_comm)
    with leases():
        res = A.straggler_summary(jobs.open_job(_tp_dp(tmp_path, fmt)), limit=1024)
    assert res.collective_match == ("communicator" if by_comm else "name_order")
    assert res.ranks_found == res.ranks_with_comm == 8 and res.p2p_kernels == 0 and not res.truncated
    assert res.collectives_compared == len(e["collectives"]) == (8 if by_comm else 3) * STEPS
    assert res.collectives_skipped == 0
    assert _rows(res) == _want_rows(e, fmt)
    assert res.total_skew_ns == sum(c["skew_ns"] for c in e["collectives"])
    assert {r.rank: (r.collectives, r.times_last, r.waited_ns) for r in res.ranks} == {
        r: (w["collectives"], w["times_last"], w["waited_ns"]) for r, w in e["ranks"].items()}
    assert res.straggler is not None and res.straggler.rank == e["straggler"] == (5 if by_comm else 2)
    assert res.straggler.times_last == (3 * STEPS if by_comm else 2 * STEPS)
    assert res.straggler.evidence.startswith(
        "rank 5 arrived last at 9 of the 9 collectives it took part in (24 compared in the job;" if by_comm else
        "rank 2 arrived last at 6 of the 9 collectives it took part in (9 compared in the job;")
    no_comm = [n for n in res.notes if "record no communicator" in n]
    assert len(no_comm) == (0 if by_comm else 1)
    if not by_comm:
        fmt_name = "Nsight Systems SQLite export" if fmt.startswith("nsys") else "PyTorch profiler (Kineto) trace"
        assert no_comm[0].startswith(f"{9 * 8} of {9 * 8} collective kernels record no communicator ({fmt_name}: ")


def test_one_kernel_without_a_communicator_matches_every_kernel_by_name(tmp_path):
    """The communicator rule needs every collective kernel's communicator: one Kineto kernel without its process
    group (rank 6, step 1's DP all-reduce) sends the whole job to name order, and the note counts it."""
    s = tp_dp_job(8, 4, 5, STEPS)
    args = s.options["kineto_args"]
    key = sorted(k for k, a in args.items() if k[1] == PID0 + 6 and a["Process Group Name"] == "dp2")[1]
    args[key] = {a: v for a, v in args[key].items() if a != "Process Group Name"}
    for r in range(8):
        kineto.write(s, tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r)
    with leases():
        res = A.straggler_summary(jobs.open_job([str(tmp_path)]), limit=1024)
    e = tp_dp_expected(8, 4, 5, STEPS, by_communicator=False)
    assert res.collective_match == "name_order" and _rows(res) == _want_rows(e, "kineto")
    assert res.straggler.rank == 2
    assert any(n.startswith("1 of 72 collective kernels record no communicator (PyTorch profiler (Kineto) trace: PyTorch "
                            "writes it as the NCCL kernel's 'Process Group Name' arg") for n in res.notes)


def test_point_to_point_kernels_are_never_compared(tmp_path):
    """fixtures/scenarios_job.job(tp_groups=2, p2p=True): TP groups {0, 1} {2, 3} all-reduce, then every rank's
    SendRecv in process group 'pp' (same name, same group on every rank). The SendRecvs are left out (a note counts
    them); the all-reduces are compared per group: group {0, 1} waits for rank 1 (gemm 304 µs), {2, 3} for rank 2."""
    steps = 2
    s = job(4, 2, steps, tp_groups=2, p2p=True)
    for r in range(4):
        kineto.write(s, tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r)
    with leases():
        res = A.straggler_summary(jobs.open_job([str(tmp_path)]))
    assert res.collective_match == "communicator" and res.p2p_kernels == 4 * steps and res.ranks_with_comm == 4
    want = []
    for i in range(steps):
        for g in (0, 1):
            c = {r: compute_us(r, i, 2) for r in (2 * g, 2 * g + 1)}
            durs = {r: (TAIL_US + max(c.values()) - x) * US for r, x in c.items()}
            last = min(r for r, x in durs.items() if x == min(durs.values()))
            want.append((f"tp{g}", i + 1, 2, last, max(durs.values()) - min(durs.values())))
    assert sorted((c.communicator, c.seq, c.ranks, c.last_rank, c.skew_ns) for c in res.collectives) == sorted(want)
    assert {c.name for c in res.collectives} == {NCCL[0]}
    assert res.collectives_compared == 2 * steps and res.collectives_skipped == 0
    assert f"{4 * steps} point-to-point kernels (Send, Recv, SendRecv) are not compared: a transfer joins two ranks " \
           "whose pairing the profile does not record, not every member of a communicator" in res.notes
    assert res.straggler is None  # ranks 1 and 2 are each last in their group at every step: a tie


@needs_data
def test_real_profiles_say_which_rule_ran():
    """Real Kineto traces: the encoder/decoder pair runs only SendRecv kernels (nothing to compare); the DDP rank's
    all-reduces and broadcasts all record process group '0' (communicator rule, but one rank: nothing to compare);
    the MI300X rank has 5 of its 17 RCCL kernels without a process group (name order, said in a note)."""
    pt = DATA / "pytorch"
    with leases():
        pair = A.straggler_summary(jobs.open_job([str(pt / f"nv_encdec_train_128rank_sampled_r{r}_hta.json.gz") for r in (0, 1)]))
        ddp = A.straggler_summary(jobs.open_job([str(pt / "nv_a100_ddp_cnn_train_2rank_r0_hta.json.gz")]))
        amd = A.straggler_summary(jobs.open_job([str(pt / "amd_mi300x_resnet_actckpt_train_8rank_r0_tracelens.json.gz")]))
    assert (pair.collective_match, pair.ranks_found, pair.ranks_with_comm, pair.p2p_kernels, pair.collectives_compared) == (
        "none", 2, 0, 20, 0)
    assert "no rank has collective communication kernels, only point-to-point ones: there is no collective to compare" in pair.notes
    assert (ddp.collective_match, ddp.collectives_compared, ddp.collectives_skipped, ddp.straggler) == ("communicator", 0, 21, None)
    assert (amd.collective_match, amd.collectives_compared, amd.collectives_skipped) == ("name_order", 0, 17)
    assert any(n.startswith("5 of 17 collective kernels record no communicator") for n in amd.notes)


@pytest.fixture
def anyio_backend():
    return "asyncio"
