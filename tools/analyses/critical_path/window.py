"""The window a critical path is taken over: a caller's time window, a step of the iterations tool, or the capture."""

from __future__ import annotations

import statistics

from ...model.errors import ProfileError
from ...model.trace import Trace
from ..common import capture_window, resolve_selection
from .result import IterationChoice


def choose_window(trace: Trace, step, marker, pid, start_ns, end_ns):
    """(ws, we, main thread or None, pid or None, IterationChoice or None, note, window source)."""
    if start_ns is not None or end_ns is not None:
        if step is not None or marker is not None:
            raise ProfileError("give either a step (step=, marker=) or a time window (start_ns/end_ns), not both.")
        _, w = resolve_selection(trace, None, None, start_ns, end_ns)
        return w.start_ns, w.end_ns, None, pid, None, "the caller's time window", w.source
    from ..iterations import iterations

    try:
        it = iterations(trace, marker=marker, pid=pid, limit=None)
    except ProfileError as exc:
        if step is not None or marker is not None:
            raise
        w = capture_window(trace)
        return (w.start_ns, w.end_ns, None, pid, None,
                f"no iteration steps ({str(exc).split('. ')[0]}); the whole capture span is analysed: pass start_ns/end_ns "
                "for one step", w.source)
    s0 = it.summaries[0]
    series = [s for s in it.steps if (s.pid, s.tid) == (s0.pid, s0.tid)]
    if step is not None:
        if not 0 <= step < len(series):
            raise ProfileError(f"step={step} does not exist: the series '{it.choice.pattern}' (process {s0.pid}, thread "
                               f"{s0.tid}) has steps 0..{len(series) - 1}.")
        chosen, how = series[step], f"caller (step={step})"
    else:
        steady = [s for s in series if not s.warmup] or series
        ranked = sorted(steady, key=lambda s: (s.wall_ns, s.index))
        chosen = ranked[(len(ranked) - 1) // 2]
        how = (f"the median-length steady step ({len(steady)} steady of {len(series)}; warm-up "
               f"{s0.warmup_steps or 'none'}; median wall {statistics.median([s.wall_ns for s in steady]):.0f} ns)")
    choice = IterationChoice(index=chosen.index, name=chosen.name, pid=chosen.pid, tid=chosen.tid, start_ns=chosen.start_ns,
                             end_ns=chosen.end_ns, wall_ns=chosen.wall_ns, steps=len(series), how=how)
    note = (f"step {chosen.index} of '{it.choice.pattern}' ({it.choice.how}: {it.choice.reason}); GPU work launched in "
            "the step is followed past the step's end")
    return chosen.start_ns, chosen.end_ns, chosen.tid, chosen.pid, choice, note, f"iteration step {chosen.index}"
