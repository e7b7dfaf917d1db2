"""iterations: the repeated steps of a run (training/inference iterations), step by step, with warm-up
detection.

Step marker, in this order:
  1. the caller's `marker`: an exact range name, a name with its numbers written as <N>
     ('step_<N>', 'ProfilerStep#<N>'), or a glob pattern ('iter*');
  2. PyTorch's `ProfilerStep#N` annotations (one per prof.step()), even when only one step was captured;
  3. automatic choice among NVTX/rocTX/annotation ranges that repeat: ranges are grouped by
     (process, thread, domain, name with digit runs as <N>), so 'step_0', 'step_1' are one group; only
     outermost, non-zero-length instances count. Eligible groups repeat >= 2 times and receive >= 50 % of
     their process's launched GPU work time via the projection (see projection.py). Of those the
     shallowest (fewest enclosing ranges) wins, then the one with most instances, then most coverage.
     Without eligible groups the group with the highest coverage is taken (shallowest first when no
     projection is possible) and the choice says so. Every other repeating group is listed as an
     alternative.

The choice is step_choice.py's SQL (rank_summary applies the same statement to every rank of a job); this module
words it (reason, alternatives) and measures the steps.

Per step: host wall time (the range), GPU busy time of the work launched inside the step on its thread
(projection), and of all GPU work of the process executing inside the step's time window (clipped to it,
unlinked work included), GPU idle inside the window, kernel counts — per device.

Warm-up rule (step_choice.WARMUP_RULE, stated in the output): leading steps are warm-up while the step's wall
time exceeds WARMUP_FACTOR x the median wall time of the steps after it, with at least 2 steps after it; the
first step that fails the test ends the warm-up. Steady-state statistics exclude warm-up steps.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import duckdb
import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from . import exact
from .common import Window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .containment import temp_tables
from .marker_summary import ANNOTATE
from .projection import RANGE_KINDS_SQL, SHIFT, projection_absent_reason
from .requirements import left_out, require
from .stacked import run, stack
from .step_choice import MIN_COVERAGE, choice_sql, choice_tables, marker_params, warmup


class StepDevice(BaseModel):
    device_id: int
    projected_ops: int = Field(description="GPU ops launched inside the step on its thread, on this device")
    projected_kernels: int = Field(description="of projected_ops, kernels")
    projected_busy_ns: int = Field(description="union of the projected ops' intervals (not clipped: work may run past the step end), ns")
    window_kernels: int = Field(description="kernels of the process executing inside the step window on this device")
    window_busy_ns: int = Field(description="union of all GPU ops of the process on this device, clipped to the step window, ns")
    window_idle_ns: int = Field(description="wall_ns - window_busy_ns: time in the step window this device ran none of the process's work, ns")
    window_busy_pct_of_wall: float | None = Field(description="window_busy_ns / wall_ns, %")


class Step(BaseModel):
    index: int = Field(description="0-based position of the step in time order within its series (process, thread)")
    name: str = Field(description="the range's name")
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    wall_ns: int = Field(description="host duration of the step range, ns")
    warmup: bool = Field(description="classified as warm-up by the rule in the summary")
    projected_kernels: int | None = Field(description="kernels launched inside the step on its thread (all devices); null without projection")
    window_kernels: int = Field(description="kernels of the process executing inside the step window (all devices)")
    gpu_busy_projected_ns: int | None = Field(
        description="busy time of the GPU work launched inside the step (single-device series; else see devices), ns")
    gpu_busy_in_window_ns: int | None = Field(
        description="busy time of the process's GPU work inside the step window (single-device series; else see devices), ns")
    gpu_idle_in_window_ns: int | None = Field(description="wall_ns - gpu_busy_in_window_ns (single-device series), ns")
    devices: list[StepDevice]


class Extreme(BaseModel):
    index: int
    wall_ns: int


class Summary(BaseModel):
    pid: int
    tid: int
    steps: int
    wall_total_ns: int
    wall_mean_ns: float
    wall_median_ns: float
    wall_min_ns: int
    wall_max_ns: int
    wall_std_ns: float | None = Field(description="sample standard deviation (n-1), ns; null for one step")
    wall_cv: float | None = Field(description="coefficient of variation std/mean (unitless); null for one step")
    slowest: Extreme
    fastest: Extreme
    warmup_steps: list[int] = Field(description="indexes of the steps classified as warm-up")
    warmup_note: str = Field(description="the rule, or why it could not be applied")
    steady_steps: int = Field(description="steps after the warm-up")
    steady_mean_ns: float | None = None
    steady_median_ns: float | None = None
    steady_std_ns: float | None = None
    steady_cv: float | None = None
    mean_gpu_busy_in_window_pct_of_wall: float | None = Field(
        description="mean over steps of gpu_busy_in_window_ns / wall_ns, % (single-device series)")


class Candidate(BaseModel):
    pattern: str = Field(description="range name with digit runs as <N>")
    example: str = Field(description="one actual name of the group")
    domain: str
    pid: int
    tid: int
    instances: int = Field(description="outermost, non-zero-length ranges of the group")
    min_depth: int = Field(description="fewest enclosing ranges of an instance (0 = top level)")
    coverage_pct_of_gpu_work: float | None = Field(
        description="GPU work time launched inside the instances / all launched GPU work time of the process, %")


class Choice(BaseModel):
    how: str = Field(description="'caller' (marker parameter), 'ProfilerStep' or 'auto'")
    pattern: str
    domain: str
    reason: str


class IterationsResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | str | None]
    choice: Choice
    alternatives: list[Candidate] = Field(description="other repeating range groups (best first, at most 10)")
    projection: str = Field(description="how GPU work is attributed to a step, or why it cannot be")
    summaries: list[Summary] = Field(description="one per series (process, thread) holding steps")
    steps: list[Step]
    truncated: bool = Field(description="true when more steps exist than `limit` (summaries cover all)")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def iterations(
    trace: Trace,
    *,
    marker: str | None = None,
    pid: int | None = None,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    limit: int | None = 50,
) -> IterationsResult:
    """`limit` (1..1000) caps the listed steps for a reader; None lists them all. The summaries cover every step;
    a Step model is made for a listed step only (a run of 250,000 steps is columns, not objects). Analyses that place
    boundaries at the steps read them with chosen_steps."""
    require(trace, "iterations", "Steps are taken from repeating ranges. " + ANNOTATE)
    _, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = None if limit is None else max(1, min(int(limit), 1000))
    absent = projection_absent_reason(trace)
    choice, groups, steps_df, figures = _steps(trace, pid, marker, absent, window, start_ns, end_ns, figures=True, device=device)
    chosen = groups[groups["picked"]]
    steps, summaries = _assemble(steps_df, figures, absent is None, trace.count("kernels") + trace.count("memops") > 0, limit)
    alternatives = groups.drop(index=chosen.index, errors="ignore")
    alternatives = alternatives[alternatives["instances"] >= 2]
    alternatives = alternatives.assign(cov=alternatives["coverage"].fillna(-1.0)).sort_values(
        ["cov", "instances", "min_depth"], ascending=[False, False, True]).head(10)
    truncated = limit is not None and len(steps_df) > limit
    return IterationsResult(
        data_issues=data_issue_notes(trace, ("markers", "kernels", "memops")),
        trace=str(trace.path), window=window, filters={"marker": marker, "pid": pid, "device": device},
        choice=choice,
        alternatives=[Candidate(pattern=clip_name(r.pattern), example=clip_name(r.example), domain=r.domain, pid=int(r.pid),
                                tid=int(r.tid), instances=int(r.instances), min_depth=int(r.min_depth),
                                coverage_pct_of_gpu_work=None if pd.isna(r.coverage) else round(100 * float(r.coverage), 2))
                      for r in alternatives.itertuples()],
        projection=("GPU work belongs to a step when its launching API call lies inside the step range on the same thread "
                    "(nvtx_gpu_proj_trace); window figures take every GPU op of the process overlapping the step window, "
                    "clipped to it" if absent is None else f"projection absent: {absent}; window figures only"
                    + "".join(f". Left out: {g}" for g in left_out(trace, "iterations"))),
        summaries=summaries, steps=steps, truncated=truncated,
        hint=f"{len(steps_df) - limit} more steps than limit={limit}; raise limit or narrow the time window" if truncated else None,
    )


def chosen_steps(trace: Trace) -> tuple[Choice, pd.DataFrame]:
    """The steps `iterations` chooses with its default arguments, without their figures: one row per step with pid, tid,
    start_ns, end_ns, name, rid and index (0-based within its series), in (pid, tid, start) order. For the tools that
    place boundaries at steps (memory_timeline); raises ProfileError as iterations does."""
    require(trace, "iterations", "Steps are taken from repeating ranges. " + ANNOTATE)
    _, window = resolve_selection(trace, None, None, None, None)
    choice, _, steps_df, _ = _steps(trace, None, None, projection_absent_reason(trace), window, None, None)
    return choice, steps_df


@contextmanager
def chosen_step_tables(trace: Trace) -> Iterator[tuple[duckdb.DuckDBPyConnection, Choice, pd.DataFrame]]:
    """chosen_steps, and for the block the cursor holding the choice's temp tables (step_choice.choice_tables with
    detail): _step_rng, the ranges (a step's rid is its row), and _step_gop, the linked GPU ops keyed by their
    launching call, with device and times; empty without a projection. A tool that looks up the GPU work of the steps
    (phases) joins them instead of building both again."""
    require(trace, "iterations", "Steps are taken from repeating ranges. " + ANNOTATE)
    _, window = resolve_selection(trace, None, None, None, None)
    with _stepping(trace, None, None, projection_absent_reason(trace), window, None, None, detail=True) as (
            cur, choice, _, steps_df):
        yield cur, choice, steps_df


def refusal(trace: Trace) -> str | None:
    """Why iterations refuses this profile with its default arguments (None: it answers), for trace_info: the same
    rules without the GPU coverage of the range groups, which ranks them but does not decide whether any step exists
    (ProfilerStep ranges, else the best group repeating at least twice), and without the steps' figures."""
    try:
        require(trace, "iterations", "Steps are taken from repeating ranges. " + ANNOTATE)
        _, window = resolve_selection(trace, None, None, None, None)
        _steps(trace, None, None, "not needed to tell whether steps exist", window, None, None)
    except ProfileError as exc:
        return str(exc)
    return None


def _steps(trace: Trace, pid: int | None, marker: str | None, absent: str | None, window: Window, start_ns: int | None,
           end_ns: int | None, figures: bool = False, device: int | None = None
           ) -> tuple[Choice, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(choice, range groups, the chosen steps starting in [start_ns, end_ns) with their index in their series, and
    with `figures` their figures per device (_step_figures; on `device` only when given), else None)."""
    with _stepping(trace, pid, marker, absent, window, start_ns, end_ns, figures) as (cur, choice, groups, steps_df):
        return choice, groups, steps_df, _step_figures(cur, steps_df[["rid"]], device) if figures else None


@contextmanager
def _stepping(trace: Trace, pid: int | None, marker: str | None, absent: str | None, window: Window, start_ns: int | None,
              end_ns: int | None, detail: bool = False
              ) -> Iterator[tuple[duckdb.DuckDBPyConnection, Choice, pd.DataFrame, pd.DataFrame]]:
    """_steps' choice, groups and steps, with the cursor holding the choice's temp tables for the block (_choosing)."""
    with _choosing([trace], 0, pid, marker, absent, detail) as (cur, choice, groups, steps_df):
        steps_df = steps_df.sort_values(["pid", "tid", "start_ns", "rid"])
        if start_ns is not None:
            steps_df = steps_df[steps_df["start_ns"] >= start_ns]
        if end_ns is not None:
            steps_df = steps_df[steps_df["start_ns"] < end_ns]
        if steps_df.empty:
            raise ProfileError(f"no step of '{choice.pattern}' starts inside the time window [{window.start_ns}, {window.end_ns}) ns.")
        yield cur, choice, groups, steps_df.assign(index=steps_df.groupby(["pid", "tid"]).cumcount()).reset_index(drop=True)


def step_choice(traces: list[Trace], part: int, pid: int | None, marker: str | None,
                absent: str | None) -> tuple[Choice, pd.DataFrame]:
    """(choice, step ranges) of one scope: profile `part` of `traces` (one profile, or a job read through its stacked
    store), process `pid` (None: every process); `absent`: why the profile has no GPU projection (None: it has one).
    Raises ProfileError as iterations does when no range can be the step. The range groups' GPU work is figured only
    where the choice is automatic (step_choice.choice_tables' steps_only): no group is returned."""
    with _choosing(traces, part, pid, marker, absent, steps_only=True) as (_, choice, _, steps_df):
        return choice, steps_df


@contextmanager
def _choosing(traces: list[Trace], part: int, pid: int | None, marker: str | None, absent: str | None, detail: bool = False,
              steps_only: bool = False) -> Iterator[tuple[duckdb.DuckDBPyConnection, Choice, pd.DataFrame, pd.DataFrame]]:
    """step_choice's answer, and the cursor holding the choice's temp tables (step_choice.choice_tables; `detail`: its
    _step_gop with each op's device and times) for the block: the steps' figures reuse its ranges and launched ops.
    Two statements after the temp tables."""
    ranges = f"kind IN ({RANGE_KINDS_SQL}) AND pid IS NOT NULL AND tid IS NOT NULL"
    if pid is not None:
        have = [p for (p,) in run(traces, f"""SELECT DISTINCT pid FROM (
            {stack(traces, 'markers', 'pid', f'{ranges} AND end_ns > start_ns', {part})}) ORDER BY 1""")]
        if pid not in have:
            raise ProfileError(f"process {pid} has no annotation ranges; processes with ranges: {have}.")
    params = marker_params(traces, marker, {part})
    # two statements after the choice's inputs: the range groups (one row each), then the chosen step ranges
    gcols = ["pid", "tid", "domain", "pattern", "instances", "min_depth", "example", "coverage", "picked", "how", "best",
             "any_eligible"]
    scols = ["rid", "pid", "tid", "start_ns", "end_ns", "name", "domain", "pattern"]
    with choice_tables(traces, [(part, pid)], [part] if absent is None else [], detail, steps_only, bool(marker)) as cur:
        sql = choice_sql(bool(marker), "names" in params)
        found = cur.execute(sql + f"""
            SELECT list(({', '.join(f'g_.{c}' for c in gcols)}) ORDER BY g_.first_rid) FROM (
                SELECT g.*, p.pid IS NOT NULL AS picked, p.how, b.pid IS NOT NULL AS best, b.any_eligible FROM grp g
                LEFT JOIN pick p ON p.pid = g.pid AND p.tid = g.tid AND p.domain = g.domain AND p.pattern = g.pattern
                LEFT JOIN best b ON b.pid = g.pid AND b.tid = g.tid AND b.domain = g.domain AND b.pattern = g.pattern) g_""",
            params or None).fetchall()[0][0]
        groups = pd.DataFrame([tuple(x) for x in found or []], columns=gcols)
        groups["coverage"] = groups["coverage"].astype("float64")
        # the steps as columns: 250,000 of them as a list of tuples took 0.6 s to fetch
        cols = cur.execute(sql + f"SELECT {', '.join(scols)} FROM chosen ORDER BY pid, tid, start_ns, rid", params or None).fetchnumpy()
        steps_df = pd.DataFrame({c: v.filled(None) if isinstance(v, np.ma.MaskedArray) else v for c, v in cols.items()})
        choice = _named(groups, steps_df, marker, absent)
        yield cur, choice, groups, steps_df


def _named(groups: pd.DataFrame, steps_df: pd.DataFrame, marker: str | None, absent: str | None) -> Choice:
    """The choice as iterations states it; raises ProfileError where no range can be the step."""
    if marker:
        if steps_df.empty:
            top = groups.sort_values("instances", ascending=False)["pattern"].head(8).tolist()
            raise ProfileError(f"no annotation range matches marker={marker!r} (exact name, name with numbers as <N>, or "
                               f"glob such as 'step*'). Most repeated range names here: {top}.")
        pats = sorted(set(steps_df["pattern"]))
        choice = Choice(how="caller", pattern=pats[0] if len(pats) == 1 else marker,
                        domain=str(steps_df.sort_values("rid")["domain"].iloc[0]), reason=f"requested with marker={marker!r}")
    else:
        choice = _auto_choice(groups, absent)
    return choice


def _auto_choice(groups: pd.DataFrame, absent: str | None) -> Choice:
    """How step_choice.py chose the groups marked `picked` (one row per range group, `best`: the automatic choice)."""
    ps = groups[groups["picked"] & (groups["how"] == "ProfilerStep")]
    if not ps.empty:
        return Choice(how="ProfilerStep", pattern="ProfilerStep#<N>", domain=ps.iloc[0].domain,
                      reason="PyTorch profiler step annotations (one per prof.step()) mark the iterations")
    if not groups["best"].any():
        names = groups.sort_values("instances", ascending=False)["example"].head(8).tolist()
        raise ProfileError("no annotation range repeats, so no iteration marker can be chosen (ranges are grouped by name with "
                           f"numbers as <N>, per thread). Range names here: {names}. Pass marker=<name or glob> to use one "
                           "anyway, or annotate each step (nvtx.range_push(f'step_{i}'), prof.step()).")
    best = groups[groups["best"]].iloc[0]
    if absent is None:
        if best.any_eligible:
            why = (f"the shallowest range group repeating >= 2 times that receives >= {int(MIN_COVERAGE * 100)} % of its "
                   f"process's launched GPU work ({100 * best.coverage:.1f} %, {best.instances} instances, depth {best.min_depth})")
        else:
            why = (f"no repeating range group receives >= {int(MIN_COVERAGE * 100)} % of the launched GPU work; this one "
                   f"receives the most ({100 * (best.coverage or 0):.1f} %): treat the steps with care or pass marker=")
    else:
        why = f"the shallowest repeating range group (coverage unknown: {absent})"
    return Choice(how="auto", pattern=best.pattern, domain=best.domain, reason=why)


def _step_figures(cur: duckdb.DuckDBPyConnection, rids: pd.DataFrame, device: int | None) -> pd.DataFrame:
    """One row per (step rid, device) with any GPU op: win_busy (union of the process's GPU ops clipped to the step
    window, ns), win_ops, win_kernels, and prj_busy, prj_ops, prj_kernels of the projected ops (0 where none).
    `cur` holds the choice's temp tables (step_choice.choice_tables with detail): the steps are its ranges (_step_rng)
    and the projected ops its launched ops (_step_gop, empty without a projection), so neither is built twice. The
    two interval joins (overlap with the window, containment of the launching call) read temp tables, so they are
    IEJoins (containment.py), not joins of every step with every op; each union is a window per (rid, device), so a
    run of 250,000 steps costs no Python object per step. `rids`: the steps' range ids (column rid), scanned as a
    frame: as an IN list in the SQL text, 250,000 ids cost 0.8 s to plan in each statement naming them."""
    on_device = "TRUE" if device is None else f"device_id = {int(device)}"
    g_on_device = "TRUE" if device is None else f"g.device_id = {int(device)}"
    # every GPU op of the steps' processes (unlinked ones too), keyed per process so one join serves every process
    inputs = f"""
        WITH st AS (SELECT r.* FROM _step_rng r SEMI JOIN _it_rid USING (rid)),
        pk AS (SELECT pid, (row_number() OVER (ORDER BY pid))::HUGEINT AS k FROM (SELECT DISTINCT pid FROM st)),
        allop AS (SELECT TRUE AS kernel, device_id, start_ns, end_ns, pid FROM kernels WHERE pid IS NOT NULL AND {on_device}
                  UNION ALL SELECT FALSE, device_id, start_ns, end_ns, pid FROM memops WHERE pid IS NOT NULL AND {on_device}),
        ko AS (SELECT o.*, pk.k * {SHIFT} + o.start_ns AS ks, pk.k * {SHIFT} + o.end_ns AS ke FROM allop o JOIN pk USING (pid)),
        kst AS (SELECT st.rid, st.start_ns AS s, st.end_ns AS e, pk.k * {SHIFT} + st.start_ns AS ks, pk.k * {SHIFT} + st.end_ns AS ke
                FROM st JOIN pk USING (pid)),
        pst AS (SELECT rid, ks, ke FROM st WHERE NOT cross_thread)"""
    # ops (zero-length ones too) per (rid, device), and the union of the non-empty ones: one pass, the reach of an op
    # being the latest end of the earlier non-empty ops (stacked.reach_sql)
    stats = """
        SELECT rid, device_id, count(*) AS ops, count(*) FILTER (WHERE kernel) AS kernels,
               coalesce(sum(greatest(0, end_ns - greatest(start_ns, coalesce(reach_ns, start_ns))))
                        FILTER (WHERE end_ns > start_ns), 0)::BIGINT AS busy
        FROM (SELECT *, max(end_ns) FILTER (WHERE end_ns > start_ns) OVER (
                            PARTITION BY rid, device_id ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                        AS reach_ns
              FROM ({pairs}))
        GROUP BY rid, device_id"""
    win = """SELECT rid, kernel, device_id, cs AS start_ns, ce AS end_ns FROM (
                 SELECT s.rid, o.kernel, o.device_id, o.start_ns, o.end_ns, greatest(o.start_ns, s.s) AS cs, least(o.end_ns, s.e) AS ce
                 FROM _it_step s JOIN _it_op o ON o.ks < s.ke AND o.ke >= s.ks)
             WHERE ce > cs OR (start_ns = end_ns AND start_ns >= cs)"""
    prj = f"""SELECT s.rid, g.kernel, g.device_id, g.start_ns, g.end_ns
              FROM _it_pstep s JOIN _step_gop g ON s.ks <= g.ks AND g.ke <= s.ke WHERE {g_on_device}"""
    cur.register("_it_rid_frame", rids)
    try:
        cur.execute("CREATE OR REPLACE TEMP TABLE _it_rid AS SELECT rid::BIGINT AS rid FROM _it_rid_frame")
    finally:
        cur.unregister("_it_rid_frame")
    try:
        with temp_tables(cur, inputs, {"_it_step": "kst", "_it_op": "ko", "_it_pstep": "pst"}):
            parts = []
            # The (step, op) pairs are a table before the unions' window reads them: straight from the join, 250,000
            # steps' 2 M pairs ran out of a 64 MiB limit; a table spills.
            for key, pairs in (("win", win), ("prj", prj)):
                with temp_tables(cur, f"WITH pairs AS ({pairs})", {"_it_pairs": "pairs"}):
                    parts.append(cur.execute(stats.format(pairs="SELECT * FROM _it_pairs")).df().rename(
                        columns={"ops": f"{key}_ops", "kernels": f"{key}_kernels", "busy": f"{key}_busy"}))
    finally:
        cur.execute("DROP TABLE IF EXISTS temp.main._it_rid")
    per = parts[0].merge(parts[1], on=["rid", "device_id"], how="outer")
    return per.fillna({c: 0 for c in per.columns if c not in ("rid", "device_id")}).astype(
        {c: "int64" for c in per.columns if c not in ("rid", "device_id")})


def _mean_busy_pct(busy: np.ndarray, has: np.ndarray, walls: np.ndarray, single: bool, gpu: bool) -> float | None:
    """The mean over a series' steps of each step's GPU busy time in its window as a percentage of its wall time, each
    rounded as `pct` rounds it; None where a step has no such figure (a series on several devices, a profile without
    GPU data, a step of zero wall time)."""
    if not single or not walls.size or not walls.all() or not (gpu or has.all()):
        return None
    rounded = exact.pcts(np.where(has, busy, 0), walls)
    return round(math.fsum(rounded.tolist()) / walls.size, 2)


def _assemble(steps_df: pd.DataFrame, per: pd.DataFrame, projected: bool, gpu: bool, limit: int | None
              ) -> tuple[list[Step], list[Summary]]:
    """The first `limit` steps (None: all) as models, and every series' summary, from the steps (one row each, in
    series order) and their figures per device (_step_figures). `gpu`: the profile recorded GPU work at all; without it
    a step's GPU busy time is unknown, not 0. Per-step figures are columns: a Step model is made only for a listed step."""
    per = per.merge(steps_df[["rid", "pid", "tid"]], on="rid")
    # a series on one device (or none) states its steps' busy and idle times; one on several leaves them to `devices`
    ndev = per.groupby(["pid", "tid"])["device_id"].nunique()
    st = steps_df.merge(ndev.rename("ndev").reset_index(), on=["pid", "tid"], how="left")
    single = st["ndev"].fillna(0).to_numpy() <= 1
    first = per.groupby("rid")["win_busy"].first()  # a single-device series' step has one device row at most
    st = st.merge(first, left_on="rid", right_index=True, how="left")
    wall = (st["end_ns"] - st["start_ns"]).to_numpy()
    has = st["win_busy"].notna().to_numpy()
    busy = st["win_busy"].fillna(0).to_numpy().astype("int64")
    steps: list[Step] = []
    warm_of: dict[tuple, set] = {}
    summaries = []
    # Per series, numpy over its steps (exact.py: the statistics module's figures); Python objects only for the
    # warm-up rule, which looks at the first few steps.
    for (p, tid), idx in st.groupby(["pid", "tid"], sort=False).indices.items():
        walls = wall[idx]
        warm, note = warmup(walls.tolist())
        warm_of[(p, tid)] = set(warm)
        steady = walls[len(warm):]
        mean = exact.fmean(walls)
        std = exact.stdev(walls) if len(walls) > 1 else None
        smean = exact.fmean(steady) if len(steady) else None
        sstd = exact.stdev(steady) if len(steady) > 1 else None
        slow, fast = int(np.argmax(walls)), int(np.argmin(walls))  # the first of equal walls
        summaries.append(Summary(
            pid=int(p), tid=int(tid), steps=len(walls), wall_total_ns=exact.total(walls), wall_mean_ns=round(mean, 1),
            wall_median_ns=float(exact.median(walls)), wall_min_ns=int(walls[fast]), wall_max_ns=int(walls[slow]),
            wall_std_ns=None if std is None else round(std, 1), wall_cv=None if std is None or not mean else round(std / mean, 4),
            slowest=Extreme(index=slow, wall_ns=int(walls[slow])), fastest=Extreme(index=fast, wall_ns=int(walls[fast])),
            warmup_steps=warm, warmup_note=note, steady_steps=len(steady),
            steady_mean_ns=None if smean is None else round(smean, 1),
            steady_median_ns=float(exact.median(steady)) if len(steady) else None,
            steady_std_ns=None if sstd is None else round(sstd, 1),
            steady_cv=None if sstd is None or not smean else round(sstd / smean, 4),
            mean_gpu_busy_in_window_pct_of_wall=_mean_busy_pct(busy[idx], has[idx], walls, bool(single[idx[0]]), gpu)))
    shown = st if limit is None else st.head(limit)
    devs = per[per["rid"].isin(shown["rid"])].sort_values(["rid", "device_id"])
    wall_of = dict(zip(shown["rid"].tolist(), (shown["end_ns"] - shown["start_ns"]).tolist()))
    devices_of: dict[int, list[StepDevice]] = {}
    for d in devs.itertuples():  # the listed steps' rows only
        w, span = int(d.win_busy), int(wall_of[d.rid])
        devices_of.setdefault(int(d.rid), []).append(StepDevice(
            device_id=int(d.device_id), projected_ops=int(d.prj_ops), projected_kernels=int(d.prj_kernels),
            projected_busy_ns=int(d.prj_busy), window_kernels=int(d.win_kernels), window_busy_ns=w, window_idle_ns=span - w,
            window_busy_pct_of_wall=pct(w, span)))
    for i, r in enumerate(shown.itertuples()):
        devices = devices_of.get(int(r.rid), [])
        one = bool(single[i])
        only = devices[0] if one and devices else None
        w = int(wall[i])
        steps.append(Step(
            index=int(r.index), name=clip_name(r.name), pid=int(r.pid), tid=int(r.tid), start_ns=int(r.start_ns),
            end_ns=int(r.end_ns), wall_ns=w, warmup=int(r.index) in warm_of[(r.pid, r.tid)],
            projected_kernels=sum(x.projected_kernels for x in devices) if projected else None,
            window_kernels=sum(x.window_kernels for x in devices),
            gpu_busy_projected_ns=(only.projected_busy_ns if only else 0 if one else None) if projected else None,
            gpu_busy_in_window_ns=only.window_busy_ns if only else (0 if one and gpu else None),
            gpu_idle_in_window_ns=only.window_idle_ns if only else (w if one and gpu else None),
            devices=devices))
    return steps, summaries
