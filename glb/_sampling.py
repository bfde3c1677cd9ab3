"""Load samples of one place for the run timeline (``APGAS_TIMELINE``, :mod:`apgas._timeline.recorder`).

A place samples only when place 0 writes a timeline and says so in
``init_place``; otherwise no sampler exists and the workers skip the one
``is not None`` check that feeds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from apgas.lowlevel import MAX_SAMPLES

__all__ = ["Sampler", "Sample"]

Sample = tuple[float, int, int, int]  # time.time(), processed units so far, workers with work, shared pieces


class Sampler:
    """Takes ``read()`` every ``interval`` seconds in a daemon thread, until ``stop``.

    Bounded: at ``limit`` samples (100 000 by default) every second sample is
    dropped (the oldest are thinned, the newest kept) and the interval doubles,
    so the samples still cover the whole computation evenly, at half the
    resolution, and a place never holds more than ``limit``.
    """

    def __init__(self, interval: float, read: Callable[[], tuple[int, int, int]],
                 name: str, limit: int = MAX_SAMPLES) -> None:
        self.interval = interval
        self.limit = max(2, limit)
        self._read = read
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Sampler:
        self.take()  # the first sample at the start: a rate needs two
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.take()

    def take(self) -> None:
        """One sample now (dropped once stopped)."""
        with self._lock:  # read and append at once: samples stay in order
            if self._stop.is_set():
                return
            processed, workers, shared = self._read()
            now = time.time()
            if len(self._samples) >= self.limit:
                self._samples = self._samples[1::2]  # keeps the newest
                self.interval *= 2
            self._samples.append((now, processed, workers, shared))

    def stop(self) -> list[Sample]:
        """A last sample, then stop; all samples, oldest first. Does not wait for the thread:
        it takes no sample after this and ends at its next wake-up."""
        self.take()
        with self._lock:
            self._stop.set()
            return list(self._samples)
