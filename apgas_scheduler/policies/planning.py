"""What the scheduling policies share: the ``Policy`` base class, EASY's
reservation, the sizes of moldable jobs, and the grants of evolving requests.

``apgas_scheduler.policies.classic`` (the live four and evolving EASY), ``apgas_scheduler.policies.mebf``,
``apgas_scheduler.policies.dmr``, ``apgas_scheduler.policies.agreements`` (the Kassel strategies) and
``apgas_scheduler.policies.thrifty`` build on this module and nothing else of each other, so
the registry in ``apgas_scheduler.policies.registry`` can import them all without a cycle.
"""

from __future__ import annotations

import abc
import dataclasses
import heapq
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .._model import Decision, Grow, JobView, Shrink, Start

__all__ = [
    "Policy", "easy", "moldable_size", "min_agree_size", "grant_requests", "with_grants",
    "waiting", "in_transit", "reservation", "GATE", "Sizer", "JobQueue", "BY_MINIMUM",
    "preferred_size",
    "by_minimum", "shrink_largest", "grow_smallest",
]

GATE = ("policy {name} does not grant evolving requests; run the scheduler with "
        "--policy evolving or dmr")
"""The refusal of ``Evolving;Request`` and ``Evolving;Check`` under a policy that
does not grant them."""

# How many nodes a job starts with when ``avail`` nodes may be used, or None
# if it cannot start on them.
Sizer = Callable[[JobView, int], int | None]


BY_MINIMUM: set[Callable[..., int | None]] = set()
"""Sizers that refuse a job exactly when fewer nodes than its minimum are
available, so that a backfill pass may ask a :class:`JobQueue` for the next job
whose minimum fits (:meth:`JobQueue.fitting`) instead of reading every one."""


def by_minimum(size: Sizer) -> Sizer:
    BY_MINIMUM.add(size)
    return size


@by_minimum
def moldable_size(job: JobView, avail: int) -> int | None:
    """The moldable extension: a moldable or malleable job takes as many nodes
    as it may, a rigid job exactly its size, an evolving job its minimum (it
    asks for more itself when it needs them); none starts below its minimum."""
    if avail < job.min_nodes:
        return None
    if job.cls in ("rigid", "evolving"):
        return job.min_nodes
    return min(job.max_nodes, avail)


@by_minimum
def min_agree_size(job: JobView, avail: int) -> int | None:
    """minAgree starts malleable jobs small (they grow later when nodes are
    idle); moldable jobs cannot grow later, so they still take what they may."""
    if job.malleable:
        return job.min_nodes if avail >= job.min_nodes else None
    return moldable_size(job, avail)


@by_minimum
def preferred_size(job: JobView, avail: int) -> int | None:
    """A flexible job's preferred size if ``avail`` allows, else what is free
    down to its minimum (a rigid job: exactly its size); None if it cannot
    start on ``avail`` nodes (MEBF's start size, and the Kassel ``pref`` one)."""
    if avail < job.min_nodes:
        return None
    if job.cls == "rigid":
        return job.min_nodes
    pref = max(job.min_nodes, min(job.pref, job.max_nodes))
    return min(pref, avail)


_ORDER = operator.attrgetter("submit", "id")


def waiting(queue: Iterable[JobView], total: int) -> Iterable[JobView]:
    """Jobs that may ever start, in submission order (then id); a job larger
    than the cluster is skipped rather than allowed to block the queue. An
    engine's :class:`JobQueue` is in that order already: its jobs come lazily,
    so a policy that stops at the head reads no more of the queue."""
    if isinstance(queue, JobQueue):
        return (j for j in queue if j.min_nodes <= total)
    waiting = [j for j in queue if j.min_nodes <= total]
    waiting.sort(key=_ORDER)  # engines pass it in order already: one cheap pass
    return waiting


