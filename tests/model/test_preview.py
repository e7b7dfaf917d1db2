"""The first answer while the store builds (tools/model/trace.py, readers/nsys.py and readers/kineto.py `preview`)
equals the stored one.

Every Nsight profile the fixtures write - clean, damaged (end before start, rows without times or device,
launches before their call, repeated string ids, graph replays, old schemas) - and every real Nsight profile
in ../shared/data is answered twice: from a preview of the export and from its finished store. The answers
(rows, per-device busy and summed time, data-issue notes, window) must be equal, or the preview must
decline (and the store answer); that the preview declines only where the docstring says is checked too.
The same for Kineto: every scenario of the fixtures as a trace of today's and of the 2021 format, the damaged
traces of test_data_issues and of the malformed corpus (bad values, broken structure, odd encodings), and every
real trace in ../shared/data/pytorch, as it is (.json.gz) and uncompressed.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from conftest import real_files
from gpuscope.fixtures import catalog, malformed, malformed_files, scenarios_diagnose, scenarios_graph_summary, scenarios_legacy
from gpuscope.fixtures.writers import kineto, nsys
from gpuscope.tools.analyses.gap_histogram import gap_histogram
from gpuscope.tools.analyses.top_kernels import top_kernels
from gpuscope.tools.model import cache, sqlite_source, trace as trace_mod
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.readers import kineto as kineto_reader, nsys as nsys_reader
from gpuscope.tools.model.detect import detect
from gpuscope.tools.model.limits import duckdb_config
from gpuscope.tools.model.store import store_exists
from gpuscope.tools.model.trace import SCHEMA_SQL

# Each question top_kernels can be asked of a preview (a device filter goes to the store).
QUESTIONS = [{}, {"group_by": "name"}, {"sort_by": "count", "limit": 2}, {"sort_by": "max"}, {"name_contains": "a"},
             {"stream": 7}]


@pytest.fixture(autouse=True)
def _every_size(monkeypatch, tmp_path):
    monkeypatch.setattr(nsys_reader, "PREVIEW_MIN_KERNELS", 0)
    monkeypatch.setattr(kineto_reader, "PREVIEW_MIN_BYTES", 0)
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    # The scanner is looked up again in this cache (a test before may have left it unavailable).
    monkeypatch.setattr(sqlite_source, "_EXTENSION_FILE", False)


def _answer(trace, **kw):
    try:
        return top_kernels(trace, **kw).model_dump()
    except ProfileError as exc:
        return f"refused: {exc}"


class _Asked:
    """Stands for a pending trace: top_kernels asks it for the preview of its question (which reads only what that
    question reads), as it asks a pending Trace."""

    def __init__(self, path, stored=None, fmt: str = "nsys"):
        self.path, self.stored, self.fmt, self.view, self.carried = path, stored, fmt, None, []

    def preview(self, **reads):
        self.view = trace_mod._preview_trace(self.path, self.fmt, lambda *_: None, **reads)
        if self.view is not None:  # the answers a pending Trace would keep for its store
            self.view.__dict__["_carry"] = self.carried
        return self.view or self.stored  # declined: the store answers


def _same(a, b) -> bool:
    """Equal, floats up to their last bits (a sample std-dev's sum depends on the order DuckDB's threads add the rows
    in, in the store as in a preview; answers round it)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _compare(path, fmt: str = "nsys") -> bool:
    """Assert the preview's answers equal the store's; False when the preview declined. Each question is asked of a
    preview that reads everything and of its own preview, whose figures kept for the store (top_kernels' rows, busy
    time, graph kernel count) must equal those the store computes itself."""
    view = trace_mod._preview_trace(path, fmt, lambda *_: None)
    try:
        stored = trace_mod.load_trace(path, store_now=True)
    except ProfileError:  # the store refuses the file: so must the preview
        assert view is None, path
        return False
    try:
        if view is None:
            return False
        try:
            for kw in QUESTIONS:
                expected = _answer(stored, **kw)
                assert _answer(view, **kw) == expected, (path.name, kw)
                asked = _Asked(path, stored, fmt)
                try:
                    answer = _answer(asked, **kw)
                    assert asked.view is not None, (path.name, kw, "its own preview declined")
                    assert answer == expected, (path.name, kw, "its own preview")
                    assert asked.carried
                    for key, value, codec in asked.carried:
                        assert _same(codec.encode(value), codec.encode(stored._memo[key])), (path.name, kw, key)
                finally:
                    if asked.view is not None:
                        asked.view.close()
        finally:
            view.close()
        return True
    finally:
        stored.close()


