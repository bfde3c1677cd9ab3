"""Lending (``lending``): our successor to thrifty, built on the Kassel group's
``min-common-pool`` (:mod:`.agreements`).

The Kassel strategies shorten turnaround more than minAgree and thrifty do,
for two reasons (measured on the archive traces, section 8 of the evaluation):
they shrink running malleable jobs for *every* waiting job that the shrinks
can serve, not only for the head, promising it the nodes; and they give idle
nodes to running malleable jobs even while jobs wait. They pay with resizes:
most of those grows lend a node or two for a few minutes, and each comes back
with a shrink. Lending keeps the promises and keeps the lending, but lends
only when a loan pays:

1. **Promises as in min-common-pool.** Jobs start at their minimum through
   EASY; every waiting job that shrinks can serve is promised the nodes,
   taken from the jobs with the most nodes above their minimum first, and
   starts once as many nodes are idle.
2. **Thrifty's starts and grows.** A malleable job alone in the queue starts
   as wide as it may; EASY tries the jobs behind the head smallest estimated
   area first; with nobody waiting, idle nodes go to the jobs holding the
   fewest, and a grow is kept only if it shortens the job by at least
   ``min_gain`` and by ``gamma`` times its cost (:class:`.thrifty.Thrifty`).
3. **Loans that pay.** While jobs wait, the idle nodes (all of them, one
   grow) go to the resizable job with the most room below its maximum, and
   only if the share of the cluster lent, times how long the loan should
   last, is at least ``lend`` resize intervals. A loan should last until the
   head's reservation (EASY's shadow time, when the head would take the
   nodes) or the job's end, whichever is first. A loan of the whole cluster
   for ``lend`` intervals passes; a node or two for a few minutes does not.

Pseudo-code of one pass::

    start the jobs whose promise can be kept (as many nodes idle, oldest promise first)
    starts, head, idle = EASY(others, min size or as wide as it may when alone,
                              backfill order = walltime x minimum nodes)
    for each job still waiting, in queue order:
        if the resizable malleable jobs can give its minimum (most above minimum first):
            shrink them, promise it the nodes
    if nobody waits and nothing is promised:  thrifty's grows (fewest first, if they pay)
    else: j = the resizable, unshrunk job with the most room
          k = min(idle, room of j); last = min(shadow of head, end of j) - now
          lend k nodes to j if k / total * last >= lend * resize_interval
"""

from __future__ import annotations

from typing import Literal

from .._model import JobView
from .agreements import AgreementStrategy, Idle
from .planning import Policy, Sizer, min_agree_size, moldable_size
from .thrifty import ReconfigCost, area_first, paying_grows

__all__ = ["Lending", "LENDING_POLICIES"]


class Lending(AgreementStrategy):
    """See the module docstring. ``reconfig_cost``, ``gamma``, ``min_gain``,
    ``backfill``, ``start_wide``: as :class:`.thrifty.Thrifty`'s; ``lend``: the
    least loan, in shares of the cluster times resize intervals (0: every
    loan, as min-common-pool)."""

    def __init__(self, resize_interval: float = 10.0, *, reconfig_cost: ReconfigCost | None = None,
                 gamma: float = 2.0, min_gain: float | None = None, lend: float = 10.0,
                 backfill: Literal["area", "queue"] = "area", start_wide: bool = True) -> None:
        super().__init__(resize_interval, sizing="min", handover="common-pool")
        self.name = "lending"
        if min_gain is None:
            min_gain = resize_interval
        if gamma < 0 or min_gain < 0 or lend < 0:
            raise ValueError(f"gamma, min_gain and lend must be >= 0, got {gamma}, {min_gain} "
                             f"and {lend}")
        if backfill not in ("area", "queue"):
            raise ValueError(f"backfill must be 'area' or 'queue', got {backfill!r}")
        self.reconfig_cost, self.gamma, self.min_gain, self.lend = reconfig_cost, gamma, min_gain, lend
        self.backfill_order = area_first if backfill == "area" else None
        self.start_wide = start_wide

    def __repr__(self) -> str:
        return (f"Lending(resize_interval={self.resize_interval}, gamma={self.gamma}, "
                f"min_gain={self.min_gain}, lend={self.lend})")

    def _start_size(self, waiting: int) -> Sizer:
        return moldable_size if self.start_wide and waiting <= 1 else min_agree_size

    def _grow(self, takers: dict[int, JobView], idle: int, state: Idle) -> dict[int, int]:
        if state.head is None and not state.promises:  # nobody waits: thrifty's grows
            return paying_grows(state.now, takers, idle, self.min_gain, self.gamma,
                                self.reconfig_cost)
        return self._loans(takers, idle, state)

    def _loans(self, takers: dict[int, JobView], idle: int, state: Idle) -> dict[int, int]:
        """The loans of idle nodes while jobs wait: to one job, if it pays."""
        now, shadow = state.now, state.shadow(idle)
        for job in sorted(takers.values(), key=lambda j: (j.nodes - j.max_nodes, j.id)):
            k = min(idle, job.max_nodes - job.nodes)
            if k <= 0:
                break
            last = min(shadow, job.end_estimate(now)) - now
            if k / state.total * last >= self.lend * self.resize_interval:
                return {job.id: k}
        return {}


LENDING_POLICIES: dict[str, type[Policy]] = {"lending": Lending}
