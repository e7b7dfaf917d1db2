"""Interval unions of one profile: busy time and idle gaps of GPU activity, per device or stream.

The unions run in DuckDB (stacked.py's window functions, the same SQL that job tools run over every rank), which
sorts and spills under the memory limit; Python receives per-partition figures, gap histograms and the few longest
gaps, never the intervals. Results depend only on the immutable profile and the query, so they are memoized on the
trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..model.trace import Codec, Trace
from .stacked import gaps_sql, merged_sql, union_stats_sql


@dataclass(frozen=True)
class Union:
    """The union of one partition's intervals (a device, or a device's stream)."""

    key: tuple                 # partition values, e.g. (device_id,) or (device_id, stream_id); None for NULL
    ops: int                   # intervals with non-zero length
    first_ns: int              # earliest start
    last_ns: int               # latest end
    work_ns: int               # summed lengths (overlaps counted twice)
    busy_ns: int               # length of the union
    gaps: int                  # idle gaps between first_ns and last_ns
    bucket_counts: tuple = ()  # gaps per length range, when asked for (see `unions`)
    bucket_ns: tuple = ()      # their summed lengths, ns
    top_gaps: tuple = ()       # ((start, end), ...) of the longest gaps, longest first, when asked for

    @property
    def span_ns(self) -> int:
        return self.last_ns - self.first_ns

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns


def unions(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...],
           bounds: tuple[int, ...] = (), top: int = 0) -> dict[tuple, Union]:
    """Per partition, the union of the intervals selected by `intervals_sql` (columns: partition columns, start_ns,
    end_ns). Zero-length intervals are skipped: they neither fill nor split gaps. With `bounds` (increasing gap lengths,
    ns), gap counts and lengths per range [bounds[i-1], bounds[i]); with `top`, the `top` longest gaps."""
    key = ("unions", intervals_sql, tuple(params), partition, tuple(bounds), top)
    return trace.memo(key, lambda: _compute(trace.sql, intervals_sql, params, partition, tuple(bounds), top))


def unions_on(cur, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, Union]:
    """`unions` run on the caller's cursor, for intervals read from its temp tables (containment.temp_tables): a tool
    that unites one costly selection under several partitions computes it once. Not memoized: a temp table's name
    says nothing of its rows."""
    return _compute(lambda q, p: cur.execute(q, p).fetchall(), intervals_sql, params, partition, (), 0)


# {partition key: busy ns} as JSON: [[key values], busy ns] pairs
BUSY = Codec(encode=lambda d: [[list(k), v] for k, v in d.items()], decode=lambda pairs: {tuple(k): int(v) for k, v in pairs})


def busy_ns(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, int]:
    """Per partition, the busy time (length of the union) of the intervals `unions` would merge, ns. Kept in the
    store, so a later process reads it instead of re-merging."""
    key = ("busy_ns", intervals_sql, tuple(params), partition)
    return trace.memo(key, lambda: {k: u.busy_ns for k, u in unions(trace, intervals_sql, params, partition).items()},
                      persist=BUSY)


def _compute(run: Callable[[str, list[Any]], list[tuple]], intervals_sql: str, params: list[Any],
             partition: tuple[str, ...], bounds: tuple[int, ...], top: int) -> dict[tuple, Union]:
    n = len(partition)
    nb = len(bounds) + 1 if bounds else 0
    rows = run(union_stats_sql(intervals_sql, ", ".join(partition), bounds if bounds else (), top), params)
    out: dict[tuple, Union] = {}
    for r in rows:
        k = tuple(r[:n])
        ops, first, last, work, busy, gaps = (int(v) for v in r[n:n + 6])
        rest = r[n + 6:]
        out[k] = Union(key=k, ops=ops, first_ns=first, last_ns=last, work_ns=work, busy_ns=busy, gaps=gaps,
                       bucket_counts=tuple(int(v) for v in rest[0:2 * nb:2]), bucket_ns=tuple(int(v) for v in rest[1:2 * nb:2]),
                       top_gaps=tuple((int(a), int(b)) for a, b in (rest[2 * nb] or [])) if top else ())
    return out


def gaps(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per partition (integer columns), the idle gaps of the union as (starts, ends), sorted: for the analyses that
    place every gap (phase boundaries, stream concurrency). Their number is bounded by the intervals', so callers
    narrow the selection (one device) first."""
    cols = ", ".join(f"coalesce({c}, {NULL_KEY}) AS {c}" for c in partition)
    cur = trace.con.cursor()
    try:
        d = cur.execute(f"SELECT {cols}, gap_start_ns, gap_end_ns FROM ({gaps_sql(intervals_sql, ', '.join(partition))}) "
                        f"ORDER BY ALL", params).fetchnumpy()
    finally:
        cur.close()
    starts, ends = np.asarray(d["gap_start_ns"], dtype=np.int64), np.asarray(d["gap_end_ns"], dtype=np.int64)
    parts = [np.asarray(d[c], dtype=np.int64) for c in partition]
    change = np.zeros(starts.size, dtype=bool)
    if starts.size:
        change[0] = True
    for p in parts:
        change[1:] |= p[1:] != p[:-1]
    bounds = np.flatnonzero(change).tolist() + [starts.size]
    return {tuple(None if p[lo] == NULL_KEY else int(p[lo]) for p in parts): (starts[lo:hi], ends[lo:hi])
            for lo, hi in zip(bounds[:-1], bounds[1:])}


def overlaps(trace: Trace, a_sql: str, a_params: list[Any], partition: tuple[str, ...], b_sql: str, b_params: list[Any],
             on: tuple[str, ...]) -> dict[tuple, int]:
    """Per partition of A (`a_sql`: columns `partition`, start_ns, end_ns), |A ∩ B|, ns, where B (`b_sql`: columns
    `on`, start_ns, end_ns) is matched on the columns `on` (non-NULL, part of `partition`). Each merged interval of A
    measures B's union between its ends: B's busy time before t is read by an ASOF join on B's merged intervals."""
    key = ("overlaps", a_sql, tuple(a_params), partition, b_sql, tuple(b_params), on)
    p, o = ", ".join(partition), ", ".join(on)
    match = " AND ".join(f"e.{c} = b.{c}" for c in on)
    sql = f"""
        WITH a AS ({merged_sql(a_sql, p)}), b AS ({merged_sql(b_sql, o)}),
             e AS (SELECT {p}, start_ns AS t, -1 AS sign FROM a UNION ALL SELECT {p}, end_ns, 1 FROM a)
        SELECT {", ".join("e." + c for c in partition)},
               sum(e.sign * coalesce(b.before_ns + least(e.t, b.end_ns) - b.start_ns, 0))::BIGINT
        FROM e ASOF LEFT JOIN b ON {match} AND b.start_ns <= e.t
        GROUP BY ALL"""
    n = len(partition)
    return trace.memo(key, lambda: {tuple(r[:n]): int(r[n]) for r in trace.sql(sql, a_params + b_params)})


NULL_KEY = -(2**62)  # stands for a NULL partition value (e.g. unknown stream) while numpy groups


EMPTY = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def merged(u: Union | None, g: tuple[np.ndarray, np.ndarray] = EMPTY) -> tuple[np.ndarray, np.ndarray]:
    """The merged intervals (busy periods) of a Union, from its gaps (`gaps`): sorted, disjoint (starts, ends)."""
    if u is None:
        return EMPTY
    return (np.concatenate(([u.first_ns], g[1])).astype(np.int64), np.concatenate((g[0], [u.last_ns])).astype(np.int64))
