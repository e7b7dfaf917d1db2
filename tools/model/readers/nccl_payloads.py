"""NCCL's NVTX payloads in an Nsight export → the `nccl_calls` model table, and the communicator and collective of
the kernels those calls launched (kernels.communicator, kernels.collective).

NCCL (2.19+) opens an NVTX range in its "NCCL" domain around each API call and attaches a binary payload
described by a static schema it registers (NCCL src/include/nvtx_payload_schemas.h): communicator hash,
message size, rank count, peer, root, reduction op. `nsys export --type sqlite --include-blobs=true`
writes the schemas to NVTX_PAYLOAD_SCHEMAS / NVTX_PAYLOAD_SCHEMA_ENTRIES (field name, NVTX entry type,
byte offset; NULL offset = 0), enum types to NVTX_PAYLOAD_ENUMS / _ENUM_ENTRIES, and each event's payload
to NVTX_EVENTS.binaryData behind a 32-byte header: schema id as uint64 at byte 8, payload size as uint64
at byte 16, payload from byte 32. The export documentation says only "binary payload, see docs for format";
this header is the one nsys-ai decodes from real Nsight 2026.2 exports. No export with blobs was at hand to
check it (real 2026.2 exports seen hold the schema tables, which match NCCL's source, but no blobs), so the
reader reads nothing else of the header and decodes a payload only when every field lies inside it.

Decoding is SQL over the blobs' hex text: each field is its little-endian bytes reversed and cast, one
pass over the NCCL rows (about 7 µs a row: 1.4 s for 200k calls, kernel link included). Payloads that
cannot be decoded are counted in data_issues with the reason.
"""

from __future__ import annotations

import duckdb

from ..quality import record_query
from ..quote import quote_literal

HEADER_BYTES = 32
# NVTX_PAYLOAD_ENTRY_TYPE_* (nvToolsExtPayload.h) → (bytes, signed), LP64 sizes for long / size_t.
ENTRY_TYPES = {1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False), 7: (8, True),
               8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False), 13: (2, True), 14: (2, False),
               15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False), 22: (8, False), 23: (8, False)}
# NCCL's entry names (nvtx_payload_schemas.h; init.cc and collectives.cc before 2.25, where broadcast and
# send/recv call the size "Bytes") → nccl_calls column.
FIELDS = {"NCCL communicator ID": "comm_id", "Message size [bytes]": "bytes", "Bytes": "bytes", "No. of ranks": "nranks", "Rank": "rank",
          "CUDA device": "cuda_device", "Peer rank": "peer", "Root": "root", "Reduction operation": "reduce_op"}
ENTRY_COLUMNS = ("schemaId", "idx", "type", "name", "offset")
COLUMNS = ("comm_id", "bytes", "nranks", "rank", "cuda_device", "peer", "root", "reduce_op")

UNKNOWN_SCHEMA = "NCCL payload names a schema id that NVTX_PAYLOAD_SCHEMAS does not list: payload not decoded"
AMBIGUOUS_SCHEMA = "NCCL payload schema id is registered with different layouts in this export: payload not decoded"
TOO_SHORT = "NCCL payload is shorter than its schema's fields (or than the 32-byte header): payload not decoded"


