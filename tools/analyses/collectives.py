"""One rule for "the same collective on every rank": which communication kernels of a job's ranks are one collective
instance. straggler_summary compares the instances' durations; critical_path joins a job's rank graphs at them.

The rule, where every collective kernel records its communicator (kernels.communicator: Nsight, the NCCL NVTX
payload's communicator id; Kineto, the kernel args' 'Process Group Name'): an instance is the k-th kernel of one
(communicator, kernel name) on each member rank, a member being a rank with kernels of that communicator
(collective_match 'communicator'). NCCL requires every member of a communicator to issue its collectives in the same
order, which is what makes the k-th kernel of a communicator one instance on every member; the kernel name in the key
keeps kernels of one communicator under different names (an all-reduce and an all-gather, two dtypes) from pairing
where a rank's capture holds more of one than another.
Where some collective kernel records none (rocpd/rpd never do; Nsight without NCCL payloads, Kineto without the
args), every kernel is matched by name order instead: the k-th kernel of one name on each rank with collective
kernels ('name_order'), which pairs kernels of different communicators that share a name. All or nothing, because a
kernel without a communicator still belongs to some communicator: leaving it out of that communicator's count (or
matching it by name while its peers are matched by communicator) would shift the order k of the communicator's later
kernels on its rank and pair them with the wrong instance.

Point-to-point kernels (Send, Recv, SendRecv: comm_patterns.POINT_TO_POINT, of the operation the profile records,
kernels.collective, else of the kernel name) are never instances: a transfer joins two ranks whose pairing the
profile does not record, not every member of its communicator. They are counted (rule.p2p_kernels) and left out of
the numbering. An instance is complete when every member holds it and they are two at least; the others (missing on
some member: a capture cut mid-step, ranks running different work; or one member only) compare nothing.

Kernels on one rank are numbered in (start, duration, `tie`) order. The SQL runs over any relation of communication
kernels, so the same statement numbers a job's stacked stores (straggler_summary) and the kernels of the rank graphs
of a window (critical_path, a DataFrame).
"""

from __future__ import annotations

from .comm_patterns import COLLECTIVES, POINT_TO_POINT, collective_index_sql

P2P_INDEXES = ", ".join(str(i) for i, (label, _) in enumerate(COLLECTIVES) if label in POINT_TO_POINT)
# collective type of kinds.coll (an index of COLLECTIVES; len(COLLECTIVES): none named)
KIND_LABELS = [label for label, _ in COLLECTIVES] + ["collective"]


def instances_sql(kernels: str) -> str:
    """CTEs (to follow WITH, or a comma) numbering the communication kernels of `kernels` into instances. `kernels`
    is a SELECT of communication kernels only, with the columns rank, name, collective (recorded operation or NULL),
    communicator (or NULL), start_ns, dur_ns and tie (any order breaking start and duration ties on a rank; other
    columns pass through to kr):
      ck     `kernels`;
      kinds  per distinct (name, collective): coll (index of COLLECTIVES) and p2p (the regexes run once per pair);
      kr     every kernel of ck with its coll and p2p;
      rule   one row: kernels (collective ones), missing (of those, without a communicator), by_comm (none missing),
             ranks (with collective kernels), p2p_kernels;
      n      the collective kernels with their instance key (comm: the communicator under by_comm, else NULL; name;
             seq: from 1 per rank, comm and name);
      members  ranks per key communicator (every rank with collective kernels under name order);
      inst   per (comm, name, seq): ranks holding it, members of its communicator, shortest and longest duration;
             complete: every member holds it, and they are two at least."""
    return f"""
        ck AS ({kernels}),
        kinds AS (SELECT name, collective, {collective_index_sql('name', 'collective')} AS coll
                  FROM (SELECT DISTINCT name, collective FROM ck)),
        kr AS (SELECT ck.*, t.coll, t.coll IN ({P2P_INDEXES}) AS p2p FROM ck
               JOIN kinds t ON ck.name = t.name AND ck.collective IS NOT DISTINCT FROM t.collective),
        rule AS (SELECT count(*) FILTER (WHERE NOT p2p) AS kernels,
                        count(*) FILTER (WHERE NOT p2p AND communicator IS NULL) AS missing,
                        kernels > 0 AND missing = 0 AS by_comm, count(DISTINCT rank) FILTER (WHERE NOT p2p) AS ranks,
                        count(*) FILTER (WHERE p2p) AS p2p_kernels FROM kr),
        keyed AS (SELECT kr.*, CASE WHEN rule.by_comm THEN kr.communicator END AS comm FROM kr, rule WHERE NOT kr.p2p),
        n AS (SELECT *, row_number() OVER (PARTITION BY rank, comm, name ORDER BY start_ns, dur_ns, tie) AS seq FROM keyed),
        members AS (SELECT comm, count(DISTINCT rank) AS ranks FROM n GROUP BY comm),
        inst AS (SELECT n.comm, n.name, n.seq, count(*) AS ranks, any_value(m.ranks) AS members, min(n.dur_ns) AS mn,
                        max(n.dur_ns) AS mx, count(*) = any_value(m.ranks) AND count(*) > 1 AS complete
                 FROM n JOIN members m ON n.comm IS NOT DISTINCT FROM m.comm GROUP BY n.comm, n.name, n.seq)"""


def match_rule(kernels: int, by_comm: bool) -> str:
    """collective_match: which rule numbered the instances ('none': no collective kernel)."""
    return "none" if not kernels else "communicator" if by_comm else "name_order"
