"""rank_summary: the ranks of a distributed job side by side — who is slow, and by how much.

A rank is one process of one profile: several single-rank profiles (one Kineto trace per rank), or
one profile holding several processes (an Nsight/rocpd file of an MPI job), or a mix. The rank
number comes from the profile (processes.rank: Nsight MPI_RANKS, Kineto distributedInfo; or the
trace_meta `rank` of a single-process profile); a rank the profile does not number gets the lowest
unused number in input order, and its row says so. Two inputs claiming the same rank are an error,
never a silent overwrite (HTA keeps the last one), and a rank without kernels is a row of zeros,
not an abort (PerfAdvisor aborts).

Per rank and device (TraceLens definitions, the same ops and classes as gpu_timeline, so the two
tools agree; all wall time = interval unions):
  compute   = kernels that are neither communication nor ROCm copy kernels, plus memsets;
  comm      = communication kernels (comm_patterns.py: NCCL/RCCL, custom all-reduce, NVSHMEM, ...);
  memcpy    = memory copies (and ROCm copy kernels);
  exposed communication = comm time not overlapped by compute;
  exposed memcpy        = copy time not overlapped by compute or comm;
  busy = compute + exposed comm + exposed memcpy;  idle = GPU span - busy
where the GPU span runs from the rank's first to its last GPU operation on the device. A rank's
figures are summed over its devices (equal to the device's figures when it drives one GPU).

Steps are host-side ranges chosen per rank by the iterations tool's rules (step_choice.py, the one definition both
use; same `marker` syntax): the caller's marker, else ProfilerStep#N, else the repeating NVTX/rocTX range that covers
the GPU work; step time = the range's duration.

However many ranks: every figure is computed by a fixed number of SQL statements over all ranks' stores at once
(stacked.py: each table of every store stacked with its position in the job): the ranks (processes, GPU pids, API
pids), the device figures (interval unions as window functions partitioned by rank and device), kernel counts and
the steps. Python then assembles one small row per rank; no event rows leave DuckDB.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .comm_patterns import comm_patterns as active_patterns
from .comm_patterns import is_comm_sql
from . import exact
from .common import NAME_CHARS, WHOLE_GRAPH_ADVICE, ToolResult, clip_name, data_issue_notes, data_issues_field, pct
from .gpu_timeline import COMM, COMP, GRAPH, MEMCPY, ROCM_COPY_KERNEL
from .owners import unowned_join, unowned_sql
from .requirements import left_out
from .stacked import prime, run, stack, union_measures_sql, values
from .step_choice import scope_steps

# Straggler by step time only when mean step times differ by at least this share of their mean;
# below it the collectives keep ranks in lockstep and step time cannot single out the slow rank.
STEP_SPREAD_FOR_STRAGGLER = 0.02
# Fallback step names when no ProfilerStep exists: step_3, iteration 7, train_step#2, iter-5, batch_1
MAX_LIMIT = 1024
UNBOUNDED = 2**62  # no time window: ops are not clipped

Metric = Literal["mean_step_ns", "gpu_span_ns", "busy_ns", "idle_in_gpu_span_ns", "compute_ns", "comm_ns",
                 "exposed_comm_ns", "exposed_memcpy_ns"]
METRICS: tuple[str, ...] = Metric.__args__  # type: ignore[attr-defined]
LABELS = {"mean_step_ns": "mean step time", "gpu_span_ns": "GPU span", "busy_ns": "GPU busy time",
          "idle_in_gpu_span_ns": "GPU idle time", "compute_ns": "compute time", "comm_ns": "communication time",
          "exposed_comm_ns": "exposed communication", "exposed_memcpy_ns": "exposed memcpy"}


class DeviceFigures(BaseModel):
    device_id: int
    gpu_span_ns: int = Field(description="first to last GPU operation of this rank on this device, ns")
    busy_ns: int = Field(description="union of kernels, copies and sets, ns")
    idle_in_gpu_span_ns: int = Field(description="gpu_span_ns - busy_ns, ns")
    compute_ns: int = Field(description="union of non-communication kernels and memsets, ns")
    comm_ns: int = Field(description="union of communication kernels, ns")
    exposed_comm_ns: int = Field(description="communication time not overlapped by compute, ns")
    exposed_memcpy_ns: int = Field(description="copy time not overlapped by compute or communication, ns")
    whole_graph_ns: int = Field(0, description="of compute_ns, the union of CUDA graph replays traced whole (Nsight "
                                "--cuda-graph-trace=graph): their kernels, possibly communication, are unknown, ns")


class RankRow(BaseModel):
    rank: int
    rank_source: Literal["profile", "input order"] = Field(
        description="'profile': the profile states the rank (MPI_RANKS, distributedInfo); 'input order': it does not, "
                    "so the rank is the lowest unused number in the order the profiles were given")
    trace: str = Field(description="profile file name")
    pid: int | None = Field(description="process id; null when the profile names no process and is taken whole")
    process_name: str | None
    hostname: str | None
    devices: list[int] = Field(description="GPUs this rank ran work on")
    kernels: int = Field(description="kernels of this rank")
    comm_kernels: int = Field(description="of which communication kernels")
    gpu_span_ns: int | None = Field(description="first to last GPU operation, summed over the rank's devices, ns; "
                                                "null without GPU operations")
    busy_ns: int | None = Field(description="union of kernels, copies and sets, summed over devices, ns "
                                            "(0: no GPU work while the profile recorded GPU activity; null: unknown)")
    busy_pct_of_gpu_span: float | None = Field(description="busy_ns / gpu_span_ns, %")
    idle_in_gpu_span_ns: int | None = Field(description="gpu_span_ns - busy_ns, ns")
    compute_ns: int | None = Field(description="union of non-communication kernels and memsets, ns")
    comm_ns: int | None = Field(description="union of communication kernels (wall time), ns")
    exposed_comm_ns: int | None = Field(description="communication not overlapped by compute (waiting in collectives "
                                                    "shows up here), ns")
    comm_overlapped_pct_of_comm: float | None = Field(description="(comm_ns - exposed_comm_ns) / comm_ns, %; null "
                                                                  "without communication")
    exposed_memcpy_ns: int | None = Field(description="copy time not overlapped by compute or communication, ns")
    whole_graph_ns: int | None = Field(None, description="of compute_ns, CUDA graph replays traced whole (union, summed "
                                       "over devices): contents unknown, possibly communication, ns; see notes")
    steps: int | None = Field(description="step ranges found on this rank; null when none")
    step_names: str | None = Field(description="how the steps were chosen and which ranges they are, e.g. "
                                               "'ProfilerStep: ProfilerStep#551 .. ProfilerStep#552 (2 ranges)'")
    mean_step_ns: float | None = Field(description="mean wall time of a step (host range), ns")
    min_step_ns: int | None = None
    max_step_ns: int | None = None
    per_device: list[DeviceFigures] | None = Field(None, description="figures per GPU, only when the rank drives several")
    notes: list[str] = Field(default_factory=list)


class MetricImbalance(BaseModel):
    metric: str = Field(description="RankRow field compared across ranks")
    ranks_counted: int = Field(description="ranks with a value for the metric")
    min: float | None = Field(description="smallest value over the ranks counted, ns (every metric is a duration)")
    max: float | None = Field(description="largest value over the ranks counted, ns")
    mean: float | None = Field(description="mean over the ranks counted, ns")
    median: float | None = Field(description="median over the ranks counted, ns")
    min_rank: int | None = Field(description="rank holding the minimum (lowest rank on ties)")
    max_rank: int | None = Field(description="rank holding the maximum (lowest rank on ties)")
    imbalance_ratio: float | None = Field(description="(max - min) / mean, a ratio (0.25: the spread is 25 % of the "
                                                      "mean); null when the mean is 0 or fewer than 2 ranks have it")


class IterationImbalance(BaseModel):
    step: str = Field(description="step name, the same on every rank")
    min_wall_ns: int = Field(description="shortest wall time of this step over the ranks, ns")
    max_wall_ns: int = Field(description="longest wall time of this step over the ranks, ns")
    mean_wall_ns: float = Field(description="mean wall time of this step over the ranks, ns")
    imbalance_ratio: float | None = Field(description="(max - min) / mean of the step's wall time across ranks")
    slowest_rank: int | None = Field(description="rank with the longest wall time (lowest rank on ties); null when all are equal")
    fastest_rank: int | None = Field(description="rank with the shortest wall time; null when all are equal")


class Straggler(BaseModel):
    rank: int
    metric: str = Field(description="what singled it out: 'mean_step_ns' (slowest steps), else 'compute_ns' "
                                    "(most GPU compute), else 'busy_ns'")
    value: float = Field(description="the rank's value of `metric`")
    median: float = Field(description="median of `metric` over the ranks")
    pct_above_median: float | None = Field(description="(value - median) / median, %")
    exposed_comm_lowest: bool | None = Field(description="true when the rank has strictly the least exposed communication "
                                                         "(the others wait for it in collectives); null when no rank has "
                                                         "communication kernels or the figure is unknown")
    evidence: str = Field(description="the reasoning in one paragraph")


class RankSummaryResult(ToolResult):
    traces: list[str]
    ranks_found: int = Field(description="ranks compared")
    world_size: int | None = Field(description="job size stated by the profiles (Kineto distributedInfo); null when unstated")
    definitions: str = Field(description="what the figures mean")
    ranks: list[RankRow] = Field(description="one row per rank, by rank")
    imbalance: list[MetricImbalance] = Field(description="spread of each metric across ranks")
    iterations: list[IterationImbalance] | None = Field(
        description="per-step wall time across ranks, when every rank has the same steps; null otherwise")
    straggler: Straggler | None = Field(description="the rank holding the job back, with the evidence; null with one "
                                                    "rank or when the ranks are equal")
    notes: list[str]
    truncated: bool = Field(description="true when ranks or iterations were cut to `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


DEFINITIONS = (
    "Per rank (a process of a profile) and GPU, wall times from interval unions: compute = non-communication kernels "
    "+ memsets; comm = communication kernels; exposed_comm = comm not overlapped by compute; exposed_memcpy = copies "
    "not overlapped by compute or comm; busy = compute + exposed_comm + exposed_memcpy; idle = GPU span - busy, the "
    "span running from the rank's first to last GPU operation. Figures of a rank with several GPUs are summed over "
    "them. Steps are host ranges (ProfilerStep#N, or the `marker` ranges); step time = range duration. "
    "imbalance_ratio = (max - min) / mean across ranks."
)


@dataclass
class _Unit:
    trace: Trace
    order: int
    pid: int | None
    whole: bool  # the profile is one rank: take all of its GPU work regardless of pid
    name: str | None = None
    hostname: str | None = None
    rank: int | None = None
    rank_source: str = "profile"
    notes: list[str] = field(default_factory=list)


def rank_summary(
    traces: list[Trace],
    *,
    marker: str | None = None,
    comm_patterns: list[str] | None = None,
    limit: int = 64,
) -> RankSummaryResult:
    limit = max(1, min(int(limit), MAX_LIMIT))
    notes: list[str] = []
    units = job_ranks(traces, notes)
    world = {t.meta.get("world_size") for t in traces} - {None, ""}
    world_size = int(next(iter(world))) if len(world) == 1 else None
    if len(world) > 1:
        notes.append(f"the profiles state different world sizes ({', '.join(sorted(world))}): they may come from different jobs")
    if world_size is not None and world_size > len(units):
        notes.append(f"{len(units)} of {world_size} ranks are compared; imbalance and straggler refer to these ranks only")

    active_patterns(comm_patterns)  # a bad user pattern is refused here, before any work
    rows, step_series = rank_rows(traces, units, marker, comm_patterns)
    if marker is not None and not step_series:
        raise ProfileError(f"no rank has step ranges matching marker {marker!r} (an exact name, a name with its number "
                           "written as <N> such as 'ProfilerStep#<N>', or a glob such as 'iter*'). " + _marker_suggestions(traces))
    rows.sort(key=lambda r: r.rank)

    imbalance = [_imbalance(m, rows) for m in METRICS]
    iterations, steps_compared, it_note = _iterations(rows, step_series, limit)
    if it_note:
        notes.append(it_note)
    straggler = _straggler(rows, {m.metric: m for m in imbalance}, notes)

    truncated = False
    hint = None
    if len(rows) > limit:
        truncated = True
        first = ([straggler.rank] if straggler else []) + [x for m in imbalance for x in (m.max_rank, m.min_rank)]
        keep: list[int] = []
        for rank in first + [r.rank for r in rows]:
            if rank is not None and rank not in keep and len(keep) < limit:
                keep.append(rank)
        rows = [r for r in rows if r.rank in keep]
        hint = (f"{len(units)} ranks; the table shows {len(rows)} (the straggler, the ranks holding each metric's min and "
                f"max, then the lowest ranks). Imbalance figures cover all ranks. Raise limit (max {MAX_LIMIT}) for all.")
    if iterations is not None and steps_compared > limit:
        truncated = True
        hint = (hint + " " if hint else "") + f"only the first {limit} iterations are listed; raise limit to see more."
    return RankSummaryResult(
        data_issues=[f"{t.path.name}: {note}" if len(traces) > 1 else note for t in traces
                     for note in data_issue_notes(t, ("kernels", "memops", "api_calls", "markers"))],
        traces=[str(t.path) for t in traces], ranks_found=len(units), world_size=world_size, definitions=DEFINITIONS,
        ranks=rows, imbalance=imbalance, iterations=iterations, straggler=straggler, notes=notes,
        truncated=truncated, hint=hint,
    )


# -- ranks -----------------------------------------------------------------------------------------

def job_ranks(traces: list[Trace], notes: list[str]) -> list[_Unit]:
    """The ranks of a job, numbered (the tools over many ranks share this): refuses an empty job and a profile given
    twice, primes every profile's counts in two statements, and adds numbering notes to `notes`."""
    if not traces:
        raise ProfileError("no profiles given: pass one profile per rank (or a folder or glob of them), or one profile "
                           "holding several ranks.")
    seen: dict[str, int] = {}
    for i, t in enumerate(traces):
        key = str(t.path)
        if key in seen:
            raise ProfileError(f"{t.path.name} is given twice (positions {seen[key] + 1} and {i + 1}); pass each rank's "
                               "profile once.")
        seen[key] = i
    prime(traces)  # row counts and data issues of every profile: two statements for the job
    units = _units(traces, notes)
    _number(units, notes)
    return units


