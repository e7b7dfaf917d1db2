"""The PyTorch op tree and the launcher of every GPU op (TraceLens `Trace2Tree` + `get_kernel_launchers`).

Containment is computed per (pid, tid) in DuckDB: one HUGEINT key per (thread, time) —
thread_index * 2^64 + ns — turns "same thread and inside" into an inequality (IE) join, which scales to
millions of cpu ops without a per-thread Python stack.

Launcher of a GPU op (kernel, memcpy, memset):
  1. its launching API call = the earliest host call of the same process with the same correlation id
     (a graph launch owns all N GPU ops that carry its correlation id: 1 → N);
  2. launcher = the innermost `cpu_op` (category cpu_op; python_function frames skipped; an op named
     `execute` is pass-through, as in TraceLens) on the call's thread whose [start, end) holds the call's
     START. Innermost = latest start, then shortest, then latest in file order (TraceLens pushes events
     sorted by (ts, -dur), so of identical intervals the later one is the child).
     Using the call's start makes a launch that overhangs its op's end still belong to the op; TraceLens
     drops such events from the tree when the overhang is >= 1 µs (§12 "event bleed") and turns them into
     siblings below 1 µs.
  3. no enclosing cpu_op: the API call itself is the launcher (TraceLens: the runtime event), kind
     'runtime' ('graph' for graph launches);
  4. no launching call in the profile (launched = false, or no call with that correlation id): kind
     'unlinked' — counted, never dropped.
Every GPU op has exactly one launcher, so direct times partition the GPU work (MECE).

Subtree: a cpu_op's subtree GPU ops are those whose launching call starts inside it on the same thread.

Node tree (`node_parents`): parent of a cpu_op / python_function / user annotation = innermost node of
the same thread that encloses it (p.start <= c.start, c.end <= p.end + BLEED_NS). TraceLens pops an event
that overhangs by < 1 µs to a sibling and drops larger overhangs; here an overhang below BLEED_NS keeps
the child under its parent (timestamp rounding in µs traces), a larger one makes it a child of the next
node that does enclose it.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import duckdb
import numpy as np

from ..model.names import GRAPH_LAUNCH_RX
from ..model.quote import quote_literal
from ..model.trace import Trace
from .comm_patterns import is_comm_sql
from .containment import SHIFT, temp_tables
from .projection import calls_unique

BLEED_NS = 1_000                 # tolerated overhang of a child past its parent's end (node tree only)
PASS_THROUGH = ("execute",)      # cpu_ops that never launch on their own (TraceLens get_kernel_launchers)


# The name of a copy or set (memops has none of its own).
MEMOP_NAME = """CASE WHEN op = 'set' THEN 'Memset (' || coalesce(dst_kind, 'Device') || ')'
                    ELSE 'Memcpy ' || kind || ' (' || coalesce(src_kind, '?') || ' -> ' || coalesce(dst_kind, '?') || ')' END"""


def with_sql(unique: bool = False) -> str:
    """WITH clause defining
        thr(pid, tid, k)  threads numbered from 0;
        op(op_id, pid, tid, start_ns, end_ns, dur_ns, name, ks, ke)  launcher candidates (cpu_op, not execute);
        launch(pid, correlation_id, call_tid, call_start_ns, call_end_ns, call_name)  the launching call per (pid, correlation);
        gpu(gop_id, op, device_id, stream_id, start_ns, end_ns, dur_ns, name, short_name, pid, correlation_id, launched,
            whole_graph)                                              every GPU op (kernel, copy, set);
        call(gop_id, call_tid, call_start_ns, call_end_ns, call_name, ks)  its launching call (NULLs: none);
        comm(name, comm)                                              whether a kernel name is communication (one regex per
                                                                      distinct name, not per kernel);
        graph_call(name)                                              the API names that launch a graph.
    `unique` (projection.calls_unique): no two calls share a (pid, correlation id), so each is its pair's launching
    call and the calls are not ranked per pair (a window sorting every call: 0.3-0.4 s CPU of a 2 M-call profile). The
    rule is projection.launch_sql's, ties going by rowid here: a call's name is read too."""
    return f"""
    WITH thr AS (
        SELECT pid, tid, (row_number() OVER (ORDER BY pid, tid) - 1)::HUGEINT AS k FROM (
            SELECT DISTINCT pid, tid FROM cpu_ops WHERE pid IS NOT NULL AND tid IS NOT NULL
            UNION SELECT DISTINCT pid, tid FROM api_calls WHERE pid IS NOT NULL AND tid IS NOT NULL)),
    op AS (
        SELECT c.rowid AS op_id, c.pid, c.tid, c.start_ns, c.end_ns, c.dur_ns, c.name,
               thr.k * {SHIFT} + c.start_ns AS ks, thr.k * {SHIFT} + c.end_ns AS ke
        FROM cpu_ops c JOIN thr ON thr.pid = c.pid AND thr.tid = c.tid
        WHERE c.category = 'cpu_op' AND c.name NOT IN ({", ".join(f"'{n}'" for n in PASS_THROUGH)})),
    launch AS (  -- the first call of each (pid, correlation id), ties by rowid; a window, which spills (an arg_min of
                 -- the call's columns cannot: it ran out of memory at 10 M calls), and was faster too
        SELECT pid, correlation_id, tid AS call_tid, start_ns AS call_start_ns, end_ns AS call_end_ns, name AS call_name
        FROM api_calls WHERE correlation_id IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
        {"" if unique else "QUALIFY row_number() OVER (PARTITION BY pid, correlation_id ORDER BY start_ns, end_ns, rowid) = 1"}),
    gpu AS (
        SELECT rowid * 2 AS gop_id, 'kernel' AS op, device_id, stream_id, start_ns, end_ns, dur_ns, name, short_name,
               pid, correlation_id, launched, whole_graph FROM kernels
        UNION ALL
        SELECT rowid * 2 + 1, op, device_id, stream_id, start_ns, end_ns, dur_ns,
               {MEMOP_NAME}, NULL, pid, correlation_id, launched, false FROM memops),
    call AS (
        SELECT g.gop_id, l.call_tid, l.call_start_ns, l.call_end_ns, l.call_name, thr.k * {SHIFT} + l.call_start_ns AS ks
        FROM gpu g
        LEFT JOIN launch l ON l.pid = g.pid AND l.correlation_id = g.correlation_id
        LEFT JOIN thr ON thr.pid = l.pid AND thr.tid = l.call_tid),
    comm AS (SELECT name, {is_comm_sql("name")} AS comm FROM (SELECT DISTINCT name FROM kernels)),
    graph_call AS (SELECT name FROM (SELECT DISTINCT name FROM api_calls) WHERE regexp_matches(name, {quote_literal(GRAPH_LAUNCH_RX)}, 'i'))
    """


class Kept:
    """Tables of one profile kept for every later query, by any cursor, in the DuckDB instance's own in-memory catalog:
    DuckDB holds their rows in its buffer pool and spills them to disk under memory_limit, so they cost Python nothing
    and the process's memory does not grow with the profile. Dropped when this object is collected (a memo entry let
    go and no tool call still using it)."""

    def __init__(self, trace: Trace, *names: str):
        self.cur = trace.con.cursor()  # builds the tables; drops them at the end
        n = next(_serial)
        self.names = {k: f"memory.main._kept{n}_{k}" for k in names}
        weakref.finalize(self, _drop, self.cur, list(self.names.values()))


_serial = itertools.count()


def _drop(cur, tables: list[str]) -> None:
    try:
        for t in tables:
            cur.execute(f"DROP TABLE IF EXISTS {t}")
        cur.close()
    except duckdb.Error:  # the instance is closing
        pass


@dataclass(frozen=True)
class Launchers:
    """Table `table`: one row per GPU op, its names as ids of table `names`; `gops`: the same rows with the names
    (a subquery over both); table `subtree`: the (ancestor cpu_op, GPU op) pairs of the op tree (Kept).

    The names are ids because every GPU op's row is written once and read by every ops_summary frame: 2 M copies of
    the kernel, call and launcher names cost more than the windows and the join that find the launchers. `names`
    numbers every name in byte order (id order is name order), so ids group, match and sort as the names do."""

    table: str
    # columns: gop_id, op ('kernel'|'copy'|'set'), device_id, stream_id, start_ns, end_ns, dur_ns, name_id, short_name_id
    #          (kernels), is_comm (never for a whole-graph row), whole_graph, pid, linked, call_tid, call_start_ns,
    #          call_end_ns, call_name_id, launcher_kind ('cpu_op'|'runtime'|'graph'|'unlinked'), launcher_id (cpu_ops.rowid
    #          or -1), launcher_name_id, launcher_start_ns, launcher_end_ns,
    #          prev_end_ns (end of the previous GPU op on the same stream: device, process, stream id)
    names: str    # columns: id, name: every GPU op, kernel base, API call, cpu_op and marker name, and UNATTRIBUTED
    subtree: str  # columns: op_id (cpu_ops.rowid, category cpu_op), gop_id, and the op's start_ns, dur_ns
    kept: tuple   # the tables (Kept, Names) live as long as this object

    @property
    def gops(self) -> str:
        """A subquery: the rows of `table` with name, short_name, call_name, launcher_name in place of their ids, and
        the launching cpu_op's input_dims and input_types (NULL for other launchers)."""
        n = self.names
        return f"""(SELECT g.gop_id, g.op, g.device_id, g.stream_id, g.start_ns, g.end_ns, g.dur_ns, n.name, s.name AS short_name,
                           g.is_comm, g.whole_graph, g.pid, g.linked, g.call_tid, g.call_start_ns, g.call_end_ns, cn.name AS call_name,
                           g.launcher_kind, g.launcher_id, ln.name AS launcher_name, g.launcher_start_ns, g.launcher_end_ns,
                           c.input_dims, c.input_types, g.prev_end_ns
                    FROM {self.table} g LEFT JOIN {n} n ON n.id = g.name_id LEFT JOIN {n} s ON s.id = g.short_name_id
                    LEFT JOIN {n} cn ON cn.id = g.call_name_id LEFT JOIN {n} ln ON ln.id = g.launcher_name_id
                    LEFT JOIN cpu_ops c ON c.rowid = g.launcher_id)"""


