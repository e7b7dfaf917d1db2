"""A TraceLens-style Excel workbook from the structured tool outputs (openpyxl).

Every data sheet is one tool result written row for row: the columns are the result's field names
(units in the names: *_ns integer nanoseconds, *_ms milliseconds, *_pct / pct_* percent as plain numbers,
*_mb = 1e6 bytes), nulls are empty cells, lists and dicts are JSON text. Sheets:

    info                     what the profile is, the selection, what each sheet holds, units
    gpu_timeline             gpu_timeline: one row per device (+ 'all_devices' merge row when present)
    gpu_timeline_streams     gpu_timeline.streams: per-stream idle breakdown (HTA)
    ops_summary              ops_summary(group_by='name')
    ops_summary_by_category  ops_summary(group_by='category')
    ops_unique_args          ops_summary(group_by='shapes')      (PyTorch profiles; else a note)
    kernel_summary           ops_summary(group_by='kernels')
    unified_perf_summary     perf_summary (all categories)        (when perf_summary can answer; else a note)
    <category>               perf_summary rows of one category, one sheet per category present

A note sheet has one column `note` saying why the data is absent; write_report counts it as 0 rows.
The workbook goes to exactly `path` (the user's choice): nothing is written next to the profile, the
file is written to a temporary name in the same folder and renamed, and the profile itself is never
overwritten.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from openpyxl import Workbook
from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE as _ILLEGAL
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter
from pydantic import BaseModel

from ..model.errors import ProfileError
from ..model.trace import Trace
from .files import atomic_output

_EXACT_INT = 2**53 - 1
ROW_LIMIT = 500  # the analyses' own maximum; truncation is stated in the info sheet
_BAD_SHEET_CHARS = re.compile(r"[\[\]:*?/\\]")
_FIXED = ("info", "gpu_timeline", "gpu_timeline_streams", "ops_summary", "ops_summary_by_category", "ops_unique_args",
          "kernel_summary", "unified_perf_summary")

UNITS = ("*_ns: integer nanoseconds on the profile timeline (durations or timestamps); *_ms: milliseconds; "
         "*_pct, pct_* and cumulative_pct: percent as plain numbers (12.5 = 12.5 %); MB = 1e6 bytes, GB = 1e9 bytes; "
         "GFLOPs per call; TFLOP/s and TB/s = 1e12 per second; empty cell = null (not applicable / unknown); "
         "lists and dicts are JSON text; integers beyond 2^53 (e.g. epoch-based ns timestamps) are written as "
         "text so that no digit is lost (Excel numbers are doubles).")


class _Sheet:
    def __init__(self, name: str, description: str, columns: list[str] | None = None,
                 rows: list[dict] | None = None, note: str | None = None):
        self.name, self.description, self.columns, self.rows, self.note = name, description, columns or [], rows or [], note


def _cell(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, BaseModel):
        v = v.model_dump()
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    if isinstance(v, bool):
        return v
    if isinstance(v, float) and v != v:  # NaN
        return None
    if isinstance(v, int) and abs(v) > _EXACT_INT:
        return str(v)  # Excel numbers are doubles: beyond 2^53 digits would be lost (epoch-based ns timestamps)
    return v


def cell_value(v: Any) -> Any:
    """How a tool-output value is written to a cell (for tests and callers comparing sheets to results)."""
    return _cell(v)


def _columns(rows: list[BaseModel], model: type[BaseModel] | None = None) -> list[str]:
    if rows:
        return list(type(rows[0]).model_fields)
    return list(model.model_fields) if model is not None else []


def _dump(rows: Iterable[BaseModel]) -> list[dict]:
    return [r.model_dump() for r in rows]


def sheet_name(category: str, taken: Iterable[str]) -> str:
    """Excel-safe sheet name (≤ 31 chars, no []:*?/\\) for a category, not clashing with the fixed sheets."""
    base = _BAD_SHEET_CHARS.sub("_", category or "other").strip("'") or "other"
    name = base[:31]
    taken_l = {t.lower() for t in taken} | {f.lower() for f in _FIXED}
    i = 2
    while name.lower() in taken_l:
        suffix = f"_{i}"
        name = base[: 31 - len(suffix)] + suffix
        i += 1
    return name


# -- building the sheets -------------------------------------------------------------------------------

def _timeline_sheets(trace: Trace, include_unlinked: bool) -> tuple[list[_Sheet], list[tuple[str, Any]]]:
    from ..analyses import gpu_timeline
    from ..analyses.gpu_timeline import StreamIdle, Timeline

    desc = ("gpu_timeline: per device, computation / exposed communication / exposed memcpy / idle time of the "
            "GPU span (TraceLens gpu_timeline; pct_of_total = share of total_ns = last_ns - first_ns)")
    sdesc = "gpu_timeline.streams: per stream idle time split into host wait / kernel wait / other (HTA), most idle first"
    try:
        res = gpu_timeline(trace, include_unlinked=include_unlinked, limit=ROW_LIMIT)
    except ProfileError as exc:
        return [_Sheet("gpu_timeline", desc, note=str(exc)), _Sheet("gpu_timeline_streams", sdesc, note=str(exc))], []
    tl = [("device", t) for t in res.timelines] + ([("all_devices", res.all_devices)] if res.all_devices else [])
    cols = ["scope", *Timeline.model_fields]
    rows = [{"scope": scope, **t.model_dump()} for scope, t in tl]
    facts = [("gpu_timeline.comm_patterns", res.comm_patterns), ("gpu_timeline.definitions", res.definitions),
             ("gpu_timeline.kernel_wait_threshold_ns", res.kernel_wait_threshold_ns)]
    if res.truncated:
        facts.append(("gpu_timeline_streams truncated", f"only the {ROW_LIMIT} most idle streams are listed"))
    if res.whole_graph:
        facts.append(("gpu_timeline.whole_graph", res.whole_graph.note))
    return [_Sheet("gpu_timeline", desc, cols, rows),
            _Sheet("gpu_timeline_streams", sdesc, _columns(res.streams, StreamIdle), _dump(res.streams))], facts


def _ops_sheets(trace: Trace, include_unlinked: bool) -> tuple[list[_Sheet], list[tuple[str, Any]], str | None]:
    from ..analyses import ops_summary
    from ..analyses.ops_summary import CategoryRow, KernelRow, OpRow, ShapeRow

    specs = [("ops_summary", "name", OpRow,
              "ops_summary: GPU time per launching operator (Kineto: PyTorch cpu_op; Nsight/rocpd: innermost NVTX/rocTX "
              "range, else kernel base name), sorted by direct time; TraceLens ops_summary (times here in ns and ms)"),
             ("ops_summary_by_category", "category", CategoryRow,
              "ops_summary(group_by='category'): direct GPU time per op category; TraceLens ops_summary_by_category"),
             ("ops_unique_args", "shapes", ShapeRow,
              "ops_summary(group_by='shapes'): per operator and input shapes/dtypes, direct time statistics; "
              "TraceLens ops_unique_args"),
             ("kernel_summary", "kernels", KernelRow,
              "ops_summary(group_by='kernels'): per parent op category, parent op, kernel name and stream; "
              "TraceLens kernel_summary")]
    sheets, facts, attribution = [], [], None
    for name, group_by, model, desc in specs:
        if group_by == "shapes" and attribution not in (None, "cpu_op"):
            sheets.append(_Sheet(name, desc, note=(
                f"not available for this profile: its GPU work is attributed to {attribution}s, not PyTorch operators, "
                "so there are no input shapes or dtypes (a PyTorch profiler trace with record_shapes=True has them).")))
            continue
        try:
            res = ops_summary(trace, group_by=group_by, include_unlinked=include_unlinked, limit=ROW_LIMIT)
        except ProfileError as exc:
            sheets.append(_Sheet(name, desc, note=str(exc)))
            continue
        attribution = res.attribution
        if group_by == "name":
            facts += [("ops_summary.attribution", res.attribution),
                      *[(f"ops_summary.totals.{k}", v) for k, v in res.totals.model_dump().items()]]
        if res.truncated:
            facts.append((f"{name} truncated", f"{res.remainder_rows} rows beyond {ROW_LIMIT} left out "
                                               f"({res.remainder_direct_ns} ns); use the ops_summary tool with filters"))
        sheets.append(_Sheet(name, desc, _columns(res.rows, model), _dump(res.rows)))
    return sheets, facts, attribution


def _perf_sheets(trace: Trace, attribution: str | None) -> tuple[list[_Sheet], list[tuple[str, Any]]]:
    desc = ("perf_summary: per operator signature (name + shapes/dtypes), kernel time, GFLOPs and bytes per call, "
            "FLOP/byte, achieved TFLOP/s and TB/s from the roofline perf models; TraceLens unified_perf_summary")
    from ..analyses.perf_summary import perf_summary
    if attribution not in (None, "cpu_op"):
        return [_Sheet("unified_perf_summary", desc, note=(
            f"not available for this profile: its GPU work is attributed to {attribution}s, not PyTorch operators, "
            "so there are no input shapes to compute FLOPs and bytes from; the per-category sheets are left out."))], []
    try:
        res = perf_summary(trace, limit=ROW_LIMIT)
    except ProfileError as exc:
        return [_Sheet("unified_perf_summary", desc, note=str(exc))], []
    rows = res.rows
    cols = _columns(rows)
    facts: list[tuple[str, Any]] = [(f"perf_summary.totals.{k}", v) for k, v in res.totals.model_dump().items()]
    facts.append(("per-category sheets", "named after the ops_summary op categories (GEMM, SDPA_fwd, elementwise, "
                                         "reduce, ...), not TraceLens's perf-model classes (BinaryElementwise, ...)"))
    if res.truncated:
        facts.append(("unified_perf_summary truncated", f"{res.remainder_rows} rows beyond {ROW_LIMIT} left out "
                                                        f"({res.remainder_kernel_time_ns} ns kernel time); "
                                                        "use the perf_summary tool with filters"))
    sheets = [_Sheet("unified_perf_summary", desc, cols, _dump(rows))]
    by_cat: dict[str, list[BaseModel]] = {}
    for r in rows:
        by_cat.setdefault(r.category or "other", []).append(r)
    taken: list[str] = []
    for cat, rs in by_cat.items():
        name = sheet_name(cat, taken)
        taken.append(name)
        sheets.append(_Sheet(name, f"unified_perf_summary rows of category {cat!r}", cols, _dump(rs)))
    return sheets, facts


def _info_rows(trace: Trace, include_unlinked: bool, sheets: list[_Sheet], facts: list[tuple[str, Any]]) -> list[dict]:
    from gpuscope import __version__

    from ..analyses import trace_info

    rows: list[tuple[str, Any]] = [("report", f"gpuscope {__version__} TraceLens-style report"), ("profile", str(trace.path))]
    try:
        ti = trace_info(trace)
        rows += [("format", f"{ti.format} ({ti.format_name}{' ' + ti.format_version if ti.format_version else ''})"),
                 ("file_bytes", ti.file_bytes),
                 ("capture_start_ns", ti.capture.start_ns), ("capture_end_ns", ti.capture.end_ns),
                 ("capture_span_ns", ti.capture.span_ns)]
        if ti.gpu_activity:
            rows += [("gpu_activity_start_ns", ti.gpu_activity.start_ns), ("gpu_activity_end_ns", ti.gpu_activity.end_ns),
                     ("gpu_activity_span_ns", ti.gpu_activity.span_ns)]
        for d in ti.devices:
            rows.append((f"device {d.device_id}", f"{d.name or '?'}; {d.kernels} kernels, {d.memops} copies/sets; "
                                                  f"busy_ns={d.busy_ns}; busy_pct_of_gpu_span={d.busy_pct_of_gpu_span}"))
        for p in ti.processes:
            rows.append((f"process {p.pid}", f"{p.name or '?'}; rank={p.rank}; {p.kernels} kernels"))
        rows += [("unlinked_gpu_ops", ti.unlinked_gpu_ops), ("unlinked_gpu_time_ns", ti.unlinked_gpu_time_ns)]
        rows += [("warning", w) for w in ti.warnings]
    except (ProfileError, OSError) as exc:  # the info sheet is best effort; the data sheets stand on their own
        rows.append(("trace_info", f"unavailable: {exc}"))
    rows += [("include_unlinked", include_unlinked), ("selection", "whole profile, all devices"), ("units", UNITS)]
    rows += facts
    for s in sheets:
        state = f"{len(s.rows)} rows" if s.note is None else "note only: " + s.note
        rows.append((f"sheet {s.name}", f"{s.description} [{state}]"))
    return [{"field": k, "value": _cell(v)} for k, v in rows]


# -- writing --------------------------------------------------------------------------------------------

def _check_path(trace: Trace, path: Path) -> Path:
    path = Path(path).expanduser()
    if path.suffix.lower() != ".xlsx":
        raise ProfileError(f"report path {str(path)!r} must end in .xlsx (an Excel workbook).")
    if path.exists() and path.is_dir():
        raise ProfileError(f"report path {str(path)!r} is a folder; give a file name ending in .xlsx.")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ProfileError(f"cannot write the report to {str(path)!r}: the folder {str(parent)!r} does not exist. "
                           "Create it or choose another path.")
    if not os.access(parent, os.W_OK):
        raise ProfileError(f"cannot write the report to {str(path)!r}: the folder {str(parent)!r} is not writable.")
    try:
        if path.resolve() == Path(trace.path).resolve():
            raise ProfileError(f"report path {str(path)!r} is the profile itself; choose another file.")
    except OSError:
        pass
    return path


def _write_sheet(wb: Workbook, s: _Sheet) -> None:
    ws = wb.create_sheet(s.name)
    bold = Font(bold=True)
    cols = ["note"] if s.note is not None else s.columns
    ws.append(cols)
    for c in ws[1]:
        c.font = bold
    ws.freeze_panes = "A2"
    widths = [len(c) for c in cols]
    body = [[s.note]] if s.note is not None else [[_cell(r.get(c)) for c in cols] for r in s.rows]
    for i, vals in enumerate(body):
        vals = [_ILLEGAL.sub("", v) if isinstance(v, str) else v for v in vals]
        ws.append(vals)
        for c, v in zip(ws[ws.max_row], vals):
            if isinstance(v, str) and v.startswith("="):
                c.value, c.data_type = v, "s"  # a name, never a formula
        if i < 200:
            for j, v in enumerate(vals):
                if v is not None:
                    widths[j] = max(widths[j], len(str(v)) if not isinstance(v, float) else min(len(repr(v)), 12))
    for j, w in enumerate(widths):
        ws.column_dimensions[get_column_letter(j + 1)].width = max(8, min(w + 2, 60 if s.note is None else 120))


def write_report(trace: Trace, path: Path, *, include_unlinked: bool = True) -> dict[str, int]:
    """Write the workbook to `path` (must end in .xlsx; its folder must exist). Returns sheet name -> data rows
    (0 for note sheets), in sheet order. Raises ProfileError for an unusable path."""
    path = _check_path(trace, path)
    sheets: list[_Sheet] = []
    facts: list[tuple[str, Any]] = []
    tl_sheets, tl_facts = _timeline_sheets(trace, include_unlinked)
    ops, ops_facts, attribution = _ops_sheets(trace, include_unlinked)
    perf, perf_facts = _perf_sheets(trace, attribution)
    sheets = [*tl_sheets, *ops, *perf]
    facts = [*tl_facts, *ops_facts, *perf_facts]
    info = _Sheet("info", "this sheet: the profile, the selection, units, and what each sheet holds", ["field", "value"],
                  _info_rows(trace, include_unlinked, sheets, facts))
    wb = Workbook()
    wb.remove(wb.active)
    for s in [info, *sheets]:
        _write_sheet(wb, s)
    with atomic_output(path) as tmp:
        wb.save(tmp)
    return {s.name: (len(s.rows) if s.note is None else 0) for s in [info, *sheets]}


class SheetWritten(BaseModel):
    sheet: str
    rows: int


class ReportWritten(BaseModel):
    trace: str
    path: str
    sheets: list[SheetWritten]


def write_report_for_cli(trace: Trace, *, xlsx: str | Path, include_unlinked: bool = True) -> ReportWritten:
    """`gpuscope report PROFILE --xlsx out.xlsx`: write the workbook and say what was written."""
    out = Path(xlsx).expanduser()
    written = write_report(trace, out, include_unlinked=include_unlinked)
    return ReportWritten(trace=str(trace.path), path=str(out.resolve()),
                         sheets=[SheetWritten(sheet=k, rows=v) for k, v in written.items()])
