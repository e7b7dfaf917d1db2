"""Crafted profiles: SQL hidden in table, column and view names, views that read other files, WAL mode.

Each crafted file is a valid profile of the sample scenario plus the attack, so the right answer is
known: the sample's figures, the marker planted in another file nowhere, no file created beside the
profile, the profile's bytes unchanged."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpuscope.fixtures import samples as H
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

MARKER = "MARKER_crafted_5eca1"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("crafted")
    profiles = H.write_profiles(root / "clean")
    secret = root / "secret" / "secret.db"
    secret.parent.mkdir()
    with sqlite3.connect(secret) as c:
        c.execute("CREATE TABLE t (v TEXT)")
        c.execute("INSERT INTO t VALUES (?)", [MARKER])
    (secret.parent / "secret.txt").write_text(MARKER)
    return {"root": root, "profiles": profiles, "secret": secret}


def _craft(base: dict, fmt: str, name: str, statements: list[str]) -> Path:
    folder = base["root"] / name
    folder.mkdir()
    path = folder / base["profiles"][fmt].name
    shutil.copyfile(base["profiles"][fmt], path)
    with sqlite3.connect(path) as c:
        for s in statements:
            c.execute(s.format(secret=base["secret"], txt=base["secret"].parent / "secret.txt"))
    return path


def _everything(trace) -> str:
    """All the text a user can get out of the profile's metadata and tables."""
    out = [repr(A.trace_info(trace).model_dump()), repr(A.list_tables(trace).model_dump())]
    for t in A.list_tables(trace).native_tables:
        try:
            out.append(repr(A.sql_query(trace, f"SELECT * FROM {t.table}").model_dump()))
            out.append(repr(A.describe_table(trace, t.table).model_dump()))
        except ProfileError as exc:
            out.append(str(exc))
    return "\n".join(out)


def _check(path: Path, expect_kernels: int | None = H.TOTAL_KERNELS) -> str:
    before = {p.name for p in path.parent.iterdir()}
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    trace = load_trace(path)
    try:
        if expect_kernels is not None:
            assert trace.count("kernels") == expect_kernels
        text = _everything(trace)
        assert MARKER not in text
    finally:
        trace.close()
    assert {p.name for p in path.parent.iterdir()} == before, "opening created files beside the profile"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    return text


INJECTIONS = [
    'x" AS SELECT 1; INSERT INTO trace_meta SELECT \'k\', v FROM sqlite_scan(\'{secret}\', \'t\'); --',
    "evil\"; DELETE FROM kernels; ATTACH '{secret}' AS s (TYPE sqlite); --",
    "q'); INSERT INTO trace_meta VALUES ('x', (SELECT v FROM sqlite_scan('{secret}', 't'))); --",
    'a""b"" ; DROP TABLE kernels',
]


@pytest.mark.parametrize("fmt", ["nsys", "rocpd"])
@pytest.mark.parametrize("i", range(len(INJECTIONS)))
def test_table_name_injection(base, fmt, i):
    name = INJECTIONS[i].format(secret=base["secret"])
    quoted = '"' + name.replace('"', '""') + '"'
    path = _craft(base, fmt, f"tname_{fmt}_{i}", [f'CREATE TABLE {quoted} ("c""; DROP TABLE kernels; --" TEXT)',
                                                   f"INSERT INTO {quoted} VALUES ('own content')"])
    text = _check(path)
    assert "own content" in text  # the table is there, read as data under its own name
    trace = load_trace(path)
    assert name in trace.native.tables
    res = A.sql_query(trace, f'SELECT * FROM native.{quoted}')
    assert res.rows == [["own content"]] and res.columns == ['c"; DROP TABLE kernels; --']
    trace.close()


def test_column_name_injection_in_tables_the_reader_reads(base):
    col = "x\"; INSERT INTO trace_meta SELECT 'k', v FROM sqlite_scan('{secret}', 't'); --"
    quoted = '"' + col.format(secret=base["secret"]).replace('"', '""') + '"'
    path = _craft(base, "nsys", "colname", [f"ALTER TABLE NVTX_EVENTS ADD COLUMN {quoted} TEXT",
                                            f"ALTER TABLE StringIds ADD COLUMN {quoted} TEXT",
                                            f"ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL ADD COLUMN {quoted} INTEGER"])
    _check(path)
    trace = load_trace(path)
    assert A.top_kernels(trace).devices[0].kernel_count == H.DEVICE0_KERNELS
    trace.close()


VIEWS = [
    "CREATE VIEW leak AS SELECT * FROM sqlite_scan('{secret}', 't')",
    "CREATE VIEW leak_text AS SELECT * FROM read_text('{txt}')",
    "CREATE VIEW \"leak\"\"q\" AS SELECT * FROM sqlite_scan('{secret}', 't')",
]


@pytest.mark.parametrize("fmt", ["nsys", "rocpd"])
def test_views_in_the_profile_are_never_run(base, fmt):
    path = _craft(base, fmt, f"views_{fmt}", VIEWS)
    _check(path)
    trace = load_trace(path)
    names = {t.table for t in A.list_tables(trace).native_tables}
    assert not any("leak" in n for n in names)
    for sql in ("SELECT * FROM native.leak", "SELECT * FROM native.leak_text", 'SELECT * FROM native."leak""q"'):
        with pytest.raises(ProfileError, match="(?i)does not exist|not found|no such|catalog"):
            A.sql_query(trace, sql)
    with pytest.raises(ProfileError, match="unknown table"):
        A.describe_table(trace, "native.leak")
    trace.close()


