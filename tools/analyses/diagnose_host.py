"""diagnose on a profile with host API calls but no GPU activity (a capture with GPU tracing off): host-side
findings from api_summary, and an explicit list of what cannot be judged without the GPU tables."""

from __future__ import annotations

from ..model.trace import Trace
from .api_summary import api_summary
from .common import ALL_TABLES, data_issue_notes, pct, resolve_selection
from .diagnose import RULES, DiagnoseResult, HostFinding, NotApplicable, _ev
from .requirements import left_out, reason

API_TOP = 5  # API names shown per process
GPU_TOOLS = ("gpu_timeline", "top_kernels", "memcpy_summary", "comm_summary", "roofline")


def host_only(trace: Trace, *, device: int | None, start_ns: int | None, end_ns: int | None, limit: int) -> DiagnoseResult:
    resolve_selection(trace, device, None, start_ns, end_ns)  # a bad device or window is refused as everywhere else
    api = api_summary(trace, start_ns=start_ns, end_ns=end_ns, limit=200)
    window = api.window
    denom_window = f"analysed window ({window.source}: {window.span_ns} ns)"
    found: list[HostFinding] = []
    for th in api.blocked_threads:
        if th.blocked_ns <= 0:
            continue
        who = f"{th.thread_name or 'thread'} (pid {th.pid}, tid {th.tid})"
        cats = {c: v for c, v in th.blocked_by_category_ns.items() if v}
        field = f"blocked_threads[pid={th.pid},tid={th.tid}]"
        ev = [_ev("api_summary", f"{field}.blocked_ns", th.blocked_ns, "union of the thread's blocking calls"),
              _ev("api_summary", f"{field}.pct_of_thread_api_span", th.pct_of_thread_api_span,
                  f"of its API span ({th.thread_api_span_ns} ns, first call entry to last return)")]
        ev += [_ev("api_summary", f"{field}.blocked_by_category_ns[{c}]", v) for c, v in cats.items()]
        ev += [_ev("api_summary", f"{field}.contributors[{c.name}].blocked_ns", c.blocked_ns, f"{c.calls} calls, {c.category}")
               for c in th.contributors[:3]]
        top = th.contributors[0].name if th.contributors else "blocking calls"
        found.append(HostFinding(
            rank=0, kind="host_blocked", pid=th.pid, tid=th.tid, time_ns=th.blocked_ns,
            title=f"Host thread {who} blocked waiting for the GPU for {th.blocked_ns} ns ({th.pct_of_window} % of the window, "
                  f"{th.pct_of_thread_api_span} % of its API span), mostly in {top}",
            share_pct=pct(th.blocked_ns, window.span_ns), denominator=denom_window, evidence=ev,
            confidence="high", confidence_reason="call intervals measured directly; whether the GPU was busy or idle meanwhile "
            "is not recorded, so this is not a GPU bottleneck class",
            next_step="capture again with GPU tracing on (see not_judged) to see what the GPU ran while the thread waited; "
                      "then find the sync sites (call_stack, marker_summary; torch: .item(), .cpu(), non_blocking=False copies)"))
    totals = {p.pid: p.summed_api_time_ns for p in api.processes}
    leads: dict[int | None, str] = {}
    for p in api.processes:
        rows = [a for a in api.apis if a.pid == p.pid][:API_TOP]
        if not rows or not totals[p.pid]:
            continue
        field = f"apis[pid={p.pid}]"
        ev = [_ev("api_summary", f"{field}[{a.name}].total_ns", a.total_ns,
                  f"{a.count} calls, {a.pct_of_process_api_time} % of the process's API time, median {a.median_ns:.0f} ns")
              for a in rows]
        ev.append(_ev("api_summary", f"processes[pid={p.pid}].summed_api_time_ns", totals[p.pid], f"{p.api_calls} calls"))
        lead = rows[0]
        leads[p.pid] = f"{lead.name} ({lead.count} calls, {lead.pct_of_process_api_time} % of its API time)"
        found.append(HostFinding(
            rank=0, kind="api_time", pid=p.pid, time_ns=lead.total_ns,
            title=f"API time of process {p.pid}: " + ", ".join(f"{a.name} {a.pct_of_process_api_time} %" for a in rows),
            share_pct=lead.pct_of_process_api_time,
            denominator=f"summed API call time of process {p.pid} (api_summary processes[].summed_api_time_ns = {totals[p.pid]} ns)",
            evidence=ev, confidence="high", confidence_reason="call durations measured directly",
            next_step="api_summary per_thread=true splits it by thread; the GPU side needs a capture with GPU tracing on"))
    found.sort(key=lambda f: (-f.time_ns, f.kind, f.pid or 0, f.tid or 0))
    dropped = max(0, len(found) - limit)
    found = found[:limit]
    for i, f in enumerate(found):
        f.rank = i + 1
    gaps = left_out(trace, "diagnose")
    na = [NotApplicable(tool=t, reason=f"not applicable: {reason(trace, t)}") for t in GPU_TOOLS if reason(trace, t)]
    blocked = [f for f in found if f.kind == "host_blocked"]
    api_lead = next((f for f in found if f.kind == "api_time"), None)
    host = (f"host thread tid {blocked[0].tid} blocked waiting for the GPU {blocked[0].share_pct} % of the window"
            if blocked else "no thread blocked in synchronisation or blocking copies")
    if api_lead is not None:
        host += f"; most API time of process {api_lead.pid} in {leads[api_lead.pid]}"
    verdict = (f"host only: {trace.path.name} holds no GPU activity, so no GPU bottleneck class is judged ({gaps[0]}). "
               f"Host side: {host}")
    return DiagnoseResult(
        trace=str(trace.path), window=window, device_id=None, device_name=None, other_devices=[], gpu_span_ns=None,
        gpu_busy_ns=None, verdict=verdict, findings=[], dropped_findings=dropped, not_applicable=na, rules=RULES,
        data_issues=data_issue_notes(trace, ALL_TABLES), scope="host_only", host_findings=found, not_judged=gaps)
