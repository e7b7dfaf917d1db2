"""compare_traces over two jobs: a job of N ranks against the same job where one known rank's gemm takes K times as
long. Every figure is computed here from the generator's constants (fixtures/scenarios_job.py), never by the engine."""

from __future__ import annotations

import json
import statistics

import pytest

from gpuscope.fixtures.scenarios_job import PID0, TAIL_US, US, compute_us, job, step_us
from gpuscope.fixtures.writers import kineto
from gpuscope.tools import analyses as A
from gpuscope.tools.model import job as jobs
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

STEPS = 3
NO_STRAGGLER = -1


def _write(folder, n: int, slow=None):
    folder.mkdir(parents=True, exist_ok=True)
    s = job(n, NO_STRAGGLER, STEPS, slow=slow)
    return [kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]


def _truth(n: int, slow=None) -> dict:
    """Per rank (ns): gemm total, all-reduce total, mean step; from compute_us / TAIL_US / step_us."""
    cs = [[compute_us(r, i, NO_STRAGGLER, slow) for i in range(STEPS)] for r in range(n)]
    slowest = [max(cs[r][i] for r in range(n)) for i in range(STEPS)]
    gemm = [sum(cs[r]) * US for r in range(n)]
    ar = [sum(slowest[i] + TAIL_US - cs[r][i] for i in range(STEPS)) * US for r in range(n)]
    step = sum(step_us(slowest[i]) for i in range(STEPS)) * US / STEPS
    return {"gemm": gemm, "ar": ar, "step": step}


