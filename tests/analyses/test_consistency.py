"""Cross-tool consistency: the same quantity is the same number in every tool.

On every real profile under ../shared/data (Nsight SQLite, PyTorch Kineto, legacy rocpd) and on every
catalog scenario written in every format, the tools are run with their default arguments and the
figures that are defined identically are compared exactly (integer ns, no tolerance), per device:

  busy        trace_info devices[].busy_ns / gpu_first_ns / gpu_last_ns
              == gpu_timeline timelines[].busy_ns / first_ns / last_ns (one timeline per device)
              == stream_summary devices[].busy_ns / gpu_first_ns / gpu_last_ns
              == gap_histogram profiles[].busy_ns / gpu_first_ns / gpu_last_ns
              == diagnose gpu_busy_ns (its device); diagnose gpu_span_ns == gpu_timeline total_ns
              Σ devices == ops_summary totals.gpu_busy_ns
              (all: union of kernel + copy + set intervals of the device, default window = capture span;
              the clipping of gpu_timeline/stream_summary/gap_histogram is a no-op because the GPU
              activity lies inside the capture span, which is checked first)
  kernels     top_kernels summed_kernel_time_ns / kernel_count == SQL over `kernels`
              == Σ stream_summary streams kernel_work_ns / kernel_count
              == trace_info devices[].kernels == api_summary launches (device rows) kernels;
              Σ devices == ops_summary totals.summed_kernel_time_ns;
              top_kernels kernel_busy_ns == memcpy_summary devices[].kernel_busy_ns
  timeline    computation + exposed_comm + exposed_memcpy + idle == total; busy + idle == total;
              total == trace_info gpu_last - gpu_first; total_memcpy_ns == memcpy_summary copy_wall_ns
              and exposed_memcpy_ns == copy_exposed_ns where the definitions coincide (no ROCm copy
              kernels, no memsets on the device)
  memops      memcpy_summary copy/set count, bytes, work == SQL over `memops`
              == Σ stream_summary streams copy_count / set_count / memop_work_ns;
              trace_info devices[].memops == SQL
  host        api_summary processes api_calls / summed_api_time_ns == SQL over `api_calls`;
              per-thread api_calls and thread_api_span_ns == SQL; blocked_ns <= thread span <= capture span
  iterations  steps lie inside the capture span and are ranges of the `markers` table
  comm        comm_summary devices[] comm_wall / overlap / exposed / span / kernels
              == gpu_timeline total_comm_ns / comm_comp_overlap_ns / exposed_comm_ns / total_ns / comm_ops;
              comm_summed_ns == SQL over the communication kernels
  shares      every field named *_pct_of_<whole> that is a share of a whole lies in [0, 100]
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from conftest import needs_data, real_files, scenario_cases
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.tools import analyses as A
from gpuscope.tools.analyses.comm_patterns import is_comm_sql
from gpuscope.tools.analyses.gpu_timeline import ROCM_COPY_KERNEL
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError

REAL = real_files("nsys/*.sqlite", "pytorch/*.json.gz", "rocpd_legacy/*.rpd")

CASES = [pytest.param(("real", p), id=f"real-{p.name}", marks=needs_data) for p in REAL] + [
    pytest.param(("scenario", *c.values), id=c.id) for c in scenario_cases(SCENARIOS)]


@pytest.fixture(scope="module", params=CASES)
def case(request, open_profile):
    """(key, trace): a real profile (opened through the cache) or a catalog scenario in one format.
    Module scope: pytest then runs every test of one profile before opening the next."""
    spec = request.param
    if spec[0] == "real":
        return spec[1].name, open_trace(spec[1])
    _, name, fmt, pid = spec
    return f"{name}-{fmt}-{pid}", open_profile(name, fmt, pid)


_RESULTS: dict[tuple, object] = {}


def run(case, tool: str, **kw):
    """The tool's result on the case (memoized), or None when the tool declines the profile (ProfileError)."""
    key, trace = case
    k = (key, tool, tuple(sorted(kw.items())))
    if k not in _RESULTS:
        try:
            _RESULTS[k] = getattr(A, tool)(trace, **kw)
        except ProfileError:
            _RESULTS[k] = None
    return _RESULTS[k]


def need(case, tool: str, **kw):
    res = run(case, tool, **kw)
    if res is None:
        pytest.skip(f"{tool} does not apply to this profile")
    return res


