"""Bags for the GLB tests: a tree with very uneven subtrees."""

from __future__ import annotations

import os
import random
import threading
import time

MASK = (1 << 64) - 1


def mix(x: int) -> int:
    """splitmix64: the same on every place."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def children(seed: int, depth: int) -> list[tuple[int, int]]:
    """Most nodes have 0-2 children, one in 16 has 9: subtrees differ wildly."""
    if depth == 0:
        return []
    h = mix(seed)
    count = 9 if h % 16 == 0 else h % 3
    return [(mix(seed * 31 + i + 1), depth - 1) for i in range(count)]


class Count:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def fold(self, other: Count) -> None:
        self.value += other.value


class TreeBag:
    """Counts the nodes of the tree below the nodes it holds.

    A node ``(seed, depth, gate)`` is *held*: it is processed (and its subtree
    grows) only once the file ``gate`` exists, so a test decides when the
    computation may end without sleeping for a guessed time.
    """

    def __init__(self, nodes=(), spin: int = 0) -> None:
        self.nodes = list(nodes)
        self.count = 0
        self.spin = spin  # extra hashing per node, to make nodes cost more

    def process(self, n: int) -> int:
        done = 0
        while done < n and self.nodes:
            node = self.nodes.pop()
            if len(node) == 3:
                if not os.path.exists(node[2]):
                    self.nodes.insert(0, node)  # the bottom: other nodes come first
                    if len(self.nodes) == 1:
                        time.sleep(0.002)
                        return done
                    continue
                node = node[:2]
            seed, depth = node
            for _ in range(self.spin):
                mix(seed)
            self.nodes.extend(children(seed, depth))
            self.count += 1
            done += 1
        return done

    def is_empty(self) -> bool:
        return not self.nodes

    def is_splittable(self) -> bool:
        return len(self.nodes) >= 2

    def split(self, take_all: bool) -> TreeBag | None:
        if take_all:
            loot, self.nodes = TreeBag(self.nodes, self.spin), []
            return loot
        if len(self.nodes) < 2:
            return None
        half = len(self.nodes) // 2
        loot = TreeBag(self.nodes[:half], self.spin)  # the oldest nodes: the biggest subtrees
        del self.nodes[:half]
        return loot

    def merge(self, other: TreeBag) -> None:
        self.nodes.extend(other.nodes)

    def submit(self, result: Count) -> None:
        result.value += self.count
        self.count = 0


def tree_nodes(roots) -> int:
    """Sequential reference count (held nodes counted as ordinary ones)."""
    bag = TreeBag([root[:2] for root in roots])
    while not bag.is_empty():
        bag.process(10_000)
    return bag.count


class ChainBag:
    """A chain of ``length`` nodes that cannot be split: one place works, the rest idle."""

    def __init__(self, length: int, spin: int = 0) -> None:
        self.left = length
        self.count = 0
        self.spin = spin

    def process(self, n: int) -> int:
        done = min(n, self.left)
        for i in range(done * self.spin):
            mix(i)
        self.left -= done
        self.count += done
        return done

    def is_empty(self) -> bool:
        return self.left == 0

    def is_splittable(self) -> bool:
        return False

    def split(self, take_all: bool) -> ChainBag | None:
        if not take_all:
            return None
        loot = ChainBag(self.left, self.spin)
        self.left = 0
        return loot

    def merge(self, other: ChainBag) -> None:
        self.left += other.left

    def submit(self, result: Count) -> None:
        result.value += self.count
        self.count = 0


# -- bags written the way X10 and Java GLB users write theirs ----------------------------------

def weight(i: int, spin: int = 0) -> int:
    """The value summed for index ``i``; ``spin`` extra rounds make it cost more, not differ."""
    x = mix(i)
    y = x
    for _ in range(spin):
        y = mix(y)
    return x % 1000


class Total:
    """The result of the interval bags: a sum and how many indices it covers."""

    def __init__(self, value: int = 0, count: int = 0) -> None:
        self.value, self.count = value, count

    def fold(self, other: Total) -> None:
        self.value += other.value
        self.count += other.count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Total) and (self.value, self.count) == (other.value, other.count)

    def __repr__(self) -> str:
        return f"Total({self.value}, {self.count})"


def interval_total(lo: int, hi: int) -> Total:
    """Sequential reference of the interval bags."""
    return Total(sum(weight(i) for i in range(lo, hi)), hi - lo)


class X10IntervalBag:
    """Sums ``weight(i)`` over intervals, as a bag is written for X10's or Java's GLB:
    ``submit`` adds the partial sum to the result and does not clear it (those
    libraries submit a bag once, at the end), and ``merge`` takes only work,
    since loot never carries a result there."""

    def __init__(self, intervals=(), spin: int = 0) -> None:
        self.intervals = [list(r) for r in intervals if r[0] < r[1]]
        self.sum = 0
        self.count = 0
        self.spin = spin

    def process(self, n: int) -> int:
        done = 0
        while done < n and self.intervals:
            interval = self.intervals[-1]
            self.sum += weight(interval[0], self.spin)
            self.count += 1
            interval[0] += 1
            if interval[0] == interval[1]:
                self.intervals.pop()
            done += 1
        return done

    def is_empty(self) -> bool:
        return not self.intervals

    def is_splittable(self) -> bool:
        return sum(hi - lo for lo, hi in self.intervals) >= 2

    def split(self, take_all: bool) -> X10IntervalBag | None:
        if take_all:
            loot, self.intervals = X10IntervalBag(self.intervals, self.spin), []
            return loot
        biggest = max(self.intervals, key=lambda r: r[1] - r[0], default=None)
        if biggest is None or biggest[1] - biggest[0] < 2:
            return None
        mid = (biggest[0] + biggest[1]) // 2
        loot = X10IntervalBag([(mid, biggest[1])], self.spin)
        biggest[1] = mid
        return loot

    def merge(self, other: X10IntervalBag) -> None:
        self.intervals.extend(other.intervals)

    def submit(self, result: Total) -> None:
        result.value += self.sum
        result.count += self.count


class CarryingIntervalBag(X10IntervalBag):
    """Like :class:`X10IntervalBag`, but a piece carries half of the partial sum, moved
    out of the bag (the contract allows it), and ``merge`` takes it over."""

    def split(self, take_all: bool) -> CarryingIntervalBag | None:
        loot = super().split(take_all)
        if loot is None:
            return None
        piece = CarryingIntervalBag(loot.intervals, self.spin)
        piece.sum, piece.count = self.sum // 2, self.count // 2
        self.sum -= piece.sum
        self.count -= piece.count
        return piece

    def merge(self, other: X10IntervalBag) -> None:
        super().merge(other)
        self.sum += other.sum
        self.count += other.count
        other.sum = other.count = 0


class GatedBag:
    """Wraps a bag and holds back the end of the computation until the file ``gate``
    exists, so a test's orders all land while GLB computes, however loaded the machine.

    The gate is not a unit of work (``process`` counts 0 for it) and never leaves the
    bag it started in but through ``split(True)``, which only a leaving place calls:
    start the computation with it at place 0, which never leaves. ``inner`` is None
    in a piece that holds only the gate."""

    def __init__(self, inner, gate: str | None = None) -> None:
        self.inner = inner
        self.gate = gate

    def _work_left(self) -> bool:
        return self.inner is not None and not self.inner.is_empty()

    def process(self, n: int) -> int:
        if self._work_left():
            done = self.inner.process(n)
            return n if done is None else done
        if self.gate is not None:
            if os.path.exists(self.gate):
                self.gate = None
            else:
                time.sleep(0.002)
        return 0

    def is_empty(self) -> bool:
        return self.gate is None and not self._work_left()

    def is_splittable(self) -> bool:
        return self._work_left() and self.inner.is_splittable()

    def split(self, take_all: bool) -> GatedBag | None:
        if take_all:
            piece = GatedBag(self.inner.split(True) if self._work_left() else None, self.gate)
            self.gate = None
            return piece
        inner = self.inner.split(False) if self._work_left() else None
        return None if inner is None else GatedBag(inner)

    def merge(self, other: GatedBag) -> None:
        if other.inner is not None:
            if self.inner is None:
                self.inner = other.inner
            else:
                self.inner.merge(other.inner)
        if other.gate is not None:
            self.gate = other.gate
        other.inner, other.gate = None, None

    def submit(self, result) -> None:
        if self.inner is not None:
            self.inner.submit(result)


# -- steals during process: a bag that must not be split then, and one that opts in -------------

class GuardedTreeBag(TreeBag):
    """A :class:`TreeBag` written as users write bags (no lock, no opt-in) that fails
    loudly if GLB calls any other method while its ``process`` runs, and naps at random
    inside ``process`` so that steal requests come in meanwhile."""

    def __init__(self, nodes=(), spin: int = 0, nap: float = 0.0003) -> None:
        super().__init__(nodes, spin)
        self.nap = nap
        self.inside = False

    def _check(self, what: str) -> None:
        if self.inside:
            raise RuntimeError(f"GuardedTreeBag.{what} called while process() runs")

    def process(self, n: int) -> int:
        self._check("process")
        self.inside = True
        try:
            done = 0
            while done < n and self.nodes:
                done += TreeBag.process(self, 1)
                if random.random() < 0.3:
                    time.sleep(random.random() * self.nap)
            return done
        finally:
            self.inside = False

    def is_empty(self) -> bool:
        self._check("is_empty")
        return super().is_empty()

    def is_splittable(self) -> bool:
        self._check("is_splittable")
        return super().is_splittable()

    def split(self, take_all: bool) -> GuardedTreeBag | None:
        self._check("split")
        piece = super().split(take_all)
        return None if piece is None else GuardedTreeBag(piece.nodes, self.spin, self.nap)

    def merge(self, other: TreeBag) -> None:
        self._check("merge")
        super().merge(other)

    def submit(self, result: Count) -> None:
        self._check("submit")
        super().submit(result)


class LockedTreeBag(TreeBag):
    """A :class:`TreeBag` that opts in to ``concurrent_split``: ``process`` takes each
    node under the bag's own lock and naps at random without it, so GLB may split the
    bag (``is_splittable``, ``split(False)``, under the same lock) from a steal request
    while ``process`` runs."""

    concurrent_split = True

    def __init__(self, nodes=(), spin: int = 0, nap: float = 0.0003) -> None:
        super().__init__(nodes, spin)
        self.nap = nap
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def process(self, n: int) -> int:
        done = 0
        while done < n:
            with self.lock:
                if not self.nodes:
                    break
                done += TreeBag.process(self, 1)
            if random.random() < 0.3:
                time.sleep(random.random() * self.nap)   # unlocked: a thief may split now
        return done

    def is_splittable(self) -> bool:
        with self.lock:
            return len(self.nodes) >= 2

    def split(self, take_all: bool) -> LockedTreeBag | None:
        with self.lock:
            piece = TreeBag.split(self, take_all)
        return None if piece is None else LockedTreeBag(piece.nodes, self.spin, self.nap)

    def merge(self, other: TreeBag) -> None:
        with self.lock:
            TreeBag.merge(self, other)


class OptedInGuardedTreeBag(GuardedTreeBag):
    """Opts in without the lock the opt-in asks for: GLB then calls it during ``process``
    (the control case of the guarded bag's test)."""

    concurrent_split = True

    def split(self, take_all: bool) -> OptedInGuardedTreeBag | None:
        piece = super().split(take_all)
        return None if piece is None else OptedInGuardedTreeBag(piece.nodes, self.spin, self.nap)