class JobQueue(Sequence[JobView]):
    """Queued jobs in submission order (then id), kept by the engine as they
    come and go, and seen by policies as a sequence of their views.

    Slots are appended in order (a job that comes out of order rebuilds
    them, sorted); a job that leaves frees its slot, and the slots are
    compacted when they fill up, so adding and removing cost O(1) amortized
    plus O(log n) for a tree of the slots' minimum sizes, which finds the
    next job that fits ``avail`` nodes (:meth:`fitting`) without reading the
    jobs in between. Iteration starts at the first live slot. Jobs need an
    ``id``, ``submit``, ``min_nodes`` and ``view()`` (with ``cached``)."""

    def __init__(self, jobs: Iterable[Any] = ()) -> None:
        self.flagged_id: int | None = None  # the engine's priority job, if any
        self._rebuild(list(jobs))

    def _rebuild(self, jobs: list[Any]) -> None:
        jobs.sort(key=_ORDER)
        cap = 16
        while cap < 2 * len(jobs) + 16:
            cap *= 2
        self._cap = cap
        self._slots: list[Any] = list(jobs)
        self._pos = {j.id: i for i, j in enumerate(jobs)}
        self._head = 0
        tree = [math.inf] * (2 * cap)
        tree[cap:cap + len(jobs)] = [j.min_nodes for j in jobs]
        for i in range(cap - 1, 0, -1):
            a, b = tree[2 * i], tree[2 * i + 1]
            tree[i] = a if a < b else b
        self._tree = tree

    def _set(self, pos: int, value: float) -> None:
        tree = self._tree
        i = pos + self._cap
        tree[i] = value
        i >>= 1
        while i:
            a, b = tree[2 * i], tree[2 * i + 1]
            tree[i] = a if a < b else b
            i >>= 1

    def add(self, job: Any) -> None:
        self.remove(job.id)  # a job submitted again replaces itself
        slots = self._slots
        last = next((j for j in reversed(slots) if j is not None), None) if slots else None
        if last is not None and (job.submit, job.id) < (last.submit, last.id):
            self._rebuild([*self.jobs(), job])  # out of order: rare
            return
        if len(slots) == self._cap:
            self._rebuild(list(self.jobs()))
            slots = self._slots
        self._pos[job.id] = len(slots)
        slots.append(job)
        self._set(len(slots) - 1, job.min_nodes)

    def remove(self, job_id: int) -> None:
        pos = self._pos.pop(job_id, None)
        if pos is None:
            return
        slots = self._slots
        slots[pos] = None
        self._set(pos, math.inf)
        while self._head < len(slots) and slots[self._head] is None:
            self._head += 1
        if not self._pos:
            self._rebuild([])

    def jobs(self) -> Iterator[Any]:
        """The queued jobs themselves (not their views), in order."""
        slots = self._slots
        for i in range(self._head, len(slots)):
            job = slots[i]
            if job is not None:
                yield job

    def __contains__(self, job: object) -> bool:
        return getattr(job, "id", None) in self._pos

    def __len__(self) -> int:
        return len(self._pos)

    def __iter__(self) -> Iterator[JobView]:
        for job in self.jobs():
            yield job.cached or job.view()

    def view_of(self, job_id: int) -> JobView | None:
        """The view of the queued job ``job_id``, or None if it is not queued."""
        pos = self._pos.get(job_id)
        if pos is None:
            return None
        job = self._slots[pos]
        return job.cached or job.view()

    def __getitem__(self, index: Any) -> Any:  # O(n): policies should iterate
        return [*self][index]

    def fitting(self, avail: int, after: JobView | None = None) -> JobView | None:
        """The first job after ``after`` (None: from the start) whose minimum is
        at most ``avail``, or None."""
        start = self._head if after is None else self._pos[after.id] + 1
        tree, cap = self._tree, self._cap
        if start >= cap:
            return None
        i = start + cap
        while tree[i] > avail:
            while i & 1:  # a right child: its parent's range ends here too
                i >>= 1
            if i == 0:
                return None
            i += 1
        while i < cap:
            i = 2 * i if tree[2 * i] <= avail else 2 * i + 1
        job = self._slots[i - cap]
        return job.cached or job.view()

    def fitting_after(self, after: JobView | None, avail: Callable[[], int]
                      ) -> Iterator[JobView]:
        """The jobs after ``after`` whose minimum is at most ``avail()`` at the
        moment each is asked for (what a backfill pass visits), until none fits."""
        job = after
        while (free := avail()) > 0:
            job = self.fitting(free, job)
            if job is None:
                return
            yield job

    def flagged(self) -> list[JobView]:
        """The priority job's view (DMR: a shrink made room for it), if queued."""
        if self.flagged_id is None or self.flagged_id not in self._pos:
            return []
        job = self._slots[self._pos[self.flagged_id]]
        return [job.cached or job.view()]


