"""Offline list scheduling of fully-predictably evolving jobs, after the study of
scheduling evolving applications in ``papers/`` (COOP project; section
numbers below are that paper's).

Each job brings its *evolution profile*: the steps ``(duration, nodes)`` it
will go through, known in advance. This module is an offline scheduler and
simulator in one (it does not use the ``Policy.decide`` interface): it places
whole profiles on a timeline of node occupation and returns the resulting
schedule.

* :func:`schedule_evolving` is the paper's Algorithm 1 (Section 4.1): jobs in
  arrival order, each given the scheduled profile that the *base fit*
  (Algorithm 2, Section 4.2) finds on the occupation left by the jobs before
  it, optionally followed by *compacting* (Section 4.2, "Post-processing
  Optimization").
* :func:`schedule_rigid_baseline` is the paper's ``rigid`` comparison
  (Section 5): a job is seen as one step of its maximum node count for the
  sum of its durations, placed in arrival order at the earliest time it fits
  without moving anyone placed before (conservative backfilling).

The model (Section 3.2): when a job goes from one step to the next it keeps
its nodes and, if the scheduler cannot give the next step's nodes at once,
it waits holding them; the step is *expanded*, and the nodes held during the
wait are wasted. A job may never shrink or stretch a step on its own. The
*expand limit* ``l`` bounds how much a step may be expanded: its held time is
at most ``l`` times its duration (``l = 1``: no expansion, ``None``: no
limit). The first step is delayed instead of expanded, since holding nodes
before starting helps nobody.

Node identities do not matter (Section 3.2: if occupation never exceeds the
cluster, a mapping to nodes exists), so the timeline only counts nodes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..stats import TAU, JobTimes, mean, summarize, summarize_by_class

__all__ = [
    "EvolvingJob", "Schedule", "schedule_evolving", "schedule_rigid_baseline",
    "evolving_policies", "PAPER_VARIANTS", "TAU",
]

COMPACT_BUDGET = 2000
"""Search steps per profile step before compacting gives up and keeps the base fit: the
right-to-left search may back off by tiny amounts many times (seen with unbounded limits)."""

Piece = tuple[float, float, int, int]  # (from, to, job, nodes)
Step = tuple[float, int]               # (duration, nodes)

PAPER_VARIANTS: dict[str, dict[str, Any]] = {
    "noX": {"expand_limit": 1, "compact": False},
    "2X": {"expand_limit": 2, "compact": False},
    "2X+c": {"expand_limit": 2, "compact": True},
    "infX": {"expand_limit": None, "compact": False},
    "infX+c": {"expand_limit": None, "compact": True},
}
"""The five options of Algorithm 1 compared in Section 5, by the paper's names."""


class _JobLike(Protocol):
    """What a job must offer: read-only ``id``, ``submit`` and ``profile``."""

    @property
    def id(self) -> int: ...
    @property
    def submit(self) -> float: ...
    @property
    def profile(self) -> Sequence[tuple[float, int]]: ...


@dataclass(frozen=True)
class EvolvingJob:
    """A job with its evolution profile; any object with these three
    attributes (e.g. a simulator's job) is accepted in its place."""

    id: int
    submit: float
    profile: tuple[tuple[float, int], ...]


@dataclass
class Schedule:
    """Where each job went.

    ``usage`` holds the pieces during which a job computes (one per step, its
    duration and node count); ``reserved`` the pieces during which it holds
    nodes, which also cover the waits of expanded steps (evolving) or the
    nodes above a step's needs (rigid baseline). ``starts``/``ends`` are
    when a job first holds nodes and when it finishes.
    """

    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    usage: list[Piece] = field(default_factory=list)
    reserved: list[Piece] = field(default_factory=list)

    def metrics(self, jobs: Iterable[_JobLike], nodes: int) -> dict[str, Any]:
        """System and user metrics of the schedule (times in seconds, None when
        undefined, e.g. for no jobs).

        ``waste`` is the share of reserved node-seconds not used to compute.
        Slowdowns divide the turnaround by the job's run time on a dedicated
        machine (the sum of its step durations), so that time lost in expanded
        steps counts against the schedule like waiting does; the bounded
        slowdown counts a run time below :data:`TAU` as ``TAU`` and is at least 1.
        ``by_class``: the same per class (a job's ``cls``, else "evolving": the
        jobs here all bring profiles), without reconfigurations.
        """
        jobs = list(jobs)
        used = sum((b - a) * n for a, b, _, n in self.usage)
        held = sum((b - a) * n for a, b, _, n in self.reserved)
        times = [JobTimes(float(j.submit), self.starts[j.id], self.ends[j.id],
                          sum(float(d) for d, _ in j.profile), cls=getattr(j, "cls", "evolving"))
                 for j in jobs]
        summary = summarize(times, used=used, nodes=nodes)
        return {
            "jobs": len(jobs),
            "makespan": summary["makespan"],
            "utilization": summary["utilization"],
            "waste": (held - used) / held if held else None,
            "used_node_seconds": used,
            "reserved_node_seconds": held,
            "mean_wait": summary["mean_wait"],
            "mean_turnaround": summary["mean_turnaround"],
            "mean_slowdown": summary["mean_slowdown"],
            "mean_bounded_slowdown": summary["mean_bounded_slowdown"],
            "mean_completion": mean([self.ends[j.id] for j in jobs]),
            "last_completion": max(self.ends.values()) if jobs else None,
            "by_class": summarize_by_class(times),
        }