def single_owner_timelines(tl) -> dict[int, object]:
    """gpu_timeline rows of devices with exactly one timeline (one owning process): device -> Timeline."""
    by_dev = defaultdict(list)
    for t in tl.timelines:
        by_dev[t.device_id].append(t)
    return {d: ts[0] for d, ts in by_dev.items() if len(ts) == 1}


def sql_per_device(trace, query: str) -> dict[int, tuple]:
    return {r[0]: tuple(r[1:]) for r in trace.sql(query)}


def gpu_inside_capture(case) -> bool:
    info = need(case, "trace_info")
    g, c = info.gpu_activity, info.capture
    return g is None or (c.start_ns <= g.start_ns and g.end_ns <= c.end_ns)


# -- the window: GPU activity lies inside the capture span (the premise of every like-with-like below) --

def test_gpu_activity_inside_capture(case):
    info = need(case, "trace_info")
    _, trace = case
    lo, hi = trace.sql("SELECT min(s), max(e) FROM (SELECT start_ns s, end_ns e FROM kernels WHERE end_ns > start_ns "
                       "UNION ALL SELECT start_ns, end_ns FROM memops WHERE end_ns > start_ns)")[0]
    if lo is None:
        assert info.gpu_activity is None
        return
    assert (info.gpu_activity.start_ns, info.gpu_activity.end_ns) == (lo, hi)
    assert info.capture.start_ns <= lo and hi <= info.capture.end_ns, \
        f"GPU activity [{lo}, {hi}) leaks out of the capture span [{info.capture.start_ns}, {info.capture.end_ns})"


# -- busy time, first/last op: trace_info == gpu_timeline == stream_summary == gap_histogram == diagnose ---

def test_device_busy_agrees(case):
    info = need(case, "trace_info")
    if not gpu_inside_capture(case):
        pytest.skip("GPU activity outside the capture span: clipped and unclipped figures differ by definition")
    devs = {d.device_id: d for d in info.devices if d.busy_ns is not None}
    if not devs:
        pytest.skip("no GPU op of non-zero length")
    tl = need(case, "gpu_timeline")
    ss = need(case, "stream_summary", limit=500)
    gh = need(case, "gap_histogram")
    ts = single_owner_timelines(tl)
    ss_dev = {d.device_id: d for d in ss.devices}
    gh_dev = {p.device_id: p for p in gh.profiles}
    assert set(ss_dev) >= set(devs)
    for d in set(ss_dev) - set(devs):  # devices whose every op has zero length: listed, with no busy time
        assert ss_dev[d].busy_ns == 0 and ss_dev[d].gpu_first_ns is None
    assert set(gh_dev) == set(devs) or gh.truncated
    for d, ti in devs.items():
        want = (ti.busy_ns, ti.gpu_first_ns, ti.gpu_last_ns)
        assert (ss_dev[d].busy_ns, ss_dev[d].gpu_first_ns, ss_dev[d].gpu_last_ns) == want, f"stream_summary device {d}"
        assert ss_dev[d].gpu_span_ns == ti.gpu_last_ns - ti.gpu_first_ns
        if d in gh_dev:
            p = gh_dev[d]
            assert (p.busy_ns, p.gpu_first_ns, p.gpu_last_ns) == want, f"gap_histogram device {d}"
            assert p.idle_in_gpu_span_ns == ss_dev[d].idle_in_gpu_span_ns
        if d in ts:
            t = ts[d]
            assert (t.busy_ns, t.first_ns, t.last_ns) == want, f"gpu_timeline device {d}"
            assert t.total_ns == ti.gpu_last_ns - ti.gpu_first_ns
            assert t.idle_ns == ss_dev[d].idle_in_gpu_span_ns
    # every device with a timeline has busy time in trace_info, and vice versa
    assert {t.device_id for t in tl.timelines} == set(devs)


def test_ops_summary_busy_and_span(case):
    info = need(case, "trace_info")
    ops = need(case, "ops_summary")
    _, trace = case
    busy = sum(d.busy_ns or 0 for d in info.devices)
    assert ops.totals.gpu_busy_ns == busy
    n, span = trace.sql("SELECT sum(n), sum(hi - lo) FROM (SELECT device_id, count(*) n, max(e) hi, min(s) lo FROM ("
                        "SELECT device_id, start_ns s, end_ns e FROM kernels UNION ALL "
                        "SELECT device_id, start_ns, end_ns FROM memops) GROUP BY device_id)")[0]
    assert ops.totals.gpu_ops == n
    assert ops.totals.gpu_span_ns == span


