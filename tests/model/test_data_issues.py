"""Bad values are counted, never silently dropped: every reader records in data_issues the source
rows it leaves out or corrects, the model check repairs and reports what a reader let through, and
the tools carry the counts of the tables they read.

The fixtures know what they wrote: one scenario has rows with end < start (written as they are by
every writer) and each format gets bad values injected through options['raw_values']; the
expected counts below are those injections, not the engine's output.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from gpuscope.fixtures import scenarios_diagnose
from gpuscope.fixtures.scenario import ApiCall, CpuOp, Device, Kernel, Marker, MemOp, Process, Scenario, Thread
from gpuscope.fixtures.writers import kineto, nsys, rocpd, rpd
from gpuscope.tools.analyses.diagnose import diagnose
from gpuscope.tools.analyses.gpu_timeline import gpu_timeline
from gpuscope.tools.analyses.top_kernels import top_kernels
from gpuscope.tools.analyses.trace_info import trace_info
from gpuscope.tools.model import quality
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.readers import nsys as nsys_reader
from gpuscope.tools.model.sqlite_source import not_of_type
from gpuscope.tools.model.trace import SCHEMA_SQL, load_trace

P, T = 100, 101
US = 1_000
N_KERNELS, N_MEMOPS, N_CALLS, N_MARKERS, N_CPU_OPS = 8, 4, 8, 3, 3
# Rows every writer writes with end < start: the reader keeps them with end = start.
BACKWARDS = {"kernels": 3, "memops": 1, "api_calls": 2, "markers": 1}
END_BEFORE_START = "end before start: end set to start (duration 0)"
MISSING = "start or end time is missing or not an integer"


def scenario() -> Scenario:
    s = Scenario("bad_values", [Device(0)], [Process(P, "python")], [Thread(P, T, "python")])
    for i in range(N_CALLS):
        s.api_calls.append(ApiCall(P, T, (10 + 10 * i) * US, (12 + 10 * i) * US, "cudaLaunchKernel", i + 1))
    for i in range(N_KERNELS):
        s.kernels.append(Kernel(0, 7, (200 + 20 * i) * US, (210 + 20 * i) * US, f"kernel_{i}", f"kernel_{i}", P, i + 1))
    for i in range(N_MEMOPS):
        s.memops.append(MemOp(0, 8, (400 + 20 * i) * US, (405 + 20 * i) * US, "copy", "HtoD", 4096, P, None))
    for i in range(N_MARKERS):
        s.markers.append(Marker(P, T, (5 + 100 * i) * US, (90 + 100 * i) * US, f"step_{i}"))
    for i in range(N_CPU_OPS):
        s.cpu_ops.append(CpuOp(P, T, (9 + 10 * i) * US, (13 + 10 * i) * US, "aten::mm", 500 + i))
    for table, i in BACKWARDS.items():
        rows = getattr(s, table)
        rows[i] = replace(rows[i], end_ns=rows[i].start_ns - 3 * US)
    return s


# (format, raw_values, expected data_issues rows as (table, action, rows, reason), sorted)
KINETO_NAN = "ts is not a finite number (NaN, Infinity or text)"
KINETO_RAW = {
    ("kernel", 0): {"ts": float("nan")},
    ("kernel", 1): {"ts": 1e300},
    ("kernel", 2): {"dur": kineto.ABSENT},
    ("kernel", 4): {"pid": "gpu", "args": {"stream": 7}},   # no device anywhere
    ("memop", 0): {"ts": float("inf")},
    ("api_call", 0): {"pid": "x"},
    ("api_call", 1): {"name": None},
    ("marker", 0): {"ts": None},
    ("cpu_op", 0): {"dur": float("nan")},
}
KINETO_ISSUES = [
    ("api_calls", "repaired", 1, "dur is negative: set to 0"),
    ("api_calls", "skipped", 1, "name is missing"),
    ("api_calls", "skipped", 1, "pid is not a number"),
    ("cpu_ops", "skipped", 1, "dur is not a finite number (NaN, Infinity or text)"),
    ("kernels", "repaired", 1, "dur is negative: set to 0"),
    ("kernels", "skipped", 1, "dur is missing"),
    ("kernels", "skipped", 1, "no device: args.device is missing or not a number, and pid is not a number"),
    ("kernels", "skipped", 1, KINETO_NAN),
    ("kernels", "skipped", 1, "ts is out of range (beyond ±4.6e15 us)"),
    ("markers", "repaired", 1, "dur is negative: set to 0"),
    ("markers", "skipped", 1, "ts is missing"),
    ("memops", "repaired", 1, "dur is negative: set to 0"),
    ("memops", "skipped", 1, KINETO_NAN),
]
# Present but not numbers: text, a boolean (which a DOUBLE column would take as 1.0), a list.
KINETO_TEXT_RAW = {**KINETO_RAW, ("kernel", 5): {"ts": "abc"}, ("kernel", 6): {"ts": True}, ("kernel", 7): {"dur": [1, 2]}}
KINETO_TEXT_ISSUES = [(t, a, 3, r) if r == KINETO_NAN and t == "kernels" else (t, a, n, r) for t, a, n, r in KINETO_ISSUES] + [
    ("kernels", "skipped", 1, "dur is not a finite number (NaN, Infinity or text)")]

ROCPD_RAW = {
    ("kernel", 0): {"start": "abc"},
    ("kernel", 1): {"agent_id": 99},
    ("kernel", 2): {"agent_id": 0},          # the CPU agent
    ("memop", 0): {"src_agent_id": 99, "dst_agent_id": 98},
    ("api_call", 0): {"end": "abc"},
    ("marker", 0): {"start": "x"},
}
ROCPD_ISSUES = [
    ("api_calls", "repaired", 1, END_BEFORE_START),
    ("api_calls", "skipped", 1, MISSING),
    ("kernels", "repaired", 1, END_BEFORE_START),
    ("kernels", "skipped", 1, "names an agent that rocpd_info_agent does not list"),
    ("kernels", "skipped", 1, "runs on an agent that rocpd_info_agent does not list as a GPU"),
    ("kernels", "skipped", 1, MISSING),
    ("markers", "repaired", 1, END_BEFORE_START),
    ("markers", "skipped", 1, MISSING),
    ("memops", "repaired", 1, END_BEFORE_START),
    ("memops", "skipped", 1, "names an agent that rocpd_info_agent does not list"),
]
RPD_RAW = {
    ("kernel", 0): {"start": "abc"},
    ("kernel", 1): {"gpuId": "x"},
    ("memop", 0): {"end": "1e400"},
    ("api_call", 0): {"end": "abc"},
    ("marker", 0): {"start": "abc"},
}
RPD_ISSUES = [
    ("api_calls", "repaired", 1, END_BEFORE_START),
    ("api_calls", "skipped", 1, MISSING),
    ("kernels", "repaired", 1, END_BEFORE_START),
    ("kernels", "skipped", 1, "gpuId is missing or not an integer"),
    ("kernels", "skipped", 1, MISSING),
    ("markers", "repaired", 1, END_BEFORE_START),
    ("markers", "skipped", 1, MISSING),
    ("memops", "repaired", 1, END_BEFORE_START),
    ("memops", "skipped", 1, MISSING),
]
# Nsight exports declare their time columns NOT NULL: the damage they carry is end < start.
NSYS_ISSUES = [(t, "repaired", 1, END_BEFORE_START) for t in sorted(BACKWARDS)]


def native_repairs(raw: dict, tables: dict[str, str]) -> list[tuple[str, str, int, str]]:
    """The SQLite readers copy a table holding text in an INTEGER column through sqlite3, and such a cell is NULL in the
    copy (native."table", which sql_query reads): one repaired row per injected text, per table and column."""
    counts: dict[tuple[str, str], int] = {}
    for (kind, _), cells in raw.items():
        for column, value in cells.items():
            if isinstance(value, str):
                counts[(tables[kind], column)] = counts.get((tables[kind], column), 0) + 1
    return [(f"native.{table}", "repaired", n, f'"{column}": {not_of_type("BIGINT")}') for (table, column), n in counts.items()]


ROCPD_ISSUES += native_repairs(ROCPD_RAW, {kind: rocpd._table("bad_values", logical) for kind, logical in (
    ("kernel", "rocpd_kernel_dispatch"), ("memop", "rocpd_memory_copy"), ("api_call", "rocpd_region"), ("marker", "rocpd_region"))})
RPD_ISSUES += native_repairs(RPD_RAW, {"kernel": '"rocpd_op"', "memop": '"rocpd_op"', "api_call": '"rocpd_api"', "marker": '"rocpd_api"'})

CASES = {
    "kineto": (kineto, ".json", KINETO_RAW, KINETO_ISSUES),
    "kineto_text": (kineto, ".json", KINETO_TEXT_RAW, KINETO_TEXT_ISSUES),
    "rocpd": (rocpd, ".db", ROCPD_RAW, ROCPD_ISSUES),
    "rpd": (rpd, ".rpd", RPD_RAW, RPD_ISSUES),
    "nsys": (nsys, ".sqlite", {}, NSYS_ISSUES),
}
WRITTEN = {"kernels": N_KERNELS, "memops": N_MEMOPS, "api_calls": N_CALLS, "markers": N_MARKERS, "cpu_ops": N_CPU_OPS}


@pytest.fixture(scope="module", params=list(CASES))
def damaged(request, tmp_path_factory):
    writer, suffix, raw, issues = CASES[request.param]
    s = scenario()
    s.options["raw_values"] = raw
    path = writer.write(s, tmp_path_factory.mktemp(request.param) / f"bad{suffix}")
    trace = load_trace(path)
    yield request.param, s, issues, trace
    trace.close()


def test_data_issues_are_exactly_the_injected_rows(damaged):
    fmt, _, issues, trace = damaged
    assert sorted(trace.sql("SELECT * FROM data_issues")) == sorted(issues)


def test_kept_plus_skipped_is_what_was_written(damaged):
    fmt, _, issues, trace = damaged
    for table, written in WRITTEN.items():
        if fmt.startswith("kineto") or table != "cpu_ops":
            skipped = sum(n for t, a, n, _ in issues if t == table and a == "skipped")
            assert trace.count(table) + skipped == written, table


def test_repaired_rows_end_at_their_start_and_no_duration_is_negative(damaged):
    fmt, s, issues, trace = damaged
    kernel = s.kernels[BACKWARDS["kernels"]]
    start = trace.scalar("SELECT start_ns FROM kernels WHERE name = ?", [kernel.name])
    assert trace.sql("SELECT end_ns - start_ns, dur_ns FROM kernels WHERE name = ?", [kernel.name]) == [(0, 0)]
    assert start is not None
    for table in quality.DURATION_TABLES:
        assert trace.scalar(f"SELECT count(*) FROM {table} WHERE dur_ns < 0 OR dur_ns <> end_ns - start_ns") == 0


def test_tools_carry_the_counts_of_the_tables_they_read(damaged):
    fmt, s, issues, trace = damaged
    info = trace_info(trace)
    assert sorted((i.table, i.action, i.rows, i.reason) for i in info.data_issues) == sorted(issues)
    skipped = sum(n for t, a, n, _ in issues if a == "skipped" and not t.startswith("native."))
    repaired = sum(n for t, a, n, _ in issues if a == "repaired" and not t.startswith("native."))
    cells = sum(n for t, _, n, _ in issues if t.startswith("native."))
    parts = [f"{n} source rows {a} (" for n, a in ((skipped, "skipped"), (repaired, "repaired")) if n]
    parts += [f"{cells} cells of the profile's own tables repaired, counted per column ("] if cells else []
    assert info.data_issues_summary.startswith(parts[0]) and all(p in info.data_issues_summary for p in parts)

    def notes(*tables):
        """The notes of the model tables' rows, and of the cells repaired in the profile's tables they are read from:
        rocpd's kernels come from rocpd_kernel_dispatch, its copies from rocpd_memory_copy, its calls (the GPU ops'
        launching calls too) from rocpd_region; RPD's GPU ops from rocpd_op, with their launching calls from rocpd_api."""
        natives = {native for t in tables for native in SOURCES.get(fmt, {}).get(t, ())}
        return sorted(f"{n} {NOUN[t][n != 1]} {a}: {r}" if t in NOUN else f"{n} {t} row{'s' * (n != 1)} {a}: {r}"
                      for t, a, n, r in issues if t in tables or t in natives)

    top = top_kernels(trace)
    assert sorted(top.data_issues) == notes("kernels")
    assert "1 kernel repaired: " in " ".join(top.data_issues)
    tl = gpu_timeline(trace)
    assert sorted(tl.data_issues) == notes("kernels", "memops", "api_calls")
    # the figures are those of the rows kept: the repaired kernel counts with 0 ns
    kept = trace.count("kernels")
    assert sum(d.kernel_count for d in top.devices) == kept


