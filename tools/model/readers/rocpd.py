"""rocprofv3 rocpd databases (rocprofiler-sdk, schema 3.0.x) → the trace model.

Layout (profile-schemas.md §2): every physical table carries a per-process UUID suffix
(`rocpd_kernel_dispatch_0191e7b2_…`); unsuffixed views forward to it. We scan the physical tables
(DuckDB's SQLite scanner cannot parse rocpd's views, and views are slower) and fall back to the
views when a file has none. Merged files hold several suffixes: their tables are stacked, and
every join also matches `guid`, as rocpd's own views do, because ids restart per process (through an integer
key per table suffix where every row's guid is one a suffix spells: _Tables).

Semantics:
  * devices.device_id = the agent's `type_index`, i.e. the GPU ordinal (0..n-1 among GPU agents,
    what HIP_VISIBLE_DEVICES-style numbering and rocprofv3's own output call the device). Each
    rank's file lists every agent of the node, so devices are all GPU agents and each activity row
    takes the agent it names (never "the first GPU");
  * host↔device link: the dispatch's/copy's rocpd_event.stack_id equals the stack_id of the
    launching API region's event (rocpd_event.correlation_id is the external id, usually 0);
    correlation_id = that stack id, launched = the region is in the file, tid = the region's thread;
  * kernel grid: rocpd stores work-items, the model wants workgroups → ceil(grid / workgroup);
    dispatch group_segment_size is static + dynamic LDS, the kernel symbol's is static;
  * API calls and markers are chosen by an allow-list of event categories (never a deny-list:
    RCCL/OMPT/rocDecode regions are not user markers).
"""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pandas as pd

from ..detect import ROCPD_SUFFIXED as _SUFFIXED, Detected
from ..errors import ProfileError
from ..limits import setting
from ..names import create_short_names
from ..quality import TIME_MISSING, count_sql, native_table_name, record, record_query, time_checks
from ..quote import quote_ident, quote_literal
from .. import sqlite_source
from ..sqlite_source import SqliteSource
from ..trace import MODEL_TABLES

log = logging.getLogger(__name__)

_REQUIRED = ("rocpd_string", "rocpd_event", "rocpd_info_agent", "rocpd_info_kernel_symbol", "rocpd_kernel_dispatch")

# Event category → API family. rocprofv3 buffer-kind names plus rocprof-sys names (§2.3).
API_CATEGORIES = {
    "HIP_RUNTIME_API": "hip", "HIP_RUNTIME_API_EXT": "hip", "HIP_COMPILER_API": "hip", "HIP_COMPILER_API_EXT": "hip",
    "HSA_CORE_API": "hsa", "HSA_AMD_EXT_API": "hsa", "HSA_IMAGE_EXT_API": "hsa", "HSA_FINALIZE_EXT_API": "hsa",
    "RCCL_API": "rccl", "rocm_hip_api": "hip", "rocm_hsa_api": "hsa",
}
# Ranges: push/pop or start/stop pairs that rocprofv3 already joined into one region.
RANGE_CATEGORIES = ("MARKER_CORE_RANGE_API", "rocm_marker_api")
# Single calls: only roctxMark* calls are annotations; the raw push/pop calls reappear as ranges.
MARK_CATEGORIES = ("MARKER_CORE_API",)

UNKNOWN_AGENT = "names an agent that rocpd_info_agent does not list"
NO_MARKER_TEXT = "marker has no text (no message in rocpd_event.extdata, no name string)"

# The tables (rocpd's unsuffixed names) each model table is read from: every event row names its category and name in
# rocpd_event / rocpd_string and its process and thread in the info tables. A cell the reader repaired in one
# (data_issues 'native."T"') stands behind that table's rows, and the tools that read them say so.
_EVENT = ("rocpd_event", "rocpd_string", "rocpd_info_process", "rocpd_info_thread")
NATIVE_SOURCES = {
    # a GPU op's launching call is a rocpd_region row
    "kernels": ("rocpd_kernel_dispatch", "rocpd_info_kernel_symbol", "rocpd_info_agent", "rocpd_region", *_EVENT),
    "memops": ("rocpd_memory_copy", "rocpd_info_agent", "rocpd_region", *_EVENT),
    "api_calls": ("rocpd_region", *_EVENT),
    "markers": ("rocpd_region", "rocpd_sample", "rocpd_track", *_EVENT),
    "memory_events": ("rocpd_memory_allocate", "rocpd_info_agent", *_EVENT),
    "devices": ("rocpd_info_agent",),
    "processes": ("rocpd_info_process", "rocpd_info_node"),
    "threads": ("rocpd_info_thread", "rocpd_info_process"),
}

COPY_KINDS = {
    "MEMORY_COPY_HOST_TO_DEVICE": "HtoD", "MEMORY_COPY_DEVICE_TO_HOST": "DtoH",
    "MEMORY_COPY_DEVICE_TO_DEVICE": "DtoD", "MEMORY_COPY_HOST_TO_HOST": "HtoH",
}


