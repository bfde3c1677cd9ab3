"""GLB checkpoints: place 0's store of copies, written to disk, so that a run
survives the loss of place 0 itself (``GLBConfig(checkpoint=DIR)``).

The store of resilient GLB (:mod:`glb._resilience`) already holds, at place
0, every other worker's bag as of its last backup, every piece of work on its
way, and the results of ended workers; restoring all of it at live places is
what a loss of those places does. A snapshot is that store plus place 0's own
share (its workers' bags, its result), copied while place 0's workers stand
at a safe point (between two ``process`` calls, never halfway through a
split or a merge: they hold place 0's :class:`apgas.lowlevel.Gate`, the
snapshot passes it as an order). So each unit of work not yet done is in
exactly one bag or piece of the snapshot, and each unit done in exactly one
partial result (the snapshot's result) — the same invariant a restore keeps.
Work done since a bag's last backup is done again after a resume; its result
is in no copy, so nothing counts twice.

On disk, a snapshot is one file, ``glb-<seq>.snapshot``, written whole or not at
all (:func:`apgas.lowlevel.write_atomically`: write, fsync, rename, fsync the
directory) and sealed with its length and SHA-256. The two newest are kept: a
resume falls back on the older when the newer is damaged. A run started on a directory that holds a
snapshot of the same problem (the same fingerprint: the SHA-256 of the pickled
initial bag and neutral result) resumes from the newest whole one, on any
number of places: every bag and piece of the snapshot is handed to the live
places as a lost place's would be. A snapshot of another problem is refused.
When the computation ends, a last snapshot holds its result and no work, so
the same run started again returns the result at once.

Bags, pieces and results must pickle (cloudpickle) to be written, as the bag
contract already asks. The directory must be the user's own and not writable
by others, nor reached through another user's symbolic link (a snapshot is
unpickled when it is read; ``apgas.serving.make_trusted_dir``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle

import apgas
from apgas.lowlevel import DamagedFile, Gate, read_sealed, write_atomically
from apgas.serving import make_trusted_dir

from . import _worker as w
from ._contract import submit
from ._resilience import BAG, STATIC, Blob, Store, _Piece, _Static

__all__ = ["Snapshot", "SnapshotDir", "Checkpointer", "Disk", "fingerprint", "CheckpointStats"]

log = logging.getLogger("glb.checkpoint")

FORMAT = 1
_NAME = re.compile(r"glb-(\d{8})\.snapshot")


def fingerprint(problem: Any) -> str:
    """What identifies a computation's problem: the SHA-256 of its pickled start."""
    return hashlib.sha256(cloudpickle.dumps(problem)).hexdigest()


@dataclasses.dataclass
class Snapshot:
    """One consistent copy of a computation: its work left and its result so far."""

    fingerprint: str
    problem: str                   # for people: the bag's and result's types
    seq: int
    written: float                 # time.time() when it was taken
    pieces: list[tuple[str, bytes]]  # (kind, pickled bag): BAG, LOOT or STATIC
    result: bytes                  # the pickled partial result of all the work done
    final: bool = False            # the computation ended: no work is left
    format: int = FORMAT


@dataclasses.dataclass
class CheckpointStats:
    """What the checkpoints of one computation cost (place 0's view)."""

    written: int = 0            # snapshots written
    last_bytes: int = 0         # the size of the last one
    pause_s: float = 0.0        # place 0's workers held at a safe point, in all
    write_s: float = 0.0        # pickling and writing, in all (the workers run meanwhile)
    resumed_from: int | None = None  # the sequence number a run resumed from
    resume_s: float = 0.0       # reading that snapshot and handing its work out
    #: the work that snapshot had done (its result and its bags' partial results), which
    #: a throughput of this run leaves out (None without a resume)
    resumed_result: Any = dataclasses.field(default=None, repr=False)


