"""The Kassel group's nine malleable strategies (Posner, Hupfeld and Finnerty,
PECS 2023; their ElastiSim schedulers in ``projectwagomu/MalleableJobScheduling``),
written here from the descriptions in that repository as published baselines.

Each strategy is a **sizing** crossed with a **hand-over**; the registry names
them ``<sizing>-<hand-over>`` (``min-agreement`` ... ``pref-steal-agreement``).

Sizing: how big a job starts, whom a shrink takes from, whom idle nodes go to.

* ``min``: jobs start at their minimum. A shrink takes from the jobs with the
  most nodes above their minimum first, each giving all it holds above it.
  Idle nodes go to the jobs with the fewest nodes above their minimum first,
  each grown up to its maximum.
* ``avg``: jobs start at their minimum. Shrinks and grows go one node at a
  time, to the job whose share of its range (``(nodes - min) / (max - min)``)
  is the highest (shrink) or the lowest (grow), so that the shares even out.
* ``pref``: jobs start at their preferred size, or on what is free down to
  their minimum. A shrink tries, in turn: the preferred size for the waiting
  job while every donor keeps its preferred size; the minimum while donors
  keep their preferred size; the minimum while donors keep their minimum.
  Donors that hold the most above their preferred size give first, in every
  try (as the Kassel code orders them). Idle nodes grow the jobs furthest
  below their preferred size first, each up to it, and then each up to its
  maximum.

Hand-over: nodes that a shrink frees for a waiting job are promised to it (an
*agreement*) and kept from everyone else; the job starts once it can have
them.

* ``agreement``: a job starts when its own promised nodes are all back;
* ``common-pool``: a job starts as soon as that many nodes are free, promised
  or not (it takes promised ones first; the promise is then on the rest);
* ``steal-agreement``: a job starts as soon as that many *promised* nodes are
  free, even if they were promised to another waiting job, which then waits
  for the nodes still on their way.

One pass (``decide``)::

    start the jobs whose agreement can be met (hand-over rule, in the order made)
    starts = EASY(the other waiting jobs, sizing's start size, the unpromised idle nodes)
    for each job still waiting, in queue order:
        if the resizable malleable jobs can give its size (sizing's rule, all or nothing):
            shrink them, and promise the nodes to it
    grow the resizable malleable jobs with the idle nodes left (sizing's rule)

Our reading where the code of the repository and our model differ:

* Nodes here are counts, not names. A policy sees only how many nodes are on
  their way back from shrinks (``in_transit``); every shrink of these
  strategies is for an agreement, so the promised nodes that are back are
  the promised ones less those in transit. Under ``agreement`` they are taken
  to come back in the order they were promised (in the simulator a shrink's
  cost differs little between jobs), so a job's own nodes are back when every
  earlier promise's are too.
* Starts go through our EASY (the head's reservation from the users'
  estimates), which is what "FCFS with backfilling" and the repository's
  check that a job does not delay the head amount to.
* A job is shrunk or grown only when :meth:`Policy.may_resize` allows (a
  job that takes orders, not resized within ``resize_interval``), as in our
  minAgree; a job shrunk in a pass is not grown in it.
* Only the malleable (and evolving) jobs are resized; moldable jobs start as
  our minAgree starts them (as large as they may).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

from .._model import Decision, Grow, JobView, Shrink, Start
from .planning import JobQueue, Policy, Sizer, easy, in_transit, min_agree_size, preferred_size, reservation

__all__ = ["AgreementStrategy", "AGREEMENT_POLICIES", "SIZINGS", "HANDOVERS", "Idle"]

Sizing = Literal["min", "avg", "pref"]
Handover = Literal["agreement", "common-pool", "steal-agreement"]
SIZINGS: tuple[str, ...] = ("min", "avg", "pref")
HANDOVERS: tuple[str, ...] = ("agreement", "common-pool", "steal-agreement")


class Idle(NamedTuple):
    """What a grow rule knows of the idle nodes it is given: the time, the
    cluster's size, the head EASY left waiting (None: none), the jobs that hold
    nodes (the running ones, those just started, the promised nodes as one
    job that never ends) and whether any job holds a promise."""

    now: float
    total: int
    head: JobView | None
    holders: list[JobView]
    promises: bool

    def shadow(self, idle: int) -> float:
        """When the head's reservation begins (EASY's shadow time; inf: no head)."""
        if self.head is None:
            return math.inf
        return reservation(self.now, self.head.min_nodes, idle,
                           [(j.end_estimate(self.now), j.nodes) for j in self.holders])[0]


def _preferred(job: JobView) -> int:
    return max(job.min_nodes, min(job.pref, job.max_nodes))


def _share(nodes: int, job: JobView) -> float:
    """The share of its range a job holds at ``nodes`` (avg's measure)."""
    span = job.max_nodes - job.min_nodes
    return (nodes - job.min_nodes) / span if span > 0 else 1.0


class AgreementStrategy(Policy):
    """One of the nine strategies; see the module docstring. ``sizing``: "min",
    "avg" or "pref"; ``handover``: "agreement", "common-pool" or
    "steal-agreement". The promises live in the policy object, so one object
    serves one cluster."""

    def __init__(self, resize_interval: float = 10.0, *, sizing: Sizing = "min",
                 handover: Handover = "agreement") -> None:
        super().__init__(resize_interval)
        if sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {', '.join(SIZINGS)}, got {sizing!r}")
        if handover not in HANDOVERS:
            raise ValueError(f"handover must be one of {', '.join(HANDOVERS)}, got {handover!r}")
        self.sizing, self.handover = sizing, handover
        self.name = f"{sizing}-{handover}"
        self._size = preferred_size if sizing == "pref" else min_agree_size
        self._promised: dict[int, int] = {}  # waiting job -> nodes promised, in the order made

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(resize_interval={self.resize_interval}, "
                f"sizing={self.sizing!r}, handover={self.handover!r})")

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        transit = in_transit(free, running, total)
        waiting = _waiting(queue, self._promised)
        self._promised = {i: n for i, n in self._promised.items() if i in waiting}
        started = self._hand_over(free, transit)
        out: list[Decision] = [Start(i, n) for i, n in started.items()]
        for i in started:
            del self._promised[i]
        left = free - sum(started.values())
        promised = sum(self._promised.values())
        back = max(0, min(promised - transit, left))  # promised nodes that are idle
        # EASY sees the jobs just handed their nodes as running and the promised nodes
        # (back or on their way) as held for good, and the rest of the transit as coming back
        others = [*running, *(dataclasses.replace(waiting[i], nodes=n, start=now)
                              for i, n in started.items())]
        if (kept := back + min(transit, promised)) > 0:
            others.append(JobView(-1, "rigid", kept, kept, math.inf, now, nodes=kept, start=now))
        pending = queue if not self._promised and not started else \
            [j for j in queue if j.id not in self._promised and j.id not in started]
        waiting_now = len(queue) - len(self._promised) - len(started)
        starts, head, idle = easy(now, pending, others, left - back, total,
                                  self._start_size(waiting_now), backfill_order=self.backfill_order)
        out += starts
        begun = {s.job for s in starts}
        donors = {j.id: j for j in running if self.may_resize(now, j)}
        sizes = {i: j.nodes for i, j in donors.items()}
        for job in pending:
            if job.id in begun:
                continue
            if not any(sizes[i] > j.min_nodes for i, j in donors.items()):
                break  # nobody can give any more
            got = self._shrink_for(job, donors, sizes)
            if got:
                self._promised[job.id] = got
        shrunk = {i for i, j in donors.items() if sizes[i] < j.nodes}
        out += [Shrink(i, donors[i].nodes - sizes[i]) for i in sorted(shrunk)]
        takers = {i: j for i, j in donors.items() if i not in shrunk}
        grown = self._grow(takers, idle, Idle(now, total, head, others, bool(self._promised)))
        out += [Grow(i, k) for i, k in sorted(grown.items()) if k > 0]
        return out

    # -- hooks for a strategy built on this one (:mod:`.lending`) ----------------------------
    backfill_order: Callable[[JobView], Any] | None = None
    """The order in which EASY tries the jobs behind the head (None: queue order)."""

    def _start_size(self, waiting: int) -> Sizer:
        """How jobs start, when ``waiting`` jobs wait with no promise."""
        return self._size

    # -- hand-over -----------------------------------------------------------------------
    def _hand_over(self, free: int, transit: int) -> dict[int, int]:
        """The waiting jobs whose promise can be kept now: {job: nodes}."""
        back = max(0, min(sum(self._promised.values()) - transit, free))
        started: dict[int, int] = {}
        if self.handover == "agreement":
            due = 0
            for i, n in self._promised.items():
                due += n
                if due > back:
                    break  # later promises' nodes come back after this one's
                started[i] = n
        elif self.handover == "steal-agreement":
            for i, n in self._promised.items():
                if back == 0:
                    break
                if n <= back:
                    started[i], back = n, back - n
        else:  # common-pool
            for i, n in self._promised.items():
                if free == 0:
                    break
                if n <= free:
                    started[i], free = n, free - n
        return started

    # -- shrinks -------------------------------------------------------------------------
    def _shrink_for(self, job: JobView, donors: dict[int, JobView],
                    sizes: dict[int, int]) -> int:
        """Shrink ``sizes`` for ``job`` by the sizing's rule; the nodes it is
        promised (0: none, and ``sizes`` unchanged)."""
        if self.sizing == "pref":
            tries = [(_preferred(job), _preferred), (job.min_nodes, _preferred),
                     (job.min_nodes, lambda j: j.min_nodes)]
            for need, keep in tries:  # the donors most above preferred first, in every try
                if _take_largest(need, donors, sizes, keep, rank=_preferred):
                    return need
            return 0
        if self.sizing == "min":
            ok = _take_largest(job.min_nodes, donors, sizes, lambda j: j.min_nodes)
        else:
            ok = _take_by_share(job.min_nodes, donors, sizes)
        return job.min_nodes if ok else 0

    # -- grows ---------------------------------------------------------------------------
    def _grow(self, takers: dict[int, JobView], idle: int, state: Idle) -> dict[int, int]:
        """Grows of ``takers`` (resizable, not shrunk in this pass) with ``idle`` nodes."""
        sizes = {i: j.nodes for i, j in takers.items()}
        if self.sizing == "avg":
            while idle > 0:
                open_ = [(_share(sizes[i], j), i) for i, j in takers.items()
                         if sizes[i] < j.max_nodes]
                if not open_:
                    break
                _, i = min(open_)
                sizes[i] += 1
                idle -= 1
        else:
            base: Callable[[JobView], int] = ((lambda j: j.min_nodes) if self.sizing == "min"
                                              else _preferred)
            targets = [(lambda j: j.max_nodes)] if self.sizing == "min" else \
                [_preferred, lambda j: j.max_nodes]
            for target in targets:
                for i in sorted(takers, key=lambda i: (sizes[i] - base(takers[i]), i)):
                    k = max(0, min(target(takers[i]) - sizes[i], idle))
                    sizes[i] += k
                    idle -= k
        return {i: sizes[i] - j.nodes for i, j in takers.items()}


def _waiting(queue: Sequence[JobView], promised: dict[int, int]) -> dict[int, JobView]:
    """The views of the promised jobs that still wait."""
    if isinstance(queue, JobQueue):
        found = {i: queue.view_of(i) for i in promised}
        return {i: v for i, v in found.items() if v is not None}
    return {j.id: j for j in queue if j.id in promised}


def _take_largest(need: int, donors: dict[int, JobView], sizes: dict[int, int],
                  keep: Callable[[JobView], int], rank: Callable[[JobView], int] | None = None
                  ) -> bool:
    """min's and pref's shrink: ``need`` nodes from the donors holding the most
    above ``rank`` (default: what they keep), each giving all it holds above what
    it keeps; all or nothing."""
    if need <= 0:
        return False
    above = rank or keep
    order = sorted(donors, key=lambda i: (-(sizes[i] - above(donors[i])), i))
    taken: dict[int, int] = {}
    for i in order:
        k = min(need, max(0, sizes[i] - max(keep(donors[i]), donors[i].min_nodes)))
        if k:
            taken[i], need = k, need - k
        if need == 0:
            for j, n in taken.items():
                sizes[j] -= n
            return True
    return False


def _take_by_share(need: int, donors: dict[int, JobView], sizes: dict[int, int]) -> bool:
    """avg's shrink: ``need`` nodes, one at a time from the donor holding the
    largest share of its range; all or nothing."""
    if need <= 0:
        return False
    trial = dict(sizes)
    for _ in range(need):
        open_ = [(-_share(trial[i], j), i) for i, j in donors.items() if trial[i] > j.min_nodes]
        if not open_:
            return False
        _, i = min(open_)
        trial[i] -= 1
    sizes.update(trial)
    return True


def _factory(sizing: Sizing, handover: Handover) -> Callable[..., AgreementStrategy]:
    def make(resize_interval: float = 10.0) -> AgreementStrategy:
        return AgreementStrategy(resize_interval, sizing=sizing, handover=handover)
    make.__doc__ = f"``{sizing}-{handover}``: see :class:`AgreementStrategy`."
    return make


AGREEMENT_POLICIES: dict[str, Callable[..., Policy]] = {
    f"{s}-{h}": _factory(s, h) for h in HANDOVERS for s in SIZINGS  # type: ignore[arg-type]
}
"""The nine strategies by their registry names."""