def test_diagnose_matches_timeline(case):
    dg = need(case, "diagnose")
    tl = need(case, "gpu_timeline")
    info = need(case, "trace_info")
    if dg.device_id is None:
        pytest.skip("diagnose analysed no device")
    rows = [t for t in tl.timelines if t.device_id == dg.device_id]
    main = max(rows, key=lambda t: t.busy_ns)
    assert dg.gpu_span_ns == main.total_ns
    assert dg.gpu_busy_ns == main.busy_ns
    if len(rows) == 1 and gpu_inside_capture(case):
        ti = next(d for d in info.devices if d.device_id == dg.device_id)
        assert dg.gpu_busy_ns == ti.busy_ns
        assert dg.gpu_span_ns == ti.gpu_last_ns - ti.gpu_first_ns
    for f in dg.findings:
        assert 0 <= f.time_at_stake_ns <= dg.gpu_span_ns
        assert f.share_pct is None or 0 <= f.share_pct <= 100


# -- kernel time: top_kernels == SQL == stream_summary == trace_info == api_summary == ops_summary ---------

def test_kernel_totals_agree(case):
    tk = need(case, "top_kernels")
    _, trace = case
    raw = sql_per_device(trace, "SELECT device_id, count(*), sum(dur_ns)::BIGINT, count(*) FILTER (WHERE NOT launched) "
                                "FROM kernels GROUP BY 1")
    got = {d.device_id: (d.kernel_count, d.summed_kernel_time_ns) for d in tk.devices}
    assert got == {d: v[:2] for d, v in raw.items()}
    info = need(case, "trace_info")
    assert {d.device_id: d.kernels for d in info.devices if d.kernels} == {d: v[0] for d, v in raw.items()}
    ops = run(case, "ops_summary")
    if ops is not None:
        assert ops.totals.summed_kernel_time_ns == sum(v[1] for v in raw.values())
    mc = run(case, "memcpy_summary")
    if mc is not None:
        busy = {d.device_id: d.kernel_busy_ns for d in tk.devices}
        for d in mc.devices:
            assert d.kernel_busy_ns == busy.get(d.device_id, 0), f"memcpy_summary vs top_kernels kernel_busy_ns, device {d.device_id}"
    api = run(case, "api_summary")
    if api is not None and api.launches is not None:
        rows = {r.device_id: r for r in api.launches if r.stream_id is None and r.pid is None}
        assert {d: (r.kernels, r.unlinked_kernels) for d, r in rows.items()} == {d: (v[0], v[2]) for d, v in raw.items()}


def test_kernel_busy_vs_timeline_when_no_memops(case):
    """Devices with kernels but no copies/sets: top_kernels kernel_busy_ns == trace_info busy_ns (same union)."""
    tk = need(case, "top_kernels")
    info = need(case, "trace_info")
    ti = {d.device_id: d for d in info.devices}
    checked = 0
    for d in tk.devices:
        if ti[d.device_id].memops == 0 and ti[d.device_id].busy_ns is not None:
            assert d.kernel_busy_ns == ti[d.device_id].busy_ns
            checked += 1
    if not checked:
        pytest.skip("every device has memory operations")


def test_stream_sums_match_device_totals(case):
    if not gpu_inside_capture(case):
        pytest.skip("GPU activity outside the capture span: stream_summary clips, the others do not")
    ss = need(case, "stream_summary", limit=500)
    assert not ss.truncated
    _, trace = case
    raw = sql_per_device(trace, """SELECT device_id, sum(k), sum(c), sum(s), sum(kw)::BIGINT, sum(mw)::BIGINT FROM (
        SELECT device_id, count(*) k, 0 c, 0 s, sum(dur_ns) kw, 0 mw FROM kernels GROUP BY 1 UNION ALL
        SELECT device_id, 0, count(*) FILTER (WHERE op = 'copy'), count(*) FILTER (WHERE op = 'set'), 0, sum(dur_ns)
        FROM memops GROUP BY 1) GROUP BY 1""")
    sums = defaultdict(lambda: [0, 0, 0, 0, 0])
    for s in ss.streams:
        for i, v in enumerate((s.kernel_count, s.copy_count, s.set_count, s.kernel_work_ns, s.memop_work_ns)):
            sums[s.device_id][i] += v
    assert {d: tuple(v) for d, v in sums.items()} == raw
    tk = run(case, "top_kernels")
    if tk is not None:
        for d in tk.devices:
            assert (sums[d.device_id][0], sums[d.device_id][3]) == (d.kernel_count, d.summed_kernel_time_ns)
    per_dev = defaultdict(int)
    for s in ss.streams:
        per_dev[s.device_id] += 1
    for d in ss.devices:
        assert d.streams == per_dev[d.device_id]
        assert d.stream_busy_sum_ns == sum(s.busy_ns for s in ss.streams if s.device_id == d.device_id)
        assert d.busy_ns <= d.stream_busy_sum_ns
        assert sum(b.time_ns for b in d.histogram) == d.gpu_span_ns
        assert sum(b.time_ns for b in d.histogram if b.busy_streams > 0) == d.busy_ns


