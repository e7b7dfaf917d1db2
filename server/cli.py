"""`gpuscope` command line: `serve` for MCP hosts, and one subcommand per tool for people.

Each tool subcommand prints the same readable text the MCP server sends (`--json` for the
structured result), so what a person sees is what the agent sees. Nothing read from a profile
reaches the terminal raw: text goes through render.visible, JSON through render.visible_json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

import duckdb
from pydantic import BaseModel

from gpuscope import __version__
from gpuscope.tools import analyses as A
from gpuscope.tools.model.cache import leases, open_trace
from gpuscope.tools.model.job import names_job, open_job
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.limits import connect

from . import install
from .render import out_of_memory_advice, out_of_memory, render, visible, visible_json


def _with_trace(fn: Callable[..., BaseModel]) -> Callable[..., BaseModel]:
    return lambda trace, **kw: fn(open_trace(trace), **kw)


# subcommand -> (analysis, title, extra arguments as (flags, argparse kwargs))
_WINDOW = [(("--start-ns",), {"type": int}), (("--end-ns",), {"type": int})]
COMMANDS: dict[str, tuple[Callable[..., BaseModel], str, list]] = {
    "list-traces": (lambda path, **kw: A.list_traces(path, **kw), "Profiles",
                    [(("--limit",), {"type": int, "default": 100})]),
    "trace-info": (_with_trace(A.trace_info), "Trace info", []),
    "top-kernels": (_with_trace(A.top_kernels), "Top kernels", [
        (("--device",), {"type": int}), (("--stream",), {"type": int}), (("--name-contains",), {}), *_WINDOW,
        (("--group-by",), {"choices": ["short_name", "name"], "default": "short_name"}),
        (("--sort-by",), {"choices": ["total", "count", "avg", "max"], "default": "total"}),
        (("--limit",), {"type": int, "default": 15})]),
    "graph-summary": (_with_trace(A.graph_summary), "CUDA graphs", [
        (("--device",), {"type": int}), *_WINDOW, (("--limit",), {"type": int, "default": 10}),
        (("--kernel-limit",), {"type": int, "default": 8})]),
    "gap-histogram": (_with_trace(A.gap_histogram), "GPU idle gaps", [
        (("--device",), {"type": int}), *_WINDOW,
        (("--no-memops",), {"dest": "include_memops", "action": "store_false"}),
        (("--per-stream",), {"action": "store_true"}), (("--top-gaps",), {"type": int, "default": 5})]),
    "memcpy-summary": (_with_trace(A.memcpy_summary), "Memory copies and sets", [
        (("--device",), {"type": int}), (("--stream",), {"type": int}), *_WINDOW,
        (("--host-link-gb-per-s",), {"type": float, "help": "host link (PCIe/C2C) GB/s per direction; default: the "
                                      "matched GPU model's datasheet link (the real slot may be slower)"}),
        (("--peer-link-gb-per-s",), {"type": float, "help": "GPU-to-GPU link GB/s per direction; default: the datasheet "
                                      "link when both GPUs are the same model"}),
        (("--top",), {"type": int, "default": 10}), (("--largest-by",), {"choices": ["bytes", "time"], "default": "bytes"}),
        (("--limit",), {"type": int, "default": 50})]),
    "stream-summary": (_with_trace(A.stream_summary), "Streams", [
        (("--device",), {"type": int}), *_WINDOW, (("--no-memops",), {"dest": "include_memops", "action": "store_false"}),
        (("--limit",), {"type": int, "default": 32})]),
    "api-summary": (_with_trace(A.api_summary), "Host API", [
        (("--pid",), {"type": int}), (("--device",), {"type": int}), (("--stream",), {"type": int}), *_WINDOW,
        (("--name-contains",), {}), (("--per-thread",), {"action": "store_true"}),
        (("--spin-min-calls",), {"type": int, "default": 3}), (("--spin-max-gap-ns",), {"type": int, "default": 5000}),
        (("--limit",), {"type": int, "default": 20})]),
    "marker-summary": (_with_trace(A.marker_summary), "Markers", [
        (("--device",), {"type": int}), (("--pid",), {"type": int}), (("--name-contains",), {}), *_WINDOW,
        (("--sort-by",), {"choices": ["cpu_total", "gpu_busy", "gpu_work", "count"], "default": "cpu_total"}),
        (("--limit",), {"type": int, "default": 15})]),
    "iterations": (_with_trace(A.iterations), "Iterations", [
        (("--marker",), {}), (("--pid",), {"type": int}), (("--device",), {"type": int}), *_WINDOW,
        (("--limit",), {"type": int, "default": 50})]),
    "gpu-timeline": (_with_trace(A.gpu_timeline), "GPU timeline", [
        (("--device",), {"type": int}), *_WINDOW, (("--linked-only",), {"dest": "include_unlinked", "action": "store_false"}),
        (("--comm-pattern",), {"dest": "comm_patterns", "action": "append"}),
        (("--kernel-wait-threshold-ns",), {"type": int, "default": 30_000}), (("--limit",), {"type": int, "default": 32})]),
    "comm-summary": (_with_trace(A.comm_summary), "Communication", [
        (("--device",), {"type": int}), *_WINDOW, (("--limit",), {"type": int, "default": 15}),
        (("--comm-pattern",), {"dest": "comm_patterns", "action": "append"})]),
    "ops-summary": (_with_trace(A.ops_summary), "Operators", [
        (("--group-by",), {"choices": ["name", "shapes", "category", "kernels"], "default": "name"}),
        (("--device",), {"type": int}), *_WINDOW, (("--linked-only",), {"dest": "include_unlinked", "action": "store_false"}),
        (("--name-contains",), {}), (("--limit",), {"type": int, "default": 20})]),
    "perf-summary": (_with_trace(A.perf_summary), "Operator performance", [
        (("--device",), {"type": int}), *_WINDOW, (("--category",), {}), (("--name-contains",), {}),
        (("--limit",), {"type": int, "default": 15})]),
    "call-stack": (_with_trace(A.call_stack), "Call stack", [
        (("--kernel",), {}), (("--op",), {}), (("--instance",), {"type": int}),
        (("--depth",), {"type": int, "default": 30}), (("--limit",), {"type": int, "default": 20})]),
    "replay-spec": (_with_trace(A.replay_spec), "Replay spec", [
        (("op",), {}), (("--shapes-index",), {"type": int, "default": 0}), (("--limit",), {"type": int, "default": 10})]),
    "memory-timeline": (_with_trace(A.memory_timeline), "Device memory", [
        (("--device",), {"type": int}), *_WINDOW, (("--step",), {"type": int}), (("--points",), {"type": int, "default": 50}),
        (("--limit",), {"type": int, "default": 10})]),
    "phases": (_with_trace(A.phases), "Phases", [
        (("--device",), {"type": int}), *_WINDOW, (("--max-phases",), {"type": int, "default": 6}),
        (("--limit",), {"type": int, "default": 5})]),
    "sql": (_with_trace(A.sql_query), "Query result", [(("sql",), {}), (("--limit",), {"type": int, "default": 100})]),
    "list-tables": (_with_trace(A.list_tables), "Tables", []),
    "describe-table": (_with_trace(A.describe_table), "Table", [(("table",), {})]),
}


def _rank_summary(trace: list[str], cluster: str | None = None, **kw) -> BaseModel:
    return A.rank_summary(open_job(trace, _stderr_progress, cluster), **kw)


def _comm_job_summary(trace: list[str], cluster: str | None = None, **kw) -> BaseModel:
    return A.comm_job_summary(open_job(trace, _stderr_progress, cluster), **kw)


def _straggler_summary(trace: list[str], cluster: str | None = None, **kw) -> BaseModel:
    return A.straggler_summary(open_job(trace, _stderr_progress, cluster), **kw)


_CLUSTER = (("--cluster",), {"metavar": "SPEC", "help": "build missing rank stores on Dask: 'local', 'tcp://host:8786' or "
                                                       "'slurm:PARTITION[:ACCOUNT]' (default $GPUSCOPE_DASK_CLUSTER, else "
                                                       "worker processes here)"})


def _stderr_progress(fraction: float, message: str) -> None:
    """Store builds of many ranks take a while: say how far they are (stderr, so --json output stays clean)."""
    if sys.stderr.isatty():
        print(f"\r{visible(message)[:100]:<100}", end="" if fraction < 1 else "\n", file=sys.stderr, flush=True)


def _roofline(trace: str, kernel_flops: str | None = None, peaks: str | None = None, plot: str | None = None, **kw) -> BaseModel:
    try:
        kf = json.loads(kernel_flops) if kernel_flops else None
        pk = json.loads(peaks) if peaks else None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"--kernel-flops / --peaks must be JSON objects ({exc}).") from None
    if not all(v is None or isinstance(v, dict) for v in (kf, pk)):
        raise ProfileError("--kernel-flops / --peaks must be JSON objects ({...}), not lists or plain values.")
    result = A.roofline(open_trace(trace), kernel_flops=kf, peaks=pk, plot=plot is not None, **kw)
    if plot:
        from gpuscope.tools.analyses.roofline import PLOTS_HINT, roofline_plot

        png = roofline_plot(result)
        if png is None:  # the user asked for a file: not writing it is a failure, not a footnote
            raise ProfileError(f"no chart written to {plot}: " + (result.plot_note or "nothing rated").replace(
                PLOTS_HINT, f"{PLOTS_HINT} (in a checkout: .venv/bin/pip install -e '.[plots]')"))
        Path(plot).write_bytes(png)
        result.plot_note = f"PNG written to {plot}"
    return result


COMMANDS["roofline"] = (_roofline, "Roofline", [
    (("--device",), {"type": int}), (("--kernel-flops",), {"help": "JSON: {\"<kernel substring>\": {\"gflop_per_call\": ..., \"bytes_per_call\": ..., \"dtype\": \"bf16\"}}"}),
    (("--peaks",), {"help": "JSON peak overrides"}), (("--dtype",), {"choices": ["bf16", "fp16", "fp32", "tf32", "fp64", "fp8", "fp4", "int8"]}),
    (("--limit",), {"type": int, "default": 8}), (("--plot",), {"metavar": "PNG", "help": "write the roofline chart (needs gpuscope[plots])"})])

def _critical_path(trace: str, what_if: list[str] | None = None, **kw) -> BaseModel:
    rules = []
    for text in what_if or []:
        # PATTERN=SPEEDUP (substring) or glob:PATTERN=SPEEDUP; several --what-if flags form one scenario
        pattern, sep, factor = text.rpartition("=")
        if not sep or not pattern:
            raise ProfileError(f"--what-if {text!r}: write PATTERN=SPEEDUP, e.g. gemm=2 (substring) or glob:gemm*=2.")
        try:
            speedup = float(factor)
        except ValueError:
            raise ProfileError(f"--what-if {text!r}: the speedup after '=' must be a number.") from None
        key = "name_glob" if pattern.startswith("glob:") else "name_contains"
        rules.append({key: pattern.removeprefix("glob:"), "speedup": speedup})
    # a folder or glob of per-rank profiles is a job: collectives are linked across the ranks
    return A.critical_path(open_job([trace], _stderr_progress) if names_job(trace) else open_trace(trace), what_if=rules or None, **kw)


COMMANDS["critical-path"] = (_critical_path, "Critical path", [
    (("--step",), {"type": int}), (("--marker",), {}), (("--pid",), {"type": int}), *_WINDOW,
    (("--what-if",), {"action": "append", "metavar": "PATTERN=SPEEDUP",
                      "help": "speed up kernels whose name contains PATTERN (glob:PAT for a short-name glob), e.g. gemm=2"}),
    (("--limit",), {"type": int, "default": 20})])

COMMANDS["diagnose"] = (_with_trace(A.diagnose), "Diagnosis", [
    (("--device",), {"type": int}), *_WINDOW, (("--limit",), {"type": int, "default": 8})])


def _compare_traces(trace: str, candidate: str, device: int | None = None, candidate_device: int | None = None,
                    **kw) -> BaseModel:
    dev = device if candidate_device is None else [device if device is not None else candidate_device, candidate_device]
    return A.compare_traces(_side(trace), _side(candidate), device=dev, **kw)


def _side(path: str):
    """A profile, or every rank's profile when `path` is a folder or glob (compare-traces over two jobs)."""
    return open_job([path], _stderr_progress) if names_job(path) else open_trace(path)


