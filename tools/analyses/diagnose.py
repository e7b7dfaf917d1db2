"""diagnose: a deterministic (rule-based, no LLM) first-pass diagnosis of one GPU of a profile.

Runs the analyses that apply (gpu_timeline, api_summary, memcpy_summary, comm_summary, top_kernels,
roofline; api_summary only when the GPU idles for at least IDLE_MIN_PCT of its span, memcpy_summary and
comm_summary only when copies / communication are exposed on the device: the only cases a rule reads their
figures, so not_applicable names them only then), turns their figures into findings of one
bottleneck class each, merges duplicates and ranks them by time at stake. Each finding names the tool and
field behind every number, its share of the GPU span, Amdahl speedup bounds, a confidence with its reason,
and the next measurement to take.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .api_summary import api_summary
from .comm_patterns import comm_patterns
from .common import (ALL_TABLES, ToolResult, WholeGraphTime, Window, clip_name, data_issue_notes, data_issues, data_issues_field, pct,
                     whole_graph_time)
from .comm_summary import comm_summary
from .gpu_timeline import gpu_timeline
from .intervals import unions
from .memcpy_summary import memcpy_summary
from .roofline import roofline
from .requirements import GPU, gap_text, left_out, present, require
from .top_kernels import top_kernels

BottleneckClass = Literal["compute", "memory", "launch_overhead", "communication", "sync", "idle_host", "copies", "other"]

MIN_SHARE_PCT = 2.0          # findings below this share of the GPU span are dropped
IDLE_MIN_PCT = 5.0           # GPU idle share that opens an idle finding
SYNC_SHARE_OF_IDLE = 0.3     # host blocked in sync calls >= 30 % of the GPU idle time -> sync
TINY_PCT = 50.0              # >= 50 % of single-kernel launches are shorter than their launch call -> launch overhead
HOST_WAIT_PCT = 50.0         # >= 50 % of stream idle is host-wait gaps -> idle_host
FAR_BELOW_ROOF_PCT = 50.0    # a rated op below 50 % of its binding roof is 'far below'
DOMINANT_KERNEL_PCT = 40.0   # one kernel >= 40 % of the device's summed kernel time is 'dominant'
SLOW_LAUNCH_NS = 1_000_000   # a median launch call >= 1 ms is first-call cost (module load, JIT), not per-launch overhead
ABSTAIN_GPU_ROWS_PCT = 1.0   # more GPU rows skipped or repaired than this share of the source's GPU rows -> no findings
LOWER = {"high": "medium", "medium": "low", "low": "low"}

RULES = [
    "Time at stake is ns of GPU time the cause accounts for; share = time at stake / GPU span of the analysed device "
    "(gpu_timeline total_ns: first to last GPU op). Findings under 2 % are dropped; findings are ranked by time at stake.",
    "Speedup bounds (Amdahl, as multipliers of the whole run): halved = 1/(1-0.5F), removed = 1/(1-F), F = share/100. "
    "Upper bounds: they assume the time at stake shrinks and nothing else grows.",
    "GPU idle >= 5 % of the span and host threads blocked in synchronize / event-query spin calls for >= 30 % of the idle "
    "time -> sync.",
    "GPU idle >= 5 % and >= 50 % of single-kernel launches shorter than their launch call (tiny kernels) -> launch_overhead; "
    "when the median launch call itself takes >= 1 ms (normally a few us) the title says the cost is first-call work "
    "(lazy module loading, JIT), not per-launch overhead, and confidence is low.",
    "GPU idle >= 5 % and >= 50 % of stream idle is host-wait gaps (next launch issued after the stream drained) -> idle_host.",
    "GPU idle without host API calls in the profile -> other: sync, launch overhead and host work cannot be told apart.",
    "Exposed communication (gpu_timeline exposed_comm_ns: comm kernels with no computation running) -> communication.",
    "Exposed copies (gpu_timeline exposed_memcpy_ns) -> copies; pageable copies (memcpy_summary) are named in the evidence.",
    "Rated ops (roofline) below 50 % of their binding roof: compute-bound -> compute, memory-bound -> memory; time at stake = "
    "their total headroom (measured - roofline time).",
    "One non-communication kernel >= 40 % of the device's summed kernel time (top_kernels pct_of_device_kernel_time) is 'dominant'. Its launching PyTorch "
    "op (most of its time) is looked up in roofline: far below its roof -> merged into that compute/memory finding; rated "
    "within 50 % of its roof -> a finding of that class with the op's headroom at stake; not rated (no ops, no shapes, "
    "unknown peaks, time window) -> class 'other', saying compute vs memory cannot be judged, with the kernel time at stake.",
    "Duplicates (same class; 'other' kept apart for idle and kernel causes) are merged: evidence joined, time at stake = "
    "the largest of them (never summed).",
    "Shares of different findings are not additive in general: idle, exposed communication and exposed copies are disjoint "
    "parts of the span, but roofline headroom and kernel time are summed op time inside the busy time (a stake above the "
    "span is capped at it, with the uncapped value in the evidence).",
    "Confidence: high = measured directly and the linking data is complete; medium = inferred from a heuristic threshold "
    "or partial data; low = the profile lacks data needed to separate causes.",
    "A profile without GPU activity (kernels, copies, sets) but with host API calls gets host-side findings only "
    "(scope host_only): per thread, the union of its blocking calls (api_summary blocked_threads: synchronize, blocking "
    "copies, query spin loops; share of the capture window) and, per process, API time by call (share of the process's "
    "summed API time). GPU-side classes are not judged; not_judged names the missing tables and the capture flag.",
    "Damaged GPU rows (data_issues of kernels/memops: rows the reader left out or corrected, whose true times are unknown): "
    "any such row lowers every finding's confidence one level (high -> medium -> low); above 1 % of the profile's GPU rows "
    "(kept + skipped, all devices) diagnose abstains: no finding is ranked and the verdict says why.",
]


class Evidence(BaseModel):
    tool: str = Field(description="analysis that gives the number")
    field: str = Field(description="field of that analysis's result")
    value: float | int | str | None
    note: str | None = None


class Finding(BaseModel):
    rank: int = Field(description="1 = most time at stake")
    bottleneck: BottleneckClass
    title: str
    evidence: list[Evidence]
    time_at_stake_ns: int = Field(description="GPU time this cause accounts for, ns")
    share_pct: float | None = Field(description="time_at_stake_ns / denominator_ns, %")
    denominator: str = Field(description="what share_pct divides by")
    speedup_if_halved: float | None = Field(description="Amdahl 1/(1-0.5F), whole-run multiplier")
    speedup_if_removed: float | None = Field(description="Amdahl 1/(1-F), whole-run multiplier; null when F >= 1")
    confidence: Literal["high", "medium", "low"]
    confidence_reason: str
    next_step: str = Field(description="the next measurement to take")


class NotApplicable(BaseModel):
    tool: str
    reason: str


class HostFinding(BaseModel):
    """A host-side figure of a profile without GPU activity: what the host threads did, not a GPU bottleneck class."""

    rank: int = Field(description="1 = most time")
    kind: Literal["host_blocked", "api_time"] = Field(description="host_blocked: a thread waiting for the GPU (sync calls, "
                                                      "blocking copies); api_time: where a process's API call time goes")
    title: str
    pid: int | None
    tid: int | None = Field(None, description="thread (host_blocked only)")
    time_ns: int = Field(description="host_blocked: union of the thread's blocking calls; api_time: summed time of the top call, ns")
    share_pct: float | None = Field(description="time_ns / denominator_ns, %")
    denominator: str = Field(description="what share_pct divides by")
    evidence: list[Evidence]
    confidence: Literal["high", "medium", "low"]
    confidence_reason: str
    next_step: str = Field(description="the next measurement to take")


class DiagnoseResult(ToolResult):
    trace: str
    window: Window = Field(description="the window analysed (capture span unless given)")
    device_id: int | None = Field(description="GPU analysed (the busiest unless `device` was given)")
    device_name: str | None = None
    other_devices: list[int] = Field(description="devices with GPU work not analysed: pass device= for them")
    gpu_span_ns: int | None = Field(description="denominator: first to last GPU op of the device in the window, ns")
    gpu_busy_ns: int | None = Field(description="union of the device's GPU ops, ns")
    verdict: str = Field(description="one line: the decisive finding, or why there is none")
    findings: list[Finding] = Field(description="ranked by time at stake")
    dropped_findings: int = Field(description="findings cut by `limit` or below 2 % share, or all of them when diagnose abstains")
    abstained: bool = Field(False, description="true when too many GPU rows were skipped or repaired to rank causes (see verdict, rules)")
    scope: Literal["gpu", "host_only"] = Field("gpu", description="gpu: findings about one GPU; host_only: the profile holds no "
                                              "GPU activity, so only host_findings are given and GPU-side classes are not judged")
    host_findings: list[HostFinding] = Field(default_factory=list, description="host_only scope: blocked time per thread, API "
                                             "time by call, ranked by time")
    not_judged: list[str] = Field(default_factory=list, description="what diagnose cannot judge on this profile: the missing data, "
                                  "where the profile would keep it and the capture flag that records it")
    not_applicable: list[NotApplicable] = Field(description="analyses that could not run, with the reason")
    whole_graph: WholeGraphTime | None = Field(None, description="CUDA graph replays traced whole on the device in the "
                                               "window: counted as computation, their contents (possibly communication) "
                                               "unknown; null when there are none")
    rules: list[str]
    data_issues: list[str] = data_issues_field()


def _amdahl(f: float | None) -> tuple[float | None, float | None]:
    if f is None:
        return None, None
    f = max(0.0, f)
    halved = round(1.0 / (1.0 - 0.5 * min(f, 1.0)), 3)
    removed = round(1.0 / (1.0 - f), 3) if f < 1.0 else None
    return halved, removed


def _ev(tool: str, field: str, value: Any, note: str | None = None) -> Evidence:
    if isinstance(value, float):
        value = round(value, 3)
    return Evidence(tool=tool, field=field, value=value, note=note)


def diagnose(trace: Trace, *, device: int | None = None, start_ns: int | None = None, end_ns: int | None = None,
             limit: int = 8) -> DiagnoseResult:
    limit = max(1, min(int(limit), 20))
    require(trace, "diagnose")
    if not any(present(trace)[k] for k in GPU):
        from .diagnose_host import host_only  # it builds this module's result types

        return host_only(trace, device=device, start_ns=start_ns, end_ns=end_ns, limit=limit)
    na: list[NotApplicable] = []

    def run(tool: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ProfileError as exc:
            na.append(NotApplicable(tool=tool, reason=f"not applicable: {exc}"))
            return None

    tl = gpu_timeline(trace, device=device, start_ns=start_ns, end_ns=end_ns)  # ProfileError propagates: nothing to diagnose
    timelines = [t for t in tl.timelines if t.device_id is not None]
    if not timelines:
        raise ProfileError(f"{trace.path.name}: no GPU operations in the selection; there is nothing to diagnose.")
    main = max(timelines, key=lambda t: (t.busy_ns, -(t.device_id or 0)))
    dev = main.device_id
    vendor = (trace.sql("SELECT vendor FROM devices WHERE device_id = ?", [dev]) or [(None,)])[0][0] or ""
    # The kernel profiler of the device's vendor (both when the profile does not say).
    kprof = {"NVIDIA": "Nsight Compute (ncu --set full)", "AMD": "rocprof-compute"}.get(
        vendor.upper(), "Nsight Compute (ncu --set full) / rocprof-compute")
    others = sorted({t.device_id for t in timelines if t.device_id != dev})
    span = main.total_ns
    denom = f"GPU span of device {dev} (gpu_timeline.timelines[].total_ns = {span} ns)"
    tl_field = f"timelines[device_id={dev}]"

    # api_summary's figures (blocked threads, launches) only explain GPU idle time: below IDLE_MIN_PCT no rule reads
    # them, and its launch analysis (every kernel matched to its call) is most of a first call on a busy GPU.
    idle_pct = main.idle_pct_of_total or 0.0
    api = run("api_summary", lambda: api_summary(trace, device=dev, start_ns=start_ns, end_ns=end_ns)) if idle_pct >= IDLE_MIN_PCT else None
    # memcpy_summary and comm_summary only add evidence to the exposed-copies / exposed-communication findings: where
    # gpu_timeline finds no exposed time of theirs on the device, no rule reads them and they are not run (named in
    # not_applicable only when the device has no such ops at all).
    mem = (run("memcpy_summary", lambda: memcpy_summary(trace, device=dev, start_ns=start_ns, end_ns=end_ns))
           if main.exposed_memcpy_ns > 0 else None)
    if not main.memcpy_ops:
        na.append(NotApplicable(tool="memcpy_summary", reason="not applicable: no memory copies on the device in the window"))
    comm = (run("comm_summary", lambda: comm_summary(trace, device=dev, start_ns=start_ns, end_ns=end_ns))
            if main.exposed_comm_ns > 0 else None)
    whole = whole_graph_time(trace, "device_id = ? AND start_ns < ? AND end_ns > ?", [dev, tl.window.end_ns, tl.window.start_ns],
                             f"computation ({tl_field}.computation_ns; never as communication)", tl.window.start_ns, tl.window.end_ns)
    not_judged = left_out(trace, "diagnose") + ([f"communication inside CUDA graphs: {whole.note}"] if whole else [])
    if not main.comm_ops:
        na.append(NotApplicable(tool="comm_summary", reason="not applicable: no communication kernels on the device in the window"
                                + (f" (but {whole.replays} CUDA graph replays traced whole may hold some: see whole_graph)" if whole else "")))
    top = run("top_kernels", lambda: top_kernels(trace, device=dev, start_ns=start_ns, end_ns=end_ns, limit=5))
    roof = None
    if start_ns is not None or end_ns is not None:
        na.append(NotApplicable(tool="roofline", reason="not applicable: roofline covers the whole profile and takes no time window"))
    else:
        roof = run("roofline", lambda: roofline(trace, device=dev, limit=200))

    found: list[dict] = []

    def add(cls: str, title: str, evidence: list[Evidence], stake: int, conf: str, why: str, step: str, *,
            key: str | None = None, rows: list | None = None) -> None:
        if stake > 0:
            found.append(dict(bottleneck=cls, key=key or cls, title=title, evidence=evidence, stake=int(stake), conf=conf, why=why,
                              step=step, rows=rows or []))

    # -- idle: sync / launch overhead / host / undecidable --------------------------------------------
    if idle_pct >= IDLE_MIN_PCT:
        ev = [_ev("gpu_timeline", f"{tl_field}.idle_ns", main.idle_ns), _ev("gpu_timeline", f"{tl_field}.idle_pct_of_total", idle_pct)]
        streams = [s for s in tl.streams if s.device_id == dev]
        s_idle = sum(s.idle_ns for s in streams)
        host_wait = sum(s.host_wait_ns for s in streams)
        unknown = sum(s.launch_unknown_ns for s in streams)
        host_wait_pct = pct(host_wait, s_idle)
        if streams:
            ev.append(_ev("gpu_timeline", "streams[].host_wait_ns (sum)", host_wait, f"{host_wait_pct} % of summed stream idle"))
        if api is None:
            add("other", f"GPU idle {idle_pct:.1f} % of the span; cause undetermined: the profile holds no host API calls, so sync, "
                "launch overhead and host-side work cannot be told apart", ev, main.idle_ns, "low",
                "no host API calls: the host side of the idle gaps is not recorded",
                "capture the host side too (" + gap_text(trace, ("api_calls",)).removeprefix("no ") + ") to see what the host did",
                key="other:idle")
        else:
            sync_ns, sync_thread, contributors = 0, None, []
            for th in api.blocked_threads:
                cat = th.blocked_by_category_ns
                v = min(th.blocked_ns, cat.get("synchronize", 0) + cat.get("event_query_spin", 0))
                if v > sync_ns:
                    sync_ns, sync_thread = v, th
                    contributors = [c.name for c in th.contributors if c.category in ("synchronize", "event_query_spin")][:3]
            launch = next((r for r in (api.launches or []) if r.device_id == dev and r.stream_id is None), None)
            tiny_pct = launch.tiny_pct_of_single_kernel_launches if launch else None
            if sync_thread is not None:
                ev.append(_ev("api_summary", f"blocked_threads[tid={sync_thread.tid}].blocked_by_category_ns[synchronize+event_query_spin]",
                              sync_ns, f"calls: {', '.join(contributors) or '-'}"))
            if launch is not None:
                ev += [_ev("api_summary", "launches[device].tiny_pct_of_single_kernel_launches", tiny_pct),
                       _ev("api_summary", "launches[device].launch_latency.median_ns", launch.launch_latency.median_ns),
                       _ev("api_summary", "launches[device].api_duration.median_ns", launch.api_duration.median_ns)]
            partial = unknown > 0.5 * max(s_idle, 1)
            conf_adj = "; more than half of the stream idle precedes ops whose launch is not in the profile" if partial else ""
            if sync_ns >= SYNC_SHARE_OF_IDLE * main.idle_ns and (tiny_pct or 0) < TINY_PCT:
                add("sync", f"GPU idle {idle_pct:.1f} % of the span while the host blocks in synchronization "
                    f"({', '.join(contributors) or 'sync calls'})", ev, main.idle_ns, "low" if partial else "medium",
                    "host blocked in sync calls for >= 30 % of the GPU idle time; that the gaps follow the syncs is inferred" + conf_adj,
                    "find the sync sites (call_stack / marker_summary around the blocking calls; torch: .item(), .cpu(), "
                    "non_blocking=False copies) and remove or defer them so the host can run ahead")
            elif tiny_pct is not None and tiny_pct >= TINY_PCT and (launch.api_duration.median_ns or 0) >= SLOW_LAUNCH_NS:
                add("launch_overhead", f"GPU idle {idle_pct:.1f} % of the span: the launch calls themselves are slow (median "
                    f"{launch.api_duration.median_ns / 1e6:.1f} ms, normally a few us), i.e. first-call work such as lazy module "
                    f"loading or JIT compilation rather than per-launch overhead", ev, main.idle_ns, "low",
                    f"median launch call {launch.api_duration.median_ns:.0f} ns over {launch.launch_calls} launch calls: a one-off "
                    "start-up cost in the window, which a steady-state run would not repeat" + conf_adj,
                    "capture a steady window after warm-up steps (or set CUDA_MODULE_LOADING=EAGER) and diagnose that window; "
                    "only then judge per-launch overhead")
            elif tiny_pct is not None and tiny_pct >= TINY_PCT:
                add("launch_overhead", f"GPU idle {idle_pct:.1f} % of the span: kernels finish faster than the host launches them "
                    f"({tiny_pct:.0f} % of launches are tiny)", ev, main.idle_ns, "low" if partial else "medium",
                    "tiny kernels shorter than their launch call measured directly; their share of the idle time is inferred" + conf_adj,
                    "count launches per step (api_summary launches) and try CUDA graphs / torch.compile / kernel fusion; "
                    "capture with -t cuda,nvtx to see the launching host code")
            elif host_wait_pct is not None and host_wait_pct >= HOST_WAIT_PCT:
                add("idle_host", f"GPU idle {idle_pct:.1f} % of the span waiting on the host (next op launched after the stream drained)",
                    ev, main.idle_ns, "low" if partial else "medium",
                    f"{host_wait_pct} % of stream idle is host-wait gaps (HTA classification)" + conf_adj,
                    "sample the host during the gaps (nsys --sample=cpu / py-spy; marker_summary on NVTX ranges) to find the CPU work")
            else:
                add("other", f"GPU idle {idle_pct:.1f} % of the span with ops launched in time (waiting on events, other streams "
                    "or dependencies)", ev, main.idle_ns, "low",
                    "neither sync, tiny launches nor host-wait gaps explain the idle time",
                    "inspect the largest gaps (gap_histogram top gaps) and the cross-stream waits around them", key="other:idle")

    # -- communication -------------------------------------------------------------------------------
    if main.exposed_comm_ns > 0:
        ev = [_ev("gpu_timeline", f"{tl_field}.exposed_comm_ns", main.exposed_comm_ns),
              _ev("gpu_timeline", f"{tl_field}.exposed_comm_pct_of_total", main.exposed_comm_pct_of_total),
              _ev("gpu_timeline", f"{tl_field}.comm_comp_overlap_pct_of_comm", main.comm_comp_overlap_pct_of_comm)]
        if comm is not None:
            for c in sorted((c for c in comm.collectives if c.device_id == dev), key=lambda c: -c.total_ns)[:2]:
                ev.append(_ev("comm_summary", f"collectives[{c.collective}].total_ns", c.total_ns, f"{c.count} calls"))
        add("communication", f"Exposed communication: {main.exposed_comm_pct_of_total or 0:.1f} % of the span has communication with no "
            "computation running", ev, main.exposed_comm_ns, "high" if main.unlinked_ops == 0 else "medium",
            "interval algebra over communication kernels (name patterns) and computation",
            "check message sizes and bandwidth (comm_summary messages), overlap comm with compute (bucket sizes, async "
            "collectives), and compare ranks (rank_summary) for stragglers")

    # -- copies --------------------------------------------------------------------------------------
    if main.exposed_memcpy_ns > 0:
        ev = [_ev("gpu_timeline", f"{tl_field}.exposed_memcpy_ns", main.exposed_memcpy_ns),
              _ev("gpu_timeline", f"{tl_field}.exposed_memcpy_pct_of_total", main.exposed_memcpy_pct_of_total)]
        pageable, dirs = [], []
        if mem is not None:
            for g in sorted((g for g in mem.groups if g.device_id == dev), key=lambda g: -g.exposed_ns)[:3]:
                ev.append(_ev("memcpy_summary", f"groups[{g.direction},{g.src_kind}->{g.dst_kind}].exposed_ns", g.exposed_ns,
                              f"{g.count} ops, {g.gb_per_s_over_wall} GB/s over wall" + (", pageable" if g.pageable else "")))
                if g.exposed_ns > 0:
                    dirs.append(g.direction)
                if g.pageable:
                    pageable.append(g.direction)
        if pageable:
            copy_step = (f"pin the host buffers of the pageable {'/'.join(pageable)} copies and issue them non_blocking on a side "
                         "stream; check bandwidth per direction (memcpy_summary)")
        elif dirs and all(d in ("DtoD", "memset", "PtoP") for d in dirs):
            copy_step = ("find the device-side copies / memsets (ops_summary, call_stack: .contiguous(), .clone(), zero_()) and "
                         "remove them or let them overlap with kernels on another stream")
        else:
            copy_step = ("overlap the copies with kernels (non_blocking copies on a side stream, prefetch the next batch); "
                         "check bandwidth per direction against the link peak (memcpy_summary)")
        add("copies", f"Exposed copies: {main.exposed_memcpy_pct_of_total or 0:.1f} % of the span copies run with no kernel running"
            + (f" (pageable {'/'.join(pageable)})" if pageable else ""), ev, main.exposed_memcpy_ns, "high",
            "interval algebra over copies, computation and communication", copy_step)

    # -- roofline: compute / memory ------------------------------------------------------------------
    if roof is not None:
        if not roof.peaks_known:
            na.append(NotApplicable(tool="roofline", reason=f"not applicable: {roof.message or 'unknown GPU peaks'}"))
        rated = [r for r in roof.rows if r.rated and r.pct_of_roof is not None and r.total_headroom_ns]
        if roof.peaks_known and not rated:
            na.append(NotApplicable(tool="roofline", reason="not applicable: no op could be rated (no op shapes / perf model); "
                                    "compute vs memory cannot be judged"))
        for cls in ("compute", "memory"):
            rows = sorted((r for r in rated if r.bound == cls and r.pct_of_roof < FAR_BELOW_ROOF_PCT),
                          key=lambda r: -(r.total_headroom_ns or 0))
            if not rows:
                continue
            stake = int(sum(r.total_headroom_ns for r in rows))
            ev = [_ev("roofline", f"rows[{roof.rows.index(r)}].total_headroom_ns", int(r.total_headroom_ns),
                      f"{clip_name(r.name, 60)} {clip_name((r.signature or {}).get('input_dims') or '', 60)}: "
                      f"{r.pct_of_roof:.1f} % of {r.compute_roof_field if cls == 'compute' else 'memory roof'} "
                      f"(roofline time / measured time), {r.count} calls, {r.total_time_ns} ns measured") for r in rows[:3]]
            ev.append(_ev("roofline", f"rows[bound={cls}, pct_of_roof<50].count", len(rows),
                          f"roofline rows truncated at {len(roof.rows)}: smaller rows beyond are not counted"
                          if roof.truncated else None))
            add(cls, f"{cls.capitalize()}-bound ops far below their roof: {clip_name(rows[0].name, 60)} at "
                f"{rows[0].pct_of_roof:.1f} % of roof" + (f" (+{len(rows) - 1} more)" if len(rows) > 1 else ""), ev, stake,
                "medium" if roof.peaks_confidence != "low" else "low",
                "analytic FLOP/byte models against datasheet peaks (perfect-cache bytes); time at stake is the headroom to the roof",
                f"profile {clip_name(rows[0].name, 60)}'s kernels with {kprof} (SOL %, "
                + ("tensor-pipe utilisation, occupancy)" if cls == "compute" else "DRAM throughput, L2 hit rate, coalescing)"),
                rows=rows)

    # -- dominant kernel -----------------------------------------------------------------------------
    if top is not None:
        rx = re.compile("|".join(f"(?:{p})" for p in comm_patterns()), re.I)
        kern = [k for k in top.kernels if k.device_id == dev and not rx.search(k.name)]
        if kern and (kern[0].pct_of_device_kernel_time or 0) >= DOMINANT_KERNEL_PCT:
            k = kern[0]
            kname = clip_name(k.name, 60)
            ev = [_ev("top_kernels", f"kernels[{kname}].total_ns", k.total_ns, f"{k.count} calls, avg {k.avg_ns:.0f} ns"),
                  _ev("top_kernels", f"kernels[{kname}].pct_of_device_kernel_time", k.pct_of_device_kernel_time,
                      "of the device's summed kernel time")]
            step = f"profile kernel {kname} with {kprof} for SOL %, occupancy and stall reasons"
            row, launcher = _rated_row_of_kernel(trace, dev, k.name, roof) if roof is not None and roof.peaks_known else (None, None)
            if launcher is not None:
                ev.append(_ev("op_tree", "launcher of the kernel (most time)", launcher))
            target = next((f for f in found if f["bottleneck"] == getattr(row, "bound", None) and row in f.get("rows", [])), None)
            if target is not None:  # the kernel's op is one of the far-below-roof ops: same cause, merge
                target["evidence"] += ev
                target["step"] += f"; dominant kernel: {kname}"
            elif row is not None:  # rated, but within 50 % of its roof: the headroom is what is at stake
                add(row.bound, f"Dominant kernel: {kname} takes {k.pct_of_device_kernel_time:.1f} % of the device's summed kernel time; its op "
                    f"{clip_name(row.name, 60)} is {row.bound}-bound at {row.pct_of_roof:.1f} % of its roof",
                    ev + [_ev("roofline", f"rows[{roof.rows.index(row)}].total_headroom_ns", int(row.total_headroom_ns or 0),
                              f"{clip_name(row.name, 60)}: {row.pct_of_roof:.1f} % of its binding roof")],
                    int(row.total_headroom_ns or 0), "medium",
                    "time share measured; roofline rating of its op from analytic FLOP/byte models (time at stake = headroom to the roof)",
                    step, rows=[row])
            else:  # no rating: say so, do not guess compute vs memory. At stake: the time it runs (its instances' union)
                wall = _kernel_wall_ns(trace, dev, k.name, start_ns, end_ns)
                ev.append(_ev("diagnose", f"kernels[{kname}] wall time (union of its instances)", wall,
                              "GPU time during which at least one instance runs; summed time counts overlaps twice"))
                why = ("the profile has no roofline rating for it (" + (
                    "analysis restricted to a time window" if roof is None and (start_ns is not None or end_ns is not None) else
                    "roofline not applicable, see not_applicable" if roof is None else
                    "unknown GPU peaks" if not roof.peaks_known else "its op has no shapes / perf model, or it has no PyTorch op") + ")")
                add("other", f"Dominant kernel: {kname} takes {k.pct_of_device_kernel_time:.1f} % of the device's summed kernel time; compute- vs "
                    f"memory-bound cannot be judged: {why}", ev, wall, "low",
                    "time share measured; its bottleneck class is unknown " + why, step, key="other:kernel")

    # -- merge, rank, cut ----------------------------------------------------------------------------
    merged: dict[str, dict] = {}
    for f in found:
        m = merged.get(f["key"])
        if m is None:
            merged[f["key"]] = f
        else:
            keep, other = (f, m) if f["stake"] > m["stake"] else (m, f)
            keep["evidence"] = keep["evidence"] + other["evidence"]
            keep["title"] += f"; also: {other['title']}"
            keep["rows"] = keep["rows"] + other["rows"]
            merged[f["key"]] = keep
    for f in merged.values():
        if span and f["stake"] > span:  # summed op time of concurrent ops can exceed the span: never claim more than all of it
            f["evidence"].append(_ev("diagnose", "time_at_stake_ns before capping", f["stake"],
                                     "summed op time exceeds the GPU span (ops overlap): capped at the span"))
            f["stake"] = span
    ranked = sorted(merged.values(), key=lambda f: -f["stake"])
    findings: list[Finding] = []
    dropped = 0
    for f in ranked:
        share = pct(f["stake"], span)
        if share is not None and share < MIN_SHARE_PCT or len(findings) >= limit:
            dropped += 1
            continue
        F = None if share is None else min(f["stake"] / span, 1.0)  # exact, not the rounded share
        h, r = _amdahl(F)
        findings.append(Finding(rank=len(findings) + 1, bottleneck=f["bottleneck"], title=f["title"], evidence=f["evidence"][:10],
                                time_at_stake_ns=f["stake"], share_pct=share, denominator=denom, speedup_if_halved=h,
                                speedup_if_removed=r, confidence=f["conf"], confidence_reason=f["why"], next_step=f["step"]))
    notes = data_issue_notes(trace, ALL_TABLES)
    damaged, gpu_rows = _damaged_gpu_rows(trace)
    damaged_pct = pct(damaged, gpu_rows)
    if 100 * damaged > ABSTAIN_GPU_ROWS_PCT * gpu_rows:  # exact: damaged_pct is rounded
        verdict = (f"abstained: {damaged} of {gpu_rows} GPU rows ({damaged_pct} %, above {ABSTAIN_GPU_ROWS_PCT} %) were skipped or "
                   "repaired by the reader, so their times are unknown and the ranking of causes cannot be trusted; "
                   "data_issues says what was wrong. Fix or re-export the profile; gpu_timeline and top_kernels still give "
                   "the figures of the rows kept")
        return DiagnoseResult(trace=tl.trace, window=tl.window, device_id=dev, device_name=main.device_name, other_devices=others,
                              gpu_span_ns=span, gpu_busy_ns=main.busy_ns, verdict=verdict, findings=[],
                              dropped_findings=len(ranked), abstained=True, not_applicable=na, rules=RULES, not_judged=not_judged,
                              whole_graph=whole, data_issues=notes)
    if damaged:
        for f in findings:
            f.confidence = LOWER[f.confidence]
            f.confidence_reason += (f"; lowered one level: {damaged} of {gpu_rows} GPU rows ({damaged_pct} %) were skipped or "
                                    "repaired by the reader (data_issues)")
    if findings:
        top_f = findings[0]
        verdict = (f"{top_f.bottleneck}: {top_f.title} — {top_f.share_pct} % of the GPU span at stake "
                   f"(≤ {top_f.speedup_if_halved}× if halved, ≤ {top_f.speedup_if_removed or '∞'}× if removed)")
    else:
        verdict = ("no bottleneck reaches 2 % of the GPU span with the data available; the GPU is busy "
                   f"{main.busy_pct_of_total} % of its span — rate kernels with roofline (needs op shapes) or {kprof}")
    return DiagnoseResult(trace=tl.trace, window=tl.window, device_id=dev, device_name=main.device_name, other_devices=others,
                          gpu_span_ns=span, gpu_busy_ns=main.busy_ns, verdict=verdict, findings=findings, dropped_findings=dropped,
                          not_applicable=na, rules=RULES, not_judged=not_judged, whole_graph=whole, data_issues=notes)


def _damaged_gpu_rows(trace: Trace) -> tuple[int, int]:
    """(kernel/copy/set source rows skipped or repaired, GPU rows in the source = kept + skipped)."""
    skipped = sum(n for t, a, n, _ in data_issues(trace) if t in ("kernels", "memops") and a == "skipped")
    repaired = sum(n for t, a, n, _ in data_issues(trace) if t in ("kernels", "memops") and a == "repaired")
    return skipped + repaired, trace.count("kernels") + trace.count("memops") + skipped


def _kernel_wall_ns(trace: Trace, dev: int, short_name: str, start_ns: int | None, end_ns: int | None) -> int:
    """Union of the kernel's instances on the device, clipped to the window, ns. `short_name` is the name as
    top_kernels reports it, i.e. clipped (clip_name) when long: match the full names it stands for."""
    lo, hi = (-(2 ** 62) if start_ns is None else start_ns), (2 ** 62 if end_ns is None else end_ns)
    names = [r[0] for r in trace.sql("SELECT DISTINCT short_name FROM kernels WHERE device_id = ? AND short_name IS NOT NULL", [dev])
             if clip_name(r[0]) == short_name] or [short_name]
    u = unions(trace, "SELECT device_id, greatest(start_ns, ?) AS start_ns, least(end_ns, ?) AS end_ns FROM kernels "
                      f"WHERE device_id = ? AND short_name IN ({', '.join('?' * len(names))}) AND end_ns > ? AND start_ns < ?",
               [lo, hi, dev, *names, lo, hi], ("device_id",)).get((dev,))
    return 0 if u is None else int(u.busy_ns)


def _rated_row_of_kernel(trace: Trace, dev: int, short_name: str, roof: Any) -> tuple[Any, str | None]:
    """The rated roofline op row of the PyTorch op that launched most of this kernel's time, and that op's name."""
    from .op_tree import launchers

    names = [r[0] for r in trace.sql("SELECT DISTINCT name, short_name FROM kernels WHERE device_id = ?", [dev])
             if clip_name(r[1] or r[0]) == short_name or clip_name(r[0]) == short_name]
    if not names:
        return None, None
    L = launchers(trace)
    by = trace.sql(f"""SELECT launcher_name, coalesce(input_dims, '') AS dims FROM {L.gops}
                       WHERE device_id = ? AND op = 'kernel' AND launcher_kind = 'cpu_op' AND name IN (SELECT unnest(?::VARCHAR[]))
                       GROUP BY ALL ORDER BY sum(dur_ns) DESC, min(start_ns), min(gop_id) LIMIT 1""", [dev, names])
    if not by:
        return None, None
    op, dims = by[0]
    for r in roof.rows:
        if r.source == "op" and r.rated and r.bound in ("compute", "memory") and r.name == op \
                and ((r.signature or {}).get("input_dims") or "") == dims:
            return r, op
    return None, op
