"""gap_histogram: when is each GPU idle, for how long, and what was the host doing meanwhile.

Idle gaps are the holes in the union of GPU activity (kernels, and copies/sets unless excluded)
per device — or per stream on request. Leading and trailing idle (before the first and after the
last GPU operation) are not gaps; they appear in idle relative to the capture/window span.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, clip_name, data_issue_notes, data_issues_field, gpu_activity_sql, pct, resolve_selection, skipped_note, ToolResult
from .intervals import Union, unions
from .requirements import require

# Upper bounds (exclusive) in ns; PerfAdvisor's buckets, kept so figures compare.
BUCKETS = [("<10us", 10_000), ("10-100us", 100_000), ("100us-1ms", 1_000_000), ("1-10ms", 10_000_000),
           ("10-100ms", 100_000_000), (">100ms", None)]


class Bucket(BaseModel):
    bucket: str = Field(description="gap length range")
    count: int
    total_ns: int = Field(description="summed gap length, ns")


class GpuOp(BaseModel):
    kind: str = Field(description="'kernel', 'copy' or 'set'")
    name: str
    stream_id: int | None
    time_ns: int = Field(description="end (op before the gap) or start (op after it), ns")


class HostCall(BaseModel):
    name: str = Field(description="host API call overlapping the gap")
    overlap_ns: int = Field(description="time the call overlapped the gap, ns")


class Gap(BaseModel):
    start_ns: int
    end_ns: int
    gap_ns: int
    before: GpuOp | None
    after: GpuOp | None
    host_thread: int | None = Field(description="thread that launched the op after the gap")
    host_calls: list[HostCall] = Field(description="API calls of host_thread during the gap, longest overlap first")
    host_note: str | None = Field(None, description="why host_calls is empty, when it is")


class GapProfile(BaseModel):
    device_id: int
    stream_id: int | None = Field(None, description="set in per-stream mode")
    ops: int = Field(description="GPU operations with non-zero duration in the window")
    gpu_first_ns: int = Field(description="start of the first GPU operation, ns")
    gpu_last_ns: int = Field(description="end of the last GPU operation, ns")
    gpu_span_ns: int = Field(description="gpu_last_ns - gpu_first_ns, ns")
    busy_ns: int = Field(description="union of GPU operation intervals, ns")
    idle_in_gpu_span_ns: int = Field(description="sum of gaps = gpu_span_ns - busy_ns, ns")
    idle_pct_of_gpu_span: float | None = Field(description="idle_in_gpu_span_ns / gpu_span_ns, %")
    idle_in_window_ns: int = Field(description="window span - busy_ns (includes leading/trailing idle), ns")
    idle_pct_of_window: float | None = Field(description="idle_in_window_ns / window span, %")
    gap_count: int
    buckets: list[Bucket]
    largest_gaps: list[Gap]


class GapHistogramResult(ToolResult):
    trace: str
    window: Window
    activity: str = Field(description="what counts as GPU activity")
    mode: str = Field(description="'per device' or 'per stream'")
    profiles: list[GapProfile]
    truncated: bool = Field(description="true when profiles were cut to `limit` (per-stream mode)")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def gap_histogram(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    include_memops: bool = True,
    per_stream: bool = False,
    top_gaps: int = 5,
    limit: int = 16,
) -> GapHistogramResult:
    require(trace, "gap_histogram")
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    top_gaps = max(0, min(int(top_gaps), 50))
    limit = max(1, int(limit))  # 0 or less would return no profile at all while claiming truncation
    where, params = sel.where(time_mode="overlap")
    # Clip to the window so an op straddling a boundary counts only its part inside.
    acts = (f"SELECT device_id, stream_id, greatest(start_ns, {window.start_ns}) AS start_ns, "
            f"least(end_ns, {window.end_ns}) AS end_ns, kind, name, pid, tid FROM ({gpu_activity_sql(include_memops, where)})")
    acts_params = params * (2 if include_memops else 1)
    part = ("device_id", "stream_id") if per_stream else ("device_id",)
    found = unions(trace, acts, acts_params, part, bounds=tuple(hi for _, hi in BUCKETS if hi is not None), top=top_gaps)
    if not found:
        what = "kernels, copies or sets" if include_memops else "kernels"
        raise ProfileError(f"no GPU activity ({what}) in the selection, so there are no gaps to measure. trace_info shows what the profile holds."
                           + skipped_note(trace, ("kernels", "memops")))
    keys = sorted(found, key=lambda k: tuple(-1 if v is None else v for v in k))
    truncated = len(keys) > limit
    profiles = []
    for key in keys[:limit]:
        u = found[key]
        idle_window = window.span_ns - u.busy_ns
        profiles.append(GapProfile(
            device_id=key[0], stream_id=key[1] if per_stream else None, ops=u.ops,
            gpu_first_ns=u.first_ns, gpu_last_ns=u.last_ns, gpu_span_ns=u.span_ns, busy_ns=u.busy_ns,
            idle_in_gpu_span_ns=u.idle_ns, idle_pct_of_gpu_span=pct(u.idle_ns, u.span_ns),
            idle_in_window_ns=idle_window, idle_pct_of_window=pct(idle_window, window.span_ns),
            gap_count=u.gaps,
            buckets=[Bucket(bucket=label, count=u.bucket_counts[i], total_ns=u.bucket_ns[i]) for i, (label, _) in enumerate(BUCKETS)],
            largest_gaps=trace.memo(("gap_histogram.largest", acts, tuple(acts_params), key, u.top_gaps[:top_gaps]),
                                    lambda: _largest_gaps(trace, include_memops, where, params, window, key, u, top_gaps))
            if top_gaps else [],
        ))
    activity = "kernels, memory copies and memsets" if include_memops else "kernels only"
    return GapHistogramResult(
        data_issues=data_issue_notes(trace, ("kernels", "memops", "api_calls")),
        trace=str(trace.path), window=window, activity=activity, mode="per stream" if per_stream else "per device",
        profiles=profiles, truncated=truncated,
        hint=(f"only the first {limit} {'streams' if per_stream else 'devices'} are shown; raise limit or pass device= to narrow"
              if truncated else None),
    )


def _largest_gaps(trace: Trace, include_memops: bool, where: str, params: list, window: Window, key: tuple, u: Union,
                  top: int) -> list[Gap]:
    # Longest first; equal lengths in time order (unions' top_gaps).
    starts, ends = [g[0] for g in u.top_gaps[:top]], [g[1] for g in u.top_gaps[:top]]
    if not starts:
        return []
    same_part = "a.device_id = ?" + (" AND a.stream_id IS NOT DISTINCT FROM ?" if len(key) > 1 else "")
    parts = 2 if include_memops else 1

    def at(col: str, times: list[int]) -> tuple[str, list]:
        # The ops whose unclipped `col` is one of `times`: a gap lies inside the window (lo <= gs < ge <= hi), so an op
        # clipped to end at gs (start at ge) ends (starts) there unclipped. Constants in the scan's filter keep these
        # few rows apart before any join: matching the gaps against every op held ~500 MB at 10 M kernels.
        marks = ", ".join("?" * len(times))
        return (f"SELECT device_id, stream_id, greatest(start_ns, {window.start_ns}) AS start_ns, "
                f"least(end_ns, {window.end_ns}) AS end_ns, kind, name, pid, tid "
                f"FROM ({gpu_activity_sql(include_memops, f'{where} AND {col} IN ({marks})')})"), (params + times) * parts
    before_sql, before_params = at("end_ns", starts)
    after_sql, after_params = at("start_ns", ends)
    # The ops bounding each gap: the one ending where it starts and the one starting where it ends
    # (zero-length ops excluded, ties broken deterministically).
    rows = trace.sql(
        f"""
        WITH b AS ({before_sql}), f AS ({after_sql}), g AS (SELECT unnest(?::BIGINT[]) AS gs, unnest(?::BIGINT[]) AS ge)
        SELECT g.gs,
            (SELECT arg_max((kind, name, stream_id), (start_ns, stream_id, name)) FROM b a
             WHERE {same_part} AND a.end_ns = g.gs AND a.end_ns > a.start_ns) AS before,
            (SELECT arg_min((kind, name, stream_id, pid, tid), (end_ns, stream_id, name)) FROM f a
             WHERE {same_part} AND a.start_ns = g.ge AND a.end_ns > a.start_ns) AS after
        FROM g
        """,
        before_params + after_params + [starts, ends] + list(key) * 2,
    )
    around = {r[0]: (r[1], r[2]) for r in rows}
    has_api = trace.count("api_calls") > 0
    gaps = []
    for gs, ge in zip(starts, ends):
        before, after = around.get(gs, (None, None))
        pid, tid = (after[3], after[4]) if after else (None, None)
        calls, note = [], None
        if not has_api:
            note = "the profile has no host API calls"
        elif tid is None:
            note = "the launch of the op after the gap is not in the profile"
        else:
            calls = [HostCall(name=n, overlap_ns=int(o)) for n, o in trace.sql(
                """SELECT name, sum(least(end_ns, ?) - greatest(start_ns, ?))::BIGINT AS o FROM api_calls
                   WHERE pid = ? AND tid = ? AND start_ns < ? AND end_ns > ? GROUP BY name ORDER BY o DESC, name LIMIT 3""",
                [ge, gs, pid, tid, ge, gs])]
            if not calls:
                note = "no API call on that thread during the gap (host busy in untraced code, or idle)"
        gaps.append(Gap(
            start_ns=gs, end_ns=ge, gap_ns=ge - gs,
            before=GpuOp(kind=before[0], name=clip_name(before[1]), stream_id=before[2], time_ns=gs) if before else None,
            after=GpuOp(kind=after[0], name=clip_name(after[1]), stream_id=after[2], time_ns=ge) if after else None,
            host_thread=tid, host_calls=calls, host_note=note,
        ))
    return gaps
