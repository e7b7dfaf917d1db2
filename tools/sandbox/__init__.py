"""Run user SQL in a separate, disposable process (tools/sandbox/worker.py).

Why a process: DuckDB can only be interrupted between vectors, and some expressions (a single
`repeat('x', 2e9)`) neither check for interruption nor count against memory_limit. In a child
with a capped address space such a query fails with an out-of-memory error, and one past its time
limit is killed together with the process; the server, its other clients and its open profiles
are untouched, and a crash in DuckDB's parser or executor is contained too.

Workers are reused between queries (a start costs ~0.2 s) and at most MAX_WORKERS run at once.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
import time

from ..model import lifecycle
from ..model.errors import ProfileError
from ..model.limits import sql_memory_limit_bytes

MAX_WORKERS = 4
START_SECONDS = 30.0


class WorkerDied(Exception):
    pass


class TimedOut(Exception):
    pass


# The worker asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), and Linux means the parent
# *thread*: spawned from a tool call's worker thread, it was killed when that thread retired (anyio ends idle
# threads), and the next query found it dead. One long-lived thread spawns every worker.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuscope-sql-spawner")


def _popen(ceiling: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuscope.tools.sandbox.worker", str(ceiling)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)


class _Worker:
    def __init__(self) -> None:
        self.ceiling = sql_memory_limit_bytes()
        self.proc = _spawner.submit(_popen, self.ceiling).result()
        self._buf = b""

    def ask(self, request: dict, timeout_s: float) -> dict:
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied from None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimedOut
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerDied
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass


_idle: list[_Worker] = []
_all: set[_Worker] = set()
_guard = threading.Lock()
_slots = threading.BoundedSemaphore(MAX_WORKERS)


def ask(request: dict, timeout_s: float) -> dict:
    """One request to a worker; ProfileError when it times out or dies (the worker is replaced)."""
    if not _slots.acquire(timeout=timeout_s):
        raise ProfileError(f"sql_query is busy: {MAX_WORKERS} queries are already running. Try again when one finishes.")
    try:
        with _guard:
            worker = _idle.pop() if _idle else None
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()
            with _guard:
                _all.add(worker)
        try:
            reply = worker.ask(request, timeout_s)
        except TimedOut:
            _discard(worker)
            raise ProfileError(f"query stopped after the {timeout_s:g} s time limit. Aggregate more (GROUP BY) or filter "
                               "(WHERE device_id = ..., start_ns BETWEEN ...) so it finishes sooner.") from None
        except WorkerDied:
            _discard(worker)
            raise ProfileError(
                "the query ended the SQL process (it most likely needed more than the "
                f"{worker.ceiling / 1e9:.1f} GB the query process may use). Aggregate or filter more, or raise "
                "GPUSCOPE_SQL_MEMORY_LIMIT.") from None
        with _guard:
            _idle.append(worker)
        return reply
    finally:
        _slots.release()


def _discard(worker: _Worker) -> None:
    worker.kill()
    with _guard:
        _all.discard(worker)


def shutdown() -> None:
    """Kill every worker. Runs at interpreter exit and on the server's signal path (lifecycle), where it must not
    block: the workers get SIGKILL and are not waited for (they also die with their parent, PR_SET_PDEATHSIG)."""
    workers = list(_all)
    _all.clear()
    _idle.clear()
    for w in workers:
        try:
            w.proc.kill()
        except OSError:
            pass


atexit.register(shutdown)
lifecycle.on_shutdown(shutdown)
