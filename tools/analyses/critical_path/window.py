"""The window a critical path is taken over: a caller's time window, a step of the iterations tool, or the capture;
for every rank of a job at once (a fixed number of statements over the job's stacked store, however many ranks)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...model.errors import ProfileError
from ...model.trace import Trace
from .. import exact
from ..common import capture_window, clip_name, resolve_selection
from ..iterations import step_choice
from ..marker_summary import ANNOTATE
from ..projection import projection_absent_reason
from ..requirements import require
from ..step_choice import scope_steps, warmup
from .result import IterationChoice

Scope = tuple[int, "int | None"]  # (position of the profile in the job, process or None for every process)
Span = tuple[int, int, "int | None", "int | None"]  # (ws, we, main thread or None, pid or None)
SERIES = ("start_ns", "end_ns", "name", "pid", "tid")  # a series of steps, one row each in time order


def choose_windows(traces: list[Trace], scopes: list[Scope], step, marker, start_ns, end_ns):
    """([Span per scope], IterationChoice or None, note, window source) of the first scope. The first scope takes
    `step` (without it: its median-length steady step); every other scope the step of the same index, or its own
    median-length steady step when the first has no steps. `traces` is one profile or a job (read through its stacked
    store: no rank's own store is opened)."""
    if start_ns is not None or end_ns is not None:
        if step is not None or marker is not None:
            raise ProfileError("give either a step (step=, marker=) or a time window (start_ns/end_ns), not both.")
        spans, source = [], None
        for part, pid in scopes:
            _, w = resolve_selection(traces[part], None, None, start_ns, end_ns)
            spans.append((w.start_ns, w.end_ns, None, pid))
            source = source or w.source
        return spans, None, "the caller's time window", source
    first, choice, note, source = _one(traces, *scopes[0], step, marker)
    at = step if choice is None else choice.index
    return [first] + _others(traces, scopes[1:], at, marker), choice, note, source


def _one(traces: list[Trace], part: int, pid, step, marker) -> tuple[Span, IterationChoice | None, str, str]:
    """One scope's window, choice, note and source: the iterations tool's steps of the scope (step_choice), or the
    capture when it has none and neither `step` nor `marker` asks for one."""
    trace = traces[part]
    try:
        require(trace, "iterations", "Steps are taken from repeating ranges. " + ANNOTATE)
        _, cap = resolve_selection(trace, None, None, None, None)
        it, steps = step_choice(traces, part, pid, marker, projection_absent_reason(trace))
        if steps.empty:
            raise ProfileError(f"no step of '{it.pattern}' starts inside the time window [{cap.start_ns}, {cap.end_ns}) ns.")
    except ProfileError as exc:
        if step is not None or marker is not None:
            raise
        w = capture_window(trace)
        return ((w.start_ns, w.end_ns, None, pid), None,
                f"no iteration steps ({str(exc).split('. ')[0]}); the whole capture span is analysed: pass start_ns/end_ns "
                "for one step", w.source)
    steps = steps.sort_values(["pid", "tid", "start_ns", "rid"])
    s0 = steps.iloc[0]
    series = steps.loc[(steps["pid"] == s0["pid"]) & (steps["tid"] == s0["tid"]), list(SERIES)].reset_index(drop=True)
    if step is not None and not 0 <= step < len(series):
        raise ProfileError(f"step={step} does not exist: the series '{it.pattern}' (process {int(s0['pid'])}, thread "
                           f"{int(s0['tid'])}) has steps 0..{len(series) - 1}.")
    choice = _pick(series, step)
    note = (f"step {choice.index} of '{it.pattern}' ({it.how}: {it.reason}); GPU work launched in "
            "the step is followed past the step's end")
    return (choice.start_ns, choice.end_ns, choice.tid, choice.pid), choice, note, f"iteration step {choice.index}"


def _pick(series: pd.DataFrame, step) -> IterationChoice:
    """Step `step` of a series (columns SERIES, in time order), else its median-length steady step: the iterations
    tool's warm-up rule leaves out the leading warm-up steps. Over arrays: a series may hold 250,000 steps."""
    walls = (series["end_ns"] - series["start_ns"]).to_numpy(dtype=np.int64)
    if step is not None:
        index, how = step, f"caller (step={step})"
    else:
        warm, _ = warmup(walls.tolist())
        steady = np.arange(len(walls))[len(warm):] if len(warm) < len(walls) else np.arange(len(walls))  # warm-up leads
        ranked = steady[np.argsort(walls[steady], kind="stable")]  # by (wall, index)
        index = int(ranked[(len(ranked) - 1) // 2])
        how = (f"the median-length steady step ({len(steady)} steady of {len(series)}; warm-up "
               f"{warm or 'none'}; median wall {exact.median(walls[steady]):.0f} ns)")
    s, e, name, pid, tid = series.iloc[index][list(SERIES)]
    return IterationChoice(index=index, name=clip_name(name), pid=int(pid), tid=int(tid), start_ns=int(s), end_ns=int(e),
                           wall_ns=int(e) - int(s), steps=len(series), how=how)


def _others(traces: list[Trace], scopes: list[Scope], at, marker) -> list[Span]:
    """The windows of the other scopes of a job, from one step choice (step_choice.scope_steps) over all of them (and one
    for the range names a glob marker matches). A scope without the step asked for goes through _one, which raises
    the error its own choice gives."""
    if not scopes:
        return []
    series: dict[Scope, pd.DataFrame] = {}
    for key, steps in scope_steps(traces, scopes, marker).items():
        first = steps.iloc[0]  # the first series (process, thread) of the scope
        series[key] = steps.loc[(steps["pid"] == first["pid"]) & (steps["tid"] == first["tid"]), list(SERIES)].reset_index(drop=True)
    spans = []
    for part, pid in scopes:
        mine = series.get((part, pid), pd.DataFrame(columns=list(SERIES)))
        if len(mine) and (at is None or 0 <= at < len(mine)):
            c = _pick(mine, at)
            spans.append((c.start_ns, c.end_ns, c.tid, c.pid))
        elif not len(mine) and at is None and marker is None:  # no steps: the capture, as _one takes it
            w = capture_window(traces[part])
            spans.append((w.start_ns, w.end_ns, None, pid))
        else:
            spans.append(_one(traces, part, pid, at, marker)[0])
    return spans
