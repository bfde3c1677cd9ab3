"""Evolving programs: the program itself asks the scheduler for places.

A malleable program obeys the scheduler's orders; an evolving one also asks:
``apgas.request_grow(n)`` for more places, ``apgas.release_places(places)``
to give some back, ``apgas.check_status(min, max)`` (DMR's
``dmr_check_status``) to ask what to do now. The lines they send are in
``docs/protocol.md``.

One handler serves both kinds of program. Whether the scheduler or the
program picks the moment, the work of a change is the same: move the work
off the leaving places, wire new places in. The only difference is who
picks the leaving places, so :meth:`MalleableHandler.pre_shrink` takes them
as an optional second argument (``chosen``) when the program released them
itself. A separate ``EvolvingHandler`` would have duplicated every method
for that one argument.
"""

from __future__ import annotations

import threading

from ._core.place import Place
from .errors import ApgasError

__all__ = ["GrowRequest", "GrowRefused"]

PENDING, GRANTED, REFUSED = "pending", "granted", "refused"


class GrowRefused(ApgasError):
    """The scheduler will not give (all of) the places a request asked for.

    ``added`` holds the places the request did get before the refusal."""

    def __init__(self, request: GrowRequest) -> None:
        super().__init__(f"request for {request.n} place(s) refused by the scheduler after "
                         f"{len(request.added)} came: {request.reason}")
        self.added = list(request.added)


class GrowRequest:
    """An outstanding ``request_grow(n)``: the places come with grow orders, later.

    ``state`` is ``pending``, ``granted`` (all ``n`` places came) or
    ``refused`` (``reason`` says why; ``added`` holds those that came before).

    A request the scheduler never answered (it closed the connection, or said
    nothing for 10 s) is refused with a reason that names the scheduler. One it
    answered ``ok`` stays pending until its grow orders, a ``refuse`` order, or
    the end of the program's malleability: if the scheduler dies after queuing
    it, nothing else ends it, so wait with a timeout (``wait(timeout)``,
    ``result(timeout)``) and decide what to do; the request stays outstanding,
    and places that come later still count towards it.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.added: list[Place] = []
        self.state = PENDING
        self.reason = ""
        self._done = threading.Event()

    @property
    def outstanding(self) -> int:
        return self.n - len(self.added) if self.state == PENDING else 0

    def done(self) -> bool:
        """True once the request is granted or refused."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request is granted or refused; False on timeout (the
        request stays pending)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> list[Place]:
        """The ``n`` places, once they are all there.

        Raises :class:`GrowRefused` if the scheduler refused, ``TimeoutError``
        if ``timeout`` seconds pass first (the request stays outstanding)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request for {self.n} place(s) still pending after {timeout} s "
                               f"({len(self.added)} came so far; the scheduler queued it and has "
                               "sent neither the rest of the places nor a refusal; it stays "
                               "outstanding)")
        if self.state == REFUSED:
            raise GrowRefused(self)
        return list(self.added)

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"GrowRequest(n={self.n}, state={self.state}, added={[p.id for p in self.added]}{why})"

    # -- the runtime's side ----------------------------------------------------------
    def _add(self, places: list[Place]) -> list[Place]:
        """Take as many of ``places`` as still outstanding; return the rest."""
        take = self.outstanding
        self.added += places[:take]
        if self.state == PENDING and len(self.added) == self.n:
            self._settle(GRANTED, "")
        return places[take:]

    def _settle(self, state: str, reason: str) -> None:
        if self.state == PENDING:
            self.state, self.reason = state, reason
            self._done.set()
