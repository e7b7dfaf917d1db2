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
