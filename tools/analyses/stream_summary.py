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
whose process is unknown belongs to the stream's only process, else the device's (owners.py, the rule
gpu_timeline and the rank tools share).

Window: ops overlapping [start_ns, end_ns) are counted; their times are clipped to the window.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, data_issue_notes, data_issues_field, pct, resolve_selection, skipped_note, ToolResult
from .intervals import merge_chunks, time_chunks
from .owners import owner_of, profile_unowned
from .requirements import require


class StreamRow(BaseModel):
    device_id: int
    stream_id: int | None = Field(description="stream id on this device (null: the profile does not say)")
    pid: int | None = Field(description="process owning the stream: its ops' process; for ops without one, the stream's "
                                        "only process, else the device's (owners.py; null when none)")
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
    tables = ("kernels", "memops") if include_memops else ("kernels",)
    found = trace.memo(("stream_summary", where, tuple(params), lo, hi, include_memops),
                       lambda: _pass(trace, where, params, lo, hi, tables))
    if found is None:
        what = "kernels, copies or sets" if include_memops else "kernels"
        raise ProfileError(f"no GPU activity ({what}) in the selection (device/time window), so there are no streams to "
                           "summarise. trace_info shows what the profile holds." + skipped_note(trace, ("kernels", "memops")))
    stats, sweeps, per_stream = found
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


class _Streams:
    """The streams (device, stream, owner) of a selection, numbered: `frame` maps each (device_id, stream_id, pid) of
    its ops to its stream's code; `keys[code]` is the stream's key (None for NULL). The owner: owners.py's, as in
    gpu_timeline (`unowned`: owners.profile_unowned)."""

    def __init__(self, rows: list[tuple], unowned: dict[tuple, int | None]):
        codes: dict[tuple, int] = {}
        cols = [[], [], [], []]
        for d, st, p in rows:
            c = codes.setdefault((d, st, owner_of(unowned, d, st, p)), len(codes))
            for col, v in zip(cols, (d, st, p, c)):
                col.append(v)
        self.keys = list(codes)
        self.frame = pd.DataFrame({c: pd.array(v, dtype="Int64") for c, v in zip(("device_id", "stream_id", "pid", "code"), cols)})


def _pass(trace: Trace, where: str, params: list, lo: int, hi: int, tables: tuple[str, ...]
          ) -> tuple[list[dict], dict[int, dict], dict[tuple, tuple[int, int, int]]] | None:
    """(per stream, its op counts and summed work; per device, the sweep (_sweeps); per stream, its busy ns, first and
    last ns), or None without ops: one pass over the ops in time order. DuckDB sorts three integers per op (clipped
    times; stream code x 4 + kind: 0 kernel, 1 copy, 2 set), the streams numbered beforehand from their distinct
    keys (a few rows); numpy counts every op and merges the non-empty ones (intervals.merge_chunks) into the temp
    table the sweep reads. Filtering the empty ones or finding the owners in SQL had DuckDB hold every op twice."""
    kinds = {"kernels": "0", "memops": "CASE WHEN op = 'set' THEN 2 ELSE 1 END"}
    rows = trace.sql(" UNION ".join(f"SELECT DISTINCT device_id, stream_id, pid FROM {t} WHERE {where}" for t in tables),
                     params * len(tables))
    if not rows:
        return None
    streams = _Streams(rows, profile_unowned(trace))
    n = len(streams.keys)
    counts, work = np.zeros(n * 3, dtype=np.int64), np.zeros(n * 3, dtype=np.int64)  # per stream code x 3 + kind
    ops = " UNION ALL ".join(f"SELECT device_id, stream_id, pid, {kinds[t]} AS what, start_ns, end_ns FROM {t} WHERE {where}"
                             for t in tables)
    sql = f"""
        SELECT greatest(a.start_ns, {lo}) AS start_ns, least(a.end_ns, {hi}) AS end_ns, s.code * 4 + a.what AS k
        FROM ({ops}) a JOIN _ss_streams s ON a.device_id = s.device_id AND a.stream_id IS NOT DISTINCT FROM s.stream_id
                                         AND a.pid IS NOT DISTINCT FROM s.pid
        ORDER BY start_ns, end_ns"""

    def chunks(cur):
        for ch in time_chunks(cur, sql, params * len(tables), {"start_ns": 0, "end_ns": 0, "k": 0}):
            k, start, end = ch["k"], ch["start_ns"], ch["end_ns"]
            at = (k >> 2) * 3 + (k & 3)
            np.add.at(counts, at, 1)
            np.add.at(work, at, end - start)
            keep = end > start
            yield k[keep] >> 2, start[keep], end[keep]

    sweeps, per_stream = _sweeps(trace, streams, chunks)
    c, w = counts.reshape(n, 3), work.reshape(n, 3)
    stats = [{"device_id": d, "stream_id": st, "owner": o, "kernels": int(c[i, 0]), "copies": int(c[i, 1]), "sets": int(c[i, 2]),
              "kernel_work": int(w[i, 0]), "memop_work": int(w[i, 1] + w[i, 2])} for i, (d, st, o) in enumerate(streams.keys)]
    return stats, sweeps, per_stream


def _sweeps(trace: Trace, streams: _Streams, chunks) -> tuple[dict[int, dict], dict[tuple, tuple[int, int, int]]]:
    """(per device, a sweep over the streams' busy intervals; per stream (device, stream, owner), its busy ns, first
    and last ns), from the streams' merged intervals (disjoint within a stream, touching ones joined), so each
    stream's union is computed once. The sweep: +1 at a start, -1 at an end, ends before starts at equal times so
    touching intervals of two streams are not concurrent. In SQL: only the per-level times and the bounds of the first
    period at the top level come back."""
    cur, src = trace.con.cursor(), trace.con.cursor()
    try:
        # The merged intervals feed the per-stream figures and the sweep's two event lists: a temp table, made once
        # (by _merge, from one pass over the ops in time order) and read by both statements.
        cur.execute("CREATE OR REPLACE TEMP TABLE _m (device_id BIGINT, code BIGINT, start_ns BIGINT, end_ns BIGINT)")
        try:
            _merge(src, cur, streams, chunks)
            per_stream = {streams.keys[code]: (int(busy), int(first), int(last)) for code, busy, first, last in cur.execute(
                "SELECT code, sum(end_ns - start_ns)::BIGINT, min(start_ns), max(end_ns) FROM _m GROUP BY ALL").fetchall()}
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
    return out, per_stream


def _merge(src, dst, streams: _Streams, chunks) -> None:
    """Fill `dst`'s temp table _m with each stream's merged intervals (device, stream code, start, end), from the pass
    `chunks` runs on `src` (intervals.merge_chunks: DuckDB sorts by time, cheap as the tables are stored in time order;
    numpy finds the intervals chunk by chunk, so memory follows the chunk)."""
    src.register("_ss_streams", streams.frame)
    device = np.array([k[0] for k in streams.keys], dtype=np.int64)
    for code, start, end in merge_chunks(chunks(src)):
        dst.register("_m_chunk", pd.DataFrame({"device_id": device[code], "code": code, "start_ns": start, "end_ns": end}))
        dst.execute("INSERT INTO _m SELECT * FROM _m_chunk")
        dst.unregister("_m_chunk")
