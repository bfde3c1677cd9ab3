"""Scheduling policies: pure functions from a snapshot of the cluster to a
list of decisions, so that the live scheduler and a simulator share them.

A policy sees the waiting jobs (``queue``, in submission order), the running
jobs (``running``, ``nodes`` = current allotment), the idle nodes (``free``)
and the size of the cluster (``total``). It returns ``Start``/``Grow``/
``Shrink`` decisions that the engine applies in list order. Starts only use
``free``: nodes released by a ``Shrink`` come back later, and the engine then
calls ``decide`` again.

Nodes that are neither free nor held by a running job (``total - free -
sum(running.nodes)``) are taken to be on their way back (a shrink or an end
in progress): EASY counts them as free *now* when it computes the head's
reservation, and minAgree counts them towards the head before it shrinks
anyone, so that calls made while a shrink is in flight do not shrink again.

The four algorithms follow the ElasticJobScheduler of the malleable-APGAS
study (Posner et al.): FCFS, Backfilling and EASY-Backfilling with a moldable
extension, and the malleable minAgree algorithm. A fifth, evolving EASY
(``evolving``), serves programs that ask for nodes themselves: it grants
their requests first, then runs EASY (see :class:`EvolvingEasy`).
"""

from __future__ import annotations

import abc
import dataclasses
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._model import Decision, Grow, JobView, Shrink, Start

__all__ = [
    "Policy", "FCFS", "Backfilling", "EasyBackfilling", "MinAgree", "EvolvingEasy",
    "POLICIES", "get_policy", "policy_names", "easy", "moldable_size", "min_agree_size",
    "grant_requests", "with_grants", "GATE",
]

GATE = ("policy {name} does not grant evolving requests; run the scheduler with "
        "--policy evolving or dmr")
"""The refusal of ``Evolving;Request`` and ``Evolving;Check`` under a policy that
does not grant them."""

# How many nodes a job starts with when ``avail`` nodes may be used, or None
# if it cannot start on them.
Sizer = Callable[[JobView, int], int | None]


def moldable_size(job: JobView, avail: int) -> int | None:
    """The moldable extension: a moldable or malleable job takes as many nodes
    as it may, a rigid job exactly its size, an evolving job its minimum (it
    asks for more itself when it needs them); none starts below its minimum."""
    if avail < job.min_nodes:
        return None
    if job.cls in ("rigid", "evolving"):
        return job.min_nodes
    return min(job.max_nodes, avail)


def min_agree_size(job: JobView, avail: int) -> int | None:
    """minAgree starts malleable jobs small (they grow later when nodes are
    idle); moldable jobs cannot grow later, so they still take what they may."""
    if job.malleable:
        return job.min_nodes if avail >= job.min_nodes else None
    return moldable_size(job, avail)


_ORDER = operator.attrgetter("submit", "id")


def _waiting(queue: Iterable[JobView], total: int) -> list[JobView]:
    """Jobs that may ever start, in submission order (then id); a job larger
    than the cluster is skipped rather than allowed to block the queue."""
    waiting = [j for j in queue if j.min_nodes <= total]
    waiting.sort(key=_ORDER)  # engines pass it in order already: one cheap pass
    return waiting


def _estimated_end(now: float, job: JobView) -> float:
    """When a running job should end by its estimate (see ``JobView.end_estimate``)."""
    return job.end_estimate(now)


def _in_transit(free: int, running: Sequence[JobView], total: int) -> int:
    return max(0, total - free - sum(j.nodes for j in running))


