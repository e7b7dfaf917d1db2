"""trace_info: the agent's entry point — what the profile is, what it holds, what can be asked of it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from ..model.quality import CORRELATION_IDS_UNIQUE
from ..model.trace import Trace
from .comm_patterns import comm_patterns
from .common import WHOLE_GRAPH_ADVICE, ToolResult, Window, capture_window, data_issues, gpu_activity_sql, pct
from .intervals import unions
from .iterations import refusal as iteration_refusal
from .graph_summary import absent_reason as graph_absent
from .requirements import left_out, reason


class DeviceInfo(BaseModel):
    device_id: int
    name: str | None
    vendor: str | None
    is_compute: bool | None = Field(description="false for display adapters the profiler listed but that cannot run CUDA/HIP work")
    sm_count: int | None = Field(description="SMs (NVIDIA) or CUs (AMD)")
    memory_gib: float | None = Field(description="device memory, GiB (2^30 bytes)")
    memory_bandwidth_gb_per_s: float | None = Field(description="peak DRAM bandwidth stated by the profile, GB/s (10^9 B/s)")
    compute_capability: str | None
    kernels: int = Field(description="kernel executions on this device (any length)")
    memops: int = Field(description="memory copies + sets on this device")
    gpu_first_ns: int | None = Field(description="start of the first kernel/copy/set of non-zero length, ns; null when the device has none")
    gpu_last_ns: int | None = Field(description="end of the last kernel/copy/set of non-zero length, ns; null when the device has none")
    busy_ns: int | None = Field(description="union of kernel/copy/set intervals, ns; null when the device has no op of non-zero length")
    busy_pct_of_gpu_span: float | None = Field(description="busy_ns / (gpu_last_ns - gpu_first_ns), %")


class ProcessInfo(BaseModel):
    pid: int
    name: str | None
    rank: int | None
    kernels: int = Field(description="kernel executions launched by this process, all devices")


class DataIssue(BaseModel):
    table: str = Field(description="model table the source rows belong to, or native.\"X\": a table of the profile a copy read")
    action: Literal["skipped", "repaired"] = Field(description="skipped: left out of the table; repaired: kept with a corrected value")
    rows: int = Field(description="source rows (of a native table: rows whose cell in the column the reason names was changed)")
    reason: str = Field(description="what was wrong and what was done")


class Capability(BaseModel):
    tool: str
    available: bool
    reason: str | None = Field(None, description="why not, when unavailable: the missing data, where the profile would keep "
                               "it and the capture flag that records it")
    left_out: list[str] = Field(default_factory=list, description="parts of the answer this profile cannot give, and why "
                                "(the tool answers the rest)")


class TraceInfoResult(ToolResult):
    trace: str
    format: str = Field(description="format key: nsys | rocpd | rpd | kineto")
    format_name: str
    format_version: str | None
    product_version: str | None
    file_bytes: int
    open_seconds: float = Field(description="time spent reading the profile into the trace model, s")
    capture: Window = Field(description="capture span (all events, host and GPU)")
    gpu_activity: Window | None = Field(description="first to last GPU operation over all devices; null without GPU work")
    devices: list[DeviceInfo]
    processes: list[ProcessInfo] = Field(description="processes with GPU work or GPU API calls")
    other_processes: int = Field(description="processes the profile lists without any GPU activity (e.g. system processes)")
    counts: dict[str, int] = Field(description="rows per trace-model table")
    unlinked_gpu_ops: int = Field(description="kernels/copies/sets whose launching API call is not in the profile")
    unlinked_gpu_time_ns: int = Field(description="summed duration of those ops, ns")
    capabilities: list[Capability]
    absent: list[str] = Field(description="data the profile does not contain, with the reason")
    warnings: list[str]
    data_issues_summary: str | None = Field(description="one line over data_issues; null when every source row was used as written")
    data_issues: list[DataIssue] = Field(description="source rows the reader left out of a model table or corrected, per table "
                                         "and reason (the data_issues table), native.\"X\" for cells of the profile's own tables "
                                         "that a copy changed; tools name those of the tables they read")
    meta: dict[str, str] = Field(description="other facts the reader recorded")


# Facts shown in their own fields, and the model check's correlation_ids_unique (a fact for the tools' SQL; sql_query
# reads it in trace_meta).
_SHOWN_META = {"format", "format_version", "product_version", "capture_start_ns", "capture_end_ns", "capture_span_source", "absent",
               CORRELATION_IDS_UNIQUE}


def trace_info(trace: Trace) -> TraceInfoResult:
    counts = {t: trace.count(t) for t in ("kernels", "memops", "api_calls", "markers", "cpu_ops", "devices", "processes", "threads")}
    counts["memcpy"] = int(trace.scalar("SELECT count(*) FROM memops WHERE op = 'copy'"))
    counts["memset"] = counts["memops"] - counts["memcpy"]
    busy = {k[0]: u for k, u in unions(trace, gpu_activity_sql(True, "TRUE"), [], ("device_id",)).items()}
    per_dev = {r[0]: r[1:] for r in trace.sql(
        "SELECT device_id, sum(k), sum(m) FROM (SELECT device_id, count(*) k, 0 m FROM kernels GROUP BY 1 "
        "UNION ALL SELECT device_id, 0, count(*) FROM memops GROUP BY 1) GROUP BY 1")}
    devices = []
    listed = trace.sql_dicts("SELECT * FROM devices ORDER BY device_id")
    seen = {d["device_id"] for d in listed}
    listed += [{"device_id": d, "is_compute": True} for d in sorted(set(per_dev) - seen)]
    for d in listed:
        b = busy.get(d["device_id"])
        k, m = per_dev.get(d["device_id"], (0, 0))
        devices.append(DeviceInfo(
            device_id=d["device_id"], name=d.get("name"), vendor=d.get("vendor"), is_compute=d.get("is_compute"),
            sm_count=d.get("sm_count"),
            memory_gib=round(d["memory_bytes"] / 2**30, 2) if d.get("memory_bytes") else None,
            memory_bandwidth_gb_per_s=round(d["memory_bandwidth_bytes_per_s"] / 1e9, 1) if d.get("memory_bandwidth_bytes_per_s") else None,
            compute_capability=d.get("compute_capability"), kernels=int(k), memops=int(m),
            gpu_first_ns=b.first_ns if b else None, gpu_last_ns=b.last_ns if b else None,
            busy_ns=b.busy_ns if b else None, busy_pct_of_gpu_span=pct(b.busy_ns, b.span_ns) if b else None,
        ))
    # Nsight lists every OS process of the machine; only those that touched the GPU are of interest.
    processes = [ProcessInfo(pid=p, name=n, rank=r, kernels=int(k)) for p, n, r, k in trace.sql(
        """SELECT p.pid, any_value(p.name), any_value(p.rank), coalesce(any_value(k.n), 0)
           FROM processes p LEFT JOIN (SELECT pid, count(*) n FROM kernels GROUP BY pid) k USING (pid)
           WHERE p.pid IN (SELECT pid FROM kernels UNION SELECT pid FROM memops UNION SELECT pid FROM api_calls)
           GROUP BY p.pid ORDER BY p.pid""")]
    other_processes = counts["processes"] - len(processes)
    unlinked = trace.sql(
        "SELECT count(*), coalesce(sum(dur_ns), 0)::BIGINT FROM (SELECT dur_ns FROM kernels WHERE NOT launched "
        "UNION ALL SELECT dur_ns FROM memops WHERE NOT launched)")[0]
    gpu = None
    if busy:
        lo, hi = min(b.first_ns for b in busy.values()), max(b.last_ns for b in busy.values())
        gpu = Window(start_ns=lo, end_ns=hi, span_ns=hi - lo, source="first to last GPU operation, all devices")
    absent = [v for (v,) in trace.sql("SELECT value FROM trace_meta WHERE key = 'absent' ORDER BY value")]
    warnings = list(trace.warnings)
    issues = [DataIssue(table=t, action=a, rows=n, reason=r) for t, a, n, r in data_issues(trace)]
    return TraceInfoResult(
        trace=str(trace.path), format=trace.format, format_name=trace.format_name,
        format_version=trace.meta.get("format_version") or None, product_version=trace.meta.get("product_version") or None,
        file_bytes=trace.path.stat().st_size, open_seconds=round(trace.open_seconds, 3),
        capture=capture_window(trace), gpu_activity=gpu, devices=devices, processes=processes, other_processes=other_processes, counts=counts,
        unlinked_gpu_ops=int(unlinked[0]), unlinked_gpu_time_ns=int(unlinked[1]),
        capabilities=capabilities(trace, counts), absent=absent, warnings=warnings,
        data_issues_summary=_issues_summary(issues), data_issues=issues,
        meta={k: v for k, v in trace.meta.items() if k not in _SHOWN_META},
    )


def _issues_summary(issues: list[DataIssue]) -> str | None:
    """Rows of the model tables per action (each counted once, under the fault that decided its fate), then the cells
    of the profile's own tables that a copy changed (counted per column: a row may count once in each)."""
    if not issues:
        return None
    parts = []
    for action in ("skipped", "repaired"):
        per: dict[str, int] = {}
        for i in issues:
            if i.action == action and not i.table.startswith("native."):
                per[i.table] = per.get(i.table, 0) + i.rows
        if per:
            parts.append(f"{sum(per.values())} source rows {action} ({', '.join(f'{t} {n}' for t, n in per.items())})")
    cells: dict[str, int] = {}
    for i in issues:
        if i.table.startswith("native."):
            cells[i.table] = cells.get(i.table, 0) + i.rows
    if cells:
        parts.append(f"{sum(cells.values())} cells of the profile's own tables repaired, counted per column "
                     f"({', '.join(f'{t} {n}' for t, n in cells.items())})")
    return "; ".join(parts) + ": every tool's data_issues names those of the tables it reads"


