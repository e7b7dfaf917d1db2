"""comm_summary: the communication kernels of each GPU — which collectives, how long, how much of it
hidden under computation, and what the profile says about message sizes and MPI calls.

Communication = kernels whose name matches the communication patterns (comm_patterns.py; the list is
returned so the caller knows what counted). Per device (and process when processes share a device):
summed time (work), wall time (interval union), overlap with computation |COMM ∩ COMP| and exposed
communication |COMM − COMP|, with COMP = non-communication kernels and memsets (gpu_timeline's
TraceLens definition). Unlinked communication kernels (no launch in the profile, e.g. RCCL on ROCm
Kineto traces) are included. Message sizes come from Kineto kernel args (NCCL kernels linked to
record_param_comms), else from `record_param_comms` CPU ops; NCCL/RCCL NVTX/rocTX ranges and Nsight
MPI tables (MPI_P2P_EVENTS, MPI_COLLECTIVES_EVENTS, MPI_START_WAIT_EVENTS, MPI_OTHER_EVENTS) are
summarised when present. Nsight exports with NCCL's NVTX payloads (nccl_calls) give message sizes per
communicator and the nccl-tests algorithm / bus bandwidth (nccl_bandwidth.py).
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from ..model.quote import quote_ident
from ..model.trace import Trace
from .comm_patterns import COLLECTIVES, collective_index_sql
from .comm_patterns import comm_patterns as active_patterns
from .common import ToolResult, WholeGraphTime, Window, clip_name, data_issue_notes, data_issues_field, pct, resolve_selection, whole_graph_time
from .gpu_timeline import COMM, split_measures, timeline_ops_sql
from .intervals import unions
from .nccl_bandwidth import TIME_NOTE, BandwidthGroup, bandwidth
from .requirements import require

# Bytes per element of the dtype names record_param_comms writes (c10 ScalarType names).
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1, "Byte": 1,
               "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
               "QInt8": 1, "QUInt8": 1, "QInt32": 4}
MPI_TABLES = (("MPI_P2P_EVENTS", "p2p"), ("MPI_COLLECTIVES_EVENTS", "collective"),
              ("MPI_START_WAIT_EVENTS", "start/wait"), ("MPI_OTHER_EVENTS", "other"))
COLLECTIVE_LABELS = [label for label, _ in COLLECTIVES] + ["Other"]


class DeviceComm(BaseModel):
    device_id: int
    device_name: str | None = None
    pid: int | None = Field(description="process owning the device's work")
    rank: int | None = None
    comm_kernels: int = Field(description="communication kernels (non-zero duration) in the selection")
    unlinked_comm_kernels: int = Field(description="of which have no launching host call in the profile")
    comm_summed_ns: int = Field(description="sum of communication kernel durations (work; concurrent ones counted twice), ns")
    comm_wall_ns: int = Field(description="|COMM|: union of communication kernel intervals, ns")
    gpu_span_ns: int = Field(description="first to last GPU op (any kind) of this device in the selection, ns")
    comm_wall_pct_of_gpu_span: float | None
    overlap_with_compute_ns: int = Field(description="|COMM ∩ COMP|: communication while computation (kernels, memsets) ran, ns")
    overlap_pct_of_comm_wall: float | None = Field(description="overlap_with_compute_ns / comm_wall_ns, % (HTA comp_comm_overlap_pctg)")
    exposed_comm_ns: int = Field(description="|COMM − COMP|: communication with no computation running, ns")
    exposed_comm_pct_of_comm_wall: float | None
    exposed_comm_pct_of_gpu_span: float | None


class CollectiveGroup(BaseModel):
    device_id: int
    pid: int | None
    collective: str = Field(description="collective type (AllReduce, AllGather, ..., 'Other' when unknown): of the operation "
                                        "the profile records for the kernels (kernels.collective) where it names one, else "
                                        "of the kernel name")
    count: int
    total_ns: int = Field(description="summed duration, ns")
    wall_ns: int = Field(description="union of these kernels' intervals, ns")
    avg_ns: float
    min_ns: int
    max_ns: int
    pct_of_device_comm_summed: float | None = Field(description="total_ns / comm_summed_ns of the device, %")


class KernelGroup(BaseModel):
    device_id: int
    pid: int | None
    name: str = Field(description="kernel base name (clipped)")
    collective: str = Field(description="collective type of the group's kernels (as CollectiveGroup.collective); where "
                                        "their recorded operations give several (ROCm's ncclDevKernel_Generic runs every "
                                        "collective), the type of the name")
    streams: list[int | None] = Field(description="streams the kernel ran on")
    count: int
    total_ns: int
    avg_ns: float
    min_ns: int
    max_ns: int
    pct_of_device_comm_summed: float | None


class MessageGroup(BaseModel):
    source: str = Field(description="'kernel args' (Kineto NCCL kernel args) or 'record_param_comms' (Kineto CPU ops)")
    device_id: int | None = Field(description="device of the kernels (null for record_param_comms: host-side)")
    collective_name: str | None = Field(description="PyTorch 'Collective name' (allreduce, broadcast, ...)")
    dtype: str | None
    group_size: int | None = Field(description="ranks in the process group")
    calls: int
    in_nelems_total: int | None = Field(description="summed 'In msg nelems' (elements)")
    out_nelems_total: int | None = Field(description="summed 'Out msg nelems' (elements)")
    in_bytes_total: int | None = Field(description="in elements × dtype size, bytes; null for an unknown dtype")
    out_bytes_total: int | None
    min_in_bytes: int | None = Field(description="smallest message (input), bytes")
    max_in_bytes: int | None = Field(description="largest message (input), bytes")
    comm_time_ns: int | None = Field(None, description="summed duration of the kernels carrying these args, ns (kernel args only)")


class RangeGroup(BaseModel):
    name: str = Field(description="NCCL/RCCL annotation range name (e.g. ncclAllReduce)")
    source: str
    count: int
    total_ns: int = Field(description="summed range duration (host side), ns")


class MpiGroup(BaseModel):
    name: str = Field(description="MPI call (StringIds text)")
    table: str = Field(description="p2p, collective, start/wait or other")
    ranks: int = Field(description="distinct MPI ranks (threads) issuing it")
    calls: int
    total_ns: int | None = Field(description="summed call duration (host side), ns; null when no call has an end time")
    max_ns: int | None = Field(description="longest call, ns; null when no call has an end time")
    bytes_total: int | None = Field(description="summed `size` (send bytes), bytes")
    recv_bytes_total: int | None = Field(description="summed `recvSize` (collectives), bytes")


class CommSummaryResult(ToolResult):
    trace: str
    window: Window
    comm_patterns: list[str] = Field(description="regexes (case-insensitive) over kernel names that counted as communication")
    matched: bool = Field(description="true when at least one kernel matched the patterns")
    message: str | None = Field(None, description="why a section is empty, when it is")
    devices: list[DeviceComm]
    collectives: list[CollectiveGroup]
    kernels: list[KernelGroup] = Field(description="per device, communication kernels by base name, largest total first")
    messages: list[MessageGroup]
    nccl_ranges: list[RangeGroup]
    bandwidth: list[BandwidthGroup] = Field(description="NCCL calls by process, collective, communicator and message size "
                                                        "with nccl-tests algbw/busbw (Nsight exports with NCCL payloads)")
    mpi: list[MpiGroup]
    notes: list[str] = Field(description="what the profile could not say (no message sizes, MPI tables unreadable, ...)")
    whole_graph: WholeGraphTime | None = Field(None, description="CUDA graph replays traced whole in the selection: "
                                               "communication inside them is not in these figures (counted as "
                                               "computation, the COMP of overlap and exposed time); null when there are none")
    truncated: bool = Field(description="true when kernels/messages/bandwidth/mpi rows were cut to `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def comm_summary(
    trace: Trace,
    *,
    device: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    limit: int = 15,
    comm_patterns: list[str] | None = None,
) -> CommSummaryResult:
    require(trace, "comm_summary")
    patterns = active_patterns(comm_patterns)
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 200))
    where, params = sel.where(time_mode="overlap")
    ops = timeline_ops_sql(trace, where, window.start_ns, window.end_ns, True, comm_patterns)
    p2 = params * 2
    coll = collective_index_sql("name")
    base = f"SELECT *, {coll} AS coll FROM ({ops}) WHERE cls = {COMM} AND end_ns > start_ns"
    dev_rows = {(r[0], r[1]): r[2:] for r in trace.sql(
        f"""SELECT device_id, owner, count(*), count(*) FILTER (WHERE NOT launched), sum(end_ns - start_ns)::BIGINT
            FROM ({base}) GROUP BY ALL""", p2)}
    # A device is reported when its communication time |COMM| is not 0, i.e. when it has a communication kernel of
    # non-zero duration in the selection (a row of dev_rows). Without any, the unions over every GPU op (most of the
    # first call's time) would give nothing to report: they are not computed.
    by_key, by_coll = {}, {}
    if dev_rows:
        by_key = split_measures(trace, f"SELECT device_id, owner, cls, start_ns, end_ns FROM ({ops})", p2, ("device_id", "owner"))
        by_coll = unions(trace, f"SELECT device_id, owner, coll, start_ns, end_ns FROM ({base})", p2, ("device_id", "owner", "coll"))
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    ranks = dict(trace.sql("SELECT pid, rank FROM processes WHERE rank IS NOT NULL"))
    devices, totals = [], {}
    for key in sorted(by_key, key=lambda k: tuple(-1 if v is None else v for v in k)):
        sp = by_key[key]
        if sp.comm_ns == 0:
            continue
        span, wall, overlap, exposed = sp.span_ns, sp.comm_ns, sp.comm_comp_overlap_ns, sp.exposed_comm_ns
        n, unl, summed = dev_rows.get(key, (0, 0, 0))
        totals[key] = int(summed)
        devices.append(DeviceComm(
            device_id=key[0], device_name=names.get(key[0]), pid=key[1], rank=ranks.get(key[1]),
            comm_kernels=int(n), unlinked_comm_kernels=int(unl), comm_summed_ns=int(summed), comm_wall_ns=wall,
            gpu_span_ns=span, comm_wall_pct_of_gpu_span=pct(wall, span), overlap_with_compute_ns=overlap,
            overlap_pct_of_comm_wall=pct(overlap, wall), exposed_comm_ns=exposed,
            exposed_comm_pct_of_comm_wall=pct(exposed, wall), exposed_comm_pct_of_gpu_span=pct(exposed, span)))
    matched = bool(devices)
    collectives, kernels, truncated = [], [], False
    if matched:
        for r in trace.sql_dicts(
                f"""SELECT device_id, owner, coll, count(*) AS n, sum(end_ns - start_ns)::BIGINT AS total,
                           avg(end_ns - start_ns) AS avg, min(end_ns - start_ns) AS mn, max(end_ns - start_ns) AS mx
                    FROM ({base}) GROUP BY ALL ORDER BY device_id, owner NULLS FIRST, total DESC, coll""", p2):
            key = (r["device_id"], r["owner"])
            u = by_coll.get((*key, r["coll"]))
            collectives.append(CollectiveGroup(
                device_id=key[0], pid=key[1], collective=COLLECTIVE_LABELS[r["coll"]], count=r["n"], total_ns=int(r["total"]),
                wall_ns=u.busy_ns if u else 0, avg_ns=round(float(r["avg"]), 1), min_ns=int(r["mn"]), max_ns=int(r["mx"]),
                pct_of_device_comm_summed=pct(r["total"], totals.get(key))))
        rows = trace.sql_dicts(
            f"""SELECT device_id, owner, short_name AS name,
                       CASE WHEN min(coll) = max(coll) THEN min(coll) ELSE min({collective_index_sql("name", "NULL")}) END AS coll,
                       list(DISTINCT stream_id ORDER BY stream_id) AS streams, count(*) AS n,
                       sum(end_ns - start_ns)::BIGINT AS total, avg(end_ns - start_ns) AS avg,
                       min(end_ns - start_ns) AS mn, max(end_ns - start_ns) AS mx,
                       row_number() OVER (PARTITION BY device_id, owner ORDER BY sum(end_ns - start_ns) DESC, short_name) AS rnk
                FROM ({base}) GROUP BY device_id, owner, short_name ORDER BY device_id, owner NULLS FIRST, rnk""", p2)
        truncated |= any(r["rnk"] > limit for r in rows)
        kernels = [KernelGroup(
            device_id=r["device_id"], pid=r["owner"], name=clip_name(r["name"]), collective=COLLECTIVE_LABELS[r["coll"]],
            streams=list(r["streams"]), count=r["n"], total_ns=int(r["total"]), avg_ns=round(float(r["avg"]), 1),
            min_ns=int(r["mn"]), max_ns=int(r["mx"]), pct_of_device_comm_summed=pct(r["total"], totals.get((r["device_id"], r["owner"]))))
            for r in rows if r["rnk"] <= limit]
    notes: list[str] = []
    messages = _messages(trace, sel, window, notes) if matched else []
    if len(messages) > limit:
        messages, truncated = messages[:limit], True
    ranges = _nccl_ranges(trace, window, limit)
    bw = bandwidth(trace, device, window.start_ns, window.end_ns)
    if bw:
        notes.append(TIME_NOTE)
    elif trace.format == "nsys":
        notes += [f"NCCL payloads: {v.split(': ', 1)[1]}" for (v,) in trace.sql(
            "SELECT value FROM trace_meta WHERE key = 'absent' AND value LIKE 'nccl_calls: %'")]
    if len(bw) > limit:
        bw, truncated = bw[:limit], True
    mpi = _mpi(trace, window, notes)
    if len(mpi) > limit:
        mpi, truncated = mpi[:limit], True
    whole = whole_graph_time(trace, where, params, "computation (the COMP of overlap_with_compute_ns and exposed_comm_ns), "
                             "never as communication", window.start_ns, window.end_ns)
    if whole:
        notes.append(whole.note)
    message = None
    if not matched:
        message = ("no kernel in the selection matched the communication patterns " + "; ".join(patterns)
                   + ". Pass comm_patterns=[...] (regexes over kernel names) if this profile's collectives use other names."
                   + (f" {whole.note}" if whole else ""))
    return CommSummaryResult(
        data_issues=data_issue_notes(trace, ("kernels", "cpu_ops", "markers", "nccl_calls")),
        trace=str(trace.path), window=window, comm_patterns=patterns, matched=matched, message=message, devices=devices,
        collectives=collectives, kernels=kernels, messages=messages, nccl_ranges=ranges, bandwidth=bw, mpi=mpi, notes=notes,
        whole_graph=whole, truncated=truncated, hint=f"rows beyond limit={limit} were cut; raise limit (max 200) or pass device=" if truncated else None,
    )


def _messages(trace: Trace, sel, window: Window, notes: list[str]) -> list[MessageGroup]:
    if trace.format != "kineto":
        if not trace.count("nccl_calls"):
            notes.append("message sizes: PyTorch (Kineto) traces carry them in record_param_comms args and Nsight exports in "
                         f"NCCL's NVTX payloads (see `bandwidth`); this {trace.format_name} has neither")
        return []
    fields = """json_extract_string(args, '$."Collective name"') AS cname, json_extract_string(args, '$.dtype') AS dtype,
                TRY_CAST(json_extract_string(args, '$."Group size"') AS INTEGER) AS gsize,
                TRY_CAST(json_extract_string(args, '$."In msg nelems"') AS BIGINT) AS inn,
                TRY_CAST(json_extract_string(args, '$."Out msg nelems"') AS BIGINT) AS outn"""
    dtype_map = "MAP {" + ", ".join(f"'{k}': {v}" for k, v in DTYPE_BYTES.items()) + "}"
    agg = f"""count(*) AS calls, sum(inn)::BIGINT AS inn, sum(outn)::BIGINT AS outn,
              sum(inn * {dtype_map}[dtype])::BIGINT AS inb, sum(outn * {dtype_map}[dtype])::BIGINT AS outb,
              min(inn * {dtype_map}[dtype])::BIGINT AS minb, max(inn * {dtype_map}[dtype])::BIGINT AS maxb"""
    where, params = sel.where("k", time_mode="start")
    try:
        rows = trace.sql_dicts(
            f"""WITH e AS (SELECT name, ts_ns, dur_ns, tid, {fields} FROM native.events
                           WHERE cat = 'kernel' AND args LIKE '%Collective name%'),
                 m AS (SELECT k.device_id, e.*, k.dur_ns AS kdur FROM e JOIN kernels k
                       ON k.name = e.name AND k.start_ns = e.ts_ns AND k.stream_id = e.tid AND {where})
                SELECT 'kernel args' AS source, device_id, cname, dtype, gsize, {agg}, sum(kdur)::BIGINT AS t
                FROM m GROUP BY ALL ORDER BY device_id, t DESC, cname, dtype, gsize""", params)
        if not rows:
            lo, hi = window.start_ns, window.end_ns
            rows = trace.sql_dicts(
                f"""SELECT 'record_param_comms' AS source, NULL AS device_id, cname, dtype, gsize, {agg}, NULL AS t
                    FROM (SELECT {fields} FROM cpu_ops WHERE name = 'record_param_comms' AND args LIKE '%Collective name%'
                          AND start_ns >= ? AND start_ns < ?)
                    GROUP BY ALL ORDER BY calls DESC, cname, dtype, gsize""", [lo, hi])
    except duckdb.Error as exc:
        notes.append(f"message sizes could not be read from the Kineto event args ({_first_line(exc)}); the other "
                     "sections are unaffected")
        return []
    if not rows:
        notes.append("message sizes: no kernel args or record_param_comms CPU op carries 'Collective name' in the selection "
                     "(older or sub-sampled traces omit them)")
    return [MessageGroup(source=r["source"], device_id=r["device_id"], collective_name=r["cname"], dtype=r["dtype"],
                         group_size=r["gsize"], calls=r["calls"], in_nelems_total=r["inn"], out_nelems_total=r["outn"],
                         in_bytes_total=r["inb"], out_bytes_total=r["outb"], min_in_bytes=r["minb"], max_in_bytes=r["maxb"],
                         comm_time_ns=None if r["t"] is None else int(r["t"])) for r in rows]


def _nccl_ranges(trace: Trace, window: Window, limit: int) -> list[RangeGroup]:
    rows = trace.sql(
        """SELECT name, source, count(*), sum(dur_ns)::BIGINT AS t FROM markers
           WHERE (domain ILIKE '%nccl%' OR domain ILIKE '%rccl%' OR regexp_matches(name, '^(nccl|rccl)', 'i'))
             AND start_ns >= ? AND start_ns < ? AND kind <> 'gpu_annotation'
           GROUP BY ALL ORDER BY t DESC, name LIMIT ?""", [window.start_ns, window.end_ns, limit])
    return [RangeGroup(name=clip_name(n), source=s, count=c, total_ns=int(t)) for n, s, c, t in rows]


def _mpi(trace: Trace, window: Window, notes: list[str]) -> list[MpiGroup]:
    if trace.format != "nsys":
        return []
    have = trace.native_tables()
    present = [(t, kind) for t, kind in MPI_TABLES if t in have]
    if not present:
        return []
    if "StringIds" not in have:
        notes.append("MPI tables are present but the export has no StringIds table; MPI call names unavailable")
        return []
    parts = []
    for table, kind in present:
        cols = trace.native_columns(table)
        size = "size" if "size" in cols else "NULL"
        recv = "recvSize" if "recvSize" in cols else "NULL"
        parts.append(f"""SELECT '{kind}' AS kind, textId, globalTid, start, "end", {size}::BIGINT AS size, {recv}::BIGINT AS recv
                         FROM native.{quote_ident(table)} WHERE start >= ? AND start < ?""")
    try:
        rows = trace.sql(
            f"""SELECT coalesce(s.value, 'StringIds ' || e.textId) AS name, kind, count(DISTINCT globalTid), count(*),
                       sum("end" - start)::BIGINT AS t, max("end" - start)::BIGINT, sum(size)::BIGINT, sum(recv)::BIGINT
                FROM ({' UNION ALL '.join(parts)}) e LEFT JOIN native."StringIds" s ON s.id = e.textId
                GROUP BY ALL ORDER BY t DESC, name""", [window.start_ns, window.end_ns] * len(parts))
    except duckdb.Error as exc:
        notes.append(f"MPI tables could not be read ({_first_line(exc)}); the other sections are unaffected. "
                     "The Nsight export may be from an older nsys version: re-export it with `nsys export --type sqlite`")
        return []
    return [MpiGroup(name=clip_name(r[0]), table=r[1], ranks=r[2], calls=r[3], total_ns=None if r[4] is None else int(r[4]),
                     max_ns=None if r[5] is None else int(r[5]),
                     bytes_total=r[6], recv_bytes_total=r[7]) for r in rows]


def _first_line(exc: Exception) -> str:
    """The database error's message without the echoed SQL that DuckDB appends on later lines."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
