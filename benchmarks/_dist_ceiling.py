"""benchmarks.dist part 3: the memory-bandwidth ceiling of two places on this machine
(a Jacobi sweep alone against two processes side by side on half the grid each)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._dist_common import side_by_side

__all__ = ["jacobi_sweep", "app_sweep", "bandwidth_ceiling", "bandwidth_once", "render_ceiling"]

def jacobi_sweep(u: npt.NDArray[np.float64], v: npt.NDArray[np.float64]) -> None:
    """One 5-point Jacobi sweep of the interior of ``u`` into ``v``, without temporaries."""
    inner = v[1:-1, 1:-1]
    np.add(u[:-2, 1:-1], u[2:, 1:-1], out=inner)
    inner += u[1:-1, :-2]
    inner += u[1:-1, 2:]
    inner *= 0.25


def app_sweep(u: npt.NDArray[np.float64], v: npt.NDArray[np.float64]) -> None:
    """The same sweep with the kernel of ``python -m apgas.arrays.apps jacobi`` (numba
    when installed: one pass over memory where numpy makes four)."""
    from apgas.arrays.apps import jacobi
    jacobi.sweep(u, v[1:-1], 1, len(u))


def _jacobi_worker(rows: int, cols: int, sweeps: int, app: bool, start: Any,
                   out: Connection) -> None:
    """A process of :func:`bandwidth_ceiling`: ``sweeps`` sweeps over ``rows`` rows,
    started together with the other processes; sends the seconds they took. ``app``:
    with the Jacobi app's kernel (:func:`app_sweep`) instead of numpy's."""
    u = np.ones((rows + 2, cols), np.float64)
    v = u.copy()
    kernel = app_sweep if app else jacobi_sweep
    kernel(u, v)  # warm: pages touched, code loaded (and compiled)
    start.wait()
    began = time.perf_counter()
    for _ in range(sweeps):
        kernel(u, v)
        u, v = v, u
    out.send(time.perf_counter() - began)
    out.close()


def bandwidth_ceiling(rows: int = 4096, cols: int = 4096, sweeps: int = 10, repeats: int = 5,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The memory-bandwidth ceiling of two places on this machine.

    A numpy 5-point Jacobi sweep (stream-like: each sweep reads one ``rows x cols``
    float64 grid and writes the other) run ``sweeps`` times alone in one process
    on the whole grid, then as two processes side by side on ``rows // 2`` rows
    each, ``repeats`` times, interleaved. ``ratio`` = t(alone) / (2 x t(pair)),
    t(pair) the slower process's time, from the medians (``ratio_best`` from the
    best times): the parallel efficiency a memory-bound kernel can reach on two
    places here (ideal 1.0). ``nominal_gbs`` counts 16 bytes a grid point and
    sweep (one read, one write), the traffic of a perfect cache."""
    alone: list[float] = []
    pair: list[float] = []
    for rep in range(repeats):
        a, p = bandwidth_once(rows, cols, sweeps)
        alone.append(a)
        pair.append(p)
        if progress is not None:
            progress(f"ceiling, repeat {rep + 1}/{repeats}: alone {alone[-1]:.3f} s, "
                     f"pair {pair[-1]:.3f} s, ratio {alone[-1] / (2 * pair[-1]):.2f}")
    traffic = 16.0 * rows * cols * sweeps
    t1, t2 = statistics.median(alone), statistics.median(pair)
    return {"kernel": "numpy 5-point Jacobi sweep", "rows": rows, "cols": cols, "sweeps": sweeps,
            "repeats": repeats, "alone_s": alone, "pair_s": pair, "alone_median_s": t1,
            "pair_median_s": t2, "ratio": t1 / (2 * t2), "ratio_best": min(alone) / (2 * min(pair)),
            "nominal_gbs_alone": traffic / t1 / 1e9, "nominal_gbs_pair": traffic / t2 / 1e9}


def bandwidth_once(rows: int, cols: int, sweeps: int, app: bool = False) -> tuple[float, float]:
    """One repeat of :func:`bandwidth_ceiling`: (alone, the slower of the pair) in seconds;
    ``app``: with the Jacobi app's kernel (the ceiling of that app)."""
    return (side_by_side(_jacobi_worker, [(rows, cols, sweeps, app)], 30)[0],
            max(side_by_side(_jacobi_worker, [(rows // 2, cols, sweeps, app),
                                              (rows - rows // 2, cols, sweeps, app)], 30)))


def render_ceiling(c: dict[str, Any]) -> str:
    return "\n".join([
        f"memory-bandwidth ceiling ({c['kernel']}, {c['rows']} x {c['cols']}, {c['sweeps']} sweeps, "
        f"medians of {c['repeats']}):",
        f"  alone, whole grid:           {c['alone_median_s']:.3f} s  "
        f"({c['nominal_gbs_alone']:.2f} GB/s nominal)",
        f"  two processes, half each:    {c['pair_median_s']:.3f} s  "
        f"({c['nominal_gbs_pair']:.2f} GB/s nominal, both together)",
        f"  ratio t(alone) / (2 t(pair)): {c['ratio']:.2f} median, {c['ratio_best']:.2f} best "
        f"(ideal 1.0)"])

