"""Thrifty malleable backfilling (``thrifty``): our own policy.

minAgree (:class:`~apgas_scheduler.policies.classic.MinAgree`) gets the most out
of malleable jobs of the published policies we run, but it pays with resizes:
every malleable job starts at its minimum and is grown at the next pass, and
every idle node is handed out however little it gains. Thrifty keeps
minAgree's two good moves (shrink running jobs so the head starts, give idle
nodes to the jobs that hold the fewest) and changes three things:

1. **Start wide when nobody waits behind.** A malleable job that is the only
   one queued starts on as many nodes as it may (up to its maximum), as a
   moldable job would: it needs no grow later, and it can be shrunk at once
   if a job comes (its first resize is not held back by ``resize_interval``).
   With others queued behind it, it starts at its minimum, as in minAgree, so
   that more jobs run and each runs more efficiently.
2. **Backfill the smallest first.** The head of the queue keeps EASY's
   reservation, so no job waits for a later one beyond it; the jobs behind it
   are tried smallest estimated area (walltime x minimum nodes) first rather
   than in submission order, which lets more short jobs through each gap.
3. **Grow only when it pays.** A grow must shorten the job's remaining time
   by at least ``min_gain`` seconds (by default the resize interval) and by
   ``gamma`` times the cost of the resize. A grow locks its nodes in the job
   for ``resize_interval`` seconds, when the next job may need them: it should
   save at least that long.

Pseudo-code of one pass (``decide``)::

    size(job) = max nodes if job is alone in the queue else its minimum
    starts, head, idle = EASY(queue, size, backfill order = area)
    if head waits:   shrink the resizable jobs largest first for head.min - idle - in transit
    else:            assign idle nodes one at a time to the resizable jobs holding the fewest
                     keep job j's grow k -> k' only if
                     remaining(j, k) - remaining(j, k') >= max(min_gain, gamma * cost(j, k, k'))

Cost model: ``remaining(j, k)`` is the job's remaining time at ``k`` nodes, its
estimated end (``end_estimate``) less now at its current size, scaled by
``runtime_on(k) / runtime_on(nodes)`` (Amdahl's law when the job's serial
fraction is known, else the rho model: the model MEBF uses); ``cost`` is
``reconfig_cost(job, old, new)`` (the simulator's :class:`Reconfig` is one;
none: free).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from .._model import Decision, Grow, JobView, Shrink
from .planning import Policy, easy, grow_smallest, in_transit, min_agree_size, moldable_size, shrink_largest

__all__ = ["Thrifty", "THRIFTY_POLICIES", "area_first", "pays", "paying_grows", "ReconfigCost"]

ReconfigCost = Callable[[JobView, int, int], float]


def area_first(job: JobView) -> tuple[float, float, int]:
    """Smallest estimated area (walltime x minimum nodes) first: thrifty's backfill order."""
    return job.walltime * job.min_nodes, job.submit, job.id


def pays(now: float, job: JobView, new: int, min_gain: float, gamma: float,
         reconfig_cost: ReconfigCost | None) -> bool:
    """Whether growing ``job`` to ``new`` nodes shortens its remaining time by at
    least ``min_gain`` and by ``gamma`` times the resize's cost (thrifty's rule)."""
    left = job.end_estimate(now) - now
    gain = left * (1.0 - job.runtime_on(new) / job.runtime_on(job.nodes))
    cost = reconfig_cost(job, job.nodes, new) if reconfig_cost else 0.0
    return gain >= max(min_gain, gamma * cost)


def paying_grows(now: float, takers: dict[int, JobView], idle: int, min_gain: float, gamma: float,
                 reconfig_cost: ReconfigCost | None) -> dict[int, int]:
    """Thrifty's grows: ``idle`` nodes dealt one at a time to the ``takers`` holding
    the fewest (:func:`grow_smallest`), each grow kept only if it :func:`pays`."""
    given = grow_smallest(takers.values(), idle)
    return {i: k for i, k in given.items()
            if pays(now, takers[i], takers[i].nodes + k, min_gain, gamma, reconfig_cost)}


class Thrifty(Policy):
    """See the module docstring. ``reconfig_cost(job, old, new)``: the seconds a
    resize costs; ``gamma``: how many times its cost a grow must gain;
    ``min_gain``: the least gain in seconds worth a grow (None: ``resize_interval``;
    both 0: every grow, as minAgree); ``backfill``: ``"area"`` (smallest first) or ``"queue"`` (submission
    order, as EASY); ``start_wide``: whether a malleable job alone in the queue
    starts on up to its maximum (else at its minimum, as minAgree)."""

    name = "thrifty"

    def __init__(self, resize_interval: float = 10.0, *, reconfig_cost: ReconfigCost | None = None,
                 gamma: float = 2.0, min_gain: float | None = None,
                 backfill: Literal["area", "queue"] = "area", start_wide: bool = True) -> None:
        super().__init__(resize_interval)
        if min_gain is None:
            min_gain = resize_interval
        if gamma < 0 or min_gain < 0:
            raise ValueError(f"gamma and min_gain must be >= 0, got {gamma} and {min_gain}")
        if backfill not in ("area", "queue"):
            raise ValueError(f"backfill must be 'area' or 'queue', got {backfill!r}")
        self.reconfig_cost = reconfig_cost
        self.gamma, self.min_gain = gamma, min_gain
        self.order = area_first if backfill == "area" else None
        self.start_wide = start_wide

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        size = moldable_size if self.start_wide and len(queue) <= 1 else min_agree_size
        starts, head, left = easy(now, queue, running, free, total, size, backfill_order=self.order)
        out: list[Decision] = list(starts)
        if head is not None:
            need = head.min_nodes - left - in_transit(free, running, total)
            taken = shrink_largest((j for j in running if self.may_resize(now, j)), need)
            return out + [Shrink(jid, k) for jid, k in sorted(taken.items())]
        takers = {j.id: j for j in running if self.may_resize(now, j)}
        given = paying_grows(now, takers, left, self.min_gain, self.gamma, self.reconfig_cost)
        return out + [Grow(jid, k) for jid, k in sorted(given.items())]


THRIFTY_POLICIES: dict[str, type[Policy]] = {Thrifty.name: Thrifty}
