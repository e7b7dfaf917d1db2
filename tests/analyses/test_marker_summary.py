"""marker_summary on scenarios written as Nsight, rocpd and Kineto files, against figures computed from the
scenario in plain Python; plus every real profile under ../shared/data."""

from __future__ import annotations

import sqlite3
import statistics

import pytest

from conftest import DATA, FORMATS, needs_data, real_files
from gpuscope.fixtures import scenarios_marker_summary as SM
from gpuscope.fixtures.truth import expressed, merge, time_shift
from gpuscope.tools.analyses.marker_summary import marker_summary
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError



@pytest.fixture(scope="module")
def opened(open_profile):
    """opened(name, fmt) -> (the scenario, the opened trace)."""
    return lambda name, fmt: (SM.SCENARIOS[name](), open_profile(name, fmt, scenarios=SM.SCENARIOS))


# -- truth --------------------------------------------------------------------------------------------


def ranges_of(s, fmt: str) -> list[dict]:
    """The ranges as the format holds them: rocpd and Kineto have no domains; Kineto writes every marker
    (marks too) as a record_function annotation; only Nsight records that a start/end range ended on
    another thread."""
    cross = s.options.get("nvtx_end_tid", {}) if fmt == "nsys" else {}
    out = []
    for m in s.markers:
        if m.kind == "mark" and fmt != "kineto":
            continue
        out.append({"pid": m.pid, "tid": m.tid, "start": m.start_ns, "end": m.end_ns, "name": m.name,
                    "domain": m.domain if fmt == "nsys" else "",
                    "kind": "annotation" if fmt == "kineto" else m.kind,
                    "cross": (m.pid, m.tid, m.start_ns, m.name) in cross})
    return out


def projected_ops(s, r: dict) -> list:
    """Linked GPU ops whose launching call lies inside the range on the same thread."""
    if r["cross"]:
        return []
    calls = {(a.pid, a.correlation_id): a for a in s.api_calls}
    out = []
    for op in [*s.kernels, *s.memops]:
        a = calls.get((op.pid, op.correlation_id))
        if a is not None and a.pid == r["pid"] and a.tid == r["tid"] and r["start"] <= a.start_ns and a.end_ns <= r["end"]:
            out.append(op)
    return out


def path_of(r: dict, ranges: list[dict]) -> str:
    chain, cur = [r["name"]], r
    while True:
        enc = [p for p in ranges if p is not cur and p["pid"] == cur["pid"] and p["tid"] == cur["tid"]
               and p["start"] <= cur["start"] and cur["end"] <= p["end"]
               and (p["start"], -p["end"]) < (cur["start"], -cur["end"])]
        if not enc:
            return "/".join(reversed(chain))
        cur = max(enc, key=lambda p: (p["start"], -p["end"]))
        chain.append(cur["name"])