UNATTRIBUTED = "<unattributed>"  # the launcher name of a GPU op without its launching call (ops_summary)


@dataclass(frozen=True)
class Names:
    """Table `table` (Kept): id, name of every GPU op, kernel base, API call, cpu_op and marker name, and UNATTRIBUTED,
    numbered in name order."""

    table: str
    kept: Kept


def names(trace: Trace) -> Names:
    """Memoized per trace. Distinct names are few (hundreds among millions of rows) and DuckDB reads them from the
    store's dictionaries: the table costs milliseconds."""
    return trace.memo(("op_tree.names",), lambda: _names(trace))


def _names(trace: Trace) -> Names:
    kept = Kept(trace, "names")
    kept.cur.execute(f"""CREATE TABLE {kept.names["names"]} AS
        SELECT (row_number() OVER (ORDER BY name))::INTEGER AS id, name FROM (
            SELECT name FROM kernels UNION SELECT short_name FROM kernels UNION SELECT {MEMOP_NAME} FROM memops
            UNION SELECT name FROM api_calls UNION SELECT name FROM cpu_ops UNION SELECT name FROM markers
            UNION SELECT {quote_literal(UNATTRIBUTED)})""")
    return Names(table=kept.names["names"], kept=kept)


def launchers(trace: Trace) -> Launchers:
    """Memoized per trace: the launcher of every GPU op and the subtree pairs."""
    return trace.memo(("op_tree.launchers",), lambda: _launchers(trace))


