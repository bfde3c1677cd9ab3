"""What each place keeps of the distributed arrays, and the tasks that run there.

Every place holds, per array id, an :class:`Entry`: the array's current layout
and the place's block (None at a home that holds no rows). The layout is
copied to every place of the layout and to the home, and only a
redistribution changes it, at all of them in one ``finish``; so a handle,
wherever it was sent, finds the current layout at its place (or at the home).

A redistribution runs in three ``finish`` blocks: in the first every place
concerned *freezes* its entry (writes through ``BlockArray.writing`` wait from
then until the swap, and those under way end first: a task no finish waits
for may write while an order re-spreads the array); in the second every old
owner pushes the slices of its block to their new owners (in messages of at
most about :data:`CHUNK_BYTES`), which assemble them in a staging buffer
(nobody's current block changes, so the pushes can run in any order); in the
third every place swaps its staging buffer in.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas import lowlevel

from ._layout import Layout, find, overlaps

__all__ = ["Entry", "ArrayId", "entry", "each", "install", "adopt", "make_zeros", "rows_of",
           "push", "receive", "commit", "drop", "stage", "unstage", "padded", "send_rows",
           "partial_sum", "partial_dot", "save", "forget", "push_copy", "ReSpread", "freeze",
           "thaw", "lend", "HOLD_TIMEOUT_S"]

ArrayId = tuple[int, int]  # (home place id, serial number at the home)
Array = npt.NDArray[Any]


class Entry:
    """One place's part of one array; ``broken``, at the home of a followed array,
    says why the array cannot be used any more (a place holding rows was lost);
    ``padded``, once ``halo(width, copy=False)`` was called here, the buffer whose
    middle rows are ``block`` (``width`` spare rows above and below it);
    ``writers``, the writes under way through :func:`lend`; ``moving``, set while a
    redistribution moves the block (from its freeze to its swap)."""

    __slots__ = ("layout", "block", "broken", "padded", "writers", "moving")

    def __init__(self, layout: Layout, block: Array | None) -> None:
        self.layout = layout
        self.block = block
        self.broken: str | None = None
        self.padded: Array | None = None
        self.writers = 0
        self.moving = False


_entries: dict[ArrayId, Entry] = {}
_staging: dict[ArrayId, Array] = {}  # blocks being assembled by a redistribution
_lock = threading.Lock()
#: notified when an entry is swapped, dropped or thawed, and when its last writer is done
_moved = threading.Condition(_lock)
#: a redistribution waits at most this long for the writes under way at a place, and a
#: write at most this long for a redistribution there; then it fails (never a hang)
HOLD_TIMEOUT_S = 30.0


def entry(aid: ArrayId) -> Entry | None:
    """This place's entry for ``aid``, None if it keeps nothing of that array."""
    return _entries.get(aid)


def _own(piece: Array) -> Array:
    """``piece`` as a block this place may write: a received array may sit read-only
    in its message's frame (sent out of band), then it is copied once."""
    if piece.flags.writeable and piece.flags.c_contiguous:
        return piece
    return np.array(piece, order="C")


def install(aid: ArrayId, layout: Layout, block: Array | None) -> None:
    with _lock:
        _entries[aid] = Entry(layout, block)


def adopt(aid: ArrayId, layout: Layout, piece: Array) -> None:
    """Keep ``piece``, sent by the home, as this place's block."""
    install(aid, layout, _own(piece))


