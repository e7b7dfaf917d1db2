"""memcpy_summary: memory copies and sets per device — direction, memory kinds, bytes, time, bandwidth.

Groups are (device, op, direction, source memory kind, destination memory kind, link). For each:
count, bytes, summed time (work: concurrent copies counted twice) and wall time (union of the
group's intervals), and achieved bandwidth both ways — bytes / wall and bytes / summed time.
Units: 1 GB = 10^9 bytes, so GB/s = bytes per ns.

Each group is compared with the link its bytes cross, never with another one (PerfAdvisor compares
PCIe copies with HBM bandwidth and reports ~1 % for a PCIe-bound transfer):
  * host link (HtoD, DtoH, HtoH, HtoA, AtoH): the PCIe / C2C bandwidth per direction. No profile format
    states it: `host_link_gb_per_s` from the caller, else the datasheet figure of the GPU model the
    device's name matches (tools/hardware/peaks.json `host_link_gb_per_s_per_direction`), else absent
    with the reason (unknown GPU, or a model whose table figure is null);
  * peer link (PtoP, or a DtoD copy whose source and destination devices differ): `peer_link_gb_per_s`
    from the caller, else the datasheet `peer_link_gb_per_s_per_direction` when every GPU the group's
    copies connect matches the same model (a link between two different models is in no datasheet),
    else absent with the reason;
  * device memory (DtoD/AtoA/AtoD/DtoA on one device, memsets): the device's DRAM bandwidth
    (devices.memory_bandwidth_bytes_per_s) when the profile states it. A device-to-device copy reads
    and writes every byte, so its DRAM traffic is 2 x bytes; a memset writes once (1 x bytes).
`pct_of_reference_bandwidth` = traffic bytes / wall time / reference bandwidth; `reference_source` says
where the reference comes from ('caller', 'datasheet: <model key> ...', 'profile'). A datasheet link is
the GPU's own link: the slot or platform may be slower (a Gen5 GPU in a Gen4 slot, x8 lanes wired, a C2C
link on GH200, peers without the NVLink bridge), and the notes say so per device.

Copies from or to pageable host memory are flagged: the driver stages them through a pinned buffer,
so they run slower and block the issuing host thread (even the *Async variants). Where the profile
does not record the host memory kind (rocpd; ROCm Kineto writes 'Host') that is said, not guessed.

Overlap with computation: per device, the wall time of copies (and of sets) that coincides with
kernel execution on the same device (interval intersection, any stream) and the exposed rest.

Selection: ops *starting* in [start_ns, end_ns) are counted whole (bytes cannot be split); the
stream filter selects copies/sets, while the kernel time they overlap is the whole device's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..hardware import peaks_for_device
from ..hardware.peaks import DevicePeaks, default_table
from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import Window, data_issue_notes, data_issues_field, pct, resolve_selection, ToolResult
from .intervals import Union, overlaps, unions
from .requirements import require

UNITS = "1 GB = 10^9 bytes; GB/s = bytes per ns; times in ns on the profile timeline"

HOST_KINDS = ("HtoD", "DtoH", "HtoH", "HtoA", "AtoH")
DEVICE_KINDS = ("DtoD", "AtoA", "AtoD", "DtoA")
# Which memory kinds of a copy lie on the host side (src, dst), per direction.
HOST_SIDE = {"HtoD": (True, False), "HtoA": (True, False), "DtoH": (False, True), "AtoH": (False, True), "HtoH": (True, True)}
KNOWN_HOST_KINDS = ("Pageable", "Pinned", "Managed", "Managed Static")

LINK_SQL = f"""CASE WHEN op = 'set' THEN 'device_memory'
    WHEN kind = 'PtoP' OR (src_device_id IS NOT NULL AND dst_device_id IS NOT NULL AND src_device_id <> dst_device_id) THEN 'peer'
    WHEN kind IN {HOST_KINDS} THEN 'host'
    WHEN kind IN {DEVICE_KINDS} THEN 'device_memory'
    ELSE 'unknown' END"""
GROUP_COLS = "device_id, op, kind, src_kind, dst_kind, link"
GROUP_RANK = "dense_rank() OVER (ORDER BY device_id, op, kind, src_kind NULLS FIRST, dst_kind NULLS FIRST, link)"


class MemGroup(BaseModel):
    device_id: int = Field(description="GPU whose engine executed the operations")
    op: str = Field(description="'copy' or 'set'")
    direction: str = Field(description="copies: HtoD, DtoH, DtoD, PtoP, HtoH, ... ; sets: 'memset'")
    src_kind: str | None = Field(description="source memory kind (Pageable, Pinned, Device, Managed, ...); null when the profile does not say")
    dst_kind: str | None = Field(description="destination memory kind (for sets: the memory set); null when the profile does not say")
    link: str = Field(description="what the bytes cross: 'host' (PCIe/C2C), 'peer' (GPU to GPU), 'device_memory' (DRAM of this GPU), 'unknown'")
    count: int = Field(description="operations")
    zero_duration_count: int = Field(description="operations of zero recorded duration (counted in count and bytes, not in time)")
    bytes: int | None = Field(description="bytes moved or set (sum); null when no operation states its size")
    bytes_unknown_count: int = Field(description="operations without a byte count; bandwidths are null when > 0")
    work_ns: int = Field(description="summed durations, ns (concurrent operations counted twice)")
    wall_ns: int = Field(description="union of the group's intervals (wall time with >= 1 of them running), ns")
    gb_per_s_over_wall: float | None = Field(description="bytes / wall_ns, GB/s (10^9 B/s); the group's achieved throughput")
    gb_per_s_over_work: float | None = Field(description="bytes / work_ns, GB/s: mean per-operation bandwidth")
    avg_bytes: float | None = Field(description="bytes / count")
    overlapped_by_kernels_ns: int = Field(description="part of wall_ns during which a kernel ran on the same device (any stream), ns")
    exposed_ns: int = Field(description="wall_ns - overlapped_by_kernels_ns, ns")
    pageable: bool = Field(description="source or destination is pageable host memory (host-blocking, staged, slower)")
    host_kind_known: bool | None = Field(description="for host-link copies: whether the profile records the host memory kind (pinned/pageable/managed); null for other links")
    reference: str | None = Field(description="the bandwidth this group is compared with, or null")
    reference_gb_per_s: float | None = Field(description="reference bandwidth, GB/s; null when unknown (see reference_note)")
    reference_source: str | None = Field(None, description="where reference_gb_per_s comes from: 'caller' (host_link_gb_per_s / "
                                         "peer_link_gb_per_s), 'datasheet: <model key> host_link|peer_link <link> (<document>)' "
                                         "(the matched GPU model's own link; the slot may be slower, see notes), "
                                         "'profile: devices.memory_bandwidth_bytes_per_s'; null with no reference")
    traffic_factor: int | None = Field(description="bytes of link/DRAM traffic per byte copied: 2 for a same-device DtoD copy (read + write), 1 otherwise")
    pct_of_reference_bandwidth: float | None = Field(description="traffic_factor * bytes / wall_ns / reference_gb_per_s, %")
    reference_note: str | None = Field(None, description="why there is no reference, when there is none")


class Transfer(BaseModel):
    device_id: int
    stream_id: int | None
    op: str = Field(description="'copy' or 'set'")
    direction: str
    src_kind: str | None
    dst_kind: str | None
    link: str
    start_ns: int = Field(description="GPU start, ns")
    dur_ns: int = Field(description="duration, ns")
    bytes: int | None
    gb_per_s: float | None = Field(description="bytes / dur_ns, GB/s; null for zero duration or unknown size")
    pageable: bool
    api_call: str | None = Field(description="the host API call that issued it (same process and correlation id), when linked")
    pid: int | None
    tid: int | None = Field(description="issuing thread, when linked")


class DeviceMemTotals(BaseModel):
    device_id: int
    device_name: str | None
    memory_bandwidth_gb_per_s: float | None = Field(description="peak DRAM bandwidth stated by the profile, GB/s; null when it states none")
    memory_bandwidth_note: str | None = Field(None, description="why memory_bandwidth_gb_per_s is null")
    kernel_busy_ns: int = Field(description="union of all kernel intervals on this device (any stream, whole profile), ns")
    copy_count: int
    copy_bytes: int | None = Field(description="bytes copied; null when no copy states its size")
    copy_work_ns: int = Field(description="summed copy durations, ns")
    copy_wall_ns: int = Field(description="union of copy intervals (wall time with >= 1 copy running), ns")
    copy_overlapped_by_kernels_ns: int = Field(description="copy wall time during which a kernel ran on this device, ns")
    copy_exposed_ns: int = Field(description="copy_wall_ns - copy_overlapped_by_kernels_ns: copy time not hidden behind computation, ns")
    copy_overlap_pct_of_copy_wall: float | None = Field(description="copy_overlapped_by_kernels_ns / copy_wall_ns, %")
    set_count: int
    set_bytes: int | None
    set_work_ns: int
    set_wall_ns: int
    set_overlapped_by_kernels_ns: int
    set_exposed_ns: int
    pageable_copy_count: int = Field(description="copies from/to pageable host memory")
    pageable_copy_bytes: int | None
    pageable_copy_work_ns: int = Field(description="summed duration of pageable copies, ns")
    host_kind_unknown_copy_count: int = Field(description="host-link copies whose host memory kind the profile does not record")
    remainder_groups: int = Field(description="groups of this device beyond the limit")


class MemcpySummaryResult(ToolResult):
    trace: str
    window: Window
    filters: dict[str, int | float | str | None]
    units: str = Field(description="unit conventions")
    selection: str = Field(description="which operations were counted")
    devices: list[DeviceMemTotals]
    groups: list[MemGroup] = Field(description="per device, groups by wall time (desc)")
    largest: list[Transfer] = Field(description="the largest single operations (by largest_by)")
    notes: list[str] = Field(description="findings and caveats: pageable copies, unknown links, missing sizes")
    truncated: bool = Field(description="true when some device had more groups than `limit`")
    hint: str | None = None
    data_issues: list[str] = data_issues_field()


def memcpy_summary(
    trace: Trace,
    *,
    device: int | None = None,
    stream: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    host_link_gb_per_s: float | None = None,
    peer_link_gb_per_s: float | None = None,
    top: int = 10,
    largest_by: Literal["bytes", "time"] = "bytes",
    limit: int = 50,
) -> MemcpySummaryResult:
    require(trace, "memcpy_summary")
    for name, value in (("host_link_gb_per_s", host_link_gb_per_s), ("peer_link_gb_per_s", peer_link_gb_per_s)):
        if value is not None and not value > 0:
            raise ProfileError(f"{name} must be a positive bandwidth in GB/s (10^9 B/s), e.g. 25 for a PCIe 4.0 x16 link; got {value}.")
    if largest_by not in ("bytes", "time"):
        raise ProfileError(f"largest_by must be 'bytes' or 'time', not {largest_by!r}.")
    sel, window = resolve_selection(trace, device, stream, start_ns, end_ns)
    top = max(0, min(int(top), 100))
    limit = max(1, min(int(limit), 200))
    where, params = sel.where()
    base = f"SELECT *, {LINK_SQL} AS link FROM memops WHERE {where}"
    groups_sql = f"""
        SELECT {GROUP_RANK} AS grp, {GROUP_COLS}, count AS n, zero, bytes, bytes_unknown, work_ns
        FROM (SELECT {GROUP_COLS}, count(*) AS count, count(*) FILTER (WHERE dur_ns = 0) AS zero,
                     sum(bytes)::BIGINT AS bytes, count(*) FILTER (WHERE bytes IS NULL) AS bytes_unknown,
                     sum(dur_ns)::BIGINT AS work_ns
              FROM ({base}) GROUP BY ALL)"""
    rows = trace.memo(("memcpy_summary.groups", groups_sql, tuple(params)), lambda: trace.sql_dicts(groups_sql, params))
    if not rows:
        raise ProfileError("no memory copy or set matches the filters (device/stream/time window: operations starting in it). "
                           "Widen them; trace_info lists devices and spans.")
    # Wall time per group and per (device, op); kernel wall time per device (whole profile, any stream).
    grp_sql = f"SELECT {GROUP_RANK} AS grp, device_id, start_ns, end_ns FROM ({base})"
    grp_u = unions(trace, grp_sql, params, ("grp",))
    op_sql = f"SELECT device_id, (op = 'set')::INTEGER AS is_set, start_ns, end_ns FROM memops WHERE {where}"
    op_u = unions(trace, op_sql,
                  params, ("device_id", "is_set"))
    devs = sorted({r["device_id"] for r in rows})
    kernels = "SELECT device_id, start_ns, end_ns FROM kernels"
    kern_u = {k[0]: u for k, u in unions(trace, kernels, [], ("device_id",)).items()}
    # time under a kernel of the same device (any stream), per group and per (device, copy/set)
    grp_ov = {k[0]: v for k, v in overlaps(trace, grp_sql, params, ("grp", "device_id"), kernels, [], ("device_id",)).items()}
    op_ov = overlaps(trace, op_sql, params, ("device_id", "is_set"), kernels, [], ("device_id",))
    dev_info = {r["device_id"]: r for r in trace.sql_dicts("SELECT device_id, name, memory_bandwidth_bytes_per_s FROM devices")}
    bw_absent = [v for (v,) in trace.sql("SELECT value FROM trace_meta WHERE key = 'absent' AND value ILIKE '%bandwidth%'")]
    notes: list[str] = []
    models: dict[int, tuple[DevicePeaks | None, str | None]] = {}
    model_of = lambda d: _device_model(trace, d, dev_info, models)  # noqa: E731
    peer_ends = _peer_endpoints(trace, base, params) if any(r["link"] == "peer" for r in rows) else {}

    groups: list[MemGroup] = []
    totals: list[DeviceMemTotals] = []
    truncated = False
    for dev in devs:
        info = dev_info.get(dev, {})
        mem_bw = info.get("memory_bandwidth_bytes_per_s") or None
        mem_note = None if mem_bw else (bw_absent[0] if bw_absent else "the profile states no DRAM bandwidth for this device")
        k = kern_u.get(dev)
        dev_groups = []
        for r in (r for r in rows if r["device_id"] == dev):
            ref = _reference(r, model_of, peer_ends.get(r["grp"]), mem_bw, mem_note, host_link_gb_per_s, peer_link_gb_per_s)
            dev_groups.append(_group(r, grp_u.get((r["grp"],)), grp_ov.get(r["grp"], 0), ref))
        dev_groups.sort(key=lambda g: (-g.wall_ns, -g.work_ns, g.op, g.direction, g.src_kind or "", g.dst_kind or "", g.link))
        truncated |= len(dev_groups) > limit
        groups += dev_groups[:limit]
        copies = [g for g in dev_groups if g.op == "copy"]
        sets = [g for g in dev_groups if g.op == "set"]
        cu, su = op_u.get((dev, 0)), op_u.get((dev, 1))
        c_wall, c_ov = (cu.busy_ns, op_ov.get((dev, 0), 0)) if cu else (0, 0)
        s_wall, s_ov = (su.busy_ns, op_ov.get((dev, 1), 0)) if su else (0, 0)
        pageable = [g for g in copies if g.pageable]
        unknown_host = [g for g in copies if g.host_kind_known is False]
        totals.append(DeviceMemTotals(
            device_id=dev, device_name=info.get("name"),
            memory_bandwidth_gb_per_s=None if not mem_bw else mem_bw / 1e9, memory_bandwidth_note=mem_note,
            kernel_busy_ns=k.busy_ns if k else 0,
            copy_count=sum(g.count for g in copies), copy_bytes=_sum_bytes(copies), copy_work_ns=sum(g.work_ns for g in copies),
            copy_wall_ns=c_wall, copy_overlapped_by_kernels_ns=c_ov, copy_exposed_ns=c_wall - c_ov,
            copy_overlap_pct_of_copy_wall=pct(c_ov, c_wall),
            set_count=sum(g.count for g in sets), set_bytes=_sum_bytes(sets), set_work_ns=sum(g.work_ns for g in sets),
            set_wall_ns=s_wall, set_overlapped_by_kernels_ns=s_ov, set_exposed_ns=s_wall - s_ov,
            pageable_copy_count=sum(g.count for g in pageable), pageable_copy_bytes=_sum_bytes(pageable),
            pageable_copy_work_ns=sum(g.work_ns for g in pageable),
            host_kind_unknown_copy_count=sum(g.count for g in unknown_host),
            remainder_groups=max(0, len(dev_groups) - limit),
        ))
        if pageable:
            notes.append(
                f"device {dev}: {sum(g.count for g in pageable)} copies ({_fmt_bytes(_sum_bytes(pageable))}, "
                f"{sum(g.work_ns for g in pageable)} ns summed) use pageable host memory: the driver stages them through a "
                "pinned buffer and the issuing thread blocks until they finish, even for *Async calls. Pin the host buffers "
                "(cudaHostAlloc/hipHostMalloc, DataLoader pin_memory=True, tensor.pin_memory()) to overlap and speed them up.")
        if unknown_host:
            notes.append(f"device {dev}: {sum(g.count for g in unknown_host)} host-link copies do not record whether host "
                         "memory was pinned or pageable (the profile format does not say); pageable copies cannot be ruled out.")
        unknown_bytes = sum(g.bytes_unknown_count for g in dev_groups)
        if unknown_bytes:
            notes.append(f"device {dev}: {unknown_bytes} operations state no byte count; their groups have no bandwidth.")
        notes += _link_notes(dev, dev_groups, model_of(dev)[0])
        for g in dev_groups:
            if (g.pct_of_reference_bandwidth or 0) > 100:
                notes.append(f"device {dev}: {g.op} {g.direction} runs at {g.pct_of_reference_bandwidth} % of its reference "
                             f"({g.reference}): faster than that bandwidth allows, so either the reference does not fit this system or "
                             "the recorded durations are too short (a clock or capture artefact); do not read it as a measured rate.")
    largest = _largest(trace, base, params, top, largest_by) if top else []
    return MemcpySummaryResult(
        data_issues=data_issue_notes(trace, ("memops", "kernels", "api_calls")),
        trace=str(trace.path), window=window,
        filters={"device": device, "stream": stream, "host_link_gb_per_s": host_link_gb_per_s,
                 "peer_link_gb_per_s": peer_link_gb_per_s, "largest_by": largest_by},
        units=UNITS,
        selection="memory copies and sets starting in the window, counted whole; overlap is measured against all kernels of the same device",
        devices=totals, groups=groups, largest=largest, notes=notes, truncated=truncated,
        hint=f"more groups than limit={limit} on some device; raise limit (max 200) or filter by device/stream" if truncated else None,
    )


# What a group is compared with: (traffic factor, description, GB/s, source, reason when absent).
Ref = tuple[int | None, str | None, float | None, str | None, str | None]
HOST_HINT = ("pass host_link_gb_per_s (per direction; raw PCIe Gen4 x16 = 32, Gen5 x16 = 64 GB/s, PCI-SIG "
             "base specification, as in tools/hardware/peaks.json)")
PEER_HINT = "pass peer_link_gb_per_s (per direction)"
LINKS = {"host": ("host_link", "host_link_gb_per_s_per_direction", HOST_HINT),
         "peer": ("peer_link", "peer_link_gb_per_s_per_direction", PEER_HINT)}


def _device_model(trace: Trace, dev: int, dev_info: dict, cache: dict) -> tuple[DevicePeaks | None, str | None]:
    """The datasheet model `dev` matches (tools/hardware peaks, user config included), or None and why."""
    if dev not in cache:
        pk, why = None, None
        try:
            pk = peaks_for_device(trace, dev)
        except ProfileError as err:  # a broken user peaks config: say so, the copies are still summarised
            why = f"the GPU peaks table cannot be loaded ({err})"
        if pk is None and why is None:
            name = dev_info.get(dev, {}).get("name")
            why = (f"device {dev} is not in the profile's device list" if dev not in dev_info else
                   f"device {dev} ({name!r}) matches no GPU model of the datasheet table (tools/hardware/peaks.json)")
        cache[dev] = (pk, why)
    return cache[dev]


def _datasheet_ref(pk: DevicePeaks, link: str) -> Ref:
    attr, field, hint = LINKS[link]
    pv = pk.get(field)
    text = getattr(pk.entry, attr) or ("link named differently by the candidates" if pk.confidence == "ambiguous" else "link not named")
    model = pk.entry.key + ("" if pk.confidence == "exact" else f" (match {pk.confidence})")
    desc = f"{link} link per direction (datasheet {pk.entry.key}: {text})"
    if pv is None or pv.value is None:
        why = f"the datasheet of {model} states no {attr} bandwidth ({text}" + (f": {pv.note}" if pv and pv.note else "") + ")"
        return 1, desc, None, None, f"{why}; {hint}"
    return 1, desc, float(pv.value), f"datasheet: {model} {attr} {text} ({pv.source or 'source not stated'})", None


def _reference(r: dict, model_of, ends: dict | None, mem_bw: int | None, mem_note: str | None,
               host_bw: float | None, peer_bw: float | None) -> Ref:
    link = r["link"]
    if link == "host":
        if host_bw:
            return 1, "host link (PCIe/C2C) per direction, caller-supplied", host_bw, "caller", None
        pk, why = model_of(r["device_id"])
        if pk is None:
            return 1, "host link (PCIe/C2C) per direction", None, None, \
                f"no profile format records the host link and {why}; {HOST_HINT}"
        return _datasheet_ref(pk, "host")
    if link == "peer":
        if peer_bw:
            return 1, "peer link (NVLink/xGMI/PCIe) per direction, caller-supplied", peer_bw, "caller", None
        desc = "peer link (NVLink/xGMI/PCIe) per direction"
        if ends is None or ends["unknown"]:
            return 1, desc, None, None, f"the profile does not record which GPUs these peer copies connect; {PEER_HINT}"
        devs = sorted({r["device_id"], *ends["devices"]})
        found = {d: model_of(d) for d in devs}
        missing = [why for pk, why in found.values() if pk is None]
        if missing:
            return 1, desc, None, None, f"{missing[0]}; {PEER_HINT}"
        keys = {d: pk.entry.key for d, (pk, _) in found.items()}
        if len(set(keys.values())) > 1:
            pairs = ", ".join(f"{d}: {k}" for d, k in keys.items())
            return 1, desc, None, None, (f"the copies connect different GPU models ({pairs}): no datasheet states a link "
                                         f"between them; {PEER_HINT}")
        return _datasheet_ref(found[r["device_id"]][0], "peer")
    if link == "device_memory":
        factor = 1 if r["op"] == "set" else 2
        desc = "device DRAM bandwidth (profile), " + ("write traffic = bytes" if factor == 1 else "read + write traffic = 2 x bytes")
        if mem_bw:
            return factor, desc, mem_bw / 1e9, "profile: devices.memory_bandwidth_bytes_per_s", None
        return factor, desc, None, None, mem_note
    return None, None, None, None, "copy direction unknown: no link to compare with"


def _peer_endpoints(trace: Trace, base: str, params: list) -> dict[int, dict]:
    """Per peer group: the devices its copies connect, and how many copies do not record them."""
    query = f"""
        SELECT grp, count(*) FILTER (WHERE src_device_id IS NULL OR dst_device_id IS NULL) AS unknown,
               list(DISTINCT src_device_id) FILTER (WHERE src_device_id IS NOT NULL) AS srcs,
               list(DISTINCT dst_device_id) FILTER (WHERE dst_device_id IS NOT NULL) AS dsts
        FROM (SELECT {GROUP_RANK} AS grp, link, src_device_id, dst_device_id FROM ({base})) WHERE link = 'peer' GROUP BY grp"""
    return {r["grp"]: {"unknown": r["unknown"], "devices": {int(d) for d in (r["srcs"] or []) + (r["dsts"] or [])}}
            for r in trace.sql_dicts(query, params)}


def _link_notes(dev: int, groups: list[MemGroup], pk: DevicePeaks | None) -> list[str]:
    """Per device: the caveat of a datasheet link reference, or why host/peer copies have none."""
    out = []
    for link in ("host", "peer"):
        mine = [g for g in groups if g.link == link]
        used = [g for g in mine if (g.reference_source or "").startswith("datasheet:")]
        if used and pk is not None:
            attr, field, _ = LINKS[link]
            pv = pk.get(field)
            how = f"{used[0].reference_gb_per_s:g} GB/s per direction" + (f" = {pv.derived}" if pv and pv.derived else "")
            table = f" Table note: {pv.note}." if pv and pv.note else ""
            if pk.confidence == "ambiguous":  # the agreed entry drops the candidates' own notes (e.g. a shared link)
                cands = [(c, default_table().entries.get(c)) for c in pk.match.candidates]
                cnotes = [f"{c}: {e.get(field).note}" for c, e in cands if e and e.get(field) and e.get(field).note]
                table = f" Table notes: {'; '.join(cnotes)}." if cnotes else ""
            part = (f" The device is a {' / '.join(pk.match.flags)} of the model: the link is shared." if pk.match.flags else "")
            param = "host_link_gb_per_s" if link == "host" else "peer_link_gb_per_s"
            why = ("the real slot may be slower" if link == "host" else "the real path may be slower")
            what = ("the GPU's slot or platform may be slower (a Gen5 GPU in a Gen4 slot, fewer lanes wired, a C2C link on "
                    "GH200)" if link == "host" else
                    "copies between GPUs that are not directly linked (no bridge installed, other topology) go over PCIe or "
                    "the host")
            out.append(f"device {dev}: {link}-link % uses a datasheet peak; {why}: {used[0].reference_source.split(' ')[1]} "
                       f"{getattr(pk.entry, attr) or 'link'}, "
                       f"{how}.{table} {what[0].upper() + what[1:]}; then a low % reflects the link, not the copy. "
                       f"Pass {param} to use the real link.{part}")
        absent = [g for g in mine if g.reference_gb_per_s is None]
        if absent:
            out.append(f"device {dev}: {sum(g.count for g in absent)} {link}-link copies have no reference bandwidth: "
                       f"{absent[0].reference_note}." + (" They are never compared with DRAM bandwidth." if link == "host" else ""))
    return out


def _group(r: dict, u: Union | None, ov: int, reference: Ref) -> MemGroup:
    wall = u.busy_ns if u else 0
    nbytes = None if r["bytes_unknown"] == r["n"] else int(r["bytes"])
    complete = r["bytes_unknown"] == 0
    link, src, dst = r["link"], r["src_kind"], r["dst_kind"]
    host_known = None
    if link == "host":
        sides = HOST_SIDE.get(r["kind"], (True, True))
        host_known = all(kind in KNOWN_HOST_KINDS for kind, host in zip((src, dst), sides) if host)
    factor, ref, ref_bw, source, note = reference
    traffic_rate = factor * nbytes / wall if (factor and complete and wall and nbytes is not None) else None
    return MemGroup(
        device_id=r["device_id"], op=r["op"], direction=r["kind"], src_kind=src, dst_kind=dst, link=link,
        count=r["n"], zero_duration_count=r["zero"], bytes=nbytes, bytes_unknown_count=r["bytes_unknown"],
        work_ns=int(r["work_ns"]), wall_ns=wall,
        gb_per_s_over_wall=_gbps(nbytes, wall) if complete else None,
        gb_per_s_over_work=_gbps(nbytes, int(r["work_ns"])) if complete else None,
        avg_bytes=round(nbytes / r["n"], 1) if complete and nbytes is not None else None,
        overlapped_by_kernels_ns=ov, exposed_ns=wall - ov,
        pageable="Pageable" in (src, dst), host_kind_known=host_known,
        reference=ref, reference_gb_per_s=ref_bw, reference_source=source, traffic_factor=factor,
        pct_of_reference_bandwidth=pct(traffic_rate, ref_bw) if traffic_rate is not None else None,
        reference_note=note,
    )


def _largest(trace: Trace, base: str, params: list, top: int, by: str) -> list[Transfer]:
    order = "bytes DESC NULLS LAST, dur_ns DESC" if by == "bytes" else "dur_ns DESC, bytes DESC NULLS LAST"
    query = f"""
        WITH t AS (SELECT * FROM ({base}) ORDER BY {order}, start_ns, device_id, stream_id NULLS FIRST LIMIT {top})
        SELECT t.*, CASE WHEN t.launched THEN (SELECT arg_min(a.name, a.start_ns) FROM api_calls a
                                               WHERE a.pid = t.pid AND a.correlation_id = t.correlation_id) END AS api_name
        FROM t ORDER BY {order}, start_ns, device_id, stream_id NULLS FIRST"""
    out = []
    for r in trace.sql_dicts(query, params):
        out.append(Transfer(
            device_id=r["device_id"], stream_id=r["stream_id"], op=r["op"], direction=r["kind"], src_kind=r["src_kind"],
            dst_kind=r["dst_kind"], link=r["link"], start_ns=r["start_ns"], dur_ns=r["dur_ns"], bytes=r["bytes"],
            gb_per_s=_gbps(r["bytes"], r["dur_ns"]), pageable="Pageable" in (r["src_kind"], r["dst_kind"]),
            api_call=r["api_name"], pid=r["pid"], tid=r["tid"],
        ))
    return out


def _gbps(nbytes: int | None, ns: int) -> float | None:
    """bytes / ns = GB/s: 3 decimals, and at least 4 significant digits (a tiny copy never reads 0)."""
    if nbytes is None or not ns:
        return None
    rate = nbytes / ns
    return round(rate, 3) if rate >= 1 else float(f"{rate:.4g}")


def _sum_bytes(groups: list[MemGroup]) -> int | None:
    known = [g.bytes for g in groups if g.bytes is not None]
    return sum(known) if known else None


def _fmt_bytes(n: int | None) -> str:
    return "size unknown" if n is None else f"{n} bytes"
