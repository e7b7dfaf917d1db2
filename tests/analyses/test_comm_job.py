"""comm_job_summary over a job of many per-rank profiles: exact figures from the generator (fixtures/scenarios_job.py),
a rank without communication kernels as a row of zeros, and a fixed number of SQL statements however many ranks."""

from __future__ import annotations

import statistics

import pytest

from gpuscope.fixtures.scenarios_job import COMM_IDS, MESSAGES, PID0, TAIL_US, US, compute_us, job, message_bytes
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.tools import analyses as A
from gpuscope.tools.model import hub as hubs
from gpuscope.tools.model import job as jobs
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

STEPS = 3


def _write(folder, n: int, straggler: int, silent: tuple[int, ...] = ()):
    folder.mkdir(parents=True, exist_ok=True)
    s = job(n, straggler, STEPS, silent)
    return [kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]


def _truth(n: int, straggler: int, silent: tuple[int, ...] = ()) -> dict[int, dict]:
    """Per rank, in ns, from the generator's constants: per step i a gemm of C(r, i) µs and (unless silent) one
    all-reduce of max_{q not silent} C(q, i) + TAIL - C(r, i) µs; the two never overlap, so the all-reduce is all
    exposed and its wall time is its summed time."""
    slowest = [max((compute_us(q, i, straggler) for q in range(n) if q not in silent), default=0) for i in range(STEPS)]
    out = {}
    for r in range(n):
        durs = [] if r in silent else [(slowest[i] + TAIL_US - compute_us(r, i, straggler)) * US for i in range(STEPS)]
        out[r] = {"comm_kernels": len(durs), "comm_summed_ns": sum(durs), "comm_wall_ns": sum(durs),
                  "exposed_comm_ns": sum(durs), "compute_ns": sum(compute_us(r, i, straggler) for i in range(STEPS)) * US,
                  "durs": durs}
    return out


def _message_truth(n: int, straggler: int, silent: tuple[int, ...] = (), source: str = "kernel args") -> list[tuple]:
    """Per (communicator, bytes) of MESSAGES, from the generator: the per-rank sums of the all-reduce durations of the
    steps using it (silent ranks count 0), as the tool's MessageSpread fields, largest total first."""
    durs = _truth(n, straggler, silent)
    groups: dict[tuple, list[int]] = {}
    for i in range(STEPS):
        group = MESSAGES[i % len(MESSAGES)][0]
        comm = group if source == "kernel args" else f"0x{COMM_IDS[group]:016x}"
        per_rank = groups.setdefault((comm, message_bytes(i)), [0] * n)
        calls = groups.setdefault(("calls", comm, message_bytes(i)), [0] * n)
        for r in range(n):
            if r not in silent:
                per_rank[r] += durs[r]["durs"][i]
                calls[r] += 1
    out = []
    for (comm, b), totals in ((k, v) for k, v in groups.items() if k[0] != "calls"):
        calls = groups[("calls", comm, b)]
        out.append((source, "allreduce" if source == "kernel args" else "AllReduce", comm, b,
                    sum(1 for c in calls if c), n, sum(calls), sum(calls), sum(totals), min(totals),
                    float(statistics.median(totals)), max(totals), totals.index(min(totals)), totals.index(max(totals))))
    return sorted(out, key=lambda m: (-m[8], m[2], m[3]))


def _messages(res) -> list[tuple]:
    return [(m.source, m.collective, m.communicator, m.message_bytes, m.ranks_with, m.ranks_counted, m.calls,
             m.timed_calls, m.total_ns, m.min_ns, m.median_ns, m.max_ns, m.min_rank, m.max_rank) for m in res.messages]


def _check(res, n: int, straggler: int, silent: tuple[int, ...] = ()):
    assert _messages(res) == _message_truth(n, straggler, silent)
    truth = _truth(n, straggler, silent)
    assert res.ranks_found == n and res.traces == n and not res.truncated
    assert res.ranks_with_comm == n - len(silent)
    assert [r.rank for r in res.ranks] == list(range(n))
    for row in res.ranks:
        want = truth[row.rank]
        assert {k: getattr(row, k) for k in ("comm_kernels", "comm_summed_ns", "comm_wall_ns", "exposed_comm_ns",
                                               "compute_ns")} == {k: v for k, v in want.items() if k != "durs"}, row.rank
        assert row.pid == PID0 + row.rank and row.devices == [row.rank % 8] and row.rank_source == "profile"
        if row.rank in silent:
            assert row.collectives == [] and row.exposed_comm_pct_of_comm_wall is None
            assert any("no communication kernel" in x for x in row.notes)
        else:
            (c,) = row.collectives
            assert (c.collective, c.count, c.total_ns, c.min_ns, c.max_ns, c.pct_of_rank_comm_summed) == (
                "AllReduce", STEPS, want["comm_summed_ns"], min(want["durs"]), max(want["durs"]), 100.0)
            assert row.exposed_comm_pct_of_comm_wall == 100.0
    totals = [truth[r]["comm_summed_ns"] for r in range(n)]  # silent ranks count 0
    (spread,) = res.collectives
    assert spread.collective == "AllReduce"
    assert (spread.ranks_with, spread.ranks_counted, spread.count, spread.total_ns) == (
        n - len(silent), n, STEPS * (n - len(silent)), sum(totals))
    assert (spread.min_ns, spread.max_ns, spread.median_ns) == (min(totals), max(totals), statistics.median(totals))
    assert spread.max_rank == totals.index(max(totals)) and spread.min_rank == totals.index(min(totals))
    return spread


