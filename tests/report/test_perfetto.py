"""`gpuscope export PROFILE --perfetto out.json`: the trace model of any format as a Chrome/Perfetto trace.

Expected events come from the scenario the fixture wrote (not from the engine): every kernel and copy/set is one
complete event on its GPU's stream track, with ts/dur equal to the written nanoseconds."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from conftest import write_scenario
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.writers import rocpd
from gpuscope.server.cli import main
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace
from gpuscope.tools.report.perfetto import GPU_PID_BASE, write_perfetto

SUFFIX = {"nsys": ".sqlite", "rocpd": "_results.db", "kineto": ".pt.trace.json"}


def _ns(us: Decimal) -> int:
    """ts/dur text (µs, three decimals) back to integer ns, without going through a float."""
    ns = us * 1000
    assert ns == ns.to_integral_value(), us
    return int(ns)


@pytest.mark.parametrize("fmt", ["nsys", "rocpd", "kineto"])
def test_every_gpu_op_is_one_complete_event_on_its_stream_track(fmt, tmp_path):
    s = SCENARIOS["concurrent_streams"]()
    trace = load_trace(write_scenario(s, fmt, tmp_path / f"p{SUFFIX[fmt]}"))
    out = tmp_path / "out" / "t.json"
    out.parent.mkdir()
    written = write_perfetto(trace, out)
    doc = json.loads(out.read_text(), parse_float=Decimal)
    events = doc["traceEvents"]
    origin = doc["otherData"]["origin_ns"]
    assert origin == written.origin_ns
    origin -= rocpd.TIME_OFFSET_NS if fmt == "rocpd" else 0  # the rocpd writer stores scenario ns + this offset

    kernels = sorted((e["pid"] - GPU_PID_BASE, e["tid"], e["name"], origin + _ns(e["ts"]), _ns(e["dur"]))
                     for e in events if e.get("cat") == "kernel")
    assert kernels == sorted((k.device_id, k.stream_id, k.name, k.start_ns, k.end_ns - k.start_ns) for k in s.kernels)
    for cat, op in (("memcpy", "copy"), ("memset", "set")):
        got = sorted((e["pid"] - GPU_PID_BASE, e["tid"], origin + _ns(e["ts"]), _ns(e["dur"]), e["args"]["bytes"])
                     for e in events if e.get("cat") == cat)
        written_ops = [] if fmt == "rocpd" and op == "set" else s.memops  # rocpd has no memory-set table
        assert got == sorted((m.device_id, m.stream_id, m.start_ns, m.end_ns - m.start_ns, m.bytes)
                             for m in written_ops if m.op == op), cat
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in events if e["ph"] != "M")
    assert written.events["kernel"] == len(s.kernels) and written.bytes == out.stat().st_size

    # every track is named: 'GPU 0: <model>' with 'stream N' threads; host processes and threads by name
    names = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    streams = {(k.device_id, k.stream_id) for k in s.kernels}
    for dev, stream in streams:
        assert names[("thread_name", GPU_PID_BASE + dev, stream)] == {"name": f"stream {stream}"}
    assert names[("process_name", GPU_PID_BASE + 0, 0)]["name"].startswith("GPU 0")
    assert written.gpu_tracks >= len(streams)
    if s.api_calls:
        api = [e for e in events if e.get("cat") == "api"]
        assert len(api) == len(s.api_calls)
        assert {(e["pid"], e["tid"]) for e in api} == {(a.pid, a.tid) for a in s.api_calls}
    assert [p.name for p in out.parent.iterdir()] == ["t.json"]  # no temporary file left
    trace.close()



def test_an_unknown_stream_or_thread_has_a_track_of_its_own(tmp_path):
    """A kernel without a stream and one on stream -1, a CPU op on thread -1 and one whose thread is text (unknown):
    four tracks, the unknown ones numbered -2 (the profile uses -1) and named so."""
    ev = [{"ph": "X", "cat": "kernel", "name": "k_minus_one", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"device": 0, "stream": -1}},
          {"ph": "X", "cat": "kernel", "name": "k_unknown", "pid": 0, "tid": 7, "ts": 20, "dur": 5, "args": {"device": 0}},
          {"ph": "X", "cat": "cpu_op", "name": "op_minus_one", "pid": 10, "tid": -1, "ts": 1, "dur": 50},
          {"ph": "X", "cat": "cpu_op", "name": "op_unknown", "pid": 10, "tid": "main", "ts": 2, "dur": 40}]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    trace = load_trace(path)
    written = write_perfetto(trace, tmp_path / "o.json")
    doc = json.loads((tmp_path / "o.json").read_text())
    assert written.unknown_ids == doc["otherData"]["unknown_ids"] == {"stream": -2, "pid": -1, "tid": -2}
    where = {e["name"]: (e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert where == {"k_minus_one": (GPU_PID_BASE, -1), "k_unknown": (GPU_PID_BASE, -2), "op_minus_one": (10, -1), "op_unknown": (10, -2)}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names[(GPU_PID_BASE, -1)] == "stream -1" and names[(GPU_PID_BASE, -2)] == "stream unknown"
    assert names[(10, -2)] == "thread unknown" and names[(10, -1)] != "thread unknown"
    assert (written.gpu_tracks, written.host_tracks) == (2, 2)
    trace.close()

def test_times_stay_exact_at_epoch_timestamps(tmp_path):
    """Kineto traces before 2024 carry epoch times (~1.6e18 ns): relative to the origin each value keeps its ns."""
    s = SCENARIOS["concurrent_streams"]()
    shift = 1_600_000_000_000_000_000
    for k in s.kernels:
        k.start_ns += shift
        k.end_ns += shift
    for group in (s.memops, s.api_calls, s.markers, s.cpu_ops):
        for x in group:
            x.start_ns += shift
            x.end_ns += shift
    trace = load_trace(write_scenario(s, "nsys", tmp_path / "epoch.sqlite"))
    write_perfetto(trace, tmp_path / "e.json")
    doc = json.loads((tmp_path / "e.json").read_text())  # plain floats, as a viewer reads them
    origin = doc["otherData"]["origin_ns"]
    got = sorted(origin + round(e["ts"] * 1000) for e in doc["traceEvents"] if e.get("cat") == "kernel")
    assert got == sorted(k.start_ns for k in s.kernels)
    trace.close()


def test_bad_targets_are_refused_clearly(tmp_path):
    s = SCENARIOS["concurrent_streams"]()
    path = write_scenario(s, "kineto", tmp_path / "p.pt.trace.json")
    trace = load_trace(path)
    with pytest.raises(ProfileError, match=r"\*\.json"):
        write_perfetto(trace, tmp_path / "out.txt")
    with pytest.raises(ProfileError, match="does not exist"):
        write_perfetto(trace, tmp_path / "missing" / "out.json")
    with pytest.raises(ProfileError, match="the profile itself"):
        write_perfetto(trace, path)
    trace.close()


def test_cli_export(tmp_path, capsys):
    path = write_scenario(SCENARIOS["concurrent_streams"](), "rocpd", tmp_path / "p_results.db")
    main(["export", str(path), "--perfetto", str(tmp_path / "x.json"), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert res["path"] == str((tmp_path / "x.json").resolve()) and res["events"]["kernel"] > 0
    assert json.loads((tmp_path / "x.json").read_text())["traceEvents"]
