"""comm_job_summary: the communication of every rank of a job side by side — per rank and collective type the
kernels and their summed time, per collective the spread across ranks and the rank spending longest in it.

The job-wide counterpart of comm_summary (one profile). Ranks are rank_summary's (`_units` / `_number`: the rank
the profile states, else the lowest unused number in input order); the ops, their classes (COMP = non-communication
kernels and memsets, COMM = communication kernels by comm_patterns.py, MEMCPY = copies) and their owners are
rank_summary's, so the figures agree with it:
  per rank and collective type (comm_patterns.COLLECTIVES, of the recorded operation kernels.collective where it
      names one, else of the kernel name; 'Other' when unknown): communication kernels of non-zero
      duration, summed duration (work: concurrent kernels counted twice), shortest and longest kernel;
  per rank: communication wall time |COMM| (interval union) and exposed communication |COMM − COMP|
      = |COMM ∪ COMP| − |COMP| (stacked.union_measures_sql), summed over the rank's devices;
  per collective type across ranks: min / median / max of the ranks' summed time (a rank that never ran it counts
      0) and the ranks holding the min and the max. All ranks leave a collective together, so the rank that waits
      longest for the others has the largest time; the last to arrive (often the straggler) the smallest;
  per message group (collective, communicator, message size) across ranks, where the profiles record messages:
      calls and the same min / median / max of the per-rank summed GPU time. Two sources, as comm_summary reads them
      from one profile: Nsight exports with NCCL's NVTX payloads (the nccl_calls table: communicator id, 'Message
      size [bytes]', GPU time of the one kernel the call launched) and PyTorch (Kineto) NCCL kernels' args
      ('Process Group Name', 'In msg nelems' x dtype size, the kernel's duration). A group is owned by the rank that
      owns its kernel (as for the kernels), an uncalled-for payload without a kernel by its calling process.

However many ranks: a fixed number of SQL statements over all ranks' stores at once (stacked.py) — two for the
row counts and data issues (prime), two for the ranks, four for the figures. Python assembles one row per rank.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..model.trace import Trace
from .comm_patterns import COLLECTIVES, collective_index_sql, is_comm_sql
from .comm_patterns import comm_patterns as active_patterns
from .comm_summary import DTYPE_BYTES
from .common import ToolResult, data_issue_notes, data_issues_field, pct, whole_graph_job_note
from .gpu_timeline import COMM, COMP, MEMCPY, ROCM_COPY_KERNEL
from .owners import device_owner_sql, unowned_join, unowned_sql
from .rank_summary import job_ranks
from .stacked import run, stack, union_measures_sql, values, whole_graph_cols

MAX_LIMIT = 1024
LABELS = [label for label, _ in COLLECTIVES] + ["Other"]
# interval sets whose unions give |COMP|, |COMM| and |COMP ∪ COMM| (exposed comm = |COMP ∪ COMM| - |COMP|)
SETS = {0: (COMP,), 1: (COMM,), 2: (COMP, COMM)}


class RankCollective(BaseModel):
    collective: str = Field(description="collective type (AllReduce, AllGather, ..., 'Other'): of the operation the profile "
                                        "records for the kernel (kernels.collective) where it names one, else of the kernel name")
    count: int = Field(description="communication kernels of this type (non-zero duration)")
    total_ns: int = Field(description="summed kernel duration (work), ns")
    min_ns: int = Field(description="shortest kernel, ns")
    max_ns: int = Field(description="longest kernel, ns")
    pct_of_rank_comm_summed: float | None = Field(description="total_ns / the rank's comm_summed_ns, %")


class RankComm(BaseModel):
    rank: int
    rank_source: str = Field(description="'profile': the profile states the rank; 'input order': numbered in the order "
                                          "the profiles were given (as rank_summary)")
    trace: str = Field(description="profile file name")
    pid: int | None = Field(description="process id; null when the profile is taken whole")
    devices: list[int] = Field(description="GPUs this rank ran communication or compute on")
    comm_kernels: int = Field(description="communication kernels of non-zero duration")
    comm_summed_ns: int = Field(description="summed communication kernel duration (work), ns")
    comm_wall_ns: int = Field(description="|COMM|: union of communication kernel intervals, summed over devices, ns")
    compute_ns: int = Field(description="|COMP|: union of non-communication kernels and memsets, ns")
    exposed_comm_ns: int = Field(description="|COMM − COMP|: communication with no computation running, ns")
    exposed_comm_pct_of_comm_wall: float | None = Field(description="exposed_comm_ns / comm_wall_ns, %; null without "
                                                                    "communication")
    collectives: list[RankCollective] = Field(description="by collective type, largest total first; empty without "
                                                          "communication kernels")
    notes: list[str] = Field(default_factory=list)


class CollectiveSpread(BaseModel):
    collective: str = Field(description="collective type (AllReduce, ...)")
    ranks_with: int = Field(description="ranks that ran at least one kernel of this type")
    ranks_counted: int = Field(description="ranks the spread is over: every rank of the job (those without it count 0)")
    count: int = Field(description="kernels of this type over all ranks")
    total_ns: int = Field(description="summed duration over all ranks, ns")
    min_ns: int = Field(description="smallest per-rank summed duration, ns")
    median_ns: float = Field(description="median per-rank summed duration (mean of the two middle ranks for an even "
                                         "count), ns")
    max_ns: int = Field(description="largest per-rank summed duration, ns")
    min_rank: int = Field(description="rank with the smallest summed time (lowest rank on ties): the last to arrive "
                                      "waits least")
    max_rank: int = Field(description="rank with the largest summed time (lowest rank on ties): the slowest rank in "
                                      "this collective, most often the one waiting longest for the others")
    spread_pct_of_max: float | None = Field(description="(max_ns - min_ns) / max_ns, %")


class MessageSpread(BaseModel):
    source: str = Field(description="'nccl payloads' (Nsight: NCCL's NVTX payload; time = GPU duration of the one kernel "
                                    "the call launched) or 'kernel args' (PyTorch Kineto: the NCCL kernel's args and duration)")
    collective: str = Field(description="collective as the profile names it: the NCCL call without 'nccl' (AllReduce) or "
                                        "PyTorch's 'Collective name' (allreduce)")
    communicator: str | None = Field(description="NCCL communicator id (payload) or PyTorch process group name "
                                                 "('Process Group Name'); null when the profile does not record it")
    message_bytes: int | None = Field(description="bytes per call: payload 'Message size [bytes]', or 'In msg nelems' x "
                                                  "dtype size; null for an unknown dtype")
    ranks_with: int = Field(description="ranks with at least one call of this group")
    ranks_counted: int = Field(description="ranks the spread is over: every rank of the job (those without it count 0)")
    calls: int = Field(description="calls over all ranks")
    timed_calls: int = Field(description="calls with a GPU time (payloads: the call launched exactly one kernel)")
    total_ns: int = Field(description="summed GPU time over all ranks, ns")
    min_ns: int = Field(description="smallest per-rank summed GPU time, ns")
    median_ns: float = Field(description="median per-rank summed GPU time (mean of the two middle ranks for an even "
                                         "count), ns")
    max_ns: int = Field(description="largest per-rank summed GPU time, ns")
    min_rank: int = Field(description="rank with the smallest summed time (lowest rank on ties)")
    max_rank: int = Field(description="rank with the largest summed time (lowest rank on ties)")
    spread_pct_of_max: float | None = Field(description="(max_ns - min_ns) / max_ns, %")


class CommJobSummaryResult(ToolResult):
    traces: int = Field(description="profiles given")
    ranks_found: int = Field(description="ranks (processes) found in them")
    ranks_with_comm: int = Field(description="ranks with at least one communication kernel")
    comm_patterns: list[str] = Field(description="regexes (case-insensitive) over kernel names that counted as communication")
    definitions: str
    collectives: list[CollectiveSpread] = Field(description="per collective type across ranks, largest total first")
    messages: list[MessageSpread] = Field(description="per (source, collective, communicator, message size) across ranks, "
                                                      "largest total first; empty when no profile records messages")
    ranks: list[RankComm] = Field(description="one row per rank, by rank")
    notes: list[str]
    truncated: bool = Field(description="true when ranks were cut to `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


DEFINITIONS = (
    "Ranks and op classes as rank_summary: COMM = communication kernels (comm_patterns), COMP = other kernels + "
    "memsets. Per rank and collective type: kernels (non-zero duration) and summed duration (work). Per rank: "
    "comm_wall = |COMM| (interval union), exposed_comm = |COMM − COMP|, summed over its GPUs. Per collective type "
    "across all ranks (a rank without it counts 0): min / median / max of the per-rank summed time, min_rank / "
    "max_rank (lowest rank on ties). messages: the same spread per (collective, communicator, message size) from "
    "NCCL payloads (Nsight) or NCCL kernel args (Kineto). Ratios name their denominator in the field name."
)
# PyTorch's args of an NCCL kernel (Kineto) give its message size; its collective and process group (communicator)
# are the model's kernels.collective and kernels.communicator
KINETO_MESSAGE = """name, ts_ns, tid, json_extract_string(args, '$.dtype') AS dtype,
    TRY_CAST(json_extract_string(args, '$."In msg nelems"') AS BIGINT) AS inn"""


def comm_job_summary(traces: list[Trace], *, comm_patterns: list[str] | None = None, limit: int = 64) -> CommJobSummaryResult:
    limit = max(1, min(int(limit), MAX_LIMIT))
    patterns = active_patterns(comm_patterns)  # a bad user pattern is refused here, before any work
    notes: list[str] = []
    units = job_ranks(traces, notes)

    comm = is_comm_sql("name", comm_patterns)
    unit_rows = values([(u.order, u.pid, u.whole or u.pid is None, u.rank) for u in units],
                       ("BIGINT", "BIGINT", "BOOLEAN", "BIGINT"))
    ops = (stack(traces, "kernels", f"device_id, stream_id, pid, start_ns, end_ns, CASE WHEN {comm} THEN {COMM} "
                                    f"WHEN regexp_matches(name, '{ROCM_COPY_KERNEL}') THEN {MEMCPY} ELSE {COMP} END AS cls, "
                                    f"CASE WHEN {comm} THEN {collective_index_sql('name')} END AS coll")
           + " UNION ALL " + stack(traces, "memops", f"device_id, stream_id, pid, start_ns, end_ns, "
                                                     f"CASE WHEN op = 'copy' THEN {MEMCPY} ELSE {COMP} END, NULL::INTEGER"))
    # owners as rank_summary._device_figures (owners.py); a message has no stream: its process, else its device's only
    # one. A profile taken whole (one rank) owns everything.
    keys = "SELECT part, device_id, stream_id, pid FROM ops"
    base = f"""
        WITH units(part, pid, whole, rank) AS ({unit_rows}),
        ops AS ({ops}),
        unowned AS ({unowned_sql(keys)}),
        device_owners AS ({device_owner_sql(keys)}),
        iv AS (SELECT u.rank, ops.device_id, ops.cls, ops.coll, ops.start_ns, ops.end_ns
               FROM ops LEFT JOIN unowned ON {unowned_join('ops', 'unowned')} JOIN units u ON u.part = ops.part
                    AND (u.whole OR u.pid = coalesce(ops.pid, unowned.owner))),
        rc AS (SELECT rank, coll, count(*) AS n, sum(end_ns - start_ns)::BIGINT AS total,
                      min(end_ns - start_ns)::BIGINT AS mn, max(end_ns - start_ns)::BIGINT AS mx
               FROM iv WHERE cls = {COMM} AND end_ns > start_ns GROUP BY rank, coll)"""
    fig_rows = run(traces, base + f"""
        SELECT rank, sum(u0)::BIGINT, sum(u1)::BIGINT, sum(u2)::BIGINT, list(DISTINCT device_id ORDER BY device_id),
               {whole_graph_cols(traces)}
        FROM ({union_measures_sql('SELECT rank, device_id, cls, start_ns, end_ns FROM iv', 'rank, device_id', SETS)})
        GROUP BY rank""")
    figs = {int(r): (int(comp), int(cm), int(both), list(devs)) for r, comp, cm, both, devs, _, _ in fig_rows}
    per_rank: dict[int, list[tuple]] = {}
    for r, c, n, total, mn, mx in run(traces, base + " SELECT rank, coll, n, total, mn, mx FROM rc ORDER BY rank, total DESC, coll"):
        per_rank.setdefault(int(r), []).append((int(c), int(n), int(total), int(mn), int(mx)))
    spread = run(traces, base + """,
        ranks AS (SELECT DISTINCT rank FROM units),
        grid AS (SELECT ranks.rank, c.coll, coalesce(rc.n, 0) AS n, coalesce(rc.total, 0) AS total
                 FROM ranks CROSS JOIN (SELECT DISTINCT coll FROM rc) c LEFT JOIN rc USING (rank, coll)),
        agg AS (SELECT coll, count(*) FILTER (WHERE n > 0) AS ranks_with, count(*) AS ranks_counted, sum(n)::BIGINT AS n,
                       sum(total)::BIGINT AS total, min(total)::BIGINT AS mn, median(total)::DOUBLE AS med,
                       max(total)::BIGINT AS mx FROM grid GROUP BY coll)
        SELECT agg.*, (SELECT min(rank) FROM grid g WHERE g.coll = agg.coll AND g.total = agg.mn),
               (SELECT min(rank) FROM grid g WHERE g.coll = agg.coll AND g.total = agg.mx)
        FROM agg ORDER BY total DESC, coll""")
    messages = run(traces, base + f""",
        msgs AS ({_messages_sql(traces)}),
        m AS (SELECT u.rank, msgs.src, msgs.coll, msgs.comm, msgs.bytes, msgs.dur FROM msgs
              LEFT JOIN device_owners d ON d.part = msgs.part AND d.device_id = msgs.device_id
              JOIN units u ON u.part = msgs.part AND (u.whole OR u.pid = coalesce(msgs.pid, d.only_pid))),
        groups AS (SELECT row_number() OVER (ORDER BY src, coll, comm, bytes) AS g, * FROM (SELECT DISTINCT src, coll, comm, bytes FROM m)),
        rm AS (SELECT g, rank, count(*) AS n, count(dur) AS timed, coalesce(sum(dur), 0)::BIGINT AS total FROM m JOIN groups
               ON m.src = groups.src AND m.coll IS NOT DISTINCT FROM groups.coll AND m.comm IS NOT DISTINCT FROM groups.comm
                  AND m.bytes IS NOT DISTINCT FROM groups.bytes GROUP BY g, rank),
        grid AS (SELECT groups.g, ranks.rank, coalesce(rm.n, 0) AS n, coalesce(rm.timed, 0) AS timed, coalesce(rm.total, 0) AS total
                 FROM (SELECT DISTINCT rank FROM units) ranks CROSS JOIN groups LEFT JOIN rm USING (g, rank)),
        agg AS (SELECT g, count(*) FILTER (WHERE n > 0) AS ranks_with, count(*) AS ranks_counted, sum(n)::BIGINT AS n,
                       sum(timed)::BIGINT AS timed, sum(total)::BIGINT AS total, min(total)::BIGINT AS mn,
                       median(total)::DOUBLE AS med, max(total)::BIGINT AS mx FROM grid GROUP BY g)
        SELECT groups.src, groups.coll, groups.comm, groups.bytes, agg.ranks_with, agg.ranks_counted, agg.n, agg.timed,
               agg.total, agg.mn, agg.med, agg.mx,
               (SELECT min(rank) FROM grid WHERE grid.g = agg.g AND grid.total = agg.mn),
               (SELECT min(rank) FROM grid WHERE grid.g = agg.g AND grid.total = agg.mx)
        FROM agg JOIN groups USING (g) ORDER BY agg.total DESC, groups.src, groups.coll, groups.comm, groups.bytes""")

    rows: list[RankComm] = []
    for u in sorted(units, key=lambda x: x.rank):
        comp, wall, both, devs = figs.get(u.rank, (0, 0, 0, []))
        mine = per_rank.get(u.rank, [])
        summed = sum(m[2] for m in mine)
        row_notes = list(u.notes)
        if not mine:
            row_notes.append("no communication kernel on this rank: its communication figures are 0")
        exposed = both - comp
        rows.append(RankComm(
            rank=u.rank, rank_source=u.rank_source, trace=u.trace.path.name, pid=u.pid, devices=[int(d) for d in devs],
            comm_kernels=sum(m[1] for m in mine), comm_summed_ns=summed, comm_wall_ns=wall, compute_ns=comp,
            exposed_comm_ns=exposed, exposed_comm_pct_of_comm_wall=pct(exposed, wall),
            collectives=[RankCollective(collective=LABELS[c], count=n, total_ns=total, min_ns=mn, max_ns=mx,
                                        pct_of_rank_comm_summed=pct(total, summed)) for c, n, total, mn, mx in mine],
            notes=row_notes))
    collectives = [CollectiveSpread(
        collective=LABELS[int(c)], ranks_with=int(rw), ranks_counted=int(rn), count=int(n), total_ns=int(total),
        min_ns=int(mn), median_ns=float(med), max_ns=int(mx), min_rank=int(lo), max_rank=int(hi),
        spread_pct_of_max=pct(int(mx) - int(mn), int(mx))) for c, rw, rn, n, total, mn, med, mx, lo, hi in spread]
    message_rows = [MessageSpread(
        source=src, collective=coll or "unknown", communicator=comm, message_bytes=None if b is None else int(b),
        ranks_with=int(rw), ranks_counted=int(rn), calls=int(n), timed_calls=int(timed), total_ns=int(total),
        min_ns=int(mn), median_ns=float(med), max_ns=int(mx), min_rank=int(lo), max_rank=int(hi),
        spread_pct_of_max=pct(int(mx) - int(mn), int(mx)))
        for src, coll, comm, b, rw, rn, n, timed, total, mn, med, mx, lo, hi in messages]
    with_comm = sum(1 for r in rows if r.comm_kernels)
    if not with_comm:
        notes.append("no rank has communication kernels matching " + "; ".join(patterns) + ": pass comm_patterns when "
                     "the library's kernels have other names")
    elif with_comm < len(rows):
        notes.append(f"{len(rows) - with_comm} of {len(rows)} ranks ran no communication kernel: their rows are 0 and "
                     "they count 0 in the spread of each collective")
    whole = whole_graph_job_note(*(fig_rows[0][5:7] if fig_rows else (0, 0)),
                                 "computation (the compute of overlap and exposed figures), never as communication")
    if whole:
        notes.append(whole)
    if with_comm and not message_rows:
        notes.append("messages: no profile records message sizes (PyTorch traces keep them in NCCL kernel args, Nsight "
                     "exports in NCCL's NVTX payloads with `nsys export --include-blobs=true`, NCCL 2.19+)")
    truncated, hint = False, None
    if len(message_rows) > limit:
        truncated = True
        message_rows = message_rows[:limit]
        hint = f"only the {limit} message groups of most time are listed; raise limit (max {MAX_LIMIT}) for all."
    if len(rows) > limit:
        truncated = True
        keep: list[int] = []
        for rank in [x for c in collectives for x in (c.max_rank, c.min_rank)] + [r.rank for r in rows]:
            if rank not in keep and len(keep) < limit:
                keep.append(rank)
        rows = [r for r in rows if r.rank in keep]
        hint = (f"{len(units)} ranks; the table shows {len(rows)} (the ranks holding each collective's max and min, then "
                f"the lowest ranks). The collective spreads cover all ranks. Raise limit (max {MAX_LIMIT}) for all."
                + (" " + hint if hint else ""))
    return CommJobSummaryResult(
        traces=len(traces), ranks_found=len(units), ranks_with_comm=with_comm, comm_patterns=patterns,
        definitions=DEFINITIONS, collectives=collectives, messages=message_rows, ranks=rows, notes=notes, truncated=truncated, hint=hint,
        data_issues=[f"{t.path.name}: {note}" if len(traces) > 1 else note for t in traces
                     for note in data_issue_notes(t, ("kernels", "memops"))])


def _messages_sql(traces: list[Trace]) -> str:
    """(part, device_id, pid, src, coll, comm, bytes, dur) of every call whose message the profiles record: NCCL
    payloads (nccl_calls, every store; empty outside Nsight exports) and NCCL kernel args of the Kineto stores: the
    kernels' recorded collective and communicator, their message size from comm_args (the NCCL kernels'
    native.events rows, joined to their kernels as comm_summary does)."""
    dtype_map = "MAP {" + ", ".join(f"'{k}': {v}" for k, v in DTYPE_BYTES.items()) + "}"
    out = (f"""SELECT part, device_id, pid, 'nccl payloads' AS src, regexp_replace(name, '^nccl', '') AS coll,
                      comm_id AS comm, bytes, kernel_end_ns - kernel_start_ns AS dur
               FROM ({stack(traces, 'nccl_calls', 'device_id, pid, name, comm_id, bytes, kernel_start_ns, kernel_end_ns',
                            'bytes IS NOT NULL')})""")
    kineto = {i for i, t in enumerate(traces) if t.format == "kineto"}
    if kineto:
        events = stack(traces, "comm_args", KINETO_MESSAGE, only=kineto)  # the NCCL kernels' native.events rows
        kernels = stack(traces, "kernels", "device_id, pid, name, start_ns, end_ns, stream_id, collective, communicator",
                        "collective IS NOT NULL", only=kineto)
        out += f"""
            UNION ALL
            SELECT k.part, k.device_id, k.pid, 'kernel args', k.collective, k.communicator,
                   (e.inn * {dtype_map}[e.dtype])::BIGINT,
                   k.end_ns - k.start_ns
            FROM ({events}) e JOIN ({kernels}) k
              ON k.part = e.part AND k.name = e.name AND k.start_ns = e.ts_ns AND k.stream_id = e.tid"""
    return out