def _launchers(trace: Trace) -> Launchers:
    n = names(trace)
    kept = Kept(trace, "gops", "subtree")
    cur = kept.cur
    unique = calls_unique([trace])
    w = with_sql(unique)
    gops, subtree = kept.names["gops"], kept.names["subtree"]
    # The containment join reads tables (containment.py): the launcher candidates are a temp table, and where there are
    # any, so is every GPU op's launching call. Without candidates (Nsight, rocpd) there is no join, and the launching
    # calls are looked up inside the one statement that writes the GPU ops: 2 M GPU ops are then read and written once.
    with temp_tables(cur, w, {"_tree_op": "op"}):
        if cur.execute("SELECT EXISTS (SELECT 1 FROM _tree_op)").fetchone()[0]:
            with temp_tables(cur, w, {"_tree_call": "call"}):
                cur.execute(f"""CREATE TABLE {subtree} AS
                                SELECT o.op_id, g.gop_id, o.start_ns, o.dur_ns
                                FROM _tree_call g JOIN _tree_op o ON o.ks <= g.ks AND g.ks < o.ke""")
                # Each GPU op's innermost op, with its name and times, a table of its own: inside the statement below,
                # its aggregate and joins held their tables beside the stream lag's window and the call join, and ran out
                # of DuckDB's memory (2.5 M GPU ops and cpu_ops at the default 800 MB, 80,000 at 64 MiB) instead of spilling.
                cur.execute(f"""CREATE OR REPLACE TEMP TABLE _tree_inner AS
                                SELECT i.gop_id, i.launcher_id, ln.id AS op_name_id, c.start_ns AS op_start_ns, c.end_ns AS op_end_ns
                                FROM (SELECT gop_id, arg_max(op_id, (start_ns, -dur_ns, op_id)) AS launcher_id FROM {subtree}
                                      GROUP BY gop_id) i
                                LEFT JOIN cpu_ops c ON c.rowid = i.launcher_id LEFT JOIN {n.table} ln ON ln.name = c.name""")
                try:
                    cur.execute(f"CREATE TABLE {gops} AS {gops_sql(n.table, tree=True, unique=unique)}")
                finally:
                    cur.execute("DROP TABLE IF EXISTS temp.main._tree_inner")
        else:
            cur.execute(f"CREATE TABLE {subtree} (op_id BIGINT, gop_id BIGINT, start_ns BIGINT, dur_ns BIGINT)")
            cur.execute(f"CREATE TABLE {gops} AS {gops_sql(n.table, unique=unique)}")
    return Launchers(table=gops, names=n.table, subtree=subtree, kept=(kept, n))


