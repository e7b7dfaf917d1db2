"""api_summary: scenarios in all three formats against figures computed from the Scenario in plain
Python (exact integer ns; the tool rounds avg/median/p90/std to 0.1 ns), plus every real profile
under ../shared/data (hand-checked figures for one of them against raw SQLite)."""

from __future__ import annotations

import math
import sqlite3
import statistics
from functools import lru_cache

import pytest

from conftest import DATA, FORMATS, needs_data, real_files
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.catalog import US, check
from gpuscope.fixtures.scenarios_api_summary import SCENARIOS
from gpuscope.fixtures.writers import rocpd as rocpd_writer
from gpuscope.tools.analyses.api_summary import api_summary
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError

ROUNDED = 0.05 + 1e-6
REAL = real_files("nsys/*.sqlite", "pytorch/*.json.gz", "rocpd_legacy/*.rpd")

# The classification the tool documents, spelled out name by name (CUDA and HIP spellings).
SYNC = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize"}
BLOCKING_COPY = {"cudaMemcpy", "hipMemcpy", "cuMemcpyDtoH"}
ASYNC_COPY = {"cudaMemcpyAsync", "hipMemcpyAsync"}
QUERY = {"cudaEventQuery", "cudaStreamQuery", "hipEventQuery", "hipStreamQuery"}


@lru_cache(maxsize=None)
def scenario(name):
    return SCENARIOS[name]()


def expressed(name, fmt, pid):
    s = scenario(name)
    if fmt == "rocpd":  # the rocpd writer's own HIP mapping (cuLaunchKernel -> hipModuleLaunchKernel)
        from dataclasses import replace
        s = replace(T.expressed(s, "nsys"), api_calls=[replace(a, name=rocpd_writer.hip_name(a.name)) for a in s.api_calls],
                    memops=[m for m in s.memops if m.op != "set"])
        return s
    return T.expressed(s, fmt, pid)


def cases(names):
    out = []
    for name in names:
        for fmt in FORMATS:
            pids = [p.pid for p in scenario(name).processes] if fmt == "kineto" else [None]
            out += [pytest.param(name, fmt, pid, id=f"{name}-{fmt}" + (f"-pid{pid}" if pid and len(pids) > 1 else "")) for pid in pids]
    return out


@pytest.fixture(scope="module")
def opened(open_profile):
    return lambda name, fmt, pid=None: open_profile(name, fmt, pid, scenarios=SCENARIOS)


# -- expected figures, from the scenario ------------------------------------------------------------

def clip(iv, lo, hi):
    s, e = iv
    if lo is not None:
        s, e = max(s, lo), min(e, hi)
    return (s, e) if e > s else None


def blocking_intervals(s, fmt, gap=5_000, min_calls=3):
    """{(pid, tid): [(category, label, start, end)]}"""
    pageable_known = fmt != "rocpd"
    copies = {(m.pid, m.correlation_id): m for m in s.memops if m.op == "copy"}
    out = {}
    for key in sorted({(a.pid, a.tid) for a in s.api_calls}):
        calls = sorted((a for a in s.api_calls if (a.pid, a.tid) == key), key=lambda a: (a.start_ns, a.end_ns))
        ivs = []
        for a in calls:
            if a.name in SYNC:
                ivs.append(("synchronize", a.name, a.start_ns, a.end_ns))
            elif a.name in BLOCKING_COPY:
                ivs.append(("blocking_copy", a.name, a.start_ns, a.end_ns))
            elif a.name in ASYNC_COPY and pageable_known:
                m = copies.get((a.pid, a.correlation_id))
                if m is not None and "Pageable" in (m.src_kind, m.dst_kind):
                    ivs.append(("pageable_async_copy", a.name, a.start_ns, a.end_ns))
        run = []
        for a in calls + [None]:
            if a is not None and a.name in QUERY and run and a.start_ns - run[-1].end_ns <= gap and run[-1].name in QUERY:
                run.append(a)
                continue
            if len(run) >= min_calls and run[0].name in QUERY:
                ivs.append(("event_query_spin", run[0].name + " spin loop", run[0].start_ns, run[-1].end_ns))
            run = [a] if a is not None and a.name in QUERY else []
        out[key] = ivs
    return out


