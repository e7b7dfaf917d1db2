"""Property-based fuzzing of the readers (Hypothesis, fixed budget, derandomized).

Whatever a profile holds, opening it ends in a ProfileError or in a model whose invariants hold:
dur_ns = end_ns - start_ns >= 0 in every table with durations, no NULL in a NOT NULL column, no
table with more rows than the source rows of its kind, and trace_info / top_kernels answer.
The sources are random Kineto event lists (random types in every field, missing keys, unicode,
huge numbers), and random values of random types written over cells of the sample Nsight and
rocpd databases. The Kineto staging step is also checked alone: whatever the layout around the
traceEvents array (keys before and after it, whitespace, BOM, gzip members cut anywhere), the
bytes it stages are the array and the keys it returns are the others.

derandomize=True makes every run try the same examples, so CI is reproducible and the budget fixed
(about 20 s on an idle 2-core machine); a failure prints the shrunk example.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuscope.fixtures.samples import ACTION_WORDS, write_profiles
from gpuscope.tools.analyses.top_kernels import top_kernels
from gpuscope.tools.analyses.trace_info import trace_info
from gpuscope.tools.model.detect import Detected
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.quality import DURATION_TABLES
from gpuscope.tools.model.readers import kineto
from gpuscope.tools.model.trace import load_trace


def _budget(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


_ids = itertools.count()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    return write_profiles(tmp_path_factory.mktemp("fuzz_base"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fresh(work: Path, name: str) -> Path:
    """A new path per example: an example never sees the store of the one before."""
    folder = work / str(next(_ids))
    folder.mkdir()
    return folder / name


def _check_model(trace, at_most: dict[str, int]) -> None:
    for table in DURATION_TABLES:
        bad = trace.scalar(f"SELECT count(*) FROM {table} WHERE dur_ns IS DISTINCT FROM end_ns - start_ns OR dur_ns < 0")
        assert bad == 0, f"{table}: {bad} rows with dur_ns <> end_ns - start_ns or dur_ns < 0"
    not_null = trace.sql("SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main' "
                         "AND NOT is_nullable AND NOT internal")
    assert not_null
    for table, column in not_null:
        assert trace.scalar(f'SELECT count(*) FROM "{table}" WHERE "{column}" IS NULL') == 0, (table, column)
    for table, n in at_most.items():
        assert trace.count(table) <= n, f"{table}: {trace.count(table)} rows from {n} source rows"
    try:  # an analysis may refuse (no timed events, no kernels), in words that say what to do
        info = trace_info(trace)
        assert info.format == trace.format
        top = top_kernels(trace)
        assert sum(d.kernel_count for d in top.devices) <= trace.count("kernels")
    except ProfileError as exc:
        assert any(w in str(exc).lower() for w in ACTION_WORDS + ("capture",)), str(exc)


def _open_and_check(path: Path, at_most: dict[str, int]) -> None:
    try:
        trace = load_trace(path)
    except ProfileError as exc:
        text = str(exc)
        assert text and "Traceback" not in text and "internal error" not in text.lower()
        return
    try:
        _check_model(trace, at_most)
    finally:
        trace.close()


# -- Kineto: random event lists -----------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 1e300, 9.3e15, 4.6e15, 1751410836000000.5, 2**63, -(2**63)]),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, _text)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_text, inner, max_size=3)), max_leaves=6)
_CATS = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "python_function",
         "user_annotation", "gpu_user_annotation", "ac2g", "Kernel", "Memcpy", "Runtime", "Operator"]
_FIELDS = {
    "ph": st.one_of(st.sampled_from(["X", "X", "X", "M", "s", "f", "i"]), _values),
    "cat": st.one_of(st.sampled_from(_CATS), _values),
    "name": st.one_of(st.sampled_from(["gemm_kernel", "cudaLaunchKernel", "aten::mm", "Memcpy HtoD (Pageable -> Device)",
                                       "process_name", "thread_name"]), _values),
    "pid": st.one_of(st.integers(0, 3), _values),
    "tid": st.one_of(st.integers(0, 3), _values),
    "ts": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6), _values),
    "dur": st.one_of(st.integers(0, 10**4), _values),
    "args": st.one_of(st.fixed_dictionaries({}, optional={"device": st.one_of(st.integers(0, 2), _values),
                                                          "stream": st.one_of(st.integers(0, 9), _values),
                                                          "correlation": st.one_of(st.integers(0, 5), _values),
                                                          "grid": _values, "name": _values, "External id": _values}),
                      _values),
}
_event = st.fixed_dictionaries({}, optional=_FIELDS)
_KIND = {"kernels": ("kernel", "Kernel"), "memops": ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset"),
         "api_calls": ("cuda_runtime", "cuda_driver", "Runtime"), "cpu_ops": ("cpu_op", "python_function", "Operator"),
         "markers": ("user_annotation", "gpu_user_annotation")}


def _written(events: list) -> dict[str, int]:
    """Source events that could become a row of each table: complete (ph X) events of its categories."""
    return {t: sum(1 for e in events if e.get("ph") == "X" and isinstance(e.get("cat"), str) and e["cat"] in cats)
            for t, cats in _KIND.items()}


@_budget(30)
@given(events=st.lists(_event, min_size=1, max_size=12),
       top=st.dictionaries(st.sampled_from(["schemaVersion", "baseTimeNanoseconds", "deviceProperties", "distributedInfo",
                                            "displayTimeUnit", "cuda_runtime_version"]), _values, max_size=3),
       compressed=st.booleans())
def test_random_kineto_events(events, top, compressed, work):
    path = _fresh(work, "trace.pt.trace.json" + (".gz" if compressed else ""))
    text = json.dumps({**top, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if compressed else text)
    _open_and_check(path, _written(events))


# -- Nsight and rocpd: random values over cells of the sample databases ------------------------------

_CELL = st.one_of(
    st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=False),
    st.sampled_from([2**63 - 1, -(2**63), 0, -1, 1e300, "abc", "", "1e400", b"\x00\xff", "12"]),
    st.text(max_size=8), st.binary(max_size=8),
)
_SOURCE = {
    "nsys": {"kernels": ["CUPTI_ACTIVITY_KIND_KERNEL"], "memops": ["CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"],
             "api_calls": ["CUPTI_ACTIVITY_KIND_RUNTIME"], "markers": ["NVTX_EVENTS"]},
    "rocpd": {"kernels": ["rocpd_kernel_dispatch"], "memops": ["rocpd_memory_copy"], "api_calls": ["rocpd_region"],
              "markers": ["rocpd_region"]},
}
_EXTRA = {"nsys": ["StringIds", "TARGET_INFO_GPU", "ENUM_CUDA_MEMCPY_OPER"],
          "rocpd": ["rocpd_string", "rocpd_info_agent", "rocpd_metadata", "rocpd_info_process", "rocpd_info_thread"]}


def _tables(path: Path, fmt: str) -> dict[str, tuple[str, list[str], int]]:
    """Logical table -> (physical name, columns, rows) of the tables the mutations touch."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        physical = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for logical in sorted({t for ts in _SOURCE[fmt].values() for t in ts} | set(_EXTRA[fmt])):
            name = next((p for p in physical if p == logical or p.startswith(logical + "_")
                         and not p[len(logical) + 1:].startswith(("dispatch", "copy", "agent"))), None)
            if name is None:
                continue
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{name}")')]
            rows = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            if rows:
                out[logical] = (name, cols, rows)
        return out
    finally:
        con.close()


