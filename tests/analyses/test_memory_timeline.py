"""memory_timeline: level, peak, live-at-peak and never-freed sets by site, churn, exact to the byte and ns against
fixtures/scenarios_memory.py (truth from the scenario, not the engine) in every format; the bounded series keeps the
peak; the refusal with the capture flag where a profile has no memory events; the model rows each reader counts;
and the real profiles with memory events (peak = a direct SQL max over the running sum)."""

from __future__ import annotations

import pytest

from conftest import FORMATS, needs_data, real_files
from gpuscope.fixtures import scenarios_memory as M
from gpuscope.fixtures.truth import expressed, time_shift
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

MiB = 1 << 20


def _open(open_profile, fmt):
    return open_profile("memory_mix", fmt, None, M.SCENARIOS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_figures_match_the_scenario(open_profile, fmt):
    s = expressed(M.memory_mix(), fmt)
    shift = time_shift(s, fmt)
    truth = M.memory_truth(s, fmt)
    res = A.memory_timeline(_open(open_profile, fmt))
    assert [d.device_id for d in res.devices] == sorted(truth)
    for d in res.devices:
        w = truth[d.device_id]
        assert d.baseline_bytes == w["baseline"]
        assert d.level_source == ("profile totals (Total Allocated)" if fmt == "kineto" else "captured events")
        assert (d.peak_allocated_bytes, d.peak_ts_ns) == (w["peak"], w["peak_ts"] + shift)
        assert d.final_allocated_bytes == w["final"] and d.net_change_bytes == w["final"] - w["baseline"]
        assert (d.allocations, d.frees, d.allocated_bytes, d.freed_bytes) == (w["allocations"], w["frees"], w["allocated"], w["freed"])
        assert {x.site: x.bytes for x in d.live_at_peak_by_site} == w["live"]
        assert d.live_at_peak_bytes == sum(w["live"].values()) == w["peak"] - w["baseline"]
        assert {x.site: x.bytes for x in d.never_freed_by_site} == w["never"]
        assert d.never_freed_bytes == sum(w["never"].values())
        assert d.frees_without_allocation == 0
        span_s = res.window.span_ns / 1e9
        assert d.allocations_per_s == round(w["allocations"] / span_s, 3)
        assert d.allocated_bytes_per_s == round(w["allocated"] / span_s, 3)
        assert d.memory_kinds == ["Device"]
        # few change points: the series is the step function itself, one point per event, the peak among them
        assert not d.series_downsampled and len(d.series) == d.events
        assert max(p.allocated_bytes for p in d.series) == d.peak_allocated_bytes
        assert d.series[-1].allocated_bytes == d.final_allocated_bytes
        if fmt == "kineto":
            assert d.stated_total_mismatches == 0
            # the writer's Total Reserved: running max of allocated rounded up to 2 MiB blocks
            assert d.peak_reserved_bytes == -(-w["peak"] // (2 * MiB)) * 2 * MiB
        else:
            assert d.peak_reserved_bytes is None and d.stated_total_mismatches is None
    dev0 = res.devices[0]
    # the hand-checked figures behind the truth function
    base = 100 * MiB if fmt == "kineto" else 0
    assert (dev0.peak_allocated_bytes, dev0.final_allocated_bytes) == (base + 10 * MiB, base + 2 * MiB)
    assert dev0.never_freed_allocations == 1 and dev0.never_freed_bytes == 2 * MiB
    if fmt == "kineto":
        assert [(x.site, x.bytes) for x in dev0.live_at_peak_by_site] == [("aten::add", 8 * MiB), ("aten::mm", 2 * MiB)]
        assert [x.pct_of_set_bytes for x in dev0.live_at_peak_by_site] == [80.0, 20.0]
    host = {"kineto": "Host", "nsys": "Pinned", "rocpd": "Host"}[fmt]
    assert res.other_memory == {host: 2}
    assert not res.truncated and res.data_issues == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_model_rows(open_profile, fmt):
    t = _open(open_profile, fmt)
    s = expressed(M.memory_mix(), fmt)
    rows = t.sql("SELECT device_id, bytes, addr, kind, site, total_allocated_bytes FROM memory_events ORDER BY ts_ns, rowid")
    want = sorted(s.memory, key=lambda m: m.ts_ns)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (m.device_id, m.bytes, m.addr, "free" if m.bytes < 0 else "alloc") for m in want]
    assert [r[4] for r in rows] == [M.site_of(s, m, fmt) for m in want]
    if fmt == "kineto":
        assert rows[0][5] == 100 * MiB + 1 * MiB


def test_downsampled_series_keeps_the_peak(open_profile):
    res = A.memory_timeline(_open(open_profile, "kineto"), device=0, points=2)
    d = res.devices[0]
    assert d.series_downsampled and len(d.series) <= 2
    assert max(p.allocated_bytes for p in d.series) == d.peak_allocated_bytes
    assert any(p.ts_ns == d.peak_ts_ns for p in d.series)
    assert sum(p.events for p in d.series) == d.events


def test_limit_truncates_with_hint(open_profile):
    res = A.memory_timeline(_open(open_profile, "kineto"), device=0, limit=1)
    assert res.truncated and "limit=1" in res.hint
    assert [x.site for x in res.devices[0].live_at_peak_by_site] == ["aten::add"]
    assert res.devices[0].live_at_peak_bytes == 10 * MiB  # totals cover every site, not only those listed


def test_unknown_device_is_refused(open_profile):
    with pytest.raises(ProfileError, match="device 5 has no device-memory events"):
        A.memory_timeline(_open(open_profile, "kineto"), device=5)


@pytest.mark.parametrize("fmt,flag", [("kineto", "profile_memory=True"), ("nsys", "--cuda-memory-usage=true"),
                                      ("rocpd", "--memory-allocation-trace")])
def test_absent_capability(open_profile, fmt, flag):
    from gpuscope.fixtures import catalog
    t = open_profile("concurrent_streams", fmt, None, catalog.SCENARIOS)
    with pytest.raises(ProfileError, match="memory_timeline needs") as exc:
        A.memory_timeline(t)
    assert flag in str(exc.value)
    cap = next(c for c in A.trace_info(t).capabilities if c.tool == "memory_timeline")
    assert not cap.available and flag in cap.reason


def test_kineto_bad_memory_events_are_counted(tmp_path):
    import json

    from gpuscope.fixtures.writers import kineto
    path = kineto.write(M.memory_mix(), tmp_path / "m.pt.trace.json")
    doc = json.loads(path.read_text())
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    mem[0]["args"]["Bytes"] = "abc"
    mem[1]["ts"] = "x"
    del mem[2]["args"]["Device Id"]
    mem[2]["args"]["Device Type"] = 1
    path.write_text(json.dumps(doc))
    t = load_trace(path)
    issues = dict(((r[3]), r[2]) for r in t.sql("SELECT * FROM data_issues WHERE table_name = 'memory_events'"))
    assert issues == {"args.Bytes is missing or not an integer": 1, "ts is missing or not a finite number": 1,
                      "device memory event without a device: args.Device Id is missing, negative or not an integer": 1}
    assert t.scalar("SELECT count(*) FROM memory_events") == len(mem) - 3
    assert any("memory_events" in n for n in A.memory_timeline(t).data_issues)


def _check_window(d, w, shift):
    assert (d.start_allocated_bytes, d.final_allocated_bytes) == (w["start"], w["final"])
    assert (d.peak_allocated_bytes, d.peak_ts_ns) == (w["peak"], w["peak_ts"] + shift)
    assert {x.site: x.bytes for x in d.live_at_peak_by_site} == w["live"]
    assert (d.events, d.allocations, d.frees, d.allocated_bytes, d.freed_bytes) == \
        (w["events"], w["allocations"], w["frees"], w["allocated"], w["freed"])
    assert d.net_change_bytes == w["final"] - w["start"] == w["allocated"] - w["freed"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_window_starts_at_the_level_left_before_it(open_profile, fmt):
    """A window over one step: the level at its start counts every earlier allocation and free; the peak, live set
    (allocations made before the window included) and churn are the window's; exact against window_truth."""
    s = expressed(M.memory_pools(), fmt)
    shift = time_shift(s, fmt)
    t = open_profile("memory_pools", fmt, None, M.SCENARIOS)
    lo, hi = M.POOL_WINDOW
    res = A.memory_timeline(t, start_ns=lo + shift, end_ns=hi + shift)
    assert (res.window.start_ns, res.window.span_ns) == (lo + shift, hi - lo)
    truth = M.window_truth(s, fmt, lo, hi)
    assert [d.device_id for d in res.devices] == sorted(truth)
    for d in res.devices:
        _check_window(d, truth[d.device_id], shift)
        assert d.allocations_per_s == round(truth[d.device_id]["allocations"] / ((hi - lo) / 1e9), 3)
    dev0 = res.devices[0]
    # by hand: 4 + 2 + 1 - 4 = 3 MiB carried in; 9 MiB at 60 us with the 2 MiB pool block, the 1 MiB cudaMalloc block
    # (both made before the window) and the 6 MiB pool B block live
    assert (dev0.start_allocated_bytes, dev0.peak_allocated_bytes, dev0.peak_ts_ns) == (3 * MiB, 9 * MiB, 60_100 + shift)
    assert dev0.live_at_peak_allocations == 3 and dev0.live_at_peak_bytes == 9 * MiB
    assert (dev0.never_freed_allocations, dev0.never_freed_bytes) == (1, 6 * MiB)
    # the series starts at the window start with the carried level
    assert (dev0.series[0].ts_ns, dev0.series[0].allocated_bytes) == (lo + shift, 3 * MiB)
    # no window: the whole capture, levels from the first event
    whole = A.memory_timeline(t)
    truth = M.window_truth(s, fmt, -(1 << 62), 1 << 62)
    for d in whole.devices:
        _check_window(d, truth[d.device_id], shift)
        assert d.start_allocated_bytes == d.baseline_bytes == 0


def test_nsys_memory_pools_give_reserved_memory(open_profile):
    """Nsight CUDA_GPU_MEMORY_POOL_EVENTS and the pool sizes on cudaMallocAsync rows: reserved = Σ of the device's
    pool sizes, at the window start and at its peak, exact."""
    s = M.memory_pools()
    shift = time_shift(s, "nsys")
    t = open_profile("memory_pools", "nsys", None, M.SCENARIOS)
    rows = t.sql("SELECT kind, site, bytes, total_reserved_bytes FROM memory_events WHERE kind = 'pool' ORDER BY ts_ns")
    assert rows == [("pool", "memory pool created", 0, 0), ("pool", "memory pool trimmed", 0, 2 * MiB),
                    ("pool", "memory pool created", 0, 10 * MiB), ("pool", "memory pool destroyed", 0, 8 * MiB)]
    lo, hi = M.POOL_WINDOW
    for window in [(lo, hi), (-(1 << 62), 1 << 62)]:
        truth = M.window_truth(s, "nsys", *window)
        kw = {} if window[0] < 0 else {"start_ns": lo + shift, "end_ns": hi + shift}
        res = A.memory_timeline(t, **kw)
        for d in res.devices:
            w = truth[d.device_id]
            assert (d.start_reserved_bytes, d.peak_reserved_bytes) == (w["start_reserved"], w["peak_reserved"])
            assert d.peak_reserved_ts_ns == (None if w["peak_reserved_ts"] is None else w["peak_reserved_ts"] + shift)
            assert d.pool_events == w["pool_events"]
    whole = A.memory_timeline(t)
    dev0, dev1 = whole.devices
    # by hand: pool A grows to 32 MiB at the first cudaMallocAsync (20 us); device 1 has no pool
    assert (dev0.peak_reserved_bytes, dev0.peak_reserved_ts_ns, dev0.pool_events) == (32 * MiB, 20_100 + shift, 4)
    assert dev1.peak_reserved_bytes is None and dev1.start_reserved_bytes is None
    win = A.memory_timeline(t, start_ns=lo + shift, end_ns=hi + shift).devices[0]
    # the window carries 32 MiB in (pool A, before its trim at 50 us): the peak is at the window start
    assert (win.start_reserved_bytes, win.peak_reserved_bytes, win.peak_reserved_ts_ns) == (32 * MiB, 32 * MiB, lo + shift)
    assert [p.reserved_bytes for p in win.series] == [32 * MiB, 2 * MiB, 10 * MiB, 10 * MiB, 10 * MiB]


def test_step_window(open_profile):
    """step= picks an iterations step as the window: the same figures as its start_ns/end_ns."""
    t = open_profile("memory_pools", "nsys", None, M.SCENARIOS)
    steps = A.iterations(t).steps
    one = A.memory_timeline(t, step=1)
    by_time = A.memory_timeline(t, start_ns=steps[1].start_ns, end_ns=steps[1].end_ns)
    assert one.window.start_ns == steps[1].start_ns and "step 1" in one.window.source
    assert one.devices == by_time.devices
    with pytest.raises(ProfileError, match="step=9 does not exist"):
        A.memory_timeline(t, step=9)
    with pytest.raises(ProfileError, match="not both"):
        A.memory_timeline(t, step=0, start_ns=0)


def test_window_before_any_memory_event_is_refused(open_profile):
    s = M.memory_pools()
    t = open_profile("memory_pools", "nsys", None, M.SCENARIOS)
    shift = time_shift(s, "nsys")
    with pytest.raises(ProfileError, match="no device-memory event lies in or before the window"):
        A.memory_timeline(t, start_ns=shift + 1_000, end_ns=shift + 2_000)


REAL = real_files("pytorch/*.json.gz", "nsys/*.sqlite")


@needs_data
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_profiles(path):
    t = load_trace(path)
    if not t.scalar("SELECT count(*) FROM memory_events WHERE device_id IS NOT NULL AND memory_kind = 'Device'"):
        with pytest.raises(ProfileError, match="memory_timeline needs"):
            A.memory_timeline(t)
        return
    res = A.memory_timeline(t, points=50)
    for d in res.devices:
        # direct SQL: the running sum over the device's events in profile order, plus the baseline the profile states
        base, peak = t.sql("""
            SELECT any_value(base), max(base + cum) FROM (
                SELECT sum(bytes) OVER (ORDER BY ts_ns, rowid ROWS UNBOUNDED PRECEDING) AS cum,
                       coalesce(first_value(total_allocated_bytes - bytes) OVER (ORDER BY ts_ns, rowid), 0) AS base
                FROM memory_events WHERE device_id = ? AND memory_kind NOT IN ('Host', 'Pinned', 'Pageable', 'Virtual'))""",
            [d.device_id])[0]
        if d.level_source == "captured events":
            base = d.baseline_bytes  # least baseline the frees imply (0 unless a free precedes its allocation)
            peak = t.scalar("""SELECT max(cum) FROM (SELECT sum(bytes) OVER (ORDER BY ts_ns, rowid ROWS UNBOUNDED PRECEDING) AS cum
                               FROM memory_events WHERE device_id = ? AND memory_kind NOT IN ('Host', 'Pinned', 'Pageable', 'Virtual'))""",
                            [d.device_id]) + base
        assert d.baseline_bytes == base and d.peak_allocated_bytes == peak
        if d.stated_total_mismatches is not None:
            assert d.stated_total_mismatches == 0
            assert peak == t.scalar("SELECT max(total_allocated_bytes) FROM memory_events WHERE device_id = ?", [d.device_id])
        assert max(p.allocated_bytes for p in d.series) == d.peak_allocated_bytes and len(d.series) <= 50
        if d.frees_without_allocation == 0:  # every free pairs with a captured allocation
            assert d.live_at_peak_bytes == d.peak_allocated_bytes - d.baseline_bytes
        assert d.allocated_bytes - d.freed_bytes == d.net_change_bytes


def _wddm_truth(s, lo: int, hi: int) -> dict:
    """Per (segment group, pid or None = all processes summed): the os_memory figures of window [lo, hi), from the
    scenario's events alone."""
    out = {}
    usage = sorted((e for e in s.os_memory if e.metric == "usage"), key=lambda e: e.ts_ns)
    budget = sorted((e for e in s.os_memory if e.metric == "budget"), key=lambda e: e.ts_ns)
    for seg, label in ((0, "local"), (1, "non-local")):
        mine = [e for e in usage if e.segment_group == seg]
        for pid in (M.PID, None):
            latest, steps = {}, []
            for e in mine:
                if pid is None or e.pid == pid:
                    latest[e.pid] = e.bytes
                    steps.append((e.ts_ns, sum(latest.values())))
            before = [v for t, v in steps if t < lo]
            pts = ([(lo, before[-1])] if before else []) + [(t, v) for t, v in steps if lo <= t < hi]
            peak = max(v for _, v in pts)
            peak_ts = next(t for t, v in pts if v == peak)
            own = [e for e in budget if e.pid == pid and e.segment_group == seg] if pid is not None else []
            at = [e.bytes for e in own if e.ts_ns <= peak_ts]
            out[(label, pid)] = {
                "start": before[-1] if before else None, "peak": peak, "peak_ts": peak_ts, "final": pts[-1][1],
                "events": sum(1 for t, _ in steps if lo <= t < hi), "budget": at[-1] if at else None,
                "budget_events": sum(1 for e in own if lo <= e.ts_ns < hi),
                "processes": len({e.pid for e in mine if e.ts_ns < hi}) if pid is None else 1, "series": pts}
    return out


def test_nsys_wddm_levels_are_reported_apart_from_allocations(open_profile):
    """Windows WDDM usage and budget (Nsight GPU_MEMORY_USAGE_EVENTS / GPU_MEMORY_BUDGET_EVENTS): per segment group,
    for the profiled process and all processes summed, exact against the scenario, with and without a window; the
    allocator figures are those of memory_mix, untouched."""
    s = M.memory_wddm()
    shift = time_shift(s, "nsys")
    t = open_profile("memory_wddm", "nsys", None, M.SCENARIOS)
    rows = t.sql("SELECT device_id, pid, ts_ns, metric, segment_group, bytes FROM os_memory_levels ORDER BY ts_ns, rowid")
    assert sorted(rows) == sorted((e.device_id, e.pid, e.ts_ns + shift, e.metric, ["local", "non-local"][e.segment_group], e.bytes)
                                  for e in s.os_memory)
    for window in [(-(1 << 62), 1 << 62), M.WDDM_WINDOW]:
        kw = {} if window[0] < 0 else {"start_ns": window[0] + shift, "end_ns": window[1] + shift}
        res = A.memory_timeline(t, **kw)
        truth = _wddm_truth(s, *window)
        got = {(o.segment_group, o.pid): o for o in res.os_memory}
        assert list(got) == [("local", M.PID), ("local", None), ("non-local", M.PID), ("non-local", None)]
        for key, w in truth.items():
            o = got[key]
            assert (o.device_id, o.processes, o.usage_events) == (0, w["processes"], w["events"])
            assert o.start_usage_bytes == w["start"]
            assert (o.peak_usage_bytes, o.peak_usage_ts_ns, o.final_usage_bytes) == (w["peak"], w["peak_ts"] + shift, w["final"])
            assert (o.budget_bytes, o.budget_events) == (w["budget"], w["budget_events"])
            assert o.pct_of_budget == (None if w["budget"] is None else round(100 * w["peak"] / w["budget"], 2))
            assert not o.series_downsampled
            want = [(ts + shift if ts != window[0] else ts + (0 if window[0] < 0 else shift), v) for ts, v in w["series"]]
            assert [(p.ts_ns, p.usage_bytes) for p in o.series] == want
            assert "not allocator live bytes" in o.source
    assert A.memory_timeline(t).devices[0].peak_allocated_bytes == 10 * MiB  # memory_mix's allocator figures, untouched
    # by hand (the scenario's docstring)
    whole = {(o.segment_group, o.pid): o for o in A.memory_timeline(t).os_memory}
    mine, both = whole[("local", M.PID)], whole[("local", None)]
    assert (mine.peak_usage_bytes, mine.peak_usage_ts_ns, mine.budget_bytes) == (150 * MiB, 55_300 + shift, 4000 * MiB)
    assert mine.pct_of_budget == 3.75 and mine.process_name is not None
    assert (both.peak_usage_bytes, both.peak_usage_ts_ns, both.budget_bytes, both.processes) == (230 * MiB, 55_300 + shift, None, 2)
    assert [p.budget_bytes for p in mine.series] == [5000 * MiB, 5000 * MiB, 4000 * MiB, 4000 * MiB, 4000 * MiB]  # 12, 30, 55, 80, 95 us
    assert (whole[("non-local", M.PID)].peak_usage_bytes, whole[("non-local", None)].peak_usage_bytes) == (30 * MiB, 35 * MiB)
    win = {(o.segment_group, o.pid): o for o in A.memory_timeline(t, start_ns=45_000 + shift, end_ns=75_000 + shift).os_memory}
    assert (win[("local", M.PID)].start_usage_bytes, win[("local", None)].start_usage_bytes) == (120 * MiB, 200 * MiB)
    assert (win[("local", None)].peak_usage_bytes, win[("local", None)].final_usage_bytes) == (230 * MiB, 160 * MiB)


def test_nsys_wddm_only_profile_and_bad_rows(tmp_path):
    """A profile with WDDM levels and no allocation events still gets an answer (os_memory, no devices); damaged WDDM
    rows are left out and counted in data_issues."""
    import sqlite3

    from gpuscope.fixtures.writers import nsys
    s = M.memory_wddm()
    s.memory = []
    path = nsys.write(s, tmp_path / "w.sqlite")
    con = sqlite3.connect(path)
    con.execute("INSERT INTO GPU_MEMORY_USAGE_EVENTS VALUES (500, 0, 0, NULL, 0)")
    con.execute("INSERT INTO GPU_MEMORY_BUDGET_EVENTS VALUES (600, 0, -1, 10, 0)")
    con.commit()
    con.close()
    t = load_trace(path)
    issues = {r[3]: r[2] for r in t.sql("SELECT * FROM data_issues WHERE table_name = 'os_memory_levels'")}
    assert issues == {"GPU_MEMORY_USAGE_EVENTS: newUsage is missing, negative or not an integer": 1,
                      "GPU_MEMORY_BUDGET_EVENTS: gpu is missing, negative or not an integer": 1}
    res = A.memory_timeline(t)
    assert res.devices == [] and len(res.os_memory) == 4
    assert any("os_memory_levels" in n for n in res.data_issues)


@needs_data
def test_real_wddm_exports_match_sqlite():
    """The two 2022.1 Windows exports: the profiled process's local and non-local peaks and budget, and the peak of all
    processes summed, against direct sqlite3 queries."""
    import sqlite3

    files = [f for f in real_files("nsys/*.sqlite") if "gtx1060" in f.name]
    assert len(files) == 2
    for f in files:
        t = load_trace(f)
        res = A.memory_timeline(t)
        pid = t.scalar("SELECT DISTINCT pid FROM kernels")
        con = sqlite3.connect(f)
        for seg, label in ((0, "local"), (1, "non-local")):
            peak, ts = con.execute("""SELECT newUsage, timestamp FROM GPU_MEMORY_USAGE_EVENTS
                                      WHERE segmentGroup = ? AND ((globalTid >> 24) & 16777215) = ?
                                      ORDER BY newUsage DESC, timestamp LIMIT 1""", (seg, pid)).fetchone()
            o = next(o for o in res.os_memory if o.pid == pid and o.segment_group == label)
            assert (o.peak_usage_bytes, o.peak_usage_ts_ns) == (peak, ts)
            budget = con.execute("""SELECT newBudget FROM GPU_MEMORY_BUDGET_EVENTS WHERE segmentGroup = ?
                                    AND ((globalTid >> 24) & 16777215) = ? AND timestamp <= ?
                                    ORDER BY timestamp DESC, rowid DESC LIMIT 1""", (seg, pid, ts)).fetchone()[0]
            assert o.budget_bytes == budget
            # all processes: each process's change from its previous level, summed in time order
            peak, ts, n = con.execute("""
                WITH d AS (SELECT timestamp AS t, rowid AS r, newUsage - coalesce(lag(newUsage) OVER (
                               PARTITION BY (globalTid >> 24) & 16777215 ORDER BY timestamp, rowid), 0) AS dd
                           FROM GPU_MEMORY_USAGE_EVENTS WHERE segmentGroup = ?),
                     c AS (SELECT t, r, sum(dd) OVER (ORDER BY t, r ROWS UNBOUNDED PRECEDING) AS lvl FROM d)
                SELECT lvl, t, (SELECT count(*) FROM c) FROM c ORDER BY lvl DESC, t, r LIMIT 1""", (seg,)).fetchone()
            o = next(o for o in res.os_memory if o.pid is None and o.segment_group == label)
            assert (o.peak_usage_bytes, o.peak_usage_ts_ns, o.usage_events) == (peak, ts, n)
        con.close()
