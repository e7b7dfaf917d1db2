"""memory_timeline: where device memory goes over the capture, its peak, and what was never freed, per device.

Semantics follow PyTorch's memory profiler (torch.profiler profile_memory=True, the '[memory]' events behind
`prof.key_averages()` "Self CUDA Mem" and the memory_timeline export) and Nsight's CUDA memory-usage view
(`--cuda-memory-usage=true`): the allocated level of a device is a step function that changes at every allocation
(+bytes) and free (-bytes) in the model's memory_events, events at one time applied in the profile's order.
Device memory is every memory_kind except host kinds ('Host', 'Pinned', 'Pageable') and address reservations
('Virtual'); those rows are counted, never added in.

level(t) = baseline_bytes + running sum of signed bytes up to t. baseline_bytes is what was allocated before the
first captured event: the allocator's own total where the profile states it (Kineto 'Total Allocated' minus the
first event's bytes), else the least the captured frees imply (max(0, -lowest running sum); 0 when every free
has its allocation in the capture). Reserved bytes exist only where the profile states them: the caching allocator's
pool (Kineto 'Total Reserved'), or the sum of the device's CUDA memory-pool sizes (Nsight CUDA_GPU_MEMORY_POOL_EVENTS
and the pool sizes on cudaMallocAsync rows; pool create/trim/destroy rows are memory events of kind 'pool' that move
no allocated bytes). A free pairs with the latest earlier allocation of the same address on the
device; an allocation with no later free at its address is "never freed within the capture" (a leak suspect: it
may be freed after the capture ended). "Live at the peak" is every captured allocation made at or before the peak
event and not freed by it, grouped by site (the innermost PyTorch op, the API call, or the variable name).

A window (start_ns/end_ns, or step = an iterations step) looks at part of the capture. Levels are always computed
over the whole capture, so the window starts at the level every earlier event left (start_allocated_bytes,
start_reserved_bytes: a point of the series at the window start, and a candidate for the peak, whose time is then the
window start); live at the peak includes allocations made before the window. Churn (allocations, frees, bytes,
rates over the window's span), never-freed allocations and frees without allocation count the window's events only.

OS-reported memory (os_memory): on Windows, Nsight also records the WDDM video memory manager's per-process levels
(GPU_MEMORY_USAGE_EVENTS / GPU_MEMORY_BUDGET_EVENTS, the model's os_memory_levels). Each event states a process's new
usage (or budget) in a segment group: 'local' (the adapter's own memory) or 'non-local' (system memory the GPU
reaches). That is everything the OS counts for the process (CUDA context, allocator pools, driver allocations), not
the allocator's live bytes, so it is reported apart from the allocated level, per device, segment group and
process: for each process that has GPU work or memory events in the profile, and for all processes the OS reported
on the adapter summed (each process at its latest level; one not yet reported counts 0). The budget is the process's
own latest budget event at the peak (null for the sum: budgets are per process). Windows carry the level in as above.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import ROWS, Trace
from .common import ToolResult, Window, capture_window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection
from .requirements import require

NOT_DEVICE = ("Host", "Pinned", "Pageable", "Virtual")
NO_SITE = "<site not recorded>"
_DEV = f"device_id IS NOT NULL AND memory_kind NOT IN ({', '.join(repr(k) for k in NOT_DEVICE)})"
_ALL = (-(1 << 63), (1 << 63) - 1)  # no window: every event is inside


class MemoryPoint(BaseModel):
    ts_ns: int = Field(description="time the bucket's highest allocated level was reached (an event time), ns")
    allocated_bytes: int = Field(description="highest allocated level within the bucket, bytes (the level right after "
                                 "the event at ts_ns)")
    reserved_bytes: int | None = Field(None, description="highest reserved (allocator pool) level the profile states "
                                       "within the bucket, bytes; null where the profile states none")
    events: int = Field(description="allocation and free events in the bucket")


class SiteBytes(BaseModel):
    site: str = Field(description=f"allocation site (innermost PyTorch op, API call or variable name); '{NO_SITE}' when "
                      "the profile does not say")
    allocations: int = Field(description="allocations of this site in the set")
    bytes: int = Field(description="their summed size, bytes")
    pct_of_set_bytes: float | None = Field(description="bytes / the set's bytes (live at peak, or never freed), %")


class DeviceMemory(BaseModel):
    device_id: int
    device_name: str | None
    device_memory_bytes: int | None = Field(description="device memory size the profile states, bytes")
    memory_kinds: list[str] = Field(description="memory_kind values counted as this device's memory")
    level_source: str = Field(description="how the level's baseline is known: 'profile totals' (Total Allocated) or "
                              "'captured events' (running sum; baseline = least memory the captured frees imply)")
    events: int = Field(description="allocation and free events of this device in the window")
    pool_events: int = Field(description="memory-pool events (created, trimmed, destroyed: Nsight) in the window")
    first_event_ns: int | None = Field(description="first memory event in the window, ns; null when none")
    last_event_ns: int | None = Field(description="last memory event in the window, ns; null when none")
    baseline_bytes: int = Field(description="allocated before the first captured event, bytes (see level_source)")
    start_allocated_bytes: int = Field(description="allocated level at the window start: baseline_bytes plus every "
                                       "captured event before it, bytes (= baseline_bytes without a window)")
    start_reserved_bytes: int | None = Field(description="reserved level at the window start (the last stated before "
                                             "it), bytes; null when none is stated before it")
    peak_allocated_bytes: int = Field(description="highest allocated level, bytes")
    peak_ts_ns: int = Field(description="first time the peak level was reached in the window, ns (the window start "
                            "when the level carried in is the peak)")
    pct_of_device_memory: float | None = Field(description="peak_allocated_bytes / device_memory_bytes, %; null when the "
                                               "profile states no memory size")
    final_allocated_bytes: int = Field(description="level after the last captured event, bytes")
    net_change_bytes: int = Field(description="final_allocated_bytes - start_allocated_bytes: the window's allocations "
                                  "minus frees, bytes")
    peak_reserved_bytes: int | None = Field(description="highest reserved (pool) level the profile states, bytes; null "
                                            "where it states none")
    peak_reserved_ts_ns: int | None = Field(description="first time that reserved level was reached, ns")
    allocations: int = Field(description="allocation events")
    frees: int = Field(description="free events")
    allocated_bytes: int = Field(description="bytes allocated (sum over allocation events)")
    freed_bytes: int = Field(description="bytes freed (sum over free events, positive)")
    allocations_per_s: float | None = Field(description="allocations / capture span (window.span_ns), per second")
    allocated_bytes_per_s: float | None = Field(description="allocated_bytes / capture span (window.span_ns), bytes per second")
    frees_without_allocation: int = Field(description="frees whose allocation is not in the capture (made earlier)")
    live_at_peak_allocations: int = Field(description="captured allocations live at the peak event")
    live_at_peak_bytes: int = Field(description="their bytes (= peak_allocated_bytes - baseline_bytes when every free "
                                    "pairs with a captured allocation)")
    live_at_peak_by_site: list[SiteBytes] = Field(description="live at the peak, by site, most bytes first (top `limit`)")
    never_freed_allocations: int = Field(description="allocations of the window with no later free at their address "
                                         "before the capture ended (leak suspects)")
    never_freed_bytes: int = Field(description="their bytes")
    never_freed_by_site: list[SiteBytes] = Field(description="never freed, by site, most bytes first (top `limit`)")
    series: list[MemoryPoint] = Field(description="allocated level over time: the step function's change points, or at "
                                      "most `points` time buckets keeping each bucket's highest level (the peak is "
                                      "always a point)")
    series_downsampled: bool = Field(description="true when the change points were more than `points` and were bucketed")
    stated_total_mismatches: int | None = Field(description="events whose stated Total Allocated differs from baseline + "
                                                "running sum (events missing from the profile); null without stated totals")


OS_SOURCE = ("Windows WDDM video memory manager (ETW VidMmProcessUsageChange / VidMmProcessBudgetChange; Nsight "
             "GPU_MEMORY_USAGE_EVENTS / GPU_MEMORY_BUDGET_EVENTS): process-level usage as the OS reports it, not "
             "allocator live bytes")
ALL_PROCESSES = -1  # internal key of the all-processes sum


class OsMemoryPoint(BaseModel):
    ts_ns: int = Field(description="time the bucket's highest usage was reached (an event time, or the window start), ns")
    usage_bytes: int = Field(description="highest OS-reported usage within the bucket, bytes")
    budget_bytes: int | None = Field(description="the process's budget in effect at ts_ns, bytes; null when none is "
                                     "stated by then, and for the all-processes sum")


class OsMemory(BaseModel):
    device_id: int
    device_name: str | None
    segment_group: str = Field(description="'local' (the adapter's own memory, DXGI segment group 0), 'non-local' "
                               "(system memory the GPU reaches, 1), else 'segment group <n>'")
    pid: int | None = Field(description="process the figures are for; null: all processes the OS reported on this "
                            "adapter, their levels summed")
    process_name: str | None
    source: str = Field(description="what these figures are")
    processes: int = Field(description="processes with a usage level on this adapter and segment group up to the "
                           "window end (1 for a process row)")
    usage_events: int = Field(description="usage events in the window (for the sum: of every process)")
    start_usage_bytes: int | None = Field(description="usage at the window start (the last level stated before it), "
                                          "bytes; null when none is stated before it")
    peak_usage_bytes: int = Field(description="highest OS-reported usage in the window, bytes")
    peak_usage_ts_ns: int = Field(description="first time that usage was reached, ns (the window start when the level "
                                  "carried in is the peak)")
    final_usage_bytes: int = Field(description="usage after the window's last event, bytes")
    budget_bytes: int | None = Field(description="the process's budget in effect at the peak (its latest budget event "
                                     "at or before peak_usage_ts_ns), bytes; null when none is stated by then, and for "
                                     "the all-processes sum")
    budget_events: int = Field(description="the process's budget events in the window")
    pct_of_budget: float | None = Field(description="peak_usage_bytes / budget_bytes, %")
    series: list[OsMemoryPoint] = Field(description="usage over time: the level's change points, or at most `points` "
                                        "time buckets keeping each bucket's highest level (the peak is always a point)")
    series_downsampled: bool


class MemoryTimelineResult(ToolResult):
    trace: str
    window: Window = Field(description="capture span, the caller's window or the step's: the denominator of every "
                           "per-second rate")
    definitions: dict[str, str]
    devices: list[DeviceMemory]
    other_memory: dict[str, int] = Field(description="events left out of the device figures, by memory_kind (host "
                                         "memory, pinned host buffers, virtual address reservations)")
    os_memory: list[OsMemory] = Field(default_factory=list, description="GPU memory the operating system reports per "
                                      "process (Windows WDDM usage and budget), per device, segment group and process; "
                                      "empty where the profile has none. Not allocator live bytes: see definitions")
    truncated: bool = Field(description="true when some device had more sites than `limit` in a by-site list")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def _ordered(device: int | None, lo: int, hi: int) -> tuple[str, list]:
    """Device-memory events with their position, level and pairing over the whole capture, the window [lo, hi)'s
    events (win) and its step function (pts: the level carried in at lo, then its events), as CTE bodies."""
    lo, hi = int(lo), int(hi)  # inlined: integers only
    where, params = _DEV, []
    if device is not None:
        where += " AND device_id = ?"
        params.append(device)
    return f"""
        ev AS (SELECT device_id, ts_ns, bytes, addr, kind, site, total_allocated_bytes AS ta, total_reserved_bytes AS tr,
                      row_number() OVER (PARTITION BY device_id ORDER BY ts_ns, rowid) AS pos
               FROM memory_events WHERE {where}),
        run AS (SELECT *, sum(bytes) OVER (PARTITION BY device_id ORDER BY pos ROWS UNBOUNDED PRECEDING) AS cum FROM ev),
        base AS (SELECT device_id,
                        coalesce(arg_min(ta - bytes, pos) FILTER (WHERE ta IS NOT NULL),
                                 greatest(0, -min(cum)))::BIGINT AS baseline,
                        count(ta) > 0 AS stated
                 FROM run GROUP BY device_id),
        lvl AS (SELECT r.*, b.baseline + r.cum AS level FROM run r JOIN base b USING (device_id)),
        -- each event's next event at the same address: a free there ends an allocation
        pair AS (SELECT *, CASE WHEN addr IS NOT NULL THEN lead(kind) OVER a END AS next_kind,
                        CASE WHEN addr IS NOT NULL THEN lead(pos) OVER a END AS next_pos,
                        CASE WHEN addr IS NOT NULL THEN lag(kind) OVER a END AS prev_kind
                 FROM lvl WINDOW a AS (PARTITION BY device_id, addr ORDER BY pos)),
        -- the level every event before the window left, as a point at the window start
        carry AS (SELECT device_id, max(pos) AS pos, arg_max(level, pos) AS level,
                         arg_max(tr, pos) FILTER (WHERE tr IS NOT NULL) AS tr
                  FROM lvl WHERE ts_ns < {lo} GROUP BY device_id),
        win AS (SELECT * FROM pair WHERE ts_ns >= {lo} AND ts_ns < {hi}),
        pts AS (SELECT device_id, pos, ts_ns, level, tr, kind FROM win
                UNION ALL SELECT device_id, pos, {lo}, level, tr, 'start' FROM carry)""", params


def _os_memory(trace: Trace, device: int | None, lo: int, hi: int, points: int) -> list[OsMemory]:
    """os_memory_levels per (device, segment group, process): the processes with GPU work or memory events in the
    profile, and the sum over every process the OS reported (each at its latest level), over the window [lo, hi)."""
    if not trace.scalar("SELECT count(*) FROM (SELECT 1 FROM os_memory_levels LIMIT 1)"):
        return []
    lo, hi = int(lo), int(hi)  # inlined: integers only
    dev, params = ("AND device_id = ?", [device]) if device is not None else ("", [])
    sql = f"""
        WITH u AS (SELECT device_id, segment_group AS seg, pid, ts_ns, bytes, rowid AS r FROM os_memory_levels
                   WHERE metric = 'usage' {dev}),
        mine AS (SELECT DISTINCT pid FROM (SELECT pid FROM kernels UNION ALL SELECT pid FROM memops
                                           UNION ALL SELECT pid FROM memory_events) WHERE pid IS NOT NULL),
        lv AS (SELECT device_id, seg, pid, ts_ns, r, bytes AS level FROM u WHERE pid IN (SELECT pid FROM mine)
               UNION ALL
               SELECT device_id, seg, {ALL_PROCESSES}, ts_ns, r,
                      sum(bytes - coalesce(prev, 0)) OVER (PARTITION BY device_id, seg ORDER BY ts_ns, r
                                                           ROWS UNBOUNDED PRECEDING)
               FROM (SELECT *, lag(bytes) OVER (PARTITION BY device_id, seg, pid ORDER BY ts_ns, r) AS prev FROM u)),
        carry AS (SELECT device_id, seg, pid, arg_max(level, (ts_ns, r)) AS level FROM lv WHERE ts_ns < {lo} GROUP BY ALL),
        pts AS (SELECT device_id, seg, pid, ts_ns, r, level, true AS ev FROM lv WHERE ts_ns >= {lo} AND ts_ns < {hi}
                UNION ALL SELECT device_id, seg, pid, {lo}, -1, level, false FROM carry),
        b AS (SELECT device_id, segment_group AS seg, pid, ts_ns, rowid AS r, bytes FROM os_memory_levels
              WHERE metric = 'budget' {dev}),
        -- the budget stated last at each time (the latest row of a time)
        bt AS (SELECT device_id, seg, pid, ts_ns, arg_max(bytes, r) AS bytes FROM b GROUP BY ALL),
        span AS (SELECT device_id, seg, pid, min(ts_ns) AS lo, max(ts_ns) - min(ts_ns) + 1 AS width, count(*) AS n
                 FROM pts GROUP BY ALL),
        bk AS (SELECT p.*, CASE WHEN s.n <= ? THEN row_number() OVER (PARTITION BY p.device_id, p.seg, p.pid ORDER BY p.ts_ns, p.r)
                                ELSE ((p.ts_ns - s.lo)::HUGEINT * ? // s.width)::BIGINT END AS bucket, s.n > ? AS down
               FROM pts p JOIN span s USING (device_id, seg, pid)),
        g AS (SELECT device_id, seg, pid, arg_min(ts_ns, (-level, ts_ns, r)) AS ts, max(level) AS level, any_value(down) AS down
              FROM bk GROUP BY device_id, seg, pid, bucket),
        series AS (SELECT g.device_id, g.seg, g.pid, any_value(g.down) AS down,
                          list({{'ts': g.ts, 'level': g.level, 'budget': CASE WHEN g.pid <> {ALL_PROCESSES} THEN bt.bytes END}}
                               ORDER BY g.ts) AS pts
                   FROM g ASOF LEFT JOIN bt ON g.device_id = bt.device_id AND g.seg = bt.seg AND g.pid = bt.pid
                                            AND g.ts >= bt.ts_ns
                   GROUP BY ALL),
        pk AS (SELECT device_id, seg, pid, max(level) AS peak, arg_min(ts_ns, (-level, ts_ns, r)) AS peak_ts,
                      arg_max(level, (ts_ns, r)) AS final, count(*) FILTER (WHERE ev) AS events
               FROM pts GROUP BY ALL),
        nproc AS (SELECT device_id, seg, count(DISTINCT pid) AS n FROM u WHERE ts_ns < {hi} GROUP BY ALL)
        SELECT pk.device_id, pk.seg, pk.pid, pk.peak, pk.peak_ts, pk.final, pk.events, c.level AS start_level,
               CASE WHEN pk.pid = {ALL_PROCESSES} THEN np.n ELSE 1 END AS processes,
               CASE WHEN pk.pid <> {ALL_PROCESSES} THEN
                   (SELECT arg_max(bytes, (ts_ns, r)) FROM b WHERE b.device_id = pk.device_id AND b.seg = pk.seg
                    AND b.pid = pk.pid AND b.ts_ns <= pk.peak_ts) END AS budget,
               (SELECT count(*) FROM b WHERE b.device_id = pk.device_id AND b.seg = pk.seg AND b.pid = pk.pid
                AND b.ts_ns >= {lo} AND b.ts_ns < {hi}) AS budget_events,
               s.pts, s.down
        FROM pk JOIN series s USING (device_id, seg, pid) LEFT JOIN carry c USING (device_id, seg, pid)
        JOIN nproc np USING (device_id, seg)
        ORDER BY pk.device_id, pk.seg, pk.pid = {ALL_PROCESSES}, pk.pid"""
    rows = trace.memo(("memory_timeline.os", device, lo, hi, points),
                      lambda: trace.sql_dicts(sql, params * 2 + [points, points, points]), persist=ROWS)
    devs = {d: name for d, name in trace.sql("SELECT device_id, name FROM devices")}
    procs = {p: name for p, name in trace.sql("SELECT pid, name FROM processes")}
    out = []
    for r in rows:
        pid = None if r["pid"] == ALL_PROCESSES else int(r["pid"])
        budget = None if r["budget"] is None else int(r["budget"])
        out.append(OsMemory(
            device_id=int(r["device_id"]), device_name=devs.get(r["device_id"]), segment_group=r["seg"], pid=pid,
            process_name=procs.get(pid) if pid is not None else None, source=OS_SOURCE, processes=int(r["processes"]),
            usage_events=int(r["events"]), start_usage_bytes=None if r["start_level"] is None else int(r["start_level"]),
            peak_usage_bytes=int(r["peak"]), peak_usage_ts_ns=int(r["peak_ts"]), final_usage_bytes=int(r["final"]),
            budget_bytes=budget, budget_events=int(r["budget_events"]), pct_of_budget=pct(int(r["peak"]), budget),
            series=[OsMemoryPoint(ts_ns=int(p["ts"]), usage_bytes=int(p["level"]),
                                  budget_bytes=None if p["budget"] is None else int(p["budget"])) for p in r["pts"]],
            series_downsampled=bool(r["down"])))
    return out


def _window(trace: Trace, start_ns: int | None, end_ns: int | None, step: int | None) -> tuple[Window, tuple[int, int]]:
    """The window analysed and its [lo, hi) bounds for the SQL (all events without a window)."""
    if step is None:
        if start_ns is None and end_ns is None:
            return capture_window(trace), _ALL
        _, w = resolve_selection(trace, None, None, start_ns, end_ns)
        return w, (w.start_ns, w.end_ns)
    if start_ns is not None or end_ns is not None:
        raise ProfileError("give either a step (step=) or a time window (start_ns/end_ns), not both.")
    from .iterations import chosen_steps  # local: iterations is only needed for a step

    choice, steps = chosen_steps(trace)
    p0, t0 = (int(steps["pid"].iloc[0]), int(steps["tid"].iloc[0]))  # the first series, as iterations lists them
    series = steps[(steps["pid"] == p0) & (steps["tid"] == t0)]
    if not 0 <= step < len(series):
        raise ProfileError(f"step={step} does not exist: the series '{choice.pattern}' (process {p0}, thread "
                           f"{t0}) has steps 0..{len(series) - 1}; iterations lists them.")
    lo, hi = int(series["start_ns"].iloc[step]), int(series["end_ns"].iloc[step])
    return (Window(start_ns=lo, end_ns=hi, span_ns=hi - lo, source=f"iteration step {step} of '{choice.pattern}' (iterations)"),
            (lo, hi))


def memory_timeline(trace: Trace, *, device: int | None = None, start_ns: int | None = None, end_ns: int | None = None,
                    step: int | None = None, points: int = 50, limit: int = 10) -> MemoryTimelineResult:
    require(trace, "memory_timeline")
    points = max(2, min(int(points), 2000))
    limit = max(1, min(int(limit), 100))
    window, (lo, hi) = _window(trace, start_ns, end_ns, step)
    if device is not None:
        known = [d for (d,) in trace.sql(f"SELECT device_id FROM memory_events WHERE {_DEV} UNION "
                                         "SELECT device_id FROM os_memory_levels ORDER BY 1")]
        if device not in known:
            raise ProfileError(f"device {device} has no device-memory events in this profile; devices with memory events: "
                               f"{known}. trace_info lists the devices.")
    cte, params = _ordered(device, lo, hi)
    summary_sql = f"""
        WITH {cte},
        pk AS (SELECT device_id, arg_min(pos, (-level, pos)) AS peak_pos, max(level) AS peak, arg_min(ts_ns, (-level, pos)) AS peak_ts,
                      max(tr) AS peak_res, arg_min(ts_ns, (-tr, pos)) FILTER (WHERE tr IS NOT NULL) AS peak_res_ts
               FROM pts GROUP BY device_id),
        agg AS (
            SELECT p.device_id, count(*) FILTER (WHERE p.kind <> 'pool') AS events, count(*) FILTER (WHERE p.kind = 'pool') AS pools,
                   min(p.ts_ns) AS first_ns, max(p.ts_ns) AS last_ns, arg_max(p.level, p.pos) AS final,
                   count(*) FILTER (WHERE p.kind = 'alloc') AS allocs, count(*) FILTER (WHERE p.kind = 'free') AS frees,
                   coalesce(sum(p.bytes) FILTER (WHERE p.kind = 'alloc'), 0)::BIGINT AS alloc_bytes,
                   coalesce(-sum(p.bytes) FILTER (WHERE p.kind = 'free'), 0)::BIGINT AS freed_bytes,
                   count(*) FILTER (WHERE p.kind = 'free' AND p.prev_kind IS DISTINCT FROM 'alloc') AS orphan_frees,
                   count(*) FILTER (WHERE p.ta IS NOT NULL AND p.ta <> p.level) AS mismatches
            FROM win p GROUP BY p.device_id)
        SELECT pk.device_id, b.baseline, b.stated, coalesce(c.level, b.baseline) AS start_level, c.tr AS start_res,
               coalesce(a.events, 0) AS events, coalesce(a.pools, 0) AS pools, a.first_ns, a.last_ns,
               pk.peak, pk.peak_ts, pk.peak_pos, pk.peak_res, pk.peak_res_ts, coalesce(a.final, c.level) AS final,
               coalesce(a.allocs, 0) AS allocs, coalesce(a.frees, 0) AS frees, coalesce(a.alloc_bytes, 0) AS alloc_bytes,
               coalesce(a.freed_bytes, 0) AS freed_bytes, coalesce(a.orphan_frees, 0) AS orphan_frees,
               CASE WHEN b.stated THEN coalesce(a.mismatches, 0) END AS mismatches, m.kinds
        FROM pk JOIN base b USING (device_id) LEFT JOIN carry c USING (device_id) LEFT JOIN agg a USING (device_id)
        JOIN (SELECT device_id, list(DISTINCT memory_kind ORDER BY memory_kind) AS kinds FROM memory_events
              WHERE {_DEV} GROUP BY device_id) m USING (device_id)
        ORDER BY pk.device_id"""
    key = (device, lo, hi)
    summary = trace.memo(("memory_timeline.summary", *key), lambda: trace.sql_dicts(summary_sql, params), persist=ROWS)
    # Live at the peak: every captured allocation up to the peak event not freed by it, those before the window included.
    sites_sql = f"""
        WITH {cte},
        pk AS (SELECT device_id, arg_min(pos, (-level, pos)) AS peak_pos FROM pts GROUP BY device_id),
        al AS (SELECT p.*, pk.peak_pos, CASE WHEN p.next_kind = 'free' THEN p.next_pos END AS freed_pos
               FROM pair p JOIN pk USING (device_id) WHERE p.kind = 'alloc')
        SELECT device_id, 'peak' AS what, coalesce(site, '{NO_SITE}') AS site, count(*) AS n, sum(bytes)::BIGINT AS bytes
        FROM al WHERE pos <= peak_pos AND (freed_pos IS NULL OR freed_pos > peak_pos) GROUP BY ALL
        UNION ALL
        SELECT device_id, 'leak', coalesce(site, '{NO_SITE}'), count(*), sum(bytes)::BIGINT
        FROM al WHERE freed_pos IS NULL AND ts_ns >= {int(lo)} AND ts_ns < {int(hi)} GROUP BY ALL
        ORDER BY device_id, what, bytes DESC, n DESC, site"""
    sites = trace.memo(("memory_timeline.sites", *key), lambda: trace.sql_dicts(sites_sql, params), persist=ROWS)
    series_sql = f"""
        WITH {cte},
        span AS (SELECT device_id, min(ts_ns) AS lo, max(ts_ns) - min(ts_ns) + 1 AS width, count(*) AS n FROM pts GROUP BY device_id),
        b AS (SELECT l.*, CASE WHEN s.n <= ? THEN l.pos
                               ELSE ((l.ts_ns - s.lo)::HUGEINT * ? // s.width)::BIGINT END AS bucket, s.n > ? AS down
              FROM pts l JOIN span s USING (device_id))
        SELECT device_id, bucket, arg_min(ts_ns, (-level, pos)) AS ts_ns, max(level)::BIGINT AS allocated,
               max(tr)::BIGINT AS reserved, count(*) FILTER (WHERE kind IN ('alloc', 'free')) AS events, any_value(down) AS down
        FROM b GROUP BY device_id, bucket ORDER BY device_id, bucket"""
    series = trace.memo(("memory_timeline.series", *key, points),
                        lambda: trace.sql_dicts(series_sql, params + [points, points, points]), persist=ROWS)
    other = dict(trace.sql(f"SELECT memory_kind, count(*) FROM memory_events WHERE NOT ({_DEV}) GROUP BY 1 ORDER BY 1"))
    devs = {d: (name, mem) for d, name, mem in trace.sql("SELECT device_id, name, memory_bytes FROM devices")}
    span_s = window.span_ns / 1e9 if window.span_ns > 0 else None
    out, truncated = [], False
    for r in summary:
        dev = r["device_id"]

        def listed(what: str) -> tuple[list[SiteBytes], int, int]:
            rows = [s for s in sites if s["device_id"] == dev and s["what"] == what]
            total = sum(int(s["bytes"]) for s in rows)
            return ([SiteBytes(site=clip_name(s["site"]), allocations=int(s["n"]), bytes=int(s["bytes"]),
                               pct_of_set_bytes=pct(int(s["bytes"]), total)) for s in rows[:limit]],
                    sum(int(s["n"]) for s in rows), total)

        peak_sites, peak_n, peak_b = listed("peak")
        leak_sites, leak_n, leak_b = listed("leak")
        truncated |= len([s for s in sites if s["device_id"] == dev and s["what"] == "peak"]) > limit
        truncated |= len([s for s in sites if s["device_id"] == dev and s["what"] == "leak"]) > limit
        pts = [p for p in series if p["device_id"] == dev]
        name, mem = devs.get(dev, (None, None))
        out.append(DeviceMemory(
            device_id=dev, device_name=name, device_memory_bytes=mem, memory_kinds=list(r["kinds"] or []),
            level_source="profile totals (Total Allocated)" if r["stated"] else "captured events",
            events=int(r["events"]), pool_events=int(r["pools"]),
            first_event_ns=None if r["first_ns"] is None else int(r["first_ns"]),
            last_event_ns=None if r["last_ns"] is None else int(r["last_ns"]),
            baseline_bytes=int(r["baseline"]), start_allocated_bytes=int(r["start_level"]),
            start_reserved_bytes=None if r["start_res"] is None else int(r["start_res"]),
            peak_allocated_bytes=int(r["peak"]), peak_ts_ns=int(r["peak_ts"]), pct_of_device_memory=pct(int(r["peak"]), mem),
            final_allocated_bytes=int(r["final"]), net_change_bytes=int(r["final"]) - int(r["start_level"]),
            peak_reserved_bytes=None if r["peak_res"] is None else int(r["peak_res"]),
            peak_reserved_ts_ns=None if r["peak_res_ts"] is None else int(r["peak_res_ts"]),
            allocations=int(r["allocs"]), frees=int(r["frees"]), allocated_bytes=int(r["alloc_bytes"]),
            freed_bytes=int(r["freed_bytes"]),
            allocations_per_s=None if span_s is None else round(int(r["allocs"]) / span_s, 3),
            allocated_bytes_per_s=None if span_s is None else round(int(r["alloc_bytes"]) / span_s, 3),
            frees_without_allocation=int(r["orphan_frees"]),
            live_at_peak_allocations=peak_n, live_at_peak_bytes=peak_b, live_at_peak_by_site=peak_sites,
            never_freed_allocations=leak_n, never_freed_bytes=leak_b, never_freed_by_site=leak_sites,
            series=[MemoryPoint(ts_ns=int(p["ts_ns"]), allocated_bytes=int(p["allocated"]),
                                reserved_bytes=None if p["reserved"] is None else int(p["reserved"]), events=int(p["events"]))
                    for p in pts],
            series_downsampled=bool(pts and pts[0]["down"]),
            stated_total_mismatches=None if r["mismatches"] is None else int(r["mismatches"]),
        ))
    os_memory = _os_memory(trace, device, lo, hi, points)
    if not out and not os_memory and (lo, hi) != _ALL:
        raise ProfileError(f"no device-memory event lies in or before the window [{window.start_ns}, {window.end_ns}) ns; "
                           "widen it or call memory_timeline without a window (trace_info lists the capture span).")
    if not out and not os_memory:
        raise ProfileError(f"{trace.path.name}: the profile's memory events are all host memory or address reservations "
                           f"({', '.join(f'{k} {n}' for k, n in other.items())}); no device memory to chart.")
    return MemoryTimelineResult(
        trace=str(trace.path), window=window,
        definitions={
            "allocated level": "baseline_bytes + running sum of signed bytes (+ alloc, - free) in time order, per device",
            "peak": "highest allocated level; peak_ts_ns is the first event that reached it",
            "live at peak": "captured allocations at or before the peak event whose free (the next event at the same "
                            "address) comes after it or never",
            "never freed": "allocations of the window with no later free at their address before the capture ended",
            "window start": "start_allocated_bytes / start_reserved_bytes: the levels every event before the window left; "
                            "a series point at the window start and a peak candidate",
            "reserved": "Kineto: the caching allocator's Total Reserved; Nsight: the sum of the device's CUDA memory-pool "
                        "sizes (CUDA_GPU_MEMORY_POOL_EVENTS and cudaMallocAsync rows), memory outside pools not included",
            "site": "innermost PyTorch cpu_op on the allocating thread (Kineto), the variable name or API call by "
                    "correlation id (Nsight), the HIP call by stack id (rocpd)",
            **({"os_memory usage": "the process's video memory as the Windows WDDM memory manager counts it, per segment "
                                   "group (CUDA context, allocator pools, driver allocations): not allocator live bytes, "
                                   "and not comparable byte for byte with peak_allocated_bytes",
                "os_memory budget": "what the OS lets the process keep resident in the segment group (its latest "
                                    "budget event), per process",
                "os_memory all processes": "pid null: every process the OS reported on the adapter, each at its latest "
                                           "level, summed (a process not yet reported counts 0)"} if os_memory else {}),
        },
        devices=out, os_memory=os_memory, other_memory={k: int(n) for k, n in other.items()}, truncated=truncated,
        hint=(f"more sites than limit={limit} in a by-site list; raise limit (max 100) or use sql_query on memory_events"
              if truncated else None),
        data_issues=data_issue_notes(trace, ("memory_events", "os_memory_levels")),
    )