# -- gpu_timeline: the partition of the span, and its copy figures vs memcpy_summary ---------------------

def test_timeline_partition(case):
    tl = need(case, "gpu_timeline")
    for t in tl.timelines + ([tl.all_devices] if tl.all_devices else []):
        assert t.computation_ns + t.exposed_comm_ns + t.exposed_memcpy_ns + t.idle_ns == t.total_ns
        assert t.busy_ns + t.idle_ns == t.total_ns == t.last_ns - t.first_ns
        assert t.computation_ns + t.exposed_comm_ns + t.exposed_memcpy_ns == t.busy_ns
        assert t.exposed_comm_ns + t.comm_comp_overlap_ns == t.total_comm_ns
        assert t.exposed_memcpy_ns <= t.total_memcpy_ns and t.idle_ns >= 0
        for f in ("computation", "exposed_comm", "exposed_memcpy", "busy", "idle", "total_comm", "total_memcpy"):
            p = getattr(t, f"{f}_pct_of_total")
            assert p is None or 0 <= p <= 100, f"{f}_pct_of_total = {p}"
    for s in tl.streams:
        assert s.host_wait_ns + s.kernel_wait_ns + s.other_ns + s.launch_unknown_ns == s.idle_ns
        assert s.busy_ns + s.idle_ns == s.last_ns - s.first_ns


def test_timeline_copies_match_memcpy_summary(case):
    if not gpu_inside_capture(case):
        pytest.skip("GPU activity outside the capture span")
    tl = need(case, "gpu_timeline")
    mc = need(case, "memcpy_summary")
    _, trace = case
    rocm_copy = {r[0] for r in trace.sql(f"SELECT DISTINCT device_id FROM kernels WHERE regexp_matches(name, '{ROCM_COPY_KERNEL}')")}
    ts = single_owner_timelines(tl)
    checked = 0
    for d in mc.devices:
        t = ts.get(d.device_id)
        if t is None or d.device_id in rocm_copy:
            continue
        assert t.total_memcpy_ns == d.copy_wall_ns, f"device {d.device_id}: gpu_timeline |MEMCPY| vs memcpy_summary copy wall"
        checked += 1
        if d.set_count == 0:  # COMP ∪ COMM is then every kernel of the device: the two 'exposed' coincide
            assert t.exposed_memcpy_ns == d.copy_exposed_ns, f"device {d.device_id}: exposed copy time"
    if not checked:
        pytest.skip("no device where the definitions coincide")


# -- memory operations: memcpy_summary == SQL == trace_info ------------------------------------------------

def test_memops_match_sql(case):
    _, trace = case
    raw = sql_per_device(trace, """SELECT device_id,
        count(*) FILTER (WHERE op = 'copy'), sum(bytes) FILTER (WHERE op = 'copy'), coalesce(sum(dur_ns) FILTER (WHERE op = 'copy'), 0),
        count(*) FILTER (WHERE op = 'set'), sum(bytes) FILTER (WHERE op = 'set'), coalesce(sum(dur_ns) FILTER (WHERE op = 'set'), 0)
        FROM memops GROUP BY 1""")
    info = need(case, "trace_info")
    assert {d.device_id: d.memops for d in info.devices if d.memops} == {d: v[0] + v[3] for d, v in raw.items()}
    assert info.counts["memcpy"] == sum(v[0] for v in raw.values())
    mc = run(case, "memcpy_summary")
    if not raw:
        assert mc is None
        return
    got = {d.device_id: (d.copy_count, d.copy_bytes, d.copy_work_ns, d.set_count, d.set_bytes, d.set_work_ns) for d in mc.devices}
    want = {d: tuple(None if x is None else int(x) for x in v) for d, v in raw.items()}
    assert got == want
    for d in mc.devices:
        assert d.copy_overlapped_by_kernels_ns <= d.copy_wall_ns <= d.copy_work_ns
        assert d.set_overlapped_by_kernels_ns <= d.set_wall_ns <= d.set_work_ns
        assert d.copy_overlap_pct_of_copy_wall is None or 0 <= d.copy_overlap_pct_of_copy_wall <= 100
    if not mc.truncated:
        for d in mc.devices:
            groups = [g for g in mc.groups if g.device_id == d.device_id]
            assert sum(g.count for g in groups if g.op == "copy") == d.copy_count
            assert sum(g.count for g in groups if g.op == "set") == d.set_count


