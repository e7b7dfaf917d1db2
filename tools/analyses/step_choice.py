"""Which host ranges are the steps: the iterations tool's choice, as one SQL statement over many ranks' stores.

The rules are iterations.py's (see its docstring), applied per scope = (profile in the job, process; or the
whole profile when the rank is a profile naming no process):
  1. the caller's `marker`: outermost ranges whose name equals it, whose name with digit runs as <N> equals it,
     or (a glob) whose name matches it;
  2. else every outermost range of the groups named ProfilerStep#<N>;
  3. else the best repeating group (>= 2 outermost instances), ranges grouped by (process, thread, domain, name
     with digit runs as <N>): with a GPU projection, the shallowest group receiving >= MIN_COVERAGE of its
     process's launched GPU work (then most instances, then most coverage), or failing that the group with the
     most coverage; without a projection the shallowest (then most instances). Ties go to the group seen first
     (smallest range id). The same group on other processes of the scope belongs to the choice; on the chosen
     process only the chosen thread.
Ranges, ids (rid), nesting depth, outermost instances and the projection (GPU work belongs to a range when its
launching API call lies inside it on the same thread) are projection.py's definitions, computed per profile.

`scope_steps` gives, per scope, its steps with their 0-based index per (process, thread) in time order, and how the
choice was made ('caller', 'ProfilerStep', 'auto'). Only step rows leave DuckDB. The statement reads its inputs
from temp tables (choice_tables), so that the range depth and the GPU work inside each range are IEJoins, not
joins quadratic in the ranges of a thread (containment.py).
"""

from __future__ import annotations

import fnmatch
import statistics
from contextlib import contextmanager
from typing import Iterator

import duckdb
import pandas as pd

from ..model.trace import Trace
from .containment import temp_table_after, temp_tables
from .projection import RANGE_KINDS_SQL, SHIFT, calls_unique, launch_sql, normalised_sql, projection_absent_reason
from .stacked import cursor, run, stack, values

MIN_COVERAGE = 0.5  # an automatic step group receives at least this share of its process's launched GPU work
WARMUP_FACTOR = 1.5
STEP_COLUMNS = ("how", "pid", "tid", "idx", "start_ns", "end_ns", "name")  # scope_steps' frames
WARMUP_RULE = (f"leading steps are warm-up while wall_ns > {WARMUP_FACTOR} x median wall_ns of the steps after it and at "
               "least 2 steps follow; the first step failing the test ends the warm-up")


def warmup(walls: list[int]) -> tuple[list[int], str]:
    """The leading warm-up steps of a series (wall times, ns, in time order) under WARMUP_RULE, and the rule or why
    it cannot be applied (iterations states it; critical_path leaves the warm-up out of its median step)."""
    if len(walls) < 3:
        return [], f"too few steps ({len(walls)}) to tell warm-up from steady state (rule: {WARMUP_RULE})"
    warm = []
    for i in range(len(walls) - 2):
        if walls[i] > WARMUP_FACTOR * statistics.median(walls[i + 1:]):
            warm.append(i)
        else:
            break
    return warm, WARMUP_RULE


