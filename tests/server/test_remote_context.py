"""remote_context: validated Remote Execution Context from clusters.toml and/or arguments."""

from __future__ import annotations

import json
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


def test_cli_json(capsys):
    main(["remote-context", "--login-host", "h", "--partition", "gpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out == remote_context(login_host="h", partition="gpu").model_dump(mode="json")


def test_cli_ssh_option_values_that_start_with_a_dash(capsys):
    main(["remote-context", "--login-host", "h", "--partition", "gpu", "--ssh-option", "-p", "--ssh-option", "2222",
          "--ssh-option=-J", "--ssh-option", "bastion"])
    assert "ssh -p 2222 -J bastion h " in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["remote-context", "--login-host", "h", "--partition", "gpu", "--ssh-option", "-oProxyCommand=nc"])
    assert exc.value.code == 2 and "ProxyCommand" in capsys.readouterr().err


@pytest.mark.parametrize("opts", [
    ["-qF/tmp/evil"], ["-F", "/tmp/evil"], ["-E/home/me/.bashrc"], ["-I/tmp/lib.so"], ["-oXAuthLocation=/tmp/x", "-X"],
    ["-oSecurityKeyProvider=/tmp/lib.so"], ["-o", "PKCS11Provider=/tmp/l.so"], ["-o", "proxycommand=nc"],
    ["-oLocalCommand=id", "-oPermitLocalCommand=yes"], ["-o", "KnownHostsCommand=/bin/x"], ["-oInclude=/tmp/cfg"],
    ["-oRemoteCommand=id"], ["-W", "h:22"], ["-Oexit"], ["-fN"], ["otherhost"], ["--", "x"], ["-"], ["-o"], ["-p"],
    ["-p", "22;id"], ["-p", "0"], ["-p", "99999"], ["-i", "$(id)"], ["-i", "`id`"], ["-i", "/x/../../etc/shadow"],
    ["-J", "-oProxyCommand=x"], ["-p", "-oProxyCommand=x"], ["-l", "-x"], ["-l", "a b"], ["-o", "User=a;b"],
    ["-o", "ForwardAgent=/tmp/sock"], ["-o", "Port"], ["-o", "Port=22\n"], ["-p", "２２"], ["-p 22"], [1],
])
def test_ssh_option_injection_refused(opts):
    with pytest.raises(ProfileError, match="ssh option"):
        remote_context(login_host="me@h", partition="gpu", ssh_options=opts)


def test_ssh_options_allow_list_parsed_like_getopt():
    r = remote_context(login_host="me@h", partition="gpu", ssh_options=[
        "-4Cqp2222", "-l", "bob", "-A", "-J", "gw,me@gw2:2200", "-i", "~/.ssh/id-foo", "-oControlPath=~/.ssh/cm-%r@%h:%p",
        "-o", "port=22", "-o", "StrictHostKeyChecking=accept-new"])
    argv = shlex.split(r.command_prefix)
    assert argv[:argv.index("me@h")] == [
        "ssh", "-4", "-C", "-q", "-p", "2222", "-l", "bob", "-A", "-J", "gw,me@gw2:2200", "-i", "~/.ssh/id-foo",
        "-o", "ControlPath=~/.ssh/cm-%r@%h:%p", "-o", "Port=22", "-o", "StrictHostKeyChecking=accept-new"]
    scp = shlex.split(r.fetch_profiles.splitlines()[1].removeprefix("# or: "))
    # scp: -P for the port, -l (a bandwidth limit there) as User=, -A as ForwardAgent=yes
    assert scp[:8] == ["scp", "-4", "-C", "-q", "-P", "2222", "-o", "User=bob"] and "ForwardAgent=yes" in scp
    rsync = shlex.split(r.fetch_profiles.splitlines()[0])
    assert rsync[:3] == ["rsync", "-av", "-e"] and shlex.split(rsync[3])[:6] == ["ssh", "-4", "-C", "-q", "-p", "2222"]


@pytest.mark.parametrize("field,value", [
    ("login_host", "hôst"), ("login_host", "me@-oProxyCommand=x"), ("login_host", "-oProxyCommand=x"), ("login_host", "a@b@c"),
    ("login_host", "h o"), ("login_host", 'h"'), ("partition", "gpü"), ("partition", "-x"), ("partition", "g&p"),
    ("account", "$(id)"), ("account", "-x"), ("account", "a\nb"), ("container_image", "img|x"), ("container_image", "-img"),
    ("container_image", "/scratch/../img.sqsh"), ("container_image", "img `id`"), ("modules", ["-x"]), ("modules", ["a$(id)"]),
    ("modules", [1]), ("workdir", "-rf"), ("workdir", "/x;id"), ("workdir", "/x\n"), ("workdir", "/x'y"), ("workdir", "/ü"),
    ("time", "٠٠:٣٠:٠٠"), ("time", "00:30:00;id"), ("nodes", True), ("nodes", "2"), ("container_mounts", ["~/d:/d"]),
    ("container_mounts", ["/a:/b,/c:/d"]), ("container_mounts", ["/a:/b;id"]), ("container_mounts", "/a:-x"),
])
def test_hostile_fields_refused(field, value):
    with pytest.raises(ProfileError):
        remote_context(**{**FULL, field: value})


def test_empty_required_values_are_incomplete():
    with pytest.raises(ProfileError, match="Incomplete remote context: no login_host"):
        remote_context(login_host="", partition="gpu")
    with pytest.raises(ProfileError, match="Incomplete remote context: srun needs a partition"):
        remote_context(login_host="h", partition="")


def test_tilde_workdir_is_expanded_remotely_and_image_paths_work():
    r = remote_context(login_host="h", partition="p", workdir="~/proj", container_image="/scratch/me/img.sqsh")
    remote = shlex.split(r.command_prefix)[-1]
    assert remote.startswith("cd ~/proj && ") and "'~" not in remote  # a quoted ~ would not be expanded
    assert "--container-image /scratch/me/img.sqsh" in remote


def test_unknown_cluster_lists_known_ones_and_default_path(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TOML)
    monkeypatch.setenv("GPUSCOPE_CLUSTERS", str(cfg))
    with pytest.raises(ProfileError, match=r"no \[clusters.nope\] table \(defined: alps, broken\)"):
        remote_context("nope")
    monkeypatch.delenv("GPUSCOPE_CLUSTERS")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config" / "gpuscope").mkdir(parents=True)
    (tmp_path / ".config" / "gpuscope" / "clusters.toml").write_text(TOML)
    assert remote_context("alps").config_path == str(tmp_path / ".config" / "gpuscope" / "clusters.toml")
