"""Synthetic: a UTS tree whose nodes sleep, so balancing, not the CPU, is measured.

    python -m glb.apps synthetic [--unit-ms 1] [UTS tree options] --places P --workers W

Like the synthetic benchmark of the Java lifeline GLB, a unit of work waits
instead of computing: each node of a UTS tree (by default a binomial tree of
127,313 nodes, the same SHA-1 tree as ``python -m glb.apps uts --type bin
--b0 2000 --q 0.245 --m 4 --seed 11``, so reproducible and irregular) is one
unit of ``--unit-ms`` milliseconds. A unit costs almost no CPU (the numba UTS
kernel finds the node's children), so 64 places fit on 2 cores and the
efficiency (unit time over places x wall time) shows how well the work is spread.

Sleeping to a *running deadline* keeps ``time.sleep``'s overshoot from piling
up as if it were imbalance: a worker's deadline moves on by one unit per node
and it sleeps until the deadline, so an overshoot shortens the next sleep.
Time a busy worker spends between its units (finding children, splitting,
sending loot) overlaps its units, as if they ran on a device of their own;
the deadline starts afresh when the worker's bag runs dry (it goes stealing)
and at every :func:`rest`, so idle time is never made up for.

A thief gets every other node *that has children* (the kernel's count, from
the node's digest): three nodes in four of this tree are leaves, one unit
each, not worth a message. A static share (``--static``, and the pieces of
``benchmarks.balancing``) is every k-th node of the first level with k nodes.
The result is the node count, checked against the plain UTS kernel's count.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from typing import Any

import numba
import numpy as np

from ._app import Params
from .uts import APP as UTS
from .uts import NodeCount, UTSBag, frontier, tree_of
from .uts import make_bag as uts_bag
from .uts import sequential as uts_count
from .uts.kernel import _children, kernel_of

__all__ = ["APP", "SyntheticBag", "DEFAULT_TREE", "CHUNK", "pace", "rest", "parents", "make_bag",
           "make_static_bag", "sequential", "node_count", "warm_up", "tree_params", "unit_seconds"]

#: a binomial tree of 127,313 nodes; its largest subtree below the root holds 8.2% of it
DEFAULT_TREE = {"type": "bin", "b0": 2000.0, "q": 0.245, "m": 4, "seed": 11}
DEFAULT_UNIT_MS = 1.0
MAX_UNIT_MS = 10_000.0
CHUNK = 1 << 10   # nodes per process call where no thief waits (sequential, static pieces)

_clock = threading.local()   # this thread's deadline: one worker per thread
_now, _sleep = time.perf_counter, time.sleep   # the tests give pace a clock of their own


def pace(seconds: float) -> None:
    """Sleep until this thread's running deadline, moved on by ``seconds``."""
    now = _now()
    deadline = getattr(_clock, "deadline", None)
    deadline = (now if deadline is None else deadline) + seconds
    _clock.deadline = deadline
    if deadline > now:
        _sleep(deadline - now)


def rest() -> None:
    """This thread goes idle: its next unit starts a new deadline from then."""
    _clock.deadline = None


class SyntheticBag:
    """A :class:`~glb.apps.uts.UTSBag` whose ``process`` also sleeps ``unit`` seconds a node.

    ``owed`` nodes are counted already but not slept yet: the nodes above the
    level a static share starts from (one worker sleeps them).

    It opts in to ``concurrent_split`` (``glb.Bag``): ``process`` takes its nodes
    out of the stack under the bag's own lock (microseconds) and sleeps without it,
    so a steal request splits the bag during the sleep instead of waiting for the
    chunk to end; ``split`` and ``is_splittable`` take the same lock."""

    concurrent_split = True

    def __init__(self, inner: UTSBag, unit: float, owed: int = 0) -> None:
        self.inner = inner
        self.unit = unit
        self.owed = owed
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]   # a lock does not pickle; each copy gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def process(self, n: int) -> int:
        with self._lock:
            if self.owed:
                done = min(n, self.owed)
                self.owed -= done
            else:
                done = self.inner.process(n)   # children first: the kernel takes microseconds
        pace(done * self.unit)   # unlocked: a thief may split the bag meanwhile
        if self.is_empty():
            rest()
        return done

    def split(self, take_all: bool) -> SyntheticBag | None:
        """Give every other node that has children, keep the leaves.

        A leaf is one unit, less than the message that would carry it, and most
        nodes of a binomial tree are leaves: UTS's every-other-node split hands
        thieves crumbs that send them stealing again at once."""
        with self._lock:
            return self._split(take_all)

    def _split(self, take_all: bool) -> SyntheticBag | None:
        if take_all or len(self.inner) < 2:
            piece = self.inner.split(take_all)
            return None if piece is None else SyntheticBag(piece, self.unit)
        rows = self.inner.rows()
        given = np.flatnonzero(parents(rows, *kernel_of(self.inner.tree)))[0::2]
        if len(given) == 0:
            return None
        kept = np.ones(len(rows), np.bool_)
        kept[given] = False
        self.inner = UTSBag(self.inner.tree, rows[kept], self.inner.count)
        return SyntheticBag(UTSBag(self.inner.tree, rows[given]), self.unit)

    def merge(self, other: SyntheticBag) -> None:
        with self._lock:
            self.inner.merge(other.inner)
            self.owed += other.owed
        other.owed = 0

    def is_empty(self) -> bool:
        with self._lock:
            return self.inner.is_empty() and not self.owed

    def is_splittable(self) -> bool:
        with self._lock:
            inner = self.inner
            return len(inner) >= 2 and bool(parents(inner.rows(), *kernel_of(inner.tree)).any())

    def submit(self, result: NodeCount) -> None:
        self.inner.submit(result)

    def __len__(self) -> int:
        return len(self.inner)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def parents(rows: np.ndarray, t: Any, log_q: np.ndarray) -> np.ndarray:
    """Which stack rows have children (the UTS kernel's count, from the row's digest)."""
    out = np.zeros(rows.shape[0], np.bool_)
    for i in range(rows.shape[0]):
        out[i] = _children(np.int64(rows[i, 4]), np.int64(rows[i, 5]), t, log_q) > 0
    return out


