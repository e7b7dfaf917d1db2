"""The sql_query process: runs user SQL where no file can be reached, in bounded memory.

Started by gpuscope.tools.sandbox (never by hand), it reads one JSON request per line on stdin and
writes one JSON answer per line. Each request names the trace store and the native table files a
query may see; the worker builds, per store, an in-memory DuckDB catalog of views over them
(ATTACHed read-only), then turns external access off and locks the configuration before any user
text runs. The SQLite extension is never loaded here. The process's address space is capped
(RLIMIT_AS), so a query that would exhaust memory fails here, and a query past its time limit is
killed by the parent with the whole process.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from collections import OrderedDict

import duckdb

from ..model.limits import connect, duckdb_config
from ..model.quote import quote_ident, quote_literal
from ..model.quality import native_table_name
from ..model.store import lock_down
from .cells import jsonable
from .guard import Refused, check, first_line

CACHED_CATALOGS = 4


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Catalogs:
    """Locked in-memory catalogs, one per (store, set of native files), least recently used dropped."""

    def __init__(self, memory_limit: int):
        self.memory_limit = memory_limit
        self._cons: OrderedDict[str, tuple[duckdb.DuckDBPyConnection, dict[str, list]]] = OrderedDict()

    def get(self, plan: dict) -> tuple[duckdb.DuckDBPyConnection, dict[str, list]]:
        """The catalog, and the data_issues rows of each native table in it (by table name)."""
        key = json.dumps(plan, sort_keys=True)
        found = self._cons.get(key)
        if found is not None:
            self._cons.move_to_end(key)
            return found
        found = self._cons[key] = _build(plan, self.memory_limit)
        while len(self._cons) > CACHED_CATALOGS:
            self._cons.popitem(last=False)[1][0].close()
        return found


def _build(plan: dict, memory_limit: int) -> tuple[duckdb.DuckDBPyConnection, dict[str, list]]:
    config = {**duckdb_config(memory_limit), "threads": "2", "allow_community_extensions": "false",
              "allow_unsigned_extensions": "false"}
    con = connect(":memory:", config)
    con.execute(f"ATTACH {quote_literal(plan['store'])} AS store (READ_ONLY)")
    for t in plan["model"]:
        con.execute(f"CREATE VIEW main.{quote_ident(t)} AS SELECT * FROM store.main.{quote_ident(t)}")
    con.execute("CREATE SCHEMA native")
    for t in plan["in_model"]:
        con.execute(f"CREATE VIEW native.{quote_ident(t)} AS SELECT * FROM store.native.{quote_ident(t)}")
    # What the reader changed in the native tables' cells (store.copy_native keeps a lazy copy's own in the file).
    by_name = {native_table_name(t): t for t in plan["in_model"]}
    issues: dict[str, list] = {}
    for table, *row in con.execute("SELECT table_name, action, rows, reason FROM store.main.data_issues "
                                   "WHERE starts_with(table_name, 'native.') ORDER BY ALL").fetchall():
        if table in by_name:
            issues.setdefault(by_name[table], []).append([table, *row])
    for i, (t, file) in enumerate(sorted(plan["files"].items())):
        cat = quote_ident(f'nt{i}')
        con.execute(f"ATTACH {quote_literal(file)} AS {cat} (READ_ONLY)")
        con.execute(f"CREATE VIEW native.{quote_ident(t)} AS SELECT * FROM {cat}.main.t")
        if con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = 'issues'", [f"nt{i}"]).fetchone()[0]:
            issues[t] = [list(r) for r in con.execute(f"SELECT table_name, action, rows, reason FROM {cat}.main.issues ORDER BY ALL").fetchall()]
    present = {t.lower(): t for t in [*plan["in_model"], *plan["files"]]}
    for view, parts in plan["views"].items():
        if view.lower() not in present and parts and all(p.lower() in present for p in parts):
            body = " UNION ALL BY NAME ".join(f"SELECT * FROM native.{quote_ident(p)}" for p in parts)
            con.execute(f"CREATE VIEW native.{quote_ident(view)} AS {body}")
            present[view.lower()] = view
    # Bare names, as queries copied from the Nsight/rocprofiler documentation write them; a model table
    # of the same name keeps the bare name.
    model = {t.lower() for t in plan["model"]}
    for low, name in present.items():
        if low not in model:
            con.execute(f"CREATE VIEW main.{quote_ident(name)} AS SELECT * FROM native.{quote_ident(name)}")
    lock_down(con)  # from here on nothing can reach a file, load code or undo these settings
    return con, issues


def named_native(plan: dict, tables: set[tuple[str, str]]) -> list[str]:
    """The profile's own tables a query names, a view standing for the tables it stacks, as the profile spells them."""
    real = {t.lower(): t for t in [*plan["in_model"], *plan["lazy"]]}
    model = {t.lower() for t in plan["model"]}
    named: list[str] = []
    for schema, name in tables:
        low = name.lower()
        # native.X, or a bare X that is not a model table (model names win: the bare name is the model's)
        if schema.lower() != "native" and (schema or low in model):
            continue
        parts = plan["views"].get(next((v for v in plan["views"] if v.lower() == low), ""), [])
        for t in ([name] if low in real else []) + parts:
            if t.lower() in real and real[t.lower()] not in named:
                named.append(real[t.lower()])
    return named


