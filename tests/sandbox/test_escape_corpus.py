"""sql_query escape corpus: every way we know to make user SQL write, attach, load code, change settings,
run nested SQL or read another file, each tried with quoting, comment, case, EXPLAIN/DESCRIBE/SUMMARIZE
and CTE/subquery obfuscations.

For every input: a marker planted in other files (SQLite, DuckDB, CSV, JSON, text, Parquet) never appears in
the answer or the error, no file appears anywhere we look, and the profiles' bytes are unchanged. Ordinary
SELECTs (the controls) still answer exactly."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import duckdb
import pytest

from gpuscope.fixtures import samples as H
from gpuscope.tools.analyses.sql_query import sql_query
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

MARKER = "MARKER_c0ffee_never_leaks"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("escape")
    profiles = H.write_profiles(root / "profiles")
    other = root / "other"
    other.mkdir()
    db = other / "secret.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE t (v TEXT)")
        c.execute("INSERT INTO t VALUES (?)", [MARKER])
    (other / "secret.csv").write_text(f"v\n{MARKER}\n")
    (other / "secret.txt").write_text(MARKER)
    (other / "secret.json").write_text(f'[{{"v": "{MARKER}"}}]')
    d = duckdb.connect(str(other / "secret.duckdb"))
    d.execute(f"CREATE TABLE t AS SELECT '{MARKER}' AS v")
    d.execute(f"COPY t TO '{other / 'secret.parquet'}' (FORMAT parquet)")
    d.close()
    traces = {k: load_trace(profiles[k]) for k in ("nsys", "rocpd", "kineto")}
    watched = [profiles["nsys"].parent, other, root]
    return {"root": root, "other": other, "profiles": profiles, "traces": traces, "watched": watched,
            "hashes": {k: _sha(p) for k, p in profiles.items()}}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(folders: list[Path]) -> set[str]:
    return {str(p) for f in folders for p in f.rglob("*")}


# --- the corpus -------------------------------------------------------------------------------------------

FILE_FUNCTIONS = [
    "read_csv('{csv}')", "read_csv_auto('{csv}')", "read_json('{json}')", "read_json_auto('{json}')",
    "read_json_objects('{json}')", "read_ndjson('{json}')", "read_ndjson_auto('{json}')", "read_ndjson_objects('{json}')",
    "read_parquet('{parquet}')", "parquet_scan('{parquet}')", "parquet_metadata('{parquet}')",
    "parquet_schema('{parquet}')", "parquet_file_metadata('{parquet}')", "parquet_kv_metadata('{parquet}')",
    "read_text('{txt}')", "read_blob('{txt}')", "glob('{other}/*')", "sniff_csv('{csv}')",
    "sqlite_scan('{db}', 't')", "sqlite_query('{db}', 'SELECT * FROM t')", "query('SELECT 1')",
    "query_table('kernels')", "iceberg_scan('{other}')", "delta_scan('{other}')", "read_xlsx('{csv}')",
    "duckdb_secrets()", "sqlite_attach('{db}')",
]

WRAPPERS = [
    "SELECT * FROM {f}",
    "select * from {F}",                                     # upper-cased function name
    'SELECT * FROM "{fn}"({args})',                           # quoted identifier
    "SELECT * FROM {fn}/**/({args})",                         # comment before the parenthesis
    "SELECT * FROM {fn}\n  (\n{args})",                       # line breaks
    "WITH x AS (SELECT * FROM {f}) SELECT * FROM x",          # CTE
    "SELECT (SELECT count(*) FROM {f}) AS n",                 # scalar subquery
    "SELECT * FROM kernels WHERE name IN (SELECT * FROM {f})",
    "SELECT 1 AS a UNION ALL SELECT count(*) FROM {f}",
    "SELECT * FROM unnest([1]), LATERAL (SELECT * FROM {f})",
    "EXPLAIN SELECT * FROM {f}",
    "EXPLAIN ANALYZE SELECT * FROM {f}",
    "EXPLAIN (ANALYZE) SELECT CAST(v AS INTEGER) FROM {f}",   # the error message used to carry the file's text
    "DESCRIBE SELECT * FROM {f}",
    "SUMMARIZE SELECT * FROM {f}",
    "FROM {f} SELECT *",
    "SELECT * FROM (DESCRIBE SELECT * FROM {f})",
]

STATEMENTS = [
    # writes to the model and to native tables
    "INSERT INTO kernels SELECT * FROM kernels", "UPDATE kernels SET dur_ns = 0", "DELETE FROM kernels",
    "CREATE TABLE t AS SELECT 1", "CREATE VIEW v AS SELECT 1", "CREATE MACRO m(x) AS x + 1",
    "CREATE TEMP TABLE t AS SELECT 1", "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')", "CREATE SEQUENCE s",
    "DROP TABLE kernels", "DROP VIEW kernels", "ALTER TABLE kernels ADD COLUMN x INTEGER", "TRUNCATE kernels",
    'DELETE FROM native."CUPTI_ACTIVITY_KIND_KERNEL"', "UPDATE native.StringIds SET value = 'x'",
    "INSERT INTO native.\"StringIds\" VALUES (999999, 'x')", "CREATE SCHEMA x", "COMMENT ON TABLE kernels IS 'x'",
    # other databases and files
    "ATTACH '{db}' AS o (TYPE sqlite)", "ATTACH '{db}' AS o", "attach '{duck}' as o (read_only)",
    "ATTACH IF NOT EXISTS '{duck}' AS o", "ATTACH DATABASE '{duck}' AS o", "ATTACH ':memory:' AS m",
    "DETACH store", "DETACH native", "USE store", "USE native",
    "COPY kernels TO '{root}/copy.csv'", "COPY (SELECT * FROM kernels) TO '{root}/copy2.parquet' (FORMAT parquet)",
    "COPY kernels FROM '{csv}'", "EXPORT DATABASE '{root}/export'", "IMPORT DATABASE '{other}'",
    "COPY FROM DATABASE store TO memory",
    # code
    "INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL sqlite_scanner", "LOAD sqlite_scanner", "LOAD '{db}'",
    "INSTALL sqlite FROM community", "UPDATE EXTENSIONS",
    # configuration
    "SET enable_external_access = true", "SET threads = 1", "RESET lock_configuration", "SET lock_configuration = false",
    "SET memory_limit = '100GB'", "SET temp_directory = '{root}'", "SET allow_unsigned_extensions = true",
    "PRAGMA threads = 1", "PRAGMA enable_profiling = 'json'", "PRAGMA profiling_output = '{root}/prof.json'",
    "PRAGMA version", "CALL pragma_version()", "CHECKPOINT", "FORCE CHECKPOINT", "VACUUM", "ANALYZE",
    "CALL sqlite_attach('{db}')", "SET search_path = 'store'", "BEGIN TRANSACTION", "COMMIT", "ROLLBACK",
    "PREPARE p AS SELECT 1", "EXECUTE p", "DEALLOCATE p",
    # several statements
    "SELECT 1; SELECT 2", "SELECT 1; DROP TABLE kernels", "SELECT count(*) FROM kernels;\nDELETE FROM kernels;",
    "SELECT 1; ATTACH '{db}' AS o", "SELECT 1;;SET threads = 1",
    # replacement scans: a file name where a table goes
    "SELECT * FROM '{csv}'", "FROM '{parquet}'", "SELECT * FROM '{db}'", "SELECT * FROM \"{csv}\"",
    "SELECT * FROM '{other}/*.csv'", "SELECT v FROM '{json}'",
    # nested SQL, error-message exfiltration, secrets and the environment
    "SELECT json_execute_serialized_sql(json_serialize_sql('SELECT 1'))", "SELECT getenv('HOME')",
    "SELECT error((SELECT v FROM read_text('{txt}')))", "SELECT * FROM which_secret('s3://x', 's3')",
    "SELECT CAST((SELECT content FROM read_text('{txt}')) AS INTEGER)",
    "EXPLAIN EXPLAIN SELECT 1", "EXPLAIN (ANALYZE) ATTACH '{db}' AS o", "EXPLAIN COPY kernels TO '{root}/e.csv'",
    "PIVOT (SELECT * FROM read_csv('{csv}')) ON v", "SELECT * FROM sqlite_scan('{db}', 't') -- trailing comment",
    "/* leading comment */ SELECT * FROM read_text('{txt}')", "WITH RECURSIVE r AS (SELECT * FROM read_text('{txt}')) SELECT * FROM r",
]


def corpus(env: dict) -> list[str]:
    paths = {"csv": env["other"] / "secret.csv", "json": env["other"] / "secret.json", "txt": env["other"] / "secret.txt",
             "parquet": env["other"] / "secret.parquet", "db": env["other"] / "secret.db",
             "duck": env["other"] / "secret.duckdb", "other": env["other"], "root": env["root"]}
    out = []
    for func in FILE_FUNCTIONS:
        f = func.format(**paths)
        fn, args = f.split("(", 1)
        args = args[:-1]
        for w in WRAPPERS:
            out.append(w.format(f=f, F=fn.upper() + "(" + args + ")", fn=fn, args=args))
    out += [s.format(**paths) for s in STATEMENTS]
    return out


def test_corpus_is_large(env):
    assert len(corpus(env)) >= 150


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_no_escape(env, fmt, monkeypatch):
    monkeypatch.chdir(env["root"])
    trace = env["traces"][fmt]
    before = _listing(env["watched"])
    kernels = sql_query(trace, "SELECT count(*) FROM kernels").rows
    answered = []
    for sql in corpus(env):
        try:
            res = sql_query(trace, sql)
            text = repr(res.model_dump())
            answered.append(sql)
        except ProfileError as exc:
            text = str(exc)
            assert text.strip(), sql
        assert MARKER not in text, f"the marker leaked through {sql!r}: {text[:300]}"
        assert "Traceback" not in text and "internal error" not in text, (sql, text[:300])
    assert _listing(env["watched"]) == before, "a query created a file"
    for k, p in env["profiles"].items():
        assert _sha(p) == env["hashes"][k], f"{k} profile changed"
    # The only inputs that answer are the harmless ones: DuckDB rewrites PRAGMA version to a SELECT of
    # pragma_version(), and the leading-comment SELECT reads a file that is refused (so it must not be here).
    assert answered == ["PRAGMA version"], answered
    assert sql_query(trace, "SELECT count(*) FROM kernels").rows == kernels == [[H.TOTAL_KERNELS]]


def test_every_refusal_says_why(env):
    trace = env["traces"]["nsys"]
    cases = {
        "SELECT 1; SELECT 2": "one statement",
        "DROP TABLE kernels": "SELECT",
        "SELECT * FROM read_csv('/etc/passwd')": "read_csv",
        "   ": "empty",
        "SELEC 1": "SQL",
        "SELECT no_such_column FROM kernels": "no_such_column",
        "SELECT * FROM no_such_table": "no_such_table",
        "PRAGMA threads = 1": "SET",
        "CALL pragma_version()": "CALL",
        f"SELECT * FROM '{env['other'] / 'secret.csv'}'": "disabled",
        "EXPLAIN EXPLAIN SELECT 1": "EXPLAIN",
    }
    for sql, word in cases.items():
        with pytest.raises(ProfileError) as info:
            sql_query(trace, sql)
        assert word.lower() in str(info.value).lower(), (sql, str(info.value))


CONTROLS = [
    ("SELECT count(*) AS n FROM kernels", [[H.TOTAL_KERNELS]]),
    ("select count(*) from kernels where device_id = 0", [[H.DEVICE0_KERNELS]]),
    ("WITH g AS (SELECT short_name, sum(dur_ns) AS t FROM kernels WHERE device_id = 0 GROUP BY 1) "
     "SELECT t FROM g WHERE short_name = 'gemm_kernel'", [[H.DEVICE0_GEMM_TOTAL_NS]]),
    ("SELECT count(*) FROM kernels -- how many kernels?", [[H.TOTAL_KERNELS]]),
    ("SELECT count(*) FROM kernels; -- trailing semicolon and comment", [[H.TOTAL_KERNELS]]),
    ("SELECT 1 -- ; DROP TABLE kernels", [[1]]),
    ("/* block comment */ SELECT 2", [[2]]),
    ("SELECT ';' AS s", [[";"]]),
    ("SELECT 'read_csv(''/etc/passwd'')' AS s", [["read_csv('/etc/passwd')"]]),
    ("SELECT count(*) FROM kernels k JOIN api_calls a ON a.correlation_id = k.correlation_id AND a.pid = k.pid",
     [[H.TOTAL_KERNELS]]),
    ("FROM kernels SELECT count(*)", [[H.TOTAL_KERNELS]]),
    ("SELECT key FROM trace_meta WHERE key = 'capture_start_ns'", [["capture_start_ns"]]),
    ("SELECT count(*) FROM (SELECT * FROM kernels UNION ALL SELECT * FROM kernels)", [[2 * H.TOTAL_KERNELS]]),
]


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
@pytest.mark.parametrize("sql,rows", CONTROLS)
def test_controls_still_answer(env, fmt, sql, rows):
    res = sql_query(env["traces"][fmt], sql)
    assert res.rows == rows and res.truncated is False and res.hint is None


@pytest.mark.parametrize("sql", ["DESCRIBE kernels", "SHOW TABLES", "SHOW kernels", "EXPLAIN SELECT * FROM kernels",
                                 "EXPLAIN ANALYZE SELECT count(*) FROM kernels", "EXPLAIN (ANALYZE) SELECT 1",
                                 "SUMMARIZE kernels", "SELECT * FROM (DESCRIBE kernels)"])
@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_metadata_statements_answer(env, fmt, sql):
    res = sql_query(env["traces"][fmt], sql)
    assert res.columns and res.rows


def test_describe_and_show_name_the_model(env):
    trace = env["traces"]["nsys"]
    cols = {r[0] for r in sql_query(trace, "DESCRIBE kernels").rows}
    assert {"start_ns", "end_ns", "dur_ns", "name", "short_name"} <= cols
    tables = {r[0] for r in sql_query(trace, "SHOW TABLES").rows}
    assert {"kernels", "memops", "api_calls"} <= tables


def test_sql_never_runs_in_the_server_process(env):
    """The tools' own connection is locked too: even gpuscope's SQL there cannot reach a file."""
    trace = env["traces"]["nsys"]
    assert trace.scalar("SELECT current_setting('enable_external_access')") is False
    with pytest.raises(duckdb.Error):
        trace.sql(f"SELECT * FROM read_text('{env['other'] / 'secret.txt'}')")
    with pytest.raises(duckdb.Error):
        trace.sql("SET enable_external_access = true")
    assert "sqlite_scan" not in {r[0] for r in trace.sql("SELECT function_name FROM duckdb_functions()")}


def test_user_sql_runs_locked(env):
    """The connection user SQL runs on has external access off, its settings locked and no SQLite scanner."""
    trace = env["traces"]["rocpd"]
    res = sql_query(trace, "SELECT current_setting('enable_external_access') AS ext, "
                           "current_setting('lock_configuration') AS locked")
    assert res.rows == [[False, True]]
    fns = sql_query(trace, "SELECT count(*) FROM duckdb_functions() WHERE function_name ILIKE 'sqlite%'")
    assert fns.rows == [[0]]