_REGION = f"native.{rocpd._table('bad_values', 'rocpd_region')}"
SOURCES = {
    "rocpd": {"kernels": [f"native.{rocpd._table('bad_values', 'rocpd_kernel_dispatch')}", _REGION],
              "memops": [f"native.{rocpd._table('bad_values', 'rocpd_memory_copy')}", _REGION],
              "api_calls": [_REGION]},
    "rpd": {t: ['native."rocpd_op"', 'native."rocpd_api"'] for t in ("kernels", "memops")} | {"api_calls": ['native."rocpd_api"']},
}
NOUN = {"kernels": ("kernel", "kernels"), "memops": ("memory copy/set", "memory copies/sets"),
        "api_calls": ("API call", "API calls"), "markers": ("marker", "markers"), "cpu_ops": ("CPU op", "CPU ops")}


@pytest.mark.parametrize("parser", ["read_json", "json.loads"])
@pytest.mark.parametrize("case", ["kineto", "kineto_text"])
def test_both_kineto_parsers_count_the_same(case, parser, tmp_path, monkeypatch):
    from gpuscope.tools.model.readers import kineto as kineto_reader

    used = []
    original = kineto_reader._load_python
    monkeypatch.setattr(kineto_reader, "_load_python", lambda *a: used.append(1) or original(*a))
    if parser == "json.loads":
        def refuse(*a):
            raise kineto_reader._Fallback
        monkeypatch.setattr(kineto_reader, "_load_duckdb", refuse)
    s = scenario()
    s.options["raw_values"] = CASES[case][2]
    trace = load_trace(kineto.write(s, tmp_path / "t.json"))
    assert ("json.loads" if used else "read_json") == parser
    assert sorted(trace.sql("SELECT * FROM data_issues")) == sorted(CASES[case][3])
    trace.close()