def _nsys_scenarios():
    makers = {**catalog.SCENARIOS, **scenarios_graph_summary.SCENARIOS, **scenarios_diagnose.SCENARIOS,
              **scenarios_legacy.SCENARIOS}
    out = []
    for name, maker in sorted(makers.items()):
        out.append(pytest.param(maker, id=name))
    return out


@pytest.mark.parametrize("maker", _nsys_scenarios())
def test_preview_answers_as_the_store_on_every_scenario(maker, tmp_path):
    try:
        path = nsys.write(maker(), tmp_path / "p.sqlite")
    except (ValueError, NotImplementedError, KeyError) as exc:
        pytest.skip(f"no Nsight form: {exc}")
    assert _compare(path) is _previewable(path)


def _previewable(path) -> bool:
    """The docstring's rule: kernels, no whole-graph executions, and a capture span that ANALYSIS_DETAILS or the
    kernels and calls alone give."""
    con = sqlite3.connect(path)
    tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    kernels = "CUPTI_ACTIVITY_KIND_KERNEL" in tables and con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    others = tables & {"CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS"}
    return bool(kernels) and "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" not in tables and ("ANALYSIS_DETAILS" in tables or not others)


def _damaged(tmp_path, name="bad.sqlite"):
    """Kernels and calls with end before start, a kernel that starts before its launching call (clocks out of step)."""
    s = copy.deepcopy(scenarios_diagnose.launch_bound())
    for i in (3, 4, 9):
        s.kernels[i] = replace(s.kernels[i], end_ns=s.kernels[i].start_ns - 5)
    s.api_calls[2] = replace(s.api_calls[2], end_ns=s.api_calls[2].start_ns - 7)
    call = next(c for c in s.api_calls if c.correlation_id == s.kernels[20].correlation_id)
    s.kernels[20] = replace(s.kernels[20], start_ns=call.start_ns - 1_000, end_ns=call.start_ns + 500)
    return nsys.write(s, tmp_path / name)


def _edit(path, sql: str) -> None:
    con = sqlite3.connect(path)
    con.executescript(sql)
    con.commit()
    con.close()


def test_preview_counts_the_data_issues_the_store_counts(tmp_path):
    path = _damaged(tmp_path)
    assert _compare(path)
    stored = trace_mod.load_trace(path, store_now=True)
    notes = top_kernels(stored).data_issues
    stored.close()
    assert any("end before start" in n for n in notes) and any("before its launching API call" in n for n in notes)


def test_preview_counts_rows_without_times_or_device(tmp_path):
    path = _damaged(tmp_path)
    _edit(path, """
        ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k_old;
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM k_old;
        DROP TABLE k_old;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE rowid = 1;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = NULL WHERE rowid = 2;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = NULL WHERE rowid = 5;
        DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 7;""")
    assert _compare(path)


def test_preview_with_repeated_string_ids_and_correlation_ids(tmp_path):
    path = _damaged(tmp_path)
    _edit(path, """
        ALTER TABLE StringIds RENAME TO s_old;
        CREATE TABLE StringIds AS SELECT * FROM s_old;
        DROP TABLE s_old;
        INSERT INTO StringIds SELECT id, value || '_twin' FROM StringIds WHERE id = (SELECT min(shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid <= 3;""")
    assert _compare(path)


def test_preview_declines_where_only_the_full_reader_is_exact(tmp_path):
    path = _damaged(tmp_path)
    _edit(path, "UPDATE StringIds SET value = value || printf('%.70000c', 'x') WHERE id = (SELECT min(shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL);")
    assert not _compare(path)  # the long name is cut by check_model
    no_span = _damaged(tmp_path, "no_span.sqlite")
    _edit(no_span, "DROP TABLE IF EXISTS ANALYSIS_DETAILS;")
    con = sqlite3.connect(no_span)
    has_other = con.execute("SELECT count(*) FROM sqlite_master WHERE name IN ('CUPTI_ACTIVITY_KIND_MEMCPY', "
                            "'CUPTI_ACTIVITY_KIND_MEMSET', 'NVTX_EVENTS')").fetchone()[0]
    con.close()
    assert _compare(no_span) is not bool(has_other)


