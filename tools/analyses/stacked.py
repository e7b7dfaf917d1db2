"""Building blocks for analyses over many ranks at once: one SQL statement over every store, not one per rank.

A job's tables are stacked once into one store of the job (tools/model/job.py job_stack); `union_sql` reads a
table of it with each row's position `part` in the job (one scan, however many ranks). The helpers here keep the number of statements an analysis runs
fixed, however many ranks it reads:

  run(traces, sql, params)   one statement over the stacked stores (through job.job_sql, so a test can count them);
  stack(traces, table, cols) the stacked table (union_sql);
  values(rows)               a VALUES list of small per-rank rows (integers, booleans, NULLs) for a CTE;
  prime(traces)              one statement for the per-profile counts (requirements.present, Trace.count,
                             projection.linked) and one for the data_issues rows, stored in each trace's memo, so that
                             the per-profile helpers that read them (data_issue_notes, left_out, ...) issue no query;
  union_measures_sql(...)    interval-union figures (TraceLens's busy / exposed / span split) per partition, as SQL
                             window functions, so the union runs for every (rank, device) in one statement.

Union of intervals in SQL: sorted by start, an interval adds what reaches past the running maximum of the ends
before it: |∪ [s_i, e_i)| = Σ max(0, e_i - max(s_i, max_{j<i} e_j)). Exact in integer ns, independent of how
equal starts are ordered; zero-length intervals are left out (they neither fill nor split gaps, as in intervals.py).
The split of a timeline into computation / exposed comm / exposed memcpy needs only unions:
|COMM - COMP| = |COMM ∪ COMP| - |COMP| and |MEMCPY - COMP - COMM| = |ALL| - |COMM ∪ COMP|.

Names from profiles never enter the SQL text: only gpuscope's own table and column names, integers, and catalog
names through quote_ident (inside union_sql); strings go in as parameters.
"""

from __future__ import annotations

import re
from typing import Any

from ..model import job as jobs
from ..model.quote import quote_ident
from ..model.trace import Trace
from .requirements import KINDS


def run(traces: list[Trace], sql: str, params: list | dict | None = None) -> list[tuple]:
    """One statement over the stacked stores of `traces` (a lone profile held in memory runs on its own instance)."""
    if len(traces) == 1 and traces[0].store.in_memory:
        return traces[0].sql(sql, params)
    return jobs.job_sql(traces, sql, params)


def stack(traces: list[Trace], table: str, columns: str, where: str = "TRUE", only: set[int] | None = None) -> str:
    """`table` of every trace with its position `part` (job.union_sql); a lone profile held in memory (the cache
    folder cannot be written) is read on its own instance, so one-profile calls work without the on-disk store."""
    if len(traces) == 1 and traces[0].store.in_memory:
        t = traces[0]
        if table in jobs.DERIVED_TABLES:
            source = jobs.source_sql(table, quote_ident(t.con.catalog), t.format) or jobs.empty_sql(table)
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


def union_measures_sql(intervals: str, partition: str, sets: dict[int, tuple[int, ...]]) -> str:
    """Per partition: for each set id s of `sets` (s -> the classes it holds), u<s> = the length of the union of the
    intervals whose `cls` is in the set; and first_ns / last_ns of the last set (meant to hold every class).
    `intervals` selects the columns of `partition` (a comma-separated list), cls, start_ns, end_ns."""
    member = ", ".join(f"({s}, {c})" for s, cs in sets.items() for c in cs)
    every = max(sets)
    cols = ", ".join(f"coalesce(sum(add_ns) FILTER (WHERE set_id = {s}), 0)::BIGINT AS u{s}" for s in sets)
    return f"""
        SELECT {partition}, {cols},
               min(start_ns) FILTER (WHERE set_id = {every}) AS first_ns, max(end_ns) FILTER (WHERE set_id = {every}) AS last_ns
        FROM (
            SELECT {partition}, set_id, start_ns, end_ns,
                   greatest(0, end_ns - greatest(start_ns, coalesce(max(end_ns) OVER (
                       PARTITION BY {partition}, set_id ORDER BY start_ns, end_ns
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns))) AS add_ns
            FROM ({intervals}) iv JOIN (VALUES {member}) sets(set_id, cls) USING (cls)
            WHERE end_ns > start_ns)
        GROUP BY {partition}"""


def catalogs(traces: list[Trace]) -> list[str]:
    """Each trace's catalog name, quoted (for the statements that read a store's native schema)."""
    return [quote_ident(t.con.catalog) for t in traces]
