"""Which model data each per-profile tool needs, and which capture option records that data in each format.

One table serves trace_info's capability list, every tool's refusal and every partial answer, so that
"cannot run here" is decided once and always says the same thing: what is missing, the native tables
(or events) that would hold it, and the profiler option that records them. Flags are the documented ones
(Nsight Systems CLI `--trace`, rocprofv3 tracing options, torch.profiler arguments); see
docs/partial-profiles.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.errors import ProfileError
from ..model.trace import Trace
from .common import skipped_note


@dataclass(frozen=True)
class Kind:
    """One kind of model data a tool can need."""

    what: str       # as a message names it: "GPU kernels"
    tables: tuple   # model tables it lives in (for the data_issues note)
    count_sql: str  # rows of it in the model


_RANGES = "kind IN ('push_pop', 'start_end', 'annotation') AND pid IS NOT NULL"
_OPS = "category = 'cpu_op'"
KINDS: dict[str, Kind] = {
    "kernels": Kind("GPU kernels", ("kernels",), "SELECT count(*) FROM kernels"),
    "memops": Kind("GPU memory copies or sets", ("memops",), "SELECT count(*) FROM memops"),
    "api_calls": Kind("host runtime/driver API calls", ("api_calls",), "SELECT count(*) FROM api_calls"),
    "markers": Kind("annotation ranges (NVTX, rocTX, record_function)", ("markers",), f"SELECT count(*) FROM markers WHERE {_RANGES}"),
    "cpu_ops": Kind("PyTorch CPU operators", ("cpu_ops",), f"SELECT count(*) FROM cpu_ops WHERE {_OPS}"),
    "memory_events": Kind("device memory allocation/free events", ("memory_events",), "SELECT count(*) FROM memory_events"),
    "os_memory": Kind("GPU memory levels the OS reports (Windows WDDM usage and budget)", ("os_memory_levels",),
                      "SELECT count(*) FROM os_memory_levels"),
    "op_shapes": Kind("PyTorch operator input shapes", ("cpu_ops",),
                      f"SELECT count(*) FROM cpu_ops WHERE {_OPS} AND input_dims IS NOT NULL AND input_dims NOT IN ('', '[]')"),
}

_TORCH = "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
_NO_OPS = "only PyTorch profiler traces hold operators: profile with " + _TORCH + ", record_shapes=True)"
# format -> kind -> (where the profile keeps it, how to capture it). None: the format cannot hold it.
SOURCES: dict[str, dict[str, tuple[str, str] | None]] = {
    "nsys": {
        "kernels": ("table CUPTI_ACTIVITY_KIND_KERNEL", "`nsys profile --trace=cuda`"),
        "memops": ("tables CUPTI_ACTIVITY_KIND_MEMCPY / CUPTI_ACTIVITY_KIND_MEMSET", "`nsys profile --trace=cuda`"),
        "api_calls": ("table CUPTI_ACTIVITY_KIND_RUNTIME", "`nsys profile --trace=cuda`"),
        "markers": ("table NVTX_EVENTS", "`nsys profile --trace=cuda,nvtx`"),
        "memory_events": ("table CUDA_GPU_MEMORY_USAGE_EVENTS", "`nsys profile --trace=cuda --cuda-memory-usage=true`"),
        "os_memory": ("tables GPU_MEMORY_USAGE_EVENTS / GPU_MEMORY_BUDGET_EVENTS",
                      "`nsys profile --trace=cuda,wddm` (Windows only)"),
        "cpu_ops": None, "op_shapes": None,
    },
    "rocpd": {
        "kernels": ("rocpd_kernel_dispatch", "`rocprofv3 --kernel-trace` (or --runtime-trace / --sys-trace)"),
        "memops": ("rocpd_memory_copy", "`rocprofv3 --memory-copy-trace` (or --runtime-trace / --sys-trace)"),
        "api_calls": ("HIP API regions in rocpd_region", "`rocprofv3 --hip-trace` (or --runtime-trace / --sys-trace)"),
        "markers": ("rocTX regions in rocpd_region", "`rocprofv3 --marker-trace`"),
        "memory_events": ("rocpd_memory_allocate", "`rocprofv3 --memory-allocation-trace`"),
        "cpu_ops": None, "op_shapes": None, "os_memory": None,
    },
    "rpd": {
        "kernels": ("kernel rows of rocpd_op", "the RPD tracer with GPU ops recorded, or rocprofv3 --kernel-trace"),
        "memops": ("copy rows of rocpd_op", "the RPD tracer with GPU ops recorded, or rocprofv3 --memory-copy-trace"),
        "api_calls": ("rocpd_api", "the RPD tracer with HIP API calls recorded, or rocprofv3 --hip-trace"),
        "markers": ("rocTX rows of rocpd_api", "roctxRangePush/Pop in the program, or rocprofv3 --marker-trace"),
        "memory_events": ("no table of legacy RPD; rocpd_memory_allocate in rocprofv3 output",
                          "rocprofv3 --memory-allocation-trace --output-format rocpd"),
        "cpu_ops": None, "op_shapes": None, "os_memory": None,
    },
    "kineto": {
        "kernels": ("'kernel' events", _TORCH + ")"),
        "memops": ("'gpu_memcpy' / 'gpu_memset' events", _TORCH + ")"),
        "api_calls": ("'cuda_runtime' / 'cuda_driver' events", _TORCH + ")"),
        "markers": ("'user_annotation' events (ProfilerStep#N, record_function)",
                    "torch.profiler.record_function('name') around steps, or prof.step() each iteration"),
        "cpu_ops": ("'cpu_op' events", _TORCH + ")"),
        "op_shapes": ("'Input Dims' of 'cpu_op' events", _TORCH + ", record_shapes=True)"),
        "memory_events": ("'[memory]' instant events (cat cpu_instant_event)", _TORCH + ", profile_memory=True)"),
        "os_memory": None,
    },
}

GPU = ("kernels", "memops")
# tool -> groups of kinds; every group must hold data of at least one of its kinds.
NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "top_kernels": (("kernels",),),
    "graph_summary": (("kernels",),),
    "gap_histogram": (GPU,),
    "gap_histogram.host_calls": (("api_calls",),),
    "gpu_timeline": (GPU,),
    "stream_summary": (GPU,),
    "phases": (GPU,),
    "diagnose": (("kernels", "memops", "api_calls"),),
    "compare_traces": (GPU,),
    "rank_summary": (),
    "check_regression": (),  # per metric: steps need markers, kernel metrics kernels; it says which is missing
    "memcpy_summary": (("memops",),),
    "api_summary": (("api_calls",),),
    "marker_summary": (("markers",),),
    "iterations": (("markers",),),
    "comm_summary": (("kernels",),),
    "straggler_summary": (("kernels",),),
    "comm_job_summary": (("kernels",),),
    "ops_summary": (GPU,),
    "call_stack": (("kernels",),),
    "call_stack.op": (("cpu_ops",),),
    "perf_summary": (("cpu_ops",), GPU),
    "roofline": (GPU, ("cpu_ops",)),
    "roofline.kernel_flops": (("kernels",),),
    "replay_spec": (("cpu_ops",),),
    "memory_timeline": (("memory_events", "os_memory"),),
    "sql_query": (),
    "critical_path": (GPU,),
}
# tool -> part of its answer -> the kinds that part needs; without them the tool answers the rest and says so.
PARTS: dict[str, dict[str, tuple[str, ...]]] = {
    "diagnose": {"GPU-side bottleneck classes (compute, memory, launch_overhead, communication, sync, idle_host, copies)": GPU,
                 "host-side findings (blocked time, API time by call)": ("api_calls",)},
    "api_summary": {"launches (API duration, queue delay, launch latency)": ("kernels",),
                    "pageable_async_copy (async copy calls whose host buffer is pageable block the thread; it takes the "
                    "copies' host memory kind)": ("memops",)},
    "iterations": {"per-step GPU figures": GPU},
    "critical_path": {"host side of the graph (host order, launches, synchronisation, events)": ("api_calls",)},
    "perf_summary": {"FLOP and byte models (without shapes every op stays time-only, unmodelled)": ("op_shapes",)},
    "roofline": {"ratings of operators (without shapes none is rated; pass kernel_flops instead)": ("op_shapes",)},
    "replay_spec": {"input shapes of the signature": ("op_shapes",)},
    "check_regression": {"step_time and per-step metrics": ("markers",), "kernel metrics": ("kernels",),
                         "gpu_busy / gpu_idle": GPU},
    "rank_summary": {"GPU figures (span, busy, compute, communication)": GPU,
                     "steps": ("markers",)},
}


def present(trace: Trace) -> dict[str, int]:
    """Rows of each kind of data in the profile (memoized)."""
    return trace.memo(("requirements.present",), lambda: {k: int(trace.scalar(v.count_sql)) for k, v in KINDS.items()})


def missing(trace: Trace, tool: str) -> list[tuple[str, ...]]:
    """The groups of `tool`'s needs the profile does not satisfy (empty: the tool can run)."""
    have = present(trace)
    return [g for g in NEEDS[tool] if not any(have[k] for k in g)]