def test_nsys_rows_without_times_or_device_are_counted(tmp_path):
    """Real exports declare these columns NOT NULL; a hand-edited one may not. The rows left out are
    counted, and the rest are not mistaken for duplicated launches."""
    import sqlite3

    path = nsys.write(scenario(), tmp_path / "nulls.sqlite")
    con = sqlite3.connect(path)
    con.executescript("""
        ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k_old;
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM k_old;
        DROP TABLE k_old;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE rowid = 1;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = NULL WHERE rowid = 2;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = NULL WHERE rowid = 3;""")
    con.commit()
    con.close()
    trace = load_trace(path)
    assert sorted(trace.sql("SELECT * FROM data_issues")) == sorted(NSYS_ISSUES + [
        ("kernels", "skipped", 2, MISSING), ("kernels", "skipped", 1, "deviceId is missing or not an integer")])
    assert trace.count("kernels") == N_KERNELS - 3
    assert not any("repeats correlation ids" in w for w in trace.warnings)
    trace.close()


def _bad_text(path, table: str, column: str, old: str, new: bytes) -> None:
    """Store `new` (not UTF-8) over the cell of `table`.`column` that holds `old`, as Windows exports hold cp1252."""
    import sqlite3

    con = sqlite3.connect(path)
    assert con.execute(f"UPDATE {table} SET {column} = CAST(? AS TEXT) WHERE {column} = ?", (new, old)).rowcount == 1
    con.commit()
    con.close()


