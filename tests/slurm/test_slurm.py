"""A real one-node SLURM (brought up by tests/slurm/up.sh from `make slurm-test`, which .ci/run calls):
dask-jobqueue's SLURMCluster builds the stores of a multi-rank set, and the commands the remote_context block
tells a delegated agent to run (sbatch / srun of a capture script, bring the profile back, analyse it) work as
written. Skipped where no SLURM answers (`sinfo`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscope.fixtures.scenarios_job import PID0, expected, job
from gpuscope.fixtures.writers import kineto
from gpuscope.tools import analyses as A
from gpuscope.tools.model import job as jobs
from gpuscope.tools.model.cache import leases
from gpuscope.tools.remote_context import remote_context


def _slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    try:  # a configured but stopped controller makes sinfo retry for ~9 s
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=4)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and ("idle" in out.stdout or "mix" in out.stdout)


pytestmark = pytest.mark.skipif(not _slurm_up(), reason="no SLURM here (make slurm-test brings one up)")
GPUSCOPE = str(Path(sys.executable).with_name("gpuscope"))
PARTITION = "debug"

# The capture a delegated agent would run on a GPU node; here it writes a fixture profile in place of
# `nsys profile` / torch.profiler, as the CI machines have no GPU.
CAPTURE = """#!/bin/sh
{python} - <<'PY'
from gpuscope.fixtures.scenarios_job import PID0, job
from gpuscope.fixtures.writers import kineto

s = job(4, 2, 3)
for r in range(4):
    kineto.write(s, f"rank{{r}}.pt.trace.json", pid=PID0 + r)
PY
"""


def test_slurm_cluster_builds_the_rank_stores(tmp_path):
    pytest.importorskip("dask_jobqueue")
    s = job(6, 4, 3)
    paths = [kineto.write(s, tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r) for r in range(6)]
    built = jobs.build_stores(paths, workers=2, cluster=f"slurm:{PARTITION}")
    assert sorted(built) == sorted(map(str, paths))
    assert jobs.missing_stores(paths) == []
    with leases():
        res = A.straggler_summary(jobs.open_job(paths))
    assert res.straggler.rank == 4
    e = expected(6, 4, 3)
    assert sorted((c.communicator, c.seq, c.skew_ns, c.median_wait_ns) for c in res.collectives) == sorted(
        (c["communicator"], c["seq"], c["skew_ns"], c["median_wait_ns"]) for c in e["collectives"])


@pytest.mark.parametrize("launcher", ["sbatch", "srun"])
def test_remote_context_commands_run_a_capture_and_its_profile_is_analysed(tmp_path, launcher):
    work = tmp_path / "remote"
    work.mkdir()
    block = remote_context(None, login_host="localhost", partition=PARTITION, launcher=launcher, nodes=1,
                           workdir=str(work)).markdown
    prefix = re.search(r"```sh\n(ssh .*?)\n```", block, re.S).group(1)
    # The login node is this machine: run what follows `ssh localhost` in a local shell instead of over ssh.
    remote = re.fullmatch(r"ssh localhost '(.*)'", prefix).group(1)
    (work / "capture.sh").write_text(CAPTURE.format(python=sys.executable))
    cmd = remote.replace("<cmd>", "'sh capture.sh'" if launcher == "sbatch" else "sh capture.sh")
    run = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (cmd, run.stdout[-1000:], run.stderr[-2000:])
    ranks = sorted(work.glob("rank*.pt.trace.json"))
    assert len(ranks) == 4, (cmd, run.stdout, run.stderr)
    back = tmp_path / "profiles"
    back.mkdir()
    for r in ranks:  # the block's rsync step, on one machine
        shutil.copy(r, back / r.name)
    out = subprocess.run([GPUSCOPE, "straggler-summary", str(back), "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["straggler"]["rank"] == 2
