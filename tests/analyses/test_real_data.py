"""Tier 2 at the tool level: the analyses on the real profiles under ../shared/data, checked
against independent computations over the raw files (sqlite3 / json), never against gpuscope."""

from __future__ import annotations

import gzip
import json
import sqlite3
import statistics
from decimal import ROUND_HALF_EVEN, Decimal
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import DATA, needs_data, real_files
from gpuscope.fixtures.truth import merge
from gpuscope.tools import analyses as A
from gpuscope.tools.model.cache import open_trace

NSYS = real_files("nsys/*.sqlite")
KINETO = real_files("pytorch/*.json.gz")


def _raw_kernels(path: Path) -> list[tuple[int, str, int, int]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return con.execute(
            "SELECT k.deviceId, s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
        ).fetchall()
    finally:
        con.close()


def _raw_gpu_intervals(path: Path) -> dict[int, list[tuple[int, int]]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            if t in tables:
                for dev, s, e in con.execute(f"SELECT deviceId, start, end FROM {t}"):
                    out[dev].append((s, e))
        return out
    finally:
        con.close()


@needs_data
@pytest.mark.parametrize("path", NSYS, ids=lambda p: p.name)
def test_top_kernels_matches_raw_sqlite(path):
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for dev, name, s, e in _raw_kernels(path):
        groups[(dev, name)].append(e - s)
    res = A.top_kernels(open_trace(path), group_by="name", limit=200)
    # Names longer than 160 characters are clipped in tool output (sql_query has them whole).
    got = {(k.device_id, k.name): k for k in res.kernels}
    groups = {(d, n if len(n) <= 160 else n[:159] + "…"): v for (d, n), v in groups.items()}
    assert len(got) == len(groups)
    dev_total = defaultdict(int)
    for (dev, _), durs in groups.items():
        dev_total[dev] += sum(durs)
    for key, durs in groups.items():
        k = got[key]
        assert (k.count, k.total_ns, k.min_ns, k.max_ns) == (len(durs), sum(durs), min(durs), max(durs))
        assert k.median_ns == statistics.median(durs)
        assert k.avg_ns == round(sum(durs) / len(durs), 1)
        if len(durs) > 1:
            assert k.std_ns == pytest.approx(statistics.stdev(durs), abs=0.06)
        assert k.pct_of_device_kernel_time == round(100 * sum(durs) / dev_total[key[0]], 2)


@needs_data
@pytest.mark.parametrize("path", NSYS, ids=lambda p: p.name)
def test_gap_histogram_matches_raw_sqlite(path):
    raw = _raw_gpu_intervals(path)
    trace = open_trace(path)
    assert raw  # every real Nsight profile has GPU activity
    res = A.gap_histogram(trace, top_gaps=50)
    by_dev = {p.device_id: p for p in res.profiles}
    assert set(by_dev) == {d for d, iv in raw.items() if any(e > s for s, e in iv)}
    for dev, iv in raw.items():
        merged = merge([(s, e) for s, e in iv if e > s])
        if not merged:  # only zero-length ops: no profile, as the set check above asserts
            continue
        gaps = [(a[1], b[0]) for a, b in zip(merged, merged[1:])]
        p = by_dev[dev]
        assert p.busy_ns == sum(e - s for s, e in merged)
        assert (p.gpu_first_ns, p.gpu_last_ns) == (merged[0][0], merged[-1][1])
        assert p.gap_count == len(gaps) and p.idle_in_gpu_span_ns == sum(e - s for s, e in gaps)
        longest = sorted(gaps, key=lambda g: (-(g[1] - g[0]), g[0]))[:50]
        assert [(g.start_ns, g.end_ns) for g in p.largest_gaps] == longest


@needs_data
def test_readme_facts():
    """Facts stated in ../shared/data/README.md, through trace_info."""
    info = {p.name: A.trace_info(open_trace(p)) for p in NSYS}
    tiny = info["nsys2026.1_rtx3080_torch_tiny.sqlite"]
    assert (tiny.counts["kernels"], tiny.counts["memcpy"], tiny.format_version) == (2, 1, "3.24.14")
    # µs-scale: exact ns, never a figure rounded to 0; the union computed here from the raw rows.
    raw = _raw_gpu_intervals(DATA / "nsys" / "nsys2026.1_rtx3080_torch_tiny.sqlite")
    d0 = tiny.devices[0]
    busy = sum(e - s for s, e in merge([(s, e) for s, e in raw[d0.device_id] if e > s]))
    assert busy > 0 and d0.busy_ns == busy
    t4060 = info["nsys2026.1_rtx4060ti_4streams_memcpy.sqlite"]
    assert (t4060.counts["kernels"], t4060.counts["memcpy"]) == (4, 12)
    assert t4060.capture.span_ns > 1_000_000_000 > t4060.gpu_activity.span_ns  # denominators differ by 10x+
    gtx = info["nsys2022.1_gtx1060_10streams_nvtx_extrap.sqlite"]
    assert (gtx.counts["kernels"], gtx.counts["memcpy"], gtx.counts["memset"], gtx.format_version) == (12, 30, 17, "2.9.1")
    assert gtx.counts["markers"] == 76
    compute = {d.name: d.is_compute for d in gtx.devices}
    assert compute == {"GeForce GTX 1060 with Max-Q Design": True, "Intel(R) HD Graphics 630": False,
                       "Microsoft Basic Render Driver": False}
    five = info["nsys2022.1_gtx1060_5streams_extrap.sqlite"]
    assert (five.counts["kernels"], five.counts["memcpy"], five.counts["memset"]) == (9, 11, 1)
    old = info["nsys_oldschema_4xA100_sampling_extrap.sqlite"]
    assert old.counts["kernels"] == 6 and old.counts["memops"] == 0
    assert [d.name for d in old.devices] == ["A100-PCIE-40GB"] * 4 and old.devices[0].sm_count == 108
    assert any(a.startswith("memops") for a in old.absent)


def _ns(us) -> int:
    """Exact µs -> ns: integers stay integers, decimals go through their shortest repr."""
    if isinstance(us, int):
        return us * 1000
    exact = us if isinstance(us, Decimal) else Decimal(repr(us))
    return int((exact * 1000).to_integral_value(ROUND_HALF_EVEN))


@needs_data
@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_kineto_kernel_totals_match_raw_json(path):
    with gzip.open(path, "rb") as fh:
        events = json.load(fh)["traceEvents"]
    per_dev: dict[int, list[int]] = defaultdict(list)
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "Kernel"):
            dur_ns = _ns(ev["ts"] + ev["dur"]) - _ns(ev["ts"]) if isinstance(ev["ts"], int) else \
                _ns(Decimal(repr(ev["ts"])) + Decimal(repr(ev["dur"]))) - _ns(ev["ts"])
            per_dev[int(ev.get("args", {}).get("device", ev["pid"]))].append(dur_ns)
    res = A.top_kernels(open_trace(path), limit=200)
    got = {d.device_id: (d.kernel_count, d.summed_kernel_time_ns) for d in res.devices}
    assert got == {dev: (len(d), sum(d)) for dev, d in per_dev.items()}