def test_a_preview_outgrowing_memory_keeps_its_kernels_in_a_file_and_answers_as_the_store(tmp_path, monkeypatch):
    """Large exports keep the preview's kernel table compressed in a database file: the same answers, with the data
    issues repaired in that table (end before start, a kernel before its call) and graph replays marked from it."""
    monkeypatch.setattr(nsys_reader, "PREVIEW_BYTES_PER_KERNEL", 2**40)  # every export outgrows the preview's memory
    damaged = _damaged(tmp_path)
    view = trace_mod._preview_trace(damaged, "nsys", lambda *_: None)
    assert view.scalar("SELECT count(*) FROM duckdb_tables() WHERE database_name = '_preview'") == 1
    view.close()
    assert not list((tmp_path / "cache").rglob("preview-*"))  # the file goes with its connection
    assert _compare(damaged)
    for name in ("graph_replays", "graph_replays_no_ids"):
        assert _compare(nsys.write(scenarios_graph_summary.SCENARIOS[name](), tmp_path / f"{name}.sqlite"))


@pytest.mark.parametrize("path", real_files("nsys/*.sqlite"), ids=lambda p: p.name)
def test_preview_answers_as_the_store_on_real_profiles(path):
    assert _compare(path)


def _answered_then_built(path):
    """A first open of `path`: pending, its first top_kernels answered (from the preview), then its store built."""
    cache.clear()
    pending = cache.open_trace(path)
    assert not pending.ready and not store_exists(path)
    first = top_kernels(pending).model_dump()
    pending._builder.join(timeout=120)
    assert pending.ready and store_exists(path) and pending.store.built
    return pending, first


def test_a_pending_trace_answers_first_then_builds_in_the_background(tmp_path):
    path = _damaged(tmp_path)
    pending, first = _answered_then_built(path)
    assert top_kernels(pending).model_dump() == first
    gap_histogram(pending)  # any tool reads the finished store
    again = trace_mod.load_trace(path)  # a new open finds the store: no preview
    assert again.ready and not again.store.built
    # the preview's answers were kept in the store, and equal what the store computes itself
    saved = list((again.store.folder / "answers").iterdir())
    assert saved
    assert top_kernels(again).model_dump() == first
    for f in saved:
        f.unlink()
    again._memo.clear()
    assert top_kernels(again).model_dump() == first
    again.close()
    cache.clear()


def test_another_tool_first_waits_for_the_store(tmp_path):
    path = _damaged(tmp_path)
    pending = trace_mod.load_trace(path)
    assert not pending.ready
    gap_histogram(pending)
    assert pending.ready and pending._builder is None and store_exists(path)
    pending.close()


def test_a_failed_background_build_is_an_error_not_a_hang(tmp_path, monkeypatch):
    path = _damaged(tmp_path)
    pending = trace_mod.load_trace(path)

    def broken(con, path, progress, detected):
        raise ProfileError("the export could not be read (test)")

    monkeypatch.setattr(nsys_reader, "load", broken)
    first = top_kernels(pending)  # the preview still answers
    assert first.kernels
    pending._builder.join(timeout=120)
    assert not pending._builder.is_alive()
    for _ in range(2):  # every later question says why, at once
        with pytest.raises(ProfileError, match="could not be read"):
            gap_histogram(pending)
    assert not store_exists(path)
    pending.close()


def test_concurrent_first_questions_share_one_build(tmp_path):
    path = _damaged(tmp_path)
    pending = trace_mod.load_trace(path)
    answers, errors = [], []

    def ask():
        try:
            answers.append(top_kernels(pending).model_dump())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(answers) == 4 and all(a == answers[0] for a in answers)
    pending._builder.join(timeout=120)
    assert pending.ready
    pending.close()


# -- Kineto ----------------------------------------------------------------------------------------------------------

def _kineto_makers():
    from gpuscope.fixtures import (scenarios_api_summary, scenarios_critical_path, scenarios_iterations, scenarios_marker_summary,
                                   scenarios_memcpy_summary, scenarios_memory, scenarios_nccl, scenarios_ops_summary,
                                   scenarios_partial, scenarios_regression, scenarios_stream_summary, scenarios_timeline)

    modules = (catalog, scenarios_api_summary, scenarios_critical_path, scenarios_diagnose, scenarios_graph_summary,
               scenarios_iterations, scenarios_legacy, scenarios_marker_summary, scenarios_memcpy_summary, scenarios_memory,
               scenarios_nccl, scenarios_ops_summary, scenarios_partial, scenarios_regression, scenarios_stream_summary,
               scenarios_timeline)
    makers = {f"{m.__name__.rsplit('.', 1)[1]}.{name}": maker for m in modules for name, maker in m.SCENARIOS.items()}
    return [pytest.param(maker, legacy, id=f"{name}{'-2021' if legacy else ''}")
            for name, maker in sorted(makers.items()) for legacy in (False, True)]


