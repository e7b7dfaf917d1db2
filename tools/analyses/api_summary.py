"""api_summary: what the host threads spend in the CUDA/HIP runtime, when they are blocked, and how
kernel launches reach the GPU.

Three sections, each with its own denominators:
  * API calls by name, per process (or per thread): count and duration statistics (nsys
    `cuda_api_sum` style), with the share of the process's (thread's) summed API time.
  * Host-blocked time per thread = the INTERVAL UNION of the calls that hold the thread until GPU
    work finishes: explicit synchronisation (`*Synchronize`), blocking copies (`*Memcpy*` without
    `Async`, e.g. cudaMemcpy, cuMemcpyHtoD, hipMemcpyWithStream), async copies that block because
    the host buffer is pageable (a `*Memcpy*Async` call whose copy has a 'Pageable' side), and
    event/stream-query spin loops (runs of back-to-back `*EventQuery`/`*StreamQuery` calls, from the
    first call's entry to the last call's return). Not counted: cudaStreamWaitEvent (asynchronous
    for the host: it makes a stream, not the thread, wait), memsets, cudaFree/cudaMalloc (may
    synchronise implicitly; their time is in the API table), HSA calls (nested inside HIP calls).
  * Launch analysis per device and stream for kernels linked to their launching call (same process
    and correlation id; graph launches map one call to many kernels). Three separate figures:
    API duration (call end - call start, per launch call), queue delay (max(0, end of the previous
    op on the stream - call end): the GPU was still busy with earlier work), and launch latency
    (kernel start - max(call end, previous op end): time from "ready to run" to running). A kernel
    that started before its call returned (the call blocked) or before the previous op on its stream
    ended has a negative difference, which is no latency: it is left out of launch latency and counted. `kernel start - call start` (PerfAdvisor's "launch overhead") and `kernel start - call
    end` (HTA's "launch_delay") mix queueing into launch cost and are not reported.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from .common import CONTAINS_SQL, Window, clip_name, contains_pattern, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .containment import temp_tables
from .intervals import INT64_MIN, part_order, reach_by_part, time_chunks, unions, unions_on
from .requirements import left_out, require

CATEGORIES = ("synchronize", "blocking_copy", "pageable_async_copy", "event_query_spin")

# Name rules (names arrive with version suffixes folded; regexes are anchored, case sensitive).
SYNC_RE = r"^(cuda|cu|hip)[A-Za-z]*Synchronize$"
COPY_RE = r"^(cuda|cu|hip)Memcpy"
QUERY_RE = r"^(cuda|cu|hip)(Event|Stream)Query$"
LAUNCH_RE = r"^(cuda|cu|hip)[A-Za-z]*Launch"
HOST_KIND_UNKNOWN = ("Host", "Unknown")  # a copy side named this way does not tell pageable from pinned

DEFINITIONS = {
    "api_time": "summed durations of API calls (work: nested calls on one thread count twice); api_busy_ns is their interval union",
    "blocked": "interval union per thread of synchronize / blocking_copy / pageable_async_copy / event_query_spin intervals",
    "synchronize": "calls named (cuda|cu|hip)*Synchronize (device, stream, event, context)",
    "blocking_copy": "(cuda|cu|hip)Memcpy* calls without 'Async' in the name (cudaMemcpy, cudaMemcpy2D, cuMemcpyHtoD, hipMemcpyWithStream, ...)",
    "pageable_async_copy": "*Memcpy*Async calls whose copy (same process and correlation id) has a 'Pageable' source or destination",
    "event_query_spin": "runs of >= spin_min_calls consecutive (cuda|cu|hip)(Event|Stream)Query calls on one thread, each within spin_max_gap_ns of the previous; the run counts from first entry to last return",
    "not_blocking": "cudaStreamWaitEvent/hipStreamWaitEvent (the stream waits, not the thread), memsets, cudaFree/cudaMalloc (may synchronise implicitly; see the API table), HSA calls",
    "thread_api_span": "first API call entry to last API call return of the thread (clipped to the window)",
    "queue_delay": "max(0, end of the previous kernel/copy/set on the same device, process and stream - launch call end)",
    "launch_latency": "kernel start - max(launch call end, previous op end on the stream), over the linked kernels where it is >= 0 "
                      "(the others started before their call returned or their predecessor ended: left out); cross-stream waits show up here",
    "api_duration": "launch call end - start, once per launch call (a graph launch counts once)",
    "tiny_kernel": "kernel shorter than its launch call (HTA's short-kernel rule), among calls that launched exactly one kernel",
    "kernels_per_s": "kernels / kernel span (first kernel start to last kernel end of the row)",
}


class ApiGroup(BaseModel):
    pid: int | None = Field(description="process that made the calls")
    tid: int | None = Field(None, description="thread (per_thread mode only)")
    name: str = Field(description="API name, version suffix folded")
    api: str | None = Field(description="API family: cuda_runtime, cuda_driver, hip, hsa, ...")
    count: int = Field(description="calls starting in the window")
    total_ns: int = Field(description="summed call duration, ns")
    pct_of_process_api_time: float | None = Field(description="total_ns / summed API time of the process in the window, %")
    pct_of_thread_api_time: float | None = Field(None, description="total_ns / summed API time of the thread, % (per_thread mode)")
    avg_ns: float = Field(description="mean call duration, ns")
    median_ns: float = Field(description="median call duration, ns")
    min_ns: int
    max_ns: int
    std_ns: float | None = Field(description="sample standard deviation (n-1), ns; null for a single call")


class ProcessApiTotals(BaseModel):
    pid: int | None
    process_name: str | None
    threads: int = Field(description="threads with API calls in the window")
    api_calls: int = Field(description="API calls starting in the window")
    summed_api_time_ns: int = Field(description="sum of their durations (work), ns")
    api_names: int = Field(description="distinct API names")


class BlockedContributor(BaseModel):
    name: str = Field(description="API name; spin loops are labelled '<name> spin loop'")
    category: str = Field(description="synchronize, blocking_copy, pageable_async_copy or event_query_spin")
    calls: int = Field(description="calls (spin loops: loops) of this name on the thread overlapping the window")
    blocked_ns: int = Field(description="union of their intervals within the window, ns")


class ThreadBlocked(BaseModel):
    pid: int | None
    tid: int | None
    thread_name: str | None
    api_calls: int = Field(description="API calls of the thread overlapping the window")
    thread_api_span_ns: int = Field(description="first API call entry to last API call return (clipped to the window), ns")
    api_busy_ns: int = Field(description="union of the thread's API call intervals (time inside the runtime), ns")
    blocked_ns: int = Field(description="union of the thread's blocking intervals, ns")
    pct_of_thread_api_span: float | None = Field(description="blocked_ns / thread_api_span_ns, %")
    pct_of_window: float | None = Field(description="blocked_ns / window span (capture span unless a window was given), %")
    blocked_by_category_ns: dict[str, int] = Field(description="union per category, ns (categories can overlap, so they may sum above blocked_ns)")
    contributors: list[BlockedContributor] = Field(description="blocking calls by name, most blocked time first (at most 8)")


class ProcessBlocked(BaseModel):
    pid: int | None
    blocked_any_thread_ns: int = Field(description="union over the process's threads: wall time with >= 1 thread blocked, ns")
    blocked_thread_sum_ns: int = Field(description="sum of the per-thread unions (thread-time), ns")
    pct_of_window: float | None = Field(description="blocked_any_thread_ns / window span, %")


class Distribution(BaseModel):
    count: int = Field(description="values in the distribution")
    avg_ns: float | None
    median_ns: float | None = Field(description="median (linear interpolation), ns")
    p90_ns: float | None = Field(description="90th percentile (linear interpolation between closest ranks), ns")
    max_ns: int | None


class LaunchStats(BaseModel):
    device_id: int
    pid: int | None = Field(None, description="process owning the stream (null on the all-streams row of a device)")
    stream_id: int | None = Field(None, description="stream; null = all streams of the device")
    kernels: int = Field(description="kernels starting in the window")
    unlinked_kernels: int = Field(description="kernels whose launching call is not in the profile (left out of the launch figures)")
    launch_calls: int = Field(description="distinct API calls that launched the linked kernels")
    launch_apis: dict[str, int] = Field(description="launch calls by API name")
    graph_launch_calls: int = Field(description="launch calls that launched more than one kernel (graph launches)")
    api_duration: Distribution = Field(description="launch call end - start, one value per launch call")
    queue_delay: Distribution = Field(description="max(0, previous op end on the stream - launch call end), per linked kernel")
    launch_latency: Distribution = Field(description="kernel start - max(call end, previous op end), per linked kernel where it is "
                                                     ">= 0 (count says how many)")
    kernels_started_before_call_returned: int = Field(description="linked kernels that started before their launch call returned "
                                                                  "(left out of launch_latency)")
    single_kernel_launches: int = Field(description="linked kernels whose launch call launched only them (tiny-kernel denominator)")
    tiny_kernels: int = Field(description="of those, kernels shorter than their launch call")
    tiny_pct_of_single_kernel_launches: float | None = Field(description="tiny_kernels / single_kernel_launches, %")
    kernel_span_ns: int = Field(description="first kernel start to last kernel end of the row, ns")
    kernels_per_s_over_kernel_span: float | None = Field(description="kernels / kernel_span_ns, per second")


class ApiSummaryResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | str | bool | None]
    definitions: dict[str, str] = Field(description="what each figure means")
    processes: list[ProcessApiTotals]
    apis: list[ApiGroup] = Field(description="API calls by name, most total time first")
    blocked_threads: list[ThreadBlocked] = Field(description="threads with API calls, most blocked time first")
    blocked_processes: list[ProcessBlocked]
    launches: list[LaunchStats] | None = Field(description="per device (stream_id null) then per stream, most kernels first; null when absent")
    absent: list[str] = Field(description="figures the profile cannot give, with the reason")
    truncated: bool = Field(description="true when a list was cut to `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def api_summary(
    trace: Trace,
    *,
    pid: int | None = None,
    device: int | None = None,
    stream: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    name_contains: str | None = None,
    per_thread: bool = False,
    spin_min_calls: int = 3,
    spin_max_gap_ns: int = 5_000,
    limit: int = 20,
) -> ApiSummaryResult:
    require(trace, "api_summary", "Without them API time, host-blocked time and launch figures cannot be computed.")
    sel, window = resolve_selection(trace, device, stream, start_ns, end_ns)
    limit = max(1, min(int(limit), 200))
    spin_min_calls = max(2, int(spin_min_calls))
    spin_max_gap_ns = max(0, int(spin_max_gap_ns))
    if pid is not None:
        pids = [r[0] for r in trace.sql("SELECT DISTINCT pid FROM api_calls ORDER BY 1")]
        if pid not in pids:
            raise ProfileError(f"process {pid} made no API call in this profile; processes with API calls: {pids[:20]}.")
    windowed = start_ns is not None or end_ns is not None
    lo, hi = (window.start_ns, window.end_ns) if windowed else (None, None)
    pid_sql, pid_params = ("pid = ?", [pid]) if pid is not None else ("TRUE", [])

    # -- (a) API calls by name ----------------------------------------------------------------------
    starts_in, starts_params = _starts_in(lo, hi)
    base = f"SELECT * FROM api_calls WHERE {pid_sql} AND {starts_in}"
    base_params = pid_params + starts_params
    totals = trace.sql_dicts(
        f"""SELECT pid, count(DISTINCT tid) AS threads, count(*) AS n, sum(dur_ns)::BIGINT AS total, count(DISTINCT name) AS names
            FROM ({base}) GROUP BY pid ORDER BY total DESC, pid""", base_params)
    if not totals:
        raise ProfileError("no API call starts in the selection (pid / time window). Widen it; trace_info gives the capture span.")
    thread_total = dict(((r[0], r[1]), int(r[2])) for r in trace.sql(
        f"SELECT pid, tid, sum(dur_ns)::BIGINT FROM ({base}) GROUP BY ALL", base_params))
    proc_total = {r["pid"]: int(r["total"]) for r in totals}
    keys = "pid, tid, name" if per_thread else "pid, name"
    name_sql, name_params = ("", [])
    if name_contains:
        name_sql, name_params = f" WHERE name {CONTAINS_SQL}", [contains_pattern(name_contains)]
    groups = trace.sql_dicts(
        f"""SELECT {keys}, any_value(api) AS api, count(*) AS n, sum(dur_ns)::BIGINT AS total, avg(dur_ns) AS avg,
                   median(dur_ns) AS med, min(dur_ns) AS mn, max(dur_ns) AS mx, stddev_samp(dur_ns) AS sd
            FROM ({base}){name_sql} GROUP BY {keys} ORDER BY total DESC, n DESC, {keys}""", base_params + name_params)
    truncated_lists = []
    if len(groups) > limit:
        truncated_lists.append("apis")
    apis = [ApiGroup(
        pid=g["pid"], tid=g["tid"] if per_thread else None, name=clip_name(g["name"]), api=g["api"], count=g["n"],
        total_ns=int(g["total"]), pct_of_process_api_time=pct(g["total"], proc_total.get(g["pid"])),
        pct_of_thread_api_time=pct(g["total"], thread_total.get((g["pid"], g["tid"]))) if per_thread else None,
        avg_ns=round(float(g["avg"]), 1), median_ns=round(float(g["med"]), 1), min_ns=int(g["mn"]), max_ns=int(g["mx"]),
        std_ns=None if g["sd"] is None else round(float(g["sd"]), 1)) for g in groups[:limit]]
    pnames = dict(trace.sql("SELECT pid, any_value(name) FROM processes GROUP BY pid"))
    processes = [ProcessApiTotals(pid=r["pid"], process_name=pnames.get(r["pid"]), threads=r["threads"], api_calls=r["n"],
                                  summed_api_time_ns=int(r["total"]), api_names=r["names"]) for r in totals]

    # -- (b) host-blocked time ------------------------------------------------------------------------
    absent: list[str] = []
    blocked_threads, blocked_procs = _blocked(trace, pid_sql, pid_params, lo, hi, window, spin_min_calls,
                                              spin_max_gap_ns, absent)
    if len(blocked_threads) > limit:
        truncated_lists.append("blocked_threads")
    blocked_threads = blocked_threads[:limit]

    # -- (c) launch analysis --------------------------------------------------------------------------
    launches = None
    async_copies = trace.scalar(f"SELECT count(*) FROM api_calls WHERE regexp_matches(name, '{COPY_RE}') AND name LIKE '%Async%'")
    absent += [a for a in left_out(trace, "api_summary") if async_copies or not a.startswith("pageable_async_copy")]
    if trace.count("kernels"):
        dev_rows, stream_rows = _launches(trace, sel, pid, absent)
        if len(stream_rows) > limit:
            truncated_lists.append("launches")
        launches = dev_rows + stream_rows[:limit]

    return ApiSummaryResult(
        data_issues=data_issue_notes(trace, ("api_calls", "kernels", "memops")),
        trace=str(trace.path), window=window,
        filters={"pid": pid, "device": device, "stream": stream, "name_contains": name_contains, "per_thread": per_thread,
                 "spin_min_calls": spin_min_calls, "spin_max_gap_ns": spin_max_gap_ns,
                 "device_and_stream_apply_to": "launches only (host calls are not tied to one GPU; use pid to narrow the host sections)"},
        definitions=DEFINITIONS, processes=processes, apis=apis, blocked_threads=blocked_threads,
        blocked_processes=blocked_procs, launches=launches, absent=absent, truncated=bool(truncated_lists),
        hint=(f"lists cut to limit={limit}: {', '.join(truncated_lists)}; raise limit (max 200) or filter by pid/device/stream/name_contains"
              if truncated_lists else None),
    )


def _starts_in(lo: int | None, hi: int | None) -> tuple[str, list]:
    clauses, params = ["TRUE"], []
    if lo is not None:
        clauses.append("start_ns >= ?")
        params.append(lo)
    if hi is not None:
        clauses.append("start_ns < ?")
        params.append(hi)
    return " AND ".join(clauses), params


def _clip(lo: int | None, hi: int | None, alias: str = "") -> tuple[str, str]:
    """(overlap predicate, clipped start/end select list) for a window; no window: unclipped."""
    p = f"{alias}." if alias else ""
    if lo is None:
        return "TRUE", f"{p}start_ns AS start_ns, {p}end_ns AS end_ns"
    return (f"{p}end_ns > {int(lo)} AND {p}start_ns < {int(hi)}",
            f"greatest({p}start_ns, {int(lo)}) AS start_ns, least({p}end_ns, {int(hi)}) AS end_ns")


def _blocking_sql(pid: int | None, lo: int | None, hi: int | None, spin_min_calls: int, spin_max_gap_ns: int) -> str:
    """Blocking intervals: pid, tid, category code, label, start_ns, end_ns (clipped to the window)."""
    overlap, clipped = _clip(lo, hi)
    cat = {c: i for i, c in enumerate(CATEGORIES)}
    # The calls it reads, with their rules, in each of its three scans (the pid an int: a literal, not one parameter
    # per scan).
    of_pid, c_of_pid = ("TRUE", "TRUE") if pid is None else (f"pid = {int(pid)}", f"c.pid = {int(pid)}")
    calls, where = "api_calls c JOIN rules r ON r.name = c.name", f"{c_of_pid} AND c.api <> 'hsa'"
    # The name rules are evaluated once per distinct name, and the spin-loop windows (over every call of a thread, as
    # any other call between two queries ends a run) run only on the threads that made a query call. Each part scans
    # the calls with its own rule as a filter: the calls with their rules as one CTE were materialized, every call
    # with every column, to find the few that block.
    return f"""
        WITH rules AS (
            SELECT name, regexp_matches(name, '{SYNC_RE}') AS sync, regexp_matches(name, '{COPY_RE}') AS copy,
                   name LIKE '%Async%' AS async, regexp_matches(name, '{QUERY_RE}') AS q
            FROM (SELECT DISTINCT name FROM api_calls WHERE {of_pid} AND api <> 'hsa')),
        host_side AS (
            SELECT pid, correlation_id,
                   bool_or(src_kind = 'Pageable' OR dst_kind = 'Pageable') AS pageable
            FROM memops WHERE op = 'copy' AND correlation_id IS NOT NULL GROUP BY ALL),
        a AS (SELECT c.pid, c.tid, c.name, c.start_ns, c.end_ns, c.correlation_id, r.sync, r.copy, r.async
              FROM {calls} WHERE {where} AND (r.sync OR r.copy)),
        direct AS (
            SELECT a.pid, a.tid, CASE WHEN a.sync THEN {cat['synchronize']} WHEN NOT a.async THEN {cat['blocking_copy']}
                                      ELSE {cat['pageable_async_copy']} END AS category,
                   a.name AS label, a.start_ns, a.end_ns
            -- (only async copies look up their host side: as a key, so the join stays a hash join; a condition on
            -- `a` alone in ON made DuckDB compare every call with every copy)
            FROM a LEFT JOIN host_side h ON h.pid IS NOT DISTINCT FROM a.pid AND h.correlation_id =
                 CASE WHEN a.copy AND a.async THEN a.correlation_id END
            WHERE a.sync OR (a.copy AND (NOT a.async OR coalesce(h.pageable, false)))),
        querying AS (SELECT DISTINCT c.pid, c.tid FROM {calls} WHERE {where} AND r.q),
        seq AS (
            SELECT c.pid, c.tid, c.name, c.start_ns, c.end_ns, r.q, lag(r.q) OVER w AS prev_q, lag(c.end_ns) OVER w AS prev_end
            FROM {calls} JOIN querying t ON t.pid IS NOT DISTINCT FROM c.pid AND t.tid IS NOT DISTINCT FROM c.tid WHERE {where}
            WINDOW w AS (PARTITION BY c.pid, c.tid ORDER BY c.start_ns, c.end_ns)),
        runs AS (
            SELECT *, sum(CASE WHEN q AND prev_q AND start_ns - prev_end <= {int(spin_max_gap_ns)} THEN 0 ELSE 1 END)
                      OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS run
            FROM seq),
        spins AS (
            SELECT pid, tid, {cat['event_query_spin']} AS category, arg_min(name, start_ns) || ' spin loop' AS label,
                   min(start_ns) AS start_ns, max(end_ns) AS end_ns
            FROM runs WHERE q GROUP BY pid, tid, run HAVING count(*) >= {int(spin_min_calls)}),
        b AS (SELECT * FROM direct UNION ALL SELECT * FROM spins)
        SELECT pid, tid, category, label, dense_rank() OVER (ORDER BY label) AS label_id, {clipped}
        FROM b WHERE {overlap}"""


def _blocked(trace: Trace, pid_sql: str, pid_params: list, lo, hi, window: Window, spin_min_calls: int,
             spin_max_gap_ns: int, absent: list[str]) -> tuple[list[ThreadBlocked], list[ProcessBlocked]]:
    overlap, clipped = _clip(lo, hi)
    calls_sql = f"SELECT pid, tid, {clipped} FROM api_calls WHERE {pid_sql} AND {overlap}"
    threads = trace.sql_dicts(
        f"SELECT pid, tid, count(*) AS n, min(start_ns) AS s, max(end_ns) AS e FROM ({calls_sql}) GROUP BY ALL", pid_params)
    api_busy = unions(trace, calls_sql, pid_params, ("pid", "tid"))
    # The blocking intervals (a pass over every call of every thread, spin loops found by window) are united under
    # four partitions: made once, as a temp table of one cursor.
    cur = trace.con.cursor()
    try:
        with temp_tables(cur, f"WITH blk AS ({_blocking_sql(pid_params[0] if pid_params else None, lo, hi, spin_min_calls, spin_max_gap_ns)})",
                         {"_blk": "blk"}):
            blk = "SELECT * FROM _blk"
            per_thread = unions_on(cur, blk, [], ("pid", "tid"))
            per_cat = unions_on(cur, blk, [], ("pid", "tid", "category"))
            per_label = unions_on(cur, blk, [], ("pid", "tid", "label_id"))
            per_proc = unions_on(cur, blk, [], ("pid",))
            labels = {(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in cur.execute(
                "SELECT pid, tid, label_id, any_value(label), any_value(category), count(*) FROM _blk GROUP BY ALL").fetchall()}
    finally:
        cur.close()
    tnames = {(r[0], r[1]): r[2] for r in trace.sql("SELECT pid, tid, any_value(name) FROM threads GROUP BY ALL")}
    out = []
    for t in threads:
        key = (t["pid"], t["tid"])
        u = per_thread.get(key)
        blocked = u.busy_ns if u else 0
        span = int(t["e"]) - int(t["s"])
        by_cat = {c: (per_cat[(*key, i)].busy_ns if (*key, i) in per_cat else 0) for i, c in enumerate(CATEGORIES)}
        contrib = [BlockedContributor(name=clip_name(lbl), category=CATEGORIES[c], calls=int(n), blocked_ns=per_label[k].busy_ns
                                      if (k := (*key, lid)) in per_label else 0)
                   for (p, tid, lid), (lbl, c, n) in labels.items() if (p, tid) == key]
        contrib.sort(key=lambda x: (-x.blocked_ns, x.name))
        ab = api_busy.get(key)
        out.append(ThreadBlocked(
            pid=t["pid"], tid=t["tid"], thread_name=tnames.get(key), api_calls=t["n"], thread_api_span_ns=span,
            api_busy_ns=ab.busy_ns if ab else 0, blocked_ns=blocked, pct_of_thread_api_span=pct(blocked, span),
            pct_of_window=pct(blocked, window.span_ns), blocked_by_category_ns=by_cat, contributors=contrib[:8]))
    out.sort(key=lambda x: (-x.blocked_ns, -x.api_calls, x.pid if x.pid is not None else -1, x.tid if x.tid is not None else -1))
    procs = []
    for p in sorted({t["pid"] for t in threads}, key=lambda v: -1 if v is None else v):
        u = per_proc.get((p,))
        procs.append(ProcessBlocked(pid=p, blocked_any_thread_ns=u.busy_ns if u else 0,
                                    blocked_thread_sum_ns=sum(x.blocked_ns for x in out if x.pid == p),
                                    pct_of_window=pct(u.busy_ns if u else 0, window.span_ns)))
    # Pageable detection needs the host memory kind of each async copy.
    unknown, total = trace.sql(
        f"""SELECT count(*) FILTER (WHERE NOT known), count(*) FROM (
              SELECT bool_or(CASE WHEN m.kind IN ('HtoD', 'HtoA') THEN m.src_kind
                                  WHEN m.kind IN ('DtoH', 'AtoH') THEN m.dst_kind
                                  WHEN m.kind = 'HtoH' THEN coalesce(m.src_kind, m.dst_kind)
                                  ELSE 'n/a' END NOT IN {HOST_KIND_UNKNOWN} IS TRUE) AS known
              FROM api_calls a JOIN memops m ON m.pid IS NOT DISTINCT FROM a.pid AND m.correlation_id = a.correlation_id
              WHERE {pid_sql.replace('pid', 'a.pid')} AND regexp_matches(a.name, '{COPY_RE}') AND a.name LIKE '%Async%' AND m.op = 'copy'
              GROUP BY a.pid, a.correlation_id)""", pid_params)[0]
    if unknown:
        absent.append(f"pageable_async_copy: {unknown} of {total} async copy calls have copies whose host memory kind is not "
                      f"recorded ({trace.format_name} does not say pageable vs pinned), so pageable ones among them cannot be detected")
    return out, procs


def _dist(values: list | None, avg, mx) -> Distribution:
    values = values or []
    return Distribution(count=len(values), avg_ns=None if avg is None else round(float(avg), 1),
                        median_ns=None if not values else round(float(values[0]), 1),
                        p90_ns=None if not values else round(float(values[1]), 1), max_ns=None if mx is None else int(mx))


def _launches(trace: Trace, sel, pid: int | None, absent: list[str]) -> tuple[list[LaunchStats], list[LaunchStats]]:
    """(one row per device, one row per (device, process, stream))."""
    where, params = sel.where("k")
    if pid is not None:
        where += " AND k.pid = ?"
        params = params + [pid]
    # The streams (device, pid, stream) of every GPU op, numbered in their order (NULL pid first, NULL stream last, as
    # ORDER BY puts it): the sorted ops carry the number, the stream level groups by it and sorts by it.
    streams = trace.sql("SELECT DISTINCT device_id, pid, stream_id FROM kernels UNION SELECT DISTINCT device_id, pid, stream_id "
                        "FROM memops ORDER BY device_id, pid NULLS FIRST, stream_id NULLS LAST")
    # the call names, sorted, with whether each is launch-named (the rule that picks a launching call among several)
    named = trace.sql(f"SELECT name, regexp_matches(name, '{LAUNCH_RE}') FROM (SELECT DISTINCT name FROM api_calls "
                      "WHERE correlation_id IS NOT NULL) ORDER BY name")
    names = [r[0] for r in named]
    cur, reader = trace.con.cursor(), trace.con.cursor()  # _kk fills on `cur` while the sorted ops stream on `reader`
    try:
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _kk ({_KK_COLUMNS})")
        try:
            per_stream = _fill_kk(trace, cur, reader, streams, named, where, params)
            reader.close()  # the sort's memory goes back before the levels
            n, linked = cur.execute("SELECT count(*), count(api_ns) FROM _kk").fetchone()
            if not n:
                raise ProfileError("no kernel starts in the selection (device/stream/pid/time window). Widen it; trace_info lists devices and spans.")
            if not linked:
                absent.append("launch figures: no kernel in the selection is linked to its launching API call "
                              "(same process and correlation id), so API duration, queue delay and latency cannot be measured")
            found = {level: _launch_rows(cur, key) for level, key in (("device", "stream >> 32"), ("stream", "stream"))}
        finally:
            cur.execute("DROP TABLE IF EXISTS temp.main._kk")
    finally:
        reader.close()
        cur.close()
    levels = {}
    for level, rows in found.items():
        levels[level] = out = []
        for r in rows:
            if level == "stream":
                device_id, p, stream_id = streams[r["key"] & 0xFFFFFFFF]
                first, last, early = (int(v[r["key"] & 0xFFFFFFFF]) for v in per_stream)
            else:
                device_id, p, stream_id = r["key"], None, None
                on = np.array([s[0] == device_id for s in streams])
                first, last, early = int(per_stream[0][on].min()), int(per_stream[1][on].max()), int(per_stream[2][on].sum())
            span = last - first
            single, tiny = int(r["single"]), int(r["tiny"])
            stats = LaunchStats(
                device_id=device_id, pid=p, stream_id=stream_id, kernels=r["kernels"],
                unlinked_kernels=r["unlinked"], launch_calls=r["calls"] or 0,
                launch_apis={names[i]: n for i, n in sorted((r["apis"] or {}).items(), key=lambda a: (-a[1], a[0]))},
                graph_launch_calls=r["graphs"] or 0,
                api_duration=_dist(r["a_q"] if r["calls"] else None, r["a_avg"], r["a_max"]),
                queue_delay=_dist(r["q_q"] if r["q_n"] else None, r["q_avg"], r["q_max"]),
                launch_latency=_dist(r["l_q"] if r["l_n"] else None, r["l_avg"], r["l_max"]),
                kernels_started_before_call_returned=early, single_kernel_launches=single, tiny_kernels=tiny,
                tiny_pct_of_single_kernel_launches=pct(tiny, single), kernel_span_ns=span,
                kernels_per_s_over_kernel_span=round(r["kernels"] * 1e9 / span, 3) if span > 0 else None)
            # count = number of values: launch calls, linked kernels, linked kernels with a latency.
            stats.api_duration.count = stats.launch_calls
            stats.queue_delay.count = stats.kernels - stats.unlinked_kernels
            stats.launch_latency.count = int(r["l_n"])
            out.append(stats)
    return levels["device"], levels["stream"]


# _kk: one row per kernel of the selection with what _launch_rows_sql reads. stream: device_id * 2^32 + the number
# of its (device, process, stream) in `streams`, so that both levels group by it (the device: stream >> 32); c_name:
# its call's name as an index into the sorted call names (no strings in the rows: a name per kernel through the join
# and the table cost ~0.5 s CPU on the 2 M-kernel export); call: the call's row number; api_ns: NULL when the kernel
# is not linked to a call; tiny: NULL unless the kernel is linked and its call's only kernel, so a linked kernel with
# a NULL tiny is one of a graph launch's kernels. Every column written costs ~0.04 s CPU per 2 M rows: no more.
_KK_COLUMNS = "stream BIGINT, c_name BIGINT, call BIGINT, api_ns BIGINT, queue_ns BIGINT, latency_ns BIGINT, tiny BOOLEAN"


def _fill_kk(trace: Trace, cur, reader, streams: list[tuple], named: list[tuple], where: str,
             params: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fill `cur`'s temp table _kk with the kernels `where` selects (alias k), each with its launching call and the
    latest end of the earlier kernels/copies/sets on its (device, process, stream) over the whole profile (so a window
    does not hide the op before it).

    DuckDB joins the launched kernels to the calls of their (process, correlation id) and sorts every GPU op by
    (start, end), copies first at equal times (cheap: the tables are stored in time order); numpy follows each stream
    through the sorted chunks with its running maximum of ends (intervals.reach_by_part) and computes the kernels'
    figures. A SQL window partitioned by stream took ~1.1 s CPU of the 2 M-kernel export's first call (its sort by
    stream, then time), the time sort ~0.15 s. The rare repeats are found in the sorted rows too, not by grouping
    every call and every kernel (~0.85 s CPU there): a kernel whose (process, correlation id) several calls share
    comes once per call, in adjacent rows (_launching_rows keeps its launching call's); a call with several kernels
    (a graph launch) is one whose row number the kernels name more than once: the call rows of the linked kernels go
    to a temp table (DuckDB's, which spills: nothing here grows with the profile), and the kernels of the calls found
    there more than once lose `tiny` at the end.

    Returns, per stream number, the first start, the last end and the count of kernels that started before their
    call returned: figures that add up per device, so _kk need not hold them."""
    stream_key = np.array([r[0] for r in streams], dtype=np.int64) * 2**32 + np.arange(len(streams), dtype=np.int64)
    first, last = np.full(len(streams), np.iinfo(np.int64).max, dtype=np.int64), np.full(len(streams), INT64_MIN, dtype=np.int64)
    early = np.zeros(len(streams), dtype=np.int64)
    reader.register("_ap_streams", pd.DataFrame({
        "device_id": pd.array([r[0] for r in streams], dtype="Int64"), "pid": pd.array([r[1] for r in streams], dtype="Int64"),
        "stream_id": pd.array([r[2] for r in streams], dtype="Int64"), "code": np.arange(len(streams), dtype=np.int64)}))
    reader.register("_ap_names", pd.DataFrame({"name": pd.array([r[0] for r in named], dtype=object),
                                               "name_id": np.arange(len(named), dtype=np.int64),
                                               "launch": np.array([bool(r[1]) for r in named], dtype=bool)}))
    # k = stream number * 16 + the call's preference rank * 4 (0 best: a launch-named non-HSA call; see
    # _launching_rows) + 2 for a selected kernel + 1 for a linked one. r: the kernel's row number (a copy's: -1 - its
    # row number). At equal times a stream's copies come before its kernels (as the figures define the previous op),
    # then rows in table order (as the SQL window's sort kept them: two kernels of one stream can share start and end).
    sql = f"""
        WITH
        calls AS (
            SELECT a.pid, a.correlation_id, a.start_ns, a.end_ns, a.rowid AS call, n.name_id,
                   CASE WHEN a.api = 'hsa' THEN 2 ELSE 0 END + CASE WHEN n.launch THEN 0 ELSE 1 END AS rank
            FROM api_calls a JOIN _ap_names n USING (name) WHERE a.correlation_id IS NOT NULL),
        sel AS (SELECT *, CASE WHEN launched THEN correlation_id END AS key
                FROM (SELECT device_id, pid, stream_id, start_ns, end_ns, correlation_id, launched, ({where}) AS chosen, rowid AS r
                      FROM kernels k)),
        ops AS (
            SELECT k.device_id, k.pid, k.stream_id, k.start_ns, k.end_ns, 1 AS kind, k.r,
                   coalesce(c.rank, 0) * 4 + CASE WHEN k.chosen THEN 2 ELSE 0 END + CASE WHEN c.end_ns IS NOT NULL THEN 1 ELSE 0 END AS f,
                   c.start_ns AS c_start, c.end_ns AS c_end, c.name_id, c.call
            -- every launched kernel meets its calls (the key NULL otherwise: no match, and the join stays a hash join),
            -- selected or not: a graph launch's kernels outside the selection count
            FROM sel k LEFT JOIN calls c ON c.pid IS NOT DISTINCT FROM k.pid AND c.correlation_id = k.key
            UNION ALL
            SELECT device_id, pid, stream_id, start_ns, end_ns, 0, -1 - rowid, 0, NULL, NULL, NULL, NULL FROM memops)
        SELECT o.start_ns, o.end_ns, o.f + s.code * 16 AS k, o.r, o.c_start, o.c_end, o.name_id, o.call
        FROM ops o JOIN _ap_streams s ON o.device_id = s.device_id AND o.pid IS NOT DISTINCT FROM s.pid
                                      AND o.stream_id IS NOT DISTINCT FROM s.stream_id
        ORDER BY o.start_ns, o.end_ns, o.kind, o.r"""
    cur.execute("CREATE OR REPLACE TEMP TABLE _kk_calls (call BIGINT)")  # the call row of every linked kernel
    carry = np.full(len(streams), INT64_MIN, dtype=np.int64)
    # NULL reads as 0: the call's columns are NULL exactly where the kernel is not linked, and go into _kk as NULL there
    cols = {"start_ns": 0, "end_ns": 0, "k": 0, "r": 0, "c_start": 0, "c_end": 0, "name_id": 0, "call": 0}
    for ch in time_chunks(reader, sql, params, cols):
        if (ch["r"][1:] == ch["r"][:-1]).any():
            ch = _launching_rows(ch)
        k = ch["k"]
        linked = (k & 1) == 1
        _count_calls(cur, ch["call"][linked])
        part = k >> 4
        o = part_order(part)
        prev, _ = reach_by_part(part[o], ch["end_ns"][o], carry)  # INT64_MIN: no op before it on its stream
        mine = (k[o] & 2) == 2
        if not mine.any():
            continue
        at, prev = o[mine], prev[mine]
        linked, part = linked[at], part[at]
        start, end, c_start, c_end = ch["start_ns"][at], ch["end_ns"][at], ch["c_start"][at], ch["c_end"][at]
        before = np.where(prev == INT64_MIN, c_end, prev)  # coalesce(prev_end, c_end)
        ready = np.maximum(c_end, before)
        api = c_end - c_start
        np.minimum.at(first, part, start)
        np.maximum.at(last, part, end)
        np.add.at(early, part, (linked & (start < c_end)).astype(np.int64))
        cur.register("_kk_chunk", {  # numpy arrays as they are: a DataFrame would first copy them into one block
            "stream": stream_key[part], "linked": linked, "timed": linked & (start >= ready),
            "c_name": ch["name_id"][at], "call": ch["call"][at], "api_ns": api, "queue_ns": np.maximum(0, before - c_end),
            # tiny: for a linked kernel, its call's only one (until a second kernel of the call shows up)
            "latency_ns": start - ready, "tiny": end - start < api})
        cur.execute("""INSERT INTO _kk SELECT stream, CASE WHEN linked THEN c_name END, CASE WHEN linked THEN call END,
                               CASE WHEN linked THEN api_ns END, CASE WHEN linked THEN queue_ns END,
                               CASE WHEN timed THEN latency_ns END, CASE WHEN linked THEN tiny END
                        FROM _kk_chunk""")
        cur.unregister("_kk_chunk")
    try:
        cur.execute("""UPDATE _kk SET tiny = NULL
                       WHERE call IN (SELECT call FROM _kk_calls GROUP BY call HAVING count(*) > 1)""")
    finally:
        cur.execute("DROP TABLE IF EXISTS temp.main._kk_calls")
    return first, last, early


