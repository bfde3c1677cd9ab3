"""What the parts of benchmarks.steps share: sizes, the arrays, what each place reports
about itself, the loop's instrumented arrays, progress and the memory check."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import apgas
from apgas.arrays import BlockArray, at_each
from benchmarks._common import available_bytes, scheduler_env_aside
from benchmarks._dist_common import COLS, ROW_BYTES, GiB, MiB, mib

__all__ = ["MiB", "GiB", "COLS", "ROW_BYTES", "mib", "Timed", "spans", "Progress", "make_arrays",
           "fill_at", "add_one_at", "expected_sum", "owners", "memory_at", "reset_peak_at",
           "memory_everywhere", "loopback_bytes", "available_bytes", "scheduler_env_aside",
           "peak_estimate", "fits", "gbs"]

log = logging.getLogger("benchmarks.steps")


def gbs(nbytes: float, seconds: float | None) -> float | None:
    """``nbytes / seconds`` in GB/s (10^9 bytes), None without a positive time."""
    return nbytes / seconds / 1e9 if seconds and seconds > 0 else None


# -- the arrays ---------------------------------------------------------------------------------

def make_arrays(size: int, count: int) -> list[BlockArray]:
    """``count`` float64 arrays of ``size / count`` bytes together, rows of ``COLS``
    columns, made with ``follow=True, resilient=True`` at place 0 and filled (row i of
    array k holds i + k, so every page is touched)."""
    rows = max(1, size // count // ROW_BYTES)
    arrays = [BlockArray.zeros((rows, COLS), np.float64, follow=True, resilient=True)
              for _ in range(count)]
    with apgas.finish():
        for pid in owners(arrays[0]):
            apgas.async_at(pid, fill_at, arrays)
    return arrays


def fill_at(arrays: Sequence[BlockArray]) -> None:
    """At an owner: row i of array k holds i + k."""
    for k, a in enumerate(arrays):
        block = a.local()
        block[:] = (np.arange(a.rows().start, a.rows().stop, dtype=np.float64) + k)[:, None]


def add_one_at(arrays: Sequence[BlockArray]) -> None:
    """At an owner: add 1.0 to every element of its blocks (one step of a test program)."""
    for a in arrays:
        a.local()[...] += 1.0


def expected_sum(a: BlockArray, k: int, added: int) -> float:
    """The sum of array ``k`` of :func:`make_arrays` after ``added`` calls of
    :func:`add_one_at` (exact: integers far below 2^53)."""
    rows, cols = a.shape
    return float(cols * (rows * (rows - 1) // 2 + rows * (k + added)))


def owners(a: BlockArray) -> list[int]:
    """The places holding rows of ``a``, in block order."""
    return [pid for pid, start, stop in a.layout if stop > start]


# -- what a place reports about itself ---------------------------------------------------------

def memory_at() -> tuple[int, int]:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), in bytes."""
    found: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line[:5]] = int(line.split()[1]) * 1024
    return found.get("VmRSS", 0), found.get("VmHWM", 0)


def reset_peak_at() -> bool:
    """Reset this process's peak resident memory (VmHWM) to its current one; False if
    the kernel does not let it (``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def memory_everywhere(places: list[int]) -> dict[int, tuple[int, int]]:
    """:func:`memory_at` of each place, by place id."""
    return dict(zip(places, at_each(places, memory_at), strict=True))


def loopback_bytes() -> int | None:
    """Bytes received on the loopback interface so far (``/proc/net/dev``): every byte
    the places send each other, and whatever else this machine sends itself."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


# -- the loop's arrays, timed ---------------------------------------------------------------------

class Timed:
    """Stands for a resilient :class:`~apgas.arrays.BlockArray` in the ``arrays`` of
    ``apgas.steps`` and records when the loop commits, forgets and restores it.

    The loop reads ``resilient`` and calls these three methods of each listed array
    (``apgas._malleability.steps._Resilient``); this forwards them and appends ``(what, start,
    end)`` (``time.perf_counter``) to ``events``. The instrumentation costs about a
    microsecond a call, against milliseconds to seconds for the calls."""

    def __init__(self, array: BlockArray, events: list[tuple[str, float, float]]) -> None:
        self.array = array
        self.resilient = array.resilient
        self.events = events
        #: what the last commit returned (its tag, the layout then, each owner's buddy)
        self.last: Any = None

    def _steps_commit(self, tag: int) -> Any:
        start = time.perf_counter()
        try:
            self.last = self.array._steps_commit(tag)
            return self.last
        finally:
            self.events.append(("commit", start, time.perf_counter()))

    def _steps_forget(self, keep: int | None) -> None:
        start = time.perf_counter()
        try:
            self.array._steps_forget(keep)
        finally:
            self.events.append(("forget", start, time.perf_counter()))

    def _steps_restore(self, commit: Any) -> None:
        start = time.perf_counter()
        try:
            self.array._steps_restore(commit)
        finally:
            self.events.append(("restore", start, time.perf_counter()))

    def __repr__(self) -> str:
        return f"Timed({self.array!r})"


def spans(events: list[tuple[str, float, float]], what: str, per: int) -> list[tuple[float, float]]:
    """The ``what`` events grouped by ``per`` (the arrays of one commit, called one
    after the other): each group's first start and last end."""
    mine = [(s, e) for w, s, e in events if w == what]
    return [(mine[i][0], mine[i + per - 1][1]) for i in range(0, len(mine) - per + 1, per)]


# -- progress ---------------------------------------------------------------------------------------

class Progress:
    """Logs ``[k/total] what`` at INFO with the time so far and an estimate of the rest."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.done = 0
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        took = time.monotonic() - self.start
        left = took / self.done * (self.total - self.done)
        log.info("[%d/%d] %s (%.0f s so far, about %.0f s left)", self.done, self.total, what, took,
                 left)


# -- the environment --------------------------------------------------------------------------------

def peak_estimate(size: int, places: int) -> int:
    """What a commit measurement of ``size`` bytes on ``places`` places holds at its peak:
    the arrays, two commits' copies (the new one is made before the old one is dropped)
    and the bare floor's buffers (one commit's worth made beforehand, one made as it
    goes), plus 1 GiB of headroom."""
    one_commit = size + size * (places - 1) // places  # local copies + the buddies' copies
    return size + 4 * one_commit + GiB


def fits(size: int, places: int, what: str, skipped: list[dict[str, Any]]) -> bool:
    """Whether :func:`peak_estimate` fits in the free memory now; if not, print why and
    record it in ``skipped``."""
    free = available_bytes()
    need = peak_estimate(size, places)
    if free is None or need <= free:
        return True
    why = (f"{what}: {mib(size)} on {places} places skipped: needs about {need / GiB:.1f} GiB, "
           f"{free / GiB:.1f} GiB available")
    print(why, flush=True)
    log.warning("%s", why)
    skipped.append({"part": what, "bytes": size, "places": places, "needed": need, "available": free})
    return False
