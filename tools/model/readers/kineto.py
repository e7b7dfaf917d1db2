"""PyTorch profiler (Kineto) Chrome-trace JSON → trace model.

One accepted Python pass: json.loads the file, then one C-level map per needed field (over all
events for the common fields, over the relevant subset for category-specific args). Everything else
- category aliases, linking, device/process resolution - is DuckDB SQL over those columns.

Besides the model tables this creates the view `native.events` (over the table native.event_store):
one row per traceEvents entry, idx = position in the file, args as JSON text - for sql_query users
who need something the model does not carry.
"""

from __future__ import annotations

import gc
import gzip
import json
import re
import zlib
from json.encoder import c_make_encoder, encode_basestring
from itertools import repeat
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ProfileError

# Pre-2022 category names (and the 2022 gpu_user_Annotation typo) → current ActivityType names.
CAT_ALIASES = {
    "Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset", "gpu_user_Annotation": "gpu_user_annotation",
}
FLOW_CATS = ("ac2g", "async", "async_gpu", "async_cpu_to_gpu")  # launch flows, 2022 name first
GPU_OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GPU_CATS = GPU_OP_CATS + ("gpu_user_annotation",)
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "python_function", "user_annotation", "cpu_instant_event") + RUNTIME_CATS
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA")
# cpu_op args lifted into their own cpu_ops columns; the rest stays in cpu_ops.args.
CPU_OP_LIFTED = ("External id", "Sequence number", "Input Dims", "Input type", "Input Strides", "Concrete Inputs")

# One reusable C encoder: json.dumps builds a new one per call, which doubles the cost per event.
_encode = c_make_encoder(None, None, encode_basestring, None, ": ", ", ", False, False, True)


def _json(value) -> str | None:
    return None if value is None else "".join(_encode(value, 0))


def load(con, path: Path, progress, detected) -> None:
    # Millions of small dicts trigger repeated full collections during json.loads and the
    # comprehensions (~2x slower); none of them form cycles, so collection can wait.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        doc = _parse(path, detected, progress)
        progress(0.45, "extracting event fields")
        try:
            top, frames = _extract(doc)
        except (AttributeError, TypeError) as exc:
            raise ProfileError(
                f"{path}: traceEvents has entries of an unexpected shape ({exc}); it does not look like a PyTorch profiler trace."
            ) from None
        del doc
    finally:
        if gc_was_enabled:
            gc.enable()
    progress(0.7, "building the trace model")
    try:
        for name, frame in frames.items():
            con.register(f"kin_{name}_df", frame)
        _build(con, top)
    finally:
        for name in frames:
            con.unregister(f"kin_{name}_df")
        con.execute("DROP VIEW IF EXISTS kin_ev")
        for table in ("kin_gpu", "kin_rt", "kin_meta", "kin_names", "kin_pids", "kin_piddev", "kin_link"):
            con.execute(f"DROP TABLE IF EXISTS {table}")


# --------------------------------------------------------------------------- parsing

def _parse(path: Path, detected, progress) -> dict | list:
    progress(0.05, "reading file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"Cannot read {path}: {exc.strerror}. Check the path and its permissions.") from None
    if detected.compressed or raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(
                f"{path} is a corrupt or truncated gzip file ({exc}). Copy or download the trace again "
                f"(`gzip -t {path.name}` confirms the damage)."
            ) from None
    progress(0.15, f"parsing {len(raw) / 1e6:.0f} MB of JSON")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); the trace is probably "
            "truncated (the profiled process ended or the disk filled while it was written). Export it again with "
            "prof.export_chrome_trace(...) or torch.profiler.tensorboard_trace_handler."
        ) from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ProfileError(f"{path} cannot be decoded as JSON text ({exc}). Export the trace again.") from None
    del raw
    events = doc if isinstance(doc, list) else doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ProfileError(
            f"{path} is JSON but has no 'traceEvents' list, so it is not a PyTorch profiler trace. Pass the file "
            "written by prof.export_chrome_trace(...) or torch.profiler.tensorboard_trace_handler (*.pt.trace.json[.gz])."
        )
    if not events:
        raise ProfileError(
            f"{path} has an empty traceEvents list: the profiler recorded nothing. Make sure the profiler schedule "
            "reaches an active step (prof.step() is called every iteration) before the trace is exported."
        )
    return doc