def _units(traces: list[Trace], notes: list[str]) -> list[_Unit]:
    """The ranks every profile holds (three statements for the whole job): per profile, processes with a stated rank
    or with GPU work; failing those, processes with GPU API calls; failing those, its only process, or the profile
    taken whole."""
    procs: dict[int, dict] = {}
    for part, pid, name, rank, host in run(traces, f"""
            SELECT part, pid, any_value(name), max(rank), any_value(hostname)
            FROM ({stack(traces, 'processes', 'pid, name, rank, hostname')}) GROUP BY part, pid"""):
        procs.setdefault(part, {})[pid] = {"pid": pid, "name": name, "rank": rank, "hostname": host}
    gpu: dict[int, set] = {}
    api: dict[int, set] = {}
    orphans: dict[int, int] = {}
    for part, what, pid, n in run(traces, f"""
            SELECT part, 'gpu', pid, NULL::BIGINT FROM (
                {stack(traces, 'kernels', 'pid')} UNION ALL {stack(traces, 'memops', 'pid')}) GROUP BY part, pid
            UNION ALL
            SELECT part, 'api', pid, NULL FROM ({stack(traces, 'api_calls', 'pid', 'pid IS NOT NULL')}) GROUP BY part, pid
            UNION ALL
            SELECT part, 'orphans', NULL, count(*) FROM (
                {stack(traces, 'kernels', 'pid', 'pid IS NULL')} UNION ALL {stack(traces, 'memops', 'pid', 'pid IS NULL')})
            GROUP BY part"""):
        if what == "gpu":
            gpu.setdefault(part, set()).add(pid)
        elif what == "api":
            api.setdefault(part, set()).add(pid)
        else:
            orphans[part] = int(n)
    units: list[_Unit] = []
    for order, t in enumerate(traces):
        mine = procs.get(order, {})
        ranked = {p for p, r in mine.items() if r["rank"] is not None}
        pids = ranked | {p for p in gpu.get(order, set()) if p is not None}
        basis = "stated rank or GPU work"
        if not pids:
            pids = set(api.get(order, set()))
            basis = "GPU API calls"
        if not pids and len(mine) == 1:
            pids = set(mine)
        if not pids:
            u = _Unit(t, order, None, True)
            u.notes.append("the profile names no process with GPU work, GPU API calls or a rank: it is taken whole as one rank")
            found = [u]
        else:
            whole = len(pids) == 1
            found = []
            for pid in sorted(pids):
                p = mine.get(pid, {})
                found.append(_Unit(t, order, pid, whole, p.get("name"), p.get("hostname"), p.get("rank")))
            if whole and found[0].rank is None and t.meta.get("rank") not in (None, ""):
                found[0].rank = int(t.meta["rank"])
        if len(found) > 1:
            if orphans.get(order):
                notes.append(f"{t.path.name}: {orphans[order]} GPU operations name no process and belong to no rank")
            left = sorted(api.get(order, set()) - pids)
            if left and basis != "GPU API calls":
                shown = ", ".join(str(p) for p in left[:8])
                notes.append(f"{t.path.name}: process(es) {shown} made GPU API calls but ran no GPU work and state no rank; "
                             "they are not counted as ranks")
        units += found
    return units


