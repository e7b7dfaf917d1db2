"""marker_summary: annotation ranges (NVTX, rocTX, PyTorch record_function) by name, with the GPU work
they launched.

Per range name (+ domain): how often it ran and how long it took on the host (CPU duration statistics
as `nsys stats nvtx_sum`: total, avg, median, min, max, sample std-dev), where it sits in the nesting
(parent chain on its thread), and its GPU projection as Nsight's `nvtx_gpu_proj_trace` defines it: the
kernels/copies/sets whose launching API call lies inside one of the name's ranges on the same thread
(see projection.py). GPU figures are computed over the distinct ops of a name, so an op launched inside
nested ranges of the same name counts once; busy time is the interval union per device.

Not summarised: instant marks (counted only) and PyTorch's GPU-side copies of annotations
('gpu_annotation'), which are listed separately as a cross-check of the projection.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..model.errors import ProfileError
from ..model.trace import Trace, cursor_dicts
from .common import CONTAINS_SQL, Window, clip_name, contains_pattern, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .containment import temp_tables
from .intervals import unions, unions_on
from .projection import RANGE_KINDS, cross_thread, projection_absent_reason, tables, tree
from .requirements import require

SORT_KEYS = ("cpu_total", "gpu_busy", "gpu_work", "count")
ANNOTATE = ("Annotations come from the program: NVTX `torch.cuda.nvtx.range_push/range_pop` or `nvtx.annotate` (C++: "
            "nvtxRangePushA); PyTorch `with torch.profiler.record_function('name'):` (ProfilerStep#N comes from calling "
            "prof.step() each iteration); rocTX `roctxRangePush/Pop`.")


class DeviceProjection(BaseModel):
    device_id: int
    gpu_ops: int = Field(description="distinct GPU ops (kernels + copies + sets) projected onto this name on this device")
    gpu_kernels: int = Field(description="of gpu_ops, kernels")
    gpu_work_ns: int = Field(description="summed duration of those ops, ns (concurrent ops counted twice)")
    gpu_busy_ns: int = Field(description="union of those ops' intervals, ns (wall time with >= 1 of them running)")


class MarkerGroup(BaseModel):
    name: str = Field(description="range name (long names clipped)")
    domain: str = Field(description="NVTX domain ('' = default domain; rocTX and PyTorch have none)")
    kinds: list[str] = Field(description="range kinds seen: push_pop, start_end (NVTX/rocTX), annotation (PyTorch)")
    source: str = Field(description="'nvtx', 'roctx' or 'pytorch'")
    count: int = Field(description="number of ranges with this name")
    processes: int = Field(description="distinct processes the ranges ran in")
    threads: int = Field(description="distinct (process, thread) pairs the ranges started on")
    cpu_total_ns: int = Field(description="summed host duration of the ranges, ns (nested ranges of one name counted each)")
    cpu_avg_ns: float = Field(description="mean host duration, ns")
    cpu_median_ns: float = Field(description="median host duration, ns")
    cpu_min_ns: int
    cpu_max_ns: int
    cpu_std_ns: float | None = Field(description="sample standard deviation (n-1) of host durations, ns; null for one range")
    path: str = Field(description="most frequent nesting path: enclosing ranges on the same thread, outermost first, '/'-joined")
    paths: list[str] = Field(description="distinct nesting paths, most frequent first (at most 3), each with its count as 'path (n)'")
    min_depth: int = Field(description="smallest number of enclosing ranges (0 = a top-level range on its thread)")
    cross_thread_ranges: int = Field(description="start/end ranges that ended on another thread: summarised here, excluded from the GPU projection")
    gpu_ops: int | None = Field(description="distinct GPU ops launched inside these ranges on the same thread; null when the projection is absent")
    gpu_kernels: int | None = Field(description="of gpu_ops, kernels")
    gpu_work_ns: int | None = Field(description="summed duration of the projected ops, ns")
    gpu_busy_ns: int | None = Field(description="union of the projected ops' intervals per device, summed over devices, ns")
    pct_of_projected_busy: float | None = Field(
        description="gpu_busy_ns / busy time (union, per device, summed) of all GPU ops projected onto any range, %")
    ranges_with_gpu_ops: int | None = Field(description="ranges of this name that launched at least one GPU op")
    gpu_projected_avg_ns: float | None = Field(
        description="mean over ranges_with_gpu_ops of nsys's Projected Duration (last op end - first op start of one range), ns")
    gpu_first_start_ns: int | None = Field(description="start of the earliest projected op, ns")
    gpu_last_end_ns: int | None = Field(description="end of the latest projected op, ns")
    gpu_span_ns: int | None = Field(description="gpu_last_end_ns - gpu_first_start_ns over all ranges of the name, ns")
    per_device: list[DeviceProjection] | None = Field(None, description="breakdown when the projected ops ran on more than one device")


class GpuAnnotationGroup(BaseModel):
    name: str = Field(description="PyTorch gpu_user_annotation name (the GPU-side span of a record_function)")
    device_id: int
    count: int
    total_ns: int = Field(description="summed duration of the GPU-side annotation spans, ns")
    busy_ns: int = Field(description="union of those spans, ns")


class Projection(BaseModel):
    available: bool = Field(description="whether GPU figures could be computed")
    rule: str = Field(description="how GPU work is attributed to a range")
    reason: str | None = Field(None, description="why the projection is absent")
    excluded: list[str] = Field(default_factory=list, description="what the projection leaves out in this profile")
    projected_ops: int | None = Field(None, description="distinct GPU ops projected onto at least one selected range")
    projected_busy_ns: int | None = Field(None, description="their busy time (union per device, summed over devices), ns")


class MarkerSummaryResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | str | None]
    sort_by: str
    ranges: int = Field(description="ranges selected (after filters)")
    names: int = Field(description="distinct (name, domain) groups selected")
    instant_marks: int = Field(description="instant marks in the profile (not summarised: they have no duration)")
    projection: Projection
    markers: list[MarkerGroup] = Field(description="one row per (name, domain), sorted by sort_by")
    gpu_annotations: list[GpuAnnotationGroup] = Field(
        description="PyTorch's GPU-side annotation spans by name and device (a cross-check; empty for other formats)")
    truncated: bool = Field(description="true when more groups exist than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def marker_summary(
    trace: Trace,
    *,
    device: int | None = None,
    pid: int | None = None,
    name_contains: str | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    sort_by: Literal["cpu_total", "gpu_busy", "gpu_work", "count"] = "cpu_total",
    limit: int = 15,
) -> MarkerSummaryResult:
    if sort_by not in SORT_KEYS:
        raise ProfileError(f"sort_by must be one of {list(SORT_KEYS)}, not {sort_by!r}.")
    n_ranges = trace.memo(("marker_summary.n", ), lambda: int(trace.scalar(
        f"SELECT count(*) FROM markers WHERE kind IN ({', '.join(repr(k) for k in RANGE_KINDS)}) AND pid IS NOT NULL")))
    marks = int(trace.scalar("SELECT count(*) FROM markers WHERE kind = 'mark'"))
    if n_ranges == 0:
        require(trace, "marker_summary", (f"The profile holds {marks} instant marks, which have no duration to summarise. "
                                          if marks else "") + ANNOTATE)
    sel, window = resolve_selection(trace, device, None, start_ns, end_ns)
    limit = max(1, min(int(limit), 500))
    if pid is not None and not trace.scalar("SELECT count(*) FROM markers WHERE pid = ?", [pid]):
        known = [r[0] for r in trace.sql("SELECT DISTINCT pid FROM markers WHERE pid IS NOT NULL ORDER BY 1")]
        raise ProfileError(f"process {pid} has no annotation ranges; processes with ranges: {known}.")

    where, params = ["TRUE"], []
    if pid is not None:
        where.append("pid = ?")
        params.append(pid)
    if start_ns is not None:
        where.append("start_ns >= ?")
        params.append(start_ns)
    if end_ns is not None:
        where.append("start_ns < ?")
        params.append(end_ns)
    if name_contains:
        where.append(f"name {CONTAINS_SQL}")
        params.append(contains_pattern(name_contains))
    w = " AND ".join(where)
    absent = projection_absent_reason(trace)
    cur = trace.con.cursor()
    try:
        # the selected ranges and the projection's pairs as temp tables: the pairs' containment join is an IEJoin
        # (projection.tables), and every statement below reads them on this cursor
        with tables(cur, trace, ("rng", "gop", "prj") if absent is None else ("rng",)), temp_tables(
                cur, f"WITH sel AS (SELECT *, dense_rank() OVER (ORDER BY name, domain) AS gid FROM _proj_rng WHERE {w})",
                {"_ms_sel": "sel"}, params):
            groups, sel_rows, projection, gpu, per_dev = _summarise(trace, cur, device, absent)
    finally:
        cur.close()

    # sorted before the rows are made: a profile may hold tens of thousands of names, of which `limit` are shown
    has = absent is None
    empty = {"ops": 0, "kernels": 0, "work": 0, "busy": 0, "first": None, "last": None}
    key = {"cpu_total": lambda g: g["total"], "count": lambda g: g["n"],
           "gpu_busy": lambda g: gpu.get(g["gid"], empty)["busy"] if has else 0,
           "gpu_work": lambda g: gpu.get(g["gid"], empty)["work"] if has else 0}[sort_by]
    shown = sorted(groups, key=lambda g: (-key(g), -g["total"], clip_name(g["name"]), g["domain"]))[:limit]
    paths, depth = _paths(trace, sel_rows, [g["gid"] for g in shown])
    total_busy = projection.projected_busy_ns
    rows = []
    for g in shown:
        gid = g["gid"]
        ps = paths.get(gid, [])
        qq = gpu.get(gid, empty) if has else empty
        rows.append(MarkerGroup(
            name=clip_name(g["name"]), domain=g["domain"], kinds=list(g["kinds"]), source=g["source"], count=g["n"],
            processes=g["procs"], threads=g["threads"], cpu_total_ns=int(g["total"]), cpu_avg_ns=round(float(g["avg"]), 1),
            cpu_median_ns=round(float(g["med"]), 1), cpu_min_ns=int(g["mn"]), cpu_max_ns=int(g["mx"]),
            cpu_std_ns=None if g["std"] is None else round(float(g["std"]), 1),
            path=clip_name(ps[0][0], 300) if ps else g["name"], paths=[f"{clip_name(p, 300)} ({n})" for p, n in ps[:3]],
            min_depth=depth.get(gid, 0), cross_thread_ranges=int(g["xt"]),
            gpu_ops=qq["ops"] if has else None, gpu_kernels=qq["kernels"] if has else None,
            gpu_work_ns=qq["work"] if has else None, gpu_busy_ns=qq["busy"] if has else None,
            pct_of_projected_busy=pct(qq["busy"], total_busy) if has else None,
            ranges_with_gpu_ops=qq.get("ranges", 0) if has else None,
            gpu_projected_avg_ns=round(qq["avg_proj"], 1) if has and qq.get("avg_proj") is not None else None,
            gpu_first_start_ns=qq["first"], gpu_last_end_ns=qq["last"],
            gpu_span_ns=qq["last"] - qq["first"] if qq["first"] is not None else None,
            per_device=per_dev.get(gid) if len(per_dev.get(gid, [])) > 1 else None,
        ))
    truncated = len(groups) > limit
    hint = None
    if truncated:
        hint = f"{len(groups) - limit} more names exist than limit={limit}; raise limit (max 500) or filter with name_contains/pid/time window"
    if sort_by in ("gpu_busy", "gpu_work") and absent is not None:
        hint = ((hint + "; ") if hint else "") + f"sorted by CPU time instead: {absent}"
    return MarkerSummaryResult(
        data_issues=data_issue_notes(trace, ("markers", "kernels", "memops")),
        trace=str(trace.path), window=window,
        filters={"device": device, "pid": pid, "name_contains": name_contains}, sort_by=sort_by,
        ranges=sum(g["n"] for g in groups), names=len(groups), instant_marks=marks, projection=projection,
        markers=rows, gpu_annotations=_gpu_annotations(trace, sel.device, start_ns, end_ns, name_contains),
        truncated=truncated, hint=hint,
    )


def _summarise(trace: Trace, cur, device: int | None, absent: str | None) -> tuple:
    """(groups, (rid, gid) of every range, projection, GPU figures, per-device figures) of the ranges in temp table _ms_sel, with
    the projection's pairs in _proj_prj unless `absent` says why there is none; every statement runs on `cur`."""
    groups = cursor_dicts(cur, """
        SELECT gid, name, domain, list(DISTINCT kind ORDER BY kind) AS kinds, min(source) AS source, count(*) AS n,
               count(DISTINCT pid) AS procs, count(DISTINCT (pid, tid)) AS threads, sum(dur_ns)::BIGINT AS total,
               avg(dur_ns) AS avg, median(dur_ns) AS med, min(dur_ns) AS mn, max(dur_ns) AS mx,
               stddev_samp(dur_ns) AS std, sum(cross_thread::INT)::BIGINT AS xt
        FROM _ms_sel GROUP BY gid, name, domain ORDER BY gid""")
    if not groups:
        raise ProfileError("no annotation range matches the filters (pid/name_contains/time window: ranges must start "
                           "inside the window). Widen them; trace_info lists the capture span.")

    sel_rows = cur.execute("SELECT rid, gid FROM _ms_sel").fetchnumpy()

    dev_where, dev_params = ("TRUE", []) if device is None else ("p.device_id = ?", [device])
    gpu: dict[int, dict] = {}
    per_dev: dict[int, list[DeviceProjection]] = {}
    projection = Projection(available=absent is None, rule=(
        "a GPU op (kernel, memcpy, memset) belongs to a range when its launching API call (same process, same "
        "correlation id) lies inside the range on the same thread (Nsight nvtx_gpu_proj_trace); nested ranges all "
        "receive the op"), reason=absent)
    if absent is None:
        pairs = (f"SELECT DISTINCT s.gid, p.op_id, p.op, p.device_id, p.start_ns, p.end_ns, p.dur_ns "
                 f"FROM _ms_sel s JOIN _proj_prj p USING (rid) WHERE {dev_where}")
        agg = cursor_dicts(
            cur, f"""SELECT gid, device_id, count(*) AS ops, count(*) FILTER (WHERE op = 'kernel') AS kernels,
                       sum(dur_ns)::BIGINT AS work, min(start_ns) AS first, max(end_ns) AS last
                FROM ({pairs}) GROUP BY gid, device_id ORDER BY gid, device_id""", dev_params)
        busy = unions_on(cur, f"SELECT gid, device_id, start_ns, end_ns FROM ({pairs})", dev_params, ("gid", "device_id"))
        inst = cur.execute(
            f"""SELECT s.gid, count(*) AS ranges, avg(pe - ps) AS avg_proj FROM (
                    SELECT s.gid, s.rid, min(p.start_ns) AS ps, max(p.end_ns) AS pe
                    FROM _ms_sel s JOIN _proj_prj p USING (rid) WHERE {dev_where} GROUP BY s.gid, s.rid) s GROUP BY s.gid""",
            dev_params).fetchall()
        for r in agg:
            b = busy.get((r["gid"], r["device_id"]))
            g = gpu.setdefault(r["gid"], {"ops": 0, "kernels": 0, "work": 0, "busy": 0, "first": None, "last": None})
            g["ops"] += r["ops"]
            g["kernels"] += r["kernels"]
            g["work"] += int(r["work"])
            g["busy"] += b.busy_ns if b else 0
            g["first"] = r["first"] if g["first"] is None else min(g["first"], r["first"])
            g["last"] = r["last"] if g["last"] is None else max(g["last"], r["last"])
            per_dev.setdefault(r["gid"], []).append(DeviceProjection(
                device_id=r["device_id"], gpu_ops=r["ops"], gpu_kernels=r["kernels"], gpu_work_ns=int(r["work"]),
                gpu_busy_ns=b.busy_ns if b else 0))
        for gid, n, avg_proj in inst:
            gpu.setdefault(gid, {"ops": 0, "kernels": 0, "work": 0, "busy": 0, "first": None, "last": None})
            gpu[gid]["ranges"], gpu[gid]["avg_proj"] = int(n), float(avg_proj)
        all_pairs = (f"SELECT DISTINCT p.op_id, p.device_id, p.start_ns, p.end_ns "
                     f"FROM _ms_sel s JOIN _proj_prj p USING (rid) WHERE {dev_where}")
        total = unions_on(cur, f"SELECT device_id, start_ns, end_ns FROM ({all_pairs})", dev_params, ("device_id",))
        projection.projected_ops = int(cur.execute(f"SELECT count(*) FROM ({all_pairs})", dev_params).fetchone()[0])
        projection.projected_busy_ns = sum(u.busy_ns for u in total.values())
        projection.excluded = _excluded(trace, cur, device)
    else:
        projection.excluded = [absent]
    return groups, sel_rows, projection, gpu, per_dev