@pytest.fixture
def kineto_compare(monkeypatch):
    """_compare for Kineto that also checks the preview declines exactly where its docstring says: where load() takes
    the json.loads path or refuses the file, and for a trace without kernels (gzip input is tested apart)."""
    fell_back = []
    original = kineto_reader._load_python
    monkeypatch.setattr(kineto_reader, "_load_python", lambda *a: fell_back.append(1) or original(*a))

    def compare(path: Path) -> bool:
        fell_back.clear()
        previewed = _compare(path, "kineto")
        try:
            stored = trace_mod.load_trace(path, store_now=True)
        except ProfileError:
            assert not previewed
            return previewed
        try:
            assert previewed is (not fell_back and stored.count("kernels") > 0), (path, fell_back)
        finally:
            stored.close()
        return previewed
    return compare


@pytest.mark.parametrize("maker,legacy", _kineto_makers())
def test_kineto_preview_answers_as_the_store_on_every_scenario(maker, legacy, tmp_path, kineto_compare):
    try:
        path = kineto.write(maker(), tmp_path / "t.pt.trace.json", legacy=legacy)
    except (ValueError, NotImplementedError, KeyError) as exc:
        pytest.skip(f"no Kineto form: {exc}")
    kineto_compare(path)


@pytest.mark.parametrize("case", ["kineto", "kineto_text"])
def test_kineto_preview_counts_the_data_issues_the_store_counts(case, tmp_path, kineto_compare):
    import test_data_issues as d

    s = d.scenario()
    s.options["raw_values"] = d.CASES[case][2]
    path = kineto.write(s, tmp_path / "bad.json")
    assert kineto_compare(path)
    stored = trace_mod.load_trace(path, store_now=True)
    notes = top_kernels(stored).data_issues
    stored.close()
    assert len(notes) == sum(t == "kernels" for t, *_ in d.CASES[case][3])


_KINETO_CORPUS = [e for e in malformed.CORPUS if e.name.startswith(("kineto-", "truncated-kineto-"))]


@pytest.fixture(scope="module")
def kineto_base(tmp_path_factory):
    return malformed_files.base_profiles(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize("entry", _KINETO_CORPUS, ids=lambda e: e.name)
def test_kineto_preview_on_the_malformed_corpus(entry, kineto_base, tmp_path, kineto_compare):
    path = Path(entry.build(tmp_path, kineto_base))
    kineto_compare(path)


@pytest.mark.parametrize("path", real_files("pytorch/*.json.gz"), ids=lambda p: p.name)
def test_kineto_preview_answers_as_the_store_on_real_traces(path, tmp_path, kineto_compare):
    plain = tmp_path / path.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    assert kineto_compare(plain)
    assert kineto_compare(path)


def test_a_kineto_trace_is_previewed_by_its_decompressed_size(tmp_path, monkeypatch):
    """The gate (model/trace.py) reads a .json.gz's size from its gzip trailer: the preview is tried for a small file
    that decompresses to a large trace, as for that trace uncompressed, and not for a small one."""
    monkeypatch.setattr(kineto_reader, "PREVIEW_MIN_BYTES", 4096)
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i, "dur": 1} for i in range(400)]
    big = json.dumps({"traceEvents": events}).encode()
    assert len(big) >= 4096 and len(gzip.compress(big)) < 4096
    for name, data, large in (("big.json", big, True), ("big.json.gz", gzip.compress(big), True),
                              ("small.json", big[:100], False), ("small.json.gz", gzip.compress(big[:100]), False)):
        (tmp_path / name).write_bytes(data)
        assert trace_mod.PREVIEW_GATES["kineto"](tmp_path / name) is large, name


def test_a_pending_kineto_trace_answers_first_then_builds_in_the_background(tmp_path):
    path = kineto.write(scenarios_diagnose.launch_bound(), tmp_path / "t.pt.trace.json")
    pending, first = _answered_then_built(path)
    assert pending.count("native.events") > 0  # the finished store, not the preview
    again = trace_mod.load_trace(path)
    for f in (again.store.folder / "answers").iterdir():  # computed by the store itself
        f.unlink()
    assert top_kernels(again).model_dump() == first
    again.close()
    cache.clear()


