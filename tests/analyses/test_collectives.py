"""collectives.instances_sql, the one rule straggler_summary and critical_path's job join share, on hand-written
kernels (ground truth written here): every instance is the same (communicator, name) or, in name order, the same name;
one kernel without its communicator sends every kernel to name order; point-to-point kernels are counted, never
numbered."""

from __future__ import annotations

import duckdb
import pandas as pd

from gpuscope.tools.analyses.collectives import instances_sql, match_rule

AR, AG = "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_AllGather_RING_LL"
GENERIC = "ncclDevKernel_Generic"


def _run(rows):
    """rows: (rank, name, collective, communicator, start_ns, dur_ns) -> (rule row, {(comm, name, seq): (ranks, members,
    complete)}, {(rank, start_ns): (comm, name, seq)})."""
    df = pd.DataFrame(rows, columns=["rank", "name", "collective", "communicator", "start_ns", "dur_ns"])
    con = duckdb.connect()
    con.register("k", df.assign(tie=range(len(df))))
    cte = "WITH " + instances_sql("SELECT rank, name, collective::VARCHAR AS collective, communicator::VARCHAR AS "
                                  "communicator, start_ns, dur_ns, tie FROM k")
    rule = con.execute(cte + " SELECT kernels, missing, by_comm, ranks, p2p_kernels FROM rule").fetchone()
    inst = {(c, n, s): (r, m, ok) for c, n, s, r, m, ok in con.execute(cte + " SELECT comm, name, seq, ranks, members, complete FROM inst").fetchall()}
    seq = {(r, s): (c, n, q) for r, s, c, n, q in con.execute(cte + " SELECT rank, start_ns, comm, name, seq FROM n").fetchall()}
    return rule, inst, seq


def test_a_communicators_kernels_under_different_names_never_pair():
    """Rank 1's capture starts after communicator c's first all-reduce: by (communicator, name) the all-gathers still
    pair (the per-communicator count of the rule critical_path ran before paired rank 1's all-gather with rank 0's
    first all-reduce), the all-reduces of one name pair in order, and rank 0's second all-reduce is incomplete."""
    rule, inst, seq = _run([(0, AR, None, "c", 100, 10), (0, AG, None, "c", 200, 10), (0, AR, None, "c", 300, 10),
                            (1, AG, None, "c", 205, 5), (1, AR, None, "c", 305, 5)])
    assert rule == (5, 0, True, 2, 0) and match_rule(rule[0], rule[2]) == "communicator"
    assert inst == {("c", AG, 1): (2, 2, True), ("c", AR, 1): (2, 2, True), ("c", AR, 2): (1, 2, False)}
    assert seq[(1, 205)] == ("c", AG, 1) and seq[(0, 200)] == ("c", AG, 1)


def test_one_kernel_without_a_communicator_sends_every_kernel_to_name_order():
    """Two communicators under one name; rank 1's second kernel records none: all four are numbered by name on every
    rank with collective kernels (the members of the one NULL key), and a point-to-point kernel (recorded operation
    'send' under ROCm's generic name) is counted, not numbered, while a generic kernel recorded as an all-reduce is."""
    rule, inst, seq = _run([(0, AR, None, "tp", 100, 10), (0, AR, None, "dp", 200, 10), (1, AR, None, "tp", 100, 10),
                            (1, AR, None, None, 200, 10), (0, GENERIC, "send", "pp", 300, 10),
                            (1, GENERIC, "allreduce", "x", 400, 10)])
    assert rule == (5, 1, False, 2, 1) and match_rule(rule[0], rule[2]) == "name_order"
    assert inst == {(None, AR, 1): (2, 2, True), (None, AR, 2): (2, 2, True), (None, GENERIC, 1): (1, 2, False)}
    assert (0, 300) not in seq and seq[(1, 200)] == (None, AR, 2)


def test_no_collective_kernel():
    rule, inst, _ = _run([(0, GENERIC, "recv", None, 1, 1)])
    assert rule == (0, 0, False, 0, 1) and match_rule(rule[0], rule[2]) == "none" and inst == {}