@pytest.mark.parametrize("n, rank, k", [(8, 5, 5), (32, 17, 3)])
def test_one_rank_k_times_slower(tmp_path, n, rank, k):
    base = [load_trace(p) for p in _write(tmp_path / "base", n)]
    cand = [load_trace(p) for p in _write(tmp_path / "cand", n, (rank, k))]
    res = A.compare_traces(base, cand)
    tb, tc = _truth(n), _truth(n, (rank, k))
    # kernels: summed over ranks, with the median over ranks of a rank's summed time
    ent = {e.key: e for e in res.kernels.entries}
    gemm = ent["gemm_kernel"]
    assert (gemm.status, gemm.baseline_count, gemm.candidate_count) == ("regressed", n * STEPS, n * STEPS)
    assert (gemm.baseline_ns, gemm.candidate_ns) == (sum(tb["gemm"]), sum(tc["gemm"]))
    assert gemm.delta_ns == (k - 1) * tb["gemm"][rank]
    assert (gemm.baseline_rank_median_ns, gemm.candidate_rank_median_ns) == (statistics.median(tb["gemm"]),
                                                                            statistics.median(tc["gemm"]))
    assert (gemm.baseline_ranks_with, gemm.candidate_ranks_with) == (n, n)
    ar = ent["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    assert (ar.baseline_ns, ar.candidate_ns) == (sum(tb["ar"]), sum(tc["ar"]))
    assert ar.candidate_rank_median_ns == statistics.median(tc["ar"])
    assert res.kernels.gross_change_ns == abs(gemm.delta_ns) + abs(ar.delta_ns)
    totals = {t.figure: t for t in res.totals}
    assert (totals["computation_ns"].baseline_ns, totals["computation_ns"].candidate_ns) == (sum(tb["gemm"]), sum(tc["gemm"]))
    assert totals["summed_kernel_time_ns"].candidate_ns == sum(tc["gemm"]) + sum(tc["ar"])
    # step time per job (every rank waits for the all-reduce: the slow gemm lengthens every rank's steps)
    assert (res.job.baseline.median_rank_step_ns, res.job.candidate.median_rank_step_ns) == (tb["step"], tc["step"])
    assert res.job.candidate.max_rank_step_ns == tc["step"] and res.job.candidate.ranks_with_steps == n
    assert res.job.median_rank_step_change_pct == round(100 * (tc["step"] - tb["step"]) / tb["step"], 2)
    # which rank got slower, by how much, and the kernel that changed most on it
    assert res.job.ranks_matched == n and res.job.counts["slower"] == 1 and res.job.counts["unchanged"] == n - 1
    (rc,) = res.job.ranks
    assert (rc.rank, rc.status, rc.baseline_compute_ns, rc.candidate_compute_ns) == (rank, "slower", tb["gemm"][rank],
                                                                                   tc["gemm"][rank])
    assert rc.compute_change_pct == 100.0 * (k - 1)
    assert (rc.top_kernel, rc.top_kernel_delta_ns) == ("gemm_kernel", (k - 1) * tb["gemm"][rank])
    assert (rc.baseline_kernel_ns, rc.candidate_kernel_ns) == (tb["gemm"][rank] + tb["ar"][rank],
                                                               tc["gemm"][rank] + tc["ar"][rank])
    assert (rc.baseline_step_ns, rc.candidate_step_ns) == (tb["step"], tc["step"])
    assert res.ops is None and res.devices == [None, None] and f"({n} profiles)" in res.baseline


def test_single_profiles_keep_their_result(tmp_path):
    (b,), (c,) = _write(tmp_path / "b", 1), _write(tmp_path / "c", 1, (0, 2))
    res = A.compare_traces(load_trace(b), load_trace(c))
    assert res.job is None and res.baseline == str(b)
    assert all(e.baseline_rank_median_ns is None for e in res.kernels.entries)
    with pytest.raises(ProfileError, match="without device"):
        A.compare_traces([load_trace(b)], [load_trace(c)], device=0)


def test_statements_do_not_grow_with_the_ranks(tmp_path, monkeypatch):
    counts = {}
    for n in (4, 12):
        base = [load_trace(p) for p in _write(tmp_path / f"b{n}", n)]
        cand = [load_trace(p) for p in _write(tmp_path / f"c{n}", n, (1, 2))]
        stacked = 0
        real = jobs.job_sql

        def job_sql(*a, **k):
            nonlocal stacked
            stacked += 1
            return real(*a, **k)

        monkeypatch.setattr(jobs, "job_sql", job_sql)
        assert A.compare_traces(base, cand).job.ranks[0].rank == 1
        counts[n] = stacked
        monkeypatch.undo()
    assert counts[4] == counts[12], counts


def test_cli_and_mcp_over_two_folders(tmp_path, capsys):
    import anyio
    from mcp import Client

    from gpuscope.server.app import server
    from gpuscope.server.cli import main

    _write(tmp_path / "base", 4)
    _write(tmp_path / "cand", 4, (2, 3))
    want = A.compare_traces(jobs.open_job([tmp_path / "base"]), jobs.open_job([tmp_path / "cand"])).model_dump(mode="json")
    assert main(["compare-traces", str(tmp_path / "base"), str(tmp_path / "cand" / "rank*.json"), "--json"]) in (None, 0)
    got = json.loads(capsys.readouterr().out)
    assert got["job"] == want["job"] and got["kernels"] == want["kernels"]

    async def call():
        async with Client(server) as client:
            return await client.call_tool("compare_traces", {"baseline": str(tmp_path / "base"),
                                                             "candidate": str(tmp_path / "cand")})

    res = anyio.run(call)
    assert not res.is_error, res.content[0].text
    assert res.structured_content == want and res.structured_content["job"]["ranks"][0]["rank"] == 2


def test_a_rank_without_gpu_work_makes_the_job_total_unknown_not_zero(tmp_path):
    """A candidate rank whose profile holds no GPU operation has no busy or compute figure (rank_summary: null). Its
    job's sums must be null with the rank named, never the other ranks' sum (that would count the rank as 0 ns)."""
    n, empty = 3, 1
    base = [load_trace(p) for p in _write(tmp_path / "base", n)]
    s = job(n, NO_STRAGGLER, STEPS)
    s.kernels = [k for k in s.kernels if k.pid != PID0 + empty]
    s.memops = [m for m in s.memops if m.pid != PID0 + empty]
    (tmp_path / "cand").mkdir()
    cand = [load_trace(kineto.write(s, tmp_path / "cand" / f"rank{r:03d}.pt.trace.json", pid=PID0 + r)) for r in range(n)]
    res = A.compare_traces(base, cand)
    tb = _truth(n)
    totals = {t.figure: t for t in res.totals}
    for figure in ("gpu_span_ns", "busy_ns", "computation_ns"):
        t = totals[figure]
        assert (t.candidate_ns, t.delta_ns, t.change_pct, t.candidate_ranks_without) == (None, None, None, [empty]), figure
        assert t.baseline_ns is not None and t.baseline_ranks_without is None, figure
    assert totals["computation_ns"].baseline_ns == sum(tb["gemm"])
    # summed kernel time is a plain sum of durations: the empty rank truly adds 0 ns to it
    assert totals["summed_kernel_time_ns"].candidate_ns == sum(tb["gemm"][r] + tb["ar"][r] for r in range(n) if r != empty)
    assert res.job.counts["no compute figure"] == 1
    (rc,) = [r for r in res.job.ranks if r.rank == empty]
    assert (rc.status, rc.baseline_compute_ns, rc.candidate_compute_ns, rc.compute_delta_ns) == (
        "no compute figure", tb["gemm"][empty], None, None)
