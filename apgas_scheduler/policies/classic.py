"""The built-in scheduling policies of the malleable-APGAS study, pure functions from a snapshot of the cluster to a
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

from collections.abc import Sequence

from .._model import Decision, Grow, JobView, Shrink, Start
from .planning import (
    JobQueue,
    Policy,
    easy,
    grant_requests,
    grow_smallest,
    in_transit,
    min_agree_size,
    moldable_size,
    shrink_largest,
    waiting,
    with_grants,
)

__all__ = ["FCFS", "Backfilling", "EasyBackfilling", "MinAgree", "EvolvingEasy", "POLICIES"]

class FCFS(Policy):
    """Start jobs from the head of the queue while the head fits; never
    overtake, so no job waits for a later one."""

    name = "fcfs"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        out: list[Decision] = []
        for job in waiting(queue, total):
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
        jobs = (queue.fitting_after(None, lambda: free) if isinstance(queue, JobQueue)
                else waiting(queue, total))  # a JobQueue skips to the jobs that fit
        for job in jobs:
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
            avail = left + in_transit(free, running, total)
            out += self._shrinks(now, running, head.min_nodes - avail)
        else:
            out += self._grows(now, running, left)
        return out

    def _shrinks(self, now: float, running: Sequence[JobView], need: int) -> list[Decision]:
        taken = shrink_largest((j for j in running if self.may_resize(now, j)), need)
        return [Shrink(jid, k) for jid, k in sorted(taken.items())]

    def _grows(self, now: float, running: Sequence[JobView], idle: int) -> list[Decision]:
        given = grow_smallest((j for j in running if self.may_resize(now, j)), idle)
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
    is answered with the DMR rules (:func:`apgas_scheduler.policies.dmr.dmr_answer`).
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
