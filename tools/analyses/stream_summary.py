"""stream_summary: what each stream of each device did, and how many streams ran at once.

Per device and stream: busy time (the union of the stream's kernel, copy and set intervals), its
share of the device's GPU-activity span (first to last op on the device) and of the device's busy
time (union over all its streams), kernel and copy/set counts, summed kernel and copy/set time.
Per device: concurrency from a sweep over the streams' busy intervals — time with >= 2 streams busy,
the largest number of streams busy at once and when, and a histogram of time by number of busy
streams (0 = idle inside the GPU span).

Streams are per device — equal stream ids on two GPUs are two streams (nsys-ai normalises by span x
streams across devices and reports > 100 %) — and per process: two processes on one GPU may both
number a stream 7 (CUPTI ids are per context), so a stream is (device, stream id, process). An op
whose process is unknown belongs to the stream's only process when there is one.

Window: ops overlapping [start_ns, end_ns) are counted; their times are clipped to the window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, data_issue_notes, data_issues_field, pct, resolve_selection, skipped_note, ToolResult
from .intervals import NULL_KEY, Keys, merged
from .requirements import require


class StreamRow(BaseModel):
    device_id: int
    stream_id: int | None = Field(description="stream id on this device (null: the profile does not say)")
    pid: int | None = Field(description="process owning the stream (null when unknown)")
    kernel_count: int = Field(description="kernels (zero-length ones included)")
    copy_count: int = Field(description="memory copies")
    set_count: int = Field(description="memory sets")
    kernel_work_ns: int = Field(description="summed kernel durations (clipped to the window), ns")
    memop_work_ns: int = Field(description="summed copy + set durations (clipped), ns")
    busy_ns: int = Field(description="union of this stream's kernel/copy/set intervals, ns")
    first_ns: int | None = Field(description="start of its first non-zero-length op, ns")
    last_ns: int | None = Field(description="end of its last op, ns")
    pct_of_device_gpu_span: float | None = Field(description="busy_ns / device gpu_span_ns, %")
    pct_of_device_busy: float | None = Field(description="busy_ns / device busy_ns, %; shares of concurrent streams add up to > 100")


class ConcurrencyBin(BaseModel):
    busy_streams: int = Field(description="number of streams busy at the same time (0 = device idle inside its GPU span)")
    time_ns: int = Field(description="time with exactly this many streams busy, ns")
    pct_of_gpu_span: float | None = Field(description="time_ns / gpu_span_ns, %")


class DeviceStreams(BaseModel):
    device_id: int
    device_name: str | None
    streams: int = Field(description="streams with ops on this device in the selection")
    gpu_first_ns: int | None = Field(description="start of the first non-zero-length op on the device, ns")
    gpu_last_ns: int | None = Field(description="end of the last op, ns")
    gpu_span_ns: int = Field(description="gpu_last_ns - gpu_first_ns, ns (denominator of the span shares)")
    busy_ns: int = Field(description="union over all streams of the device (>= 1 stream busy), ns")
    idle_in_gpu_span_ns: int = Field(description="gpu_span_ns - busy_ns, ns")
    stream_busy_sum_ns: int = Field(description="sum of the streams' busy_ns, ns")
    avg_busy_streams: float | None = Field(description="stream_busy_sum_ns / busy_ns: mean number of streams busy while the device is busy")
    concurrent_ns: int = Field(description="time with >= 2 streams busy, ns")
    concurrent_pct_of_busy: float | None = Field(description="concurrent_ns / busy_ns, %")
    max_concurrent_streams: int = Field(description="largest number of streams busy at once")
    max_concurrency_start_ns: int | None = Field(description="start of the first period at max_concurrent_streams, ns")
    max_concurrency_end_ns: int | None = Field(description="end of that period, ns")
    time_at_max_concurrency_ns: int = Field(description="total time at max_concurrent_streams, ns")
    histogram: list[ConcurrencyBin] = Field(description="time by number of busy streams, 0..max")
    shared_stream_ids: list[int] = Field(description="stream ids that several processes use on this device (kept apart, one row each)")
    remainder_streams: int = Field(description="streams beyond the limit (in the device figures, not listed)")


class StreamSummaryResult(ToolResult):
    trace: str
    window: Window
    activity: str = Field(description="what counts as stream activity")
    filters: dict[str, int | bool | None]
    devices: list[DeviceStreams]
    streams: list[StreamRow] = Field(description="per device, streams by busy time (desc)")
    truncated: bool = Field(description="true when some device had more streams than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def stream_summary(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    include_memops: bool = True,
    limit: int = 32,
) -> StreamSummaryResult:
    require(trace, "stream_summary")
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 500))
    where, params = sel.where(time_mode="overlap")
    lo, hi = window.start_ns, window.end_ns
    parts = [f"SELECT device_id, stream_id, pid, 0 AS what, start_ns, end_ns FROM kernels WHERE {where}"]
    if include_memops:
        parts.append(f"SELECT device_id, stream_id, pid, CASE WHEN op = 'set' THEN 2 ELSE 1 END, start_ns, end_ns FROM memops WHERE {where}")
    acts_params = params * len(parts)
    # The owner: the op's process, or the stream's only process when the op's is unknown.
    acts = f"""
        WITH a AS ({' UNION ALL '.join(parts)}),
        o AS (SELECT device_id, stream_id, count(DISTINCT pid) AS n, min(pid) AS only FROM a GROUP BY ALL)
        SELECT a.device_id, a.stream_id, CASE WHEN o.n = 1 THEN o.only ELSE a.pid END AS owner, a.what,
               greatest(a.start_ns, {lo}) AS start_ns, least(a.end_ns, {hi}) AS end_ns
        FROM a JOIN o ON o.device_id = a.device_id AND o.stream_id IS NOT DISTINCT FROM a.stream_id"""
    stats_sql = f"""
        SELECT device_id, stream_id, owner, count(*) FILTER (WHERE what = 0) AS kernels,
               count(*) FILTER (WHERE what = 1) AS copies, count(*) FILTER (WHERE what = 2) AS sets,
               coalesce(sum(end_ns - start_ns) FILTER (WHERE what = 0), 0)::BIGINT AS kernel_work,
               coalesce(sum(end_ns - start_ns) FILTER (WHERE what > 0), 0)::BIGINT AS memop_work
        FROM ({acts}) GROUP BY ALL"""
    stats = trace.memo(("stream_summary", stats_sql, tuple(acts_params)), lambda: trace.sql_dicts(stats_sql, acts_params))
    if not stats:
        what = "kernels, copies or sets" if include_memops else "kernels"
        raise ProfileError(f"no GPU activity ({what}) in the selection (device/time window), so there are no streams to "
                           "summarise. trace_info shows what the profile holds." + skipped_note(trace, ("kernels", "memops")))
    sweeps, per_stream = trace.memo(("stream_summary.sweep", acts, tuple(acts_params)), lambda: _sweeps(trace, acts, acts_params))
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    devices, rows, truncated = [], [], False
    for dev in sorted({r["device_id"] for r in stats}):
        dev_stats = [r for r in stats if r["device_id"] == dev]
        us = {k: u for k, u in per_stream.items() if k[0] == dev}
        stream_busy = sum(u[0] for u in us.values())
        sweep = sweeps.get(dev)
        busy = sweep["busy_ns"] if sweep else 0
        span = sweep["span_ns"] if sweep else 0
        hist = sweep["hist"] if sweep else [0]
        top = len(hist) - 1
        ids = {}
        for r in dev_stats:
            ids.setdefault(r["stream_id"], set()).add(r["owner"])
        stream_rows = []
        for r in dev_stats:
            u = us.get((dev, r["stream_id"], r["owner"]))
            b = u[0] if u else 0
            stream_rows.append(StreamRow(
                device_id=dev, stream_id=r["stream_id"], pid=r["owner"], kernel_count=r["kernels"], copy_count=r["copies"],
                set_count=r["sets"], kernel_work_ns=int(r["kernel_work"]), memop_work_ns=int(r["memop_work"]), busy_ns=b,
                first_ns=u[1] if u else None, last_ns=u[2] if u else None,
                pct_of_device_gpu_span=pct(b, span), pct_of_device_busy=pct(b, busy),
            ))
        stream_rows.sort(key=lambda s: (-s.busy_ns, -(s.kernel_count + s.copy_count + s.set_count),
                                        -1 if s.stream_id is None else s.stream_id, -1 if s.pid is None else s.pid))
        truncated |= len(stream_rows) > limit
        rows += stream_rows[:limit]
        concurrent = sum(hist[2:])
        devices.append(DeviceStreams(
            device_id=dev, device_name=names.get(dev), streams=len(dev_stats),
            gpu_first_ns=sweep["first_ns"] if sweep else None, gpu_last_ns=sweep["last_ns"] if sweep else None,
            gpu_span_ns=span, busy_ns=busy, idle_in_gpu_span_ns=span - busy, stream_busy_sum_ns=stream_busy,
            avg_busy_streams=round(stream_busy / busy, 3) if busy else None,
            concurrent_ns=concurrent, concurrent_pct_of_busy=pct(concurrent, busy),
            max_concurrent_streams=top if busy else 0,
            max_concurrency_start_ns=sweep["max_start_ns"] if sweep else None,
            max_concurrency_end_ns=sweep["max_end_ns"] if sweep else None,
            time_at_max_concurrency_ns=int(hist[top]) if busy else 0,
            histogram=[ConcurrencyBin(busy_streams=n, time_ns=int(t), pct_of_gpu_span=pct(int(t), span)) for n, t in enumerate(hist)]
            if busy else [],
            shared_stream_ids=sorted(s for s, owners in ids.items() if s is not None and len(owners) > 1),
            remainder_streams=max(0, len(stream_rows) - limit),
        ))
    return StreamSummaryResult(
        data_issues=data_issue_notes(trace, ("kernels", "memops")),
        trace=str(trace.path), window=window,
        activity="kernels, memory copies and memsets" if include_memops else "kernels only",
        filters={"device": device, "include_memops": include_memops},
        devices=devices, streams=rows, truncated=truncated,
        hint=f"more streams than limit={limit} on some device; raise limit (max 500) or pass device=" if truncated else None,
    )


def _sweeps(trace: Trace, acts: str, params: list) -> tuple[dict[int, dict], dict[tuple, tuple[int, int, int]]]:
    """(per device, a sweep over the streams' busy intervals; per stream (device, stream, owner), its busy ns, first
    and last ns), from the streams' merged intervals (disjoint within a stream, touching ones joined), so each
    stream's union is computed once. The sweep: +1 at a start, -1 at an end, ends before starts at equal times so
    touching intervals of two streams are not concurrent. In SQL: only the per-level times and the bounds of the first
    period at the top level come back."""
    cur, src = trace.con.cursor(), trace.con.cursor()
    try:
        # The merged intervals feed the per-stream figures and the sweep's two event lists: a temp table, made once
        # (by _merge, from one pass over the ops in time order) and read by both statements.
        cur.execute("CREATE OR REPLACE TEMP TABLE _m (device_id BIGINT, stream_id BIGINT, owner BIGINT, start_ns BIGINT, "
                    "end_ns BIGINT)")
        try:
            _merge(src, cur, acts, params)
            streams = {(d, None if s == NULL_KEY else s, None if o == NULL_KEY else o): (int(busy), int(first), int(last))
                       for d, s, o, busy, first, last in cur.execute(
                "SELECT device_id, stream_id, owner, sum(end_ns - start_ns)::BIGINT, min(start_ns), max(end_ns) FROM _m GROUP BY ALL")
                .fetchall()}
            rows = cur.execute("""
        WITH ev AS (SELECT device_id, start_ns AS t, 1 AS d FROM _m UNION ALL SELECT device_id, end_ns, -1 FROM _m),
        lv AS (SELECT device_id, t, sum(d) OVER w AS level, lead(t) OVER w - t AS seg   -- streams busy on [t, t + seg)
               FROM ev WINDOW w AS (PARTITION BY device_id ORDER BY t, d ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
        tops AS (SELECT device_id, min(t) AS first_ns, max(t) AS last_ns, max(level) FILTER (WHERE seg > 0) AS top
                 FROM lv GROUP BY device_id),
        hist AS (SELECT device_id, list([level, ns] ORDER BY level) AS hist
                 FROM (SELECT device_id, level, sum(seg)::BIGINT AS ns FROM lv WHERE seg > 0 GROUP BY ALL) GROUP BY device_id),
        mx AS (SELECT device_id, min(t) AS max_start FROM lv JOIN tops USING (device_id) WHERE seg > 0 AND level = top GROUP BY ALL),
        -- the first period at the top level ends where fewer streams are busy for a non-zero time (a stream ending
        -- exactly where another starts does not end it)
        me AS (SELECT device_id, min(t) AS max_end FROM lv JOIN tops USING (device_id) JOIN mx USING (device_id)
               WHERE seg > 0 AND level < top AND t > max_start GROUP BY ALL)
        SELECT device_id, first_ns, last_ns, top, max_start, coalesce(max_end, last_ns), hist
        FROM tops LEFT JOIN mx USING (device_id) LEFT JOIN me USING (device_id) LEFT JOIN hist USING (device_id)""").fetchall()
        finally:
            cur.execute("DROP TABLE IF EXISTS temp.main._m")
    finally:
        cur.close()
        src.close()
    out = {}
    for dev, first, last, top, max_start, max_end, levels in rows:
        hist = [0] * (int(top) + 1)
        for level, ns in levels:
            hist[int(level)] = int(ns)
        out[dev] = {"first_ns": int(first), "last_ns": int(last), "span_ns": int(last - first), "busy_ns": sum(hist[1:]),
                    "hist": hist, "max_start_ns": int(max_start), "max_end_ns": int(max_end)}
    return out, streams


def _merge(src, dst, acts: str, params: list) -> None:
    """Fill `dst`'s temp table _m with each stream's merged intervals, from one pass over `acts` (its non-empty ops)
    in time order on `src` (intervals.merged: DuckDB sorts by time, cheap as the tables are stored in time order;
    numpy finds the intervals chunk by chunk, so memory follows the chunk)."""
    cols = ("device_id", "stream_id", "owner")
    keys = Keys(cols)
    sql = (f"SELECT device_id, coalesce(stream_id, {NULL_KEY}) AS stream_id, coalesce(owner, {NULL_KEY}) AS owner, "
           f"start_ns, end_ns FROM ({acts}) WHERE end_ns > start_ns ORDER BY start_ns, end_ns")
    who = np.zeros((3, 0), dtype=np.int64)  # per stream id: its key columns (NULL as NULL_KEY)
    for part, start, end in merged(src, sql, params, keys):
        if who.shape[1] < len(keys.ids):
            new = list(keys.ids)[who.shape[1]:]
            who = np.hstack((who, np.array([[NULL_KEY if v is None else v for v in k] for k in new], dtype=np.int64).T))
        dst.register("_m_chunk", pd.DataFrame({"device_id": who[0, part], "stream_id": who[1, part], "owner": who[2, part],
                                               "start_ns": start, "end_ns": end}))
        dst.execute("INSERT INTO _m SELECT * FROM _m_chunk")
        dst.unregister("_m_chunk")