def gop_kinds_sql(names: str) -> str:
    """The query of each distinct (name_id, is_comm, op, whole_graph) that gops_sql can give a GPU op, from the distinct
    kernel and copy/set rows (a few hundred), with gops_sql's definitions."""
    return f"""{with_sql()}
        SELECT DISTINCT n.id AS name_id, (d.op = 'kernel' AND NOT d.whole_graph AND coalesce(cm.comm, false)) AS is_comm,
               d.op, d.whole_graph
        FROM (SELECT DISTINCT name, 'kernel' AS op, coalesce(whole_graph, false) AS whole_graph FROM kernels
              UNION SELECT DISTINCT {MEMOP_NAME}, op, false FROM memops) d
        JOIN {names} n ON n.name = d.name LEFT JOIN comm cm ON cm.name = d.name"""


def gops_sql(names: str, tree: bool = False, unique: bool = False) -> str:
    """The query (WITH clause included) of Launchers.table's rows: the GPU ops, their launching calls and, with `tree`,
    the innermost op around each call (temp tables on the cursor: _tree_call, each GPU op's launching call as `call`
    gives it, and _tree_inner, its innermost op with that op's name id and times); without it (no cpu_ops) there is no
    op launcher and the calls are joined here.
    Names become ids by joins to `names` once per distinct name (gname) or per call. The stream lag (prev_end_ns) is a
    window over these rows, narrow now that names are ids: no second window over the GPU ops joined back by id (2 M
    export: 0.3 s CPU and 200 MB of peak less). No ORDER BY: every reader orders.
    Where one reader scans it once (ops_summary's frame without cpu_ops), it is read as a subquery, never written."""
    if not tree:
        join, calls, on, inner = "LEFT JOIN", "launch", "ON l.pid = g.pid AND l.correlation_id = g.correlation_id", ""
        op_cols = "NULL::BIGINT AS launcher_id, NULL::INTEGER AS op_name_id, NULL::BIGINT AS op_start_ns, NULL::BIGINT AS op_end_ns"
    else:
        join, calls, on = "JOIN", "_tree_call", "USING (gop_id)"
        inner = "LEFT JOIN _tree_inner i USING (gop_id)"
        op_cols = "i.launcher_id, i.op_name_id, i.op_start_ns, i.op_end_ns"
    # The calls' names become ids before the calls meet the GPU ops: named after that join, its hash side held every
    # call's name text (10 M-kernel export: out of a 128 MiB limit, and 2 s slower at the default one).
    link = (f"{join} (SELECT c.* EXCLUDE (call_name), cn.id AS call_name_id FROM {calls} c "
            f"LEFT JOIN {names} cn ON cn.name = c.call_name) l {on}")
    return f"""{with_sql(unique)},
        gname AS (SELECT d.name, d.short_name, n.id AS name_id, s.id AS short_name_id, coalesce(cm.comm, false) AS comm
                  FROM (SELECT DISTINCT name, short_name FROM kernels UNION SELECT DISTINCT {MEMOP_NAME}, NULL FROM memops) d
                  JOIN {names} n ON n.name = d.name
                  LEFT JOIN {names} s ON s.name = d.short_name LEFT JOIN comm cm ON cm.name = d.name),
        gc AS (SELECT id FROM {names} WHERE name IN (SELECT name FROM graph_call)),
        unattributed AS (SELECT id FROM {names} WHERE name = {quote_literal(UNATTRIBUTED)}),
        x AS (SELECT g.gop_id, g.op, g.device_id, g.stream_id, g.start_ns, g.end_ns, g.dur_ns, gn.name_id, gn.short_name_id,
                     (g.op = 'kernel' AND NOT coalesce(g.whole_graph, false) AND gn.comm) AS is_comm,
                     coalesce(g.whole_graph, false) AS whole_graph, g.pid, l.call_tid, l.call_start_ns, l.call_end_ns,
                     l.call_name_id, {op_cols},
                     lag(g.end_ns) OVER (PARTITION BY g.device_id, g.pid, g.stream_id ORDER BY g.start_ns, g.end_ns, g.gop_id) AS prev_end_ns
              FROM gpu g {link}
              JOIN gname gn ON gn.name = g.name AND gn.short_name IS NOT DISTINCT FROM g.short_name {inner})
        SELECT gop_id, op, device_id, stream_id, start_ns, end_ns, dur_ns, name_id, short_name_id, is_comm, whole_graph, pid,
               call_tid IS NOT NULL AS linked, call_tid, call_start_ns, call_end_ns, call_name_id,
               CASE WHEN launcher_id IS NOT NULL THEN 'cpu_op'
                    WHEN call_tid IS NOT NULL AND call_name_id IN (SELECT id FROM gc) THEN 'graph'
                    WHEN call_tid IS NOT NULL THEN 'runtime' ELSE 'unlinked' END AS launcher_kind,
               coalesce(launcher_id, -1)::BIGINT AS launcher_id,
               CASE WHEN launcher_id IS NOT NULL THEN op_name_id WHEN call_tid IS NOT NULL THEN call_name_id
                    ELSE (SELECT id FROM unattributed) END AS launcher_name_id,
               CASE WHEN launcher_id IS NOT NULL THEN op_start_ns ELSE call_start_ns END AS launcher_start_ns,
               CASE WHEN launcher_id IS NOT NULL THEN op_end_ns ELSE call_end_ns END AS launcher_end_ns,
               prev_end_ns
        FROM x"""


