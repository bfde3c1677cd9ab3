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
    user's estimate of the run time in seconds at ``max_nodes`` (policies use it
    for reservations). For a running job, ``nodes`` is its current allotment,
    ``start`` its start time and ``last_resize`` the time of its last grow or
    shrink (``None`` if never); ``resizable`` is True once a malleable or
    evolving job has registered and no order to it is in flight.
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
