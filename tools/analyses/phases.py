"""phases: split a capture into phases (init, steady state, teardown, idle stretches, ...) by the mix
of GPU work over time.

Method (one device; kernels, memory copies and memsets all count as GPU activity):
  1. The GPU-activity span [first op start, last op end] (clipped to the window) is cut into bins of
     width max(100 ns, ceil(span / 400)) — about 400 bins whatever the capture length, so a 50 µs
     profile segments as well as a 50 s one (PerfAdvisor floors bins at 50 ms and so splits short
     captures into meaningless pieces).
  2. Each bin gets a feature vector: the share of the bin covered by each of the top 8 kernel base
     names, by all other kernels, by each copy direction / memset, and the idle share (1 - union).
     Shares are exact interval overlaps (an op spanning several bins counts in each only for its part).
  3. An optimal segmentation into k contiguous segments minimises the within-segment sum of squared
     deviations from the segment mean (dynamic programming, every k from 1 to max_phases). The phase
     count is the k minimising cost(k) + penalty·k, the smallest such k on ties: penalty =
     2·ν·ln(bins), ν = 5·(median squared difference of adjacent 5-bin block means)/2, the wander of
     the mean of the shortest allowed phase (5 bins) in stationary work — a split must remove more
     variance than that noise would. This picks the first knee that pays for itself (PerfAdvisor
     takes the largest k whose gain passes 5 %). Phases are at least 5 bins long; adjacent idle
     phases (busy < 10 %) are merged after snapping.
  4. Each boundary is snapped to a real event within two bins of the cut: the first GPU op of an
     iteration when present — the steps are those the `iterations` tool chooses (ProfilerStep#N, else
     the best repeating NVTX/rocTX/annotation range group), and a step's first GPU op is the earliest op
     on the device launched by an API call inside the step on its thread (the iterations projection);
     else the longest idle gap nearby — the next phase starts at the op ending that gap (or, when the
     next phase is idle, at the end of the op starting it); else the nearest op start or end; else it
     stays on the bin edge (start_source says which).
  5. Per phase, every figure is clipped to the phase: an op straddling a boundary contributes only its
     part inside to busy time (interval union) and to per-kernel time; counts are ops starting inside.
Every step over the ops runs in DuckDB (gaps as stacked.py's window functions) or in numpy over chunks of the ops
in time order (unions, the device's merged intervals: intervals.py): Python receives per-name totals, per-(feature,
bin) times, the snapping candidates of each cut and per-phase figures, never all the ops at once, so memory does not
grow with the profile.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, clip_name, data_issue_notes, data_issues_field, gpu_activity_sql, pct, resolve_selection, skipped_note, ToolResult
from .intervals import merge_chunks, time_chunks, unions, unions_on
from .iterations import chosen_step_tables
from .stacked import gaps_sql
from .requirements import require

TARGET_BINS = 400
MIN_BIN_NS = 100
TOP_NAMES = 8
IDLE_BUSY_PCT = 10.0       # a phase busier than this is not 'idle'
SIMILAR_JS = 0.10          # Jensen–Shannon (base 2) below which two phases have the same mix
PENALTY_FACTOR = 2.0
MIN_SEG_BINS = 5          # shortest phase the segmentation may form, in bins
SNAP_BINS = 2             # snapping reach, in bins
MAX_PHASES_CAP = 20


class PhaseKernel(BaseModel):
    name: str = Field(description="kernel base name (short_name)")
    count: int = Field(description="executions starting inside the phase")
    time_in_phase_ns: int = Field(description="summed duration clipped to the phase (work: concurrent kernels add up), ns")
    pct_of_phase_kernel_time: float | None = Field(description="time_in_phase_ns / kernel_time_ns of the phase, %")


class Activity(BaseModel):
    name: str = Field(description="kernel base name, 'memcpy <kind>', 'memset', or 'idle'")
    time_ns: int = Field(description="time of this activity clipped to the phase (summed over ops; for 'idle': idle_ns), ns")
    pct_of_phase_duration: float | None = Field(description="time_ns / phase duration_ns, %; time_ns sums instances, so "
                                                            "concurrent ones can take it above 100")


class Phase(BaseModel):
    index: int = Field(description="0-based position in time")
    label: str = Field(description="'idle', 'init', 'steady', 'teardown', 'memcpy-heavy' or 'active' (see label_reason)")
    label_reason: str = Field(description="why the label was given, in figures")
    start_ns: int = Field(description="phase start, ns on the profile timeline")
    end_ns: int = Field(description="phase end (exclusive), ns")
    duration_ns: int = Field(description="end_ns - start_ns, ns")
    pct_of_gpu_span: float | None = Field(description="duration_ns / gpu_span_ns, %")
    start_source: str = Field(description="what the start was placed on: first GPU op, iteration marker, op after an idle gap, ...")
    busy_ns: int = Field(description="union of GPU activity (kernels, copies, sets) clipped to the phase, ns (wall time)")
    idle_ns: int = Field(description="duration_ns - busy_ns, ns")
    busy_pct_of_phase: float | None = Field(description="busy_ns / duration_ns, %")
    kernel_count: int = Field(description="kernels starting inside the phase")
    copy_count: int = Field(description="memory copies starting inside the phase")
    set_count: int = Field(description="memsets starting inside the phase")
    kernel_time_ns: int = Field(description="summed kernel duration clipped to the phase (work; > busy_ns with concurrency), ns")
    copy_time_ns: int = Field(description="summed copy duration clipped to the phase, ns")
    set_time_ns: int = Field(description="summed memset duration clipped to the phase, ns")
    iterations: int | None = Field(None, description="iterations (see iteration_markers) whose first GPU op starts inside the phase")
    dominant: Activity = Field(description="the activity with the most time in the phase ('idle' when idle_ns exceeds every activity)")
    top_kernels: list[PhaseKernel] = Field(description="kernels by time clipped to the phase, at most `limit`")
    more_kernel_names: int = Field(description="kernel names in the phase beyond `limit`")


class IterationMarkers(BaseModel):
    name: str = Field(description="the step marker the `iterations` tool chooses, numbers as <N>, e.g. 'ProfilerStep#<N>'")
    count: int = Field(description="its steps overlapping the GPU span")
    with_gpu_work: int = Field(description="of them, those with a GPU op on the device launched inside the step on its thread "
                                           "(the iterations projection); the earliest such op is the iteration's first GPU op")


class PhasesResult(ToolResult):
    trace: str
    window: Window
    device_id: int = Field(description="the GPU analysed")
    device_name: str | None
    device_note: str | None = Field(None, description="how the device was chosen when none was given")
    activity: str = Field(description="what counts as GPU activity")
    gpu_first_ns: int = Field(description="start of the first GPU op in the window (clipped), ns: start of phase 0")
    gpu_last_ns: int = Field(description="end of the last GPU op in the window (clipped), ns: end of the last phase")
    gpu_span_ns: int = Field(description="gpu_last_ns - gpu_first_ns, ns: what the phases cover")
    idle_before_first_op_ns: int = Field(description="window start to gpu_first_ns, ns (not in any phase)")
    idle_after_last_op_ns: int = Field(description="gpu_last_ns to window end, ns (not in any phase)")
    busy_ns: int = Field(description="union of GPU activity over the span, ns (= sum of the phases' busy_ns)")
    bin_width_ns: int = Field(description="bin width used for the segmentation, ns")
    bins: int = Field(description="number of bins over the GPU span")
    features: list[str] = Field(description="per-bin feature names (shares of bin time)")
    cost_by_phase_count: list[float] = Field(description="optimal within-segment cost for k = 1, 2, ... phases")
    penalty_per_phase: float = Field(description="cost a further phase must save to be kept")
    max_phases: int
    iteration_markers: IterationMarkers | None = Field(None, description="iteration markers used to place boundaries, when found")
    method: str = Field(description="how the phases were found")
    phases: list[Phase]
    truncated: bool = Field(description="true when some phase has more kernel names than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def phases(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    max_phases: int = 6,
    limit: int = 5,
) -> PhasesResult:
    require(trace, "phases")
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    if int(max_phases) < 1:
        raise ProfileError(f"max_phases must be at least 1 (got {max_phases}); 1 gives one phase covering the whole GPU span.")
    max_phases = min(int(max_phases), MAX_PHASES_CAP)
    limit = max(1, min(int(limit), 50))
    where, params = sel.where(time_mode="overlap")
    acts = (f"SELECT device_id, stream_id, greatest(start_ns, {window.start_ns}) AS start_ns, "
            f"least(end_ns, {window.end_ns}) AS end_ns, kind, name, pid, tid FROM ({gpu_activity_sql(True, where)})")
    acts_params = params * 2
    found = unions(trace, acts, acts_params, ("device_id",))
    if not found:
        raise ProfileError("no GPU activity (kernels, copies or sets) in the selection, so there are no phases to find. "
                           "trace_info shows what the profile holds and its capture span." + skipped_note(trace, ("kernels", "memops")))
    note = None
    if device is None:
        dev = max(found, key=lambda k: (found[k].busy_ns, -k[0]))[0]
        if len(found) > 1:
            others = sorted(k[0] for k in found if k[0] != dev)
            note = f"device {dev} chosen: the busiest of {len(found)} devices with GPU activity; pass device= for {others}"
    else:
        dev = device
    u = found[(dev,)]
    t0, t1 = u.first_ns, u.last_ns
    span = t1 - t0
    dev_acts = f"SELECT * FROM ({acts}) WHERE device_id = ? AND end_ns >= start_ns"
    dev_params = acts_params + [dev]

    width = max(MIN_BIN_NS, -(-span // TARGET_BINS))
    nbins = max(1, -(-span // width))
    edges = np.minimum(t0 + width * np.arange(nbins + 1, dtype=np.int64), t1)

    feat_names, top, others, memop_names = _feature_groups(trace, dev_acts, dev_params)
    lens = np.diff(edges).astype(np.float64)
    cover, busy_bins = _bin_coverage(trace, dev_acts, dev_params, t0, width, nbins, top, others, memop_names, len(feat_names))
    feats = np.zeros((nbins, len(feat_names) + 1))
    feats[:, :-1] = cover.T / lens[:, None]
    feats[:, -1] = 1.0 - busy_bins / lens
    feat_names = feat_names + ["idle"]

    costs, cuts_by_k = _segment(feats, max_phases)
    penalty = _penalty(feats, costs[0])
    score = [c + penalty * (i + 1) for i, c in enumerate(costs)]
    k = int(np.argmin(np.round(score, 9))) + 1  # ties → smallest k
    cuts = cuts_by_k[k - 1]

    iters = _iterations(trace, dev, t0, t1)
    iter_starts = iters[1] if iters else np.zeros(0, dtype=np.int64)
    bounds, sources = [t0], ["first GPU op"]
    seg_idle = [float(feats[a:b, -1].mean()) for a, b in zip([0] + cuts, cuts + [nbins])]
    near = _near_events(trace, dev_acts, dev_params, [int(edges[c]) for c in cuts], width)
    for i, c in enumerate(cuts):
        t = int(edges[c])
        right_idle = seg_idle[i + 1] > 1 - IDLE_BUSY_PCT / 100
        x, why = _snap(t, width, iter_starts, near[i], right_idle, iters[0] if iters else None)
        if x <= bounds[-1] or x >= t1:
            continue  # snapping merged it into a neighbour
        bounds.append(x)
        sources.append(why)
    bounds.append(t1)
    # Adjacent idle phases are one idle stretch, whatever lone ops sit in it.
    busy_all = _busy_between(trace, dev_acts, dev_params, bounds)
    lazy = busy_all * 100 < IDLE_BUSY_PCT * np.diff(np.asarray(bounds, dtype=np.int64))
    keep = [0] + [i for i in range(1, len(bounds) - 1) if not (lazy[i - 1] and lazy[i])] + [len(bounds) - 1]
    bounds, sources = [bounds[i] for i in keep], [sources[i] for i in keep[:-1]]
    cum = np.concatenate(([0], np.cumsum(busy_all)))  # the busy time of the merged phases: their parts' sum
    busy = np.diff(cum[keep])

    figures = _phase_figures(trace, dev_acts, dev_params, bounds)
    mixes = []
    for i in range(len(bounds) - 1):
        a, b = np.searchsorted(edges, bounds[i], "right") - 1, np.searchsorted(edges, bounds[i + 1], "left")
        mixes.append(feats[max(a, 0):max(b, a + 1)].mean(axis=0))

    out, truncated = [], False
    for i in range(len(bounds) - 1):
        s, e = bounds[i], bounds[i + 1]
        f = figures.get(i, {})
        kern = f.get("kernels", [])
        truncated |= len(kern) > limit
        dur = e - s
        b = int(busy[i])
        ktime = sum(x[2] for x in kern)
        acts_i = f.get("activities", [])
        idle = dur - b
        dom = max([(t, n) for n, t in acts_i] + [(idle, "idle")], key=lambda x: (x[0], x[1] != "idle", x[1]))
        n_iter = int(((iter_starts >= s) & ((iter_starts < e) | ((i == len(bounds) - 2) & (iter_starts <= e)))).sum()) if iters else None
        out.append(Phase(
            index=i, label="", label_reason="", start_ns=s, end_ns=e, duration_ns=dur, pct_of_gpu_span=pct(dur, span),
            start_source=sources[i], busy_ns=b, idle_ns=idle, busy_pct_of_phase=pct(b, dur),
            kernel_count=f.get("n_kernel", 0), copy_count=f.get("n_copy", 0), set_count=f.get("n_set", 0),
            kernel_time_ns=ktime, copy_time_ns=f.get("t_copy", 0), set_time_ns=f.get("t_set", 0), iterations=n_iter,
            dominant=Activity(name=clip_name(dom[1]), time_ns=int(dom[0]), pct_of_phase_duration=pct(dom[0], dur)),
            top_kernels=[PhaseKernel(name=clip_name(n), count=c, time_in_phase_ns=t, pct_of_phase_kernel_time=pct(t, ktime))
                         for n, c, t in kern[:limit]],
            more_kernel_names=max(0, len(kern) - limit),
        ))
    _label(out, mixes, k_forced=(max_phases == 1))
    iter_info = IterationMarkers(name=iters[0], count=iters[2], with_gpu_work=len(iters[1])) if iters else None
    names_dev = dict(trace.sql("SELECT device_id, name FROM devices"))
    return PhasesResult(
        data_issues=data_issue_notes(trace, ("kernels", "memops", "markers", "api_calls")),
        trace=str(trace.path), window=window, device_id=dev, device_name=names_dev.get(dev), device_note=note,
        activity="kernels, memory copies and memsets",
        gpu_first_ns=t0, gpu_last_ns=t1, gpu_span_ns=span,
        idle_before_first_op_ns=t0 - window.start_ns, idle_after_last_op_ns=window.end_ns - t1,
        busy_ns=u.busy_ns, bin_width_ns=int(width), bins=int(nbins), features=[clip_name(n) for n in feat_names],
        cost_by_phase_count=[round(c, 6) for c in costs], penalty_per_phase=round(penalty, 6), max_phases=max_phases,
        iteration_markers=iter_info,
        method=(f"{nbins} bins of {width} ns over the GPU span; per-bin time shares of {len(feat_names)} activities; "
                f"optimal segmentation (least squares, dynamic programming) for k = 1..{len(costs)}; chose k = {k} "
                f"minimising cost + {round(penalty, 4)}·k; boundaries snapped to real events within two bins"
                + (f"; {len(out)} phases after snapping" if len(out) != k else "")),
        phases=out, truncated=truncated,
        hint=(f"some phases have more kernel names than limit={limit}; raise limit (max 50), or run top_kernels with "
              "start_ns/end_ns of a phase" if truncated else None),
    )


# ---------------------------------------------------------------------------------------------------


def _feature_groups(trace: Trace, dev_acts: str, params: list) -> tuple[list[str], list[str], bool, list[str]]:
    """Feature names: the top kernel base names by time, 'other kernels' when there are more, each memop name; and
    (top names, whether 'other kernels' is a feature, memop names). One row per name leaves DuckDB."""
    rows = trace.sql(f"SELECT kind = 'kernel', name, sum(end_ns - start_ns)::BIGINT FROM ({dev_acts}) "
                     "WHERE end_ns > start_ns GROUP BY ALL", params)
    kern = sorted(((-int(t), n) for k, n, t in rows if k))
    top = [n for _, n in kern[:TOP_NAMES]]
    others = len(kern) > TOP_NAMES
    memop_names = sorted({n for k, n, _ in rows if not k})
    return top + (["other kernels"] if others else []) + memop_names, top, others, memop_names


def _bin_coverage(trace: Trace, dev_acts: str, params: list, t0: int, width: int, nbins: int, top: list[str],
                  others: bool, memop_names: list[str], nfeat: int) -> tuple[np.ndarray, np.ndarray]:
    """Per feature and bin, the summed time of its ops inside the bin (ns, overlaps counted per op); and per bin the
    busy time (the union of every op) inside it. An op adds its clipped part to its first and last bin and a whole
    bin to each bin between, as a +1/-1 pair around them (summed over bins afterwards). One pass over the device's
    ops in time order (DuckDB sorts three integers per op: feature id, start, end): numpy adds each non-empty op to
    its feature and each merged interval (intervals.merge_chunks) to the busy row, chunk by chunk."""
    other = len(top) if others else -1
    first = len(top) + (1 if others else 0)
    fid = (f"CASE WHEN kind = 'kernel' THEN coalesce(list_position(?::VARCHAR[], name) - 1, {other}) "
           f"ELSE {first} + list_position(?::VARCHAR[], name) - 1 END")
    # Empty ops are dropped in numpy (their names may have no feature: NULL read as 0), not by a WHERE in the sort.
    sql = f"SELECT {fid} AS fid, start_ns, end_ns FROM ({dev_acts}) ORDER BY start_ns, end_ns"
    t = np.zeros((nfeat + 1, nbins), dtype=np.int64)  # row -1 (the last): busy
    d = np.zeros((nfeat + 1, nbins), dtype=np.int64)
    tf, df = t.reshape(-1), d.reshape(-1)  # views: feature f, bin b at f * nbins + b

    def add(row: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        b0, b1 = (s - t0) // width, (e - 1 - t0) // width
        one = b0 == b1
        np.add.at(tf, row + b0, np.where(one, e - s, t0 + (b0 + 1) * width - s))
        np.add.at(tf, (row + b1)[~one], e[~one] - (t0 + b1[~one] * width))
        np.add.at(df, (row + b0)[~one] + 1, 1)
        np.add.at(df, (row + b1)[~one], -1)

    def ops(cur):
        for ch in time_chunks(cur, sql, [top, memop_names] + params, {"fid": 0, "start_ns": 0, "end_ns": 0}):
            keep = ch["end_ns"] > ch["start_ns"]
            s, e = ch["start_ns"][keep], ch["end_ns"][keep]
            add(ch["fid"][keep] * nbins, s, e)
            yield np.zeros(s.size, dtype=np.int64), s, e

    cur = trace.con.cursor()
    try:
        for _, s, e in merge_chunks(ops(cur)):  # busy: the device's merged intervals, each added the same way
            add(np.full(s.size, nfeat * nbins, dtype=np.int64), s, e)
    finally:
        cur.close()
    cov = t + width * np.cumsum(d, axis=1)
    return cov[:-1].astype(np.float64), cov[-1].astype(np.float64)


def _segment(f: np.ndarray, kmax: int) -> tuple[list[float], list[list[int]]]:
    """Optimal least-squares segmentation of the rows of f into 1..kmax contiguous segments."""
    n = f.shape[0]
    kmax = max(1, min(kmax, n))
    s1 = np.vstack((np.zeros(f.shape[1]), np.cumsum(f, axis=0)))
    s2 = np.concatenate(([0.0], np.cumsum((f ** 2).sum(axis=1))))
    nrm = (s1 ** 2).sum(axis=1)
    cnt = np.arange(n + 1, dtype=np.float64)
    length = cnt[None, :] - cnt[:, None]                       # [a, b] → b - a
    cross = nrm[None, :] + nrm[:, None] - 2.0 * (s1 @ s1.T)    # |S1[b] - S1[a]|²
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = (s2[None, :] - s2[:, None]) - cross / length
    minlen = max(1, min(MIN_SEG_BINS, n // 4))
    cost[length < minlen] = np.inf
    cost = np.maximum(cost, 0.0)
    best = [cost[0].copy()]
    back = [np.zeros(n + 1, dtype=np.int64)]
    for _ in range(1, kmax):
        tot = best[-1][:, None] + cost
        arg = np.argmin(tot, axis=0)
        best.append(tot[arg, np.arange(n + 1)])
        back.append(arg)
    costs, cuts = [], []
    for k in range(kmax):
        c = float(best[k][n])
        if not math.isfinite(c):
            break
        costs.append(c)
        b, cs = n, []
        for kk in range(k, 0, -1):
            b = int(back[kk][b])
            cs.append(b)
        cuts.append(sorted(cs))
    return costs, cuts


def _penalty(f: np.ndarray, total: float) -> float:
    """Cost a further segment must save. The noise that a spurious split feeds on is the wander of
    segment means, which for autocorrelated bins (an op or an iteration spans many bins) is far above
    the per-bin variance: it is measured on block means (blocks of B bins, B·var(block mean) ≈ σ²·τ),
    by the median squared difference of adjacent blocks, so that real phase changes barely count."""
    n = f.shape[0]
    blk = max(1, min(MIN_SEG_BINS, n // 4))
    nb = n // blk
    if nb < 3:
        return max(total, 1e-9)  # too few bins to tell noise from phases: one phase
    m = f[: nb * blk].reshape(nb, blk, -1).mean(axis=1)
    noise = blk * float(np.median((np.diff(m, axis=0) ** 2).sum(axis=1))) / 2
    return max(PENALTY_FACTOR * noise * math.log(n), 1e-9 * n, 0.01 * total)


def _near_events(trace: Trace, dev_acts: str, params: list, cuts: list[int], width: int) -> list[tuple]:
    """Per cut at t (bin edges), what _snap may place it on within SNAP_BINS bins: (gap start, gap end) of the longest
    idle gap of the device's union overlapping [t - reach, t + reach] (ties: midpoint nearest t, then earliest), and
    the op start or end nearest t in that range (ties: the earlier); None where there is none. One statement."""
    if not cuts:
        return []
    reach = SNAP_BINS * width
    cut_rows = "SELECT unnest(?::BIGINT[]) AS c, unnest(?::BIGINT[]) AS t"
    mid = "((gap_start_ns + gap_end_ns) - (((gap_start_ns + gap_end_ns) % 2) + 2) % 2) // 2"  # floor of the midpoint
    rows = trace.sql(f"""
        WITH cuts AS ({cut_rows}),
        g AS (SELECT c, gap_start_ns, gap_end_ns FROM ({gaps_sql(f"SELECT 0 AS z, start_ns, end_ns FROM ({dev_acts})", "z")}) g
              JOIN cuts ON gap_start_ns < t + {reach} AND gap_end_ns > t - {reach}
              QUALIFY row_number() OVER (PARTITION BY c ORDER BY gap_end_ns - gap_start_ns DESC, abs({mid} - t), gap_start_ns) = 1),
        x AS (SELECT c, x FROM (SELECT start_ns AS x FROM ({dev_acts}) WHERE end_ns > start_ns
                                UNION ALL SELECT end_ns FROM ({dev_acts}) WHERE end_ns > start_ns) e
              JOIN cuts ON x BETWEEN t - {reach} AND t + {reach}
              QUALIFY row_number() OVER (PARTITION BY c ORDER BY abs(x - t), x) = 1)
        SELECT cuts.c, g.gap_start_ns, g.gap_end_ns, x.x FROM cuts LEFT JOIN g USING (c) LEFT JOIN x USING (c)""",
        [list(range(len(cuts))), cuts] + params + params + params)
    found = {int(c): (None if gs is None else (int(gs), int(ge)), None if x is None else int(x)) for c, gs, ge, x in rows}
    return [found.get(i, (None, None)) for i in range(len(cuts))]


def _busy_between(trace: Trace, dev_acts: str, params: list, bounds: list[int]) -> np.ndarray:
    """The busy time (union of the device's ops) inside each [bounds[i], bounds[i+1]), ns: one union per phase of the
    ops clipped to it (an op straddling a boundary counts in each phase for its part)."""
    n = len(bounds) - 1
    clipped = f"""SELECT p.i, greatest(a.start_ns, p.s) AS start_ns, least(a.end_ns, p.e) AS end_ns
                  FROM ({dev_acts}) a JOIN (SELECT unnest(?::BIGINT[]) AS s, unnest(?::BIGINT[]) AS e,
                                                   unnest(?::INTEGER[]) AS i) p ON a.start_ns < p.e AND a.end_ns > p.s"""
    cur = trace.con.cursor()
    try:  # not memoized: the phase bounds are list parameters
        found = unions_on(cur, clipped, params + [bounds[:-1], bounds[1:], list(range(n))], ("i",))
    finally:
        cur.close()
    out = np.zeros(n, dtype=np.int64)
    for (i,), u in found.items():
        out[int(i)] = u.busy_ns
    return out


def _snap(t: int, width: int, iters: np.ndarray, near: tuple, right_idle: bool, family: str | None) -> tuple[int, str]:
    """Place a cut at bin edge t on a real event within SNAP_BINS bins: an iteration's first GPU op,
    else the longest idle gap (its end, or its start when the next phase is idle), else an op start/end
    (`near`: _near_events' candidates for t)."""
    lo, hi = t - SNAP_BINS * width, t + SNAP_BINS * width
    close = iters[(iters >= lo) & (iters <= hi)]
    if close.size:
        x = int(close[np.argmin(np.abs(close - t))])
        return x, f"first GPU op of an iteration ({family} marker)"
    gap, edge = near
    if gap is not None:
        g_s, g_e = gap
        if right_idle:
            return g_s, f"end of the last op before a {g_e - g_s} ns idle gap"
        return g_e, f"first op after a {g_e - g_s} ns idle gap"
    if edge is not None:
        return edge, f"nearest op start/end (no idle gap within {SNAP_BINS} bins)"
    return t, f"bin edge (no op starts or ends within {SNAP_BINS} bins)"


def _iterations(trace: Trace, dev: int, t0: int, t1: int) -> tuple[str, np.ndarray, int] | None:
    """(pattern, GPU start of each iteration on device `dev` (sorted, distinct), number of steps) for the steps the
    `iterations` tool chooses (its rule: ProfilerStep#N, else the best repeating range group), or None when it finds none.
    Steps overlapping [t0, t1] count; a step's first GPU op is the earliest op on `dev` projected into it
    (launched by an API call inside the step on the step's thread, as `iterations` projects GPU work).
    None as well when no step has such an op: those steps cannot place a boundary."""
    try:
        with chosen_step_tables(trace) as (cur, choice, chosen):
            chosen = chosen[(chosen["end_ns"] > t0) & (chosen["start_ns"] < t1)]
            steps = len(chosen[["pid", "tid", "start_ns", "end_ns"]].drop_duplicates())
            if not steps:
                return None
            # the step choice's ranges and linked ops are temp tables, the step lookup a subquery: no CTE, so the
            # containment join is an IEJoin
            cur.register("phase_steps", chosen[["rid"]])
            try:
                gpu = np.asarray(cur.execute(
                    """SELECT DISTINCT first_ns FROM (
                           SELECT st.pid, st.tid, st.start_ns, min(g.start_ns) AS first_ns FROM (
                               SELECT DISTINCT r.pid, r.tid, r.start_ns, r.ks, r.ke FROM _step_rng r SEMI JOIN phase_steps s USING (rid)
                               WHERE NOT r.cross_thread) st
                           JOIN _step_gop g ON st.ks <= g.ks AND g.ke <= st.ke
                           WHERE g.device_id = ? AND g.end_ns > g.start_ns GROUP BY ALL)
                       WHERE first_ns BETWEEN ? AND ? ORDER BY 1""", [dev, t0, t1]).fetchnumpy()["first_ns"], dtype=np.int64)
            finally:
                cur.unregister("phase_steps")
    except ProfileError:
        return None
    if not gpu.size:  # steps that launched nothing on this device (a fallback choice of `iterations`) place no boundary
        return None
    return choice.pattern, gpu, steps


def _phase_figures(trace: Trace, dev_acts: str, params: list, bounds: list[int]) -> dict[int, dict]:
    """Per phase: kernels by name (count starting inside, clipped time), counts and clipped times per kind."""
    last = len(bounds) - 2
    rows = trace.sql(
        f"""WITH p AS (SELECT unnest(?::BIGINT[]) AS s, unnest(?::BIGINT[]) AS e, unnest(?::INTEGER[]) AS i),
                 a AS ({dev_acts}),
                 j AS (SELECT p.i, a.kind, a.name,
                              greatest(least(a.end_ns, p.e) - greatest(a.start_ns, p.s), 0) AS t,
                              (a.start_ns >= p.s AND (a.start_ns < p.e OR (p.i = {last} AND a.start_ns <= p.e))) AS starts
                       FROM a JOIN p ON a.start_ns <= p.e AND a.end_ns >= p.s)
            SELECT i, kind, name, count(*) FILTER (WHERE starts) AS n, sum(t)::BIGINT AS t
            FROM j GROUP BY i, kind, name""",
        [bounds[:-1], bounds[1:], list(range(len(bounds) - 1))] + params,
    )
    out: dict[int, dict] = {}
    for i, kind, name, n, t in rows:
        d = out.setdefault(i, {"kernels": [], "activities": {}, "n_kernel": 0, "n_copy": 0, "n_set": 0, "t_copy": 0, "t_set": 0})
        n, t = int(n), int(t)
        d["n_" + kind] += n
        if kind == "kernel":
            if n or t:
                d["kernels"].append((name, n, t))
        else:
            d["t_" + kind] += t
        if t:
            d["activities"][name] = d["activities"].get(name, 0) + t
    for d in out.values():
        d["kernels"].sort(key=lambda x: (-x[2], -x[1], x[0]))
        d["activities"] = sorted(d["activities"].items())
    return out


def _js(p: np.ndarray, q: np.ndarray) -> float:
    p, q = p / p.sum() if p.sum() else p, q / q.sum() if q.sum() else q
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * np.log2(p / m), 0.0).sum()
        b = np.where(q > 0, q * np.log2(q / m), 0.0).sum()
    return float(max(0.0, (a + b) / 2))


def _label(ps: list[Phase], mixes: list[np.ndarray], k_forced: bool) -> None:
    idle = [p.busy_pct_of_phase is None or p.busy_pct_of_phase < IDLE_BUSY_PCT for p in ps]
    active = [i for i in range(len(ps)) if not idle[i]]
    main = max(active, key=lambda i: (ps[i].duration_ns, -i)) if active else None
    for i, p in enumerate(ps):
        copy_heavy = p.copy_time_ns + p.set_time_ns > p.kernel_time_ns
        what = f"dominant: {p.dominant.name} ({p.dominant.pct_of_phase_duration} % of the phase)"
        if idle[i]:
            p.label, p.label_reason = "idle", f"GPU busy {p.busy_pct_of_phase} % of the phase (< {IDLE_BUSY_PCT:g} %)"
            continue
        if len(ps) == 1:
            why = "max_phases=1" if k_forced else "no change in the mix of GPU work paid for a split"
            p.label = "memcpy-heavy" if copy_heavy else "steady"
            p.label_reason = f"one phase covers the GPU span ({why}); {what}"
            continue
        js = _js(mixes[i], mixes[main])
        like_main = i == main or js < SIMILAR_JS
        if like_main:
            p.label = "steady"
            p.label_reason = ("longest non-idle phase" if i == main
                              else f"same mix as the longest non-idle phase (Jensen–Shannon {js:.3f} < {SIMILAR_JS})") + f"; {what}"
        elif i == 0:
            p.label, p.label_reason = "init", f"first phase, unlike the longest non-idle phase (Jensen–Shannon {js:.3f}); {what}"
        elif i == len(ps) - 1:
            p.label, p.label_reason = "teardown", f"last phase, unlike the longest non-idle phase (Jensen–Shannon {js:.3f}); {what}"
        elif copy_heavy:
            p.label, p.label_reason = "memcpy-heavy", f"copy + memset time {p.copy_time_ns + p.set_time_ns} ns > kernel time {p.kernel_time_ns} ns; {what}"
        else:
            p.label, p.label_reason = "active", f"a middle phase whose mix differs from the longest non-idle phase (Jensen–Shannon {js:.3f}); {what}"