def load(con: duckdb.DuckDBPyConnection, src, named: str) -> str | None:
    """Fill nccl_calls from the NCCL-domain ranges of `named` (a relation with start, end, eventType, globalTid,
    label, dom (domain id), domain (its name), blob) once kernels and api_calls are in. Returns why the export holds no payloads to decode
    although it has NCCL ranges, else None."""
    ranges = "eventType IN (59, 60, 70, 71) AND domain = 'NCCL'"
    if not src.has_column("NVTX_EVENTS", "binaryData"):
        n = con.execute(f"SELECT count(*) FROM {named} WHERE {ranges}").fetchone()[0]
        return (f"the export has NCCL NVTX ranges ({n}) but NVTX_EVENTS has no binaryData column (Nsight before 2024): "
                "message sizes and communicators are not in the file") if n else None
    with_blob = con.execute(f"SELECT count(*) FILTER (WHERE blob IS NOT NULL), count(*) FROM {named} WHERE {ranges}").fetchone()
    if not with_blob[0]:
        return (f"the export has {with_blob[1]} NCCL NVTX ranges but no payload blobs: NCCL before 2.19 attaches none, and "
                "`nsys export` writes them only with `--include-blobs=true`") if with_blob[1] else None
    # Static schema ids are per domain: read only the schemas of the NCCL domain's ids.
    domains = [d for (d,) in con.execute(f"SELECT DISTINCT dom FROM {named} WHERE domain = 'NCCL'").fetchall() if isinstance(d, int)]
    schemas = _schemas(src, domains)
    hexed = f"(SELECT *, hex(blob) AS h, octet_length(blob) AS len FROM {named} WHERE {ranges} AND blob IS NOT NULL)"
    sid, size = _le("h", 8, 8, False), _le("h", 16, 8, False)
    cols, needed, known = [], [], []
    for column in COLUMNS:
        cases = [f"WHEN {s} THEN {expr}" for s, (_, fields) in schemas.items() if (expr := fields.get(column))]
        cols.append(f"CASE sid {' '.join(cases)} END AS {column}" if cases else f"NULL AS {column}")
    for s, (need, _) in schemas.items():
        needed.append(f"WHEN {s} THEN {need}")
        known.append(str(s))
    need = f"CASE sid {' '.join(needed)} END" if needed else "NULL"
    decodable = (f"coalesce(len >= {HEADER_BYTES} AND sid IN ({', '.join(known) or 'NULL'}) AND size >= {need} "
                 f"AND len >= {HEADER_BYTES} + size, false)")
    header = f"(SELECT *, CASE WHEN len >= {HEADER_BYTES} THEN {sid} END AS sid, CASE WHEN len >= {HEADER_BYTES} THEN {size} END AS size FROM {hexed})"
    con.execute(f"CREATE TEMP TABLE _nccl AS SELECT *, {decodable} AS ok FROM {header}")
    try:
        ambiguous = [str(s) for s in _ambiguous(src, domains)] or ["NULL"]
        record_query(con, f"""SELECT 'nccl_calls', 'skipped', count(*), reason FROM (
            SELECT CASE WHEN len < {HEADER_BYTES} THEN {quote_literal(TOO_SHORT)}
                        WHEN sid IN ({', '.join(ambiguous)}) THEN {quote_literal(AMBIGUOUS_SCHEMA)}
                        WHEN sid NOT IN ({', '.join(known) or 'NULL'}) THEN {quote_literal(UNKNOWN_SCHEMA)}
                        ELSE {quote_literal(TOO_SHORT)} END AS reason
            FROM _nccl WHERE NOT ok) GROUP BY reason ORDER BY reason""")
        _insert(con, ", ".join(cols))
        _label_kernels(con)
    finally:
        con.execute("DROP TABLE IF EXISTS _nccl")
    return None


def _insert(con: duckdb.DuckDBPyConnection, fields: str) -> None:
    # The kernel an NCCL call launched: the launch API call lies inside the range on the range's thread. NCCL's
    # ranges do not nest, so each launch is matched to the latest range started before it on its thread (ASOF:
    # one ordered pass, where a range join on (pid, tid) would pair every call with every launch of the thread).
    con.execute(f"""
        INSERT INTO nccl_calls
        WITH c AS (SELECT row_number() OVER () AS id, ({PID}) AS pid, ({TID}) AS tid, start AS start_ns,
                          greatest(coalesce("end", start), start) AS end_ns, label, sid, {fields}
                   FROM _nccl WHERE ok),
             launch AS (SELECT a.pid, a.tid, a.start_ns, k.device_id, k.stream_id, k.start_ns AS ks, k.end_ns AS ke
                        FROM kernels k JOIN api_calls a ON a.pid = k.pid AND a.correlation_id = k.correlation_id),
             k AS (SELECT c.id, count(*) AS n, min(l.device_id) AS device_id, min(l.stream_id) AS stream_id,
                          min(l.ks) AS ks, min(l.ke) AS ke
                   FROM launch l ASOF JOIN c ON c.pid = l.pid AND c.tid = l.tid AND l.start_ns >= c.start_ns
                   WHERE l.start_ns < c.end_ns GROUP BY c.id)
        SELECT c.pid, c.tid, c.start_ns, c.end_ns, c.end_ns - c.start_ns, coalesce(c.label, ''), c.sid,
               {', '.join(f'c.{col}' for col in COLUMNS)}, coalesce(k.n, 0),
               CASE WHEN k.n = 1 THEN k.device_id END, CASE WHEN k.n = 1 THEN k.stream_id END,
               CASE WHEN k.n = 1 THEN k.ks END, CASE WHEN k.n = 1 THEN k.ke END
        FROM c LEFT JOIN k USING (id) ORDER BY c.start_ns""")


