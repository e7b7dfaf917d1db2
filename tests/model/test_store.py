"""The persistent trace store: reopened identically by a new process, never stale, built once, bounded.

Every check reads the store through the public entry points (load_trace, open_trace, the CLI) in fresh
processes where the claim is about processes; figures come from the fixture scenarios, not the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, write_scenario
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.samples import real_profiles
from gpuscope.tools import analyses as A
from gpuscope.tools.model import cache, store
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

RUNNER = Path(__file__).with_name("run_every_tool.py")
GPUSCOPE = Path(sys.executable).with_name("gpuscope")


def _env(cache_dir: Path, **extra: str) -> dict:
    return {**os.environ, "GPUSCOPE_CACHE_DIR": str(cache_dir), **extra}


def _run_every_tool(paths: list[Path], cache_dir: Path) -> dict:
    out = subprocess.run([sys.executable, str(RUNNER), *map(str, paths)], env=_env(cache_dir), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _sample(tmp_path: Path, fmt: str, name: str = "concurrent_streams") -> Path:
    suffix = {"nsys": ".sqlite", "rocpd": "_results.db", "kineto": ".pt.trace.json"}[fmt]
    return write_scenario(SCENARIOS[name](), fmt, tmp_path / f"{name}{suffix}")


def test_every_tool_answers_the_same_from_a_new_store_and_a_reopened_one(tmp_path):
    """First process builds each store; a second process reopens them and every tool's answer is identical."""
    paths = [_sample(tmp_path, fmt) for fmt in ("nsys", "rocpd", "kineto")] + real_profiles()
    first = _run_every_tool(paths, tmp_path / "cache")
    again = _run_every_tool(paths, tmp_path / "cache")
    for p in map(str, paths):
        assert first[p]["built"] and not again[p]["built"], p
        assert not first[p]["in_memory"]
        assert first[p]["answers"] == again[p]["answers"], p
    if DATA.is_dir():
        assert len(paths) > 3


