"""critical_path: the four hand-computed scenarios of fixtures/scenarios_critical_path.py in every format (exact ns),
what-if cases (off the path: nothing changes; the critical kernel sped up: the path moves to the other stream), the
window choices and refusals, and internal consistency on the real multi-stream profiles under ../shared/data."""

from __future__ import annotations

import pytest

from conftest import FORMATS, needs_data, real_files, scenario_cases
from gpuscope.fixtures.scenarios_critical_path import EVENT_SCENARIOS, SCENARIOS, STEP, T0
from gpuscope.tools.analyses.critical_path import KINDS, build, critical_path
from gpuscope.tools.model.errors import ProfileError

US = 1_000
# Every writer expresses host calls, launches, both streams, cudaEventRecord / cudaStreamWaitEvent (hipEventRecord /
# hipStreamWaitEvent in rocpd) and the step ranges, so every scenario runs on every format.
EXPECTED = {  # path length, split (µs), lanes on the path, end event lane
    "cp_host_bound": (100, {"cpu": 88, "launch_overhead": 12}, ["host 3000/3000"]),
    "cp_gpu_bound": (415, {"cpu": 10, "launch_overhead": 5, "gpu_compute": 400}, ["gpu 3000/0/7", "host 3000/3000"]),
    "cp_cross_stream": (330, {"cpu": 20, "launch_overhead": 5, "gpu_compute": 300, "sync_wait": 5},
                        ["gpu 3000/0/7", "gpu 3000/0/13", "host 3000/3000"]),
    "cp_host_sync": (460, {"cpu": 33, "launch_overhead": 5, "gpu_compute": 420, "sync_wait": 2}, ["gpu 3000/0/7", "host 3000/3000"]),
}


@pytest.fixture(scope="module")
def opened(open_profile):
    return lambda name, fmt, pid=None: open_profile(name, fmt, pid, scenarios=SCENARIOS)


def _split(r):
    return {s.kind: s.ns for s in r.split if s.ns}


