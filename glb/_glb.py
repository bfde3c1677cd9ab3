"""The GLB driver at place 0: start the workers everywhere, wait, reduce."""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

import apgas
from apgas import protocol
from apgas.lowlevel import current_timeline, immediate_at, sample_interval, watch_deaths
from apgas.malleable import MalleableCommunicator

from . import _worker as w
from ._checkpoint import CheckpointStats, Disk
from ._config import GLBConfig
from ._evolving import Evolver
from ._recovery import Recovery
from ._resilience import ResilienceStats
from ._sampling import Sample
from ._stats import GLBStats

__all__ = ["GLB", "Bag", "Result"]


R = TypeVar("R", bound="Result")
T = TypeVar("T")
_ids = itertools.count(1)
log = logging.getLogger("glb")
#: a worker's start task: (place, function, arguments)
_Start = tuple[int, Callable[..., None], tuple[Any, ...]]


@runtime_checkable
class Result(Protocol):
    """A partial result. ``fold(other)`` folds ``other`` into ``self``, in any order."""

    def fold(self, other: Any) -> None: ...


@runtime_checkable
class Bag(Protocol):
    """A bag of work and the partial result of the work it has done.

    The bag contract. GLB keeps its side of every rule below, so a bag that
    keeps its own side gets an exact result, whatever moves and resizes happen:

    - ``process(n)`` does about ``n`` units of work (``n`` bounds the time
      between two checks for hungry thieves), keeps their outcome in the
      bag's partial result, and returns how many units it did (``None``
      counts as ``n``); the count feeds the statistics only.
    - ``split(take_all)`` moves work out of the bag into a new bag, the
      *piece*, and returns it, or returns ``None`` when it has nothing to give.
      GLB calls ``split(False)`` only when ``is_splittable()`` is true; the
      piece holds part of the work. GLB calls ``split(True)`` only on a bag
      that is not empty, when its place leaves; the piece must hold all of
      the work, leaving the bag empty. Work is moved, never copied. A piece
      may carry part of the partial result only if that part was moved out
      of the bag too; usually a piece carries none.
    - ``merge(other)`` moves all of ``other``'s work and partial result into
      this bag. GLB never uses ``other`` again. GLB merges only pieces that
      nothing has processed since ``split`` returned them, so when pieces carry
      no partial result, ``merge`` need only take their work.
    - ``submit(result)`` folds this bag's partial result into ``result``. GLB
      calls it exactly once for every bag it did not merge into another, when
      the worker holding the bag ends, and never uses the bag again, so
      ``submit`` may reset the bag but need not.
    - ``is_empty()`` is true when no work is left. ``is_splittable()`` is
      true when ``split(False)`` may give a piece (a hint: ``None`` is still
      allowed).
    - Bags, pieces and results travel between places: they must pickle (with
      cloudpickle) and behave the same after a pickle round trip. Checkpoints
      write them to disk in the same way.
      ``result.fold(other)`` must give the same result in any order.
    - GLB owns the bag given to ``compute_dynamic`` and the bags that
      ``compute_static``'s ``make_bag`` returns. A worker holds one bag for its
      life: loot that reaches it is merged into that bag, and work leaves it
      only as pieces from ``split``.

    ``glb.testing.check_bag`` checks a bag against these rules.

    A bag class may opt in to steals while it is processed, with
    ``concurrent_split = True``: GLB may then call ``is_splittable()`` and
    ``split(False)`` from another thread while ``process`` runs, and the bag
    makes those two safe against ``process`` under a lock of its own (the
    precise rule: :mod:`glb.bags`). Without it, nothing is called concurrently.
    """

    def process(self, n: int) -> int | None:
        """Do at most ``n`` units of work; return how many were done."""

    def split(self, take_all: bool) -> Bag | None:
        """Move part of the work (all of it if ``take_all``) into a new bag and return it, or None."""

    def merge(self, other: Bag) -> None:
        """Move all of ``other``'s work and partial result into this bag."""

    def is_empty(self) -> bool: ...

    def is_splittable(self) -> bool: ...

    def submit(self, result: Any) -> None:
        """Fold this bag's partial result into ``result`` (called once per bag)."""


