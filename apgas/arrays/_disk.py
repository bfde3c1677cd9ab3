"""Commits of BlockArrays on disk, for ``apgas.steps(..., checkpoint=DIR)``: block files.

:mod:`apgas._malleability.checkpoint_steps` keeps the directory (the temporary folder of a
commit, its manifest, the renames and fsyncs); this module writes and reads the
rows of one array. A block file holds the global rows ``start .. stop`` of one
array in C order, raw, as the places held them at the commit: one file per
block of the layout then, named ``a{k}.{start}-{stop}.bin`` (``k``: the array's
position in the loop's ``arrays``). Its rows are checksummed in chunks of
``chunk_rows`` rows (about :data:`CHUNK_BYTES`), CRC-32 each, so that a place
that reads some rows of a file checks every chunk it reads, and every chunk of
every file is read, and checked, by some place at a resume.

Two ways, the same files:

- ``parallel``: each place writes its own block's file, and at a resume each
  place reads the rows of its new block from the files that hold them. All
  places must see DIR: on a cluster, a filesystem they share.
- ``gathered``: the owners send their rows to place 0 (in chunks, as a
  redistribution sends them), which writes every file; at a resume place 0 reads
  them and sends each place its rows. DIR need only be place 0's.

``APGAS_TEST_CHECKPOINT_DELAY`` (seconds; a test hook, never for production)
sleeps after the first chunk of each block file is written, so that a test can
kill a program in the middle of a commit.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

import apgas
from apgas._malleability.checkpoint_steps import TornCommit, test_delay

from . import _blocks
from ._layout import even, find, overlaps

if TYPE_CHECKING:
    from . import BlockArray

__all__ = ["CHUNK_BYTES", "write", "read"]

#: rows are checksummed, and sent in ``gathered`` mode, in chunks of about this many bytes
CHUNK_BYTES = 8 << 20

Array = np.ndarray[Any, Any]


def chunk_rows(tail: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    row = dtype.itemsize * math.prod(tail)
    return max(1, CHUNK_BYTES // row) if row else 1 << 30


def _bytes(piece: Array) -> memoryview:
    return np.ascontiguousarray(piece).reshape(-1).view(np.uint8).data


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def _file_entry(k: int, start: int, stop: int, nbytes: int, rows: int, crcs: list[int]) -> dict[str, Any]:
    return {"name": f"a{k}.{start}-{stop}.bin", "start": start, "stop": stop, "size": nbytes,
            "chunk_rows": rows, "crc32": crcs}


# -- writing ------------------------------------------------------------------------------
def write(a: BlockArray, folder: str, k: int, mode: str) -> list[dict[str, Any]]:
    """At place 0: the current rows of ``a`` into block files in ``folder`` (fsynced);
    their manifest entries, in row order."""
    held = [(pid, start, stop) for pid, start, stop in a.layout if stop > start]
    if mode == "parallel":
        entries = _blocks.each([b[0] for b in held], write_block_at, a.id, folder, k)
        for e in entries:
            _check_shared(folder, e, held)
        return entries
    sink = _Sink(folder)
    ref = apgas.GlobalRef(sink)
    try:
        with apgas.finish():
            for pid, _, _ in held:
                apgas.async_at(pid, send_block_at, a.id, ref, k)
    finally:
        ref.free()
    return sink.close()


def _mine(aid: _blocks.ArrayId) -> tuple[Array, int, int]:
    me = apgas.here().id
    e = _blocks.entry(aid)
    mine = None if e is None else find(e.layout, me)
    if e is None or e.block is None or mine is None:
        raise _blocks.ReSpread(aid, me, "its commit to disk")
    return e.block, mine[1], mine[2]


def write_block_at(aid: _blocks.ArrayId, folder: str, k: int) -> dict[str, Any]:
    """At an owner (``parallel``): its block into its file, fsynced; the file's entry."""
    block, start, stop = _mine(aid)
    rows = chunk_rows(block.shape[1:], block.dtype)
    entry = _file_entry(k, start, stop, block.nbytes, rows, [])
    fd = os.open(os.path.join(folder, entry["name"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        offset = 0
        for lo in range(0, len(block), rows):
            data = _bytes(block[lo:lo + rows])
            entry["crc32"].append(zlib.crc32(data))
            _write_all(fd, data, offset)
            offset += len(data)
            if lo == 0:
                test_delay()
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def _check_shared(folder: str, entry: dict[str, Any], held: list[tuple[int, int, int]]) -> None:
    """At place 0, after a ``parallel`` write: the file is there, whole."""
    path = os.path.join(folder, entry["name"])
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = -1
    if size != entry["size"]:
        owner = next(pid for pid, start, _ in held if start == entry["start"])
        raise apgas.ApgasError(
            f"place {owner} wrote {path} ({entry['size']} bytes), and place 0 sees "
            f"{'no such file' if size < 0 else f'{size} bytes'}: with checkpoint_mode='parallel' "
            "every place writes its blocks into the checkpoint directory, which must be on a "
            "filesystem all places share; use checkpoint_mode='gathered' otherwise")


class _Sink:
    """At place 0 (``gathered``): the block files, written as their chunks arrive."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.files: dict[str, tuple[int, dict[str, Any]]] = {}  # name -> (fd, entry)
        self.lock = threading.Lock()

    def put(self, entry: dict[str, Any], index: int, offset: int, data: memoryview) -> None:
        with self.lock:
            if entry["name"] not in self.files:
                fd = os.open(os.path.join(self.folder, entry["name"]),
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                self.files[entry["name"]] = fd, entry
            fd, kept = self.files[entry["name"]]
        kept["crc32"][index] = zlib.crc32(data)
        _write_all(fd, data, offset)
        if index == 0:
            test_delay()

    def close(self) -> list[dict[str, Any]]:
        entries = []
        try:
            for fd, entry in self.files.values():
                os.fsync(fd)
                entries.append(entry)
        finally:
            for fd, _ in self.files.values():
                os.close(fd)
        return sorted(entries, key=lambda e: e["start"])


def send_block_at(aid: _blocks.ArrayId, ref: apgas.GlobalRef[_Sink], k: int) -> None:
    """At an owner (``gathered``): its block to place 0's sink, in chunks."""
    block, start, stop = _mine(aid)
    rows = chunk_rows(block.shape[1:], block.dtype)
    count = -(-len(block) // rows)
    entry = _file_entry(k, start, stop, block.nbytes, rows, [0] * count)
    row_bytes = block.nbytes // len(block)
    for index in range(count):
        piece = block[index * rows:(index + 1) * rows]
        if apgas.here() == ref.home:
            ref.get().put(entry, index, index * rows * row_bytes, _bytes(piece))
        else:
            apgas.async_at(ref.home, _put, ref, entry, index, index * rows * row_bytes, piece)


def _put(ref: apgas.GlobalRef[_Sink], entry: dict[str, Any], index: int, offset: int,
         piece: Array) -> None:
    ref.get().put(entry, index, offset, _bytes(piece))


# -- reading ------------------------------------------------------------------------------
def read(a: BlockArray, folder: str, files: list[dict[str, Any]], mode: str) -> None:
    """At place 0: the rows of ``a`` from the block files of a commit in ``folder``, spread
    evenly over the live places. :class:`TornCommit` if a file is missing, short or fails
    its checksums; the array is left as it was then."""
    _check_files(a, folder, files)
    live = [p.id for p in apgas.places()]
    new = even(a.shape[0], live)
    _everywhere(live, _blocks.unstage, a.id)
    try:
        with apgas.finish():
            if mode == "parallel":
                for pid, start, stop in new:
                    if stop > start:
                        apgas.async_at(pid, load_block_at, a.id, folder, files, start, stop,
                                       a.shape[1:], a.dtype)
            else:
                for f in files:
                    for lo, hi, rows in _chunks(folder, f, a.shape[1:], a.dtype, 0, a.shape[0]):
                        for pid, first, last, nstart, nstop in overlaps(lo, hi, new):
                            apgas.async_at(pid, _blocks.receive, a.id, nstop - nstart,
                                           first - nstart, rows[first - lo:last - lo])
    except BaseException:
        try:
            _everywhere(live, _blocks.unstage, a.id)
        except Exception:
            pass  # a place lost meanwhile: the error above says so already
        raise
    _everywhere(list(dict.fromkeys(live + [a.home])), _blocks.commit, a.id, new, a.home,
                a.shape[1:], a.dtype)


def _everywhere(ids: list[int], fn: Any, *args: Any) -> None:
    with apgas.finish():
        for pid in ids:
            apgas.async_at(pid, fn, *args)


def _check_files(a: BlockArray, folder: str, files: list[dict[str, Any]]) -> None:
    """At place 0: the files cover the rows once, in order, and have their sizes."""
    row = a.dtype.itemsize * math.prod(a.shape[1:])
    at = 0
    for f in files:
        path = os.path.join(folder, f["name"])
        if f["start"] != at or f["stop"] <= f["start"] or f["size"] != (f["stop"] - f["start"]) * row:
            raise TornCommit(f"{path}: rows {f['start']}:{f['stop']} ({f['size']} bytes) do not "
                             f"follow row {at} of {a.shape}")
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise TornCommit(f"{path} is missing") from None
        if size != f["size"]:
            raise TornCommit(f"{path} has {size} bytes, not {f['size']}")
        at = f["stop"]
    if at != a.shape[0]:
        raise TornCommit(f"{folder}: the block files end at row {at}, not {a.shape[0]}")


def _chunks(folder: str, f: dict[str, Any], tail: tuple[int, ...], dtype: np.dtype[Any],
            lo: int, hi: int) -> Any:
    """The checked chunks of file ``f`` that hold rows of ``[lo, hi)``: ``(first, last,
    rows)`` with ``rows`` the global rows ``first .. last``."""
    path = os.path.join(folder, f["name"])
    start, stop, per = f["start"], f["stop"], f["chunk_rows"]
    first, last = max(lo, start), min(hi, stop)
    if first >= last:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise apgas.ApgasError(
            f"place {apgas.here().id} does not see {path}, which place 0 sees: with "
            "checkpoint_mode='parallel' every place reads its rows from the checkpoint "
            "directory, which must be on a filesystem all places share; use "
            "checkpoint_mode='gathered' otherwise") from None
    try:
        for index in range((first - start) // per, (last - 1 - start) // per + 1):
            r0, r1 = start + index * per, min(stop, start + (index + 1) * per)
            rows = np.empty((r1 - r0, *tail), dtype)
            data = rows.reshape(-1).view(np.uint8).data
            offset = index * per * (rows.nbytes // max(1, len(rows)))
            got = 0
            while got < len(data):
                done = os.preadv(fd, [data[got:]], offset + got)
                if not done:
                    break
                got += done
            crcs = f["crc32"]
            if got < len(data) or index >= len(crcs) or zlib.crc32(data) != crcs[index]:
                raise TornCommit(f"{path}: rows {r0}:{r1} "
                                 + ("are short" if got < len(data) else "fail their checksum"))
            yield r0, r1, rows
    finally:
        os.close(fd)


def load_block_at(aid: _blocks.ArrayId, folder: str, files: list[dict[str, Any]], start: int,
                  stop: int, tail: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """At a new owner (``parallel``): its rows ``start .. stop`` from the files, staged."""
    out = np.empty((stop - start, *tail), dtype)
    for f in files:
        for lo, hi, rows in _chunks(folder, f, tail, dtype, start, stop):
            first, last = max(lo, start), min(hi, stop)
            out[first - start:last - start] = rows[first - lo:last - lo]
    _blocks.stage(aid, out)