def _extract(doc) -> tuple[dict, dict[str, pd.DataFrame]]:
    """The one Python pass: column lists per field, converted to numpy/pandas for DuckDB. map() with
    dict.get/pop and the C encoder keeps each per-event step out of the bytecode loop."""
    top = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    events = doc if isinstance(doc, list) else doc["traceEvents"]

    def field(rows: list[dict], key: str) -> list:
        return list(map(dict.get, rows, repeat(key)))

    def encoded(values: list) -> np.ndarray:  # None → 'null', {} → '{}'; SQL turns both into NULL
        return np.array(list(map("".join, map(_encode, values, repeat(0)))), dtype=object)

    ph = np.array(field(events, "ph"), dtype=object)
    raw_cat = field(events, "cat")
    cat = raw_cat
    if not CAT_ALIASES.keys().isdisjoint(c for c in set(raw_cat) if type(c) is str):
        cat = [CAT_ALIASES.get(c, c) if type(c) is str else c for c in raw_cat]
    cat = np.array(cat, dtype=object)
    empty: dict = {}
    args = [a if type(a) is dict else empty for a in field(events, "args")]
    complete = ph == "X"

    def subset(*cats) -> tuple[np.ndarray, list[dict]]:
        mask = cat == cats[0]
        for c in cats[1:]:
            mask |= cat == c
        idx = np.flatnonzero(mask & complete)
        return idx, [args[i] for i in idx]

    # cpu_op args are split before all args are encoded: the lifted values get cpu_ops columns and
    # the rest is both cpu_ops.args and (reassembled by the native.events view) the raw args, so
    # every value is encoded exactly once.
    ci, ca = subset("cpu_op")
    cpu = pd.DataFrame({"idx": ci})
    for i, key in enumerate(CPU_OP_LIFTED):
        cpu[f"lift{i}"] = encoded(list(map(dict.pop, ca, repeat(key), repeat(None))))
    del ca
    names = field(events, "name")
    if not all(type(n) is str for n in names):
        names = [_text(n) for n in names]
    ev = pd.DataFrame({
        "idx": np.arange(len(events), dtype=np.int64),
        "ph": ph,
        "cat": np.array(raw_cat, dtype=object),
        "name": np.array(names, dtype=object),
        "pid": _ints(field(events, "pid"), text=True),
        "tid": _ints(field(events, "tid"), text=True),
        "ts_ns": _ns(field(events, "ts")),
        "dur_ns": _ns(field(events, "dur")),
        "args": encoded(args),
    })
    del names, raw_cat
    flows = (ph == "s") | (ph == "f") | (ph == "t")
    top["_flow_count"] = int(np.count_nonzero(flows & np.isin(cat, FLOW_CATS)))
    gi, ga = subset(*GPU_OP_CATS)
    none3 = (None, None, None)
    grid = list(zip(*[g if type(g) is list and len(g) == 3 else none3 for g in field(ga, "grid")])) or [()] * 3
    block = list(zip(*[b if type(b) is list and len(b) == 3 else none3 for b in field(ga, "block")])) or [()] * 3
    gpu = pd.DataFrame({
        "idx": gi,
        # Peer copies carry fromDevice/inDevice/toDevice instead of device; the engine is inDevice.
        "device": _ints([a.get("device", a.get("inDevice")) for a in ga]),
        "stream": _ints(field(ga, "stream")),
        "corr": _ints(field(ga, "correlation")),
        "graph_id": _ints(field(ga, "graph id")),
        **{f"grid_{c}": _ints(list(grid[i])) for i, c in enumerate("xyz")},
        **{f"block_{c}": _ints(list(block[i])) for i, c in enumerate("xyz")},
        "regs": _ints(field(ga, "registers per thread")),
        "shmem": _ints(field(ga, "shared memory")),
        "bytes": _ints(field(ga, "bytes")),
        "src_dev": _ints(field(ga, "fromDevice")),
        "dst_dev": _ints(field(ga, "toDevice")),
    })
    ri, ra = subset(*RUNTIME_CATS)
    rt = pd.DataFrame({"idx": ri, "corr": _ints(field(ra, "correlation")), "ext": _ints(field(ra, "External id"))})
    mi = np.flatnonzero(ph == "M")
    meta = pd.DataFrame({"idx": mi, "value": np.array([_text(args[i].get("name", args[i].get("labels"))) for i in mi], dtype=object)})
    return top, {"ev": ev, "gpu": gpu, "rt": rt, "cpu": cpu, "meta": meta}