def _number(units: list[_Unit], notes: list[str]) -> None:
    claimed: dict[int, _Unit] = {}
    for u in units:
        if u.rank is None:
            continue
        if u.rank in claimed:
            o = claimed[u.rank]
            raise ProfileError(
                f"rank {u.rank} is claimed twice: by {_who(o)} and by {_who(u)}. Pass one profile per rank of the same "
                "job (the same rank twice usually means two different runs).")
        claimed[u.rank] = u
    unnumbered = [u for u in units if u.rank is None]
    nxt = 0
    for u in unnumbered:
        while nxt in claimed:
            nxt += 1
        u.rank, u.rank_source = nxt, "input order"
        claimed[nxt] = u
    if unnumbered:
        notes.append(f"{len(unnumbered)} rank(s) are not numbered by their profile ({', '.join(_who(u) for u in unnumbered[:6])}"
                     f"{', ...' if len(unnumbered) > 6 else ''}): they were numbered in input order (profile order, then "
                     "pid), rank_source 'input order'")


def _who(u: _Unit) -> str:
    return f"{u.trace.path.name}" + (f" pid {u.pid}" if u.pid is not None else "")


# -- per-rank figures: each a fixed number of statements over every rank's store -------------------

FIGURES = ("gpu_span_ns", "busy_ns", "idle_in_gpu_span_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "exposed_memcpy_ns",
           "whole_graph_ns")