@pytest.mark.parametrize("n, straggler", [(2, 1), (8, 5)])
def test_every_rank_and_collective_exact(tmp_path, n, straggler):
    res = A.comm_job_summary([load_trace(p) for p in _write(tmp_path, n, straggler)])
    spread = _check(res, n, straggler)
    # the straggler arrives last at every all-reduce: the shortest kernels, the least time in it
    assert spread.min_rank == straggler
    assert spread.max_rank == 0  # a rank of the least compute (r % 3 == 0) waits longest; rank 0 on ties
    assert res.ranks[straggler].comm_summed_ns == min(r.comm_summed_ns for r in res.ranks)


def test_32_ranks_with_a_silent_rank_and_the_limit(tmp_path):
    n, straggler, silent = 32, 11, (30,)
    traces = [load_trace(p) for p in _write(tmp_path, n, straggler, silent)]
    res = A.comm_job_summary(traces)
    spread = _check(res, n, straggler, silent)
    assert spread.min_rank == 30 and spread.min_ns == 0 and spread.max_rank == 0
    assert any("1 of 32 ranks ran no communication kernel" in x for x in res.notes)
    cut = A.comm_job_summary(traces, limit=3)
    assert cut.truncated and "32 ranks" in cut.hint
    assert [r.rank for r in cut.ranks] == [0, 1, 30]  # the max and min ranks first, then the lowest
    assert cut.collectives == res.collectives  # spreads cover all ranks


@pytest.mark.parametrize("n", [2, 8, 32])
def test_messages_by_communicator_and_size(tmp_path, n):
    """Three message groups (two sizes on group '0', the larger size on group '1'): per group the per-rank GPU time
    spread, from Kineto kernel args (one file per rank) and from NCCL payloads (one Nsight export of every rank)."""
    straggler, silent = n // 2, ((n - 1,) if n > 2 else ())
    res = A.comm_job_summary([load_trace(p) for p in _write(tmp_path / "kineto", n, straggler, silent)])
    want = _message_truth(n, straggler, silent)
    assert _messages(res) == want and len(want) == 3
    assert {(m.communicator, m.message_bytes) for m in res.messages} == {("0", 4 << 20), ("0", 2 << 20), ("1", 4 << 20)}
    export = nsys.write(job(n, straggler, STEPS, silent, nccl_ranges=True), tmp_path / "job.sqlite")
    res = A.comm_job_summary([load_trace(export)])
    assert res.ranks_found == n and _messages(res) == _message_truth(n, straggler, silent, "nccl payloads")
    cut = A.comm_job_summary([load_trace(export)], limit=2)
    assert cut.truncated and _messages(cut) == _message_truth(n, straggler, silent, "nccl payloads")[:2]


def test_one_profile_and_refusals(tmp_path):
    (p,) = _write(tmp_path, 1, 0)
    res = A.comm_job_summary([load_trace(p)])
    assert res.ranks_found == 1 and res.ranks[0].comm_kernels == STEPS and res.ranks[0].comm_summed_ns == STEPS * TAIL_US * US
    with pytest.raises(ProfileError, match="given twice"):
        A.comm_job_summary([load_trace(p), load_trace(p)])
    with pytest.raises(ProfileError, match="no profiles"):
        A.comm_job_summary([])


def test_no_communication_anywhere(tmp_path):
    res = A.comm_job_summary([load_trace(p) for p in _write(tmp_path, 2, 1, silent=(0, 1))])
    assert res.ranks_with_comm == 0 and res.collectives == []
    assert all(r.comm_summed_ns == 0 and r.comm_wall_ns == 0 and r.exposed_comm_ns == 0 and r.collectives == []
               for r in res.ranks)
    assert [r.compute_ns for r in res.ranks] == [_truth(2, 1, (0, 1))[r]["compute_ns"] for r in range(2)]
    assert any("no rank has communication kernels" in x for x in res.notes)


