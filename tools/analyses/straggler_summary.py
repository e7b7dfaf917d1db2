"""straggler_summary: per collective, which rank arrived last and by how much; the slowest rank's own work.

A collective instance follows the one rule critical_path's job join uses too (collectives.py, where the reasons are):
where the profiles record every collective kernel's communicator (kernels.communicator: Nsight, the NCCL NVTX
payload's communicator id; Kineto, the kernel args' 'Process Group Name'), the k-th kernel of one (communicator,
kernel name) on each rank that is a member of that communicator (a rank with kernels of it), so a tensor-parallel
all-reduce is compared across its tensor-parallel group only, never with the data-parallel all-reduces that run the
same kernel. Where some collective kernel records none (rocpd/rpd never do; Nsight without NCCL payloads, Kineto
without the args), the k-th kernel of one name on each rank with collective kernels, which pairs kernels of different
communicators that share a name: `collective_match` says which rule ran and a note says why. Ranks are numbered as
in rank_summary (a process of a profile, by the profile or in input order).

Point-to-point kernels (Send, Recv, SendRecv: the operation the profile records, kernels.collective, else the kernel
name) are never compared: a transfer joins two ranks whose pairing the profile does not record, not every member of
the communicator (critical_path leaves them out of its joins for the same reason). An instance held by one given
rank only (the profiles given hold no other member of its communicator) compares nothing and is left out too.

Every member leaves a collective together, once the last one has arrived, so a rank's kernel lasts (time it waited
for the last rank) + (the transfer itself): the rank with the SHORTEST kernel arrived last. This reads durations only,
never start times, so it holds across hosts whose clocks are not synchronised.

Against HTA and TraceLens: TraceLens's NcclAnalyser keys an instance by ('Process Group Name', order on the rank) and
compares only the collectives that synchronise every member (all-reduce, reduce-scatter, all-gather, all-to-all);
where no kernel records a process group and each rank uses one stream it falls back to the order of all collective
kernels on the rank, and otherwise keys kernels without one under a shared 'Unknown_Group'. This tool follows that
keying (with the kernel name added, so that kernels of one communicator under different names never pair) and the
point-to-point exclusion, but falls back as soon as one kernel lacks its communicator: that kernel belongs to some
communicator, and leaving it out would shift the order k of that communicator's later kernels on its rank.
TraceLens's skew and wait come from start times (latest start - own start), which need one clock across hosts; here
they come from durations. HTA's straggler analysis compares the start of the last long communication kernel per
(stream, iteration, kernel name) across ranks: a name and stream, never a communicator, and one clock again.

Per collective (instances present on every member rank):
  last_rank       rank with the shortest kernel (lowest rank on ties);
  skew_ns         longest - shortest kernel duration = how long the first rank to arrive waited for the last;
  median_wait_ns  median over the member ranks of (kernel duration - shortest duration) = the typical rank's wait.
Per rank: times it arrived last, and the time it spent waiting for others (sum over collectives of its wait).
The straggler is the rank last most often (lowest rank on ties); its top kernels and GPU idle time follow.

All ranks are one SQL statement over the ranks' stores (tools/model/job.py), however many ranks there are.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.detect import FORMAT_NAMES
from ..model.trace import Trace
from .collectives import instances_sql, match_rule
from .comm_patterns import is_comm_sql
from .comm_patterns import comm_patterns as active_patterns
from .common import ToolResult, data_issue_notes, data_issues_field, pct, whole_graph_job_note
from .rank_summary import job_ranks
from .intervals import unions_on
from .stacked import cursor, run, stack, whole_graph_cols

MAX_LIMIT = 1024
# Where each format records a communication kernel's communicator, for the note when one does not
COMMUNICATOR_SOURCE = {
    "nsys": "Nsight records it from NCCL's NVTX payloads (NCCL 2.19 or later, exported with --include-blobs=true), "
            "for kernels one NCCL call launched",
    "kineto": "PyTorch writes it as the NCCL kernel's 'Process Group Name' arg (kernels without their collective's "
              "args, e.g. unlinked RCCL kernels, have none)",
    "rocpd": "rocpd databases never link RCCL calls to kernels",
    "rpd": "RPD databases never link RCCL calls to kernels",
}


class CollectiveRow(BaseModel):
    name: str = Field(description="communication kernel name")
    communicator: str | None = Field(description="communicator of the instance as the profiles record it (Nsight NCCL "
                                                 "communicator id, Kineto process group name); null when matched by name "
                                                 "order (collective_match)")
    seq: int = Field(description="occurrence of this (communicator, kernel name) on each member rank, from 1 (start "
                                 "order); of the kernel name alone when matched by name order")
    ranks: int = Field(description="ranks that ran this instance: the members of its communicator among the ranks given")
    last_rank: int = Field(description="rank that arrived last: the shortest kernel (lowest rank on ties)")
    skew_ns: int = Field(description="longest - shortest kernel duration over the ranks: the first arrival's wait "
                                     "for the last, ns")
    median_wait_ns: float = Field(description="median over ranks of (kernel duration - shortest duration), ns")
    min_dur_ns: int = Field(description="shortest kernel duration (the last rank's: transfer without waiting), ns")
    max_dur_ns: int = Field(description="longest kernel duration, ns")


class RankWait(BaseModel):
    rank: int
    trace: str = Field(description="profile file name")
    pid: int | None
    collectives: int = Field(description="collective instances this rank took part in (of those compared)")
    times_last: int = Field(description="collectives in which this rank arrived last")
    last_pct_of_collectives: float | None = Field(description="times_last / collectives, %")
    waited_ns: int = Field(description="sum over collectives of (its kernel duration - the shortest): time this rank "
                                       "spent waiting for others, ns")


class KernelTotal(BaseModel):
    name: str = Field(description="kernel short name")
    count: int
    total_ns: int = Field(description="summed kernel time, ns")
    pct_of_rank_kernel_time: float | None = Field(description="total_ns / the rank's summed kernel time, %")


class SlowestRank(BaseModel):
    rank: int
    trace: str
    pid: int | None
    times_last: int
    collectives: int
    top_kernels: list[KernelTotal] = Field(description="the rank's kernels by summed time")
    gpu_span_ns: int | None = Field(description="first to last GPU operation of the rank, summed over its devices, ns")
    gpu_busy_ns: int | None = Field(description="union of the rank's kernels, copies and sets, summed over devices, ns")
    gpu_idle_ns: int | None = Field(description="gpu_span_ns - gpu_busy_ns, ns")
    evidence: str


class StragglerSummaryResult(ToolResult):
    traces: int = Field(description="profiles given")
    ranks_found: int = Field(description="ranks (processes) found in them")
    ranks_with_comm: int = Field(description="ranks with collective communication kernels (the ones compared; "
                                             "point-to-point kernels are not)")
    definitions: str
    collective_match: str = Field(description="how kernels were matched into instances: 'communicator' (every "
                                              "collective kernel records its communicator: the k-th of a (communicator, "
                                              "name) on each member rank), 'name_order' (some kernel records none: the "
                                              "k-th of a name on every rank with communication, which pairs kernels of "
                                              "different communicators sharing a name; see notes) or 'none' (no "
                                              "collective kernel)")
    p2p_kernels: int = Field(description="point-to-point kernels (Send, Recv, SendRecv) left out of the comparison")
    collectives_compared: int = Field(description="collective instances present on every member rank")
    collectives_skipped: int = Field(description="instances not compared: missing on some member rank, or held by one "
                                                 "rank only (see notes)")
    total_skew_ns: int | None = Field(description="sum of skew_ns over the collectives compared, ns; null when none "
                                                  "was compared (see notes)")
    collectives: list[CollectiveRow] = Field(description="largest skew first")
    ranks: list[RankWait] = Field(description="most often last first")
    straggler: SlowestRank | None = Field(description="the rank most often last; null when no rank is last more than "
                                                      "another or nothing was compared")
    notes: list[str]
    truncated: bool
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


DEFINITIONS = (
    "A collective instance = the k-th kernel of one (communicator, kernel name) on each member rank of the communicator "
    "(collective_match 'communicator'), or, where some kernel records no communicator, the k-th kernel of one name on "
    "every rank with communication ('name_order'); point-to-point kernels are not compared. All members leave it "
    "together, so the rank with the shortest kernel arrived last; skew = longest - shortest duration (first arrival's "
    "wait); a rank's wait = its duration - the shortest. Durations only: valid across hosts with unsynchronised clocks."
)


def _instances_sql(traces: list[Trace], units, comm_patterns: list[str] | None) -> str:
    """CTEs (WITH ...): the job's communication kernels per rank numbered into instances by collectives.instances_sql
    (kinds, kr, rule, n, members, inst: the rule of that module), then
      full_inst  the instances compared; w  per rank and instance compared: its duration, its wait and whether it
            was the shortest."""
    rows_sql = ", ".join(f"({u.order}, {'NULL' if u.pid is None else int(u.pid)}, {str(u.whole or u.pid is None).upper()}, "
                         f"{int(u.rank)})" for u in units)
    comm = stack(traces, "kernels", "rowid AS tie, pid, name, start_ns, dur_ns, communicator, collective",
                 is_comm_sql("name", comm_patterns))
    return f"""
        WITH units(part, pid, whole, rank) AS (VALUES {rows_sql}),
        {instances_sql(f"SELECT u.rank, k.part, k.name, k.collective, k.communicator, k.start_ns, k.dur_ns, k.tie "
                       f"FROM ({comm}) k JOIN units u ON k.part = u.part AND (u.whole OR k.pid = u.pid)")},
        full_inst AS (SELECT * FROM inst WHERE complete),
        w AS (SELECT n.rank, n.comm, n.name, n.seq, n.dur_ns, n.dur_ns - f.mn AS wait_ns, n.dur_ns = f.mn AS shortest
              FROM n JOIN full_inst f ON n.comm IS NOT DISTINCT FROM f.comm AND n.name = f.name AND n.seq = f.seq)"""


def straggler_summary(traces: list[Trace], *, comm_patterns: list[str] | None = None, limit: int = 20) -> StragglerSummaryResult:
    limit = max(1, min(int(limit), MAX_LIMIT))
    active_patterns(comm_patterns)
    notes: list[str] = []
    units = job_ranks(traces, notes)
    base = _instances_sql(traces, units, comm_patterns)
    colls = run(traces, base + """
        SELECT name, comm, seq, count(*), min(rank) FILTER (WHERE shortest), max(dur_ns) - min(dur_ns), median(wait_ns),
               min(dur_ns), max(dur_ns)
        FROM w GROUP BY name, comm, seq ORDER BY max(dur_ns) - min(dur_ns) DESC, name, comm NULLS FIRST, seq""")
    counts = run(traces, base + f"""
        SELECT rule.ranks, i.compared, i.missing_on_some, i.single, rule.p2p_kernels, rule.by_comm, rule.kernels,
               rule.missing, (SELECT list(DISTINCT part ORDER BY part) FROM kr WHERE NOT p2p AND communicator IS NULL),
               {whole_graph_cols(traces)}
        FROM rule, (SELECT count(*) FILTER (WHERE complete) AS compared,
                           count(*) FILTER (WHERE NOT complete AND members > 1) AS missing_on_some,
                           count(*) FILTER (WHERE members = 1) AS single FROM inst) i""")
    ranks_with_comm, compared, missing_on_some, single, p2p, by_comm, kernels, no_comm, parts, *whole_cols = counts[0]
    ranks_with_comm, compared, p2p = int(ranks_with_comm or 0), int(compared or 0), int(p2p or 0)
    skipped = int(missing_on_some or 0) + int(single or 0)
    match = match_rule(kernels, by_comm)
    lasts = {}
    for _, _, _, _, last, *_ in colls:
        lasts[last] = lasts.get(last, 0) + 1
    per_rank = run(traces, base + """
        SELECT rank, count(*), sum(wait_ns)::BIGINT FROM w GROUP BY rank""")
    by_rank = {u.rank: u for u in units}
    rank_rows = [RankWait(rank=r, trace=by_rank[r].trace.path.name, pid=by_rank[r].pid, collectives=int(n),
                          times_last=lasts.get(r, 0), last_pct_of_collectives=pct(lasts.get(r, 0), int(n)),
                          waited_ns=int(waited or 0))
                 for r, n, waited in per_rank]
    rank_rows.sort(key=lambda x: (-x.times_last, x.rank))
    if match == "name_order":
        formats = sorted({traces[p].format for p in parts or []})
        notes.append(f"{int(no_comm)} of {int(kernels)} collective kernels record no communicator ("
                     + "; ".join(f"{FORMAT_NAMES.get(f, f)}: {COMMUNICATOR_SOURCE.get(f, 'the format records none')}"
                                 for f in formats)
                     + "), so collectives are matched by kernel name order across every rank with communication: where "
                     "ranks run several communicators (tensor-, data-, pipeline-parallel groups) under one kernel name, "
                     "an instance can join kernels of different communicators and its last rank and skew are then wrong")
    if missing_on_some:
        notes.append(f"{int(missing_on_some)} collective instances are missing on some member rank (different counts of a "
                     + ("(communicator, kernel name)" if by_comm else "kernel name")
                     + " per rank: a capture cut mid-step, or ranks running different work) and were not compared")
    if single:
        notes.append(f"{int(single)} collective instances are held by one rank only ("
                     + ("no other member of their communicator is among the profiles given" if by_comm else
                        "the only rank with collective kernels") + "): nothing to compare them with")
    if p2p:
        notes.append(f"{p2p} point-to-point kernels (Send, Recv, SendRecv) are not compared: a transfer joins two ranks "
                     "whose pairing the profile does not record, not every member of a communicator")
    if not ranks_with_comm and p2p:
        notes.append("no rank has collective communication kernels, only point-to-point ones: there is no collective "
                     "to compare")
    elif not ranks_with_comm:
        notes.append("no rank has communication kernels (NCCL/RCCL, ...): there is no collective to compare; pass "
                     "comm_patterns when the library's kernels have other names")
    elif ranks_with_comm < len(units):
        notes.append(f"{len(units) - ranks_with_comm} of {len(units)} ranks ran no collective communication kernel and "
                     "are not compared")
    whole = whole_graph_job_note(*whole_cols, "non-communication work: collectives inside them are not compared")
    if whole:
        notes.append(whole)
    straggler = None
    if rank_rows and len(rank_rows) > 1 and rank_rows[0].times_last > rank_rows[1].times_last:
        straggler = _slowest(traces, by_rank[rank_rows[0].rank], rank_rows[0], compared)
    truncated = len(colls) > limit or len(rank_rows) > limit
    hint = (f"{len(colls)} collectives and {len(rank_rows)} ranks; the lists show the first {limit}; raise limit "
            f"(max {MAX_LIMIT}) to see more") if truncated else None
    return StragglerSummaryResult(
        traces=len(traces), ranks_found=len(units), ranks_with_comm=ranks_with_comm, definitions=DEFINITIONS,
        collective_match=match, p2p_kernels=p2p, collectives_compared=compared, collectives_skipped=skipped,
        total_skew_ns=int(sum(c[5] for c in colls)) if colls else None,
        collectives=[CollectiveRow(name=c[0], communicator=c[1], seq=int(c[2]), ranks=int(c[3]), last_rank=int(c[4]),
                                   skew_ns=int(c[5]), median_wait_ns=float(c[6]), min_dur_ns=int(c[7]), max_dur_ns=int(c[8]))
                     for c in colls[:limit]],
        ranks=rank_rows[:limit], straggler=straggler, notes=notes, truncated=truncated, hint=hint,
        data_issues=[f"{t.path.name}: {note}" if len(traces) > 1 else note for t in traces
                     for note in data_issue_notes(t, ("kernels",))])


def _slowest(traces: list[Trace], u, row: RankWait, compared: int) -> SlowestRank:
    """The slowest rank's own top kernels and GPU idle, read from the job's stacked store like every other figure
    (no rank's own store is attached)."""
    t: Trace = u.trace
    where = "TRUE" if (u.whole or u.pid is None) else f"pid = {int(u.pid)}"
    only = {u.order}
    kernels = stack(traces, "kernels", "short_name, dur_ns", where, only)
    top = run(traces, f"""SELECT short_name, count(*), sum(dur_ns)::BIGINT FROM ({kernels})
                          GROUP BY short_name ORDER BY 3 DESC, 1 LIMIT 10""")
    total = run(traces, f"SELECT sum(dur_ns)::BIGINT FROM ({kernels})")[0][0] or 0
    cols = "device_id, start_ns, end_ns"
    ops = f"{stack(traces, 'kernels', cols, where, only)} UNION ALL {stack(traces, 'memops', cols, where, only)}"
    cur = cursor(traces)
    try:
        per_dev = unions_on(cur, ops, [], ("device_id",)).values()
    finally:
        cur.close()
    span = sum(u.span_ns for u in per_dev) if per_dev else None
    busy = sum(u.busy_ns for u in per_dev) if per_dev else None
    lead = top[0] if top else None
    evidence = (f"rank {u.rank} arrived last at {row.times_last} of the {row.collectives} collectives it took part in "
                f"({compared} compared in the job; the shortest kernel each time: "
                f"the others were waiting for it) and itself waited {row.waited_ns:,} ns in total")
    if lead:
        evidence += (f"; its largest kernel is {lead[0]} ({int(lead[2]):,} ns over {int(lead[1])} launches, "
                     f"{pct(int(lead[2]), int(total))} % of its kernel time): compare with the same kernel on other ranks")
    return SlowestRank(rank=u.rank, trace=t.path.name, pid=u.pid, times_last=row.times_last, collectives=row.collectives,
                       top_kernels=[KernelTotal(name=n, count=int(c), total_ns=int(s), pct_of_rank_kernel_time=pct(int(s), int(total)))
                                    for n, c, s in top],
                       gpu_span_ns=span, gpu_busy_ns=busy, gpu_idle_ns=None if span is None else span - busy,
                       evidence=evidence)


