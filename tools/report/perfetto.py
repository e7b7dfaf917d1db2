"""The trace model as a Chrome / Perfetto JSON trace (`gpuscope export PROFILE --perfetto out.json`).

Whatever the input format (Nsight, rocpd, Kineto), the file shows one process track per GPU with one thread
track per stream, and one process per host process with a track per thread. Every row of the model's interval
tables is one complete event (`ph: "X"`), the category naming the table:

    kernel      kernels       GPU track (pid = GPU_PID_BASE + device_id, tid = stream_id)
    memcpy      memops copies GPU track
    memset      memops sets   GPU track
    api         api_calls     host track (pid, tid); name = the API call
    cpu_op      cpu_ops       host track (PyTorch operators and Python frames, category in args)
    marker      markers       host track, or the GPU track for GPU-side annotations

A stream, process or thread the profile does not name gets a number of its own: -1, or where the profile uses -1
itself, the nearest negative number it does not use (`unknown_ids` and otherData say which), so it never shares a
track with a real one.

Times are exact: `ts` and `dur` are microseconds written with three decimals from integer nanoseconds, relative
to the earliest event (`otherData.origin_ns` holds it), so each value keeps its nanoseconds even as a double.
Names come through DuckDB's to_json, so any text in a profile stays a JSON string. Rows go from SQL to the file in
chunks; the profile is read, never changed, and the file is written to a temporary name beside the target and
renamed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from ..model.errors import ProfileError, shown_path
from ..model.quote import quote_literal
from ..model.trace import Trace
from .files import atomic_output

GPU_PID_BASE = 1_000_000_000  # GPU tracks' pids: far above any OS pid, so host and GPU processes never merge
CHUNK = 50_000


def _us(x: str) -> str:
    """SQL: a non-negative ns offset as µs text with exactly three decimals."""
    return f"printf('%d.%03d', ({x}) // 1000, ({x}) % 1000)"


def _event(cat: str, name: str, pid: str, tid: str, args: str) -> str:
    head = '{"ph":"X","cat":' + json.dumps(cat) + ',"name":'  # cat is one of ours, a plain word
    return (f"""{quote_literal(head)} || to_json({name}) || ',"pid":' || ({pid}) || ',"tid":' || ({tid})"""
            f""" || ',"ts":' || {_us('start_ns - $origin')} || ',"dur":' || {_us('dur_ns')} || ',"args":' || to_json({args}) || '}}'""")


GPU_TID = "coalesce(stream_id, $unknown_stream)"
HOST_PID, HOST_TID = "coalesce(pid, $unknown_pid)", "coalesce(tid, $unknown_tid)"
EVENTS = {
    "kernel": ("kernels", _event("kernel", "name", f"{GPU_PID_BASE} + device_id", GPU_TID,
                                 "{'device_id': device_id, 'stream_id': stream_id, 'short_name': short_name, "
                                 "'grid': [grid_x, grid_y, grid_z], 'block': [block_x, block_y, block_z], "
                                 "'correlation_id': correlation_id, 'start_ns': start_ns, 'dur_ns': dur_ns}"), "TRUE"),
    "memcpy": ("memops", _event("memcpy", "'memcpy ' || kind", f"{GPU_PID_BASE} + device_id", GPU_TID,
                                "{'bytes': bytes, 'kind': kind, 'src_kind': src_kind, 'dst_kind': dst_kind, "
                                "'correlation_id': correlation_id, 'start_ns': start_ns, 'dur_ns': dur_ns}"), "op = 'copy'"),
    "memset": ("memops", _event("memset", "'memset'", f"{GPU_PID_BASE} + device_id", GPU_TID,
                                "{'bytes': bytes, 'correlation_id': correlation_id, 'start_ns': start_ns, 'dur_ns': dur_ns}"),
               "op = 'set'"),
    "api": ("api_calls", _event("api", "name", HOST_PID, HOST_TID,
                                "{'api': api, 'correlation_id': correlation_id, 'start_ns': start_ns, 'dur_ns': dur_ns}"), "TRUE"),
    "cpu_op": ("cpu_ops", _event("cpu_op", "name", HOST_PID, HOST_TID,
                                 "{'category': category, 'external_id': external_id, 'input_dims': input_dims, "
                                 "'start_ns': start_ns, 'dur_ns': dur_ns}"), "TRUE"),
    "marker": ("markers", _event("marker", "name",
                                 f"CASE WHEN device_id IS NOT NULL THEN {GPU_PID_BASE} + device_id ELSE {HOST_PID} END",
                                 f"CASE WHEN device_id IS NOT NULL THEN {GPU_TID} ELSE {HOST_TID} END",
                                 "{'domain': domain, 'kind': kind, 'source': source, 'start_ns': start_ns, 'dur_ns': dur_ns}"),
               "TRUE"),
}


class ExportWritten(BaseModel):
    trace: str
    path: str = Field(description="the Perfetto/Chrome JSON trace written")
    bytes: int = Field(description="size of the file written, bytes")
    origin_ns: int | None = Field(description="model time of ts = 0 (the earliest event), ns; null when the model is empty")
    events: dict[str, int] = Field(description="complete (ph X) events written per category")
    gpu_tracks: int = Field(description="GPU thread tracks (device, stream)")
    host_tracks: int = Field(description="host thread tracks (pid, tid)")
    unknown_ids: dict[str, int] = Field(description="the number written for a stream, pid or tid the profile does not name "
                                                    "(-1 unless the profile uses -1 itself)")
    hint: str = "open the file at https://ui.perfetto.dev (Open trace file) or chrome://tracing; nothing is uploaded by gpuscope"


def write_perfetto(trace: Trace, out: str | Path) -> ExportWritten:
    path = Path(out).expanduser()
    if path.suffix.lower() != ".json":
        raise ProfileError(f"the Perfetto export is JSON: name the file *.json (got {shown_path(path)}).")
    if path.exists() and path.resolve() == trace.path.resolve():
        raise ProfileError("the output file is the profile itself; choose another name.")
    if not path.parent.is_dir():
        raise ProfileError(f"folder {shown_path(path.parent)} does not exist; create it or name a file in an existing folder.")
    tables = sorted({t for t, _, _ in EVENTS.values()})
    origin = trace.scalar("SELECT min(m) FROM (" + " UNION ALL ".join(f"SELECT min(start_ns) AS m FROM {t}" for t in tables) + ")")
    tracks = _tracks(trace)
    values = {"$origin": str(int(origin or 0)), "$unknown_stream": str(tracks.unknown["stream"]),
              "$unknown_pid": str(tracks.unknown["pid"]), "$unknown_tid": str(tracks.unknown["tid"])}
    counts: dict[str, int] = {}
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit":"ns","otherData":')
            fh.write(json.dumps({"generator": "gpuscope", "profile": str(trace.path), "format": trace.format,
                                 "origin_ns": origin, "time_unit": "ts/dur in us, 3 decimals = exact ns, relative to origin_ns",
                                 "unknown_ids": tracks.unknown}))
            fh.write(',"traceEvents":[\n')
            first = True
            for line in _metadata_events(trace, tracks):
                fh.write(("" if first else ",\n") + line)
                first = False
            for cat, (table, select, where) in EVENTS.items():
                counts[cat] = 0
                if origin is None:
                    continue
                for key, value in values.items():
                    select = select.replace(key, value)
                cur = trace.con.cursor()
                try:
                    cur.execute(f"SELECT {select} FROM {table} WHERE {where} ORDER BY start_ns")
                    while rows := cur.fetchmany(CHUNK):
                        fh.write(("" if first else ",\n") + ",\n".join(r[0] for r in rows))
                        first = False
                        counts[cat] += len(rows)
                finally:
                    cur.close()
            fh.write("\n]}\n")
    return ExportWritten(trace=str(trace.path), path=str(path.resolve()), bytes=path.stat().st_size, origin_ns=origin,
                         events=counts, gpu_tracks=len(tracks.gpu), host_tracks=len(tracks.host), unknown_ids=tracks.unknown)


@dataclass(frozen=True)
class _Tracks:
    gpu: list[tuple]       # (device_id, stream_id), stream None where unknown
    host: list[tuple]      # (pid, tid), None where unknown
    unknown: dict[str, int]  # the number written for an unknown stream, pid, tid


def _unused(used: set) -> int:
    """-1, or the nearest negative integer below it that `used` (a track's few distinct ids) does not hold."""
    v = -1
    while v in used:
        v -= 1
    return v


def _tracks(trace: Trace) -> _Tracks:
    gpu = trace.sql("""SELECT DISTINCT device_id, stream_id FROM (
                           SELECT device_id, stream_id FROM kernels UNION ALL SELECT device_id, stream_id FROM memops
                           UNION ALL SELECT device_id, stream_id FROM markers WHERE device_id IS NOT NULL)
                       ORDER BY 1, 2 NULLS FIRST""")
    host = trace.sql("""SELECT DISTINCT pid, tid FROM (
                            SELECT pid, tid FROM api_calls UNION ALL SELECT pid, tid FROM cpu_ops
                            UNION ALL SELECT pid, tid FROM markers WHERE device_id IS NULL) ORDER BY 1 NULLS FIRST, 2 NULLS FIRST""")
    unknown = {"stream": _unused({s for _, s in gpu}), "pid": _unused({p for p, _ in host}), "tid": _unused({t for _, t in host})}
    return _Tracks(gpu=gpu, host=host, unknown=unknown)


def _metadata_events(trace: Trace, tracks: _Tracks) -> list[str]:
    """process_name / thread_name (and sort order) for every track, so the UI shows 'GPU 0: H100 …' / 'stream 7'."""
    device_names = dict(trace.sql("SELECT device_id, name FROM devices"))
    process_names = dict(trace.sql("SELECT pid, any_value(name) FROM processes GROUP BY pid"))
    thread_names = {(p, t): n for p, t, n in trace.sql("SELECT pid, tid, any_value(name) FROM threads GROUP BY pid, tid")}
    no = tracks.unknown
    out = []

    def meta(kind: str, pid: int, tid: int, args: dict) -> None:
        out.append(json.dumps({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}, ensure_ascii=False))

    for dev in sorted({d for d, _ in tracks.gpu}):
        label = f"GPU {dev}" + (f": {device_names[dev]}" if device_names.get(dev) else "")
        meta("process_name", GPU_PID_BASE + dev, 0, {"name": label})
        meta("process_sort_index", GPU_PID_BASE + dev, 0, {"sort_index": dev})
    for dev, stream in tracks.gpu:
        meta("thread_name", GPU_PID_BASE + dev, no["stream"] if stream is None else stream,
             {"name": "stream unknown" if stream is None else f"stream {stream}"})
    for pid in dict.fromkeys(p for p, _ in tracks.host):
        shown = no["pid"] if pid is None else pid
        meta("process_name", shown, 0, {"name": "process unknown" if pid is None else f"{process_names.get(pid) or 'process'} (pid {pid})"})
    for pid, tid in tracks.host:
        name = "thread unknown" if tid is None else thread_names.get((pid, tid)) or f"thread {tid}"
        meta("thread_name", no["pid"] if pid is None else pid, no["tid"] if tid is None else tid, {"name": name})
    return out
