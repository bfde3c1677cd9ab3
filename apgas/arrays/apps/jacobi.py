"""Jacobi: the 5-point stencil on an N x N grid, distributed by rows.

The grid is float64; its top row (row 0) is 1.0 and the rest of the boundary
0.0, for good; the interior starts at 0.0. Each iteration sets every interior
point to the mean of its four neighbours of the previous iteration. The value
is the sum of the whole grid, boundary included.

Two grids take turns (the new one is written from the old one's rows and
halos; iteration ``i`` reads grid ``i % 2``, so a roll-back that repeats
iterations finds them where they were), so an iteration is one ``finish``:
each place fetches its halo rows and sweeps its own rows. The halo is ``halo(1, copy=False)``: only the two neighbour
rows travel, the block is not copied. The sweep is compiled with numba when it
is installed (one pass over memory where numpy makes four: about 6 times
faster; :data:`KERNELS` says which), with the same additions in the same order.
A point is computed by the same expression whatever the places, and the sum adds the rows' sums in row order (:func:`~apgas.arrays.apps.total`),
so the value is the same bit for bit on any places and through any resizes.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas.arrays import BlockArray

from . import CheckSizes, Outcome, Session, at_owners, row_sums, total

__all__ = ["CHECK", "CHECK_EVERY", "COMMIT_EVERY", "KERNELS", "initial", "sweep", "sequential", "run",
           "add_arguments", "parameters"]

log = logging.getLogger("apgas.arrays.apps.jacobi")

Grid = npt.NDArray[np.float64]

#: DMR's Table 1 for Jacobi: 2 to 32 processes, 8 preferred; resizes by a factor of 2
CHECK: CheckSizes = (2, 32, 8, 2)
#: iterations between two ``check_status`` calls (the runtime's inhibitor spaces the asks too)
CHECK_EVERY = 10
#: iterations between two commits of ``apgas.steps`` (copies of both grids, for roll-back):
#: a commit costs about 7 iterations here (30 ms against 4 ms at n = 1000 on 2 places)
COMMIT_EVERY = 50


def check(n: int, iterations: int) -> None:
    """ValueError unless the problem makes sense (a grid needs an interior point)."""
    if not isinstance(n, int) or n < 3:
        raise ValueError(f"jacobi needs --n >= 3 (an N x N grid with an interior), got {n!r}")
    if not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"jacobi needs --iterations >= 0, got {iterations!r}")


# -- kernels ------------------------------------------------------------------------------------
def initial(block: Grid, first: int) -> None:
    """Rows ``first..`` of the starting grid, in place: row 0 is 1.0, all else 0.0."""
    block[...] = 0.0
    if first == 0 and len(block):
        block[0] = 1.0


def sweep(h: Grid, out: Grid, first: int, n: int) -> None:
    """One Jacobi sweep of the global rows ``first .. first + len(out)`` of an ``n`` x
    ``n`` grid: ``h`` holds those rows of the old grid with one more row above and
    below (the halo). Writes only the interior points of ``out``: its boundary keeps
    its (constant) values."""
    rows = len(out)
    lo = 1 if first == 0 else 0  # local rows lo..hi are interior rows
    hi = rows - 1 if first + rows == n else rows
    if hi > lo:
        _sweep(h, out, lo, hi)


def _sweep_numpy(h: Grid, out: Grid, lo: int, hi: int) -> None:
    o = out[lo:hi, 1:-1]  # ((up + down) + left + right) / 4, without temporaries
    np.add(h[lo:hi, 1:-1], h[lo + 2:hi + 2, 1:-1], out=o)
    o += h[lo + 1:hi + 1, :-2]
    o += h[lo + 1:hi + 1, 2:]
    o *= 0.25


def _sweep_loop(h: Grid, out: Grid, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        for j in range(1, out.shape[1] - 1):
            out[i, j] = (((h[i, j] + h[i + 2, j]) + h[i + 1, j - 1]) + h[i + 1, j + 1]) * 0.25


try:
    import numba
except ImportError:  # four numpy passes over the rows: the same values, bound by memory
    KERNELS = "numpy"
    _sweep = _sweep_numpy
else:
    # One pass (the numpy form makes four over memory); the same additions in the same
    # order, no fastmath, so the values are those of the numpy form, bit for bit.
    KERNELS = "numba"
    _sweep = numba.njit(nogil=True, cache=True)(_sweep_loop)


# -- the reference ------------------------------------------------------------------------------
def sequential(n: int, iterations: int) -> dict[str, float]:
    """The same iterations on one whole grid in this process: ``{"checksum": S}``."""
    check(n, iterations)
    # each grid sits between two rows of zeros, so sweep reads its halo in place
    old, new = np.zeros((n + 2, n)), np.zeros((n + 2, n))
    initial(old[1:-1], 0)
    initial(new[1:-1], 0)
    for _ in range(iterations):
        sweep(old, new[1:-1], 0, n)
        old, new = new, old
    return {"checksum": float(row_sums(old[1:-1]).sum())}


# -- distributed --------------------------------------------------------------------------------
def _initial_at(grids: tuple[BlockArray, ...]) -> None:
    for g in grids:
        initial(g.local(), g.rows().start)


def _sweep_at(old: BlockArray, new: BlockArray) -> None:
    sweep(old.halo(1, copy=False), new.local(), old.rows().start, old.shape[0])


def run(n: int, iterations: int, places: Sequence[apgas.Place | int] | None = None, *,
        malleable: bool = False, check_sizes: CheckSizes | None = None, check_every: int = CHECK_EVERY,
        commit_every: int = COMMIT_EVERY, resilient: bool = False,
        on_iteration: Callable[[int], None] | None = None) -> Outcome:
    """The iterations over the places, at place 0 inside ``apgas.run``: the steps of
    :func:`apgas.steps`.

    ``places`` (default: all, following grow and shrink orders) spreads the grid over
    those places only, for good. ``malleable``: take orders (carried out between
    iterations); ``check_sizes``: also ask the scheduler (``apgas.check_status``) every
    ``check_every`` iterations (:data:`CHECK` are DMR's values). ``resilient``: the
    grids are copied at the loop's commits (before the first iteration, after every
    ``commit_every``-th and after each order), and a lost place (not place 0) rolls
    them back to the last commit; ``resilient=False`` keeps no copies (a loss is then
    an error)."""
    check(n, iterations)
    session = Session(malleable, check_sizes, check_every, on_iteration)
    follow = session.follows(places)
    session.start()
    grids = tuple(BlockArray.zeros((n, n), np.float64, places=places, follow=follow,
                                   resilient=resilient) for _ in range(2))
    try:
        at_owners(grids[0], _initial_at, grids)
        session.ready(grids)
        try:
            loop = apgas.steps(iterations, commit_every=commit_every, arrays=grids)
            for step in session.steps(loop, iterations):
                with step:
                    old, new = grids[step.index % 2], grids[(step.index + 1) % 2]
                    at_owners(old, _sweep_at, old, new)
        finally:
            session.close()
        values = {"checksum": total(grids[iterations % 2])}
    finally:
        for g in grids:
            g.free()
    return session.outcome(values, iterations)


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=1000, help="grid size N (N x N points); default 1000")
    parser.add_argument("--iterations", type=int, default=100, help="sweeps; default 100")


def parameters(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as ``run``'s and ``sequential``'s keywords (checked)."""
    check(ns.n, ns.iterations)
    return {"n": ns.n, "iterations": ns.iterations}