def gap_text(trace: Trace, kinds: tuple[str, ...]) -> str:
    """'no GPU kernels (table CUPTI_ACTIVITY_KIND_KERNEL; capture with `nsys profile --trace=cuda`)' for a group of
    kinds the profile lacks (any one of them would do); the rows the reader skipped from them are named."""
    sources = SOURCES.get(trace.format, {})
    held = [k for k in kinds if sources.get(k) is not None]
    parts = []
    if held:
        flags = " / ".join(dict.fromkeys(sources[k][1] for k in held))
        parts.append(f"no {' or '.join(KINDS[k].what for k in held)} ({'; '.join(sources[k][0] for k in held)}; "
                     f"capture with {flags})")
    never = [k for k in kinds if sources.get(k) is None]
    if never and not held:  # where one kind of the group can be captured, that is the advice
        parts.append(f"no {' or '.join(KINDS[k].what for k in never)} (this format never holds them; {_NO_OPS})")
    tables = tuple(dict.fromkeys(t for k in kinds for t in KINDS[k].tables))
    return ", nor ".join(parts) + skipped_note(trace, tables).rstrip()


def reason(trace: Trace, tool: str) -> str | None:
    """Why `tool` cannot run on this profile (the missing data, where it would be, the capture flag), or None."""
    gaps = missing(trace, tool)
    if not gaps:
        return None
    return (f"{tool.split('.')[0]} needs data this {trace.format_name} does not hold: "
            + "; and ".join(gap_text(trace, g) for g in gaps)
            + ". trace_info lists what the profile holds and which tools apply.")


def require(trace: Trace, tool: str, detail: str = "") -> None:
    """Raise the table's ProfileError when `tool` cannot run here; `detail` adds tool-specific advice."""
    why = reason(trace, tool)
    if why is not None:
        raise ProfileError(f"{trace.path.name}: {why}" + (f" {detail}" if detail else ""))


def left_out(trace: Trace, tool: str) -> list[str]:
    """The parts of `tool`'s answer this profile cannot give, each with its gap text ('launches: no GPU kernels (...)')."""
    have = present(trace)
    return [f"{part}: {gap_text(trace, kinds)}" for part, kinds in PARTS.get(tool, {}).items() if not any(have[k] for k in kinds)]
