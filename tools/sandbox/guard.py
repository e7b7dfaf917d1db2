"""What user SQL may be: exactly one read-only SELECT, decided by DuckDB's own parser.

A statement passes when DuckDB parses it as one SELECT (with CTEs, set operations, FROM-first,
DESCRIBE/SHOW/SUMMARIZE, which DuckDB rewrites to SELECTs) that json_serialize_sql can serialise,
or as EXPLAIN / EXPLAIN ANALYZE of such a SELECT. The parsed tree, not the text, is then checked for
functions that read files or run nested SQL. This is the second layer: the statement runs in the
sandbox process on a connection that cannot open files whatever it says.
No regular expression ever runs over the user's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

# Functions that read files, run SQL given as text, or change state. Names, not patterns: compared
# case-insensitively with the function names in the parsed tree.
DENIED_PREFIXES = ("sqlite_", "read_", "parquet_", "iceberg_", "delta_", "load_", "install_", "postgres_", "mysql_")
DENIED_NAMES = {
    "query", "query_table", "glob", "sniff_csv", "json_execute_serialized_sql", "checkpoint", "force_checkpoint",
    "getenv", "delta_scan", "iceberg_scan", "parquet_scan", "duckdb_secrets", "which_secret", "attach", "detach",
    "pragma_database_size",
}


class Refused(Exception):
    """The statement is not allowed; str(exc) says why and what to do instead."""


@dataclass
class Checked:
    sql: str                                   # the statement gpuscope will run (EXPLAIN rebuilt by us)
    tables: set[tuple[str, str]] = field(default_factory=set)  # (schema, table) of every base table named
    functions: set[str] = field(default_factory=set)


def check(con: duckdb.DuckDBPyConnection, sql: str) -> Checked:
    if not isinstance(sql, str) or not sql.strip():
        raise Refused("empty SQL. Example: SELECT short_name, count(*) FROM kernels GROUP BY 1 ORDER BY 2 DESC")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise Refused(f"SQL does not parse: {first_line(exc)}") from None
    if len(statements) != 1:
        raise Refused(f"send exactly one statement (got {len(statements)}); split them into separate calls.")
    stmt = statements[0]
    kind = stmt.type.name
    if kind == "EXPLAIN":
        analyze, inner = _explain_parts(stmt.query)
        checked = check(con, inner)
        if checked.sql.lstrip()[:7].upper() == "EXPLAIN":
            raise Refused("EXPLAIN of an EXPLAIN is not allowed; explain the SELECT itself.")
        checked.sql = ("EXPLAIN ANALYZE " if analyze else "EXPLAIN ") + checked.sql
        return checked
    if kind != "SELECT":
        raise Refused(f"only read-only SELECT / WITH queries (and EXPLAIN, DESCRIBE, SHOW, SUMMARIZE) are allowed; got {kind}. "
                      "The profile and the trace model cannot be modified.")
    tree = _serialise(con, stmt.query)
    checked = Checked(sql=stmt.query)
    _walk(tree, checked)
    for name in sorted(checked.functions):
        low = name.lower()
        if low in DENIED_NAMES or low.startswith(DENIED_PREFIXES):
            raise Refused(f"function {name}() is not allowed in sql_query: it reads files or runs nested SQL. "
                          "Query the model tables or native.<table> instead.")
    return checked


def _serialise(con: duckdb.DuckDBPyConnection, sql: str) -> dict:
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    except duckdb.Error as exc:
        raise Refused(f"SQL cannot be checked: {first_line(exc)}. Simplify the query (one SELECT over the model tables).") from None
    if tree.get("error"):
        # PRAGMA and CALL forms parse as SELECT-like statements but are not plain queries.
        raise Refused("only plain SELECT queries can run here (this statement is a PRAGMA/CALL or another form that is "
                      f"not a query: {tree.get('error_message', 'not serialisable')}). Use list_tables / describe_table for "
                      "the schema.")
    return tree


def _walk(node: Any, out: Checked) -> None:
    if isinstance(node, dict):
        if node.get("type") == "BASE_TABLE" and isinstance(node.get("table_name"), str):
            out.tables.add((str(node.get("schema_name") or ""), node["table_name"]))
        name = node.get("function_name")
        if isinstance(name, str):
            out.functions.add(name)
        for v in node.values():
            _walk(v, out)
    elif isinstance(node, list):
        for v in node:
            _walk(v, out)


def _explain_parts(sql: str) -> tuple[bool, str]:
    """(analyze?, the explained statement's text) of an EXPLAIN, found with DuckDB's tokenizer."""
    tokens = duckdb.tokenize(sql)
    if not tokens:
        raise Refused("EXPLAIN without a statement.")
    words = [(pos, sql[pos:tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)].strip()) for i, (pos, _) in enumerate(tokens)]
    i = 1  # words[0] is EXPLAIN
    analyze = False
    if i < len(words) and words[i][1].upper() == "ANALYZE":
        analyze, i = True, i + 1
    elif i < len(words) and words[i][1].startswith("("):
        depth = 0
        while i < len(words):
            text = words[i][1]
            if text.upper().startswith("ANALYZE"):
                analyze = True
            depth += text.count("(") - text.count(")")
            i += 1
            if depth <= 0:
                break
    if i >= len(words):
        raise Refused("EXPLAIN without a statement to explain.")
    return analyze, sql[words[i][0]:]


MAX_MESSAGE_CHARS = 500


def first_line(exc: Exception) -> str:
    """The first line of a DuckDB error, cut to MAX_MESSAGE_CHARS: errors quote the query's own text (a 60 KB
    identifier came back whole)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if len(line) > MAX_MESSAGE_CHARS:
        line = f"{line[:MAX_MESSAGE_CHARS]}… ({len(line) - MAX_MESSAGE_CHARS:,} more characters)"
    return line
