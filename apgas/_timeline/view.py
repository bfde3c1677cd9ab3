"""Read a run timeline (:mod:`apgas._timeline.recorder`) and turn it into a view model for
:func:`apgas.serving._webview.render_page`: ``python -m apgas timeline FILE --html OUT.html``.

Why a separate module: the writer runs inside every run with ``APGAS_TIMELINE``
and must stay small; reading and summarising run afterwards, once, anywhere.

A file may hold several runs (the writer appends): each starts at its ``run``
line, and the model shows one of them, the last by default. Times in the model
are seconds from that run's start.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["read_timeline", "split_runs", "timeline_model", "MAX_POINTS"]

MAX_POINTS = 400  # points per place in "Work per place"; more samples are merged
_PLACE_PHASE = {"grow": "placeStart", "shrink": "placeStop"}


def read_timeline(path: str) -> list[dict[str, Any]]:
    """The events of a timeline file, in file order; blank lines are skipped.

    ``ValueError`` naming ``path:line`` for a line that is not a JSON object with a
    numeric ``t`` and a string ``event``; ``OSError`` if the file cannot be read."""
    events: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
            if not isinstance(event, dict):
                raise ValueError(f"{path}:{number}: a timeline line must be a JSON object, "
                                 f"got {line.strip()[:60]!r}")
            missing = [k for k in ("t", "event") if k not in event]
            if missing:
                raise ValueError(f"{path}:{number}: the line has no {' and no '.join(map(repr, missing))}"
                                 f": {line.strip()[:80]!r}")
            t = event["t"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise ValueError(f"{path}:{number}: 't' must be a number of seconds, got {t!r}")
            if not isinstance(event["event"], str):
                raise ValueError(f"{path}:{number}: 'event' must be a string, got {event['event']!r}")
            events.append(event)
    return events


def split_runs(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs of a file, each from its ``run`` line (lines before the first: a run of their own)."""
    runs: list[list[dict[str, Any]]] = []
    for event in events:
        if event["event"] == "run" or not runs:
            runs.append([])
        runs[-1].append(event)
    return runs


def _r(x: float) -> float:
    return round(x, 6)


def timeline_model(events: list[dict[str, Any]], run: int = -1) -> dict[str, Any]:
    """The view model of run ``run`` (an index into :func:`split_runs`, the last by default)."""
    runs = split_runs(events)
    if not runs:
        raise ValueError("the timeline has no events")
    try:
        chosen = sorted(runs[run], key=lambda e: e["t"])  # stable: file order within a time
    except IndexError:
        raise ValueError(f"the timeline holds {len(runs)} run(s), there is no run {run}") from None
    start = next((e for e in chosen if e["event"] == "run"), None)
    base = start["t"] if start is not None else chosen[0]["t"]
    ended = next((e for e in chosen if e["event"] == "end"), None)
    t1 = _r(max(_end_of(e) for e in chosen) - base)
    rows, bars, failed = _places(chosen, base, t1)
    orders = _orders(chosen, base)
    marks = [o["mark"] for o in orders] + failed
    marks.sort(key=lambda m: m["t"])
    series, processed = _work(chosen, base)
    most, live = 0, 0
    for e in chosen:
        if e["event"] in ("join", "leave"):
            live += 1 if e["event"] == "join" else -1
            most = max(most, live)
    grows = [o for o in orders if o["order"] == "grow"]
    shrinks = [o for o in orders if o["order"] == "shrink"]
    subtitle = _subtitle(start, ended, len(runs), run % len(runs))
    return {
        "title": "APGAS run timeline", "subtitle": subtitle, "t0": 0.0, "t1": t1,
        "sections": [
            {"kind": "gantt", "id": "places", "title": "Places over time", "rows": rows,
             "bars": bars, "marks": marks, "legend": {}},
            {"kind": "series", "id": "work", "title": "Work per place", "unit": "items/s",
             "step": False, "series": series, "marks": marks},
            {"kind": "table", "id": "orders", "title": "Orders",
             "columns": ["t [s]", "order", "places", "pre [s]", "places [s]", "post [s]",
                         "total [s]", "GLB [s]"],
             "rows": [o["row"] for o in orders]},
            {"kind": "metrics", "id": "summary", "title": "Summary", "items": [
                ["run [s]", t1], ["places at most", most], ["grows", len(grows)],
                ["shrinks", len(shrinks)], ["places added", sum(len(o["places"]) for o in grows)],
                ["places removed", sum(len(o["places"]) for o in shrinks)],
                ["places failed", len(failed)],
                ["resize time [s]", _r(sum(o["seconds"] for o in orders))],
                ["items processed", processed]]},
        ]}


def _end_of(event: dict[str, Any]) -> float:
    t: float = event["t"]  # a number: read_timeline checked it
    start = event.get("start")
    if event["event"] in ("phase", "order") and isinstance(start, (int, float)):
        return max(t, start + float(event.get("seconds", 0)))
    return t