def _label_kernels(con: duckdb.DuckDBPyConnection) -> None:
    """kernels.communicator and .collective from the NCCL calls that launched exactly one kernel: the call's
    communicator id and its name without 'nccl', where every such call of the kernel agrees (a kernel is known by its
    process, device, stream and GPU times, as nccl_calls records it)."""
    con.execute("""
        UPDATE kernels SET communicator = c.communicator, collective = c.collective
        FROM (SELECT pid, device_id, stream_id, kernel_start_ns, kernel_end_ns,
                     CASE WHEN count(DISTINCT comm_id) = 1 THEN min(comm_id) END AS communicator,
                     CASE WHEN count(DISTINCT name) = 1 THEN regexp_replace(min(name), '^nccl', '') END AS collective
              FROM nccl_calls WHERE kernels_launched = 1 GROUP BY ALL) c
        WHERE NOT kernels.whole_graph AND kernels.pid IS NOT DISTINCT FROM c.pid AND kernels.device_id = c.device_id
              AND kernels.stream_id IS NOT DISTINCT FROM c.stream_id AND kernels.start_ns = c.kernel_start_ns
              AND kernels.end_ns = c.kernel_end_ns""")


PID = "(globalTid >> 24) & 16777215"
TID = "globalTid & 16777215"


def _schemas(src, domains: list[int]) -> dict[int, tuple[str, dict[str, str]]]:
    """schema id → (payload bytes the decoded fields need, {nccl_calls column: SQL expression over `h`}).
    Only schemas with one layout in the file; the same static schema is listed once per process."""
    if not (all(src.has_column("NVTX_PAYLOAD_SCHEMA_ENTRIES", c) for c in ENTRY_COLUMNS)
            and src.has_column("NVTX_PAYLOAD_SCHEMAS", "schemaId")):
        return {}
    mine = _in_domains(src, "NVTX_PAYLOAD_SCHEMAS", domains)
    entries = src.query('SELECT DISTINCT schemaId, idx, type, name, coalesce("offset", 0) FROM NVTX_PAYLOAD_SCHEMA_ENTRIES '
                        f"WHERE {_in_domains(src, 'NVTX_PAYLOAD_SCHEMA_ENTRIES', domains)} "
                        f"AND schemaId IN (SELECT schemaId FROM NVTX_PAYLOAD_SCHEMAS WHERE {mine}) ORDER BY schemaId, idx",
                        table="NVTX_PAYLOAD_SCHEMA_ENTRIES")
    enums = _enums(src, domains)
    ambiguous = set(_ambiguous(src, domains))
    out: dict[int, tuple[str, dict[str, str]]] = {}
    for schema, idx, typ, name, offset in entries:
        column = FIELDS.get(name)
        if schema in ambiguous or not isinstance(schema, int) or not isinstance(offset, int) or not 0 <= offset < 1 << 20 \
                or column is None:
            continue
        width, signed = ENTRY_TYPES.get(typ, (None, False)) if typ not in enums else (enums[typ][0], False)
        if width is None:
            continue
        need, fields = out.setdefault(schema, ("0", {}))
        raw = _le("h", HEADER_BYTES + offset, width, signed)
        if column == "comm_id":
            expr = f"lower(printf('0x%x', {raw}))"
        elif column == "reduce_op":
            names = enums.get(typ, (None, {}))[1]
            cases = " ".join(f"WHEN {v} THEN {quote_literal(n)}" for v, n in names.items())
            expr = f"CASE {raw} {cases} ELSE CAST({raw} AS VARCHAR) END" if cases else f"CAST({raw} AS VARCHAR)"
        else:
            expr = raw
        out[schema] = (f"greatest({need}, {offset + width})", {**fields, column: expr})
    return out


