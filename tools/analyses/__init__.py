"""The analyses, one module per question. Each takes an opened Trace and returns a pydantic result.

    list_traces     profiles under a folder                      list_traces.py
    trace_info      what a profile is and holds (entry point)    trace_info.py
    top_kernels     kernels ranked by time, per device           top_kernels.py
    graph_summary   CUDA/HIP graph replays inside, Triton kernels graph_summary.py
    gap_histogram   idle gaps per device/stream + host context   gap_histogram.py
    phases          init / steady / teardown segmentation        phases.py
    memcpy_summary  copies/sets by direction, bandwidth, overlap  memcpy_summary.py
    stream_summary  per-stream busy time and concurrency         stream_summary.py
    api_summary     host API calls, blocked time, launch delays  api_summary.py
    gpu_timeline    compute / exposed comm / exposed copy / idle gpu_timeline.py
    comm_summary    NCCL/RCCL/MPI communication and overlap      comm_summary.py (comm_patterns.py)
    comm_job_summary  a job's communication per rank and collective  comm_job.py (stacked.py)
    rank_summary    per-rank comparison, imbalance, straggler    rank_summary.py
    straggler_summary  per collective: who arrived last, skew     straggler_summary.py (collectives.py, tools/model/job.py)
    ops_summary     GPU time per launching operator (TraceLens)  ops_summary.py (op_tree.py)
    perf_summary    FLOPs, bytes, TFLOP/s, TB/s per op signature perf_summary.py (tools/perf_models)
    roofline        bound, % of roof, headroom, impact table     roofline.py (tools/hardware)
    call_stack      parent chain and subtree of a kernel or op    call_stack.py
    diagnose        ranked findings with bottleneck class         diagnose.py (diagnose_host.py without GPU data)
    compare_traces  two profiles side by side                     compare_traces.py
    check_regression  CI gate: a profile against a saved baseline  regression.py (save_baseline, load_baseline)
    replay_spec     reproducer description of an op signature    replay_spec.py
    marker_summary  NVTX/rocTX/annotation ranges + GPU projection marker_summary.py (projection.py)
    iterations      repeated steps, warm-up vs steady state      iterations.py
    critical_path   step-bounding chain (a job: across ranks)    critical_path/ (a package: one module per part; collectives.py)
    memory_timeline device memory over time, peak, never freed   memory_timeline.py
    sql_query       read-only SQL; list_tables, describe_table   sql_query.py

Which data each tool needs, and the capture flag that records it: requirements.py (trace_info, refusals).
"""

from .api_summary import api_summary
from .call_stack import call_stack
from .comm_job import comm_job_summary
from .comm_summary import comm_summary
from .compare_traces import compare_traces
from .critical_path import critical_path
from .diagnose import diagnose
from .gap_histogram import gap_histogram
from .gpu_timeline import gpu_timeline
from .graph_summary import graph_summary
from .iterations import iterations
from .list_traces import list_traces
from .marker_summary import marker_summary
from .memcpy_summary import memcpy_summary
from .memory_timeline import memory_timeline
from .ops_summary import ops_summary
from .perf_summary import perf_summary
from .phases import phases
from .regression import check_regression, save_baseline
from .rank_summary import rank_summary
from .replay_spec import replay_spec
from .roofline import roofline
from .sql_query import describe_table, list_tables, sql_query
from .straggler_summary import straggler_summary
from .stream_summary import stream_summary
from .top_kernels import top_kernels
from .trace_info import trace_info

__all__ = ["api_summary", "call_stack", "check_regression", "comm_job_summary", "comm_summary", "compare_traces", "critical_path", "describe_table", "diagnose", "gap_histogram", "gpu_timeline", "graph_summary", "iterations", "list_tables", "list_traces", "marker_summary", "memcpy_summary", "memory_timeline", "ops_summary", "perf_summary", "phases", "rank_summary", "replay_spec", "roofline", "save_baseline", "sql_query", "straggler_summary", "stream_summary", "top_kernels", "trace_info"]
