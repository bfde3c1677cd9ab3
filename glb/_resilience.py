"""Resilient GLB: place 0 keeps a copy of everything another place could lose.

Place 0 is the computation's single point of failure anyway (it holds the finish,
the driver and the final result), so it is also the one home of the backups:
nothing is replicated, and each change to the copies is one call under one lock.
docs/glb.md ("Resilience") tells the whole design; in short:

- A *record* is the bag of one worker at a place other than 0, as of its last
  backup (pickled there; its partial result travels inside it). A worker backs
  up every ``GLBConfig.backup_interval`` seconds, when it splits off work, and
  when it ends (then its result joins the place's ``done`` result instead).
- A *piece* is work split off a bag. It has one owner, a place. Pieces move
  between places only through place 0: a victim asks the store to give a piece
  to a thief, and the store itself sends it there in a counted task. So a piece
  is never on the wire without place 0 knowing where it goes, and the sender's
  death cannot lose it.
- A worker that merges a piece keeps it listed until its next backup; that
  backup (the bag with the piece's work) and the piece's removal are one change.

So each unit of work not yet done is in exactly one record or piece, and each
unit done is in exactly one of a live place's result, a record's partial result
or the ``done`` result of a place. When a place dies, its records and pieces go
to live places (records as the bags of new workers, never merged: they carry a
partial result) and its ``done`` joins the final result; changes it sent later
are refused. Nothing is redone twice, nothing counted twice.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle

import apgas
from apgas.lowlevel import immediate_at, spawn_under

__all__ = ["Store", "Ledger", "ResilienceStats", "Held", "COMING", "coming", "LOOT", "BAG", "STATIC", "open_blob"]

log = logging.getLogger("glb.resilience")

#: what a restored piece becomes at its new place
LOOT, BAG, STATIC = "loot", "bag", "static"
#: a worker's key in the store: (place, serial) or (place, ("static", index))
Key = tuple[int, Any]

_stores: dict[int, Store] = {}  # at place 0: gid -> store


class Held(NamedTuple):
    """A piece of work in a place's ``shared`` queue, and its id in place 0's store."""

    pid: int
    bag: Any


#: a resilient steal's answer: the loot comes from place 0, in a task of its own
COMING = "glb:loot-coming"


def coming(loot: Any) -> bool:
    return isinstance(loot, str) and loot == COMING


class Blob(bytes):
    """A bag pickled at the place that sent it; place 0 keeps it without unpickling."""


def open_blob(value: Any) -> Any:
    return cloudpickle.loads(value) if isinstance(value, Blob) else value


def _blob(value: Any) -> Blob:
    return Blob(cloudpickle.dumps(value))


@dataclasses.dataclass
class ResilienceStats:
    """What resilience cost and did in one computation (place 0's view)."""

    backups: int = 0          # records written (backups, splits and ends of places > 0)
    backup_bytes: int = 0     # their pickled bags and results
    pieces: int = 0           # pieces registered
    piece_bytes: int = 0      # of them, pickled at places > 0
    places_lost: int = 0      # places whose work was restored
    restored: int = 0         # records and pieces restored at live places
    rounds: int = 1           # finishes run (one more after a loss that the first missed)
    recovery_s: float = 0.0   # place 0's time spent restoring


@dataclasses.dataclass
class _Piece:
    owner: int | None         # None: an orphan waiting for a live place
    kind: str
    bag: Any                  # Blob from places > 0, the object itself from place 0


class Store:
    """Place 0's copies of one computation (see the module docstring)."""

    def __init__(self, gid: int, prototype: Any, arrive: Callable[..., None]) -> None:
        self.gid = gid
        self.arrive = arrive  # the task that brings a piece to its new place
        self.lock = threading.Lock()
        self.records: dict[Key, Any] = {}
        self.pieces: dict[int, _Piece] = {}
        self.done: dict[int, Any] = {}
        self.prototype = prototype
        self.restored_result = copy.deepcopy(prototype)
        self.lost: set[int] = set()
        # units (``process`` counts) behind the copies: a record's, as of its backup, by
        # key; a place's ended workers', by place; a lost place's, once lost (its stats row)
        self.units: dict[Key, int] = {}
        self.done_units: dict[int, int] = {}
        self.lost_units: dict[int, int] = {}
        self.retired: set[int] = set()  # left in a shrink: late changes are ignored
        self.fref: tuple[int, int] | None = None  # the running round's finish
        self.targets: Callable[[], list[int]] = lambda: [0]
        self.stats = ResilienceStats()
        self._ids = itertools.count(1)
        self._next_target = 0

    # -- changes sent by places (each one call, under the lock) ---------------------
    def _alive(self, place: int) -> None:
        if place in self.lost:
            raise apgas.ApgasError(f"GLB {self.gid}: place {place} was declared dead; its "
                                   "work has been restored elsewhere")

    def _write(self, place: int, key: Key, bag: Any, merged: list[int], units: int) -> None:
        if place in self.retired:
            return
        if bag is not None:
            self.records[key] = bag
            self.units[key] = units
            self.stats.backups += 1
            self.stats.backup_bytes += len(bag)
        for pid in merged:
            self.pieces.pop(pid, None)

    def backup(self, place: int, key: Key, bag: Blob | None, merged: list[int],
               units: int = 0) -> None:
        with self.lock:
            self._alive(place)
            self._write(place, key, bag, merged, units)

    def split(self, place: int, key: Key, bag: Blob | None, merged: list[int], piece: Any,
              to: int | None, units: int = 0) -> tuple[int, bool]:
        """Record the bag after a split and register the piece; with ``to``, give it
        there too. Returns the piece's id and whether it was given."""
        with self.lock:
            self._alive(place)
            self._write(place, key, bag, merged, units)
            pid = next(self._ids)
            self.pieces[pid] = _Piece(place, LOOT, piece)
            self.stats.pieces += 1
            if isinstance(piece, Blob):
                self.stats.piece_bytes += len(piece)
            return pid, to is not None and self._give(place, pid, to)

    def give(self, place: int, pid: int, to: int) -> bool:
        with self.lock:
            self._alive(place)
            return self._give(place, pid, to)

    def end(self, place: int, key: Key, result: Any, merged: list[int], units: int = 0) -> None:
        """A worker ended: its result joins the place's ``done``; its record goes."""
        with self.lock:
            self._alive(place)
            self._write(place, key, None, merged, units)
            if place in self.retired:
                return
            self.records.pop(key, None)
            self.units.pop(key, None)
            if place != 0:
                self.done_units[place] = self.done_units.get(place, 0) + units
                self.stats.backups += 1
                self.stats.backup_bytes += len(result)
                result = open_blob(result)
                done = self.done.get(place)
                if done is None:
                    self.done[place] = result
                else:
                    done.fold(result)

    def _give(self, place: int, pid: int, to: int) -> bool:
        piece = self.pieces.get(pid)
        if (piece is None or piece.owner != place or to in self.lost or to in self.retired
                or self.fref is None):
            return False
        piece.owner = to  # from now on the piece is the thief's: lost with it, restored from here
        try:
            return spawn_under(self.fref, to, self.arrive, self.gid, pid, piece.kind, piece.bag,
                               place)
        except apgas.DeadPlaceError:
            return True  # its loss is being handled: recover(to) restores the piece

    # -- losses ----------------------------------------------------------------------
    def recover(self, place: int) -> bool:
        """Take a dead place's records and pieces back, once; True the first time."""
        with self.lock:
            if place in self.lost or place in self.retired or place == 0:
                return False  # a place that left had its result taken with it
            self.lost.add(place)
            self.stats.places_lost += 1
            # the units its copies hold, which the result counts: its stats row (GLB.stats)
            self.lost_units[place] = self.done_units.pop(place, 0) + sum(
                self.units.pop(k, 0) for k in self.records if k[0] == place)
            for key in [k for k in self.records if k[0] == place]:
                bag = self.records.pop(key)
                kind = STATIC if isinstance(bag, _Static) else BAG
                self.pieces[next(self._ids)] = _Piece(None, kind, bag)
            for piece in self.pieces.values():
                if piece.owner == place:
                    piece.owner = None
            done = self.done.pop(place, None)
            if done is not None:
                self.restored_result.fold(done)
            return True

    def retire(self, place: int) -> bool:
        """A place left in a shrink, its result in hand: True if that result is to be
        kept, False if the place was declared dead first (its copies are restored
        instead, and the result in hand would count its work twice)."""
        with self.lock:
            if place in self.lost:
                return False
            self.retired.add(place)
            self.done.pop(place, None)
            self.done_units.pop(place, None)
            for key in [k for k in self.records if k[0] == place]:
                del self.records[key]
                self.units.pop(key, None)
            # Pieces still its own were on their way when it left (it drops them on
            # arrival): they go to the places that stay.
            stray = [p for p in self.pieces.values() if p.owner == place]
            for piece in stray:
                piece.owner = None
        if stray:
            self.dispatch()
        return True

    def orphans(self) -> int:
        """At the end of a round: every piece still here is an orphan. A live place
        holds none by then: its workers ended with ``shared`` empty and wrote the
        pieces they merged away, and pieces on their way are counted tasks."""
        with self.lock:
            for piece in self.pieces.values():
                piece.owner = None
            return len(self.pieces)

    def dispatch(self) -> int:
        """Send every orphan to a live place in the running round; returns how many
        are left (the round had ended, or no place is live)."""
        with self.lock:
            orphans = [(pid, p) for pid, p in self.pieces.items() if p.owner is None]
            targets = [t for t in self.targets() if t not in self.lost and t not in self.retired]
            left = len(orphans)
            for pid, piece in orphans:
                if self.fref is None or not targets:
                    break
                to = targets[self._next_target % len(targets)]
                self._next_target += 1
                piece.owner = to
                try:
                    if not spawn_under(self.fref, to, self.arrive, self.gid, pid, piece.kind,
                                       piece.bag, None):
                        piece.owner = None
                        break
                except apgas.DeadPlaceError:
                    pass  # lost with ``to``: restored again when its loss is handled
                left -= 1
                self.stats.restored += 1
            return left

    def static_records(self, places: list[int], make_bag: Callable[[int, int], Any],
                       workers: int) -> None:
        """compute_static: until its first backup, a worker's record is how to make its bag."""
        count = len(places) * workers
        with self.lock:
            for position, place in enumerate(places):
                if place != 0:
                    for k in range(workers):
                        index = position * workers + k
                        self.records[(place, ("static", index))] = _Static(make_bag, index, count)


@dataclasses.dataclass
class _Static:
    make_bag: Callable[[int, int], Any]
    index: int
    count: int


def store(gid: int) -> Store:
    return _stores[gid]


def open_store(gid: int, prototype: Any, arrive: Callable[..., None]) -> Store:
    s = _stores[gid] = Store(gid, prototype, arrive)
    return s


def close_store(gid: int) -> None:
    _stores.pop(gid, None)


#: the changes a place may send (never ``recover``, ``dispatch`` or ``retire``: place 0's own)
_OPS = frozenset({"backup", "split", "give", "end"})


def _call(gid: int, op: str, *args: Any) -> Any:
    """At place 0: one change to the store."""
    if op not in _OPS:
        raise apgas.ApgasError(f"GLB {gid}: {op!r} is not a change a place may send to the store")
    return getattr(_stores[gid], op)(*args)


class Ledger:
    """One worker's side of the store: its key, the pieces it merged since its last
    backup, and when the next backup is due."""

    _serials = itertools.count(1)

    def __init__(self, gid: int, me: int, interval: float, key: Key | None = None) -> None:
        self.gid = gid
        self.me = me
        self.key: Key = key if key is not None else (me, next(Ledger._serials))
        self.merged: list[int] = []
        self.units = 0  # the worker's units as of its last process: sent with each change
        self.interval = interval
        self.due = time.perf_counter() + interval

    def took(self, pid: int) -> None:
        self.merged.append(pid)

    def _bag(self, bag: Any) -> Blob | None:
        self.due = time.perf_counter() + self.interval
        return None if self.me == 0 or bag is None else _blob(bag)

    def _send(self, op: str, value: Any, *more: Any) -> Any:
        """``Store.<op>(place, key, value, merged, *more, units)`` at place 0; the merged
        pieces leave the store in the same change, and ``units`` is the worker's count."""
        merged, self.merged = self.merged, []
        return immediate_at(0, _call, self.gid, op, self.me, self.key, value, merged, *more,
                            self.units)

    def maybe_backup(self, bag: Any, now: float, units: int) -> None:
        """After each ``process``, ``now`` its end (``time.perf_counter``, which the
        worker reads anyway) and ``units`` the worker's units so far: a backup if one
        is due."""
        self.units = units
        if now >= self.due and (self.me != 0 or self.merged):
            self._send("backup", self._bag(bag))

    def split(self, bag: Any, piece: Any, to: int | None) -> tuple[int, bool]:
        """Register ``piece`` (just split off ``bag``) with the bag's new backup; give it
        to ``to`` if not None. Returns the piece's id and whether it was given."""
        sent = piece if self.me == 0 else _blob(piece)
        result: tuple[int, bool] = self._send("split", self._bag(bag), sent, to)
        return result

    def ended(self, result: Any) -> Any:
        """What :meth:`end` sends: taken when the worker ends (under the place's lock)."""
        return result if self.me == 0 else _blob(result)

    def end(self, sealed: Any) -> None:
        self._send("end", sealed)


def give(gid: int, me: int, pid: int, to: int) -> bool:
    """Ask place 0 to send piece ``pid`` (this place's) to ``to``."""
    result: bool = immediate_at(0, _call, gid, "give", me, pid, to)
    return result
