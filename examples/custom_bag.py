"""How to write a bag for GLB: sum the integers 0..N-1 over every place and worker.

    python examples/custom_bag.py [N]

A bag holds work (here: ranges of integers still to add) and the partial
result of the work it has done. GLB calls ``process`` in chunks, ``split``
when a thief is hungry, ``merge`` when loot arrives, and ``submit`` to
collect the partial result. Bags travel between places, so they must pickle.
"""

import sys

import apgas
from glb import GLB, GLBConfig


class Sum:
    """The result: GLB folds the workers' partial results together."""

    def __init__(self, total: int = 0, count: int = 0) -> None:
        self.total, self.count = total, count

    def fold(self, other: "Sum") -> None:   # must not depend on the order of folds
        self.total += other.total
        self.count += other.count


class RangeBag:
    def __init__(self, ranges=()) -> None:
        self.ranges = [list(r) for r in ranges]   # [lo, hi) still to add
        self.partial = Sum()                       # what this bag has done so far

    def process(self, n: int) -> int:
        """Add up to n integers; return how many."""
        done = 0
        while done < n and self.ranges:
            lo, hi = self.ranges[-1]
            take = min(n - done, hi - lo)
            self.partial.total += take * (2 * lo + take - 1) // 2   # lo + ... + lo+take-1
            self.partial.count += take
            done += take
            if lo + take == hi:
                self.ranges.pop()
            else:
                self.ranges[-1][0] = lo + take
        return done

    def remaining(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def is_empty(self) -> bool:
        return not self.ranges

    def is_splittable(self) -> bool:
        return self.remaining() >= 2

    def split(self, take_all: bool) -> "RangeBag | None":
        """Give away all the work, or half of the biggest range."""
        if take_all:
            loot, self.ranges = RangeBag(self.ranges), []
            return loot
        if not self.is_splittable():
            return None
        biggest = max(self.ranges, key=lambda r: r[1] - r[0])
        lo, hi = biggest
        if hi - lo < 2:                       # only single integers left: give one range
            return RangeBag([self.ranges.pop()])
        mid = (lo + hi) // 2
        biggest[1] = mid
        return RangeBag([(mid, hi)])

    def merge(self, other: "RangeBag") -> None:
        self.ranges.extend(other.ranges)       # loot carries work only, never results

    def submit(self, result: Sum) -> None:
        result.fold(self.partial)
        self.partial = Sum()


def main(n: int) -> None:
    glb = GLB(GLBConfig(n=1000, workers=2))
    total = glb.compute_dynamic(RangeBag([(0, n)]), Sum())
    assert (total.total, total.count) == (n * (n - 1) // 2, n)
    print(f"sum of 0..{n - 1} = {total.total} over {len(apgas.places())} places")
    print(glb.stats())


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    apgas.run(lambda: main(count), places=4, threads=3)
