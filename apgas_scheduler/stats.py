"""Run metrics, computed in one place: the simulator (``SimResult.metrics``),
the daemon's event log (``metrics.compute_metrics``) and the offline list
scheduler (``listsched.Schedule.metrics``) each gather their jobs' times and
node-seconds and call :func:`summarize`, so that a makespan or a mean wait
means the same thing wherever it is reported, and :func:`summarize_by_class`
for the same figures per job class (their ``metrics["by_class"]``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ._model import CLASSES

__all__ = ["JobTimes", "summarize", "summarize_by_class", "mean", "TAU", "CLASS_KEYS"]

TAU = 10.0
"""Bounded slowdown threshold in seconds (short jobs count as this long)."""


class JobTimes(NamedTuple):
    """One job's times (None: not reached). ``run``: its run time for the
    slowdowns (None: end - start). ``cls``: its class, for
    :func:`summarize_by_class`; ``reconfigs``: how many times it was resized
    (None: not known)."""

    submit: float
    start: float | None
    end: float | None
    run: float | None = None
    cls: str | None = None
    reconfigs: int | None = None


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


CLASS_KEYS = ("mean_wait", "mean_turnaround", "mean_slowdown", "mean_bounded_slowdown")
"""The figures of :func:`summarize` that :func:`summarize_by_class` gives each class."""


def summarize_by_class(jobs: Iterable[JobTimes]) -> dict[str, dict[str, Any]]:
    """The jobs' figures per class: class -> ``jobs`` (how many of the jobs
    given are of the class), the :data:`CLASS_KEYS` of :func:`summarize` over
    them alone, and ``reconfigurations`` (their resizes) when every one of them
    knows its count.

    Only the classes present are listed (a run without moldable jobs has no
    ``"moldable"`` entry), in the order of ``_model.CLASSES``; a job without
    a class counts as ``"unknown"``, listed last."""
    groups: dict[str, list[JobTimes]] = {}
    for j in jobs:
        groups.setdefault(j.cls or "unknown", []).append(j)
    order = {cls: i for i, cls in enumerate(CLASSES)}
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted(groups, key=lambda c: (order.get(c, len(order)), c)):
        group = groups[cls]
        summary = summarize(group)
        figures: dict[str, Any] = {"jobs": len(group), **{k: summary[k] for k in CLASS_KEYS}}
        if all(j.reconfigs is not None for j in group):
            figures["reconfigurations"] = sum(j.reconfigs or 0 for j in group)
        out[cls] = figures
    return out
