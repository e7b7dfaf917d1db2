"""sql_query, list_tables, describe_table: read-only SQL over the trace model and native tables.

Safety comes in layers: the connection itself has external access disabled and its
configuration locked once the profile is loaded (no file reads, ATTACH, COPY, INSTALL/LOAD or
SET); a query must be exactly one SELECT (or EXPLAIN of one); functions that open other files
through the SQLite scanner (which ignores the external-access switch) are refused by walking the
parsed query; a timer interrupts long queries; rows and characters are capped.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import re
import threading
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import MODEL_TABLES, SCHEMA_SQL, Trace

MAX_ROWS = 1000
MAX_CHARS = 15_000       # JSON characters of the rows; keeps a result well under host output caps
MAX_CELL_CHARS = 400
DENIED_FUNCTIONS = re.compile(
    r"^(sqlite_\w+|query|query_table|read_\w+|glob|sniff_csv|parquet_\w+|iceberg_\w+|delta_scan|"
    r"json_execute_serialized_sql|load_\w+|install_\w+|checkpoint|force_checkpoint|getenv)$", re.I)


class SqlResult(BaseModel):
    trace: str
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="rows returned here")
    truncated: bool = Field(description="true when more rows exist (row or character cap reached)")
    hint: str | None = None


class TableInfo(BaseModel):
    table: str = Field(description="name to use in SQL")
    rows: int | None = Field(description="row count (null when the native table cannot be scanned)")
    description: str | None = None


class TablesResult(BaseModel):
    trace: str
    model_tables: list[TableInfo] = Field(description="the normalised trace model (same for every format)")
    native_tables: list[TableInfo] = Field(description="the profile's own tables, read-only, as catalog `native`")
    note: str


class ColumnInfo(BaseModel):
    name: str
    type: str
    description: str | None = None


class DescribeResult(BaseModel):
    trace: str
    table: str
    rows: int
    columns: list[ColumnInfo]
    sample: list[list[Any]] = Field(description="up to 3 rows")


def sql_query(trace: Trace, sql: str, limit: int = 100, timeout_s: float = 10.0) -> SqlResult:
    limit = max(1, min(int(limit), MAX_ROWS))
    check_query(trace, sql)
    cur = trace.con.cursor()
    timer = threading.Timer(timeout_s, cur.interrupt)
    timer.start()
    try:
        res = cur.execute(sql)
        columns = [d[0] for d in res.description] if res.description else []
        raw = res.fetchmany(limit + 1)
    except duckdb.InterruptException:
        raise ProfileError(f"query stopped after the {timeout_s:g} s time limit. Aggregate more (GROUP BY) or filter "
                           "(WHERE device_id = ..., start_ns BETWEEN ...) so it finishes sooner.") from None
    except duckdb.ParserException as exc:
        # The query itself parsed in check_query, so this comes from a native SQLite view whose SQL
        # DuckDB cannot parse (rocpd writes its views with backtick quoting).
        raise ProfileError(f"a native SQLite view of this profile cannot be read by DuckDB ({str(exc).strip()}). "
                           "Query the model tables or the native tables list_tables shows instead.") from None
    except duckdb.Error as exc:
        raise ProfileError(f"SQL error: {str(exc).strip()}. Call list_tables / describe_table for table and column names.") from None
    finally:
        timer.cancel()
        cur.close()
    truncated = len(raw) > limit
    rows = [[_jsonable(v) for v in r] for r in raw[:limit]]
    size, kept = 0, []
    for r in rows:
        size += len(json.dumps(r, default=str)) + 1
        if size > MAX_CHARS:
            truncated = True
            break
        kept.append(r)
    hint = None
    if truncated:
        hint = (f"showing {len(kept)} rows; more exist. Aggregate, add WHERE/LIMIT/OFFSET, select fewer columns, "
                f"or raise limit (max {MAX_ROWS}; output is also capped at {MAX_CHARS} characters)")
    return SqlResult(trace=str(trace.path), columns=columns, rows=kept, row_count=len(kept), truncated=truncated, hint=hint)


def check_query(trace: Trace, sql: str) -> None:
    """Refuse anything but one read-only SELECT that reads only this profile."""
    if not sql or not sql.strip():
        raise ProfileError("empty SQL. Example: SELECT short_name, count(*) FROM kernels GROUP BY 1 ORDER BY 2 DESC")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ProfileError(f"SQL does not parse: {str(exc).strip()}") from None
    if len(statements) != 1:
        raise ProfileError(f"send exactly one statement (got {len(statements)}); split them into separate calls.")
    kind = statements[0].type.name
    if kind not in ("SELECT", "EXPLAIN"):
        raise ProfileError(f"only read-only SELECT / WITH queries (and EXPLAIN, DESCRIBE, SHOW) are allowed; got {kind}. "
                           "The profile and the trace model cannot be modified.")
    body = statements[0].query
    if kind == "EXPLAIN":
        body = re.sub(r"^\s*EXPLAIN\s+(ANALYZE\s+)?", "", body, flags=re.I)
    for name in _function_names(trace, body):
        if DENIED_FUNCTIONS.match(name):
            raise ProfileError(f"function {name}() is not allowed in sql_query: it reads files or runs nested SQL. "
                               "Query the model tables or native.<table> instead.")


def _function_names(trace: Trace, sql: str) -> set[str]:
    cur = trace.con.cursor()
    try:
        tree = json.loads(cur.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    except duckdb.Error as exc:  # json_serialize_sql reports errors in its result; should it raise, say so plainly
        raise ProfileError(f"SQL cannot be checked: {str(exc).strip()}. Simplify the query (one SELECT over the model tables).") from None
    finally:
        cur.close()
    if tree.get("error"):
        # DESCRIBE/SHOW/PRAGMA forms do not serialise; fall back to a lexical scan of call sites.
        return {m.group(1) for m in re.finditer(r"([A-Za-z_][\w]*)\s*\(", sql)}
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "function_name" and isinstance(v, str):
                    names.add(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    return names


def list_tables(trace: Trace) -> TablesResult:
    docs = table_docs()
    model = [TableInfo(table=t, rows=trace.count(t), description=docs.get(t, ("", {}))[0]) for t in MODEL_TABLES]
    native = []
    for (name,) in trace.sql(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'native' ORDER BY table_name"):
        try:
            rows = int(trace.scalar(f'SELECT count(*) FROM native."{name}"'))
        except duckdb.Error:
            rows = None
        native.append(TableInfo(table=f'native."{name}"', rows=rows))
    return TablesResult(
        trace=str(trace.path), model_tables=model, native_tables=native,
        note="Times are integer ns. Prefer the model tables: they are the same for every format. "
             "Native tables with rows=null hold bytes DuckDB cannot decode; the model has their content.",
    )


def describe_table(trace: Trace, table: str) -> DescribeResult:
    name = table.strip()
    if name.lower() in MODEL_TABLES:
        ref, key = name.lower(), name.lower()
    else:
        bare = name.split(".", 1)[1] if name.lower().startswith("native.") else name
        bare = bare.strip('"')
        known = {n for (n,) in trace.sql("SELECT table_name FROM duckdb_tables() WHERE database_name = 'native'")}
        if bare not in known:
            raise ProfileError(f"unknown table {table!r}. Model tables: {', '.join(MODEL_TABLES)}; "
                               "list_tables shows the native ones.")
        ref, key = f'native."{bare}"', None
    cur = trace.con.cursor()
    try:
        res = cur.execute(f"SELECT * FROM {ref} LIMIT 3")
        cols = [(d[0], str(d[1])) for d in res.description]
        sample = [[_jsonable(v) for v in r] for r in res.fetchall()]
        rows = int(cur.execute(f"SELECT count(*) FROM {ref}").fetchone()[0])
    except duckdb.Error as exc:
        raise ProfileError(f"table {table!r} cannot be read: {str(exc).strip()}") from None
    finally:
        cur.close()
    col_docs = table_docs().get(key, ("", {}))[1] if key else {}
    return DescribeResult(trace=str(trace.path), table=ref, rows=rows, sample=sample,
                          columns=[ColumnInfo(name=n, type=t, description=col_docs.get(n)) for n, t in cols])


@lru_cache(maxsize=1)
def table_docs() -> dict[str, tuple[str, dict[str, str]]]:
    """Table and column descriptions, parsed from the comments of schema.sql (the one source)."""
    docs: dict[str, tuple[str, dict[str, str]]] = {}
    pending: list[str] = []
    table = None
    for line in SCHEMA_SQL.splitlines():
        s = line.strip()
        m = re.match(r"CREATE TABLE (\w+)", s)
        if m:
            table = m.group(1)
            docs[table] = (" ".join(pending), {})
            pending = []
        elif s.startswith("--"):
            if table is None:
                pending.append(s[2:].strip())
        elif s.startswith(");"):
            table = None
        elif table and "--" in s:
            code, comment = s.split("--", 1)
            for col in re.findall(r"(\w+)\s+(?:BIGINT|INTEGER|VARCHAR|BOOLEAN|DOUBLE)", code):
                docs[table][1][col] = comment.strip()
        if not s:
            pending = [] if table is None else pending
    return docs


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return v if len(v) <= MAX_CELL_CHARS else v[: MAX_CELL_CHARS - 1] + "…"
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", errors="replace")[:MAX_CELL_CHARS]
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time, _dt.timedelta, uuid.UUID, Path)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)
