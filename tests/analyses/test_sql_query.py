"""sql_query over native tables, list_tables and describe_table: the profile's own tables as it stores them."""

from __future__ import annotations

import pytest

from gpuscope.fixtures import samples as H
from gpuscope.tools.analyses.sql_query import describe_table, list_tables, sql_query
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    profiles = H.write_profiles(tmp_path_factory.mktemp("sqlq"))
    out = {k: load_trace(profiles[k]) for k in ("nsys", "rocpd", "kineto")}
    yield out
    for t in out.values():
        t.close()


def test_native_tables_answer(traces):
    nsys, rocpd, kineto = traces["nsys"], traces["rocpd"], traces["kineto"]
    assert sql_query(nsys, 'SELECT count(*) FROM native."CUPTI_ACTIVITY_KIND_KERNEL"').rows == [[H.TOTAL_KERNELS]]
    assert sql_query(nsys, "SELECT count(*) FROM native.cupti_activity_kind_kernel").rows == [[H.TOTAL_KERNELS]]
    assert sql_query(nsys, "SELECT count(*) FROM native.StringIds").rows[0][0] > 0
    # rocpd: gpuscope's own view over the per-process table, and the physical table itself
    assert sql_query(rocpd, "SELECT count(*) FROM native.rocpd_kernel_dispatch").rows == [[H.TOTAL_KERNELS]]
    physical = next(t for t in rocpd.native.tables if t.startswith("rocpd_kernel_dispatch_"))
    assert sql_query(rocpd, f'SELECT count(*) FROM native."{physical}"').rows == [[H.TOTAL_KERNELS]]
    events = sql_query(kineto, "SELECT count(*) FROM native.events WHERE cat = 'kernel'").rows
    assert events == [[H.TOTAL_KERNELS]]


def test_a_native_table_is_copied_once(traces):
    nsys = traces["nsys"]
    target = nsys.store.native_file("CUPTI_ACTIVITY_KIND_RUNTIME")
    assert not target.exists()
    sql_query(nsys, "SELECT count(*) FROM native.CUPTI_ACTIVITY_KIND_RUNTIME")
    assert target.exists()
    mtime = target.stat().st_mtime_ns
    sql_query(nsys, "SELECT min(start) FROM native.CUPTI_ACTIVITY_KIND_RUNTIME")
    assert target.stat().st_mtime_ns == mtime


def test_list_tables(traces):
    res = list_tables(traces["nsys"])
    model = {t.table: t.rows for t in res.model_tables}
    assert model["kernels"] == H.TOTAL_KERNELS
    native = {t.table: t.rows for t in res.native_tables}
    assert native['native."CUPTI_ACTIVITY_KIND_KERNEL"'] == H.TOTAL_KERNELS
    assert all(name.startswith('native."') for name in native)
    rocpd = {t.table: t for t in list_tables(traces["rocpd"]).native_tables}
    view = rocpd['native."rocpd_kernel_dispatch"']
    assert view.rows == H.TOTAL_KERNELS and "stacking" in view.description
    kineto = {t.table: t.rows for t in list_tables(traces["kineto"]).native_tables}
    assert kineto['native."events"'] == kineto['native."event_store"'] > 0


@pytest.mark.parametrize("name", ["kernels", "native.CUPTI_ACTIVITY_KIND_KERNEL", 'native."CUPTI_ACTIVITY_KIND_KERNEL"',
                                  "CUPTI_ACTIVITY_KIND_KERNEL", "native.StringIds"])
def test_describe_table(traces, name):
    res = describe_table(traces["nsys"], name)
    cols = {c.name: c.type for c in res.columns}
    if name == "kernels":
        assert res.rows == H.TOTAL_KERNELS and cols["dur_ns"] == "BIGINT"
        assert next(c for c in res.columns if c.name == "dur_ns").description
    elif "StringIds" in name:
        assert set(cols) == {"id", "value"} and res.rows > 0
    else:
        assert res.rows == H.TOTAL_KERNELS and cols["start"] == "BIGINT" and len(res.sample) == 3


def test_describe_unknown_table(traces):
    with pytest.raises(ProfileError, match="unknown table"):
        describe_table(traces["nsys"], "native.nope")


