"""Kernel base names ("short names"), one rule for every reader whose format does not state them.

Nsight exports carry their own shortName; Kineto, rocpd and legacy RPD give only the full symbol,
so their readers derive it here. One rule matters because compare_traces and rank_summary match
kernels across formats by this name.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pandas as pd

# API calls that replay a CUDA/HIP graph: cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch (version suffixes are folded).
# graph_summary marks the kernels they launch; the Nsight preview (readers/nsys.py) keeps exactly these calls.
GRAPH_LAUNCH_RX = "graph.?launch"

_PARAMS_START = re.compile(r"[\w>]$")


def short_name(full: str) -> str:
    """Base name like Nsight's shortName: no return type, namespaces, template args or parameters.
    'void at::native::vectorized_elementwise_kernel<4, F>(int, F)' → 'vectorized_elementwise_kernel';
    AMD code-object symbols lose their '.kd' suffix ('_Z6kernelPfi.kd' → '_Z6kernelPfi')."""
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
    base = base[:-3] if base.endswith(".kd") and len(base) > 3 else base
    return base if re.search(r"\w", base) else full


def create_short_names(con: duckdb.DuckDBPyConnection, table: str, names_sql: str) -> None:
    """TEMP TABLE `table`(name, short) over the distinct non-null names `names_sql` selects. Distinct
    kernel names number in the hundreds even in traces of millions of kernels, so the rule runs in
    Python per name and the readers join the result in SQL."""
    names = [n for (n,) in con.execute(f"SELECT DISTINCT name FROM ({names_sql}) WHERE name IS NOT NULL").fetchall()]
    df = pd.DataFrame({"name": np.array(names, dtype=object), "short": np.array([short_name(n) for n in names], dtype=object)})
    view = f"_{table}_df"
    con.register(view, df)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT name::VARCHAR AS name, short::VARCHAR AS short FROM {view}")
    con.unregister(view)
