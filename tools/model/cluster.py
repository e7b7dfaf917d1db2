"""Building rank stores on a Dask cluster: where the profiles are, not where the question is asked.

gpuscope does not schedule anything itself: a Dask `LocalCluster` (one process per core), a running Dask scheduler,
or `dask-jobqueue`'s `SLURMCluster` (each worker a SLURM job) runs `job._build_one` per profile, and the workers
write the stores into the cache folder given here, which must be on a file system the asking process can read
(the usual shared home or scratch on a cluster). The analysis then attaches those stores as usual (job.py).

Cluster specs (CLI `--cluster`, env GPUSCOPE_DASK_CLUSTER for the server):
  local                         a LocalCluster on this machine (the default when Dask is asked for)
  tcp://host:8786               an existing Dask scheduler
  slurm:PARTITION[:ACCOUNT]     a SLURMCluster submitting one single-core worker job per profile batch
Dask comes with the optional extra `gpuscope[cluster]` (installed by `make install`).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import ProfileError
from .limits import cache_root, private_dir

SLURM_WORKERS = 2            # SLURM jobs started for the ingest (each one worker process, one core)
SLURM_WALLTIME = "00:30:00"


def _dask():
    try:
        import distributed
    except ImportError:
        raise ProfileError("building stores on a cluster needs Dask: install gpuscope with the `cluster` extra "
                           "(pip install 'gpuscope[cluster]'; `make install` includes it).") from None
    return distributed


def _build_with_cache(path: str, cache_dir: str) -> tuple[str, str | None, float]:
    """Dask task: build one store into `cache_dir` (the worker may be another machine with its own environment)."""
    os.environ["GPUSCOPE_CACHE_DIR"] = cache_dir
    from .job import _build_one

    return _build_one(path)


def build_on_dask(client, paths: list[str], progress: Callable[[float, str], None]) -> list[tuple[str, str | None, float]]:
    distributed = _dask()
    futures = client.map(_build_with_cache, paths, cache_dir=str(cache_root()), pure=False)
    path_of = {f.key: p for f, p in zip(futures, paths)}
    results = []
    for fut in distributed.as_completed(futures):
        try:
            results.append(fut.result())
        except Exception as exc:  # a worker died or the task could not run: name the profile
            path = path_of[fut.key]
            results.append((path, f"the Dask worker building it failed ({type(exc).__name__}: {exc})", 0.0))
        progress(len(results) / len(paths), f"built store {len(results)}/{len(paths)} on the cluster")
    return results


@contextmanager
def cluster_client(spec: str, workers: int | None = None) -> Iterator[object]:
    """A Dask client for `spec` (see the module doc), closed (and its SLURM jobs cancelled) on exit."""
    distributed = _dask()
    spec = spec.strip()
    if spec == "local":
        cluster = distributed.LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                                           processes=True, dashboard_address=None)
    elif spec.startswith("tcp://") or spec.startswith("tls://"):
        cluster = None
    elif spec.startswith("slurm:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise ProfileError(f"cluster spec {spec!r}: write slurm:PARTITION or slurm:PARTITION:ACCOUNT.")
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError:
            raise ProfileError("SLURM ingest needs dask-jobqueue: install gpuscope with the `cluster` extra.") from None
        cluster = SLURMCluster(cores=1, processes=1, memory="4GB", queue=parts[1],
                               account=parts[2] if len(parts) == 3 and parts[2] else None,
                               walltime=SLURM_WALLTIME, python=sys.executable,
                               # job logs go to the cache, not slurm-<id>.out in whatever folder we run from
                               log_directory=str(private_dir("slurm-logs")),
                               scheduler_options={"dashboard_address": None})
        cluster.scale(jobs=workers or SLURM_WORKERS)
    else:
        raise ProfileError(f"unknown cluster spec {spec!r}: use 'local', a scheduler address 'tcp://host:8786', or "
                           "'slurm:PARTITION[:ACCOUNT]'.")
    client = distributed.Client(cluster if cluster is not None else spec)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