def in_transit(free: int, running: Sequence[JobView], total: int) -> int:
    return max(0, total - free - sum(j.nodes for j in running))


def reservation(now: float, need: int, avail: int,
                 ends: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """(shadow time, extra nodes) for a head that needs ``need`` nodes.

    ``avail`` nodes are free now and each (end, nodes) pair frees ``nodes``
    at ``end``. All jobs ending at the shadow time count towards the extra
    nodes. Returns (inf, 0) if the head can never get enough nodes.
    """
    if avail >= need:
        return now, avail - need
    heap = list(ends)  # popped in order: only the ends up to the shadow time are sorted
    heapq.heapify(heap)
    while heap:
        end, n = heapq.heappop(heap)
        avail += n
        while heap and heap[0][0] == end:  # every job ending then counts
            avail += heapq.heappop(heap)[1]
        if avail >= need:
            return end, avail - need
    return math.inf, 0


def easy(now: float, queue: Sequence[JobView], running: Sequence[JobView],
         free: int, total: int, size: Sizer,
         runtime: Callable[[JobView, int], float] | None = None,
         backfill_order: Callable[[JobView], Any] | None = None,
         ) -> tuple[list[Start], JobView | None, int]:
    """EASY backfilling with a start-size rule ``size``.

    Returns the starts, the head left waiting (None if every job started) and
    the free nodes left. A backfilled job must fit now and either end by the
    head's shadow time or use only the extra nodes; a flexible job gets the
    most nodes that keeps that promise. ``runtime(job, n)`` is a job's run
    time on ``n`` nodes: its walltime unless given (MEBF gives its model's, so
    a flexible job started small runs longer and must still keep the promise).
    ``backfill_order``: a key by which the jobs behind the head are tried
    (default: queue order); the head keeps its reservation either way.
    """
    run_for = runtime or (lambda job, n: job.walltime)
    starts: list[Start] = []
    begun: list[tuple[JobView, int]] = []
    jobs = iter(waiting(queue, total))
    head = None
    for job in jobs:
        n = size(job, free)
        if n is None:
            head = job
            break
        starts.append(Start(job.id, n))
        begun.append((job, n))
        free -= n
    if head is None:
        return starts, None, free
    # the running jobs' ends only matter for a head left waiting
    transit = in_transit(free + sum(n for _, n in begun), running, total)
    ends = [(j.end_estimate(now), j.nodes) for j in running]
    ends += [(now + run_for(job, n), n) for job, n in begun]
    shadow, extra = reservation(now, head.min_nodes, free + transit, ends)
    if size in BY_MINIMUM and isinstance(queue, JobQueue):  # only jobs whose minimum
        jobs = queue.fitting_after(head, lambda: free)  # fits can start: skip to them
    if backfill_order is not None:  # free only shrinks: a job that does not fit now never will
        jobs = iter(sorted((j for j in jobs if j.min_nodes <= free), key=backfill_order))
    for job in jobs:
        if free == 0:
            break
        n = size(job, free)
        if n is not None and now + run_for(job, n) > shadow:
            n = size(job, min(free, extra))  # then it may only use the extra nodes
            if n is not None:
                extra -= n
        if n is not None:
            starts.append(Start(job.id, n))
            free -= n
    return starts, head, free


def shrink_largest(donors: Iterable[JobView], need: int) -> dict[int, int]:
    """minAgree's shrinks: ``need`` nodes, one at a time from the donor holding
    the most (ties: lower id), never below a donor's minimum; nothing at all
    unless the donors can give ``need`` together. Returns {job id: nodes}."""
    donors = [j for j in donors if j.nodes > j.min_nodes]
    if need <= 0 or sum(j.nodes - j.min_nodes for j in donors) < need:
        return {}
    heap = [(-j.nodes, j.id, j.min_nodes) for j in donors]
    heapq.heapify(heap)
    taken: dict[int, int] = {}
    for _ in range(need):
        neg, jid, low = heapq.heappop(heap)
        taken[jid] = taken.get(jid, 0) + 1
        if -neg - 1 > low:
            heapq.heappush(heap, (neg + 1, jid, low))
    return taken


def grow_smallest(takers: Iterable[JobView], idle: int) -> dict[int, int]:
    """minAgree's grows: ``idle`` nodes, one at a time to the taker holding the
    fewest (ties: lower id), never beyond its maximum. Returns {job id: nodes}."""
    heap = [(j.nodes, j.id, j.max_nodes) for j in takers if j.nodes < j.max_nodes]
    heapq.heapify(heap)
    given: dict[int, int] = {}
    while idle > 0 and heap:
        nodes, jid, high = heapq.heappop(heap)
        given[jid] = given.get(jid, 0) + 1
        idle -= 1
        if nodes + 1 < high:
            heapq.heappush(heap, (nodes + 1, jid, high))
    return given


def grant_requests(queue: Sequence[JobView], running: Sequence[JobView], free: int,
                   total: int) -> tuple[list[Grow], int]:
    """Idle nodes to the evolving jobs that asked for them, node by node.

    Round robin over the resizable malleable or evolving running jobs with
    outstanding requests (a rigid or moldable job cannot take places later),
    oldest request first (then id), one node per job per round, never
    beyond a job's maximum, so that one large request does not starve the
    others. Nodes a ``priority`` queued job is owed (its minimum, less what
    is on its way back) are kept for it. Returns one ``Grow`` per job, in
    the order of their requests, and the free nodes left.
    """
    askers = sorted((j for j in running if j.requested > 0 and j.resizable and j.malleable),
                    key=lambda j: (j.requested_since or 0.0, j.id))
    if not askers:
        return [], free
    flagged = getattr(queue, "flagged", None)  # a JobQueue knows its priority job
    owed = sum(j.min_nodes for j in (flagged() if flagged else queue) if j.priority)
    spare = max(0, min(free, free + in_transit(free, running, total) - owed))
    wants = {j.id: max(0, min(j.requested, j.max_nodes - j.nodes)) for j in askers}
    given = dict.fromkeys(wants, 0)
    while spare > 0 and any(wants.values()):
        for jid, want in wants.items():
            if spare > 0 and want > 0:
                given[jid] += 1
                wants[jid] -= 1
                spare -= 1
    grants = [Grow(jid, k) for jid, k in given.items() if k]
    return grants, free - sum(g.nodes for g in grants)


def with_grants(running: Sequence[JobView], grants: Sequence[Grow]) -> list[JobView]:
    """The running jobs as they will be once ``grants`` are carried out: the
    granted nodes count as theirs (not in transit) and they take no other resize."""
    given = {g.job: g.nodes for g in grants}
    return [dataclasses.replace(j, nodes=j.nodes + given[j.id], resizable=False, requested=0)
            if j.id in given else j for j in running]


class Policy(abc.ABC):
    """A scheduling algorithm. ``resize_interval`` is the least time in
    seconds between two resizes of one job, so that a job is not kept busy
    redistributing work instead of computing.

    ``grants_requests``: whether the live scheduler grants evolving jobs'
    ``Evolving;Request`` (through ``decide``, from the views' ``requested``)
    and answers their ``Evolving;Check`` (through :meth:`answer`). The
    others refuse both with :data:`GATE`."""

    name: str = ""
    grants_requests: bool = False

    def __init__(self, resize_interval: float = 10.0) -> None:
        if resize_interval < 0:
            raise ValueError(f"resize_interval must be >= 0, not {resize_interval}")
        self.resize_interval = resize_interval

    @abc.abstractmethod
    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        """Decisions for this moment, to be applied in list order."""

    def may_resize(self, now: float, job: JobView) -> bool:
        """Whether the policy may grow or shrink ``job`` now: a malleable or evolving
        job that takes orders (``resizable``), not resized within ``resize_interval``."""
        return (job.malleable and job.resizable
                and (job.last_resize is None or now - job.last_resize >= self.resize_interval))

    def answer(self, now: float, job: JobView, queue: Sequence[JobView],
               running: Sequence[JobView], free: int, total: int,
               factor: int = 1) -> Grow | Shrink | None:
        """DMR's check_status for ``job`` (a running job's view carrying the
        check's min, max and preferred size): resize it, or None. Only
        policies that grant requests answer."""
        raise NotImplementedError(GATE.format(name=self.name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(resize_interval={self.resize_interval})"