class GLB:
    """Lifeline-based global load balancing over all places and their workers."""

    def __init__(self, config: GLBConfig | None = None) -> None:
        self.config = config or GLBConfig()
        self._stats = GLBStats()
        self._moved = GLBStats()
        self._recovery: Recovery | None = None
        self.seconds = 0.0
        self.evolver: Evolver | None = None  # the last computation's, in evolving mode
        #: the last computation's backups and restores (GLBConfig(resilient=True) only)
        self.resilience: ResilienceStats | None = None
        #: the last computation's snapshots (GLBConfig(checkpoint=DIR) only)
        self.checkpoints: CheckpointStats | None = None

    def compute_dynamic(self, bag: Bag, result: R) -> R:
        """All work starts at place 0 in ``bag``; ``result`` is the neutral result."""
        def starts(gid: int, members: list[int]) -> list[_Start]:  # the others start by stealing
            return [(p, w.start_dynamic, (gid, bag if p == 0 else None)) for p in members]
        return self._compute(result, starts, bag)

    def compute_static(self, make_bag: Callable[[int, int], Bag], result: R) -> R:
        """Each worker starts with ``make_bag(worker_index, worker_count)``.

        Resilient, ``make_bag`` must give the same bag for the same arguments at any
        place: a lost place's bags are made again elsewhere until they are backed up."""
        def starts(gid: int, members: list[int]) -> list[_Start]:
            if self._recovery is not None:
                self._recovery.store.static_records(members, make_bag, self.config.workers)
            return [(p, w.start_static, (gid, make_bag, i, len(members))) for i, p in enumerate(members)]
        return self._compute(result, starts, make_bag)

    def stats(self) -> GLBStats:
        """Per-place statistics of the last computation (places that left included)."""
        return self._stats

    # -------------------------------------------------------------------------------------
    def _compute(self, prototype: R, starts: Callable[[int, list[int]], list[_Start]],
                 problem: Any) -> R:
        if apgas.here().id != 0:
            raise apgas.ApgasError("GLB computations are started at place 0")
        if not isinstance(prototype, Result):
            raise TypeError(f"the result must have a fold(other) method, got {prototype!r}")
        disk = Disk(self.config, problem, prototype) if self.config.checkpoint else None
        if disk is not None and disk.snapshot is not None and disk.snapshot.final:
            self._stats, self.seconds = GLBStats(), 0.0
            self.checkpoints = disk.stats
            done: R = disk.result(prototype)  # the same run again: its result, at once
            return done
        gid = next(_ids) * 100_000 + os.getpid() % 100_000
        members = [p.id for p in apgas.places()]
        start = time.monotonic()
        sample = sample_interval()  # None: no timeline, no load samples
        recovery = self._recovery = Recovery(gid, prototype) if self.config.keeps_copies else None
        if disk is not None and recovery is not None and disk.snapshot is not None:
            starts = disk.resume_into(recovery.store)  # its work goes to the places there are
        lost: list[tuple[int, str]] = []  # plain GLB: places that died (their results with them)
        stop_watching = watch_deaths(lambda pid, host, reason: lost.append((pid, reason)))
        try:
            if recovery is not None:
                recovery.start()
            self._init_places(gid, prototype, members, sample)
            if disk is not None and recovery is not None:
                disk.start(gid, recovery.store)
            total = self._run(gid, prototype, members, starts, sample, start)
            if disk is not None:
                disk.final(total)
        finally:
            stop_watching()
            if disk is not None:
                disk.stop()
                self.checkpoints = disk.stats
            if recovery is not None:
                recovery.close()
                self.resilience = recovery.stats
            self._recovery = None
        if lost and recovery is None:  # even one that died idle took its partial result along
            pid, reason = lost[0]
            raise apgas.DeadPlaceError(pid, f"it died during GLB computation {gid} ({reason}), and "
                                       "its share of the result with it; GLBConfig(resilient=True) "
                                       "survives this")
        return total

    def _init_places(self, gid: int, prototype: Any, members: list[int], sample: float | None) -> None:
        try:
            with apgas.finish():
                for pid in members:
                    apgas.async_at(pid, w.init_place, gid, self.config, prototype, members, False,
                                   sample)
        except apgas.MultipleException as e:  # resilient: a place lost now is just not used
            if self._recovery is None or not all(isinstance(x, apgas.DeadPlaceError)
                                                 for x in e.exceptions):
                raise
        if self._recovery is not None:
            live = {p.id for p in apgas.places()}
            if not set(members) <= live:
                members[:] = [m for m in members if m in live]
                for pid in members:
                    try:
                        apgas.at(pid, w.set_members, gid, members)
                    except apgas.DeadPlaceError:
                        pass  # its restore rewires the others

    def _run(self, gid: int, prototype: R, members: list[int],
             starts: Callable[[int, list[int]], list[_Start]], sample: float | None,
             start: float) -> R:
        recovery = self._recovery
        self._moved = GLBStats()
        resizable = self.config.malleable or self.config.evolving
        handler = _GLBHandler(self, gid, prototype, sample) if resizable else None
        evolver = Evolver(gid, self.config) if self.config.evolving else None
        self.evolver = evolver
        if handler is not None:
            communicator = apgas.define_malleable_handler(handler)
            handler.communicator = communicator
            if evolver is not None and not communicator.attached:
                apgas.disable_malleable_handler()
                for pid in members:
                    apgas.at(pid, w.collect, gid)  # forget the computation's state
                raise apgas.ApgasError("GLBConfig(evolving=True) needs a scheduler to ask for "
                                       "places: APGAS_SCHEDULER is not set")
        failed = False

        def begin() -> None:
            try:
                for place, fn, args in starts(gid, members):
                    try:
                        apgas.async_at(place, fn, *args)
                    except apgas.DeadPlaceError:
                        if recovery is None:
                            raise
                        continue  # resilient: its share is restored from place 0's records
                    if handler is not None:
                        handler.start_sent.add(place)
            finally:
                if handler is not None:
                    handler.started.set()  # orders may change the places from now on
        try:
            if evolver is not None:
                evolver.start()
            if recovery is not None:
                recovery.run(begin)
            else:
                with apgas.finish():
                    begin()
        except BaseException:
            failed = True
            raise
        finally:
            if evolver is not None:
                evolver.stop()  # before the handler goes: a release may be under way
            if handler is not None:
                handler.started.set()  # an order waiting for the start goes on (and ends)
                apgas.disable_malleable_handler()  # waits for an order in progress
            if failed:  # every task has ended (the finish waited): drop the places' state
                _forget(gid)
        self.seconds = time.monotonic() - start
        stats = GLBStats()
        total = copy.deepcopy(prototype)
        for p in apgas.places():
            collected = (apgas.at(p, w.collect, gid) if recovery is None
                         else recovery.collect(p.id))
            if collected is None:
                continue  # lost after the work ended: its result is in the recovery's
            part, place_stats, samples = collected
            total.fold(part)
            stats.append(place_stats)
            _write_loads(p.id, gid, samples)
        if recovery is not None:
            total.fold(recovery.result())
            stats.extend(recovery.lost_stats())
        stats.extend(self._moved)
        stats.sort(key=lambda s: s.place)
        self._stats = stats
        return total