def _subtitle(start: dict[str, Any] | None, ended: dict[str, Any] | None, runs: int, index: int) -> str:
    if start is None:
        text = "no run line: the start of the run is missing"
    else:
        when = datetime.datetime.fromtimestamp(start["t"], datetime.UTC)
        text = (f"started {when:%Y-%m-%d %H:%M:%S} UTC on {start.get('host', '?')} "
                f"(pid {start.get('pid', '?')}) with {start.get('places', '?')} place(s), "
                f"{start.get('threads', '?')} thread(s) each")
    if ended is None:
        text += "; no end line: the run was cut short or still runs"
    if runs > 1:
        text += f"; run {index + 1} of {runs} in the file"
    return text


def _places(events: list[dict[str, Any]], base: float,
            t1: float) -> tuple[list[str], list[list[Any]], list[dict[str, Any]]]:
    """Rows (one per place, in the order they joined), their bars, and the failure marks."""
    rows: list[str] = []
    bars: list[list[Any]] = []  # [row, start, end, key, label]
    failed: list[dict[str, Any]] = []
    open_bars: dict[int, int] = {}  # place -> index of its open bar
    row_of: dict[int, int] = {}

    def row(place: int, event: dict[str, Any]) -> int:
        if place not in row_of:
            row_of[place] = len(rows)
            rows.append(f"place {place} ({event.get('host', '?')})")
        return row_of[place]

    for e in events:
        place = e.get("place")
        if e["event"] == "join" and isinstance(place, int):
            open_bars[place] = len(bars)
            bars.append([row(place, e), _r(e["t"] - base), t1, str(place), f"place {place}"])
        elif e["event"] == "leave" and isinstance(place, int):
            index = open_bars.pop(place, None)
            if index is not None:
                bars[index][2] = _r(e["t"] - base)
            if e.get("why") == "failed":
                reason = f": {e['reason']}" if e.get("reason") else ""
                failed.append({"t": _r(e["t"] - base), "kind": "failed", "key": "failed",
                               "label": f"place {place} failed{reason}", "rows": [row(place, e)]})
    return rows, bars, failed


def _orders(events: list[dict[str, Any]], base: float) -> list[dict[str, Any]]:
    """Each order with its phases: its mark and its table row."""
    phases = [e for e in events if e["event"] == "phase"]
    out = []
    for e in (e for e in events if e["event"] == "order"):
        kind, n, begin, seconds = e.get("order", "?"), e.get("n", 0), e["start"], e["seconds"]
        mine = [p for p in phases if p.get("order") == kind and p.get("n") == n
                and begin - 1e-3 <= p["start"] <= begin + seconds + 1e-3]
        own = {p["phase"]: p["seconds"] for p in mine if p.get("source") != "GLB"}
        verb = kind.capitalize()
        pre, mid, post = (own.get(f"pre{verb}", 0.0), own.get(_PLACE_PHASE.get(kind, ""), 0.0),
                          own.get(f"post{verb}", 0.0))
        glb = sum(p["seconds"] for p in mine if p.get("source") == "GLB")
        places = list(e.get("places", []))
        sign = "+" if kind == "grow" else "-"
        label = (f"{kind} {sign}{n}: {seconds:.2f} s (pre {pre:.2f}, places {mid:.2f}, "
                 f"post {post:.2f})")
        t = _r(begin - base)
        out.append({"order": kind, "places": places, "seconds": seconds,
                    "mark": {"t": t, "kind": kind, "key": kind, "label": label},
                    "row": [t, kind, " ".join(map(str, places)), _r(pre), _r(mid), _r(post),
                            _r(seconds), _r(glb)]})
    return out


def _work(events: list[dict[str, Any]], base: float) -> tuple[list[dict[str, Any]], int]:
    """Items per second of each place between its samples, and the items processed in all."""
    by_place: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["event"] == "load" and isinstance(e.get("place"), int):
            by_place.setdefault(e["place"], []).append(e)
    series = []
    processed = 0
    for place in sorted(by_place):
        samples = by_place[place]
        segments: list[list[dict[str, Any]]] = []  # one per GLB computation
        for s in samples:
            if not segments or s.get("glb") != segments[-1][-1].get("glb"):
                segments.append([])
            segments[-1].append(s)
        processed += sum(int(seg[-1].get("processed", 0)) for seg in segments)
        step = max(1, math.ceil(sum(len(seg) - 1 for seg in segments) / MAX_POINTS))
        points: list[list[float]] = []
        for seg in segments:
            kept = seg[::step] if (len(seg) - 1) % step == 0 else seg[::step] + [seg[-1]]
            for a, b in zip(kept, kept[1:], strict=False):  # neighbours: one fewer pair
                dt = b["t"] - a["t"]
                if dt > 0:
                    rate = max(0.0, (b.get("processed", 0) - a.get("processed", 0)) / dt)
                    points.append([_r(b["t"] - base), round(rate, 3)])
        series.append({"name": f"place {place}", "key": str(place), "points": points})
    return series, processed
