"""gap_histogram: when is each GPU idle, for how long, and what was the host doing meanwhile.

Idle gaps are the holes in the union of GPU activity (kernels, and copies/sets unless excluded)
per device — or per stream on request. Leading and trailing idle (before the first and after the
last GPU operation) are not gaps; they appear in idle relative to the capture/window span.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, busy_sql, clip_name, gpu_activity_sql, pct, resolve_selection, union_gaps_sql

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


class GapHistogramResult(BaseModel):
    trace: str
    window: Window
    activity: str = Field(description="what counts as GPU activity")
    mode: str = Field(description="'per device' or 'per stream'")
    profiles: list[GapProfile]
    truncated: bool = Field(description="true when profiles were cut to `limit` (per-stream mode)")
    hint: str | None = None


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
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    top_gaps = max(0, min(int(top_gaps), 50))
    where, params = sel.where(time_mode="overlap")
    # Clip to the window so a kernel straddling a boundary counts only its part inside.
    acts = (f"SELECT device_id, stream_id, greatest(start_ns, {window.start_ns}) AS start_ns, "
            f"least(end_ns, {window.end_ns}) AS end_ns, kind, name, pid, tid FROM ({gpu_activity_sql(include_memops, where)})")
    part = "device_id, stream_id" if per_stream else "device_id"
    all_params = params * (2 if include_memops else 1)
    stats = trace.sql_dicts(busy_sql(acts, part) + f" ORDER BY {part}", all_params)
    if not stats:
        what = "kernels, copies or sets" if include_memops else "kernels"
        raise ProfileError(f"no GPU activity ({what}) in the selection, so there are no gaps to measure. trace_info shows what the profile holds.")
    truncated = len(stats) > limit
    stats = stats[:limit]
    bucket_sql = "CASE " + " ".join(
        f"WHEN gap_ns < {hi} THEN {i}" for i, (_, hi) in enumerate(BUCKETS) if hi is not None) + f" ELSE {len(BUCKETS) - 1} END"
    hist = trace.sql(
        f"SELECT {part}, {bucket_sql} AS b, count(*), sum(gap_ns)::BIGINT FROM ({union_gaps_sql(acts, part)}) GROUP BY ALL",
        all_params,
    )
    largest = _largest_gaps(trace, acts, part, all_params, top_gaps) if top_gaps else {}
    profiles = []
    for s in stats:
        key = (s["device_id"], s["stream_id"]) if per_stream else (s["device_id"],)
        counts = {row[len(key)]: row[len(key) + 1:] for row in hist if tuple(row[: len(key)]) == key}
        span = int(s["last_ns"] - s["first_ns"])
        busy = int(s["busy_ns"])
        idle_window = window.span_ns - busy
        profiles.append(GapProfile(
            device_id=s["device_id"], stream_id=s["stream_id"] if per_stream else None, ops=int(s["n"]),
            gpu_first_ns=int(s["first_ns"]), gpu_last_ns=int(s["last_ns"]), gpu_span_ns=span, busy_ns=busy,
            idle_in_gpu_span_ns=int(s["idle_ns"]), idle_pct_of_gpu_span=pct(s["idle_ns"], span),
            idle_in_window_ns=idle_window, idle_pct_of_window=pct(idle_window, window.span_ns),
            gap_count=int(s["n_gaps"]),
            buckets=[Bucket(bucket=label, count=int(counts.get(i, (0, 0))[0]), total_ns=int(counts.get(i, (0, 0))[1] or 0))
                     for i, (label, _) in enumerate(BUCKETS)],
            largest_gaps=largest.get(key, []),
        ))
    activity = "kernels, memory copies and memsets" if include_memops else "kernels only"
    return GapHistogramResult(
        trace=str(trace.path), window=window, activity=activity, mode="per stream" if per_stream else "per device",
        profiles=profiles, truncated=truncated,
        hint=f"only the first {limit} streams are shown; pass device= to narrow" if truncated else None,
    )


def _largest_gaps(trace: Trace, acts: str, part: str, params: list, top: int) -> dict[tuple, list[Gap]]:
    # The ops bounding a gap: the one ending where it starts and the one starting where it ends
    # (zero-length ops excluded, ties broken deterministically).
    same_stream = "AND a.stream_id = top.stream_id" if "stream" in part else ""
    rows = trace.sql_dicts(
        f"""
        WITH a AS ({acts}),
        g AS (SELECT *, row_number() OVER (PARTITION BY {part} ORDER BY gap_ns DESC, gap_start_ns) AS rnk
              FROM ({union_gaps_sql('SELECT * FROM a', part)})),
        top AS (SELECT * FROM g WHERE rnk <= {top})
        SELECT top.*,
            (SELECT arg_max((kind, name, stream_id), (start_ns, stream_id, name)) FROM a
             WHERE a.device_id = top.device_id {same_stream} AND a.end_ns = top.gap_start_ns AND a.end_ns > a.start_ns) AS before,
            (SELECT arg_min((kind, name, stream_id, pid, tid), (end_ns, stream_id, name)) FROM a
             WHERE a.device_id = top.device_id {same_stream} AND a.start_ns = top.gap_end_ns AND a.end_ns > a.start_ns) AS after
        FROM top ORDER BY {part}, rnk
        """,
        params,
    )
    has_api = trace.count("api_calls") > 0
    out: dict[tuple, list[Gap]] = {}
    for r in rows:
        key = (r["device_id"], r["stream_id"]) if "stream" in part else (r["device_id"],)
        before, after = r["before"], r["after"]
        pid, tid = (after[3], after[4]) if after else (None, None)
        calls, note = [], None
        if not has_api:
            note = "the profile has no host API calls"
        elif tid is None:
            note = "the launch of the op after the gap is not in the profile"
        else:
            calls = [HostCall(name=n, overlap_ns=int(o)) for n, o in trace.sql(
                """SELECT name, sum(least(end_ns, ?) - greatest(start_ns, ?))::BIGINT AS o FROM api_calls
                   WHERE pid = ? AND tid = ? AND start_ns < ? AND end_ns > ? GROUP BY name ORDER BY o DESC LIMIT 3""",
                [r["gap_end_ns"], r["gap_start_ns"], pid, tid, r["gap_end_ns"], r["gap_start_ns"]])]
            if not calls:
                note = "no API call on that thread during the gap (host busy in untraced code, or idle)"
        out.setdefault(key, []).append(Gap(
            start_ns=int(r["gap_start_ns"]), end_ns=int(r["gap_end_ns"]), gap_ns=int(r["gap_ns"]),
            before=GpuOp(kind=before[0], name=clip_name(before[1]), stream_id=before[2], time_ns=int(r["gap_start_ns"])) if before else None,
            after=GpuOp(kind=after[0], name=clip_name(after[1]), stream_id=after[2], time_ns=int(r["gap_end_ns"])) if after else None,
            host_thread=tid, host_calls=calls, host_note=note,
        ))
    return out
