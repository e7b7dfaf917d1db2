"""Shared pieces of the analyses: selection filters, interval-union SQL, result conventions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.quality import native_table_of, read_from
from ..model.trace import Trace

NAME_CHARS = 160  # full kernel names can run to thousands of characters; sql_query has them whole


def clip_name(name: str | None, limit: int = NAME_CHARS) -> str | None:
    if name is None or len(name) <= limit:
        return name
    return name[: limit - 1] + "…"


# Layout version of every tool's result. Within a version, row keys and their meaning stay as they are: fields may be
# added, never renamed or removed. A tool whose layout changes bumps its own default below (`gpuscope schema TOOL`).
SCHEMA_VERSION = 1


class ToolResult(BaseModel):
    """Base of every tool's result."""

    schema_version: int = Field(SCHEMA_VERSION, description="layout version of this result (gpuscope schema TOOL prints its "
                                "JSON Schema); row keys stay stable within a version")


def pct(part: float | int | None, whole: float | int | None, digits: int = 2) -> float | None:
    """Percentage, or None when the denominator is absent or zero (never a silent 0)."""
    if part is None or not whole:
        return None
    return round(100.0 * float(part) / float(whole), digits)


def sig(x: float | None, digits: int = 6) -> float | None:
    """`x` to `digits` significant digits, or None when it is absent or not finite (never NaN or Infinity in JSON)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


class Window(BaseModel):
    """The time window an analysis covered."""

    start_ns: int = Field(description="window start, ns on the profile timeline")
    end_ns: int = Field(description="window end, ns on the profile timeline")
    span_ns: int = Field(description="end_ns - start_ns, ns")
    source: str = Field(description="what the window is: the capture span or the caller's window")


@dataclass
class Selection:
    """Filters common to the tools: device, stream, time window ([start_ns, end_ns))."""

    device: int | None = None
    stream: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None

    def where(self, alias: str = "", *, time_mode: str = "start") -> tuple[str, list[Any]]:
        """SQL predicate + params. time_mode 'start': rows starting in the window; 'overlap': rows overlapping it."""
        p = f"{alias}." if alias else ""
        clauses, params = ["TRUE"], []
        if self.device is not None:
            clauses.append(f"{p}device_id = ?")
            params.append(self.device)
        if self.stream is not None:
            clauses.append(f"{p}stream_id = ?")
            params.append(self.stream)
        if self.start_ns is not None:
            clauses.append(f"{p}start_ns >= ?" if time_mode == "start" else f"{p}end_ns > ?")
            params.append(self.start_ns)
        if self.end_ns is not None:
            clauses.append(f"{p}start_ns < ?")
            params.append(self.end_ns)
        return " AND ".join(clauses), params


# The model tables op-level tools read: operators link host calls, markers and GPU work.
ALL_TABLES = ("kernels", "memops", "api_calls", "markers", "cpu_ops")
_ROWS = {"kernels": ("kernel", "kernels"), "memops": ("memory copy/set", "memory copies/sets"),
         "api_calls": ("API call", "API calls"), "markers": ("marker", "markers"), "cpu_ops": ("CPU op", "CPU ops")}
DATA_ISSUES_DOC = ("source rows behind these figures that the reader left out ('skipped') or corrected ('repaired'), "
                   "as 'N <rows> <action>: <reason>'; the figures count only the rows kept. Rows of the profile's own "
                   "tables the figures' rows were read from (their names included) are named as native.\"<table>\". "
                   "Empty when none; trace_info lists them for the whole profile")


def data_issues_field() -> Any:
    """The `data_issues` field every tool result carries (one definition, one meaning)."""
    return Field(default_factory=list, description=DATA_ISSUES_DOC)


def data_issues(trace: Trace) -> list[tuple[str, str, int, str]]:
    """The profile's data_issues rows (table, action, rows, reason): per table, skipped before
    repaired, most rows first."""
    return trace.memo(("data_issues",), lambda: [(t, a, int(n), r) for t, a, n, r in trace.sql(
        "SELECT table_name, action, rows, reason FROM data_issues ORDER BY table_name, action DESC, rows DESC, reason")])


def data_issue_notes(trace: Trace, tables: Iterable[str]) -> list[str]:
    """'N kernels skipped: ts is not a finite number' for each data_issues row of the model tables a
    tool's figures read, in the order `tables` names them; then the rows the reader repaired in the profile's own
    tables those are read from ('1 native."StringIds" row repaired: "value": text that is not valid UTF-8...': a
    kernel's name shown with U+FFFD)."""
    tables, rows = list(tables), data_issues(trace)
    source = read_from(trace.format, tables)
    return ([issue_note(t, action, n, reason) for table in tables for t, action, n, reason in rows if t == table]
            + [issue_note(t, action, n, reason) for t, action, n, reason in rows
               if (native := native_table_of(t)) is not None and source(native)])


def issue_note(table: str, action: str, rows: int, reason: str) -> str:
    """One data_issues row as 'N kernels skipped: <reason>'."""
    one, many = _ROWS.get(table, (f"{table} row", f"{table} rows"))
    return f"{rows} {one if rows == 1 else many} {action}: {reason}"


def skipped_note(trace: Trace, tables: Iterable[str]) -> str:
    """For an error that says a table has nothing to analyse: the rows the reader left out of it, so that
    'no kernels' is never the answer when the profile's kernels were all unreadable."""
    notes = [n for n in data_issue_notes(trace, tables) if " skipped: " in n]
    return f" The reader left rows out: {'; '.join(notes)} (trace_info lists every data issue)." if notes else ""


def capture_window(trace: Trace) -> Window:
    start, end = trace.meta_int("capture_start_ns"), trace.meta_int("capture_end_ns")
    if start is None or end is None:
        raise ProfileError(f"{trace.path.name} holds no timed events: there is no capture span to analyse. Check that the "
                           "profiler was running while the workload ran, and re-capture; list_tables and sql_query "
                           "still show what the file holds.")
    return Window(start_ns=start, end_ns=end, span_ns=end - start, source=trace.meta.get("capture_span_source", "capture span"))


def resolve_selection(trace: Trace, device: int | None, stream: int | None, start_ns: int | None, end_ns: int | None) -> tuple[Selection, Window]:
    """Validate filters against the profile; return them with the window they describe."""
    cap = capture_window(trace)
    if device is not None:
        known = [r[0] for r in trace.sql(
            "SELECT device_id FROM (SELECT device_id FROM kernels UNION SELECT device_id FROM memops UNION SELECT device_id FROM devices) ORDER BY 1")]
        if device not in known:
            raise ProfileError(f"device {device} does not exist in this profile; devices with data: {known}. trace_info lists them.")
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        raise ProfileError(f"empty time window: end_ns ({end_ns}) must be greater than start_ns ({start_ns}).")
    lo = start_ns if start_ns is not None else cap.start_ns
    hi = end_ns if end_ns is not None else cap.end_ns
    if start_ns is not None or end_ns is not None:
        if hi <= cap.start_ns or lo >= cap.end_ns:
            raise ProfileError(
                f"time window [{lo}, {hi}) ns lies outside the capture [{cap.start_ns}, {cap.end_ns}) ns. "
                "Times are ns on the profile's own timeline, as trace_info reports them."
            )
        window = Window(start_ns=lo, end_ns=hi, span_ns=hi - lo, source="caller's time window")
    else:
        window = cap
    return Selection(device, stream, start_ns, end_ns), window


def gpu_activity_sql(include_memops: bool, where: str) -> str:
    """Kernel (and memcpy/memset) intervals with a kind label; `where` filters each part."""
    parts = [f"SELECT device_id, stream_id, start_ns, end_ns, 'kernel' AS kind, short_name AS name, pid, tid FROM kernels WHERE {where}"]
    if include_memops:
        parts.append(
            "SELECT device_id, stream_id, start_ns, end_ns, op AS kind, "
            f"CASE WHEN op = 'set' THEN 'memset' ELSE 'memcpy ' || kind END AS name, pid, tid FROM memops WHERE {where}"
        )
    return " UNION ALL ".join(parts)


@dataclass(frozen=True)
class GpuTimeSplit:
    """TraceLens/HTA split of one GPU timeline's time, from the union lengths of its computation (COMP),
    communication (COMM) and copies (MEMCPY) (gpu_timeline.split_measures). All figures ns."""

    first_ns: int              # start of the first op of any class
    last_ns: int               # end of the last op of any class
    span_ns: int               # last_ns - first_ns
    busy_ns: int               # |ALL| = computation_ns + exposed_comm_ns + exposed_memcpy_ns
    computation_ns: int        # |COMP|
    comm_ns: int               # |COMM|
    memcpy_ns: int             # |MEMCPY|
    exposed_comm_ns: int       # |COMM - COMP|
    exposed_memcpy_ns: int     # |MEMCPY - COMP - COMM|
    comm_comp_overlap_ns: int  # |COMM ∩ COMP|
    whole_graph_ns: int = 0    # |GRAPH|: whole-graph replays (contents not traced), a part of computation_ns


def split_gpu_time(comp: int, comm: int, memcpy: int, comp_comm: int, every: int, first: int, last: int,
                   whole_graph: int = 0) -> GpuTimeSplit:
    """The one definition of busy / exposed / overlap figures shared by gpu_timeline, comm_summary and
    rank_summary, so the tools cannot drift apart: from the union lengths |COMP|, |COMM|, |MEMCPY|, |COMP ∪ COMM|
    and |ALL|, and ALL's first start and last end, by |A - B| = |A ∪ B| - |B| and |A ∩ B| = |A| + |B| - |A ∪ B|."""
    split = GpuTimeSplit(
        first_ns=first, last_ns=last, span_ns=last - first, busy_ns=every, computation_ns=comp, comm_ns=comm,
        memcpy_ns=memcpy, exposed_comm_ns=comp_comm - comp, exposed_memcpy_ns=every - comp_comm,
        comm_comp_overlap_ns=comm + comp - comp_comm, whole_graph_ns=whole_graph,
    )
    assert split.computation_ns + split.exposed_comm_ns + split.exposed_memcpy_ns == split.busy_ns
    return split


WHOLE_GRAPH_ADVICE = ("re-capture with `nsys profile --trace=cuda --cuda-graph-trace=node` to trace the kernels inside the "
                      "graphs and classify them")


class WholeGraphTime(BaseModel):
    """Whole-graph replays in a tool's selection (Nsight --cuda-graph-trace=graph: kernels rows with whole_graph = true):
    their contents are not in the export, so no tool can tell computation from communication inside them."""

    replays: int = Field(description="whole-graph replays (kernels rows with whole_graph = true) in the selection")
    time_ns: int = Field(description="their summed duration in the selection, ns (a sum over replays, not a union)")
    counted_as: str = Field(description="where the tool counts that time")
    note: str = Field(description="what that means and how to see inside the graphs")


def whole_graph_time(trace: Trace, where: str, params: list, counted_as: str, lo: int | None = None,
                     hi: int | None = None) -> WholeGraphTime | None:
    """The whole-graph replays among the kernels matching `where` (a kernels predicate, with `params`), their time
    clipped to [lo, hi) when given, or None when there are none (every profile but an Nsight graph-level trace)."""
    end = "end_ns" if hi is None else f"least(end_ns, {int(hi)})"
    start = "start_ns" if lo is None else f"greatest(start_ns, {int(lo)})"
    n, total = trace.sql(f"""SELECT count(*), coalesce(sum(greatest({end} - {start}, 0)), 0)::BIGINT FROM kernels
                             WHERE whole_graph AND ({where})""", params)[0]
    if not n:
        return None
    return WholeGraphTime(replays=int(n), time_ns=int(total), counted_as=counted_as, note=(
        f"{int(n)} CUDA graph replays ({int(total)} ns) were traced whole: the kernels inside, which may include "
        f"communication (NCCL), are not in the export; they are counted as {counted_as}. {WHOLE_GRAPH_ADVICE[0].upper()}{WHOLE_GRAPH_ADVICE[1:]}."))


def whole_graph_job_note(replays: int, time_ns: int, counted_as: str) -> str | None:
    """whole_graph_time's note for a job tool, from the replays and their summed ns over every rank (job tools count
    them inside one of their fixed statements: stacked.whole_graph_cols), or None without any."""
    if not replays:
        return None
    return (f"{int(replays)} CUDA graph replays ({int(time_ns)} ns, summed over ranks) were traced whole: the kernels "
            f"inside, which may include communication (NCCL), are not in the export; they are counted as {counted_as}. "
            f"{WHOLE_GRAPH_ADVICE[0].upper()}{WHOLE_GRAPH_ADVICE[1:]}.")


# A user's "name contains" text is literal: '_' and '%' in kernel names are characters, not LIKE wildcards.
CONTAINS_SQL = "ILIKE ? ESCAPE '!'"


def contains_pattern(text: str) -> str:
    """Parameter for `<column> {CONTAINS_SQL}`: case-insensitive substring match of `text`, taken literally."""
    return "%" + text.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
