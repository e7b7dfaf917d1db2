"""Bus bandwidth of NCCL calls from their NVTX payloads (nccl_calls; Nsight exports of NCCL 2.19+).

The nccl-tests convention (doc/PERFORMANCE.md, src/*.cu GetBw): algbw = S / t and busbw = algbw x factor,
where S is the operation's size in bytes and the factor depends on the collective and on n, the ranks in
the communicator. NCCL's payload size is count x type size, which is S itself except where `count` is per
rank (AllGather, ReduceScatter, AlltoAll, Gather, Scatter): there S = size x n. t is the GPU duration of the
one kernel launched inside the call's NVTX range; the range itself only times the host-side enqueue. n comes
from the payload of the communicator's init call (ncclCommInitRank*, ncclCommSplit, ncclCommDestroy), matched
on the communicator id; payloads without one (NCCL before 2.25) leave n unknown rather than guess among the
process's communicators. A figure whose inputs the profile lacks is null, with the reason.
"""

from __future__ import annotations

from fractions import Fraction

from pydantic import BaseModel, Field

from ..model.trace import Trace

# collective -> (S = message bytes x n?, busbw factor as a function of n (None: 1), the factor's formula)
FORMULAS = {
    "AllReduce": (False, lambda n: Fraction(2 * (n - 1), n), "2(n-1)/n"),
    "ReduceScatter": (True, lambda n: Fraction(n - 1, n), "(n-1)/n"),
    "AllGather": (True, lambda n: Fraction(n - 1, n), "(n-1)/n"),
    "AlltoAll": (True, lambda n: Fraction(n - 1, n), "(n-1)/n"),
    "Gather": (True, lambda n: Fraction(n - 1, n), "(n-1)/n"),
    "Scatter": (True, lambda n: Fraction(n - 1, n), "(n-1)/n"),
    "Broadcast": (False, None, "1"),
    "Reduce": (False, None, "1"),
    "Send": (False, None, "1"),
    "Recv": (False, None, "1"),
}
TIME_NOTE = ("bandwidth: t = GPU duration of the one kernel each NCCL call launched inside its NVTX range (the range "
             "itself times only the host-side enqueue); algbw_gb_per_s = alg_bytes_per_call x timed_calls / gpu_time_ns "
             "(10^9 bytes/s), busbw = algbw x busbw_factor (nccl-tests doc/PERFORMANCE.md); n from the communicator's "
             "init-call payload")


class BandwidthGroup(BaseModel):
    pid: int | None
    rank: int | None = Field(description="process rank when the profile states it")
    device_id: int | None = Field(description="device of the calls' kernels (null when no call launched one)")
    collective: str = Field(description="NCCL call without the 'nccl' prefix (AllReduce, AllGather, Send, ...)")
    comm_id: str | None = Field(description="NCCL communicator id (commHash) from the payload; null before NCCL 2.25")
    n_ranks: int | None = Field(description="ranks in the communicator, from its init-call payload; null when unknown")
    message_bytes: int = Field(description="NCCL payload 'Message size [bytes]' of each call (count x type size)")
    calls: int
    timed_calls: int = Field(description="calls that launched exactly one kernel inside their NVTX range")
    alg_bytes_per_call: int | None = Field(description="S: message_bytes, x n_ranks for AllGather/ReduceScatter/AlltoAll/"
                                                       "Gather/Scatter (per-rank counts), bytes")
    gpu_time_ns: int = Field(description="summed GPU duration of the timed calls' kernels, ns")
    avg_gpu_time_ns: float | None = Field(description="gpu_time_ns / timed_calls, ns")
    algbw_gb_per_s: float | None = Field(description="alg_bytes_per_call x timed_calls / gpu_time_ns, 10^9 bytes/s")
    busbw_factor: float | None = Field(description="nccl-tests bus factor for this collective and n_ranks")
    busbw_formula: str | None = Field(description="the factor's formula, e.g. '2(n-1)/n'")
    busbw_gb_per_s: float | None = Field(description="algbw_gb_per_s x busbw_factor, 10^9 bytes/s")
    missing: str | None = Field(None, description="why a bandwidth figure is null")


