"""compare_traces: two profiles side by side (before/after, or the same workload on two platforms).

Totals (gpu_timeline / trace_info) with deltas; kernels matched by name and PyTorch ops matched by
name + input shapes (ops_summary group_by='shapes'), classified new / removed / regressed / improved
and ranked by |delta|. Cross-platform pairs (different device models) get the time ratio expected
from the hardware peaks (memory-bound: bandwidth ratio; compute-bound: matrix peak for the dtype,
bounds from roofline on the baseline) and entries far from it are flagged. Wording is neutral:
'takes N % longer on candidate', never 'X is better'.

Two jobs (each a list of per-rank profiles: a folder or glob) are compared as SQL over both jobs' stores at once
(stacked.py), a fixed number of statements however many ranks: ranks as rank_summary numbers them and matched by
rank number; kernels by name summed over each job's ranks, with the median over the job's ranks of a rank's summed
time (ranks without the kernel count 0); the totals are sums over ranks of rank_summary's per-rank figures; step
time per rank by step_choice.py (rank_summary's steps), per job the median and the maximum over ranks of a rank's
mean step; per rank the change of its compute time (which ranks got slower), its step time and the kernel that
changed most on it. PyTorch ops are compared for single profiles only.
"""

from __future__ import annotations

import statistics
from functools import partial

from typing import Literal

from pydantic import BaseModel, Field

from ..hardware.peaks import peaks_for_device
from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import ALL_TABLES, capture_window, clip_name, data_issue_notes, data_issues_field, pct, ToolResult
from .gpu_timeline import gpu_timeline
from .ops_summary import ops_summary
from .owners import unowned_join, unowned_sql
from .rank_summary import job_ranks, rank_rows
from .requirements import require
from .stacked import run, stack, values

UNCHANGED_FRACTION = 0.02   # |delta| below 2 % of the baseline time (or 1 µs) counts as unchanged
UNCHANGED_MIN_NS = 1_000
RATIO_TOLERANCE = 1.5       # flag when measured/expected ratio is outside [1/1.5, 1.5]
TOTAL_FIELDS = ("capture_span_ns", "gpu_span_ns", "busy_ns", "idle_ns", "computation_ns", "total_comm_ns", "exposed_comm_ns",
                "total_memcpy_ns", "exposed_memcpy_ns", "summed_kernel_time_ns")
_TL_FIELDS = ("total_ns", "busy_ns", "idle_ns", "computation_ns", "total_comm_ns", "exposed_comm_ns", "total_memcpy_ns",
              "exposed_memcpy_ns")


class TotalDelta(BaseModel):
    figure: str = Field(description="what is compared (ns): capture_span (first to last event of the profile), gpu_span "
                                    "(first to last GPU op), busy / idle / computation / total_comm / exposed_comm / total_memcpy / "
                                    "exposed_memcpy as in gpu_timeline, summed_kernel_time (Σ kernel durations)")
    baseline_ns: int | None = Field(description="ns; jobs: the sum over the job's ranks, null when a rank lacks its own "
                                                "figure (listed in baseline_ranks_without)")
    candidate_ns: int | None
    delta_ns: int | None = Field(description="candidate - baseline, ns; null when either side is null")
    change_pct: float | None = Field(description="delta / baseline, % (positive: takes longer on candidate)")
    baseline_ranks_without: list[int] | None = Field(None, description="jobs: ranks whose own figure is null (e.g. no GPU "
                                                                        "work), so the baseline sum is not given")
    candidate_ranks_without: list[int] | None = None


