"""The scheduler's view model (:func:`apgas.serving.render_page`) from its event log: the
nodes over time by job with every grow and shrink marked, utilization, the
jobs, the policy's decisions and the metrics of ``report``.

Pure: events in, a JSON-able dict out. The live dashboard (:mod:`.dashboard`)
and ``report --html`` both draw it, so the page of a running scheduler and the
report of a finished run show the same things the same way.

A grow or shrink is marked with its duration as the job reported it (its
``growTimeAPGAS`` or ``shrinkTimeAPGAS`` timing line), else as the scheduler
measured its order (the event's ``duration``); the mark's label gives both,
and every other timing line of the job that came while the order was in
flight (``preGrowTimeGLB``, ...: ``timing`` events). A place a job lost
without an order is marked as a failure on its node's row, and the nodes
that are down (``node_down`` until ``node_up``) are named above the chart.
A job that went back to the queue (``requeue``) is queued again, its nodes
back, and the jobs table counts its requeues and gives the last reason.

The texts a client or a job gave (a job's name, a timing's name, a reason a
job sent) are shown escaped and cut (:func:`apgas.serving.loggable`): an
event log written by an older scheduler may hold any.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apgas.serving import loggable

from ..metrics import Interval, _ordered, compute_metrics, node_intervals

__all__ = ["dashboard_model", "down_nodes", "lost_places", "TIMING_WINDOW"]

TIMING_WINDOW = 2.0  # s: a timing line this long after an order's reply still belongs to it
MAX_BARS = 20_000  # beyond, the chart shows the latest ones (the page says so)
MAX_JOB_ROWS = 200
MAX_DECISIONS = 15
_ENDED = ("done", "failed", "cancelled")


def dashboard_model(events: Iterable[dict[str, Any]], *, now: float | None = None,
                    title: str = "apgas scheduler", subtitle: str = "") -> dict[str, Any]:
    """The view of ``events``; ``now`` (live) extends the time axis and the
    nodes still held up to that time."""
    ordered = _ordered(events)
    if now is not None:
        ordered.append({"t": max(now, float(ordered[-1]["t"])) if ordered else now, "event": "now"})
    t0 = float(ordered[0]["t"]) if ordered else 0.0
    t1 = float(ordered[-1]["t"]) if ordered else 1.0
    jobs = _jobs(ordered)
    nodes = _node_rows(ordered)
    intervals = node_intervals(ordered)
    ends = sorted(b for ivs in intervals.values() for _, b, _ in ivs)
    notes = [subtitle] if subtitle else []
    if len(ends) > MAX_BARS:  # the latest MAX_BARS bars: a page stays quick to make and draw
        t0 = ends[len(ends) - MAX_BARS]
        notes.append(f"the chart shows t ≥ {t0:.0f} s ({len(ends) - MAX_BARS} earlier bars left out)")
    counts = {s: sum(j["state"] == s for j in jobs.values()) for s in ("running", "queued")}
    ended = sum(j["state"] in _ENDED for j in jobs.values())
    notes.append(f"t = {t1:.1f} s · {len(nodes)} node(s) · {counts['running']} running, "
                 f"{counts['queued']} queued, {ended} ended")
    down = down_nodes(ordered)
    if down:
        notes.append(f"{len(down)} node(s) down: {', '.join(down)}")
    return {"title": title, "subtitle": " · ".join(notes), "t0": t0, "t1": t1,
            "sections": [_gantt(ordered, intervals, nodes, jobs, t0),
                         _utilization(ordered, intervals, nodes, t0),
                         _job_table(jobs), _decisions(ordered), _metrics(ordered, intervals)]}


def _jobs(ordered: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every job's name, class, size limits, state and current node count."""
    jobs: dict[int, dict[str, Any]] = {}
    for e in ordered:
        kind, job_id = e.get("event"), e.get("job")
        if not isinstance(job_id, int):
            continue
        job = jobs.setdefault(job_id, {"name": "", "class": "", "min": None, "max": None,
                                       "state": "queued", "submit": None, "start": None,
                                       "end": None, "held": set(), "grows": 0, "shrinks": 0,
                                       "requeues": 0, "requeued": ""})
        nodes = e.get("nodes", ())
        if kind == "submit":
            job.update(name=_text(e.get("name", "")), submit=e["t"], min=e.get("min_nodes"),
                       max=e.get("max_nodes"), **{"class": _text(e.get("class", ""))})
        elif kind in ("start", "adopt"):
            job.update(state="running", start=job["start"] if job["start"] is not None else e["t"])
            job["held"].update(nodes)
        elif kind in ("reserve", "grow"):
            job["held"].update(nodes)
            job["grows"] += kind == "grow"
        elif kind in ("shrink", "grow_failed", "release"):
            job["held"].difference_update(nodes)
            job["shrinks"] += kind == "shrink"
        elif kind == "end":
            job.update(state=_text(e.get("state", "ended")), end=e["t"])
            job["held"].clear()
        elif kind == "requeue":
            job.update(state="queued", end=None, requeues=e.get("count", job["requeues"] + 1),
                       requeued=_text(e.get("reason", "")))
            job["held"].clear()
    return jobs