def choice_sql(marker: bool, globbed: bool) -> str:
    """A WITH clause over choice_tables' temp tables defining, per scope (upid: the scope's process, NULL for every
    process of the profile):
       outer_(part, upid, rid, pid, tid, start_ns, end_ns, name, domain, pattern, depth, ...)  outermost ranges;
       grp(part, upid, pid, tid, domain, pattern, instances, min_depth, first_rid, example, coverage, projected);
       best(... as grp, any_eligible)   the automatic choice's group (none with the caller's marker or ProfilerStep);
       pick(part, upid, pid, tid, domain, pattern, how)   the chosen groups;
       chosen(... as outer_, how)       the step ranges; stepped(... idx) with their index per (process, thread).
    marker: the statement takes $marker (and $names, the range names matching a glob marker, when `globbed`)."""
    if marker:
        hit = f"(d.name = $marker OR d.pattern = $marker{' OR list_contains($names, d.name)' if globbed else ''})"
        chosen = f"""
        chosen AS (SELECT d.*, 'caller' AS how FROM outer_ AS d WHERE {hit}),
        pick AS (SELECT DISTINCT part, upid, pid, tid, domain, pattern, how FROM chosen),
        best AS (SELECT *, NULL::BOOLEAN AS any_eligible FROM grp WHERE FALSE),"""
    else:
        chosen = f"""
        ps AS (SELECT DISTINCT part, upid FROM grp WHERE pattern = 'ProfilerStep#<N>'),
        rep AS (SELECT g.*, coalesce(g.coverage, 0) >= {MIN_COVERAGE} AS eligible FROM grp g
                WHERE g.instances >= 2 AND NOT EXISTS (SELECT 1 FROM ps WHERE ps.part = g.part AND ps.upid IS NOT DISTINCT FROM g.upid)),
        rep2 AS (SELECT *, bool_or(eligible) OVER (PARTITION BY part, upid) AS any_eligible FROM rep),
        best AS (SELECT * EXCLUDE (pick, eligible) FROM (
                    SELECT *, row_number() OVER (PARTITION BY part, upid ORDER BY
                        eligible DESC,
                        CASE WHEN projected AND NOT any_eligible THEN coverage END DESC NULLS LAST,
                        min_depth, instances DESC,
                        CASE WHEN any_eligible THEN coverage END DESC NULLS LAST,
                        first_rid) AS pick
                    FROM rep2) WHERE pick = 1),
        pick AS (SELECT g.part, g.upid, g.pid, g.tid, g.domain, g.pattern, 'ProfilerStep' AS how FROM grp g
                 JOIN ps ON ps.part = g.part AND ps.upid IS NOT DISTINCT FROM g.upid WHERE g.pattern = 'ProfilerStep#<N>'
                 UNION ALL
                 SELECT r.part, r.upid, r.pid, r.tid, r.domain, r.pattern, 'auto' FROM rep r JOIN best b
                 ON r.part = b.part AND r.upid IS NOT DISTINCT FROM b.upid AND r.pattern = b.pattern AND r.domain = b.domain
                 WHERE r.pid <> b.pid OR r.tid = b.tid),
        chosen AS (SELECT d.*, p.how FROM outer_ d JOIN pick p
                   ON d.part = p.part AND d.upid IS NOT DISTINCT FROM p.upid AND d.pid = p.pid AND d.tid = p.tid
                   AND d.domain = p.domain AND d.pattern = p.pattern),"""
    return f"""
        WITH data AS (SELECT r.*, s.pid AS upid, coalesce(dp.depth, 0) AS depth
                      FROM _step_rng r JOIN _step_scope s ON s.part = r.part AND (s.pid IS NULL OR s.pid = r.pid)
                      LEFT JOIN _step_depth dp ON dp.part = r.part AND dp.rid = r.rid
                      WHERE r.end_ns > r.start_ns),
        outer_ AS (SELECT * FROM (
                      SELECT *, max(end_ns) OVER (PARTITION BY part, upid, pid, tid, domain, pattern ORDER BY rid
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max FROM data)
                   WHERE prev_max IS NULL OR prev_max < end_ns),
        tot AS (SELECT part, pid, sum(dur_ns) AS work FROM _step_gop GROUP BY part, pid),
        cov AS (SELECT g.part, g.pid, g.tid, g.domain, g.pattern, g.work / nullif(t.work, 0) AS coverage
                FROM _step_cgrp g JOIN tot t USING (part, pid)),
        grp AS (SELECT o.part, o.upid, o.pid, o.tid, o.domain, o.pattern, count(*) AS instances, min(o.depth) AS min_depth,
                       min(o.rid) AS first_rid, arg_min(o.name, o.rid) AS example,
                       CASE WHEN c.pid IS NOT NULL THEN c.coverage WHEN o.part IN (SELECT part FROM _step_proj) THEN 0.0 END AS coverage,
                       o.part IN (SELECT part FROM _step_proj) AS projected
                FROM outer_ o LEFT JOIN cov c USING (part, pid, tid, domain, pattern)
                GROUP BY o.part, o.upid, o.pid, o.tid, o.domain, o.pattern, c.pid, c.coverage),{chosen}
        stepped AS (SELECT part, upid, how, pid, tid, start_ns, end_ns, name,
                           row_number() OVER (PARTITION BY part, upid, pid, tid ORDER BY start_ns, rid) - 1 AS idx, rid
                    FROM chosen)
    """


