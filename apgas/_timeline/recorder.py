"""The run timeline: place 0 appends what happened, as JSON lines, to ``APGAS_TIMELINE``.

Why a file of lines and not a report at the end: a run that is killed still
leaves what it did up to then, and ``python -m apgas timeline FILE --html
OUT.html`` (:mod:`apgas._timeline.view`) draws it afterwards.

Every line is ``{"t": <time.time()>, "event": <kind>, ...}``; the kinds:

- ``run`` (places, threads, host, pid) when place 0 starts, ``end`` when it stops;
- ``join`` ``{"place", "host"}`` for every place that joins, the first ones too;
  ``leave`` ``{"place", "host", "why"}``, ``why`` being ``shrink``, ``failed``
  (its process ended, or it fell silent) or ``end`` (the run ended);
- ``phase`` ``{"order", "phase", "n", "start", "seconds"}`` for each phase of a
  grow or shrink order (``"source": "GLB"`` for GLB's own share of a phase), and
  ``order`` ``{"order", "n", "start", "seconds", "places"}`` for the whole order;
- ``load`` ``{"place", "glb", "processed", "workers", "shared"}``: GLB's samples of
  each place's cumulative processed units (``workers``: its workers holding work,
  ``shared``: pieces of work waiting for thieves). They are taken at each place
  every ``APGAS_TIMELINE_INTERVAL`` seconds but written when they reach place 0
  (at the end of the computation, or when the place leaves), so the file is not
  in time order; readers sort by ``t``.

Times are ``time.time()`` of the host that took them: samples of places on other
hosts are off by those hosts' clock skew (NTP keeps it to milliseconds, usually).

The writer exists at place 0 only, when ``APGAS_TIMELINE`` is set; otherwise
every hook is one ``is not None`` check and GLB samples nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from ..errors import ApgasError

__all__ = ["Timeline", "open_timeline", "current", "sample_interval", "wall", "MAX_SAMPLES"]

MAX_SAMPLES = 100_000  # load samples a place keeps; see glb._sampling.Sampler for what happens then

_active: Timeline | None = None  # place 0's writer while a run with a timeline is active


class Timeline:
    """Thread-safe writer of one run's timeline (appended, one flush per line)."""

    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._lock = threading.Lock()
        try:
            self._file: IO[str] | None = open(path, "a", encoding="utf-8", buffering=1)
        except OSError as e:
            raise ApgasError(f"APGAS_TIMELINE: cannot open {path!r} for appending: {e}") from None

    def write(self, event: str, t: float | None = None, **fields: Any) -> None:
        """One line; ``t`` defaults to now. A write after ``close`` is dropped."""
        line = json.dumps({"t": time.time() if t is None else t, "event": event, **fields},
                          separators=(",", ":"))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def phase(self, order: str, phase: str, n: int, since_ns: int, ns: int, **more: Any) -> None:
        """A ``phase`` line: ``phase`` of a grow or shrink ``order`` of ``n`` places,
        which began at ``time.monotonic_ns()`` ``since_ns`` and took ``ns``."""
        self.write("phase", order=order, phase=phase, n=n, start=wall(since_ns), seconds=ns / 1e9,
                   **more)

    def loads(self, place: int, glb: int, samples: Iterable[tuple[float, int, int, int]]) -> None:
        """A place's load samples, as ``(t, processed, workers, shared)``."""
        lines = [json.dumps({"t": t, "event": "load", "place": place, "glb": glb,
                             "processed": processed, "workers": workers, "shared": shared},
                            separators=(",", ":")) for t, processed, workers, shared in samples]
        if not lines:
            return
        with self._lock:
            if self._file is not None:
                self._file.write("\n".join(lines) + "\n")

    def close(self) -> None:
        global _active
        with self._lock:
            if self._file is None:
                return
            self._file.write(json.dumps({"t": time.time(), "event": "end"}, separators=(",", ":")) + "\n")
            self._file.close()
            self._file = None
        if _active is self:
            _active = None


def open_timeline(config: Any, host: str) -> Timeline | None:
    """Place 0, at the run's start: the writer if ``APGAS_TIMELINE`` is set, its ``run`` line written."""
    global _active
    _active = None  # a run that was never shut down leaves no writer behind
    if not config.timeline:
        return None
    timeline = Timeline(config.timeline, config.timeline_interval)
    timeline.write("run", places=config.places, threads=config.threads, host=host, pid=os.getpid())
    _active = timeline
    return timeline


def current() -> Timeline | None:
    """The active writer (place 0 of a run with ``APGAS_TIMELINE``), else None."""
    return _active


def sample_interval() -> float | None:
    """Seconds between load samples if a timeline is written, else None (sample nothing)."""
    timeline = _active
    return None if timeline is None else timeline.interval


def wall(monotonic_ns: int) -> float:
    """The ``time.time()`` of a ``time.monotonic_ns()`` reading taken in this process."""
    return time.time() - (time.monotonic_ns() - monotonic_ns) / 1e9
