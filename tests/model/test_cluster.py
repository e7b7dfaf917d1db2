"""Rank stores built on Dask (a LocalCluster here; SLURM in tests/slurm, run by `make slurm-test`): the stores the
workers write are the ones the analysis reopens, and the figures are the fixture's exact ones."""

from __future__ import annotations

import pytest

from gpuscope.fixtures.scenarios_job import PID0, expected, job
from gpuscope.fixtures.writers import kineto
from gpuscope.tools import analyses as A
from gpuscope.tools.model import job as jobs
from gpuscope.tools.model.cache import leases
from gpuscope.tools.model.errors import ProfileError

pytest.importorskip("distributed", reason="the `cluster` extra is not installed")


def test_local_cluster_builds_every_rank_store_and_the_answer_is_exact(tmp_path):
    s = job(8, 6, 3)
    paths = [kineto.write(s, tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r) for r in range(8)]
    progress = []
    built = jobs.build_stores(paths, lambda f, m: progress.append(f), workers=2, cluster="local")
    assert sorted(built) == sorted(str(p) for p in paths) and progress[-1] == 1.0
    assert jobs.missing_stores(paths) == []  # written by the Dask workers into this process's cache
    with leases():
        res = A.straggler_summary(jobs.open_job(paths))
    e = expected(8, 6, 3)
    assert res.straggler.rank == 6
    assert sorted((c.communicator, c.seq, c.skew_ns) for c in res.collectives) == sorted(
        (c["communicator"], c["seq"], c["skew_ns"]) for c in e["collectives"])


def test_a_bad_cluster_spec_is_a_clear_error(tmp_path):
    p = kineto.write(job(1, 0, 1), tmp_path / "r.pt.trace.json", pid=PID0)
    with pytest.raises(ProfileError, match="unknown cluster spec"):
        jobs.build_stores([p], cluster="yarn")
