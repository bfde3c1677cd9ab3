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
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Sequence

__all__ = ["RangeBag"]


class RangeBag:
    """Indices still to do, as disjoint intervals ``[lo, hi)``, and the folded result of
    the indices done.

    ``process(n)`` hands up to ``n`` indices, in blocks, to :meth:`work` (from the
    end of the last interval, so a bag works through one interval at a time).
    ``split(False)`` gives away the upper half of the biggest interval, or one
    whole interval of a single index; ``split(True)`` gives away every interval.
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

    def work(self, lo: int, hi: int) -> Any:
        """Do indices ``lo..hi-1``; return their result (something with ``fold``).

        Subclasses define it. It may be called with any block of the range, in
        any order, at any place."""
        raise NotImplementedError(f"{type(self).__name__} must define work(lo, hi)")

    # -- the bag protocol -----------------------------------------------------------
    def process(self, n: int) -> int:
        done = 0
        while done < n and self.ranges:
            lo, hi = self.ranges.pop()
            take = min(n - done, hi - lo)
            self._keep(self.work(lo, lo + take))
            done += take
            if lo + take < hi:
                self.ranges.append((lo + take, hi))
        return done

    def remaining(self) -> int:
        """Indices still to do."""
        return sum(hi - lo for lo, hi in self.ranges)

    def is_empty(self) -> bool:
        return not self.ranges

    def is_splittable(self) -> bool:
        return self.remaining() >= 2

    def split(self, take_all: bool) -> "RangeBag | None":
        if take_all:
            given, self.ranges = self.ranges, []
            return self._piece(given) if given else None
        if not self.is_splittable():
            return None
        i = max(range(len(self.ranges)), key=lambda k: self.ranges[k][1] - self.ranges[k][0])
        lo, hi = self.ranges[i]
        if hi - lo < 2:
            return self._piece([self.ranges.pop(i)])
        mid = (lo + hi) // 2
        self.ranges[i] = (lo, mid)
        return self._piece([(mid, hi)])

    def merge(self, other: "RangeBag") -> None:
        self.ranges.extend(other.ranges)
        if other.partial is not None:
            self._keep(other.partial)
        other.ranges, other.partial = [], None

    def submit(self, result: Any) -> None:
        if self.partial is not None:
            result.fold(self.partial)
            self.partial = None

    # -------------------------------------------------------------------------------
    def _keep(self, outcome: Any) -> None:
        if self.partial is None:
            self.partial = outcome
        else:
            self.partial.fold(outcome)

    def _piece(self, ranges: list[tuple[int, int]]) -> "RangeBag":
        piece = copy.copy(self)
        piece.ranges, piece.partial = list(ranges), None
        return piece

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ranges={self.ranges!r}, partial={self.partial!r})"