def bandwidth(trace: Trace, device: int | None, start_ns: int, end_ns: int) -> list[BandwidthGroup]:
    if trace.count("nccl_calls") == 0:
        return []
    dev = "AND c.device_id = ?" if device is not None else ""
    rows = trace.sql_dicts(f"""
        WITH comm_n AS (SELECT comm_id, min(nranks) AS n, count(DISTINCT nranks) AS k FROM nccl_calls
                        WHERE comm_id IS NOT NULL AND nranks IS NOT NULL GROUP BY comm_id)
        SELECT c.pid, min(c.device_id) AS device_id, regexp_replace(c.name, '^nccl', '') AS collective, c.comm_id,
               c.bytes, count(*) AS calls, count(c.kernel_end_ns) AS timed,
               coalesce(sum(c.kernel_end_ns - c.kernel_start_ns), 0)::BIGINT AS t,
               CASE WHEN min(cn.k) = 1 THEN min(cn.n) END AS n, min(cn.k) AS comm_sizes
        FROM nccl_calls c LEFT JOIN comm_n cn ON cn.comm_id = c.comm_id
        WHERE c.bytes IS NOT NULL AND c.start_ns >= ? AND c.start_ns < ? {dev}
        GROUP BY c.pid, collective, c.comm_id, c.bytes
        ORDER BY c.pid NULLS FIRST, t DESC, collective, c.comm_id, c.bytes""",
        [start_ns, end_ns] + ([device] if device is not None else []))
    ranks = dict(trace.sql("SELECT pid, rank FROM processes WHERE rank IS NOT NULL"))
    return [_group(r, ranks.get(r["pid"])) for r in rows]


def _group(r: dict, rank: int | None) -> BandwidthGroup:
    coll, n, timed, t = r["collective"], r["n"], r["timed"], int(r["t"])
    times_n, factor_of, formula = FORMULAS.get(coll, (None, None, None))
    why = []
    if coll not in FORMULAS:
        why.append(f"no nccl-tests bus-bandwidth formula for {coll}")
    needs_n = times_n or factor_of is not None
    if needs_n and n is None:
        why.append(_why_no_n(r))
    if not timed:
        why.append("no call launched exactly one kernel inside its NVTX range (grouped calls are launched by ncclGroupEnd "
                   "for the whole group; CUDA tracing off or CUDA-graph replays also leave none), so there is no GPU time")
    if timed and t <= 0:
        why.append("the calls' kernels have zero GPU duration")
    s = None if coll not in FORMULAS or (times_n and n is None) else r["bytes"] * (n if times_n else 1)
    alg = Fraction(s * timed, t) if s is not None and timed and t > 0 else None
    factor = (Fraction(1) if factor_of is None else (factor_of(n) if n else None)) if coll in FORMULAS else None
    bus = alg * factor if alg is not None and factor is not None else None
    return BandwidthGroup(
        pid=r["pid"], rank=rank, device_id=r["device_id"], collective=coll, comm_id=r["comm_id"], n_ranks=n,
        message_bytes=int(r["bytes"]), calls=r["calls"], timed_calls=timed, alg_bytes_per_call=s, gpu_time_ns=t,
        avg_gpu_time_ns=round(t / timed, 1) if timed else None, algbw_gb_per_s=_gb(alg),
        busbw_factor=None if factor is None else round(float(factor), 6), busbw_formula=formula, busbw_gb_per_s=_gb(bus),
        missing="; ".join(why) or None)


def _why_no_n(r: dict) -> str:
    if r["comm_id"] is None:
        return ("n unknown: the payload names no communicator (NCCL before 2.25), so no communicator-init payload "
                "can be tied to it")
    if r["comm_sizes"] and r["comm_sizes"] > 1:
        return f"n unknown: communicator {r['comm_id']}'s init payloads give different sizes"
    return (f"n unknown: no init payload for communicator {r['comm_id']} in the profile (it was created before the capture "
            "started, or NVTX was off then)")


def _gb(v: Fraction | None) -> float | None:
    return None if v is None else round(float(v), 3)  # bytes per ns = 10^9 bytes per s
