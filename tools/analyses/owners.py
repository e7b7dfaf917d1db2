"""Which process a GPU op's figures count under, its owner: one rule for every tool that splits GPU work by process.

An op's owner is its own process (kernels.pid / memops.pid: the process that launched it). An op without one (an
unlinked op of a legacy RPD file, a Kineto file holding several processes) is owned by the only process among the
ops of its stream on its device, else by the only process among the ops of its device, else by nobody (NULL). So a
device one process uses is that process's, whole; on a device several processes share, each process owns its own
ops, and a stream only one of them uses owns its unattributed ops too.

The rule reads every op of a profile (of each part of a job), never a window or a filter's selection: a stream has
the same owner in gpu_timeline, stream_summary, comm_summary and the rank tools, whatever the question. Only the
streams holding ops without a process need a lookup (none, in most profiles): `unowned_sql` lists them with their
owner, and an op's owner is coalesce(pid, that owner).
"""

from __future__ import annotations

from ..model.trace import ROWS, Trace
from .stacked import sql_value

# Every GPU op's keys, of one profile (`part` 0, as stacked.stack gives a lone profile's rows).
PROFILE_OPS = ("SELECT 0 AS part, device_id, stream_id, pid FROM kernels "
               "UNION ALL SELECT 0 AS part, device_id, stream_id, pid FROM memops")


def unowned_sql(ops: str = PROFILE_OPS) -> str:
    """Per (part, device_id, stream_id) of `ops` (every op of each part) holding ops without a process: `owner`, the
    process those ops count under (NULL: none). min = max is one process: the stream's, else the device's."""
    return f"""
        WITH k AS (SELECT part, device_id, stream_id, min(pid) AS lo, max(pid) AS hi, bool_or(pid IS NULL) AS unowned
                   FROM ({ops}) GROUP BY ALL),
             d AS (SELECT part, device_id, min(lo) AS lo, max(hi) AS hi FROM k GROUP BY ALL)
        SELECT k.part, k.device_id, k.stream_id, CASE WHEN k.lo = k.hi THEN k.lo WHEN d.lo = d.hi THEN d.lo END AS owner
        FROM k JOIN d ON d.part = k.part AND d.device_id = k.device_id WHERE k.unowned"""


def device_owner_sql(ops: str) -> str:
    """Per (part, device_id) of `ops`: `only_pid`, the device's only process (NULL: none or several), the owner of
    what is known by device alone (a NCCL message: no stream) and has no process of its own."""
    return f"SELECT part, device_id, CASE WHEN min(pid) = max(pid) THEN min(pid) END AS only_pid FROM ({ops}) GROUP BY ALL"


def unowned_join(ops: str, unowned: str, part: bool = True) -> str:
    """The LEFT JOIN condition giving each row of `ops` its stream's row of `unowned` (unowned_sql); the owner is then
    coalesce(ops.pid, unowned.owner). Without `part`: rows of a lone profile."""
    return (f"{unowned}.part = {ops}.part AND " if part else "") + (
        f"{unowned}.device_id = {ops}.device_id AND {unowned}.stream_id IS NOT DISTINCT FROM {ops}.stream_id")


def profile_unowned(trace: Trace) -> dict[tuple, int | None]:
    """(device_id, stream_id) -> owner of the profile's streams that hold ops without a process (memoized in the store:
    one pass over every op, then a few rows)."""
    rows = trace.memo(("owners.unowned",), lambda: [list(r[1:]) for r in trace.sql(unowned_sql())], persist=ROWS)
    return {(d, s): o for d, s, o in rows}


def owner_of(unowned: dict[tuple, int | None], device_id: int, stream_id: int | None, pid: int | None) -> int | None:
    """The owner of an op of a lone profile, from its keys and profile_unowned."""
    return pid if pid is not None else unowned.get((device_id, stream_id))


def owner_sql(trace: Trace, ops: str) -> str:
    """SQL for the owner of each row of `ops` (device_id, stream_id, pid) of a lone profile: its pid where every op
    has one, else the lookup of its stream (integers gpuscope computed, written as SQL literals)."""
    unowned = profile_unowned(trace)
    if not unowned:
        return f"{ops}.pid"
    cases = " ".join(f"WHEN {ops}.device_id = {sql_value(d)} AND {ops}.stream_id IS NOT DISTINCT FROM {sql_value(s)} "
                     f"THEN {sql_value(o)}" for (d, s), o in sorted(unowned.items(), key=repr))
    return f"coalesce({ops}.pid, CASE {cases} END)"
