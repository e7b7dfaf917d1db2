"""rank_summary: ranks side by side, imbalance, per-iteration imbalance and the straggler.

Synthetic jobs (fixtures/scenarios_rank_summary.py) written as one Nsight/rocpd file holding every
process and as one Kineto file per process; expected figures computed from the scenario in plain
Python (exact integer ns). The real 2-rank pair is checked against the raw JSON.
"""

from __future__ import annotations

import gzip
import json
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import DATA, FORMATS
from gpuscope.fixtures import truth as T
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.scenarios_rank_summary import (FIRST_STEP, REPEATED_STEP, REPEATED_WALLS_US, rank_idle,
                                                       rank_repeated_steps, rank_straggler)
from gpuscope.tools.analyses.gpu_timeline import gpu_timeline
from gpuscope.tools.analyses import step_choice
from gpuscope.tools.analyses.critical_path import critical_path
from gpuscope.tools.analyses.rank_summary import rank_summary
from gpuscope.tools.analyses.step_choice import scope_steps
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

PAIR = [DATA / "pytorch" / f"nv_encdec_train_128rank_sampled_r{r}_hta.json.gz" for r in (0, 1)]
needs_pair = pytest.mark.skipif(not all(p.is_file() for p in PAIR), reason="../shared/data real 2-rank pair is not present")
BUILD = {
    "rank_straggler": lambda: rank_straggler(),
    "rank_straggler_async": lambda: rank_straggler(lockstep=False),
    "rank_straggler_unranked": lambda: rank_straggler(ranked=False),
    "rank_idle": rank_idle,
    "rank_repeated_steps": rank_repeated_steps,
    "two_gpus_one_process": SCENARIOS["two_gpus_one_process"],
}
FIGURES = ("gpu_span_ns", "busy_ns", "idle_in_gpu_span_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "exposed_memcpy_ns")


@pytest.fixture(scope="module")
def profiles(open_profile):
    """profiles(name, fmt) -> list of opened traces: one file (nsys/rocpd) or one per process (kineto)."""
    def get(name: str, fmt: str, copy: str = ""):
        pids = [p.pid for p in BUILD[name]().processes] if fmt == "kineto" else [None]
        return [open_profile(name, fmt, pid, scenarios=BUILD, copy=copy) for pid in pids]

    return get


# -- expected figures, from the scenario alone ---------------------------------------------------

def _is_comm(name: str) -> bool:
    return "nccl" in name.lower()


def rank_truth(s, pid: int) -> dict:
    """Per-device TraceLens figures of one process, summed over its devices; steps from its
    ProfilerStep ranges."""
    out = dict.fromkeys(FIGURES, 0)
    devices = sorted({o.device_id for o in [*s.kernels, *s.memops] if o.pid == pid})
    for dev in devices:
        ks = [k for k in s.kernels if k.pid == pid and k.device_id == dev]
        ms = [m for m in s.memops if m.pid == pid and m.device_id == dev]
        comm = [(k.start_ns, k.end_ns) for k in ks if _is_comm(k.name)]
        comp = [(k.start_ns, k.end_ns) for k in ks if not _is_comm(k.name)] + [(m.start_ns, m.end_ns) for m in ms if m.op == "set"]
        copy = [(m.start_ns, m.end_ns) for m in ms if m.op == "copy"]
        every = [iv for iv in comm + comp + copy if iv[1] > iv[0]]
        span = max(e for _, e in every) - min(s_ for s_, _ in every)
        busy, cc, c = T.busy_ns(every), T.busy_ns(comp + comm), T.busy_ns(comp)
        for k, v in dict(gpu_span_ns=span, busy_ns=busy, idle_in_gpu_span_ns=span - busy, compute_ns=c,
                         comm_ns=T.busy_ns(comm), exposed_comm_ns=cc - c, exposed_memcpy_ns=busy - cc).items():
            out[k] += v
    steps = [m.end_ns - m.start_ns for m in s.markers if m.pid == pid and m.name.startswith("ProfilerStep#")]
    out.update(devices=devices, steps=steps,
               kernels=sum(1 for k in s.kernels if k.pid == pid), comm_kernels=sum(1 for k in s.kernels if k.pid == pid and _is_comm(k.name)))
    return out


def ratio(values):
    mean = sum(values) / len(values)
    return round((max(values) - min(values)) / mean, 4) if mean else None


def check_rows(res, s, fmt, pids):
    assert [r.rank for r in res.ranks] == list(range(len(pids)))
    for row, pid in zip(res.ranks, pids):
        want = rank_truth(T.expressed(s, fmt, pid if fmt == "kineto" else None), pid)
        assert row.pid == pid
        assert row.devices == want["devices"]
        assert (row.kernels, row.comm_kernels) == (want["kernels"], want["comm_kernels"])
        for f in FIGURES:
            assert getattr(row, f) == want[f], (pid, f)
        assert row.busy_pct_of_gpu_span == round(100 * want["busy_ns"] / want["gpu_span_ns"], 2)
        assert row.compute_ns + row.exposed_comm_ns + row.exposed_memcpy_ns + row.idle_in_gpu_span_ns == row.gpu_span_ns
        assert row.steps == len(want["steps"])
        assert row.mean_step_ns == round(sum(want["steps"]) / len(want["steps"]), 1)
        assert (row.min_step_ns, row.max_step_ns) == (min(want["steps"]), max(want["steps"]))
    return {pid: rank_truth(T.expressed(s, fmt, pid if fmt == "kineto" else None), pid) for pid in pids}


# -- the straggler job -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_lockstep_straggler_found_by_compute(profiles, fmt):
    s = rank_straggler()
    traces = profiles("rank_straggler", fmt)
    if fmt == "kineto":
        traces = traces[::-1]  # ranks come from distributedInfo, not from the input order
    res = rank_summary(traces)
    assert res.ranks_found == 2
    want = check_rows(res, s, fmt, [7000, 7001])
    assert [r.rank_source for r in res.ranks] == (["input order"] * 2 if fmt == "rocpd" else ["profile"] * 2)
    if fmt == "rocpd":
        assert any("input order" in n for n in res.notes)
    imb = {m.metric: m for m in res.imbalance}
    for f in FIGURES:
        vals = [want[p][f] for p in (7000, 7001)]
        assert imb[f].imbalance_ratio == ratio(vals), f
        assert (imb[f].min, imb[f].max) == (min(vals), max(vals))
    assert imb["mean_step_ns"].imbalance_ratio == 0.0
    assert (imb["compute_ns"].max_rank, imb["exposed_comm_ns"].min_rank) == (1, 1)
    # every step is equally long on both ranks: per-iteration imbalance 0, no slowest rank
    assert [(i.step, i.min_wall_ns, i.max_wall_ns, i.imbalance_ratio, i.slowest_rank) for i in res.iterations] == [
        (f"ProfilerStep#{5 + i}", 1_500_000, 1_500_000, 0.0, None) for i in range(3)]
    st = res.straggler
    c0, c1 = want[7000]["compute_ns"], want[7001]["compute_ns"]
    assert (st.rank, st.metric, st.value, st.median) == (1, "compute_ns", c1, (c0 + c1) / 2)
    assert st.pct_above_median == round(100 * (c1 - (c0 + c1) / 2) / ((c0 + c1) / 2), 2)
    assert st.exposed_comm_lowest is True
    assert "lockstep" in st.evidence and "waiting for it" in st.evidence
    # the waiting rank's all-reduce is longer by the compute difference of every step
    assert want[7000]["exposed_comm_ns"] - want[7001]["exposed_comm_ns"] == sum(c - 300_000 for c in (420_000, 430_000, 440_000))


@pytest.mark.parametrize("fmt", FORMATS)
def test_straggler_by_step_time(profiles, fmt):
    s = rank_straggler(lockstep=False)
    res = rank_summary(profiles("rank_straggler_async", fmt))
    check_rows(res, s, fmt, [7000, 7001])
    st = res.straggler
    assert (st.rank, st.metric, st.value, st.median) == (1, "mean_step_ns", 1_600_000.0, 1_550_000.0)
    assert st.pct_above_median == round(100 * 50_000 / 1_550_000, 2)
    assert [(i.imbalance_ratio, i.slowest_rank, i.fastest_rank) for i in res.iterations] == [(round(100_000 / 1_550_000, 4), 1, 0)] * 3
    assert {m.metric: m.imbalance_ratio for m in res.imbalance}["mean_step_ns"] == round(100_000 / 1_550_000, 4)


def test_marker_names_the_steps(profiles):
    traces = profiles("rank_straggler_async", "nsys")
    named, auto = rank_summary(traces, marker="ProfilerStep#<N>"), rank_summary(traces)
    assert [r.step_names for r in named.ranks] == ["caller: ProfilerStep#5 .. ProfilerStep#7 (3 ranges)"] * 2
    assert [r.step_names for r in auto.ranks] == ["ProfilerStep: ProfilerStep#5 .. ProfilerStep#7 (3 ranges)"] * 2
    strip = lambda res: res.model_dump(exclude={"ranks": {"__all__": {"step_names"}}})  # noqa: E731
    assert strip(named) == strip(auto)
    with pytest.raises(ProfileError, match="no rank has step ranges matching marker .nosuch."):
        rank_summary(traces, marker="nosuch")


def test_comm_patterns_extend_communication(profiles):
    base = rank_summary(profiles("rank_straggler", "nsys"))
    wider = rank_summary(profiles("rank_straggler", "nsys"), comm_patterns=["gemm_kernel"])
    assert all(w.comm_kernels == b.comm_kernels + 3 for w, b in zip(wider.ranks, base.ranks))
    assert all(w.compute_ns < b.compute_ns for w, b in zip(wider.ranks, base.ranks))
    with pytest.raises(ProfileError, match="invalid communication pattern"):
        rank_summary(profiles("rank_straggler", "nsys"), comm_patterns=["("])


# -- rank identity: never a regex, never a silent overwrite ------------------------------------------

def test_duplicate_rank_is_an_error_naming_both(profiles):
    a = profiles("rank_straggler", "kineto")[0]
    b = profiles("rank_straggler", "kineto", copy="_again")[0]  # another file of rank 0
    with pytest.raises(ProfileError, match=r"rank 0 is claimed twice: by rank_straggler\.7000\.pt\.trace\.json pid 7000 "
                                           r"and by rank_straggler_again\.7000\.pt\.trace\.json pid 7000"):
        rank_summary([a, b])
    with pytest.raises(ProfileError, match="given twice"):
        rank_summary([a, a])
    with pytest.raises(ProfileError, match="no profiles"):
        rank_summary([])


def test_rankless_files_numbered_by_input_order(profiles):
    """HTA reads ranks with a regex and maps a missing one to 0, so two rank-less files collapse into one."""
    t0, t1 = profiles("rank_straggler_unranked", "kineto")
    for order in ([t0, t1], [t1, t0]):
        res = rank_summary(order)
        pids = [t.sql("SELECT pid FROM processes")[0][0] for t in order]
        assert [(r.rank, r.pid, r.rank_source) for r in res.ranks] == [(0, pids[0], "input order"), (1, pids[1], "input order")]
        assert any("input order" in n for n in res.notes)
        assert res.straggler.rank == [r.rank for r in res.ranks if r.pid == 7001][0]


# -- a rank without GPU work is a row, not an abort -----------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_rank_without_kernels(profiles, fmt):
    s = rank_idle()
    res = rank_summary(profiles("rank_idle", fmt))
    if fmt == "rocpd":  # rocpd states no ranks: a process without GPU work is not taken for a rank
        assert [r.pid for r in res.ranks] == [7100, 7101]
        assert any("7102 made GPU API calls but ran no GPU work" in n for n in res.notes)
        return
    assert [(r.rank, r.pid) for r in res.ranks] == [(0, 7100), (1, 7101), (2, 7102)]
    check_rows_partial = [rank_truth(T.expressed(s, fmt, p if fmt == "kineto" else None), p) for p in (7100, 7101)]
    for row, want in zip(res.ranks[:2], check_rows_partial):
        assert {f: getattr(row, f) for f in FIGURES} == {f: want[f] for f in FIGURES}
    idle = res.ranks[2]
    assert (idle.kernels, idle.devices, idle.steps, idle.mean_step_ns) == (0, [], 1, 1_100_000.0)
    assert idle.gpu_span_ns is None and idle.idle_in_gpu_span_ns is None and idle.busy_pct_of_gpu_span is None
    if fmt == "nsys":  # the profile recorded GPU work of other ranks: this rank's zeros are real
        assert (idle.busy_ns, idle.compute_ns, idle.comm_ns, idle.exposed_comm_ns) == (0, 0, 0, 0)
        busy = {m.metric: m for m in res.imbalance}["busy_ns"]
        assert (busy.ranks_counted, busy.min_rank, busy.imbalance_ratio) == (3, 2, round(380_000 / ((280_000 + 380_000) / 3), 4))
        assert "no communication kernels" in res.straggler.evidence
    else:  # its Kineto file holds no GPU activity at all: unknown, not zero
        assert (idle.busy_ns, idle.compute_ns, idle.comm_ns) == (None, None, None)
        assert any("no GPU activity at all" in n for n in idle.notes)
        assert {m.metric: m for m in res.imbalance}["busy_ns"].ranks_counted == 2
    # steps: 1000, 1050, 1100 µs -> rank 2 is slowest by step time (spread 9.5 % of the mean)
    assert (res.straggler.rank, res.straggler.metric) == (2, "mean_step_ns")
    assert res.iterations[0].imbalance_ratio == round(100_000 / 1_050_000, 4)


def test_single_rank_with_two_gpus(profiles):
    s = SCENARIOS["two_gpus_one_process"]()
    res = rank_summary(profiles("two_gpus_one_process", "nsys"))
    want = rank_truth(s, 3000)
    (row,) = res.ranks
    assert (row.rank, row.rank_source, row.devices) == (0, "input order", [0, 1])
    assert {f: getattr(row, f) for f in FIGURES} == {f: want[f] for f in FIGURES}
    assert [d.device_id for d in row.per_device] == [0, 1]
    assert sum(d.busy_ns for d in row.per_device) == row.busy_ns
    assert row.steps is None and res.iterations is None and res.straggler is None
    assert "one rank: nothing to compare" in res.notes
    assert all(m.imbalance_ratio is None for m in res.imbalance)


def test_limit_keeps_the_straggler(profiles):
    res = rank_summary(profiles("rank_straggler", "nsys"), limit=1)
    assert res.truncated and res.hint and [r.rank for r in res.ranks] == [1]
    assert res.ranks_found == 2 and res.straggler.rank == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_steps_of_one_name_on_two_threads(profiles, fmt):
    """Every step bears the same long name: the iterations table keys them by clipped name and number. A second
    thread holds fewer of those ranges: the main thread's series is used, and each rank says so. With limit 3 of
    5 steps, the first 3 are compared and the answer says it is cut."""
    res = rank_summary(profiles("rank_repeated_steps", fmt), marker=REPEATED_STEP, limit=3)
    clipped = REPEATED_STEP[:159] + "…"
    assert len(REPEATED_STEP) > 160
    for row, pid, walls in zip(res.ranks, (7200, 7201), REPEATED_WALLS_US):
        assert row.pid == pid and row.steps == len(walls)
        assert row.step_names == f"caller: {clipped} [1] .. {clipped} [5] (5 ranges)"
        assert row.mean_step_ns == round(sum(walls) * 1000 / len(walls), 1)
        assert (row.min_step_ns, row.max_step_ns) == (min(walls) * 1000, max(walls) * 1000)
        assert f"step ranges on 2 threads; thread {pid} (most steps) is used" in row.notes
    want = []
    for i in range(3):
        vals = [w[i] * 1000 for w in REPEATED_WALLS_US]
        lo, hi = min(vals), max(vals)
        want.append((f"{clipped} [{i + 1}]", lo, hi, sum(vals) / 2, ratio(vals),
                     vals.index(hi) if hi > lo else None, vals.index(lo) if hi > lo else None))
    assert [(i.step, i.min_wall_ns, i.max_wall_ns, i.mean_wall_ns, i.imbalance_ratio, i.slowest_rank, i.fastest_rank)
            for i in res.iterations] == want
    assert res.truncated and "only the first 3 iterations are listed" in res.hint
    assert len(rank_summary(profiles("rank_repeated_steps", fmt), marker=REPEATED_STEP).iterations) == 5


# -- the real 2-rank pair ----------------------------------------------------------------------------

def _raw(path: Path) -> dict:
    doc = json.loads(gzip.open(path).read())
    ns = lambda v: int(Decimal(str(v)) * 1000)  # noqa: E731 (integer µs in these files)
    comm, comp, copy, steps = [], [], [], []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        iv = (ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0)))
        cat = e.get("cat")
        if cat == "kernel":
            (comm if "nccl" in e["name"].lower() else comp).append(iv)
        elif cat == "gpu_memset":
            comp.append(iv)
        elif cat == "gpu_memcpy":
            copy.append(iv)
        elif cat == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            steps.append(iv[1] - iv[0])
    every = [iv for iv in comm + comp + copy if iv[1] > iv[0]]
    span = max(e for _, e in every) - min(s for s, _ in every)
    busy, cc, c = T.busy_ns(every), T.busy_ns(comp + comm), T.busy_ns(comp)
    return {"rank": doc["distributedInfo"]["rank"], "gpu_span_ns": span, "busy_ns": busy, "compute_ns": c,
            "comm_ns": T.busy_ns(comm), "exposed_comm_ns": cc - c, "exposed_memcpy_ns": busy - cc, "steps": steps}


