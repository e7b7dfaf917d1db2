"""Remote Execution Context: how a specialist agent runs a command on a GPU cluster and gets
profiles back, rendered from `~/.config/gpuscope/clusters.toml` (env `GPUSCOPE_CLUSTERS`) and/or
arguments (arguments win). Every value is validated; nothing is executed here.

clusters.toml:

    [clusters.mycluster]
    login_host = "user@login.example.org"
    ssh_options = ["-p", "22", "-i", "~/.ssh/id_ed25519"]   # allow-list: -4 -6 -A -C -T -q -v -x -p -i -l -J -o KEY=VALUE
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
_TIME = re.compile(r"^(?:[0-9]+-)?[0-9]{1,3}(?::[0-9]{2}){0,2}$")   # [0-9], not \d: no non-ASCII digits
_PORT = re.compile(r"^[0-9]{1,5}$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_JUMP_HOP = r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?"
_JUMP = re.compile(rf"^(?:none|{_JUMP_HOP}(?:,{_JUMP_HOP})*)$")
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,+-]*$")
_SSH_PATH = re.compile(r"^[A-Za-z0-9_~/.%][A-Za-z0-9_./+@%:-]*$")  # ssh expands ~ and %h-style tokens itself
_YES_NO = {"yes", "no"}

# ssh options are an allow-list, parsed the way ssh's getopt reads them (so "-qF/x" is seen as -q -F /x).
# Everything else is refused: -F/-E/-I and -o ProxyCommand, LocalCommand, KnownHostsCommand, XAuthLocation,
# PKCS11Provider, SecurityKeyProvider, ... run local programs, load libraries or write local files.
_SSH_FLAGS = set("46ACTqvx")                   # options without an argument
_SSH_ARG_FLAGS = {"p": "port", "i": "path", "l": "user", "J": "jump", "o": "option"}
_SSH_O_KEYS: dict[str, tuple[str, Any]] = {   # lower-cased keyword -> (spelling, validator)
    "port": ("Port", "port"), "user": ("User", "user"), "identityfile": ("IdentityFile", "path"),
    "identitiesonly": ("IdentitiesOnly", _YES_NO), "proxyjump": ("ProxyJump", "jump"),
    "stricthostkeychecking": ("StrictHostKeyChecking", {"yes", "no", "ask", "accept-new", "off"}),
    "userknownhostsfile": ("UserKnownHostsFile", "path"), "serveraliveinterval": ("ServerAliveInterval", "int"),
    "serveralivecountmax": ("ServerAliveCountMax", "int"), "connecttimeout": ("ConnectTimeout", "int"),
    "connectionattempts": ("ConnectionAttempts", "int"), "controlmaster": ("ControlMaster", {"yes", "no", "ask", "auto", "autoask"}),
    "controlpath": ("ControlPath", "path"), "controlpersist": ("ControlPersist", "persist"),
    "batchmode": ("BatchMode", _YES_NO), "compression": ("Compression", _YES_NO), "forwardagent": ("ForwardAgent", _YES_NO),
    "hostkeyalias": ("HostKeyAlias", "user"), "preferredauthentications": ("PreferredAuthentications", "word"),
    "pubkeyauthentication": ("PubkeyAuthentication", _YES_NO), "passwordauthentication": ("PasswordAuthentication", _YES_NO),
    "gssapiauthentication": ("GSSAPIAuthentication", _YES_NO),
    "gssapidelegatecredentials": ("GSSAPIDelegateCredentials", _YES_NO),
    "addkeystoagent": ("AddKeysToAgent", {"yes", "no", "ask", "confirm"}), "tcpkeepalive": ("TCPKeepAlive", _YES_NO),
    "loglevel": ("LogLevel", {"quiet", "fatal", "error", "info", "verbose", "debug", "debug1", "debug2", "debug3"}),
}


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
                           "(or set GPUSCOPE_CLUSTERS), or pass login_host/partition/... as arguments without cluster "
                           "(CLI: --login-host, --partition, ...).")
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


def _ssh_value(value: Any, kind: Any, what: str) -> str:
    bad = ProfileError(f"Refusing ssh option {what} {value!r}: not a valid value for it (plain values only, "
                       "no spaces or shell metacharacters).")
    if not isinstance(value, str) or not value or len(value) > 256:
        raise bad
    if isinstance(kind, set):
        if value.lower() not in kind:
            raise ProfileError(f"Refusing ssh option {what} {value!r}: expected one of {sorted(kind)}.")
        return value
    if kind == "port":
        if not _PORT.fullmatch(value) or not 1 <= int(value) <= 65535:
            raise bad
    elif kind == "int":
        if not _PORT.fullmatch(value):
            raise bad
    elif kind == "persist":
        if not re.fullmatch(r"yes|no|[0-9]{1,6}[smhdw]?", value, re.IGNORECASE):
            raise bad
    elif kind == "path":
        if not _SSH_PATH.fullmatch(value) or ".." in value.split("/"):
            raise bad
    else:
        if not {"user": _USER, "jump": _JUMP, "word": _WORD}[kind].fullmatch(value):
            raise bad
    return value


def _ssh_options(value: Any) -> list[tuple[str, str | None]]:
    """Parse ssh options like ssh's getopt does; returns [(flag, value or None)] with -o values as 'Key=Value'."""
    args = _str_list(value, "ssh_options")
    allowed = ("allowed: -4 -6 -A -C -T -q -v -x, -p PORT, -i KEYFILE, -l USER, -J JUMPHOST, -o KEY=VALUE with KEY in "
               + ", ".join(v[0] for v in _SSH_O_KEYS.values()))
    parsed: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not isinstance(arg, str) or not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            raise ProfileError(f"Refusing ssh option {arg!r}: every entry must be an option starting with '-' "
                               f"(anything else would become the ssh destination or the remote command); {allowed}.")
        j = 1
        while j < len(arg):
            c = arg[j]
            if c in _SSH_FLAGS:
                parsed.append((c, None))
                j += 1
                continue
            if c not in _SSH_ARG_FLAGS:
                raise ProfileError(f"Refusing ssh option -{c} (in {arg!r}): it is not on the allow-list (-F, -E, -I, "
                                   "-O, -W and the like read other config files, write local files, load libraries or "
                                   f"change what ssh does; put what you need in ~/.ssh/config instead); {allowed}.")
            if j + 1 < len(arg):
                val = arg[j + 1:]
            elif i + 1 < len(args):
                i += 1
                val = args[i]
            else:
                raise ProfileError(f"Refusing ssh options: -{c} is missing its value.")
            kind = _SSH_ARG_FLAGS[c]
            if kind == "option":
                key, sep, v = val.partition("=") if isinstance(val, str) else ("", "", "")
                spec = _SSH_O_KEYS.get(key.lower())
                if not sep or spec is None:
                    raise ProfileError(f"Refusing ssh option -o {val!r}: only KEY=VALUE with an allowed KEY (ProxyCommand, "
                                       "LocalCommand, KnownHostsCommand, XAuthLocation, PKCS11Provider, SecurityKeyProvider, "
                                       f"Include and the like run local programs or read files); {allowed}.")
                val = f"{spec[0]}={_ssh_value(v, spec[1], spec[0])}"
            else:
                val = _ssh_value(val, kind, f"-{c}")
            parsed.append((c, val))
            break
        i += 1
    return parsed


