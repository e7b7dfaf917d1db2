"""Interval unions in numpy: busy time and idle gaps of GPU activity, per device or stream.

DuckDB fetches the (start, end) columns; numpy sorts them and runs a cumulative maximum of end
times, so a gap is any start later than every earlier end. This is one sort per partition,
several times faster than a window function over millions of rows. Results depend only on the
immutable profile and the query, so they are memoized on the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.trace import Codec, Trace


@dataclass(frozen=True)
class Union:
    """The merged intervals of one partition (a device, or a device's stream)."""

    key: tuple                # partition values, e.g. (device_id,) or (device_id, stream_id)
    ops: int                  # intervals with non-zero length
    first_ns: int             # earliest start
    last_ns: int              # latest end
    work_ns: int              # summed lengths (overlaps counted twice)
    gap_start_ns: np.ndarray  # start of each idle gap (= end of the work before it)
    gap_end_ns: np.ndarray    # end of each idle gap (= start of the work after it)

    @property
    def span_ns(self) -> int:
        return self.last_ns - self.first_ns

    @property
    def idle_ns(self) -> int:
        return int((self.gap_end_ns - self.gap_start_ns).sum())

    @property
    def busy_ns(self) -> int:
        return self.span_ns - self.idle_ns


def unions(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, Union]:
    """Per partition, the union of the intervals selected by `intervals_sql` (columns: partition
    columns, start_ns, end_ns). Zero-length intervals are skipped: they neither fill nor split gaps."""
    key = ("unions", intervals_sql, tuple(params), partition)
    return trace.memo(key, lambda: _compute(trace, intervals_sql, params, partition))


# {partition key: busy ns} as JSON: [[key values], busy ns] pairs
BUSY = Codec(encode=lambda d: [[list(k), v] for k, v in d.items()], decode=lambda pairs: {tuple(k): int(v) for k, v in pairs})


def busy_ns(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, int]:
    """Per partition, the busy time (length of the union) of the intervals `unions` would merge, ns. Kept in the
    store: unlike the gaps behind it, it is a few numbers, so a later process reads it instead of re-merging."""
    key = ("busy_ns", intervals_sql, tuple(params), partition)
    return trace.memo(key, lambda: {k: u.busy_ns for k, u in unions(trace, intervals_sql, params, partition).items()},
                      persist=BUSY)


def _compute(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, Union]:
    cols = ", ".join(f"coalesce({c}, {NULL_KEY}) AS {c}" for c in partition)
    cur = trace.con.cursor()
    try:
        data = cur.execute(f"SELECT {cols}, start_ns, end_ns FROM ({intervals_sql}) WHERE end_ns > start_ns", params).fetchnumpy()
    finally:
        cur.close()
    start = np.asarray(data["start_ns"], dtype=np.int64)
    if start.size == 0:
        return {}
    parts = [np.asarray(data[c]) for c in partition]
    # numpy's sort beats an SQL ORDER BY here by ~3x; afterwards each partition is one slice.
    varying = [p for p in parts if p.size and p.min() != p.max()]
    order = np.lexsort((start, *reversed(varying))) if varying else np.argsort(start, kind="stable")
    start = start[order]
    end = np.asarray(data["end_ns"], dtype=np.int64)[order]
    parts = [p[order] for p in parts]
    change = np.zeros(start.size, dtype=bool)
    change[0] = True
    for p in parts:
        change[1:] |= p[1:] != p[:-1]
    bounds = np.flatnonzero(change).tolist() + [start.size]
    out: dict[tuple, Union] = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s, e = start[lo:hi], end[lo:hi]
        reach = np.maximum.accumulate(e)
        is_gap = s[1:] > reach[:-1]
        k = tuple(_py(p[lo]) for p in parts)
        out[k] = Union(key=k, ops=hi - lo, first_ns=int(s[0]), last_ns=int(reach[-1]), work_ns=int((e - s).sum()),
                       gap_start_ns=reach[:-1][is_gap], gap_end_ns=s[1:][is_gap])
    return out


NULL_KEY = -(2**62)  # stands for a NULL partition value (e.g. unknown stream) while numpy groups


def _py(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return None if value == NULL_KEY else value


# -- interval algebra on merged sets (added for gpu_timeline / comm_summary) ---------------------------
# A merged set is a pair (starts, ends) of int64 arrays: sorted, disjoint, non-empty intervals
# [starts[i], ends[i]) that do not touch (touching intervals are joined, as in `unions`).

EMPTY = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def merged(u: Union | None) -> tuple[np.ndarray, np.ndarray]:
    """The merged intervals of a Union (busy periods between its gaps)."""
    if u is None:
        return EMPTY
    starts = np.concatenate(([u.first_ns], u.gap_end_ns)).astype(np.int64)
    ends = np.concatenate((u.gap_start_ns, [u.last_ns])).astype(np.int64)
    return starts, ends


def measure(a: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of a merged set, ns."""
    return int((a[1] - a[0]).sum())


def _coverage(sets: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Boundary times and, for each segment [t[i], t[i+1]), how many of the sets cover it."""
    times = np.concatenate([x for s in sets for x in s]) if sets else np.zeros(0, dtype=np.int64)
    delta = np.concatenate([np.concatenate((np.ones(s[0].size, np.int64), -np.ones(s[1].size, np.int64))) for s in sets]) \
        if sets else np.zeros(0, dtype=np.int64)
    order = np.argsort(times, kind="stable")
    return times[order], np.cumsum(delta[order])


def _segments(times: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Join the kept, non-empty segments [times[i], times[i+1]) into a merged set."""
    if times.size < 2:
        return EMPTY
    s, e = times[:-1][keep[:-1]], times[1:][keep[:-1]]
    nz = e > s
    s, e = s[nz], e[nz]
    if s.size == 0:
        return EMPTY
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    return s[idx].astype(np.int64), np.maximum.reduceat(e, idx).astype(np.int64)


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A ∩ B of two merged sets, as a merged set."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    times, cover = _coverage([a, b])
    return _segments(times, cover == 2)


def union_of(*sets: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A ∪ B ∪ ... of merged sets, as a merged set."""
    sets = [s for s in sets if s[0].size]
    if not sets:
        return EMPTY
    if len(sets) == 1:
        return sets[0]
    times, cover = _coverage(sets)
    return _segments(times, cover > 0)


def subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A − B of two merged sets, as a merged set."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    times = np.concatenate((a[0], a[1], b[0], b[1]))
    delta = np.concatenate((np.full(a[0].size, 1, np.int64), np.full(a[1].size, -1, np.int64),
                            np.full(b[0].size, 2, np.int64), np.full(b[1].size, -2, np.int64)))
    order = np.argsort(times, kind="stable")
    times, cover = times[order], np.cumsum(delta[order])
    return _segments(times, cover == 1)
