"""sql_query's guard: read-only SELECTs over this profile pass; writes, file access, nested SQL,
configuration changes and multi-statements are refused with ProfileError; long queries time out;
rows and characters are capped; the profile file is never modified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
import shutil
import time

import pytest

from gpuscope.tools.analyses.sql_query import MAX_CELL_CHARS, MAX_CHARS, MAX_ROWS, check_query, sql_query
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError


from gpuscope.fixtures import samples as H


def _fingerprint(path: Path) -> tuple:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("sqlguard")
    profiles = H.write_profiles(folder / "profiles")
    other = folder / "other.sqlite"  # a second SQLite file a query must not be able to read
    shutil.copyfile(profiles["nsys"], other)
    return {"profiles": profiles, "other": other, "folder": folder,
            "before": {k: _fingerprint(profiles[k]) for k in ("nsys", "rocpd")}}


@pytest.fixture(scope="module", params=["nsys", "rocpd"])
def trace(request, files):
    return open_trace(files["profiles"][request.param])


@pytest.fixture(scope="module")
def nsys(files):
    return open_trace(files["profiles"]["nsys"])


ALLOWED = [
    ("SELECT count(*) AS n FROM kernels", [[H.TOTAL_KERNELS]]),
    ("select count(*) from kernels where device_id = 0", [[H.DEVICE0_KERNELS]]),
    ("WITH g AS (SELECT short_name, sum(dur_ns) AS t FROM kernels WHERE device_id = 0 GROUP BY 1) "
     "SELECT t FROM g WHERE short_name = 'gemm_kernel'", [[H.DEVICE0_GEMM_TOTAL_NS]]),
    ("SELECT count(*) FROM kernels -- how many kernels?", [[H.TOTAL_KERNELS]]),
    ("SELECT count(*) FROM kernels; -- trailing semicolon and comment", [[H.TOTAL_KERNELS]]),
    ("SELECT 1 -- ; DROP TABLE kernels", [[1]]),
    ("/* block comment */ SELECT 2", [[2]]),
    ("SELECT ';' AS s", [[";"]]),
    ("SELECT count(*) FROM kernels k JOIN api_calls a ON a.correlation_id = k.correlation_id AND a.pid = k.pid",
     [[H.TOTAL_KERNELS]]),
    ("FROM kernels SELECT count(*)", [[H.TOTAL_KERNELS]]),
    ("SELECT key FROM trace_meta WHERE key = 'capture_start_ns'", [["capture_start_ns"]]),
]


@pytest.mark.parametrize("sql,rows", ALLOWED)
def test_allowed_queries(trace, sql, rows):
    res = sql_query(trace, sql)
    assert res.rows == rows
    assert res.truncated is False and res.hint is None


@pytest.mark.parametrize("sql", ["DESCRIBE kernels", "SHOW TABLES", "SHOW kernels", "EXPLAIN SELECT * FROM kernels",
                                 "EXPLAIN ANALYZE SELECT count(*) FROM kernels", "SUMMARIZE kernels"])
def test_allowed_metadata_statements(trace, sql):
    if sql == "SHOW TABLES" and trace.format == "rocpd":
        # rocpd's own views are written with backticks, which DuckDB's SQLite scanner cannot parse:
        # the answer is an error that points to list_tables, not a crash.
        with pytest.raises(ProfileError, match="list_tables"):
            sql_query(trace, sql)
        return
    res = sql_query(trace, sql)
    assert res.columns and res.rows


def test_describe_and_show_list_model_tables(nsys):
    cols = {r[0] for r in sql_query(nsys, "DESCRIBE kernels").rows}
    assert {"start_ns", "end_ns", "dur_ns", "name", "short_name"} <= cols
    tables = {r[0] for r in sql_query(nsys, "SHOW TABLES").rows}
    assert {"kernels", "memops", "api_calls"} <= tables


def test_native_tables_readable(files):
    nsys = open_trace(files["profiles"]["nsys"])
    res = sql_query(nsys, 'SELECT count(*) FROM native."CUPTI_ACTIVITY_KIND_KERNEL"')
    assert res.rows == [[H.TOTAL_KERNELS]]
    res = sql_query(nsys, 'SELECT count(*) FROM native.StringIds')
    assert res.rows[0][0] > 0
    rocpd = open_trace(files["profiles"]["rocpd"])
    natives = [r[0] for r in sql_query(rocpd, "SELECT table_name FROM duckdb_tables() WHERE database_name = 'native'").rows]
    assert any("kernel" in n for n in natives), natives


def refused_queries(files) -> list[str]:
    out = files["folder"]
    other = files["other"]
    return [
        # writes to the model or the native profile
        "INSERT INTO kernels SELECT * FROM kernels",
        "UPDATE kernels SET dur_ns = 0",
        "DELETE FROM kernels",
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        "CREATE MACRO m(x) AS x + 1",
        "DROP TABLE kernels",
        "ALTER TABLE kernels ADD COLUMN x INTEGER",
        "TRUNCATE kernels",
        'DELETE FROM native."CUPTI_ACTIVITY_KIND_KERNEL"',
        "UPDATE native.StringIds SET value = 'x'",
        'INSERT INTO native."StringIds" VALUES (999999, \'x\')',
        # other databases and files
        f"ATTACH '{out / 'attached.db'}' AS x",
        f"ATTACH '{other}' AS o (TYPE sqlite)",
        "DETACH native",
        "USE native",
        f"COPY kernels TO '{out / 'copy.csv'}'",
        f"COPY (SELECT * FROM kernels) TO '{out / 'copy2.csv'}' (FORMAT csv)",
        f"COPY kernels FROM '{out / 'copy.csv'}'",
        f"EXPORT DATABASE '{out / 'export'}'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "FORCE INSTALL sqlite_scanner",
        # configuration
        "SET enable_external_access = true",
        "SET threads = 1",
        "RESET lock_configuration",
        "PRAGMA threads = 1",
        "PRAGMA enable_profiling = 'json'",
        f"PRAGMA profiling_output = '{out / 'prof.json'}'",
        "CHECKPOINT",
        "VACUUM",
        "CALL sqlite_attach('/etc/passwd')",
        # several statements
        "SELECT 1; SELECT 2",
        "SELECT 1; DROP TABLE kernels",
        "SELECT count(*) FROM kernels;\nDELETE FROM kernels;",
        # file-reading and nested-SQL functions, anywhere in the query
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_csv_auto('/etc/passwd')",
        "SELECT * FROM read_json('/etc/passwd')",
        "SELECT * FROM read_json_auto('/etc/passwd')",
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_blob('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM '/etc/passwd'",
        "FROM '/etc/passwd'",
        "SELECT * FROM 'other.csv'",
        f"SELECT * FROM sqlite_scan('{other}', 'StringIds')",
        "SELECT * FROM sqlite_scan('/any/file', 't')",
        f"SELECT * FROM SQLITE_SCAN('{other}', 'StringIds')",
        f"SELECT * FROM \"sqlite_scan\"('{other}', 'StringIds')",
        f"SELECT * FROM sqlite_query('{other}', 'SELECT * FROM StringIds')",
        "SELECT * FROM query('SELECT 1')",
        "SELECT * FROM query_table('kernels')",
        "SELECT json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "SELECT getenv('HOME')",
        f"WITH x AS (SELECT * FROM sqlite_scan('{other}', 'StringIds')) SELECT count(*) FROM x",
        "SELECT (SELECT count(*) FROM glob('/etc/*')) AS n",
        "SELECT count(*) FROM kernels WHERE name IN (SELECT column0 FROM read_csv('/etc/passwd'))",
        "SELECT 1 UNION ALL SELECT count(*) FROM read_text('/etc/hostname')",
        "EXPLAIN SELECT * FROM read_csv('/etc/passwd')",
        f"EXPLAIN ANALYZE SELECT * FROM sqlite_scan('{other}', 'StringIds')",
        "DESCRIBE SELECT * FROM read_csv('/etc/passwd')",
        f"SUMMARIZE SELECT * FROM sqlite_scan('{other}', 'StringIds')",
        f"SUMMARIZE SELECT * FROM sqlite_scan/**/('{other}', 'StringIds')",
        f"SELECT * FROM (DESCRIBE SELECT * FROM \"sqlite_scan\"('{other}', 'StringIds'))",
        f"SELECT * FROM unnest([1]), LATERAL sqlite_scan('{other}', 'StringIds')",
        "SELECT * FROM read_csv('/etc/passwd') -- a trailing comment must not hide it",
    ]


def test_refused_queries(trace, files):
    for sql in refused_queries(files):
        with pytest.raises(ProfileError) as info:
            sql_query(trace, sql)
        msg = str(info.value)
        assert msg.strip(), sql
        assert "root:" not in msg, f"file content leaked for {sql!r}: {msg}"
    # nothing was written anywhere
    leftovers = {p.name for p in files["folder"].iterdir()} - {"profiles", "other.sqlite"}
    assert not leftovers, leftovers
    # the model is intact and the connection is still usable
    assert sql_query(trace, "SELECT count(*) FROM kernels").rows == [[H.TOTAL_KERNELS]]
    assert trace.scalar("SELECT current_setting('enable_external_access')") is False


def test_refusal_messages_say_why(nsys):
    with pytest.raises(ProfileError, match="one statement"):
        check_query(nsys, "SELECT 1; SELECT 2")
    with pytest.raises(ProfileError, match="(?i)select"):
        check_query(nsys, "DROP TABLE kernels")
    with pytest.raises(ProfileError, match="read_csv"):
        check_query(nsys, "SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(ProfileError, match="(?i)empty"):
        check_query(nsys, "   ")
    with pytest.raises(ProfileError, match="(?i)SQL"):
        sql_query(nsys, "SELEC 1")
    with pytest.raises(ProfileError, match="no_such_column"):
        sql_query(nsys, "SELECT no_such_column FROM kernels")
    with pytest.raises(ProfileError, match="no_such_table"):
        sql_query(nsys, "SELECT * FROM no_such_table")


def test_timeout_interrupts_long_query(nsys):
    t0 = time.monotonic()
    with pytest.raises(ProfileError, match="time limit"):
        sql_query(nsys, "SELECT count(*) FROM range(1000000000) a, range(1000000000) b WHERE a.range + b.range = -1",
                  timeout_s=1)
    assert time.monotonic() - t0 < 6
    assert sql_query(nsys, "SELECT count(*) FROM kernels").rows == [[H.TOTAL_KERNELS]]  # connection still works


def test_row_cap(nsys):
    res = sql_query(nsys, "SELECT range AS i FROM range(5000)", limit=10)
    assert res.row_count == len(res.rows) == 10 and res.truncated is True
    assert res.hint and "limit" in res.hint
    exact = sql_query(nsys, "SELECT range AS i FROM range(10)", limit=10)
    assert exact.row_count == 10 and exact.truncated is False and exact.hint is None
    big = sql_query(nsys, "SELECT range AS i FROM range(5000)", limit=10**6)
    assert big.row_count == MAX_ROWS and big.truncated is True


def test_character_cap(nsys):
    res = sql_query(nsys, "SELECT repeat('x', 300) AS a, range AS i FROM range(1000)", limit=1000)
    assert res.truncated is True and res.hint
    assert 0 < res.row_count < 1000
    assert len(json.dumps(res.model_dump(mode="json"))) < MAX_CHARS + 2_000
    cell = sql_query(nsys, "SELECT repeat('y', 100000) AS huge")
    assert len(cell.rows[0][0]) <= MAX_CELL_CHARS


def test_values_are_json(nsys):
    res = sql_query(nsys, "SELECT 1.5::DECIMAL(10,2) AS d, 3::HUGEINT AS h, DATE '2024-01-02' AS day, "
                          "[1, 2] AS l, {'a': 1} AS s, NULL AS n, 'abc'::BLOB AS b, uuid() AS u, INTERVAL 1 HOUR AS iv")
    out = json.loads(json.dumps(res.model_dump(mode="json")))
    assert out["columns"] == ["d", "h", "day", "l", "s", "n", "b", "u", "iv"]
    (row,) = out["rows"]
    assert row[:7] == [1.5, 3, "2024-01-02", [1, 2], {"a": 1}, None, "abc"]
    assert isinstance(row[7], str) and len(row[7]) == 36 and row[7].count("-") == 4  # a UUID, as text
    assert row[8] == "1:00:00"


def test_profile_files_unchanged(files):
    for key in ("nsys", "rocpd"):
        trace = open_trace(files["profiles"][key])
        for sql in refused_queries(files):
            with pytest.raises(ProfileError):
                sql_query(trace, sql)
        assert _fingerprint(files["profiles"][key]) == files["before"][key], f"{key} profile was modified"
    assert _fingerprint(files["other"])[1] == files["profiles"]["nsys"].stat().st_size
