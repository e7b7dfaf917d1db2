"""Nsight Systems SQLite export (nsys 2020-2026) → trace model.

Bulk tables (KERNEL, MEMCPY, MEMSET, RUNTIME) are scanned in place through DuckDB's SQLite
attachment; text-bearing tables (StringIds, NVTX_EVENTS, TARGET_INFO_*, metadata) go through the
lenient sqlite3 copy because real exports hold non-UTF-8 bytes. Version drift handled here is listed
in profile-schemas.md §1.2: metadata in META_DATA_EXPORT / EXPORT_META_DATA / nowhere, device
properties in TARGET_INFO_GPU or TARGET_INFO_CUDA_GPU, optional ENUM tables, optional columns.

Serialized GlobalIds: pid = (g >> 24) & 0xFFFFFF, tid = g & 0xFFFFFF. Bits >= 48 hold VM/hardware
ids that differ between platforms, so process-level joins compare `g >> 24` (pid plus those bits).
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from pathlib import Path

import duckdb

from ..errors import NoPreview, ProfileError
from ..limits import memory_limit_bytes, preview_memory_limit_bytes, scratch_dir, setting
from ..quality import END_BEFORE_START, LAUNCH_BEFORE_CALL, MAX_NAME_CHARS, count_sql, record, record_query, time_checks
from ..names import GRAPH_LAUNCH_RX
from ..quote import quote_ident, quote_literal
from ..sqlite_source import SqliteSource
from . import nccl_payloads

KERNEL, MEMCPY, MEMSET, RUNTIME = (f"CUPTI_ACTIVITY_KIND_{t}" for t in ("KERNEL", "MEMCPY", "MEMSET", "RUNTIME"))
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"  # one row per graph launch under --cuda-graph-trace=graph (the default)
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"  # nsys profile --cuda-memory-usage=true
MEMORY_POOL = "CUDA_GPU_MEMORY_POOL_EVENTS"  # created / destroyed / trimmed CUDA memory pools (same option)
# Windows WDDM video-memory manager events (Nsight on Windows): per-process usage and budget levels, not allocations.
OS_MEMORY = {"usage": ("GPU_MEMORY_USAGE_EVENTS", "newUsage"), "budget": ("GPU_MEMORY_BUDGET_EVENTS", "newBudget")}
SEGMENT_GROUPS = {0: "local", 1: "non-local"}  # DXGI_MEMORY_SEGMENT_GROUP_LOCAL / _NON_LOCAL
BACKTRACE_CLASS = 67  # TRACE_PROCESS_EVENT_CUDABACKTRACE: duplicates of real API rows, carrying a callchain

# Built-in maps (profile-schemas.md §1.4) for exports without ENUM tables (all 2022-era ones).
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
# Nsight's ENUM_CUDA_MEM_KIND numbering, which differs from CUPTI's CUpti_ActivityMemoryKind.
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static", 6: "Managed Static", 7: "Unknown"}
NVTX_KINDS = {34: "mark", 59: "push_pop", 70: "push_pop", 60: "start_end", 71: "start_end"}

# The export's tables each model table is read from (names, kinds and links included): a cell the reader repaired in
# one (data_issues 'native."T"') stands behind that table's rows, and the tools that read them say so.
_NCCL = ("NVTX_EVENTS", "NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES", "NVTX_PAYLOAD_ENUMS", "NVTX_PAYLOAD_ENUM_ENTRIES")
NATIVE_SOURCES = {
    # a GPU op's launching call (its thread, its launch delays) is a RUNTIME row; the communicators NCCL's payloads give
    # kernels are named with nccl_calls
    "kernels": (KERNEL, GRAPH_TRACE, "StringIds", RUNTIME),
    "memops": (MEMCPY, MEMSET, "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", RUNTIME),
    "api_calls": (RUNTIME, "StringIds", CUDA_EVENT, SYNC),
    "markers": ("NVTX_EVENTS", "StringIds"),
    "nccl_calls": ("StringIds", *_NCCL),
    "memory_events": (MEMORY_USAGE, MEMORY_POOL, "ENUM_CUDA_MEM_KIND", RUNTIME, "StringIds"),
    "os_memory_levels": tuple(table for table, _ in OS_MEMORY.values()),
    "devices": ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU", "TARGET_INFO_CUDA_DEVICE"),
    "processes": ("PROCESSES", "MPI_RANKS", "TARGET_INFO_SYSTEM_ENV"),
    "threads": ("ThreadNames", "StringIds"),
}

PID = "(({g} >> 24) & 16777215)"
TID = "({g} & 16777215)"


def load(con: duckdb.DuckDBPyConnection, path: Path, progress, detected) -> None:
    src = SqliteSource(con, path)
    # Row order carries no meaning in the model; dropping it lets DuckDB insert from parallel scans (~2x).
    try:
        with setting(con, "preserve_insertion_order", False):
            _Reader(con, src, progress).run()
    finally:
        src.close()


class _Reader:
    def __init__(self, con: duckdb.DuckDBPyConnection, src: SqliteSource, progress):
        self.con, self.src, self.progress = con, src, progress
        self.meta: list[tuple[str, str]] = []

    # -- helpers ------------------------------------------------------------------------------------
    def col(self, table: str, column: str, alias: str) -> str:
        return f"{alias}.{quote_ident(column)}" if self.src.has_column(table, column) else "NULL"

    def warn(self, text: str) -> None:
        self.meta.append(("warning", text))

    def absent(self, what: str, why: str) -> None:
        self.meta.append(("absent", f"{what}: {why}"))

    def scalar(self, sql: str):
        return self.con.execute(sql).fetchone()[0]

    def _strings(self) -> str:
        """The StringIds relation names are resolved from (also sets self.strings)."""
        if not self.src.has("StringIds"):
            raise ProfileError(f"{self.src.path} has no StringIds table, so no names can be resolved; re-export it with `nsys export --type sqlite`.")
        # One name per id: Nsight declares id the primary key, but a hand-edited or damaged file can repeat
        # one, and a plain join would then repeat every kernel that names it.
        strings = self.src.relation("StringIds", text=True)
        self.strings = f"(SELECT id, min(value) AS value FROM {strings} GROUP BY id)"
        return strings

    def run(self) -> None:
        strings = self._strings()
        dup = self.scalar(f"SELECT count(*) - count(DISTINCT id) FROM {strings}")
        if dup:
            self.warn(f"StringIds repeats {dup} id(s); the alphabetically first name of each is used")
        self._metadata()
        self._maps()
        self.progress(0.1, "reading CUDA API calls")
        self._runtime()
        self.progress(0.3, "reading kernels")
        self._kernels()
        self._graphs()
        self.progress(0.7, "reading memory operations")
        self._memops()
        self._memory()
        self._os_memory()
        self.progress(0.8, "reading NVTX ranges")
        self._markers()
        self._devices()
        self._processes()
        self._span()
        self.absent("cpu_ops", "only PyTorch traces have CPU operators")
        for table in self.src.tables:  # comm_summary reads the MPI tables; they are small
            if table.startswith("MPI_"):
                self.src.copy(table)
        self.con.executemany("INSERT INTO trace_meta VALUES (?, ?)", self.meta)
        for t in ("_apiname", "_rt", "_copykind", "_memkind"):
            self.con.execute(f"DROP TABLE IF EXISTS {t}")

    # -- metadata -----------------------------------------------------------------------------------
    def _metadata(self) -> None:
        table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if self.src.has(t)), None)
        rows = dict(self.src.query(f"SELECT name, value FROM {quote_ident(table)}", table=table)) if table else {}
        self.meta += [("format", "nsys"), ("format_version", rows.get("EXPORT_SCHEMA_VERSION") or ""),
                      ("product_version", rows.get("EXPORT_PRODUCT_VERSION") or "")]
        if table is None:
            self.warn("no META_DATA_EXPORT or EXPORT_META_DATA table (export from about 2021 or earlier): Nsight and schema versions unknown")
        if rows.get("EXPORT_PLATFORM"):
            self.meta.append(("platform", rows["EXPORT_PLATFORM"]))
        if self.src.has_column("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            utc = self.src.query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1",
                                 table="TARGET_INFO_SESSION_START_TIME")
            if utc and utc[0][0] is not None:
                self.meta.append(("session_start_utc_ns", str(int(utc[0][0]))))

    def _maps(self) -> None:
        """Copy-kind and memory-kind lookup tables, from the file's ENUM tables when it has them."""
        copy = COPY_KINDS
        if self.src.has("ENUM_CUDA_MEMCPY_OPER"):
            short = {n.upper(): n for n in set(COPY_KINDS.values())}
            # CAST and typeof: a damaged or hand-edited enum can hold blobs or text ids
            rows = self.src.query("SELECT id, CAST(name AS TEXT) AS name FROM ENUM_CUDA_MEMCPY_OPER WHERE typeof(id) = 'integer'",
                                  table="ENUM_CUDA_MEMCPY_OPER")
            copy = {i: short.get((name or "").removeprefix("CUDA_MEMCPY_KIND_").removeprefix("UVM_"), "Unknown") for i, name in rows}
            uvm = {i for i, name in rows if "UVM" in (name or "")}
        else:
            uvm = {11, 12, 13}
            if self.src.has(MEMCPY):
                self.warn("no ENUM_CUDA_MEMCPY_OPER table: built-in copy-kind map used")
        mem = (dict(self.src.query("SELECT id, CAST(label AS TEXT) AS label FROM ENUM_CUDA_MEM_KIND WHERE typeof(id) = 'integer'",
                                    table="ENUM_CUDA_MEM_KIND"))
               if self.src.has("ENUM_CUDA_MEM_KIND") else MEM_KINDS)
        self.con.execute("CREATE TEMP TABLE _copykind (id BIGINT, kind VARCHAR, managed BOOLEAN)")
        self.con.executemany("INSERT INTO _copykind VALUES (?, ?, ?)", [(i, k, i in uvm) for i, k in copy.items()])
        self.con.execute("CREATE TEMP TABLE _memkind (id BIGINT, label VARCHAR)")
        self.con.executemany("INSERT INTO _memkind VALUES (?, ?)", list(mem.items()))

    # -- host API calls -----------------------------------------------------------------------------
    def _runtime(self) -> None:
        self.con.execute("CREATE TEMP TABLE _rt (start BIGINT, \"end\" BIGINT, eventClass INTEGER, globalTid BIGINT, correlationId BIGINT, nameId BIGINT)")
        if not self.src.has(RUNTIME):
            self.absent("api_calls", f"no {RUNTIME} table (CUDA API tracing was off)")
            return
        # One scan of the (often multi-million-row) table serves the API calls and the GPU-side links.
        self.con.execute(f"""INSERT INTO _rt SELECT start, "end", eventClass, globalTid, correlationId, nameId
                             FROM {self.src.relation(RUNTIME)} WHERE eventClass <> {BACKTRACE_CLASS}""")
        # nsys reports strip `_vNNNNN` (substr(name,-6,2)='_v'); driver names also end in `_v2`. Folding the
        # few distinct strings, not every call, keeps the regex off the per-event path.
        self.con.execute(f"CREATE TEMP TABLE _apiname AS SELECT id, regexp_replace(value, '_v[0-9]+$', '') AS name FROM {self.strings}")
        record_query(self.con, count_sql("api_calls", "_rt", time_checks()))
        # Event ids: cudaEventRecord calls from the CUDA event trace, event syncs and stream waits from their
        # SYNCHRONIZATION rows, both by (process, correlationId). 0xFFFFFFFF means no event; syncType is not used
        # because its numbering moved (2022 exports: 2 = event sync; 2024+: 1 = event sync, 2 = stream wait).
        ev = [f"SELECT TRY_CAST(e.globalPid AS BIGINT) >> 24 AS gp, TRY_CAST(e.correlationId AS BIGINT) AS corr, "
              f"TRY_CAST(e.eventId AS BIGINT) AS eventId FROM {self.src.relation(t)} e"
              for t in (CUDA_EVENT, SYNC)
              if self.src.has(t) and all(self.src.has_column(t, c) for c in ("globalPid", "correlationId", "eventId"))]
        self.con.execute("CREATE TEMP TABLE _evid (gp BIGINT, corr BIGINT, event_id BIGINT)")
        if ev:
            self.con.execute(f"""INSERT INTO _evid SELECT gp, corr, min(eventId) FROM ({' UNION ALL '.join(ev)})
                                 WHERE eventId <> 4294967295 AND corr IS NOT NULL AND gp IS NOT NULL GROUP BY gp, corr""")
        self.con.execute(
            f"""INSERT INTO api_calls
                SELECT {PID.format(g='r.globalTid')}, {TID.format(g='r.globalTid')}, r.start, greatest(r."end", r.start),
                       greatest(r."end", r.start) - r.start,
                       coalesce(s.name, 'unknown API (StringIds ' || r.nameId || ')'),
                       CASE r.eventClass WHEN 0 THEN 'cuda_runtime' WHEN 1 THEN 'cuda_driver' ELSE 'cuda_class_' || r.eventClass END,
                       r.correlationId, NULL, e.event_id
                FROM _rt r LEFT JOIN _apiname s ON s.id = r.nameId
                LEFT JOIN _evid e ON e.gp = r.globalTid >> 24 AND e.corr = r.correlationId
                WHERE r.start IS NOT NULL AND r."end" IS NOT NULL""")

    # -- GPU work -----------------------------------------------------------------------------------
    def _gpu_rows(self, table: str, what: str, model: str, select: str, joins: str = "") -> None:
        """INSERT GPU activity rows linked to their launching call (same correlationId and process)."""
        graph = "" if model == "memops" else f"{self.col(table, 'graphId', 'k')},"
        # kernels: whole_graph, then communicator and collective (set from NCCL payloads once those are read)
        whole = {KERNEL: ", false, NULL, NULL", GRAPH_TRACE: ", true, NULL, NULL"}.get(table, "")
        mine = {KERNEL: "NOT whole_graph", GRAPH_TRACE: "whole_graph", MEMSET: "op = 'set'"}.get(table, "op = 'copy'")
        rel = self.src.relation(table)

        def insert(launch: str) -> int:
            # The calls are the hash side, as written. DuckDB would pick the side it estimates smaller, and the scanner
            # estimates the GPU table at its max rowid - 1: with one launch per kernel it built on the GPU rows, every
            # column of them, and a 10 M-kernel export ran out of a 128 MiB limit where the two join columns fit.
            with setting(self.con, "disabled_optimizers", "build_side_probe_side"):
                return self.con.execute(
                    f"""INSERT INTO {model}
                        SELECT {select}, k.correlationId, {graph} {PID.format(g='k.globalPid')}, {TID.format(g='l.globalTid')},
                               l.globalTid IS NOT NULL{whole}
                        FROM {rel} k LEFT JOIN {launch} l ON l.globalTid >> 24 = k.globalPid >> 24 AND l.correlationId = k.correlationId
                        {joins} WHERE k.start IS NOT NULL AND k."end" IS NOT NULL AND k.deviceId IS NOT NULL""").fetchone()[0]

        # CUPTI makes (process, correlationId) unique among API calls; should an export break that, the
        # join would duplicate GPU rows, so redo it against one call per pair. Exports are written
        # append-only, so max(rowid) is the row count at O(log n); only on a mismatch is the table scanned
        # for rows left out (no times, no device), and any mismatch left after them takes the safe path.
        inserted = insert("_rt")
        rows = self.src.query(f"SELECT coalesce(max(rowid), 0) FROM {quote_ident(table)}", table=table)[0][0]
        if inserted != rows:
            missing_time, _ = time_checks("k.start", 'k."end"')
            skipped = self.con.execute(count_sql(model, f"{rel} k", [
                missing_time, ("k.deviceId IS NULL", "skipped", "deviceId is missing or not an integer")])).fetchall()
            record(self.con, skipped)
            rows -= sum(n for _, _, n, _ in skipped)
        if inserted != rows:
            self.con.execute(f"DELETE FROM {model} WHERE {mine}")
            insert("(SELECT min(globalTid) AS globalTid, correlationId FROM _rt GROUP BY globalTid >> 24, correlationId)")
            self.warn(f"{RUNTIME} repeats correlation ids within a process: {what} linked to the first thread that used each id")
        # One pass counts both; the UPDATE below leaves `launched` alone, so `unlinked` is unaffected by it.
        bad, unlinked = self.con.execute(
            f"SELECT count(*) FILTER (WHERE dur_ns < 0), count(*) FILTER (WHERE NOT launched) FROM {model} WHERE {mine}").fetchone()
        if bad:
            self.con.execute(f"UPDATE {model} SET end_ns = start_ns, dur_ns = 0 WHERE dur_ns < 0 AND {mine}")
            record(self.con, [(model, "repaired", bad, END_BEFORE_START)])
        if unlinked and self.src.has(RUNTIME):
            self.warn(f"{unlinked} {what} have no launching API call in the profile")

    def _kernels(self) -> None:
        if not self.src.has(KERNEL):
            self.absent("kernels", f"no {KERNEL} table (no kernels ran, or CUDA tracing was off)")
            return
        k = lambda c: self.col(KERNEL, c, "k")  # noqa: E731
        self._gpu_rows(KERNEL, "kernels", "kernels", f"""
            k.deviceId, k.streamId, k.start, k."end", k."end" - k.start,
            coalesce(dn.value, sn.value, 'unknown kernel (StringIds ' || k.demangledName || ')'),
            coalesce(sn.value, dn.value, 'unknown kernel (StringIds ' || k.shortName || ')'),
            {k('gridX')}, {k('gridY')}, {k('gridZ')}, {k('blockX')}, {k('blockY')}, {k('blockZ')},
            {k('registersPerThread')}, {k('staticSharedMemory')}, {k('dynamicSharedMemory')}""",
            f"LEFT JOIN {self.strings} dn ON dn.id = k.demangledName LEFT JOIN {self.strings} sn ON sn.id = k.shortName")

    def _graphs(self) -> None:
        """Whole-graph executions (GRAPH_TRACE: Nsight's default --cuda-graph-trace=graph) as kernels rows with
        whole_graph = true, so every GPU-time figure counts them as GPU work; the kernels inside are not in the export."""
        if not self.src.has(GRAPH_TRACE):
            return
        self._gpu_rows(GRAPH_TRACE, "CUDA graph executions", "kernels", f"""
            k.deviceId, k.streamId, k.start, k."end", k."end" - k.start,
            'CUDA graph ' || coalesce(CAST({self.col(GRAPH_TRACE, 'graphId', 'k')} AS VARCHAR), '?'),
            'CUDA graph ' || coalesce(CAST({self.col(GRAPH_TRACE, 'graphId', 'k')} AS VARCHAR), '?'),
            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL""")
        # A launch whose kernels are also in the KERNEL table would count its GPU time twice: the kernels win.
        both = self.con.execute("""
            DELETE FROM kernels g WHERE g.whole_graph AND EXISTS (
                SELECT 1 FROM kernels k WHERE NOT k.whole_graph AND k.device_id = g.device_id
                AND k.pid IS NOT DISTINCT FROM g.pid AND k.correlation_id = g.correlation_id)""").fetchone()[0]
        if both:
            self.warn(f"{both} rows of {GRAPH_TRACE} repeat graph launches whose kernels are in {KERNEL}: left out, "
                      "the kernels kept")
        n = self.scalar("SELECT count(*) FROM kernels WHERE whole_graph")
        if n:
            self.warn(f"{n} CUDA graph launches were traced whole ({GRAPH_TRACE}, nsys --cuda-graph-trace=graph): each is "
                      "one kernels row named 'CUDA graph <id>' (whole_graph = true) without the kernels inside; "
                      "re-capture with `nsys profile --cuda-graph-trace=node` for per-kernel detail")

    def _memops(self) -> None:
        if not (self.src.has(MEMCPY) or self.src.has(MEMSET)):
            self.absent("memops", f"no {MEMCPY}/MEMSET tables (no copies or sets ran, or CUDA tracing was off)")
            return
        if self.src.has(MEMCPY):
            c = lambda col: self.col(MEMCPY, col, "k")  # noqa: E731
            self._gpu_rows(MEMCPY, "memory copies", "memops", f"""
                k.deviceId, k.streamId, k.start, k."end", k."end" - k.start, 'copy', coalesce(ck.kind, 'Unknown'), k.bytes,
                CASE WHEN ck.managed THEN 'Managed' ELSE sk.label END, CASE WHEN ck.managed THEN 'Managed' ELSE dk.label END,
                {c('srcDeviceId')}, {c('dstDeviceId')}""",
                f"""LEFT JOIN _copykind ck ON ck.id = k.copyKind LEFT JOIN _memkind sk ON sk.id = {c('srcKind')}
                    LEFT JOIN _memkind dk ON dk.id = {c('dstKind')}""")
        if self.src.has(MEMSET):
            self._gpu_rows(MEMSET, "memory sets", "memops", """
                k.deviceId, k.streamId, k.start, k."end", k."end" - k.start, 'set', 'memset', k.bytes, NULL, mk.label, NULL, NULL""",
                f"LEFT JOIN _memkind mk ON mk.id = {self.col(MEMSET, 'memKind', 'k')}")

    # -- device memory --------------------------------------------------------------------------------
    def _memory(self) -> None:
        """memory_events from CUDA_GPU_MEMORY_USAGE_EVENTS: one row per allocation (memoryOperationType 0) or free (1),
        bytes positive in both, so frees are negated; the site is the variable name when the export has one, else the
        API call with the row's correlationId in its process.

        Reserved memory is what the device's CUDA memory pools (stream-ordered allocator) hold: each pool's size is
        known at its CUDA_GPU_MEMORY_POOL_EVENTS rows (created / trimmed: localMemoryPoolSize; destroyed: 0) and at
        every allocation or free made from it (localMemoryPoolAddress / localMemoryPoolSize). total_reserved_bytes is
        the sum over the device's pools of their latest size, carried forward to every later row of the device; pool
        rows are memory_events rows of kind 'pool' (bytes 0). Memory allocated outside pools (cudaMalloc) is in no pool."""
        if not self.src.has(MEMORY_USAGE):
            self.absent("memory_events", f"no {MEMORY_USAGE} table (capture with `nsys profile --cuda-memory-usage=true`)")
            return
        m = lambda c: self.col(MEMORY_USAGE, c, "m")  # noqa: E731
        rel = f"(SELECT {m('start')} AS start, {m('globalPid')} AS globalPid, {m('deviceId')} AS deviceId, {m('address')} AS address, " \
              f"{m('bytes')} AS bytes, {m('memKind')} AS memKind, {m('memoryOperationType')} AS op, " \
              f"CAST({m('name')} AS VARCHAR) AS name, {m('correlationId')} AS correlationId, " \
              f"{m('localMemoryPoolAddress')} AS pool, {m('localMemoryPoolSize')} AS pool_size " \
              f"FROM {self.src.relation(MEMORY_USAGE, text=True)} m)"
        record_query(self.con, count_sql("memory_events", rel, [
            ("start IS NULL", "skipped", "start is missing or not an integer"),
            ("deviceId IS NULL", "skipped", "deviceId is missing or not an integer"),
            ("bytes IS NULL OR bytes < 0", "skipped", "bytes is missing, negative or not an integer"),
            ("op IS NULL OR op NOT IN (0, 1)", "skipped", "memoryOperationType is not 0 (allocation) or 1 (deallocation)")]))
        if self.src.has(MEMORY_POOL):
            p = lambda c: self.col(MEMORY_POOL, c, "p")  # noqa: E731
            pools = f"(SELECT {p('start')} AS start, {p('globalPid')} AS globalPid, {p('deviceId')} AS deviceId, " \
                    f"{p('address')} AS pool, {p('operationType')} AS op, {p('localMemoryPoolSize')} AS pool_size, " \
                    f"{p('correlationId')} AS correlationId FROM {self.src.relation(MEMORY_POOL, text=True)} p)"
            record_query(self.con, count_sql("memory_events", pools, [
                ("start IS NULL", "skipped", f"{MEMORY_POOL}: start is missing or not an integer"),
                ("deviceId IS NULL OR pool IS NULL", "skipped", f"{MEMORY_POOL}: deviceId or address is missing or not an integer"),
                ("op IS NULL OR op NOT IN (1, 2, 3)", "skipped", f"{MEMORY_POOL}: operationType is not 1 (created), 2 (destroyed) or 3 (trimmed)"),
                ("op <> 2 AND (pool_size IS NULL OR pool_size < 0)", "skipped",
                 f"{MEMORY_POOL}: localMemoryPoolSize is missing or negative on a create or trim")]))
        else:
            pools = "(SELECT NULL::BIGINT AS start, NULL::BIGINT AS globalPid, NULL::BIGINT AS deviceId, NULL::BIGINT AS pool, " \
                    "NULL::BIGINT AS op, NULL::BIGINT AS pool_size, NULL::BIGINT AS correlationId WHERE false)"
        api = "_apiname" if self.src.has(RUNTIME) else "(SELECT NULL::BIGINT AS id, NULL::VARCHAR AS name)"
        # Ties at one ns keep the export's order (rowid), which the analyses use as tie-break; a pool event goes before
        # an allocation at the same ns (a pool exists before memory is taken from it).
        with setting(self.con, "preserve_insertion_order", True):
            self.con.execute(f"""
                INSERT INTO memory_events
                WITH ev AS (
                    SELECT start, globalPid, deviceId, address, bytes, memKind, op, name, correlationId,
                           nullif(pool, 0) AS pool, pool_size, 1 AS src, row_number() OVER () AS k
                    FROM {rel} WHERE start IS NOT NULL AND deviceId IS NOT NULL AND bytes >= 0 AND op IN (0, 1)
                    UNION ALL
                    SELECT start, globalPid, deviceId, NULL, 0, NULL, 10 + op, NULL, correlationId, pool,
                           CASE WHEN op = 2 THEN 0 ELSE pool_size END, 0, row_number() OVER ()
                    FROM {pools} WHERE start IS NOT NULL AND deviceId IS NOT NULL AND pool IS NOT NULL AND op IN (1, 2, 3)
                          AND (op = 2 OR pool_size >= 0)),
                -- a pool's size change at each row that states it, summed per device in time order
                sized AS (
                    SELECT *, CASE WHEN pool IS NOT NULL AND pool_size IS NOT NULL THEN
                                   pool_size - coalesce(lag(pool_size) OVER (PARTITION BY deviceId, globalPid >> 24, pool,
                                                                             pool_size IS NULL ORDER BY start, src, k), 0)
                              END AS delta
                    FROM ev),
                lv AS (
                    SELECT *, CASE WHEN count(delta) OVER w > 0 THEN sum(delta) OVER w END AS reserved
                    FROM sized WINDOW w AS (PARTITION BY deviceId ORDER BY start, src, k ROWS UNBOUNDED PRECEDING))
                SELECT CASE WHEN k.label IN ('Pinned', 'Pageable') THEN NULL ELSE m.deviceId END,
                       CASE WHEN m.src = 0 THEN 'Device' ELSE coalesce(k.label, 'Unknown') END,
                       {PID.format(g='m.globalPid')}, {TID.format(g='r.globalTid')},
                       m.start, CASE WHEN m.op = 1 THEN -m.bytes ELSE m.bytes END, m.address, NULL,
                       CASE WHEN k.label IN ('Pinned', 'Pageable') THEN NULL ELSE m.reserved END,
                       CASE m.op WHEN 0 THEN 'alloc' WHEN 1 THEN 'free' ELSE 'pool' END,
                       CASE m.op WHEN 11 THEN 'memory pool created' WHEN 12 THEN 'memory pool destroyed'
                                 WHEN 13 THEN 'memory pool trimmed' ELSE coalesce(nullif(m.name, ''), a.name) END,
                       nullif(m.correlationId, 0)
                FROM lv m LEFT JOIN _memkind k ON k.id = m.memKind
                LEFT JOIN (SELECT * FROM _rt WHERE correlationId <> 0
                           QUALIFY row_number() OVER (PARTITION BY globalTid >> 24, correlationId ORDER BY start) = 1) r
                       ON r.globalTid >> 24 = m.globalPid >> 24 AND r.correlationId = m.correlationId
                LEFT JOIN {api} a ON a.id = r.nameId
                ORDER BY m.start, m.src, m.k""")

    def _os_memory(self) -> None:
        """os_memory_levels from the WDDM tables: one row per ETW event, the process's new usage or budget in a segment
        group (bytes, a level). The export's `gpu` is the adapter index TARGET_INFO_GPU numbers (the 2022.1 Windows
        exports: gpu 0 = the GeForce, whose local budget fits its memory size)."""
        parts = []
        for i, (metric, (table, column)) in enumerate(OS_MEMORY.items()):
            if not self.src.has(table):
                continue
            c = lambda col: self.col(table, col, "m")  # noqa: E731
            rel = (f"(SELECT {c('timestamp')} AS ts, {c('globalTid')} AS g, {c('gpu')} AS gpu, {c(column)} AS bytes, "
                   f"{c('segmentGroup')} AS seg FROM {self.src.relation(table, text=True)} m)")
            record_query(self.con, count_sql("os_memory_levels", rel, [
                ("ts IS NULL", "skipped", f"{table}: timestamp is missing or not an integer"),
                ("gpu IS NULL OR gpu NOT BETWEEN 0 AND 2147483647", "skipped", f"{table}: gpu is missing, negative or not an integer"),
                ("bytes IS NULL OR bytes < 0", "skipped", f"{table}: {column} is missing, negative or not an integer"),
                ("seg IS NULL", "skipped", f"{table}: segmentGroup is missing or not an integer")]))
            parts.append(f"SELECT ts, g, gpu, {quote_literal(metric)} AS metric, seg, bytes, {i} AS src, row_number() OVER () AS k "
                         f"FROM {rel} WHERE ts IS NOT NULL AND gpu BETWEEN 0 AND 2147483647 AND bytes >= 0 AND seg IS NOT NULL")
        if not parts:
            return
        groups = " ".join(f"WHEN {n} THEN {quote_literal(label)}" for n, label in SEGMENT_GROUPS.items())
        with setting(self.con, "preserve_insertion_order", True):
            self.con.execute(f"""
                INSERT INTO os_memory_levels
                SELECT gpu, {PID.format(g='g')}, ts, metric, CASE seg {groups} ELSE 'segment group ' || seg END, bytes
                FROM ({' UNION ALL '.join(parts)}) ORDER BY ts, src, k""")

    # -- NVTX -----------------------------------------------------------------------------------------
    def _markers(self) -> None:
        if not self.src.has("NVTX_EVENTS"):
            self.absent("markers", "no NVTX_EVENTS table (the application emitted no NVTX annotations, or NVTX tracing was off)")
            return
        n = self.src.relation("NVTX_EVENTS", text=True)
        has = lambda c: self.src.has_column("NVTX_EVENTS", c)  # noqa: E731
        text = "CAST(n.text AS VARCHAR)" if has("text") else "NULL"
        text_id = "n.textId" if has("textId") else "NULL"
        dom = "n.domainId" if has("domainId") else "NULL"
        kinds = " ".join(f"WHEN {t} THEN '{k}'" for t, k in NVTX_KINDS.items())
        blob = "n.binaryData" if has("binaryData") else "NULL"
        # Domains are per process (eventType 75 rows, matched on domainId and the process bits); domain 0 is the default.
        self.con.execute(f"""
            CREATE TEMP TABLE _nvtx AS
            WITH named AS (SELECT n.start, n."end", n.eventType, n.globalTid, coalesce({dom}, 0) AS dom,
                                  coalesce({text}, s.value) AS label, {blob} AS blob
                           FROM {n} n LEFT JOIN {self.strings} s ON s.id = {text_id}),
                 domains AS (SELECT globalTid >> 24 AS proc, dom, min(label) AS domain FROM named WHERE eventType = 75 GROUP BY ALL)
            SELECT n.* EXCLUDE (blob), CASE WHEN n.dom = 0 THEN '' ELSE d.domain END AS domain,
                   CASE WHEN d.domain = 'NCCL' THEN n.blob END AS blob
            FROM named n LEFT JOIN domains d ON d.proc = n.globalTid >> 24 AND d.dom = n.dom
            WHERE n.eventType IN ({', '.join(map(str, NVTX_KINDS))}) AND n.start IS NOT NULL""")
        self.con.execute(f"""
            INSERT INTO markers
            SELECT {PID.format(g='globalTid')}, {TID.format(g='globalTid')}, start, greatest(coalesce("end", start), start),
                   greatest(coalesce("end", start), start) - start, coalesce(label, ''), domain,
                   CASE eventType {kinds} END, 'nvtx', NULL, NULL
            FROM _nvtx""")
        absent = nccl_payloads.load(self.con, self.src, "_nvtx")
        if absent:
            self.absent("nccl_calls", absent)
        self.con.execute("DROP TABLE _nvtx")
        # An end of NULL is an open range (warned about below), not damage; an end before the start is.
        record_query(self.con, count_sql("markers", f"{n} WHERE eventType IN ({', '.join(map(str, NVTX_KINDS))})", [
            ("start IS NULL", "skipped", "start time is missing or not an integer"), time_checks()[1]]))
        open_ranges = self.scalar(f"SELECT count(*) FROM {n} WHERE \"end\" IS NULL AND eventType IN (59, 60, 70, 71)")
        if open_ranges:
            self.warn(f"{open_ranges} NVTX ranges never ended in the capture: their end is set to their start")

    # -- devices --------------------------------------------------------------------------------------
    def _devices(self) -> None:
        used = "SELECT device_id FROM kernels UNION SELECT device_id FROM memops"
        if self.src.has("TARGET_INFO_GPU"):
            g = self.src.relation("TARGET_INFO_GPU", text=True)
            gid = "g.id" if self.src.has_column("TARGET_INFO_GPU", "id") else "g.deviceId"
            c = lambda col: self.col("TARGET_INFO_GPU", col, "g")  # noqa: E731
            old = self.src.has("TARGET_INFO_CUDA_GPU")
            o = self.src.relation("TARGET_INFO_CUDA_GPU", text=True) if old else None
            oc = lambda col, scale="": (f"o.{col}{scale}" if old and self.src.has_column("TARGET_INFO_CUDA_GPU", col) else "NULL")  # noqa: E731
            cd = self.src.has("TARGET_INFO_CUDA_DEVICE")
            cuda_set = (f"SELECT gpuId FROM {self.src.relation('TARGET_INFO_CUDA_DEVICE', text=True)}" if cd
                        else "SELECT deviceId FROM " + o if old else None)
            cd_sms = (f"(SELECT max(numMultiprocessors) FROM {self.src.relation('TARGET_INFO_CUDA_DEVICE', text=True)} x WHERE x.gpuId = {gid})"
                      if cd and self.src.has_column("TARGET_INFO_CUDA_DEVICE", "numMultiprocessors") else "NULL")
            # Without a CUDA-device list, a listed adapter is CUDA when it reports SMs or a compute capability.
            cuda = (f"{gid} IN ({cuda_set})" if cuda_set else f"coalesce({c('smCount')}, 0) > 0 OR coalesce({c('computeMajor')}, 0) > 0")
            major, minor = f"coalesce({c('computeMajor')}, {oc('computeCapabilityMajor')})", f"coalesce({c('computeMinor')}, {oc('computeCapabilityMinor')})"
            # Zero in a property column means "not reported" (non-CUDA adapters list zeros), hence NULLIF.
            self.con.execute(f"""
                INSERT INTO devices
                WITH o AS (SELECT * FROM {o or '(SELECT NULL AS deviceId)'} QUALIFY row_number() OVER (PARTITION BY deviceId) = 1)
                SELECT DISTINCT ON (device_id) * FROM (
                  SELECT {gid} AS device_id, coalesce(g.name, CAST({oc('name')} AS VARCHAR)) AS name,
                         CASE WHEN compute THEN 'NVIDIA' WHEN g.name ILIKE '%intel%' THEN 'Intel'
                              WHEN g.name ILIKE 'microsoft%' THEN 'Microsoft'
                              WHEN g.name ILIKE '%amd%' OR g.name ILIKE '%radeon%' THEN 'AMD' END,
                         compute,
                         nullif(coalesce(nullif({c('smCount')}, 0), {cd_sms}, {oc('numMultiprocessors')}), 0),
                         nullif(coalesce({c('totalMemory')}, {oc('globalMemorySize')}), 0),
                         nullif(coalesce({c('memoryBandwidth')}, {oc('globalMemoryBandwidth', ' * 1000')}), 0),
                         nullif(coalesce({c('clockRate')}, {oc('coreClockRate', ' * 1000')}), 0),
                         CASE WHEN {major} > 0 THEN {major} || '.' || {minor} END,
                         nullif(coalesce({c('threadsPerWarp')}, {oc('numThreadsPerWarp')}), 0),
                         nullif(CAST(g.busLocation AS VARCHAR), '')
                  FROM (SELECT * REPLACE (CAST(name AS VARCHAR) AS name), {cuda} OR {gid} IN ({used}) AS compute FROM {g} g) g
                  LEFT JOIN o ON o.deviceId = {gid})
                ORDER BY device_id""")
            others = [r[0] for r in self.con.execute("SELECT coalesce(name, '?') FROM devices WHERE NOT is_compute ORDER BY device_id").fetchall()]
            if others:
                self.warn(f"TARGET_INFO_GPU lists {len(others)} non-CUDA adapter{'s' if len(others) > 1 else ''} "
                          f"({'; '.join(others)}): listed with is_compute=false")
        missing = self.con.execute(f"SELECT device_id FROM ({used}) WHERE device_id NOT IN (SELECT device_id FROM devices) ORDER BY 1").fetchall()
        if missing:
            self.con.executemany("INSERT INTO devices (device_id, vendor, is_compute) VALUES (?, 'NVIDIA', true)", missing)
            self.warn(f"device ids {', '.join(str(m[0]) for m in missing)} ran GPU work but are not described in TARGET_INFO_GPU: "
                      "their name and properties are unknown")

    # -- processes and threads -------------------------------------------------------------------------
    def _processes(self) -> None:
        parts = ["SELECT pid, NULL AS name, NULL AS vm FROM kernels", "SELECT pid, NULL, NULL FROM memops",
                 "SELECT pid, NULL, NULL FROM api_calls", "SELECT pid, NULL, NULL FROM markers"]
        if self.src.has("PROCESSES"):
            p = self.src.relation("PROCESSES", text=True)
            parts.append(f"SELECT coalesce(pid, {PID.format(g='globalPid')}), CAST(name AS VARCHAR), globalPid >> 48 FROM {p}")
        else:
            self.warn("no PROCESSES table (export from about 2021 or earlier): process names unknown")
        threads = ["SELECT DISTINCT pid, tid, NULL AS name FROM api_calls", "SELECT DISTINCT pid, tid, NULL FROM markers"]
        if self.src.has("ThreadNames"):
            t = self.src.relation("ThreadNames", text=True)
            threads.append(f"""SELECT {PID.format(g='t.globalTid')}, {TID.format(g='t.globalTid')}, s.value
                               FROM {t} t LEFT JOIN {self.strings} s ON s.id = t.nameId""")
        self.con.execute(f"INSERT INTO threads SELECT pid, tid, max(name) FROM ({' UNION ALL '.join(threads)}) "
                         "WHERE pid IS NOT NULL AND tid IS NOT NULL GROUP BY ALL ORDER BY pid, tid")
        parts.append("SELECT pid, NULL, NULL FROM threads")
        ranks = "NULL"
        if self.src.has("MPI_RANKS"):
            ranks = (f"(SELECT min(rank) FROM {self.src.relation('MPI_RANKS', text=True)} m "
                     f"WHERE {PID.format(g='m.globalTid')} = u.pid)")
        hosts = []
        if self.src.has("TARGET_INFO_SYSTEM_ENV"):
            hosts = self.src.query("SELECT DISTINCT globalVid >> 48, value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'",
                                   table="TARGET_INFO_SYSTEM_ENV")
        if len({h for _, h in hosts}) == 1:
            host = quote_literal(str(hosts[0][1]))
        elif hosts:  # several hosts in one report: match on the VM bits of the process id
            host = "CASE u.vm " + " ".join(f"WHEN {int(v)} THEN {quote_literal(str(h))}" for v, h in hosts if v is not None) + " END"
        else:
            host = "NULL"
        self.con.execute(f"""
            INSERT INTO processes
            SELECT u.pid, u.name, {ranks}, {host} FROM (
                SELECT pid, max(name) AS name, max(vm) AS vm FROM ({' UNION ALL '.join(parts)}) WHERE pid IS NOT NULL GROUP BY pid) u
            ORDER BY u.pid""")

    # -- capture span ----------------------------------------------------------------------------------
    def _span(self) -> None:
        if self.src.has("ANALYSIS_DETAILS"):
            row = self.src.query("SELECT duration, startTime FROM ANALYSIS_DETAILS LIMIT 1", table="ANALYSIS_DETAILS")
            clock = None
            if self.src.has_column("TARGET_INFO_SESSION_START_TIME", "systemClockNs"):
                clock = self.src.query("SELECT systemClockNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1",
                                       table="TARGET_INFO_SESSION_START_TIME")
            if row and row[0][0] is not None:
                duration, start_time = int(row[0][0]), row[0][1]
                # Event times are relative to session start; ANALYSIS_DETAILS.startTime is on the target system
                # clock, which TARGET_INFO_SESSION_START_TIME.systemClockNs (3.x exports) ties to session start.
                tied = bool(clock and clock[0][0] is not None and start_time is not None)
                start = int(start_time) - int(clock[0][0]) if tied else 0
                source = "ANALYSIS_DETAILS: analysed session duration from session start" + (
                    "" if tied else " (taken as 0 on the event clock: this export has no TARGET_INFO_SESSION_START_TIME "
                                    "to place ANALYSIS_DETAILS.startTime on it)")
                self.meta += [("capture_start_ns", str(start)), ("capture_end_ns", str(start + duration)),
                              ("capture_span_source", source)]
                return
        parts = [f"SELECT min(start_ns) s, max(end_ns) e FROM {t}" for t in ("kernels", "memops", "api_calls", "markers")]
        for t in (SYNC, "OSRT_API"):
            if self.src.has(t):
                parts.append(f'SELECT min(start), max("end") FROM {self.src.relation(t)}')
        lo, hi = self.con.execute(f"SELECT min(s), max(e) FROM ({' UNION ALL '.join(parts)})").fetchone()
        if lo is not None:
            self.meta += [("capture_start_ns", str(int(lo))), ("capture_end_ns", str(int(hi))),
                          ("capture_span_source", "first to last event in the CUDA, NVTX, sync and OS-runtime tables (no ANALYSIS_DETAILS table)")]


