"""sql_query, list_tables, describe_table: read-only SQL over the trace model and native tables.

User SQL never runs in this process. tools/sandbox sends it to a worker process that opens the
profile's store read-only in a DuckDB instance with external access off, no extension loaded and
its configuration locked, under an address-space ceiling and a time limit (the worker is killed
past it). DuckDB's parser decides what the statement is: one SELECT (or EXPLAIN of one), checked
again on its parsed tree for file-reading functions (tools/sandbox/guard.py). Native tables that
the reader did not already copy into the store are copied the first time a query names one.
Rows and characters are capped.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import duckdb
from pydantic import BaseModel, Field

from .. import sandbox
from ..sandbox.cells import jsonable
from ..model.errors import ProfileError
from ..model.quote import quote_ident
from ..model.sqlite_source import connect_readonly, duck_type, lenient_text
from ..model.trace import MODEL_TABLES, SCHEMA_SQL, Trace
from .common import ToolResult, issue_note

MAX_ROWS = 1000
MAX_CHARS = 15_000       # JSON characters of the rows; keeps a result well under host output caps
MAX_CELL_CHARS = 400


class SqlResult(ToolResult):
    trace: str
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="rows returned here")
    truncated: bool = Field(description="true when more rows exist (row or character cap reached)")
    hint: str | None = None
    note: str | None = Field(None, description="how a bare table name was resolved when the profile has a table of "
                                               "the same name as a model table")
    data_issues: list[str] = Field(default_factory=list, description=(
        "cells of the profile's own (native) tables this query read that the reader had to change, as "
        "'N <table> rows repaired: \"column\": <what was done>'; the model tables' data_issues are in trace_info"))


class TableInfo(BaseModel):
    table: str = Field(description="name to use in SQL")
    bare_name: str | None = Field(None, description="the same table without the native. prefix, as the profiler's "
                                                    "documentation writes it (null when a model table has that name)")
    rows: int | None = Field(description="row count (null when it cannot be counted)")
    description: str | None = None


class TablesResult(ToolResult):
    trace: str
    model_tables: list[TableInfo] = Field(description="the normalised trace model (same for every format)")
    native_tables: list[TableInfo] = Field(description="the profile's own tables, read-only, under schema `native`")
    note: str


class ColumnInfo(BaseModel):
    name: str
    type: str
    description: str | None = None


class DescribeResult(ToolResult):
    trace: str
    table: str
    rows: int
    columns: list[ColumnInfo]
    sample: list[list[Any]] = Field(description="up to 3 rows")


def sql_query(trace: Trace, sql: str, limit: int = 100, timeout_s: float = 10.0) -> SqlResult:
    limit = max(1, min(int(limit), MAX_ROWS))
    reply = _run(trace, sql, limit, timeout_s)
    rows, truncated = reply["rows"], bool(reply["truncated"])
    hint = None
    if truncated:
        hint = (f"showing {len(rows)} rows; more exist. Aggregate, add WHERE/LIMIT/OFFSET, select fewer columns, "
                f"or raise limit (max {MAX_ROWS}; output is also capped at {MAX_CHARS} characters)")
    note = None
    if reply.get("shadowed"):
        names = ", ".join(reply["shadowed"])
        note = (f"{names}: the bare name is the gpuscope model table; the profile's own table of that name is "
                f"native.{quote_ident(reply['shadowed'][0])}")
    return SqlResult(trace=str(trace.path), columns=reply["columns"], rows=rows, row_count=len(rows),
                     truncated=truncated, hint=hint, note=note,
                     data_issues=[issue_note(*issue) for issue in reply.get("issues", [])])


def _run(trace: Trace, sql: str, limit: int, timeout_s: float) -> dict:
    if not isinstance(sql, str) or not sql.strip():
        raise ProfileError("empty SQL. Example: SELECT short_name, count(*) FROM kernels GROUP BY 1 ORDER BY 2 DESC")
    copied: set[str] = set()
    while True:
        request = {"plan": _plan(trace), "sql": sql, "limit": limit, "max_chars": MAX_CHARS, "max_cell": MAX_CELL_CHARS}
        reply = sandbox.ask(request, timeout_s)
        if "need" not in reply:
            break
        fresh = [t for t in reply["need"] if t not in copied]
        if not fresh:  # the worker keeps asking for what was copied: never loop
            raise ProfileError(f"native table(s) {', '.join(reply['need'])} could not be prepared for the query.")
        for table in fresh:
            _copy_native(trace, table)
            copied.add(table)
    if "refused" in reply:
        raise ProfileError(reply["refused"])
    if "error" in reply:
        kind = reply.get("kind")
        if kind == "OutOfMemoryException":
            raise ProfileError(f"the query needs more memory than sql_query may use ({reply['error']}). Aggregate or filter "
                               "more, or raise GPUSCOPE_SQL_MEMORY_LIMIT.")
        if kind == "internal":
            raise ProfileError(f"sql_query could not run this statement ({reply['error']}). Simplify it, or query the "
                               "model tables; please report it with the query.")
        raise ProfileError(f"SQL error: {reply['error']}. Call list_tables / describe_table for table and column names.")
    return reply


def _plan(trace: Trace) -> dict:
    """What the worker's catalog holds: the store, and the native tables copied so far."""
    cat = trace.native
    lazy = [t for t in cat.tables if t not in cat.in_model] if cat.source == "sqlite" else []
    files = {t: str(f) for t in lazy if (f := trace.store.native_file(t)).exists()}
    return {"store": str(trace.store.model_file), "model": list(MODEL_TABLES), "in_model": list(cat.in_model),
            "files": files, "views": cat.views, "lazy": lazy}