def capabilities(trace: Trace, counts: dict[str, int]) -> list[Capability]:
    """Which per-profile tools give answers here, and why not where they cannot: the data each tool needs comes
    from requirements.NEEDS; iterations, comm_summary and the operator tools add their own rule (one cheap query each)."""
    def cap(tool: str, extra: str | None = None) -> Capability:
        why = reason(trace, tool) or extra
        return Capability(tool=tool, available=why is None, reason=why, left_out=[] if why else left_out(trace, tool))

    rx = re.compile("|".join(f"(?:{p})" for p in comm_patterns()), re.I)
    comm = any(rx.search(n) for (n,) in trace.sql("SELECT DISTINCT name FROM kernels")) if counts["kernels"] else False
    steps_why = iteration_refusal(trace) if reason(trace, "iterations") is None else None
    caps = [cap(t) for t in ("top_kernels", "gap_histogram", "gap_histogram.host_calls", "gpu_timeline", "stream_summary",
                             "phases", "diagnose", "compare_traces", "check_regression", "rank_summary", "memcpy_summary",
                             "api_summary", "marker_summary")]
    no_comm = None
    if not comm:
        whole = trace.scalar("SELECT count(*) FROM kernels WHERE whole_graph") if counts["kernels"] else 0
        no_comm = ("no kernel name matches the NCCL/RCCL/all-reduce patterns (pass comm_patterns for custom ones)"
                   + (f"; {whole} CUDA graph replays were traced whole and may hold communication kernels: "
                      f"{WHOLE_GRAPH_ADVICE}" if whole else ""))
    caps += [cap("iterations", steps_why),
             cap("comm_summary", no_comm), cap("straggler_summary", no_comm), cap("comm_job_summary", no_comm),
             cap("graph_summary", graph_absent(trace)),
             cap("ops_summary"), cap("call_stack"), cap("call_stack.op"), cap("perf_summary"),
             cap("roofline"), cap("replay_spec"), cap("critical_path"), cap("memory_timeline"), cap("sql_query")]
    return caps
