"""Interval unions (intervals.py: DuckDB sorts the intervals, numpy merges the sorted chunks) against the generator.

The intervals are generated here, with the cases that break naive merges: overlapping, nested, touching, duplicated
and zero-length intervals, and NULL partition values (an unknown stream). The truth is computed in plain Python
(fixtures.truth.merge) from the generated lists, never by the engine; every figure is exact integer ns.

A second test runs the union-based tools on a ~1M-kernel profile under a 64 MiB DuckDB memory limit: the unions
spill instead of failing, and still equal the truth computed from the export's own rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict

import numpy as np
import pytest

from conftest import under_memory_limit
from gpuscope.fixtures.truth import BUCKETS, bucket_of, merge
from gpuscope.tools.analyses import intervals
from gpuscope.tools.analyses.gpu_timeline import COMM, COMP, MEMCPY, split_measures

BOUNDS = tuple(hi for _, hi in BUCKETS if hi is not None)


def _generate(seed: int = 7, n: int = 3000) -> list[tuple]:
    """(device_id, stream_id, cls, start_ns, end_ns) rows: random work plus the awkward cases, on purpose."""
    rng = np.random.default_rng(seed)
    dev = rng.integers(0, 3, n)
    stream = rng.integers(0, 4, n)
    start = rng.integers(0, 1_500_000_000, n)  # sparse enough for gaps of every bucket
    # gap-sized and long lengths, and zero (a fifth of the intervals)
    length = np.where(rng.random(n) < 0.2, 0, rng.choice([50, 5_000, 60_000, 400_000, 3_000_000], n) + rng.integers(0, 999, n))
    cls = rng.integers(0, 3, n)
    rows = [(int(d), None if s == 3 else int(s), int(c), int(a), int(a + b))  # stream 3 stands for "unknown"
            for d, s, c, a, b in zip(dev, stream, cls, start, length)]
    extra = []
    for d, s, c, a, e in rows[:200]:
        if e > a:
            extra.append((d, s, (c + 1) % 3, a + (e - a) // 3, e - (e - a) // 3))  # nested, another class
            extra.append((d, s, c, e, e + 1_000))  # touching: joins the union, no gap between
            extra.append((d, s, c, a, e))  # duplicate
            extra.append((d, s, c, e + 20_000_000, e + 20_000_000))  # zero-length, far away: must not stretch the span
    far = [(d, s, c, 2_000_000_000 + i * 150_000_000, 2_000_000_000 + i * 150_000_000 + 700) for i, (d, s, c, _, _) in enumerate(rows[:12])]
    return rows + extra + far  # far: gaps over 100 ms


def _sql(rows: list[tuple]) -> tuple[str, list]:
    """The rows as a VALUES relation (generated integers only), and its (empty) parameter list."""
    text = ", ".join("(" + ", ".join("NULL" if v is None else str(v) for v in r) + ")" for r in rows)
    return (f"SELECT device_id::BIGINT AS device_id, stream_id::BIGINT AS stream_id, cls::INTEGER AS cls, "
            f"start_ns::BIGINT AS start_ns, end_ns::BIGINT AS end_ns FROM (VALUES {text}) v(device_id, stream_id, cls, start_ns, end_ns)"), []


def _truth(rows: list[tuple], key) -> dict[tuple, dict]:
    groups = defaultdict(list)
    for r in rows:
        groups[key(r)].append((r[3], r[4]))
    out = {}
    for k, iv in groups.items():
        m = merge(iv)
        if not m:
            continue
        gaps = [(a[1], b[0]) for a, b in zip(m, m[1:])]
        buckets = defaultdict(lambda: [0, 0])
        for g0, g1 in gaps:
            buckets[bucket_of(g1 - g0)][0] += 1
            buckets[bucket_of(g1 - g0)][1] += g1 - g0
        nonzero = [(s, e) for s, e in iv if e > s]
        out[k] = {"ops": len(nonzero), "first_ns": m[0][0], "last_ns": m[-1][1], "work_ns": sum(e - s for s, e in nonzero),
                  "busy_ns": sum(e - s for s, e in m), "gaps": gaps,
                  "buckets": [tuple(buckets[label]) for label, _ in BUCKETS],
                  "top": sorted(gaps, key=lambda g: (-(g[1] - g[0]), g[0]))[:7]}
    return out


def _intersection(a: list, b: list) -> int:
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


@pytest.fixture(scope="module")
def trace(open_profile):
    return open_profile("concurrent_streams", "nsys")  # any profile: the intervals come in as parameters


@pytest.mark.parametrize("vectors", [intervals.STREAM_VECTORS, 1])
@pytest.mark.parametrize("partition", [("device_id",), ("device_id", "stream_id"), ("device_id", "stream_id", "cls")])
def test_union_figures_gaps_and_histogram_equal_the_truth(trace, partition, vectors, monkeypatch):
    """With chunks of one vector (2,048 rows), partitions run across chunks: their reach and figures carry over."""
    monkeypatch.setattr(intervals, "STREAM_VECTORS", vectors)
    rows = _generate()
    sql, params = _sql(rows)
    sql += f" /* {vectors} vectors a chunk */"  # another statement: not answered from the first run's memo
    idx = {"device_id": 0, "stream_id": 1, "cls": 2}
    want = _truth(rows, lambda r: tuple(r[idx[c]] for c in partition))
    assert any(None in k for k in want) or len(partition) == 1  # NULL streams are their own partition
    got = intervals.unions(trace, sql, params, partition, bounds=BOUNDS, top=7)
    assert set(got) == set(want)
    for k, w in want.items():
        u = got[k]
        assert (u.ops, u.first_ns, u.last_ns, u.work_ns, u.busy_ns, u.gaps, u.idle_ns) == (
            w["ops"], w["first_ns"], w["last_ns"], w["work_ns"], w["busy_ns"], len(w["gaps"]), sum(b - a for a, b in w["gaps"])), k
        assert list(zip(u.bucket_counts, u.bucket_ns)) == w["buckets"], k
        assert list(u.top_gaps) == w["top"], k


@pytest.mark.parametrize("vectors", [intervals.STREAM_VECTORS, 1])
def test_busy_split_and_overlap_equal_the_truth(trace, vectors, monkeypatch):
    """TraceLens's split (|COMP|, |COMM|, |MEMCPY|, exposed, overlap) and |A ∩ B| per partition, from unions only.
    With chunks of one vector (2,048 rows) the last chunks hold one partition only, not the one numbered last: what
    they add must reach that partition alone (a chunk-wide array once spread it over every partition)."""
    monkeypatch.setattr(intervals, "STREAM_VECTORS", vectors)
    rows = _generate(seed=11)
    tail = 1_600_000_000
    rows += [(0, 0, COMP, tail + i * 1_000, tail + i * 1_000 + 400) for i in range(5_000)]
    sql, params = _sql(rows)
    sql += f" /* {vectors} vectors a chunk */"  # another statement: not answered from the first run's memo
    split = split_measures(trace, f"SELECT device_id, stream_id, cls, start_ns, end_ns FROM ({sql})", params, ("device_id", "stream_id"))
    by = defaultdict(lambda: defaultdict(list))
    for d, s, c, a, e in rows:
        by[(d, s)][c].append((a, e))
    assert set(split) == {k for k, v in by.items() if any(e > a for iv in v.values() for a, e in iv)}
    for k, v in by.items():
        comp, comm, mem = (merge(v[c]) for c in (COMP, COMM, MEMCPY))
        every = merge(v[COMP] + v[COMM] + v[MEMCPY])
        if not every:
            continue
        sp = split[k]
        comp_comm = merge(v[COMP] + v[COMM])
        size = lambda m: sum(e - a for a, e in m)  # noqa: E731
        assert (sp.first_ns, sp.last_ns, sp.busy_ns, sp.computation_ns, sp.comm_ns, sp.memcpy_ns) == (
            every[0][0], every[-1][1], size(every), size(comp), size(comm), size(mem)), k
        assert sp.comm_comp_overlap_ns == _intersection(comm, comp), k
        assert sp.exposed_comm_ns == size(comm) - _intersection(comm, comp), k
        assert sp.exposed_memcpy_ns == size(mem) - _intersection(mem, comp_comm), k
    # |A ∩ B| with B matched per device: class 2 intervals of each stream against class 0 intervals of the device
    a_sql = f"SELECT device_id, stream_id, start_ns, end_ns FROM ({sql}) WHERE cls = 2"
    b_sql = f"SELECT device_id, start_ns, end_ns FROM ({sql}) WHERE cls = 0"
    got = intervals.overlaps(trace, a_sql, params, ("device_id", "stream_id"), b_sql, params, ("device_id",))
    want = {}
    for (d, s), v in by.items():
        a = merge(v[MEMCPY])
        if a:
            want[(d, s)] = _intersection(a, merge([iv for (d2, _), w in by.items() if d2 == d for iv in w[COMP]]))
    assert got == want


def _raw_truth(path) -> dict:
    """Per device, busy/first/last/gap figures from the export's kernel rows (sqlite3 + fixtures.truth, no DuckDB)."""
    con = sqlite3.connect(path)
    try:
        rows = con.execute("SELECT deviceId, start, [end] FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    finally:
        con.close()
    per = defaultdict(list)
    for d, s, e in rows:
        per[d].append((s, e))
    out = {}
    for d, iv in per.items():
        m = merge(iv)
        out[str(d)] = [m[0][0], m[-1][1], sum(e - s for s, e in m), len(m) - 1]
    return out


CHILD = """
import json, sys
from gpuscope.tools import analyses as A
from gpuscope.tools.model.cache import open_trace
t = open_trace(sys.argv[1])
gh, tl = A.gap_histogram(t), A.gpu_timeline(t)
print(json.dumps({"gaps": {str(p.device_id): [p.gpu_first_ns, p.gpu_last_ns, p.busy_ns, p.gap_count] for p in gh.profiles},
                  "timeline": {str(x.device_id): [x.first_ns, x.last_ns, x.busy_ns] for x in tl.timelines},
                  "streams": sum(s.busy_ns > 0 for s in tl.streams)}))
"""


def test_unions_spill_under_a_small_memory_limit(tmp_path):
    """~1M kernels, unions under a 64 MiB DuckDB limit: gap_histogram and gpu_timeline answer (spilling), exactly."""
    from gpuscope.fixtures.writers import nsys

    path = tmp_path / "scale.sqlite"
    nsys.write_scale(path, n_kernels=1_000_000)
    want = _raw_truth(path)
    got = json.loads(under_memory_limit(tmp_path, path, CHILD, timeout=300))
    assert got["gaps"] == want
    assert got["timeline"] == {d: v[:3] for d, v in want.items()}
    assert got["streams"] == 8  # write_scale's streams 13..20, each busy