def test_tools_name_the_repaired_cells_their_rows_were_read_from(tmp_path):
    """A kernel's name of invalid UTF-8 in StringIds and a marker's text of invalid UTF-8 in NVTX_EVENTS are read with
    U+FFFD and counted under the profile's table. The tools showing those names say so: top_kernels names the StringIds
    cell and not the NVTX one, gpu_timeline (kernels, copies, calls) the same; a tool reading the markers names both.
    On rocpd, the repaired name of the launch calls (the writer's hipLaunchKernel) in rocpd_string_<uuid> is named by
    the tools reading calls."""
    from gpuscope.tools.analyses.api_summary import api_summary
    from gpuscope.tools.analyses.marker_summary import marker_summary
    from gpuscope.tools.model.sqlite_source import NOT_UTF8

    path = nsys.write(scenario(), tmp_path / "names.sqlite")
    _bad_text(path, "StringIds", "value", "kernel_2", b"kernel_\xff2")
    _bad_text(path, "NVTX_EVENTS", "text", "step_1", b"step_\xe91")
    strings = f'1 native."StringIds" row repaired: "value": {NOT_UTF8}'
    nvtx = f'1 native."NVTX_EVENTS" row repaired: "text": {NOT_UTF8}'
    trace = load_trace(path)
    try:
        top = top_kernels(trace, limit=50)
        assert "kernel_\ufffd2" in {k.name for k in top.kernels}
        assert strings in top.data_issues and nvtx not in top.data_issues
        timeline = gpu_timeline(trace).data_issues
        assert strings in timeline and nvtx not in timeline
        markers = marker_summary(trace).data_issues
        assert strings in markers and nvtx in markers
    finally:
        trace.close()

    path = rocpd.write(scenario(), tmp_path / "names.db")
    table = rocpd._table("bad_values", "rocpd_string")
    _bad_text(path, table, "string", "hipLaunchKernel", b"hipLaunch\xffKernel")
    note = f'1 native.{table} row repaired: "string": {NOT_UTF8}'
    trace = load_trace(path)
    try:
        assert note in api_summary(trace).data_issues and note in gpu_timeline(trace).data_issues
    finally:
        trace.close()


