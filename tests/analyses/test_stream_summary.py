"""stream_summary: per-stream busy time and per-device concurrency, checked against plain-Python
sweeps over the scenario (fixtures/scenarios_stream_summary.py) in every format, and on real files."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from conftest import DATA, FORMATS
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.samples import real_profiles
from gpuscope.fixtures.catalog import SCENARIOS as CATALOG
from gpuscope.fixtures.scenarios_stream_summary import stream_concurrency, stream_truth
from gpuscope.tools.analyses.stream_summary import stream_summary
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError

REAL = real_profiles()
US = 1000


def pct(part, whole):
    return None if not whole else round(100.0 * part / whole, 2)


OWN = {"stream_concurrency": stream_concurrency}


@pytest.fixture(scope="module")
def own(open_profile):
    """stream_concurrency written in each format (Kineto: one file per process), opened once."""
    return lambda fmt, pid=None: open_profile("stream_concurrency", fmt, pid, scenarios=OWN)


def clipped(s, lo: int | None, hi: int | None):
    """The scenario's GPU ops overlapping [lo, hi), clipped to it (what a windowed call sees)."""
    if lo is None and hi is None:
        return s
    lo = -(2**62) if lo is None else lo
    hi = 2**62 if hi is None else hi
    keep = lambda ops: [replace(o, start_ns=max(o.start_ns, lo), end_ns=min(o.end_ns, hi))  # noqa: E731
                        for o in ops if o.end_ns > lo and o.start_ns < hi]
    return replace(s, kernels=keep(s.kernels), memops=keep(s.memops))


def check(result, s, shift: int, include_memops: bool = True):
    exp = stream_truth(s, include_memops)
    got_streams = {(r.device_id, r.stream_id, r.pid): r for r in result.streams}
    assert set(got_streams) == set(exp["streams"])
    for key, e in exp["streams"].items():
        g = got_streams[key]
        dev = exp["devices"][key[0]]
        for f in ("kernel_count", "copy_count", "set_count", "kernel_work_ns", "memop_work_ns", "busy_ns"):
            assert getattr(g, f) == e[f], (key, f)
        assert g.first_ns == (e["merged"][0][0] + shift if e["merged"] else None)
        assert g.last_ns == (e["merged"][-1][1] + shift if e["merged"] else None)
        assert g.pct_of_device_gpu_span == pct(e["busy_ns"], dev["gpu_span_ns"])
        assert g.pct_of_device_busy == pct(e["busy_ns"], dev["busy_ns"])
    got_devs = {d.device_id: d for d in result.devices}
    assert set(got_devs) == set(exp["devices"])
    for dev, e in exp["devices"].items():
        g = got_devs[dev]
        for f in ("streams", "gpu_span_ns", "busy_ns", "concurrent_ns", "max_concurrent_streams", "time_at_max_concurrency_ns",
                  "stream_busy_sum_ns", "shared_stream_ids"):
            assert getattr(g, f) == e[f], (dev, f)
        for f in ("gpu_first_ns", "gpu_last_ns", "max_concurrency_start_ns", "max_concurrency_end_ns"):
            assert getattr(g, f) == (None if e[f] is None else e[f] + shift), (dev, f)
        assert [b.time_ns for b in g.histogram] == e["histogram"]
        assert [b.busy_streams for b in g.histogram] == list(range(len(e["histogram"])))
        assert g.idle_in_gpu_span_ns == e["gpu_span_ns"] - e["busy_ns"]
        assert sum(b.time_ns for b in g.histogram) == g.gpu_span_ns
        assert g.avg_busy_streams == (round(e["stream_busy_sum_ns"] / e["busy_ns"], 3) if e["busy_ns"] else None)


OWN_CASES = [("nsys", None), ("rocpd", None), ("kineto", 21000), ("kineto", 21001)]


@pytest.mark.parametrize("fmt,pid", OWN_CASES, ids=[f"{f}-{p}" for f, p in OWN_CASES])
def test_stream_concurrency_matches_truth(own, fmt, pid):
    s = T.expressed(stream_concurrency(), fmt, pid)
    check(stream_summary(own(fmt, pid)), s, T.time_shift(s, fmt))


