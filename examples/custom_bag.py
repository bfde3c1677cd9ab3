"""How to give GLB your own work: sum the integers 0..N-1 over every place and worker.

    python examples/custom_bag.py [N]

Work that is "do f(i) for every index i of a range, then fold the outcomes"
needs only a ``glb.bags.RangeBag`` subclass with one method, ``work(lo, hi)``,
returning the result of indices lo..hi-1. RangeBag keeps the bag contract
(``help(glb.Bag)``): it splits the biggest range in halves for thieves, gives
all of it away when its place leaves, merges loot, and submits its partial
result once. Anything else the bag holds (here: nothing; in
``glb/apps/pi.py``: a seed and a chunk size) travels with every piece, so it
must pickle. For work that is not a range (a tree, a graph), write the six
bag methods yourself: ``tests/glb_bags.py`` has a tree bag, and
``glb.testing.check_bag`` checks any bag against the contract.
"""

import sys

import apgas
from glb import GLB, GLBConfig
from glb.bags import RangeBag


class Sum:
    """The result: GLB folds the workers' partial results together."""

    def __init__(self, total: int = 0, count: int = 0) -> None:
        self.total, self.count = total, count

    def fold(self, other: "Sum") -> None:   # must not depend on the order of folds
        self.total += other.total
        self.count += other.count

    def __eq__(self, other: object) -> bool:  # lets glb.testing.check_bag compare results
        return isinstance(other, Sum) and (self.total, self.count) == (other.total, other.count)

    def __repr__(self) -> str:
        return f"Sum(total={self.total}, count={self.count})"


class IntegerSum(RangeBag):
    def work(self, lo: int, hi: int) -> Sum:
        """The integers lo..hi-1: their sum and how many."""
        return Sum((lo + hi - 1) * (hi - lo) // 2, hi - lo)


def main(n: int) -> None:
    glb = GLB(GLBConfig(n=1000, workers=2))
    total = glb.compute_dynamic(IntegerSum(0, n), Sum())
    assert (total.total, total.count) == (n * (n - 1) // 2, n)
    print(f"sum of 0..{n - 1} = {total.total} over {len(apgas.places())} places")
    print(glb.stats())


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    apgas.run(lambda: main(count), places=4, threads=3)