@dataclass(frozen=True)
class HostNodes:
    """Every host node: cpu_ops rows (cpu_op and python_function), then PyTorch annotations (markers), each by rowid;
    position i is the i-th node in that order. Numpy arrays, one entry per node: nothing per node in Python objects but
    the names."""

    is_marker: np.ndarray  # bool: a markers row (annotation), else a cpu_ops row
    row: np.ndarray        # rowid in its table
    pid: np.ndarray        # float64, NaN where unknown
    tid: np.ndarray        # float64, NaN where unknown
    start_ns: np.ndarray
    dur_ns: np.ndarray
    name: np.ndarray       # object (str)
    category: np.ndarray   # object: cpu_ops.category, 'annotation' for markers
    parent: np.ndarray     # position of the parent, -1 at a root (or where the thread is unknown)
    depth: np.ndarray      # enclosing nodes on the thread


def node_parents(trace: Trace) -> HostNodes:
    """Every host node with its parent (see the module docstring). Memoized per trace."""
    return trace.memo(("op_tree.node_parents",), lambda: _node_parents(trace))


def _node_parents(trace: Trace) -> HostNodes:
    cur = trace.con.cursor()
    try:
        with temp_tables(cur, NODES_SQL, {"_tree_nodes": "n"}):
            # The IEJoin works on the first two conditions: in tree order p comes first, and c starts before p ends.
            # (On one thread an earlier ord starts no later, so p.ks <= c.ks holds; a node of an earlier thread ends
            # before any of a later thread starts.) Leading with p.ks <= c.ks and p.ord < c.ord instead paired every
            # earlier node with every later one. A statement of its own: it names no CTE (containment.py).
            cur.execute(f"""CREATE OR REPLACE TEMP TABLE _tree_par AS
                            SELECT c.ord, arg_max(p.ord, p.ord) AS parent_ord, count(*) AS depth
                            FROM _tree_nodes c JOIN _tree_nodes p ON p.ord < c.ord AND c.ks < p.ke AND c.ke <= p.ke + {BLEED_NS}
                            GROUP BY c.ord""")
            try:
                d = cur.execute("""
                    WITH a AS (SELECT (row_number() OVER (ORDER BY m, row) - 1)::BIGINT AS i, * FROM (
                                   SELECT false AS m, rowid AS row, pid, tid, start_ns, dur_ns, name, category FROM cpu_ops
                                   UNION ALL SELECT true, rowid, pid, tid, start_ns, dur_ns, name, 'annotation' FROM markers
                                   WHERE kind = 'annotation')),
                         t AS (SELECT n.node = 'markers' AS m, n.row, p.node = 'markers' AS pm, p.row AS prow,
                                      coalesce(par.depth, 0) AS depth
                               FROM _tree_nodes n LEFT JOIN _tree_par par ON par.ord = n.ord
                               LEFT JOIN _tree_nodes p ON p.ord = par.parent_ord)
                    SELECT a.m, a.row, a.pid::DOUBLE AS pid, a.tid::DOUBLE AS tid, a.start_ns, a.dur_ns, a.name, a.category,
                           coalesce(pa.i, -1) AS parent, coalesce(t.depth, 0) AS depth
                    FROM a LEFT JOIN t ON t.m = a.m AND t.row = a.row LEFT JOIN a pa ON pa.m = t.pm AND pa.row = t.prow
                    ORDER BY a.i""").fetchnumpy()
            finally:
                cur.execute("DROP TABLE IF EXISTS temp.main._tree_par")
    finally:
        cur.close()

    def arr(k, dtype):
        v = d[k]
        return np.ma.filled(v.astype(dtype), np.nan) if isinstance(v, np.ma.MaskedArray) else np.asarray(v, dtype=dtype)
    return HostNodes(is_marker=arr("m", bool), row=arr("row", np.int64), pid=arr("pid", np.float64), tid=arr("tid", np.float64),
                     start_ns=arr("start_ns", np.int64), dur_ns=arr("dur_ns", np.int64), name=np.asarray(d["name"], dtype=object),
                     category=np.asarray(d["category"], dtype=object), parent=arr("parent", np.int64),
                     depth=arr("depth", np.int64))


