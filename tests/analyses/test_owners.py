"""owners.py: one owner rule for every tool that splits GPU work by process, on ops whose process is unknown.

A legacy RPD file records no process for a GPU op it cannot link to a launching call. The scenario puts such ops on a
device two processes share, on a stream one of them uses and on a stream neither uses, and on a device one process
uses alone, on a stream of their own. The owners below are the rule's, written by hand from the scenario: the op's
process, else its stream's only process, else its device's only process, else none. gpu_timeline, stream_summary
and rank_summary must all count every op under that owner (before, gpu_timeline left the first kind without an owner
and stream_summary the last).
"""

from __future__ import annotations

from gpuscope.fixtures.scenario import ApiCall, Device, Kernel, Process, Scenario, Thread
from gpuscope.fixtures.writers import rpd
from gpuscope.tools.analyses.gpu_timeline import gpu_timeline
from gpuscope.tools.analyses.rank_summary import rank_summary
from gpuscope.tools.analyses.stream_summary import stream_summary
from gpuscope.tools.model.trace import load_trace

A, B = 100, 200
US = 1_000
# (device, stream, launching process or None: unlinked, start us, duration us, expected owner)
OPS = [
    (0, 7, A, 10, 5, A),
    (0, 9, B, 20, 6, B),
    (0, 7, None, 30, 7, A),      # shared device, a stream only A uses: A's
    (0, 11, None, 40, 8, None),  # shared device, a stream no process uses: nobody's
    (1, 3, A, 50, 9, A),
    (1, 5, None, 60, 4, A),      # a device only A uses, on a stream of its own: A's
]


def scenario() -> Scenario:
    s = Scenario("owners", [Device(0), Device(1)], [Process(A, "a", rank=0), Process(B, "b", rank=1)],
                 [Thread(A, A, "a"), Thread(B, B, "b")])
    for i, (dev, stream, pid, start, dur, _) in enumerate(OPS):
        corr = None
        if pid is not None:
            corr = i + 1
            s.api_calls.append(ApiCall(pid, pid, start * US - 3 * US, start * US - 1 * US, "cudaLaunchKernel", corr))
        s.kernels.append(Kernel(dev, stream, start * US, (start + dur) * US, f"k{i}", f"k{i}", pid or A, corr))
    return s


def test_every_tool_counts_an_op_without_a_process_under_the_same_owner(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    trace = load_trace(rpd.write(scenario(), tmp_path / "owners.rpd"))
    assert trace.scalar("SELECT count(*) FROM kernels WHERE pid IS NULL") == sum(1 for o in OPS if o[2] is None)

    want_streams = {}
    want_devices = {}
    for dev, stream, _, _, dur, owner in OPS:
        n, busy = want_streams.get((dev, stream, owner), (0, 0))
        want_streams[(dev, stream, owner)] = (n + 1, busy + dur * US)
        n, busy = want_devices.get((dev, owner), (0, 0))
        want_devices[(dev, owner)] = (n + 1, busy + dur * US)

    streams = stream_summary(trace).streams
    assert {(s.device_id, s.stream_id, s.pid): (s.kernel_count, s.busy_ns) for s in streams} == want_streams
    timelines = gpu_timeline(trace).timelines
    assert {(t.device_id, t.pid): (t.ops, t.busy_ns) for t in timelines} == want_devices

    ranks = {r.pid: r for r in rank_summary([trace]).ranks}
    for pid in (A, B):
        mine = {dev: busy for (dev, owner), (_, busy) in want_devices.items() if owner == pid}
        assert ranks[pid].busy_ns == sum(mine.values()), pid
    trace.close()