COMMANDS["compare-traces"] = (_compare_traces, "Comparison", [
    (("candidate",), {"help": "profile compared against the first (baseline); two folders or globs of per-rank "
                              "profiles compare two jobs"}),
    (("--device",), {"type": int, "help": "device id (both sides, or the baseline side with --candidate-device)"}),
    (("--candidate-device",), {"type": int}), (("--limit",), {"type": int, "default": 15}),
    (("--match",), {"choices": ["name", "short_name"], "default": "short_name"})])

# Subcommands outside the trace-tool table: name -> (help, add_arguments(subparser), run(args)).
EXTRA_COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def _remote_context_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("cluster", nargs="?", help="cluster name in ~/.config/gpuscope/clusters.toml (env GPUSCOPE_CLUSTERS)")
    for flag in ("--login-host", "--partition", "--account", "--time", "--container-image", "--workdir"):
        p.add_argument(flag)
    p.add_argument("--launcher", choices=["srun", "sbatch"])
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int)
    for flag in ("--ssh-option", "--container-mount", "--module"):
        p.add_argument(flag, dest=flag[2:].replace("-", "_") + "s", action="append")


def _remote_context_run(args: argparse.Namespace) -> None:
    from gpuscope.tools.remote_context import remote_context

    kw = {k: v for k, v in vars(args).items() if k not in ("command", "cluster", "json")}
    result = remote_context(args.cluster, **kw)
    if args.json:
        print(visible_json(result.model_dump(mode="json")))
    else:
        print(visible(result.markdown, keep_newlines=True), end="")