def _launching_rows(ch: dict) -> dict:
    """A chunk's rows with one row per kernel: of the adjacent rows of a kernel met by several calls (same `r`), the
    row of its launching call, as the model pairs them: a launch-named non-HSA call first, then the first by (start,
    end, name), then by row number."""
    r = ch["r"]
    new = np.ones(r.size, dtype=bool)
    new[1:] = r[1:] != r[:-1]
    group = np.cumsum(new) - 1  # non-decreasing: sorting by it first keeps the rows in time order
    o = np.lexsort((ch["call"], ch["name_id"], ch["c_end"], ch["c_start"], (ch["k"] >> 2) & 3, group))
    g = group[o]
    first = np.ones(o.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    keep = o[first]
    return {c: v[keep] for c, v in ch.items()}


def _count_calls(cur, calls: np.ndarray) -> None:
    """Append the call row numbers `calls` (one per linked kernel) to temp table _kk_calls."""
    if not calls.size:
        return
    cur.register("_kk_chunk_calls", {"call": calls})
    cur.execute("INSERT INTO _kk_calls SELECT call FROM _kk_chunk_calls")
    cur.unregister("_kk_chunk_calls")


def _launch_rows(cur, key: str) -> list[dict]:
    """Launch figures per `key` (an expression over _kk, _launches' temp table: the device or the stream), most
    kernels first. A quantile holds every value of its group outside DuckDB's memory limit, so each runs in a
    statement of its own: DuckDB runs a statement's independent aggregates at the same time where it has idle
    threads, and two quantiles' values together took 10 M kernels past 1.5 GB."""
    rows = {r["key"]: r for r in cursor_dicts(cur, f"""
        SELECT {key} AS key, count(*) AS kernels, count(*) FILTER (WHERE api_ns IS NULL) AS unlinked,
               avg(queue_ns) AS q_avg, max(queue_ns) AS q_max, count(queue_ns) AS q_n,
               avg(latency_ns) AS l_avg, max(latency_ns) AS l_max, count(latency_ns) AS l_n,
               count(tiny) AS single, count(*) FILTER (WHERE tiny) AS tiny
        FROM _kk GROUP BY key""")}
    # (queue_ns is NULL exactly for the unlinked kernels: a quantile leaves them out)
    parts = [f"SELECT {key} AS key, quantile_cont(queue_ns, [0.5, 0.9]) AS q_q FROM _kk GROUP BY key",
             f"SELECT {key} AS key, quantile_cont(latency_ns, [0.5, 0.9]) AS l_q FROM _kk GROUP BY key",
             # one row per launch call: a call that launched one kernel is that kernel's row; only the calls that
             # launched several (graph launches) are grouped (grouping every call took most of the statement). The
             # calls per name in the same pass (histogram: a map name index -> calls).
             f"""SELECT key, count(*) AS calls, quantile_cont(api_ns, [0.5, 0.9]) AS a_q, avg(api_ns) AS a_avg,
                        max(api_ns) AS a_max, count(*) FILTER (WHERE graph) AS graphs, histogram(c_name) AS apis
                 FROM (SELECT {key} AS key, api_ns, c_name, false AS graph FROM _kk WHERE tiny IS NOT NULL
                       UNION ALL
                       SELECT {key} AS key, any_value(api_ns), any_value(c_name), true FROM _kk
                       WHERE api_ns IS NOT NULL AND tiny IS NULL GROUP BY key, call)
                 GROUP BY key"""]
    blank = {"q_q": None, "l_q": None, "calls": None, "a_q": None, "a_avg": None, "a_max": None, "graphs": None, "apis": None}
    for r in rows.values():
        r.update(blank)
    for sql in parts:
        for r in cursor_dicts(cur, sql):
            rows[r["key"]].update(r)
    return sorted(rows.values(), key=lambda r: (-r["kernels"], r["key"]))