def test_stream_concurrency_hand_figures(own):
    """The figures of the docstring, by hand: the tool and the plain-Python truth agree with them."""
    r = stream_summary(own("nsys"))
    d0, d1 = r.devices
    assert (d0.device_id, d1.device_id) == (0, 1)
    # 100-150 1 | 150-180 2 | 180-200 3 | 200-220 2 | 220-230 1 | 230-240 2 | 240-250 1 | 250-260 2 | 260-270 1 |
    # 270-290 2 | 290-310 1 | 310-400 0 | 400-450 1
    assert [b.time_ns for b in d0.histogram] == [90 * US, (50 + 10 + 10 + 10 + 20 + 50) * US, (30 + 20 + 10 + 10 + 20) * US, 20 * US]
    assert (d0.max_concurrent_streams, d0.max_concurrency_start_ns, d0.max_concurrency_end_ns) == (3, 180 * US, 200 * US)
    assert d0.gpu_span_ns == 350 * US and d0.busy_ns == 260 * US
    assert d0.concurrent_ns == 110 * US and d0.concurrent_pct_of_busy == pct(110, 260)
    assert d0.shared_stream_ids == [7] and d0.streams == 4
    s7 = {(x.stream_id, x.pid): x for x in r.streams if x.device_id == 0}
    assert s7[(7, 21000)].busy_ns == 160 * US and s7[(7, 21001)].busy_ns == 20 * US
    # GPU 1 uses stream ids 7 and 13 too: its own figures, never merged with GPU 0 (nsys-ai's > 100 %).
    assert (d1.busy_ns, d1.concurrent_ns, d1.max_concurrent_streams) == (220 * US, 50 * US, 2)
    assert all(x.pct_of_device_gpu_span <= 100 for x in r.streams)
    d1_rows = [x for x in r.streams if x.device_id == 1]
    assert {x.stream_id for x in d1_rows} == {7, 13}
    assert next(x for x in d1_rows if x.stream_id == 7).busy_ns == 220 * US  # kernel 100-300 + touching copy 300-320


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernels_only_and_device_filter(own, fmt):
    pid = 21000 if fmt == "kineto" else None
    s = T.expressed(stream_concurrency(), fmt, pid)
    shift = T.time_shift(s, fmt)
    check(stream_summary(own(fmt, pid), include_memops=False), s, shift, include_memops=False)
    one = stream_summary(own(fmt, pid), device=1)
    check(one, replace(s, kernels=[k for k in s.kernels if k.device_id == 1], memops=[m for m in s.memops if m.device_id == 1]), shift)


@pytest.mark.parametrize("fmt", FORMATS)
def test_window_clips(own, fmt):
    pid = 21000 if fmt == "kineto" else None
    s = T.expressed(stream_concurrency(), fmt, pid)
    shift = T.time_shift(s, fmt)
    lo, hi = 190 * US, 280 * US
    r = stream_summary(own(fmt, pid), start_ns=lo + shift, end_ns=hi + shift)
    check(r, clipped(s, lo, hi), shift)
    assert r.window.span_ns == hi - lo


def test_limit_truncates(own):
    r = stream_summary(own("nsys"), limit=1)
    assert r.truncated and r.hint
    assert [(x.device_id, x.stream_id) for x in r.streams] == [(0, 7), (1, 7)]
    assert [d.remainder_streams for d in r.devices] == [3, 1]
    assert r.devices[0].streams == 4  # device figures still cover every stream


def test_bad_requests(own):
    t = own("nsys")
    with pytest.raises(ProfileError, match="device 5 does not exist"):
        stream_summary(t, device=5)
    with pytest.raises(ProfileError, match="empty time window"):
        stream_summary(t, start_ns=300, end_ns=200)
    with pytest.raises(ProfileError, match="no GPU activity"):
        stream_summary(t, start_ns=460 * US, end_ns=490 * US)  # inside the capture, no op