def logical_tables(tables: list[str]) -> dict[str, list[str]]:
    """rocpd's unsuffixed names -> the per-process physical tables behind them. rocprofv3 ships views
    with these names; gpuscope never runs a profile's views and stacks the tables itself instead."""
    out: dict[str, list[str]] = {}
    for name in sorted(tables):
        m = _SUFFIXED.fullmatch(name)
        if m:
            out.setdefault(m.group(1), []).append(name)
    return out


# Raised (through DuckDB's error()) by a row whose guid is none of the file's table suffixes: the load starts over
# joining on the guid text itself.
_FOREIGN_GUID = "gpuscope: a rocpd row carries a guid that names none of the file's tables"
# A key is one CASE branch per suffix, tried in turn on every row: a file merging more processes joins on the text.
MAX_KEYED_GUIDS = 16


class _Tables:
    """Logical rocpd table name → DuckDB relation, over however many UUID suffixes the file has.

    Every relation's guid column holds a join key for the row's guid: the index of its process among the file's table
    suffixes (rocprofv3 writes each table's rows with the guid its suffix spells), or with `text_keys` the guid text
    itself. Integer keys keep 20 M-row event tables a third of the size and their joins cheaper (a 10 M-kernel build
    spilled less); a row with any other guid makes every key unusable, and the load starts over on text keys."""

    def __init__(self, con: duckdb.DuckDBPyConnection, src: SqliteSource, lenient: bool = False, text_keys: bool = False):
        self.con, self.src, self.lenient = con, src, lenient
        self.physical = logical_tables(src.tables)
        guids = sorted({n[len(logical) + 1:].replace("_", "-") for logical, names in self.physical.items() for n in names})
        self.text_keys = text_keys or not guids or len(guids) > MAX_KEYED_GUIDS
        self.key_type = "VARCHAR" if self.text_keys else "INTEGER"
        self._guids = guids
        self._rel: dict[tuple[str, bool], str | None] = {}
        self.views: list[str] = []

    def key(self, column: str) -> str:
        """SQL for the join key of the guid in `column` (a column reference made by this module, never profile text)."""
        if self.text_keys:
            return column
        cases = " ".join(f"WHEN {column} = {quote_literal(g)} THEN {i}" for i, g in enumerate(self._guids))
        return f"CASE WHEN {column} IS NULL THEN NULL {cases} ELSE error({quote_literal(_FOREIGN_GUID)}) END"

    def has(self, logical: str) -> bool:
        return logical in self.physical or self.src.has(logical)

    def sqlite_names(self, logical: str) -> list[str]:
        return self.physical.get(logical) or ([logical] if self.src.has(logical) else [])

    def columns(self, logical: str) -> list[str]:
        names = self.sqlite_names(logical)
        return self.src.columns(names[0]) if names else []

    def rel(self, logical: str, text: bool = False) -> str | None:
        """text=True: lenient sqlite3 copy (small tables with free text); False: native scan."""
        text = text or self.lenient
        key = (logical, text)
        if key not in self._rel:
            names = self.sqlite_names(logical)
            if not names:
                self._rel[key] = None
            else:
                parts = " UNION ALL BY NAME ".join(self._select(n, text) for n in names)
                name = f"_rocpd_{logical}_{int(text)}"
                self.con.execute(f"CREATE TEMP VIEW {name} AS {parts}")
                self.views.append(name)
                self._rel[key] = name
        return self._rel[key]

    def _select(self, name: str, text: bool) -> str:
        """A SELECT over one SQLite object, its guid turned into the join key. SqliteSource.relation picks the native
        scan or the lenient copy, and the copy already gives columns their declared SQLite types."""
        keyed = f" REPLACE ({self.key('guid')} AS guid)" if "guid" in self.src.columns(name) else ""
        return f"SELECT *{keyed} FROM {self.src.relation(name, text=text)}"


def load(con: duckdb.DuckDBPyConnection, path: Path, progress, detected: Detected) -> None:
    sidecars = [s for s in ("-wal", "-journal") if path.with_name(path.name + s).exists()]
    src = SqliteSource(con, path)
    try:
        # Row order carries no meaning in the model (an insert that wants one says ORDER BY). Dropping it lets DuckDB
        # fill tables from parallel scans: _ev, 4 M events at 2 M kernels, took 1.5 s on one thread with it kept.
        with setting(con, "preserve_insertion_order", False):
            _load_or_retry(con, path, progress, src, sidecars)
    finally:
        src.close()


def _load_or_retry(con, path: Path, progress, src: SqliteSource, sidecars: list[str]) -> None:
    tb = _Tables(con, src)
    try:
        while True:
            try:
                _load(con, path, progress, tb, sidecars)
                return
            except duckdb.OutOfMemoryException:
                raise  # the sqlite3 copies hold whole tables in Python: they would need many times more
            except duckdb.Error as exc:
                if _FOREIGN_GUID in str(exc) and not tb.text_keys:
                    retry = _Tables(con, src, lenient=tb.lenient, text_keys=True)
                elif src.attached and not tb.lenient:
                    # The native scanner rejects cells that do not match the declared column type (and
                    # invalid UTF-8); start over on lenient sqlite3 copies, slower but tolerant.
                    retry = _Tables(con, src, lenient=True, text_keys=tb.text_keys)
                else:
                    raise
                log.info("rocpd load of %s starts over (%s)", path, exc)
                _start_over(con, tb, src)
                tb = retry
    finally:
        _cleanup(con, tb)


