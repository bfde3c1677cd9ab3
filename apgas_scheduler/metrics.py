"""Metrics and Gantt charts from a scheduler's JSON-lines event log, so that
live runs and simulated runs are measured the same way.

Events (``t`` in seconds; a change of nodes takes effect at ``t``):

* ``{"event": "pool", "nodes": [...]}``: the cluster's nodes from then on (nodes
  added; in the live scheduler also drained nodes gone, named by ``"left"``)
* ``{"event": "submit", "job": id, "name": str, "class": cls}``
* ``{"event": "start", "job": id, "nodes": [...]}``
* ``{"event": "grow"|"shrink", "job": id, "nodes": [...], "duration": s}``
* ``{"event": "reserve", "job": id, "nodes": [...]}``: nodes held for a grow in
  flight (the live scheduler's; they count as the job's from then on), given
  back by ``{"event": "grow_failed"|"release", "job": id, "nodes": [...]}``
* ``{"event": "end", "job": id, "state": "done"|"failed"|"cancelled", "reason": str}``
* ``{"event": "requeue", "job": id, "reason": str, "count": k}``: the job went back to
  the queue (its k-th time): its nodes come back as at an end; it starts again later,
  and its wait counts to its first start, its turnaround to its last end
* ``{"event": "decision", "job": id, "decision": "start"|"grow"|"shrink", "nodes": k,
  "policy": str}``: a decision of the policy that the scheduler carries out
* ``{"event": "timing", "job": id, "name": "growTimeAPGAS", "n": k, "seconds": s}``:
  a timing line the job reported (see :func:`apgas.protocol.timing`)

Other event kinds are ignored.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from .live.state import DB_NAME, read_db_events
from .stats import JobTimes, mean, summarize, summarize_by_class

__all__ = ["read_events", "node_intervals", "compute_metrics", "gantt"]

Interval = tuple[float, float, int]


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a JSON-lines log (blank lines are skipped), or of a
    scheduler's database (``scheduler.db``, or its state directory)."""
    if os.path.isdir(path):
        path = os.path.join(path, DB_NAME)
    with open(path, "rb") as f:
        if f.read(16) == b"SQLite format 3\x00":
            return read_db_events(path)
    events = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.fspath(path)}:{lineno}: not JSON: {e}") from None
            if not isinstance(event, dict):
                raise ValueError(f"{os.fspath(path)}:{lineno}: an event must be a JSON object")
            events.append(event)
    return events


