"""Interrupting what a place runs for the program, and nothing of its own.

A Ctrl-C in a notebook cell must stop what the cell started at every place and
leave the places usable (:meth:`apgas._core.runtime.Runtime.interrupt`). At each
place that means: the program's code that runs now (tasks, ``at`` calls) gets a
``KeyboardInterrupt``, raised in its thread; what waits in a queue does not start;
and what arrives while the interrupt goes round is dropped too (a task sent by a
task an instant before that task was interrupted).

Only threads inside :meth:`Interrupts.run` are interrupted, never the runtime's
own code: a thread leaves it under the lock that :meth:`Interrupts.begin` takes,
and drops an interrupt sent too late to be raised inside. Python raises the
interrupt at the thread's next bytecode; a thread inside a long C call (a numba
kernel, ``time.sleep``) sees it when the call returns.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Interrupts", "Interrupted"]

T = TypeVar("T")

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)  # an exception type, or NULL


class Interrupted(KeyboardInterrupt):
    """The program's code at a place was interrupted (a Ctrl-C at place 0)."""


class Interrupts:
    """The epoch of interrupts at one place and the threads that run the program's code."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._running: set[int] = set()  # idents of threads inside run()
        self.epoch = 0  # interrupts so far; work delivered before the last one is dropped
        self.holding = False  # an interrupt goes round: work that arrives is dropped

    def stamp(self) -> int:
        """The epoch to give work delivered now (-1 while an interrupt goes round)."""
        return -1 if self.holding else self.epoch

    def run(self, stamp: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as the program's code, which an interrupt ends;
        :class:`Interrupted` at once if it was stamped before the last interrupt."""
        ident = threading.get_ident()
        with self._lock:
            if stamp < self.epoch:
                raise Interrupted("interrupted before it started")
            self._running.add(ident)
            entered = self.epoch
        try:
            return fn(*args, **kwargs)
        finally:
            self._leave(ident, entered)

    def _leave(self, ident: int, entered: int) -> None:
        while True:  # an interrupt raised here, after fn, is for fn: dropped
            try:
                with self._lock:
                    self._running.discard(ident)
                    if self.epoch != entered:  # one may have been sent and not yet raised
                        _set_async_exc(ident, None)
                        self._ended.notify_all()
                return
            except KeyboardInterrupt:
                continue

    def begin(self, spare: int | None = None) -> int:
        """Interrupt every thread in :meth:`run` (but ``spare``), drop what was delivered
        before, and hold what comes until :meth:`end`; the threads interrupted."""
        with self._lock:
            self.epoch += 1
            self.holding = True
            hit = 0
            for ident in self._running:
                if ident != spare:
                    hit += _set_async_exc(ident, id(Interrupted))
            return hit

    def wait_quiet(self, timeout: float, spare: int | None = None) -> bool:
        """Wait until no thread (but ``spare``) runs the program's code; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._running - {spare}:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ended.wait(left)
            return True

    def end(self) -> None:
        """Take work again."""
        with self._lock:
            self.holding = False