# interval sets whose unions give the TraceLens split: COMP (whole-graph replays included), COMM, COMP ∪ COMM, GRAPH, ALL
# (stacked.union_measures_sql; the last id holds every class)
SETS = {0: (COMP, GRAPH), 1: (COMM,), 2: (COMP, GRAPH, COMM), 3: (GRAPH,), 4: (COMP, GRAPH, COMM, MEMCPY)}


def _device_figures(traces: list[Trace], units: list[_Unit], patterns: list[str] | None) -> dict[tuple, list[DeviceFigures]]:
    """(part, owner) -> figures per device, by device; owner is None when the profile is taken as one rank. The ops,
    their classes and owners are gpu_timeline's (timeline_ops_sql; owners.py), so both tools give the same figures.
    One statement for the whole job."""
    comm = is_comm_sql("name", patterns)
    whole = values(sorted({(u.order, u.whole) for u in units}), ("BIGINT", "BOOLEAN"))
    ops = (stack(traces, "kernels", f"device_id, stream_id, pid, start_ns, end_ns, CASE WHEN whole_graph THEN {GRAPH} WHEN {comm} THEN {COMM} "
                                    f"WHEN regexp_matches(name, '{ROCM_COPY_KERNEL}') THEN {MEMCPY} ELSE {COMP} END AS cls")
           + " UNION ALL " + stack(traces, "memops", f"device_id, stream_id, pid, start_ns, end_ns, CASE WHEN op = 'copy' THEN {MEMCPY} ELSE {COMP} END"))
    rows = run(traces, f"""
        WITH whole(part, whole) AS ({whole}),
        ops AS ({ops}),
        unowned AS ({unowned_sql('SELECT part, device_id, stream_id, pid FROM ops')}),
        iv AS (SELECT ops.part, ops.device_id, CASE WHEN whole.whole THEN NULL ELSE coalesce(ops.pid, unowned.owner) END AS owner,
                      ops.cls, ops.start_ns, ops.end_ns
               FROM ops LEFT JOIN unowned ON {unowned_join('ops', 'unowned')} JOIN whole ON whole.part = ops.part)
        SELECT part, owner, device_id, u0, u1, u2, u4, u3, first_ns, last_ns
        FROM ({union_measures_sql('SELECT * FROM iv', 'part, owner, device_id', SETS)})
        ORDER BY part, owner, device_id""")
    out: dict[tuple, list[DeviceFigures]] = {}
    for part, owner, dev, comp, comm_ns, comp_comm, every, graph, first, last in rows:
        span = int(last - first)
        out.setdefault((part, owner), []).append(DeviceFigures(
            device_id=dev, gpu_span_ns=span, busy_ns=every, idle_in_gpu_span_ns=span - every, compute_ns=comp,
            comm_ns=comm_ns, exposed_comm_ns=comp_comm - comp, exposed_memcpy_ns=every - comp_comm, whole_graph_ns=graph))
    return out


