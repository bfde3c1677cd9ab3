"""The DMR study's applications on :mod:`apgas.arrays`: Jacobi, CG, N-body and Flexible Sleep.

    python -m apgas.arrays.apps {jacobi,cg,nbody,sleep} [options] [--places P]
                              [--malleable] [--check] [--resilient] [--commit-every K] [--json]

Each module has ``sequential(...)`` (plain numpy in one process, the reference),
``run(...)`` (the same problem over :class:`~apgas.arrays.BlockArray`\\ s, called
at place 0 inside ``apgas.run``) and its per-place kernels as plain functions.
They use the public API only, as a user's program would: every array follows
the places (``follow=True``), so no application has redistribution code of its
own; the iterations are the steps of :func:`apgas.steps`, which lists the arrays
and any scalar state. So an order that comes in the middle of an iteration is
carried out at its end. With ``resilient=True`` (``--resilient``; off by default,
since the copies cost memory and time: docs/results.md) the arrays are copied at
a commit every ``commit_every`` iterations, and a lost place (not place 0) rolls
them back to the last commit: everything an iteration does
follows from ``step.index``, the arrays and the state, so the values stay
those of ``sequential`` bit for bit.

What the applications share lives here: :class:`Session` is one run's side of
the orders (the handler that gives back the newest places, ``check_status``
every ``check_every`` iterations, the times of the resizes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas import lowlevel
from apgas.arrays import BlockArray, at_each

__all__ = ["APPS", "CheckSizes", "Resize", "Outcome", "Session", "Timed", "owners", "at_owners",
           "at_owners_sum", "mark", "row_sums", "total"]

APPS = ("jacobi", "cg", "nbody", "sleep")

log = logging.getLogger("apgas.arrays.apps")

#: ``apgas.check_status``'s (min, max, preferred, factor)
CheckSizes = tuple[int, int, int | None, int]


def mark() -> float:
    """A monotonic time in seconds (time.perf_counter: the one clock of all timings here)."""
    return time.perf_counter()


@dataclasses.dataclass
class Resize:
    """One order as the application saw it, at place 0.

    The order holds the steps from the moment it passes place 0's gate (the
    handler's ``pre_*``: a step in progress has ended) to the end of its
    ``post_*``; a grow starts its places before that, while the steps run.

    - ``seconds``: ``wait_seconds`` plus the time the order held the steps;
    - ``move_seconds``: within it, the re-spread of the arrays (None if the
      session could not tell: the arrays had moved before its first mark);
    - ``commit_seconds``: within it too, the commit of ``apgas.steps`` that
      follows the re-spread inside the order (the resilient arrays copied over
      the new places; None if none was timed);
    - ``wait_seconds``: how long the order waited for the step in progress. The
      application sees when an order passes the gate, not when it reached it: an
      order that passes at a reconfiguring point (the session lets an order that
      waited for the step go first, then calls ``on_iteration`` and
      ``check_status``) waited for nothing, 0; for one that passes at the end of a
      step this is *at most*: the length of that step (an order that had come
      before the step began would have gone first).
    """

    kind: str  # "grow" or "shrink"
    n: int
    places_before: int
    places_after: int
    seconds: float
    move_seconds: float | None
    wait_seconds: float | None = None
    commit_seconds: float | None = None


@dataclasses.dataclass
class Outcome:
    """What ``run`` returns: the values (in the order they are printed) and how it went.
    ``repeated``: steps run again after a lost place rolled the arrays back."""

    values: dict[str, float]
    seconds: float
    places: int
    final_places: int
    iterations: int
    resizes: list[Resize]
    repeated: int = 0


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
    ``apgas.arrays.dot`` add one partial sum per block, so their last bits depend on the
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
    parts = at_each(owners(a), fn, *args)
    return float(np.concatenate(parts).sum()) if parts else 0.0


class _Handler(apgas.MalleableHandler):
    """Gives back the newest places (never place 0, never an mpiexec rank); times each
    order. The arrays follow by themselves and the orders wait for the steps, so
    there is no work to move."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def pre_shrink(self, n: int, chosen: list[apgas.Place] | None = None) -> list[apgas.Place]:
        self.session._passed("shrink", n)
        if chosen is not None:
            return chosen
        return [p for p in apgas.places() if p.id != 0 and lowlevel.removable(p.id)][-n:]

    def post_shrink(self, n: int, removed: list[apgas.Place]) -> None:
        self.session._done()

    def pre_grow(self, n: int) -> None:
        self.session._passed("grow", n)

    def post_grow(self, n: int, continued: list[apgas.Place], added: list[apgas.Place]) -> None:
        self.session._done()


class _Mark:
    """A resize listener that notes when it is called. The listeners are called in the
    order they were added: mark 0 is added before the arrays are made (so before the
    arrays' own listener, which re-spreads them), mark 1 after them, mark 2 once the
    loop of ``apgas.steps`` listens (its commit comes between 1 and 2)."""

    def __init__(self, session: Session, which: int) -> None:
        self.session, self.which = session, which

    def before_shrink(self, leaving: list[apgas.Place]) -> None:
        self.session._mark(self.which, {p.id for p in leaving}, False)

    def after_grow(self, added: list[apgas.Place]) -> None:
        self.session._mark(self.which, {p.id for p in added}, True)