def expected_blocked(s, fmt, lo=None, hi=None):
    per_thread = {}
    for key, ivs in blocking_intervals(s, fmt).items():
        calls = [(a.start_ns, a.end_ns) if lo is None else (max(a.start_ns, lo), min(a.end_ns, hi))
                 for a in s.api_calls if (a.pid, a.tid) == key and (lo is None or (a.end_ns > lo and a.start_ns < hi))]
        if not calls:
            continue
        clipped = [(c, lbl, *iv) for c, lbl, s0, e0 in ivs if (iv := clip((s0, e0), lo, hi))]
        per_thread[key] = {
            "span": max(e for _, e in calls) - min(s0 for s0, _ in calls),
            "blocked": T.busy_ns([(a, b) for *_, a, b in clipped]),
            "by_cat": {c: T.busy_ns([(a, b) for cc, _, a, b in clipped if cc == c])
                       for c in ("synchronize", "blocking_copy", "pageable_async_copy", "event_query_spin")},
            "labels": {lbl: T.busy_ns([(a, b) for _, ll, a, b in clipped if ll == lbl]) for _, lbl, *_ in clipped},
            "intervals": [(a, b) for *_, a, b in clipped],
        }
    return per_thread


def quantile(values, q):
    v = sorted(values)
    h = (len(v) - 1) * q
    lo = math.floor(h)
    return v[lo] + (h - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def expected_launches(s):
    """{(device, pid, stream): figures} and {device: figures}."""
    calls = {(a.pid, a.correlation_id): a for a in s.api_calls}
    per_call = {}
    for k in s.kernels:
        if (k.pid, k.correlation_id) in calls:
            per_call[(k.pid, k.correlation_id)] = per_call.get((k.pid, k.correlation_id), 0) + 1
    rows = []
    for k in s.kernels:
        ops = sorted([(o.start_ns, o.end_ns, 0 if o in s.memops else 1) for o in [*s.kernels, *s.memops]
                      if (o.device_id, o.pid, o.stream_id) == (k.device_id, k.pid, k.stream_id)])
        me = ops.index((k.start_ns, k.end_ns, 1))
        prev = max((e for _, e, _ in ops[:me]), default=None)
        call = calls.get((k.pid, k.correlation_id))
        row = {"key": (k.device_id, k.pid, k.stream_id), "start": k.start_ns, "end": k.end_ns, "call": call}
        if call is not None:
            ready = max(call.end_ns, prev) if prev is not None else call.end_ns
            row.update(queue=max(0, (prev if prev is not None else call.end_ns) - call.end_ns),
                       latency=k.start_ns - ready if k.start_ns >= ready else None, early=k.start_ns < call.end_ns,
                       single=per_call[(k.pid, k.correlation_id)] == 1,
                       tiny=per_call[(k.pid, k.correlation_id)] == 1 and k.end_ns - k.start_ns < call.end_ns - call.start_ns)
        rows.append(row)

    def figures(rs):
        linked = [r for r in rs if r["call"] is not None]
        launch_calls = {(r["call"].pid, r["call"].correlation_id): r["call"] for r in linked}
        api = [c.end_ns - c.start_ns for c in launch_calls.values()]
        names = {}
        for c in launch_calls.values():
            names[c.name] = names.get(c.name, 0) + 1
        span = max(r["end"] for r in rs) - min(r["start"] for r in rs)
        return {"kernels": len(rs), "unlinked": len(rs) - len(linked), "launch_calls": len(launch_calls), "apis": names,
                "graphs": sum(1 for key in launch_calls if per_call[key] > 1),
                "api": api, "queue": [r["queue"] for r in linked], "latency": [r["latency"] for r in linked if r["latency"] is not None],
                "early": sum(r["early"] for r in linked), "single": sum(r["single"] for r in linked),
                "tiny": sum(r["tiny"] for r in linked), "span": span}

    streams = {key: figures([r for r in rows if r["key"] == key]) for key in {r["key"] for r in rows}}
    devices = {d: figures([r for r in rows if r["key"][0] == d]) for d in {r["key"][0] for r in rows}}
    return streams, devices


def check_dist(got, values):
    assert got.count == len(values)
    if not values:
        assert got.median_ns is None and got.max_ns is None
        return
    assert got.max_ns == max(values)
    assert abs(got.median_ns - quantile(values, 0.5)) <= ROUNDED
    assert abs(got.p90_ns - quantile(values, 0.9)) <= ROUNDED
    assert abs(got.avg_ns - sum(values) / len(values)) <= ROUNDED


# -- tests -----------------------------------------------------------------------------------------

def test_scenarios_are_consistent():
    for name in SCENARIOS:
        check(scenario(name))


@pytest.mark.parametrize("name,fmt,pid", cases(["api_host_blocking", "api_queued_launches", "api_graph_two_procs"]))
def test_api_table(opened, name, fmt, pid):
    s = expressed(name, fmt, pid)
    res = api_summary(opened(name, fmt, pid), limit=200)
    want = {}
    for a in s.api_calls:
        want.setdefault((a.pid, a.name), []).append(a.end_ns - a.start_ns)
    proc_total = {p: sum(a.end_ns - a.start_ns for a in s.api_calls if a.pid == p) for p in {a.pid for a in s.api_calls}}
    got = {(g.pid, g.name): g for g in res.apis}
    assert set(got) == set(want)
    for key, durs in want.items():
        g = got[key]
        assert (g.count, g.total_ns, g.min_ns, g.max_ns) == (len(durs), sum(durs), min(durs), max(durs)), key
        assert abs(g.median_ns - statistics.median(durs)) <= ROUNDED
        assert abs(g.avg_ns - sum(durs) / len(durs)) <= ROUNDED
        assert (g.std_ns is None) == (len(durs) == 1)
        if g.std_ns is not None:
            assert abs(g.std_ns - statistics.stdev(durs)) <= ROUNDED
        assert g.pct_of_process_api_time == round(100 * sum(durs) / proc_total[key[0]], 2)
    assert {p.pid: p.summed_api_time_ns for p in res.processes} == proc_total
    assert not res.truncated


@pytest.mark.parametrize("name,fmt,pid", cases(["api_host_blocking", "api_queued_launches", "api_graph_two_procs"]))
def test_blocked_union(opened, name, fmt, pid):
    s = expressed(name, fmt, pid)
    res = api_summary(opened(name, fmt, pid))
    want = expected_blocked(s, fmt)
    got = {(t.pid, t.tid): t for t in res.blocked_threads}
    assert set(got) == set(want)
    span = res.window.span_ns
    for key, w in want.items():
        t = got[key]
        assert (t.blocked_ns, t.thread_api_span_ns) == (w["blocked"], w["span"]), key
        assert t.blocked_by_category_ns == w["by_cat"], key
        assert {c.name: c.blocked_ns for c in t.contributors} == w["labels"], key
        assert t.pct_of_thread_api_span == round(100 * w["blocked"] / w["span"], 2)
        assert t.pct_of_window == round(100 * w["blocked"] / span, 2)
    for p in res.blocked_processes:
        mine = [w for (pp, _), w in want.items() if pp == p.pid]
        assert p.blocked_any_thread_ns == T.busy_ns([iv for w in mine for iv in w["intervals"]])
        assert p.blocked_thread_sum_ns == sum(w["blocked"] for w in mine)
    pageable_absent = any(a.startswith("pageable_async_copy") for a in res.absent)
    has_async_copy = any(a.name in ASYNC_COPY for a in s.api_calls)
    assert pageable_absent == (fmt == "rocpd" and has_async_copy)


def test_blocking_scenario_figures(opened):
    """The hand-computed figures of api_host_blocking (nsys): syncs overlapping on two threads are
    merged per process, not summed; waits, pinned copies, lone queries do not count."""
    res = api_summary(opened("api_host_blocking", "nsys"))
    main, worker = (next(t for t in res.blocked_threads if t.tid == tid) for tid in (2000, 2001))
    assert main.blocked_by_category_ns == {"synchronize": 100 * US, "blocking_copy": 80 * US,
                                           "pageable_async_copy": 130 * US, "event_query_spin": 18 * US}
    assert main.blocked_ns == 328 * US and worker.blocked_ns == 107 * US
    (proc,) = res.blocked_processes
    assert proc.blocked_thread_sum_ns == 435 * US
    # main's sync [265, 365] and spin loop [380, 398] lie inside worker's [300, 400] ∪ itself: 135 µs, not 218
    assert proc.blocked_any_thread_ns == 352 * US
    names = {c.name for c in main.contributors}
    assert "cudaStreamWaitEvent" not in names and "cudaFree" not in names
    assert {c.name: c.calls for c in main.contributors}["cudaEventQuery spin loop"] == 1
    # a spin loop needs >= spin_min_calls queries: with 2 the back-to-back pair counts too
    res2 = api_summary(opened("api_host_blocking", "nsys"), spin_min_calls=2)
    main2 = next(t for t in res2.blocked_threads if t.tid == 2000)
    assert main2.blocked_by_category_ns["event_query_spin"] == 18 * US + 5 * US


@pytest.mark.parametrize("name,fmt,pid", cases(["api_host_blocking", "api_queued_launches", "api_graph_two_procs"]))
def test_launches(opened, name, fmt, pid):
    s = expressed(name, fmt, pid)
    res = api_summary(opened(name, fmt, pid), limit=200)
    streams, devices = expected_launches(s)
    got_dev = {r.device_id: r for r in res.launches if r.stream_id is None and r.pid is None}
    got_str = {(r.device_id, r.pid, r.stream_id): r for r in res.launches if r.stream_id is not None}
    assert set(got_dev) == set(devices) and set(got_str) == set(streams)
    for got, want in [*((got_dev[k], v) for k, v in devices.items()), *((got_str[k], v) for k, v in streams.items())]:
        assert (got.kernels, got.unlinked_kernels, got.launch_calls, got.graph_launch_calls) == (
            want["kernels"], want["unlinked"], want["launch_calls"], want["graphs"])
        assert got.launch_apis == want["apis"]
        check_dist(got.api_duration, want["api"])
        check_dist(got.queue_delay, want["queue"])
        check_dist(got.launch_latency, want["latency"])
        assert (got.kernels_started_before_call_returned, got.single_kernel_launches, got.tiny_kernels) == (
            want["early"], want["single"], want["tiny"])
        assert got.kernel_span_ns == want["span"]
        assert got.kernels_per_s_over_kernel_span == round(want["kernels"] * 1e9 / want["span"], 3)


def test_queued_launches_keep_queue_and_latency_apart(opened):
    res = api_summary(opened("api_queued_launches", "nsys"))
    s7 = next(r for r in res.launches if r.stream_id == 7)
    assert s7.queue_delay.median_ns == 972 * US        # the 1 ms kernel ahead of them
    assert s7.launch_latency.median_ns == 1 * US       # each quick kernel starts 1 µs after the previous ends
    assert s7.launch_latency.max_ns == 5 * US          # the long kernel: call returns at 15 µs, starts at 20 µs
    assert s7.tiny_kernels == 10 and s7.launch_apis == {"cudaLaunchKernel": 5, "cudaLaunchKernelExC": 3, "cuLaunchKernel": 3}


def test_graph_and_processes_do_not_mix(opened):
    """Correlation ids overlap across the two processes; stream 7 exists in both."""
    for fmt in ("nsys", "rocpd"):
        res = api_summary(opened("api_graph_two_procs", fmt))
        p0 = next(r for r in res.launches if r.pid == 2200)
        p1 = next(r for r in res.launches if r.pid == 2201)
        assert (p0.kernels, p1.kernels, p1.graph_launch_calls) == (2, 5, 1)
        assert p0.api_duration.max_ns == 4 * US           # not the other process's 20 µs graph launch
        assert p1.queue_delay.max_ns == 30 * US           # graph kernel 4 waits on kernel 3, not on process 2200's
        assert p1.single_kernel_launches == 1             # graph kernels are not judged against the graph call
        dev = next(r for r in res.launches if r.stream_id is None)
        assert dev.kernels == 7 and dev.launch_calls == 4


def test_window_clips(opened):
    """A window [250 µs, 395 µs): calls starting in it are tabled; blocked intervals are clipped."""
    for fmt in FORMATS:
        pid = 2000 if fmt == "kineto" else None
        shift = T.time_shift(scenario("api_host_blocking"), fmt)
        lo, hi = 250 * US + shift, 395 * US + shift
        res = api_summary(opened("api_host_blocking", fmt, pid), start_ns=lo, end_ns=hi)
        s = expressed("api_host_blocking", fmt, pid)
        want = expected_blocked(s, fmt, 250 * US, 395 * US)
        got = {(t.pid, t.tid): t for t in res.blocked_threads}
        assert {k: (g.blocked_ns, g.thread_api_span_ns) for k, g in got.items()} == {k: (w["blocked"], w["span"]) for k, w in want.items()}
        assert got[(2000, 2000)].pct_of_window == round(100 * want[(2000, 2000)]["blocked"] / (145 * US), 2)
        starting = [a for a in s.api_calls if 250 * US <= a.start_ns < 395 * US]
        assert sum(g.count for g in res.apis) == len(starting)
        assert res.window.span_ns == 145 * US


def test_filters_and_errors(opened):
    t = opened("api_graph_two_procs", "nsys")
    res = api_summary(t, pid=2201, per_thread=True, name_contains="graph")
    assert [(g.pid, g.tid, g.name) for g in res.apis] == [(2201, 2201, "cudaGraphLaunch")]
    assert res.apis[0].pct_of_thread_api_time == round(100 * 20 / (20 + 3 + 10), 2)
    assert {r.pid for r in res.launches if r.pid is not None} == {2201}
    assert api_summary(t, limit=1).truncated
    with pytest.raises(ProfileError, match="process 9"):
        api_summary(t, pid=9)
    with pytest.raises(ProfileError, match="device 5"):
        api_summary(t, device=5)
    with pytest.raises(ProfileError, match="no kernel starts"):
        api_summary(t, stream=99)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_api_calls_is_refused(opened, fmt):
    with pytest.raises(ProfileError, match="no host runtime/driver API calls") as err:
        api_summary(opened("api_no_calls", fmt, 2300 if fmt == "kineto" else None))
    assert {"nsys": "nsys profile --trace=cuda", "rocpd": "--hip-trace", "kineto": "ProfilerActivity.CUDA"}[fmt] in str(err.value)
    assert {"nsys": "CUPTI_ACTIVITY_KIND_RUNTIME", "rocpd": "rocpd_region", "kineto": "cuda_runtime"}[fmt] in str(err.value)


# -- real profiles ----------------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_profiles_run(path):
    trace = open_trace(path)
    try:
        res = api_summary(trace)
    except ProfileError as exc:
        assert "API calls" in str(exc)
        return
    # Every API call is tabled: per (pid, name) counts against a GROUP BY over the trace's api_calls table.
    full = api_summary(trace, limit=200)
    raw = {(pid, name): n for pid, name, n in trace.sql("SELECT pid, name, count(*) FROM api_calls GROUP BY 1, 2")}
    assert raw, "api_summary answered on a profile with no API calls"
    if not full.truncated:
        assert {(g.pid, g.name): g.count for g in full.apis} == raw
    assert sum(g.count for g in full.apis) <= sum(raw.values())
    assert res.blocked_threads and res.launches  # every real profile with API calls has a thread and a launch row
    for t in res.blocked_threads:
        assert max(t.blocked_by_category_ns.values()) <= t.blocked_ns <= t.thread_api_span_ns
    for r in res.launches or []:
        assert r.kernels >= r.unlinked_kernels >= 0
        for d in (r.queue_delay, r.launch_latency, r.api_duration):
            assert d.max_ns is None or d.max_ns >= 0


@needs_data
def test_real_nsys_4streams_by_hand():
    """nsys2026.1_rtx4060ti_4streams_memcpy.sqlite checked against raw SQLite queries."""
    path = DATA / "nsys" / "nsys2026.1_rtx4060ti_4streams_memcpy.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            """SELECT r.start, r.end, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
               WHERE s.value LIKE '%Synchronize%'""").fetchall()
        launch = con.execute(
            """SELECT k.start, r.start, r.end, k.streamId FROM CUPTI_ACTIVITY_KIND_KERNEL k
               JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                    AND (r.globalTid >> 24) = (k.globalPid >> 24)""").fetchall()
    finally:
        con.close()
    res = api_summary(open_trace(path))
    (thread,) = [t for t in res.blocked_threads if t.blocked_ns]
    assert thread.blocked_ns == T.busy_ns([(s, e) for s, e, _ in rows])
    dev = next(r for r in res.launches if r.stream_id is None)
    assert dev.kernels == len(launch)
    assert dev.api_duration.max_ns == max(e - s for _, s, e, _ in launch)


def _shared_ids():
    """Process 2400: correlation id 5 is shared by a cudaGetLastError call (first by start) and the cudaLaunchKernel
    that launched the kernel; id 6 is a graph launch of two kernels. Process 2401 numbers its ids from 5 too."""
    from gpuscope.fixtures.scenario import ApiCall, Device, Kernel, Process, Scenario, Thread

    api = [ApiCall(2400, 2400, 8 * US, 9 * US, "cudaGetLastError", 5), ApiCall(2400, 2400, 10 * US, 14 * US, "cudaLaunchKernel", 5),
           ApiCall(2400, 2400, 30 * US, 50 * US, "cudaGraphLaunch", 6), ApiCall(2401, 2401, 10 * US, 13 * US, "cudaLaunchKernel", 5)]
    kernels = [Kernel(0, 7, 20 * US, 21 * US, "k_a", "k_a", 2400, 5), Kernel(0, 7, 60 * US, 61 * US, "k_b", "k_b", 2400, 6),
               Kernel(0, 7, 62 * US, 63 * US, "k_c", "k_c", 2400, 6), Kernel(0, 8, 40 * US, 42 * US, "k_d", "k_d", 2401, 5)]
    return Scenario("api_shared_ids", [Device(0)], [Process(2400), Process(2401)], [Thread(2400, 2400), Thread(2401, 2401)],
                    api_calls=api, kernels=kernels)


def test_shared_correlation_ids_and_graph_launches(open_profile):
    """Repeated (process, correlation id) keys among the calls (a launch and another call) and among the kernels (a graph
    launch) are found, so each kernel meets one call, its launch: ids repeated across processes are no repeat."""
    res = api_summary(open_profile("api_shared_ids", "nsys", scenarios={"api_shared_ids": _shared_ids}))
    s7 = next(r for r in res.launches if r.stream_id == 7)
    assert (s7.kernels, s7.launch_calls, s7.graph_launch_calls) == (3, 2, 1)
    assert s7.launch_apis == {"cudaLaunchKernel": 1, "cudaGraphLaunch": 1}
    assert s7.api_duration.max_ns == 20 * US and s7.kernels_started_before_call_returned == 0
    assert s7.launch_latency.count == 3 and s7.launch_latency.max_ns == 10 * US  # k_b: 60 µs - graph call end 50 µs
    s8 = next(r for r in res.launches if r.stream_id == 8)
    assert (s8.kernels, s8.launch_calls, s8.api_duration.max_ns) == (1, 1, 3 * US)
