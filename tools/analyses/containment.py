"""Containment joins (an interval inside another on the same thread) as DuckDB IEJoins, whatever the query around them.

The op tree, the NVTX/annotation projection and the step choice key every interval by (thread, time) and join on
two inequalities, which DuckDB runs as an IEJoin: O(n log n) on one thread's ops. DuckDB 1.5 plans every join
below a materialized CTE without IEJoin (its planner registers materialized CTEs as recursive-CTE tables, which
rules IEJoin out), and it materializes a CTE that a query names twice; the join then became a piecewise merge
join filtering the second inequality, quadratic on one thread: 250,000 ops did not finish in minutes. So a
containment join reads its inputs from temp tables made on the caller's cursor first (`temp_tables`), in a
statement that names no CTE. tests/analyses/test_join_plans.py checks every tool's plans for the fallback.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import duckdb

from ..model.quote import quote_ident

# Thread key k and time t become k * SHIFT + t (HUGEINT): the keyed times of different threads never interleave
# (|t| < 2^63), so "inside an op of the same thread" needs no equality condition, which DuckDB would hash and then
# compare every pair within a thread.
SHIFT = "18446744073709551616"  # 2^64


@contextmanager
def temp_tables(cur: duckdb.DuckDBPyConnection, with_clause: str, tables: dict[str, str],
                params: list | None = None) -> Iterator[None]:
    """Make each `tables` entry (temp name -> CTE of `with_clause`) a temp table of `cur` for the block, then drop
    it. Temp tables belong to the cursor's connection: concurrent tool calls (one cursor each) never share them."""
    made = []
    try:
        for name, cte in tables.items():
            sql = f"CREATE OR REPLACE TEMP TABLE {quote_ident(name)} AS {with_clause} SELECT * FROM {quote_ident(cte)}"
            cur.execute(sql, params) if params else cur.execute(sql)
            made.append(name)
        yield
    finally:
        for name in made:
            cur.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(name)}")


@contextmanager
def temp_table_after(cur: duckdb.DuckDBPyConnection, with_clause: str, name: str, cte: str,
                     staged: dict[str, str]) -> Iterator[None]:
    """Temp table `name` (CTE `cte` of `with_clause`) for the block, made in a statement of its own after the temp
    tables `staged` (temp name -> CTE of the same clause) that `cte` reads, which go as soon as it is made. GPU ops
    joined to their launching calls, and those calls to their threads, in one statement ran out of a 190 MiB limit
    at 2 M ops; as two statements, each with one join of 2 M rows, they spill."""
    with temp_tables(cur, with_clause, staged):
        cur.execute(f"CREATE OR REPLACE TEMP TABLE {quote_ident(name)} AS {with_clause} SELECT * FROM {quote_ident(cte)}")
    try:
        yield
    finally:
        cur.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(name)}")
