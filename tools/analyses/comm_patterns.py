"""Which GPU kernels are communication, and which collective they perform.

A configurable list of case-insensitive regular expressions over kernel names. The defaults cover
NCCL/RCCL (old `ncclKernel_*`, new `ncclDevKernel_*`, ROCm 6 `ncclDevKernel_Generic`, legacy
`rcclGenericKernel`), custom all-reduce kernels (`multimem_all_reduce`, `cross_device_reduce`,
`one_shot_all_reduce`, ...) and NVSHMEM/DeepEP — HTA's `^nccl` rule and TraceLens's fixed names
miss the custom ones and count them as computation. Users extend the list per call or with the
GPUSCOPE_COMM_PATTERNS environment variable (patterns separated by `;`).
"""

from __future__ import annotations

import os
import re

from ..model.errors import ProfileError
from ..model.quote import quote_literal

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"nccl",                      # ncclKernel_*, ncclDevKernel_* (NCCL and RCCL)
    r"rccl",                      # rcclGenericKernel*, rccl*
    r"multimem_all_reduce",
    r"cross_device_reduce",
    r"one_shot_all_reduce|two_shot_all_reduce|custom_all_reduce|allreduce|all_reduce",
    r"all_gather|allgather|reduce_scatter|reducescatter|alltoall|all_to_all",
    r"nvshmem",
    r"deep_ep|deepep",
)

# Collective type from the kernel name, first match wins (NCCL names: ncclDevKernel_AllReduce_Sum_f32_RING_LL).
COLLECTIVES: tuple[tuple[str, str], ...] = (
    ("AllReduce", r"all_?reduce|cross_device_reduce"),
    ("ReduceScatter", r"reduce_?scatter"),
    ("AllGather", r"all_?gather"),
    ("AllToAll", r"all_?to_?all"),
    ("Broadcast", r"broadcast"),
    ("Reduce", r"reduce"),
    ("SendRecv", r"send_?recv|sendrecv"),
    ("Send", r"send"),
    ("Recv", r"recv"),
)
# The types of COLLECTIVES that move data between two ranks (pipeline stages, ...), not among every rank of a
# communicator: their peer is not in the profile, so they cannot be matched across ranks as one collective instance.
POINT_TO_POINT: frozenset[str] = frozenset({"SendRecv", "Send", "Recv"})


def comm_patterns(extra: list[str] | None = None) -> list[str]:
    """The active pattern list: defaults, then GPUSCOPE_COMM_PATTERNS, then `extra`."""
    env = [p for p in os.environ.get("GPUSCOPE_COMM_PATTERNS", "").split(";") if p.strip()]
    patterns = list(DEFAULT_PATTERNS) + env + list(extra or [])
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ProfileError(f"invalid communication pattern {p!r}: {exc}. Patterns are regular expressions over "
                               "kernel names.") from None
    return patterns


def is_comm_sql(column: str = "name", extra: list[str] | None = None) -> str:
    """SQL predicate: the kernel name in `column` is communication."""
    alternation = "|".join(f"(?:{p})" for p in comm_patterns(extra))
    return f"regexp_matches({column}, {quote_literal(alternation)}, 'i')"


def collective_index_sql(column: str = "name") -> str:
    """SQL expression: the index in COLLECTIVES of a communication kernel name's collective type
    (len(COLLECTIVES) = 'Other' when unknown). An integer, so it can partition interval unions."""
    cases = " ".join(f"WHEN regexp_matches({column}, '{rx}', 'i') THEN {i}" for i, (_, rx) in enumerate(COLLECTIVES))
    return f"CASE {cases} ELSE {len(COLLECTIVES)} END"
