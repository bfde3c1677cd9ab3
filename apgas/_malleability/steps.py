"""``apgas.steps``: an iterative program's safe points, commits and roll-back.

A step is the unit that orders respect and losses undo. Each step holds place
0's gate (:mod:`apgas._core.gate`), so a grow, a shrink, ``release_places`` or the
answer to ``check_status`` that comes during a step is carried out at its end
(a grow starts its places meanwhile). The loop *commits* before its first
step, after every ``commit_every``-th step, inside every grow and shrink
(between two steps, once the arrays are re-spread; a shrink so that no copy
leaves with a leaving place, a grow so that a later loss undoes no step before
it) and after a roll-back: each resilient array listed
keeps a copy of every block at its place and at a buddy place, and ``state``
is pickled at place 0. A place lost during a step or between steps (not place
0) rolls the arrays and ``state`` back to the last commit, spreads the arrays
over the live places, and the loop goes on with the step after that commit.

A loss is known by the runtime's dead places (``Runtime.dead``), not by the
exceptions a step raised: a loss that no task noticed still took rows with
it. Exceptions are only the way a loss shows up in the step's code: they are
swallowed when a place was lost, raised as they are otherwise.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol

from .._core.runtime import current
from ..errors import ApgasError, DeadPlaceError, MultipleException
from . import orders
from . import problem_steps as problem
from .checkpoint_steps import MODES, Disk

__all__ = ["steps", "Step"]

log = logging.getLogger("apgas.steps")
_tags = itertools.count(1)  # commit tags, distinct within the process


class _Resilient(Protocol):
    """What a loop needs of an array it rolls back (``apgas.arrays.BlockArray`` keeps it)."""

    resilient: bool

    def _steps_commit(self, tag: int) -> Any: ...

    def _steps_forget(self, keep: int | None) -> None: ...

    def _steps_restore(self, commit: Any) -> None: ...


class _Array(_Resilient, Protocol):
    """An array a loop with ``checkpoint=DIR`` also writes to disk and reads back."""

    shape: tuple[int, ...]
    dtype: Any

    def _steps_write(self, folder: str, k: int, mode: str) -> list[dict[str, Any]]: ...

    def _steps_read(self, folder: str, files: list[dict[str, Any]], mode: str) -> None: ...


class Step:
    """One step of :func:`steps`: run its body as ``with step:``.

    ``index`` is the step's number. ``rolled_back`` is True once the step has ended
    with a loss: its work (and the steps' since the last commit) was undone, and the
    loop repeats them, so an index may come again. Everything a step does must
    follow from ``index``, the listed arrays and ``state``; code after ``with step:``
    that uses the step's outcome checks ``rolled_back``. ``resumed`` is True for the
    first step of a loop that resumed from a commit on disk (``checkpoint=DIR``)."""

    __slots__ = ("index", "rolled_back", "resumed", "_loop", "_state")

    def __init__(self, loop: _Loop, index: int, resumed: bool = False) -> None:
        self.index = index
        self.rolled_back = False
        self.resumed = resumed
        self._loop = loop
        self._state = "new"  # new -> running -> ended

    def __enter__(self) -> Step:
        if self._state != "new":
            raise ApgasError(f"step {self.index} was entered already: each step runs once, "
                             "as `with step:` in the loop's body")
        self._loop._begin(self)
        self._state = "running"
        return self

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        self._state = "ended"
        return self._loop._end(self, exc)

    def __repr__(self) -> str:
        return f"Step({self.index}{', rolled back' if self.rolled_back else ''})"


class _Loop:
    """The state of one loop at place 0: the last commit, the places lost since.

    It listens to the orders (``apgas.lowlevel.on_resize``, after the arrays'
    follower, so the arrays are re-spread already): a shrink runs between two steps,
    and the loop commits inside it, with copies on the places that stay; the leaving
    places would otherwise take the copies they hold away with them. If a place was
    lost meanwhile, the shrink is refused (its places keep their copies for the
    roll-back). A grow commits too, once the arrays are re-spread, so that a loss
    after it undoes no step before it.
    """

    def __init__(self, n: int, start: int, commit_every: int, arrays: list[_Array],
                 state: dict[str, Any] | None, checkpoint: str | os.PathLike[str] | None = None,
                 mode: str = "parallel", fingerprint: dict[str, str] | None = None,
                 names: Any = None) -> None:
        """``fingerprint``: the problem's parts known at the call (``problem_steps``);
        ``names``: what the program calls its arrays, None if a key names the problem."""
        rt = current()
        self._orders = orders.current("apgas.steps")
        self._rt = rt
        self._gate = rt.gate
        self.n, self.commit_every = n, commit_every
        self.arrays = arrays
        self.state = state
        self._handled = set(rt.dead)  # losses that happened before, or were rolled back
        self._tag: int | None = None
        self._commits: list[Any] = []
        self._saved_state: bytes | None = None
        self._committed: int | None = None  # the step a roll-back goes back to
        self._next = start  # the step that runs next
        self._checkpoint, self._mode = checkpoint, mode
        self._fingerprint, self._names = fingerprint or {}, names
        self._disk: Disk | None = None  # the commits on disk, while the loop runs

    def __repr__(self) -> str:
        return f"the apgas.steps loop at step {self._next}"

    def __iter__(self) -> Iterator[Step]:
        stop_listening = self._orders.add_listener(self)
        try:
            resumed = self._resume()
            while True:
                while self._next < self.n:
                    step = Step(self, self._next, resumed)
                    resumed = False
                    yield step
                    if step._state != "ended":
                        raise ApgasError(f"step {step.index} of apgas.steps was not run: write "
                                         "the loop's body as `with step:` (orders wait for the "
                                         "step, losses roll it back)")
                if self._disk is None or self._last_commit():
                    break
        finally:
            stop_listening()
            if self._disk is not None:
                self._disk.close()
                self._disk = None
        for a in self._resilient():
            a._steps_forget(None)  # the loop is over: no more roll-back, free the copies

    # -- commits on disk ------------------------------------------------------------------
    def _resume(self) -> bool:
        """With ``checkpoint=DIR``: lock DIR and load its newest whole commit, if any, over
        the live places (again if a place is lost meanwhile); whether one was loaded."""
        if self._checkpoint is None:
            return False
        with self._gate.hold():
            if self._names is not None:  # the rows as the program made them, before a load
                self._fingerprint.update(problem.array_parts(self.arrays, self._names))
            self._disk = Disk(self._checkpoint, self._mode, self.n, self.arrays, self._fingerprint)
            while True:
                try:
                    resumed = self._disk.load(self.arrays, self.state)
                except (DeadPlaceError, MultipleException):
                    if not self._losses():
                        raise
                    self._handled |= self._losses()  # loaded over the live places: again
                    continue
                break
        if resumed is not None:
            self._next = resumed
        return resumed is not None

    def _last_commit(self) -> bool:
        """The loop's end on disk (running it again yields no step); False if a place was
        lost since the last step (the loop rolls back and goes on)."""
        assert self._disk is not None
        step = Step(self, self.n - 1)
        with self._gate.hold():
            try:
                if not self._losses():
                    self._disk.write(self.n, self.arrays, self._state_bytes(), len(self._rt.sorted_places()))
            except (ApgasError, MultipleException):
                if not self._losses():
                    raise
            if self._losses():
                self._roll_back(step)
                return False
        return True

    def _state_bytes(self) -> bytes | None:
        return None if self.state is None else _pickled(self.state)

    # -- a step's two ends -------------------------------------------------------------
    def _begin(self, step: Step) -> None:
        self._gate.enter()
        try:
            if self._committed is None and not self._losses():
                try:
                    self._commit(step.index)
                except (DeadPlaceError, MultipleException):
                    if not self._losses():
                        raise
            if self._losses() and self._committed is None:
                raise ApgasError(f"places {sorted(self._losses())} were lost before the loop's "
                                 "first commit: there is nothing to roll back to")
            # after a loss the step runs on what is left, and is rolled back at its end
        except BaseException:
            self._gate.exit()
            raise

    def _end(self, step: Step, exc: BaseException | None) -> bool:
        try:
            if self._losses():
                if exc is not None:
                    log.info("step %d ended with %r after a loss: rolled back", step.index, exc)
                self._roll_back(step)
                return True
            if exc is not None:
                return False
            self._next = done = step.index + 1
            if self.commit_every and done % self.commit_every == 0 and done < self.n:
                try:
                    self._commit(done)
                except (DeadPlaceError, MultipleException):
                    if not self._losses():
                        raise
                    self._roll_back(step)  # the commit failed: the one before stands
            return False
        finally:
            self._gate.exit()

    # -- orders (resize listener: the order's thread, the gate held by the order) ---------
    def before_shrink(self, leaving: list[Any]) -> None:
        if self._committed is None:
            return  # before the first step: its commit comes after the order
        if self._losses():
            raise ApgasError(f"places {sorted(self._losses())} were lost since the last commit "
                             "of an apgas.steps loop, and the places leaving hold copies its "
                             "roll-back may need: the shrink waits for the roll-back")
        self._commit(self._next)

    def after_grow(self, added: list[Any]) -> None:
        """Commit: a loss after the grow should undo no step before it (a loop without
        ``commit_every`` would go back to step 0), and the arrays were re-spread anyway."""
        if self._committed is None or self._losses():
            return  # before the first step (its commit comes next), or a roll-back is due
        try:
            self._commit(self._next)
        except (DeadPlaceError, MultipleException):
            if not self._losses():
                raise  # else the next step's end rolls back to the commit before

    # -- commits and roll-back (the gate held) ---------------------------------------------
    def _resilient(self) -> list[_Resilient]:
        return [a for a in self.arrays if a.resilient]

    def _losses(self) -> set[int]:
        return self._rt.dead - self._handled

    def _commit(self, index: int) -> None:
        saved = self._state_bytes()
        tag = next(_tags)
        commits = [a._steps_commit(tag) for a in self._resilient()]
        if self._disk is not None:  # in memory, then on disk: the commit is whole once both are
            self._disk.write(index, self.arrays, saved, len(self._rt.sorted_places()))
        old = self._tag
        self._tag, self._commits, self._saved_state = tag, commits, saved
        self._committed = index
        if old is not None:
            for a in self._resilient():
                a._steps_forget(tag)
        log.debug("committed before step %d (tag %d)", index, tag)

    def _roll_back(self, step: Step) -> None:
        assert self._committed is not None, "a step runs after the first commit"
        plain = [a for a in self.arrays if not a.resilient]
        lost: set[int] = set()
        while True:
            lost |= self._losses()
            self._handled |= lost
            if plain:
                raise ApgasError(f"places {sorted(lost)} were lost and the arrays {plain} cannot "
                                 "be rolled back: make them with resilient=True")
            try:
                for a, commit in zip(self._resilient(), self._commits, strict=True):
                    a._steps_restore(commit)
            except (DeadPlaceError, MultipleException):
                if not self._losses():
                    raise
                continue  # another place was lost during the restore: again, from the copies
            break
        if self.state is not None and self._saved_state is not None:
            self.state.clear()
            self.state.update(pickle.loads(self._saved_state))
        log.warning("places %s lost at step %d: arrays and state rolled back to the commit "
                    "before step %d", sorted(lost), step.index, self._committed)
        step.rolled_back = True
        self._next = self._committed
        # copies went with the lost places, and the layout changed: commit anew at once
        try:
            self._commit(self._committed)
        except (DeadPlaceError, MultipleException):
            if not self._losses():
                raise  # another loss: the next step is rolled back to the same commit


def _pickled(state: dict[str, Any]) -> bytes:
    try:
        return pickle.dumps(state, protocol=5)
    except Exception as e:
        bad = []
        for key, value in state.items():
            try:
                pickle.dumps(value, protocol=5)
            except Exception:
                bad.append(key)
        raise ApgasError(f"apgas.steps keeps state at each commit by pickling it, and "
                         f"{'state[' + repr(bad[0]) + ']' if bad else 'state'} cannot be "
                         f"pickled: {type(e).__name__}: {e}") from e


def _count(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"apgas.steps: {name} must be an integer >= {low}, got {value!r}")
    return value


def steps(n: int, *, start: int = 0, commit_every: int = 0, arrays: Sequence[Any] = (),
          state: dict[str, Any] | None = None,
          checkpoint: str | os.PathLike[str] | None = None,
          checkpoint_mode: str = "parallel", checkpoint_key: str | None = None) -> Iterator[Step]:
    """The steps ``start .. n - 1`` of an iterative program, at place 0::

        for step in apgas.steps(1000, commit_every=10, arrays=[u, v], state=st):
            with step:
                ...  # one iteration: finishes, at, async_at

    - **Orders wait for the step.** No grow, shrink, ``release_places`` or
      ``check_status`` answer changes the places or re-spreads a followed array
      inside ``with step:``; one that comes meanwhile is carried out at the step's
      end (a grow starts its places while the step runs; one that fails never stops
      the loop). ``apgas.places()`` is stable inside a step.
    - **Commits.** Before the first step, after every ``commit_every``-th step
      (``index + 1`` a multiple of it; 0: never again), inside every grow and
      every shrink (between two steps, once the arrays are re-spread: a loss after
      an order undoes no step before it) and after a roll-back, each array of ``arrays``
      made with ``resilient=True`` keeps a
      copy of every block at its place and at a buddy place, and ``state`` (a dict
      of picklable values the program updates in place) is kept at place 0.
    - **Losses roll back.** A place other than 0 lost during a step or between
      steps: the step's exceptions are swallowed, the arrays are restored from the
      copies over the live places, ``state`` is restored in place, and the loop goes
      on with the step after the last commit (``step.index`` values come again;
      ``step.rolled_back`` tells code after ``with step:`` that the step was undone). A
      block lost with its buddy, or a listed array that is not resilient, is an
      ``ApgasError``. Other exceptions of a step end the loop as they are.

    **Commits on disk** (``checkpoint=DIR``, to survive the loss of place 0, of the
    whole job, or its end by a time limit): every commit is also written to DIR,
    with every listed array (resilient or not) and ``state``, atomically (temporary
    names, fsync, rename; the commit before is kept until the new one is whole; a
    torn one is never loaded), and the loop's end leaves a final commit. A commit
    whose step DIR holds already (after a roll-back or a resume) is not written
    again. A loop started on a DIR that holds a commit *resumes*: its arrays (made
    afresh by the program, as they were the first time) get the committed rows,
    spread over the places it has now, however many; ``state`` is restored in
    place; the steps go on after the commit (``start`` is then ignored;
    ``step.resumed`` marks the first). A finished loop run again yields no step and
    leaves the arrays and ``state`` as they were at its end. One loop uses a DIR
    at a time; a resume unpickles ``state``, so DIR must be writable by you alone.

    **The same problem.** DIR records ``n``, the arrays' shapes and dtypes, in
    order, and a fingerprint of the problem: the code of the function that runs the
    loop, the globals it loads and its closure's values (a function of its module by
    its code in turn), the arrays' rows and each ``state`` value as the program made
    them. A loop of another problem refuses DIR with an ``ApgasError`` that names
    what differs (``the value of 'k' differs``, ``the step function's code
    differs``, ``the initial array 'u' differs``). The function's arguments are no
    part of it (what steers a run, such as DIR or ``commit_every``, comes that way),
    and a value that does not pickle cannot be told, which a warning says:
    ``checkpoint_key="..."`` names the problem instead (say, its parameters:
    ``f"k={k}"``), and replaces the fingerprint; a key that differs is refused
    (``the key differs: 'k=8' vs 'k=5'``).

    ``checkpoint_mode``: ``"parallel"`` (the default: each place writes, and at a
    resume reads, its own blocks, all at once; on a cluster DIR must be on a
    filesystem all places share) or ``"gathered"`` (the rows travel to place 0,
    which writes and reads every file; DIR need only be place 0's). Measured with
    ``python -m benchmarks.steps_checkpoint`` (docs/tutorial-resilient-solver.md).
    """
    _count("n", n, 0)
    _count("start", start, 0)
    if start > n:
        raise ValueError(f"apgas.steps: start {start} is beyond n {n}")
    _count("commit_every", commit_every, 0)
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Sequence):
        raise TypeError(f"apgas.steps: arrays must be a list of BlockArrays, got {arrays!r}")
    need = ("_steps_commit",) if checkpoint is None else ("_steps_commit", "_steps_write")
    for a in arrays:
        if not all(callable(getattr(a, name, None)) for name in need):
            raise TypeError(f"apgas.steps: arrays must be a list of apgas.arrays.BlockArray, got "
                            f"{type(a).__name__}: {a!r:.80}")
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"apgas.steps: state must be a dict (updated in place), got "
                        f"{type(state).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"apgas.steps: checkpoint must be a directory's path, got {checkpoint!r}")
    if checkpoint_mode not in MODES:
        raise ValueError(f"apgas.steps: checkpoint_mode must be one of {', '.join(MODES)}, got "
                         f"{checkpoint_mode!r}")
    if checkpoint_key is not None and not isinstance(checkpoint_key, str):
        raise TypeError(f"apgas.steps: checkpoint_key must be a str naming the problem, got "
                        f"{checkpoint_key!r}")
    fingerprint, names = _problem(sys._getframe(1), checkpoint, checkpoint_key, arrays, state)
    return iter(_Loop(n, start, commit_every, list(arrays), state, checkpoint, checkpoint_mode,
                      fingerprint, names))


def _problem(frame: Any, checkpoint: object, key: str | None, arrays: Sequence[Any],
             state: dict[str, Any] | None) -> tuple[dict[str, str] | None, Any]:
    """With ``checkpoint=DIR``, what defines the problem, known now: the key, or the
    caller's code and values and the initial state (the arrays' rows come at the start)."""
    try:
        if checkpoint is None:
            return None, None
        if key is not None:
            return {problem.KEY: key}, None
        parts = problem.code_parts(frame)
        parts.update(problem.state_parts(state))
        return parts, problem.local_names(frame, arrays)
    finally:
        del frame  # no cycle through the caller's frame