def tree_params(params: Params) -> Params:
    """The UTS parameters of the tree (``params`` without ``unit_ms``)."""
    return {k: v for k, v in params.items() if k != "unit_ms"}


def unit_seconds(params: Params) -> float:
    return float(params["unit_ms"]) / 1000.0


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    UTS.add_arguments(parser)
    parser.add_argument("--unit-ms", dest="unit_ms", type=float, default=DEFAULT_UNIT_MS,
                        help="milliseconds each tree node sleeps (default %(default)s); without tree "
                             "options the tree is " + " ".join(f"--{k} {v:g}" if isinstance(v, float)
                                                               else f"--{k} {v}"
                                                               for k, v in DEFAULT_TREE.items()))


def _params(ns: argparse.Namespace) -> Params:
    ns = argparse.Namespace(**vars(ns))
    if ns.tree is None and ns.type in (None, "bin"):   # binomial by default, UTS's defaults otherwise
        for key, value in DEFAULT_TREE.items():
            if getattr(ns, key, None) is None:
                setattr(ns, key, value)
    unit = ns.unit_ms
    if not isinstance(unit, (int, float)) or not 0 <= unit <= MAX_UNIT_MS:
        raise ValueError(f"--unit-ms must be a number of milliseconds in [0, {MAX_UNIT_MS:g}], got {unit!r}")
    return {**UTS.params(ns), "unit_ms": float(unit)}


def make_bag(params: Params) -> SyntheticBag:
    return SyntheticBag(uts_bag(tree_params(params)), unit_seconds(params))


def make_static_bag(params: Params, index: int, count: int) -> SyntheticBag:
    """Piece ``index`` of ``count``: every count-th node of the first level with at least
    ``count`` nodes (level 1 of the default tree: the root's 2000 children); piece 0 also
    sleeps the nodes above that level."""
    if not 0 <= index < count:
        raise ValueError(f"piece index must be in [0, {count}), got {index}")
    level, above = frontier(tree_params(params), count)
    owed = above if index == 0 else 0
    inner = UTSBag(tree_of(tree_params(params)), level[index::count].copy(), owed)
    return SyntheticBag(inner, unit_seconds(params), owed)


def sequential(params: Params) -> NodeCount:
    """One worker sleeps through the whole tree (the baseline: efficiency about 1)."""
    bag, result = make_bag(params), NodeCount()
    rest()
    while not bag.is_empty():
        bag.process(CHUNK)
    bag.submit(result)
    return result


def warm_up() -> float:
    """UTS's kernels and the split's: seconds taken."""
    start = time.perf_counter()
    UTS.warm_up()
    bag = make_bag({**DEFAULT_TREE, "b0": 8.0, "unit_ms": 0.0})
    bag.process(1)
    bag.split(False)
    rest()   # else this thread's deadline stays at the warm-up, and a worker on it later
    return time.perf_counter() - start   # would do its first units without sleeping


def node_count(params: Params) -> int:
    """The tree's node count by the plain UTS kernel, without sleeping."""
    return uts_count(tree_params(params)).nodes


def _check(params: Params, value: int) -> bool:
    return value == node_count(params)


# UTS's application with sleeping bags: the same result, value and units
APP = dataclasses.replace(
    UTS,
    name="synthetic",
    add_arguments=_add_arguments,
    params=_params,
    make_bag=make_bag,
    make_static_bag=make_static_bag,
    sequential=sequential,
    check=_check,
    warm_up=warm_up,
    default_n=8,   # nodes per process call: 8 ms between checks for thieves at 1 ms units
)
