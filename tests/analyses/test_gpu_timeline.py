"""gpu_timeline: TraceLens's timeline algebra and HTA's overlap / per-stream idle, checked against figures
computed from the scenarios in plain Python (all three formats, exact ns), the TraceLens golden CSVs
(within 0.1 %) and every real profile under shared/data."""

from __future__ import annotations

import csv
import re
from functools import lru_cache

import pytest

from conftest import DATA, needs_data, real_files, scenario_cases
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.scenarios_timeline import SCENARIOS
from gpuscope.tools.analyses.comm_patterns import DEFAULT_PATTERNS
from gpuscope.tools.analyses.gpu_timeline import gpu_timeline
from gpuscope.tools.model.errors import ProfileError

COMM_RX = re.compile("|".join(f"(?:{p})" for p in DEFAULT_PATTERNS), re.I)


@pytest.fixture(scope="module")
def open_case(open_profile):
    return lambda name, fmt, pid=None: open_profile(name, fmt, pid, scenarios=SCENARIOS)


# -- plain-Python truth ------------------------------------------------------------------------------------


def classify(op) -> str:
    if hasattr(op, "short_name"):
        return "comm" if COMM_RX.search(op.name) else "comp"
    return "memcpy" if op.op == "copy" else "comp"


@lru_cache(maxsize=None)
def expected(name: str, fmt: str, pid: int | None, include_unlinked: bool = True, threshold: int = 30_000):
    s = T.expressed(SCENARIOS[name](), fmt, pid)
    shift = T.time_shift(s, fmt)
    ops = [o for o in [*s.kernels, *s.memops] if o.end_ns > o.start_ns and (include_unlinked or T.is_linked(s, o))]
    pids_of = {}
    for o in ops:
        pids_of.setdefault(o.device_id, set()).add(o.pid)
    owner = lambda o: next(iter(pids_of[o.device_id])) if len(pids_of[o.device_id]) == 1 else o.pid  # noqa: E731
    timelines = {}
    for key in sorted({(o.device_id, owner(o)) for o in ops}):
        mine = [o for o in ops if (o.device_id, owner(o)) == key]
        sets = {c: T.merge([(o.start_ns, o.end_ns) for o in mine if classify(o) == c]) for c in ("comp", "comm", "memcpy")}
        every = T.merge([(o.start_ns, o.end_ns) for o in mine])
        total = every[-1][1] - every[0][0]
        comp, comm, mem = (T.length(sets[c]) for c in ("comp", "comm", "memcpy"))
        ov = T.overlap_ns(sets["comm"], sets["comp"])
        exp_mem = mem - T.overlap_ns(sets["memcpy"], T.merge(sets["comp"] + sets["comm"]))
        busy = T.length(every)
        timelines[key] = dict(first_ns=every[0][0] + shift, last_ns=every[-1][1] + shift, total_ns=total, computation_ns=comp,
                              exposed_comm_ns=comm - ov, exposed_memcpy_ns=exp_mem, busy_ns=busy, idle_ns=total - busy,
                              total_comm_ns=comm, total_memcpy_ns=mem, comm_comp_overlap_ns=ov, ops=len(mine),
                              comm_ops=sum(classify(o) == "comm" for o in mine), memcpy_ops=sum(classify(o) == "memcpy" for o in mine),
                              unlinked_ops=sum(not T.is_linked(s, o) for o in mine),
                              unlinked_op_time_ns=sum(o.end_ns - o.start_ns for o in mine if not T.is_linked(s, o)))
    calls = {(a.pid, a.correlation_id): a for a in s.api_calls}
    streams = {}
    for key in sorted({(o.device_id, owner(o), o.stream_id) for o in ops}):
        mine = [o for o in ops if (o.device_id, owner(o), o.stream_id) == key]
        merged = T.merge([(o.start_ns, o.end_ns) for o in mine])
        cat = {"host_wait_ns": 0, "kernel_wait_ns": 0, "other_ns": 0, "launch_unknown_ns": 0}
        for (_, gs), (ge, _) in zip(merged, merged[1:]):
            nxt = [o for o in mine if o.start_ns == ge]
            launches = [calls[(o.pid, o.correlation_id)].start_ns if T.is_linked(s, o) else None for o in nxt]
            if None in launches:
                c = "launch_unknown_ns"
            elif min(launches) > gs:
                c = "host_wait_ns"
            elif ge - gs < threshold:
                c = "kernel_wait_ns"
            else:
                c = "other_ns"
            cat[c] += ge - gs
        streams[key] = dict(busy_ns=T.length(merged), idle_ns=merged[-1][1] - merged[0][0] - T.length(merged), gaps=len(merged) - 1, **cat)
    return timelines, streams