def _reservation(now: float, need: int, avail: int,
                 ends: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """(shadow time, extra nodes) for a head that needs ``need`` nodes.

    ``avail`` nodes are free now and each (end, nodes) pair frees ``nodes``
    at ``end``. All jobs ending at the shadow time count towards the extra
    nodes. Returns (inf, 0) if the head can never get enough nodes.
    """
    if avail >= need:
        return now, avail - need
    for end, group in itertools.groupby(sorted(ends), key=lambda e: e[0]):
        avail += sum(n for _, n in group)
        if avail >= need:
            return end, avail - need
    return math.inf, 0


def easy(now: float, queue: Sequence[JobView], running: Sequence[JobView],
         free: int, total: int, size: Sizer) -> tuple[list[Start], JobView | None, int]:
    """EASY backfilling with a start-size rule ``size``.

    Returns the starts, the head left waiting (None if every job started) and
    the free nodes left. A backfilled job must fit now and either end by the
    head's shadow time or use only the extra nodes; a flexible job gets the
    most nodes that keeps that promise.
    """
    transit = _in_transit(free, running, total)
    ends = [(_estimated_end(now, j), j.nodes) for j in running]
    starts: list[Start] = []
    jobs = iter(_waiting(queue, total))
    head = None
    for job in jobs:
        n = size(job, free)
        if n is None:
            head = job
            break
        starts.append(Start(job.id, n))
        free -= n
        ends.append((now + job.walltime, n))
    if head is None:
        return starts, None, free
    shadow, extra = _reservation(now, head.min_nodes, free + transit, ends)
    for job in jobs:
        if free == 0:
            break
        if now + job.walltime <= shadow:
            n = size(job, free)
        else:
            n = size(job, min(free, extra))
            if n is not None:
                extra -= n
        if n is not None:
            starts.append(Start(job.id, n))
            free -= n
    return starts, head, free


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
    owed = sum(j.min_nodes for j in queue if j.priority)
    spare = max(0, min(free, free + _in_transit(free, running, total) - owed))
    askers = sorted((j for j in running if j.requested > 0 and j.resizable and j.malleable),
                    key=lambda j: (j.requested_since or 0.0, j.id))
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

    def answer(self, now: float, job: JobView, queue: Sequence[JobView],
               running: Sequence[JobView], free: int, total: int,
               factor: int = 1) -> Grow | Shrink | None:
        """DMR's check_status for ``job`` (a running job's view carrying the
        check's min, max and preferred size): resize it, or None. Only
        policies that grant requests answer."""
        raise NotImplementedError(GATE.format(name=self.name))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(resize_interval={self.resize_interval})"


class FCFS(Policy):
    """Start jobs from the head of the queue while the head fits; never
    overtake, so no job waits for a later one."""

    name = "fcfs"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        out: list[Decision] = []
        for job in _waiting(queue, total):
            n = moldable_size(job, free)
            if n is None:
                break
            out.append(Start(job.id, n))
            free -= n
        return out


class Backfilling(Policy):
    """Start every job that fits now, in queue order, without a reservation:
    good utilisation, but large jobs may starve."""

    name = "backfill"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        out: list[Decision] = []
        if free == 0:
            return out  # nothing can start, and it never resizes
        for job in _waiting(queue, total):
            n = moldable_size(job, free)
            if n is not None:
                out.append(Start(job.id, n))
                free -= n
                if free == 0:
                    break
        return out


class EasyBackfilling(Policy):
    """Backfill only jobs that do not delay the head of the queue beyond its
    reservation (computed from the users' walltime estimates)."""

    name = "easy"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        if free == 0:
            return []  # nothing can start, and it never resizes
        starts, _, _ = easy(now, queue, running, free, total, moldable_size)
        return list(starts)


class MinAgree(Policy):
    """The malleable algorithm (minAgree), in three steps.

    1. Start waiting jobs with EASY backfilling; malleable and evolving jobs
       start at their minimum, moldable jobs still take as many as they may.
    2. If a head is left waiting, shrink running malleable jobs to make room
       for its minimum: one node at a time from the job holding the most
       (ties: lower id), counting nodes already on their way back. Shrinks are
       issued only if the target can be reached, so that no job loses nodes
       for nothing; the head starts in a later call, once the nodes are back.
    3. Only when no job is left waiting, give the idle nodes to running
       malleable jobs below their maximum, one at a time to the job holding
       the fewest (ties: lower id). With a waiting head the idle nodes are
       kept, since they are being collected for it.

    Only jobs that are ``resizable`` and not resized within
    ``resize_interval`` seconds are shrunk or grown; a job started in this
    call is not running yet, so it is not grown in the same call. Shrinks
    and grows come as one decision per job, in id order, after the starts.
    """

    name = "malleable"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        starts, head, left = easy(now, queue, running, free, total, min_agree_size)
        out: list[Decision] = list(starts)
        if head is not None:
            avail = left + _in_transit(free, running, total)
            out += self._shrinks(now, running, head.min_nodes - avail)
        else:
            out += self._grows(now, running, left)
        return out

    def _may_resize(self, now: float, job: JobView) -> bool:
        return (job.malleable and job.resizable
                and (job.last_resize is None or now - job.last_resize >= self.resize_interval))

    def _shrinks(self, now: float, running: Sequence[JobView], need: int) -> list[Decision]:
        if need <= 0:
            return []
        donors = [j for j in running if self._may_resize(now, j) and j.nodes > j.min_nodes]
        if sum(j.nodes - j.min_nodes for j in donors) < need:
            return []
        heap = [(-j.nodes, j.id, j.min_nodes) for j in donors]
        heapq.heapify(heap)
        taken: dict[int, int] = {}
        for _ in range(need):
            neg, jid, low = heapq.heappop(heap)
            taken[jid] = taken.get(jid, 0) + 1
            if -neg - 1 > low:
                heapq.heappush(heap, (neg + 1, jid, low))
        return [Shrink(jid, k) for jid, k in sorted(taken.items())]

    def _grows(self, now: float, running: Sequence[JobView], idle: int) -> list[Decision]:
        heap = [(j.nodes, j.id, j.max_nodes) for j in running
                if self._may_resize(now, j) and j.nodes < j.max_nodes]
        heapq.heapify(heap)
        given: dict[int, int] = {}
        while idle > 0 and heap:
            nodes, jid, high = heapq.heappop(heap)
            given[jid] = given.get(jid, 0) + 1
            idle -= 1
            if nodes + 1 < high:
                heapq.heappush(heap, (nodes + 1, jid, high))
        return [Grow(jid, k) for jid, k in sorted(given.items())]


class EvolvingEasy(Policy):
    """Evolving EASY: EASY backfilling for clusters with evolving programs.

    1. Grant the outstanding grow requests of ready, idle evolving (or
       malleable) jobs with the idle nodes, node by node round robin
       (:func:`grant_requests`): a program that asked is already running
       and waits for the nodes, while queued jobs have not started.
    2. Run EASY with the moldable extension on the nodes left; evolving
       jobs start at their minimum and ask for more themselves.

    It never grows or shrinks a job on its own. A job's ``Evolving;Check``
    is answered with the DMR rules (:func:`scheduler.dmr.dmr_answer`).
    """

    name = "evolving"
    grants_requests = True

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        if free == 0:
            return []
        grants, left = grant_requests(queue, running, free, total)
        if left == 0:
            return list(grants)
        starts, _, _ = easy(now, queue, with_grants(running, grants), left, total, moldable_size)
        return [*grants, *starts]

    def answer(self, now: float, job: JobView, queue: Sequence[JobView],
               running: Sequence[JobView], free: int, total: int,
               factor: int = 1) -> Grow | Shrink | None:
        from .dmr import dmr_answer

        return dmr_answer(now, job, queue, running, free, total, factor)


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (FCFS, Backfilling, EasyBackfilling, MinAgree, EvolvingEasy)
}


def _registry() -> dict[str, Callable[..., Policy]]:
    """The live policies, then those from the later studies (MEBF, DMR)."""
    from .dmr import DMR_POLICIES
    from .mebf import MEBF_POLICIES

    return {**POLICIES, **MEBF_POLICIES, **DMR_POLICIES}


def policy_names() -> list[str]:
    return list(_registry())


def get_policy(name: str, **options: Any) -> Policy:
    """The policy called ``name``, built with ``options``."""
    registry = _registry()
    try:
        factory = registry[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(registry))}") from None
    return factory(**options)
