"""top_kernels: the kernels that take the GPU's time, per device.

Statistics follow nsys `cuda_gpu_kern_sum` (count, total, avg, median, min, max, sample std-dev)
with two shares named by their denominators: summed kernel time of the device (work, as nsys
reports it) and the device's kernel busy time (the union of kernel intervals, wall time).
Graph replays (graph_summary.py's definition: a graph id, or launched by a cudaGraphLaunch/hipGraphLaunch call)
are counted per group and device (in_graph_count, graph_ns); null when the profile holds no graph replay.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import ROWS, Trace
from .graph_summary import GRAPH_KERNELS_CTE, graph_kernel_count
from .common import CONTAINS_SQL, Window, clip_name, contains_pattern, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .intervals import busy_ns
from .requirements import require

SORT_COLUMNS = {"total": "total_ns", "count": "count", "avg": "avg_ns", "max": "max_ns"}


class KernelGroup(BaseModel):
    device_id: int = Field(description="GPU the kernels ran on")
    name: str = Field(description="kernel name (grouping key; long names clipped, sql_query has them whole)")
    short_name: str | None = Field(None, description="base name, when grouping by full name")
    count: int = Field(description="number of executions")
    total_ns: int = Field(description="summed duration, ns")
    pct_of_device_kernel_time: float | None = Field(description="total_ns / summed kernel time of this device in the selection, %")
    pct_of_device_busy_time: float | None = Field(description="total_ns / kernel busy time (interval union) of this device, %; >100 possible with concurrent kernels")
    avg_ns: float = Field(description="mean duration, ns")
    median_ns: float = Field(description="median duration, ns")
    min_ns: int
    max_ns: int
    std_ns: float | None = Field(description="sample standard deviation (n-1), ns; null for a single execution")
    grid: list[int] | None = Field(None, description="most frequent grid [x,y,z] (blocks)")
    block: list[int] | None = Field(None, description="most frequent block [x,y,z] (threads)")
    registers_per_thread: int | None = None
    shared_mem_bytes: int | None = Field(None, description="static + dynamic shared memory per block, bytes (most frequent)")
    launch_configs: int = Field(description="distinct (grid, block) configurations seen")
    in_graph_count: int | None = Field(None, description="executions that ran inside CUDA/HIP graph replays (graph_summary); "
                                       "null when the profile holds no graph replay")
    graph_ns: int | None = Field(None, description="summed duration of those executions, ns (part of total_ns)")


class DeviceKernelTotals(BaseModel):
    device_id: int
    device_name: str | None
    kernel_count: int = Field(description="kernels in the selection on this device")
    kernel_names: int = Field(description="distinct groups (names) on this device")
    summed_kernel_time_ns: int = Field(description="sum of kernel durations (work; concurrent kernels counted twice), ns")
    kernel_busy_ns: int = Field(description="union of kernel intervals (wall time with >= 1 kernel running), ns; "
                                "0 when every selected kernel of the device has zero length (pct_of_device_busy_time is then null)")
    remainder_groups: int = Field(description="groups beyond the limit")
    remainder_count: int = Field(description="executions in the groups beyond the limit")
    remainder_total_ns: int = Field(description="summed duration of the groups beyond the limit, ns")
    graph_kernels: int | None = Field(None, description="kernels of the selection that ran in graph replays; null when the "
                                      "profile holds no graph replay (graph_summary says why)")
    graph_kernel_time_ns: int | None = Field(None, description="their summed duration (part of summed_kernel_time_ns), ns")


class TopKernelsResult(ToolResult):
    trace: str
    group_by: Literal["name", "short_name"]
    sort_by: str
    window: Window
    filters: dict[str, int | str | None]
    devices: list[DeviceKernelTotals]
    kernels: list[KernelGroup] = Field(description="top groups per device, sorted by sort_by")
    truncated: bool = Field(description="true when some device had more groups than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def top_kernels(
    trace: Trace,
    *,
    device: int | None = None,
    stream: int | None = None,
    name_contains: str | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    group_by: Literal["name", "short_name"] = "short_name",
    sort_by: Literal["total", "count", "avg", "max"] = "total",
    limit: int = 15,
) -> TopKernelsResult:
    # A large export opened for the first time is answered from a preview while its store builds (model/trace.py).
    # (A device filter is checked against memory operations too, which the preview leaves out.) The preview reads
    # what this question reads: full names for grouping by them or filtering on them, streams for a stream filter.
    if device is None:
        trace = trace.preview(names=group_by == "name" or bool(name_contains), streams=stream is not None)
    require(trace, "top_kernels")
    sel, window = resolve_selection(trace, device, stream, start_ns, end_ns)
    limit = max(1, min(int(limit), 200))
    where, params = sel.where("k")
    if name_contains:
        where += f" AND (k.name {CONTAINS_SQL} OR k.short_name {CONTAINS_SQL})"
        params += [contains_pattern(name_contains)] * 2
    col = "name" if group_by == "name" else "short_name"
    order = SORT_COLUMNS[sort_by]
    # Launch configurations are counted per (group, configuration) first: the most frequent one (ties
    # to the larger value, so every format agrees) and the number of distinct ones then come from a
    # small table instead of mode() over every kernel. Grouping on the scalar columns and building the
    # [x, y, z] lists from the few groups afterwards is the same grouping at a fraction of the cost.
    # `sel` is read twice: without a name filter, scanning the table twice is cheaper than
    # materializing the selection (~40%); an ILIKE filter is worth evaluating only once.
    materialized = "MATERIALIZED" if name_contains else "NOT MATERIALIZED"
    # Graph replays are marked only where the profile has any: other profiles pay nothing for the join.
    graphs = graph_kernel_count(trace) > 0
    if graphs:
        sel_sql = (f"{GRAPH_KERNELS_CTE}, sel AS {materialized} (SELECT k.*, gk.kid IS NOT NULL AS in_graph FROM kernels k "
                   f"LEFT JOIN graph_kids gk ON gk.kid = k.rowid WHERE {where})")
        graph_cols = ("count(*) FILTER (WHERE in_graph) AS in_graph_count, "
                      "coalesce(sum(dur_ns) FILTER (WHERE in_graph), 0)::BIGINT AS graph_ns")
    else:
        sel_sql = f"sel AS {materialized} (SELECT * FROM kernels k WHERE {where})"
        graph_cols = "NULL AS in_graph_count, NULL AS graph_ns"
    query = f"""
        WITH {sel_sql},
        g AS (
            SELECT device_id, {col} AS gname, any_value(short_name) AS short_name, count(*) AS count,
                   sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS avg_ns, median(dur_ns) AS median_ns,
                   min(dur_ns) AS min_ns, max(dur_ns) AS max_ns, stddev_samp(dur_ns) AS std_ns, {graph_cols}
            FROM sel GROUP BY device_id, {col}
        ),
        cfg AS (
            SELECT device_id, gname, [grid_x, grid_y, grid_z] AS grid, [block_x, block_y, block_z] AS block, regs, smem, n
            FROM (SELECT device_id, {col} AS gname, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                         registers_per_thread AS regs, coalesce(static_shared_bytes, 0) + coalesce(dynamic_shared_bytes, 0) AS smem,
                         count(*) AS n
                  FROM sel GROUP BY ALL)
        ),
        c AS (
            SELECT device_id, gname, arg_max(grid, (n, grid, block)) AS grid, arg_max(block, (n, grid, block)) AS block,
                   count(DISTINCT (grid, block)) AS configs
            FROM cfg GROUP BY device_id, gname
        ),
        regs AS (SELECT device_id, gname, arg_max(regs, (n, regs)) AS regs
                 FROM (SELECT device_id, gname, regs, sum(n) AS n FROM cfg GROUP BY ALL) GROUP BY device_id, gname),
        smem AS (SELECT device_id, gname, arg_max(smem, (n, smem)) AS smem
                 FROM (SELECT device_id, gname, smem, sum(n) AS n FROM cfg GROUP BY ALL) GROUP BY device_id, gname),
        r AS (SELECT g.*, c.grid, c.block, c.configs, regs.regs, smem.smem,
                     row_number() OVER (PARTITION BY g.device_id ORDER BY {order} DESC, count DESC, g.gname) AS rnk,
                     sum(total_ns) OVER (PARTITION BY g.device_id) AS dev_total
              FROM g JOIN c USING (device_id, gname) JOIN regs USING (device_id, gname) JOIN smem USING (device_id, gname))
        SELECT * FROM r ORDER BY device_id, rnk
        """
    # The profile never changes once open: a repeated question is answered from memory, or from the store when
    # another process asked it before.
    rows = trace.memo(("top_kernels", query, tuple(params)), lambda: trace.sql_dicts(query, params), persist=ROWS)
    if not rows:
        raise ProfileError("no kernel matches the filters (device/stream/name_contains/time window). Widen them; trace_info lists devices and spans.")
    busy = {k[0]: b for k, b in busy_ns(trace, f"SELECT device_id, start_ns, end_ns FROM kernels k WHERE {where}",
                                         params, ("device_id",)).items()}
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    groups, totals, truncated = [], [], False
    for dev in sorted({r["device_id"] for r in rows}):
        dev_rows = [r for r in rows if r["device_id"] == dev]
        shown, rest = dev_rows[:limit], dev_rows[limit:]
        truncated |= bool(rest)
        # The device has selected kernels (it has rows), so no union means they all have zero length:
        # a measured 0 ns of busy time, not absent data.
        b = busy.get(dev, 0)
        dev_total = int(dev_rows[0]["dev_total"])
        totals.append(DeviceKernelTotals(
            device_id=dev, device_name=names.get(dev), kernel_count=sum(r["count"] for r in dev_rows),
            kernel_names=len(dev_rows), summed_kernel_time_ns=dev_total, kernel_busy_ns=b,
            remainder_groups=len(rest), remainder_count=sum(r["count"] for r in rest),
            remainder_total_ns=sum(int(r["total_ns"]) for r in rest),
            graph_kernels=sum(r["in_graph_count"] for r in dev_rows) if graphs else None,
            graph_kernel_time_ns=sum(int(r["graph_ns"]) for r in dev_rows) if graphs else None,
        ))
        for r in shown:
            groups.append(KernelGroup(
                device_id=dev, name=clip_name(r["gname"]),
                short_name=r["short_name"] if group_by == "name" else None,
                count=r["count"], total_ns=int(r["total_ns"]),
                pct_of_device_kernel_time=pct(r["total_ns"], dev_total),
                pct_of_device_busy_time=pct(r["total_ns"], b or None),
                avg_ns=round(float(r["avg_ns"]), 1), median_ns=round(float(r["median_ns"]), 1),
                min_ns=int(r["min_ns"]), max_ns=int(r["max_ns"]),
                std_ns=None if r["std_ns"] is None else round(float(r["std_ns"]), 1),
                grid=_triple(r["grid"]), block=_triple(r["block"]), registers_per_thread=r["regs"],
                shared_mem_bytes=None if r["smem"] is None else int(r["smem"]), launch_configs=int(r["configs"]),
                in_graph_count=None if r["in_graph_count"] is None else int(r["in_graph_count"]),
                graph_ns=None if r["graph_ns"] is None else int(r["graph_ns"]),
            ))
    return TopKernelsResult(
        data_issues=data_issue_notes(trace, ("kernels",)),
        trace=str(trace.path), group_by=group_by, sort_by=sort_by, window=window,
        filters={"device": device, "stream": stream, "name_contains": name_contains},
        devices=totals, kernels=groups, truncated=truncated,
        hint=(f"more groups exist than limit={limit}; raise limit (max 200) or filter by device/stream/name_contains"
              if truncated else None),
    )


def _triple(value) -> list[int] | None:
    if value is None or any(v is None for v in value):
        return None
    return [int(v) for v in value]
