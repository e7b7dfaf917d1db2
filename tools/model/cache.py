"""Opened profiles stay open: keyed by path, size and mtime, bounded by count and memory."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from .detect import regular_file
from .errors import ProfileError, shown_path
from .trace import Progress, Trace, _no_progress, load_trace

MAX_TRACES = int(os.environ.get("GPUSCOPE_CACHE_TRACES", "4"))
MAX_BYTES = int(float(os.environ.get("GPUSCOPE_CACHE_MB", "4096")) * 1e6)

_cache: "OrderedDict[tuple, Trace]" = OrderedDict()
# Recent refusals, by the same key: an agent calls several tools on a damaged file in a row, and each
# would otherwise read it all again (a truncated 2 GB export takes as long to refuse as to load). Kept
# for seconds only, so that a refusal that depends on the moment (out of memory) is soon retried.
_refused: "OrderedDict[tuple, tuple[float, str]]" = OrderedDict()
REFUSAL_TTL_S = 15.0
MAX_REFUSED = 64
_loading: dict[tuple, threading.Lock] = {}
_guard = threading.Lock()


def _key(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


def _memory_bytes(trace: Trace) -> int:
    try:
        return int(trace.scalar("SELECT sum(memory_usage_bytes) FROM duckdb_memory()") or 0)
    except Exception:
        return 0


def open_trace(path: str | Path, progress: Progress = _no_progress) -> Trace:
    """The trace model of `path`, loaded once and reused while the file is unchanged."""
    resolved = regular_file(path)
    try:
        key = _key(resolved)
    except OSError as exc:  # e.g. a parent folder without search permission
        raise ProfileError(f"Cannot read {shown_path(resolved)}: {exc.strerror or exc}. Check the path and its permissions.") from None
    with _guard:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        lock = _loading.setdefault(key, threading.Lock())
    with lock:  # two concurrent first calls load the file once
        try:
            with _guard:
                hit = _cache.get(key)
                if hit is not None:
                    return hit
                refused = _refused.get(key)
                if refused is not None and time.monotonic() - refused[0] < REFUSAL_TTL_S:
                    raise ProfileError(refused[1])
            try:
                trace = load_trace(resolved, progress)
            except ProfileError as exc:
                with _guard:
                    _refused[key] = (time.monotonic(), str(exc))
                    while len(_refused) > MAX_REFUSED:
                        _refused.popitem(last=False)
                raise
            with _guard:
                for stale in [k for k in _cache if k[0] == key[0]]:
                    _cache.pop(stale).close()
                _cache[key] = trace
                _evict()
        finally:
            with _guard:  # a failed load leaves no lock behind (the same bad file is retried often)
                _loading.pop(key, None)
    return trace


def _evict() -> None:
    while len(_cache) > MAX_TRACES:
        _cache.popitem(last=False)[1].close()
    while len(_cache) > 1 and sum(_memory_bytes(t) for t in _cache.values()) > MAX_BYTES:
        _cache.popitem(last=False)[1].close()


def clear() -> None:
    with _guard:
        _refused.clear()
        while _cache:
            _cache.popitem()[1].close()
