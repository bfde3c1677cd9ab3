"""The DMR study's applications on :mod:`apgas.dist`: Jacobi, CG, N-body and Flexible Sleep.

    python -m apgas.dist.apps {jacobi,cg,nbody,sleep} [options] [--places P]
                              [--malleable] [--check] [--json]

Each module has ``sequential(...)`` (plain numpy in one process, the reference),
``run(...)`` (the same problem over :class:`~apgas.dist.BlockArray`\\ s, called
at place 0 inside ``apgas.run``) and its per-place kernels as plain functions.
Every array follows the places (``follow=True``), so no application has
redistribution code of its own.

What the applications share lives here: :class:`Session` keeps the orders out
of an iteration. An order's re-spread is a collective on the arrays, so it
must not overlap an iteration that uses them; a session runs each iteration
under the lock with which :mod:`apgas.dist` re-spreads its followed arrays, so
an order that comes in the middle of an iteration waits for its end, and the
next iteration waits for the re-spread. That holds also for an order that
fails half way (a handler's ``pre_grow`` would never see its ``post_grow``),
which a pause held from ``pre_*`` to ``post_*`` would not survive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas import lowlevel
from apgas.dist import BlockArray, _blocks, _follower

__all__ = ["APPS", "CheckSizes", "Resize", "Outcome", "Session", "owners", "at_owners", "at_owners_sum", "mark",
           "row_sums", "total"]

APPS = ("jacobi", "cg", "nbody", "sleep")

log = logging.getLogger("apgas.dist.apps")

#: ``apgas.check_status``'s (min, max, preferred, factor)
CheckSizes = tuple[int, int, int | None, int]


def mark() -> float:
    """A monotonic time in seconds (time.perf_counter: the one clock of all timings here)."""
    return time.perf_counter()


@dataclasses.dataclass
class Resize:
    """One order as the application saw it: the whole order (handler's ``pre`` to
    ``post``) and, within it, the wait for the iteration in progress and the
    re-spread of the arrays (None if the session could not tell)."""

    kind: str  # "grow" or "shrink"
    n: int
    places_before: int
    places_after: int
    seconds: float
    move_seconds: float | None
    wait_seconds: float | None = None


@dataclasses.dataclass
class Outcome:
    """What ``run`` returns: the values (in the order they are printed) and how it went."""

    values: dict[str, float]
    seconds: float
    places: int
    final_places: int
    iterations: int
    resizes: list[Resize]


def owners(a: BlockArray) -> list[int]:
    """The places that hold rows of ``a``, in block order."""
    return [pid for pid, start, stop in a.layout if stop > start]


def at_owners(a: BlockArray, fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` at every place holding rows of ``a``, in parallel; waits for all."""
    with apgas.finish():
        for pid in owners(a):
            apgas.async_at(pid, fn, *args)


def row_sums(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64] | None = None
             ) -> npt.NDArray[np.float64]:
    """The sum of each row of ``a`` (of ``a * b`` if given): the kernel of :func:`total`."""
    m = a if b is None else a * b
    sums: npt.NDArray[np.float64] = m.reshape(len(m), -1).sum(axis=1)
    return sums


def _row_sums_at(a: BlockArray, b: BlockArray | None) -> npt.NDArray[np.float64]:
    return row_sums(a.local(), None if b is None else b.local())


def total(a: BlockArray, b: BlockArray | None = None) -> float:
    """The sum of all elements of ``a`` (of ``a * b``: a dot product), the same whatever
    the layout: each place sums its rows one by one, and place 0 adds the row sums in
    row order, as ``row_sums(whole a).sum()`` does. (``BlockArray.sum`` and
    ``apgas.dist.dot`` add one partial sum per block, so their last bits depend on the
    layout; a converged CG's residual would then differ from one run to another in its
    fourth digit.) Sends one float per row to place 0."""
    if b is not None and b.layout != a.layout:
        raise ValueError(f"total of arrays laid out differently: {a.layout} and {b.layout}")
    return at_owners_sum(a, _row_sums_at, a, b)


def at_owners_sum(a: BlockArray, fn: Callable[..., npt.NDArray[np.float64]], *args: Any) -> float:
    """``fn(*args)`` at every place holding rows of ``a``, in parallel, each returning the
    :func:`row_sums` of its rows of something; their sum, added in row order as
    :func:`total` does. A step and the reduction after it in one round of messages
    (CG's matrix-vector product and ``p . q``), instead of two."""
    parts = _blocks.each(owners(a), fn, *args)
    return float(np.concatenate(parts).sum()) if parts else 0.0