class Entry(BaseModel):
    key: str = Field(description="kernel name (clipped) or op name")
    input_dims: str | None = Field(None, description="ops: input shapes (JSON) the op was matched on")
    input_types: str | None = None
    status: str = Field(description="'new' (only in candidate), 'removed' (only in baseline), 'regressed' "
                                    "(takes longer on candidate), 'improved' (takes less time on candidate), 'unchanged'")
    baseline_count: int
    candidate_count: int
    baseline_ns: int = Field(description="summed time in baseline, ns (kernels: Σ durations; ops: Σ direct kernel time)")
    candidate_ns: int
    delta_ns: int = Field(description="candidate - baseline, ns")
    change_pct: float | None = Field(description="delta / baseline, %; null for new entries")
    pct_of_gross_change: float | None = Field(description="delta / gross_change_ns of this list (Σ |delta| over all entries), %, signed")
    bound: str | None = Field(None, description="cross-platform: 'memory' / 'compute (<roof field>)' (roofline on the baseline's op) "
                                                "or 'bound unknown' (kernels, unrated ops): then no expected ratio")
    expected_ratio: float | None = Field(None, description="cross-platform: candidate/baseline time expected from the peaks")
    measured_ratio: float | None = Field(None, description="candidate_ns / baseline_ns")
    off_expected: bool | None = Field(None, description="measured ratio outside the tolerance band around the expected one")
    baseline_rank_median_ns: float | None = Field(None, description="jobs: median over the baseline job's ranks of a rank's "
                                                                    "summed time (ranks without it count 0), ns; null for "
                                                                    "single profiles and for kernels the job never ran")
    candidate_rank_median_ns: float | None = Field(None, description="jobs: the same over the candidate job's ranks, ns")
    baseline_ranks_with: int | None = Field(None, description="jobs: baseline ranks that ran it")
    candidate_ranks_with: int | None = Field(None, description="jobs: candidate ranks that ran it")


class EntryList(BaseModel):
    matched_by: str
    baseline_total_ns: int = Field(description="Σ time of all entries in baseline, ns")
    candidate_total_ns: int
    net_change_ns: int = Field(description="candidate_total - baseline_total, ns")
    gross_change_ns: int = Field(description="Σ |delta| over every entry (denominator of pct_of_gross_change), ns")
    counts: dict[str, int] = Field(description="entries per status")
    entries: list[Entry] = Field(description="sorted by |delta|, unchanged entries left out")
    truncated: bool
    remainder_entries: int
    remainder_delta_ns: int = Field(description="Σ delta of the changed entries beyond the limit, ns")


class PlatformRatio(BaseModel):
    baseline_device: str | None
    candidate_device: str | None
    cross_platform: bool = Field(description="true: the device models differ")
    memory_bandwidth_ratio: float | None = Field(description="baseline bandwidth / candidate bandwidth: expected candidate/baseline time for memory-bound work")
    matrix_ratios: dict[str, float] = Field(description="dtype -> baseline matrix peak / candidate matrix peak: expected time ratio for "
                                                        "compute-bound work on tensor cores (ops use the roof field roofline chose)")
    tolerance: str
    note: str | None = None


class JobSide(BaseModel):
    profiles: int = Field(description="profiles of the job")
    ranks: int = Field(description="ranks found in them (as rank_summary)")
    ranks_with_steps: int = Field(description="ranks with step ranges (step_choice.py: ProfilerStep#N, or the repeating "
                                              "range covering the GPU work)")
    median_rank_step_ns: float | None = Field(description="median over ranks_with_steps of a rank's mean step time, ns")
    max_rank_step_ns: float | None = Field(description="largest mean step time of a rank (the slowest rank), ns")
    slowest_rank: int | None = Field(description="rank with the largest mean step time (lowest rank on ties)")


class RankChange(BaseModel):
    rank: int
    status: str = Field(description="by compute time: 'slower' / 'faster' (|delta| >= max(1 µs, 2 % of the baseline "
                                    "rank's)), 'only in baseline', 'only in candidate'")
    baseline_compute_ns: int | None = Field(description="union of the rank's non-communication kernels and memsets "
                                                        "(rank_summary compute_ns), ns")
    candidate_compute_ns: int | None
    compute_delta_ns: int | None = Field(description="candidate - baseline compute time, ns")
    compute_change_pct: float | None = Field(description="compute_delta_ns / baseline_compute_ns, %")
    baseline_step_ns: float | None = Field(description="the rank's mean step time, ns")
    candidate_step_ns: float | None
    step_change_pct: float | None = Field(description="(candidate - baseline) / baseline_step_ns, %")
    baseline_kernel_ns: int = Field(description="Σ durations of the rank's kernels (work), ns")
    candidate_kernel_ns: int
    top_kernel: str | None = Field(description="kernel whose summed time on this rank changed most (clipped)")
    top_kernel_delta_ns: int | None = Field(description="its candidate - baseline summed time on this rank, ns")