# -- the first answer while the store builds ----------------------------------------------------------------
PREVIEW_MIN_KERNELS = 500_000  # smaller exports build their store in a few seconds: no preview
# Memory a preview kernel takes while answering: ~140 B in the table (uncompressed in memory) and ~60 B in the launch
# check's hash table. Beyond the preview's memory (limits.preview_memory_limit_bytes) the table is compressed into a file.
PREVIEW_BYTES_PER_KERNEL = 200


def preview(con: duckdb.DuckDBPyConnection, path: Path, names: bool = True, streams: bool = True) -> None:
    """Fill the model tables top_kernels reads, with the rows and counts the full reader and check_model give them.

    That is kernels (without their launching thread: tid is NULL, launched false), devices, the capture span
    and the kernels' data_issues, and of api_calls one row standing for the calls' capture bounds plus the calls
    of graph launches. One scan of the kernel and runtime tables into memory: the store's build repeats this work
    and more in the background.

    A preview answers one question, so it reads only what that question reads: without `names` (grouped by base
    name, no name filter) kernels.name is '' and the demangled names are not read; without `streams` (no stream
    filter) stream_id is NULL. kernels is a view of the table _kernels, which stores neither these constants nor
    dur_ns (end_ns - start_ns), and names as their StringIds ids. Where that table would outgrow the preview's
    memory it is kept compressed in a database file (~6 B a kernel), so nothing spills.

    Raises NoPreview where a cheap check cannot rule out a difference from the full reader: a small export
    (its store is quick), no SQLite scanner, memory copies or NVTX ranges without ANALYSIS_DETAILS (they
    move the capture span), whole-graph executions (GRAPH_TRACE: kernels rows of the store), names longer than
    MAX_NAME_CHARS (cut by check_model), kernels left out while the runtime table repeats correlation ids (the
    reader's row count check then decides differently), API call times further apart than the 64-bit ns range
    (the reader's call durations might overflow), or, without `names`, a base name missing from StringIds (the
    reader names the kernel after its demangled name then)."""
    src = SqliteSource(con, path)
    try:
        with setting(con, "preserve_insertion_order", False):
            if not (src.attached and src.has(KERNEL) and src.has("StringIds")):
                raise NoPreview("no scanner or no kernels")
            rows = src.query(f"SELECT coalesce(max(rowid), 0) FROM {quote_ident(KERNEL)}", table=KERNEL)[0][0]
            if rows < PREVIEW_MIN_KERNELS:
                raise NoPreview("small export")
            r = _Reader(con, src, lambda *_: None)
            strings = r._strings()
            if r.scalar(f"SELECT coalesce(max(length(value)), 0) FROM {strings}") > MAX_NAME_CHARS:
                raise NoPreview("long names")
            analysed = src.has("ANALYSIS_DETAILS") and (src.query("SELECT duration FROM ANALYSIS_DETAILS LIMIT 1", table="ANALYSIS_DETAILS")
                                                        or [(None,)])[0][0] is not None
            if not analysed and any(src.has(t) for t in (MEMCPY, MEMSET, "NVTX_EVENTS")):
                raise NoPreview("capture span needs more tables")
            if src.has(GRAPH_TRACE):  # whole-graph executions are kernels rows too (_graph_executions): the store has them
                raise NoPreview("graph-level trace")
            r._metadata()
            calls = graphs = None
            if src.has(RUNTIME):
                calls = f"""(SELECT {PID.format(g='globalTid')} AS pid, {TID.format(g='globalTid')} AS tid, start AS start_ns,
                                    greatest("end", start) AS end_ns, nameId, eventClass, correlationId AS correlation_id
                             FROM {src.relation(RUNTIME)} WHERE eventClass <> {BACKTRACE_CLASS} AND start IS NOT NULL AND "end" IS NOT NULL)"""
                con.execute(f"CREATE TEMP TABLE _apiname AS SELECT id, regexp_replace(value, '_v[0-9]+$', '') AS name FROM {r.strings}")
                graphs = r.scalar(f"SELECT count(*) FROM _apiname WHERE regexp_matches(name, {quote_literal(GRAPH_LAUNCH_RX)}, 'i')")
                if graphs:  # graph replays are marked from the calls themselves: keep them (scanned twice otherwise)
                    con.execute(f"CREATE TEMP TABLE _calls AS SELECT * FROM {calls}")
                    calls = "_calls"
            # A table outgrowing memory is kept in a compressed database file instead (~6 B a kernel; deleted now, it lives
            # as long as the connection). In memory, 10 M kernels spilled: top_kernels' query took twice the CPU, and the
            # compression this costs while inserting is less than that.
            table = "_kernels"
            if rows * PREVIEW_BYTES_PER_KERNEL > preview_memory_limit_bytes():
                file = scratch_dir() / f"preview-{uuid.uuid4().hex}.duckdb"
                con.execute(f"ATTACH {quote_literal(str(file))} AS _preview")
                file.unlink()
                table = "_preview._kernels"
            k = lambda c: r.col(KERNEL, c, "k")  # noqa: E731
            # kernels is a view of a narrower table: what the question does not read is not stored, nor dur_ns (end - start),
            # and names are kept as their StringIds ids, resolved by the view from the few names used (joining the names
            # while scanning took a fifth of the insert's CPU at 10 M kernels, more than the view's joins cost). The view
            # passes rowid on (graph_kids joins on it).
            con.execute(f"""DROP TABLE kernels;
                CREATE TABLE {table} (device_id INTEGER NOT NULL, {'stream_id BIGINT, ' if streams else ''}start_ns BIGINT NOT NULL,
                    end_ns BIGINT NOT NULL, {'name_id BIGINT, ' if names else ''}short_id BIGINT, grid_x INTEGER, grid_y INTEGER,
                    grid_z INTEGER, block_x INTEGER, block_y INTEGER, block_z INTEGER, registers_per_thread INTEGER,
                    static_shared_bytes BIGINT, dynamic_shared_bytes BIGINT, correlation_id BIGINT, graph_id BIGINT, pid BIGINT)""")
            inserted = con.execute(f"""
                INSERT INTO {table}
                SELECT k.deviceId, {'k.streamId, ' if streams else ''}k.start, k."end", {'k.demangledName, ' if names else ''}k.shortName,
                       {k('gridX')}, {k('gridY')}, {k('gridZ')}, {k('blockX')}, {k('blockY')}, {k('blockZ')},
                       {k('registersPerThread')}, {k('staticSharedMemory')}, {k('dynamicSharedMemory')},
                       k.correlationId, {k('graphId')}, {PID.format(g='k.globalPid')}
                FROM {src.relation(KERNEL)} k
                WHERE k.start IS NOT NULL AND k."end" IS NOT NULL AND k.deviceId IS NOT NULL""").fetchone()[0]
            if inserted != rows:  # as _gpu_rows: the rows left out, counted when the reader's row check counts them
                if src.has(RUNTIME) and r.scalar(
                        f"""SELECT count(*) FROM (SELECT 1 FROM {src.relation(RUNTIME)} WHERE eventClass <> {BACKTRACE_CLASS}
                            GROUP BY globalTid >> 24, correlationId HAVING count(*) > 1)"""):
                    raise NoPreview("rows left out and correlation ids repeat")
                missing_time, _ = time_checks("k.start", 'k."end"')
                record(con, con.execute(count_sql("kernels", f"{src.relation(KERNEL)} k", [
                    missing_time, ("k.deviceId IS NULL", "skipped", "deviceId is missing or not an integer")])).fetchall())
            # The names of the ids used (one per id, as the reader's join gives them).
            con.execute(f"""CREATE TABLE _names AS SELECT id, value FROM {r.strings}
                            WHERE id IN (SELECT DISTINCT short_id FROM {table}{' UNION SELECT DISTINCT name_id FROM ' + table if names else ''})""")
            # end - start of every row, as the reader computes dur_ns (it fails where that overflows)
            bad = r.scalar(f"SELECT count(*) FILTER (WHERE end_ns - start_ns < 0) FROM {table}")
            # Without names, a base name missing from StringIds would be NULL here (the reader takes the demangled name).
            if not names and r.scalar(f"SELECT count(*) FROM {table} k ANTI JOIN _names n ON n.id = k.short_id"):
                raise NoPreview("base names missing from StringIds")
            if bad:
                con.execute(f"UPDATE {table} SET end_ns = start_ns WHERE end_ns < start_ns")
                record(con, [("kernels", "repaired", bad, END_BEFORE_START)])
            name, short, join = (
                ("coalesce(dn.value, sn.value, 'unknown kernel (StringIds ' || k.name_id || ')')",
                 "coalesce(sn.value, dn.value, 'unknown kernel (StringIds ' || k.short_id || ')')",
                 "LEFT JOIN _names dn ON dn.id = k.name_id") if names else ("''", "sn.value", ""))
            con.execute(f"""
                CREATE VIEW kernels AS
                SELECT k.rowid AS rowid, k.device_id, {'k.stream_id' if streams else 'NULL::BIGINT AS stream_id'}, k.start_ns, k.end_ns,
                       k.end_ns - k.start_ns AS dur_ns, {name} AS name, {short} AS short_name, k.grid_x, k.grid_y, k.grid_z,
                       k.block_x, k.block_y, k.block_z, k.registers_per_thread, k.static_shared_bytes, k.dynamic_shared_bytes,
                       k.correlation_id, k.graph_id, k.pid, NULL::BIGINT AS tid, false AS launched, false AS whole_graph,
                       NULL::VARCHAR AS communicator, NULL::VARCHAR AS collective  -- top_kernels reads neither
                FROM {table} k LEFT JOIN _names sn ON sn.id = k.short_id {join}""")
            if calls is not None:
                # With the kernels compressed, nothing else holds memory during the launch check: its hash table (one entry
                # a call) gets the whole limit, not the preview's share, and spills less (10 M calls: 3.3 s CPU, not 4.0).
                limit = f"{memory_limit_bytes() // 2**20}MiB" if table != "_kernels" else None
                with setting(con, "memory_limit", limit) if limit else nullcontext():
                    _launches(con, calls, graphs, table)
                con.execute("DROP TABLE IF EXISTS _launch; DROP TABLE IF EXISTS _calls")
            r._devices()
            r._span()
            con.executemany("INSERT INTO trace_meta VALUES (?, ?)", r.meta)
    except duckdb.Error as exc:  # whatever the full reader makes of it, it will say so
        raise NoPreview(str(exc)) from None
    finally:
        src.close()


