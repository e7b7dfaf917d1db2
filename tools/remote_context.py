"""Remote Execution Context: how a specialist agent runs a command on a GPU cluster and gets
profiles back, rendered from `~/.config/gpuscope/clusters.toml` (env `GPUSCOPE_CLUSTERS`) and/or
arguments (arguments win). Every value is validated; nothing is executed here.

clusters.toml:

    [clusters.mycluster]
    login_host = "user@login.example.org"
    ssh_options = ["-p", "22", "-i", "~/.ssh/id_ed25519"]
    launcher = "srun"            # or "sbatch"
    partition = "gpu"
    account = "proj123"
    nodes = 1
    gpus_per_node = 4
    time = "00:30:00"
    container_image = "nvcr.io#nvidia/pytorch:24.05-py3"
    container_mounts = ["/scratch/me:/scratch/me"]
    modules = ["cuda/12.4", "nsight-systems"]
    workdir = "/scratch/me/project"
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from gpuscope.tools.model.errors import ProfileError

FIELDS = ("login_host", "ssh_options", "launcher", "partition", "account", "nodes", "gpus_per_node", "time",
          "container_image", "container_mounts", "modules", "workdir")

# Conservative allow-lists: anything outside them is refused rather than quoted.
_HOST = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")           # partition, account
_MODULE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+/-]*$")
_IMAGE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/#@+-]*$")
_PATH = re.compile(r"^[A-Za-z0-9_~/.][A-Za-z0-9_./+@-]*$")
_SSH_OPT = re.compile(r"^[A-Za-z0-9_./=:@,+~-]+$")
_TIME = re.compile(r"^(?:\d+-)?\d{1,3}(?::\d{2}){0,2}$")


class RemoteContextResult(BaseModel):
    cluster: str | None = Field(description="Cluster name from clusters.toml, if one was used")
    config_path: str | None = Field(description="clusters.toml that was read, if any")
    launcher: Literal["srun", "sbatch"]
    command_prefix: str = Field(description="Prefix a specialist puts before its command (<cmd> marks where it goes)")
    fetch_profiles: str = Field(description="How profiles come back to this machine")
    markdown: str = Field(description="The Remote Execution Context block to paste into a specialist's brief")


def clusters_path() -> Path:
    env = os.environ.get("GPUSCOPE_CLUSTERS")
    return Path(env).expanduser() if env else Path.home() / ".config" / "gpuscope" / "clusters.toml"


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ProfileError("Reading clusters.toml needs Python 3.11+ (or `pip install tomli`); "
                               "pass the cluster settings as arguments instead.") from None
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ProfileError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path} is not valid TOML ({exc}); fix it or pass the settings as arguments.") from None


def _cluster_settings(cluster: str | None) -> tuple[dict[str, Any], str | None]:
    if cluster is None:
        return {}, None
    if not _NAME.match(cluster):
        raise ProfileError(f"Cluster name {cluster!r} may only hold letters, digits and _ . + -.")
    path = clusters_path()
    if not path.is_file():
        raise ProfileError(f"No cluster file at {path}: create it with a [clusters.{cluster}] table "
                           "(or set GPUSCOPE_CLUSTERS), or pass login_host/partition/... as arguments without cluster.")
    data = _load_toml(path)
    clusters = data.get("clusters", {})
    if not isinstance(clusters, dict) or cluster not in clusters or not isinstance(clusters[cluster], dict):
        known = ", ".join(sorted(clusters)) if isinstance(clusters, dict) else ""
        raise ProfileError(f"{path} has no [clusters.{cluster}] table" + (f" (defined: {known})" if known else "") + ".")
    settings = clusters[cluster]
    unknown = sorted(set(settings) - set(FIELDS))
    if unknown:
        raise ProfileError(f"[clusters.{cluster}] in {path} has unknown keys {unknown}; allowed: {list(FIELDS)}.")
    return dict(settings), str(path)


def _check(value: Any, pattern: re.Pattern, what: str) -> str:
    # fullmatch, not match: `$` also matches before a trailing newline, which would let "gpu\n" through.
    if not isinstance(value, str) or not value or len(value) > 256 or not pattern.fullmatch(value):
        raise ProfileError(f"Refusing {what} {value!r}: it must be a plain value without spaces or shell "
                           "metacharacters (; & | $ ` < > ( ) { } quotes, newlines).")
    return value


def _check_path(value: Any, what: str) -> str:
    path = _check(value, _PATH, what)
    if ".." in path.split("/"):
        raise ProfileError(f"Refusing {what} {value!r}: '..' components are not allowed.")
    return path


def _str_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ProfileError(f"{what} must be a list of strings.")
    return value


def _check_mount(value: Any) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"Refusing container mount {value!r}: expected 'SRC[:DST[:ro|rw]]'.")
    parts = value.split(":")
    if not 1 <= len(parts) <= 3:
        raise ProfileError(f"Refusing container mount {value!r}: expected 'SRC[:DST[:ro|rw]]'.")
    for p in parts[:2]:
        _check_path(p, "container mount path")
        if not p.startswith(("/", "~")):
            raise ProfileError(f"Refusing container mount {value!r}: mount paths must be absolute.")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        raise ProfileError(f"Refusing container mount {value!r}: the flag must be ro or rw.")
    return value


def _positive_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ProfileError(f"{what} must be a positive integer, got {value!r}.")
    return value


def remote_context(cluster: str | None = None, **overrides: Any) -> RemoteContextResult:
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ProfileError(f"Unknown settings {unknown}; allowed: {list(FIELDS)}.")
    settings, config_path = _cluster_settings(cluster)
    settings.update({k: v for k, v in overrides.items() if v is not None})
    s = settings

    if not s.get("login_host"):
        raise ProfileError("Incomplete remote context: no login_host (e.g. 'user@login.cluster.org'). "
                           "Set it in clusters.toml or pass login_host.")
    host = _check(s["login_host"], _HOST, "login_host")
    ssh_opts = [_check(o, _SSH_OPT, "ssh option") for o in _str_list(s.get("ssh_options"), "ssh_options")]
    if any(k in o.lower() for o in ssh_opts for k in ("proxycommand", "localcommand", "knownhostscommand", "-f")):
        raise ProfileError("Refusing ssh options that run local commands or read other config files "
                           "(ProxyCommand, LocalCommand, KnownHostsCommand, -F); put them in ~/.ssh/config instead.")
    launcher = s.get("launcher", "srun")
    if launcher not in ("srun", "sbatch"):
        raise ProfileError(f"launcher must be 'srun' or 'sbatch', got {launcher!r}.")
    partition = s.get("partition")
    if partition is None:
        raise ProfileError(f"Incomplete remote context: {launcher} needs a partition (-p). "
                           "Set it in clusters.toml or pass partition.")
    partition = _check(partition, _NAME, "partition")
    account = _check(s["account"], _NAME, "account") if s.get("account") is not None else None
    nodes = _positive_int(s.get("nodes", 1), "nodes") or 1
    gpus = _positive_int(s.get("gpus_per_node"), "gpus_per_node")
    time = s.get("time")
    if time is not None and not (isinstance(time, str) and _TIME.fullmatch(time)):
        raise ProfileError(f"time must be a Slurm time like '00:30:00' or '1-00:00:00', got {time!r}.")
    image = _check(s["container_image"], _IMAGE, "container_image") if s.get("container_image") else None
    mounts = [_check_mount(m) for m in _str_list(s.get("container_mounts"), "container_mounts")]
    if mounts and not image:
        raise ProfileError("container_mounts given without container_image.")
    modules = [_check(m, _MODULE, "module name") for m in _str_list(s.get("modules"), "modules")]
    workdir = _check_path(s["workdir"], "workdir") if s.get("workdir") else None

    slurm = [launcher, "-p", partition]
    if account:
        slurm += ["-A", account]
    slurm += ["-N", str(nodes)]
    if gpus:
        slurm += ["--gpus-per-node", str(gpus)]
    if time:
        slurm += ["-t", time]
    if image:
        slurm += ["--container-image", image]
    if mounts:
        slurm += ["--container-mounts", ",".join(mounts)]
    if launcher == "sbatch":
        slurm += ["--wait", "--wrap"]
    steps = []
    if workdir:
        steps.append(f"cd {shlex.quote(workdir)}")
    if modules:
        steps.append("module load " + " ".join(shlex.quote(m) for m in modules))
    remote_prefix = " && ".join(steps + [shlex.join(slurm)])
    ssh = shlex.join(["ssh", *ssh_opts, host])
    # The remote shell receives one quoted string; <cmd> is where the specialist's (quoted) command goes.
    command_prefix = f"{ssh} {shlex.quote(remote_prefix + ' <cmd>')}"
    remote_dir = workdir or "~"
    scp_opts = " ".join(shlex.quote(o) for o in _scp_options(ssh_opts))
    rsync_e = f"-e {shlex.quote(shlex.join(['ssh', *ssh_opts]))} " if ssh_opts else ""
    fetch = (f"rsync -av {rsync_e}'{host}:{remote_dir}/<profile>.*' ./profiles/\n"
             f"# or: scp {scp_opts + ' ' if scp_opts else ''}'{host}:{remote_dir}/<profile>.sqlite' ./profiles/")

    md = [f"## Remote Execution Context{f' ({cluster})' if cluster else ''}", "",
          f"- login host: `{host}`" + (f" (ssh options: `{' '.join(ssh_opts)}`)" if ssh_opts else ""),
          f"- launcher: `{launcher}`, partition `{partition}`" + (f", account `{account}`" if account else "")
          + f", {nodes} node(s)" + (f", {gpus} GPU(s) per node" if gpus else "") + (f", time limit {time}" if time else ""),
          ]
    if image:
        md.append(f"- container: `{image}`" + (f" with mounts `{','.join(mounts)}`" if mounts else ""))
    if modules:
        md.append(f"- modules: {', '.join(f'`{m}`' for m in modules)}")
    md.append(f"- working directory: `{remote_dir}`")
    md += ["", "Run every GPU command through this prefix (replace `<cmd>`, quoting it for the remote shell; "
           "e.g. `nsys profile -o <profile> --export sqlite python train.py`):", "", "```sh", command_prefix, "```", "",
           "Bring profiles back, then analyse them locally with gpuscope:", "", "```sh", "mkdir -p ./profiles", fetch, "```",
           "", "Never run GPU work on the login node; do not change cluster settings beyond this block."]
    if config_path:
        md += ["", f"_Defined in `{config_path}`._"]
    return RemoteContextResult(cluster=cluster, config_path=config_path, launcher=launcher, command_prefix=command_prefix,
                               fetch_profiles=fetch, markdown="\n".join(md) + "\n")


def _scp_options(ssh_opts: list[str]) -> list[str]:
    # scp spells ssh's -p (port) as -P.
    return ["-P" if o == "-p" else o for o in ssh_opts]