# Host nodes (cpu_ops rows and PyTorch annotations) in tree order, keyed by (thread, time) like the launchers.
NODES_SQL = f"""
            WITH thr AS (SELECT pid, tid, (row_number() OVER (ORDER BY pid, tid) - 1)::HUGEINT AS k FROM (
                    SELECT DISTINCT pid, tid FROM cpu_ops WHERE pid IS NOT NULL AND tid IS NOT NULL
                    UNION SELECT DISTINCT pid, tid FROM markers WHERE kind = 'annotation' AND pid IS NOT NULL AND tid IS NOT NULL)),
            n0 AS (SELECT 'cpu_ops' AS node, rowid AS row, pid, tid, start_ns, end_ns FROM cpu_ops
                   UNION ALL SELECT 'markers', rowid, pid, tid, start_ns, end_ns FROM markers WHERE kind = 'annotation'),
            n AS (SELECT n0.*, row_number() OVER (ORDER BY n0.pid, n0.tid, n0.start_ns, n0.end_ns DESC, n0.node DESC, n0.row) AS ord,
                         thr.k * {SHIFT} + n0.start_ns AS ks, thr.k * {SHIFT} + n0.end_ns AS ke
                  FROM n0 JOIN thr ON thr.pid = n0.pid AND thr.tid = n0.tid)
"""