class JobComparison(BaseModel):
    baseline: JobSide
    candidate: JobSide
    ranks_matched: int = Field(description="rank numbers present in both jobs")
    median_rank_step_change_pct: float | None = Field(description="(candidate - baseline median_rank_step_ns) / baseline "
                                                                  "median_rank_step_ns, %")
    counts: dict[str, int] = Field(description="ranks per status (slower, faster, unchanged, only in baseline, only in "
                                               "candidate, no compute figure: a side without GPU compute on that rank)")
    ranks: list[RankChange] = Field(description="ranks whose compute time changed, largest |compute_delta_ns| first")
    truncated: bool = Field(description="true when changed ranks were cut to `limit`")


class CompareResult(ToolResult):
    baseline: str
    candidate: str
    devices: list[int | None] = Field(description="[baseline device, candidate device]; null = all devices merged")
    totals: list[TotalDelta]
    platform: PlatformRatio
    kernels: EntryList
    ops: EntryList | None = Field(description="PyTorch ops by name + shapes; null unless both sides have cpu_ops "
                                              "(and for jobs)")
    job: JobComparison | None = Field(None, description="two jobs (folders/globs of per-rank profiles): per job step time "
                                                        "and per rank the change; null for two single profiles")
    notes: list[str]
    data_issues: list[str] = data_issues_field()


def _devices(trace: Trace) -> list[int]:
    return [int(r[0]) for r in trace.sql(
        "SELECT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memops) GROUP BY 1 ORDER BY 1")]


def _pick(trace: Trace, dev: int | None, side: str) -> int | None:
    devs = _devices(trace)
    require(trace, "compare_traces", f"(It is the {side} profile.)")
    if dev is None:
        return devs[0] if len(devs) == 1 else None
    if dev not in devs:
        raise ProfileError(f"device {dev} has no GPU work in {trace.path.name} ({side}); devices with work: {devs}.")
    return dev


def _totals(trace: Trace, dev: int | None) -> dict[str, int]:
    tl = gpu_timeline(trace, device=dev, limit=1)
    t = tl.all_devices if dev is None and tl.all_devices is not None else None
    if t is None:
        rows = tl.timelines
        agg = {f: sum(getattr(r, f) for r in rows) for f in _TL_FIELDS}
    else:
        agg = {f: getattr(t, f) for f in _TL_FIELDS}
    cap = capture_window(trace)
    where, params = ("WHERE device_id = ?", [dev]) if dev is not None else ("", [])
    summed = trace.sql(f"SELECT coalesce(sum(dur_ns), 0)::BIGINT FROM kernels {where}", params)[0][0]
    return {"capture_span_ns": int(cap.span_ns), "gpu_span_ns": agg["total_ns"],
            **{f: agg[f] for f in _TL_FIELDS if f != "total_ns"}, "summed_kernel_time_ns": int(summed)}


def _kernel_groups(trace: Trace, dev: int | None, col: str) -> dict[tuple, tuple[int, int]]:
    where, params = ("WHERE device_id = ?", [dev]) if dev is not None else ("", [])
    return {(r[0],): (int(r[1]), int(r[2])) for r in trace.sql(
        f"SELECT {col}, count(*), sum(dur_ns)::BIGINT FROM kernels {where} GROUP BY 1", params)}


def _op_groups(trace: Trace, dev: int | None) -> dict[tuple, tuple[int, int]]:
    res = ops_summary(trace, group_by="shapes", device=dev, limit=100_000)
    out: dict[tuple, tuple[int, int]] = {}
    for r in res.rows:
        k = (r.name, r.input_dims, r.input_types)
        c, t = out.get(k, (0, 0))
        out[k] = (c + r.count, t + r.direct_total_ns)
    return out


