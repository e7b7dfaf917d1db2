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
