"""The incentive to be malleable: what a malleable job gains (or loses) against
the same job submitted rigid, in an otherwise identical run.

A user decides whether to submit a job malleable; what matters to them is
whether it then ends sooner. :func:`as_rigid` makes the workload in which
every malleable job is rigid at its preferred size, :func:`incentive`
compares the malleable jobs' waits and turnarounds in the two runs, and
:func:`run_with_incentive` runs both and puts the comparison into the first
run's ``metrics["incentive"]``.

Only malleable jobs are made rigid. A moldable job is sized once, at its
start, and an evolving one follows its own profile: neither is resized by
the scheduler, so neither is what the incentive asks about, and both stay as
they are in the rigid run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..policies.planning import Policy
from ..stats import JobTimes, summarize
from .simulator import SimResult, Simulator
from .workload import SimJob

__all__ = ["as_rigid", "incentive", "run_with_incentive"]


def as_rigid(jobs: Sequence[SimJob]) -> list[SimJob]:
    """The same jobs, in the same order, with every malleable job made rigid at
    its preferred size (``min_nodes == max_nodes == preferred``); ids, submit
    times, run times, estimates, ``rho``, ``serial`` and names unchanged, and
    every other job as it is."""
    return [dataclasses.replace(j, cls="rigid", min_nodes=j.preferred, max_nodes=j.preferred)
            if j.cls == "malleable" else j for j in jobs]


def _times(result: SimResult, ids: Sequence[int]) -> dict[str, Any]:
    records = [result.jobs[i] for i in ids]
    return summarize([JobTimes(r["submit"], r["start"], r["end"]) for r in records])


def incentive(result: SimResult, rigid_result: SimResult,
              jobs: Sequence[SimJob]) -> dict[str, Any] | None:
    """The malleable jobs of ``jobs`` in ``result`` against the same ids in
    ``rigid_result`` (the run of :func:`as_rigid` ``(jobs)``): ``jobs`` (how
    many were compared), ``mean_turnaround`` and ``mean_wait`` in the malleable
    run, ``mean_turnaround_as_rigid`` and ``mean_wait_as_rigid`` in the rigid
    one, ``ratio`` (turnaround over turnaround as rigid: below 1, being
    malleable paid) and ``change_pct`` (100 (x - y) / y; negative: sooner).

    Compared are the malleable jobs that ended in both runs (a job left out
    for its size, or never ended, is in neither mean). None when there is no
    such job; ``ratio`` and ``change_pct`` are None when the rigid mean
    turnaround is 0."""
    ids = [j.id for j in jobs if j.cls == "malleable"
           and (result.jobs.get(j.id) or {}).get("end") is not None
           and (rigid_result.jobs.get(j.id) or {}).get("end") is not None]
    if not ids:
        return None
    mine, rigid = _times(result, ids), _times(rigid_result, ids)
    x, y = mine["mean_turnaround"], rigid["mean_turnaround"]
    assert x is not None and y is not None  # every job compared ended
    return {
        "jobs": len(ids),
        "mean_turnaround": x,
        "mean_turnaround_as_rigid": y,
        "ratio": x / y if y else None,
        "change_pct": 100 * (x - y) / y if y else None,
        "mean_wait": mine["mean_wait"],
        "mean_wait_as_rigid": rigid["mean_wait"],
    }


def run_with_incentive(nodes: int, make_policy: Callable[[], Policy], jobs: Sequence[SimJob],
                       **simulator_options: Any) -> SimResult:
    """Simulate ``jobs`` on ``nodes`` nodes under ``make_policy()`` and, when
    some are malleable, :func:`as_rigid` ``(jobs)`` too (a fresh policy, the
    same ``simulator_options`` of :class:`Simulator`); return the first run's
    result with ``metrics["incentive"]`` set to :func:`incentive` (no such
    key without malleable jobs: nothing was compared)."""
    result = Simulator(nodes, make_policy(), **simulator_options).run(jobs)
    if any(j.cls == "malleable" for j in jobs):
        rigid = Simulator(nodes, make_policy(), **simulator_options).run(as_rigid(jobs))
        result.metrics["incentive"] = incentive(result, rigid, jobs)
    return result
