"""GLB's evolving mode: place 0 watches the load and asks for places or gives them back.

The load of a place is the share of its workers that hold work (a worker out
stealing holds none). A thread at place 0 samples every place; a mean load
that stays high asks the scheduler for one more place (``apgas.request_grow``),
one that stays low releases the least loaded place that can leave (not place 0,
not an mpiexec rank) with ``apgas.release_places``, whose work GLB's handler
moves away first, as for a shrink order. A step that fails (the scheduler went
away, a place left meanwhile) is logged as a warning and the watching goes on
after ``evolving_backoff`` seconds. The result
stays exact because work only ever moves inside counted tasks.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import apgas
from apgas.lowlevel import immediate_at, removable

from . import _worker as w
from ._config import GLBConfig

__all__ = ["Evolver"]

log = logging.getLogger("glb.evolving")


class Evolver:
    """The watching thread; ``stop()`` before the handler is disabled."""

    def __init__(self, gid: int, config: GLBConfig) -> None:
        self.gid = gid
        self.config = config
        self.means: collections.deque[float] = collections.deque(maxlen=config.evolving_window)
        self.request: apgas.GrowRequest | None = None
        self.quiet_until = 0.0
        self.requests = 0
        self.releases = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="glb-evolving", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.config.evolving_interval):
            try:
                self.step()
            except Exception as e:
                if isinstance(e, (apgas.ApgasError, ValueError)):  # the scheduler went away,
                    log.warning("evolving GLB: %s; watching goes on", e)  # a place left, ...
                else:  # a bug: say so with its traceback, but keep watching
                    log.exception("evolving GLB: a step failed (%s); watching goes on", e)
                self.means.clear()
                self.quiet_until = time.monotonic() + self.config.evolving_backoff

    def step(self) -> None:
        loads = self._loads()
        if not loads:
            return
        self.means.append(sum(loads.values()) / len(loads))
        if len(self.means) < self.config.evolving_window:  # the deque's maxlen
            return
        if self.request is not None and self.request.done():
            if self.request.state == "refused":
                log.info("evolving GLB: request refused (%s); asking again in %g s",
                         self.request.reason, self.config.evolving_backoff)
                self.quiet_until = time.monotonic() + self.config.evolving_backoff
            self.request = None
        if min(self.means) >= self.config.evolving_high:
            if self.request is None and time.monotonic() >= self.quiet_until:
                log.info("evolving GLB: load %.2f on %d place(s): asking for one more",
                         self.means[-1], len(loads))
                self.request = apgas.request_grow(1)
                self.requests += 1
                self.means.clear()
        elif max(self.means) <= self.config.evolving_low and len(loads) > 1:
            leavable = [p for p in loads if p != 0 and removable(p)]  # not mpiexec ranks
            if not leavable:
                log.debug("evolving GLB: low load, but no place can leave (mpiexec ranks stay)")
                return
            victim = min(leavable, key=lambda p: (loads[p], -p))
            log.info("evolving GLB: load %.2f on %d place(s): releasing place %d",
                     self.means[-1], len(loads), victim)
            apgas.release_places([victim])
            self.releases += 1
            self.means.clear()

    def _loads(self) -> dict[int, float]:
        loads: dict[int, float] = {}
        for p in apgas.places():
            try:
                loads[p.id] = immediate_at(p.id, w.load, self.gid)
            except apgas.DeadPlaceError:
                continue  # left meanwhile
        return loads