def _paths(trace: Trace, sel_rows: dict, gids: list[int]) -> tuple[dict, dict]:
    """Of the groups `gids`: their nesting paths with counts, most frequent first, and their least depth, from the
    shared range tree (`sel_rows`: rid and gid of every selected range)."""
    t = tree(trace)
    gid = np.asarray(sel_rows["gid"], dtype=np.int64)
    keep = np.isin(gid, np.asarray(gids, dtype=np.int64))
    idx = np.asarray(sel_rows["rid"], dtype=np.int64)[keep] - 1
    frame = pd.DataFrame({"gid": gid[keep], "path": t.path[idx], "depth": t.depth[idx]})
    path_counts = frame.groupby(["gid", "path"]).size().reset_index(name="n").sort_values(["gid", "n", "path"], ascending=[True, False, True])
    paths = {int(g): list(zip(d["path"], d["n"].astype(int))) for g, d in path_counts.groupby("gid")}
    depth = {int(g): int(v) for g, v in frame.groupby("gid")["depth"].min().items()}
    return paths, depth


def _excluded(trace: Trace, cur, device: int | None) -> list[str]:
    """Profile-wide statements of what no range receives (`cur` holds projection.tables' temp tables)."""
    dev = "" if device is None else f" AND device_id = {int(device)}"
    out = []
    un = trace.sql(f"""SELECT count(*), coalesce(sum(dur_ns), 0)::BIGINT FROM (
        SELECT dur_ns FROM kernels WHERE NOT launched{dev} UNION ALL SELECT dur_ns FROM memops WHERE NOT launched{dev})""")[0]
    if un[0]:
        out.append(f"{un[0]} GPU ops ({un[1]} ns) have no launching API call in the profile and cannot be projected")
    outside = cur.execute(f"""SELECT count(*), coalesce(sum(dur_ns), 0)::BIGINT FROM _proj_gop
        WHERE op_id NOT IN (SELECT op_id FROM _proj_prj){dev}""").fetchone()
    if outside[0]:
        out.append(f"{outside[0]} launched GPU ops ({outside[1]} ns) were launched outside every range of their launching "
                   "thread (e.g. by a thread without annotations)")
    xt = cross_thread(trace)
    if xt.keys:
        out.append(f"{len(xt.keys)} start/end ranges ended on another thread than they started: they are summarised on the "
                   "CPU side but excluded from the projection (as nsys does)")
    elif trace.format == "nsys":
        out.append(f"cross-thread start/end ranges: none found ({xt.note})")
    else:
        out.append(f"cross-thread start/end ranges: cannot occur or cannot be recognised here ({xt.note})")
    return out


