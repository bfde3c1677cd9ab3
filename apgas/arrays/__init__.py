"""Distributed arrays: the rows of a numpy array spread in blocks over places.

>>> import numpy as np, apgas
>>> from apgas.arrays import BlockArray
>>> def main():
...     a = BlockArray.from_array(np.arange(10.0))   # rows over all places
...     with apgas.finish():
...         for p in apgas.places():
...             apgas.async_at(p, lambda: a.local().__imul__(2))
...     return a.sum()
>>> apgas.run(main, places=4)      # doctest: +SKIP
90.0

A :class:`BlockArray` is a small handle (an id, the global shape and dtype)
that pickles cheaply: send it anywhere with ``apgas.at`` or ``async_at`` and
call its methods there. Each place keeps its block, and the current layout,
in a per-place registry under the array's id; the *home* (the place that made
the array) keeps the layout even when it holds no rows. So a handle never
goes stale: :meth:`BlockArray.redistribute` updates the layout at every place
concerned, and a handle anywhere sees the new one.

Collective calls (:meth:`~BlockArray.redistribute`, :meth:`~BlockArray.free`,
and reading calls that run while another place writes) must not overlap with
others on the same array: order them, for example with ``finish``.

With ``follow=True`` (:meth:`BlockArray.from_array`, :meth:`BlockArray.zeros`)
an array made at place 0 follows the places: on every grow or shrink order (and
``apgas.release_places``) the runtime re-spreads it evenly over the places that
stay, before the leaving ones are removed, and over all live places once new ones
have joined (before the handler's ``post_grow``). See docs/malleability.md,
"Arrays that follow the places". A task that no finish waits for
(``uncounted_async_at``) writes such an array through
:meth:`BlockArray.writing`, which a re-spread waits for; its ``local()`` raises.

:func:`exact_sum` adds elements, or rows (vectors), exactly: the same bits on
any layout.

This is the only part of ``apgas`` that needs numpy; ``import apgas`` does not
import it.

Why one module of about 580 lines: it is the face of one class,
:class:`BlockArray`, whose methods share the per-place registry and the
re-spread's guard of writes; the blocks, the layout, the disk, roll-backs and
exact sums are modules of their own already.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas import lowlevel
from apgas._core import runtime as _runtime
from apgas._core.pool import on_pool_thread

from . import _blocks, _disk, _exact, _rollback
from ._layout import Layout, even, find, overlaps

__all__ = ["BlockArray", "dot", "exact_sum", "at_each"]

_serial = itertools.count(1)
_serial_lock = threading.Lock()


def _new_id() -> tuple[int, int]:
    with _serial_lock:
        return apgas.here().id, next(_serial)


def _place_ids(places: Sequence[apgas.Place | int] | None) -> list[int]:
    """Ids of ``places`` (default: the live places), checked live, distinct, not empty."""
    if places is None:
        return [p.id for p in apgas.places()]
    if isinstance(places, (apgas.Place, int)):
        raise TypeError(f"places must be a list of places, got {places!r}")
    ids = [apgas.place(p.id if isinstance(p, apgas.Place) else p).id for p in places]
    if not ids:
        raise ValueError("places is empty: an array needs at least one place")
    if len(set(ids)) != len(ids):
        raise ValueError(f"places lists a place twice: {ids}")
    return ids


def _check_dtype(dtype: np.dtype[Any]) -> None:
    if dtype.hasobject:
        raise TypeError(f"dtype {dtype} holds Python objects; a BlockArray holds plain numbers "
                        f"(send the objects with apgas.at instead)")


def _drop_where_alive(aid: tuple[int, int], ids: list[int]) -> None:
    """Undo a half-made array (a place died while it was made): drop what was kept."""
    _blocks.drop(aid)
    live = {p.id for p in apgas.places()}
    try:
        with apgas.finish():
            for pid in ids:
                if pid in live:
                    apgas.async_at(pid, _blocks.drop, aid)
    except apgas.MultipleException:
        pass  # another place died meanwhile: nothing of the array is left there anyway


def _layout_at_home(aid: tuple[int, int]) -> Layout:
    e = _blocks.entry(aid)
    if e is None:
        raise ValueError(f"BlockArray {aid} was freed (or its home has no such array)")
    if e.broken is not None:
        raise apgas.ApgasError(e.broken)
    return e.layout


class _Follower:
    """Place 0's resize listener (``apgas.lowlevel.on_resize``): re-spreads the arrays
    made with ``follow=True``, which it holds until they are freed. ``lock`` keeps an
    order's re-spread and the making of a followed array apart."""

    def __init__(self) -> None:
        self.arrays: dict[tuple[int, int], BlockArray] = {}
        self.lock = threading.RLock()

    def before_shrink(self, leaving: list[apgas.Place]) -> None:
        gone = {p.id for p in leaving}
        self._spread([p.id for p in apgas.places() if p.id not in gone])

    def after_grow(self, added: list[apgas.Place]) -> None:
        self._spread([p.id for p in apgas.places()])

    def _spread(self, ids: list[int]) -> None:
        with self.lock:
            for a in list(self.arrays.values()):
                e = _blocks.entry(a.id)
                if e is not None and e.broken is None:
                    a.redistribute(ids)

    def place_lost(self, places: list[apgas.Place]) -> None:
        """Rows held by a lost place are gone (there is no backup): mark the arrays broken."""
        lost = {p.id for p in places}
        with self.lock:
            for a in list(self.arrays.values()):
                e = _blocks.entry(a.id)
                if e is None or e.broken is not None:
                    continue
                held = [(pid, start, stop) for pid, start, stop in e.layout
                        if pid in lost and stop > start]
                if held:
                    e.broken = (f"{a!r} lost rows "
                                + ", ".join(f"{start}:{stop} with place {pid}"
                                            for pid, start, stop in held)
                                + " when the place died; an array keeps copies only when it is "
                                  "made with resilient=True and listed in the arrays of "
                                  "apgas.steps, which rolls it back; this one cannot be used "
                                  "any more: free() it and make it again")