def _text(v):
    return v if v is None or type(v) is str else str(v)


def _floats(values: list, text: bool = False) -> np.ndarray:
    if not text:
        try:
            return np.array(values, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            pass
    # pid/tid are text in some events ('Spans', ROCm '123'): numeric text counts, the rest is NULL.
    return np.array([v if type(v) is int or type(v) is float else _number(v) for v in values], dtype=np.float64)


def _number(v) -> float | None:
    if type(v) is str:
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _ints(values: list, text: bool = False) -> pd.arrays.IntegerArray:
    a = _floats(values, text)
    mask = ~np.isfinite(a)
    return pd.arrays.IntegerArray(np.where(mask, 0, a).astype(np.int64), mask)


def _ns(values: list) -> pd.arrays.IntegerArray:
    """µs → integer ns as round(us*1000), done on the integer and fractional parts separately so
    absolute integer µs (~1.7e15) stay exact and 3-decimal relative µs round to the written ns."""
    a = _floats(values)
    mask = ~np.isfinite(a)
    a = np.where(mask, 0.0, a)
    whole = np.floor(a)
    ns = whole.astype(np.int64) * 1000 + np.rint((a - whole) * 1000).astype(np.int64)
    return pd.arrays.IntegerArray(ns, mask)


# --------------------------------------------------------------------------- model

def _build(con, top: dict) -> None:
    aliases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in CAT_ALIASES.items())
    lifted = ", ".join(f"""CASE WHEN lift{i} IS NOT NULL THEN '{_json(k)}: ' || lift{i} END""" for i, k in enumerate(CPU_OP_LIFTED))
    # One copy of the events into DuckDB (string copies dominate the build); native.events is a
    # view over it that puts the split cpu_op args back together.
    con.execute("CREATE SCHEMA IF NOT EXISTS native")
    con.execute(
        f"""CREATE TABLE native.event_store AS
            SELECT e.idx, e.ph::VARCHAR AS ph, e.cat::VARCHAR AS cat, e.name::VARCHAR AS name, e.pid, e.tid, e.ts_ns, e.dur_ns,
                   nullif(e.args::VARCHAR, '{{}}') AS args, CASE e.cat::VARCHAR {aliases} ELSE e.cat::VARCHAR END AS category,
                   {', '.join(f"nullif(c.lift{i}::VARCHAR, 'null') AS lift{i}" for i in range(len(CPU_OP_LIFTED)))}
            FROM kin_ev_df e LEFT JOIN kin_cpu_df c USING (idx)"""
    )
    con.execute("COMMENT ON TABLE native.event_store IS 'storage behind native.events (cpu_op args split into lift0..5); query native.events'")
    con.execute(
        f"""CREATE VIEW native.events AS
            SELECT idx, ph, cat, name, pid, tid, ts_ns, dur_ns,
                   CASE WHEN category = 'cpu_op' AND ph = 'X'
                        THEN '{{' || concat_ws(', ', {lifted}, nullif(substr(coalesce(args, '{{}}'), 2, length(coalesce(args, '{{}}')) - 2), '')) || '}}'
                        ELSE args END AS args
            FROM native.event_store"""
    )
    con.execute(
        "COMMENT ON VIEW native.events IS 'Kineto traceEvents, one row per entry (ORDER BY idx for file order); "
        "ts_ns/dur_ns = round(us*1000); pid/tid NULL where the trace writes text; args as JSON text'"
    )
    con.execute(
        """CREATE TEMP VIEW kin_ev AS SELECT idx, ph, category AS cat, name, pid, tid, ts_ns AS ts, greatest(dur_ns, 0) AS dur,
                  dur_ns < 0 AS neg_dur, args, lift0, lift1, lift2, lift3, lift4, lift5
           FROM native.event_store WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns IS NOT NULL"""
    )

    con.execute("CREATE TEMP TABLE kin_gpu AS SELECT g.*, e.cat, e.name, e.pid, e.tid, e.ts, e.dur FROM kin_gpu_df g JOIN kin_ev e USING (idx)")
    con.execute("CREATE TEMP TABLE kin_rt AS SELECT r.*, e.cat, e.name, e.pid, e.tid, e.ts, e.dur FROM kin_rt_df r JOIN kin_ev e USING (idx) WHERE e.pid IS NOT NULL")
    con.execute(
        """CREATE TEMP TABLE kin_meta AS SELECT e.name AS kind, e.pid, e.tid, m.value::VARCHAR AS value, m.idx
           FROM kin_meta_df m JOIN native.event_store e USING (idx) WHERE e.pid IS NOT NULL"""
    )
    # CPU processes: pids with host-side events or a 'CPU' label, never a pid that carries GPU work
    # or a 'GPU n' label (Kineto also writes python frames of helper threads under GPU pid 0).
    con.execute(
        f"""CREATE TEMP TABLE kin_pids AS
            WITH gpu_pids AS (SELECT DISTINCT pid FROM kin_ev WHERE cat IN {GPU_CATS} AND pid IS NOT NULL
                              UNION SELECT pid FROM kin_meta WHERE kind = 'process_labels' AND value LIKE 'GPU%')
            SELECT DISTINCT pid FROM (
                SELECT pid FROM kin_ev WHERE cat IN {CPU_CATS} AND pid IS NOT NULL
                UNION SELECT pid FROM kin_meta WHERE kind = 'process_labels' AND value = 'CPU')
            WHERE pid NOT IN (SELECT pid FROM gpu_pids)"""
    )
    # Device of each GPU pid: what its GPU ops say in args.device (ROCm pids are HSA agent ids),
    # else the 'GPU n' label, else the pid itself.
    con.execute(
        """CREATE TEMP TABLE kin_piddev AS
           SELECT pid, coalesce(d.dev, l.dev, pid)::INTEGER AS dev FROM (
               SELECT DISTINCT pid FROM kin_ev WHERE cat IN ('kernel','gpu_memcpy','gpu_memset','gpu_user_annotation'))
           LEFT JOIN (SELECT pid, mode(device) AS dev FROM kin_gpu WHERE device IS NOT NULL GROUP BY pid) d USING (pid)
           LEFT JOIN (SELECT pid, max(TRY_CAST(regexp_extract(value, '^GPU\\s*(\\d+)$', 1) AS INTEGER)) AS dev
                      FROM kin_meta WHERE kind = 'process_labels' GROUP BY pid) l USING (pid)"""
    )
    # Launch link by args.correlation. Correlation ids are unique per process, so the only
    # ambiguity is a file with several processes: take the latest call that started before the op.
    # A graph launch matches every op of its replay (1 → N).
    con.execute(
        """CREATE TEMP TABLE kin_link AS
           SELECT g.idx, r.pid, r.tid FROM kin_gpu g JOIN kin_rt r ON r.corr = g.corr
           QUALIFY row_number() OVER (PARTITION BY g.idx ORDER BY (r.ts <= g.ts) DESC, r.ts DESC) = 1"""
    )
    names = [n for (n,) in con.execute("SELECT DISTINCT name FROM kin_gpu WHERE cat = 'kernel' AND name IS NOT NULL").fetchall()]
    con.register("kin_names_df", pd.DataFrame({"name": np.array(names, dtype=object), "short": np.array([short_name(n) for n in names], dtype=object)}))
    con.execute("CREATE TEMP TABLE kin_names AS SELECT name::VARCHAR AS name, short::VARCHAR AS short FROM kin_names_df")
    con.unregister("kin_names_df")
    one_cpu = "(SELECT CASE WHEN count(*) = 1 THEN min(pid) END FROM kin_pids)"
    gpu_from = f"""FROM kin_gpu g LEFT JOIN kin_link l USING (idx) LEFT JOIN kin_piddev p ON p.pid = g.pid"""
    con.execute(
        f"""INSERT INTO kernels
            SELECT coalesce(g.device, p.dev, g.pid), g.stream, g.ts, g.ts + g.dur, g.dur, g.name, coalesce(n.short, g.name),
                   g.grid_x, g.grid_y, g.grid_z, g.block_x, g.block_y, g.block_z, g.regs, g.shmem, NULL, g.corr, g.graph_id,
                   coalesce(l.pid, {one_cpu}), l.tid, l.pid IS NOT NULL
            {gpu_from} LEFT JOIN kin_names n ON n.name = g.name
            WHERE g.cat = 'kernel' AND g.name IS NOT NULL AND coalesce(g.device, p.dev, g.pid) IS NOT NULL ORDER BY g.idx"""
    )
    kinds = ", ".join(f"'{k}'" for k in COPY_KINDS)
    con.execute(
        f"""INSERT INTO memops
            SELECT coalesce(g.device, p.dev, g.pid), g.stream, g.ts, g.ts + g.dur, g.dur,
                   CASE g.cat WHEN 'gpu_memset' THEN 'set' ELSE 'copy' END,
                   CASE WHEN g.cat = 'gpu_memset' THEN 'memset'
                        WHEN regexp_extract(g.name, '^Memcpy\\s+(\\w+)', 1) IN ({kinds}) THEN regexp_extract(g.name, '^Memcpy\\s+(\\w+)', 1)
                        ELSE 'Unknown' END,
                   g.bytes,
                   nullif(regexp_extract(g.name, '\\((.+?)\\s*->', 1), ''),
                   nullif(coalesce(nullif(regexp_extract(g.name, '->\\s*(.+?)\\s*\\)', 1), ''), regexp_extract(g.name, '^Memset\\s*\\((.+?)\\)', 1)), ''),
                   g.src_dev, g.dst_dev, g.corr, coalesce(l.pid, {one_cpu}), l.tid, l.pid IS NOT NULL
            {gpu_from}
            WHERE g.cat IN ('gpu_memcpy', 'gpu_memset') AND coalesce(g.device, p.dev, g.pid) IS NOT NULL ORDER BY g.idx"""
    )
    con.execute(
        """INSERT INTO api_calls
           SELECT pid, tid, ts, ts + dur, dur, regexp_replace(name, '_v\\d+$', ''),
                  CASE WHEN name LIKE 'hip%' THEN 'hip' WHEN name LIKE 'hsa%' THEN 'hsa' ELSE cat END, corr, ext
           FROM kin_rt WHERE name IS NOT NULL ORDER BY idx"""
    )
    con.execute(
        """INSERT INTO markers
           SELECT pid, tid, ts, ts + dur, dur, name, '', 'annotation', 'pytorch', NULL, NULL
           FROM kin_ev WHERE cat = 'user_annotation' AND pid IS NOT NULL AND name IS NOT NULL
           UNION ALL
           SELECT NULL, NULL, ts, ts + dur, dur, name, '', 'gpu_annotation', 'pytorch', p.dev, e.tid
           FROM kin_ev e JOIN kin_piddev p USING (pid) WHERE e.cat = 'gpu_user_annotation' AND name IS NOT NULL"""
    )
    con.execute(
        """INSERT INTO cpu_ops
           SELECT pid, tid, ts, ts + dur, dur, name, cat, TRY_CAST(lift0 AS BIGINT), TRY_CAST(lift1 AS BIGINT),
                  lift2, lift3, lift4, lift5, args
           FROM kin_ev WHERE cat IN ('cpu_op', 'python_function') AND pid IS NOT NULL AND name IS NOT NULL"""
    )
    dist = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    rank = _int_or_none(dist.get("rank"))
    n_cpu = con.execute("SELECT count(*) FROM kin_pids").fetchone()[0]
    con.execute(
        """INSERT INTO processes
           SELECT p.pid, n.value, ?, NULL FROM kin_pids p
           LEFT JOIN (SELECT pid, arg_max(value, idx) AS value FROM kin_meta WHERE kind = 'process_name' GROUP BY pid) n USING (pid)""",
        [rank if n_cpu == 1 else None],
    )
    con.execute(
        """INSERT INTO threads
           SELECT t.pid, t.tid, coalesce(nullif(regexp_extract(n.value, '^thread\\s+\\d+\\s+\\((.*)\\)$', 1), ''), n.value)
           FROM (SELECT DISTINCT pid, tid FROM kin_ev WHERE tid IS NOT NULL AND pid IN (SELECT pid FROM kin_pids)
                 UNION SELECT pid, tid FROM kin_meta WHERE kind = 'thread_name' AND tid IS NOT NULL AND pid IN (SELECT pid FROM kin_pids)) t
           LEFT JOIN (SELECT pid, tid, arg_max(value, idx) AS value FROM kin_meta WHERE kind = 'thread_name' GROUP BY pid, tid) n
                  ON n.pid = t.pid AND n.tid = t.tid"""
    )
    _devices(con, top)
    _meta(con, top, dist, rank, n_cpu)