def _start_over(con, tb: _Tables, src: SqliteSource) -> None:
    _cleanup(con, tb)
    for t in MODEL_TABLES:
        if t != "data_issues":
            con.execute(f"DELETE FROM {t}")
    # the native tables already copied stay, and so do their data_issues rows
    con.execute("DELETE FROM data_issues WHERE NOT list_contains(?, table_name)",
                [[native_table_name(t) for t in src.copied]])
    src.restart()


def _cleanup(con, tb: _Tables) -> None:
    for t in ("_catmap", "_cat", "_str", "_ev", "_kd", "_api", "_link", "_mem", "_sym", "_sym0", "_sym_names", "_copy", "_agent", "_proc", "_thr",
              "_msg", "_samp", "_mk"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    for v in tb.views:
        con.execute(f"DROP VIEW IF EXISTS {v}")
    tb.views.clear()


def _load(con, path: Path, progress, tb: _Tables, sidecars: list[str]) -> None:
    src = tb.src
    version = _schema_version(src, tb, path)
    missing = [t for t in _REQUIRED if not tb.has(t)]
    if missing:
        raise ProfileError(
            f"{path} is an incomplete rocpd database: it lacks {', '.join(missing)}. It may be hand-made or "
            "from an interrupted run; re-run rocprofv3 with `--output-format rocpd` and let it finish."
        )
    if "track_id" in tb.columns("rocpd_kernel_dispatch") or version.split(".")[0] == "4":
        raise ProfileError(
            f"{path} is a rocpd schema {version or '4.x'} database (track-based layout), which gpuscope does not "
            "support yet. Profile with a ROCm release whose rocprofv3 writes rocpd schema 3.x, or export this "
            "one to CSV/Perfetto with the `rocpd` tool."
        )
    meta = [("format", "rocpd"), ("format_version", version), ("product_version", "")]
    warnings: list[str] = []
    absent: list[str] = ["cpu_ops: only PyTorch traces have CPU operators",
                         "memsets: rocpd has no memory-set records",
                         "memory_bandwidth: rocpd agents state no peak DRAM bandwidth"]
    if sidecars:
        warnings.append(
            f"A {' and '.join(sidecars)} file lies next to {path.name}: rocprofv3 was probably killed before it "
            "finished writing (e.g. a job time limit), so dispatch and copy tables may be incomplete."
        )
    rel = tb.rel
    string, event, agent = rel("rocpd_string", True), rel("rocpd_event"), rel("rocpd_info_agent", True)
    con.execute(
        "CREATE TEMP TABLE _catmap AS SELECT * FROM (VALUES "
        + ", ".join(f"('{c}', '{a}', NULL)" for c, a in API_CATEGORIES.items()) + ", "
        + ", ".join(f"('{c}', NULL, 'range')" for c in RANGE_CATEGORIES) + ", "
        + ", ".join(f"('{c}', NULL, 'mark')" for c in MARK_CATEGORIES)
        + ") t(category, api, marker)"
    )
    con.execute(f"CREATE TEMP TABLE _str AS SELECT guid, id, string FROM {string}")
    # Events keep their category's string id; the few category strings are mapped once (_cat), not written on each of
    # millions of event rows: a 10 M-kernel database has 20 M events, and _ev is joined by every kind of activity.
    con.execute("""CREATE TEMP TABLE _cat AS SELECT s.guid, s.id, m.api, m.marker FROM _str s JOIN _catmap m ON m.category = s.string""")
    con.execute(f"CREATE TEMP TABLE _ev AS SELECT guid, id, stack_id, category_id FROM {event}")
    progress(0.2, "rocpd: devices, processes, threads")
    _ids(con, tb)
    _devices(con, agent)

    progress(0.3, "rocpd: API calls")
    region = rel("rocpd_region")
    if region:
        con.execute(
            f"""CREATE TEMP TABLE _api AS
                SELECT r.guid, r.pid AS rpid, COALESCE(p.pid, r.pid) AS pid, COALESCE(t.tid, r.tid) AS tid,
                       r.start, r."end", COALESCE(n.string, 'rocpd_string#' || r.name_id) AS name, m.api, e.stack_id
                FROM {region} r
                JOIN _ev e ON e.id = r.event_id AND e.guid = r.guid
                JOIN _cat m ON m.id = e.category_id AND m.guid = e.guid AND m.api IS NOT NULL
                LEFT JOIN _str n ON n.id = r.name_id AND n.guid = r.guid
                LEFT JOIN _proc p ON p.id = r.pid AND p.guid = r.guid
                LEFT JOIN _thr t ON t.id = r.tid AND t.guid = r.guid"""
        )
        record_query(con, count_sql("api_calls", "_api", time_checks()))
        con.execute(
            """INSERT INTO api_calls SELECT pid, tid, start, greatest("end", start), greatest("end", start) - start, name, api, stack_id, NULL, NULL
               FROM _api WHERE start IS NOT NULL AND "end" IS NOT NULL ORDER BY start"""
        )
    else:
        con.execute(f"CREATE TEMP TABLE _api (guid {tb.key_type}, rpid BIGINT, tid BIGINT, start BIGINT, stack_id BIGINT, name VARCHAR)")
    # One launcher per (process, stack id); arg_min keeps the join 1:1 even for odd files.
    con.execute(
        """CREATE TEMP TABLE _link AS SELECT guid, rpid, stack_id, arg_min(tid, start) AS tid
           FROM _api WHERE stack_id IS NOT NULL GROUP BY ALL"""
    )

    progress(0.45, "rocpd: kernel dispatches")
    sym = rel("rocpd_info_kernel_symbol", True)
    disp = rel("rocpd_kernel_dispatch")
    dcols = tb.columns("rocpd_kernel_dispatch")
    graph = "k.graph_exec_id" if "graph_exec_id" in dcols else "NULL::BIGINT"
    if "graph_exec_id" not in dcols:
        absent.append("graph_id: rocpd schemas before 3.0.2 record no graph ids")
    con.execute(
        f"""CREATE TEMP TABLE _sym0 AS
            SELECT guid, id, name, arch_vgpr_count, group_segment_size
            FROM (SELECT *, COALESCE(NULLIF(display_name, ''), NULLIF(kernel_name, ''), 'kernel symbol ' || id) AS name
                  FROM {sym})"""
    )
    create_short_names(con, "_sym_names", "SELECT name FROM _sym0")
    con.execute("CREATE TEMP TABLE _sym AS SELECT s.*, n.short AS short_name FROM _sym0 s LEFT JOIN _sym_names n USING (name)")

    def wg(axis: str) -> str:
        return f"CASE WHEN k.workgroup_size_{axis} > 0 THEN (k.grid_size_{axis} + k.workgroup_size_{axis} - 1) // k.workgroup_size_{axis} END"

    # Two statements with one large join each (the dispatch's event, then its launching call): in one statement, with
    # the rows sorted by start, a 10 M-kernel database ran out of memory at the default limit, and a 1 M-kernel one at
    # 128 MiB without the sort; apart, each join spills on its own.
    con.execute(
        f"""CREATE TEMP TABLE _kd AS
            SELECT a.ordinal, k.guid, k.pid, k.kernel_id, k.stream_id, k.start, greatest(k."end", k.start) AS "end",
                   k.group_segment_size, k.workgroup_size_x, k.workgroup_size_y, k.workgroup_size_z,
                   {wg('x')} AS grid_x, {wg('y')} AS grid_y, {wg('z')} AS grid_z, {graph} AS graph_id, e.stack_id
            FROM {disp} k
            JOIN _agent a ON a.id = k.agent_id AND a.guid = k.guid AND a.type = 'GPU'
            LEFT JOIN _ev e ON e.id = k.event_id AND e.guid = k.guid
            WHERE k.start IS NOT NULL AND k."end" IS NOT NULL"""
    )
    con.execute(
        """INSERT INTO kernels
           SELECT k.ordinal, k.stream_id, k.start, k."end", k."end" - k.start,
                  COALESCE(s.name, 'kernel symbol ' || k.kernel_id), COALESCE(s.short_name, 'kernel symbol ' || k.kernel_id),
                  k.grid_x, k.grid_y, k.grid_z, k.workgroup_size_x, k.workgroup_size_y, k.workgroup_size_z,
                  s.arch_vgpr_count, s.group_segment_size,
                  CASE WHEN k.group_segment_size >= s.group_segment_size THEN k.group_segment_size - s.group_segment_size END,
                  k.stack_id, k.graph_id, COALESCE(p.pid, k.pid), l.tid, l.rpid IS NOT NULL, false, NULL, NULL
           FROM _kd k
           LEFT JOIN _sym s ON s.id = k.kernel_id AND s.guid = k.guid
           LEFT JOIN _link l ON l.guid = k.guid AND l.rpid = k.pid AND l.stack_id = k.stack_id
           LEFT JOIN _proc p ON p.id = k.pid AND p.guid = k.guid"""
    )
    con.execute("DROP TABLE _kd")
    missing_time, backwards = time_checks("k.start", 'k."end"')
    record_query(con, count_sql("kernels", f"{disp} k LEFT JOIN _agent a ON a.id = k.agent_id AND a.guid = k.guid", [
        missing_time, ("a.id IS NULL", "skipped", UNKNOWN_AGENT),
        ("a.type IS DISTINCT FROM 'GPU'", "skipped", "runs on an agent that rocpd_info_agent does not list as a GPU"), backwards]))
    n_k, n_unlinked = con.execute("SELECT count(*), count(*) FILTER (WHERE NOT launched) FROM kernels").fetchone()
    if n_unlinked:
        hint = ("the database has no HIP API regions; run rocprofv3 with --hip-trace or --sys-trace to record launches"
                if not con.execute("SELECT count(*) FROM api_calls WHERE api = 'hip'").fetchone()[0]
                else "their launching HIP call is not in the profile")
        warnings.append(f"{n_unlinked} of {n_k} kernel dispatches are not linked to a launching API call: {hint}.")
    if not n_k:
        absent.append("kernels: no kernel dispatches recorded (rocprofv3 --kernel-trace or --sys-trace records them)")

    progress(0.65, "rocpd: memory copies")
    copy = rel("rocpd_memory_copy")
    if copy:
        kinds = " ".join(f"WHEN '{n}' THEN '{k}'" for n, k in COPY_KINDS.items())
        con.execute(
            f"""CREATE TEMP TABLE _copy AS
                SELECT c.stream_id, c.start, c."end", c.size, CASE n.string {kinds} ELSE 'Unknown' END AS kind,
                       CASE WHEN sa.type = 'GPU' THEN sa.ordinal END AS src_gpu,
                       CASE WHEN da.type = 'GPU' THEN da.ordinal END AS dst_gpu,
                       e.stack_id, l.tid AS launch_tid, l.rpid IS NOT NULL AS launched, COALESCE(p.pid, c.pid) AS os_pid,
                       sa.id IS NULL OR da.id IS NULL AS unknown_agent
                FROM {copy} c
                LEFT JOIN _str n ON n.id = c.name_id AND n.guid = c.guid
                LEFT JOIN _agent sa ON sa.id = c.src_agent_id AND sa.guid = c.guid
                LEFT JOIN _agent da ON da.id = c.dst_agent_id AND da.guid = c.guid
                LEFT JOIN _ev e ON e.id = c.event_id AND e.guid = c.guid
                LEFT JOIN _link l ON l.guid = c.guid AND l.rpid = c.pid AND l.stack_id = e.stack_id
                LEFT JOIN _proc p ON p.id = c.pid AND p.guid = c.guid"""
        )
        # The GPU side is the device whose engine did the copy: destination for HtoD, source otherwise.
        con.execute(
            """INSERT INTO memops
               SELECT device_id, stream_id, start, greatest("end", start), greatest("end", start) - start, 'copy', kind, size,
                      CASE WHEN src_gpu IS NOT NULL THEN 'Device' END, CASE WHEN dst_gpu IS NOT NULL THEN 'Device' END,
                      CASE WHEN kind = 'DtoD' THEN src_gpu END, CASE WHEN kind = 'DtoD' THEN dst_gpu END,
                      stack_id, os_pid, launch_tid, launched
               FROM (SELECT *, CASE WHEN kind = 'HtoD' THEN COALESCE(dst_gpu, src_gpu) ELSE COALESCE(src_gpu, dst_gpu) END AS device_id
                     FROM _copy)
               WHERE device_id IS NOT NULL AND start IS NOT NULL AND "end" IS NOT NULL ORDER BY start"""
        )
        # Copies between two known host agents are not GPU work (a warning says so); a copy whose
        # agent is not in rocpd_info_agent, or without times, is damage and counted as such.
        no_gpu = "COALESCE(src_gpu, dst_gpu) IS NULL"
        missing_time, backwards = time_checks()
        record_query(con, count_sql("memops", "_copy", [
            missing_time, (f"{no_gpu} AND unknown_agent", "skipped", UNKNOWN_AGENT), (f"NOT {no_gpu} AND {backwards[0]}", *backwards[1:])]))
        n_raw, n_host = con.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE {no_gpu} AND NOT unknown_agent AND start IS NOT NULL AND "end" IS NOT NULL)
                FROM _copy""").fetchone()
        if n_host:
            warnings.append(f"{n_host} of {n_raw} memory copies involve no GPU agent (host-to-host) and were left out of memops.")
    if not con.execute("SELECT count(*) FROM memops").fetchone()[0]:
        absent.append("memops: no memory copies recorded (rocprofv3 --memory-copy-trace or --sys-trace records them)")

    _memory(con, rel("rocpd_memory_allocate"), absent)

    progress(0.8, "rocpd: markers")
    n_api_samples = _markers(con, tb, region)
    if n_api_samples:
        warnings.append(f"{n_api_samples} zero-length API calls are stored as rocpd samples without a call name and are not listed.")
    if not con.execute("SELECT count(*) FROM api_calls").fetchone()[0]:
        absent.append("api_calls: no HIP/HSA API calls recorded (rocprofv3 --hip-trace or --sys-trace records them)")
    if not con.execute("SELECT count(*) FROM markers").fetchone()[0]:
        absent.append("markers: no rocTX markers recorded (rocprofv3 --marker-trace records them)")

    meta += _capture_span(con)
    rows = meta + [("warning", w) for w in warnings] + [("absent", a) for a in absent]
    con.executemany("INSERT INTO trace_meta VALUES (?, ?)", rows)
    progress(0.95, "rocpd: done")


MEMORY_TYPES = ("ALLOC", "FREE")


def _memory(con, mem: str | None, absent: list[str]) -> None:
    """memory_events from rocpd_memory_allocate (rocprofv3 --memory-allocation-trace). rocprofv3 gives the agent only
    on ALLOC rows, so a FREE takes the agent (and, when its own size is 0, the size) of the latest earlier ALLOC of
    the same address in its process. Level REAL is device (or, on a CPU agent, host) memory; VIRTUAL address
    reservations and SCRATCH keep their level as memory_kind. The site is the HIP call with the row's stack id."""
    if not mem:
        absent.append("memory_events: no rocpd_memory_allocate table (rocprofv3 --memory-allocation-trace records it)")
        return
    con.execute(
        f"""CREATE TEMP TABLE _mem AS
            SELECT *, CASE WHEN type = 'FREE' THEN -coalesce(nullif(size, 0), alloc_size) ELSE size END AS bytes,
                   coalesce(agent_id, alloc_agent) AS agent
            FROM (SELECT m.id AS k, m.guid, m.pid AS rpid, COALESCE(p.pid, m.pid) AS pid, COALESCE(t.tid, m.tid) AS tid,
                         m.agent_id, m.type, m.level, m.start, m.address, m.size, e.stack_id,
                         last_value(CASE WHEN m.type = 'ALLOC' THEN m.agent_id END IGNORE NULLS) OVER w AS alloc_agent,
                         last_value(CASE WHEN m.type = 'ALLOC' THEN m.size END IGNORE NULLS) OVER w AS alloc_size
                  FROM {mem} m
                  LEFT JOIN _ev e ON e.id = m.event_id AND e.guid = m.guid
                  LEFT JOIN _proc p ON p.id = m.pid AND p.guid = m.guid
                  LEFT JOIN _thr t ON t.id = m.tid AND t.guid = m.guid
                  WINDOW w AS (PARTITION BY m.guid, m.pid, m.address ORDER BY m.start, m.id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
               LEFT JOIN (SELECT guid AS aguid, id AS aid, ordinal, type AS agent_type FROM _agent) a
                      ON a.aid = coalesce(agent_id, alloc_agent) AND a.aguid = guid"""
    )
    types = ", ".join(f"'{t}'" for t in MEMORY_TYPES)
    record_query(con, count_sql("memory_events", "_mem", [
        ("start IS NULL", "skipped", TIME_MISSING),
        (f"type IS NULL OR type NOT IN ({types})", "skipped", "type is not ALLOC or FREE (REALLOC, RECLAIM): not an allocation or a free"),
        ("agent IS NULL", "skipped", "FREE of a block whose ALLOC is not in the profile: device unknown"),
        ("aid IS NULL", "skipped", UNKNOWN_AGENT),
        ("bytes IS NULL", "skipped", "size is missing or not an integer")]))
    con.execute(
        f"""INSERT INTO memory_events
            SELECT CASE WHEN m.agent_type = 'GPU' THEN m.ordinal END,
                   CASE m.level WHEN 'VIRTUAL' THEN 'Virtual' WHEN 'SCRATCH' THEN 'Scratch'
                        ELSE CASE WHEN m.agent_type = 'GPU' THEN 'Device' ELSE 'Host' END END,
                   m.pid, m.tid, m.start, m.bytes, m.address, NULL, NULL, CASE m.type WHEN 'FREE' THEN 'free' ELSE 'alloc' END,
                   api.name, m.stack_id
            FROM _mem m
            LEFT JOIN (SELECT guid, rpid, stack_id, arg_min(name, start) AS name FROM _api WHERE stack_id IS NOT NULL GROUP BY ALL) api
                   ON api.guid = m.guid AND api.rpid = m.rpid AND api.stack_id = m.stack_id
            WHERE m.start IS NOT NULL AND m.type IN ({types}) AND m.aid IS NOT NULL AND m.bytes IS NOT NULL
            ORDER BY m.start, m.k"""
    )
    if not con.execute("SELECT count(*) FROM memory_events").fetchone()[0]:
        absent.append("memory_events: no memory allocations recorded (rocprofv3 --memory-allocation-trace records them)")


