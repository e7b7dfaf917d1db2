"""Bad values in the trace model: how readers record them, and the model check every profile passes.

A reader never drops or corrects a source row silently: it counts, with SQL over its source, the rows
it leaves out of a model table ('skipped') or keeps with a corrected value ('repaired') and records
the counts in `data_issues` (schema.sql) with `record`. After the reader, `check_model` guarantees
what every tool assumes - dur_ns = end_ns - start_ns >= 0 in every table with durations - by
repairing and counting any row that breaks it: a reader bug shows up in data_issues, not as a
traceback or a negative figure.

The same holds for the delays tools derive from a GPU op and its launching call (the earliest API
call of its process with its correlation id): a GPU op cannot start before that call starts, so one
that does is a wrong pairing or clocks out of step; check_model removes that link and counts it. A
GPU op may well start before its call returns (the host was inside a synchronous call: a pageable or
synchronous copy, a launch that blocked) - no damage, but GPU start - call end is then negative and
no delay: check_model states how many such ops there are in a warning, and the tools that report
launch delays leave them out and say so.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

import duckdb

from .quote import quote_ident, quote_literal

DURATION_TABLES = ("kernels", "memops", "api_calls", "markers", "cpu_ops")

# Reasons shared by the readers, so one kind of damage reads the same in every format.
END_BEFORE_START = "end before start: end set to start (duration 0)"
TIME_MISSING = "start or end time is missing or not an integer"

_BIGINT_MAX = 2**63 - 1
# Longest name kept whole. Real kernel names, template arguments and all, stay below ~20k characters;
# a name of megabytes is damage, and every tool that matches, groups or prints it would pay for all
# of it on every call (ops_summary's category regexes took 20 s on one 10 MB kernel name).
MAX_NAME_CHARS = 65_536
NAME_COLUMNS = (("kernels", "name"), ("kernels", "short_name"), ("api_calls", "name"), ("markers", "name"),
                ("cpu_ops", "name"))

GPU_OP_TABLES = ("kernels", "memops")
# trace_meta key: 'true' when no two api_calls rows share (pid, correlation_id), both known ('false' otherwise).
CORRELATION_IDS_UNIQUE = "correlation_ids_unique"
LAUNCH_BEFORE_CALL = ("model check: GPU op starts before its launching API call starts (wrong pairing or clocks out of step): "
                      "link to the call removed (correlation_id and tid set to NULL, launched = false)")
# The launching call of each (process, correlation id), as the tools pair them: the first by (start, end, name).
# Plain min() aggregates of fixed-size values, which spill: arg_min over names cannot (it ran out of a 64 MiB limit
# at 2 M calls), and a window over every call held ~400 MB beyond the memory limit at 10 M calls. (start, end) is
# packed into one HUGEINT that sorts as the pair does; the first call's name is looked up for the early ops only.
_FIRST_CALL = """SELECT pid, correlation_id, call_start,
                         (first_key - call_start::HUGEINT * 18446744073709551616 - 9223372036854775808)::BIGINT AS call_end
                  FROM (SELECT pid, correlation_id, min(start_ns) AS call_start,
                               min(start_ns::HUGEINT * 18446744073709551616 + (end_ns::HUGEINT + 9223372036854775808)) AS first_key
                        FROM api_calls WHERE pid IS NOT NULL AND correlation_id IS NOT NULL GROUP BY pid, correlation_id)"""


def native_table_name(table: str) -> str:
    """How data_issues names a profile's own table whose cells a reader changed (as sql_query names it)."""
    return f"native.{quote_ident(table)}"


def native_table_of(shown: str) -> str | None:
    """The profile's own table a data_issues table_name names (native_table_name's inverse); None for a model table."""
    if len(shown) > 9 and shown.startswith('native."') and shown.endswith('"'):
        return shown[8:-1].replace('""', '"')
    return None


def read_from(fmt: str, model_tables: Iterable[str]) -> Callable[[str], bool]:
    """Whether a profile's own table (its name in the file) is one that the `fmt` reader reads any of `model_tables`
    from: its module's NATIVE_SOURCES, by the table's name less a rocpd process suffix. A cell the reader repaired in
    such a table stands behind those tables' rows (a kernel's name of invalid UTF-8 comes from StringIds)."""
    from .detect import FORMAT_NAMES, unsuffixed

    # Kineto's reader declares none (no native tables); a name that is no reader (a caller's mistake) reads nothing
    reader = importlib.import_module(f"{__package__}.readers.{fmt}") if fmt in FORMAT_NAMES else None
    sources = getattr(reader, "NATIVE_SOURCES", {})
    wanted = {s for t in model_tables for s in sources.get(t, ())}
    return lambda native: unsuffixed(native) in wanted