_followers: weakref.WeakKeyDictionary[Any, _Follower] = weakref.WeakKeyDictionary()


def _follower() -> _Follower:
    """This run's follower (one per runtime), registered on first use."""
    rt = _runtime.current()
    f = _followers.get(rt)
    if f is None:
        f = _followers[rt] = _Follower()
        lowlevel.on_resize(f)  # removed with the run's order machinery at its end
    return f


def _check_follow(follow: bool, places: object) -> _Follower | None:
    if not follow:
        return None
    if places is not None:
        raise ValueError("follow=True spreads the array over all live places, and again after "
                         f"each order; do not pass places (got {places!r})")
    me = apgas.here().id
    if me != 0:
        raise apgas.ApgasError(f"follow=True needs the array's home to be place 0, where orders "
                               f"are carried out; this is place {me}: make the array at place 0 "
                               "or redistribute it yourself in the handler")
    return _follower()


def _made(f: _Follower | None, make: Callable[[], BlockArray]) -> BlockArray:
    """``make()``, registered with ``f`` in the same step if the array follows."""
    if f is None:
        return make()
    gate = _runtime.current().gate
    # the gate before the lock: an order holds the gate when it takes the lock to re-spread
    # (a task at place 0 belongs to a computation that holds it already)
    with gate.hold() if not on_pool_thread() else contextlib.nullcontext(), f.lock:
        a = make()
        a.follow = True
        f.arrays[a.id] = a
        gate.guards = len(f.arrays)  # top-level finishes keep orders out from now on
    return a


def _unfollow(aid: tuple[int, int]) -> None:
    rt = _runtime.current()
    f = _followers.get(rt)
    if f is not None:
        with f.lock:
            f.arrays.pop(aid, None)
            rt.gate.guards = len(f.arrays)


def _drop_at_home(aid: tuple[int, int]) -> None:
    _unfollow(aid)
    _blocks.drop(aid)