def _schema_version(src: SqliteSource, tb: _Tables, path: Path) -> str:
    names = tb.sqlite_names("rocpd_metadata")
    if not names:
        raise ProfileError(
            f"{path} has rocpd tables but no rocpd_metadata: it is not a complete rocprofv3 database (hand-made or "
            "interrupted). Re-run rocprofv3 with `--output-format rocpd`."
        )
    versions = {str(v) for n in names
                for (v,) in src.query(f"SELECT value FROM {quote_ident(n)} WHERE tag = 'schema_version'", table=n)}
    if len(versions) > 1:
        raise ProfileError(f"{path} merges rocpd databases of different schema versions ({', '.join(sorted(versions))}); "
                           "analyse each process's database separately.")
    return versions.pop() if versions else ""


def _ids(con, tb: _Tables) -> None:
    """Process/thread/agent id maps and the processes/threads model rows.

    rocprofv3 makes rocpd_info_process.id the OS pid and rocpd_info_thread.id the OS tid, but the
    columns are distinct; map through them so files from other writers still give OS ids.
    """
    proc, thr, node = tb.rel("rocpd_info_process", True), tb.rel("rocpd_info_thread", True), tb.rel("rocpd_info_node", True)
    if proc:
        con.execute(f'CREATE TEMP TABLE _proc AS SELECT guid, id, pid, nid, command, init, fini, start, "end" FROM {proc}')
    else:
        con.execute(
            f'CREATE TEMP TABLE _proc (guid {tb.key_type}, id BIGINT, pid BIGINT, nid BIGINT, command VARCHAR, '
            'init BIGINT, fini BIGINT, start BIGINT, "end" BIGINT)'
        )
    if thr:
        con.execute(
            f"""CREATE TEMP TABLE _thr AS SELECT t.guid, t.id, t.tid, COALESCE(p.pid, t.pid) AS pid, t.name
                FROM {thr} t LEFT JOIN _proc p ON p.id = t.pid AND p.guid = t.guid"""
        )
    else:
        con.execute(f"CREATE TEMP TABLE _thr (guid {tb.key_type}, id BIGINT, tid BIGINT, pid BIGINT, name VARCHAR)")
    host = f"(SELECT n.hostname FROM {node} n WHERE n.id = p.nid AND n.guid = p.guid LIMIT 1)" if node else "NULL"
    con.execute(f"INSERT INTO processes SELECT DISTINCT ON (pid) pid, command, NULL, {host} FROM _proc p ORDER BY pid, guid, id")
    con.execute("INSERT INTO threads SELECT DISTINCT ON (pid, tid) pid, tid, name FROM _thr ORDER BY pid, tid, guid, id")