def _status(b: int, c: int, in_b: bool, in_c: bool) -> str:
    if not in_b:
        return "new"
    if not in_c:
        return "removed"
    d = c - b
    if abs(d) < max(UNCHANGED_MIN_NS, UNCHANGED_FRACTION * b):
        return "unchanged"
    return "regressed" if d > 0 else "improved"


def _entries(base: dict, cand: dict, matched_by: str, limit: int, ratio_for=None, extra: dict | None = None) -> EntryList:
    keys = set(base) | set(cand)
    gross = sum(abs(cand.get(k, (0, 0))[1] - base.get(k, (0, 0))[1]) for k in keys)
    rows: list[Entry] = []
    counts: dict[str, int] = {s: 0 for s in ("new", "removed", "regressed", "improved", "unchanged")}
    for k in keys:
        (bc, bt), (cc, ct) = base.get(k, (0, 0)), cand.get(k, (0, 0))
        st = _status(bt, ct, k in base, k in cand)
        counts[st] += 1
        if st == "unchanged":
            continue
        e = Entry(key=clip_name(k[0]) or "<unnamed>", input_dims=k[1] if len(k) > 1 else None,
                  input_types=k[2] if len(k) > 2 else None, status=st, baseline_count=bc, candidate_count=cc,
                  baseline_ns=bt, candidate_ns=ct, delta_ns=ct - bt, change_pct=pct(ct - bt, bt),
                  pct_of_gross_change=pct(ct - bt, gross), **(extra or {}).get(k, {}))
        if ratio_for is not None and bt and ct:
            bound, exp = ratio_for(k)
            e.bound, e.expected_ratio, e.measured_ratio = bound, exp, round(ct / bt, 3)
            if exp:
                r = (ct / bt) / exp
                e.off_expected = not (1 / RATIO_TOLERANCE <= r <= RATIO_TOLERANCE)
        rows.append(e)
    rows.sort(key=lambda e: (-abs(e.delta_ns), e.key, e.input_dims or ""))
    shown, rest = rows[:limit], rows[limit:]
    bsum, csum = sum(v[1] for v in base.values()), sum(v[1] for v in cand.values())
    return EntryList(matched_by=matched_by, baseline_total_ns=bsum, candidate_total_ns=csum, net_change_ns=csum - bsum,
                     gross_change_ns=gross, counts=counts, entries=shown, truncated=bool(rest),
                     remainder_entries=len(rest), remainder_delta_ns=sum(e.delta_ns for e in rest))


def _device_name(trace: Trace, dev: int | None) -> str | None:
    rows = trace.sql("SELECT name FROM devices WHERE device_id = ?" if dev is not None else "SELECT name FROM devices",
                     [dev] if dev is not None else [])
    names = sorted({r[0] for r in rows if r[0]})
    return names[0] if len(names) == 1 else (", ".join(names) or None)


def _peaks(trace: Trace, dev: int | None):
    d = dev if dev is not None else (_devices(trace) or [0])[0]
    return peaks_for_device(trace, d)  # None for an unknown GPU: no expected ratio


def _bounds(trace: Trace, dev: int | None) -> dict[tuple, tuple[str, str | None]]:
    """(op name, input_dims) -> (bound, compute roof field) from roofline on the baseline; empty when not available."""
    from .roofline import roofline
    try:
        res = roofline(trace, device=dev, limit=500)
    except ProfileError:  # no PyTorch ops / several GPUs on the baseline: bounds unknown
        return {}
    out = {}
    for r in res.rows:
        if r.source == "op" and r.rated and r.bound:
            out[(r.name, (r.signature or {}).get("input_dims"))] = (r.bound, r.compute_roof_field)
    return out