def _ssh_argv(opts: list[tuple[str, str | None]], scp: bool = False) -> list[str]:
    out: list[str] = []
    for flag, val in opts:
        if val is None:
            if scp and flag in "Tx":          # scp -T means something else; -x does not exist there
                continue
            if scp and flag == "A":
                out += ["-o", "ForwardAgent=yes"]
                continue
            out.append(f"-{flag}")
        elif scp and flag == "p":               # scp spells ssh's -p (port) as -P
            out += ["-P", val]
        elif scp and flag == "l":               # scp -l is a bandwidth limit
            out += ["-o", f"User={val}"]
        else:
            out += [f"-{flag}", val]
    return out


def _remote_path(path: str) -> str:
    """Shell-quote a remote path, leaving a leading ~ or ~user unquoted so the remote shell expands it."""
    if path.startswith("~"):
        head, sep, tail = path.partition("/")
        return head + sep + (shlex.quote(tail) if tail else "")
    return shlex.quote(path)


def _check_image(value: Any) -> str:
    if isinstance(value, str) and value.startswith("/"):     # a squashfs file on the cluster
        return _check_path(value, "container_image")
    return _check(value, _IMAGE, "container_image")


def _check_mount(value: Any) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"Refusing container mount {value!r}: expected 'SRC[:DST[:ro|rw]]'.")
    parts = value.split(":")
    if not 1 <= len(parts) <= 3:
        raise ProfileError(f"Refusing container mount {value!r}: expected 'SRC[:DST[:ro|rw]]'.")
    for p in parts[:2]:
        _check_path(p, "container mount path")
        if not p.startswith("/"):
            raise ProfileError(f"Refusing container mount {value!r}: mount paths must be absolute (start with /; "
                               "srun does not expand ~).")
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
    parsed_ssh = _ssh_options(s.get("ssh_options"))
    ssh_opts = _ssh_argv(parsed_ssh)
    launcher = s.get("launcher", "srun")
    if launcher not in ("srun", "sbatch"):
        raise ProfileError(f"launcher must be 'srun' or 'sbatch', got {launcher!r}.")
    partition = s.get("partition")
    if partition is None or partition == "":
        raise ProfileError(f"Incomplete remote context: {launcher} needs a partition (-p). "
                           "Set it in clusters.toml or pass partition.")
    partition = _check(partition, _NAME, "partition")
    account = _check(s["account"], _NAME, "account") if s.get("account") is not None else None
    nodes = _positive_int(s.get("nodes", 1), "nodes") or 1
    gpus = _positive_int(s.get("gpus_per_node"), "gpus_per_node")
    time = s.get("time")
    if time is not None and not (isinstance(time, str) and _TIME.fullmatch(time)):
        raise ProfileError(f"time must be a Slurm time like '00:30:00' or '1-00:00:00', got {time!r}.")
    image = _check_image(s["container_image"]) if s.get("container_image") else None
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
        steps.append(f"cd {_remote_path(workdir)}")
    if modules:
        steps.append("module load " + " ".join(shlex.quote(m) for m in modules))
    remote_prefix = " && ".join(steps + [shlex.join(slurm)])
    ssh = shlex.join(["ssh", *ssh_opts, host])
    # The remote shell receives one quoted string; <cmd> is where the specialist's (quoted) command goes.
    command_prefix = f"{ssh} {shlex.quote(remote_prefix + ' <cmd>')}"
    remote_dir = workdir or "~"
    scp_opts = shlex.join(_ssh_argv(parsed_ssh, scp=True))
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

