"""regression: the CI gate — did this profile get slower than a saved baseline?

`save_baseline(trace)` records what a later check compares against (a Baseline, written as JSON by
`gpuscope baseline save`): the per-step figures of the iterations tool (ProfilerStep#N, or a caller
`marker`, chosen by the same rules), the kernel groups of top_kernels (group_by='short_name', every
group, no filter) with their per-step totals, and the per-device busy / idle time of gpu_timeline.
Every figure is an integer number of ns on the profile's own timeline.

`check_regression(trace, baseline, fail_on)` compares a candidate profile with it, one metric per
`fail_on` spec (grammar in FAIL_ON_GRAMMAR), and states its decision rule (DECISION_RULE):

    a metric regresses when the median of its per-step values rose by more than the threshold AND the
    one-sided Mann–Whitney U test (candidate > baseline, scipy.stats.mannwhitneyu) gives p < ALPHA,
    over the steady steps of each side (warm-up steps left out by the iterations tool's rule).
    With fewer than MIN_STEPS steady steps on a side the median rule alone decides, and the metric says so.

So one slow step cannot fail a build: it moves a median by at most one rank and is no shift of the
distribution. Per-step values: step_time = the step range's wall time; gpu_busy / gpu_idle = the
process's GPU work inside the step window (iterations' window figures, summed over devices);
kernel:<glob> = summed duration of the matching kernels (short name, fnmatch, case-sensitive) of the
step's process that start inside the step window, summed over devices. Without iterations on either
side, gpu_busy / gpu_idle / kernel compare whole-profile totals (one sample: threshold rule only);
step_time then cannot be compared. The overall verdict: 'regression' (exit 1) when any metric
regresses, else 'cannot_compare' (exit 2) when any metric cannot be compared, else 'pass' (exit 0).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import statistics
import unicodedata
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from gpuscope import __version__

from ..model.detect import regular_file
from ..model.errors import ProfileError
from ..model.store import content_key
from ..model.trace import Trace
from .common import clip_name, ToolResult
from .gpu_timeline import gpu_timeline
from .iterations import iterations

SCHEMA = "gpuscope-baseline"
SCHEMA_VERSION = 1
ALPHA = 0.05
MIN_STEPS = 5  # below this, the exact one-sided Mann–Whitney p cannot reach 0.05 robustly (3 vs 3: 0.05 at best)
METRICS = ("step_time", "gpu_busy", "gpu_idle", "kernel")
FAIL_ON_GRAMMAR = ("METRIC[:PATTERN]:+N% — METRIC is step_time, gpu_busy, gpu_idle or kernel; kernel needs PATTERN, a glob "
                   "over kernel short names (fnmatch, case-sensitive: 'gemm*', '*nccl*'); N is the allowed rise in %, "
                   "e.g. step_time:+5%, kernel:gemm*:+10%")
DECISION_RULE = (f"a metric regresses when the median of its per-step values rose by more than its threshold AND the one-sided "
                 f"Mann-Whitney U test (candidate > baseline) gives p < {ALPHA}, over the steady steps of each side (warm-up "
                 f"steps left out by the iterations rule); with fewer than {MIN_STEPS} steady steps on a side the median rule "
                 "alone decides; without iterations on either side, gpu_busy / gpu_idle / kernel compare profile totals "
                 "(threshold rule only). Exit 1 when any metric regresses, else 2 when any cannot be compared, else 0")
DEFINITIONS = ("step wall_ns: host duration of the step range; gpu_busy_ns / gpu_idle_ns: union of the process's GPU ops "
               "clipped to the step window / wall_ns minus it, summed over devices (iterations window figures); kernel "
               "per_step_ns: summed duration of the group's kernels of the step's process starting inside the step "
               "window; devices: gpu_timeline per device (total = first to last GPU op, busy = union of every GPU op, "
               "idle = total - busy). All ns.")


# ------------------------------------------------------------------------------------------ baseline


class ProfileIdentity(BaseModel):
    path: str = Field(description="the profile file as given")
    format: str = Field(description="nsys / rocpd / rpd / kineto")
    size_bytes: int
    content_key: str = Field(description="gpuscope's content identity (size, mtime and a hash of the content): equal keys "
                                         "mean the same file")


class BaselineStep(BaseModel):
    index: int = Field(description="0-based position in time order")
    name: str = Field(description="the step range's name")
    start_ns: int
    wall_ns: int = Field(description="host duration of the step range, ns")
    warmup: bool = Field(description="warm-up by the iterations rule (left out of comparisons)")
    gpu_busy_ns: int | None = Field(description="union of the process's GPU ops clipped to the step window, summed over "
                                                "devices, ns; null when the profile has no GPU ops")
    gpu_idle_ns: int | None = Field(description="wall_ns - busy per device, summed over devices, ns")


class BaselineIterations(BaseModel):
    how: str = Field(description="'caller' (marker), 'ProfilerStep' or 'auto', as the iterations tool chose")
    pattern: str = Field(description="step range name with numbers as <N>")
    marker: str | None = Field(description="the caller's marker, reused by check unless it passes its own")
    pid: int
    tid: int
    warmup_rule: str
    steps: list[BaselineStep]


class BaselineKernelGroup(BaseModel):
    device_id: int
    short_name: str = Field(description="kernel base name (top_kernels group_by='short_name'); whole, not clipped")
    count: int = Field(description="executions in the whole profile")
    total_ns: int = Field(description="summed duration in the whole profile, ns")
    per_step_ns: list[int] | None = Field(description="summed duration per step (aligned with iterations.steps), of the "
                                                      "kernels of the step's process starting inside the step, ns; null "
                                                      "without iterations")


class BaselineDevice(BaseModel):
    device_id: int | None
    pid: int | None = Field(description="process owning the work when processes share a device (gpu_timeline)")
    total_ns: int = Field(description="first to last GPU op, ns")
    busy_ns: int = Field(description="union of every GPU op, ns")
    idle_ns: int = Field(description="total_ns - busy_ns, ns")


class Baseline(BaseModel):
    schema_name: Literal["gpuscope-baseline"] = Field(SCHEMA, description="what this file is")
    schema_version: int = Field(description=f"layout of this file ({SCHEMA_VERSION}); check refuses another")
    gpuscope_version: str = Field(description="gpuscope that measured it; check refuses another unless allowed")
    profile: ProfileIdentity
    definitions: str
    iterations: BaselineIterations | None = Field(description="the steps; null when the profile has none")
    iterations_absent: str | None = Field(None, description="why there are no steps")
    kernel_groups: list[BaselineKernelGroup] = Field(description="every kernel group per device, by total_ns")
    devices: list[BaselineDevice] = Field(description="per device (and process) busy / idle, gpu_timeline")
    data_issues: list[str] = Field(default_factory=list, description="source rows the profile's reader skipped or repaired")


def _identity(trace: Trace) -> ProfileIdentity:
    try:
        key, size = content_key(trace.path), trace.path.stat().st_size
    except OSError:
        key, size = "", 0
    return ProfileIdentity(path=str(trace.path), format=trace.format, size_bytes=size, content_key=key)


def _steps(trace: Trace, marker: str | None, pid: int | None) -> tuple[BaselineIterations | None, str | None, bool]:
    """(steps, why absent, whether the absence is the caller's to fix: a marker/pid that matched nothing, several series)."""
    try:
        res = iterations(trace, marker=marker, pid=pid, limit=None)
    except ProfileError as exc:
        return None, str(exc), marker is not None or pid is not None
    if len(res.summaries) > 1:
        series = ", ".join(f"pid {s.pid} tid {s.tid} ({s.steps} steps)" for s in res.summaries[:8])
        return None, (f"steps of '{res.choice.pattern}' come from {len(res.summaries)} series ({series}); pass pid= (CLI --pid) "
                      "to compare one process, or one profile per rank"), True
    gpu = trace.count("kernels") + trace.count("memops") > 0
    steps = [BaselineStep(index=s.index, name=s.name, start_ns=s.start_ns, wall_ns=s.wall_ns, warmup=s.warmup,
                          gpu_busy_ns=sum(d.window_busy_ns for d in s.devices) if gpu else None,
                          gpu_idle_ns=(sum(d.window_idle_ns for d in s.devices) if s.devices else s.wall_ns) if gpu else None)
             for s in res.steps]
    sm = res.summaries[0]
    return BaselineIterations(how=res.choice.how, pattern=res.choice.pattern, marker=marker, pid=sm.pid, tid=sm.tid,
                              warmup_rule=sm.warmup_note, steps=steps), None, False


MAX_STEP_FIGURES = 2_000_000  # steps x (kernel groups + 1) a baseline holds: ~20 MB of JSON (MAX_BASELINE_BYTES: 64 MiB)


def _kernel_groups(trace: Trace, it: BaselineIterations | None) -> list[BaselineKernelGroup]:
    if trace.count("kernels") == 0:
        return []
    rows = trace.sql("""SELECT device_id, coalesce(short_name, name) AS g, count(*), sum(dur_ns)::BIGINT FROM kernels
                        GROUP BY ALL ORDER BY 4 DESC, 1, 2""")
    per: dict[tuple, list[int]] = {}
    if it is not None:
        n = len(it.steps)
        if n * (len(rows) + 1) > MAX_STEP_FIGURES:
            raise ProfileError(
                f"too many per-step figures to record or compare: {n:,} steps of '{clip_name(it.pattern, 60)}' x "
                f"{len(rows):,} kernel groups (a baseline holds at most {MAX_STEP_FIGURES:,}). Pass marker= (CLI --marker) "
                "naming a coarser step range (an iteration rather than a layer), or capture fewer steps.")
        # The step windows go in as a frame scanned into a temp table, and the series' one process filters the kernels
        # first: the join is then an IEJoin on the two time conditions (containment.py), not a hash join on the process
        # comparing every step with every kernel (250,000 steps did not finish in minutes).
        cur = trace.con.cursor()
        try:
            cur.register("_rg_frame", {"i": np.arange(n, dtype=np.int64),
                                       "s": np.array([s.start_ns for s in it.steps], dtype=np.int64),
                                       "e": np.array([s.start_ns + s.wall_ns for s in it.steps], dtype=np.int64)})
            cur.execute("CREATE OR REPLACE TEMP TABLE _rg_steps AS SELECT * FROM _rg_frame")
            cur.unregister("_rg_frame")
            found = cur.execute("""
                SELECT k.device_id, coalesce(k.short_name, k.name), st.i, sum(k.dur_ns)::BIGINT
                FROM (SELECT device_id, short_name, name, start_ns, dur_ns FROM kernels WHERE pid = ?) k
                JOIN _rg_steps st ON k.start_ns >= st.s AND k.start_ns < st.e GROUP BY ALL""", [int(it.pid)]).fetchall()
        finally:
            cur.execute("DROP TABLE IF EXISTS temp.main._rg_steps")
            cur.close()
        for dev, g, i, total in found:
            per.setdefault((dev, g), [0] * n)[i] = int(total)
    return [BaselineKernelGroup(device_id=int(d), short_name=str(g), count=int(c), total_ns=int(t),
                                per_step_ns=None if it is None else per.get((d, g), [0] * len(it.steps)))
            for d, g, c, t in rows]


def _devices(trace: Trace) -> list[BaselineDevice]:
    if trace.count("kernels") + trace.count("memops") == 0:
        return []
    tl = gpu_timeline(trace, limit=1)
    return [BaselineDevice(device_id=t.device_id, pid=t.pid, total_ns=t.total_ns, busy_ns=t.busy_ns, idle_ns=t.idle_ns)
            for t in tl.timelines]


def _measure(trace: Trace, marker: str | None, pid: int | None) -> tuple[Baseline, bool]:
    from .common import data_issue_notes

    it, absent, callers = _steps(trace, marker, pid)
    base = Baseline(schema_version=SCHEMA_VERSION, gpuscope_version=__version__, profile=_identity(trace),
                    definitions=DEFINITIONS, iterations=it, iterations_absent=absent,
                    kernel_groups=_kernel_groups(trace, it), devices=_devices(trace),
                    data_issues=data_issue_notes(trace, ("markers", "kernels", "memops")))
    return base, callers


def save_baseline(trace: Trace, *, marker: str | None = None, pid: int | None = None) -> Baseline:
    """What `check_regression` compares against. A profile without steps still gives a baseline (kernel and device
    totals; iterations_absent says why), unless the caller asked for a marker or process that is not there."""
    base, callers = _measure(trace, marker, pid)
    if base.iterations is None and callers:
        raise ProfileError(f"no baseline written: {base.iterations_absent}")
    if base.iterations is None and not base.kernel_groups and not base.devices:
        raise ProfileError(f"nothing to record: the profile has no steps ({base.iterations_absent}) and no GPU work. "
                           "Profile with GPU activity (nsys --trace=cuda, ProfilerActivity.CUDA, rocprofv3 --kernel-trace).")
    return base


MAX_BASELINE_BYTES = 64 * 2**20  # a baseline is kB: per-step figures of a few kernel groups


def load_baseline(path: str | Path) -> Baseline:
    """A saved baseline, or a ProfileError saying why it cannot be used and what to do."""
    redo = "Re-create it with `gpuscope baseline save PROFILE -o FILE`."
    try:
        p = regular_file(path)  # a FIFO or device named as the baseline would block the read for ever
    except ProfileError as exc:
        raise ProfileError(f"baseline: {exc} {redo}") from None
    if p.stat().st_size > MAX_BASELINE_BYTES:
        raise ProfileError(f"{clip_name(str(p), 200)} is {p.stat().st_size:,} bytes, far more than a baseline holds "
                           f"(they are kB); it is not a gpuscope baseline. {redo}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{clip_name(str(p), 200)} is not a gpuscope baseline (not UTF-8 JSON text; a profile "
                           f"goes in `trace`, the saved baseline file in `baseline`). {redo}") from None
    except OSError as exc:
        raise ProfileError(f"cannot read the baseline {clip_name(str(p), 200)}: {exc.strerror or exc}. {redo}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"the baseline {clip_name(str(p), 200)} is not JSON ({exc.msg}, line {exc.lineno}). {redo}") from None
    if not isinstance(raw, dict) or raw.get("schema_name") != SCHEMA:
        raise ProfileError(f"{clip_name(str(p), 200)} is not a gpuscope baseline (no schema_name '{SCHEMA}'). {redo}")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"the baseline {clip_name(str(p), 200)} has schema_version {clip_name(repr(raw.get('schema_version')), 40)}; "
                           f"this gpuscope ({__version__}) reads schema_version {SCHEMA_VERSION} only. {redo}")
    try:
        base = Baseline.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise ProfileError(f"the baseline {clip_name(str(p), 200)} is damaged ({exc.error_count()} problems; first: "
                           f"{clip_name(where, 80)}: {clip_name(first.get('msg', ''), 120)}). {redo}") from None
    n = len(base.iterations.steps) if base.iterations else None
    if (n == 0 or any((g.per_step_ns is None) != (n is None) or (n is not None and len(g.per_step_ns) != n)
                      for g in base.kernel_groups)):
        raise ProfileError(f"the baseline {clip_name(str(p), 200)} is damaged (kernel per_step_ns do not match its "
                           f"{n} steps). {redo}")
    return base


# ------------------------------------------------------------------------------------------ check


class Threshold(BaseModel):
    spec: str = Field(description="as given, e.g. 'kernel:gemm*:+10%'")
    metric: Literal["step_time", "gpu_busy", "gpu_idle", "kernel"]
    pattern: str | None = Field(description="kernel: glob over kernel short names")
    max_rise_pct: float = Field(description="allowed rise of the median, % of the baseline median")


_PCT = re.compile(r"^\+?(\d+(?:\.\d+)?)%$")


def parse_fail_on(spec: str) -> Threshold:
    """'step_time:+5%', 'kernel:gemm*:+10%' (the pattern may itself hold ':'), per FAIL_ON_GRAMMAR."""
    bad = f"cannot read --fail-on {clip_name(spec, 120)!r}: expected {FAIL_ON_GRAMMAR}."
    if ":" not in spec:
        raise ProfileError(bad)
    head, _, limit = spec.rpartition(":")
    metric, _, pattern = head.partition(":")
    m = _PCT.match(limit.strip())
    if limit.strip().startswith("-"):
        raise ProfileError(f"--fail-on {clip_name(spec, 120)!r}: the threshold is an allowed rise (+N%); a fall never fails the "
                           f"check. Expected {FAIL_ON_GRAMMAR}.")
    if m is None or metric not in METRICS:
        raise ProfileError(bad)
    if metric == "kernel" and not pattern:
        raise ProfileError(f"--fail-on {clip_name(spec, 120)!r}: kernel needs a pattern, e.g. kernel:gemm*:+10%.")
    if metric != "kernel" and pattern:
        raise ProfileError(f"--fail-on {clip_name(spec, 120)!r}: only kernel takes a pattern. Expected {FAIL_ON_GRAMMAR}.")
    return Threshold(spec=spec, metric=metric, pattern=pattern or None, max_rise_pct=float(m.group(1)))


class MetricCheck(BaseModel):
    spec: str = Field(description="the --fail-on spec")
    metric: str
    pattern: str | None = None
    max_rise_pct: float = Field(description="threshold: allowed rise, % of the baseline figure")
    samples: Literal["per_step", "profile_total"] | None = Field(
        description="per_step: one value per steady step; profile_total: one whole-profile total per side")
    baseline_n: int | None = Field(description="baseline values compared (steady steps, or 1 for a total)")
    candidate_n: int | None
    baseline_ns: float | None = Field(description="baseline median per steady step (or profile total), ns")
    candidate_ns: float | None = Field(description="candidate median per steady step (or profile total), ns")
    change_pct: float | None = Field(description="(candidate_ns - baseline_ns) / baseline_ns, %; null when baseline_ns is 0")
    p_value: float | None = Field(description="one-sided Mann-Whitney U p (candidate > baseline); null when not tested")
    test: str | None = Field(description="the rule that decided this metric")
    verdict: Literal["pass", "regression", "cannot_compare"]
    reason: str = Field(description="why this verdict, or what to do when it cannot be compared")
    matched_groups: list[str] = Field(default_factory=list, description="kernel: the groups the pattern matched (either side)")


class CheckResult(ToolResult):
    baseline_file: str | None = Field(description="the baseline JSON file")
    baseline_profile: ProfileIdentity
    candidate_profile: ProfileIdentity
    steps: str = Field(description="which steps were compared on each side")
    decision_rule: str
    verdict: Literal["pass", "regression", "cannot_compare"]
    exit_code: int = Field(description="0 pass, 1 regression, 2 cannot compare")
    metrics: list[MetricCheck]
    markdown: str = Field(description="the summary as a markdown PR comment (profile text escaped)")
    notes: list[str] = Field(default_factory=list)


def _steady(it: BaselineIterations) -> list[int]:
    return [i for i, s in enumerate(it.steps) if not s.warmup]


def _median(values: list[int]) -> float:
    return float(statistics.median(values))


def _decide(th: Threshold, base: list[int], cand: list[int], per_step: bool) -> MetricCheck:
    if not base or not cand:
        return _cannot(th, f"no steady step on the {'baseline' if not base else 'candidate'} side to compare")
    bm, cm = _median(base), _median(cand)
    change = None if bm == 0 else round(100.0 * (cm - bm) / bm, 2)
    p = test = None
    common = dict(spec=th.spec, metric=th.metric, pattern=th.pattern, max_rise_pct=th.max_rise_pct,
                  samples="per_step" if per_step else "profile_total", baseline_n=len(base), candidate_n=len(cand),
                  baseline_ns=bm, candidate_ns=cm, change_pct=change)
    what = "median per steady step" if per_step else "profile total"
    if bm == 0:
        regressed = cm > 0
        test = "baseline figure is 0 ns: any candidate time counts as a regression"
        reason = (f"{what} is 0 ns in the baseline and {cm:,.1f} ns in the candidate (new work)" if regressed
                  else f"{what} is 0 ns on both sides")
        return MetricCheck(**common, p_value=None, test=test, verdict="regression" if regressed else "pass", reason=reason)
    rose = change > th.max_rise_pct
    if not per_step:
        test = "threshold on the profile total (one value per side: no noise test)"
        regressed = rose
    elif len(base) >= MIN_STEPS and len(cand) >= MIN_STEPS:
        from scipy.stats import mannwhitneyu

        p = float(mannwhitneyu(cand, base, alternative="greater").pvalue)
        p = 1.0 if math.isnan(p) else float(f"{p:.4g}")  # nan: every value equal on both sides, no evidence of a shift
        test = f"median rise > {th.max_rise_pct:g} % and one-sided Mann-Whitney p < {ALPHA} ({len(base)} vs {len(cand)} steps)"
        regressed = rose and p < ALPHA
    else:
        test = (f"median rise > {th.max_rise_pct:g} % only: too few steady steps for the Mann-Whitney test "
                f"({len(base)} vs {len(cand)}; needs >= {MIN_STEPS} on each side)")
        regressed = rose
    if regressed:
        reason = f"{what} rose {change:+.2f} % (> +{th.max_rise_pct:g} %)" + (f", p = {p:.2g} < {ALPHA}" if p is not None else "")
    elif rose and p is not None:
        reason = (f"{what} rose {change:+.2f} % but p = {p:.2g} >= {ALPHA}: not a shift of the distribution "
                  "(a few noisy steps)")
    else:
        reason = f"{what} changed {change:+.2f} % (allowed +{th.max_rise_pct:g} %)"
    return MetricCheck(**common, p_value=p, test=test, verdict="regression" if regressed else "pass", reason=reason)


def _cannot(th: Threshold, reason: str, matched: list[str] | None = None) -> MetricCheck:
    return MetricCheck(spec=th.spec, metric=th.metric, pattern=th.pattern, max_rise_pct=th.max_rise_pct, samples=None,
                       baseline_n=None, candidate_n=None, baseline_ns=None, candidate_ns=None, change_pct=None, p_value=None,
                       test=None, verdict="cannot_compare", reason=reason, matched_groups=matched or [])


RECORD_STEPS = ("record steps (torch.profiler with prof.step() per iteration, or an NVTX/rocTX range per step), or pass "
                "--marker NAME (MCP: marker=) to name the step range")


def _absent(side: str, b: Baseline) -> str:
    why = (b.iterations_absent or "no steps").split(". ")[0]
    return f"the {side} has no iterations ({clip_name(why, 300)}); {RECORD_STEPS}"


def _metric(th: Threshold, base: Baseline, cand: Baseline) -> MetricCheck:
    bi, ci = base.iterations, cand.iterations
    if bi is None or ci is None:
        side = "baseline" if bi is None else "candidate"
        if th.metric == "step_time" or (bi is None) != (ci is None):
            return _cannot(th, f"{th.metric} needs steps on both sides and the {side} has none (see notes)")
    per_step = bi is not None
    bs, cs = (_steady(bi), _steady(ci)) if per_step else ([], [])
    if th.metric == "step_time":
        return _decide(th, [bi.steps[i].wall_ns for i in bs], [ci.steps[i].wall_ns for i in cs], True)
    if th.metric in ("gpu_busy", "gpu_idle"):
        field = "gpu_busy_ns" if th.metric == "gpu_busy" else "gpu_idle_ns"
        if per_step:
            bv, cv = [getattr(bi.steps[i], field) for i in bs], [getattr(ci.steps[i], field) for i in cs]
            if any(v is None for v in bv + cv):
                side = "baseline" if any(v is None for v in bv) else "candidate"
                return _cannot(th, f"the {side} profile has no GPU ops: {th.metric} needs kernels or copies "
                                   "(nsys --trace=cuda, ProfilerActivity.CUDA, rocprofv3 --kernel-trace)")
            return _decide(th, bv, cv, True)
        if not base.devices or not cand.devices:
            side = "baseline" if not base.devices else "candidate"
            return _cannot(th, f"the {side} profile has no GPU ops: {th.metric} needs kernels or copies")
        key = "busy_ns" if th.metric == "gpu_busy" else "idle_ns"
        return _decide(th, [sum(getattr(d, key) for d in base.devices)], [sum(getattr(d, key) for d in cand.devices)], False)
    # kernel:<glob>
    pat = th.pattern or "*"
    bg = [g for g in base.kernel_groups if fnmatch.fnmatchcase(g.short_name, pat)]
    cg = [g for g in cand.kernel_groups if fnmatch.fnmatchcase(g.short_name, pat)]
    matched = sorted({clip_name(g.short_name) for g in bg + cg})
    if not bg and not cg:
        top = list(dict.fromkeys(clip_name(g.short_name, 60) for g in base.kernel_groups))[:8]
        return _cannot(th, f"no kernel short name matches {clip_name(pat, 80)!r} in either profile (glob, case-sensitive). "
                           f"Largest groups in the baseline: {top}")
    if per_step:
        def per(groups: list[BaselineKernelGroup], idx: list[int]) -> list[int]:
            return [sum((g.per_step_ns or [0] * (i + 1))[i] for g in groups) for i in idx]

        out = _decide(th, per(bg, bs), per(cg, cs), True)
    else:
        out = _decide(th, [sum(g.total_ns for g in bg)], [sum(g.total_ns for g in cg)], False)
    out.matched_groups = matched[:20]
    return out


def check_regression(trace: Trace, baseline: Baseline, fail_on: list[str], *, marker: str | None = None,
                     pid: int | None = None, baseline_file: str | None = None,
                     allow_version_mismatch: bool = False) -> CheckResult:
    """Compare `trace` (the candidate) with a saved baseline, one metric per fail_on spec (FAIL_ON_GRAMMAR)."""
    thresholds = [parse_fail_on(s) for s in (fail_on or [])]
    if not thresholds:
        raise ProfileError(f"give at least one --fail-on threshold ({FAIL_ON_GRAMMAR}).")
    notes: list[str] = []
    if baseline.gpuscope_version != __version__:
        msg = (f"the baseline was measured by gpuscope {baseline.gpuscope_version}, this is {__version__}: its definitions "
               "may differ. Re-save the baseline with this version")
        if not allow_version_mismatch:
            raise ProfileError(msg + ", or allow the comparison (CLI --allow-version-mismatch).")
        notes.append(msg + "; compared anyway (allowed).")
    use_marker = marker if marker is not None else (baseline.iterations.marker if baseline.iterations else None)
    cand, _ = _measure(trace, use_marker, pid)
    if baseline.profile.content_key and baseline.profile.content_key == cand.profile.content_key:
        notes.append("the candidate is the baseline's own profile file (same content key)")
    metrics = [_metric(th, baseline, cand) for th in thresholds]
    for side, b in (("baseline", baseline), ("candidate", cand)):
        if b.iterations is None and any(m.verdict == "cannot_compare" and side in m.reason for m in metrics):
            notes.append(_absent(side, b))
    verdict = ("regression" if any(m.verdict == "regression" for m in metrics)
               else "cannot_compare" if any(m.verdict == "cannot_compare" for m in metrics) else "pass")
    steps = _steps_line(baseline, cand)
    result = CheckResult(baseline_file=baseline_file, baseline_profile=baseline.profile, candidate_profile=cand.profile,
                         steps=steps, decision_rule=DECISION_RULE, verdict=verdict,
                         exit_code={"pass": 0, "regression": 1, "cannot_compare": 2}[verdict], metrics=metrics,
                         markdown="", notes=notes + [f"baseline: {x}" for x in baseline.data_issues]
                         + [f"candidate: {x}" for x in cand.data_issues])
    result.markdown = markdown(result)
    return result


def _steps_line(base: Baseline, cand: Baseline) -> str:
    def side(b: Baseline) -> str:
        if b.iterations is None:
            return "no steps"
        it = b.iterations
        warm = sum(s.warmup for s in it.steps)
        return f"{len(it.steps) - warm} steady steps of '{clip_name(it.pattern, 60)}' ({warm} warm-up left out)"
    return f"baseline: {side(base)}; candidate: {side(cand)}"


# ------------------------------------------------------------------------------------------ markdown


def _md(text: str) -> str:
    """Profile or user text in a markdown table cell: hidden characters escaped, no cell or code breaks."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _HIDDEN_CATEGORIES else c for c in text
                   ).replace("|", "\\|").replace("`", "'")


def _ns(v: float | None) -> str:
    if v is None:
        return "—"
    text = f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    return f"{text} ns ({v / 1e6:,.3f} ms)"


_HIDDEN_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co"}  # line breaks, controls, bidi, zero-width: never raw in a cell
VERDICT_WORDS = {"pass": "pass", "regression": "**REGRESSION**", "cannot_compare": "cannot compare"}


def markdown(r: CheckResult) -> str:
    head = {"pass": "PASS", "regression": "FAIL: regression", "cannot_compare": "CANNOT COMPARE"}[r.verdict]
    n_bad = sum(m.verdict == r.verdict for m in r.metrics)
    lines = [f"### gpuscope check: {head}" + (f" ({n_bad} of {len(r.metrics)} metrics)" if r.verdict != "pass" else ""), "",
             f"Baseline `{_md(clip_name(r.baseline_profile.path, 200))}` vs candidate `{_md(clip_name(r.candidate_profile.path, 200))}`; "
             f"{_md(r.steps)}.", "",
             "| metric | baseline | candidate | change | threshold | p-value | verdict |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for m in r.metrics:
        what = {"per_step": "median/step", "profile_total": "total"}.get(m.samples or "", "")
        name = _md(m.spec.rpartition(":")[0]) + (f" ({what})" if what else "")
        change = "—" if m.change_pct is None else f"{m.change_pct:+.2f} %"
        p = "—" if m.p_value is None else f"{m.p_value:.2g}"
        lines.append(f"| {name} | {_ns(m.baseline_ns)} | {_ns(m.candidate_ns)} | {change} | +{m.max_rise_pct:g} % | {p} | "
                     f"{VERDICT_WORDS[m.verdict]} |")
    lines.append("")
    for m in r.metrics:
        groups = f" Matched kernel groups: {', '.join(_md(g) for g in m.matched_groups)}." if m.matched_groups else ""
        lines.append(f"- {_md(m.spec)}: {_md(m.reason)}." + (f" Rule: {_md(m.test)}." if m.test else "") + groups)
    lines += ["", f"Decision rule: {DECISION_RULE}."]
    lines += [f"Note: {_md(n)}" for n in r.notes]
    return "\n".join(lines) + "\n"