# -- host side: api_summary == SQL; blocked time within the spans ------------------------------------------

def test_api_summary_matches_sql(case):
    api = need(case, "api_summary")
    info = need(case, "trace_info")
    _, trace = case
    raw = {r[0]: (r[1], r[2]) for r in trace.sql("SELECT pid, count(*), sum(dur_ns)::BIGINT FROM api_calls GROUP BY 1")}
    assert {p.pid: (p.api_calls, p.summed_api_time_ns) for p in api.processes} == raw
    assert api.window.span_ns == info.capture.span_ns
    threads = {(r[0], r[1]): (r[2], r[3]) for r in trace.sql(
        "SELECT pid, tid, count(*), max(end_ns) - min(start_ns) FROM api_calls GROUP BY 1, 2")}
    for t in api.blocked_threads:
        assert (t.api_calls, t.thread_api_span_ns) == threads[(t.pid, t.tid)]
        assert 0 <= t.blocked_ns <= t.thread_api_span_ns <= info.capture.span_ns
        assert t.api_busy_ns <= t.thread_api_span_ns
        for p in (t.pct_of_thread_api_span, t.pct_of_window):
            assert p is None or 0 <= p <= 100
    for p in api.blocked_processes:
        assert p.blocked_any_thread_ns <= min(p.blocked_thread_sum_ns, info.capture.span_ns)
        assert p.pct_of_window is None or 0 <= p.pct_of_window <= 100
    for g in api.apis:
        assert g.pct_of_process_api_time is None or 0 <= g.pct_of_process_api_time <= 100


# -- iterations: steps are marker ranges inside the capture ------------------------------------------------

def test_iteration_steps_inside_capture(case):
    it = need(case, "iterations")
    info = need(case, "trace_info")
    _, trace = case
    cap = info.capture
    for s in it.steps:
        assert cap.start_ns <= s.start_ns < s.end_ns <= cap.end_ns
        assert s.wall_ns == s.end_ns - s.start_ns
        n = trace.scalar("SELECT count(*) FROM markers WHERE pid = ? AND tid = ? AND name = ? AND start_ns = ? AND end_ns = ?",
                         [s.pid, s.tid, s.name, s.start_ns, s.end_ns])
        assert n >= 1, f"step {s.index} ({s.name}) is no range of the markers table"
        assert s.window_kernels <= trace.scalar("SELECT count(*) FROM kernels WHERE pid = ?", [s.pid])
        if s.gpu_busy_in_window_ns is not None:
            assert 0 <= s.gpu_busy_in_window_ns <= s.wall_ns
            assert s.gpu_idle_in_window_ns == s.wall_ns - s.gpu_busy_in_window_ns
        for d in s.devices:
            assert 0 <= d.window_busy_ns <= s.wall_ns
            assert d.window_busy_pct_of_wall is None or 0 <= d.window_busy_pct_of_wall <= 100
    if not it.truncated:
        for m in it.summaries:
            walls = [s.wall_ns for s in it.steps if (s.pid, s.tid) == (m.pid, m.tid)]
            assert (m.steps, m.wall_total_ns) == (len(walls), sum(walls))


# -- communication: comm_summary == gpu_timeline == SQL ----------------------------------------------------

