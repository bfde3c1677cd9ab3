"""The reconfiguration policy of the DMR API's Slurm plug-in (Iserte et al.):
a malleable job calls ``dmr_check_status(min, max, factor, preferred)`` at
its reconfiguring points and the resource manager answers "expand", "shrink"
or "no action", aiming at throughput rather than at the job's own speed.

Jobs in the simulator (and live malleable jobs) do not call in, so
every resizable malleable or evolving job that was not resized within
``resize_interval`` seconds (the DMR "checking inhibitor") is taken to ask,
each time :meth:`DMR.decide` runs, with its own ``min_nodes``, ``max_nodes``
and ``preferred`` and the policy's ``factor``. The answers, in id order (the
order in which the jobs are taken to ask):

1. **Request an action.** A job outside its [min, max] asks for a definite
   action: it grows to its minimum (if enough nodes are idle) or shrinks to
   its maximum. Our views keep every job inside its limits, so this only
   fires for a view built otherwise; it is kept so the three modes are all
   here.
2. **Preferred size** (jobs with ``preferred`` set). If no job is waiting,
   the job may grow up to its maximum. Otherwise it moves towards its
   preferred size: it shrinks to it, or grows towards it with idle nodes;
   at that size it gets "no action" and is never shrunk below it to let a
   queued job start (as in the paper's trace, where a queued 32-node job
   waited while five jobs ran at their preferred 8 nodes).
3. **Wide optimization** (jobs without a preference). A job shrinks (at
   most to its minimum) if that lets a queued job start; failing that, it
   grows with idle nodes up to its maximum, when no job waits or no waiting
   job could start anyway.

Details the paper leaves open, and our choices:

* Waiting jobs start with the live scheduler's EASY backfilling with the
  moldable extension (a malleable job takes what it may, up to its
  maximum), as Slurm's backfill plug-in starts them; jobs with a
  preference are then brought down to it while others wait, as in the
  paper's experiments ("launched with its maximum", "scaled-down as soon as
  possible").
* "A queued job that could be executed" is the head of the queue: the job
  that triggers a shrink is given top priority in DMR, and the head already
  has it, so the policy stays stateless and the queue order holds. The
  shrinks for it count idle nodes, nodes on their way back and the nodes
  released by preferred-size shrinks; they are issued only if together they
  reach the head's minimum, each job giving only what is still missing.
* While the head can start once released nodes are back, no job grows, so
  the idle nodes wait for it.
* ``factor`` (default 1: any size) restricts resizes to multiples or
  divisors of the current size by powers of ``factor``; a move towards a
  size stops at the last such size before it, except that a shrink for the
  head may pass it by one step to free enough nodes.
* Outstanding requests of evolving jobs (live only; the simulator's jobs
  never ask) are granted first, as evolving EASY does
  (:func:`apgas_scheduler.policies.grant_requests`).

A live evolving job (its view ``asks``) is left to call ``check_status``
itself and gets :func:`dmr_answer`: the same rules for that one job, with
the check's min, max, preferred size and factor, after the other jobs'
requests and the queue's starts; the resize interval does not apply (the
job's own inhibitor does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._model import Decision, Grow, JobView, Shrink
from .planning import Policy, easy, grant_requests, in_transit, moldable_size, with_grants

__all__ = ["DMR", "DMR_POLICIES", "dmr_answer"]


class DMR(Policy):
    """The DMR Slurm reconfiguration policy; see the module docstring."""

    name = "dmr"
    grants_requests = True

    def __init__(self, factor: int = 1, resize_interval: float = 10.0) -> None:
        super().__init__(resize_interval)
        if int(factor) != factor or factor < 1:
            raise ValueError(f"factor must be a whole number >= 1, not {factor}")
        self.factor = int(factor)

    def __repr__(self) -> str:
        return f"DMR(factor={self.factor}, resize_interval={self.resize_interval})"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        grants, free = grant_requests(queue, running, free, total)
        running = with_grants(running, grants)
        starts, head, idle = easy(now, queue, running, free, total, moldable_size)
        askers = sorted((j for j in running if self._asks(now, j)), key=lambda j: j.id)
        return [*grants, *starts,
                *_reconfigure(askers, head, idle, in_transit(free, running, total), self.factor)]

    def answer(self, now: float, job: JobView, queue: Sequence[JobView],
               running: Sequence[JobView], free: int, total: int,
               factor: int = 1) -> Grow | Shrink | None:
        return dmr_answer(now, job, queue, running, free, total, factor)

    def _asks(self, now: float, job: JobView) -> bool:
        """Whether the job is taken to call check_status now: it does not call
        itself, and its checking inhibitor (``resize_interval``) has passed."""
        return not job.asks and self.may_resize(now, job)


def dmr_answer(now: float, job: JobView, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int, factor: int = 1) -> Grow | Shrink | None:
    """DMR's answer to one job's check_status: the rules of :meth:`DMR.decide`
    for ``job`` alone (its view carries the check's min, max and preferred
    size), after the other jobs' outstanding requests and the starts of the
    queue have taken their idle nodes. None: no action, and for a job that is
    not resizable (not ready, or an order is in flight)."""
    if not job.resizable:
        return None
    others = [j for j in running if j.id != job.id]
    grants, free = grant_requests(queue, others, free, total)
    running = [*with_grants(others, grants), job]
    _, head, idle = easy(now, queue, running, free, total, moldable_size)
    plan = _reconfigure([job], head, idle, in_transit(free, running, total), factor)
    return next((d for d in plan if d.job == job.id and isinstance(d, (Grow, Shrink))), None)


def _reconfigure(askers: Sequence[JobView], head: JobView | None, idle: int, transit: int,
                 factor: int) -> list[Decision]:
    """The three modes for the jobs that ask (in this order), given the head
    EASY left waiting, the idle nodes after its starts and the nodes on their
    way back."""
    out: list[Decision] = []
    inside: list[JobView] = []
    for job in askers:
        if job.nodes < job.min_nodes:  # 1. request an action
            if job.min_nodes - job.nodes <= idle:
                out.append(Grow(job.id, job.min_nodes - job.nodes))
                idle -= job.min_nodes - job.nodes
        elif job.nodes > job.max_nodes:
            out.append(Shrink(job.id, job.nodes - job.max_nodes))
        else:
            inside.append(job)

    if head is None:  # 2. and 3.: nothing waits, so grow up to the maximum
        return out + _grows(inside, idle, lambda j: j.max_nodes, factor)

    coming = idle + transit
    shrunk: set[int] = set()
    for job in inside:  # 2. preferred size, from above
        if job.preferred and job.nodes > _pref(job):
            new = _toward(job, _pref(job), factor)
            if new < job.nodes:
                out.append(Shrink(job.id, job.nodes - new))
                shrunk.add(job.id)
                coming += job.nodes - new
    need = head.min_nodes - coming
    if need > 0:  # 3. shrink so that the head can start
        plan = _shrinks_for([j for j in inside if not j.preferred], need, factor)
        out += plan
        need -= sum(d.nodes for d in plan)
    if need > 0:  # the head cannot start: idle nodes go to the askers
        rest = [j for j in inside if j.id not in shrunk]
        out += _grows(rest, idle, lambda j: _pref(j) if j.preferred else j.max_nodes, factor)
    return out


def _pref(job: JobView) -> int:
    return max(job.min_nodes, min(job.preferred or job.max_nodes, job.max_nodes))


def _toward(job: JobView, goal: int, factor: int, room: int = 0) -> int:
    """The size nearest ``goal`` the job may take without passing it:
    within its limits, at most ``room`` nodes above its current size and
    reachable by the factor; its current size if there is none."""
    n, f = job.nodes, factor
    goal = max(job.min_nodes, min(goal, job.max_nodes, n + room))
    if f == 1 or goal == n:
        return goal
    size = n
    if goal > n:
        while size * f <= goal:
            size *= f
    else:
        while size % f == 0 and size // f >= goal:
            size //= f
    return size


def _grows(jobs: Sequence[JobView], idle: int, goal: Callable[[JobView], int],
           factor: int) -> list[Decision]:
    out: list[Decision] = []
    for job in jobs:
        if idle <= 0:
            break
        new = _toward(job, goal(job), factor, room=idle)
        if new > job.nodes:
            out.append(Grow(job.id, new - job.nodes))
            idle -= new - job.nodes
    return out


def _shrinks_for(jobs: Sequence[JobView], need: int, factor: int) -> list[Decision]:
    """Shrinks that free ``need`` nodes between them, or none."""
    out: list[Decision] = []
    for job in jobs:
        if need <= 0:
            break
        new = _toward(job, job.nodes - need, factor)
        f = factor
        if job.nodes - new < need and f > 1 and new % f == 0 and new // f >= job.min_nodes:
            new //= f  # one step past the goal, to free enough
        if new < job.nodes:
            out.append(Shrink(job.id, job.nodes - new))
            need -= job.nodes - new
    return out if need <= 0 else []


DMR_POLICIES: dict[str, Callable[..., Policy]] = {"dmr": DMR}