def _kernel_counts(traces: list[Trace], patterns: list[str] | None) -> dict[int, list[tuple]]:
    """part -> [(pid, device_id, kernels, communication kernels)] over kernels and copies/sets: one statement."""
    comm = is_comm_sql("name", patterns)
    out: dict[int, list[tuple]] = {}
    for part, pid, dev, k, c in run(traces, f"""
            SELECT part, pid, device_id, count(*) FILTER (WHERE kernel), count(*) FILTER (WHERE kernel AND comm)
            FROM ({stack(traces, 'kernels', f'pid, device_id, TRUE AS kernel, {comm} AS comm')} UNION ALL
                  {stack(traces, 'memops', 'pid, device_id, FALSE, FALSE')})
            GROUP BY part, pid, device_id"""):
        out.setdefault(part, []).append((pid, dev, int(k), int(c)))
    return out


def rank_rows(traces: list[Trace], units: list[_Unit], marker: str | None,
              comm_patterns: list[str] | None) -> tuple[list[RankRow], dict[int, _Steps]]:
    """Every rank's row, in `units` order, and the step series of the ranks with steps: a fixed number of statements
    over all stores (compare_traces reads a job's ranks through this too)."""
    figs = _device_figures(traces, units, comm_patterns)
    counts = _kernel_counts(traces, comm_patterns)
    series = _steps(traces, units, marker)
    rows: list[RankRow] = []
    step_series: dict[int, _Steps] = {}
    for u in units:  # one small row per rank from the results above: no query per rank
        row, steps = _rank_row(u, figs, counts, series)
        rows.append(row)
        if steps is not None:
            step_series[u.rank] = steps
    return rows, step_series