def test_statements_do_not_grow_with_the_ranks(tmp_path, monkeypatch):
    counts = {}
    for n in (4, 16):
        traces = [load_trace(p) for p in _write(tmp_path / f"job{n}", n, 1)]  # fresh: nothing memoized yet
        stacked = per_trace = 0
        real_job_sql, real_cursor = jobs.job_sql, hubs.ModelConnection.cursor

        def job_sql(*a, **k):
            nonlocal stacked
            stacked += 1
            return real_job_sql(*a, **k)

        def cursor(con):
            nonlocal per_trace
            per_trace += 1
            return real_cursor(con)

        monkeypatch.setattr(jobs, "job_sql", job_sql)
        monkeypatch.setattr(hubs.ModelConnection, "cursor", cursor)
        res = A.comm_job_summary(traces)
        assert res.collectives[0].min_rank == 1
        counts[n] = (stacked, per_trace)
        monkeypatch.undo()
    assert counts[4] == counts[16], f"statements (stacked, per trace) for 4 vs 16 ranks: {counts}"
    assert counts[16][0] == 8, counts  # prime 2, ranks 2, figures 4 (README)


def test_cli_and_mcp_over_a_folder_and_a_glob(tmp_path, capsys):
    import anyio
    import json

    from mcp import Client

    from gpuscope.server.app import server
    from gpuscope.server.cli import main

    n, straggler = 8, 5
    _write(tmp_path / "run", n, straggler)
    want = A.comm_job_summary(jobs.open_job([tmp_path / "run"])).model_dump(mode="json")
    assert main(["comm-job-summary", str(tmp_path / "run" / "rank*.pt.trace.json"), "--json"]) in (None, 0)
    assert json.loads(capsys.readouterr().out) == want
    assert main(["comm-job-summary", str(tmp_path / "run")]) in (None, 0)
    assert capsys.readouterr().out.startswith("## Communication across ranks")

    async def call():
        async with Client(server) as client:
            return await client.call_tool("comm_job_summary", {"traces": [str(tmp_path / "run")]})

    res = anyio.run(call)
    assert not res.is_error, res.content[0].text
    assert res.structured_content["collectives"][0]["min_rank"] == straggler
    assert res.structured_content == want


def test_rocm_generic_kernels_by_their_recorded_operation(tmp_path):
    """ROCm's RCCL runs every collective under one kernel name, ncclDevKernel_Generic: a job whose NCCL kernels are all
    so named (fixtures/scenarios_job.py with p2p=True, the SendRecvs' args saying 'send' on even ranks and 'recv' on
    odd ones) splits by the operation its kernel args record: the all-reduces as from their NCCL names, and per rank
    STEPS sends or receives of P2P_US + rank x P2P_STEP_US µs each. (With their NCCL names and every SendRecv's args
    saying 'send', the recorded operation wins there too: Send, not SendRecv.)"""
    import dataclasses

    from gpuscope.fixtures.catalog import NCCL, NCCL_SENDRECV
    from gpuscope.fixtures.scenarios_job import P2P_STEP_US, P2P_US

    n, straggler = 4, 2
    folders = {}
    for variant in ("named", "generic"):
        s = job(n, straggler, STEPS, p2p=True)
        if variant == "generic":
            s.kernels = [dataclasses.replace(k, name="ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
                                             short_name="ncclDevKernel_Generic") if k.name in (NCCL[0], NCCL_SENDRECV[0]) else k
                         for k in s.kernels]
            for (_, pid, _), a in s.options["kineto_args"].items():
                if a["Collective name"] == "send" and (pid - PID0) % 2:
                    a["Collective name"] = "recv"
        (tmp_path / variant).mkdir()
        folders[variant] = [kineto.write(s, tmp_path / variant / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]
    named = A.comm_job_summary([load_trace(p) for p in folders["named"]])
    res = A.comm_job_summary([load_trace(p) for p in folders["generic"]])
    assert [c.collective for c in named.collectives] == ["AllReduce", "Send"]
    by_type = {c.collective: c for c in res.collectives}
    assert set(by_type) == {"AllReduce", "Send", "Recv"} and by_type["AllReduce"] == named.collectives[0]
    for label, ranks in (("Send", range(0, n, 2)), ("Recv", range(1, n, 2))):
        c = by_type[label]
        totals = [STEPS * (P2P_US + r * P2P_STEP_US) * US if r in ranks else 0 for r in range(n)]
        assert (c.ranks_with, c.count, c.total_ns, c.min_ns, c.max_ns, c.max_rank) == (
            len(ranks), STEPS * len(ranks), sum(totals), 0, max(totals), max(ranks))
    for row in res.ranks:
        assert sorted(c.collective for c in row.collectives) == sorted(["AllReduce", "Send" if row.rank % 2 == 0 else "Recv"])
    # messages: the collective and process group the kernel args record, 'send' / 'recv' of group 'pp'
    assert {(m.collective, m.communicator) for m in res.messages if m.communicator == "pp"} == {("send", "pp"), ("recv", "pp")}