_NS_MAX = 2**63 - 1


def _launches(con: duckdb.DuckDBPyConnection, calls: str, graphs: int, kernels: str) -> None:
    """The preview's api_calls rows and check_model's launch check (a kernel starting before the first call of its
    (process, correlation id) loses its link), from `calls`: the runtime table's calls as the reader reads them.

    One join of the calls with the kernels gives the calls' capture bounds and, counting the matches where the call
    starts after the kernel, proves in the usual case (none) that no kernel starts before its launching call without
    grouping the calls by pair; the pairs' first calls are grouped only where some match says otherwise, or where
    graph-launch calls are kept."""
    first, last, later = con.execute(f"""
        SELECT min(c.start_ns), max(c.end_ns), count(*) FILTER (WHERE c.start_ns > k.start_ns)
        FROM {calls} c LEFT JOIN {kernels} k ON k.pid = c.pid AND k.correlation_id = c.correlation_id""").fetchone()
    if first is None:
        return
    if last - first > _NS_MAX:
        raise NoPreview("API call times span more than the 64-bit ns range")
    # One row standing for the calls' capture bounds (no process, no correlation id, name '(capture bounds)').
    con.execute("""INSERT INTO api_calls VALUES (NULL, NULL, ?, ?, ?, '(capture bounds)', 'cuda_runtime', NULL, NULL, NULL)""",
                [first, last, last - first])
    if not (graphs or later):
        return
    # The launching call of a (process, correlation id) is its first by (start, end, name), so it starts at the
    # pair's earliest start (a NULL process or id is a pair of its own here, never matched by the joins below).
    con.execute(f"""CREATE TEMP TABLE _launch AS SELECT pid, correlation_id, min(start_ns) AS call_start FROM {calls}
                    GROUP BY pid, correlation_id""")
    if graphs:
        # Of every pair with a graph-launch call at its earliest start, all its calls there: graph_summary picks
        # the first among them exactly as among all calls.
        con.execute(f"""
            INSERT INTO api_calls
            SELECT c.pid, c.tid, c.start_ns, c.end_ns, c.end_ns - c.start_ns,
                   coalesce(s.name, 'unknown API (StringIds ' || c.nameId || ')'),
                   CASE c.eventClass WHEN 0 THEN 'cuda_runtime' WHEN 1 THEN 'cuda_driver' ELSE 'cuda_class_' || c.eventClass END,
                   c.correlation_id, NULL, NULL
            FROM {calls} c JOIN _launch l ON l.pid = c.pid AND l.correlation_id = c.correlation_id AND c.start_ns = l.call_start
            LEFT JOIN _apiname s ON s.id = c.nameId
            QUALIFY bool_or(regexp_matches(coalesce(s.name, ''), {quote_literal(GRAPH_LAUNCH_RX)}, 'i'))
                    OVER (PARTITION BY c.pid, c.correlation_id)""")
    early = 0
    if later:
        # counted first: a join that changes nothing costs half an UPDATE that rewrites nothing
        launch_check = "k.pid = c.pid AND k.correlation_id = c.correlation_id AND k.start_ns < c.call_start"
        early = con.execute(f"SELECT count(*) FROM {kernels} k JOIN _launch c ON {launch_check}").fetchone()[0]
        if early:
            con.execute(f"UPDATE {kernels} AS k SET correlation_id = NULL FROM _launch c WHERE {launch_check}")
    record(con, [("kernels", "repaired", early, LAUNCH_BEFORE_CALL)])