def _rank_row(u: _Unit, figs: dict, counts: dict, series: dict) -> tuple[RankRow, _Steps | None]:
    t = u.trace
    mine = figs.get((u.order, None), []) if u.whole else figs.get((u.order, u.pid), [])
    have = [c for c in counts.get(u.order, []) if u.whole or c[0] == u.pid]
    kernels = sum(c[2] for c in have)
    comm_kernels = sum(c[3] for c in have)
    devices = sorted({c[1] for c in have})
    notes = list(u.notes)
    profile_has_gpu = t.count("kernels") + t.count("memops") > 0
    vals: dict[str, Any] = {}
    if mine:
        for name in FIGURES:
            vals[name] = sum(getattr(f, name) for f in mine)
    elif profile_has_gpu:
        # The profiler recorded GPU work (of other processes) but none of this rank: true zeros.
        vals = dict(gpu_span_ns=None, busy_ns=0, idle_in_gpu_span_ns=None, compute_ns=0, comm_ns=0,
                    exposed_comm_ns=0, exposed_memcpy_ns=0, whole_graph_ns=0)
        notes.append("no GPU work in this rank (the profile holds other processes' GPU work): busy, compute and "
                     "communication are 0; the GPU span is undefined")
    else:
        vals = dict.fromkeys(FIGURES)
        notes.append("the profile holds no GPU activity at all: GPU figures are unknown (null); "
                     + "; ".join(left_out(t, "rank_summary")))
    if mine and kernels == 0:
        notes.append("no kernels: only copies/sets ran, compute is memsets only")
    if len(mine) > 1:
        notes.append(f"drives {len(mine)} GPUs: figures are summed over them (per_device has each)")
    if vals.get("whole_graph_ns"):
        notes.append(f"compute_ns includes {vals['whole_graph_ns']} ns of CUDA graph replays traced whole (whole_graph_ns): "
                     f"their kernels, possibly communication, are not in the export; {WHOLE_GRAPH_ADVICE}")
    steps = _series(series.get((u.order, _scope_pid(u))), notes)
    wall = steps.walls if steps is not None else None
    span, busy = vals["gpu_span_ns"], vals["busy_ns"]
    comm, exposed = vals["comm_ns"], vals["exposed_comm_ns"]
    row = RankRow(
        rank=u.rank, rank_source=u.rank_source, trace=t.path.name, pid=u.pid, process_name=u.name, hostname=u.hostname,
        devices=devices, kernels=int(kernels), comm_kernels=int(comm_kernels), **vals,
        busy_pct_of_gpu_span=pct(busy, span),
        comm_overlapped_pct_of_comm=pct(comm - exposed, comm) if comm else None,
        steps=len(wall) if steps else None, step_names=steps.described if steps else None,
        mean_step_ns=round(exact.total(wall) / len(wall), 1) if steps else None,
        min_step_ns=int(wall.min()) if steps else None, max_step_ns=int(wall.max()) if steps else None,
        per_device=mine if len(mine) > 1 else None, notes=notes,
    )
    return row, steps


# -- steps -----------------------------------------------------------------------------------------

def _scope_pid(u: _Unit) -> int | None:
    """The process whose steps are the rank's (None: every process of the profile, as iterations(pid=None))."""
    return None if u.whole and u.pid is None else u.pid


def _steps(traces: list[Trace], units: list[_Unit], marker: str | None) -> dict[tuple, pd.DataFrame]:
    """(part, scope pid) -> the scope's steps (step_choice.scope_steps)."""
    return scope_steps(traces, [(u.order, _scope_pid(u)) for u in units], marker)