class _Timeline:
    """Nodes in use over time as sorted breakpoints: ``used[k]`` nodes are busy
    on ``[times[k], times[k + 1])``. The first breakpoint is -inf and the last
    is +inf, a sentinel that ends every scan without a bounds check.

    Queries and updates touch only the segments of the window they ask about
    (found by bisection). The fit jumps from window to window instead of
    walking every segment, and peaks are taken over list slices (``max`` and
    ``index`` in C), which is what keeps thousands of jobs fast in Python.
    """

    def __init__(self) -> None:
        self.times: list[float] = [-math.inf, math.inf]
        self.used: list[int] = [0, 0]

    def earliest_fit(self, ts: float, d: float, limit: int) -> float:
        """The earliest ``t >= ts`` with at most ``limit`` nodes in use on
        ``[t, t + d)``: the paper's lines 5-7. Any start before the end of the
        *last* segment over ``limit`` in the window also overlaps that
        segment, so the search jumps past it and looks at the next window,
        until a window has none. Each window is scanned backwards from its
        end, so a busy future (where nearly every window holds such a
        segment near its end) is crossed in about one step per window rather
        than one per segment; the first window found is the earliest."""
        times, used = self.times, self.used
        k = bisect_right(times, ts) - 1
        while True:
            m = bisect_left(times, ts + d, k) - 1  # the window's last segment
            while used[m] <= limit:
                if m == k:
                    return ts
                m -= 1
            k = m + 1
            ts = times[k]  # finite: the last segment is empty

    def peak_last(self, a: float, b: float) -> tuple[int, float]:
        """Most nodes in use on ``[a, b)`` and the paper's ``loc``: the end of
        the last segment reaching that peak, clipped to ``b`` (0 and ``a`` if
        the window is empty)."""
        if b <= a:
            return 0, a
        times, used = self.times, self.used
        k = bisect_right(times, a) - 1
        j = bisect_left(times, b, k)  # segments k .. j - 1 meet the window
        window = used[k:j]
        peak = max(window)
        last = j - 1 - window[::-1].index(peak)
        return peak, min(times[last + 1], b)

    def peak_first(self, a: float, b: float) -> tuple[int, float]:
        """Mirror of :meth:`peak_last` for right-to-left placement: the peak on
        ``[a, b)`` and the start of the first segment reaching it, clipped to
        ``a`` (0 and ``b`` if the window is empty)."""
        if b <= a:
            return 0, b
        times, used = self.times, self.used
        k = bisect_right(times, a) - 1
        window = used[k:bisect_left(times, b, k)]  # the segments that meet the window
        peak = max(window)
        return peak, max(times[k + window.index(peak)], a)

    def _split(self, t: float) -> int:
        """Index of a breakpoint at (finite) ``t``, inserted if missing."""
        k = bisect_right(self.times, t) - 1
        if self.times[k] != t:
            k += 1
            self.times.insert(k, t)
            self.used.insert(k, self.used[k - 1])
        return k

    def add(self, a: float, b: float, nodes: int) -> None:
        """Occupy ``nodes`` more nodes on ``[a, b)``."""
        if b <= a:
            return
        lo, hi = self._split(a), self._split(b)
        used = self.used
        for k in range(lo, hi):
            used[k] += nodes

    def forget_before(self, t: float) -> None:
        """Drop the history before ``t``; jobs come in arrival order and never
        look before their submission, so the lists stay as long as the future."""
        k = bisect_right(self.times, t) - 1
        if k > 0:
            del self.times[:k]
            del self.used[:k]
            self.times[0] = -math.inf