@contextmanager
def choice_tables(traces: list[Trace], scopes: list[tuple[int, int | None]], projected: list[int],
                  detail: bool = False, steps_only: bool = False, marker: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on which choice_sql's statement runs: the cursor stacked.run would use (the profile's model, or the
    job's stacked stores), holding choice_sql's inputs as temp tables for the block:
       _step_scope(part, pid)  the scopes (pid NULL: every process of the profile); _step_proj(part) the parts with
                               a GPU projection;
       _step_thr(part, pid, tid, k)  the threads of ranges and API calls, numbered (k) from 0;
       _step_rng(rid, part, pid, tid, start_ns, end_ns, name, domain, pattern, cross_thread, ks, ke, gid)  the ranges
                               (gid: the number of their (part, pid, tid, domain, pattern) group);
       _step_gop(part, op_id, pid, dur_ns, ks, ke)  the projected parts' linked GPU ops, keyed by their launching call
                               (with `detail`, also kernel (a kernel, not a memory op), device_id, start_ns, end_ns);
       _step_depth(part, rid, depth)  the enclosing ranges of a range (same thread, enclosing, earlier rid; a range
                               without any has no row);
       _step_cgrp(part, pid, tid, domain, pattern, work)  GPU work launched inside a range group's ranges.
    With `steps_only` (the caller reads the chosen steps, not the groups' GPU work or depth), the last three, which only
    the automatic choice reads, are left empty where no scope makes that choice: with a `marker`, or with ProfilerStep
    ranges in every scope. They were most of the statement's work (4 ranks of 250,000 steps and 2 M kernels: 5.4 of
    6.2 s).
    The two containment joins (depth, cgrp) read temp tables in statements that name no CTE, so DuckDB runs them
    as IEJoins (containment.py): near-linear in the ranges of a thread, not quadratic.
    scopes: (part, pid) with pid None for 'every process of the profile'; projected: parts with a GPU projection."""
    ranges = stack(traces, "markers", "pid, tid, start_ns, end_ns, name, domain, kind",
                   f"kind IN ({RANGE_KINDS_SQL}) AND pid IS NOT NULL AND tid IS NOT NULL")
    calls = stack(traces, "api_calls", "pid, tid, correlation_id, start_ns, end_ns", "pid IS NOT NULL AND tid IS NOT NULL")
    more = ", device_id, start_ns, end_ns" if detail else ""
    # No `correlation_id IS NOT NULL` on the ops (the join drops NULL ids): DuckDB guesses a filter keeps a fifth of the
    # rows, and 2 M ops guessed at 400 k became the hash side of their join with the calls, which then ran out of a
    # 64 MiB limit; unfiltered, the narrower calls' table is hashed.
    ops = (stack(traces, "kernels", f"rowid * 2 AS op_id, pid, correlation_id, dur_ns{more}")
           + " UNION ALL "
           + stack(traces, "memops", f"rowid * 2 + 1 AS op_id, pid, correlation_id, dur_ns{more}"))
    inputs = f"""
        WITH scope(part, pid) AS ({values(scopes, ('BIGINT', 'BIGINT'))}),
        proj(part) AS ({values([(p,) for p in projected], ("BIGINT",))}),
        m AS ({ranges}),
        a AS ({calls}),
        thr AS (SELECT part, pid, tid, (row_number() OVER (ORDER BY part, pid, tid) - 1)::HUGEINT AS k FROM (
                    SELECT DISTINCT part, pid, tid FROM m UNION SELECT DISTINCT part, pid, tid FROM a)),
        xt AS ({stack(traces, "nvtx_cross_thread", "pid, tid, start_ns")}),
        rng AS (SELECT *, dense_rank() OVER (ORDER BY part, pid, tid, domain, pattern) AS gid FROM (
            SELECT row_number() OVER (PARTITION BY m.part ORDER BY m.pid, m.tid, m.start_ns, m.end_ns DESC, m.name, m.domain, m.kind) AS rid,
                   m.part, m.pid, m.tid, m.start_ns, m.end_ns, m.name, coalesce(m.domain, '') AS domain,
                   {normalised_sql('m.name')} AS pattern,
                   m.kind = 'start_end' AND EXISTS (SELECT 1 FROM xt WHERE xt.part = m.part AND xt.pid = m.pid AND xt.tid = m.tid
                                                    AND xt.start_ns = m.start_ns) AS cross_thread,
                   thr.k * {SHIFT} + m.start_ns AS ks, thr.k * {SHIFT} + m.end_ns AS ke
            FROM m JOIN _step_thr thr USING (part, pid, tid))),
        launch AS ({launch_sql("SELECT * FROM a WHERE part IN (SELECT part FROM proj)", "part, pid",
                               calls_unique([traces[p] for p in projected]))}),
        call AS (
            SELECT l.part, l.pid, l.correlation_id, thr.k * {SHIFT} + l.start_ns AS ks, thr.k * {SHIFT} + l.end_ns AS ke
            FROM launch l JOIN _step_thr thr ON thr.part = l.part AND thr.pid = l.pid AND thr.tid = l.tid),
        gop AS (  -- over `call` as the temp table _step_call (containment.temp_table_after)
            SELECT o.part, o.op_id, o.pid, o.dur_ns, c.ks, c.ke{
                   ", o.op_id % 2 = 0 AS kernel, o.device_id, o.start_ns, o.end_ns" if detail else ""}
            FROM ({ops}) o JOIN _step_call c ON c.part = o.part AND c.pid = o.pid AND c.correlation_id = o.correlation_id)"""
    # The IEJoin works on the first two conditions: containment itself. Each thread has its own key range, so no
    # pair of two threads (or profiles) passes both; rid, numbered per profile, only orders a thread's own ranges.
    joins = """
        WITH depth AS (SELECT c.part, c.rid, count(*) AS depth
                       FROM _step_rng c JOIN _step_rng p ON p.ks <= c.ks AND c.ke <= p.ke AND p.rid < c.rid
                       GROUP BY c.part, c.rid),
        cgrp AS (SELECT r.part, r.pid, r.tid, r.domain, r.pattern, w.work
                 FROM (SELECT gid, sum(dur_ns) AS work FROM (
                           SELECT DISTINCT r.gid, g.op_id, g.dur_ns
                           FROM _step_rng r JOIN _step_gop g ON r.ks <= g.ks AND g.ke <= r.ke
                           WHERE NOT r.cross_thread) GROUP BY gid) w
                 JOIN (SELECT DISTINCT gid, part, pid, tid, domain, pattern FROM _step_rng) r USING (gid))"""
    cur = cursor(traces)
    try:
        # The threads are a table before anything joins them: as the CTE, their number is guessed from the calls' (a
        # DISTINCT over 2 M rows is guessed at 400 k), so the calls became the hash side of that join and it ran out of a
        # 64 MiB limit; as a table, the few threads are hashed. _step_rng's gid numbers the range groups, so the GPU
        # work per group is a DISTINCT over integers, not over the groups' names (which ran out of that limit too).
        with temp_tables(cur, inputs, {"_step_scope": "scope", "_step_proj": "proj", "_step_thr": "thr", "_step_rng": "rng"}):
            if steps_only and (marker or not cur.execute(_AUTOMATIC_SQL).fetchone()[0]):
                with temp_tables(cur, _UNUSED_INPUTS, {"_step_gop": "gop", "_step_depth": "depth", "_step_cgrp": "cgrp"}):
                    yield cur
                return
            with temp_table_after(cur, inputs, "_step_gop", "gop", {"_step_call": "call"}), \
                    temp_tables(cur, joins, {"_step_depth": "depth", "_step_cgrp": "cgrp"}):
                yield cur
    finally:
        cur.close()


# Whether some scope makes the automatic choice (choice_sql's `rep`): one without ranges of the ProfilerStep#<N> group.
_AUTOMATIC_SQL = """
    SELECT EXISTS (SELECT 1 FROM _step_scope s WHERE NOT EXISTS (
        SELECT 1 FROM _step_rng r WHERE r.part = s.part AND (s.pid IS NULL OR s.pid = r.pid) AND r.end_ns > r.start_ns
        AND r.pattern = 'ProfilerStep#<N>'))"""
# choice_tables' automatic-choice inputs, empty and typed as it makes them.
_UNUSED_INPUTS = """
    WITH gop AS (SELECT NULL::INTEGER AS part, NULL::BIGINT AS op_id, NULL::BIGINT AS pid, NULL::BIGINT AS dur_ns,
                        NULL::HUGEINT AS ks, NULL::HUGEINT AS ke WHERE FALSE),
    depth AS (SELECT NULL::INTEGER AS part, NULL::BIGINT AS rid, NULL::BIGINT AS depth WHERE FALSE),
    cgrp AS (SELECT NULL::INTEGER AS part, NULL::BIGINT AS pid, NULL::BIGINT AS tid, NULL::VARCHAR AS domain,
                    NULL::VARCHAR AS pattern, NULL::HUGEINT AS work WHERE FALSE)"""


def run_choice(traces: list[Trace], scopes: list[tuple[int, int | None]], projected: list[int], marker: bool,
               globbed: bool, select: str, params: dict | None) -> pd.DataFrame:
    """The rows of `select` (a statement reading choice_sql's chosen steps, not its range groups) over the step choice
    of `scopes` (choice_tables' arguments; marker, globbed: choice_sql's), as one frame: a job's steps may number
    millions."""
    with choice_tables(traces, scopes, projected, steps_only=True, marker=marker) as cur:
        sql = choice_sql(marker, globbed) + select
        return (cur.execute(sql, params) if params else cur.execute(sql)).df()


def marker_params(traces: list[Trace], marker: str | None, parts: set[int] | None = None) -> dict:
    """The parameters choice_sql's `marker` and `globbed` read: the marker, and for a glob (`*?[`) the range names of
    `parts` (None: every profile) it matches (fnmatch, case-sensitive), found in one statement."""
    if not marker:
        return {}
    params: dict = {"marker": marker}
    if any(ch in marker for ch in "*?["):
        names = run(traces, f"""SELECT DISTINCT name FROM ({stack(traces, 'markers', 'name',
                    f'kind IN ({RANGE_KINDS_SQL}) AND pid IS NOT NULL AND tid IS NOT NULL AND name IS NOT NULL', parts)})""")
        params["names"] = [n for (n,) in names if fnmatch.fnmatchcase(n, marker)]
    return params


def scope_steps(traces: list[Trace], scopes: list[tuple[int, int | None]], marker: str | None) -> dict[tuple, pd.DataFrame]:
    """(part, scope pid) -> the scope's steps, one row each (STEP_COLUMNS) in time order per (process, thread), chosen by
    the iterations tool's rules for every scope in one statement (plus, for a glob marker, one for the range names it
    matches). A scope whose profile has no capture span, or without steps, has no entry (as iterations)."""
    timed = sorted({(part, pid) for part, pid in scopes if traces[part].meta_int("capture_start_ns") is not None
                    and traces[part].meta_int("capture_end_ns") is not None}, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    if not timed:
        return {}
    projected = sorted({part for part, _ in timed if projection_absent_reason(traces[part]) is None})
    params = marker_params(traces, marker)
    # Each step carries its scope's position in `timed` (k): a scope of every process has no pid to key it by.
    steps = run_choice(traces, timed, projected, bool(marker), "names" in params, f"""
            SELECT sc.k, {', '.join(f's.{c}' for c in STEP_COLUMNS)}
            FROM stepped s JOIN ({values([(k, part, pid) for k, (part, pid) in enumerate(timed)], ('BIGINT', 'BIGINT', 'BIGINT'))})
                 sc(k, part, pid) ON sc.part = s.part AND sc.pid IS NOT DISTINCT FROM s.upid
            ORDER BY sc.k, s.pid, s.tid, s.start_ns, s.rid""", params or None)
    return {timed[k]: rows.drop(columns="k").reset_index(drop=True) for k, rows in steps.groupby("k", sort=False)}