def needed(plan: dict, tables: set[tuple[str, str]]) -> list[str]:
    """Native tables the query names that are not in the catalog yet (the parent copies them)."""
    lazy = {t.lower() for t in plan["lazy"]}
    have = {t.lower() for t in [*plan["in_model"], *plan["files"]]}
    return [t for t in named_native(plan, tables) if t.lower() in lazy and t.lower() not in have]


def answer(catalogs: Catalogs, request: dict) -> dict:
    plan = request["plan"]
    try:
        con, issues = catalogs.get(plan)
        checked = check(con, request["sql"])
    except Refused as exc:
        return {"refused": str(exc)}
    except duckdb.Error as exc:
        return {"error": first_line(exc), "kind": type(exc).__name__}
    need = needed(plan, checked.tables)
    if need:
        return {"need": need}
    shadowed = sorted({name for schema, name in checked.tables if not schema and name.lower() in _clashes(plan)})
    limit, max_chars, max_cell = request["limit"], request["max_chars"], request["max_cell"]
    cur = con.cursor()
    try:
        res = cur.execute(checked.sql)
        columns = [d[0] for d in res.description] if res.description else []
        raw = res.fetchmany(limit + 1)
    except duckdb.OutOfMemoryException as exc:
        return {"error": first_line(exc), "kind": "OutOfMemoryException"}
    except duckdb.Error as exc:
        return {"error": first_line(exc), "kind": type(exc).__name__}
    except MemoryError:
        return {"error": "the result does not fit in the query process's memory", "kind": "OutOfMemoryException"}
    finally:
        cur.close()
    truncated = len(raw) > limit
    rows, size = [], 0
    for r in raw[:limit]:
        row = [jsonable(v, max_cell) for v in r]
        size += len(json.dumps(row, default=str)) + 1
        if size > max_chars:
            truncated = True
            break
        rows.append(row)
    read_issues = [row for t in named_native(plan, checked.tables) for row in issues.get(t, [])]
    return {"columns": columns, "rows": rows, "truncated": truncated, "shadowed": shadowed, "issues": read_issues}


def _clashes(plan: dict) -> set[str]:
    """Lower-cased names that are both a model table and a native table or view."""
    native = {t.lower() for t in [*plan["in_model"], *plan["lazy"], *plan["views"]]}
    return native & {t.lower() for t in plan["model"]}


def main() -> None:
    _die_with_parent()
    ceiling = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr  # nothing but answers may reach the parent's pipe
    catalogs = Catalogs(memory_limit=ceiling // 2)
    for line in sys.stdin:
        try:
            reply = answer(catalogs, json.loads(line))
        except MemoryError:
            reply = {"error": "the query process ran out of memory", "kind": "OutOfMemoryException"}
        except Exception as exc:  # keep serving: the parent turns this into a clear error
            reply = {"error": f"{type(exc).__name__}: {exc}", "kind": "internal"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