def _steps(job: _JobLike, nodes: int) -> list[Step]:
    """The job's profile, checked: a step that can never fit, or lasts no
    time, would make the fit loop forever or mean nothing."""
    steps = [(float(d), int(n)) for d, n in job.profile]
    if not steps:
        raise ValueError(f"job {job.id}: empty profile")
    for d, n in steps:
        if not d > 0 or not math.isfinite(d):
            raise ValueError(f"job {job.id}: step duration {d} must be positive and finite")
        if not 1 <= n <= nodes:
            raise ValueError(f"job {job.id}: step of {n} nodes on a cluster of {nodes}")
    return steps


def _arrival_order(jobs: Iterable[_JobLike]) -> list[_JobLike]:
    """Jobs by submission time, ties in the order given; ids must be unique."""
    jobs = list(jobs)
    if len({j.id for j in jobs}) != len(jobs):
        raise ValueError("job ids must be unique")
    return sorted(jobs, key=lambda j: float(j.submit))


def _base_fit(steps: Sequence[Step], tl: _Timeline, cap: int,
              limit: float | None, submit: float) -> list[float]:
    """Algorithm 2 (base fit), unrolled into a loop: the compute start of each
    step, the first step delayed to end where the second starts.

    Level ``i`` tries candidates ``ts`` for step ``i`` from ``t0`` (the end of
    step ``i - 1``, or the submission). It (1) moves ``ts`` past the last peak
    that leaves too few nodes (lines 5-7); (2) checks the expansion of step
    ``i - 1`` over ``[t0, ts)`` it forces: beyond the limit, the previous step
    retries from ``ts - l * d[i-1]`` (lines 9-11); without room for its nodes,
    from ``loc`` of that gap (lines 12-13); (3) goes on with step ``i + 1`` from
    ``ts + d[i]`` (line 14). Going back a level is the paper's failed
    recursive call whose returned time becomes the caller's next candidate
    (line 16). As in the paper, step 2 checks the limit and the room for the
    first step's wait too, although that step is then delayed, not expanded.
    """
    last = len(steps) - 1
    starts = [0.0] * len(steps)
    i, ts = 0, submit
    while True:
        d, n = steps[i]
        ts = tl.earliest_fit(ts, d, cap - n)  # lines 5-7
        if i > 0:
            d_prev, n_prev = steps[i - 1]
            t0 = starts[i - 1] + d_prev
            if limit is not None and ts - t0 > (limit - 1) * d_prev:
                # teas > start of step i-1 in exact arithmetic; keep it so under rounding.
                i, ts = i - 1, max(ts - limit * d_prev, math.nextafter(starts[i - 1], math.inf))
                continue
            peak, after = tl.peak_last(t0, ts)
            if peak > cap - n_prev:
                i, ts = i - 1, after
                continue
        starts[i] = ts
        if i == last:
            break
        i, ts = i + 1, ts + d
    if last > 0:
        starts[0] = starts[1] - steps[0][0]  # line 20: delay, do not expand, the first step
    return starts


def _compact(steps: Sequence[Step], tl: _Timeline, cap: int, limit: float | None,
             submit: float, completion: float) -> list[float] | None:
    """Compacting (Section 4.2): the base fit mirrored in time. The last step
    ends at the base fit's completion time; the others are placed from right
    to left, each as late as it fits before the next one starts, so that
    waits move towards the start of the job and shrink. The paper gives only
    this outline; the mirror below is our reading of "similarly to the base
    algorithm", keeping the model's rule that a wait is held with the nodes
    of the step before it (so here the first step may be expanded).

    Level ``j`` tries latest ends ``te`` for step ``j``: it moves ``te`` before
    the first peak that leaves too few nodes; then checks the wait it leaves
    before step ``j + 1`` (held with step ``j``'s nodes): beyond the limit,
    step ``j + 1`` retries ending by ``te + (l - 1) * d[j] + d[j+1]``; without
    room, ending by the first peak of that gap plus ``d[j+1]``. Returns the
    compute starts, or None if none is found within ``COMPACT_BUDGET`` search
    steps per profile step (then the base fit's stands, "in the worst case, no
    compacting occurs").
    """
    last = len(steps) - 1
    lowest = [submit]  # earliest possible start of each step
    for d, _ in steps[:-1]:
        lowest.append(lowest[-1] + d)
    starts = [0.0] * len(steps)
    j, te = last, completion
    for _ in range(COMPACT_BUDGET * len(steps)):  # backtracking can crawl: keep the base fit then
        d, n = steps[j]
        while True:  # latest placement of step j ending by te
            if te - d < lowest[j]:
                return None
            peak, before = tl.peak_first(te - d, te)
            if peak <= cap - n:
                break
            te = before
        if j < last:
            d_next = steps[j + 1][0]
            t1 = starts[j + 1]
            if limit is not None and t1 - te > (limit - 1) * d:
                end_next = starts[j + 1] + d_next
                te = min(te + (limit - 1) * d + d_next, math.nextafter(end_next, -math.inf))
                j += 1
                continue
            peak, before = tl.peak_first(te, t1)
            if peak > cap - n:
                j, te = j + 1, before + d_next
                continue
        starts[j] = te - d
        if j == 0:
            return starts
        j, te = j - 1, te - d
    return None