def compare_traces(
    baseline: Trace | list[Trace],
    candidate: Trace | list[Trace],
    *,
    device: int | tuple[int, int] | list[int] | None = None,
    limit: int = 15,
    match: Literal["name", "short_name"] = "short_name",
) -> CompareResult:
    """`baseline` and `candidate` are profiles, or jobs (lists of per-rank profiles, e.g. from job.open_job)."""
    if match not in ("name", "short_name"):
        raise ProfileError("match must be 'name' (full kernel name) or 'short_name' (base name).")
    limit = max(1, min(int(limit), 200))
    if isinstance(baseline, list) or isinstance(candidate, list):
        if device is not None:
            raise ProfileError("device applies to two single profiles; comparing jobs, every rank's GPUs are its own. "
                               "Call without device.")
        return _compare_jobs(baseline if isinstance(baseline, list) else [baseline],
                             candidate if isinstance(candidate, list) else [candidate], limit, match)
    if device is None or isinstance(device, int):
        bdev, cdev = device, device
    elif isinstance(device, (list, tuple)) and len(device) == 2:
        bdev, cdev = device
    else:
        raise ProfileError(f"device must be one device id (both sides) or [baseline_device, candidate_device], not {device!r}.")
    bdev, cdev = _pick(baseline, bdev, "baseline"), _pick(candidate, cdev, "candidate")
    notes: list[str] = []
    if (bdev is None) != (cdev is None):
        notes.append("one side has several GPUs with work and the other one: the several are merged; pass device=[b, c] to pick one each.")
    tb, tc = _totals(baseline, bdev), _totals(candidate, cdev)
    totals = [TotalDelta(figure=f, baseline_ns=tb[f], candidate_ns=tc[f], delta_ns=tc[f] - tb[f],
                         change_pct=pct(tc[f] - tb[f], tb[f])) for f in TOTAL_FIELDS]

    bname, cname = _device_name(baseline, bdev), _device_name(candidate, cdev)
    pb, pc = _peaks(baseline, bdev), _peaks(candidate, cdev)
    cross = (pb.entry is not pc.entry) if (pb and pc) else ((bname or "").lower() != (cname or "").lower())
    bw = None
    mats = {}
    pnote = None
    if cross and pb and pc:
        vb, vc = pb.value("memory_bandwidth_bytes_per_s"), pc.value("memory_bandwidth_bytes_per_s")
        bw = round(vb / vc, 3) if vb and vc else None
        for dt in ("bf16", "fp16", "fp32", "tf32", "fp8"):
            mb, mc = pb.value(f"tflops_{dt}_matrix"), pc.value(f"tflops_{dt}_matrix")
            if mb and mc:
                mats[dt] = round(mb / mc, 3)
    elif cross:
        pnote = "a device is not in the peaks table: no expected ratio"
    platform = PlatformRatio(baseline_device=bname, candidate_device=cname, cross_platform=cross,
                             memory_bandwidth_ratio=bw, matrix_ratios=mats,
                             tolerance=f"flagged when measured/expected is outside [1/{RATIO_TOLERANCE}, {RATIO_TOLERANCE}]",
                             note=pnote)

    kb, kc = _kernel_groups(baseline, bdev, match), _kernel_groups(candidate, cdev, match)
    kernels = _entries(kb, kc, f"kernel {match}", limit, (lambda k: ("bound unknown", None)) if cross else None)
    if cross:
        notes.append("cross-platform pair: kernel names differ between vendors/libraries, so few kernels match and most "
                     "show as new/removed; the op comparison (name + shapes) is the like-for-like one.")
    if match == "short_name":
        notes.append("kernels matched by base name (short_name): template/argument variants of one kernel are merged.")

    ops = None
    if baseline.count("cpu_ops") and candidate.count("cpu_ops"):
        ratio_for = None
        if cross and (bw or mats):
            ratio_for = partial(_expected_ratio, _bounds(baseline, bdev), bw, pb, pc)
        ops = _entries(_op_groups(baseline, bdev), _op_groups(candidate, cdev), "op name + input shapes + dtypes", limit, ratio_for)
    else:
        notes.append("op comparison skipped: a side has no PyTorch cpu_ops."
                     + (" No entry gets an expected ratio: the bound (memory/compute) comes from roofline on the baseline's "
                        "PyTorch ops (shapes), and kernels alone carry none." if cross else ""))
    for lst, what in ((kernels, "kernels"), (ops, "ops")):
        if lst is not None and lst.truncated:
            notes.append(f"{what}: {lst.remainder_entries} more changed entries (Σ delta {lst.remainder_delta_ns} ns) beyond limit="
                         f"{limit}; pass a larger limit to see them.")
    notes.append(f"'unchanged' = |delta| < max({UNCHANGED_MIN_NS} ns, {UNCHANGED_FRACTION:.0%} of baseline); "
                 "positive delta: takes longer on candidate.")
    return CompareResult(baseline=str(baseline.path), candidate=str(candidate.path), devices=[bdev, cdev], totals=totals,
                         platform=platform, kernels=kernels, ops=ops, notes=notes,
                         data_issues=[f"{side}: {note}" for side, trace in (("baseline", baseline), ("candidate", candidate))
                                      for note in data_issue_notes(trace, ALL_TABLES)])