def test_a_clean_profile_has_no_issues_and_tools_say_nothing(tmp_path):
    s = scenario()
    for table, i in BACKWARDS.items():
        rows = getattr(s, table)
        rows[i] = replace(rows[i], end_ns=rows[i].start_ns + US)
    trace = load_trace(nsys.write(s, tmp_path / "clean.sqlite"))
    assert trace.count("data_issues") == 0
    info = trace_info(trace)
    assert info.data_issues == [] and info.data_issues_summary is None
    assert top_kernels(trace).data_issues == []
    trace.close()


def test_all_kernels_unreadable_is_said_not_hidden(tmp_path):
    s = scenario()
    s.options["raw_values"] = {("kernel", i): {"ts": float("nan")} for i in range(N_KERNELS)}
    trace = load_trace(kineto.write(s, tmp_path / "nan.json"))
    with pytest.raises(ProfileError, match=f"The reader left rows out: {N_KERNELS} kernels skipped: ts is not a finite number"):
        top_kernels(trace)
    cap = next(c for c in trace_info(trace).capabilities if c.tool == "top_kernels")
    assert not cap.available and f"{N_KERNELS} kernels skipped" in cap.reason
    trace.close()


# -- the model check ---------------------------------------------------------------------------------

def test_model_check_reports_a_reader_bug_instead_of_raising(tmp_path, monkeypatch):
    s = scenario()
    path = nsys.write(s, tmp_path / "reader_bug.sqlite")
    original = nsys_reader.load

    def buggy(con, path, progress, detected):
        original(con, path, progress, detected)
        con.execute("UPDATE kernels SET end_ns = start_ns - 10 WHERE name IN ('kernel_0', 'kernel_1')")
        con.execute("UPDATE api_calls SET dur_ns = dur_ns + 1 WHERE correlation_id IN (4, 5, 6)")
        con.execute("UPDATE markers SET start_ns = -9223372036854775000, end_ns = 9223372036854775000 WHERE name = 'step_0'")

    monkeypatch.setattr(nsys_reader, "load", buggy)
    trace = load_trace(path)
    assert sorted(trace.sql("SELECT * FROM data_issues")) == sorted(NSYS_ISSUES + [
        ("api_calls", "repaired", 3, "model check: dur_ns was not end_ns - start_ns (reader error): dur_ns recomputed"),
        ("kernels", "repaired", 2, "model check: end before start, not repaired by the reader: end set to start (duration 0)"),
        ("markers", "skipped", 1, "model check: end_ns - start_ns exceeds the 64-bit ns range: row left out"),
    ])
    assert trace.sql("SELECT dur_ns, end_ns - start_ns FROM kernels WHERE name IN ('kernel_0', 'kernel_1')") == [(0, 0), (0, 0)]
    assert trace.scalar("SELECT count(*) FROM api_calls WHERE dur_ns <> end_ns - start_ns") == 0
    assert trace.count("markers") == N_MARKERS - 1
    trace.close()


def test_record_adds_to_an_existing_reason():
    import duckdb

    con = duckdb.connect()
    con.execute(SCHEMA_SQL)
    quality.record(con, [("kernels", "skipped", 2, "why"), ("kernels", "skipped", 0, "nothing"), ("kernels", "skipped", 3, "why")])
    assert con.execute("SELECT * FROM data_issues").fetchall() == [("kernels", "skipped", 5, "why")]
    with pytest.raises(ValueError):
        quality.record(con, [("kernels", "dropped", 1, "why")])
    con.close()


