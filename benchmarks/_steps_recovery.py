"""benchmarks.steps, part 2: from the SIGKILL of a place to the next step on the survivors.

Each repetition is one ``apgas.run(places=P)`` (a lost place is not replaced, so
every repetition starts whole). At place 0 :func:`recover_once` makes the arrays
(S bytes, ``follow=True, resilient=True``), asks every place its pid, and runs
``apgas.steps(steps, commit_every=2, arrays=...)`` whose steps add 1.0 to every
element (one ``finish`` over the owners, so each step touches every place). At the
start of the body of step ``kill_at`` place 0 notes the time and SIGKILLs the victim
(``os.kill(pid, SIGKILL)``); the step's ``finish`` then fails, the loop restores the
arrays over the survivors from the copies of the last commit, commits again (the
layout changed) and runs the body of the step after that commit, whose start is
noted. Recovery = that start - the kill. Broken down, from the same clock:

- *detection*: the kill to the step's ``finish`` failing with the death (caught and
  raised again in the body; place 0 learns of a local place's death from a thread
  that polls its children);
- *unwinding*: from there to the restore's start (the exception reaching ``with
  step:``, the loop beginning its roll-back);
- *restore*: ``_steps_restore`` of every array (timed by
  :class:`~benchmarks._steps_common.Timed`);
- *re-commit*: the commit that follows it, before the step runs;
- *rest*: what is left (the gate, the loop's own work).

After the loop the arrays' sums are checked against the exact value for ``steps``
steps, each applied once: a step run twice or lost would show. The time at which
``apgas.lowlevel.watch_deaths`` hears of the death is recorded too (``watchers_told_s``;
the runtime tells its watchers after it has failed the finishes).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Sequence
from typing import Any

import apgas
from apgas.arrays import at_each
from apgas.arrays._layout import even, overlaps
from apgas.lowlevel import watch_deaths
from benchmarks._steps_common import (
    ROW_BYTES,
    Timed,
    add_one_at,
    expected_sum,
    make_arrays,
    owners,
    spans,
)

__all__ = ["recover_once", "recovery_row", "restore_network_bytes", "COMMIT_EVERY", "PHASES"]

COMMIT_EVERY = 2
PHASES = ("detection", "unwinding", "restore", "recommit", "rest")


def restore_network_bytes(commits: Sequence[Any], lost: set[int], live: list[int]) -> int:
    """Bytes a restore of ``commits`` over ``live`` sends between places: each block
    comes from its owner's own copy, or from its buddy's if the owner was lost, to its
    owners in the even layout over ``live``; rows that stay at their source do not travel."""
    sent = 0
    for c in commits:
        rows = max(stop for _, _, stop in c.layout)
        new = even(rows, live)
        for owner, start, stop in c.layout:
            source = c.buddies.get(owner) if owner in lost else owner
            sent += sum(last - first for pid, first, last, _, _ in overlaps(start, stop, new)
                        if pid != source) * ROW_BYTES
    return sent


def recover_once(size: int, count: int, victim: int, kill_at: int, steps: int) -> dict[str, Any]:
    """One repetition, at place 0 (see the module's docstring)."""
    arrays = make_arrays(size, count)
    events: list[tuple[str, float, float]] = []
    timed = [Timed(a, events) for a in arrays]
    places = [p.id for p in apgas.places()]
    pids = dict(zip(places, at_each(places, os.getpid), strict=True))
    deaths: list[tuple[int, float]] = []
    stop = watch_deaths(lambda pid, host, reason: deaths.append((pid, time.perf_counter())))
    marks: dict[str, Any] = {}
    ran: list[int] = []
    commits: list[Any] = []
    try:
        for step in apgas.steps(steps, commit_every=COMMIT_EVERY, arrays=timed):
            with step:
                now = time.perf_counter()
                if "kill" in marks and "next" not in marks:
                    marks["next"], marks["next_index"] = now, step.index
                    marks["next_places"] = len(apgas.places())
                if step.index == kill_at and "kill" not in marks:
                    commits = [t.last for t in timed]  # the commit the loop rolls back to
                    marks["kill"] = time.perf_counter()
                    os.kill(pids[victim], signal.SIGKILL)
                ran.append(step.index)
                try:
                    with apgas.finish():
                        for pid in owners(arrays[0]):
                            apgas.async_at(pid, add_one_at, arrays)
                except BaseException:
                    if "kill" in marks and "raised" not in marks:
                        marks["raised"] = time.perf_counter()
                    raise
    finally:
        stop()
    sums = [float(a.sum()) for a in arrays]
    exact = all(s == expected_sum(a, k, steps) for k, (a, s) in enumerate(zip(arrays, sums, strict=True)))
    live = [p.id for p in apgas.places()]
    for a in arrays:
        a.free()
    if "next" not in marks:
        raise RuntimeError(f"no step ran after the kill of place {victim} (steps run: {ran})")
    kill, nxt = marks["kill"], marks["next"]
    told = next((t for pid, t in deaths if pid == victim), None)
    raised = marks.get("raised")
    restores = [(s, e) for s, e in spans(events, "restore", count) if s >= kill]
    recommits = [(s, e) for s, e in spans(events, "commit", count) if s >= kill]
    if raised is None or not restores or not recommits:
        raise RuntimeError(f"the roll-back after the kill of place {victim} was not seen whole: "
                           f"the step's finish failed {raised is not None}, restores {len(restores)}, "
                           f"commits after it {len(recommits)}")
    restore, recommit = restores[0], recommits[0]
    phases = {"detection": raised - kill, "unwinding": restore[0] - raised,
              "restore": restore[1] - restore[0], "recommit": recommit[1] - recommit[0]}
    total = nxt - kill
    phases["rest"] = total - sum(phases.values())
    return {"bytes": size, "places": len(places), "victim": victim, "kill_at": kill_at,
            "rolled_back_to": marks["next_index"], "places_after": marks["next_places"],
            "live_after": live, "steps_run": ran, "exact": exact, "sums": sums,
            "recovery_s": total, "phases_s": phases,
            "watchers_told_s": None if told is None else told - kill,
            "restores": len(restores), "restore_network_bytes":
                restore_network_bytes(commits, {victim}, [p for p in places if p != victim])}


def recovery_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetitions of one configuration: medians of the total and of each phase."""
    totals = [r["recovery_s"] for r in runs]
    return {"bytes": runs[0]["bytes"], "places": runs[0]["places"], "repetitions": len(runs),
            "victims": [r["victim"] for r in runs], "all_exact": all(r["exact"] for r in runs),
            "recovery_median_s": statistics.median(totals), "recovery_min_s": min(totals),
            "recovery_max_s": max(totals),
            "phases_median_s": {k: statistics.median(r["phases_s"][k] for r in runs) for k in PHASES},
            "restore_network_bytes_median": statistics.median(r["restore_network_bytes"] for r in runs),
            "watchers_told_median_s": statistics.median(
                r["watchers_told_s"] for r in runs if r["watchers_told_s"] is not None)
            if any(r["watchers_told_s"] is not None for r in runs) else None,
            "runs": runs}