EXTRA_COMMANDS["remote-context"] = ("Remote Execution Context block for a cluster", _remote_context_args, _remote_context_run)
def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "clear"], help="list the stored profiles, or delete every store not in use")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _cache_run(args: argparse.Namespace) -> None:
    from gpuscope.tools.model import store

    if args.action == "list":
        entries, kept = store.list_stores(), []
    else:
        entries, kept = store.clear()
    rows = [{"profile": e.profile, "format": e.format, "profile_bytes": e.profile_bytes, "store_bytes": e.store_bytes,
             "store_share_of_profile": round(e.store_bytes / e.profile_bytes, 3) if e.profile_bytes else None,
             "last_used_unix_s": round(e.last_used_unix_s, 3), "in_use": e.in_use, "current_version": e.current,
             "store": str(e.folder)} for e in entries]
    total = sum(e.store_bytes for e in entries)
    if args.json:
        print(visible_json({"cache": str(store.stores_root()), "action": args.action, "stores": rows, "store_bytes": total,
                            "kept_in_use": [str(e.folder) for e in kept], "limit_bytes": store.cache_bytes()}))
        return
    verb = "deleted" if args.action == "clear" else "stored"
    print(visible(f"{len(rows)} profile stores {verb}, {total / 1e6:,.1f} MB, in {store.stores_root()} "
                  f"(limit GPUSCOPE_CACHE_GB = {store.cache_bytes() / 1e9:g} GB)"))
    for r in rows:
        share = f"{r['store_share_of_profile']:.2f}x the profile" if r["store_share_of_profile"] is not None else ""
        flags = ", in use" if r["in_use"] else ""
        flags += "" if r["current_version"] else ", older gpuscope version"
        print(visible(f"  {r['store_bytes'] / 1e6:9,.1f} MB  {share:>18}  {r['format']:<7} {r['profile']}{flags}"))
    if kept:
        print(visible(f"{len(kept)} stores kept: in use by a running gpuscope"))


