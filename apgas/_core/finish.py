"""Bookkeeping of distributed termination detection (docs/design.md, section 4).

The counting protocol of X10 and APGAS for Java, refined to edges: the home of
a finish keeps, per (source place, destination place), tasks spawned minus
tasks completed. The home's own spawns and completions are counted exactly
as they happen. Any other place keeps a :class:`RemoteFinish` while it runs
tasks of the finish, and reports its deltas home when its count of live tasks
falls to zero. A task's spawns are therefore reported no later than its
completion, and since reports of one place travel in order, the home sees all
edges balanced only when every task has ended. Edges touching a dead place
are dropped; a dead place that still had tasks is reported as
``DeadPlaceError``.
"""

from __future__ import annotations

import threading

from ..errors import DeadPlaceError

__all__ = ["HomeFinish", "RemoteFinish"]


class HomeFinish:
    """State of a finish at its home place. Callers hold the runtime's finish lock."""

    __slots__ = ("fid", "edges", "exceptions", "body_done", "done", "dead")

    def __init__(self, fid: int) -> None:
        self.fid = fid
        self.edges: dict[tuple[int, int], int] = {}
        self.exceptions: list[Exception] = []
        self.body_done = False
        self.done = threading.Event()
        self.dead: set[int] = set()

    def bump(self, src: int, dst: int, delta: int) -> None:
        if not delta:
            return
        if src in self.dead or dst in self.dead:
            if dst in self.dead and delta > 0:
                self._lost(dst)
            return
        key = (src, dst)
        value = self.edges.get(key, 0) + delta
        if value:
            self.edges[key] = value
        else:
            del self.edges[key]

    def apply_report(self, src: int, spawned: dict[int, int], completed: dict[int, int],
                     exceptions: list[Exception]) -> None:
        for dst, n in spawned.items():
            self.bump(src, dst, n)
        for origin, n in completed.items():
            self.bump(origin, src, -n)
        self.exceptions.extend(exceptions)

    def place_died(self, place_id: int, reason: str = "") -> None:
        if place_id in self.dead:
            return
        lost = any(dst == place_id and n > 0 for (_, dst), n in self.edges.items())
        self.dead.add(place_id)
        for key in [k for k in self.edges if place_id in k]:
            del self.edges[key]
        if lost:
            self._lost(place_id, reason)

    def _lost(self, place_id: int, reason: str = "") -> None:
        if not any(isinstance(e, DeadPlaceError) and e.place_id == place_id for e in self.exceptions):
            why = f" ({reason})" if reason else ""
            self.exceptions.append(DeadPlaceError(place_id, f"it still had tasks of this finish{why}"))

    def check(self) -> bool:
        """Mark the finish done if the body has ended and every edge is balanced."""
        if self.body_done and not self.edges:
            self.done.set()
            return True
        return False


class RemoteFinish:
    """What one non-home place knows of a finish since its last report."""

    __slots__ = ("live", "spawned", "completed", "exceptions")

    def __init__(self) -> None:
        self.live = 0
        self.spawned: dict[int, int] = {}
        self.completed: dict[int, int] = {}
        self.exceptions: list[Exception] = []

    def complete(self, src: int) -> None:
        self.completed[src] = self.completed.get(src, 0) + 1