@dataclass
class _Steps:
    """A rank's step series: each step's name as the iterations table keys it, and its wall time (ns), in time order."""
    keys: np.ndarray  # object: str
    walls: np.ndarray  # int64
    described: str  # the step ranges in a few words

    def __len__(self) -> int:
        return len(self.walls)


def _series(found: pd.DataFrame | None, notes: list[str]) -> _Steps | None:
    """The scope's steps on the thread with the most of them (iterations' series; the lowest thread, then process,
    on ties), over columns: a rank may run 250,000 steps."""
    if found is None or not len(found):
        return None
    counts = found.groupby(["pid", "tid"], sort=False).size().reset_index(name="n")
    best = counts.sort_values(["n", "tid", "pid"], ascending=[False, True, True], kind="stable").iloc[0]
    if len(counts) > 1:
        notes.append(f"step ranges on {len(counts)} threads; thread {int(best['tid'])} (most steps) is used")
    series = found[(found["pid"] == best["pid"]) & (found["tid"] == best["tid"])].sort_values("idx", kind="stable")
    names = series["name"]
    long = names.str.len() > NAME_CHARS
    if long.any():
        names = names.where(~long, names[long].map(clip_name))
    keys = names if names.nunique(dropna=False) == len(names) else names.astype(str) + " [" + (series["idx"] + 1).astype(str) + "]"
    keys = keys.to_numpy(dtype=object)
    walls = (series["end_ns"] - series["start_ns"]).to_numpy(dtype=np.int64)
    described = f"{series['how'].iloc[0]}: " + (keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]} ({len(keys)} ranges)")
    return _Steps(keys, walls, described)


def _marker_suggestions(traces: list[Trace]) -> str:
    rows = traces[0].sql("SELECT name, count(*) AS n FROM markers WHERE kind <> 'gpu_annotation' GROUP BY name "
                         "HAVING count(*) > 1 ORDER BY n DESC, name LIMIT 8")
    if not rows:
        return f"{traces[0].path.name} has no repeated ranges; call without marker to use ProfilerStep#N ranges."
    return f"Repeated ranges in {traces[0].path.name}: " + ", ".join(f"{n!r} ×{c}" for n, c in rows) + "."


# -- comparisons -----------------------------------------------------------------------------------

def _imbalance(metric: str, rows: list[RankRow]) -> MetricImbalance:
    have = [(r.rank, float(getattr(r, metric))) for r in rows if getattr(r, metric) is not None]
    if not have:
        return MetricImbalance(metric=metric, ranks_counted=0, min=None, max=None, mean=None, median=None,
                               min_rank=None, max_rank=None, imbalance_ratio=None)
    values = [v for _, v in have]
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    return MetricImbalance(
        metric=metric, ranks_counted=len(have), min=lo, max=hi, mean=round(mean, 1),
        median=float(statistics.median(values)),
        min_rank=next(r for r, v in have if v == lo), max_rank=next(r for r, v in have if v == hi),
        imbalance_ratio=round((hi - lo) / mean, 4) if len(have) > 1 and mean else None,
    )


def _iterations(rows: list[RankRow], steps: dict[int, _Steps], limit: int) -> tuple[list[IterationImbalance] | None, int, str | None]:
    """The first `limit` steps compared across the ranks, the number of steps compared, and why none are."""
    if len(rows) < 2:
        return None, 0, None
    if not steps:
        return None, 0, "no rank has step ranges (ProfilerStep#N): per-step comparison and step times are unavailable; pass marker= to name the step ranges"
    missing = [r.rank for r in rows if r.rank not in steps]
    if missing:
        return None, 0, f"rank(s) {_ranks(missing)} have no step ranges: iterations are not compared"
    first = steps[rows[0].rank].keys
    diff = [r.rank for r in rows[1:] if len(steps[r.rank]) != len(first) or not (steps[r.rank].keys == first).all()]
    if diff:
        return None, 0, (f"ranks do not have the same steps (rank {rows[0].rank}: {len(first)} steps, differing ranks: "
                         f"{_ranks(diff)}): iterations are not compared step by step")
    shown = np.stack([steps[r.rank].walls[:limit] for r in rows], axis=1).tolist()  # one row of rank walls per step
    out = []
    for key, vals in zip(first[:limit].tolist(), shown):
        walls = list(zip((r.rank for r in rows), vals))
        lo, hi, mean = min(vals), max(vals), sum(vals) / len(vals)
        out.append(IterationImbalance(
            step=key, min_wall_ns=lo, max_wall_ns=hi, mean_wall_ns=round(mean, 1),
            imbalance_ratio=round((hi - lo) / mean, 4) if mean else None,
            slowest_rank=next(r for r, w in walls if w == hi) if hi > lo else None,
            fastest_rank=next(r for r, w in walls if w == lo) if hi > lo else None))
    return out, len(first), None