def _baseline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["save"], help="save: measure PROFILE and write the baseline file")
    p.add_argument("trace", metavar="PROFILE", help="profile file (the reference run)")
    p.add_argument("-o", "--output", required=True, metavar="BASELINE.json", help="baseline file to write")
    p.add_argument("--marker", help="step range name, name with numbers as <N> or glob (default: ProfilerStep#N, else "
                                    "the iterations tool's automatic choice); check reuses it")
    p.add_argument("--pid", type=int, help="process whose steps to record (profiles with several processes)")
    p.add_argument("--json", action="store_true", help="print the saved baseline as JSON")


def _baseline_run(args: argparse.Namespace) -> None:
    from gpuscope.tools.analyses.regression import save_baseline

    with leases():
        base = save_baseline(open_trace(args.trace), marker=args.marker, pid=args.pid)
    data = visible_json(base.model_dump(mode="json"))
    Path(args.output).write_text(data + "\n", encoding="utf-8")
    if args.json:
        print(data)
        return
    it = base.iterations
    steps = (f"{len(it.steps)} steps of '{it.pattern}' ({sum(s.warmup for s in it.steps)} warm-up)" if it
             else f"no steps ({(base.iterations_absent or '').split('. ')[0]}): step_time cannot be checked against it")
    devices = sorted({g.device_id for g in base.kernel_groups})
    print(visible(f"baseline written to {args.output}: {steps}; {len(base.kernel_groups)} kernel groups on "
                  f"{len(devices)} device(s); profile {base.profile.path} ({base.profile.format}), schema_version "
                  f"{base.schema_version}, gpuscope {base.gpuscope_version}"))