class _Handler(apgas.MalleableHandler):
    """Chooses the newest places to leave; times each order. The arrays follow by
    themselves and the session keeps the iterations out, so there is no work to move."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def pre_shrink(self, n: int, chosen: list[apgas.Place] | None = None) -> list[apgas.Place]:
        self.session._begin("shrink", n)
        if chosen is not None:
            return chosen
        return [p for p in apgas.places() if p.id != 0 and lowlevel.removable(p.id)][-n:]

    def post_shrink(self, n: int, removed: list[apgas.Place]) -> None:
        self.session._end()

    def pre_grow(self, n: int) -> None:
        self.session._begin("grow", n)

    def post_grow(self, n: int, continued: list[apgas.Place], added: list[apgas.Place]) -> None:
        self.session._end()


class _Mark:
    """A resize listener that notes when it was called (``first``: just before the
    arrays are re-spread, then it also asks the iterations to make way)."""

    def __init__(self, session: Session, first: bool) -> None:
        self.session, self.first = session, first

    def before_shrink(self, leaving: list[apgas.Place]) -> None:
        self.session._moving(self.first)

    def after_grow(self, added: list[apgas.Place]) -> None:
        self.session._moving(self.first)


class Session:
    """One run's side of the orders, at place 0: the iterations under the re-spread
    lock, the handler (``malleable``), ``check_status`` every ``check_every``
    iterations (``check``: the sizes), and the times of the resizes.

    ``on_iteration(i)``, if given, is called at every reconfiguring point, after
    ``i`` iterations (tests use it to interleave orders with the iterations)."""

    def __init__(self, malleable: bool = False, check: CheckSizes | None = None,
                 check_every: int = 1, on_iteration: Callable[[int], None] | None = None) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.malleable = malleable or check is not None
        self.check = check
        self.check_every = check_every
        self.on_iteration = on_iteration
        self.resizes: list[Resize] = []
        self._lock = threading.RLock()  # replaced by the follower's lock in start()
        self._wanted = False  # an order is about to take the lock
        self._order: tuple[str, int, int, float] | None = None  # kind, n, places, start
        self._moves: list[float] = []
        self._released = 0.0  # when the last iteration ended
        self._undo: list[Callable[[], None]] = []
        self.started = mark()
        self.places = len(apgas.places())

    # -- lifecycle (run() calls these) ------------------------------------------------------
    def follows(self, places: Sequence[apgas.Place | int] | None) -> bool:
        """Whether the arrays follow the places: when they are spread over all of them."""
        if places is None:
            return True
        if self.malleable:
            raise ValueError("a malleable run spreads its arrays over all the places, which follow "
                             f"the orders; do not pass places (got {places!r})")
        return False

    def start(self) -> None:
        """Hook into the orders. Call it before making the arrays: the first mark must
        come before the arrays' follower among the resize listeners."""
        if apgas.here().id != 0:
            raise apgas.ApgasError("the applications run at place 0 (their arrays follow the places)")
        self._undo.append(lowlevel.on_resize(_Mark(self, True)))
        self._lock = _follower().lock  # registers the follower (once per run)
        self._undo.append(lowlevel.on_resize(_Mark(self, False)))

    def ready(self) -> None:
        """The arrays are made: take orders now (``malleable``)."""
        if self.malleable:
            communicator = apgas.define_malleable_handler(_Handler(self))
            log.info("malleable: orders to %s", getattr(communicator, "address", "the scheduler"))

    def close(self) -> None:
        """Take no more orders (waits for one in progress) and unhook."""
        if self.malleable:
            apgas.disable_malleable_handler()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    # -- the iterations -----------------------------------------------------------------
    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One iteration: no order re-spreads the arrays meanwhile. If an order is
        waiting for its turn, it goes first (a lock handed back at once is often
        taken again by the same thread, and the order would wait for ever)."""
        if self._wanted:
            self._wanted = False
            for _ in range(40):  # let the waiting order take the lock (it does within ~1 ms)
                if not self._lock.acquire(blocking=False):
                    break  # it did
                self._lock.release()
                time.sleep(0.0005)
        with self._lock:
            try:
                yield
            finally:
                self._released = mark()

    def between(self, done: int, total: int) -> None:
        """The reconfiguring point after ``done`` of ``total`` iterations: ask the
        scheduler (``check``) every ``check_every`` iterations, not after the last."""
        if self.on_iteration is not None:
            self.on_iteration(done)
        if self.check is not None and done < total and done % self.check_every == 0:
            low, high, preferred, factor = self.check
            try:
                count = apgas.check_status(low, high, preferred, factor)
            except apgas.ApgasError as e:  # the scheduler is gone or said no: go on as we are
                log.warning("check_status after iteration %d: %s", done, e)
            else:
                log.debug("check_status after iteration %d: %d place(s)", done, count)

    def outcome(self, values: dict[str, float], iterations: int) -> Outcome:
        return Outcome(values=values, seconds=mark() - self.started, places=self.places,
                       final_places=len(apgas.places()), iterations=iterations,
                       resizes=list(self.resizes))

    # -- called by the handler and the listeners, in the order's thread -----------------------
    def _begin(self, kind: str, n: int) -> None:
        self._order = (kind, n, len(apgas.places()), mark())
        self._moves = []

    def _moving(self, first: bool) -> None:
        if first:
            self._wanted = True
        self._moves.append(mark())

    def _end(self) -> None:
        if self._order is None:
            return
        kind, n, before, since = self._order
        moves = self._moves
        move = wait = None
        if len(moves) == 2:  # the re-spread began when both the order and the iteration were there
            began = max(moves[0], self._released)
            move, wait = moves[1] - began, began - moves[0]
        resize = Resize(kind, n, before, len(apgas.places()), mark() - since, move, wait)
        self.resizes.append(resize)
        self._order = None
        log.info("%s %d: %d -> %d place(s) in %.3f s (arrays moved in %s after %s for the "
                 "iteration)", kind, n, before, resize.places_after, resize.seconds,
                 "?" if move is None else f"{move:.3f} s", "?" if wait is None else f"{wait:.3f} s")