def _ordered(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events by time; events at the same time keep their log order."""
    return sorted(events, key=lambda e: float(e["t"]))


def node_intervals(events: Iterable[dict[str, Any]]) -> dict[str, list[Interval]]:
    """node -> sorted (from, to, job) intervals during which ``job`` held it.

    Intervals are kept per (node, job), so a node given to two jobs at once
    shows up as two overlapping intervals instead of one hiding the other. A
    node still held when the log ends is released at the last event time.
    """
    ordered = _ordered(events)
    held: dict[tuple[str, int], float] = {}  # (node, job) -> since
    out: dict[str, list[Interval]] = {}

    def release(node: str, job: int, t: float) -> None:
        since = held.pop((node, job), None)
        if since is not None:
            out.setdefault(node, []).append((since, t, job))

    for e in ordered:
        kind, t = e.get("event"), float(e["t"])
        if kind in ("start", "grow", "reserve"):
            for node in e.get("nodes", ()):
                held.setdefault((node, e["job"]), t)
        elif kind in ("shrink", "grow_failed", "release"):
            for node in e.get("nodes", ()):
                release(node, e["job"], t)
        elif kind in ("end", "requeue"):
            for node, job in [k for k in held if k[1] == e["job"]]:
                release(node, job, t)
    last = float(ordered[-1]["t"]) if ordered else 0.0
    for node, job in list(held):
        release(node, job, last)
    return {node: sorted(iv) for node, iv in out.items()}


def _overlaps(intervals: dict[str, list[Interval]]) -> int:
    """How many times a node was taken while another job still held it
    (handing a node over at the same instant is fine)."""
    count = 0
    for ivs in intervals.values():
        busy_until = -float("inf")
        for start, end, _ in ivs:  # sorted by start
            if start < busy_until:
                count += 1
            busy_until = max(busy_until, end)
    return count


def _capacity(events: Sequence[dict[str, Any]], lo: float, hi: float) -> float:
    """Node-seconds of the pool within [lo, hi]; each "pool" event gives the whole
    pool (nodes added, or drained nodes gone)."""
    pool: set[str] = set()
    steps: list[tuple[float, int]] = []
    for e in events:
        if e.get("event") == "pool":
            pool = set(e.get("nodes", ()))
            steps.append((float(e["t"]), len(pool)))
    total = 0.0
    for i, (t, size) in enumerate(steps):
        until = steps[i + 1][0] if i + 1 < len(steps) else hi
        total += size * max(0.0, min(until, hi) - max(t, lo))
    return total


def compute_metrics(events: Iterable[dict[str, Any]],
                    intervals: dict[str, list[Interval]] | None = None) -> dict[str, Any]:
    """Makespan, utilisation, waiting and turnaround times, resize counts and
    the node-overlap check of a run (times in seconds, None when undefined);
    ``intervals``: the events' :func:`node_intervals`, if the caller has them.

    ``by_class``: the figures of each class present among the submitted jobs
    (the ``class`` of their ``submit`` event; see
    :func:`~apgas_scheduler.stats.summarize_by_class`), with
    ``reconfigurations`` their grows and shrinks. ``requeues``: how many times
    jobs went back to the queue, ``requeued_jobs`` how many jobs did; a
    requeued job counts once, in the state of its last end."""
    ordered = _ordered(events)
    submit: dict[int, float] = {}
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    classes: dict[int, str] = {}
    final: dict[int, str] = {}  # each job's state at its last end
    requeues: Counter[int] = Counter()
    resizes: dict[str, list[float | None]] = {"grow": [], "shrink": []}
    resized: Counter[int] = Counter()
    for e in ordered:
        kind, t = e.get("event"), float(e["t"])
        if kind == "submit":
            submit.setdefault(e["job"], t)
            if e.get("class"):
                classes.setdefault(e["job"], str(e["class"]))
        elif kind == "start":
            start.setdefault(e["job"], t)
        elif kind == "end":
            end[e["job"]], final[e["job"]] = t, str(e.get("state", "unknown"))
        elif kind == "requeue":  # back in the queue: not ended (any more)
            end.pop(e["job"], None)
            final.pop(e["job"], None)
            requeues[e["job"]] += 1
        elif kind in resizes:
            resizes[kind].append(e.get("duration"))
            resized[e["job"]] += 1

    states = Counter(final.values())
    intervals = node_intervals(ordered) if intervals is None else intervals
    used = capacity = None
    if submit and end:
        lo, hi = min(submit.values()), max(end.values())
        capacity = _capacity(ordered, lo, hi)
        used = sum(max(0.0, min(b, hi) - max(a, lo)) for ivs in intervals.values() for a, b, _ in ivs)
    times = [JobTimes(t, start.get(j), end.get(j), cls=classes.get(j), reconfigs=resized[j])
             for j, t in submit.items()]
    summary = summarize(times, used=used, capacity=capacity)

    def mean_duration(kind: str) -> float | None:
        return mean([float(d) for d in resizes[kind] if d is not None])

    return {
        "makespan": summary["makespan"],
        "utilization": summary["utilization"],
        "mean_wait": summary["mean_wait"],
        "mean_turnaround": summary["mean_turnaround"],
        "jobs": len(submit.keys() | start.keys() | end.keys()),
        "by_state": dict(sorted(states.items())),
        "grows": len(resizes["grow"]),
        "shrinks": len(resizes["shrink"]),
        "mean_grow_seconds": mean_duration("grow"),
        "mean_shrink_seconds": mean_duration("shrink"),
        "max_overlap_violations": _overlaps(intervals),
        "requeues": sum(requeues.values()),
        "requeued_jobs": len(requeues),
        "by_class": summarize_by_class(times),
    }


def _colours(n: int) -> list[Any]:
    """``n`` distinguishable colours (40 before they repeat)."""
    from matplotlib import colormaps

    palette = [colormaps["tab20"](i) for i in range(20)] + [colormaps["tab20b"](i) for i in range(20)]
    return [palette[i % len(palette)] for i in range(n)]


def gantt(events: Iterable[dict[str, Any]], path: str | os.PathLike[str], title: str = "") -> None:
    """Write a PNG with one row per node and one bar per (job, node, interval),
    coloured by job, labelled with the job id where the bar is wide enough,
    and a legend mapping job ids to names."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ordered = _ordered(events)
    intervals = node_intervals(ordered)
    nodes: list[str] = []
    names: dict[int, str] = {}
    jobs: list[int] = []
    for e in ordered:
        kind = e.get("event")
        if kind == "pool" or kind in ("start", "grow"):
            nodes += [n for n in e.get("nodes", ()) if n not in nodes]
        if kind == "submit":
            names.setdefault(e["job"], str(e.get("name", "")))
        if kind == "start" and e["job"] not in jobs:
            jobs.append(e["job"])
    colour = dict(zip(jobs, _colours(len(jobs)), strict=True))

    height = max(3.0, 0.32 * len(nodes) + 1.6)
    fig = Figure(figsize=(12, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    t0 = float(ordered[0]["t"]) if ordered else 0.0
    t1 = float(ordered[-1]["t"]) if ordered else 1.0
    span = max(t1 - t0, 1e-9)
    for row, node in enumerate(nodes):
        for a, b, job in intervals.get(node, ()):
            ax.barh(row, b - a, left=a - t0, height=0.8, color=colour.get(job, "grey"),
                    edgecolor="white", linewidth=0.5)
            if (b - a) / span > 0.025:
                ax.text((a + b) / 2 - t0, row, str(job), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(nodes)), nodes, fontsize=7 if len(nodes) > 16 else 9)
    ax.set_ylim(max(len(nodes), 1) - 0.5, -0.5)
    ax.set_xlim(0, span)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("node")
    if title:
        ax.set_title(title)
    if not jobs:
        ax.text(0.5, 0.5, "no jobs", transform=ax.transAxes, ha="center", va="center")
    else:
        handles = [Patch(color=colour[j], label=f"{j}: {names[j]}" if names.get(j) else str(j))
                   for j in jobs]
        rows = max(1, int(height * 5))  # legend entries that fit in one column
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                  ncol=-(-len(jobs) // rows), frameon=False)
    fig.savefig(path, format="png", dpi=110)
