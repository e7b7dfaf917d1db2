"""remote_context: validated Remote Execution Context from clusters.toml and/or arguments."""

from __future__ import annotations

import shlex

import pytest
from mcp import Client

from gpuscope.server.app import server
from gpuscope.server.cli import main
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.remote_context import remote_context

FULL = dict(login_host="me@login.example.org", ssh_options=["-p", "2222"], partition="gpu", account="proj1",
            nodes=2, gpus_per_node=4, time="00:30:00", container_image="nvcr.io#nvidia/pytorch:24.05-py3",
            container_mounts=["/scratch/me:/scratch/me:rw"], modules=["cuda/12.4", "nsight-systems"],
            workdir="/scratch/me/proj")

TOML = """
[clusters.alps]
login_host = "me@login.alps.org"
partition = "normal"
account = "a01"
gpus_per_node = 4
time = "01:00:00"
workdir = "/scratch/me"
modules = ["cuda/12.4"]

[clusters.broken]
login_host = "me@x;rm -rf /"
partition = "gpu"
"""


def test_full_context_quotes_and_parses():
    r = remote_context(**FULL)
    argv = shlex.split(r.command_prefix)
    assert argv[:4] == ["ssh", "-p", "2222", "me@login.example.org"] and len(argv) == 5
    remote = shlex.split(argv[4])
    assert remote[:3] == ["cd", "/scratch/me/proj", "&&"]
    i = remote.index("srun")
    assert remote[i:i + 11] == ["srun", "-p", "gpu", "-A", "proj1", "-N", "2", "--gpus-per-node", "4", "-t", "00:30:00"]
    assert "nvcr.io#nvidia/pytorch:24.05-py3" in remote and remote[-1] == "<cmd>"
    assert "module" in remote and "cuda/12.4" in remote
    assert "scp -P 2222" in r.fetch_profiles and "rsync" in r.fetch_profiles
    assert "## Remote Execution Context" in r.markdown and r.command_prefix in r.markdown


def test_sbatch_waits():
    r = remote_context(login_host="h", partition="p", launcher="sbatch")
    assert "sbatch -p p -N 1 --wait --wrap <cmd>" in shlex.split(r.command_prefix)[-1]


@pytest.mark.parametrize("bad", [
    {"login_host": "me@host;reboot"}, {"login_host": "$(id)"}, {"login_host": "-oProxyCommand=x"},
    {"partition": "gpu|x"}, {"partition": "gpu x"}, {"account": "a`id`"}, {"account": "a'b"},
    {"container_image": "img\nrm"}, {"container_image": "img&&x"}, {"modules": ["cuda;id"]}, {"modules": ["a b"]},
    {"container_mounts": ["/a:/b:xx"]}, {"container_mounts": ["rel:/b"]}, {"container_mounts": ["/a/../etc:/b"]},
    {"workdir": "/x/../../etc"}, {"workdir": "/x y"}, {"workdir": "/x>y"}, {"ssh_options": ["-o", "Proxy Command"]}, {"ssh_options": ["-oProxyCommand=nc"]},
    {"time": "1h; id"}, {"login_host": "h\n"}, {"partition": "gpu\n"}, {"time": "00:30:00\n"}, {"nodes": 0}, {"gpus_per_node": -1}, {"launcher": "mpirun"},
])
def test_hostile_values_refused(bad):
    with pytest.raises(ProfileError):
        remote_context(**{**FULL, **bad})


def test_incomplete_refused():
    with pytest.raises(ProfileError, match="login_host"):
        remote_context(partition="gpu")
    with pytest.raises(ProfileError, match="partition"):
        remote_context(login_host="h")
    with pytest.raises(ProfileError, match="container_image"):
        remote_context(login_host="h", partition="p", container_mounts=["/a:/a"])


def test_toml_file_and_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "clusters.toml"
    cfg.write_text(TOML)
    monkeypatch.setenv("GPUSCOPE_CLUSTERS", str(cfg))
    r = remote_context("alps")
    assert r.config_path == str(cfg) and "srun -p normal -A a01" in r.command_prefix
    assert "cd /scratch/me" in r.command_prefix and "--gpus-per-node 4" in r.command_prefix
    r2 = remote_context("alps", partition="debug", gpus_per_node=1)
    assert "srun -p debug -A a01" in r2.command_prefix and "--gpus-per-node 1" in r2.command_prefix
    with pytest.raises(ProfileError, match="Refusing login_host"):
        remote_context("broken")
    with pytest.raises(ProfileError, match="no \\[clusters.nope\\]"):
        remote_context("nope")
    with pytest.raises(ProfileError):
        remote_context("../etc")
    cfg.write_text("[clusters.x\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        remote_context("x")
    cfg.write_bytes(b"\xff[clusters.x]\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        remote_context("x")
    cfg.write_text('[clusters.x]\nlogin_host = "h"\npartition = "p"\nevil = 1\n')
    with pytest.raises(ProfileError, match="unknown keys"):
        remote_context("x")
    monkeypatch.setenv("GPUSCOPE_CLUSTERS", str(tmp_path / "missing.toml"))
    with pytest.raises(ProfileError, match="No cluster file"):
        remote_context("alps")


@pytest.mark.anyio
async def test_mcp_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_CLUSTERS", str(tmp_path / "none.toml"))
    async with Client(server) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["remote_context"].annotations.read_only_hint is True
        res = await c.call_tool("remote_context", {"login_host": "me@h", "partition": "gpu", "gpus_per_node": 8})
        assert res.is_error is False
        assert "--gpus-per-node 8" in res.structured_content["command_prefix"]
        assert res.content[0].text.startswith("## Remote Execution Context")
        bad = await c.call_tool("remote_context", {"login_host": "me@h;id", "partition": "gpu"})
        assert bad.is_error is True and "Refusing login_host" in bad.content[0].text


def test_cli(capsys):
    main(["remote-context", "--login-host", "me@h", "--partition", "gpu", "--module", "cuda/12.4"])
    assert "module load cuda/12.4 && srun -p gpu -N 1 <cmd>" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["remote-context", "--login-host", "me@h", "--partition", "g;p"])
    assert exc.value.code == 2
