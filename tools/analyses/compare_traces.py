"""compare_traces: two profiles side by side (before/after, or the same workload on two platforms).

Totals (gpu_timeline / trace_info) with deltas; kernels matched by name and PyTorch ops matched by
name + input shapes (ops_summary group_by='shapes'), classified new / removed / regressed / improved
and ranked by |delta|. Cross-platform pairs (different device models) get the time ratio expected
from the hardware peaks (memory-bound: bandwidth ratio; compute-bound: matrix peak for the dtype,
bounds from roofline on the baseline) and entries far from it are flagged. Wording is neutral:
'takes N % longer on candidate', never 'X is better'.
"""

from __future__ import annotations

from functools import partial

from typing import Literal

from pydantic import BaseModel, Field

from ..hardware.peaks import peaks_for_device
from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import ALL_TABLES, capture_window, clip_name, data_issue_notes, data_issues_field, pct, ToolResult
from .gpu_timeline import gpu_timeline
from .ops_summary import ops_summary
from .requirements import require

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
    baseline_ns: int
    candidate_ns: int
    delta_ns: int = Field(description="candidate - baseline, ns")
    change_pct: float | None = Field(description="delta / baseline, % (positive: takes longer on candidate)")


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


class CompareResult(ToolResult):
    baseline: str
    candidate: str
    devices: list[int | None] = Field(description="[baseline device, candidate device]; null = all devices merged")
    totals: list[TotalDelta]
    platform: PlatformRatio
    kernels: EntryList
    ops: EntryList | None = Field(description="PyTorch ops by name + shapes; null unless both sides have cpu_ops")
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


def _entries(base: dict, cand: dict, matched_by: str, limit: int, ratio_for=None) -> EntryList:
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
                  pct_of_gross_change=pct(ct - bt, gross))
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
    baseline: Trace,
    candidate: Trace,
    *,
    device: int | tuple[int, int] | list[int] | None = None,
    limit: int = 15,
    match: Literal["name", "short_name"] = "short_name",
) -> CompareResult:
    if match not in ("name", "short_name"):
        raise ProfileError("match must be 'name' (full kernel name) or 'short_name' (base name).")
    limit = max(1, min(int(limit), 200))
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