# Catalog scenarios with streams, several devices/processes, zero-length ops, copies only, shifted
# clocks and AMD; rocpd (slowest to write and read) on the three that matter most for streams.
CATALOG_PICK = {"concurrent_streams": FORMATS, "two_gpus_one_process": FORMATS, "zero_length_kernels": FORMATS,
                "multi_process": ("nsys", "kineto"), "no_kernels": ("nsys", "kineto"), "graph_launch": ("nsys", "kineto"),
                "negative_timestamps": ("nsys",), "amd_mi300x": ("kineto",), "microsecond_scale": ("nsys", "kineto")}
CATALOG_CASES = []
for _name, _fmts in CATALOG_PICK.items():
    _pids = [p.pid for p in CATALOG[_name]().processes]
    for _fmt in _fmts:
        for _pid in (_pids if _fmt == "kineto" and len(_pids) > 1 else [None]):
            CATALOG_CASES.append(pytest.param(_name, _fmt, _pid, id=f"{_name}-{_fmt}" + ("" if _pid is None else f"-{_pid}")))


@pytest.mark.parametrize("name,fmt,pid", CATALOG_CASES)
def test_catalog_scenarios(open_profile, name, fmt, pid):
    s = T.expressed(CATALOG[name](), fmt, pid)
    trace = open_profile(name, fmt, pid)
    if not s.kernels and not s.memops:
        with pytest.raises(ProfileError):
            stream_summary(trace)
        return
    check(stream_summary(trace), s, T.time_shift(s, fmt))


# -- real profiles -------------------------------------------------------------------------------

@pytest.mark.skipif(not REAL, reason="../shared/data is not present")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_files_run(path):
    try:
        trace = open_trace(path)
    except ProfileError:
        return  # the reader refuses it (tested elsewhere)
    try:
        r = stream_summary(trace)
    except ProfileError as exc:
        assert "no GPU activity" in str(exc)
        return
    assert r.devices and r.streams
    # every kernel and memop lands in exactly one stream row (raw counts from the trace tables)
    assert sum(x.kernel_count + x.copy_count + x.set_count for x in r.streams) == trace.count("kernels") + trace.count("memops")
    for d in r.devices:  # device busy = union of its kernel and memop intervals, merged here
        ivs = trace.sql("SELECT start_ns, end_ns FROM kernels WHERE device_id = ? AND end_ns > start_ns UNION ALL "
                        "SELECT start_ns, end_ns FROM memops WHERE device_id = ? AND end_ns > start_ns", [d.device_id, d.device_id])
        assert d.busy_ns == T.busy_ns(ivs), d.device_id
    for d in r.devices:
        assert d.busy_ns <= d.gpu_span_ns <= d.stream_busy_sum_ns + d.idle_in_gpu_span_ns
        assert sum(b.time_ns for b in d.histogram) == d.gpu_span_ns
        assert d.concurrent_ns == sum(b.time_ns for b in d.histogram[2:])
    assert all(s.pct_of_device_busy is None or s.pct_of_device_busy <= 100 for s in r.streams)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")
def test_real_10streams_against_raw_sqlite():
    """GTX 1060, 10 concurrent streams: per-stream busy time from the raw CUPTI tables, merged in Python."""
    path = DATA / "nsys" / "nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("""SELECT deviceId, streamId, start, "end", 0 FROM CUPTI_ACTIVITY_KIND_KERNEL
                          UNION ALL SELECT deviceId, streamId, start, "end", 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY
                          UNION ALL SELECT deviceId, streamId, start, "end", 2 FROM CUPTI_ACTIVITY_KIND_MEMSET""").fetchall()
    con.close()
    per: dict[tuple, list] = {}
    for dev, stream, s, e, _ in rows:
        per.setdefault((dev, stream), []).append((s, e))
    r = stream_summary(open_trace(path))
    got = {(x.device_id, x.stream_id): x for x in r.streams}
    assert set(got) == set(per)
    for key, ivs in per.items():
        assert got[key].busy_ns == T.busy_ns(ivs)
        assert got[key].kernel_count + got[key].copy_count + got[key].set_count == len(ivs)
    every = [iv for ivs in per.values() for iv in ivs]
    d = r.devices[0]
    assert d.busy_ns == T.busy_ns(every)
    assert d.gpu_span_ns == max(e for _, e in every) - min(s for s, _ in every)
    assert d.max_concurrent_streams == 4
