"""straggler_summary: per collective, which rank arrived last and by how much; the slowest rank's own work.

A collective instance is the k-th communication kernel of one name on each rank (ranks as in rank_summary: a
process of a profile, numbered by the profile or in input order). Every rank leaves a collective together, once
the last one has arrived, so a rank's kernel lasts (time it waited for the last rank) + (the transfer itself):
the rank with the SHORTEST kernel arrived last. This reads durations only, never start times, so it holds across
hosts whose clocks are not synchronised (start-time skew would not). HTA's and TraceLens's collective analyses
compare start times and therefore need one clock.

Per collective (instances present on every rank with communication kernels):
  last_rank       rank with the shortest kernel (lowest rank on ties);
  skew_ns         longest - shortest kernel duration = how long the first rank to arrive waited for the last;
  median_wait_ns  median over ranks of (kernel duration - shortest duration) = the typical rank's wait.
Per rank: times it arrived last, and the time it spent waiting for others (sum over collectives of its wait).
The straggler is the rank last most often (lowest rank on ties); its top kernels and GPU idle time follow.

All ranks are one SQL statement over the ranks' stores (tools/model/job.py), however many ranks there are.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .comm_patterns import comm_patterns as active_patterns
from .comm_patterns import is_comm_sql
from .common import ToolResult, data_issue_notes, data_issues_field, pct, whole_graph_job_note
from .rank_summary import job_ranks
from .intervals import unions_on
from .stacked import cursor, run, stack, whole_graph_cols

MAX_LIMIT = 1024


class CollectiveRow(BaseModel):
    name: str = Field(description="communication kernel name")
    seq: int = Field(description="occurrence of this kernel name on each rank, from 1 (start order)")
    ranks: int = Field(description="ranks that ran this instance")
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
    ranks_with_comm: int = Field(description="ranks with communication kernels (the ones compared)")
    definitions: str
    collectives_compared: int = Field(description="collective instances present on every rank with communication")
    collectives_skipped: int = Field(description="instances missing on some rank (not compared)")
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
    "A collective instance = the k-th communication kernel of one name on each rank. All ranks leave it together, so "
    "the rank with the shortest kernel arrived last; skew = longest - shortest duration (first arrival's wait); a "
    "rank's wait = its duration - the shortest. Durations only: valid across hosts with unsynchronised clocks."
)


def straggler_summary(traces: list[Trace], *, comm_patterns: list[str] | None = None, limit: int = 20) -> StragglerSummaryResult:
    limit = max(1, min(int(limit), MAX_LIMIT))
    active_patterns(comm_patterns)
    notes: list[str] = []
    units = job_ranks(traces, notes)
    rows_sql = ", ".join(f"({u.order}, {'NULL' if u.pid is None else int(u.pid)}, {str(u.whole or u.pid is None).upper()}, "
                         f"{int(u.rank)})" for u in units)
    comm = stack(traces, "kernels", "pid, name, start_ns, dur_ns", is_comm_sql("name", comm_patterns))
    base = f"""
        WITH units(part, pid, whole, rank) AS (VALUES {rows_sql}),
        k AS ({comm}),
        kr AS (SELECT u.rank, k.name, k.start_ns, k.dur_ns FROM k JOIN units u
               ON k.part = u.part AND (u.whole OR k.pid = u.pid)),
        n AS (SELECT rank, name, dur_ns,
                     row_number() OVER (PARTITION BY rank, name ORDER BY start_ns, dur_ns) AS seq FROM kr),
        nr AS (SELECT count(DISTINCT rank) AS ranks FROM kr),
        inst AS (SELECT name, seq, count(*) AS ranks, min(dur_ns) AS mn, max(dur_ns) AS mx FROM n GROUP BY name, seq),
        full_inst AS (SELECT i.* FROM inst i, nr WHERE i.ranks = nr.ranks),
        w AS (SELECT n.rank, n.name, n.seq, n.dur_ns - f.mn AS wait_ns, n.dur_ns = f.mn AS shortest
              FROM n JOIN full_inst f USING (name, seq))"""
    colls = run(traces, base + """
        SELECT f.name, f.seq, f.ranks, (SELECT min(rank) FROM w WHERE w.name = f.name AND w.seq = f.seq AND w.shortest),
               f.mx - f.mn, (SELECT median(wait_ns) FROM w WHERE w.name = f.name AND w.seq = f.seq), f.mn, f.mx
        FROM full_inst f ORDER BY f.mx - f.mn DESC, f.name, f.seq""")
    counts = run(traces, base + f"""
        SELECT (SELECT ranks FROM nr), (SELECT count(*) FROM full_inst), (SELECT count(*) FROM inst) - (SELECT count(*) FROM full_inst),
               {whole_graph_cols(traces)}""")
    ranks_with_comm, compared, skipped = (int(x or 0) for x in counts[0][:3])
    lasts = {}
    for name, seq, _, last, *_ in colls:
        lasts[last] = lasts.get(last, 0) + 1
    per_rank = run(traces, base + """
        SELECT rank, count(*), sum(wait_ns)::BIGINT FROM w GROUP BY rank""")
    by_rank = {u.rank: u for u in units}
    rank_rows = [RankWait(rank=r, trace=by_rank[r].trace.path.name, pid=by_rank[r].pid, collectives=int(n),
                          times_last=lasts.get(r, 0), last_pct_of_collectives=pct(lasts.get(r, 0), int(n)),
                          waited_ns=int(waited or 0))
                 for r, n, waited in per_rank]
    rank_rows.sort(key=lambda x: (-x.times_last, x.rank))
    if skipped:
        notes.append(f"{skipped} collective instances are missing on some rank (different counts of a kernel name per "
                     "rank: a capture cut mid-step, or ranks running different work) and were not compared")
    if not ranks_with_comm:
        notes.append("no rank has communication kernels (NCCL/RCCL, ...): there is no collective to compare; pass "
                     "comm_patterns when the library's kernels have other names")
    elif ranks_with_comm < len(units):
        notes.append(f"{len(units) - ranks_with_comm} of {len(units)} ranks ran no communication kernel and are not compared")
    whole = whole_graph_job_note(*counts[0][3:5], "non-communication work: collectives inside them are not compared")
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
        collectives_compared=compared, collectives_skipped=skipped, total_skew_ns=int(sum(c[4] for c in colls)) if colls else None,
        collectives=[CollectiveRow(name=c[0], seq=int(c[1]), ranks=int(c[2]), last_rank=int(c[3]), skew_ns=int(c[4]),
                                   median_wait_ns=float(c[5]), min_dur_ns=int(c[6]), max_dur_ns=int(c[7]))
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
    evidence = (f"rank {u.rank} arrived last at {row.times_last} of {compared} collectives (the shortest kernel each time: "
                f"the others were waiting for it) and itself waited {row.waited_ns:,} ns in total")
    if lead:
        evidence += (f"; its largest kernel is {lead[0]} ({int(lead[2]):,} ns over {int(lead[1])} launches, "
                     f"{pct(int(lead[2]), int(total))} % of its kernel time): compare with the same kernel on other ranks")
    return SlowestRank(rank=u.rank, trace=t.path.name, pid=u.pid, times_last=row.times_last, collectives=row.collectives,
                       top_kernels=[KernelTotal(name=n, count=int(c), total_ns=int(s), pct_of_rank_kernel_time=pct(int(s), int(total)))
                                    for n, c, s in top],
                       gpu_span_ns=span, gpu_busy_ns=busy, gpu_idle_ns=None if span is None else span - busy,
                       evidence=evidence)