def _gpu_annotations(trace: Trace, device: int | None, start_ns: int | None, end_ns: int | None,
                     name_contains: str | None) -> list[GpuAnnotationGroup]:
    if not trace.scalar("SELECT count(*) FROM markers WHERE kind = 'gpu_annotation'"):
        return []
    where, params = ["kind = 'gpu_annotation'", "device_id IS NOT NULL"], []
    for cond, val in (("device_id = ?", device), ("start_ns >= ?", start_ns), ("start_ns < ?", end_ns)):
        if val is not None:
            where.append(cond)
            params.append(val)
    if name_contains:
        where.append(f"name {CONTAINS_SQL}")
        params.append(contains_pattern(name_contains))
    src = f"SELECT dense_rank() OVER (ORDER BY name) AS gid, * FROM markers WHERE {' AND '.join(where)}"
    rows = trace.sql(f"SELECT gid, any_value(name), device_id, count(*), sum(dur_ns)::BIGINT FROM ({src}) GROUP BY gid, device_id "
                     "ORDER BY 5 DESC, 2, 3", params)
    busy = unions(trace, f"SELECT gid, device_id, start_ns, end_ns FROM ({src})", params, ("gid", "device_id"))
    return [GpuAnnotationGroup(name=clip_name(n), device_id=d, count=c, total_ns=int(s),
                               busy_ns=busy[(g, d)].busy_ns if (g, d) in busy else 0) for g, n, d, c, s in rows[:50]]