def make_zeros(aid: ArrayId, layout: Layout, tail: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    block = find(layout, apgas.here().id)
    rows = 0 if block is None else block[2] - block[1]
    install(aid, layout, np.zeros((rows, *tail), dtype))


def rows_of(aid: ArrayId, lo: int, hi: int) -> Array:
    """Global rows ``[lo, hi)`` of this place's block (a view; it is pickled if it travels)."""
    me = apgas.here().id
    e = _entries.get(aid)
    mine = None if e is None else find(e.layout, me)
    if e is None or mine is None or e.block is None or not mine[1] <= lo <= hi <= mine[2]:
        raise ReSpread(aid, me, f"rows {lo}:{hi} asked of a place that no longer holds them")
    return e.block[lo - mine[1]:hi - mine[1]]


# -- redistribution -------------------------------------------------------------
#: the rows of a piece travel in messages of about this many bytes (at least one row):
#: far below the transport's ``max_message_bytes`` (256 MiB by default), and small
#: enough that the sender's hashing, the wire, and the receiver's checking and copying
#: of successive messages overlap instead of following each other
CHUNK_BYTES = 4 << 20


def push(aid: ArrayId, new: Layout) -> None:
    """Phase one at an old owner: send each piece of its block to its new owner, in
    messages of about :data:`CHUNK_BYTES`; then copy the rows it keeps, if any, while
    the others travel."""
    e = _entries[aid]
    mine = find(e.layout, apgas.here().id)
    if mine is None or e.block is None:
        return
    _push_rows(aid, e.block, mine[1], new, share=True)


def _rows_per_message(block: Array) -> int:
    row_bytes = block.itemsize * math.prod(block.shape[1:])
    return max(1, CHUNK_BYTES // row_bytes) if row_bytes else max(1, len(block))


def _push_rows(aid: ArrayId, block: Array, start: int, new: Layout, share: bool) -> None:
    """Send the global rows ``start .. start + len(block)``, held in ``block``, to their
    owners in ``new`` (staging buffers); ``share``: a block that stays whole is staged
    itself, not copied."""
    me = apgas.here().id
    stop = start + len(block)
    step = _rows_per_message(block)
    kept = None
    for pid, first, last, nstart, nstop in overlaps(start, stop, new):
        if pid == me:
            kept = first, last, nstart, nstop
            continue
        for lo in range(first, last, step):
            hi = min(last, lo + step)
            apgas.async_at(pid, receive, aid, nstop - nstart, lo - nstart,
                           block[lo - start:hi - start])
    if kept is None:
        return
    first, last, nstart, nstop = kept
    if share and (first, last) == (start, stop) == (nstart, nstop):
        with _lock:
            _staging[aid] = block  # the same rows stay: no copy
    else:
        receive(aid, nstop - nstart, first - nstart, block[first - start:last - start])


def receive(aid: ArrayId, rows: int, offset: int, piece: Array) -> None:
    """Rows of a piece into this place's staging buffer of ``aid`` (made on the first piece
    with ``rows`` rows), at ``offset``."""
    with _lock:
        buf = _staging.get(aid)
        if buf is None:
            buf = _staging[aid] = np.empty((rows, *piece.shape[1:]), piece.dtype)
    buf[offset:offset + len(piece)] = piece  # pieces never overlap: outside the lock


def commit(aid: ArrayId, new: Layout, home: int, tail: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """Last phase: the assembled block becomes current; a place left out drops its block.
    Writes that waited for the move go on with the new entry (or find none)."""
    me = apgas.here().id
    with _lock:
        staged = _staging.pop(aid, None)
        if find(new, me) is not None:
            _entries[aid] = Entry(new, staged if staged is not None else np.empty((0, *tail), dtype))
        elif me == home:
            _entries[aid] = Entry(new, None)
        else:
            _entries.pop(aid, None)
        _moved.notify_all()


def drop(aid: ArrayId) -> None:
    with _lock:
        _entries.pop(aid, None)
        _staging.pop(aid, None)
        _moved.notify_all()
    forget(aid, None)


# -- writes that no finish waits for (BlockArray.writing) ---------------------------------
def freeze(aid: ArrayId) -> None:
    """First phase of a redistribution at a place: new writes wait for the swap, and
    the writes under way end first, so none lands in a block already sent. ApgasError
    (and the entry thawed) if they take more than :data:`HOLD_TIMEOUT_S`."""
    with lowlevel.blocking(), _moved:
        e = _entries.get(aid)
        if e is None:
            return
        e.moving = True
        _moved.notify_all()
        if not _moved.wait_for(lambda: e.writers == 0, HOLD_TIMEOUT_S):
            e.moving = False
            _moved.notify_all()
            raise apgas.ApgasError(
                f"array {aid} was not re-spread: a task at place {apgas.here().id} has been "
                f"writing it (BlockArray.writing) for more than {HOLD_TIMEOUT_S:g} s; keep "
                "each writing() block short")


def thaw(aid: ArrayId) -> None:
    """Undo :func:`freeze` at a place (a redistribution that failed before its swap)."""
    with _moved:
        e = _entries.get(aid)
        if e is not None and e.moving:
            e.moving = False
            _moved.notify_all()


def _settled(aid: ArrayId) -> bool:
    e = _entries.get(aid)
    return e is None or not e.moving


def _writer(aid: ArrayId) -> Entry | None:
    """This place's entry of ``aid`` once no redistribution moves it, counted as one
    more writer (None: no entry)."""
    with _moved:
        if _settled(aid):
            return _count_writer(aid)
    with lowlevel.blocking(), _moved:  # a spare thread may start: not under the lock
        if not _moved.wait_for(lambda: _settled(aid), HOLD_TIMEOUT_S):
            raise ReSpread(aid, apgas.here().id, f"a write waited {HOLD_TIMEOUT_S:g} s for a "
                                                 "re-spread that did not end")
        return _count_writer(aid)


def _count_writer(aid: ArrayId) -> Entry | None:  # holds _lock
    e = _entries.get(aid)
    if e is not None:
        e.writers += 1
    return e


def _done_writing(e: Entry) -> None:
    with _moved:
        e.writers -= 1
        if not e.writers:
            _moved.notify_all()


@contextlib.contextmanager
def lend(aid: ArrayId, lo: int, hi: int) -> Iterator[Array]:
    """The global rows ``[lo, hi)`` of this place's block (a view), which no
    redistribution moves until the ``with`` ends; ReSpread if they are not here."""
    me = apgas.here().id
    e = _writer(aid)
    try:
        mine = None if e is None else find(e.layout, me)
        if e is None or e.block is None or mine is None or not mine[1] <= lo <= hi <= mine[2]:
            held = "none" if mine is None else f"{mine[1]}:{mine[2]}"
            raise ReSpread(aid, me, f"writing rows {lo}:{hi}, which are not at this place, "
                                    f"holding rows {held}; send the write to their owner in "
                                    "the array's layout now")
        yield e.block[lo - mine[1]:hi - mine[1]]
    finally:
        if e is not None:
            _done_writing(e)


def stage(aid: ArrayId, block: Array) -> None:
    """Stage ``block``, whole, as this place's next block of ``aid`` (a commit read from disk)."""
    with _lock:
        _staging[aid] = block


def unstage(aid: ArrayId) -> None:
    """Drop a staging buffer left by a redistribution or restore that a loss cut short."""
    with _lock:
        _staging.pop(aid, None)


# -- copies for roll-back (resilient arrays, apgas.steps) ------------------------------
#: (array, commit tag) -> this place's own block as it was at that commit
_saved: dict[tuple[ArrayId, int], Array] = {}
#: (array, commit tag, owner) -> the block of ``owner`` at that commit, kept here as its buddy
_copies: dict[tuple[ArrayId, int, int], Array] = {}


def save(aid: ArrayId, tag: int, buddy: int | None) -> None:
    """At an owner, for commit ``tag``: keep a copy of its block, and send one to
    ``buddy`` (None: nobody, the block is place 0's) in messages of about
    :data:`CHUNK_BYTES`. The copy sent is the one kept, which nothing writes."""
    me = apgas.here().id
    e = _entries.get(aid)
    if e is None or e.block is None:
        raise ReSpread(aid, me, "save")
    copy = np.array(e.block, order="C")
    with _lock:
        _saved[(aid, tag)] = copy
    if buddy is None or not len(copy):
        return
    step = _rows_per_message(copy)
    for lo in range(0, len(copy), step):
        apgas.async_at(buddy, _keep, aid, tag, me, len(copy), lo, copy[lo:lo + step])


def _keep(aid: ArrayId, tag: int, owner: int, rows: int, offset: int, piece: Array) -> None:
    key = (aid, tag, owner)
    with _lock:
        buf = _copies.get(key)
        if buf is None:
            buf = _copies[key] = np.empty((rows, *piece.shape[1:]), piece.dtype)
    buf[offset:offset + len(piece)] = piece  # pieces never overlap: outside the lock


def forget(aid: ArrayId, keep: int | None) -> None:
    """Drop this place's copies of ``aid`` but those of commit ``keep``."""
    with _lock:
        for k in [k for k in _saved if k[0] == aid and k[1] != keep]:
            del _saved[k]
        for c in [c for c in _copies if c[0] == aid and c[1] != keep]:
            del _copies[c]


def push_copy(aid: ArrayId, tag: int, owner: int, start: int, new: Layout) -> None:
    """Restore, phase one: send the rows that ``owner`` held at commit ``tag``, from
    ``start`` on (this place's own copy, or the one it keeps as ``owner``'s buddy), to
    their owners in ``new``. The copies stay, for a loss during the restore."""
    me = apgas.here().id
    with _lock:
        copy = _saved.get((aid, tag)) if owner == me else _copies.get((aid, tag, owner))
    if copy is None:
        raise apgas.ApgasError(f"place {me} has no copy of the rows of place {owner} of array "
                               f"{aid} at commit {tag}")
    _push_rows(aid, copy, start, new, share=False)


class ReSpread(apgas.ApgasError):
    """A task used a block that an order re-spread (or a restore replaced) under it."""

    def __init__(self, aid: ArrayId, place: int, what: str) -> None:
        super().__init__(
            f"array {aid} was re-spread over the places by an order while a task at place "
            f"{place} used it ({what}); its result would be wrong. Run the iterations as "
            "steps (for step in apgas.steps(...): with step: ...), where orders wait for "
            "the step's end, or keep to one top-level finish per use of the array")

    def __reduce__(self) -> tuple[Any, ...]:
        return (apgas.ApgasError, (str(self),))


# -- halos -------------------------------------------------------------------------
def padded(aid: ArrayId, width: int) -> Array:
    """This place's block inside a buffer with ``width`` spare rows above and below it
    (made on first use, and again after a redistribution or for another width: one copy
    of the block, which then lives in the buffer's middle rows)."""
    with _lock:
        e = _entries[aid]
        block = e.block
        assert block is not None
        buf = e.padded
        if buf is None or block.base is not buf or len(buf) != len(block) + 2 * width:
            buf = np.zeros((len(block) + 2 * width, *block.shape[1:]), block.dtype)
            buf[width:width + len(block)] = block
            e.padded = buf
            e.block = buf[width:width + len(block)]
        return buf


def send_rows(aid: ArrayId, lo: int, hi: int, dest: int, offset: int) -> None:
    """At an owner: send global rows ``[lo, hi)`` of its block to ``dest``'s padded
    buffer of ``aid``, at ``offset`` (one message; the rows travel out of band)."""
    apgas.async_at(dest, _put_rows, aid, offset, rows_of(aid, lo, hi))


def _put_rows(aid: ArrayId, offset: int, rows: Array) -> None:
    e = _entries.get(aid)
    buf = None if e is None else e.padded
    if buf is None or offset + len(rows) > len(buf):
        raise ReSpread(aid, apgas.here().id, "halo rows arrived for a block that was replaced")
    buf[offset:offset + len(rows)] = rows


# -- reductions -------------------------------------------------------------------
def _block(aid: ArrayId) -> Array:
    e = _entries.get(aid)
    if e is None or e.block is None:
        raise ReSpread(aid, apgas.here().id, "its block is no longer here")
    return e.block


def partial_sum(aid: ArrayId) -> Any:
    return np.sum(_block(aid))


def partial_dot(aid: ArrayId, bid: ArrayId) -> Any:
    return np.dot(_block(aid).ravel(), _block(bid).ravel())


def whole(aid: ArrayId) -> Array:
    return _block(aid)


# -- running one function at many places --------------------------------------------
def each(place_ids: Sequence[int], fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``[fn(*args) at p for p in place_ids]``, run in parallel, in the order of ``place_ids``."""
    results: dict[int, Any] = {}
    ref = apgas.GlobalRef(results)
    try:
        with apgas.finish():
            for i, pid in enumerate(place_ids):
                apgas.async_at(pid, _call_and_reply, ref, i, fn, args)
    finally:
        ref.free()
    return [results[i] for i in range(len(place_ids))]


def _call_and_reply(ref: apgas.GlobalRef[dict[int, Any]], i: int, fn: Callable[..., Any],
                    args: tuple[Any, ...]) -> None:
    value = fn(*args)
    if apgas.here() == ref.home:
        ref.get()[i] = value
    else:
        apgas.async_at(ref.home, _store, ref, i, value)


def _store(ref: apgas.GlobalRef[dict[int, Any]], i: int, value: Any) -> None:
    ref.get()[i] = value
