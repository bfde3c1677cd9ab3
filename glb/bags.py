"""Ready-made bags. ``RangeBag``: a range of independent indices.

Many GLB programs are "do ``f(i)`` for every ``i`` in ``0..N-1`` and fold the
outcomes": Monte Carlo chunks, parameter sweeps, files of a list. Subclass
:class:`RangeBag`, define :meth:`RangeBag.work` for a block of indices, and
the splitting, merging, pickling and submitting follow the bag contract
(``glb.Bag``)::

    class Squares(RangeBag):
        def work(self, lo, hi):
            return Sum(sum(i * i for i in range(lo, hi)))

    total = GLB().compute_dynamic(Squares(0, 10**6), Sum())

**Steals while a worker processes: ``concurrent_split``.** By default GLB calls a
bag's methods from one thread at a time, the worker holding the bag, and a
steal request that finds no piece ready waits for ``process(n)`` to return (a
lifeline thief is served then; a random thief goes away empty-handed). A bag
class that sets the class attribute ``concurrent_split = True`` allows more:
while the worker thread is inside ``process(n)``, GLB may call
``is_splittable()`` and then ``split(False)`` on that bag from another thread
(the one serving a steal request, or another worker of the same place). Only
these two methods, only while ``process`` runs, and from one such thread at a
time: GLB holds its place lock around them, and never calls ``split(True)``,
``merge``, ``submit``, ``is_empty`` or a second ``process`` while ``process``
runs, nor while another thread splits. So the bag makes only ``process``
safe against ``is_splittable()`` and ``split(False)``: typically ``process``
takes its units out of the work under a lock of the bag's own, which
``split(False)`` and ``is_splittable()`` take too, and does the units
(computes, sleeps, waits) without it. ``process`` may then do fewer units
than it meant to, even none, because a thief took them; what it did stays in
the bag's partial result, which pieces still do not carry. The lock must not
travel: leave it out in ``__getstate__`` and make a new one in
``__setstate__`` (``glb.testing.check_bag`` gives a copied bag a new lock).
GLB reads the flag from the class (``type(bag).concurrent_split is True``);
a bag without it is never called concurrently, whatever it was written for.
Resilient GLB ignores the flag: a piece must be registered at place 0 with a
backup of the bag, which only the worker writes. ``RangeBag`` does not opt
in, since its subclasses may override ``process``;
``glb.apps.synthetic.SyntheticBag`` does, with the lock pattern above.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from ._contract import not_a_result

__all__ = ["RangeBag"]


class RangeBag:
    """Indices still to do, as disjoint intervals ``[lo, hi)``, and the folded result of
    the indices done.

    ``process(n)`` hands up to ``n`` indices, in blocks, to :meth:`work` (from the
    end of the last interval, so a bag works through one interval at a time).
    ``split(False)`` gives away the upper half of the biggest interval, or, when
    every interval holds a single index, half of the intervals; ``split(True)``
    gives away every interval.
    Pieces carry no partial result. ``merge`` takes the other's intervals and its
    partial result; ``submit`` folds the partial result into the result and
    forgets it. A piece is a shallow copy of the bag (with its own intervals and
    no partial result), so the subclass's other attributes, its parameters,
    travel with every piece and are shared, not copied, between a bag and its
    pieces in one place: keep them read-only.
    """

    def __init__(self, lo: int = 0, hi: int = 0, *,
                 ranges: Iterable[Sequence[int]] | None = None) -> None:
        given = [(lo, hi)] if ranges is None else [tuple(r) for r in ranges]
        for r in given:
            if len(r) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in r):
                raise ValueError(f"a range is a pair of integers (lo, hi), got {r!r}")
        self.ranges: list[tuple[int, int]] = [(a, b) for a, b in given if a < b]
        self.partial: Any = None
        self._left = sum(b - a for a, b in self.ranges)  # kept, not summed: GLB asks often

    def work(self, lo: int, hi: int) -> Any:
        """Do indices ``lo..hi-1``; return their result (something with ``fold``).

        Subclasses define it. It may be called with any block of the range, in
        any order, at any place."""
        raise NotImplementedError(f"{type(self).__name__} must define work(lo, hi)")

    # -- the bag protocol -----------------------------------------------------------
    def process(self, n: int) -> int:
        blocks = self._take(n)
        for lo, hi in blocks:
            self._keep(self.work(lo, hi))
        return sum(hi - lo for lo, hi in blocks)

    def _take(self, n: int) -> list[tuple[int, int]]:
        """Remove up to ``n`` indices, as blocks ``[lo, hi)``, from the end of the last
        interval backwards."""
        blocks: list[tuple[int, int]] = []
        left = n
        while left > 0 and self.ranges:
            lo, hi = self.ranges.pop()
            step = min(left, hi - lo)
            blocks.append((lo, lo + step))
            left -= step
            if lo + step < hi:
                self.ranges.append((lo + step, hi))
        self._left -= n - left
        return blocks

    def remaining(self) -> int:
        """Indices still to do."""
        return self._left

    def is_empty(self) -> bool:
        return not self.ranges

    def is_splittable(self) -> bool:
        return self.remaining() >= 2

    def split(self, take_all: bool) -> RangeBag | None:
        if take_all:
            given, self.ranges, self._left = self.ranges, [], 0
            return self._piece(given) if given else None
        if not self.is_splittable():
            return None
        i = max(range(len(self.ranges)), key=lambda k: self.ranges[k][1] - self.ranges[k][0])
        lo, hi = self.ranges[i]
        if hi - lo < 2:  # single indices only: give half of them
            half = len(self.ranges) // 2
            given, self.ranges = self.ranges[half:], self.ranges[:half]
        else:
            mid = (lo + hi) // 2
            self.ranges[i] = (lo, mid)
            given = [(mid, hi)]
        piece = self._piece(given)
        self._left -= piece._left
        return piece

    def merge(self, other: RangeBag) -> None:
        self.ranges.extend(other.ranges)
        self._left += other._left
        if other.partial is not None:
            self._keep(other.partial)
        other.ranges, other.partial, other._left = [], None, 0

    def submit(self, result: Any) -> None:
        if self.partial is not None:
            result.fold(self.partial)
            self.partial = None

    # -------------------------------------------------------------------------------
    def _keep(self, outcome: Any) -> None:
        partial = self.partial
        if partial is None:  # once per piece and per worker, not per block: checked
            if not hasattr(outcome, "fold"):
                raise not_a_result(self, "work(lo, hi)", outcome)
            self.partial = outcome
        else:
            try:
                partial.fold(outcome)
            except (AttributeError, TypeError) as e:
                if type(outcome) is type(partial):
                    raise
                raise not_a_result(self, "work(lo, hi)", outcome, partial) from e

    def _piece(self, ranges: list[tuple[int, int]]) -> RangeBag:
        piece = copy.copy(self)
        piece.ranges, piece.partial = list(ranges), None
        piece._left = sum(hi - lo for lo, hi in piece.ranges)
        return piece

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ranges={self.ranges!r}, partial={self.partial!r})"