def test_comm_summary_matches_timeline(case):
    cs = need(case, "comm_summary")
    tl = need(case, "gpu_timeline")
    _, trace = case
    rows = {(t.device_id, t.pid): t for t in tl.timelines if t.total_comm_ns > 0 or t.comm_ops > 0}
    got = {(d.device_id, d.pid): d for d in cs.devices}
    assert set(got) == set(rows)
    for k, d in got.items():
        t = rows[k]
        assert (d.comm_wall_ns, d.overlap_with_compute_ns, d.exposed_comm_ns, d.gpu_span_ns, d.comm_kernels) == \
               (t.total_comm_ns, t.comm_comp_overlap_ns, t.exposed_comm_ns, t.total_ns, t.comm_ops), f"device {k}"
        for p in (d.overlap_pct_of_comm_wall, d.exposed_comm_pct_of_comm_wall, d.comm_wall_pct_of_gpu_span, d.exposed_comm_pct_of_gpu_span):
            assert p is None or 0 <= p <= 100
    if got and gpu_inside_capture(case):
        raw = sql_per_device(trace, f"SELECT device_id, count(*), sum(dur_ns)::BIGINT FROM kernels "
                                    f"WHERE end_ns > start_ns AND {is_comm_sql('name')} GROUP BY 1")
        per_dev = defaultdict(lambda: [0, 0])
        for d in cs.devices:
            per_dev[d.device_id][0] += d.comm_kernels
            per_dev[d.device_id][1] += d.comm_summed_ns
        assert {d: tuple(v) for d, v in per_dev.items()} == raw
        if not cs.truncated:
            for k, d in got.items():
                assert sum(c.total_ns for c in cs.collectives if (c.device_id, c.pid) == k) == d.comm_summed_ns


# -- shares of a whole in top_kernels / stream_summary / trace_info -----------------------------------------

def test_shares_are_percentages(case):
    info = need(case, "trace_info")
    for d in info.devices:
        assert d.busy_pct_of_gpu_span is None or 0 <= d.busy_pct_of_gpu_span <= 100
    tk = run(case, "top_kernels")
    if tk is not None:
        for k in tk.kernels:
            assert k.pct_of_device_kernel_time is None or 0 <= k.pct_of_device_kernel_time <= 100
    ss = run(case, "stream_summary", limit=500)
    if ss is not None:
        for s in ss.streams:
            for p in (s.pct_of_device_gpu_span, s.pct_of_device_busy):
                assert p is None or 0 <= p <= 100
        for d in ss.devices:
            assert d.concurrent_pct_of_busy is None or 0 <= d.concurrent_pct_of_busy <= 100
            for b in d.histogram:
                assert b.pct_of_gpu_span is None or 0 <= b.pct_of_gpu_span <= 100


# -- gpu_timeline all-device merge vs trace_info's GPU activity window ----------------------------------

def test_all_devices_timeline_spans_gpu_activity(case):
    tl = need(case, "gpu_timeline")
    info = need(case, "trace_info")
    if tl.all_devices is None:
        pytest.skip("one timeline only")
    if not gpu_inside_capture(case):
        pytest.skip("GPU activity outside the capture span")
    a = tl.all_devices
    assert (a.first_ns, a.last_ns) == (info.gpu_activity.start_ns, info.gpu_activity.end_ns)
    assert max(t.busy_ns for t in tl.timelines) <= a.busy_ns <= sum(t.busy_ns for t in tl.timelines)
    assert a.ops == sum(t.ops for t in tl.timelines) and a.comm_ops == sum(t.comm_ops for t in tl.timelines)


# -- rank_summary (one profile: a rank per process) == gpu_timeline summed over the process's devices -----

def test_rank_summary_matches_timeline(case):
    _, trace = case
    tl = need(case, "gpu_timeline")
    try:
        rs = A.rank_summary([trace])
    except ProfileError:
        pytest.skip("rank_summary does not apply to this profile")
    pids = {t.pid for t in tl.timelines}
    if None in pids or len({t.device_id for t in tl.timelines}) != len(tl.timelines) or pids != {r.pid for r in rs.ranks}:
        pytest.skip("devices shared by processes or work without a process: ownership differs by definition")
    fields = ("busy_ns", "computation_ns", "total_comm_ns", "exposed_comm_ns", "exposed_memcpy_ns", "total_ns", "comm_ops")
    for r in rs.ranks:
        rows = [t for t in tl.timelines if t.pid == r.pid]
        want = tuple(sum(getattr(t, f) for t in rows) for f in fields)
        got = (r.busy_ns, r.compute_ns, r.comm_ns, r.exposed_comm_ns, r.exposed_memcpy_ns, r.gpu_span_ns, r.comm_kernels)
        assert got == want, f"rank pid {r.pid}: rank_summary {got} vs gpu_timeline {want} ({fields})"
        assert r.kernels == trace.scalar("SELECT count(*) FROM kernels WHERE pid = ?", [r.pid])
        assert r.busy_pct_of_gpu_span is None or 0 <= r.busy_pct_of_gpu_span <= 100


