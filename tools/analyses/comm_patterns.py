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

# Collective type, first match wins: of the operation the profile records for the kernel (kernels.collective: NCCL
# call names as AllReduce, Send; PyTorch 'Collective name' as allreduce, _reduce_scatter_base, send) where it matches
# one, else of the kernel name (ncclDevKernel_AllReduce_Sum_f32_RING_LL). ROCm's ncclDevKernel_Generic runs every
# collective and point-to-point transfer under one name: only the recorded operation tells them apart. An operation
# of no type here (PyTorch 'barrier', 'gather', 'scatter') falls back to the name.
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
# communicator: their peer is not in the model, so they cannot be matched across ranks as one collective instance.
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


def collective_label(op: str | None, name: str) -> str | None:
    """The COLLECTIVES type of a communication kernel: of its recorded operation `op` (kernels.collective) where that
    matches one, else of its name; None when neither does."""
    for text in (op, name):
        found = next((label for label, rx in COLLECTIVES if text and re.search(rx, text, re.I)), None)
        if found:
            return found
    return None


def collective_index_sql(column: str = "name", op: str = "collective") -> str:
    """SQL expression: the index in COLLECTIVES of a communication kernel's collective type, from its recorded
    operation (column `op`, kernels.collective) where that matches one, else from its name (column `column`);
    len(COLLECTIVES) = 'Other' when neither does. An integer, so it can partition interval unions."""
    def index(col: str, other: str) -> str:
        cases = " ".join(f"WHEN regexp_matches({col}, '{rx}', 'i') THEN {i}" for i, (_, rx) in enumerate(COLLECTIVES))
        return f"CASE {cases} ELSE {other} END"

    return index(op, index(column, str(len(COLLECTIVES))))