def _devices(con, top: dict) -> None:
    props = [p for p in (top.get("deviceProperties") or []) if isinstance(p, dict) and _int_or_none(p.get("id")) is not None]
    build = ("AMD" if any(k in top for k in ("hip_runtime_version", "roctracer_version", "hip_driver_version")) else
             "NVIDIA" if any(k in top for k in ("cuda_runtime_version", "cuda_driver_version", "cupti_version")) else None)
    rows = {int(p["id"]): _device_row(int(p["id"]), p, build) for p in props}
    seen = [d for (d,) in con.execute(
        "SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memops "
        "UNION ALL SELECT device_id FROM markers WHERE device_id IS NOT NULL) ORDER BY 1").fetchall()]
    missing = [d for d in seen if d not in rows]
    warnings = []
    if missing and props:
        listed = ", ".join(str(i) for i in sorted(rows))
        kinds = {(r[1], r[4], r[5], r[8]) for r in rows.values()}
        if len(kinds) == 1:
            # ROCm Kineto writes the HSA agent id (2, 3, ...) where deviceProperties uses ordinals;
            # when every listed GPU is the same model the properties still hold for the unlisted id.
            for d in missing:
                rows[d] = (d,) + next(iter(rows.values()))[1:]
            warnings.append(
                f"GPU events use device id(s) {', '.join(map(str, missing))} that deviceProperties does not list (ids {listed}); "
                f"ROCm traces write the HSA agent id there. All listed devices are '{props[0].get('name')}', so those properties are used."
            )
        else:
            warnings.append(
                f"GPU events use device id(s) {', '.join(map(str, missing))} that deviceProperties does not list (ids {listed}); "
                "their names and sizes are unknown."
            )
    if missing and not props:
        warnings.append("The trace has no deviceProperties: GPU names, SM counts and memory sizes are unknown (sub-sampled or very old trace).")
    for d in missing:
        rows.setdefault(d, (d,) + (None,) * 10)
    if rows:
        con.executemany("INSERT INTO devices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [rows[k] for k in sorted(rows)])
    if warnings:
        con.executemany("INSERT INTO trace_meta VALUES ('warning', ?)", [[w] for w in warnings])


def _device_row(dev: int, p: dict, build: str | None) -> tuple:
    name = _text(p.get("name"))
    low = (name or "").lower()
    # ROCm builds add maxSharedMemoryPerMultiProcessor; CUDA builds the Optin/PerMultiprocessor keys.
    if any(k in low for k in ("amd", "radeon", "instinct")) or "maxSharedMemoryPerMultiProcessor" in p:
        vendor = "AMD"
    elif any(k in low for k in ("nvidia", "tesla", "geforce", "quadro")) or "sharedMemPerBlockOptin" in p or "regsPerMultiprocessor" in p:
        vendor = "NVIDIA"
    else:
        vendor = build
    major, minor = _int_or_none(p.get("computeMajor")), _int_or_none(p.get("computeMinor"))
    cc = f"{major}.{minor}" if major is not None and minor is not None else None
    return (dev, name, vendor, True, _int_or_none(p.get("numSms")), _int_or_none(p.get("totalGlobalMem")), None, None, cc,
            _int_or_none(p.get("warpSize")), None)


def _int_or_none(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _meta(con, top: dict, dist: dict, rank, n_cpu: int) -> None:
    rows: list[tuple[str, str]] = [("format", "kineto"), ("format_version", _text(top.get("schemaVersion")) or "")]
    cuda, hip = _int_or_none(top.get("cuda_runtime_version")), _int_or_none(top.get("hip_runtime_version"))
    if hip is not None:
        rows.append(("product_version", f"HIP runtime {hip // 10_000_000}.{hip // 100_000 % 100}.{hip % 100_000}"))
    elif cuda is not None:
        rows.append(("product_version", f"CUDA runtime {cuda // 1000}.{cuda % 1000 // 10}"))
    else:
        rows.append(("product_version", ""))
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version", "hip_driver_version",
                "roctracer_version", "trace_id", "displayTimeUnit"):
        if top.get(key) is not None:
            rows.append((key if key != "displayTimeUnit" else "display_time_unit", _text(top[key])))
    base = _int_or_none(top.get("baseTimeNanoseconds"))
    lo, hi, frac, big = con.execute(
        "SELECT min(ts), max(ts + dur), bool_or(ts % 1000 <> 0 OR dur % 1000 <> 0), max(abs(ts)) >= 8796093022208000 FROM kin_ev"
    ).fetchone()
    if base is not None:
        rows.append(("base_time_ns", str(base)))
        rows.append(("timestamp_format", "microseconds relative to baseTimeNanoseconds (absolute epoch ns = base_time_ns + ts)"))
    else:
        rows.append(("timestamp_format", "absolute epoch microseconds"))
    if lo is not None:
        rows += [("capture_start_ns", str(lo)), ("capture_end_ns", str(hi)),
                 ("capture_span_source", "first start to last end of all complete (ph X) events, including the profiler's own span event")]
    else:
        rows.append(("absent", "capture span: the trace has no timed (ph X) events"))
    if base is None and frac and big:
        rows.append(("warning", "Timestamps are fractional absolute microseconds (2024-era Kineto before baseTimeNanoseconds): "
                                "float parsing keeps only ~0.25 us resolution, so sub-microsecond times are approximate."))
    if dist:
        for key, meta_key in (("rank", "rank"), ("world_size", "world_size"), ("backend", "distributed_backend")):
            if dist.get(key) is not None:
                rows.append((meta_key, _text(dist[key])))
        if rank is not None and n_cpu > 1:
            rows.append(("warning", f"distributedInfo gives rank {rank} but the trace has {n_cpu} CPU processes; process ranks are left unset."))
    (n_gpu, n_unlinked, n_kern, n_mem, n_rt, n_mark, n_cpu_ops, n_neg, n_nopid) = con.execute(
        """SELECT (SELECT count(*) FROM kernels) + (SELECT count(*) FROM memops),
                  (SELECT count(*) FILTER (WHERE NOT launched) FROM kernels) + (SELECT count(*) FILTER (WHERE NOT launched) FROM memops),
                  (SELECT count(*) FROM kernels), (SELECT count(*) FROM memops), (SELECT count(*) FROM api_calls),
                  (SELECT count(*) FROM markers), (SELECT count(*) FROM cpu_ops),
                  (SELECT count(*) FROM kin_ev WHERE neg_dur),
                  (SELECT count(*) FROM kin_ev WHERE pid IS NULL AND cat IN ('cpu_op','python_function','user_annotation','cuda_runtime','cuda_driver'))"""
    ).fetchone()
    if n_unlinked:
        rows.append(("warning", f"{n_unlinked} of {n_gpu} GPU operations (kernels, copies, sets) have no launching runtime call in the trace "
                                "(launched before profiling started, or the call was not captured); they count as GPU work but have no host thread."))
    if n_gpu and top["_flow_count"] == 0:
        rows.append(("warning", "The trace has no flow (ac2g) events; GPU work was linked to runtime calls by args.correlation alone."))
    if n_neg:
        rows.append(("warning", f"{n_neg} events have a negative duration; they were given duration 0."))
    if n_nopid:
        rows.append(("warning", f"{n_nopid} host events have a non-numeric pid and were left out of the model tables (they remain in native.events)."))
    for count, what in ((n_kern, "kernels: no kernel events"), (n_mem, "memops: no gpu_memcpy/gpu_memset events"),
                        (n_rt, "api_calls: no cuda_runtime/cuda_driver events"), (n_mark, "markers: no user annotations"),
                        (n_cpu_ops, "cpu_ops: no cpu_op/python_function events")):
        if not count:
            rows.append(("absent", what))
    rows.append(("absent", "device clocks and memory bandwidth: Kineto deviceProperties has no clock or bandwidth fields"))
    rows.append(("absent", "dynamic shared memory: Kineto reports one shared-memory total per kernel (kept in static_shared_bytes)"))
    con.executemany("INSERT INTO trace_meta VALUES (?, ?)", rows)


# --------------------------------------------------------------------------- kernel names

_PARAMS_START = re.compile(r"[\w>]$")


def short_name(full: str) -> str:
    """Base name like Nsight's shortName: no return type, namespaces, template args or parameters.
    'void at::native::vectorized_elementwise_kernel<4, F>(int, F)' → 'vectorized_elementwise_kernel'."""
    s = full.replace("(anonymous namespace)", "anonymous_namespace").replace("->", "\x00")
    # Keep only depth-0 text; '<' '>' inside parentheses are operators ('enable_if<(N<2)>'), not brackets.
    stack, kept = [], []
    for ch in s:
        if ch == "(" or (ch == "<" and (not stack or stack[-1] == "<")):
            if not stack:
                kept.append(ch)
            stack.append(ch)
        elif stack and ((ch == ")" and stack[-1] == "(") or (ch == ">" and stack[-1] == "<")):
            stack.pop()
            if not stack:
                kept.append(ch)
        elif not stack:
            kept.append(ch)
    skel = "".join(kept)
    cut = -1
    for i in range(len(skel) - 1, -1, -1):
        if skel[i] == "(" and i and _PARAMS_START.search(skel[:i]):
            cut = i
            break
    if cut < 0 and " " in skel.strip():
        return full  # not a C++ signature ('Memcpy DtoD (Device -> Device)', ...)
    base = (skel[:cut] if cut >= 0 else skel).replace("<>", "").replace("()", "").strip()
    base = base.split()[-1] if base else ""
    base = base.split("::")[-1]
    return base if re.search(r"\w", base) else full