def _straggler(rows: list[RankRow], imb: dict[str, MetricImbalance], notes: list[str]) -> Straggler | None:
    if len(rows) < 2:
        notes.append("one rank: nothing to compare")
        return None
    step = imb["mean_step_ns"]
    lockstep = None
    if step.ranks_counted >= 2 and step.imbalance_ratio is not None and step.imbalance_ratio >= STEP_SPREAD_FOR_STRAGGLER:
        metric = "mean_step_ns"
    else:
        if step.ranks_counted >= 2 and step.imbalance_ratio is not None:
            lockstep = step.imbalance_ratio
        metric = "compute_ns" if (imb["compute_ns"].max or 0) > 0 else "busy_ns"
    m = imb[metric]
    if m.ranks_counted < 2 or m.max is None or m.max == m.min:
        notes.append(f"no straggler: the ranks are equal on {LABELS[metric]}" if m.ranks_counted >= 2
                     else f"no straggler: fewer than 2 ranks have a {LABELS[metric]}")
        return None
    by_rank = {r.rank: r for r in rows}
    rank = m.max_rank
    row = by_rank[rank]
    value, median = float(getattr(row, metric)), float(m.median)
    above = round(100.0 * (value - median) / median, 2) if median else None
    parts = []
    if lockstep is not None:
        parts.append(f"Mean step times agree within {100 * lockstep:.2f} % across ranks (as when collectives keep the "
                     "ranks in lockstep), so step time cannot single out the slow rank; it is found by GPU compute time instead.")
    elif metric != "mean_step_ns":
        parts.append(f"No step ranges on {'any' if step.ranks_counted == 0 else 'enough'} ranks: the straggler is the rank "
                     f"with the most {LABELS[metric]}.")
    rel = f"{above:.1f} % above" if above is not None else "above"
    parts.append(f"Rank {rank} {LABELS[metric]} {_fmt(value)} is {rel} the median of {m.ranks_counted} ranks ({_fmt(median)}).")
    if above is not None and above < 100 * STEP_SPREAD_FOR_STRAGGLER:
        parts.append(f"That is less than {100 * STEP_SPREAD_FOR_STRAGGLER:.0f} %: the ranks are close to balanced on this metric.")
    if metric == "mean_step_ns":
        c = imb["compute_ns"]
        if row.compute_ns is not None and c.median:
            d = 100.0 * (row.compute_ns - c.median) / c.median
            parts.append(f"Its compute time {_fmt(row.compute_ns)} is {abs(d):.1f} % {'above' if d >= 0 else 'below'} the median "
                         f"({_fmt(c.median)}){'' if d > 0 else ': the slow steps are not explained by more GPU compute (look at host time and idle)'}.")
    e = imb["exposed_comm_ns"]
    lowest = None
    if (imb["comm_ns"].max or 0) == 0:
        parts.append("No communication kernels matched, so waiting in collectives cannot be checked (extend comm_patterns "
                     "if the job uses custom collective kernels).")
    elif row.comm_ns == 0:
        lowest = False
        parts.append("It runs no communication kernels while other ranks do: check whether it takes part in the "
                     "collectives at all (a rank missing from a collective leaves the others waiting).")
    elif row.exposed_comm_ns is not None and e.ranks_counted >= 2:
        lowest = row.exposed_comm_ns == e.min and e.max > e.min
        if lowest:
            parts.append(f"Its exposed communication {_fmt(row.exposed_comm_ns)} is the lowest of the ranks (median "
                         f"{_fmt(e.median)}, highest rank {e.max_rank}: {_fmt(e.max)}), consistent with the other ranks "
                         "waiting for it in collectives.")
        elif e.max == e.min:
            parts.append(f"Exposed communication is equal on all ranks ({_fmt(e.min)}), so the collective wait pattern "
                         "neither confirms nor contradicts it.")
        else:
            parts.append(f"Its exposed communication {_fmt(row.exposed_comm_ns)} is not the lowest (rank {e.min_rank}: "
                         f"{_fmt(e.min)}), so the collective wait pattern does not confirm it as the straggler.")
    return Straggler(rank=rank, metric=metric, value=value, median=median, pct_above_median=above,
                     exposed_comm_lowest=lowest, evidence=" ".join(parts))


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:10]) + (", ..." if len(ranks) > 10 else "")


def _fmt(ns: float) -> str:
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3f} µs"
    return f"{ns:.0f} ns"
