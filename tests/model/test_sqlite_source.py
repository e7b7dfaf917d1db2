"""sqlite_source: loading DuckDB's SQLite scanner."""

from __future__ import annotations

import os

import duckdb
import pytest

from gpuscope.tools.model import sqlite_source


@pytest.fixture()
def extension(monkeypatch, tmp_path):
    """The scanner's copy in a fresh cache folder."""
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sqlite_source, "_EXTENSION_FILE", False)
    ext = sqlite_source._extension_file()
    if ext is None:
        pytest.skip("the DuckDB sqlite extension is not installed")
    return ext


def _load(ext, config: dict) -> None:
    con = duckdb.connect(":memory:", config=config)
    try:
        con.execute(f"LOAD '{ext}'")
    finally:
        con.close()


def test_the_signature_check_is_skipped_only_where_no_one_else_can_write_the_copy(extension):
    """In the private cache the LOAD skips DuckDB's signature check (0.11 s a profile); once a folder on the way to the
    copy is writable by others, or the copy is a link, the check runs again and refuses a changed binary."""
    assert sqlite_source.scanner_config() == {"allow_unsigned_extensions": "true"}
    assert [sqlite_source.scanner_config(f) for f in ("nsys", "rocpd", "rpd", "kineto")] == [
        {"allow_unsigned_extensions": "true"}] * 3 + [{}]  # a Kineto build loads no scanner: it gets nothing
    _load(extension, sqlite_source.scanner_config())

    with open(extension, "r+b") as fh:  # a changed binary of the same size (the copy is not made again)
        fh.seek(os.path.getsize(extension) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    for shared in (extension.parent, extension.parents[2]):  # the version folder, the cache folder
        mode = shared.stat().st_mode
        shared.chmod(mode | 0o022)
        assert sqlite_source.scanner_config() == {}
        with pytest.raises(duckdb.Error):
            _load(extension, sqlite_source.scanner_config())
        shared.chmod(mode)
    assert sqlite_source.scanner_config() == {"allow_unsigned_extensions": "true"}

    link = extension.with_name("elsewhere.duckdb_extension")
    extension.rename(link)
    extension.symlink_to(link)
    assert sqlite_source.scanner_config() == {}


def test_text_a_query_or_a_copy_repairs_is_counted_once_per_row(tmp_path, monkeypatch):
    """Cells of invalid UTF-8 that a reader's own query reads (metadata, enum names) are counted in data_issues as a
    copy's are, under the table and the column as the query names it. Several reads of one table may read the same
    rows: each (table, column) counts the most rows one read repaired (here 3 of 3), never their sum."""
    import sqlite3

    from gpuscope.tools.model.trace import SCHEMA_SQL

    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "p.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (id INTEGER, name TEXT, value TEXT)")
    db.executemany("INSERT INTO meta VALUES (?, ?, CAST(? AS TEXT))",
                   [(i, f"k{i}", b"Gei\xdf" if i < 4 else b"ok") for i in range(1, 6)])
    db.commit()
    db.close()
    con = duckdb.connect()
    con.execute(SCHEMA_SQL)
    src = sqlite_source.SqliteSource(con, path)
    issues = lambda: con.execute("SELECT * FROM data_issues").fetchall()  # noqa: E731
    reason = f'"value": {sqlite_source.NOT_UTF8}'

    assert src.query("SELECT name FROM meta", table="meta") == [(f"k{i}",) for i in range(1, 6)]
    assert issues() == []
    assert src.query("SELECT value FROM meta WHERE id = 1", table="meta") == [("Gei\ufffd",)]
    assert issues() == [('native."meta"', "repaired", 1, reason)]
    src.query("SELECT id, value FROM meta", table="meta")
    src.query("SELECT value FROM meta WHERE id <= 2", table="meta")
    assert issues() == [('native."meta"', "repaired", 3, reason)]
    src.copy("meta", lenient=True)  # reads every row: its 3 are the rows the queries read
    assert issues() == [('native."meta"', "repaired", 3, reason)]
    assert con.execute('SELECT count(*) FROM native."meta" WHERE value = \'Gei\ufffd\'').fetchone()[0] == 3

    # A reader starting over (rocpd, on lenient copies) deletes the rows of the tables it has not copied: a query
    # running again counts its rows again.
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta2 AS SELECT * FROM meta")
    db.commit()
    db.close()
    src.close()
    src = sqlite_source.SqliteSource(con, path)
    src.query("SELECT value FROM meta2", table="meta2")
    con.execute("DELETE FROM data_issues WHERE table_name = 'native.\"meta2\"'")
    src.restart()
    src.query("SELECT value FROM meta2 WHERE id = 1", table="meta2")
    assert issues() == [('native."meta"', "repaired", 3, reason), ('native."meta2"', "repaired", 1, reason)]
    src.close()