# -- scenarios -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,fmt,pid", scenario_cases(SCENARIOS))
@pytest.mark.parametrize("include_unlinked", [True, False])
def test_scenarios(open_case, name, fmt, pid, include_unlinked):
    trace = open_case(name, fmt, pid)
    r = gpu_timeline(trace, include_unlinked=include_unlinked)
    want_tl, want_streams = expected(name, fmt, pid, include_unlinked)
    got = {(t.device_id, t.pid): t for t in r.timelines}
    assert set(got) == set(want_tl)
    for key, want in want_tl.items():
        t = got[key]
        assert {k: getattr(t, k) for k in want} == want, key
        assert t.computation_ns + t.exposed_comm_ns + t.exposed_memcpy_ns + t.idle_ns == t.total_ns
        assert t.computation_pct_of_total == round(100 * want["computation_ns"] / want["total_ns"], 4)
        assert t.comm_comp_overlap_pct_of_comm == (None if not want["total_comm_ns"]
                                                   else round(100 * want["comm_comp_overlap_ns"] / want["total_comm_ns"], 4))
    assert (r.all_devices is not None) == (len(want_tl) > 1)
    if r.all_devices:
        assert r.all_devices.total_ns == max(t.last_ns for t in r.timelines) - min(t.first_ns for t in r.timelines)
        assert r.all_devices.computation_ns + r.all_devices.exposed_comm_ns + r.all_devices.exposed_memcpy_ns + r.all_devices.idle_ns \
            == r.all_devices.total_ns
    gs = {(x.device_id, x.pid, x.stream_id): x for x in r.streams}
    assert set(gs) == set(want_streams)
    for key, want in want_streams.items():
        assert {k: getattr(gs[key], k) for k in want} == want, key
    assert r.include_unlinked is include_unlinked and r.kernel_wait_threshold_ns == 30_000


def test_comm_overlap_figures_by_hand(open_case):
    """Rank 0 of comm_overlap, worked out by hand (µs): gemm 150-350 vs all-reduce 300-500 overlap 50;
    unlinked all-reduce 900-950; multimem 600-660 exposed; DtoD copy 480-520 under comm until 500,
    under the memset 505-507 and the add 510-530: exposed 500-505, 507-510, plus the HtoD copy 110-140 = 38."""
    r = gpu_timeline(open_case("comm_overlap", "nsys"), device=0)
    t = r.timelines[0]
    assert (t.device_id, t.pid, t.rank) == (0, 5000, 0)
    assert t.total_comm_ns == (200 + 60 + 50) * 1000 and t.comm_comp_overlap_ns == 50_000
    assert t.exposed_comm_ns == 260_000 and t.exposed_memcpy_ns == 38_000
    assert t.comm_comp_overlap_pct_of_comm == round(100 * 50 / 310, 4)
    s7 = next(s for s in r.streams if s.stream_id == 7)
    assert (s7.kernel_wait_ns, s7.host_wait_ns, s7.other_ns) == (13_000, 170_000, 155_000 + 90_000)
    s20 = next(s for s in r.streams if s.stream_id == 20)
    assert s20.launch_unknown_ns == 400_000 and s20.launch_unknown_pct_of_stream_idle == 100.0
    # the threshold moves the 90 µs gap from 'other' to 'kernel_wait'
    s7b = next(s for s in gpu_timeline(open_case("comm_overlap", "nsys"), device=0, kernel_wait_threshold_ns=100_000).streams
               if s.stream_id == 7)
    assert s7b.kernel_wait_ns == 103_000 and s7b.other_ns == 155_000


