"""The pool of a restarted live scheduler, and the line that tells the operator
what it took up from the earlier run's state.

The pool is what the operator asks for now: a node of the earlier pool not
asked again leaves it, at once if nobody holds it (down nodes too), else it
*drains* (:meth:`~apgas_scheduler.engine.Engine.drain`): it stays the adopted
job's while that job holds it, goes to nobody else, and leaves the pool (a
``pool`` event) when the job gives it back. Adopting a job again is the
daemon's (``Scheduler._resume``); this module ends what is left of the jobs it
cannot adopt (:func:`end_all_left`) and settles the pool after it."""

from __future__ import annotations

import collections
import concurrent.futures
from pathlib import Path
from typing import Any

import launcher as launchers

from ..engine import Engine
from . import containment
from .processes import KILL_GRACE

__all__ = ["settle_pool", "resumed_line", "end_all_left"]


def settle_pool(engine: Engine[str], asked: list[str]) -> tuple[list[str], dict[str, int]]:
    """Drain every node of ``engine`` not in ``asked``: returns those that left at
    once and those that drain, with the job that holds each. ``engine.left`` is
    emptied: the caller records the pool (a ``pool`` event) with them."""
    left: list[str] = []
    draining: dict[str, int] = {}
    for node in [n for n in engine.owner if n not in asked]:
        job = engine.owner[node]
        if engine.drain(node):
            left.append(node)
        elif job is not None:
            draining[node] = job
    engine.left = []
    return left, draining


def resumed_line(directory: Path, jobs: collections.Counter[str], earlier: list[str],
                 asked: list[str], left: list[str], draining: dict[str, int]) -> str:
    """What a scheduler took up from an earlier run's state in ``directory``: its
    jobs (counted by what became of them), and the pool: ``asked`` (those not in
    the ``earlier`` pool are new), the nodes of the earlier pool (or of its jobs)
    that ``left`` it and those ``draining``, by the job that holds them."""
    short = launchers.compress_hostlist
    counts = ", ".join(f"{n} {what}" for what, n in sorted(jobs.items()) if n)
    new = [n for n in asked if n not in earlier]
    news = ("none new" if not new else "all new" if len(new) == len(asked)
            else f"{short(new)} new")
    parts = [f"resumed the state in {directory}: {sum(jobs.values())} job(s)"
             + (f" ({counts})" if counts else ""),
             f"pool {short(asked)} as asked, {len(asked)} node(s) ({news})"]
    gone = [n for n in dict.fromkeys([*earlier, *left]) if n not in asked and n not in draining]
    if gone:
        parts.append(f"{short(gone)} left (not asked now)")
    by_job: dict[int, list[str]] = {}
    for node, job in draining.items():
        by_job.setdefault(job, []).append(node)
    for job, nodes in sorted(by_job.items()):
        if len(nodes) == 1:
            parts.append(f"{nodes[0]} drains (job {job} runs on it, not asked now: it leaves "
                         "the pool when the job gives it back)")
        else:
            parts.append(f"{short(nodes)} drain (job {job} runs on them, not asked now: they "
                         "leave the pool when the job gives them back)")
    parts.append("a different --state-dir starts afresh")
    return "; ".join(parts)


def end_all_left(stored: list[Any]) -> dict[int, Exception]:
    """End what is left of the earlier run's jobs in ``stored`` (their first processes
    are gone), all at once, so that a start waits at most one kill bound however
    many there are; what would not end, by job id."""
    def end(s: Any) -> Exception | None:
        try:
            containment.kill(s.identity, KILL_GRACE)
            return None
        except (containment.StillRunning, OSError) as e:
            return e

    if not stored:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(len(stored), 32)) as pool:
        failures = dict(zip((s.id for s in stored), pool.map(end, stored), strict=True))
    return {i: e for i, e in failures.items() if e is not None}
