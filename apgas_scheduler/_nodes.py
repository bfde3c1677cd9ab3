"""The engine's nodes (:class:`NodePool`, the base of :class:`~.engine.Engine`): the
pool in its order, each node's owner, the free ones (a heap, so that jobs get
them in pool order), those down and those draining; see the engine's module
docstring for what down and draining mean."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["NodePool", "Node"]

Node = TypeVar("Node", bound=Hashable)
"""A node's name: the daemon's host names (``Engine[str]``), the simulator's
indices (``Engine[int]``)."""


class NodePool(Generic[Node]):
    """Who holds which node. The engine's transitions take and give nodes through
    ``_take`` and ``_give``."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.owner: dict[Node, int | None] = {}
        self._pool: list[Node] = []
        self._index: dict[Node, int] = {}
        self._free: list[int] = []  # a heap of pool indices: nodes go out in pool order
        self.down: set[Node] = set()  # out of service: neither free nor anybody's
        self.quarantine: dict[Node, float] = {}  # down nodes free again at this time
        self.reporters: dict[Node, set[Any]] = {}  # who lost places there, since its last node_up
        self.draining: set[Node] = set()  # held, and leaving the pool when given back
        self.left: list[Node] = []  # drained nodes gone from the pool, for the driver to record
        self.add_nodes(nodes)

    # -- nodes -------------------------------------------------------------------------
    @property
    def total(self) -> int:
        """The pool's nodes without those draining (no capacity for new work)."""
        return len(self._pool) - len(self.draining)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def usable(self) -> int:
        """The pool without the nodes that are down or draining: the cluster policies
        plan for."""
        return len(self._pool) - len(self.down) - len(self.draining)

    def add_nodes(self, names: Iterable[Node]) -> None:
        """New nodes join the pool, free; a draining one named stays (its drain ends)."""
        names = list(names)
        if len(set(names)) != len(names) or any(n in self.owner and n not in self.draining
                                                for n in names):
            raise ValueError(f"new node names must be distinct and not in the pool, got {names}")
        for n in names:
            if n in self.draining:
                self.draining.discard(n)
                continue
            self._index[n] = len(self._pool)
            self._pool.append(n)
            self.owner[n] = None
            heapq.heappush(self._free, self._index[n])

    def free_nodes(self, count: int | None = None) -> list[Node]:
        """The first ``count`` (all) free nodes, the ones a start would take."""
        picks = sorted(self._free) if count is None else heapq.nsmallest(count, self._free)
        return [self._pool[i] for i in picks]

    def _take(self, job: Any, count: int) -> list[Node]:
        taken = [self._pool[heapq.heappop(self._free)] for _ in range(count)]
        for n in taken:
            self.owner[n] = job.id
        return taken

    def _give(self, nodes: Iterable[Node]) -> None:
        """The nodes are nobody's again: free, or out of the pool if draining."""
        gone = []
        for n in nodes:
            if n in self.draining:
                gone.append(n)
                continue
            self.owner[n] = None
            heapq.heappush(self._free, self._index[n])
        if gone:
            self._remove(gone)

    def drain(self, node: Node) -> bool:
        """``node`` is to leave the pool: at once if nobody holds it (down or free;
        True), else once its job gives it back (False; see the module docstring).
        ValueError if it is not in the pool."""
        if node not in self.owner:
            raise ValueError(f"node {node} is not in the pool")
        if self.owner[node] is None:
            self.down.discard(node)
            self.quarantine.pop(node, None)
            self._remove([node])
            return True
        self.draining.add(node)
        return False

    def _remove(self, nodes: list[Node]) -> None:
        """Take ``nodes`` (nobody's, or draining) out of the pool; ``left`` records them.
        Rare (a drain), so the indices are simply rebuilt."""
        gone = set(nodes)
        free = {self._pool[i] for i in self._free}
        self._pool = [n for n in self._pool if n not in gone]
        self._index = {n: i for i, n in enumerate(self._pool)}
        self._free = [self._index[n] for n in free if n not in gone]
        heapq.heapify(self._free)
        for n in nodes:
            del self.owner[n]
            self.draining.discard(n)
            self.reporters.pop(n, None)
        self.left.extend(nodes)

    def set_down(self, node: Node, until: float | None = None) -> None:
        """Take a free node out of service (a restarted scheduler takes up its earlier
        state so), until ``node_up`` or, given ``until``, until then (a quarantine);
        ValueError if it is not free."""
        if self.owner.get(node, -1) is not None or node in self.down:
            raise ValueError(f"node {node} is not a free node of the pool")
        self._free = [i for i in self._free if self._pool[i] != node]
        heapq.heapify(self._free)
        self.down.add(node)
        if until is not None:
            self.quarantine[node] = until

    def report_lost(self, node: Node, reporter: Any, until: float | None) -> None:
        """A job of ``reporter`` (its owner) lost its place on ``node``, which is down
        now. One job's word cannot take a node from everyone for good (any job may
        say it, and for every node it holds): the node is quarantined until
        ``until`` and then free again. Only when a second reporter has said so
        since the node's last ``node_up`` (or ``until`` is None) does it stay down
        until ``node_up``."""
        seen = self.reporters.setdefault(node, set())
        seen.add(reporter)
        if until is None or len(seen) > 1:
            self.quarantine.pop(node, None)
        else:
            self.quarantine[node] = until

    def end_quarantines(self, now: float) -> list[Node]:
        """The quarantined nodes whose time is over at ``now``: free again (returned).
        Their reporters are remembered until ``node_up``."""
        over = [n for n, until in self.quarantine.items() if until <= now]
        for n in over:
            del self.quarantine[n]
            self.down.discard(n)
        self._give(over)
        return over

    def node_up(self, node: Node) -> None:
        """A node that was down is back in service: free again, its reports forgotten."""
        self.down.remove(node)
        self.quarantine.pop(node, None)
        self.reporters.pop(node, None)
        self._give([node])
