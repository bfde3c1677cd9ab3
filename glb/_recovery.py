"""Place 0's side of a resilient GLB computation: hear of lost places, restore their
work at the live ones, and run the computation's finish again when a loss came
too late for the running one (see :mod:`glb._resilience` for the store)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import apgas
from apgas.lowlevel import current_finish, immediate_at, watch_deaths

from . import _worker as w
from ._resilience import ResilienceStats, Store, close_store, open_store
from ._stats import PlaceStats

__all__ = ["Recovery"]

log = logging.getLogger("glb.resilience")


class Recovery:
    """Lost places of one computation: their work goes back to the live places."""

    def __init__(self, gid: int, prototype: Any) -> None:
        self.gid = gid
        self.store: Store = open_store(gid, prototype, w.arrive)
        self.store.targets = self._targets
        self.dead: set[int] = set()
        self.joining: set[int] = set()  # members of a grow not set up yet: no work for them
        self._stop: Callable[[], None] | None = None

    @property
    def stats(self) -> ResilienceStats:
        return self.store.stats

    def start(self) -> None:
        self._stop = watch_deaths(self._died)

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
        close_store(self.gid)

    def _live(self) -> list[int]:
        """The live places of the computation, as place 0's GLB state knows them."""
        members = w.members(self.gid) or [0]
        live = {p.id for p in apgas.places()}
        return [m for m in members if m in live]

    def _targets(self) -> list[int]:
        """The live places that may take restored work (set up, not joining)."""
        return [m for m in self._live() if m not in self.joining]

    def _died(self, place: int, host: str, reason: str) -> None:
        self.dead.add(place)
        threading.Thread(target=self.restore, args=(place,), name=f"glb-restore-{place}",
                         daemon=True).start()

    def restore(self, place: int) -> None:
        """Take ``place``'s work back (once) and send it to the live places."""
        start = time.monotonic()
        if not self.store.recover(place):
            return
        live = self._live()
        log.warning("GLB %d: place %d was lost; restoring its work at places %s",
                    self.gid, place, live)
        for p in live:  # its lifeline thieves and buddies are wired again
            try:
                immediate_at(p, w.set_members, self.gid, live)
            except apgas.DeadPlaceError:
                pass  # lost too: its own restore follows
        self.store.dispatch()
        self.store.stats.recovery_s += time.monotonic() - start

    def run(self, body: Callable[[], None]) -> None:
        """Run ``body`` in a finish, then as many more finishes as it takes to do the
        work that losses left behind. Only losses of places are forgiven."""
        while True:
            try:
                with apgas.finish():
                    self.store.fref = current_finish()
                    body()
            except apgas.MultipleException as e:
                others = [x for x in _flat(e) if not isinstance(x, apgas.DeadPlaceError)]
                if others:
                    raise
                self.dead.update(x.place_id for x in _flat(e)
                                 if isinstance(x, apgas.DeadPlaceError))
            finally:
                self.store.fref = None
            for place in sorted(self.dead):
                self.restore(place)
            if not self.store.orphans():
                return
            if not self._targets():
                raise apgas.ApgasError(f"GLB {self.gid}: no live place is left for the work of "
                                       f"the lost places {sorted(self.dead)}")
            self.store.stats.rounds += 1
            log.info("GLB %d: one more round for the work restored after the loss of %s",
                     self.gid, sorted(self.dead))
            body = self._dispatch

    def _dispatch(self) -> None:
        self.store.dispatch()

    def collect(self, place: int) -> tuple[Any, Any, Any] | None:
        """``w.collect`` at ``place``, or None if it was lost (its result is in the store)."""
        try:
            return apgas.at(place, w.collect, self.gid)
        except apgas.DeadPlaceError:
            self.dead.add(place)
            self.restore(place)
            if self.store.orphans():
                raise apgas.ApgasError(f"GLB {self.gid}: place {place} was lost holding work "
                                       "after the computation ended (a bug: please report it)"
                                       ) from None
            return None

    def lost_stats(self) -> list[PlaceStats]:
        """A row for each lost place: the units of its work that the result holds (what
        its last backups and ends told place 0; later units were redone elsewhere)."""
        with self.store.lock:
            lost = sorted(self.store.lost_units.items())
        return [PlaceStats(place=place, units=units, lost=True) for place, units in lost]

    def result(self) -> Any:
        """The results of lost places (what they had done by their last backup)."""
        return self.store.restored_result


def _flat(e: BaseException) -> list[BaseException]:
    if isinstance(e, apgas.MultipleException):
        return [x for inner in e.exceptions for x in _flat(inner)]
    return [e]
