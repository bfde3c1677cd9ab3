"""The gate between a program's steps and the orders that change its places.

Place 0 keeps one :class:`Gate`. Code that must not see the places change,
a step of ``apgas.steps`` and (while arrays follow the places) every finish
and ``at`` opened at the top level of place 0, *holds* the gate; an order
(grow, shrink, ``release_places``) carries out its changes *through* it. An
order waits until nobody holds the gate, and while an order waits or runs,
new holds wait for it: orders are never starved by a loop whose steps follow
each other closely, and a step never sees half an order.

Holds are re-entrant per thread (a finish inside a step, ``at`` inside a
finish), and the thread carrying out an order passes its own gate (a
re-spread opens finishes of its own).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .signals import wait_slice

__all__ = ["Gate"]


class Gate:
    """A reader-writer lock that prefers its (rare) writers: holds are steps, orders write."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holds: dict[int, int] = {}  # thread id -> depth of its holds
        self._waiting = 0  # orders waiting for the holds to end
        self._order: int | None = None  # the thread carrying out an order
        #: arrays following the places: while some exist, top-level finishes hold the gate
        self.guards = 0

    def enter(self) -> bool:
        """Hold the gate (waiting for an order that runs or waits); False if this thread
        needs no hold (it holds one already, or carries out the order)."""
        me = threading.get_ident()
        with self._cond:
            if me == self._order:
                return False
            depth = self._holds.get(me)
            if depth:
                self._holds[me] = depth + 1
                return True
            while self._order is not None or self._waiting:
                self._cond.wait(wait_slice())  # the main thread: Ctrl-C comes through
            self._holds[me] = 1
            return True

    def exit(self) -> None:
        me = threading.get_ident()
        with self._cond:
            depth = self._holds[me] - 1
            if depth:
                self._holds[me] = depth
            else:
                del self._holds[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        held = self.enter()
        try:
            yield
        finally:
            if held:
                self.exit()

    def wanted(self) -> bool:
        """Whether an order waits or runs: a long hold should let it pass now
        (``exit`` then ``enter`` again)."""
        return self._waiting > 0 or self._order is not None

    def held_here(self) -> bool:
        """Whether this thread holds the gate (it is inside a step or a guarded finish)."""
        with self._cond:
            return threading.get_ident() in self._holds

    @contextlib.contextmanager
    def order(self) -> Iterator[None]:
        """Carry out an order: wait until nobody holds the gate, keep new holds out."""
        me = threading.get_ident()
        with self._cond:
            if me in self._holds:
                raise RuntimeError("an order cannot be carried out by a thread inside a step")
            self._waiting += 1
            try:
                while self._holds:
                    self._cond.wait(wait_slice())
            finally:
                self._waiting -= 1
            self._order = me
        try:
            yield
        finally:
            with self._cond:
                self._order = None
                self._cond.notify_all()