def _rows_of(path: Path, fmt: str, tables: dict) -> dict[str, int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: sum(con.execute(f'SELECT count(*) FROM "{tables[s][0]}"').fetchone()[0] for s in srcs if s in tables)
                for t, srcs in _SOURCE[fmt].items()}
    finally:
        con.close()


def _mutations(tables: dict):
    cell = st.sampled_from(sorted(tables)).flatmap(
        lambda t: st.tuples(st.just(t), st.sampled_from(tables[t][1]), st.integers(1, tables[t][2]), _CELL))
    return st.lists(cell, min_size=1, max_size=4)


def _sqlite_case(fmt: str, examples: int):
    @_budget(examples)
    @given(data=st.data())
    def test(data, base, work):
        tables = _tables(base[fmt], fmt)
        path = _fresh(work, base[fmt].name)
        shutil.copyfile(base[fmt], path)
        con = sqlite3.connect(path)
        applied = 0
        try:
            for logical, column, row, value in data.draw(_mutations(tables)):
                try:
                    con.execute(f'UPDATE "{tables[logical][0]}" SET "{column}" = ? WHERE rowid = '
                                f'(SELECT rowid FROM "{tables[logical][0]}" LIMIT 1 OFFSET ?)', [value, row - 1])
                    applied += 1
                except sqlite3.IntegrityError:  # NOT NULL / UNIQUE / PRIMARY KEY: SQLite itself refuses the value
                    pass
            con.commit()
        finally:
            con.close()
        assume(applied)
        _open_and_check(path, _rows_of(path, fmt, tables))
    return test


test_random_nsys_cells = _sqlite_case("nsys", 15)
test_random_rocpd_cells = _sqlite_case("rocpd", 15)


# -- Kineto staging alone: cheap, so many examples ----------------------------------------------------

_ws = st.text(alphabet=" \t\n\r", max_size=3)
_key = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6).filter(lambda k: k != "traceEvents")
_plain = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                                _text),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
                      max_leaves=5)


def _dumps(value, ws: str) -> str:
    return json.dumps(value, separators=("," + ws, ":" + ws), ensure_ascii=False)


@_budget(150)
@given(before=st.dictionaries(_key, _plain, max_size=3), after=st.dictionaries(_key, _plain, max_size=3),
       events=st.lists(st.dictionaries(_text, _plain, max_size=3), min_size=1, max_size=5),
       ws=_ws, bom=st.booleans(), cuts=st.lists(st.integers(0, 10**6), max_size=4), gz=st.booleans(),
       threads=st.integers(1, 4), block=st.sampled_from([1, 3, 16, 8 << 20]))