def _copy_native(trace: Trace, table: str) -> None:
    try:
        trace.store.copy_native(trace.path, table)
    except duckdb.OutOfMemoryException:
        raise ProfileError(f"native.{quote_ident(table)} is too large to copy within GPUSCOPE_MEMORY_LIMIT; query the model "
                           "tables instead, or raise the limit.") from None
    except duckdb.Error as exc:
        raise ProfileError(f"native.{quote_ident(table)} cannot be read from the profile ({str(exc).strip().splitlines()[0]}); "
                           "query the model tables instead.") from None


def list_tables(trace: Trace) -> TablesResult:
    docs = table_docs()
    model = [TableInfo(table=t, rows=trace.count(t), description=docs.get(t, ("", {}))[0]) for t in MODEL_TABLES]
    counts = trace.memo(("native_counts",), lambda: _native_counts(trace))
    model_names = set(MODEL_TABLES)
    native = [TableInfo(table=f"native.{quote_ident(name)}", rows=counts.get(name),
                        bare_name=None if name.lower() in model_names else name,
                        description=("gpuscope's view stacking " + ", ".join(trace.native.views[name])
                                     if name in trace.native.views else None))
              for name in [*sorted(trace.native.tables), *sorted(v for v in trace.native.views if v not in trace.native.tables)]]
    return TablesResult(
        trace=str(trace.path), model_tables=model, native_tables=native,
        note="Times are integer ns. Prefer the model tables: they are the same for every format. Native tables are "
             "the profile's own (native.\"X\", or bare X unless a model table has that name), read as stored (views inside the profile are never run; rocpd's are rebuilt by gpuscope "
             "from the tables they stack). The first query naming a large native table copies it, once.",
    )


def _native_counts(trace: Trace) -> dict[str, int | None]:
    counts: dict[str, int | None] = {}
    for name in trace.native.in_model:
        try:
            counts[name] = int(trace.scalar(f"SELECT count(*) FROM native.{quote_ident(name)}"))
        except duckdb.Error:
            counts[name] = None
    lazy = [t for t in trace.native.tables if t not in counts]
    if lazy:
        conn = connect_readonly(trace.path)
        try:
            for name in lazy:
                try:
                    counts[name] = int(conn.execute(f"SELECT count(*) FROM {quote_ident(name)}").fetchone()[0])
                except Exception:  # a damaged page: the count is unknown, not zero
                    counts[name] = None
        finally:
            conn.close()
    for view, parts in trace.native.views.items():
        vals = [counts.get(p) for p in parts]
        counts.setdefault(view, None if any(v is None for v in vals) else sum(vals))
    return counts


def describe_table(trace: Trace, table: str) -> DescribeResult:
    name = (table or "").strip()
    if name.lower() in MODEL_TABLES:
        key = name.lower()
        cur = trace.con.cursor()
        try:
            res = cur.execute(f"SELECT * FROM {key} LIMIT 3")
            cols = [(d[0], str(d[1])) for d in res.description]
            sample = [[sandbox_value(v) for v in r] for r in res.fetchall()]
            rows = trace.count(key)
        finally:
            cur.close()
        col_docs = table_docs().get(key, ("", {}))[1]
        return DescribeResult(trace=str(trace.path), table=key, rows=rows, sample=sample,
                              columns=[ColumnInfo(name=n, type=t, description=col_docs.get(n)) for n, t in cols])
    bare = _bare_native(name)
    found = trace.native.resolve(bare) if bare else None
    if found is None:
        raise ProfileError(f"unknown table {table!r}. Model tables: {', '.join(MODEL_TABLES)}; "
                           "list_tables shows the native ones.")
    ref = f"native.{quote_ident(found)}"
    if found in trace.native.in_model or found in trace.native.views or trace.native.source != "sqlite":
        described = _run(trace, f"DESCRIBE {ref}", MAX_ROWS, 30.0)
        sample = _run(trace, f"SELECT * FROM {ref} LIMIT 3", 3, 30.0)["rows"]
        rows = _run(trace, f"SELECT count(*) FROM {ref}", 1, 30.0)["rows"][0][0]
        columns = [ColumnInfo(name=r[0], type=str(r[1])) for r in described["rows"]]
        return DescribeResult(trace=str(trace.path), table=ref, rows=int(rows), columns=columns, sample=sample)
    # A native table not copied yet: read its schema and a sample from the profile, without copying it.
    conn = connect_readonly(trace.path)
    conn.text_factory = lenient_text
    try:
        info = conn.execute(f"PRAGMA table_info({quote_ident(found)})").fetchall()
        sample = [[sandbox_value(v) for v in r] for r in conn.execute(f"SELECT * FROM {quote_ident(found)} LIMIT 3").fetchall()]
        rows = int(conn.execute(f"SELECT count(*) FROM {quote_ident(found)}").fetchone()[0])
    except Exception as exc:
        raise ProfileError(f"table {table!r} cannot be read: {str(exc).strip()}") from None
    finally:
        conn.close()
    columns = [ColumnInfo(name=r[1], type=duck_type(r[2] or "") or "ANY") for r in info]
    return DescribeResult(trace=str(trace.path), table=ref, rows=rows, columns=columns, sample=sample)


def _bare_native(name: str) -> str | None:
    """`native."X"`, `native.X`, `"X"` or `X` -> X."""
    if name.lower().startswith("native."):
        name = name[7:]
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].replace('""', '"')
    return name or None


def sandbox_value(v: Any) -> Any:
    return jsonable(v, MAX_CELL_CHARS)


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