def test_bare_native_names_resolve(traces):
    """Queries copied from the Nsight / rocprofiler documentation name native tables bare."""
    nsys, rocpd, kineto = traces["nsys"], traces["rocpd"], traces["kineto"]
    assert sql_query(nsys, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").rows == [[H.TOTAL_KERNELS]]
    joined = sql_query(nsys, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                             "WHERE s.value = 'gemm_kernel'")
    assert joined.rows == [[sum(1 for p in H.KERNEL_PLAN if p[3] == "gemm_kernel")]]
    assert sql_query(rocpd, "SELECT count(*) FROM rocpd_kernel_dispatch").rows == [[H.TOTAL_KERNELS]]
    assert sql_query(kineto, "SELECT count(*) FROM events WHERE cat = 'kernel'").rows == [[H.TOTAL_KERNELS]]
    assert sql_query(nsys, "SELECT count(*) FROM kernels").note is None
    names = {t.table: t.bare_name for t in list_tables(nsys).native_tables}
    assert names['native."CUPTI_ACTIVITY_KIND_KERNEL"'] == "CUPTI_ACTIVITY_KIND_KERNEL"


def test_model_names_win_and_the_answer_says_so(tmp_path):
    import sqlite3

    path = H.write_profiles(tmp_path)["nsys"]
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE kernels (x INTEGER)")
        c.executemany("INSERT INTO kernels VALUES (?)", [(i,) for i in range(3)])
    trace = load_trace(path)
    try:
        res = sql_query(trace, "SELECT count(*) FROM kernels")
        assert res.rows == [[H.TOTAL_KERNELS]]
        assert res.note and "model table" in res.note and 'native."kernels"' in res.note
        assert sql_query(trace, "SELECT count(*) FROM native.kernels").rows == [[3]]
        names = {t.table: t.bare_name for t in list_tables(trace).native_tables}
        assert names['native."kernels"'] is None
    finally:
        trace.close()


def test_a_query_names_the_cells_the_reader_changed_in_the_native_tables_it_reads(tmp_path, monkeypatch):
    """Native tables the scanner refuses are copied through sqlite3, which changes some cells (invalid UTF-8 read as
    U+FFFD, text in an integer column read as NULL). A query reading such a table says how many rows and why: for a
    table copied while the profile was read (NVTX_EVENTS), one copied by the query itself (TARGET_INFO_SYSTEM_ENV),
    and a rocpd view through the table it stacks; a query reading none of them says nothing."""
    from gpuscope.fixtures.catalog import SCENARIOS
    from gpuscope.fixtures.writers import nsys, rocpd
    from gpuscope.tools.model.sqlite_source import NOT_UTF8, not_of_type

    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    trace = load_trace(nsys.write(SCENARIOS["non_utf8"](), tmp_path / "t.sqlite"))
    nvtx = f'1 native."NVTX_EVENTS" row repaired: "text": {NOT_UTF8}'
    env = f'1 native."TARGET_INFO_SYSTEM_ENV" row repaired: "value": {NOT_UTF8}'
    assert sql_query(trace, "SELECT count(*) FROM native.NVTX_EVENTS").data_issues == [nvtx]
    assert sql_query(trace, "SELECT count(*) FROM kernels").data_issues == []
    assert not trace.store.native_file("TARGET_INFO_SYSTEM_ENV").exists()
    for _ in range(2):  # copied by the first query, read from its copy by the second
        assert sql_query(trace, "SELECT name, value FROM TARGET_INFO_SYSTEM_ENV").data_issues == [env]
    both = sql_query(trace, "SELECT count(*) FROM NVTX_EVENTS, native.TARGET_INFO_SYSTEM_ENV").data_issues
    assert sorted(both) == sorted([nvtx, env])
    trace.close()

    scenario = SCENARIOS["concurrent_streams"]()
    scenario.options["raw_values"] = {("kernel", 0): {"start": "abc"}, ("kernel", 1): {"end": ""}}
    trace = load_trace(rocpd.write(scenario, tmp_path / "t.db"))
    physical = rocpd._table(scenario.name, "rocpd_kernel_dispatch")
    want = sorted(f'1 native.{physical} row repaired: "{c}": {not_of_type("BIGINT")}' for c in ("start", "end"))
    assert sorted(sql_query(trace, "SELECT count(*) FROM rocpd_kernel_dispatch").data_issues) == want
    assert sorted(sql_query(trace, f"SELECT count(*) FROM native.{physical}").data_issues) == want
    assert sql_query(trace, "SELECT count(*) FROM native.rocpd_info_agent").data_issues == []
    trace.close()