class Timed:
    """A step of :func:`apgas.steps` as :meth:`Session.steps` hands it out: ``with step:``
    runs it (the step's own ``__enter__`` and ``__exit__``) and notes when it ran."""

    __slots__ = ("step", "_session")

    def __init__(self, step: apgas.Step, session: Session) -> None:
        self.step, self._session = step, session

    @property
    def index(self) -> int:
        return self.step.index

    @property
    def rolled_back(self) -> bool:
        return self.step.rolled_back

    def __enter__(self) -> Timed:
        self._session._entering()
        self.step.__enter__()
        return self

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        try:
            return self.step.__exit__(etype, exc, tb)
        finally:
            self._session._ended()

    def __repr__(self) -> str:
        return f"Timed({self.step!r})"


class Session:
    """One run's side of the orders, at place 0: the handler (``malleable``: take
    orders; it gives back the newest places), ``check_status`` every ``check_every``
    iterations (``check``: the sizes), and the times of the resizes. It holds no
    lock: :func:`apgas.steps` keeps the orders out of the iterations.

    ``on_iteration(i)``, if given, is called at every reconfiguring point, after
    ``i`` iterations (tests use it to interleave orders with the iterations; after
    a roll-back ``i`` comes again)."""

    def __init__(self, malleable: bool = False, check: CheckSizes | None = None,
                 check_every: int = 1, on_iteration: Callable[[int], None] | None = None) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.malleable = malleable or check is not None
        self.check = check
        self.check_every = check_every
        self.on_iteration = on_iteration
        self.resizes: list[Resize] = []
        self.repeated = 0
        self.started = mark()
        self._arrays: list[BlockArray] = []
        # the order in progress: kind, n, places before, when it passed the gate, its wait
        self._order: tuple[str, int, int, float, float] | None = None
        self._marks: dict[int, float | None] = {}
        # the last step that began: when it was entered and when it ended (None: it runs)
        self._step: tuple[float, float | None] = (self.started, self.started)
        self._between = False  # at a reconfiguring point, after the orders that waited
        self._undo: list[Callable[[], None]] = []
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
        """Hook into the orders. Call it before making the arrays, so that the first
        mark comes before their re-spread among the resize listeners."""
        if apgas.here().id != 0:
            raise apgas.ApgasError("the applications run at place 0 (their arrays follow the places)")
        if self.malleable:
            self._undo.append(lowlevel.on_resize(_Mark(self, 0)))

    def ready(self, arrays: Sequence[BlockArray] = ()) -> None:
        """The arrays are made: take orders now (``malleable``)."""
        self._arrays = list(arrays)
        if self.malleable:
            self._undo.append(lowlevel.on_resize(_Mark(self, 1)))
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
    def steps(self, loop: Iterable[apgas.Step], total: int) -> Iterator[Timed]:
        """The steps of ``loop`` (an :func:`apgas.steps` of ``total`` steps), each to run
        as ``with step:``; after each, the reconfiguring point (:meth:`between`)."""
        each = iter(loop)
        step = next(each, None)  # the loop listens to the orders from here on
        if self.malleable:
            self._undo.append(lowlevel.on_resize(_Mark(self, 2)))
        while step is not None:
            index = step.index
            yield Timed(step, self)
            step = next(each, None)
            done = total if step is None else step.index
            if done <= index:  # a lost place rolled the loop back to a commit
                self.repeated += index + 1 - done
            if self.malleable:
                # a top-level finish holds the gate (the arrays follow the places): an
                # order that waited for the step passes it first, the others come later
                with apgas.finish():
                    pass
            self._between = True
            try:
                self.between(done, total)
            finally:
                self._between = False

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
                       resizes=list(self.resizes), repeated=self.repeated)

    # -- called by the steps, the handler and the listeners ---------------------------------
    def _entering(self) -> None:
        self._step = (mark(), None)

    def _ended(self) -> None:
        self._step = (self._step[0], mark())

    def _passed(self, kind: str, n: int) -> None:
        now = mark()
        began, ended = self._step  # the order waited for this step at most
        wait = 0.0 if self._between else max(0.0, (now if ended is None else min(now, ended)) - began)
        self._order = (kind, n, len(apgas.places()), now, wait)
        self._marks = {}

    def _mark(self, which: int, ids: set[int], grow: bool) -> None:
        now: float | None = mark()
        if which == 0:  # the arrays must not have moved yet (their listener may come first)
            try:
                held = {b[0] for b in self._arrays[0].layout} if self._arrays else set()
            except apgas.ApgasError:
                held = set()  # a listener must not fail the order
            if not self._arrays or ((ids <= held) if grow else not (ids & held)):
                now = None
        self._marks[which] = now

    def _done(self) -> None:
        if self._order is None:
            return
        kind, n, before, passed, wait = self._order
        end = mark()
        spans = [_span(self._marks.get(i), self._marks.get(i + 1)) for i in (0, 1)]
        resize = Resize(kind, n, before, len(apgas.places()), wait + end - passed, spans[0], wait,
                        spans[1])
        self.resizes.append(resize)
        self._order = None
        log.info("%s %d: %d -> %d place(s) in %.3f s (arrays moved in %s, committed in %s, after "
                 "at most %.3f s for the step)", kind, n, before, resize.places_after, resize.seconds,
                 *("?" if t is None else f"{t:.3f} s" for t in spans), wait)


def _span(since: float | None, until: float | None) -> float | None:
    return None if since is None or until is None else until - since