def _check_args(p: argparse.ArgumentParser) -> None:
    from gpuscope.tools.analyses.regression import FAIL_ON_GRAMMAR

    p.add_argument("trace", metavar="PROFILE", help="profile of the candidate run")
    p.add_argument("--baseline", required=True, metavar="BASELINE.json", help="written by `gpuscope baseline save`")
    p.add_argument("--fail-on", dest="fail_on", action="append", metavar="SPEC",
                   help=f"repeatable; {FAIL_ON_GRAMMAR} (default: step_time:+5%%)".replace("%", "%%").replace("%%%%", "%%"))
    p.add_argument("--marker", help="step range of the candidate (default: the baseline's marker, else the iterations rules)")
    p.add_argument("--pid", type=int, help="process whose steps to compare (profiles with several processes)")
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help="compare with a baseline measured by another gpuscope version")
    p.add_argument("--format", choices=["markdown", "json"], default="markdown",
                   help="markdown: the PR-comment summary (default); json: the structured result")
    p.add_argument("--json", action="store_true", help="same as --format json")


def _check_run(args: argparse.Namespace) -> None:
    from gpuscope.tools.analyses.regression import check_regression, load_baseline

    baseline = load_baseline(args.baseline)
    with leases():
        result = check_regression(open_trace(args.trace), baseline, args.fail_on or ["step_time:+5%"], marker=args.marker,
                                  pid=args.pid, baseline_file=args.baseline,
                                  allow_version_mismatch=args.allow_version_mismatch)
    if args.json or args.format == "json":
        print(visible_json(result.model_dump(mode="json")))
    else:
        print(visible(result.markdown, keep_newlines=True), end="")
    sys.stdout.flush()
    raise SystemExit(result.exit_code)


EXTRA_COMMANDS["baseline"] = ("CI gate: record a profile's step times, kernel groups and busy/idle as a baseline file",
                              _baseline_args, _baseline_run)
EXTRA_COMMANDS["check"] = ("CI gate: compare a profile with a baseline; exit 0 pass, 1 regression, 2 cannot compare",
                           _check_args, _check_run)
