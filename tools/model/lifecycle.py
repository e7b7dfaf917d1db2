"""What must happen when the server stops: a registry of shutdown callbacks.

The server exits on SIGTERM/SIGINT without waiting for worker threads stuck in a long query, so
anything that outlives the process on its own (a child process running user SQL, an `nsys export`)
registers a callback here; the server's signal path calls `shutdown()` just before it exits.

Callbacks run on the event-loop thread inside the signal path: they must be quick and must not
block (send the child a signal; do not wait for it). No locks here on purpose: a lock held by the
interrupted main thread would deadlock the signal path; dict operations are atomic under the GIL.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable

log = logging.getLogger("gpuscope")

_callbacks: dict[int, Callable[[], object]] = {}
_ids = itertools.count()


def on_shutdown(callback: Callable[[], object]) -> Callable[[], None]:
    """Run `callback` at shutdown; returns a function that unregisters it (call it once the child is gone)."""
    key = next(_ids)
    _callbacks[key] = callback
    return lambda: _callbacks.pop(key, None)


def shutdown() -> None:
    """Run every registered callback once, newest first; a failing callback does not stop the others."""
    while _callbacks:
        try:
            _, callback = _callbacks.popitem()  # the newest; atomic, so a concurrent registration is not lost
        except KeyError:  # emptied by a concurrent unregister
            return
        try:
            callback()
        except Exception:  # the process is exiting: log and go on to the next child
            log.exception("shutdown callback %r failed", callback)
