"""Place 0's side of malleability: the handler's lifecycle and the orders.

Orders run one at a time under ``_order_lock``; disabling the handler takes
the same lock, so it waits for an order in progress. Every phase is timed,
logged and reported to the scheduler (``growTimeAPGAS;<n>;<ns>`` and the like).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable


from ._place import Place
from ._runtime import Runtime
from .errors import ApgasError
from .malleable import MalleableCommunicator, MalleableHandler, OrderError, communicator_class

__all__ = ["Orders"]

log = logging.getLogger("apgas.malleability")

RIGID, MALLEABLE, DISABLED, CLOSED = "rigid", "malleable", "disabled", "closed"


class Orders:
    """Carries out grow and shrink orders through the registered handler."""

    def __init__(self, rt: Runtime, started_ns: int) -> None:
        self._rt = rt
        self._started_ns = started_ns
        self._order_lock = threading.Lock()
        self._state = RIGID
        self._handler: MalleableHandler | None = None
        self.communicator: MalleableCommunicator | None = None

    # -- lifecycle --------------------------------------------------------------
    def listen(self) -> MalleableCommunicator:
        """Start the configured communicator (orders are refused until a handler comes)."""
        if self.communicator is None:
            cls = communicator_class(self._rt.config.communicator)
            self.communicator = cls(self, self._rt.config)
            self.communicator.start()
        return self.communicator

    def define(self, handler: MalleableHandler) -> MalleableCommunicator:
        if not isinstance(handler, MalleableHandler):
            raise TypeError(f"expected a MalleableHandler, got {handler!r}")
        with self._order_lock:
            if self._state != RIGID:
                raise ApgasError(f"a malleable handler cannot be registered now: the program is "
                                 f"{self._state} (a handler is registered once and never again)")
            communicator = self.listen()
            self._handler = handler
            self._state = MALLEABLE
        ready_ns = time.monotonic_ns() - self._started_ns
        communicator.report("APGAS-Ready")
        self._report("readyTimeAPGAS", len(self._rt.places), ready_ns)
        return communicator

    def disable(self) -> None:
        with self._order_lock:  # waits for an order in progress
            if self._state != MALLEABLE:
                raise ApgasError(f"no malleable handler to disable: the program is {self._state}")
            self._state = DISABLED
        assert self.communicator is not None
        self.communicator.report("APGAS-NotMalleable")

    def close(self) -> None:
        """End of the program: wait for an order in progress, then stop listening."""
        with self._order_lock:
            was, self._state = self._state, CLOSED
        if self.communicator is not None:
            if was == MALLEABLE:
                self.communicator.report("APGAS-NotMalleable")
            self.communicator.stop()

    # -- orders (called by the communicator) ---------------------------------------
    def status(self) -> tuple[str, list[Place]]:
        return self._state, self._rt.sorted_places()

    def grow(self, n: int, hosts: list[str]) -> list[Place]:
        if len(hosts) != n:
            raise OrderError(f"grow {n} needs {n} host name(s), got {len(hosts)}: {hosts}")
        if len(set(hosts)) != len(hosts):
            raise OrderError(f"grow names a host twice: {hosts}")
        with self._order_lock:
            handler = self._ready_handler()
            start = time.monotonic_ns()
            continued = self._rt.sorted_places()
            self._call("pre_grow", handler.pre_grow, n)
            t1 = time.monotonic_ns()
            try:
                added = self._rt.start_places(hosts, self._rt.launcher, self._rt.config.join_timeout)
            except ApgasError as e:
                raise OrderError(f"no place was added: {e}") from e
            t2 = time.monotonic_ns()
            self._call("post_grow", handler.post_grow, n, continued, added)
            end = time.monotonic_ns()
        self._report_phases("Grow", "Start", n, start, t1, t2, end)
        return added

    def shrink(self, n: int, released: Callable[[list[str]], None]) -> list[str]:
        with self._order_lock:
            handler = self._ready_handler()
            live = self._rt.sorted_places()
            if n >= len(live):
                raise OrderError(f"cannot shrink by {n}: the program has {len(live)} place(s) "
                                 "and place 0 always stays")
            fixed = [p.id for p in live if p.id != 0 and not self._rt.removable(p.id)]
            if n > len(live) - 1 - len(fixed):
                raise OrderError(f"cannot shrink by {n}: places {fixed} are mpiexec ranks, which "
                                 "stay until the job ends; only places started by a grow can leave")
            start = time.monotonic_ns()
            chosen = self._call("pre_shrink", handler.pre_shrink, n)
            self._check_choice(n, chosen)
            t1 = time.monotonic_ns()
            hosts = self._rt.remove_places([p.id for p in chosen])
            t2 = time.monotonic_ns()
            released(hosts)
            self._call("post_shrink", handler.post_shrink, n, list(chosen))
            end = time.monotonic_ns()
        self._report_phases("Shrink", "Stop", n, start, t1, t2, end)
        return hosts

    # -- helpers ----------------------------------------------------------------------
    def _ready_handler(self) -> MalleableHandler:
        if self._state == RIGID:
            raise OrderError("the program is not malleable yet: no MalleableHandler is registered")
        if self._state != MALLEABLE or self._handler is None:
            raise OrderError(f"the program is no longer malleable ({self._state})")
        return self._handler

    def _check_choice(self, n: int, chosen: object) -> None:
        live = self._rt.places
        if (not isinstance(chosen, (list, tuple)) or len(chosen) != n
                or not all(isinstance(p, Place) for p in chosen)
                or len({p.id for p in chosen}) != n
                or any(not self._rt.removable(p.id) or p.id not in live for p in chosen)):
            raise OrderError(f"pre_shrink({n}) must return {n} distinct live places other than "
                             f"place 0 (and mpiexec ranks), returned {chosen!r}; nothing was removed")

    @staticmethod
    def _call(name: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            log.exception("the handler's %s failed", name)
            raise OrderError(f"the handler's {name} raised {type(e).__name__}: {e}") from e

    def _report_phases(self, verb: str, place_phase: str, n: int, start: int, t1: int, t2: int,
                       end: int) -> None:
        """The handler's pre phase, the places' start or stop, the post phase, the whole."""
        self._report(f"pre{verb}TimeAPGAS", n, t1 - start)
        self._report(f"place{place_phase}TimeAPGAS", n, t2 - t1)
        self._report(f"post{verb}TimeAPGAS", n, end - t2)
        self._report(f"{verb.lower()}TimeAPGAS", n, end - start)

    def _report(self, what: str, n: int, ns: int) -> None:
        log.info("%s: %d place(s) in %.3f s", what, n, ns / 1e9)
        if self.communicator is not None:
            self.communicator.report(f"{what};{n};{ns}")