def result_models() -> dict[str, type[BaseModel]]:
    """Tool name -> its result model (the return annotation of the analysis function)."""
    import typing

    out = {}
    for name in A.__all__:
        model = typing.get_type_hints(getattr(A, name)).get("return")
        if isinstance(model, type) and issubclass(model, BaseModel):
            out[name] = model
    return out


def _schema_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("tool", help="tool name, e.g. top_kernels or top-kernels; 'list' names them all")


def _schema_run(args: argparse.Namespace) -> None:
    models = result_models()
    name = args.tool.replace("-", "_")
    if name == "list":
        for tool, model in sorted(models.items()):
            field = model.model_fields.get("schema_version")
            version = field.default if field is not None and isinstance(field.default, int) else "(in the file)"
            print(f"{tool:<20} schema_version {version}")
        return
    if name not in models:
        raise ProfileError(f"no tool {args.tool!r}; `gpuscope schema list` names them ({', '.join(sorted(models))}).")
    print(json.dumps(models[name].model_json_schema(mode="serialization"), indent=2))


EXTRA_COMMANDS["schema"] = ("print the JSON Schema of a tool's result (row keys are stable within its schema_version)",
                            _schema_args, _schema_run)
EXTRA_COMMANDS["cache"] = ("list or clear the trace-store cache (GPUSCOPE_CACHE_DIR)", _cache_args, _cache_run)
EXTRA_COMMANDS["install"] = ("register the MCP server with Claude Code or Cursor and copy the skills",
                             install.add_arguments, install.run_cli)

COMMANDS["rank-summary"] = (_rank_summary, "Ranks", [
    (("--marker",), {}), (("--comm-pattern",), {"dest": "comm_patterns", "action": "append"}),
    (("--limit",), {"type": int, "default": 64}), _CLUSTER])
COMMANDS["straggler-summary"] = (_straggler_summary, "Stragglers", [
    (("--comm-pattern",), {"dest": "comm_patterns", "action": "append"}), (("--limit",), {"type": int, "default": 20}),
    _CLUSTER])
COMMANDS["comm-job-summary"] = (_comm_job_summary, "Communication across ranks", [
    (("--comm-pattern",), {"dest": "comm_patterns", "action": "append"}), (("--limit",), {"type": int, "default": 64}),
    _CLUSTER])
MULTI_PROFILE = {"rank-summary", "straggler-summary", "comm-job-summary"}


def _report(trace: str, xlsx: str | None = None, html: str | None = None, **kw) -> BaseModel:
    """CLI only: writes the files the user names (MCP tools stay read-only)."""
    from gpuscope.tools.report import write_report_for_cli
    from gpuscope.tools.report.html import write_html

    if not xlsx and not html:
        raise ProfileError("name what to write: --html out.html (charts, offline) and/or --xlsx out.xlsx (tables).")
    opened = open_trace(trace)
    if xlsx and html:
        return ReportsWritten(xlsx=write_report_for_cli(opened, xlsx=xlsx, **kw), html=write_html(opened, html))
    return write_report_for_cli(opened, xlsx=xlsx, **kw) if xlsx else write_html(opened, html)


class ReportsWritten(BaseModel):
    xlsx: BaseModel
    html: BaseModel


COMMANDS["report"] = (_report, "Report written", [
    (("--xlsx",), {"metavar": "OUT.xlsx", "help": "Excel workbook to write (TraceLens-style sheets)"}),
    (("--html",), {"metavar": "OUT.html", "help": "one self-contained offline HTML file: diagnosis, GPU timeline, top kernels, "
                                                  "gaps, iterations, roofline and memory charts with their tables"}),
    (("--linked-only",), {"dest": "include_unlinked", "action": "store_false"})])


def _export(trace: str, perfetto: str) -> BaseModel:  # CLI only, like report: writes the file the user names
    from gpuscope.tools.report.perfetto import write_perfetto

    return write_perfetto(open_trace(trace), perfetto)