def down_nodes(events: Iterable[dict[str, Any]]) -> list[str]:
    """The nodes the log leaves down: a job lost its place there (``node_down``), and
    no ``node_up`` came since (the operator's, or a quarantine's end), nor a ``pool``
    without it (it left the pool: added again later, it comes free)."""
    return list(lost_places(events)[0])


def lost_places(events: Iterable[dict[str, Any]]) -> tuple[dict[str, float | None],
                                                            dict[str, set[Any]]]:
    """What the log says of the nodes where jobs lost places, for a restart to take
    up: the nodes down, each with the end of its quarantine (None: down until
    ``node-up``, as every ``node_down`` of an older log), and who (the jobs'
    owners) reported each since the operator last brought it up (a quarantine's
    end, ``node_up`` with ``quarantine``, forgets nobody)."""
    down: dict[str, float | None] = {}
    reporters: dict[str, set[Any]] = {}
    for e in events:
        kind = e.get("event")
        if kind not in ("pool", "node_down", "node_up"):
            continue  # others' "nodes" may be a count
        nodes = [str(n) for n in e.get("nodes", ())]
        if kind == "pool":
            down = {n: until for n, until in down.items() if n in nodes}
            reporters = {n: seen for n, seen in reporters.items() if n in nodes}
        elif kind == "node_down":
            until = e.get("until")
            for node in nodes:
                down[node] = float(until) if isinstance(until, int | float) else None
                reporters.setdefault(node, set()).add(e.get("owner"))
        elif kind == "node_up":
            for node in nodes:
                down.pop(node, None)
                if not e.get("quarantine"):
                    reporters.pop(node, None)
    return down, reporters


def _node_rows(ordered: list[dict[str, Any]]) -> list[str]:
    nodes: dict[str, None] = {}
    for e in ordered:
        if e.get("event") in ("pool", "start", "grow", "reserve", "adopt"):
            nodes.update(dict.fromkeys(str(n) for n in e.get("nodes", ())))
    return list(nodes)


def _gantt(ordered: list[dict[str, Any]], intervals: dict[str, list[Interval]], nodes: list[str],
           jobs: dict[int, dict[str, Any]], t0: float) -> dict[str, Any]:
    row = {n: i for i, n in enumerate(nodes)}
    bars = [[row[str(node)], a, b, str(job), str(job)]
            for node, ivs in intervals.items() for a, b, job in ivs if b >= t0 and str(node) in row]
    return {"kind": "gantt", "id": "nodes", "title": "Nodes over time, by job",
            "rows": nodes, "bars": bars,
            "marks": [m for m in _resize_marks(ordered, row) if m["t"] >= t0],
            "legend": {str(j): f"{j}: {info['name']}" if info["name"] else str(j)
                       for j, info in jobs.items() if info["start"] is not None}}


def _resize_marks(ordered: list[dict[str, Any]], row: dict[str, int]) -> list[dict[str, Any]]:
    """One mark per grow, shrink or failed resize, at the rows of its nodes."""
    timings: dict[Any, list[dict[str, Any]]] = {}  # by job, in log order; taken ones leave
    for e in ordered:
        if e.get("event") == "timing":
            timings.setdefault(e.get("job"), []).append(e)
    marks = []
    for e in ordered:
        kind = e.get("event")
        if kind not in ("grow", "shrink", "grow_failed", "shrink_failed"):
            continue
        job, t, nodes = e.get("job"), float(e["t"]), [str(n) for n in e.get("nodes", ())]
        rows = [row[n] for n in nodes if n in row]
        if kind == "shrink" and e.get("lost"):
            marks.append({"t": t, "kind": "failed", "key": str(job), "short": "✗",
                          "label": f"job {job} lost its place on {', '.join(nodes)}, now down",
                          "rows": rows})
            continue
        if kind.endswith("_failed"):
            label = f"job {job}: {kind.replace('_', ' ')}: {_text(e.get('reason', ''))}"
            marks.append({"t": t, "kind": "failed", "key": str(job), "label": label,
                          "short": "✗", "rows": rows})
            continue
        given = e.get("duration")
        duration = float(given) if isinstance(given, (int, float)) else None
        took = f" in {duration:.2f} s" if duration is not None else ""
        since = t - (duration or 0.0) - 0.5
        mine = timings.get(job, [])
        reported = [timing for timing in mine if since <= float(timing["t"]) <= t + TIMING_WINDOW
                    and _verb(str(timing.get("name", ""))) == kind]
        if reported:
            taken = {id(timing) for timing in reported}
            timings[job] = [timing for timing in mine if id(timing) not in taken]
        sign = "+" if kind == "grow" else "−"
        label = f"job {job} {kind}s by {len(nodes)} ({', '.join(nodes)}){took}"
        if reported:
            label += "; the job reports " + ", ".join(
                f"{_text(t_['name'])} {float(t_.get('seconds', 0)):.3f} s" for t_ in reported)
        whole = [float(t_.get("seconds", 0)) for t_ in reported
                 if str(t_.get("name", "")).lower() == f"{kind}timeapgas"]
        shown = whole[0] if whole else duration
        short = f"{sign}{len(nodes)}" + (f" {shown:.2f}s" if shown is not None else "")
        marks.append({"t": t, "kind": kind, "key": str(job), "label": label, "short": short,
                      "rows": rows})
    return marks


