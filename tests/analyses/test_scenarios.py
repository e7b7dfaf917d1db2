"""Tier 1: every catalog scenario, written in every format, gives the analyses' results that
fixtures/truth.py computes from the Scenario alone — and the formats agree with each other.

Exact integer ns everywhere; the tools round avg/median/std to 0.1 ns, so avg and std are compared
within 0.05 ns (median is an integer or .5, hence exact).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import pytest

from conftest import FORMATS
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.catalog import SCENARIOS, US, check
from gpuscope.tools.analyses import gap_histogram, top_kernels, trace_info
from gpuscope.tools.model.errors import ProfileError

ROUNDED = 0.05 + 1e-6  # the tools round to 0.1 ns


@lru_cache(maxsize=None)
def scenario(name: str):
    return SCENARIOS[name]()


@lru_cache(maxsize=None)
def expected_scenario(name: str, fmt: str, pid: int | None):
    return T.expressed(scenario(name), fmt, pid)


def _cases():
    out = []
    for name in SCENARIOS:
        for fmt in FORMATS:
            pids = [p.pid for p in scenario(name).processes]
            if fmt == "kineto" and len(pids) > 1:  # PyTorch writes one trace per process
                out += [pytest.param(name, fmt, pid, id=f"{name}-{fmt}-pid{pid}") for pid in pids]
            else:
                out.append(pytest.param(name, fmt, None, id=f"{name}-{fmt}"))
    return out


CASES = _cases()


def clip(name: str, limit: int = 160) -> str:
    """The tools clip names longer than 160 characters to 159 + '…'."""
    return name if len(name) <= limit else name[: limit - 1] + "…"


def pct(part, whole):
    return None if not whole else round(100.0 * part / whole, 2)


def canonical_api(name: str) -> str:
    """HIP and CUDA spellings of the same runtime call compare equal across formats."""
    return "cuda" + name[3:] if name.startswith("hip") else name


def expected_capture(name: str, fmt: str, pid: int | None) -> tuple[int, int]:
    """The capture span each reader documents, on the scenario timeline."""
    s = scenario(name)
    if fmt == "nsys":
        # The writer states an explicit span in ANALYSIS_DETAILS for modern exports only (2022-era
        # ones only when it starts at session start, which no catalog scenario does).
        if s.options.get("nsys_old_schema") or s.options.get("nsys_meta_table") == "EXPORT_META_DATA":
            return T.capture_span(replace_options(s))  # first to last event
        return T.capture_span(s)
    if fmt == "rocpd":
        return T.capture_span(s)  # rocpd_info_process init/fini, as the writer sets them
    # Kineto: first to last event of the file (the profiler's own span event covers exactly that)
    return T.capture_span(replace_options(expected_scenario(name, fmt, pid)), include_cpu_ops=True)


def capability(s, fmt: str, d) -> str:
    """NVIDIA compute capability 'major.minor'; rocpd states the gfx target (its writer's mapping)."""
    if fmt == "rocpd":
        return s.options.get("rocpd_gfx", {}).get(d.device_id) or f"gfx{d.compute_major}{d.compute_minor}"
    return f"{d.compute_major}.{d.compute_minor}"


def replace_options(s):
    return replace(s, options={k: v for k, v in s.options.items() if k not in ("capture_start_ns", "capture_end_ns")})


# -- the catalog itself --------------------------------------------------------------------------------


def test_catalog_scenarios_are_consistent():
    assert len(SCENARIOS) == 15
    for name, make in SCENARIOS.items():
        s = make()
        check(s)
        assert s.name == name
        assert make() == s, "scenarios must be deterministic"
    cs = scenario("concurrent_streams")
    assert len({k.stream_id for k in cs.kernels}) == 3
    assert any(len({k.stream_id for k in cs.kernels if k.short_name == n}) > 1 for n in {k.short_name for k in cs.kernels})
    assert {m.kind for m in cs.memops} == {"HtoD", "DtoH", "memset"}
    gaps = T.gaps_truth(cs)[0]
    assert all(gaps["buckets"][b][0] > 0 for b in ("<10us", "10-100us", "100us-1ms", "1-10ms"))
    syncs = [a for a in cs.api_calls if a.name == "cudaStreamSynchronize"]
    assert any(a.start_ns <= g["start_ns"] and g["end_ns"] <= a.end_ns for a in syncs for g in gaps["largest_gaps"])
    mp = scenario("multi_process")
    assert len({k.device_id for k in mp.kernels}) == 2 and len({k.stream_id for k in mp.kernels if k.short_name.startswith("nccl")}) == 1
    ids = [{a.correlation_id for a in mp.api_calls if a.pid == p.pid} for p in mp.processes]
    assert ids[0] & ids[1]
    assert any(k.end_ns == k.start_ns for k in scenario("zero_length_kernels").kernels)
    assert not scenario("no_kernels").kernels and scenario("no_kernels").memops
    neg = scenario("negative_timestamps")
    assert min(k.start_ns for k in neg.kernels) + T.time_shift(neg, "nsys") < 0 < max(k.end_ns for k in neg.kernels) + T.time_shift(neg, "nsys")
    assert T.unlinked(scenario("unlinked_kernels"))[0] >= 3
    g = scenario("graph_launch")
    launch = [a for a in g.api_calls if a.name == "cudaGraphLaunch"]
    assert len(launch) == 1 and sum(k.correlation_id == launch[0].correlation_id for k in g.kernels) == 20
    us = scenario("microsecond_scale")
    lo, hi = T.capture_span(us, include_cpu_ops=True)
    assert hi - lo < 50 * US and min(k.end_ns - k.start_ns for k in us.kernels) == 700
    assert T.top_kernels_truth(us)["groups"][(0, "reduce_kernel")]["median_ns"] == 825.5
    assert scenario("amd_mi300x").is_amd


def test_truth_merges_like_the_definition():
    """The ground truth's own building blocks on hand-checked inputs."""
    assert T.merge([(5, 9), (0, 3), (3, 4), (7, 8), (6, 6), (12, 12)]) == [[0, 4], [5, 9]]
    assert T.busy_ns([(0, 10), (5, 15), (20, 20), (30, 31)]) == 16
    assert [T.bucket_of(g) for g in (9_999, 10_000, 99_999, 100_000, 999_999, 1_000_000, 10**7, 10**8)] == [
        "<10us", "10-100us", "10-100us", "100us-1ms", "100us-1ms", "1-10ms", "10-100ms", ">100ms"]


# -- per format against the truth -----------------------------------------------------------------------


@pytest.mark.parametrize("group_by", ["short_name", "name"])
@pytest.mark.parametrize("name, fmt, pid", CASES)
def test_top_kernels_match_truth(open_profile, name, fmt, pid, group_by):
    s = expected_scenario(name, fmt, pid)
    trace = open_profile(name, fmt, pid)
    want = T.top_kernels_truth(s, group_by)
    if not s.kernels:
        with pytest.raises(ProfileError):
            top_kernels(trace, limit=200, group_by=group_by)
        return
    res = top_kernels(trace, limit=200, group_by=group_by)
    assert not res.truncated
    assert [(g.device_id, g.name) for g in res.kernels] == [(d, clip(n)) for d, n in want["order"]]
    names = {d.device_id: d.name for d in s.devices}
    got_dev = {d.device_id: (d.device_name, d.kernel_count, d.kernel_names, d.summed_kernel_time_ns, d.kernel_busy_ns,
                             d.remainder_groups, d.remainder_count, d.remainder_total_ns) for d in res.devices}
    want_dev = {dev: (names[dev], t["kernel_count"], t["kernel_names"], t["summed_kernel_time_ns"], t["kernel_busy_ns"], 0, 0, 0)
                for dev, t in want["devices"].items()}
    assert got_dev == want_dev
    got, exp = {}, {}
    for g, key in zip(res.kernels, want["order"]):
        t, dev = want["groups"][key], want["devices"][key[0]]
        got[key] = (g.count, g.total_ns, g.min_ns, g.max_ns, g.median_ns, g.std_ns is None, g.launch_configs,
                    g.pct_of_device_kernel_time, g.pct_of_device_busy_time)
        exp[key] = (t["count"], t["total_ns"], t["min_ns"], t["max_ns"], t["median_ns"], t["std_ns"] is None, t["launch_configs"],
                    pct(t["total_ns"], dev["summed_kernel_time_ns"]), pct(t["total_ns"], dev["kernel_busy_ns"]))
        for field in ("grid", "block", "registers_per_thread", "shared_mem_bytes"):
            if t[field] is not None:  # a unique most-frequent value
                got[key] += (getattr(g, field),)
                exp[key] += (list(t[field]) if isinstance(t[field], tuple) else t[field],)
        assert abs(g.avg_ns - t["avg_ns"]) <= ROUNDED, (key, g.avg_ns, t["avg_ns"])
        if t["std_ns"] is not None:
            assert abs(g.std_ns - t["std_ns"]) <= ROUNDED, (key, g.std_ns, t["std_ns"])
    assert got == exp


@pytest.mark.parametrize("include_memops", [True, False])
@pytest.mark.parametrize("name, fmt, pid", CASES)
def test_gap_histogram_matches_truth(open_profile, name, fmt, pid, include_memops):
    s = expected_scenario(name, fmt, pid)
    shift = T.time_shift(s, fmt)
    trace = open_profile(name, fmt, pid)
    want = T.gaps_truth(s, include_memops, top=50)
    if not want:
        with pytest.raises(ProfileError):
            gap_histogram(trace, include_memops=include_memops, top_gaps=50)
        return
    res = gap_histogram(trace, include_memops=include_memops, top_gaps=50)
    lo, hi = expected_capture(name, fmt, pid)
    assert (res.window.start_ns - shift, res.window.end_ns - shift) == (lo, hi)
    assert not res.truncated
    assert [p.device_id for p in res.profiles] == list(want)
    for p in res.profiles:
        w = want[p.device_id]
        span = w["gpu_last_ns"] - w["gpu_first_ns"]
        got = (p.ops, p.gpu_first_ns - shift, p.gpu_last_ns - shift, p.gpu_span_ns, p.busy_ns, p.idle_in_gpu_span_ns,
               p.idle_pct_of_gpu_span, p.idle_in_window_ns, p.gap_count, [(b.bucket, b.count, b.total_ns) for b in p.buckets])
        exp = (w["ops"], w["gpu_first_ns"], w["gpu_last_ns"], span, w["busy_ns"], w["idle_in_gpu_span_ns"],
               pct(w["idle_in_gpu_span_ns"], span), hi - lo - w["busy_ns"], w["gap_count"],
               [(label, *w["buckets"][label]) for label, _ in T.BUCKETS])
        assert got == exp, p.device_id
        assert [(g.start_ns - shift, g.end_ns - shift, g.gap_ns) for g in p.largest_gaps] == [
            (g["start_ns"], g["end_ns"], g["gap_ns"]) for g in w["largest_gaps"]]
        for g, e in zip(p.largest_gaps, w["largest_gaps"]):
            if e["before"] is not None:
                b = e["before"]
                assert (g.before.kind, g.before.name, g.before.stream_id) == (b["kind"], clip(b["name"]), b["stream_id"]), e
            if e["after"] is None:
                continue
            a = e["after"]
            assert (g.after.kind, g.after.name, g.after.stream_id) == (a["kind"], clip(a["name"]), a["stream_id"]), e
            assert g.host_thread == a["tid"], e
            if a["tid"] is None:
                assert g.host_calls == [] and g.host_note, e
            else:
                assert sorted((c.name, c.overlap_ns) for c in g.host_calls) == sorted(e["host_calls"]), e
                assert bool(g.host_calls) != bool(g.host_note), e


@pytest.mark.parametrize("name, fmt, pid", CASES)
def test_trace_info_reports_scenario(open_profile, name, fmt, pid):
    s = expected_scenario(name, fmt, pid)
    shift = T.time_shift(s, fmt)
    info = trace_info(open_profile(name, fmt, pid))
    assert (info.unlinked_gpu_ops, info.unlinked_gpu_time_ns) == T.unlinked(s)
    lo, hi = expected_capture(name, fmt, pid)
    assert (info.capture.start_ns - shift, info.capture.end_ns - shift) == (lo, hi)
    busy = T.gaps_truth(s, include_memops=True, top=0)
    compute = [d for d in s.devices if d.compute]
    got = {d.device_id: (d.name, d.vendor, d.sm_count, d.memory_gib, d.compute_capability, d.kernels, d.memops, d.busy_ns,
                         None if d.gpu_first_ns is None else d.gpu_first_ns - shift,
                         None if d.gpu_last_ns is None else d.gpu_last_ns - shift)
           for d in info.devices if d.is_compute is not False}
    exp = {d.device_id: (d.name, d.vendor, d.sm_count, round(d.memory_bytes / 2**30, 2), capability(s, fmt, d),
                         sum(k.device_id == d.device_id for k in s.kernels),
                         sum(m.device_id == d.device_id for m in s.memops),
                         *((busy[d.device_id]["busy_ns"], busy[d.device_id]["gpu_first_ns"], busy[d.device_id]["gpu_last_ns"])
                           if d.device_id in busy else (None, None, None)))
           for d in compute}
    assert got == exp
    if fmt == "nsys" and not s.options.get("nsys_old_schema"):  # only Nsight states bandwidth
        assert {d.device_id: d.memory_bandwidth_gb_per_s for d in info.devices if d.is_compute} == {
            d.device_id: round(d.memory_bandwidth_bytes_per_s / 1e9, 1) for d in compute}
    listed_only = {d.device_id: d.name for d in s.devices if not d.compute}
    for d in info.devices:
        if d.is_compute is False:  # a display adapter the profiler lists
            assert listed_only.get(d.device_id) == d.name and d.kernels == d.memops == 0
    assert sum(d.kernels for d in info.devices) == len(s.kernels)
    # Old Nsight exports have no PROCESSES table (no names); rocpd states no ranks.
    no_names, no_ranks = fmt == "nsys" and s.options.get("nsys_old_schema"), fmt == "rocpd"
    assert [(p.pid, p.name, p.rank, p.kernels) for p in info.processes] == [
        (q.pid, None if no_names else q.name, None if no_ranks else q.rank, sum(k.pid == q.pid for k in s.kernels))
        for q in sorted(s.processes, key=lambda q: q.pid)]
    counts = info.counts
    assert (counts["kernels"], counts["memcpy"], counts["memset"], counts["api_calls"]) == (
        len(s.kernels), sum(m.op == "copy" for m in s.memops), sum(m.op == "set" for m in s.memops), len(s.api_calls))


@pytest.mark.parametrize("name, fmt, pid", CASES)
def test_markers_match_scenario(open_profile, name, fmt, pid):
    """NVTX / rocTX / record_function ranges come back with their text (textId-only and non-UTF-8
    exports included), thread and times; Nsight also keeps domains and range kinds, rocpd the kinds."""
    s = expected_scenario(name, fmt, pid)
    shift = T.time_shift(s, fmt)
    rows = open_profile(name, fmt, pid).sql("SELECT pid, tid, start_ns, end_ns, name, domain, kind FROM markers")
    got = sorted((p, t, a - shift, b - shift, n, d if fmt == "nsys" else "", k if fmt != "kineto" else "")
                 for p, t, a, b, n, d, k in rows)
    assert got == sorted((m.pid, m.tid, m.start_ns, m.end_ns, m.name, m.domain if fmt == "nsys" else "",
                          m.kind if fmt != "kineto" else "") for m in s.markers)


# -- the formats agree ------------------------------------------------------------------------------------


def _normalised(result, shift: int):
    """A result dump on the scenario timeline, without what legitimately differs between formats
    (file path, capture window and what depends on it, HIP vs CUDA spelling of API names)."""
    d = result.model_dump(exclude={"trace", "window"})

    def walk(x, key=None):
        if isinstance(x, dict):
            return {k: walk(v, k) for k, v in x.items() if k not in ("idle_in_window_ns", "idle_pct_of_window")}
        if isinstance(x, list):
            return [walk(v, key) for v in x]
        if isinstance(x, int) and key in ("start_ns", "end_ns", "gpu_first_ns", "gpu_last_ns", "time_ns"):
            return x - shift
        if isinstance(x, str) and key == "name" and x.startswith("hip"):
            return canonical_api(x)
        return x

    return walk(d)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_formats_agree(open_profile, name):
    s = scenario(name)
    fmts = [f for f in FORMATS if not (f == "kineto" and len(s.processes) > 1)]
    # rocpd holds no memsets and writes peer copies as device-to-device
    full = [f for f in fmts if f != "rocpd" or not any(m.op == "set" or m.kind == "PtoP" for m in s.memops)]
    results: dict[str, dict] = {}
    for fmt in fmts:
        trace = open_profile(name, fmt)
        shift = T.time_shift(s, fmt)
        r = {}
        if s.kernels:
            for group_by in ("short_name", "name"):
                r[f"top_kernels/{group_by}"] = _normalised(top_kernels(trace, limit=200, group_by=group_by), shift)
            r["gaps/kernels"] = _normalised(gap_histogram(trace, include_memops=False, top_gaps=50), shift)
        if fmt in full:
            r["gaps/all"] = _normalised(gap_histogram(trace, include_memops=True, top_gaps=50), shift)
        results[fmt] = r
    ref = fmts[0]
    for fmt in fmts[1:]:
        for key in results[fmt]:
            assert results[fmt][key] == results[ref][key], f"{name}: {fmt} and {ref} disagree on {key}"