# -- phases: the phases tile the device's GPU span; their sums are the device's figures --------------------

def test_phases_tile_device_span(case):
    ph = need(case, "phases")
    info = need(case, "trace_info")
    _, trace = case
    if not gpu_inside_capture(case):
        pytest.skip("GPU activity outside the capture span")
    dev = next(d for d in info.devices if d.device_id == ph.device_id)
    assert (ph.gpu_first_ns, ph.gpu_last_ns, ph.busy_ns) == (dev.gpu_first_ns, dev.gpu_last_ns, dev.busy_ns)
    assert ph.idle_before_first_op_ns == dev.gpu_first_ns - info.capture.start_ns
    assert ph.idle_after_last_op_ns == info.capture.end_ns - dev.gpu_last_ns
    assert ph.phases[0].start_ns == ph.gpu_first_ns and ph.phases[-1].end_ns == ph.gpu_last_ns
    for a, b in zip(ph.phases, ph.phases[1:]):
        assert a.end_ns == b.start_ns
    assert sum(p.busy_ns for p in ph.phases) == ph.busy_ns
    assert sum(p.duration_ns for p in ph.phases) == ph.gpu_span_ns
    for p in ph.phases:
        assert p.busy_ns + p.idle_ns == p.duration_ns
        # (dominant.pct_of_phase_duration is summed op time over the duration: > 100 with concurrency, by definition)
        for v in (p.pct_of_gpu_span, p.busy_pct_of_phase):
            assert v is None or 0 <= v <= 100
    # counts: ops starting inside the span; times: durations clipped to it (= whole, for ops inside the span)
    raw = trace.sql("""SELECT
        (SELECT count(*) FROM kernels WHERE device_id = $d AND start_ns >= $lo AND start_ns < $hi),
        (SELECT count(*) FROM memops WHERE device_id = $d AND op = 'copy' AND start_ns >= $lo AND start_ns < $hi),
        (SELECT count(*) FROM memops WHERE device_id = $d AND op = 'set' AND start_ns >= $lo AND start_ns < $hi),
        (SELECT coalesce(sum(least(end_ns, $hi) - greatest(start_ns, $lo)), 0) FROM kernels
         WHERE device_id = $d AND end_ns > $lo AND start_ns < $hi)""",
        {"d": ph.device_id, "lo": ph.gpu_first_ns, "hi": ph.gpu_last_ns})[0]
    got = (sum(p.kernel_count for p in ph.phases), sum(p.copy_count for p in ph.phases),
           sum(p.set_count for p in ph.phases), sum(p.kernel_time_ns for p in ph.phases))
    assert got == tuple(int(x) for x in raw)


# -- compare_traces of a profile with itself: no change, and its totals are the other tools' figures -------

def test_compare_with_itself(case):
    key, trace = case
    info = need(case, "trace_info")
    try:
        cmp = A.compare_traces(trace, trace)
    except ProfileError:
        pytest.skip("compare_traces does not apply to this profile")
    totals = {t.figure.removesuffix("_ns"): t for t in cmp.totals}
    assert all(t.delta_ns == 0 and t.baseline_ns == t.candidate_ns for t in cmp.totals)
    assert cmp.kernels.net_change_ns == 0 and cmp.kernels.gross_change_ns == 0 and not cmp.kernels.entries
    assert totals["capture_span"].baseline_ns == info.capture.span_ns
    dev = cmp.devices[0]
    tk = run(case, "top_kernels")
    if tk is not None:
        kt = [d.summed_kernel_time_ns for d in tk.devices if dev is None or d.device_id == dev]
        assert totals["summed_kernel_time"].baseline_ns == sum(kt) == cmp.kernels.baseline_total_ns
    busy = [d for d in info.devices if d.busy_ns is not None]
    if dev is not None and gpu_inside_capture(case) and len(busy) == 1 and busy[0].device_id == dev:
        tl = need(case, "gpu_timeline")
        if len(tl.timelines) == 1:
            assert totals["busy"].baseline_ns == busy[0].busy_ns
            assert totals["gpu_span"].baseline_ns == busy[0].gpu_last_ns - busy[0].gpu_first_ns
