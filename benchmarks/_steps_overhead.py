"""benchmarks.steps, part 3: what ``with step:`` costs, around nothing and around a Jacobi
iteration.

Runs at place 0 of one ``apgas.run(places=P)``; the variants take turns within each
repetition (rotated from one repetition to the next), on the same places.

- **Empty step**: ``for i in range(N): pass`` against ``for step in apgas.steps(N):
  with step: pass`` (no arrays): seconds per step of each, and their difference.
- **Jacobi** (``apgas.arrays.apps.jacobi``'s kernels): two ``n x n`` float64 grids made
  with ``follow=True, resilient=True``; an iteration is one ``finish`` in which each
  owner sweeps its rows of the new grid from ``halo(1, copy=False)`` of the old one
  (as the app does); the grids swap by the iteration's parity. Three loops of
  ``iterations`` iterations, each from freshly initialised grids (the same values
  every time, and no denormal numbers from a front that a long run would push down
  the grid):

  - *plain*: ``for i in range(iterations):`` the iteration (each top-level
    ``finish`` holds the gate by itself, since the grids follow the places);
  - *steps, commit_every=0*: ``apgas.steps(iterations, arrays=grids)``, the
    iteration inside ``with step:``;
  - *steps, commit_every=10*: the same, with a commit after every 10th step.

  Each loop notes the start of every iteration's body and its own end. Per
  iteration: the *mean* (the first body's start to the loop's end, over the
  iterations: for the steps loops after the loop's first commit, which part 1
  measures, and with the commits of ``commit_every=10``), and the *typical* one,
  the median of the times from one body's start to the next (commits and bursts of
  the machine's other work left out: the figure that tells ``with step:`` from the
  noise of a shared machine).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import apgas
from apgas.arrays import BlockArray
from apgas.arrays.apps import jacobi
from benchmarks._steps_common import owners

__all__ = ["empty_steps", "jacobi_loops", "JACOBI_VARIANTS", "EMPTY_VARIANTS"]

EMPTY_VARIANTS = ("plain", "steps")
JACOBI_VARIANTS = ("plain", "steps_c0", "steps_c10")


def _rotated(items: tuple[str, ...], k: int) -> tuple[str, ...]:
    k %= len(items)
    return items[k:] + items[:k]


def _stats(values: list[float]) -> dict[str, float]:
    return {"best": min(values), "median": statistics.median(values)}


# -- the empty step ------------------------------------------------------------------------------------

def _empty_plain(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pass
    return (time.perf_counter() - start) / n


def _empty_steps(n: int) -> float:
    start = time.perf_counter()
    for step in apgas.steps(n):
        with step:
            pass
    return (time.perf_counter() - start) / n


def empty_steps(n: int, repeats: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Seconds per step of an empty loop, plain and as steps, ``repeats`` times in turn."""
    got: dict[str, list[float]] = {v: [] for v in EMPTY_VARIANTS}
    for rep in range(repeats):
        for v in _rotated(EMPTY_VARIANTS, rep):
            got[v].append(_empty_plain(n) if v == "plain" else _empty_steps(n))
        progress(f"empty steps, repeat {rep + 1}/{repeats}: {got['steps'][-1] * 1e6:.2f} us a step")
    per = [s - p for s, p in zip(got["steps"], got["plain"], strict=True)]
    return {"steps": n, "repeats": repeats, "samples": got, "plain_s": _stats(got["plain"]),
            "steps_s": _stats(got["steps"]), "overhead_s": _stats(per)}


# -- Jacobi -----------------------------------------------------------------------------------------------

def _initial_at(grids: list[BlockArray]) -> None:
    for g in grids:
        jacobi.initial(g.local(), g.rows().start)


def _sweep_at(old: BlockArray, new: BlockArray) -> None:
    jacobi.sweep(old.halo(1, copy=False), new.local(), old.rows().start, old.shape[0])


def _iteration(grids: list[BlockArray], i: int) -> None:
    old, new = grids[i % 2], grids[(i + 1) % 2]
    with apgas.finish():
        for pid in owners(old):
            apgas.async_at(pid, _sweep_at, old, new)


def _initialise(grids: list[BlockArray]) -> None:
    with apgas.finish():
        for pid in owners(grids[0]):
            apgas.async_at(pid, _initial_at, grids)


def _plain(grids: list[BlockArray], iterations: int) -> list[float]:
    marks = []
    for i in range(iterations):
        marks.append(time.perf_counter())
        _iteration(grids, i)
    marks.append(time.perf_counter())
    return marks


def _steps(grids: list[BlockArray], iterations: int, every: int) -> list[float]:
    marks = []
    for step in apgas.steps(iterations, commit_every=every, arrays=grids):
        with step:
            marks.append(time.perf_counter())
            _iteration(grids, step.index)
    marks.append(time.perf_counter())
    return marks


def _per_iteration(marks: list[float]) -> tuple[float, float]:
    """From the start of each iteration's body and the loop's end: the mean time an
    iteration took, and the median of the times between two bodies' starts."""
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    return (marks[-1] - marks[0]) / len(gaps), statistics.median(gaps)


def _checksum(grids: list[BlockArray], iterations: int) -> float:
    return float(grids[iterations % 2].sum())


def _ratios(values: list[float], plain: list[float]) -> dict[str, float]:
    return {"median_of_pairs": statistics.median(v / p for v, p in zip(values, plain, strict=True)),
            "median_over_median": statistics.median(values) / statistics.median(plain),
            "best_over_best": min(values) / min(plain)}


def jacobi_loops(n: int, iterations: int, repeats: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """The three Jacobi loops, ``repeats`` times in turn; per-iteration seconds, checksums."""
    grids = [BlockArray.zeros((n, n), np.float64, follow=True, resilient=True) for _ in range(2)]
    got: dict[str, list[float]] = {v: [] for v in JACOBI_VARIANTS}
    typical: dict[str, list[float]] = {v: [] for v in JACOBI_VARIANTS}
    sums: dict[str, set[float]] = {v: set() for v in JACOBI_VARIANTS}
    try:
        _initialise(grids)
        _plain(grids, min(iterations, 3))  # warm: the kernel loaded, the halo buffers made
        for rep in range(repeats):
            for v in _rotated(JACOBI_VARIANTS, rep):
                _initialise(grids)
                if v == "plain":
                    marks = _plain(grids, iterations)
                else:
                    marks = _steps(grids, iterations, 0 if v == "steps_c0" else 10)
                mean, gap = _per_iteration(marks)
                got[v].append(mean)
                typical[v].append(gap)
                sums[v].add(_checksum(grids, iterations))
            progress(f"jacobi n={n}, repeat {rep + 1}/{repeats}: "
                     + ", ".join(f"{v} {got[v][-1] * 1e3:.2f} ms" for v in JACOBI_VARIANTS))
    finally:
        for g in grids:
            g.free()
    out: dict[str, Any] = {"n": n, "iterations": iterations, "repeats": repeats, "kernels": jacobi.KERNELS,
                           "places": len(apgas.places()), "samples": got,
                           "typical_samples": typical,
                           "checksums": {v: sorted(s) for v, s in sums.items()},
                           "same_checksums": len(set().union(*sums.values())) == 1}
    for v in JACOBI_VARIANTS:
        out[f"{v}_s"] = _stats(got[v])
        out[f"{v}_typical_s"] = _stats(typical[v])
    for v in JACOBI_VARIANTS[1:]:
        out[f"{v}_over_plain"] = _ratios(got[v], got["plain"])
        out[f"{v}_typical_over_plain"] = _ratios(typical[v], typical["plain"])
    return out