def test_custom_patterns_and_window(open_case):
    trace = open_case("comm_overlap", "kineto", 5000)
    base = gpu_timeline(trace).timelines[0]
    # without multimem in the patterns it would be computation, as TraceLens/HTA count it: here it is communication
    assert base.comm_ops == 3
    more = gpu_timeline(trace, comm_patterns=[r"elementwise"]).timelines[0]
    assert more.comm_ops == 4 and more.total_comm_ns == base.total_comm_ns + 20_000
    w = gpu_timeline(trace, start_ns=300_000, end_ns=400_000).timelines[0]
    # gemm 150-350 and all-reduce 300-500, clipped to [300, 400) µs
    assert (w.first_ns, w.last_ns, w.computation_ns, w.total_comm_ns, w.comm_comp_overlap_ns) == (300_000, 400_000, 50_000, 100_000, 50_000)


def test_bad_requests(open_case):
    trace = open_case("comm_overlap", "nsys")
    with pytest.raises(ProfileError, match="device 9"):
        gpu_timeline(trace, device=9)
    with pytest.raises(ProfileError, match="pattern"):
        gpu_timeline(trace, comm_patterns=["("])
    with pytest.raises(ProfileError, match="kernel_wait_threshold_ns"):
        gpu_timeline(trace, kernel_wait_threshold_ns=-1)
    with pytest.raises(ProfileError, match="no GPU operation"):
        gpu_timeline(trace, start_ns=958_000, end_ns=960_000)


# -- golden TraceLens CSVs and real profiles ---------------------------------------------------------------------------

GOLDEN = {"nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz": "tracelens_h100_qwen1.5-0.5b",
          "nv_h100_bert-small_infer_tracelens.json.gz": "tracelens_h100_bert-small"}
ROWS = {"computation_time": "computation_ns", "exposed_comm_time": "exposed_comm_ns", "exposed_memcpy_time": "exposed_memcpy_ns",
        "busy_time": "busy_ns", "idle_time": "idle_ns", "total_time": "total_ns", "total_comm_time": "total_comm_ns",
        "total_memcpy_time": "total_memcpy_ns"}


@needs_data
@pytest.mark.parametrize("file", sorted(GOLDEN))
def test_tracelens_golden(file):
    from gpuscope.tools.model.cache import open_trace

    rows = list(csv.DictReader((DATA / "pytorch" / "reference_csvs" / GOLDEN[file] / "gpu_timeline.csv").open()))
    assert [r["type"] for r in rows] == list(ROWS)
    t = gpu_timeline(open_trace(DATA / "pytorch" / file), include_unlinked=False).timelines[0]
    for r in rows:
        want_ms, got_ms = float(r["time ms"]), getattr(t, ROWS[r["type"]]) / 1e6
        assert got_ms == pytest.approx(want_ms, rel=1e-3, abs=1e-9), r["type"]
        got_pct = getattr(t, ROWS[r["type"]].replace("_ns", "_pct_of_total"), None)
        if got_pct is not None:
            assert got_pct == pytest.approx(float(r["percent"]), rel=1e-3, abs=1e-3), r["type"]