def record(con: duckdb.DuckDBPyConnection, rows: Iterable[tuple[str, str, int, str]]) -> None:
    """Add (table_name, action, rows, reason) counts to data_issues: zero counts are left out and a
    reason already recorded for the table has its count raised (a few rows, never one per event)."""
    for table, action, n, reason in rows:
        if not n:
            continue
        if action not in ("skipped", "repaired"):
            raise ValueError(f"data_issues action must be 'skipped' or 'repaired', not {action!r}")
        updated = con.execute(
            "UPDATE data_issues SET rows = rows + ? WHERE table_name = ? AND action = ? AND reason = ?",
            [int(n), table, action, reason]).fetchone()[0]
        if not updated:
            con.execute("INSERT INTO data_issues VALUES (?, ?, ?, ?)", [table, action, int(n), reason])


def record_query(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> None:
    """Record the (table_name, action, rows, reason) rows a counting query over the source returns."""
    record(con, con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall())


def count_sql(table: str, source: str, checks: list[tuple[str, str, str]]) -> str:
    """A query for record_query: rows of `source` counted by the first check they fail. Each check is
    (SQL condition, action, reason); list them in the order the reader applies them, so that a row
    with several faults is counted once, under the fault that decided its fate."""
    def case(pick: int) -> str:
        return "CASE " + " ".join(f"WHEN {c[0]} THEN {quote_literal(c[pick])}" for c in checks) + " END"

    return (f"SELECT {quote_literal(table)}, action, count(*), reason FROM "
            f"(SELECT {case(1)} AS action, {case(2)} AS reason FROM {source}) "
            "WHERE reason IS NOT NULL GROUP BY ALL ORDER BY 2, 4")


def time_checks(start: str = "start", end: str = '"end"') -> list[tuple[str, str, str]]:
    """The checks every interval row of a SQLite source gets: times present, end not before start."""
    return [(f"{start} IS NULL OR {end} IS NULL", "skipped", TIME_MISSING),
            (f"{end} < {start}", "repaired", END_BEFORE_START)]


def check_model(con: duckdb.DuckDBPyConnection) -> None:
    """Repair and count rows of the duration tables that break dur_ns = end_ns - start_ns >= 0.

    Readers repair what they know to be wrong before this runs, so every count here is a reader bug
    (or a source value no reader anticipated); the reasons say so. end_ns - start_ns of two extreme
    BIGINTs does not fit a BIGINT: such rows are found without computing it (CASE evaluates its
    branches only for the rows that reach them) and left out."""
    too_long = f"CASE WHEN start_ns < 0 THEN end_ns > {_BIGINT_MAX} + start_ns ELSE false END"
    wrong_dur = f"CASE WHEN end_ns < start_ns OR {too_long} THEN false ELSE dur_ns <> end_ns - start_ns END"
    counts = con.execute(" UNION ALL ".join(
        f"""SELECT '{t}', count(*) FILTER (WHERE end_ns < start_ns), count(*) FILTER (WHERE {wrong_dur}),
                   count(*) FILTER (WHERE {too_long}) FROM {t}""" for t in DURATION_TABLES)).fetchall()
    _cut_long_names(con)
    for table, backwards, wrong, long in counts:
        if wrong:
            con.execute(f"UPDATE {table} SET dur_ns = end_ns - start_ns WHERE {wrong_dur}")
        if backwards:
            con.execute(f"UPDATE {table} SET end_ns = start_ns, dur_ns = 0 WHERE end_ns < start_ns")
        if long:
            con.execute(f"DELETE FROM {table} WHERE {too_long}")
        record(con, [
            (table, "repaired", backwards, "model check: end before start, not repaired by the reader: end set to start (duration 0)"),
            (table, "repaired", wrong, "model check: dur_ns was not end_ns - start_ns (reader error): dur_ns recomputed"),
            (table, "skipped", long, "model check: end_ns - start_ns exceeds the 64-bit ns range: row left out"),
        ])
    _check_launches(con)


def _check_launches(con: duckdb.DuckDBPyConnection) -> None:
    # The first calls are grouped once (a temp table: it spills), for the repair of each GPU op table and the count
    # of the ops that start inside their call; grouping them per statement took three passes over every call.
    con.execute(f"CREATE OR REPLACE TEMP TABLE _first_call AS {_FIRST_CALL}")
    try:
        # One call per (process, correlation id), as CUPTI makes them: then each call is its pair's launching call and
        # the tools take it as is instead of ranking the calls of every pair (op_tree's launch: a window over all calls).
        unique = con.execute("""SELECT (SELECT count(*) FROM _first_call) =
                                       (SELECT count(*) FROM api_calls WHERE pid IS NOT NULL AND correlation_id IS NOT NULL)""").fetchone()[0]
        con.execute("INSERT INTO trace_meta VALUES (?, ?)", [CORRELATION_IDS_UNIQUE, str(bool(unique)).lower()])
        # One join of the GPU ops with their pairs' first calls counts, per table, the ops starting before the call (the
        # repair) and inside it (the warning). A profile usually has none of the first, often none of the second: the
        # repair's UPDATE and the warning's grouped query, each another join of every op, run only where there are some.
        tagged = " UNION ALL ".join(f"SELECT {i} AS t, pid, correlation_id, start_ns FROM {t}" for i, t in enumerate(GPU_OP_TABLES))
        counts = {t: (before, inside) for t, before, inside in con.execute(
            f"""SELECT t, count(*) FILTER (WHERE g.start_ns < c.call_start),
                       count(*) FILTER (WHERE g.start_ns >= c.call_start AND g.start_ns < c.call_end)
                FROM ({tagged}) g JOIN _first_call c USING (pid, correlation_id) GROUP BY t""").fetchall()}
        for i, table in enumerate(GPU_OP_TABLES):
            if counts.get(i, (0, 0))[0]:
                n = con.execute(
                    f"""UPDATE {table} SET correlation_id = NULL, tid = NULL, launched = false FROM _first_call c
                        WHERE {table}.pid = c.pid AND {table}.correlation_id = c.correlation_id AND {table}.start_ns < c.call_start"""
                ).fetchone()[0]
                record(con, [(table, "repaired", n, LAUNCH_BEFORE_CALL)])
        union = " UNION ALL ".join(f"SELECT pid, correlation_id, start_ns FROM {t}" for t in GPU_OP_TABLES)
        early = [] if not any(inside for _, inside in counts.values()) else con.execute(
            f"""WITH e AS (SELECT pid, correlation_id, c.call_start, c.call_end, count(*) AS n
                           FROM ({union}) g JOIN _first_call c USING (pid, correlation_id)
                           WHERE g.start_ns < c.call_end GROUP BY ALL),
                     named AS (SELECT min(a.name) AS call_name, any_value(e.n) AS n
                               FROM e JOIN api_calls a ON a.pid = e.pid AND a.correlation_id = e.correlation_id
                                    AND a.start_ns = e.call_start AND a.end_ns = e.call_end
                               GROUP BY e.pid, e.correlation_id)
                SELECT call_name, sum(n)::BIGINT AS n, sum(sum(n)) OVER ()::BIGINT AS total FROM named GROUP BY 1 ORDER BY 2 DESC, 1"""
        ).fetchall()
    finally:
        con.execute("DROP TABLE IF EXISTS temp.main._first_call")
    if early:
        names = ", ".join(f"{name} {n}" for name, n, _ in early[:5]) + (", ..." if len(early) > 5 else "")
        con.execute("INSERT INTO trace_meta VALUES ('warning', ?)", [
            f"{int(early[0][2])} GPU operations (kernels, copies, sets) started before their launching call returned ({names}): "
            "the host was still inside a synchronous call (a pageable or synchronous copy, a launch that blocked), so GPU start "
            "- call end is negative for them and is no launch delay; launch-delay figures leave them out."])


def _cut_long_names(con: duckdb.DuckDBPyConnection) -> None:
    """Cut names longer than MAX_NAME_CHARS to that length, ending in '…', and count the rows."""
    counts = con.execute(" UNION ALL ".join(
        f"SELECT {quote_literal(t)}, {quote_literal(c)}, count(*) FROM {t} WHERE length({c}) > {MAX_NAME_CHARS}" for t, c in NAME_COLUMNS)).fetchall()
    for table, column, n in counts:
        if n:
            con.execute(f"UPDATE {table} SET {column} = left({column}, {MAX_NAME_CHARS - 1}) || '…' "
                        f"WHERE length({column}) > {MAX_NAME_CHARS}")
            record(con, [(table, "repaired", n, f"{column} longer than {MAX_NAME_CHARS} characters: cut to that length")])