def test_a_view_standing_in_for_a_required_table_is_not_read(base):
    """Replace the kernel table by a view over another file: the reader sees no kernel table."""
    path = _craft(base, "nsys", "fake_kernels", [
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO real_kernels",
        "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM real_kernels, sqlite_scan('{secret}', 't')"])
    text = _check(path, expect_kernels=0)
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in text  # trace_info says the kernel table is absent


def test_rocpd_views_are_gpuscope_s_own(base):
    """rocprofv3 ships views such as rocpd_kernel_dispatch; a crafted one reads another file. gpuscope stacks the
    physical tables itself, so the answer is the profile's dispatches."""
    path = _craft(base, "rocpd", "rocpd_view", [
        "DROP VIEW IF EXISTS rocpd_kernel_dispatch",
        "CREATE VIEW rocpd_kernel_dispatch AS SELECT v AS id FROM sqlite_scan('{secret}', 't')"])
    _check(path)
    trace = load_trace(path)
    res = A.sql_query(trace, "SELECT count(*) FROM native.rocpd_kernel_dispatch")
    assert res.rows == [[H.TOTAL_KERNELS]]
    trace.close()


@pytest.mark.parametrize("fmt", ["nsys", "rocpd"])
def test_wal_mode_profile_creates_nothing_beside_it(base, fmt):
    path = _craft(base, fmt, f"wal_{fmt}", ["PRAGMA journal_mode=WAL"])
    with open(path, "rb") as fh:
        header = fh.read(20)
    assert header[18] == 2 and header[19] == 2  # really in WAL mode
    folder = path.parent
    folder.chmod(0o555)  # even a writable folder would show a stray -shm; a read-only one must still open
    try:
        text = _check(path)
    finally:
        folder.chmod(0o755)
    assert "gemm_kernel" in text
    trace = load_trace(path)
    assert A.sql_query(trace, "SELECT count(*) FROM native.StringIds" if fmt == "nsys" else
                       "SELECT count(*) FROM native.rocpd_string").rows[0][0] > 0
    assert {p.name for p in folder.iterdir()} == {path.name}
    trace.close()


KERNEL_TABLE = {"nsys": "CUPTI_ACTIVITY_KIND_KERNEL", "rocpd": "rocpd_kernel_dispatch"}


def _wal_with_commit(base: dict, fmt: str, name: str) -> Path:
    """A WAL-mode profile whose last committed transaction (one kernel deleted) lives only in its -wal:
    both files are copied while the writer still holds the database open, so nothing was checkpointed."""
    work = base["root"] / f"{name}_writer"
    work.mkdir()
    src = work / base["profiles"][fmt].name
    shutil.copyfile(base["profiles"][fmt], src)
    table = KERNEL_TABLE[fmt]
    con = sqlite3.connect(src)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA wal_autocheckpoint=0")
        physical = table if fmt == "nsys" else con.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_kernel_dispatch%'").fetchone()[0]
        con.execute(f'DELETE FROM "{physical}" WHERE rowid = (SELECT min(rowid) FROM "{physical}")')
        con.commit()
        folder = base["root"] / name
        folder.mkdir()
        path = folder / src.name
        shutil.copyfile(src, path)
        shutil.copyfile(f"{src}-wal", f"{path}-wal")
    finally:
        con.close()
    return path


def _listing(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize("fmt", ["nsys", "rocpd"])
def test_a_transaction_committed_in_the_wal_is_read(base, fmt):
    """SQLite shows the database with its -wal replayed; reading the main file alone would count a deleted
    kernel. The profile and its -wal stay byte-identical and nothing else appears."""
    path = _wal_with_commit(base, fmt, f"walcommit_{fmt}")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:  # what SQLite itself reads
        truth = c.execute(f"SELECT count(*) FROM {KERNEL_TABLE[fmt]}").fetchone()[0]
    assert truth == H.TOTAL_KERNELS - 1
    for p in list(path.parent.iterdir()):  # the read above may have made a -shm: not ours to judge
        if p.name.endswith("-shm"):
            p.unlink()
    before = _listing(path.parent)
    _check(path, expect_kernels=H.TOTAL_KERNELS - 1)
    trace = load_trace(path)
    assert A.sql_query(trace, f"SELECT count(*) FROM native.{KERNEL_TABLE[fmt]}").rows == [[H.TOTAL_KERNELS - 1]]
    trace.close()
    assert _listing(path.parent) == before


def test_the_wal_is_part_of_the_profile_s_identity(base):
    """A store built before the -wal arrived is not served once it is there (same main file, size, mtime)."""
    path = _wal_with_commit(base, "nsys", "walkey")
    wal = path.with_name(path.name + "-wal")
    held = wal.with_name("held-wal")
    wal.rename(held)
    trace = load_trace(path)
    assert trace.count("kernels") == H.TOTAL_KERNELS  # the main file alone: nothing deleted yet
    trace.close()
    held.rename(wal)
    trace = load_trace(path)
    assert trace.count("kernels") == H.TOTAL_KERNELS - 1
    trace.close()


def test_a_garbage_wal_is_ignored_as_sqlite_ignores_it(base):
    path = _craft(base, "nsys", "walgarbage", ["PRAGMA journal_mode=WAL"])
    Path(f"{path}-wal").write_bytes(b"not a write-ahead log" * 100)
    before = _listing(path.parent)
    _check(path)
    assert _listing(path.parent) == before


def test_nul_in_a_name_is_refused_cleanly(base):
    path = _craft(base, "nsys", "nul", [])
    trace = load_trace(path)
    with pytest.raises(ProfileError, match="unknown table"):
        A.describe_table(trace, "native.\"a\x00b\"")
    with pytest.raises(ProfileError, match="(?i)sql"):
        A.sql_query(trace, 'SELECT * FROM native."a\x00b"')
    trace.close()