def _enums(src, domains: list[int]) -> dict[int, tuple[int, dict[int, str]]]:
    """Enum type id → (size in bytes, {value: name}) from NVTX_PAYLOAD_ENUMS / _ENUM_ENTRIES."""
    if not (src.has_column("NVTX_PAYLOAD_ENUMS", "schemaId") and src.has_column("NVTX_PAYLOAD_ENUMS", "size")):
        return {}
    sizes = {s: z for s, z in src.query(f"SELECT DISTINCT schemaId, size FROM NVTX_PAYLOAD_ENUMS "
                                        f"WHERE {_in_domains(src, 'NVTX_PAYLOAD_ENUMS', domains)}", table="NVTX_PAYLOAD_ENUMS")
             if isinstance(s, int) and z in (1, 2, 4, 8)}
    names: dict[int, dict[int, str]] = {s: {} for s in sizes}
    if all(src.has_column("NVTX_PAYLOAD_ENUM_ENTRIES", c) for c in ("schemaId", "value", "name")):
        for s, value, name in src.query("SELECT DISTINCT schemaId, value, name FROM NVTX_PAYLOAD_ENUM_ENTRIES "
                                        f"WHERE {_in_domains(src, 'NVTX_PAYLOAD_ENUM_ENTRIES', domains)}",
                                        table="NVTX_PAYLOAD_ENUM_ENTRIES"):
            if s in names and isinstance(value, int) and isinstance(name, str):
                names[s].setdefault(value, name)
    return {s: (sizes[s], names[s]) for s in sizes}


def _ambiguous(src, domains: list[int]) -> list[int]:
    """NCCL-domain schema ids whose fields are listed with more than one layout."""
    if not all(src.has_column("NVTX_PAYLOAD_SCHEMA_ENTRIES", c) for c in ENTRY_COLUMNS):
        return []
    rows = src.query('SELECT schemaId FROM (SELECT DISTINCT schemaId, idx, type, name, "offset" FROM NVTX_PAYLOAD_SCHEMA_ENTRIES '
                     f"WHERE {_in_domains(src, 'NVTX_PAYLOAD_SCHEMA_ENTRIES', domains)}) GROUP BY schemaId, idx HAVING count(*) > 1",
                     table="NVTX_PAYLOAD_SCHEMA_ENTRIES")
    return sorted({r[0] for r in rows if isinstance(r[0], int)})


def _in_domains(src, table: str, domains: list[int]) -> str:
    """SQLite condition: the row belongs to an NCCL domain id (any row, when the table has no domainId column).
    Static schema ids are chosen per domain, so another domain may reuse NCCL's with another layout."""
    if not src.has_column(table, "domainId"):
        return "1 = 1"
    return f"domainId IN ({', '.join(str(int(d)) for d in domains) or 'NULL'})"


def _le(h: str, offset: int, width: int, signed: bool) -> str:
    """SQL: the little-endian integer of `width` bytes at byte `offset` of the hex text `h`."""
    digits = " || ".join(f"substr({h}, {2 * (offset + i) + 1}, 2)" for i in reversed(range(width)))
    value = f"TRY_CAST('0x' || {digits} AS UBIGINT)"
    if not signed:
        return value if width == 8 else f"CAST({value} AS BIGINT)"
    bits = 8 * width
    return f"CAST(CAST({value} AS HUGEINT) - CASE WHEN {value} >= {1 << (bits - 1)} THEN {1 << bits} ELSE 0 END AS BIGINT)"