class BlockArray:
    """A handle on an array whose rows (axis 0) are split in contiguous blocks over places.

    Make one with :meth:`from_array` or :meth:`zeros`, not with the constructor.
    """

    __slots__ = ("id", "shape", "dtype", "resilient", "follow")

    def __init__(self, aid: tuple[int, int], shape: tuple[int, ...], dtype: np.dtype[Any],
                 resilient: bool = False, follow: bool = False) -> None:
        self.id = aid
        self.shape = shape
        self.dtype = dtype
        #: copies are kept at the commits of ``apgas.steps`` (a buddy place holds each block)
        self.resilient = resilient
        #: re-spread by the runtime on every order (made with ``follow=True``)
        self.follow = follow

    # -- making ---------------------------------------------------------------------
    @classmethod
    def from_array(cls, x: npt.NDArray[Any], places: Sequence[apgas.Place | int] | None = None,
                   follow: bool = False, resilient: bool = False) -> BlockArray:
        """Spread the rows of ``x`` in even contiguous blocks over ``places`` (default: the
        live places), in the order given; the first ``len(x) % len(places)`` places get one
        row more. The blocks are copies: ``x`` is not touched afterwards. The calling place
        is the array's home.

        ``follow=True`` (at place 0, without ``places``): the runtime re-spreads the array
        over the live places on every grow and shrink order, until :meth:`free`.

        ``resilient=True``: at every commit of an ``apgas.steps`` loop that lists the
        array, each block is copied at its place and at a buddy place (the next place
        holding rows; place 0's block, which dies only with the program, at its place
        alone), so the loop can roll the array back when a place is lost."""
        f = _check_follow(follow, places)
        return _made(f, lambda: cls._from_array(x, places, resilient))

    @classmethod
    def _from_array(cls, x: npt.NDArray[Any], places: Sequence[apgas.Place | int] | None,
                    resilient: bool) -> BlockArray:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"from_array needs a numpy array, got {type(x).__name__}: {x!r:.80}")
        _check_dtype(x.dtype)
        if x.ndim == 0:
            raise ValueError(f"from_array needs an array with at least one axis, got the scalar {x!r}")
        ids = _place_ids(places)
        a = cls(_new_id(), tuple(x.shape), x.dtype, bool(resilient))
        layout = even(len(x), ids)
        me = apgas.here().id
        if me not in ids:
            _blocks.install(a.id, layout, None)
        try:
            with apgas.finish():
                for pid, start, stop in layout:
                    if pid == me:
                        _blocks.install(a.id, layout, np.array(x[start:stop], order="C"))
                    else:  # contiguous rows travel out of band, uncopied
                        apgas.async_at(pid, _blocks.adopt, a.id, layout,
                                       np.ascontiguousarray(x[start:stop]))
        except BaseException:
            _drop_where_alive(a.id, ids)
            raise
        return a

    @classmethod
    def zeros(cls, shape: int | Sequence[int], dtype: npt.DTypeLike = float,
              places: Sequence[apgas.Place | int] | None = None, follow: bool = False,
              resilient: bool = False) -> BlockArray:
        """An array of zeros, laid out as :meth:`from_array` would; each place makes its
        block. ``follow`` and ``resilient`` as for :meth:`from_array`."""
        f = _check_follow(follow, places)
        return _made(f, lambda: cls._zeros(shape, dtype, places, resilient))

    @classmethod
    def _zeros(cls, shape: int | Sequence[int], dtype: npt.DTypeLike,
               places: Sequence[apgas.Place | int] | None, resilient: bool) -> BlockArray:
        try:
            dims = (operator.index(shape),) if not isinstance(shape, Sequence) else \
                tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
        if not dims or min(dims) < 0:
            raise ValueError(f"shape must be one or more non-negative ints, got {shape!r}")
        kind = np.dtype(dtype)
        _check_dtype(kind)
        ids = _place_ids(places)
        a = cls(_new_id(), dims, kind, bool(resilient))
        layout = even(dims[0], ids)
        if apgas.here().id not in ids:
            _blocks.install(a.id, layout, None)
        try:
            with apgas.finish():
                for pid in ids:
                    apgas.async_at(pid, _blocks.make_zeros, a.id, layout, dims[1:], kind)
        except BaseException:
            _drop_where_alive(a.id, ids)
            raise
        return a

    # -- where things are ---------------------------------------------------------------
    @property
    def home(self) -> int:
        """The id of the place that made the array (it keeps the layout)."""
        return self.id[0]

    @property
    def layout(self) -> Layout:
        """The current ``((place id, start row, stop row), ...)``, in block order.
        ApgasError at the home of a followed array that lost rows with a dead place."""
        e = _blocks.entry(self.id)
        if e is not None:
            if e.broken is not None:
                raise apgas.ApgasError(e.broken)
            return e.layout
        if apgas.here().id == self.home:
            return _layout_at_home(self.id)  # raises: freed
        return apgas.at(self.home, _layout_at_home, self.id)

    def rows(self) -> range:
        """The global rows this place holds (empty at a place that holds none)."""
        e = _blocks.entry(self.id)
        block = None if e is None else find(e.layout, apgas.here().id)
        return range(0) if block is None else range(block[1], block[2])

    def local(self) -> npt.NDArray[Any]:
        """This place's block, shape ``(len(rows()), *shape[1:])``: the block itself, not a
        copy, so writes to it are writes to the array (an empty array where none is held).

        ApgasError for a followed array in a task that no finish waits for
        (``uncounted_async_at``, ``immediate_async_at``): no order waits for such a task,
        so the block could move under it and its writes be lost; use :meth:`writing`."""
        if self.follow and on_pool_thread() and lowlevel.current_finish() is None:
            raise apgas.ApgasError(
                f"{self!r}.local() in a task that no finish waits for (uncounted_async_at, "
                "immediate_async_at): orders do not wait for it, so the array may be re-spread "
                "under it and its writes lost. Write with `with a.writing(rows) as block:`, "
                "which holds the rows at this place, or spawn the task inside a finish")
        e = _blocks.entry(self.id)
        if e is None or e.block is None:
            return np.empty((0, *self.shape[1:]), self.dtype)
        return e.block

    def writing(self, rows: int | slice | range) -> contextlib.AbstractContextManager[npt.NDArray[Any]]:
        """``with a.writing(rows) as block:``: the global ``rows`` (an int: that row
        alone) of this place's block, a writable view, which no order moves until the
        ``with`` ends. The way to write a followed array from a task that no finish
        waits for (``uncounted_async_at``, a thread of its own): a re-spread waits for
        the writes under way, and a write that comes during one waits for its end.

        ApgasError (naming the array) if the rows are not at this place: an order
        re-spread the array since the task was sent, or it was sent to another place
        than the rows' owner. Keep the ``with`` short: a re-spread waits for it (at most
        30 s, then the order fails)."""
        lo, hi = _span(rows, self.shape[0])
        return _blocks.lend(self.id, lo, hi)

    # -- collectives ---------------------------------------------------------------------
    def gather(self) -> npt.NDArray[Any]:
        """The whole array, assembled at the calling place (any place)."""
        held = [b for b in self.layout if b[2] > b[1]]
        blocks = _blocks.each([b[0] for b in held], _blocks.whole, self.id)
        out = np.empty(self.shape, self.dtype)
        for (_, start, stop), block in zip(held, blocks, strict=True):
            out[start:stop] = block
        return out

    def redistribute(self, places: Sequence[apgas.Place | int] | None = None) -> None:
        """Spread the rows evenly over ``places`` (default: the live places), as
        :meth:`from_array` would. Each row moves at most once, straight from its old
        owner to its new one, all owners pushing in parallel; places left out drop their
        blocks. Every handle on the array sees the new layout afterwards."""
        ids = _place_ids(places)
        old = self.layout
        new = even(self.shape[0], ids)
        if new == old:
            return
        involved = list(dict.fromkeys([b[0] for b in old] + ids + [self.home]))
        try:
            _everywhere(involved, _blocks.freeze, self.id)  # writes under way end first
            with apgas.finish():
                for pid, start, stop in old:
                    if stop > start:
                        apgas.async_at(pid, _blocks.push, self.id, new)
        except BaseException:
            _thaw(self.id, involved)
            raise
        _everywhere(involved, _blocks.commit, self.id, new, self.home, self.shape[1:], self.dtype)

    def halo(self, width: int, *, copy: bool = True) -> npt.NDArray[Any]:
        """This place's block with ``width`` rows of the array above and below it, for
        stencils: shape ``(len(rows()) + 2 * width, *shape[1:])``.

        A per-place call: each place that needs its halo calls it (typically in one
        ``finish`` over the places of the layout), and fetches the rows from their
        owners, however many blocks they span. Rows beyond the global top and bottom
        are zeros. The owners must not write those rows meanwhile: exchange halos in one
        ``finish``, update the blocks in the next.

        ``copy=True`` (the default) returns a fresh array. ``copy=False`` is the form
        for iterative solvers, which call it every iteration: the block itself is not
        copied, only the ``2 * width`` neighbour rows travel (one message from each
        owner, all fetched in parallel) into a buffer kept at this place, whose middle
        rows *are* the block. The first such call (and the first after a
        redistribution, or with another width) moves the block into that buffer once,
        so take ``local()`` after ``halo(copy=False)``, not before: an older
        ``local()`` is no longer the block. The result is a view, overwritten by the
        next call; writing its middle rows writes the block."""
        if not isinstance(width, int) or width < 0:
            raise ValueError(f"halo width must be a non-negative int, got {width!r}")
        me = apgas.here().id
        e = _blocks.entry(self.id)
        mine = None if e is None else find(e.layout, me)
        if e is None or mine is None or e.block is None:
            raise ValueError(f"place {me} holds no block of {self!r}; call halo at the places "
                             f"of its layout, {[b[0] for b in self.layout]}")
        _, start, stop = mine
        top = start - width  # global row of out[0]
        edges = ((max(0, top), start), (stop, min(self.shape[0], stop + width)))
        if copy:
            out = np.zeros((stop - start + 2 * width, *self.shape[1:]), self.dtype)
            out[width:width + stop - start] = e.block
            for lo, hi in edges:
                for pid, first, last, _, _ in overlaps(lo, hi, e.layout):
                    out[first - top:last - top] = apgas.at(pid, _blocks.rows_of, self.id, first, last)
            return out
        out = _blocks.padded(self.id, width)
        out[:edges[0][0] - top] = 0  # beyond the global top and bottom
        out[edges[1][1] - top:] = 0
        with apgas.finish():
            for lo, hi in edges:
                for pid, first, last, _, _ in overlaps(lo, hi, e.layout):
                    apgas.async_at(pid, _blocks.send_rows, self.id, first, last, me, first - top)
        return out

    def sum(self) -> Any:
        """The sum of all elements: each place sums its block, the partial sums are added
        in block order, so the same layout always gives the same value."""
        return _fold(self, _blocks.each(_owners(self.layout), _blocks.partial_sum, self.id))

    def free(self) -> None:
        """Drop the blocks and the layout everywhere; the handle is unusable afterwards.
        Freeing twice does nothing. A followed array stops following; a broken one (it
        lost rows with a dead place) is dropped at the places still alive."""
        try:
            layout = self.layout
        except ValueError:
            return
        except apgas.ApgasError:  # broken: only the home raises that
            e = _blocks.entry(self.id)
            assert e is not None
            layout = e.layout
        live = {p.id for p in apgas.places()}
        # copies for roll-back may sit at any live place (a buddy of another layout)
        others = sorted(live) if self.resilient else []
        with apgas.finish():
            for pid in dict.fromkeys([b[0] for b in layout] + [self.home] + others):
                if pid == self.home:
                    apgas.async_at(pid, _drop_at_home, self.id)
                elif pid in live:
                    apgas.async_at(pid, _blocks.drop, self.id)

    # -- roll-back and commits on disk (apgas.steps calls these at place 0, orders kept out) --
    _steps_commit, _steps_forget, _steps_restore = _rollback.commit, _rollback.forget, _rollback.restore
    _steps_write, _steps_read = _disk.write, _disk.read  # apgas.arrays._disk

    # -- a value ---------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockArray, (self.id, self.shape, self.dtype, self.resilient, self.follow))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockArray) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"BlockArray(id={self.id}, shape={self.shape}, dtype={self.dtype})"