COMMANDS["export"] = (_export, "Export written", [
    (("--perfetto",), {"required": True, "metavar": "OUT.json",
                       "help": "Chrome/Perfetto JSON trace: a track per GPU stream and host thread, kernels as ph X events"})])


def _summary(command: str, fallback: str) -> str:
    """First sentence of the analysis module's docstring ('top_kernels: kernels per device ...')."""
    fixed = {"list-tables": "the trace model's tables and the profile's own (native) tables, with row counts",
             "describe-table": "the columns of one table, with their meaning and unit",
             "report": "write the analyses into an offline HTML report (--html out.html) and/or a .xlsx workbook (--xlsx out.xlsx)",
             "export": "write the trace as a Chrome/Perfetto JSON trace (--perfetto out.json) for ui.perfetto.dev"}
    if command in fixed:
        return fixed[command]
    module = {"sql": "sql_query"}.get(command, command.replace("-", "_"))
    try:
        doc = importlib.import_module(f"gpuscope.tools.analyses.{module}").__doc__ if module else None
    except ImportError:
        doc = None
    if not doc:
        return fallback
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.split(": ", 1)[-1].split(". ")[0].rstrip(".")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuscope", description="Read-only GPU profile analysis (MCP server and CLI).")
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve MCP over stdio (what Claude Code / Cursor spawn)")
    serve.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address for --http (default 127.0.0.1); any non-loopback address needs a token")
    serve.add_argument("--port", type=int, default=8765, help="port for --http (default 8765; endpoint /mcp)")
    serve.add_argument("--token", help="bearer token every HTTP request must send (default $GPUSCOPE_TOKEN; prefer the "
                                       "variable: a command line is visible to other users)")
    for name, (_, title, extra) in COMMANDS.items():
        p = sub.add_parser(name, help=_summary(name, title))
        if name in MULTI_PROFILE:
            p.add_argument("trace", nargs="+", help="profile files (one per rank, or one with several processes), folders "
                                                    "of them, or glob patterns")
        else:
            p.add_argument("path" if name == "list-traces" else "trace", help="folder" if name == "list-traces" else "profile file")
        for flags, kwargs in extra:
            p.add_argument(*flags, **kwargs)
        p.add_argument("--format", choices=FORMATS, default="table",
                       help="table (readable text, the default), json (the structured result), csv or parquet (one row per "
                            "entry of the result's main list; columns are the JSON field names)")
        p.add_argument("--json", action="store_const", dest="format", const="json", help="same as --format json")
        p.add_argument("--rows", metavar="FIELD", help="csv/parquet: which list of the result to write (default: the longest)")
        p.add_argument("--output", "-o", metavar="FILE", help="write csv/parquet to FILE (parquet needs it; csv defaults to stdout)")
    for name, (help_, add_args, _) in EXTRA_COMMANDS.items():
        add_args(sub.add_parser(name, help=help_))
    return parser


def _glue_option_values(argv: list[str]) -> list[str]:
    """`--ssh-option -p` would read -p as a flag: glue each value to its option (`--ssh-option=-p`)."""
    out, it = [], iter(argv)
    for a in it:
        nxt = next(it, None) if a == "--ssh-option" else None
        out.append(a if nxt is None else f"{a}={nxt}")
    return out


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except BrokenPipeError:  # output piped into `head` and the like: the reader left, nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from .serve import TOKEN_ENV, check_token

    if not args.http and (args.host != "127.0.0.1" or args.token is not None):
        parser.error("--host and --token apply to --http only (stdio needs neither)")
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    if args.http:
        check_token(args.host, token)  # refuse before loading the tools, long before binding
    from .app import run

    run(http=args.http, port=args.port, host=args.host, token=token)


def _fail(message: str) -> None:
    print(f"gpuscope: {visible(message)}", file=sys.stderr)
    raise SystemExit(2) from None


