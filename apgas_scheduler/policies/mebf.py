"""Malleable EASY Backfilling (MEBF): EASY backfilling that also shrinks and
expands running malleable jobs, guided by a scalability model and a
feasibility test (the ADMIRE study of malleable backfilling).

The paper gives the algorithm in prose plus listings that are only figures;
this is our reading of the prose. One call of :meth:`MEBF.decide`:

1. **Starts.** Jobs are served in queue order at their preferred size, or
   at what is free if that is less but at least their minimum (rigid jobs:
   their size). When the head cannot start, EASY backfilling follows: a job
   may overtake it if, at the size it would get, it ends by the head's
   shadow time or uses only nodes the head does not need. Run times come
   from the scalability model (``JobView.runtime_on``), ends of running jobs
   from ``JobView.end_estimate``.
2. **Reconfiguration.** With no job left waiting and idle nodes, *Expand*.
   With a head left waiting: if no node is idle, *Shrink* (every variant);
   if some are idle but too few for the head and nothing more could be
   backfilled, ``basic`` leaves the gap, ``shrink+`` shrinks anyway and
   ``expand+`` expands instead. Nothing is resized for the head while nodes
   already on their way back cover its need.

*Shrink* (for the head's minimum): candidates are the resizable malleable
jobs, least scalable first (highest ``rho``). Each may give at most
``share_factor`` of its nodes (rounded down, never below its minimum) and
gives only what is still missing, if the reconfiguration is feasible.
Shrinks are issued only if together they cover the head's need, so no job
loses nodes for nothing; the head starts in a later call, once they are back.

*Expand* (with the idle nodes): candidates are the resizable malleable jobs,
most scalable first (lowest ``rho``). Each is offered ``min(max - nodes,
idle)`` nodes (``GetResources``) and takes them all if the expand policy
accepts the amount and the reconfiguration is feasible:

* ``handoff``: only if the amount exceeds the job's current nodes (worth the
  overhead, a chance for jobs that started small);
* ``spare``: only if it exceeds ``spare_ratio`` times the job's nodes; the
  gains too small for that are left idle, a spare for jobs that arrive;
* ``intensive``: any amount.

*Feasibility*: a job is reconfigured only if it still has at least ``theta``
times its estimated run time (``walltime``, the user's estimate at the
preferred size) to go, and if its remaining time at the new size plus the
reconfiguration cost is at most ``gamma`` times its remaining time at the
current size.

Interpretations where the paper leaves details open:

* malleable means ``JobView.malleable`` (malleable or evolving jobs); rigid
  and moldable jobs are only started, never resized. Every flexible job,
  evolving ones included, starts at its preferred size (``pref``: its
  maximum when it names none), not at its minimum as in ``moldable_size``;
* "initial estimated execution time" (theta) is the user's ``walltime``,
  and "static execution time" (gamma) the time the job still needs at its
  current size, ``end_estimate(now) - now``; the model scales that
  remaining time by ``runtime_on(new) / runtime_on(nodes)``;
* a share is rounded down, so a job with fewer than ``1 / share_factor``
  nodes is not shrunk; an expand takes the whole offered amount;
* "previously reconfigured" jobs are those resized within
  ``resize_interval`` seconds or not ``resizable`` (an order in flight);
* the system state is judged after backfilling (the paper's loop reaches the
  same state once its backfill step finds no more job);
* a job started in this call is not resized in it;
* ties in scalability go to the lower id.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal

from .._model import Decision, Grow, JobView, Shrink, Start
from .planning import Policy, easy, in_transit, preferred_size

__all__ = ["MEBF", "MEBF_POLICIES", "mebf_size", "model_easy", "ReconfigCost"]

ReconfigCost = Callable[[JobView, int, int], float]
Variant = Literal["basic", "shrink+", "expand+"]
ExpandPolicy = Literal["handoff", "spare", "intensive"]

VARIANTS: tuple[str, ...] = ("basic", "shrink+", "expand+")
EXPAND_POLICIES: tuple[str, ...] = ("handoff", "spare", "intensive")


mebf_size = preferred_size
"""MEBF's start size: the preferred size if ``avail`` allows, else what is free
down to the minimum (:func:`~.planning.preferred_size`)."""


def model_easy(now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> tuple[list[Start], JobView | None, int]:
    """EASY backfilling with MEBF's start sizes, where a job's run time is
    the one its model gives at the size it gets (a flexible job started small
    runs longer than its estimate, and must still keep the head's promise)."""
    return easy(now, queue, running, free, total, mebf_size,
                runtime=lambda job, n: job.runtime_on(n))


class MEBF(Policy):
    """Malleable EASY Backfilling; see the module docstring for the algorithm.

    ``variant`` is "basic", "shrink+" or "expand+", ``expand`` the expand
    policy ("handoff", "spare" or "intensive"). ``reconfig_cost(job, old,
    new)`` is the model's reconfiguration overhead in seconds for the
    feasibility test (None: free); the engine charges the real cost itself.
    The instance's ``name`` tells the variant apart ("mebf", "mebf-shrink+",
    "mebf-expand+"), as in ``MEBF_POLICIES``.
    """

    name = "mebf"

    def __init__(self, variant: Variant = "basic", expand: ExpandPolicy = "handoff", *,
                 spare_ratio: float = 0.5, share_factor: float = 0.4, theta: float = 0.5,
                 gamma: float = 2.0, reconfig_cost: ReconfigCost | None = None,
                 resize_interval: float = 10.0) -> None:
        super().__init__(resize_interval)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
        if expand not in EXPAND_POLICIES:
            raise ValueError(f"expand must be one of {', '.join(EXPAND_POLICIES)}, not {expand!r}")
        if spare_ratio < 0 or not 0 <= share_factor <= 1 or theta < 0 or gamma <= 0:
            raise ValueError("need spare_ratio >= 0, 0 <= share_factor <= 1, theta >= 0, gamma > 0")
        self.variant = variant
        self.expand = expand
        self.spare_ratio = spare_ratio
        self.share_factor = share_factor
        self.theta = theta
        self.gamma = gamma
        self.reconfig_cost = reconfig_cost
        self.name = "mebf" if variant == "basic" else f"mebf-{variant}"

    def __repr__(self) -> str:
        return (f"MEBF(variant={self.variant!r}, expand={self.expand!r}, "
                f"spare_ratio={self.spare_ratio}, share_factor={self.share_factor}, "
                f"theta={self.theta}, gamma={self.gamma}, resize_interval={self.resize_interval})")

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        starts, head, idle = model_easy(now, queue, running, free, total)
        out: list[Decision] = list(starts)
        if head is None:
            return out + self._expand(now, running, idle)
        need = head.min_nodes - idle - in_transit(free, running, total)
        if need <= 0:
            return out  # the nodes it needs are on their way back
        if idle == 0 or self.variant == "shrink+":
            return out + self._shrink(now, running, need)
        if self.variant == "expand+":
            return out + self._expand(now, running, idle)
        return out  # basic leaves a gap that nothing fits

    # -- reconfigurations ----------------------------------------------------------------
    def _shrink(self, now: float, running: Sequence[JobView], need: int) -> list[Decision]:
        donors = sorted((j for j in running if self.may_resize(now, j) and j.nodes > j.min_nodes),
                        key=lambda j: (-j.rho, j.id))
        out: list[Decision] = []
        for job in donors:
            if need <= 0:
                break
            share = math.floor(self.share_factor * job.nodes + 1e-9)
            take = min(share, job.nodes - job.min_nodes, need)
            if take > 0 and self._feasible(now, job, job.nodes - take):
                out.append(Shrink(job.id, take))
                need -= take
        return out if need <= 0 else []

    def _expand(self, now: float, running: Sequence[JobView], idle: int) -> list[Decision]:
        takers = sorted((j for j in running if self.may_resize(now, j) and j.nodes < j.max_nodes),
                        key=lambda j: (j.rho, j.id))
        out: list[Decision] = []
        for job in takers:
            if idle <= 0:
                break
            amount = min(job.max_nodes - job.nodes, idle)  # GetResources
            if amount > self._least_expand(job) and self._feasible(now, job, job.nodes + amount):
                out.append(Grow(job.id, amount))
                idle -= amount
        return out

    def _least_expand(self, job: JobView) -> float:
        """An expand must add more nodes than this, by the expand policy."""
        if self.expand == "handoff":
            return job.nodes
        if self.expand == "spare":
            return self.spare_ratio * job.nodes
        return 0

    def _feasible(self, now: float, job: JobView, new: int) -> bool:
        """The paper's feasibility test: enough time left for a resize to be
        worth it, and the remaining time at ``new`` nodes (plus the
        reconfiguration cost) at most ``gamma`` times the static one."""
        left = job.end_estimate(now) - now
        # (no estimate, no model: such a job is not resized)
        if job.walltime <= 0 or left <= 0 or left < self.theta * job.walltime:
            return False
        cost = self.reconfig_cost(job, job.nodes, new) if self.reconfig_cost else 0.0
        after = left * job.runtime_on(new) / job.runtime_on(job.nodes) + cost
        return after <= self.gamma * left


MEBF_POLICIES: dict[str, Callable[..., Policy]] = {
    "mebf": functools.partial(MEBF, variant="basic"),
    "mebf-shrink+": functools.partial(MEBF, variant="shrink+"),
    "mebf-expand+": functools.partial(MEBF, variant="expand+"),
}
