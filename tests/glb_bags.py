"""Bags for the GLB tests: a tree with very uneven subtrees."""

from __future__ import annotations

import os
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

    def fold(self, other: "Count") -> None:
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

    def split(self, take_all: bool) -> "TreeBag | None":
        if take_all:
            loot, self.nodes = TreeBag(self.nodes, self.spin), []
            return loot
        if len(self.nodes) < 2:
            return None
        half = len(self.nodes) // 2
        loot = TreeBag(self.nodes[:half], self.spin)  # the oldest nodes: the biggest subtrees
        del self.nodes[:half]
        return loot

    def merge(self, other: "TreeBag") -> None:
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

    def split(self, take_all: bool) -> "ChainBag | None":
        if not take_all:
            return None
        loot = ChainBag(self.left, self.spin)
        self.left = 0
        return loot

    def merge(self, other: "ChainBag") -> None:
        self.left += other.left

    def submit(self, result: Count) -> None:
        result.value += self.count
        self.count = 0
