"""What policies see and what they decide: plain values shared by the live
scheduler and the simulator."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["JobClass", "JobView", "Start", "Grow", "Shrink", "Decision", "CLASSES"]

JobClass = Literal["rigid", "moldable", "malleable", "evolving"]
CLASSES: tuple[str, ...] = ("rigid", "moldable", "malleable", "evolving")


@dataclasses.dataclass(frozen=True)
class JobView:
    """A job as a policy sees it.

    ``min_nodes``/``max_nodes`` are equal for rigid jobs. ``walltime`` is the
    user's estimate of the run time in seconds at its preferred size
    (``preferred``, 0 meaning ``max_nodes``); policies use it for reservations.
    For a running job, ``nodes`` is its current allotment, ``start`` its start
    time and ``last_resize`` the time of its last grow or shrink (``None`` if
    never); ``resizable`` is True once a malleable or evolving job has
    registered and no order to it is in flight.

    The job's model, for policies that use one (MEBF, DMR): ``rho`` is its
    scalability (0 linear, larger sub-linear; see :meth:`runtime_on`), and
    ``expected_end`` the engine's estimate of when a running job ends at its
    current size (``None``: start + walltime, as the live scheduler knows no
    better). ``serial``, when known, is its Amdahl serial fraction, and then
    :meth:`runtime_on` follows Amdahl's law instead of ``rho`` (the simulator's
    ``amdahl`` model tells policies the law it runs jobs by).

    Evolving jobs' asks, for the policies that grant them (``grants_requests``):
    ``requested`` is how many more nodes a running job asked for and has not
    yet been given, ``requested_since`` when the oldest of those requests
    came. ``priority`` marks a queued job that a resize was made for (DMR's
    check_status shrank a job so that it could start): requests wait for it.
    ``asks``: the job asks for its resizes itself (a live evolving program,
    with ``Evolving;Check``), so DMR, which takes silent jobs to ask at every
    pass, leaves it to its own calls.
    """

    id: int
    cls: JobClass
    min_nodes: int
    max_nodes: int
    walltime: float
    submit: float
    nodes: int = 0
    start: float | None = None
    last_resize: float | None = None
    resizable: bool = False
    preferred: int = 0
    rho: float = 0.0
    expected_end: float | None = None
    requested: int = 0
    requested_since: float | None = None
    priority: bool = False
    asks: bool = False
    serial: float | None = None

    @property
    def pref(self) -> int:
        """The size the walltime estimate is for."""
        return self.preferred or self.max_nodes

    def runtime_on(self, k: int) -> float:
        """Estimated run time on ``k`` nodes: ``walltime * (pref / k) ** (1 - rho)``,
        i.e. speed-up ``k ** (1 - rho)`` (our reading of the MEBF study's rho model),
        or Amdahl's law when ``serial`` is known."""
        if self.serial is not None:
            s = self.serial
            return self.walltime * (s + (1 - s) / k) / (s + (1 - s) / self.pref)
        return self.walltime * (self.pref / k) ** (1.0 - self.rho)

    def end_estimate(self, now: float) -> float:
        """When a running job should end; an overdue job is expected to end now."""
        if self.expected_end is not None:
            return max(now, self.expected_end)
        start = now if self.start is None else self.start
        return max(now, start + self.walltime)

    @property
    def malleable(self) -> bool:
        return self.cls in ("malleable", "evolving")

    @property
    def flexible(self) -> bool:
        """Its size at start may be chosen (moldable, malleable, evolving)."""
        return self.cls != "rigid"


@dataclasses.dataclass(frozen=True)
class Start:
    job: int
    nodes: int


@dataclasses.dataclass(frozen=True)
class Grow:
    job: int
    nodes: int  # how many nodes to add


@dataclasses.dataclass(frozen=True)
class Shrink:
    job: int
    nodes: int  # how many nodes to take away


Decision = Start | Grow | Shrink