def _place(schedule: Schedule, tl: _Timeline, job_id: int, steps: Sequence[Step],
           starts: Sequence[float], held: Sequence[Piece]) -> None:
    """Record a job's computing pieces (each step from its start) and the
    pieces it holds (``held``) in the schedule, and occupy the latter."""
    for s, (d, n) in zip(starts, steps, strict=True):
        schedule.usage.append((s, s + d, job_id, n))
    for a, b, _, n in held:
        schedule.reserved.append((a, b, job_id, n))
        tl.add(a, b, n)
    schedule.starts[job_id] = starts[0]
    schedule.ends[job_id] = starts[-1] + steps[-1][0]


def schedule_evolving(jobs: Iterable[_JobLike], nodes: int, *,
                      expand_limit: float | None = 1, compact: bool = False) -> Schedule:
    """Algorithm 1 of the paper: jobs in arrival order, each placed by the base
    fit on what the jobs before it occupy, then compacted if ``compact``.

    ``expand_limit`` is ``l`` (Section 4.2): a step may be held at most ``l``
    times its duration; 1 forbids expansion (noX), ``None`` lifts the limit
    (infX). No job starts before its submission, and jobs placed earlier are
    never moved, so no job starves (Section 4.3).
    """
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    if expand_limit is not None and not expand_limit >= 1:
        raise ValueError(f"expand limit {expand_limit} must be at least 1 (or None)")
    schedule, tl = Schedule(), _Timeline()
    for job in _arrival_order(jobs):
        steps = _steps(job, nodes)
        submit = float(job.submit)
        tl.forget_before(submit)
        starts = _base_fit(steps, tl, nodes, expand_limit, submit)
        if compact:
            completion = starts[-1] + steps[-1][0]
            starts = _compact(steps, tl, nodes, expand_limit, submit, completion) or starts
        # Each step holds its nodes until the next one starts.
        ends = [*starts[1:], starts[-1] + steps[-1][0]]
        held = [(a, b, job.id, n) for a, b, (_, n) in zip(starts, ends, steps, strict=True)]
        _place(schedule, tl, job.id, steps, starts, held)
    return schedule


def schedule_rigid_baseline(jobs: Iterable[_JobLike], nodes: int) -> Schedule:
    """The paper's ``rigid`` algorithm (Section 5): a job that cannot say how
    it evolves must ask for its peak node count for its whole run; jobs in
    arrival order each take the earliest such slot (conservative backfilling).
    Its steps still run back to back, so the usage is the profile's."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    schedule, tl = Schedule(), _Timeline()
    for job in _arrival_order(jobs):
        steps = _steps(job, nodes)
        submit = float(job.submit)
        tl.forget_before(submit)
        whole = (sum(d for d, _ in steps), max(n for _, n in steps))
        start = _base_fit([whole], tl, nodes, 1, submit)[0]
        starts = [start]
        for d, _ in steps[:-1]:
            starts.append(starts[-1] + d)
        _place(schedule, tl, job.id, steps, starts, [(start, start + whole[0], job.id, whole[1])])
    return schedule


def evolving_policies() -> dict[str, Callable[..., Schedule]]:
    """Schedulers by name for the comparison command, each ``(jobs, nodes) ->
    Schedule``; "evolving" takes ``expand_limit`` (1, 2 or None) and
    ``compact`` as keyword options (see :data:`PAPER_VARIANTS`)."""
    return {"evolving": schedule_evolving, "evolving-rigid": schedule_rigid_baseline}
