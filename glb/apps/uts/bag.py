"""The UTS bag (a stack of nodes still to expand) and its result (nodes counted), the
bags that hold a whole tree or one worker's share of it, and the count by the kernel
alone."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._app import Params
from .kernel import WORDS, expand, index_table, kernel_of, next_level, root
from .trees import Tree, tree_of

__all__ = ["NodeCount", "UTSBag", "make_bag", "make_static_bag", "frontier", "sequential",
           "tree_size", "INITIAL_ROWS"]

INITIAL_ROWS = 1024
FRONTIER_PER_WORKER = 16
MAX_FRONTIER = 1 << 14       # make_static_bag(p, 0, 2^30) must stay cheap ...
MAX_ABOVE = 1 << 16          # ... also where levels never get that wide (binomial trees)


class NodeCount:
    """Nodes counted; folds by addition, so in any order."""

    def __init__(self, nodes: int = 0) -> None:
        self.nodes = nodes

    def fold(self, other: NodeCount) -> None:
        self.nodes += other.nodes

    def __repr__(self) -> str:
        return f"NodeCount({self.nodes})"


class UTSBag:
    """A stack of nodes of ``tree`` still to expand and the nodes counted so far.

    ``process(n)`` counts at most ``n`` nodes (at least one node is expanded, and
    a node whose children are leaves counts with them) and returns how many.
    """

    def __init__(self, tree: Tree, rows: np.ndarray | None = None, count: int = 0) -> None:
        rows = np.zeros((0, WORDS), np.uint32) if rows is None else rows
        self.tree = tree
        self._kernel, self._log_q = kernel_of(tree)
        self._nodes = np.zeros((max(INITIAL_ROWS, 2 * len(rows)), WORDS), np.uint32)
        self._nodes[:len(rows)] = rows
        self._top = len(rows)
        self.count = count

    # pickling sends the tree and the live rows only
    def __getstate__(self) -> dict[str, Any]:
        return {"tree": self.tree, "rows": self.rows(), "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        UTSBag.__init__(self, state["tree"], state["rows"], state["count"])

    def rows(self) -> np.ndarray:
        """A copy of the nodes still to expand, oldest first."""
        return self._nodes[:self._top].copy()

    def __len__(self) -> int:
        return self._top

    def process(self, n: int) -> int:
        done = 0
        while True:
            top, counted, wanted = expand(self._nodes, self._top, n - done,
                                          self._kernel, self._log_q, index_table())
            self._top = int(top)  # ints already (numba returns int64 as int), typed as Int
            done += int(counted)
            if not wanted or done >= n:
                break
            self._reserve(int(wanted))
        self.count += done
        return done

    def is_empty(self) -> bool:
        return self._top == 0

    def is_splittable(self) -> bool:
        return self._top >= 2

    def split(self, take_all: bool) -> UTSBag | None:
        """Give away every other node of the stack (so both sides keep shallow nodes
        with big subtrees and deep ones alike), or all of it; never the count."""
        if take_all:
            if self._top == 0:
                return None
            loot, self._top = UTSBag(self.tree, self.rows()), 0
            return loot
        if self._top < 2:
            return None
        stack = self._nodes[:self._top]
        loot = UTSBag(self.tree, stack[0::2].copy())
        kept = stack[1::2].copy()
        self._nodes[:len(kept)] = kept
        self._top = len(kept)
        return loot

    def merge(self, other: UTSBag) -> None:
        """Take all of ``other``'s nodes and count, leaving it empty."""
        if other.tree != self.tree:
            raise ValueError(f"cannot merge nodes of {other.tree} into a bag of {self.tree}")
        self._reserve(other._top)
        self._nodes[self._top:self._top + other._top] = other._nodes[:other._top]
        self._top += other._top
        self.count += other.count
        other._top, other.count = 0, 0

    def submit(self, result: NodeCount) -> None:
        result.nodes += self.count
        self.count = 0

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` more rows."""
        need = self._top + rows
        if need > len(self._nodes):
            grown = np.zeros((max(need, 2 * len(self._nodes)), WORDS), np.uint32)
            grown[:self._top] = self._nodes[:self._top]
            self._nodes = grown


def make_bag(params: Params) -> UTSBag:
    """The bag holding the root: all the work."""
    tree = tree_of(params)
    return UTSBag(tree, root(tree.seed, index_table()))


def frontier(params: Params, width: int) -> tuple[np.ndarray, int]:
    """Expand whole levels from the root until one has at least ``width`` nodes (or
    the last level whose children are hashed, or ``MAX_ABOVE`` nodes above it);
    returns that level and the count of the nodes above it."""
    tree = tree_of(params)
    t, log_q = kernel_of(tree)
    level, above, height = root(tree.seed, index_table()), 0, 0
    while 0 < len(level) < width and height + 1 < t.leaf and above < MAX_ABOVE:
        above, height = above + len(level), height + 1
        level = next_level(level, t, log_q, index_table())
    return level, above


def make_static_bag(params: Params, index: int, count: int) -> UTSBag:
    """Worker ``index`` of ``count``: every count-th node of a frontier level; worker 0
    also holds the count of the nodes above the frontier. Each worker builds the
    same frontier, so together they cover the tree exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"worker index must be in [0, {count}), got {index}")
    level, above = frontier(params, min(FRONTIER_PER_WORKER * count, MAX_FRONTIER))
    return UTSBag(tree_of(params), level[index::count].copy(), above if index == 0 else 0)


def sequential(params: Params) -> NodeCount:
    """The kernel alone, in this thread: no runtime, no splitting."""
    bag, result = make_bag(params), NodeCount()
    while not bag.is_empty():
        bag.process(1 << 62)
    bag.submit(result)
    return result


def tree_size(seed: int, depth: int) -> int:
    """Nodes of the geometric fixed b0 = 4 tree of ``seed`` and ``depth``, counted by the kernel."""
    return sequential({"seed": seed, "depth": depth}).nodes