class SnapshotDir:
    """The snapshots of one computation in a directory of the user's own."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = make_trusted_dir(path, "the GLB checkpoint directory")
        for entry in os.scandir(self.path):  # a write a crash cut short
            if entry.name.startswith(".glb-") and entry.name.endswith(".tmp"):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        for entry in os.scandir(self.path):
            m = _NAME.fullmatch(entry.name)
            if m:
                found.append((int(m.group(1)), Path(entry.path)))
        return sorted(found)

    def load(self, expected: str, problem: str) -> Snapshot | None:
        """The newest whole snapshot, or None when there is none. A torn or damaged
        one is skipped (the previous one serves); one of another problem is refused."""
        for _, path in reversed(self._files()):
            try:
                snap = pickle.loads(read_sealed(path))
            except (DamagedFile, OSError, pickle.UnpicklingError, EOFError) as e:
                log.warning("GLB checkpoint: %s is not whole, not used: %s", path, e)
                continue
            if not isinstance(snap, Snapshot) or snap.format != FORMAT:
                raise apgas.ApgasError(f"{path} is not a GLB snapshot this version reads")
            if snap.fingerprint != expected:
                raise apgas.ApgasError(
                    f"the GLB checkpoint directory {self.path} holds a snapshot of another "
                    f"problem ({snap.problem}, fingerprint {snap.fingerprint[:12]}), not of this "
                    f"one ({problem}, fingerprint {expected[:12]}); give another directory, or "
                    "remove it to start afresh")
            return snap
        return None

    def write(self, snap: Snapshot) -> int:
        """Write ``snap`` whole, then remove all but it and the one before (which a
        resume falls back on if this one is damaged later); returns its size."""
        data = pickle.dumps(snap, protocol=pickle.HIGHEST_PROTOCOL)
        write_atomically(self.path / f"glb-{snap.seq:08d}.snapshot", data)
        for seq, path in self._files()[:-2]:
            if seq < snap.seq:
                try:
                    path.unlink()
                except OSError:
                    pass
        return len(data)

    def next_seq(self) -> int:
        files = self._files()
        return files[-1][0] + 1 if files else 1


class Checkpointer:
    """Takes a snapshot every ``interval`` seconds, in a thread of place 0."""

    def __init__(self, directory: SnapshotDir, interval: float, store: Store, pause: Gate,
                 place0: Callable[[], tuple[list[Any], set[int], Any]], prototype: Any,
                 fingerprint: str, problem: str) -> None:
        """``place0()``: place 0's share, read while its workers stand: the bags they
        hold, the ids of the pieces they merged since (still in the store), and the
        place's result."""
        self.directory = directory
        self.interval = interval
        self.store = store
        self.pause = pause
        self.place0 = place0
        self.prototype = prototype
        self.fingerprint = fingerprint
        self.problem = problem
        self.seq = directory.next_seq()
        self.stats = CheckpointStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one snapshot at a time

    def start(self) -> Checkpointer:
        self._thread = threading.Thread(target=self._run, name="glb-checkpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.take()
            except Exception:  # noqa: BLE001 - a failed snapshot keeps the previous one
                log.exception("GLB checkpoint: a snapshot could not be written; the previous "
                              "one stays")

    def take(self) -> None:
        """Copy the computation at a safe point, then write it (the workers go on)."""
        with self._lock:
            t0 = time.perf_counter()
            pieces, result = self._capture()
            t1 = time.perf_counter()
            self._write(pieces, result, final=False)
            self.stats.pause_s += t1 - t0
            self.stats.write_s += time.perf_counter() - t1

    def final(self, result: Any) -> None:
        """The computation ended with ``result``: the last snapshot holds it, no work."""
        self._stop.set()
        with self._lock:
            self._write([], cloudpickle.dumps(result), final=True)

    def _capture(self) -> tuple[list[tuple[str, bytes]], bytes]:
        store = self.store
        with self.pause.order():
            bags, merged, place_result = self.place0()
            with store.lock:
                records = list(store.records.values())
                pieces = [(p.kind, p.bag) for pid, p in store.pieces.items() if pid not in merged]
                results = [place_result, store.restored_result, *store.done.values()]
                out: list[tuple[str, bytes]] = [
                    (STATIC if isinstance(r, _Static) else BAG, _pickled(r)) for r in records]
                out += [(kind, _pickled(bag)) for kind, bag in pieces]
                out += [(BAG, _pickled(bag)) for bag in bags]
                total = cloudpickle.loads(cloudpickle.dumps(self.prototype))
                for r in results:
                    total.fold(cloudpickle.loads(cloudpickle.dumps(r)))
                result = cloudpickle.dumps(total)
        return out, result

    def _write(self, pieces: list[tuple[str, bytes]], result: bytes, final: bool) -> None:
        snap = Snapshot(self.fingerprint, self.problem, self.seq, time.time(), pieces, result,
                        final)
        self.stats.last_bytes = self.directory.write(snap)
        self.stats.written += 1
        self.seq += 1


def _pickled(value: Any) -> bytes:
    """A bag as bytes: a store's Blob is pickled already; place 0's objects are pickled now."""
    return bytes(value) if isinstance(value, bytes) else cloudpickle.dumps(value)


class Disk:
    """One computation's checkpoints, from the driver's side (``glb._glb``): the
    snapshot it resumes from, the thread that writes new ones, the last one."""

    def __init__(self, config: Any, problem: Any, prototype: Any) -> None:
        self.config = config
        self.directory = SnapshotDir(config.checkpoint)
        self.problem = (f"{getattr(problem, '__qualname__', type(problem).__qualname__)} -> "
                        f"{type(prototype).__qualname__}")
        self.fingerprint = fingerprint((problem, prototype))
        self.prototype = prototype
        self.stats = CheckpointStats()
        t0 = time.perf_counter()
        self.snapshot = self.directory.load(self.fingerprint, self.problem)
        if self.snapshot is not None:
            self.stats.resumed_from = self.snapshot.seq
            self.stats.resumed_result = self._done_before(prototype)
            self.stats.resume_s = time.perf_counter() - t0
            log.info("GLB checkpoint: resuming from snapshot %d in %s (%d bags and pieces)",
                     self.snapshot.seq, self.directory.path, len(self.snapshot.pieces))
        self.checkpointer: Checkpointer | None = None

    def _done_before(self, prototype: Any) -> Any:
        """The work the snapshot had done: its result, and the partial results its bags
        still hold (a bag may count as it goes, and submit only at its end)."""
        assert self.snapshot is not None
        total = self.result(prototype)
        for kind, data in self.snapshot.pieces:
            if kind != STATIC:  # a static share not yet made: nothing done
                submit(cloudpickle.loads(data), total)
        return total

    def result(self, prototype: Any) -> Any:
        """The result of the snapshot's finished work, folded into a copy of ``prototype``."""
        assert self.snapshot is not None
        total = cloudpickle.loads(cloudpickle.dumps(prototype))
        total.fold(cloudpickle.loads(self.snapshot.result))
        return total

    def resume_into(self, store: Store) -> Callable[[int, list[int]], list[Any]]:
        """Put the snapshot's work into ``store`` as orphans and its result into the
        store's result; returns the computation's ``starts``: hand the orphans out."""
        assert self.snapshot is not None
        t0 = time.perf_counter()
        with store.lock:
            for kind, data in self.snapshot.pieces:
                store.pieces[next(store._ids)] = _Piece(None, kind, Blob(data))
            store.restored_result.fold(cloudpickle.loads(self.snapshot.result))
        self.stats.resume_s += time.perf_counter() - t0

        def starts(gid: int, members: list[int]) -> list[Any]:
            store.dispatch()  # inside the computation's finish: counted tasks
            return []
        return starts

    def start(self, gid: int, store: Store) -> None:
        pause = w.state(gid).pause
        assert pause is not None, "place 0 has a pause when it checkpoints"
        self.checkpointer = Checkpointer(self.directory, self.config.checkpoint_interval, store,
                                         pause, lambda: w.checkpoint_share(gid), self.prototype,
                                         self.fingerprint, self.problem).start()
        self.checkpointer.stats = self.stats

    def final(self, total: Any) -> None:
        if self.checkpointer is not None:
            self.checkpointer.final(total)

    def stop(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.stop()
