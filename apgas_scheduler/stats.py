"""Run metrics, computed in one place: the simulator (``SimResult.metrics``),
the daemon's event log (``metrics.compute_metrics``) and the offline list
scheduler (``listsched.Schedule.metrics``) each gather their jobs' times and
node-seconds and call :func:`summarize`, so that a makespan or a mean wait
means the same thing wherever it is reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = ["JobTimes", "summarize", "mean", "TAU"]

TAU = 10.0
"""Bounded slowdown threshold in seconds (short jobs count as this long)."""


class JobTimes(NamedTuple):
    """One job's times (None: not reached). ``run``: its run time for the
    slowdowns (None: end - start)."""

    submit: float
    start: float | None
    end: float | None
    run: float | None = None


def mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def summarize(jobs: Iterable[JobTimes], *, used: float | None = None,
              capacity: float | None = None, nodes: int | None = None) -> dict[str, float | None]:
    """Makespan (first submission to last end), utilization (``used``
    node-seconds over ``capacity``, or over ``nodes`` times the makespan),
    mean wait (jobs that started), mean turnaround, slowdown and bounded
    slowdown (jobs that ended); None when undefined."""
    jobs = list(jobs)
    ends = [j.end for j in jobs if j.end is not None]
    makespan = max(ends) - min(j.submit for j in jobs) if ends else None
    if capacity is None and nodes is not None and makespan is not None:
        capacity = nodes * makespan
    turns, runs = [], []
    for j in jobs:
        if j.end is not None:
            turns.append(j.end - j.submit)
            runs.append(j.run if j.run is not None else j.end - (j.start or j.submit))
    return {
        "makespan": makespan,
        "utilization": used / capacity if used is not None and capacity else None,
        "mean_wait": mean([j.start - j.submit for j in jobs if j.start is not None]),
        "mean_turnaround": mean(turns),
        "mean_slowdown": mean([t / r if r > 0 else 1.0 for t, r in zip(turns, runs, strict=True)]),
        "mean_bounded_slowdown": mean([max(1.0, t / max(r, TAU)) for t, r in zip(turns, runs, strict=True)]),
    }
