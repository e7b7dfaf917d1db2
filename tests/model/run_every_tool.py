"""Run every single-profile analysis with default arguments on the profiles named on the command line, in a
fresh process, and print one JSON object: per profile, whether the store was built by this open, and each
tool's result (or its ProfileError). Used by test_store.py to compare a first open with a reopen."""

import json
import sys

from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace

TOOLS = ["trace_info", "top_kernels", "gap_histogram", "memcpy_summary", "stream_summary", "marker_summary",
         "iterations", "api_summary", "gpu_timeline", "comm_summary", "phases", "ops_summary", "perf_summary",
         "diagnose", "list_tables"]


def _drop_timing(value):
    """Open time is the one figure that may differ between a build and a reopen."""
    if isinstance(value, dict):
        return {k: _drop_timing(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_drop_timing(v) for v in value]
    return value


out = {}
for path in sys.argv[1:]:
    trace = load_trace(path)
    answers = {}
    for tool in TOOLS:
        try:
            answers[tool] = _drop_timing(getattr(A, tool)(trace).model_dump(mode="json"))
        except ProfileError as exc:
            answers[tool] = {"refused": str(exc)}
    out[path] = {"built": trace.store.built, "in_memory": trace.store.in_memory, "answers": answers}
    trace.close()
print(json.dumps(out, sort_keys=True))