@needs_pair
def test_real_pair_against_raw_json():
    traces = [load_trace(p) for p in PAIR[::-1]]
    try:
        res = rank_summary(traces)
        raw = [_raw(p) for p in PAIR]
        assert [r.rank for r in res.ranks] == [0, 1] and res.world_size == 128
        assert any("2 of 128 ranks" in n for n in res.notes)
        for row, want in zip(res.ranks, raw):
            assert row.rank == want["rank"]
            for f in ("gpu_span_ns", "busy_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "exposed_memcpy_ns"):
                assert getattr(row, f) == want[f], f
            assert row.steps == 2 and row.mean_step_ns == sum(want["steps"]) / 2
        # hand-checked figures (ms): compute 210.348 / 272.004, exposed comm 336.981 / 303.520,
        # steps 607.312 + 622.928 / 607.904 + 630.639
        assert [r.compute_ns for r in res.ranks] == [210_348_000, 272_004_000]
        assert [r.exposed_comm_ns for r in res.ranks] == [336_981_000, 303_520_000]
        assert [(i.step, i.min_wall_ns, i.max_wall_ns, i.slowest_rank) for i in res.iterations] == [
            ("ProfilerStep#551", 607_312_000, 607_904_000, 1), ("ProfilerStep#552", 622_928_000, 630_639_000, 1)]
        st = res.straggler
        assert (st.rank, st.metric, st.exposed_comm_lowest) == (1, "compute_ns", True)
        med = statistics.median([210_348_000, 272_004_000])
        assert st.pct_above_median == round(100 * (272_004_000 - med) / med, 2) == 12.78
        # the same figures gpu_timeline gives
        for row, t in zip(res.ranks, traces[::-1]):
            (tl,) = gpu_timeline(t).timelines
            assert (row.busy_ns, row.compute_ns, row.exposed_comm_ns, row.comm_ns) == (
                tl.busy_ns, tl.computation_ns, tl.exposed_comm_ns, tl.total_comm_ns)
    finally:
        for t in traces:
            t.close()


# -- the step choice over many scopes builds the automatic choice's inputs only where a scope makes it -------------

def _marked(s, pid: int, prefix: str) -> list[tuple]:
    return sorted((m.pid, m.tid, m.start_ns, m.end_ns, m.name) for m in s.markers if m.pid == pid and m.name.startswith(prefix))


def test_scope_steps_makes_the_automatic_choice_only_where_needed(profiles, monkeypatch):
    """The GPU work per range group (and the range depths) decide only the automatic choice. With a marker, or with
    ProfilerStep ranges in every scope, they are not built for the steps of rank_summary and critical_path (they were
    most of the statement's time); a scope without either gets its automatic choice. The steps are the scenario's
    ranges in every case."""
    built = []
    make = step_choice.temp_table_after
    monkeypatch.setattr(step_choice, "temp_table_after", lambda cur, sql, name, *a: built.append(name) or make(cur, sql, name, *a))
    steps, auto = profiles("rank_straggler", "nsys"), profiles("rank_repeated_steps", "nsys")
    s, r = rank_straggler(), rank_repeated_steps()
    got = lambda found: sorted(map(tuple, found[["pid", "tid", "start_ns", "end_ns", "name"]].to_numpy().tolist()))  # noqa: E731
    for marker, how in ((None, "ProfilerStep"), ("ProfilerStep#<N>", "caller")):
        found = scope_steps(steps, [(0, 7000), (0, 7001)], marker)
        assert built == []
        for pid in (7000, 7001):
            assert got(found[(0, pid)]) == _marked(s, pid, "ProfilerStep#") and set(found[(0, pid)]["how"]) == {how}
    # critical_path's step (iterations' step_choice) is chosen the same way
    assert critical_path(steps, step=1).iteration.name == f"ProfilerStep#{FIRST_STEP + 1}" and built == []
    found = scope_steps(steps + auto, [(0, 7000), (1, 7200)], None)
    assert built == ["_step_gop"]
    assert got(found[(0, 7000)]) == _marked(s, 7000, "ProfilerStep#")
    # on the chosen process, only the chosen thread (the main one: more ranges)
    assert got(found[(1, 7200)]) == [m for m in _marked(r, 7200, REPEATED_STEP) if m[1] == 7200]
    assert set(found[(1, 7200)]["how"]) == {"auto"}