def test_staging_finds_the_events_array(before, after, events, ws, bom, cuts, gz, threads, block, work, monkeypatch):
    """The staged parts (any size may be cut here) hold the events in order, each part a JSON array - or a cut fell
    inside a string, which leaves a part that is not JSON (the reader then stages the array as one part). A .json.gz
    is cut while it streams, in blocks of `block` bytes: a boundary between events may straddle two blocks, and its
    trailer (the last member's size) may put a cut past the array."""
    monkeypatch.setattr(kineto, "PART_BYTES", 1)
    monkeypatch.setattr(kineto, "_CHUNK", block)
    monkeypatch.setattr(kineto, "_HEAD_BYTES", 64)  # the stream goes on past the head
    assume(not set(before) & set(after))
    body = ", ".join(f'{_dumps(k, ws)}:{ws}{_dumps(v, ws)}' for k, v in before.items())
    body += (", " if before else "") + f'"traceEvents":{ws}{_dumps(events, ws)}'
    body += "".join(f",{ws}{_dumps(k, ws)}:{_dumps(v, ws)}" for k, v in after.items())
    raw = ("\ufeff" if bom else "").encode() + f"{ws}{{{ws}{body}{ws}}}{ws}".encode()
    path = _fresh(work, "t.json.gz" if gz else "t.json")
    if gz:  # split into members at the cut points: concatenated members are one stream
        points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
        path.write_bytes(b"".join(gzip.compress(raw[a:b], mtime=0) for a, b in zip(points, points[1:])))
    else:
        path.write_bytes(raw)
    tmp = path.parent / "stage"
    tmp.mkdir()
    want = json.loads(_dumps(events, ws))
    staged, top = kineto._stage(path, Detected("kineto", compressed=gz), tmp, threads)
    assert top == {**before, **after} and len(staged) <= threads  # more than the events: a cut inside a string
    try:
        got = [e for part in staged for e in json.loads(part.read_bytes())]
    except json.JSONDecodeError:
        assert len(staged) > 1 and "}" in json.dumps(events)  # a cut inside a string
        staged, top = kineto._stage(path, Detected("kineto", compressed=gz), tmp, 1)
        got = json.loads(staged[0].read_bytes())
    assert got == want and top == {**before, **after}


@pytest.mark.parametrize("threads", [2, 3])
def test_a_gzip_trailer_past_the_array_leaves_no_empty_part(threads, work, monkeypatch):
    """A second gzip member of padding makes the trailer (the last member's size) overstate the array: the cuts
    aimed at its shares fall in the keys after it, whose list of objects holds the boundary a cut looks for. The
    part holding the array's end stops there and the parts past it go, so every event is staged once and the keys
    after the array are read whole."""
    monkeypatch.setattr(kineto, "PART_BYTES", 1)
    events = [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1} for i in range(50)]
    after = {"deviceProperties": [{"id": i, "name": "GPU"} for i in range(400)]}
    raw = json.dumps({"traceEvents": events, **after}).encode()
    array_end = raw.index(b"]") + 1
    pad = 2 * len(raw)  # the trailer's size: every share's cut falls past the array
    assert array_end < pad // threads
    path = _fresh(work, "t.json.gz")
    path.write_bytes(gzip.compress(raw, mtime=0) + gzip.compress(b" " * pad, mtime=0))
    tmp = path.parent / "stage"
    tmp.mkdir()
    staged, top = kineto._stage(path, Detected("kineto", compressed=True), tmp, threads)
    assert [e for part in staged for e in json.loads(part.read_bytes())] == events
    assert top == after and sorted(tmp.iterdir()) == sorted(staged)


@_budget(60)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=6), cap_kb=st.integers(1, 20), block=st.integers(1, 9000))
def test_gzip_reader_counts_every_member(sizes, cap_kb, block, work, monkeypatch):
    """The running count spans concatenated members; past the cap the read stops with an error
    naming the setting; below it every byte comes out."""
    monkeypatch.setattr(kineto, "max_decompressed_bytes", lambda: cap_kb * 1000)
    data = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    path = _fresh(work, "m.json.gz")
    path.write_bytes(b"".join(gzip.compress(d, mtime=0) for d in data))
    with open(path, "rb") as fh:
        read = kineto._gzip_reader(path, fh)
        out = bytearray()
        try:
            while chunk := read(block):
                out += chunk
        except ProfileError as exc:
            assert "GPUSCOPE_MAX_DECOMPRESSED_GB" in str(exc)
            assert sum(sizes) > cap_kb * 1000 and len(out) <= cap_kb * 1000
            return
    assert bytes(out) == b"".join(data) and len(out) <= cap_kb * 1000


@_budget(100)
@given(depth=st.integers(0, 600), strings=st.lists(st.text(alphabet='[]{}"\\ab', max_size=6), max_size=3))
def test_nesting_depth_ignores_brackets_in_strings(depth, strings):
    text = json.dumps({"s": strings, "deep": json.loads("[" * depth + "1" + "]" * depth)})
    # the outer object, then the deeper of the list of strings (1: brackets in strings count nothing) and `deep`
    assert kineto._depth(text) == 1 + max(1, depth)