@pytest.mark.parametrize("name,fmt,pid", scenario_cases(SCENARIOS))
def test_hand_computed_paths(opened, name, fmt, pid):
    t = opened(name, fmt, pid)
    r = critical_path(t)
    length, split, lanes = EXPECTED[name]
    assert r.iteration is not None and r.iteration.index == 1 and "median-length steady" in r.iteration.how
    origin = r.window.start_ns - (T0 + STEP) * US  # the format's clock offset
    assert r.iteration.start_ns == origin + (T0 + STEP) * US
    assert r.path_ns == r.window_span_ns == r.window.span_ns == length * US
    assert _split(r) == {k: v * US for k, v in split.items()}
    assert sum(s.ns for s in r.split) == r.path_ns and [s.kind for s in r.split] == list(KINDS)
    assert [s for s in r.split if s.kind == "gpu_compute"][0].pct_of_path == round(100 * split.get("gpu_compute", 0) / length, 2)
    assert {s.lane for s in r.segments} == set(lanes)
    assert r.end_event.end_ns == r.window.end_ns
    assert r.segments[0].start_ns == r.window.start_ns and r.segments[-1].end_ns == r.window.end_ns
    assert sum(s.ns for s in r.segments) == r.path_ns
    holder = [ln for ln in r.lanes if ln.slack_ns == 0]
    assert holder and all(ln.slack_ns >= 0 for ln in r.lanes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cross_stream_event_and_what_if_moves_the_path(opened, fmt):
    t = opened("cp_cross_stream", fmt)
    r = critical_path(t, what_if=[[{"name_contains": "gemm", "speedup": 4.0}],
                                  [{"name_contains": "elementwise", "speedup": 2.0}],
                                  [{"name_glob": "gemm_*", "speedup": 1.0}]])
    assert r.graph.event_pairs_inferred == 1 and r.graph.event_pairs_dropped == 0
    assert r.graph.edges["event_wait"] == 1 and r.graph.edges["sync_wait"] == 1
    # the path runs A (stream 7) -> event -> C (stream 13)
    assert [s.lane for s in r.segments] == ["host 3000/3000", "gpu 3000/0/7", "gpu 3000/0/13", "host 3000/3000"]
    faster, off_path, unchanged = r.what_if
    # gemm x4: re-evaluated, C now waits for B; 187 µs, not 330 - 150 = 180 µs
    assert faster.rules[0].matched_ops == 1 and faster.rules[0].matched_on_path == 1
    assert faster.path_ns == 187 * US and faster.change_ns == -143 * US
    assert faster.change_pct == round(-100 * 143 / 330, 2)
    assert faster.path_moved and "gpu 3000/0/7" not in faster.lanes_after and "gpu 3000/0/13" in faster.lanes_after
    assert {s.kind: s.ns for s in faster.split if s.ns} == {"cpu": 22 * US, "launch_overhead": 10 * US,
                                                            "gpu_compute": 150 * US, "sync_wait": 3 * US, "idle_gap": 2 * US}
    # the add kernel B is off the path: nothing changes
    assert off_path.rules[0].matched_on_path == 0 and off_path.path_ns == r.path_ns and off_path.change_ns == 0
    assert not off_path.path_moved
    # speedup 1.0 is the baseline
    assert unchanged.path_ns == r.path_ns and not unchanged.path_moved


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_sync_what_if(opened, fmt):
    r = critical_path(opened("cp_host_sync", fmt), what_if=[{"name_contains": "gemm", "speedup": 4.0}])
    assert r.graph.sync_calls == 1 and r.graph.sync_calls_awaiting == 1
    (w,) = r.what_if
    assert w.path_ns == 160 * US and w.change_ns == -300 * US and not w.path_moved
    top = r.top_contributors[0]
    assert top.kind == "gpu_compute" and top.ns == 400 * US and "gemm" in top.name


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_bound_kernel_speedup_changes_nothing(opened, fmt):
    r = critical_path(opened("cp_host_bound", fmt), what_if=[{"name_contains": "elementwise", "speedup": 10.0}])
    (w,) = r.what_if
    assert w.rules[0].matched_ops == 4 and w.rules[0].matched_on_path == 0
    assert w.change_ns == 0 and not w.path_moved and w.lanes_after == ["host 3000/3000"]
    assert r.end_event.lane == "host 3000/3000"
    assert all(s.kind != "gpu_compute" or s.ns == 0 for s in r.split)


@pytest.mark.parametrize("fmt", FORMATS)
def test_event_ids_pair_the_wait_with_its_record(open_profile, fmt):
    """cp_event_ids: Nsight names the events and Kineto's cuda_sync record names the recording call, so the wait pairs
    with E1 (C waits for A) and gemm x4 saves 150 µs; rocpd pairs by call order (E2: C waits for B), and gemm x4 changes nothing. Path length 330 µs either way."""
    r = critical_path(open_profile("cp_event_ids", fmt, scenarios=EVENT_SCENARIOS), what_if=[{"name_contains": "gemm", "speedup": 4.0}])
    (w,) = r.what_if
    assert r.path_ns == 330 * US and r.graph.event_pairs_inferred == 1 and r.graph.event_pairs_dropped == 0
    if fmt in ("nsys", "kineto"):  # Nsight: CUDA event trace eventId; Kineto: cuda_sync's record correlation id
        assert r.graph.event_pairs_by_id == 1
        assert _split(r) == {"cpu": 20 * US, "launch_overhead": 5 * US, "gpu_compute": 300 * US, "sync_wait": 5 * US}
        assert [s.lane for s in r.segments] == ["host 3000/3000", "gpu 3000/0/7", "gpu 3000/0/13", "host 3000/3000"]
        assert w.path_ns == 180 * US and w.change_ns == -150 * US
    else:
        assert r.graph.event_pairs_by_id == 0
        assert _split(r) == {"cpu": 21 * US, "launch_overhead": 11 * US, "gpu_compute": 120 * US, "sync_wait": 178 * US}
        assert [s.lane for s in r.segments] == ["host 3000/3000", "gpu 3000/0/9", "gpu 3000/0/13", "host 3000/3000"]
        assert w.path_ns == 330 * US and w.change_ns == 0


def test_step_and_window_choices(opened):
    t = opened("cp_gpu_bound", "nsys")
    first = critical_path(t, step=0)
    assert first.iteration.index == 0 and first.iteration.how == "caller (step=0)" and first.path_ns == 415 * US
    ws = (T0 + 2 * STEP) * US
    win = critical_path(t, start_ns=ws, end_ns=ws + 500 * US)
    assert win.iteration is None and win.window.start_ns == ws and win.path_ns == 415 * US
    with pytest.raises(ProfileError, match="steps 0..2"):
        critical_path(t, step=7)
    # a window inside the capture where nothing runs: the longest gap between the host calls and GPU ops
    spans = sorted(t.sql("SELECT start_ns, end_ns FROM api_calls UNION ALL SELECT start_ns, end_ns FROM kernels "
                         "UNION ALL SELECT start_ns, end_ns FROM memops"))
    reach, gaps = spans[0][1], []
    for s0, e0 in spans[1:]:
        if s0 > reach:
            gaps.append((s0 - reach, reach, s0))
        reach = max(reach, e0)
    _, lo, hi = max(gaps)
    with pytest.raises(ProfileError, match="no API call or GPU operation starts or runs in the window.*widen the window"):
        critical_path(t, start_ns=lo + 1, end_ns=hi - 1)
    with pytest.raises(ProfileError, match="not both"):
        critical_path(t, step=1, start_ns=ws)
    with pytest.raises(ProfileError, match="speedup must be a positive"):
        critical_path(t, what_if=[{"name_contains": "gemm", "speedup": 0}])
    with pytest.raises(ProfileError, match="exactly one of"):
        critical_path(t, what_if=[{"speedup": 2.0}])



@pytest.mark.parametrize("buckets", [1, 3, 4096])
def test_node_cap_moves_the_window_end_to_the_first_start_past_it(opened, monkeypatch, buckets):
    """build._cut against a plain running count over the profile's events (3 nodes per API call, 1 per GPU op, by
    start): the new end is the first start where the count passes MAX_NODES, whatever the number of time slices."""
    t = opened("cp_cross_stream", "nsys")
    starts = {tb: [r[0] for r in t.sql(f"SELECT start_ns FROM {tb}")] for tb in ("api_calls", "kernels", "memops")}
    events = sorted([(s, 3) for s in starts["api_calls"]] + [(s, 1) for s in starts["kernels"] + starts["memops"]])
    ws, we = events[0][0], events[-1][0] + 1
    total = sum(w for _, w in events)
    monkeypatch.setattr(build, "BUCKETS", buckets)
    for cap in (1, 2, 3, 4, total // 2, total - 1, total):
        monkeypatch.setattr(build, "MAX_NODES", cap)
        upto, want = 0, None
        for s, w in events:
            upto += w
            if upto > cap:
                want = s
                break
        assert build._cut([t], [(0, None, ws, we, None)]) == ({} if want is None else {0: want}), cap


def test_a_substring_with_glob_characters_says_it_was_matched_literally(opened):
    t = opened("cp_gpu_bound", "nsys")
    star, glob, plain = critical_path(t, what_if=[[{"name_contains": "*", "speedup": 2.0}], [{"name_glob": "*", "speedup": 2.0}],
                                                  [{"name_contains": "gemm", "speedup": 2.0}]]).what_if
    assert "glob:*=K" in star.rules[0].hint  # (the fixture's demangled names hold a literal '*' in pointer arguments)
    assert glob.rules[0].matched_ops > star.rules[0].matched_ops and glob.rules[0].hint is None and glob.change_ns < 0
    assert plain.rules[0].hint is None


REAL = real_files("nsys/*streams*.sqlite", "pytorch/nv_a100_ddp_cnn_train_2rank_r0_hta.json.gz",
                  "pytorch/nv_h100_bert-small_infer_tracelens.json.gz")


@needs_data
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_multi_stream_consistency(path):
    from gpuscope.tools.model.cache import open_trace

    t = open_trace(path)
    r = critical_path(t, what_if=[[{"name_glob": "*", "speedup": 1.0}], [{"name_glob": "*", "speedup": 2.0}]])
    assert 0 < r.path_ns <= r.window.span_ns
    assert sum(s.ns for s in r.split) == r.path_ns
    assert all(s.ns >= 0 for s in r.split)
    same, faster = r.what_if
    assert same.path_ns == r.path_ns and same.change_ns == 0 and not same.path_moved
    assert faster.path_ns <= r.path_ns
    assert r.end_event.end_ns == r.window.end_ns


def _reference_longest_path(n, order, src, dst, typ, anc, w, delay, d):
    """Node by node in a topological order: S = max over incoming edges (S[src] + d[src], or S[src] + min(lag, d[src])
    for a start -> start edge) + delay; the binding edge is the latest, then the higher type, then the lower index."""
    S, bind = [0] * n, [-1] * n
    inc = {}
    for e, t in enumerate(dst):
        inc.setdefault(int(t), []).append(e)
    for i in order:
        best = None
        for e in inc[i]:
            p = int(src[e])
            a = S[p] + (int(d[p]) if anc[e] == 0 else min(int(w[e]), int(d[p])))
            if best is None or a > best or (a == best and typ[e] > typ[bind[i]]):
                best, bind[i] = a, e
        S[i] = best + int(delay[i])
    return S, bind


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_evaluation_matches_node_by_node_longest_path(seed):
    """Lanes (runs of lanes evaluated with running maxima, rounds over cross-lane edges) against the plain loop on
    random lane DAGs: random lanes, chain edges end -> start or start -> start + lag, cross edges from any node earlier
    in a random topological interleaving (same lane too), root edges, ties (small integer times), zero durations."""
    import numpy as np

    from gpuscope.tools.analyses.critical_path.lanes import Lanes

    rng = np.random.default_rng(seed)
    lanes = [int(x) for x in rng.integers(1, 12, size=rng.integers(1, 7))]
    n = 1 + sum(lanes)
    members, k = [], 1
    for ln in lanes:
        members.append(list(range(k, k + ln)))
        k += ln
    # a random topological order: lanes interleaved, each in chain order
    picks = rng.permutation(np.repeat(np.arange(len(lanes)), lanes))
    nxt = [0] * len(lanes)
    order = []
    for lane in picks:
        order.append(members[lane][nxt[lane]])
        nxt[lane] += 1
    rank = {v: i for i, v in enumerate(order)}
    src, dst, typ, anc, w, chain = [], [], [], [], [], []

    def edge(s, t, ty, a=0, lag=0, ch=False):
        src.append(s), dst.append(t), typ.append(ty), anc.append(a), w.append(lag), chain.append(ch)

    for m in members:
        edge(0, m[0], 0)
        for a, b in zip(m, m[1:]):
            edge(a, b, int(rng.choice([1, 3])), int(rng.integers(0, 2)), int(rng.integers(0, 6)), True)
    for v in order:
        for u in rng.choice(order[:rank[v]], size=min(rank[v], int(rng.integers(0, 3))), replace=False) if rank[v] else []:
            if not any(s == u and t == v for s, t in zip(src, dst)):
                edge(int(u), v, int(rng.integers(0, 6)), int(rng.integers(0, 2)), int(rng.integers(0, 6)))
        if rng.random() < 0.2 and not any(s == 0 and t == v for s, t in zip(src, dst)):
            edge(0, v, 0)
    arr = [np.asarray(x, dtype=np.int64) for x in (src, dst, typ, anc, w)]
    o = np.lexsort((arr[0], arr[1]))
    src, dst, typ, anc, w = (x[o] for x in arr)
    chain = np.asarray(chain)[o]
    seq = np.concatenate([np.asarray(m) for m in members])
    head = np.concatenate([[True] + [False] * (len(m) - 1) for m in members])
    delay = np.r_[0, rng.integers(0, 4, size=n - 1)]
    lanes_eval = Lanes(n, seq, head, src, dst, typ.astype(np.int8), anc.astype(np.int8), w, chain, delay)
    for _ in range(3):
        d = np.r_[0, rng.integers(0, 8, size=n - 1)]
        S, F, bind = lanes_eval.evaluate(d)
        ref_s, ref_bind = _reference_longest_path(n, order, src, dst, typ, anc, w, delay, d)
        assert S.tolist() == ref_s and (F - S).tolist() == d.tolist()
        assert bind.tolist() == ref_bind


def test_vectorised_evaluation_refuses_a_cycle():
    import numpy as np

    from gpuscope.tools.analyses.critical_path.lanes import Lanes

    # lanes [1, 2] and [3, 4]; 2 waits for 3 and 4 waits for 1 ... and 3 for 2: a cycle across the lanes
    src, dst, chain = np.array([0, 1, 2, 0, 3]), np.array([1, 2, 3, 3, 4]), np.array([False, True, False, False, True])
    src, dst, chain = np.r_[src, 3], np.r_[dst, 2], np.r_[chain, False]
    o = np.lexsort((src, dst))
    with pytest.raises(ProfileError, match="cycle"):
        Lanes(5, np.array([1, 2, 3, 4]), np.array([True, False, True, False]), src[o], dst[o], np.zeros(6, np.int8),
               np.zeros(6, np.int8), np.zeros(6, np.int64), chain[o], np.zeros(5, np.int64))


# -- jobs: collectives linked across ranks (fixtures/scenarios_job.py with deps=True; figures from its constants) ----

def _job_folder(tmp_path, n: int, straggler: int) -> str:
    from gpuscope.fixtures.scenarios_job import job, write_job

    return write_job(job(n, straggler, 3, deps=True), "kineto", tmp_path)[0]


@pytest.mark.parametrize("n,straggler", [(2, 1), (4, 2), (8, 5)])
def test_job_path_runs_through_the_last_arriving_rank_and_what_if_moves_every_rank(tmp_path, n, straggler):
    from gpuscope.fixtures.scenarios_job import PID0, TAIL_US, compute_us, step_us
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    with leases():
        traces = jobs.open_job([_job_folder(tmp_path, n, straggler)])
        r = critical_path(traces, what_if=[{"name_contains": "gemm", "speedup": 2.0}])
        start = r.window.start_ns
        c = critical_path(traces, start_ns=start, end_ns=start + 1_500 * US, what_if=[{"name_contains": "gemm", "speedup": 2.0}])
    i = 1  # three steps of equal length: the median steady step, on every rank
    cs = [compute_us(q, i, straggler) for q in range(n)]
    slow = cs[straggler]
    step = step_us(slow) * US
    assert r.iteration.index == i and r.path_ns == r.window_span_ns == step
    # the straggler's launch (gap 8 µs = cpu, then 22 µs to the gemm's start), its gemm, its event wait (7 µs), one
    # rank's transfer part (TAIL_US), that rank's sync return (10 µs), its host to the step's end
    assert _split(r) == {"cpu": step - (22 + slow + 7 + TAIL_US + 10) * US, "launch_overhead": 22 * US,
                         "gpu_compute": slow * US, "communication": TAIL_US * US, "sync_wait": 17 * US}
    last = n - 1  # every rank leaves together: the end event is the latest node of equal end, the last rank's
    p, q = PID0 + straggler, PID0 + last
    lanes = [f"rank {straggler} host {p}/{p}", f"rank {straggler} gpu {p}/{straggler % 8}/7",
             f"rank {straggler} gpu {p}/{straggler % 8}/20", f"rank {last} gpu {q}/{last % 8}/20", f"rank {last} host {q}/{q}"]
    lanes = [x for k, x in enumerate(lanes) if k == 0 or x != lanes[k - 1]]
    assert [s.lane for s in r.segments] == lanes
    assert r.segments[0].start_ns == start and r.segments[-1].end_ns == start + step
    # Kineto records the process group of each NCCL kernel: matched by communicator; one barrier, 2 edges per rank
    assert r.collectives.model_dump() == {"ranks_with_comm": n, "collective_match": "communicator", "comm_kernels": n,
                                          "p2p_kernels": 0, "comm_kernels_with_communicator": n, "instances": 1, "instances_by_communicator": 1,
                                          "instances_by_name_order": 0, "unlinked": 0, "edges": 2 * n,
                                          "wait_ns": sum(slow - x for x in cs) * US, "clamped_transfers": 0}
    assert r.graph.edges["collective"] == 2 * n and [x.rank for x in r.ranks] == list(range(n))
    assert any("clocks are assumed aligned" in a for a in r.assumptions)
    # gemm twice as fast on every rank: the straggler still arrives last, 190+ µs earlier; every rank's transfer, sync
    # return and step end move with it (re-evaluated: the other ranks' waits shrink, they are not subtracted)
    w = r.what_if[0]
    assert w.path_ns == step - slow * US // 2 and w.change_ns == -(slow * US // 2)
    assert f"rank {straggler} gpu {p}/{straggler % 8}/7" in w.lanes_after
    assert {s.kind: s.ns for s in w.split if s.ns}["gpu_compute"] == slow * US // 2
    # a caller window ends with the last event: the last rank's sync return after the transfer
    assert c.path_ns == (37 + slow + TAIL_US + 10) * US and c.what_if[0].path_ns == c.path_ns - slow * US // 2
    assert c.end_event.lane == f"rank {last} host {q}/{q}"


def test_job_refuses_pid(tmp_path):
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    with leases():
        traces = jobs.open_job([_job_folder(tmp_path, 2, 1)])
        with pytest.raises(ProfileError, match="pid selects a process"):
            critical_path(traces, pid=20_000)


@pytest.mark.parametrize("collectives", [False, True])
def test_job_reads_every_rank_through_the_stacked_store_in_a_fixed_number_of_statements(tmp_path, monkeypatch, collectives):
    """Every rank's window (step choice), API calls, GPU ops (with their communicators) and host-gap names come from
    the job's stacked store: the statements do not grow with the ranks, and no rank's own store is attached (each
    costs DuckDB ~0.5 MB of its memory limit), with or without collectives to match."""
    from gpuscope.fixtures.scenarios_job import PID0, job, step_us
    from gpuscope.fixtures.writers import kineto
    from gpuscope.tools.model import hub as hubs
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    statements = {}
    for n in (3, 6):
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        s = job(n, 1, 3, deps=True, silent=() if collectives else tuple(range(n)))
        for r in range(n):
            kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r)
        with leases():
            traces = jobs.open_job([str(folder)])
            seen = []
            for name in ("job_sql", "job_df"):
                real = getattr(jobs, name)
                monkeypatch.setattr(jobs, name, lambda *a, _real=real, **k: seen.append(a) or _real(*a, **k))
            res = critical_path(traces)
            monkeypatch.undo()
            attached = sum(str(t.store.model_file.resolve()) in hubs.hub()._attached for t in traces)
        statements[n] = len(seen)
        assert attached == 0
        assert [x.rank for x in res.ranks] == list(range(n))
        if collectives:
            assert res.collectives.comm_kernels > 0 and res.collectives.instances > 0
        else:
            # each rank's step thread runs to the step's end (the generator's step_us: no all-reduce to wait for)
            assert res.collectives.comm_kernels == 0
            assert res.iteration.index == 1 and res.path_ns == res.window_span_ns == step_us(0) * US
    assert statements[3] == statements[6]


def test_job_step_missing_on_another_rank_is_refused_with_that_ranks_series(tmp_path):
    """The first rank's step index is taken on every rank: a rank with fewer steps refuses it, naming its own series."""
    from gpuscope.fixtures.scenarios_job import PID0, job
    from gpuscope.fixtures.writers import kineto
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    paths = [str(kineto.write(job(2, 1, steps, deps=True), tmp_path / f"rank{r}.pt.trace.json", pid=PID0 + r))
             for r, steps in enumerate((3, 2))]
    with leases():
        traces = jobs.open_job(paths)
        assert critical_path(traces, step=1).iteration.index == 1
        with pytest.raises(ProfileError, match=rf"step=2 does not exist: .*\(process {PID0 + 1}, thread {PID0 + 1}\) has steps 0\.\.1"):
            critical_path(traces, step=2)


def test_job_clock_skew_clamps_transfer_parts(tmp_path):
    """Rank 0's clock runs 500 µs late: its arrival comes after the other ranks' all-reduce ended, so their transfer
    parts are clamped to 0 ns (counted); the path still ends on the latest rank's step end."""
    import dataclasses

    from gpuscope.fixtures.scenarios_job import PID0, job
    from gpuscope.fixtures.writers import kineto
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    n, skew = 4, 500 * US
    s = job(n, 2, 3, deps=True)
    for table in ("api_calls", "kernels", "markers", "cpu_ops", "memops"):
        setattr(s, table, [dataclasses.replace(x, start_ns=x.start_ns + skew, end_ns=x.end_ns + skew) if x.pid == PID0 else x
                           for x in getattr(s, table)])
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(n):
        kineto.write(s, folder / f"rank{r:03d}.pt.trace.json", pid=PID0 + r)
    with leases():
        r = critical_path(jobs.open_job([str(folder)]))
    assert r.collectives.clamped_transfers == n - 1 and r.collectives.instances == 1
    assert r.path_ns == skew + 1_500 * US and r.end_event.lane == f"rank 0 host {PID0}/{PID0}"


def test_job_in_one_nsight_file_holding_every_rank(tmp_path):
    """The ranks as processes of one profile (an MPI job's Nsight export): the same joined graph, the same figures."""
    from gpuscope.fixtures.scenarios_job import PID0, compute_us, job, step_us
    from gpuscope.fixtures.writers import nsys
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    path = nsys.write(job(4, 2, 3, deps=True), tmp_path / "job.sqlite")
    with leases():
        r = critical_path(jobs.open_job([str(path)]), what_if=[{"name_contains": "gemm", "speedup": 2.0}])
    slow = compute_us(2, 1, 2)
    assert r.path_ns == step_us(slow) * US and r.what_if[0].path_ns == r.path_ns - slow * US // 2
    assert r.collectives.instances == 1 and r.collectives.ranks_with_comm == 4
    assert [s.lane for s in r.segments][1:4] == [f"rank 2 gpu {PID0 + 2}/2/7", f"rank 2 gpu {PID0 + 2}/2/20",
                                                 f"rank 3 gpu {PID0 + 3}/3/20"]


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_job_point_to_point_kernels_are_not_joined(tmp_path, fmt):
    """Each rank runs a SendRecv after its all-reduce (fixtures/scenarios_job.py, p2p=True), rank 0 launching it
    last and the last rank's ending last, and its host waits for it. Only the all-reduce is joined (Kineto by its
    process group; the Nsight export has no NCCL payload: by name order): the SendRecvs (one process group 'pp', one
    kernel name) stay whole on each rank's stream 24. The path ends on the last rank: its SendRecv's full
    P2P_US + 3 x P2P_STEP_US is communication after its own launch, where a barrier would have made it wait for rank
    0's arrival (3 x P2P_LAG_US later) and put rank 0 on the path."""
    from gpuscope.fixtures.scenarios_job import P2P_STEP_US, P2P_US, PID0, TAIL_US, compute_us, job, step_us
    from gpuscope.fixtures.writers import kineto, nsys
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    n, straggler = 4, 2
    s = job(n, straggler, 3, deps=True, p2p=True)
    if fmt == "nsys":
        paths = [str(nsys.write(s, tmp_path / "job.sqlite"))]
    else:
        folder = tmp_path / "run"
        folder.mkdir()
        for q in range(n):
            kineto.write(s, folder / f"rank{q:03d}.pt.trace.json", pid=PID0 + q)
        paths = [str(folder)]
    with leases():
        r = critical_path(jobs.open_job(paths))
    cs = [compute_us(q, 1, straggler) for q in range(n)]
    slow = cs[straggler]
    step = step_us(slow)
    assert r.iteration.index == 1 and r.path_ns == r.window_span_ns == step * US
    # as without SendRecv, plus the last rank's SendRecv launch (5 µs), the whole SendRecv and its sync return (10 µs)
    p2p = P2P_US + (n - 1) * P2P_STEP_US
    assert _split(r) == {"cpu": (step - (22 + slow + 7 + TAIL_US + 10) - (5 + p2p + 10)) * US, "launch_overhead": 27 * US,
                         "gpu_compute": slow * US, "communication": (TAIL_US + p2p) * US, "sync_wait": 27 * US}
    p, q = PID0 + straggler, PID0 + n - 1
    assert [x.lane for x in r.segments] == [f"rank 2 host {p}/{p}", f"rank 2 gpu {p}/2/7", f"rank 2 gpu {p}/2/20",
                                            f"rank 3 gpu {q}/3/20", f"rank 3 host {q}/{q}", f"rank 3 gpu {q}/3/24",
                                            f"rank 3 host {q}/{q}"]
    by_comm = fmt == "kineto"
    assert r.collectives.model_dump() == {
        "ranks_with_comm": n, "collective_match": "communicator" if by_comm else "name_order", "comm_kernels": n,
        "p2p_kernels": n, "comm_kernels_with_communicator": n if by_comm else 0, "instances": 1,
        "instances_by_communicator": int(by_comm), "instances_by_name_order": int(not by_comm), "unlinked": 0,
        "edges": 2 * n, "wait_ns": sum(slow - x for x in cs) * US, "clamped_transfers": 0}
    assert r.graph.edges["collective"] == 2 * n
    assert any("point-to-point kernels" in a and "never joined" in a for a in r.assumptions)


@pytest.mark.parametrize("recorded", [True, False])
def test_job_rocm_generic_kernels_are_told_apart_by_their_recorded_operation(tmp_path, recorded):
    """ROCm's RCCL runs collectives and point-to-point transfers under one kernel name, ncclDevKernel_Generic: the
    p2p=True job above with every NCCL kernel so named, the SendRecvs' args saying 'send' (even ranks) or 'recv' (odd
    ranks). With the operation recorded (Kineto 'Collective name': kernels.collective) the job's figures are those of
    the named kernels; without it nothing tells them apart, and the SendRecvs of process group 'pp' are joined as a
    collective: its last arrival is rank 0's (each rank launches P2P_LAG_US after the next), so rank r waits
    r x P2P_LAG_US, on top of the all-reduce's waits."""
    import dataclasses

    from gpuscope.fixtures.catalog import NCCL, NCCL_SENDRECV
    from gpuscope.fixtures.scenarios_job import P2P_LAG_US, PID0, compute_us, job
    from gpuscope.fixtures.writers import kineto
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    generic = ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_Generic")
    n, straggler = 4, 2
    results = {}
    for variant in ("named", "generic"):
        s = job(n, straggler, 3, deps=True, p2p=True)
        if variant == "generic":
            s.kernels = [dataclasses.replace(k, name=generic[0], short_name=generic[1]) if k.name in (NCCL[0], NCCL_SENDRECV[0])
                         else k for k in s.kernels]
            for (_, pid, _), a in s.options["kineto_args"].items():
                if a["Collective name"] == "send":
                    a["Collective name"] = "send" if (pid - PID0) % 2 == 0 else "recv"
                if not recorded:
                    del a["Collective name"]
        folder = tmp_path / variant
        folder.mkdir()
        for q in range(n):
            kineto.write(s, folder / f"rank{q:03d}.pt.trace.json", pid=PID0 + q)
        with leases():
            r = critical_path(jobs.open_job([str(folder)]))
        results[variant] = (r.path_ns, _split(r), [x.lane for x in r.segments], r.collectives.model_dump())
    named, got = results["named"], results["generic"]
    assert named[3]["p2p_kernels"] == n and named[3]["instances"] == 1
    if recorded:
        assert got == named
    else:
        cs = [compute_us(q, 1, straggler) for q in range(n)]
        assert got[3] == {**named[3], "comm_kernels": 2 * n, "p2p_kernels": 0, "comm_kernels_with_communicator": 2 * n,
                          "instances": 2, "instances_by_communicator": 2, "edges": 4 * n,
                          "wait_ns": (sum(max(cs) - x for x in cs) + sum(q * P2P_LAG_US for q in range(n))) * US}


# -- jobs with two communicators: tensor-parallel groups {0, 1} and {2, 3}, a straggler (rank 2, gemm x2) in one ----

def _tp_job(tmp_path, fmt: str):
    """4 ranks, TP groups {0, 1} and {2, 3}, rank 2's gemm twice as slow (fixtures/scenarios_job.py, tp_groups=2):
    Kineto one file per rank (process group 'tp<g>' in the NCCL kernels' args), Nsight one file with every rank (NCCL
    payload communicator per group), or Kineto with the process group removed from the args (name order)."""
    from gpuscope.fixtures.scenarios_job import job, write_job

    return write_job(job(4, 2, 3, deps=True, slow=(2, 2), tp_groups=2, nccl_ranges=fmt == "nsys"), fmt, tmp_path)


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "kineto_no_group"])
def test_job_collectives_match_by_communicator_not_by_name(tmp_path, fmt):
    """Each group's all-reduce waits only for its own ranks. By communicator (Kineto process group, Nsight NCCL
    payload): group {2, 3} waits for rank 2's gemm (780 µs) and bounds the step (1,500 µs, the window span); gemm x2
    on every rank frees it by 390 µs, but group {0, 1} only by 152 µs (rank 1: 304 -> 152): path 1,348 µs, moved to
    rank 1. By name order (no communicator recorded) the four kernels form one instance: ranks 0 and 1 wait for rank
    2's arrival 376 µs past their own kernels' end (2 transfer parts clamped), and their step runs to 1,876 µs; gemm x2
    gives 1,486 µs. Figures from the generator's constants."""
    from gpuscope.fixtures.scenarios_job import PID0, TAIL_US, compute_us, step_us
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    with leases():
        r = critical_path(jobs.open_job(_tp_job(tmp_path, fmt)), what_if=[{"name_contains": "gemm", "speedup": 2.0}])
    c = [compute_us(q, 1, 2, (2, 2)) for q in range(4)]  # step 1: 300, 304, 780, 300 µs
    last_a, last_b = max(c[:2]), max(c[2:])
    step = step_us(max(c))
    assert r.iteration.index == 1 and (step, last_a, last_b) == (1_500, 304, 780)
    w = r.what_if[0]
    p1, p2, p3 = PID0 + 1, PID0 + 2, PID0 + 3
    by_group = fmt != "kineto_no_group"
    links = r.collectives.model_dump()
    assert links["comm_kernels"] == 4 and links["edges"] == 8 and links["unlinked"] == 0 and links["ranks_with_comm"] == 4
    if by_group:
        assert {k: links[k] for k in ("collective_match", "comm_kernels_with_communicator", "instances", "instances_by_communicator",
                                      "instances_by_name_order", "wait_ns", "clamped_transfers")} == {
            "collective_match": "communicator", "comm_kernels_with_communicator": 4, "instances": 2,
            "instances_by_communicator": 2, "instances_by_name_order": 0,
            "wait_ns": ((last_a - c[0]) + (last_a - c[1]) + (last_b - c[2]) + (last_b - c[3])) * US, "clamped_transfers": 0}
        assert r.path_ns == r.window_span_ns == step * US
        assert _split(r) == {"cpu": (step - 22 - last_b - 7 - TAIL_US - 10) * US, "launch_overhead": 22 * US,
                             "gpu_compute": last_b * US, "communication": TAIL_US * US, "sync_wait": 17 * US}
        assert [s.lane for s in r.segments] == [f"rank 2 host {p2}/{p2}", f"rank 2 gpu {p2}/2/7", f"rank 2 gpu {p2}/2/20",
                                                f"rank 3 gpu {p3}/3/20", f"rank 3 host {p3}/{p3}"]
        # gemm x2: group {2, 3} ends 390 µs earlier, group {0, 1} 152 µs earlier and now bounds the step
        assert w.path_ns == (step - last_a // 2) * US == 1_348 * US and w.change_ns == -152 * US and w.path_moved
        assert w.end_event.lane == f"rank 1 host {p1}/{p1}" and f"rank 1 gpu {p1}/1/7" in w.lanes_after
        assert {s.kind: s.ns for s in w.split if s.ns} == {"cpu": (1_348 - 22 - 152 - 7 - TAIL_US - 10) * US, "launch_overhead": 22 * US,
                                                          "gpu_compute": 152 * US, "communication": TAIL_US * US, "sync_wait": 17 * US}
    else:
        late = (37 + last_b) - (37 + last_a + TAIL_US)  # rank 2 arrives 376 µs after group {0, 1}'s kernels ended
        assert {k: links[k] for k in ("collective_match", "comm_kernels_with_communicator", "instances", "instances_by_communicator",
                                      "instances_by_name_order", "wait_ns", "clamped_transfers")} == {
            "collective_match": "name_order", "comm_kernels_with_communicator": 0, "instances": 1,
            "instances_by_communicator": 0, "instances_by_name_order": 1, "wait_ns": sum(last_b - x for x in c) * US,
            "clamped_transfers": 2}
        assert late == 376 and r.path_ns == (step + late) * US == 1_876 * US and r.end_event.lane == f"rank 1 host {p1}/{p1}"
        assert _split(r) == {"cpu": (step + late - 22 - last_b - 7 - 10) * US, "launch_overhead": 22 * US,
                             "gpu_compute": last_b * US, "sync_wait": 17 * US}
        assert w.path_ns == (step + late - last_b // 2) * US == 1_486 * US


# -- one collective rule for critical_path and straggler_summary: TP {0-3} {4-7}, DP pairs, straggler rank 5 ---------

@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_job_with_one_communicator_unrecorded_matches_every_collective_by_name_as_straggler_summary(tmp_path, fmt):
    """fixtures/scenarios_comm_groups.tp_dp_job with the DP all-reduces' communicator unrecorded (Kineto args without
    'Process Group Name', Nsight launch without NCCL range), the TP ones' recorded. The rule both job tools share
    (collectives.py) then matches every all-reduce by name order, since a kernel without its communicator would
    shift its communicator's count: 3 instances of the 8 ranks in the step, where the per-kernel rule critical_path
    ran before joined 4 TP instances by communicator and 1 DP instance by name. Group 1's second TP all-reduce then
    starts after group 0's ended, so group 0's 4 transfer parts are clamped. straggler_summary on the same job agrees.
    Figures from the generator (fixtures/scenarios_comm_groups.joined), exact ns."""
    from gpuscope.fixtures.scenarios_comm_groups import KINDS, joined, tp_dp_job
    from gpuscope.fixtures.scenarios_job import write_job
    from gpuscope.tools.analyses import straggler_summary
    from gpuscope.tools.model import job as jobs
    from gpuscope.tools.model.cache import leases

    steps = 3
    paths = write_job(tp_dp_job(8, 4, 5, steps, nccl_ranges=fmt == "nsys", unrecorded=("dp",)), fmt, tmp_path)
    with leases():
        job = jobs.open_job(paths)
        r = critical_path(job)
        s = straggler_summary(job)
    i = r.iteration.index
    want = joined(8, 4, 5, i, by_name=KINDS)
    assert r.collectives.model_dump() == {
        "ranks_with_comm": 8, "collective_match": "name_order", "comm_kernels": 3 * 8, "p2p_kernels": 0,
        "comm_kernels_with_communicator": 2 * 8, "instances_by_communicator": 0, "instances_by_name_order": 3,
        "unlinked": 0, **want}
    assert want["clamped_transfers"] == 4 and r.graph.edges["collective"] == want["edges"] == 2 * 3 * 8
    old = joined(8, 4, 5, i, by_name=("dp",))  # the per-kernel rule: 4 TP instances by communicator, DP by name
    assert (old["instances"], old["clamped_transfers"]) == (5, 0) and old["wait_ns"] != want["wait_ns"]
    assert r.path_ns == r.window_span_ns
    assert (s.collective_match, s.collectives_compared, s.collectives_skipped) == ("name_order", 3 * steps, 0)


def test_an_unknown_stream_is_a_lane_of_its_own(tmp_path):
    """Any integer may be a stream id, -1 included, and a GPU op may carry no stream at all: cp_cross_stream with
    stream 7 renamed -1 and stream 13's kernels stripped of args.stream keeps its two lanes and its path (330 µs),
    instead of one lane holding both streams."""
    import dataclasses
    import json

    from gpuscope.fixtures.writers import kineto
    from gpuscope.tools.model.trace import load_trace

    s = SCENARIOS["cp_cross_stream"]()
    s = dataclasses.replace(s, kernels=[dataclasses.replace(k, stream_id=-1) if k.stream_id == 7 else k for k in s.kernels])
    path = kineto.write(s, tmp_path / "streams.pt.trace.json")
    doc = json.loads(path.read_text())
    stripped = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("args", {}).get("stream") == 13:
            del e["args"]["stream"]
            stripped += 1
    assert stripped == sum(k.stream_id == 13 for k in s.kernels)
    path.write_text(json.dumps(doc))
    t = load_trace(path)
    try:
        assert t.scalar("SELECT count(*) FROM kernels WHERE stream_id IS NULL") == stripped
        r = critical_path(t)
        length, split, _ = EXPECTED["cp_cross_stream"]
        assert r.path_ns == length * US and _split(r) == {k: v * US for k, v in split.items()}
        assert {seg.lane for seg in r.segments} == {"gpu 3000/0/-1", "gpu 3000/0/?", "host 3000/3000"}
    finally:
        t.close()