def test_a_base_name_missing_from_string_ids(tmp_path):
    """The reader names such a kernel after its demangled name: a preview without names declines (the store answers),
    one with them answers."""
    path = _damaged(tmp_path)
    _edit(path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 987654321 WHERE rowid = 3;")
    stored = trace_mod.load_trace(path, store_now=True)
    try:
        for kw, previewed in (({}, False), ({"group_by": "name"}, True), ({"name_contains": "a"}, True)):
            asked = _Asked(path, stored)
            assert _answer(asked, **kw) == _answer(stored, **kw), kw
            assert (asked.view is not None) is previewed, kw
            if asked.view is not None:
                asked.view.close()
    finally:
        stored.close()



def _gz(scenario, path: Path) -> Path:
    plain = kineto.write(scenario, path.with_name(path.name.removesuffix(".gz")))
    path.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return path


@pytest.mark.parametrize("fmt", ["nsys", "kineto"])
@pytest.mark.parametrize("order", [False, True])
def test_a_reader_puts_back_the_settings_it_found(tmp_path, fmt, order):
    """The readers change DuckDB settings around a statement or a build (insertion order, threads, the memory limit,
    an optimizer) and put back what they found, which a caller may have set, not what DuckDB starts with."""
    scenario = catalog.SCENARIOS["concurrent_streams"]()
    path = (nsys.write if fmt == "nsys" else kineto.write)(scenario, tmp_path / f"t.{fmt}")
    reader = nsys_reader if fmt == "nsys" else kineto_reader
    names = ("preserve_insertion_order", "threads", "memory_limit", "disabled_optimizers")
    for read in (lambda con: reader.preview(con, path), lambda con: reader.load(con, path, lambda *_: None, detect(path))):
        con = duckdb.connect(":memory:", config={**duckdb_config(256 * 2**20), "preserve_insertion_order": str(order).lower(),
                                                 "threads": "2"})
        con.execute(SCHEMA_SQL)
        found = [con.execute(f"SELECT current_setting('{n}')").fetchone()[0] for n in names]
        read(con)
        assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(scenario.kernels)
        assert [con.execute(f"SELECT current_setting('{n}')").fetchone()[0] for n in names] == found
        con.close()


def test_the_build_after_a_kineto_preview_reads_the_parts_the_preview_staged(tmp_path, monkeypatch):
    """A .json.gz is decompressed once: the store's build that follows the preview parses the parts the preview staged,
    which are removed once the build is over; the store holds every kernel the generator wrote."""
    staged, kept = [], []
    stage, keep = kineto_reader._stage, kineto_reader._staged.keep
    monkeypatch.setattr(kineto_reader, "_stage", lambda *a, **kw: staged.append(1) or stage(*a, **kw))
    monkeypatch.setattr(kineto_reader._staged, "keep", lambda path, staged: kept.append(staged[0]) or keep(path, staged))
    scenario = scenarios_diagnose.launch_bound()
    path = _gz(scenario, tmp_path / "t.pt.trace.json.gz")
    pending, first = _answered_then_built(path)
    assert len(staged) == 1 and len(kept) == 1
    assert not Path(kept[0]).exists() and kineto_reader._staged._kept is None
    assert pending.count("kernels") == len(scenario.kernels)
    assert sum(d["kernel_count"] for d in first["devices"]) == len(scenario.kernels)
    pending.close()
    cache.clear()


def test_a_trace_rewritten_between_its_preview_and_its_build_is_staged_anew(tmp_path):
    """The parts a preview kept are for the content it read: rewritten in between, the build reads the new file."""
    path = _gz(scenarios_diagnose.launch_bound(), tmp_path / "t.pt.trace.json.gz")
    view = trace_mod._preview_trace(path, "kineto", lambda *_: None)
    assert view is not None and kineto_reader._staged._kept is not None
    view.close()
    other = catalog.SCENARIOS["concurrent_streams"]()
    _gz(other, path)
    stored = trace_mod.load_trace(path, store_now=True)
    try:
        assert stored.count("kernels") == len(other.kernels)
        assert kineto_reader._staged._kept is None
    finally:
        stored.close()


def test_a_gzip_bomb_refused_by_the_preview_is_not_unpacked_again_by_the_build(tmp_path, monkeypatch):
    """The preview stops at the decompression cap; the store's build that follows says the same without unpacking the
    file a second time (a few MB of gzip that expand past the cap cost that time once)."""
    monkeypatch.setenv("GPUSCOPE_MAX_DECOMPRESSED_GB", "0.001")  # 1 MB
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i, "dur": 1, "args": {"pad": "x" * 200}}
              for i in range(10_000)]
    path = tmp_path / "bomb.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    opened = []
    reader = kineto_reader._gzip_reader
    monkeypatch.setattr(kineto_reader, "_gzip_reader", lambda *a: opened.append(1) or reader(*a))
    pending = cache.open_trace(path)
    assert not pending.ready
    with pytest.raises(ProfileError, match="GPUSCOPE_MAX_DECOMPRESSED_GB"):
        top_kernels(pending)
    assert len(opened) == 1
    pending.close()
    cache.clear()
