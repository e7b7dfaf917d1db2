"""rank_summary over a job of many per-rank profiles: exact figures from the generator (fixtures/scenarios_job.py),
and a fixed number of SQL statements however many ranks there are (the figures of every rank are computed over the
stacked stores at once, never with a query per rank)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuscope.fixtures.scenarios_job import PID0, STEP_US, TAIL_US, US, compute_us, job
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.tools import analyses as A
from gpuscope.tools.model import hub as hubs
from gpuscope.tools.model import job as jobs
from gpuscope.tools.model.trace import load_trace

STEPS = 3


def _write(folder, n: int, straggler: int):
    folder.mkdir(parents=True, exist_ok=True)
    s = job(n, straggler, STEPS)
    return [kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]


def _truth(n: int, straggler: int, r: int) -> dict:
    """One rank's figures in ns, from the generator's constants: per step i (t = 100 + i * STEP_US µs) a gemm
    [t + 30, t + 30 + C) and an all-reduce [t + 37 + C, t + 37 + max C + TAIL); they never overlap."""
    slowest = [max(compute_us(q, i, straggler) for q in range(n)) for i in range(STEPS)]
    compute = sum(compute_us(r, i, straggler) for i in range(STEPS)) * US
    comm = sum(slowest[i] + TAIL_US - compute_us(r, i, straggler) for i in range(STEPS)) * US
    first = (100 + 30) * US
    last = (100 + (STEPS - 1) * STEP_US + 37 + slowest[-1] + TAIL_US) * US
    return {"kernels": 2 * STEPS, "comm_kernels": STEPS, "gpu_span_ns": last - first, "busy_ns": compute + comm,
            "idle_in_gpu_span_ns": last - first - compute - comm, "compute_ns": compute, "comm_ns": comm,
            "exposed_comm_ns": comm, "exposed_memcpy_ns": 0, "steps": STEPS, "mean_step_ns": 1_500.0 * US,
            "min_step_ns": 1_500 * US, "max_step_ns": 1_500 * US, "pid": PID0 + r, "devices": [r % 8]}


@pytest.fixture(scope="module")
def ranks16(tmp_path_factory):
    return [load_trace(p) for p in _write(tmp_path_factory.mktemp("job16"), 16, 11)]


def test_every_rank_exact_and_the_straggler(ranks16):
    n, straggler = 16, 11
    res = A.rank_summary(ranks16)
    assert res.ranks_found == n and res.world_size == n and not res.truncated
    assert [r.rank for r in res.ranks] == list(range(n))
    for row in res.ranks:
        want = _truth(n, straggler, row.rank)
        assert {k: getattr(row, k) for k in want} == want, f"rank {row.rank}"
        assert row.rank_source == "profile" and row.trace == f"rank{row.rank:03d}.pt.trace.json"
        assert row.step_names == "ProfilerStep: ProfilerStep#0 .. ProfilerStep#2 (3 ranges)"
    # equal step times (the collective keeps the ranks in lockstep): the straggler is found by compute time
    s = res.straggler
    assert s is not None and s.rank == straggler and s.metric == "compute_ns"
    assert s.value == _truth(n, straggler, straggler)["compute_ns"]
    assert s.exposed_comm_lowest is True
    computes = sorted(_truth(n, straggler, r)["compute_ns"] for r in range(n))
    assert s.median == (computes[7] + computes[8]) / 2
    assert [it.step for it in res.iterations] == [f"ProfilerStep#{i}" for i in range(STEPS)]
    assert all(it.min_wall_ns == it.max_wall_ns == 1_500 * US for it in res.iterations)
    # straggler_summary names the same rank: it arrived last at every collective
    ss = A.straggler_summary(ranks16)
    assert ss.straggler is not None and ss.straggler.rank == straggler and ss.straggler.times_last == STEPS


class _Counter:
    """Counts SQL statements: over the stacked stores (job.job_sql) and on any one store (a cursor of a trace)."""

    def __init__(self, monkeypatch):
        self.stacked = 0
        self.per_trace = 0
        real_job_sql, real_cursor = jobs.job_sql, hubs.ModelConnection.cursor

        def job_sql(*a, **k):
            self.stacked += 1
            return real_job_sql(*a, **k)

        def cursor(con):
            self.per_trace += 1
            return real_cursor(con)

        monkeypatch.setattr(jobs, "job_sql", job_sql)
        monkeypatch.setattr(hubs.ModelConnection, "cursor", cursor)


@pytest.mark.parametrize("tool", ["rank_summary", "straggler_summary"])
def test_statements_do_not_grow_with_the_ranks(tmp_path, monkeypatch, tool):
    counts = {}
    for n in (4, 16):
        traces = [load_trace(p) for p in _write(tmp_path / f"job{n}", n, 1)]  # fresh: nothing memoized yet
        c = _Counter(monkeypatch)
        res = getattr(A, tool)(traces)
        assert res.straggler is not None and res.straggler.rank == 1
        counts[n] = (c.stacked, c.per_trace)
        monkeypatch.undo()
    assert counts[4] == counts[16], f"statements (stacked, per trace) for 4 vs 16 ranks: {counts}"
    assert counts[16][0] <= 10, counts


@pytest.mark.parametrize("leased", [False, True])
def test_a_job_larger_than_the_trace_cache_stays_open(tmp_path, monkeypatch, leased):
    """More ranks than GPUSCOPE_CACHE_TRACES: outside a lease (library use) the caller owns every trace, inside one
    (MCP, CLI) the lease holds them; either way no rank is closed before the query over all of them runs."""
    from gpuscope.tools.model import cache

    monkeypatch.setattr(cache, "MAX_TRACES", 2)
    paths = _write(tmp_path / "job", 6, 4)
    if leased:
        with cache.leases():
            res = A.rank_summary(jobs.open_job(paths))
    else:
        traces = jobs.open_job(paths)
        res = A.rank_summary(traces)
        for t in traces:
            t.close()
    assert res.ranks_found == 6 and res.straggler is not None and res.straggler.rank == 4


def test_a_job_is_read_through_one_stacked_store(tmp_path):
    """However many ranks, an opened job keeps no rank's store attached (each costs DuckDB ~0.5 MB of its memory
    limit: 1,000 attached stores exhausted the default 1 GB) and a stacked table is one scan of the job's store,
    not a UNION of one subquery per rank."""
    n = 12
    folder = tmp_path / "run"
    folder.mkdir()
    s = job(n, 3, 2)
    for r in range(n):
        kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r)
    traces = jobs.open_job([folder])

    def attached_ranks():
        return sum(str(t.store.model_file.resolve()) in hubs.hub()._attached for t in traces)

    assert attached_ranks() == 0  # read through the job's stacked store only
    sql = jobs.union_sql(traces, "kernels", "pid")
    assert sql.count(".main.kernels") == 1 and "UNION ALL" not in sql
    res = A.rank_summary(traces)
    assert res.ranks_found == n and res.straggler.rank == 3
    assert attached_ranks() == 0  # Kineto ranks need nothing outside the stacked store


def _one_rank(s, pid: int):
    """Scenario `s` cut to process `pid`: what one rank's own Nsight export holds."""
    keep = lambda rows: [x for x in rows if getattr(x, "pid", pid) == pid]  # noqa: E731
    return dataclasses.replace(s, processes=keep(s.processes), threads=keep(s.threads), api_calls=keep(s.api_calls),
                               kernels=keep(s.kernels), memops=keep(s.memops), markers=keep(s.markers))


