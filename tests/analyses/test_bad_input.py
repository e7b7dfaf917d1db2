"""Bad input at the engine layer: every broken file and bad request raises ProfileError (never
another exception) with a message that says what is wrong and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import FORMATS
from gpuscope.tools import analyses as A
from gpuscope.tools.model import cache
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace


from gpuscope.fixtures import samples as H

BAD_FILE_CASES = ["missing", "directory", "text", "text_with_sqlite_suffix", "truncated_sqlite", "truncated_sqlite_head",
                  "unrelated_sqlite", "corrupt_json_gz", "truncated_json_gz", "truncated_json", "json_not_a_trace",
                  "empty", "empty_json", "nsys_rep_garbage"]


def _raises_profile_error(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except ProfileError as exc:
        return str(exc)
    except BaseException as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{getattr(fn, '__name__', fn)} raised {type(exc).__name__}: {exc} (expected ProfileError)")
    pytest.fail(f"{getattr(fn, '__name__', fn)} accepted bad input {args} {kwargs}")


@pytest.mark.parametrize("case", BAD_FILE_CASES)
def test_load_trace_refuses(bad_inputs, case):
    path, words = bad_inputs[case]
    msg = _raises_profile_error(load_trace, path)
    H.assert_message(msg, words)
    if case != "missing":
        assert path.name in msg, msg


@pytest.mark.parametrize("case", BAD_FILE_CASES)
def test_open_trace_refuses_and_caches_nothing(bad_inputs, case):
    path, words = bad_inputs[case]
    for attempt in range(2):  # a failed load must not poison the cache
        msg = _raises_profile_error(open_trace, str(path))
        H.assert_message(msg, words)
    assert all(k[0] != str(path.resolve()) for k in cache._cache)


def test_empty_path():
    msg = _raises_profile_error(open_trace, "   ")
    assert "path" in msg.lower()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions are not enforced for root")
def test_unreadable_file(profiles, tmp_path):
    locked = tmp_path / "locked.sqlite"
    locked.write_bytes(profiles["nsys"].read_bytes())
    locked.chmod(0)
    try:
        msg = _raises_profile_error(load_trace, locked)
        assert "permission" in msg.lower() or "cannot read" in msg.lower()
    finally:
        locked.chmod(0o600)


def test_list_traces_survives_bad_files(bad_inputs, profiles):
    folder = bad_inputs["text"][0].parent
    res = A.list_traces(str(folder))
    assert res.traces == [] or all(t.format is not None for t in res.traces)
    assert res.skipped >= 8
    one = A.list_traces(str(bad_inputs["truncated_json_gz"][0]))
    assert len(one.traces) == 1 and one.traces[0].format is None and one.traces[0].summary
    msg = _raises_profile_error(A.list_traces, str(bad_inputs["missing"][0]))
    H.assert_message(msg, ["no such folder"])


@pytest.fixture(scope="module", params=FORMATS)
def trace(request, profiles):
    return open_trace(profiles[request.param])


def test_unknown_table(trace):
    for table in ("no_such_table", 'native."NoSuchTable"', "native.no_such", ""):
        msg = _raises_profile_error(A.describe_table, trace, table)
        H.assert_message(msg, ["unknown table", "list_tables"])


def test_unknown_column(trace):
    msg = _raises_profile_error(A.sql_query, trace, "SELECT bogus_col FROM kernels")
    H.assert_message(msg, ["bogus_col", ("describe_table", "list_tables")])


def test_window_outside_capture(trace):
    info = A.trace_info(trace)
    end = info.capture.end_ns
    for fn in (A.top_kernels, A.gap_histogram):
        msg = _raises_profile_error(fn, trace, start_ns=end + 10**9, end_ns=end + 2 * 10**9)
        H.assert_message(msg, ["outside the capture", "trace_info"])
        msg = _raises_profile_error(fn, trace, start_ns=info.capture.start_ns - 10**12, end_ns=info.capture.start_ns - 10**11)
        H.assert_message(msg, ["outside the capture"])
        msg = _raises_profile_error(fn, trace, start_ns=end, end_ns=end - 5)
        H.assert_message(msg, ["end_ns", "start_ns"])


def test_unknown_device(trace):
    for fn in (A.top_kernels, A.gap_histogram):
        msg = _raises_profile_error(fn, trace, device=99)
        H.assert_message(msg, ["device 99", "trace_info"])
        msg = _raises_profile_error(fn, trace, device=-1)
        H.assert_message(msg, ["device -1"])


def test_unknown_stream_and_name(trace):
    msg = _raises_profile_error(A.top_kernels, trace, stream=123456)
    H.assert_message(msg, ["no kernel matches"])
    msg = _raises_profile_error(A.top_kernels, trace, name_contains="zzz_not_a_kernel")
    H.assert_message(msg, ["no kernel matches"])


def test_out_of_range_limits_do_not_crash(trace):
    """The MCP schema refuses limit=0; called directly the engine clamps or refuses, never crashes."""
    for limit in (0, -5, 10**9):
        try:
            res = A.top_kernels(trace, limit=limit)
        except ProfileError:
            continue
        per_device = {}
        for k in res.kernels:
            per_device[k.device_id] = per_device.get(k.device_id, 0) + 1
        assert max(per_device.values()) <= 200
    for top in (0, -1):
        try:
            A.gap_histogram(trace, top_gaps=top)
        except ProfileError:
            pass
    try:
        res = A.sql_query(trace, "SELECT 1", limit=0)
        assert res.row_count <= 1
    except ProfileError:
        pass


def test_profile_without_kernels(tmp_path):
    """A valid profile with only host activity: top_kernels and gap_histogram explain, trace_info works."""
    from gpuscope.fixtures.writers import nsys

    scenario = H.make_scenario()
    scenario.kernels, scenario.memops = [], []
    path = Path(nsys.write(scenario, tmp_path / "host_only.sqlite") or tmp_path / "host_only.sqlite")
    trace = open_trace(path)
    info = A.trace_info(trace)
    assert info.counts["kernels"] == 0
    assert {c.tool: c.available for c in info.capabilities}["top_kernels"] is False
    msg = _raises_profile_error(A.top_kernels, trace)
    H.assert_message(msg, ["no gpu kernels", "cupti_activity_kind_kernel", "nsys profile --trace=cuda"])
    msg = _raises_profile_error(A.gap_histogram, trace)
    H.assert_message(msg, ["no gpu kernels or gpu memory copies or sets", "cupti_activity_kind_memcpy"])


def test_damaged_files_variants(profiles, tmp_path):
    """Many ways of damage, one rule: ProfileError that names the file."""
    import gzip
    import random

    sqlite_bytes = profiles["nsys"].read_bytes()
    raw_json = profiles["kineto"].read_bytes()
    gz_bytes = gzip.compress(raw_json)
    damaged = []
    for frac in (0.05, 0.3, 0.6, 0.9, 0.99):
        p = tmp_path / f"cut_{int(frac * 100)}.sqlite"
        p.write_bytes(sqlite_bytes[: max(4096, int(len(sqlite_bytes) * frac) // 4096 * 4096)])
        damaged.append(p)
    for seed in range(6):
        b = bytearray(gz_bytes)
        rnd = random.Random(seed)
        for _ in range(5):
            b[rnd.randrange(10, len(b))] = rnd.randrange(256)
        p = tmp_path / f"flipped_{seed}.json.gz"
        p.write_bytes(bytes(b))
        damaged.append(p)
    for frac in (0.01, 0.5, 0.95):
        p = tmp_path / f"cut_{int(frac * 100)}.json"
        p.write_bytes(raw_json[: int(len(raw_json) * frac)])
        damaged.append(p)
    for p in damaged:
        msg = _raises_profile_error(load_trace, p)
        assert p.name in msg, msg


def test_gap_histogram_limit_below_one_still_answers(trace):
    # limit=0 used to return no profile while reporting truncation; it now means "at least one".
    try:
        res = A.gap_histogram(trace, limit=0)
    except ProfileError:
        pytest.skip("no GPU activity in this profile")
    assert len(res.profiles) >= 1
    assert res.hint is None or "only the first 1 devices" in res.hint


def test_list_traces_unreadable_folder_is_an_error(tmp_path, monkeypatch):
    # os.walk skips a folder it cannot read silently; list_traces must not report it as holding no profiles.
    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(os, "listdir", denied)
    msg = _raises_profile_error(A.list_traces, str(tmp_path))
    H.assert_message(msg, ["cannot list", "permission"])