def _text(value: Any) -> str:
    """A text of the log as the page shows it: escaped and cut."""
    return loggable(str(value))


def _verb(name: str) -> str:
    """``growTimeAPGAS``, ``placeStartTimeAPGAS``, ``preGrowTimeGLB`` -> ``grow``."""
    lower = name.lower()
    return "grow" if "grow" in lower or "start" in lower else "shrink"


def _utilization(ordered: list[dict[str, Any]], intervals: dict[str, list[Interval]],
                 nodes: list[str], t0: float) -> dict[str, Any]:
    """Busy nodes, the pool and the queue over time, as step series (from ``t0``)."""
    changes: list[tuple[float, int]] = []
    for ivs in intervals.values():
        for a, b, _ in ivs:
            changes += [(a, 1), (b, -1)]
    busy = _steps(changes)
    pool: set[str] = set()
    pool_points: list[list[float]] = []
    queue_points: list[list[float]] = []
    waiting: set[Any] = set()
    for e in ordered:
        kind, t, job = e.get("event"), float(e["t"]), e.get("job")
        if kind == "pool":
            pool = set(e.get("nodes", ()))  # the whole pool (drained nodes leave it)
            pool_points.append([t, len(pool)])
        elif kind in ("submit", "requeue") or (kind in ("start", "adopt", "end") and job in waiting):
            (waiting.add if kind in ("submit", "requeue") else waiting.discard)(job)
            queue_points.append([t, len(waiting)])
    return {"kind": "series", "id": "utilization", "title": "Utilization", "unit": "nodes / jobs",
            "step": True, "ymax": max(len(nodes), 1),
            "series": [{"name": "busy nodes", "key": "busy", "points": _since(busy, t0)},
                       {"name": "nodes in the pool", "key": "pool", "points": _since(pool_points, t0)},
                       {"name": "queued jobs", "key": "queue", "points": _since(queue_points, t0)}],
            "marks": []}


def _since(points: list[list[float]], t0: float) -> list[list[float]]:
    """A step series from ``t0`` on: the level at ``t0``, then the later steps."""
    later = [p for p in points if p[0] > t0]
    before = [p for p in points if p[0] <= t0]
    return ([[t0, before[-1][1]]] if before else []) + later


def _steps(changes: list[tuple[float, int]]) -> list[list[float]]:
    points: list[list[float]] = []
    level = 0
    for t, delta in sorted(changes):
        level += delta
        if points and points[-1][0] == t:
            points[-1][1] = level
        else:
            points.append([t, level])
    return [p for i, p in enumerate(points) if i == 0 or p[1] != points[i - 1][1]]


def _job_table(jobs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Running jobs first, then the queue, then the ended ones, latest first."""
    order = {"running": 0, "queued": 1}
    ranked = sorted(jobs.items(), key=lambda kv: (order.get(kv[1]["state"], 2),
                                                  kv[0] if kv[1]["state"] in order else -kv[0]))
    rows = []
    for job_id, j in ranked[:MAX_JOB_ROWS]:
        wait = (j["start"] - j["submit"]) if j["start"] is not None and j["submit"] is not None else None
        ran = (j["end"] - j["start"]) if j["end"] is not None and j["start"] is not None else None
        rows.append([job_id, j["name"], j["class"], j["state"], len(j["held"]),
                     j["min"], j["max"], j["grows"], j["shrinks"],
                     None if wait is None else round(wait, 2), None if ran is None else round(ran, 2),
                     j["requeues"], j["requeued"]])
    more = len(ranked) - len(rows)
    return {"kind": "table", "id": "jobs", "keyed": True,
            "title": "Jobs" + (f" (and {more} more ended)" if more > 0 else ""),
            "columns": ["id", "name", "class", "state", "nodes", "min", "max", "grows", "shrinks",
                        "waited [s]", "ran [s]", "requeues", "last requeue"],
            "rows": rows, "empty": "no jobs yet"}


def _decisions(ordered: list[dict[str, Any]]) -> dict[str, Any]:
    decisions = [e for e in ordered if e.get("event") == "decision"][-MAX_DECISIONS:]
    rows = [[round(float(e["t"]), 2), e.get("decision", ""), e.get("job"), e.get("nodes"),
             e.get("policy", "")] for e in reversed(decisions)]
    return {"kind": "table", "id": "decisions", "title": "The policy's last decisions",
            "columns": ["t [s]", "decision", "job", "nodes", "policy"], "rows": rows,
            "empty": "no decisions yet"}


def _metrics(ordered: list[dict[str, Any]], intervals: dict[str, list[Interval]]) -> dict[str, Any]:
    items = [[name, round(value, 3) if isinstance(value, float) else value]
             for name, value in compute_metrics(ordered, intervals).items()]
    return {"kind": "metrics", "id": "metrics", "title": "Metrics so far", "items": items}