# -- diagnose ----------------------------------------------------------------------------------------

def _launch_bound(tmp_path, damaged_kernels: int):
    s = copy.deepcopy(scenarios_diagnose.launch_bound())
    for i in range(damaged_kernels):
        k = s.kernels[10 + i]
        s.kernels[10 + i] = replace(k, end_ns=k.start_ns - 1)
    return load_trace(nsys.write(s, tmp_path / f"launch_{damaged_kernels}.sqlite")), len(s.kernels)


def test_diagnose_lowers_confidence_when_gpu_rows_were_repaired(tmp_path):
    clean, _ = _launch_bound(tmp_path, 0)
    damaged, n = _launch_bound(tmp_path, 1)   # 1 of 200 GPU rows: 0.5 %, under the 1 % threshold
    before, after = diagnose(clean), diagnose(damaged)
    assert not after.abstained and [f.bottleneck for f in after.findings] == [f.bottleneck for f in before.findings]
    lower = {"high": "medium", "medium": "low", "low": "low"}
    assert [f.confidence for f in after.findings] == [lower[f.confidence] for f in before.findings]
    assert all(f"1 of {n} GPU rows (0.5 %) were skipped or repaired" in f.confidence_reason for f in after.findings)
    assert after.data_issues == [f"1 kernel repaired: {END_BEFORE_START}"] and before.data_issues == []
    assert any("abstains" in r for r in after.rules)
    clean.close()
    damaged.close()


def test_diagnose_abstains_above_one_percent_of_gpu_rows(tmp_path):
    trace, n = _launch_bound(tmp_path, 3)     # 3 of 200: 1.5 %
    res = diagnose(trace)
    assert res.abstained and res.findings == [] and res.dropped_findings >= 1
    assert res.verdict.startswith(f"abstained: 3 of {n} GPU rows (1.5 %, above 1.0 %) were skipped or repaired")
    trace.close()


def test_the_model_checks_of_a_build_fit_a_small_memory_limit():
    """The launch check pairs every GPU op with the first call of its correlation id. As a hash aggregate
    with arg_min over 2 M calls it needed more than 64 MiB and cannot spill; as a window it spills, so a
    profile of any size builds under the configured limit."""
    import duckdb

    from gpuscope.tools.model.limits import duckdb_config

    n = 2_000_000
    con = duckdb.connect(config={**duckdb_config(64 * 2**20), "threads": "2"})
    try:
        con.execute(SCHEMA_SQL)
        con.execute(f"""INSERT INTO api_calls SELECT 1, 7, i * 10, i * 10 + 5, 5, 'cudaLaunchKernel', 'cuda_runtime', i, NULL, NULL
                        FROM range({n}) t(i)""")
        # every tenth kernel starts before its call: the check must find exactly those
        con.execute(f"""INSERT INTO kernels (device_id, stream_id, start_ns, end_ns, dur_ns, name, short_name, correlation_id,
                                            pid, tid, launched)
                        SELECT 0, 1, CASE WHEN i % 10 = 0 THEN i * 10 - 1 ELSE i * 10 + 6 END,
                               CASE WHEN i % 10 = 0 THEN i * 10 + 1 ELSE i * 10 + 8 END, 2, 'k', 'k', i, 1, 7, true
                        FROM range(1, {n}) t(i)""")
        quality.check_model(con)
        rows = con.execute("SELECT table_name, action, rows FROM data_issues").fetchall()
    finally:
        con.close()
    assert rows == [("kernels", "repaired", (n - 1) // 10)]


def test_read_from_maps_each_reader_s_own_tables():
    """The native sources of a model table: Nsight's kernels come from StringIds (their names) and not from NVTX_EVENTS;
    a rocpd table is matched without its process suffix; Kineto and a name that is no reader have none."""
    from gpuscope.tools.model.quality import read_from

    assert read_from("nsys", ["kernels"])("StringIds") and not read_from("nsys", ["kernels"])("NVTX_EVENTS")
    assert read_from("rocpd", ["kernels"])("rocpd_string_87a57b49_b7b5_512f_aeaa_44e3938b648e")
    assert not read_from("kineto", ["kernels"])("StringIds") and not read_from("job", ["kernels"])("StringIds")