def test_a_profile_rewritten_with_the_same_size_and_mtime_is_read_again(tmp_path):
    """JSON (hashed whole): one kernel's duration changes digit for digit; size and mtime are restored."""
    path = _sample(tmp_path, "kineto")
    before = load_trace(path)
    total = before.scalar("SELECT sum(dur_ns) FROM kernels")
    st = path.stat()
    text = path.read_text()
    import re

    m = re.search(r'"cat": ?"kernel".*?"dur": ?(\d)', text)
    assert m, "the fixture has a kernel with a duration"
    digit = m.group(1)
    changed = text[:m.start(1)] + ("1" if digit != "1" else "2") + text[m.end(1):]
    path.write_text(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    # The kernel's dur is in µs in the file: its first digit is worth 10^k µs.
    after = load_trace(path)
    assert after.store.built and after.store.key != before.store.key
    assert after.scalar("SELECT sum(dur_ns) FROM kernels") != total
    # and a running cache follows the file too (ctime changed even though size and mtime did not)
    cached = cache.open_trace(path)
    assert cached.store.key == after.store.key


def test_large_sqlite_profile_edited_in_place_gets_a_new_store(tmp_path, monkeypatch):
    """Sampled identity (files above WHOLE_FILE): an UPDATE through SQLite changes the header's change counter."""
    import sqlite3

    monkeypatch.setattr(store, "WHOLE_FILE", 0)
    path = _sample(tmp_path, "nsys")
    st = path.stat()
    key = store.content_key(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = \"end\" + 1 WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    con.commit()
    con.close()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    assert store.content_key(path) != key


def test_two_processes_opening_one_new_profile_build_it_once(tmp_path):
    path = _sample(tmp_path, "nsys", "concurrent_streams")
    code = ("import json,sys; from gpuscope.tools.model.trace import load_trace; t = load_trace(sys.argv[1]); "
            "print(json.dumps([t.store.built, t.scalar('SELECT count(*) FROM kernels'), str(t.store.folder)]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], env=_env(tmp_path / "cache"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    assert sorted(r[0] for r in results) == [False, True]  # one built, the other waited and reopened
    assert results[0][1:] == results[1][1:]
    assert results[0][1] == len(SCENARIOS["concurrent_streams"]().kernels)
    assert not list((tmp_path / "cache" / "stores").glob("*/.tmp-*")), "a temporary build folder was left"


def test_what_a_killed_process_staged_goes_when_the_next_process_opens_a_store(tmp_path):
    """A Kineto trace's staged parts are in the process's scratch folder in the cache, not the system's temp folder:
    what a killed process leaves there (a host's SIGTERM exits without cleaning up) goes with the next open."""
    path = _sample(tmp_path, "kineto")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = _env(tmp_path / "cache", TMPDIR=str(temp))
    dies = ("import os, sys; from gpuscope.tools.model.readers import kineto; "
            "kineto._read_events = lambda *a, **kw: os._exit(9); "
            "from gpuscope.tools.model.trace import load_trace; load_trace(sys.argv[1], store_now=True)")
    killed = subprocess.run([sys.executable, "-c", dies, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == 9, killed.stderr[-2000:]
    scratch = tmp_path / "cache" / "spill"
    left = list(scratch.glob("*/kineto-*/*.json"))
    assert left, "the killed process staged nothing in its scratch folder"
    assert not list(temp.iterdir()), "staged in the system's temp folder"
    opens = ("import sys; from gpuscope.tools.model.trace import load_trace; "
             "print(load_trace(sys.argv[1], store_now=True).count('kernels'))")
    out = subprocess.run([sys.executable, "-c", opens, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == len(SCENARIOS["concurrent_streams"]().kernels)
    assert not left[0].parent.parent.exists(), "the killed process's scratch folder is still there"
    assert not list(scratch.glob("*/kineto-*")) and not list(temp.iterdir())


def test_a_store_of_another_version_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = _sample(tmp_path, "kineto")
    old = load_trace(path)
    old_folder = old.store.folder
    old.close()
    monkeypatch.setattr(store, "STORE_VERSION", "0" * 16)
    new = load_trace(path)
    assert new.store.built and new.store.folder != old_folder
    assert old_folder.is_dir()  # the other version's store stays until eviction (another gpuscope may use it)
    new.close()
    assert store.list_stores()[0].folder == old_folder and not store.list_stores()[0].current  # evicted first


def test_unwritable_cache_falls_back_to_memory_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(blocker / "cache"))
    path = _sample(tmp_path, "nsys")
    trace = load_trace(path)
    assert trace.store.in_memory
    assert any("held in memory" in w for w in trace.warnings)
    s = SCENARIOS["concurrent_streams"]()
    assert A.top_kernels(trace).devices[0].kernel_count == len(s.kernels)
    assert any("held in memory" in w for w in A.trace_info(trace).warnings)
    with pytest.raises(ProfileError, match="GPUSCOPE_CACHE_DIR"):
        A.sql_query(trace, "SELECT count(*) FROM kernels")
    trace.close()


def test_eviction_keeps_stores_in_use_and_drops_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    a = load_trace(_sample(tmp_path, "nsys", "two_gpus_one_process"))
    b = load_trace(_sample(tmp_path, "nsys", "concurrent_streams"))
    monkeypatch.setenv("GPUSCOPE_CACHE_GB", "0")
    assert store.evict() == []  # both open: nothing may go
    a_folder = a.store.folder
    a.close()
    removed = store.evict()
    assert [e.folder for e in removed] == [a_folder] and not a_folder.exists()
    assert b.store.folder.is_dir() and A.top_kernels(b).devices
    b.close()


def test_cache_list_and_clear_from_the_command_line(tmp_path):
    path = _sample(tmp_path, "rocpd")
    env = _env(tmp_path / "cache")
    subprocess.run([str(GPUSCOPE), "trace-info", str(path)], env=env, check=True, capture_output=True)
    listed = json.loads(subprocess.run([str(GPUSCOPE), "cache", "list", "--json"], env=env, check=True,
                                       capture_output=True, text=True).stdout)
    assert [s["profile"] for s in listed["stores"]] == [str(path)]
    assert listed["stores"][0]["profile_bytes"] == path.stat().st_size and listed["stores"][0]["store_bytes"] > 0
    cleared = json.loads(subprocess.run([str(GPUSCOPE), "cache", "clear", "--json"], env=env, check=True,
                                        capture_output=True, text=True).stdout)
    assert len(cleared["stores"]) == 1 and not cleared["kept_in_use"]
    assert not list((tmp_path / "cache" / "stores").glob("*/*/model.duckdb"))


def test_a_job_s_stacked_store_is_listed_counted_evicted_and_cleared(tmp_path, monkeypatch):
    """The job file rank_summary builds (tools/model/job.py: one DuckDB file stacking the ranks' tables) is part of
    the cache: `cache list` shows it, a process using it holds it against eviction, GPUSCOPE_CACHE_GB counts it and
    `cache clear` removes it."""
    from gpuscope.fixtures.scenarios_job import PID0, job
    from gpuscope.fixtures.writers import kineto

    folder = tmp_path / "job"
    folder.mkdir()
    paths = [kineto.write(job(3, 1, 2), folder / f"rank{r}.pt.trace.json", pid=PID0 + r) for r in range(3)]
    env = _env(tmp_path / "cache")
    subprocess.run([str(GPUSCOPE), "rank-summary", str(folder)], env=env, check=True, capture_output=True)
    listed = json.loads(subprocess.run([str(GPUSCOPE), "cache", "list", "--json"], env=env, check=True,
                                       capture_output=True, text=True).stdout)
    (stack,) = [e for e in listed["stores"] if e["format"] == "job"]
    assert sorted(e["profile"] for e in listed["stores"] if e["format"] != "job") == sorted(map(str, paths))
    assert stack["profile"] == f"{paths[0]} (+2 more ranks)" and stack["store_bytes"] > 0 and not stack["in_use"]
    assert stack["profile_bytes"] == sum(p.stat().st_size for p in paths)

    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    traces = [load_trace(p) for p in paths]
    A.rank_summary(traces)  # this process now holds the job file
    monkeypatch.setenv("GPUSCOPE_CACHE_GB", "0")
    for t in traces:
        t.close()
    removed = store.evict()
    assert "job" not in [e.format for e in removed]  # still attached here: kept
    assert [e.format for e in store.list_stores()] == ["job"]
    deleted, kept = store.clear()
    assert deleted == [] and [e.format for e in kept] == ["job"]
    from gpuscope.tools.model.job import release_stacks

    release_stacks()
    deleted, kept = store.clear()
    assert [e.format for e in deleted] == ["job"] and kept == [] and store.list_stores() == []
    assert not list((tmp_path / "cache" / "stores").glob("*/.jobs/*.duckdb"))


def test_xdg_cache_home_is_the_default_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUSCOPE_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    path = _sample(tmp_path, "kineto")
    subprocess.run([str(GPUSCOPE), "trace-info", str(path)], env=env, check=True, capture_output=True)
    assert list((tmp_path / "xdg" / "gpuscope" / "stores").glob("*/*/model.duckdb"))


def test_a_held_profile_is_not_closed_by_eviction(tmp_path, monkeypatch):
    """Leases: more profiles than the cache keeps, opened inside one tool call, all stay usable until it ends."""
    monkeypatch.setattr(cache, "MAX_TRACES", 2)
    cache.clear()
    paths = [_sample(tmp_path / str(i), "nsys") for i in range(5) if (tmp_path / str(i)).mkdir() is None]
    with cache.leases():
        traces = [cache.open_trace(p) for p in paths]
        assert all(A.top_kernels(t).devices for t in traces)  # none closed under the call
        assert cache.open_count() == 5
    assert cache.open_count() == 2  # released: the evicted three are closed now
    cache.clear()


def test_small_memory_limit_spills_instead_of_failing(tmp_path):
    """A sort far larger than a 64 MiB limit completes on the process's analysis instance (it spills)."""
    code = ("from gpuscope.tools.model.hub import hub; "
            "print(hub().con.execute(\"SELECT count(*), min(s) < max(s) FROM (SELECT md5(range::VARCHAR) s "
            "FROM range(3000000) ORDER BY s)\").fetchone())")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "cache", GPUSCOPE_MEMORY_LIMIT="64MiB"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(3000000, True)"


def test_duckdb_gets_a_thread_per_64_mib_of_the_limit(tmp_path):
    """The analysis instance runs one DuckDB thread per 64 MiB of GPUSCOPE_MEMORY_LIMIT, at most DuckDB's own count: two
    threads' buffers did not fit in 64 MiB (tests/analyses/test_iterations.py runs the heavy tools there)."""
    import duckdb

    code = ("from gpuscope.tools.model.hub import hub; "
            "print(hub().con.execute(\"SELECT current_setting('threads')\").fetchone()[0])")
    own = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
    for limit, threads in (("64MiB", 1), ("127MiB", 1), ("128MiB", min(2, own)), ("800MB", min(11, own))):
        out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "cache", GPUSCOPE_MEMORY_LIMIT=limit),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert int(out.stdout.strip().splitlines()[-1]) == threads, limit


def _instance_settings(tmp_path, *names: str) -> dict[str, list[str]]:
    """For each DuckDB setting in `names`, its value in a plain duckdb.connect(), in the analysis instance and in an
    instance limits.connect makes (builds, previews, sql_query's worker), read in a new process run as python -c."""
    q = "SELECT " + ", ".join(f"current_setting('{n}')" for n in names)
    code = ("import duckdb\n"
            "from gpuscope.tools.model.hub import hub\n"
            "from gpuscope.tools.model.limits import connect, duckdb_config\n"
            f"q = {q!r}\n"
            "for con in (duckdb.connect(), hub().con, connect(':memory:', duckdb_config())):\n"
            "    print(*con.execute(q).fetchone(), sep='|')")
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "cache"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|") for line in out.stdout.strip().splitlines()[-3:]]
    return {n: [r[i] for r in rows] for i, n in enumerate(names)}


def test_every_instance_hands_freed_memory_back_to_the_os(tmp_path):
    """jemalloc's background threads purge freed pages, and a bulk free of 64 MiB or more flushes them at once: in the
    analysis instance and in every instance limits.connect makes (builds, previews). Without them a 10 M-kernel store
    build peaked anywhere from 1.22 to 1.55 GB; the README's memory figures rely on them."""
    got = _instance_settings(tmp_path, "allocator_background_threads", "allocator_bulk_deallocation_flush_threshold")
    assert got["allocator_background_threads"][1:] == ["True", "True"]
    assert got["allocator_bulk_deallocation_flush_threshold"][1:] == ["64.0 MiB", "64.0 MiB"]


def test_no_instance_draws_duckdb_s_progress_bar_where_python_counts_as_interactive(tmp_path):
    """DuckDB's Python client turns its progress bar on for a connection made where __main__ has no file (python -c,
    as here) and draws it on fd 1, a stdio server's protocol stream: the analysis instance and every instance made by
    limits.connect (builds, previews, sql_query's worker) have it off."""
    plain, analysis, built = _instance_settings(tmp_path, "enable_progress_bar")["enable_progress_bar"]
    if plain != "True":
        pytest.skip("this DuckDB client does not turn the progress bar on under python -c")
    assert (analysis, built) == ("False", "False")


def test_two_instances_of_one_process_spill_without_mixing_their_rows(tmp_path, monkeypatch):
    """The hub and a build behind a preview live in one process and both spill: each must read back its own rows.
    With one spill folder per process their same-named spill files overwrote each other and sums came back wrong."""
    import duckdb

    from gpuscope.tools.model.limits import duckdb_config

    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    n = 6_000_000  # three BIGINT columns: ~144 MB per instance against a 64 MiB limit
    cons = [duckdb.connect(config={**duckdb_config(64 * 2**20), "threads": "2"}) for _ in range(2)]
    try:
        for k, con in enumerate(cons):
            con.execute(f"CREATE TABLE t AS SELECT i, i * {k + 2} AS j, i % 7 AS m FROM range({n}) r(i)")
        assert len({con.execute("SELECT current_setting('temp_directory')").fetchone()[0] for con in cons}) == 2
        for k, con in enumerate(cons):
            assert con.execute("SELECT sum(i)::HUGEINT, sum(j)::HUGEINT, count(*) FROM t").fetchone() == (
                n * (n - 1) // 2, (k + 2) * n * (n - 1) // 2, n)
    finally:
        for con in cons:
            con.close()


def test_a_cache_that_turns_read_only_falls_back_to_memory(tmp_path, monkeypatch):
    """Lock files cannot be created (EROFS): the profile is still analysed, in memory, with the warning."""
    import errno

    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))

    def read_only(path, mode):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(store, "_flock", read_only)
    trace = load_trace(_sample(tmp_path, "kineto"))
    assert trace.store.in_memory and any("held in memory" in w for w in trace.warnings)
    assert A.top_kernels(trace).devices[0].kernel_count == len(SCENARIOS["concurrent_streams"]().kernels)
    trace.close()


def test_a_later_process_reads_top_kernels_from_the_store_and_a_damaged_answer_is_recomputed(tmp_path, monkeypatch):
    """A figure computed once is kept in the store: a new Trace (as in a new process: empty memo) answers top_kernels
    without scanning the kernels, identically; an answer file that no longer parses is recomputed, never misread."""
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = _sample(tmp_path, "nsys")
    first = load_trace(path)
    expected = A.top_kernels(first).model_dump()
    folder = first.store.folder
    first.close()
    saved = sorted((folder / store.ANSWERS_DIR).glob("*.json"))
    assert len(saved) == 3  # the grouped rows, the per-device busy time and whether any kernel ran in a graph replay

    again = load_trace(path)
    assert not again.store.built
    from gpuscope.tools.analyses import intervals

    def no_scan(*a, **k):
        raise AssertionError("recomputed instead of read from the store")
    with monkeypatch.context() as m:
        m.setattr(again, "sql_dicts", no_scan)  # the grouped rows
        m.setattr(intervals, "_compute", no_scan)  # the interval union behind the busy time
        assert A.top_kernels(again).model_dump() == expected
    again.close()

    for f in saved:
        f.write_text('{"key": "damaged')
    third = load_trace(path)
    assert A.top_kernels(third).model_dump() == expected
    third.close()
    assert all(json.loads(f.read_text())["key"] != "damaged" for f in saved)  # rewritten whole


def test_saved_answers_are_tied_to_the_analysis_code(tmp_path, monkeypatch):
    """An answer saved by other analysis code (same store, same query text) is not read: part of it was computed in
    Python, which the key's query text does not show."""
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = _sample(tmp_path, "nsys")
    first = load_trace(path)
    expected = A.top_kernels(first).model_dump()
    first.close()
    monkeypatch.setattr(store, "ANSWERS_VERSION", "other-code")
    again = load_trace(path)
    from gpuscope.tools.analyses import intervals

    computed = []
    original = intervals._compute
    monkeypatch.setattr(intervals, "_compute", lambda *a: computed.append(1) or original(*a))
    assert A.top_kernels(again).model_dump() == expected
    assert computed  # recomputed, not read
    again.close()