def _devices(con, agent: str) -> None:
    def ext(key: str, typ: str = "BIGINT") -> str:
        return f"TRY_CAST(CASE WHEN json_valid(extdata) THEN json_extract_string(extdata, '$.{key}') END AS {typ})"

    con.execute(
        f"""CREATE TEMP TABLE _agent AS
            SELECT guid, id, type, COALESCE(type_index, logical_index, absolute_index) AS ordinal,
                   COALESCE(NULLIF(product_name, ''), {ext('product_name', 'VARCHAR')}, NULLIF(user_name, ''), name) AS product,
                   COALESCE(NULLIF(name, ''), {ext('name', 'VARCHAR')}) AS gfx,
                   {ext('cu_count')} AS cu_count, {ext('local_mem_size')} AS mem, {ext('max_engine_clk_fcompute')} AS mhz,
                   {ext('wave_front_size')} AS wave
            FROM {agent}"""
    )
    con.execute(
        """INSERT INTO devices
           SELECT DISTINCT ON (ordinal) ordinal, product, 'AMD', true, cu_count, mem, NULL, mhz * 1000000, gfx, wave, NULL
           FROM _agent WHERE type = 'GPU' ORDER BY ordinal, guid, id"""
    )


def _markers(con, tb: _Tables, region: str | None) -> int:
    """Insert rocTX ranges and marks; return how many API samples were skipped."""
    cats = [*RANGE_CATEGORIES, *MARK_CATEGORIES]
    # Marker text lives in rocpd_event.extdata, free text that may hold any bytes: read only the
    # marker events, through sqlite3's lenient decoding, rather than scanning every event's JSON.
    # Fetched LENIENT_CHUNK_ROWS events at a time: a capture may hold millions of rocTX ranges.
    ids = con.execute(f"SELECT DISTINCT id FROM _str WHERE id IS NOT NULL AND string IN ({', '.join('?' * len(cats))})", cats).fetchall()
    con.execute(f"CREATE TEMP TABLE _msg (guid {tb.key_type}, id BIGINT, message VARCHAR)")
    id_list = ", ".join(str(int(i)) for (i,) in ids)
    columns = ["guid", "id", "extdata"]
    for name in tb.sqlite_names("rocpd_event") if ids else []:
        repaired: dict[str, int] = {}
        with sqlite_source.counting_utf8(tb.src.sqlite) as utf8:  # invalid UTF-8 is read as U+FFFD, and counted
            cur = tb.src.sqlite.execute(f"SELECT guid, id, extdata FROM {quote_ident(name)} WHERE category_id IN ({id_list})")
            while rows := cur.fetchmany(sqlite_source.LENIENT_CHUNK_ROWS):
                decoded, rows = utf8.take(columns, rows)
                for c, n in decoded.items():
                    repaired[c] = repaired.get(c, 0) + n
                chunk = pd.DataFrame.from_records(rows, columns=columns)
                con.register("_msg_df", chunk.astype({"guid": "string", "id": "Int64", "extdata": "string"}))
                try:
                    con.execute(f"""INSERT INTO _msg SELECT {tb.key('guid')}, id,
                                   CASE WHEN json_valid(extdata) THEN json_extract_string(extdata, '$.message') END FROM _msg_df""")
                finally:
                    con.unregister("_msg_df")
        record(con, [(native_table_name(name), "repaired", n, f"{quote_ident(c)}: {sqlite_source.NOT_UTF8}") for c, n in repaired.items()])
    if region:
        con.execute(
            f"""CREATE TEMP TABLE _mk AS
                SELECT * FROM (SELECT COALESCE(p.pid, r.pid) AS pid, COALESCE(t.tid, r.tid) AS tid, r.start, r."end",
                             COALESCE(g.message, n.string) AS name,
                             CASE WHEN m.marker = 'mark' THEN 'mark'
                                  WHEN n.string ILIKE '%start%' THEN 'start_end' ELSE 'push_pop' END AS kind,
                             m.marker, n.string AS op
                      FROM {region} r
                      JOIN _ev e ON e.id = r.event_id AND e.guid = r.guid
                      JOIN _cat m ON m.id = e.category_id AND m.guid = e.guid AND m.marker IS NOT NULL
                      LEFT JOIN _msg g ON g.id = e.id AND g.guid = e.guid
                      LEFT JOIN _str n ON n.id = r.name_id AND n.guid = r.guid
                      LEFT JOIN _proc p ON p.id = r.pid AND p.guid = r.guid
                      LEFT JOIN _thr t ON t.id = r.tid AND t.guid = r.guid)
                WHERE marker = 'range' OR op ILIKE 'roctxMark%'"""
        )
        # A mark has no end: only its start must be there.
        (_, _, missing), backwards = time_checks()
        record_query(con, count_sql("markers", "_mk", [
            ("""start IS NULL OR ("end" IS NULL AND kind <> 'mark')""", "skipped", missing),
            ("name IS NULL", "skipped", NO_MARKER_TEXT), (f"kind <> 'mark' AND {backwards[0]}", *backwards[1:])]))
        con.execute(
            """INSERT INTO markers
               SELECT pid, tid, start, CASE WHEN kind = 'mark' THEN start ELSE greatest("end", start) END,
                      CASE WHEN kind = 'mark' THEN 0 ELSE greatest("end", start) - start END, name, '', kind, 'roctx', NULL, NULL
               FROM _mk WHERE name IS NOT NULL AND start IS NOT NULL AND ("end" IS NOT NULL OR kind = 'mark')"""
        )
        con.execute("DROP TABLE _mk")
    skipped = 0
    sample, track = tb.rel("rocpd_sample"), tb.rel("rocpd_track", True)
    if sample and track:
        con.execute(
            f"""CREATE TEMP TABLE _samp AS
                SELECT COALESCE(p.pid, tr.pid) AS pid, COALESCE(t.tid, tr.tid) AS tid, s.timestamp AS ts,
                       m.api, m.marker, COALESCE(g.message, n.string) AS name
                FROM {sample} s
                JOIN _ev e ON e.id = s.event_id AND e.guid = s.guid
                JOIN _cat m ON m.id = e.category_id AND m.guid = e.guid
                LEFT JOIN {track} tr ON tr.id = s.track_id AND tr.guid = s.guid
                LEFT JOIN _msg g ON g.id = e.id AND g.guid = e.guid
                LEFT JOIN _str n ON n.id = tr.name_id AND n.guid = tr.guid
                LEFT JOIN _proc p ON p.id = tr.pid AND p.guid = tr.guid
                LEFT JOIN _thr t ON t.id = tr.tid AND t.guid = tr.guid"""
        )
        record_query(con, count_sql("markers", "_samp WHERE marker IS NOT NULL", [
            ("ts IS NULL", "skipped", "timestamp is missing or not an integer"), ("name IS NULL", "skipped", NO_MARKER_TEXT)]))
        con.execute(
            """INSERT INTO markers SELECT pid, tid, ts, ts, 0, name, '', 'mark', 'roctx', NULL, NULL
               FROM _samp WHERE marker IS NOT NULL AND name IS NOT NULL AND ts IS NOT NULL"""
        )
        skipped = con.execute("SELECT count(*) FROM _samp WHERE api IS NOT NULL").fetchone()[0]
        con.execute("DROP TABLE _samp")
    con.execute("DROP TABLE _msg")
    return skipped


def _capture_span(con) -> list[tuple[str, str]]:
    """rocprofv3 records when it initialised and finalised in each process: that is the capture."""
    for lo, hi, what in (("init", "fini", "rocpd_info_process init to fini (profiler start to finalisation)"),
                         ("start", "end", "rocpd_info_process start to end (process lifetime)")):
        row = con.execute(f"SELECT min(NULLIF({quote_ident(lo)}, 0)), max(NULLIF({quote_ident(hi)}, 0)) FROM _proc").fetchone()
        if row[0] is not None and row[1] is not None and row[1] > row[0]:
            return [("capture_start_ns", str(row[0])), ("capture_end_ns", str(row[1])), ("capture_span_source", what)]
    return []