def _span(rows: int | slice | range, n: int) -> tuple[int, int]:
    """``[lo, hi)`` of the global rows ``rows`` (contiguous, within ``range(n)``)."""
    if isinstance(rows, slice):
        rows = range(n)[rows]
    elif not isinstance(rows, range):
        i = operator.index(rows)
        rows = range(i, i + 1)
    if rows.step != 1 and len(rows) > 1:
        raise ValueError(f"writing takes contiguous rows, got {rows}")
    if rows and not (0 <= rows[0] and rows[-1] < n):
        raise IndexError(f"rows {rows.start}:{rows.stop} out of range for {n} rows")
    return (rows.start, rows.start + len(rows)) if rows else (0, 0)


def _everywhere(ids: list[int], fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` at every place of ``ids``, in one finish."""
    with apgas.finish():
        for pid in ids:
            apgas.async_at(pid, fn, *args)


def _thaw(aid: tuple[int, int], ids: list[int]) -> None:
    """After a redistribution failed before its swap: writes go on where the places live."""
    live = {p.id for p in apgas.places()}
    with contextlib.suppress(apgas.MultipleException):
        _everywhere([pid for pid in ids if pid in live], _blocks.thaw, aid)


def _owners(layout: Layout) -> list[int]:
    return [pid for pid, start, stop in layout if stop > start]


def _fold(a: BlockArray, partials: list[Any]) -> Any:
    total = np.sum(np.empty(0, a.dtype))
    for value in partials:
        total = total + value
    return total


def dot(a: BlockArray, b: BlockArray) -> Any:
    """The sum of the elementwise products of ``a`` and ``b`` (``np.dot`` of the flattened
    arrays: no complex conjugation), which must have the same shape and layout. Partial
    products are added in block order, so the value is reproducible."""
    for name, v in (("a", a), ("b", b)):
        if not isinstance(v, BlockArray):
            raise TypeError(f"dot needs two BlockArrays, got {type(v).__name__} for {name}")
    if a.shape != b.shape:
        raise ValueError(f"dot of arrays of different shapes: {a.shape} and {b.shape}")
    layout = a.layout
    if b.layout != layout:
        raise ValueError(f"dot of arrays laid out differently: {layout} and {b.layout}; "
                         f"redistribute one over the other's places first")
    partials = _blocks.each(_owners(layout), _blocks.partial_dot, a.id, b.id)
    total = np.sum(np.empty(0, np.result_type(a.dtype, b.dtype)))
    for value in partials:
        total = total + value
    return total


def exact_sum(a: BlockArray, axis: int | None = None) -> Any:
    """The sum of all elements of ``a`` (``axis=None``), or of its rows (``axis=0``: an
    array of shape ``a.shape[1:]``, e.g. the sum of an array of vectors, as a k-means
    needs), *exact*: rounded once, at the end, so the same whatever the layout (on 1
    place or 8, after any resize) and equal to ``math.fsum`` of the same numbers.

    Each place sums its block without rounding (into integers) and place 0 adds those;
    this costs a few times :meth:`BlockArray.sum` (one Python integer per column and
    place travels). Floats give float64 (inf or nan if an element is); ints and bools
    give ints (an int64 array for ``axis=0``); other dtypes raise TypeError."""
    if not isinstance(a, BlockArray):
        raise TypeError(f"exact_sum needs a BlockArray, got {type(a).__name__}")
    if axis not in (None, 0):
        raise ValueError(f"exact_sum sums over all elements (axis=None) or the rows (axis=0), "
                         f"got axis={axis!r}")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"exact_sum adds real numbers, not {a.dtype}")
    width = 1 if axis is None else math.prod(a.shape[1:])
    parts = [[0] * width] + _blocks.each(_owners(a.layout), _exact.at_place, a.id, axis is None)
    sums = _exact.rounded(parts, a.dtype.kind == "f")
    if axis is None:
        return sums[0]
    return np.array(sums, np.float64 if a.dtype.kind == "f" else np.int64).reshape(a.shape[1:])


def at_each(places: Sequence[apgas.Place | int], fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``[fn(*args) at p for p in places]``: run in parallel (one ``finish``), the values
    in the order of ``places``. The per-place form of a reduction over a layout, e.g.
    ``at_each([b[0] for b in a.layout], partial, a)``."""
    ids = [p.id if isinstance(p, apgas.Place) else p for p in places]
    return _blocks.each(ids, fn, *args)
