"""Interval unions of one profile (or of a job's stacked stores): busy time and idle gaps of GPU activity, per device
or stream.

A union's figures (`unions`, `unions_on`, `busy_ns`) come from one pass over the intervals sorted by (partition,
start, end): DuckDB sorts, spilling under its memory limit, and numpy merges the sorted rows chunk by chunk with
stacked.py's formula (the running maximum of the ends), so memory stays bounded and Python never loops over
intervals. Overlaps (`overlaps`) come from stacked.py's merged intervals in SQL. Results depend only on the immutable
profile and the query, so they are memoized on the trace.

A tool that needs several partitions (or class sets) at once reads the intervals once in time order instead
(`time_chunks`: cheap to sort, the tables are stored in time order) and follows every partition through each chunk
with `reach_by_part` (the running maximum per partition, carried between chunks); `merge_chunks` gives the merged
intervals that way (stream_summary, phases), and `Keys` numbers partitions read as key columns (gpu_timeline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..model.trace import Codec, Trace
from .stacked import merged_sql


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
    return trace.memo(key, lambda: _on_cursor(trace, intervals_sql, params, partition, tuple(bounds), top))


def unions_on(cur, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, Union]:
    """`unions` run on the caller's cursor, for intervals read from its temp tables (containment.temp_tables): a tool
    that unites one costly selection under several partitions computes it once. Not memoized: a temp table's name
    says nothing of its rows."""
    return _compute(cur, intervals_sql, params, partition, (), 0)


# {partition key: busy ns} as JSON: [[key values], busy ns] pairs
BUSY = Codec(encode=lambda d: [[list(k), v] for k, v in d.items()], decode=lambda pairs: {tuple(k): int(v) for k, v in pairs})


def busy_ns(trace: Trace, intervals_sql: str, params: list[Any], partition: tuple[str, ...]) -> dict[tuple, int]:
    """Per partition, the busy time (length of the union) of the intervals `unions` would merge, ns. Kept in the
    store, so a later process reads it instead of re-merging."""
    key = ("busy_ns", intervals_sql, tuple(params), partition)
    return trace.memo(key, lambda: {k: u.busy_ns for k, u in unions(trace, intervals_sql, params, partition).items()},
                      persist=BUSY)


def _on_cursor(trace: Trace, *args) -> dict[tuple, Union]:
    cur = trace.con.cursor()  # tools run on worker threads: one cursor each
    try:
        return _compute(cur, *args)
    finally:
        cur.close()


# Rows per chunk of the sorted stream that _compute merges: memory stays bounded whatever the profile's size.
STREAM_VECTORS = 64  # x 2,048 rows


def _compute(cur, intervals_sql: str, params: list[Any], partition: tuple[str, ...], bounds: tuple[int, ...],
             top: int) -> dict[tuple, Union]:
    """The unions of `intervals_sql` per partition, merged from its rows sorted by (partition, start, end): DuckDB
    sorts (spilling under its memory limit) and numpy merges each sorted chunk, every partition of it at once
    (_merge_chunk); the SQL window that computes the same took twice the CPU and 500 MB more at 10 M kernels.
    A partition running on into the next chunk carries its reach and figures there."""
    cols = ", ".join(partition)
    # Empty intervals are dropped here, not by a WHERE in the sort's statement: at 10 M kernels that filter doubled
    # the statement's CPU and memory (gpu_timeline's sort measured 1.3-1.5 GB against 1.0-1.1 GB without it).
    cur.execute(f"SELECT {cols}, start_ns::BIGINT AS start_ns, end_ns::BIGINT AS end_ns FROM ({intervals_sql}) "
                f"ORDER BY {cols}, start_ns, end_ns", params)
    edges = np.asarray(bounds, dtype=np.int64)
    acc: dict[tuple, _Acc] = {}
    last: _Acc | None = None
    while True:
        chunk = cur.fetch_df_chunk(STREAM_VECTORS)
        if not len(chunk):
            break
        start = chunk["start_ns"].to_numpy(dtype=np.int64)
        end = chunk["end_ns"].to_numpy(dtype=np.int64)
        keep = end > start
        if not keep.all():
            if not keep.any():
                continue
            chunk, start, end = chunk[keep], start[keep], end[keep]
        # Rows of one partition are adjacent (sorted): a new one starts wherever a key column changes.
        change = np.zeros(start.size, dtype=bool)
        change[0] = True
        keys = []
        for c in partition:
            codes, uniques = pd.factorize(chunk[c], use_na_sentinel=True)
            change[1:] |= codes[1:] != codes[:-1]
            keys.append((codes, uniques))
        cuts = np.append(np.flatnonzero(change), start.size)
        found = [tuple(None if codes[i] < 0 else _plain(uniques[codes[i]]) for codes, uniques in keys) for i in cuts[:-1]]
        going_on = last is not None and last.key == found[0]
        m = _merge_chunk(start, end, cuts, last.reach if going_on else None, edges, top)
        for i, key in enumerate(found):
            if i == 0 and going_on:
                last.extend(m, 0, top)
            else:
                last = acc[key] = _Acc(key, m, i)
    return {k: a.union(bounds, top) for k, a in acc.items()}


def _plain(value):
    """A key value as fetchall gives it (int, str, bool), not a numpy scalar."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass
class _Merged:
    """Per partition of one chunk (arrays indexed by partition): stacked.py's figures of its rows."""

    first: np.ndarray     # earliest start
    reach: np.ndarray     # latest end (the running maximum the next chunk goes on from)
    ops: np.ndarray
    work: np.ndarray
    busy: np.ndarray
    gaps: np.ndarray
    n: np.ndarray         # [range, partition]: gaps per length range
    ns: np.ndarray        # [range, partition]: their summed lengths
    top: list             # per partition: (gap starts, gap lengths), longest first, equal lengths in time order


def _running_max(end: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """The running maximum of `end`, restarting in each partition (`seg`: each row's partition index, non-decreasing
    from 0). Each partition's ends are shifted above every end of the partitions before it, so one running maximum
    restarts at each partition: by (span of the ends) x index when that fits in int64 (one O(n) pass), else as ranks
    (0..n-1, an argsort) offset by n per partition; back to the ends by the same shift."""
    n = end.size
    if not n or seg[-1] == 0:
        return np.maximum.accumulate(end)
    lo = int(end.min())
    span = int(end.max()) - lo + 1
    if span * (int(seg[-1]) + 1) < 2**62:
        shift = seg * span  # with end - lo in [0, span): no value leaves int64
        return np.maximum.accumulate((end - lo) + shift) - shift + lo
    order = np.argsort(end, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return end[order][np.maximum.accumulate(seg * n + rank) - seg * n]


def part_order(part: np.ndarray) -> np.ndarray:
    """The stable order of rows by partition id (ids >= 0): as 16-bit integers when the ids fit, which numpy
    radix-sorts (~4x faster than int64's merge sort on a chunk)."""
    if part.size and int(part.max()) < 2**15:
        return np.argsort(part.astype(np.int16), kind="stable")
    return np.argsort(part, kind="stable")


def _merge_chunk(start: np.ndarray, end: np.ndarray, cuts: np.ndarray, reach0: int | None, edges: np.ndarray,
                 top: int) -> _Merged:
    """The figures of each partition [cuts[i], cuts[i+1]) of a chunk sorted by (partition, start, end); `reach0` is the
    running maximum of the ends carried into the first partition from the chunk before (None: it starts here)."""
    first = cuts[:-1]
    parts = first.size
    seg = np.repeat(np.arange(parts, dtype=np.int64), np.diff(cuts))
    running = _running_max(end, seg)
    # reach: the latest end of the partition's earlier intervals (its first interval has none: no gap before it)
    reach = np.empty_like(end)
    reach[1:] = running[:-1]
    reach[first] = start[first]
    out_reach = running[cuts[1:] - 1]
    if reach0 is not None:
        np.maximum(reach[:cuts[1]], reach0, out=reach[:cuts[1]])
        reach[0] = reach0
        out_reach[0] = max(int(out_reach[0]), reach0)
    gap = start > reach
    glen = np.where(gap, start - reach, 0)
    sums = lambda v: np.add.reduceat(v, first)  # noqa: E731 (exact int64 sums per partition)
    nb = edges.size + 1 if edges.size else 0
    which = np.searchsorted(edges, glen, side="right") if nb else None  # range i: edges[i-1] <= length < edges[i]
    ranges = [gap & (which == i) for i in range(nb)]
    tops = [(np.zeros(0, dtype=np.int64),) * 2] * parts
    if top:
        at = np.flatnonzero(gap)
        o = np.lexsort((reach[at], -glen[at], seg[at]))
        at = at[o]
        pos = np.searchsorted(seg[at], np.arange(parts + 1, dtype=np.int64))
        tops = [(reach[at[lo:min(hi, lo + top)]], glen[at[lo:min(hi, lo + top)]]) for lo, hi in zip(pos[:-1], pos[1:])]
    return _Merged(first=start[first], reach=out_reach, ops=np.diff(cuts), work=sums(end - start),
                   busy=sums(np.maximum(0, end - np.maximum(start, reach))), gaps=sums(gap.astype(np.int64)),
                   n=np.array([sums(r.astype(np.int64)) for r in ranges]).reshape(nb, parts),
                   ns=np.array([sums(np.where(r, glen, 0)) for r in ranges]).reshape(nb, parts), top=tops)


class _Acc:
    """One partition's figures over the chunks seen."""

    def __init__(self, key: tuple, m: _Merged, i: int):
        self.key, self.first, self.reach = key, int(m.first[i]), int(m.reach[i])
        self.ops, self.work, self.busy, self.gaps = int(m.ops[i]), int(m.work[i]), int(m.busy[i]), int(m.gaps[i])
        self.n, self.ns, self.top = m.n[:, i].tolist(), m.ns[:, i].tolist(), m.top[i]

    def extend(self, m: _Merged, i: int, top: int) -> None:
        self.reach = int(m.reach[i])
        self.ops += int(m.ops[i])
        self.work += int(m.work[i])
        self.busy += int(m.busy[i])
        self.gaps += int(m.gaps[i])
        self.n = [a + int(b) for a, b in zip(self.n, m.n[:, i])]
        self.ns = [a + int(b) for a, b in zip(self.ns, m.ns[:, i])]
        if top:
            s, ln = np.concatenate((self.top[0], m.top[i][0])), np.concatenate((self.top[1], m.top[i][1]))
            o = np.lexsort((s, -ln))[:top]
            self.top = (s[o], ln[o])

    def union(self, bounds: tuple[int, ...], top: int) -> Union:
        return Union(key=self.key, ops=self.ops, first_ns=self.first, last_ns=self.reach, work_ns=self.work,
                     busy_ns=self.busy, gaps=self.gaps, bucket_counts=tuple(self.n), bucket_ns=tuple(self.ns),
                     top_gaps=tuple((int(s), int(s + ln)) for s, ln in zip(*self.top)) if top else ())


def overlaps(trace: Trace, a_sql: str, a_params: list[Any], partition: tuple[str, ...], b_sql: str, b_params: list[Any],
             on: tuple[str, ...]) -> dict[tuple, int]:
    """Per partition of A (`a_sql`: columns `partition`, start_ns, end_ns), |A ∩ B|, ns, where B (`b_sql`: columns
    `on`, start_ns, end_ns) is matched on the columns `on` (non-NULL, part of `partition`). Each merged interval of A
    measures B's union between its ends: B's busy time before t is read by an ASOF join on B's merged intervals."""
    key = ("overlaps", a_sql, tuple(a_params), partition, b_sql, tuple(b_params), on)
    p, o = ", ".join(partition), ", ".join(on)
    match = " AND ".join(f"e.{c} = b.{c}" for c in on)
    sql = f"""
        WITH a AS ({merged_sql(a_sql, p)}), b AS ({merged_sql(b_sql, o, before=True)}),
             e AS (SELECT {p}, start_ns AS t, -1 AS sign FROM a UNION ALL SELECT {p}, end_ns, 1 FROM a)
        SELECT {", ".join("e." + c for c in partition)},
               sum(e.sign * coalesce(b.before_ns + least(e.t, b.end_ns) - b.start_ns, 0))::BIGINT
        FROM e ASOF LEFT JOIN b ON {match} AND b.start_ns <= e.t
        GROUP BY ALL"""
    n = len(partition)
    return trace.memo(key, lambda: {tuple(r[:n]): int(r[n]) for r in trace.sql(sql, a_params + b_params)})


INT64_MIN = np.iinfo(np.int64).min  # "no reach yet": below every start, so max(start, reach) = start


def time_chunks(cur, sql: str, params: list[Any], columns: dict[str, int]):
    """The rows of `sql` (ordered by start_ns, end_ns) in chunks of int64 arrays, one per column of `columns` (name ->
    the value standing for NULL), cut so that no start time
    spans two chunks: a chunk's rows starting at its last start wait for the next one, so each start group (the ops of
    one partition starting at the same time) lies whole in one chunk. Memory follows the chunk, not the profile."""
    cur.execute(sql, params)
    held: dict[str, np.ndarray] | None = None
    while True:
        df = cur.fetch_df_chunk(STREAM_VECTORS)
        got = {}
        for c, fill in columns.items():
            col = df[c] if len(df) else pd.Series([], dtype="int64")
            got[c] = col.to_numpy(dtype=np.int64, na_value=fill)
        if held is not None:
            got = {c: np.concatenate((held[c], v)) for c, v in got.items()}
        if not len(df):
            if got["start_ns"].size:
                yield got
            return
        start = got["start_ns"]
        cut = int(np.searchsorted(start, start[-1], side="left"))
        if cut:
            yield {c: v[:cut] for c, v in got.items()}
        held = {c: v[cut:] for c, v in got.items()}


def reach_by_part(part: np.ndarray, end: np.ndarray, carry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows in time order (start, end) with partition ids `part` (sorted: rows of a partition adjacent), each row's
    reach: the latest end of the earlier rows of its partition, including `carry[part]` (the latest end of the
    partition in earlier chunks; INT64_MIN: none), and the index of each partition's first row (for np.*.reduceat).
    `carry` is updated for the next chunk. What a row adds to its union: max(0, end - max(start, reach)); an idle
    gap [reach, start) precedes it where start > reach > INT64_MIN."""
    n = end.size
    reach = np.empty(n, dtype=np.int64)
    cuts = np.flatnonzero(part[1:] != part[:-1]) + 1
    firsts = np.concatenate(([0], cuts)) if n else cuts
    if not n:
        return reach, firsts
    lasts = np.append(cuts, n) - 1
    running = _running_max(end, np.repeat(np.arange(firsts.size, dtype=np.int64), np.diff(np.append(firsts, n))))
    reach[1:] = running[:-1]
    reach[firsts] = INT64_MIN
    before = carry[part[firsts]]
    np.maximum(reach, np.repeat(before, np.diff(np.append(firsts, n))), out=reach)
    carry[part[firsts]] = np.maximum(before, running[lasts])
    return reach, firsts


def grown(a: np.ndarray, n: int, fill: int) -> np.ndarray:
    """`a` with its last axis extended to n, new entries `fill`."""
    more = n - a.shape[-1]
    return a if more <= 0 else np.concatenate((a, np.full((*a.shape[:-1], more), fill, dtype=np.int64)), axis=-1)


class Keys:
    """Dense ids (0, 1, ...) for partition keys (tuples of nullable integer columns) across chunks. Each column comes
    as two arrays (`select_sql`): its value, 0 where NULL, and its null flag, so that no value has to stand for NULL
    (any BIGINT may be a real pid or stream). Python loops over a chunk's distinct keys only."""

    def __init__(self, cols: tuple[str, ...]):
        self.cols, self.ids = cols, {}
        self.arrays = tuple(a for c in cols for a in (c, f"{c}__null"))  # the columns time_chunks reads, in order

    def select_sql(self) -> str:
        """The select list giving each key column as its two arrays."""
        return ", ".join(f"coalesce({c}, 0) AS {c}, ({c} IS NULL)::BIGINT AS {c}__null" for c in self.cols)

    def __call__(self, ch: dict) -> np.ndarray:
        combined = np.zeros(ch[self.arrays[0]].size, dtype=np.int64)
        uniques = []
        for a in self.arrays:
            code, u = pd.factorize(ch[a])
            combined = combined * len(u) + code
            uniques.append(np.asarray(u))
        local, found = pd.factorize(combined)
        lut = np.empty(len(found), dtype=np.int64)
        for j, v in enumerate(found.tolist()):
            codes = []
            for u in reversed(uniques):
                v, rest = divmod(v, len(u))
                codes.append(rest)
            values = [int(u[cd]) for u, cd in zip(uniques, reversed(codes))]
            key = tuple(None if null else x for x, null in zip(values[::2], values[1::2]))
            lut[j] = self.ids.setdefault(key, len(self.ids))
        return lut[local]


def merge_chunks(chunks):
    """The merged intervals of each partition, in chunks of (partition ids, starts, ends), from chunks of non-empty
    ops (partition ids >= 0, starts, ends) in time order, each start group whole in one chunk (time_chunks): an op
    starting after its partition's reach opens an interval and closes the one before at that reach; a partition's
    last interval stays open across chunks."""
    reach = np.zeros(0, dtype=np.int64)   # per partition: the latest end so far
    opened = np.zeros(0, dtype=np.int64)  # per partition: start of its open interval
    for part, start, end in chunks:
        if not part.size:
            continue
        n = int(part.max()) + 1
        reach, opened = grown(reach, n, INT64_MIN), grown(opened, n, INT64_MIN)
        o = part_order(part)
        p, s, e = part[o], start[o], end[o]
        r, _ = reach_by_part(p, e, reach)
        at = np.flatnonzero(s > r)  # ops opening an interval (a partition's first op: r = INT64_MIN)
        if not at.size:
            continue
        pa = p[at]
        first = np.ones(at.size, dtype=bool)  # the partition's first opening in this chunk: closes the carried interval
        first[1:] = pa[1:] != pa[:-1]
        prev = np.where(first, opened[pa], np.roll(s[at], 1))
        closes = r[at] > INT64_MIN
        yield pa[closes], prev[closes], r[at][closes]
        last = np.append(first[1:], True)  # the partition's last opening in this chunk: stays open
        opened[pa[last]] = s[at][last]
    live = np.flatnonzero(opened > INT64_MIN)
    if live.size:
        yield live, opened[live], reach[live]