def _expected_ratio(bounds: dict, bw: float | None, pb, pc, key: tuple) -> tuple[str, float | None]:
    """(bound, expected candidate/baseline time ratio) of an op: memory-bound -> baseline/candidate bandwidth; compute-bound
    -> baseline/candidate peak of the compute roof the baseline roofline chose for it (e.g. tflops_bf16_matrix)."""
    b = bounds.get((key[0], key[1]))
    if b is None:
        return "bound unknown", None
    if b[0] == "memory":
        return "memory", bw
    field = b[1]
    vb, vc = (pb.value(field), pc.value(field)) if field else (None, None)
    if not vb or not vc:
        return "compute", None
    return f"compute ({field})", round(vb / vc, 3)


# -- two jobs --------------------------------------------------------------------------------------

# figure -> RankRow field summed over a job's ranks
JOB_TOTALS = (("gpu_span_ns", "gpu_span_ns"), ("busy_ns", "busy_ns"), ("idle_ns", "idle_in_gpu_span_ns"),
              ("computation_ns", "compute_ns"), ("total_comm_ns", "comm_ns"), ("exposed_comm_ns", "exposed_comm_ns"),
              ("exposed_memcpy_ns", "exposed_memcpy_ns"))
RANK_STATUSES = ("slower", "faster", "unchanged", "only in baseline", "only in candidate", "no compute figure")


def _job_label(traces: list[Trace]) -> str:
    if len(traces) == 1:
        return str(traces[0].path)
    folders = {t.path.parent for t in traces}
    where = str(next(iter(folders))) if len(folders) == 1 else f"{traces[0].path} .. {traces[-1].path}"
    return f"{where} ({len(traces)} profiles)"


def _side(traces: list[Trace], rows: list) -> JobSide:
    stepped = [(r.rank, r.mean_step_ns) for r in rows if r.mean_step_ns is not None]
    vals = [v for _, v in stepped]
    top = max(vals) if vals else None
    return JobSide(profiles=len(traces), ranks=len(rows), ranks_with_steps=len(stepped),
                   median_rank_step_ns=float(statistics.median(vals)) if vals else None, max_rank_step_ns=top,
                   slowest_rank=min(r for r, v in stepped if v == top) if vals else None)


