"""Waits on the main thread that a signal can end.

CPython runs a signal's Python handler (Ctrl-C's ``KeyboardInterrupt``, the
``SystemExit`` that :func:`apgas.run` makes of SIGTERM) between bytecodes of the
main thread only. A lock wait is cut short by a signal that comes while the thread
sleeps in the kernel; one that comes just before (after the last check, before
the sleep) is seen only once the wait ends, which for a finish of hour-long tasks
is an hour later. So the main thread waits in slices and runs the handlers between
them; other threads, which never run them, wait in one go.
"""

from __future__ import annotations

import threading

__all__ = ["SLICE_S", "wait_slice"]

#: s: the longest a wait of the main thread lasts before signal handlers run
SLICE_S = 0.25

_MAIN = threading.main_thread()


def wait_slice() -> float | None:
    """The timeout of one wait of this thread: :data:`SLICE_S` on the main thread (the
    caller waits again until its condition holds), else None (no limit)."""
    return SLICE_S if threading.current_thread() is _MAIN else None