def test_a_job_of_nsight_ranks_is_read_through_the_stacked_store(tmp_path):
    """The step choice reads the Nsight ranges that ended on another thread (native NVTX_EVENTS) from the job's
    stacked store too: rank_summary and straggler_summary over 12 Nsight ranks attach no rank's own store."""
    n, straggler = 12, 3
    folder = tmp_path / "run"
    folder.mkdir()
    s = job(n, straggler, 2)
    for r in range(n):
        nsys.write(_one_rank(s, PID0 + r), folder / f"rank{r:03d}.sqlite")
    traces = jobs.open_job([folder])
    assert {t.format for t in traces} == {"nsys"}

    def attached_ranks():
        return sum(str(t.store.model_file.resolve()) in hubs.hub()._attached for t in traces)

    assert attached_ranks() == 0
    res = A.rank_summary(traces)
    assert res.ranks_found == n and res.straggler.rank == straggler
    assert all(r.steps == 2 for r in res.ranks)
    assert attached_ranks() == 0  # the step choice read the stacked nvtx_cross_thread, no rank's NVTX_EVENTS
    strag = A.straggler_summary(traces)
    assert strag.ranks_found == n
    assert attached_ranks() == 0  # the slowest rank's kernels too came from the stacked store


def test_the_stack_holds_each_nsight_ranks_cross_thread_ranges(tmp_path):
    """nvtx_cross_thread of the job's stacked store holds, per rank, exactly the start/end ranges that ended on
    another thread, as read from the rank's own NVTX_EVENTS (projection.cross_thread)."""
    from gpuscope.fixtures.scenarios_marker_summary import marker_tree
    from gpuscope.tools.analyses.projection import cross_thread

    paths = [nsys.write(marker_tree(), tmp_path / f"rank{r}.sqlite") for r in range(2)]
    traces = jobs.open_job(paths)
    table = jobs.union_sql(traces, "nvtx_cross_thread", "pid, tid, start_ns")
    stacked = jobs.job_sql(traces, f"SELECT part, pid, tid, start_ns FROM ({table})")
    for part, t in enumerate(traces):
        own = sorted(cross_thread(t).keys)
        assert own and sorted((p, tid, s) for q, p, tid, s in stacked if q == part) == own