def _compare_jobs(base: list[Trace], cand: list[Trace], limit: int, match: str) -> CompareResult:
    notes: list[str] = []
    jobs = (base, cand)
    units = [job_ranks(j, notes) for j in jobs]  # refuses an empty job and a profile given twice in one job
    both = base + cand
    unit_rows = values([(side, u.order + side * len(base), u.pid, u.whole or u.pid is None, u.rank)
                        for side in (0, 1) for u in units[side]], ("INTEGER", "BIGINT", "BIGINT", "BOOLEAN", "BIGINT"))
    # kernels by rank, owned as rank_summary and comm_job_summary own them (owners.py, over every GPU op)
    keys = (stack(both, "kernels", "device_id, stream_id, pid") + " UNION ALL " + stack(both, "memops", "device_id, stream_id, pid"))
    base_sql = f"""
        WITH units(job, part, pid, whole, rank) AS ({unit_rows}),
        kk AS ({stack(both, 'kernels', f'device_id, stream_id, pid, {match} AS key, dur_ns')}),
        unowned AS ({unowned_sql(keys)}),
        rk AS (SELECT u.job, u.rank, kk.key, count(*) AS n, sum(kk.dur_ns)::BIGINT AS total
               FROM kk LEFT JOIN unowned ON {unowned_join('kk', 'unowned')} JOIN units u ON u.part = kk.part
                    AND (u.whole OR u.pid = coalesce(kk.pid, unowned.owner))
               GROUP BY u.job, u.rank, kk.key)"""
    families = run(both, base_sql + """,
        keys AS (SELECT DISTINCT job, key FROM rk),
        grid AS (SELECT keys.job, keys.key, jr.rank, coalesce(rk.n, 0) AS n, coalesce(rk.total, 0) AS total
                 FROM keys JOIN (SELECT DISTINCT job, rank FROM units) jr USING (job) LEFT JOIN rk USING (job, rank, key))
        SELECT job, key, sum(n)::BIGINT, sum(total)::BIGINT, median(total)::DOUBLE, count(*) FILTER (WHERE n > 0)
        FROM grid GROUP BY job, key""")
    per_rank = {int(r): (int(bt), int(ct), key, None if d is None else int(d)) for r, bt, ct, key, d in run(both, base_sql + """,
        d AS (SELECT coalesce(b.rank, c.rank) AS rank, coalesce(b.key, c.key) AS key, coalesce(b.total, 0) AS bt,
                     coalesce(c.total, 0) AS ct
              FROM (SELECT * FROM rk WHERE job = 0) b FULL JOIN (SELECT * FROM rk WHERE job = 1) c
                   ON b.rank = c.rank AND b.key = c.key),
        ranked AS (SELECT *, row_number() OVER (PARTITION BY rank ORDER BY abs(ct - bt) DESC, key) AS rn FROM d)
        SELECT rank, sum(bt)::BIGINT, sum(ct)::BIGINT, any_value(key) FILTER (WHERE rn = 1 AND ct <> bt),
               any_value(ct - bt) FILTER (WHERE rn = 1 AND ct <> bt)
        FROM ranked GROUP BY rank""")}
    sides: list[dict] = [{}, {}]
    extra: dict[tuple, dict] = {}
    for job, key, n, total, med, ranks_with in families:
        side = "baseline" if job == 0 else "candidate"
        sides[job][(key,)] = (int(n), int(total))
        extra.setdefault((key,), {}).update({f"{side}_rank_median_ns": float(med), f"{side}_ranks_with": int(ranks_with)})
    kernels = _entries(sides[0], sides[1], f"kernel {match}, summed over each job's ranks", limit, extra=extra)

    rows = []  # per job {rank: RankRow}: figures and steps (step_choice.py), a fixed number of statements per job
    for j, u in zip(jobs, units):
        rows.append({r.rank: r for r in rank_rows(j, u, None, None)[0]})
    totals = []
    for figure, field in JOB_TOTALS:
        # a rank whose figure is unknown makes the sum unknown: never counted as 0 ns
        without = [sorted(r for r, x in rows[i].items() if getattr(x, field) is None) for i in (0, 1)]
        b, c = (None if without[i] else sum(getattr(x, field) for x in rows[i].values()) for i in (0, 1))
        d = c - b if b is not None and c is not None else None
        totals.append(TotalDelta(figure=figure, baseline_ns=b, candidate_ns=c, delta_ns=d,
                                 change_pct=pct(d, b) if d is not None else None,
                                 baseline_ranks_without=without[0] or None, candidate_ranks_without=without[1] or None))
    b, c = (sum(v[i] for v in per_rank.values()) for i in (0, 1))
    totals.append(TotalDelta(figure="summed_kernel_time_ns", baseline_ns=b, candidate_ns=c, delta_ns=c - b,
                             change_pct=pct(c - b, b)))

    changes: list[RankChange] = []
    counts = dict.fromkeys(RANK_STATUSES, 0)
    for rank in sorted(set(rows[0]) | set(rows[1])):
        rb, rc = rows[0].get(rank), rows[1].get(rank)
        bc, cc = (rb.compute_ns if rb else None), (rc.compute_ns if rc else None)
        if rb is None or rc is None:
            status = "only in candidate" if rb is None else "only in baseline"
        elif bc is None or cc is None:
            status = "no compute figure"
        else:
            st = _status(bc, cc, True, True)
            status = {"regressed": "slower", "improved": "faster"}.get(st, st)
        counts[status] += 1
        if status == "unchanged":
            continue
        bt, ct, key, kd = per_rank.get(rank, (0, 0, None, None))
        bs, cs = (rb.mean_step_ns if rb else None), (rc.mean_step_ns if rc else None)
        delta = cc - bc if bc is not None and cc is not None else None
        changes.append(RankChange(
            rank=rank, status=status, baseline_compute_ns=bc, candidate_compute_ns=cc, compute_delta_ns=delta,
            compute_change_pct=pct(delta, bc) if delta is not None else None, baseline_step_ns=bs, candidate_step_ns=cs,
            step_change_pct=pct(cs - bs, bs) if bs is not None and cs is not None else None,
            baseline_kernel_ns=bt, candidate_kernel_ns=ct, top_kernel=clip_name(key) if key is not None else None,
            top_kernel_delta_ns=kd))
    changes.sort(key=lambda x: (x.compute_delta_ns is None, -abs(x.compute_delta_ns or 0), x.rank))
    side_b, side_c = (_side(j, list(rows[i].values())) for i, j in enumerate(jobs))
    mb, mc = side_b.median_rank_step_ns, side_c.median_rank_step_ns
    job = JobComparison(
        baseline=side_b, candidate=side_c, ranks_matched=len(set(rows[0]) & set(rows[1])),
        median_rank_step_change_pct=pct(mc - mb, mb) if mb is not None and mc is not None else None,
        counts=counts, ranks=changes[:limit], truncated=len(changes) > limit)
    if len(rows[0]) != len(rows[1]):
        notes.append(f"the jobs have {len(rows[0])} and {len(rows[1])} ranks: ranks are matched by number, and sums over "
                     "ranks cover different rank counts")
    notes.append("jobs: totals are sums over ranks of each rank's own figures (rank_summary: interval unions per rank and "
                 "GPU), not unions across ranks; kernels are summed over each job's ranks, with the median over its ranks; "
                 "ranks are slower/faster by their compute time. PyTorch ops are compared for single profiles only.")
    if kernels.truncated:
        notes.append(f"kernels: {kernels.remainder_entries} more changed entries (Σ delta {kernels.remainder_delta_ns} ns) "
                     f"beyond limit={limit}; pass a larger limit to see them.")
    if job.truncated:
        notes.append(f"ranks: {len(changes) - limit} more changed ranks beyond limit={limit}; pass a larger limit to see them.")
    notes.append(f"'unchanged' = |delta| < max({UNCHANGED_MIN_NS} ns, {UNCHANGED_FRACTION:.0%} of baseline); "
                 "positive delta: takes longer on candidate.")
    return CompareResult(
        baseline=_job_label(base), candidate=_job_label(cand), devices=[None, None], totals=totals,
        platform=PlatformRatio(baseline_device=_job_devices(base), candidate_device=_job_devices(cand),
                               cross_platform=False, memory_bandwidth_ratio=None, matrix_ratios={},
                               tolerance="not applied to jobs", note="jobs: no expected cross-platform ratios"),
        kernels=kernels, ops=None, job=job, notes=notes,
        data_issues=[f"{side}: {t.path.name}: {note}" for side, j in (("baseline", base), ("candidate", cand))
                     for t in j for note in data_issue_notes(t, ("kernels", "memops", "api_calls", "markers"))])


def _job_devices(traces: list[Trace]) -> str | None:
    """Device models of a job, from every store in one statement."""
    names = sorted({n for (n,) in run(traces, f"SELECT DISTINCT name FROM ({stack(traces, 'devices', 'name')}) "
                                              "WHERE name IS NOT NULL")})
    return ", ".join(names) or None