def _forget(gid: int) -> None:
    """Best effort after a failed computation: no place keeps its state or sampler."""
    for p in apgas.places():
        try:
            apgas.at(p, w.forget, gid)
        except Exception as e:  # a place that died with the computation
            log.debug("GLB %d: place %d could not forget its state: %s", gid, p.id, e)


class _GLBHandler(apgas.MalleableHandler):
    """GLB's own handler: moves work off leaving places, wires new places in.

    Each phase reports its time as the Java GLB does (``preGrowTimeGLB``,
    ``postGrowTimeGLB``, ``preShrinkTimeGLB``, ``postShrinkTimeGLB``), which the
    ElasticJobScheduler's result tools read."""

    def __init__(self, glb: GLB, gid: int, prototype: Any, sample: float | None = None) -> None:
        self.glb = glb
        self.gid = gid
        self.prototype = prototype
        self.sample = sample  # seconds between load samples of new places (a timeline is on)
        # Set once every place's start task is spawned: an order that came earlier
        # waits, else a place could leave before its start task (with its share of
        # the work in compute_static) reached it.
        self.started = threading.Event()
        self.start_sent: set[int] = set()  # places whose start task was sent
        self.communicator: MalleableCommunicator | None = None

    def _timed(self, event: str, n: int, since_ns: int) -> None:
        ns = time.monotonic_ns() - since_ns
        if self.communicator is not None:
            self.communicator.report(protocol.timing(event, n, ns, source="GLB"))
        timeline = current_timeline()
        if timeline is not None:
            timeline.phase("grow" if "Grow" in event else "shrink", event, n, since_ns, ns,
                           source="GLB")

    def pre_grow(self, n: int) -> None:
        self._timed("preGrow", n, time.monotonic_ns())  # GLB has nothing to do before a grow

    def post_grow(self, n: int, continued: list[apgas.Place], added: list[apgas.Place]) -> None:
        start = time.monotonic_ns()
        self._post_grow(continued, added)
        self._timed("postGrow", n, start)

    def pre_shrink(self, n: int, chosen: list[apgas.Place] | None = None) -> list[apgas.Place]:
        start = time.monotonic_ns()
        leaving = self._pre_shrink(n, chosen)
        self._timed("preShrink", n, start)
        return leaving

    def post_shrink(self, n: int, removed: list[apgas.Place]) -> None:
        self._timed("postShrink", n, time.monotonic_ns())  # the work moved in pre_shrink

    def _pre_shrink(self, n: int, chosen: list[apgas.Place] | None) -> list[apgas.Place]:
        self.started.wait()
        places = apgas.places()
        leaving = list(chosen) if chosen is not None else places[-n:]
        gone = {p.id for p in leaving}
        staying = [p.id for p in places if p.id not in gone]
        for pid in staying:
            self._call(pid, w.set_members, self.gid, staying)
        for p in leaving:
            left = self._call(p.id, w.leave, self.gid, staying, p.id in self.start_sent)
            if left is None:
                continue  # lost meanwhile (resilient): its work is restored from place 0's copies
            result, thieves, stats, samples = left
            _write_loads(p.id, self.gid, samples)
            recovery = self.glb._recovery
            # Resilient, a loss declared between the leave's answer and now wins: the
            # store restores the place's copies, so the result in hand is dropped.
            with _paused(self.gid):  # a snapshot sees the result in the store or here
                kept = recovery is None or recovery.store.retire(p.id)
                if kept:
                    w.absorb(self.gid, result)  # place 0 stays: partial results live on here
            self._call(staying[0], w.register_thieves, self.gid, [t for t in thieves if t in staying])
            if kept:  # else its row is a lost place's, with the units of the copies restored
                self.glb._moved.append(stats)
        return leaving

    def _post_grow(self, continued: list[apgas.Place], added: list[apgas.Place]) -> None:
        self.started.wait()
        members = [p.id for p in continued + added]
        recovery = self.glb._recovery
        if recovery is not None:  # restored work waits until the new places are set up
            recovery.joining.update(p.id for p in added)
        for p in continued:  # first: a worker drops a thief that is not a member
            self._call(p.id, w.set_members, self.gid, members)
        try:
            with apgas.finish():  # the new places set up at once: each imports the bag's modules
                for p in added:
                    apgas.async_at(p.id, w.init_place, self.gid, self.glb.config, self.prototype,
                                   members, True, self.sample)
        except apgas.MultipleException as e:
            if recovery is None or not all(isinstance(x, apgas.DeadPlaceError)
                                           for x in e.exceptions):
                raise
        finally:
            if recovery is not None:
                recovery.joining.difference_update(p.id for p in added)

    def _call(self, place: int, fn: Callable[..., T], *args: Any) -> T | None:
        """``immediate_at``; resilient, a place lost meanwhile gives None (its work is
        restored), where plain GLB fails the order."""
        try:
            return immediate_at(place, fn, *args)
        except apgas.DeadPlaceError:
            if self.glb._recovery is None:
                raise
            log.warning("GLB %d: place %d was lost during an order; going on without it",
                        self.gid, place)
            return None


@contextlib.contextmanager
def _paused(gid: int) -> Iterator[None]:
    """Hold place 0's pause (checkpoints: no snapshot in between), if it has one."""
    pause = w.state(gid).pause
    if pause is None:
        yield
        return
    with pause.hold():
        yield


def _write_loads(place: int, gid: int, samples: list[Sample] | None) -> None:
    """A place's load samples into the run timeline (they come only when one is written)."""
    timeline = current_timeline()
    if samples and timeline is not None:
        timeline.loads(place, gid, samples)
