"""Legacy rocmProfileData (RPD, "rocpd" schema 2, roctracer era) → the trace model.

Tables (profile-schemas.md §2.6): rocpd_op (GPU ops: kernels, copies, fills) linked to rocpd_api
(host calls) through rocpd_api_ops; launch parameters in rocpd_kernelapi / rocpd_copyapi. The
tracer writes '' into integer columns it has no value for, so those tables are read through the
lenient sqlite3 copy and every number goes through TRY_CAST ('' → NULL, never 0).

Semantics:
  * device_id = rocpd_op.gpuId; stream_id = rocpd_op.queueId (set on every op, linked or not);
  * correlation_id = the rocpd_api id of the launching call (the key rocpd_api_ops links by);
  * kernel grid: rpd_tracer stores hipLaunchKernel/hipModuleLaunchKernel grids in blocks but
    hipExtModuleLaunchKernel/hipHccModuleLaunchKernel grids as global work sizes (work-items), so
    those are divided by the workgroup size;
  * rocpd_kernelapi.groupSegmentSize is the launch's sharedMemBytes argument, i.e. dynamic LDS;
  * rocpd_api also holds rocTX markers (apiName 'UserMarker', text in args) and the tracer's own
    bookkeeping rows (OpTable::writeRows, ...); only allow-listed API families become api_calls.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ..detect import Detected
from ..errors import ProfileError
from ..quote import quote_ident
from ..sqlite_source import SqliteSource
from ..names import create_short_names
from ..quality import count_sql, record_query, time_checks

KERNEL_OPS = ("KernelExecution", "DispatchKernel")
COPY_OPS = {
    "CopyHostToDevice": "HtoD", "CopyDeviceToHost": "DtoH", "CopyDeviceToDevice": "DtoD",
    "CopyHostToHost": "HtoH", "CopyPeerToPeer": "PtoP",
}
FILL_OPS = ("FillBuffer",)
WORKITEM_GRID_APIS = ("hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel")
API_FAMILY = "CASE WHEN {n} LIKE 'hip%' THEN 'hip' WHEN {n} LIKE 'hsa\\_%' ESCAPE '\\' THEN 'hsa' WHEN {n} LIKE 'nccl%' OR {n} LIKE 'rccl%' THEN 'rccl' END"
MARKER_API = "({n} = 'UserMarker' OR {n} LIKE 'roctx%')"
# The tables each model table is read from: a cell the reader repaired in one (data_issues 'native."T"') stands behind
# that table's rows, and the tools that read them say so.
_OPS = ("rocpd_op", "rocpd_api_ops", "rocpd_api", "rocpd_string")
NATIVE_SOURCES = {
    "kernels": (*_OPS, "rocpd_kernelapi", "rocpd_kernelcodeobject"),
    "memops": (*_OPS, "rocpd_copyapi"),
    "api_calls": ("rocpd_api", "rocpd_string"),
    "markers": ("rocpd_api", "rocpd_string"),
    "devices": ("rocpd_op",),
    "processes": ("rocpd_api",),
    "threads": ("rocpd_api",),
}
# Times present and a device to put the op on; a row failing them is counted in data_issues, never dropped silently.
GPU_OK = """start IS NOT NULL AND "end" IS NOT NULL AND gpuId IS NOT NULL"""
HOST_OK = """start IS NOT NULL AND "end" IS NOT NULL"""


def _gpu_checks() -> list[tuple[str, str, str]]:
    missing_time, backwards = time_checks()
    return [missing_time, ("gpuId IS NULL", "skipped", "gpuId is missing or not an integer"), backwards]


def load(con: duckdb.DuckDBPyConnection, path: Path, progress, detected: Detected) -> None:
    src = SqliteSource(con, path)
    try:
        _load(con, path, progress, src)
    finally:
        src.close()


def _num(col: str) -> str:
    return f"TRY_CAST({quote_ident(col)} AS BIGINT) AS {quote_ident(col)}"


def _materialise(con, src: SqliteSource, table: str, cols: list[str], text: bool) -> None:
    """Copy the needed columns into a temp table; the native scan falls back to the lenient copy
    when a cell does not match its declared type."""
    target = f"_rpd_{table}"
    if not src.has(table):
        con.execute(f"CREATE TEMP TABLE {target} AS SELECT " + ", ".join(f"NULL::BIGINT AS {quote_ident(c)}" for c in cols) + " WHERE false")
        return
    missing = [c for c in cols if not src.has_column(table, c)]
    if missing:
        raise ProfileError(f"{src.path} has a {table} table without column(s) {', '.join(missing)}: it is not an RPD "
                           "database gpuscope knows. Re-profile with rocprofv3 `--output-format rocpd`.")
    select = ", ".join(_num(c) for c in cols)
    for lenient in ((True,) if text else (False, True)):
        try:
            rel = src.copy(table, lenient=True) if lenient else src.relation(table)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {target} AS SELECT {select} FROM {rel}")
            return
        except duckdb.Error as exc:
            if lenient or isinstance(exc, duckdb.OutOfMemoryException):  # the sqlite3 copy would need more
                raise


def _load(con, path: Path, progress, src: SqliteSource) -> None:
    for t in ("rocpd_op", "rocpd_api", "rocpd_string"):
        if not src.has(t):
            raise ProfileError(f"{path} lacks {t}: it is not a complete RPD database. Re-profile with rocprofv3 `--output-format rocpd`.")
    version = ((src.query("SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'", table="rocpd_metadata") or [("",)])[0][0]
               if src.has("rocpd_metadata") else "")
    progress(0.1, "rpd: reading tables")
    _materialise(con, src, "rocpd_op", ["id", "gpuId", "queueId", "start", "end", "description_id", "opType_id"], False)
    _materialise(con, src, "rocpd_api", ["id", "pid", "tid", "start", "end", "apiName_id", "args_id"], False)
    _materialise(con, src, "rocpd_api_ops", ["api_id", "op_id"], False)
    _materialise(con, src, "rocpd_kernelapi", ["api_ptr_id", "gridX", "gridY", "gridZ", "workgroupX", "workgroupY",
                                               "workgroupZ", "groupSegmentSize", "codeObject_id", "kernelName_id"], True)
    _materialise(con, src, "rocpd_copyapi", ["api_ptr_id", "size", "dstDevice", "srcDevice"], True)
    _materialise(con, src, "rocpd_kernelcodeobject", ["id", "vgpr"], True)
    con.execute(f"CREATE TEMP TABLE _rpd_str AS SELECT TRY_CAST(id AS BIGINT) AS id, CAST(string AS VARCHAR) AS string FROM {src.relation('rocpd_string', text=True)}")
    # Every op with its type, description and (first) launching call.
    con.execute(
        """CREATE TEMP TABLE _rpd_ops AS
           SELECT o.*, t.string AS op_type, d.string AS description, x.api_id, a.pid, a.tid, an.string AS api_name
           FROM _rpd_rocpd_op o
           LEFT JOIN _rpd_str t ON t.id = o.opType_id
           LEFT JOIN _rpd_str d ON d.id = o.description_id
           LEFT JOIN (SELECT op_id, min(api_id) AS api_id FROM _rpd_rocpd_api_ops GROUP BY op_id) x ON x.op_id = o.id
           LEFT JOIN _rpd_rocpd_api a ON a.id = x.api_id
           LEFT JOIN _rpd_str an ON an.id = a.apiName_id"""
    )
    con.execute("INSERT INTO devices SELECT DISTINCT gpuId, NULL, 'AMD', true, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM _rpd_ops WHERE gpuId IS NOT NULL ORDER BY 1")
    con.execute("INSERT INTO processes SELECT DISTINCT pid, NULL, NULL, NULL FROM _rpd_rocpd_api WHERE pid IS NOT NULL ORDER BY 1")
    con.execute("INSERT INTO threads SELECT DISTINCT pid, tid, NULL FROM _rpd_rocpd_api WHERE pid IS NOT NULL AND tid IS NOT NULL ORDER BY 1, 2")

    progress(0.4, "rpd: kernels")
    kinds = ", ".join(f"'{k}'" for k in KERNEL_OPS)
    wi = ", ".join(f"'{a}'" for a in WORKITEM_GRID_APIS)

    def grid(axis: str) -> str:
        g, w = f"k.grid{axis}", f"k.workgroup{axis}"
        return f"CASE WHEN o.api_name IN ({wi}) THEN CASE WHEN {w} > 0 THEN ({g} + {w} - 1) // {w} END ELSE {g} END"

    con.execute(
        f"""CREATE TEMP TABLE _rpd_kernels AS
            SELECT o.*, COALESCE(NULLIF(o.description, ''), kn.string, o.op_type) AS name,
                   {grid('X')} AS g_x, {grid('Y')} AS g_y, {grid('Z')} AS g_z,
                   k.workgroupX, k.workgroupY, k.workgroupZ, k.groupSegmentSize, co.vgpr
            FROM _rpd_ops o
            LEFT JOIN _rpd_rocpd_kernelapi k ON k.api_ptr_id = o.api_id
            LEFT JOIN _rpd_str kn ON kn.id = k.kernelName_id
            LEFT JOIN _rpd_rocpd_kernelcodeobject co ON co.id = k.codeObject_id
            WHERE o.op_type IN ({kinds})"""
    )
    create_short_names(con, "_rpd_names", "SELECT name FROM _rpd_kernels")
    record_query(con, count_sql("kernels", "_rpd_kernels", _gpu_checks()))
    con.execute(
        f"""INSERT INTO kernels
           SELECT gpuId, queueId, start, greatest("end", start), greatest("end", start) - start, k.name, n.short,
                  g_x, g_y, g_z, workgroupX, workgroupY, workgroupZ, vgpr, NULL, groupSegmentSize,
                  api_id, NULL, pid, tid, api_id IS NOT NULL AND pid IS NOT NULL, false, NULL, NULL
           FROM _rpd_kernels k LEFT JOIN _rpd_names n USING (name) WHERE {GPU_OK}
           ORDER BY start"""
    )

    progress(0.6, "rpd: copies")
    copy_case = " ".join(f"WHEN '{t}' THEN '{k}'" for t, k in COPY_OPS.items())
    fills = ", ".join(f"'{f}'" for f in FILL_OPS)
    con.execute(
        f"""CREATE TEMP TABLE _rpd_memops AS
            SELECT o.*, CASE WHEN o.op_type IN ({fills}) THEN 'set' ELSE 'copy' END AS op,
                   CASE WHEN o.op_type IN ({fills}) THEN 'memset' ELSE CASE o.op_type {copy_case} ELSE 'Unknown' END END AS kind,
                   c.size AS bytes, c.srcDevice, c.dstDevice
            FROM _rpd_ops o LEFT JOIN _rpd_rocpd_copyapi c ON c.api_ptr_id = o.api_id
            WHERE o.op_type LIKE 'Copy%' OR o.op_type IN ({fills})"""
    )
    record_query(con, count_sql("memops", "_rpd_memops", _gpu_checks()))
    con.execute(
        f"""INSERT INTO memops
            SELECT gpuId, queueId, start, greatest("end", start), greatest("end", start) - start, op, kind, bytes,
                   CASE WHEN kind IN ('DtoH', 'DtoD', 'PtoP') THEN 'Device' END,
                   CASE WHEN kind IN ('HtoD', 'DtoD', 'PtoP') OR op = 'set' THEN 'Device' END,
                   CASE WHEN kind IN ('DtoD', 'PtoP') THEN srcDevice END, CASE WHEN kind IN ('DtoD', 'PtoP') THEN dstDevice END,
                   api_id, pid, tid, api_id IS NOT NULL AND pid IS NOT NULL
            FROM _rpd_memops WHERE {GPU_OK} ORDER BY start"""
    )

    progress(0.75, "rpd: API calls and markers")
    con.execute(
        """CREATE TEMP TABLE _rpd_calls AS
           SELECT a.*, n.string AS name, g.string AS args FROM _rpd_rocpd_api a
           LEFT JOIN _rpd_str n ON n.id = a.apiName_id LEFT JOIN _rpd_str g ON g.id = a.args_id"""
    )
    api, marker = f"{API_FAMILY.format(n='name')} IS NOT NULL", MARKER_API.format(n='name')
    record_query(con, count_sql("api_calls", f"_rpd_calls WHERE {api}", time_checks()))
    record_query(con, count_sql("markers", f"_rpd_calls WHERE {marker}", time_checks()))
    con.execute(
        f"""INSERT INTO api_calls
            SELECT pid, tid, start, greatest("end", start), greatest("end", start) - start, name, {API_FAMILY.format(n='name')}, id, NULL, NULL
            FROM _rpd_calls WHERE {api} AND {HOST_OK} ORDER BY start"""
    )
    con.execute(
        f"""INSERT INTO markers
            SELECT pid, tid, start, greatest("end", start), greatest("end", start) - start, COALESCE(NULLIF(args, ''), name), '',
                   CASE WHEN "end" = start THEN 'mark' ELSE 'push_pop' END, 'roctx', NULL, NULL
            FROM _rpd_calls WHERE {marker} AND {HOST_OK} ORDER BY start"""
    )
    _meta(con, path, version)
    for t in ("op", "api", "api_ops", "kernelapi", "copyapi", "kernelcodeobject"):
        con.execute(f"DROP TABLE IF EXISTS _rpd_rocpd_{t}")
    for t in ("_rpd_str", "_rpd_ops", "_rpd_calls", "_rpd_kernels", "_rpd_names", "_rpd_memops"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    progress(0.95, "rpd: done")


def _meta(con, path: Path, version: str) -> None:
    count = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
    warnings = [
        f"{path.name} is a legacy RPD (rocmProfileData / roctracer) database: it has no device properties, kernel "
        "register counts or static LDS sizes. rocprofv3 with `--output-format rocpd` records a fuller picture."
    ]
    n_k, n_unlinked = con.execute("SELECT count(*), count(*) FILTER (WHERE NOT launched) FROM kernels").fetchone()
    if n_unlinked:
        warnings.append(f"{n_unlinked} of {n_k} kernels have no launching API call in rocpd_api_ops.")
    skipped_ops = count(
        f"""SELECT count(*) FROM _rpd_ops WHERE op_type IS NULL OR NOT (op_type IN ({', '.join(f"'{k}'" for k in KERNEL_OPS + FILL_OPS)})
            OR op_type LIKE 'Copy%')"""
    )
    if skipped_ops:
        kinds = [r[0] for r in con.execute(
            f"""SELECT DISTINCT COALESCE(op_type, '?') FROM _rpd_ops WHERE op_type IS NULL OR NOT (op_type IN
                ({', '.join(f"'{k}'" for k in KERNEL_OPS + FILL_OPS)}) OR op_type LIKE 'Copy%') ORDER BY 1""").fetchall()]
        warnings.append(f"{skipped_ops} GPU ops of other types ({', '.join(kinds)}) are not kernels or copies and were left out.")
    other = count(f"SELECT count(*) FROM _rpd_calls WHERE {API_FAMILY.format(n='name')} IS NULL AND NOT {MARKER_API.format(n='name')}")
    if other:
        warnings.append(f"{other} rocpd_api rows are neither HIP/HSA/RCCL calls nor rocTX markers (the tracer's own "
                        "bookkeeping, e.g. OpTable::writeRows) and were left out.")
    absent = [
        "cpu_ops: only PyTorch traces have CPU operators",
        "device properties: legacy RPD records only GPU ids (no name, compute units, clock or memory size)",
        "static_shared_bytes: legacy RPD records only the launch's dynamic LDS size",
        "graph_id: legacy RPD records no graph ids",
    ]
    if not count("SELECT count(*) FROM kernels WHERE registers_per_thread IS NOT NULL"):
        absent.append("registers_per_thread: rocpd_kernelcodeobject holds no register counts")
    for table, what in (("kernels", "no kernel ops recorded"), ("memops", "no copy or fill ops recorded"),
                        ("api_calls", "no HIP/HSA API calls recorded"), ("markers", "no rocTX markers recorded")):
        if not count(f"SELECT count(*) FROM {table}"):
            absent.append(f"{table}: {what}")
    rows = [("format", "rpd"), ("format_version", str(version)), ("product_version", "")]
    rows += [("warning", w) for w in warnings] + [("absent", a) for a in absent]
    con.executemany("INSERT INTO trace_meta VALUES (?, ?)", rows)
