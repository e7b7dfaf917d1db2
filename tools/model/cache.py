"""Opened profiles stay open, and a profile in use is never closed under a running tool.

Opening a profile whose store exists costs milliseconds (tools/model/store.py) and an open one costs
little (its store is attached to the process's one DuckDB instance, tools/model/hub.py, whose memory
limit covers them all), so many stay open: GPUSCOPE_CACHE_TRACES (default 64), least recently used
closed first. A file changed in any way (size, mtime, inode, or ctime: also a rewrite that restores
size and mtime) is opened again, and its new content finds or builds its own store.

Leases: a tool call runs inside `leases()`; every profile it opens there is held until the call ends.
Eviction closes only profiles nobody holds; a held one leaves the cache at once and closes on release.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .detect import regular_file
from .errors import ProfileError, shown_path
from .trace import Progress, Trace, _no_progress, load_trace

MAX_TRACES = int(os.environ.get("GPUSCOPE_CACHE_TRACES", "64"))

_cache: "OrderedDict[tuple, Trace]" = OrderedDict()
# Recent refusals, by the same key: an agent calls several tools on a damaged file in a row, and each
# would otherwise read it all again (a truncated 2 GB export takes as long to refuse as to load). Kept
# for seconds only, so that a refusal that depends on the moment (out of memory) is soon retried.
_refused: "OrderedDict[tuple, tuple[float, str]]" = OrderedDict()
REFUSAL_TTL_S = 15.0
MAX_REFUSED = 64
_loading: dict[tuple, threading.Lock] = {}
_holders: dict[int, int] = {}       # id(trace) -> leases held on it
_retired: dict[int, Trace] = {}     # evicted while held: closed when the last lease ends
_guard = threading.Lock()
_scope = threading.local()


def _key(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@contextmanager
def leases() -> Iterator[None]:
    """Hold every profile opened in this block (on this thread) until the block ends."""
    outer = getattr(_scope, "held", None)
    held: list[Trace] = []
    _scope.held = held
    try:
        yield
    finally:
        _scope.held = outer
        with _guard:
            for trace in held:
                _holders[id(trace)] -= 1
                if _holders[id(trace)] == 0:
                    del _holders[id(trace)]
                    retired = _retired.pop(id(trace), None)
                    if retired is not None:
                        retired.close()


def in_lease() -> bool:
    """True inside a `leases()` block on this thread (profiles opened now are held until it ends)."""
    return getattr(_scope, "held", None) is not None


def _hold(trace: Trace) -> Trace:
    held = getattr(_scope, "held", None)
    if held is not None:
        _holders[id(trace)] = _holders.get(id(trace), 0) + 1
        held.append(trace)
    return trace


def open_trace(path: str | Path, progress: Progress = _no_progress, attached: bool = True) -> Trace:
    """The trace model of `path`, loaded once and reused while the file is unchanged (`attached`: load_trace's)."""
    resolved = regular_file(path)
    try:
        key = _key(resolved)
    except OSError as exc:  # e.g. a parent folder without search permission
        raise ProfileError(f"Cannot read {shown_path(resolved)}: {exc.strerror or exc}. Check the path and its permissions.") from None
    with _guard:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            hit.follow(progress)
            return _hold(hit)
        lock = _loading.setdefault(key, threading.Lock())
    with lock:  # two concurrent first calls load the file once
        try:
            with _guard:
                hit = _cache.get(key)
                if hit is not None:
                    return _hold(hit)
                refused = _refused.get(key)
                if refused is not None and time.monotonic() - refused[0] < REFUSAL_TTL_S:
                    raise ProfileError(refused[1])
            try:
                trace = load_trace(resolved, progress, attached)
            except ProfileError as exc:
                with _guard:
                    _refused[key] = (time.monotonic(), str(exc))
                    while len(_refused) > MAX_REFUSED:
                        _refused.popitem(last=False)
                raise
            with _guard:
                for stale in [k for k in _cache if k[0] == key[0]]:
                    _drop(stale)
                _cache[key] = trace
                _hold(trace)
                while len(_cache) > MAX_TRACES:
                    _drop(next(iter(_cache)))
        finally:
            with _guard:  # a failed load leaves no lock behind (the same bad file is retried often)
                _loading.pop(key, None)
    return trace


def _drop(key: tuple) -> None:
    """Remove from the cache; close now if nobody holds it, else when the last holder is done. (Under _guard.)"""
    trace = _cache.pop(key)
    if _holders.get(id(trace)):
        _retired[id(trace)] = trace
    else:
        trace.close()


def open_count() -> int:
    with _guard:
        return len(_cache) + len(_retired)


def clear() -> None:
    with _guard:
        _refused.clear()
        while _cache:
            _drop(next(iter(_cache)))