def truth(s, fmt: str) -> dict:
    ranges = ranges_of(s, fmt)
    groups: dict[tuple, list[dict]] = {}
    for r in ranges:
        groups.setdefault((r["name"], r["domain"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        durs = [r["end"] - r["start"] for r in rs]
        ops: dict[int, object] = {}
        per_range = []
        for r in rs:
            mine = projected_ops(s, r)
            for op in mine:
                ops[id(op)] = op
            if mine:
                per_range.append(max(o.end_ns for o in mine) - min(o.start_ns for o in mine))
        ops_l = list(ops.values())
        devs = sorted({o.device_id for o in ops_l})
        paths: dict[str, int] = {}
        for r in rs:
            p = path_of(r, ranges)
            paths[p] = paths.get(p, 0) + 1
        out[key] = {
            "count": len(rs), "cpu_total_ns": sum(durs), "cpu_min_ns": min(durs), "cpu_max_ns": max(durs),
            "cpu_avg_ns": sum(durs) / len(durs), "cpu_median_ns": float(statistics.median(durs)),
            "cpu_std_ns": statistics.stdev(durs) if len(durs) > 1 else None,
            "cross_thread_ranges": sum(r["cross"] for r in rs),
            "gpu_ops": len(ops_l), "gpu_kernels": sum(1 for o in ops_l if hasattr(o, "short_name")),
            "gpu_work_ns": sum(o.end_ns - o.start_ns for o in ops_l),
            "gpu_busy_ns": sum(sum(e - b for b, e in merge([(o.start_ns, o.end_ns) for o in ops_l if o.device_id == d])) for d in devs),
            "ranges_with_gpu_ops": len(per_range),
            "gpu_projected_avg_ns": sum(per_range) / len(per_range) if per_range else None,
            "gpu_first_start_ns": min((o.start_ns for o in ops_l), default=None),
            "gpu_last_end_ns": max((o.end_ns for o in ops_l), default=None),
            "paths": sorted(paths.items(), key=lambda kv: (-kv[1], kv[0])),
        }
    return out


# -- scenario tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["marker_tree", "marker_tree_textid"])
def test_marker_tree_matches_truth(opened, name, fmt):
    s, trace = opened(name, fmt)
    s = expressed(s, fmt)
    shift = time_shift(s, fmt)
    want = truth(s, fmt)
    res = marker_summary(trace, limit=100)
    assert res.projection.available
    got = {(r.name, r.domain): r for r in res.markers}
    assert set(got) == set(want)
    assert res.names == len(want) and res.ranges == sum(w["count"] for w in want.values())
    for key, w in want.items():
        r = got[key]
        for f in ("count", "cpu_total_ns", "cpu_min_ns", "cpu_max_ns", "cross_thread_ranges", "gpu_ops", "gpu_kernels",
                  "gpu_work_ns", "gpu_busy_ns", "ranges_with_gpu_ops"):
            assert getattr(r, f) == w[f], (key, f)
        assert r.cpu_avg_ns == pytest.approx(w["cpu_avg_ns"], abs=0.05)
        assert r.cpu_median_ns == w["cpu_median_ns"]
        assert (r.cpu_std_ns is None) == (w["cpu_std_ns"] is None)
        if w["cpu_std_ns"] is not None:
            assert r.cpu_std_ns == pytest.approx(w["cpu_std_ns"], abs=0.05)
        if w["gpu_projected_avg_ns"] is None:
            assert r.gpu_projected_avg_ns is None and r.gpu_first_start_ns is None
        else:
            assert r.gpu_projected_avg_ns == pytest.approx(w["gpu_projected_avg_ns"], abs=0.05)
            assert r.gpu_first_start_ns == w["gpu_first_start_ns"] + shift
            assert r.gpu_last_end_ns == w["gpu_last_end_ns"] + shift
        assert r.path == w["paths"][0][0]
        assert r.paths == [f"{p} ({n})" for p, n in w["paths"][:3]]
    # sorted by CPU total time
    assert [r.cpu_total_ns for r in res.markers] == sorted((r.cpu_total_ns for r in res.markers), reverse=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_marker_tree_specifics(opened, fmt):
    """Hand-checked figures: nested same-name ranges count the inner op once; the worker thread's launches and
    the launch outside every range are excluded; the cross-thread range is excluded only where Nsight says so."""
    s, trace = opened("marker_tree", fmt)
    res = marker_summary(trace, limit=100)
    dom = "training" if fmt == "nsys" else ""
    got = {(r.name, r.domain): r for r in res.markers}
    block = got[("block", dom)]
    assert (block.count, block.gpu_ops, block.gpu_work_ns) == (2, 2, 50_000)
    assert block.paths == ["block (1)", "block/block (1)"]
    step = got[("train_step", dom)]
    # per step: gemm 50 + softmax 20 + gemm 30+5i + copy 10 + add 15 + reduce 30 + cublas 100+10i + memset 5
    # (rocpd has no memsets)
    memset = 0 if fmt == "rocpd" else 5
    assert step.gpu_ops == 3 * (7 + (fmt != "rocpd")) and step.gpu_work_ns == sum(255 + memset + 15 * i for i in range(3)) * 1_000
    # add (t+230..245) and reduce (t+235..265) overlap: busy = work - 10 µs per step
    assert step.gpu_busy_ns == step.gpu_work_ns - 3 * 10_000
    att = got[("attention", dom)]
    assert att.path == "train_step/forward/attention" and att.count == 6 and att.min_depth == 2
    wait = got[("data_wait", dom)]
    assert wait.cross_thread_ranges == (1 if fmt == "nsys" else 0)
    assert wait.gpu_ops == (0 if fmt == "nsys" else 1)
    excluded = " ".join(res.projection.excluded)
    assert "1 GPU ops (8000 ns) have no launching API call" in excluded
    # outside every range: the reduce at 3900 µs and the worker thread's 3 adds (+ the softmax in data_wait for nsys)
    assert f"{5 if fmt == 'nsys' else 4} launched GPU ops" in excluded
    if fmt == "nsys":
        assert ("forward", "eval") in got and got[("forward", "eval")].gpu_ops == 1
        assert "1 start/end ranges ended on another thread" in excluded
        assert res.instant_marks == 1
    else:
        assert got[("forward", "")].count == 4
    sorted_busy = marker_summary(trace, sort_by="gpu_busy", limit=2)
    assert sorted_busy.truncated and sorted_busy.hint
    assert sorted_busy.markers[0].gpu_busy_ns >= sorted_busy.markers[1].gpu_busy_ns


@pytest.mark.parametrize("fmt", FORMATS)
def test_filters(opened, fmt):
    s, trace = opened("marker_tree", fmt)
    shift = time_shift(expressed(s, fmt), fmt)
    res = marker_summary(trace, name_contains="attent")
    assert [r.name for r in res.markers] == ["attention"]
    # ranges starting in [1100, 2100) µs: only the second train step and its children
    res = marker_summary(trace, start_ns=1_100_000 + shift, end_ns=2_100_000 + shift, limit=50)
    got = {r.name: r for r in res.markers}
    assert got["train_step"].count == 1 and got["attention"].count == 2
    assert got["train_step"].gpu_work_ns == (255 + 15 + (0 if fmt == "rocpd" else 5)) * 1_000
    res = marker_summary(trace, device=0)
    assert res.filters["device"] == 0
    with pytest.raises(ProfileError, match="device 5 does not exist"):
        marker_summary(trace, device=5)
    with pytest.raises(ProfileError, match="no annotation range matches"):
        marker_summary(trace, name_contains="nothing-like-this")
    with pytest.raises(ProfileError, match="process 1 has no annotation ranges"):
        marker_summary(trace, pid=1)
    with pytest.raises(ProfileError, match="sort_by"):
        marker_summary(trace, sort_by="bogus")


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_api_calls_gives_cpu_only(opened, fmt):
    _, trace = opened("no_api_calls", fmt)
    res = marker_summary(trace)
    assert not res.projection.available and "no host runtime/driver API calls" in res.projection.reason
    (row,) = res.markers
    assert (row.count, row.cpu_total_ns, row.cpu_min_ns, row.cpu_max_ns) == (2, 700_000, 300_000, 400_000)
    assert row.gpu_ops is None and row.gpu_busy_ns is None and row.pct_of_projected_busy is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_markers_refused(opened, fmt):
    _, trace = opened("no_markers", fmt)
    with pytest.raises(ProfileError, match="no annotation ranges") as exc:
        marker_summary(trace)
    flag = {"nsys": "nsys profile --trace=cuda,nvtx", "rocpd": "rocprofv3 --marker-trace", "kineto": "record_function"}[fmt]
    assert flag in str(exc.value) and "record_function" in str(exc.value)


# -- real profiles --------------------------------------------------------------------------------------

REAL = real_files("nsys/*.sqlite", "pytorch/*.json.gz")


@needs_data
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_profiles(path):
    trace = open_trace(path)
    try:
        res = marker_summary(trace, limit=500)
    except ProfileError as exc:
        assert "marker_summary needs data" in str(exc) and "no annotation ranges" in str(exc)
        assert trace.scalar("SELECT count(*) FROM markers WHERE kind <> 'gpu_annotation'") == 0
        return
    assert res.ranges == trace.scalar("SELECT count(*) FROM markers WHERE kind IN ('push_pop','start_end','annotation')")
    for r in res.markers:
        assert r.cpu_min_ns <= r.cpu_median_ns <= r.cpu_max_ns
        if r.gpu_busy_ns is not None:
            assert r.gpu_busy_ns <= r.gpu_work_ns


@needs_data
def test_real_nvtx_export_against_sqlite():
    """The NVTX export: CPU totals and the projection of 'main' checked with sqlite3 on the raw tables."""
    path = DATA / "nsys" / "nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    ranges = con.execute("SELECT text, start, end, globalTid FROM NVTX_EVENTS WHERE eventType = 59").fetchall()
    main = next(r for r in ranges if r[0] == "main")
    ops = con.execute(
        """SELECT o.start, o.end FROM (SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL
                  UNION ALL SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY
                  UNION ALL SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) o
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId
                AND o.globalPid = (r.globalTid & ~16777215)
           WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ?""", (main[3], main[1], main[2])).fetchall()
    con.close()
    res = marker_summary(open_trace(path), limit=500)
    got = {r.name: r for r in res.markers}
    assert len(got) == len(ranges)
    for name, s, e, _ in ranges:
        assert got[name].cpu_total_ns == e - s
    m = got["main"]
    assert m.gpu_ops == len(ops) == 59
    assert m.gpu_work_ns == sum(e - s for s, e in ops)
    assert m.gpu_busy_ns == sum(e - s for s, e in merge(ops))
    assert got["main->test_max_par->phase->memset0"].path == "main/main->test_max_par/main->test_max_par->phase/main->test_max_par->phase->memset0"
