"""Building blocks for analyses over many ranks at once: one SQL statement over every store, not one per rank.

A job's tables are stacked once into one store of the job (tools/model/job.py job_stack); `union_sql` reads a
table of it with each row's position `part` in the job (one scan, however many ranks). The helpers here keep the number of statements an analysis runs
fixed, however many ranks it reads:

  run(traces, sql, params)   one statement over the stacked stores (through job.job_sql, so a test can count them);
  frame(traces, sql, ...)    the same as a pandas DataFrame (through job.job_df), reading registered DataFrames too;
  stack(traces, table, cols) the stacked table (union_sql);
  values(rows)               a VALUES list of small per-rank rows (integers, booleans, NULLs) for a CTE;
  prime(traces)              one statement for the per-profile counts (requirements.present, Trace.count,
                             projection.linked) and one for the data_issues rows, stored in each trace's memo, so that
                             the per-profile helpers that read them (data_issue_notes, left_out, ...) issue no query;
  reach_sql / union_stats_sql / gaps_sql / merged_sql / union_measures_sql
                             interval unions per partition as SQL window functions, for statements that keep
                             using them (a union per op instance joined to other tables, the gaps themselves);
                             figures that come back to Python come from intervals.unions / unions_on, which merge
                             DuckDB's sorted rows in numpy with the same formula (one profile, or every (rank,
                             device) of a job on stacked.cursor): half the CPU, no window's memory; a tool that
                             needs several partitions or class sets at once follows them all through one stream
                             in time order (intervals.time_chunks / reach_by_part, as gpu_timeline does).

Union of intervals in SQL: sorted by start, an interval adds what reaches past the running maximum of the ends
before it (its reach): |∪ [s_i, e_i)| = Σ max(0, e_i - max(s_i, max_{j<i} e_j)), and an idle gap [reach, s_i) opens
wherever s_i > reach. Exact in integer ns, independent of how equal starts are ordered; zero-length intervals are left
out (they neither fill nor split gaps); touching intervals join. DuckDB sorts and windows out of core, so the memory
of a union does not grow with the number of intervals: only per-partition figures (or the gaps asked for) come back.
Set algebra needs only unions: |A ∩ B| = |A| + |B| - |A ∪ B|, |COMM - COMP| = |COMM ∪ COMP| - |COMP| and
|MEMCPY - COMP - COMM| = |ALL| - |COMM ∪ COMP|.

Names from profiles never enter the SQL text: only gpuscope's own table and column names, integers, and catalog
names through quote_ident (inside union_sql); strings go in as parameters.
"""

from __future__ import annotations

from typing import Any

from ..model import job as jobs
from ..model.hub import hub
from ..model.quote import quote_ident
from ..model.trace import Trace
from .requirements import KINDS


def run(traces: list[Trace], sql: str, params: list | dict | None = None) -> list[tuple]:
    """One statement over the stacked stores of `traces`; a lone profile runs on its own model (stack() reads it
    there: one profile is never copied into a job file)."""
    if len(traces) == 1:
        return traces[0].sql(sql, params)
    return jobs.job_sql(traces, sql, params)


def frame(traces: list[Trace], sql: str, params: list | dict | None = None, frames: dict | None = None):
    """run()'s statement as a pandas DataFrame; `frames`: DataFrames the statement reads by name."""
    return jobs.job_df(sql, params, frames, _source(traces))


def cursor(traces: list[Trace]):
    """A new cursor where run() and frame() run their statements (for temp tables a block of statements shares)."""
    return (_source(traces) or hub().con).cursor()


def _source(traces: list[Trace]):
    """A lone profile's own model; None for a job (the shared instance that holds every stacked store)."""
    return traces[0].con if len(traces) == 1 else None


def whole_graph_cols(traces: list[Trace]) -> str:
    """Two scalar columns for a job statement's SELECT: whole-graph replays (kernels rows with whole_graph = true) of
    every trace and their summed duration, ns; part of an existing statement, so a job tool's statements stay fixed."""
    k = stack(traces, "kernels", "dur_ns", "whole_graph")
    return f"(SELECT count(*) FROM ({k})) AS whole_n, (SELECT coalesce(sum(dur_ns), 0)::BIGINT FROM ({k})) AS whole_ns"