@needs_data
@pytest.mark.parametrize("path", real_files("pytorch/*.json.gz", "nsys/*.sqlite", "rocpd_legacy/*"), ids=lambda p: p.name)
def test_real_profiles(path):
    from gpuscope.tools.model.cache import open_trace

    try:
        trace = open_trace(path)
    except ProfileError:
        pytest.skip("the profile itself is refused by the reader")
    for inc in (True, False):
        try:
            r = gpu_timeline(trace, include_unlinked=inc)
        except ProfileError as exc:
            assert not inc and "host launch" in str(exc)
            continue
        if inc:  # one timeline per device that ran a kernel (raw SQL over the kernels table)
            assert r.timelines
            assert {t.device_id for t in r.timelines} == {d for (d,) in trace.sql("SELECT DISTINCT device_id FROM kernels")}
        for t in [*r.timelines, *([r.all_devices] if r.all_devices else [])]:
            assert t.computation_ns + t.exposed_comm_ns + t.exposed_memcpy_ns + t.idle_ns == t.total_ns
            assert t.busy_ns <= t.total_ns and t.exposed_comm_ns <= t.total_comm_ns
            assert t.comm_comp_overlap_pct_of_comm is None if t.total_comm_ns == 0 else 0 <= t.comm_comp_overlap_pct_of_comm <= 100
        for s in r.streams:
            assert s.host_wait_ns + s.kernel_wait_ns + s.other_ns + s.launch_unknown_ns == s.idle_ns


def test_first_call_reads_the_ops_once(write_profile, monkeypatch):
    """The first call (nothing memoized) reads and sorts the GPU ops once for every figure (the split per device and
    of all devices, and per stream the counts, unions and idle categories), not once per figure (on a 2 M-kernel
    export each read costs seconds); a second call reads them no more, nor does comm_summary's split after it."""
    import importlib

    from gpuscope.tools.model.trace import Trace, load_trace

    module = importlib.import_module("gpuscope.tools.analyses.gpu_timeline")  # the package exports the function

    trace = load_trace(write_profile("comm_overlap", "nsys", scenarios=SCENARIOS))
    seen: list[str] = []
    sql, chunks = Trace.sql, module.time_chunks

    def counting(self, query, *a, **k):
        seen.append(query)
        return sql(self, query, *a, **k)

    def counting_chunks(cur, query, *a, **k):
        seen.append(query)
        return chunks(cur, query, *a, **k)

    monkeypatch.setattr(Trace, "sql", counting)
    monkeypatch.setattr(module, "time_chunks", counting_chunks)
    try:
        first = gpu_timeline(trace)
        reads = [q for q in seen if "FROM kernels JOIN named" in q]
        assert first.all_devices is not None and len(reads) == 1, [" ".join(q.split())[:120] for q in reads]
        seen.clear()
        assert gpu_timeline(trace) == first and not [q for q in seen if "FROM kernels JOIN named" in q]
        from gpuscope.tools.analyses import comm_summary
        comm_summary(trace)
        assert not [q for q in seen if "FROM kernels JOIN named" in q and "cls, start_ns, end_ns" in q], seen
    finally:
        trace.close()


@pytest.mark.parametrize("batch", [1, 3])
def test_launch_lookup_in_batches_gives_the_idle_split(write_profile, monkeypatch, batch):
    """The gaps' launch lookup runs a batch of op positions per statement (memory follows the batch): with batches of
    a few ops (more gaps than one batch holds) the per-stream idle split is still the generator's."""
    import importlib

    from gpuscope.tools.model.trace import load_trace

    module = importlib.import_module("gpuscope.tools.analyses.gpu_timeline")
    monkeypatch.setattr(module, "idle_batch", lambda: batch)
    trace = load_trace(write_profile("comm_overlap", "nsys", scenarios=SCENARIOS))
    try:
        got = {(x.device_id, x.pid, x.stream_id): x for x in gpu_timeline(trace, kernel_wait_threshold_ns=1000).streams}
    finally:
        trace.close()
    _, want = expected("comm_overlap", "nsys", None, True, 1000)
    assert sum(w["gaps"] for w in want.values()) > batch
    assert set(got) == set(want)
    for key, w in want.items():
        assert {k: getattr(got[key], k) for k in w} == w, key