def _main(argv: list[str] | None) -> None:
    parser = build_parser()
    args = parser.parse_args(_glue_option_values(sys.argv[1:] if argv is None else argv))
    if args.command == "serve":
        try:
            _serve(args, parser)
        except ProfileError as exc:  # e.g. a non-loopback address without a token
            _fail(str(exc))
        return
    try:
        if args.command in EXTRA_COMMANDS:
            EXTRA_COMMANDS[args.command][2](args)
            return
        fn, title, _ = COMMANDS[args.command]
        if args.format == "parquet" and not args.output:
            raise ProfileError("--format parquet writes a file: add --output FILE.parquet.")
        with leases():
            result = fn(**{k: v for k, v in vars(args).items() if k not in ("command", "format", "rows", "output")})
        if args.format in ("csv", "parquet"):
            _write_rows(result, args.format, args.rows, args.output)
            return
    except ProfileError as exc:
        _fail(str(exc))
    except BrokenPipeError:
        raise
    except OSError as exc:  # a file the user named cannot be written or read (report, --plot, install target)
        _fail(f"{exc.strerror or exc}: {exc.filename or ''}. Check the path and its permissions.")
    except (MemoryError, duckdb.OutOfMemoryException) as exc:
        _fail(f"out of memory ({out_of_memory(exc)}). {out_of_memory_advice()}")
    if args.format == "json":
        print(visible_json(result.model_dump(mode="json")))
    else:
        print(render(result, title), end="")


FORMATS = ("table", "json", "csv", "parquet")


def table_rows(result: BaseModel, field: str | None = None) -> tuple[str | None, list[dict]]:
    """(list field, rows) of a result for csv/parquet: the named list of row objects, else the longest one (first on a
    tie); a result without one is a single row of its scalar fields. Nested values become JSON text."""
    data = result.model_dump(mode="json")
    lists = {k: v for k, v in data.items() if isinstance(v, list) and all(isinstance(x, dict) for x in v) and v}
    if field is not None:
        if field not in data or not isinstance(data[field], list):
            choices = ", ".join(k for k, v in data.items() if isinstance(v, list)) or "none"
            raise ProfileError(f"--rows {field!r}: no such list in this result; lists: {choices}.")
        name, rows = field, [x if isinstance(x, dict) else {"value": x} for x in data[field]]
    elif lists:
        name = max(lists, key=lambda k: len(lists[k]))  # max keeps the first of equal lengths
        rows = lists[name]
    else:
        name, rows = None, [{k: v for k, v in data.items() if not isinstance(v, (list, dict))}]
    flat = [{k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in r.items()} for r in rows]
    return name, flat


def _write_rows(result: BaseModel, fmt: str, field: str | None, output: str | None) -> None:
    import csv

    import pandas as pd

    name, rows = table_rows(result, field)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    frame = pd.DataFrame(rows, columns=columns)
    if fmt == "parquet":
        con = connect(":memory:", {})  # a private in-memory instance: it only writes the file the user named
        try:
            con.register("result_rows", frame)
            con.execute("COPY result_rows TO ? (FORMAT parquet)", [str(Path(output).expanduser())])
        except duckdb.Error as exc:
            raise ProfileError(f"cannot write {output}: {str(exc).splitlines()[0]}. Check the folder and its permissions.") from None
        finally:
            con.close()
        print(visible(f"{len(rows)} rows ({name or 'the result'}) written to {output}"), file=sys.stderr)
        return
    if output:
        with open(Path(output).expanduser(), "w", newline="", encoding="utf-8") as fh:  # a file keeps the raw text
            frame.to_csv(fh, index=False, quoting=csv.QUOTE_MINIMAL)
        print(visible(f"{len(rows)} rows ({name or 'the result'}) written to {output}"), file=sys.stderr)
    else:  # the terminal: profile text shown escaped, as everywhere else
        shown = frame.map(lambda v: visible(v) if isinstance(v, str) else v)
        sys.stdout.write(shown.to_csv(index=False, quoting=csv.QUOTE_MINIMAL))


if __name__ == "__main__":
    main()