def stack(traces: list[Trace], table: str, columns: str, where: str = "TRUE", only: set[int] | None = None) -> str:
    """`table` of every trace with its position `part` (job.union_sql); a lone profile is read from its own model
    (its store, or the in-memory model when the cache folder cannot be written), never stacked into a job file."""
    if len(traces) == 1:
        t = traces[0]
        if table in jobs.DERIVED_TABLES:
            nvtx = t.native_columns("NVTX_EVENTS") if table == "nvtx_cross_thread" and t.format == "nsys" else frozenset()
            source = jobs.source_sql(table, quote_ident(t.con.catalog), t.format, nvtx) or jobs.empty_sql(table)
            source = f"({source})"
        else:  # the table itself, not a subquery: `columns` may read its rowid
            source = f"{quote_ident(t.con.catalog)}.main.{table}"
        return f"SELECT 0 AS part, {columns} FROM {source} WHERE {where if only is None or 0 in only else 'FALSE'}"
    return jobs.union_sql(traces, table, columns, where, only)


def sql_value(v: Any) -> str:
    """An integer, boolean or NULL as SQL text (per-rank keys computed by gpuscope, never profile text)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(int(v))
    raise TypeError(f"only integers, booleans and NULL go into SQL text, not {type(v).__name__}")


def values(rows: list[tuple], types: tuple[str, ...]) -> str:
    """`SELECT * FROM (VALUES ...)` with typed columns; an empty list gives an empty relation of those types."""
    if not rows:
        return "SELECT " + ", ".join(f"NULL::{t}" for t in types) + " WHERE FALSE"
    first = "(" + ", ".join(f"{sql_value(v)}::{t}" for v, t in zip(rows[0], types)) + ")"
    rest = ["(" + ", ".join(sql_value(v) for v in r) + ")" for r in rows[1:]]
    return "VALUES " + ", ".join([first, *rest])


def prime(traces: list[Trace]) -> None:
    """Fill each trace's memo with its row counts and data_issues rows: two statements for the whole job (the counts
    are the stacked store's kind_counts, made with requirements.KINDS' count queries)."""
    todo = [t for t in traces if ("requirements.present",) not in t._memo or ("data_issues",) not in t._memo]
    if not todo:
        return
    counts: dict[tuple[int, str], int] = {(p, k): int(n) for p, k, n in run(
        todo, f"SELECT part, kind, n FROM ({stack(todo, 'kind_counts', 'kind, n')})")}
    issues: dict[int, list] = {}
    for p, t_, a, n, r in run(todo, f"SELECT * FROM ({stack(todo, 'data_issues', 'table_name, action, rows, reason')}) "
                                    "ORDER BY part, table_name, action DESC, rows DESC, reason"):
        issues.setdefault(p, []).append((t_, a, int(n), r))
    for i, t in enumerate(todo):
        present = {k: counts.get((i, k), 0) for k in KINDS}
        t.memo(("requirements.present",), lambda: present)
        for table in ("kernels", "memops", "api_calls"):
            t.memo(("count", table), lambda table=table: present[table])
        linked = counts.get((i, "launched_kernels"), 0) + counts.get((i, "launched_memops"), 0)
        t.memo(("projection.linked",), lambda: linked)
        t.memo(("data_issues",), lambda: issues.get(i, []))


def reach_sql(intervals: str, partition: str) -> str:
    """The non-empty intervals of `intervals` (columns: those of `partition`, a comma-separated list, and start_ns,
    end_ns, any others) with reach_ns: the latest end of the earlier intervals of their partition (NULL for the first).
    An idle gap [reach_ns, start_ns) precedes each interval with start_ns > reach_ns."""
    return f"""
        SELECT *, max(end_ns) OVER (PARTITION BY {partition} ORDER BY start_ns, end_ns
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach_ns
        FROM ({intervals}) WHERE end_ns > start_ns"""


_ADDS = "greatest(0, end_ns - greatest(start_ns, coalesce(reach_ns, start_ns)))"  # what an interval adds to its union
_GAP = "start_ns > reach_ns"


def union_stats_sql(intervals: str, partition: str, bounds: tuple[int, ...] = (), top: int = 0) -> str:
    """Per partition of `intervals` (as reach_sql): ops (non-empty intervals), first_ns, last_ns, work_ns (summed
    lengths), busy_ns (length of the union), gaps (idle gaps inside first..last); with `bounds` (increasing gap
    lengths, ns) the count n<i> and summed length ns<i> of the gaps in each of the len(bounds) + 1 ranges
    [bounds[i-1], bounds[i]); with `top`, top_gaps: the `top` longest gaps as [start, end] pairs, longest first,
    equal lengths in time order."""
    edges = [None, *(int(b) for b in bounds), None]
    cols = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        cond = " AND ".join([_GAP] + ([f"start_ns - reach_ns >= {lo}"] if lo is not None else [])
                            + ([f"start_ns - reach_ns < {hi}"] if hi is not None else []))
        cols.append(f"count(*) FILTER (WHERE {cond}) AS n{i}, "
                    f"coalesce(sum(start_ns - reach_ns) FILTER (WHERE {cond}), 0)::BIGINT AS ns{i}")
    if top:
        cols.append(f"max_by([reach_ns, start_ns], (start_ns - reach_ns, -reach_ns), {int(top)}) FILTER (WHERE {_GAP}) AS top_gaps")
    return f"""
        SELECT {partition}, count(*) AS ops, min(start_ns) AS first_ns, max(end_ns) AS last_ns,
               sum(end_ns - start_ns)::BIGINT AS work_ns, sum({_ADDS})::BIGINT AS busy_ns,
               count(*) FILTER (WHERE {_GAP}) AS gaps, {", ".join(cols)}
        FROM ({reach_sql(intervals, partition)})
        GROUP BY {partition}"""


def gaps_sql(intervals: str, partition: str) -> str:
    """The idle gaps of each partition's union: the columns of `partition`, gap_start_ns, gap_end_ns."""
    return f"SELECT {partition}, reach_ns AS gap_start_ns, start_ns AS gap_end_ns FROM ({reach_sql(intervals, partition)}) WHERE {_GAP}"


def merged_sql(intervals: str, partition: str, before: bool = False) -> str:
    """The merged intervals of each partition's union (disjoint, not touching): the columns of `partition`, start_ns,
    end_ns; with `before`, also before_ns, the union's length before start_ns (so the busy time before any t inside
    or after a merged interval is before_ns + least(t, end_ns) - start_ns: an ASOF join on start_ns <= t answers
    coverage questions). before_ns is one more window over the merged intervals: only asked for where it is read."""
    before_col = (f""",
               (sum(end_ns - start_ns) OVER (PARTITION BY {partition} ORDER BY start_ns) - (end_ns - start_ns))::BIGINT AS before_ns"""
                  if before else "")
    return f"""
        SELECT {partition}, start_ns, end_ns{before_col}
        FROM (SELECT {partition}, min(start_ns) AS start_ns, max(end_ns) AS end_ns
              FROM (SELECT *, sum((reach_ns IS NULL OR {_GAP})::INTEGER) OVER (
                                  PARTITION BY {partition} ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
                    FROM ({reach_sql(intervals, partition)}))
              GROUP BY {partition}, island)"""


def union_measures_sql(intervals: str, partition: str, sets: dict[int, tuple[int, ...]]) -> str:
    """Per partition: for each set id s of `sets` (s -> the classes it holds), u<s> = the length of the union of the
    intervals whose `cls` is in the set; and first_ns / last_ns of the last set (meant to hold every class).
    `intervals` selects the columns of `partition` (a comma-separated list), cls, start_ns, end_ns. Each class is
    merged first (one pass over the intervals); the sets then unite the far fewer merged intervals."""
    member = ", ".join(f"({s}, {c})" for s, cs in sets.items() for c in cs)
    every = max(sets)
    cols = ", ".join(f"coalesce(sum({_ADDS}) FILTER (WHERE set_id = {s}), 0)::BIGINT AS u{s}" for s in sets)
    merged = merged_sql(f"SELECT {partition}, cls, start_ns, end_ns FROM ({intervals})", f"{partition}, cls")
    joined = f"SELECT {partition}, set_id, start_ns, end_ns FROM ({merged}) m JOIN (VALUES {member}) sets(set_id, cls) USING (cls)"
    return f"""
        SELECT {partition}, {cols},
               min(start_ns) FILTER (WHERE set_id = {every}) AS first_ns, max(end_ns) FILTER (WHERE set_id = {every}) AS last_ns
        FROM ({reach_sql(joined, partition + ', set_id')})
        GROUP BY {partition}"""


def catalogs(traces: list[Trace]) -> list[str]:
    """Each trace's catalog name, quoted (for the statements that read a store's native schema)."""
    return [quote_ident(t.con.catalog) for t in traces]
