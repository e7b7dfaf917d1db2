"""straggler_summary and multi-rank jobs: exact figures for N = 2, 8 and 64 ranks with a known straggler and
known collective skew (fixtures/scenarios_job.py computes them from its constants, not from the engine)."""

from __future__ import annotations

import pytest
from mcp import Client

from gpuscope.fixtures.scenarios_job import PID0, expected, job
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.server.app import server
from gpuscope.tools import analyses as A
from gpuscope.tools.model import cache, job as jobs
from gpuscope.tools.model.cache import leases
from gpuscope.tools.model.errors import ProfileError

STEPS = 3


def _write_ranks(folder, n: int, straggler: int):
    folder.mkdir(parents=True, exist_ok=True)
    s = job(n, straggler, STEPS)
    return [kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r) for r in range(n)]


def _check(res, n: int, straggler: int) -> None:
    e = expected(n, straggler, STEPS)
    got = sorted(res.collectives, key=lambda c: c.seq)
    assert [(c.seq, c.ranks, c.last_rank, c.skew_ns, c.median_wait_ns, c.min_dur_ns, c.max_dur_ns) for c in got] == [
        (c["seq"], n, c["last_rank"], c["skew_ns"], c["median_wait_ns"], c["min_dur_ns"], c["max_dur_ns"])
        for c in e["collectives"]]
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
    _check(res, 8, 3)


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
    paths = _write_ranks(tmp_path / "run", 1, 0)
    with leases():
        res = A.straggler_summary(jobs.open_job(paths))
    assert res.straggler is None and res.collectives_compared == STEPS
    assert all(c.skew_ns == 0 for c in res.collectives)


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


@pytest.fixture
def anyio_backend():
    return "asyncio"
