"""top_kernels: the kernels that take the GPU's time, per device.

Statistics follow nsys `cuda_gpu_kern_sum` (count, total, avg, median, min, max, sample std-dev)
with two shares named by their denominators: summed kernel time of the device (work, as nsys
reports it) and the device's kernel busy time (the union of kernel intervals, wall time).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, busy_sql, clip_name, pct, resolve_selection

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


class DeviceKernelTotals(BaseModel):
    device_id: int
    device_name: str | None
    kernel_count: int = Field(description="kernels in the selection on this device")
    kernel_names: int = Field(description="distinct groups (names) on this device")
    summed_kernel_time_ns: int = Field(description="sum of kernel durations (work; concurrent kernels counted twice), ns")
    kernel_busy_ns: int = Field(description="union of kernel intervals (wall time with >= 1 kernel running), ns")
    remainder_groups: int = Field(description="groups beyond the limit")
    remainder_count: int = Field(description="executions in the groups beyond the limit")
    remainder_total_ns: int = Field(description="summed duration of the groups beyond the limit, ns")


class TopKernelsResult(BaseModel):
    trace: str
    group_by: Literal["name", "short_name"]
    sort_by: str
    window: Window
    filters: dict[str, int | str | None]
    devices: list[DeviceKernelTotals]
    kernels: list[KernelGroup] = Field(description="top groups per device, sorted by sort_by")
    truncated: bool = Field(description="true when some device had more groups than `limit`")
    hint: str | None = None


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
    if trace.count("kernels") == 0:
        raise ProfileError(f"{trace.path.name} contains no kernels, so there is nothing to rank. trace_info says what the profile holds.")
    sel, window = resolve_selection(trace, device, stream, start_ns, end_ns)
    limit = max(1, min(int(limit), 200))
    where, params = sel.where("k")
    if name_contains:
        where += " AND (k.name ILIKE ? OR k.short_name ILIKE ?)"
        params += [f"%{name_contains}%"] * 2
    col = "name" if group_by == "name" else "short_name"
    order = SORT_COLUMNS[sort_by]
    rows = trace.sql_dicts(
        f"""
        WITH sel AS (SELECT * FROM kernels k WHERE {where}),
        g AS (
            SELECT device_id, {col} AS gname, any_value(short_name) AS short_name, count(*) AS count,
                   sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS avg_ns, median(dur_ns) AS median_ns,
                   min(dur_ns) AS min_ns, max(dur_ns) AS max_ns, stddev_samp(dur_ns) AS std_ns,
                   mode([grid_x, grid_y, grid_z]) AS grid, mode([block_x, block_y, block_z]) AS block,
                   mode(registers_per_thread) AS regs,
                   mode(coalesce(static_shared_bytes, 0) + coalesce(dynamic_shared_bytes, 0)) AS smem,
                   count(DISTINCT (grid_x, grid_y, grid_z, block_x, block_y, block_z)) AS configs
            FROM sel k GROUP BY device_id, {col}
        ),
        r AS (SELECT *, row_number() OVER (PARTITION BY device_id ORDER BY {order} DESC, count DESC, gname) AS rnk,
                     sum(total_ns) OVER (PARTITION BY device_id) AS dev_total FROM g)
        SELECT * FROM r ORDER BY device_id, rnk
        """,
        params,
    )
    if not rows:
        raise ProfileError("no kernel matches the filters (device/stream/name_contains/time window). Widen them; trace_info lists devices and spans.")
    busy_where, busy_params = sel.where("k")
    if name_contains:
        busy_where += " AND (k.name ILIKE ? OR k.short_name ILIKE ?)"
        busy_params += [f"%{name_contains}%"] * 2

    def busy_rows() -> dict:
        rows = trace.sql_dicts(busy_sql(f"SELECT device_id, start_ns, end_ns FROM kernels k WHERE {busy_where}", "device_id"), busy_params)
        return {r["device_id"]: r for r in rows}

    busy = trace.memo(("kernel_busy", busy_where, tuple(busy_params)), busy_rows)
    names = dict(trace.sql("SELECT device_id, name FROM devices"))
    groups, totals, truncated = [], [], False
    for dev in sorted({r["device_id"] for r in rows}):
        dev_rows = [r for r in rows if r["device_id"] == dev]
        shown, rest = dev_rows[:limit], dev_rows[limit:]
        truncated |= bool(rest)
        b = busy.get(dev, {})
        dev_total = int(dev_rows[0]["dev_total"])
        totals.append(DeviceKernelTotals(
            device_id=dev, device_name=names.get(dev), kernel_count=sum(r["count"] for r in dev_rows),
            kernel_names=len(dev_rows), summed_kernel_time_ns=dev_total, kernel_busy_ns=int(b.get("busy_ns") or 0),
            remainder_groups=len(rest), remainder_count=sum(r["count"] for r in rest),
            remainder_total_ns=sum(int(r["total_ns"]) for r in rest),
        ))
        for r in shown:
            groups.append(KernelGroup(
                device_id=dev, name=clip_name(r["gname"]),
                short_name=r["short_name"] if group_by == "name" else None,
                count=r["count"], total_ns=int(r["total_ns"]),
                pct_of_device_kernel_time=pct(r["total_ns"], dev_total),
                pct_of_device_busy_time=pct(r["total_ns"], b.get("busy_ns")),
                avg_ns=round(float(r["avg_ns"]), 1), median_ns=round(float(r["median_ns"]), 1),
                min_ns=int(r["min_ns"]), max_ns=int(r["max_ns"]),
                std_ns=None if r["std_ns"] is None else round(float(r["std_ns"]), 1),
                grid=_triple(r["grid"]), block=_triple(r["block"]), registers_per_thread=r["regs"],
                shared_mem_bytes=None if r["smem"] is None else int(r["smem"]), launch_configs=int(r["configs"]),
            ))
    return TopKernelsResult(
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
