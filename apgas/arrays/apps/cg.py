"""CG: unpreconditioned conjugate gradient on the 5-point Laplacian, distributed by rows.

The matrix is the Laplacian of an N x N grid with a zero Dirichlet boundary (N*N
unknowns, 4 on the diagonal, -1 to each grid neighbour); the right-hand side is
all ones and x0 = 0. Exactly K iterations run (no early stop; a residual that
reaches 0 exactly makes the steps 0 instead of dividing by it). The values are
the sum of x and the 2-norm of b - Ax, computed from x at the end (not from the
recurrence).

The vectors are BlockArrays of shape (N, N): a matrix-vector product is a
stencil on the rows with their halos. Every element is updated by the same
expression whatever the places, and the inner products add the rows' sums in
row order (:func:`~apgas.arrays.apps.total`), so the values are the same bit for
bit on any places and through any resizes, as :func:`sequential`'s.

An iteration is three rounds of tasks, not five: the matrix-vector product
returns the row sums of ``p * q``, the update of x and r those of ``r * r``
(:func:`~apgas.arrays.apps.at_owners_sum`); p's halo is ``halo(1, copy=False)``,
which moves two rows, not the block. The iterations are the steps of
:func:`apgas.steps`, with the four vectors and ``rho`` (the state) kept at its
commits.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas.arrays import BlockArray

from . import CheckSizes, Outcome, Session, at_owners, at_owners_sum, row_sums, total

__all__ = ["CHECK", "CHECK_EVERY", "COMMIT_EVERY", "laplacian", "step_size", "update_x_r", "update_p",
           "inner", "residual_rows", "sequential", "run", "add_arguments", "parameters"]

log = logging.getLogger("apgas.arrays.apps.cg")

Vector = npt.NDArray[np.float64]

#: DMR's Table 1 for CG: 2 to 32 processes, 8 preferred; resizes by a factor of 2
CHECK: CheckSizes = (2, 32, 8, 2)
#: iterations between two ``check_status`` calls (the runtime's inhibitor spaces the asks too)
CHECK_EVERY = 10
#: iterations between two commits of ``apgas.steps`` (copies of x, r, p, q and rho): a
#: commit costs about 2 iterations here (55 ms against 25 ms at n = 1000 on 2 places)
COMMIT_EVERY = 25


def check(n: int, iterations: int) -> None:
    """ValueError unless the problem makes sense."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"cg needs --n >= 2 (an N x N grid), got {n!r}")
    if not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"cg needs --iterations >= 0, got {iterations!r}")


# -- kernels ------------------------------------------------------------------------------------
def laplacian(h: Vector, out: Vector) -> None:
    """``out`` = A times the rows of a vector (shaped as the grid): ``h`` holds those
    rows with one row above and below (zeros beyond the grid's edge)."""
    c = h[1:-1]
    np.multiply(c, 4.0, out=out)
    out -= h[:-2]
    out -= h[2:]
    out[:, 1:] -= c[:, :-1]
    out[:, :-1] -= c[:, 1:]


def step_size(num: float, den: float) -> float:
    """``num / den``, or 0.0 when ``den`` is 0 (the residual reached 0 exactly)."""
    return num / den if den != 0.0 else 0.0


def update_x_r(x: Vector, r: Vector, p: Vector, q: Vector, alpha: float) -> None:
    """x += alpha p; r -= alpha q (in place)."""
    x += alpha * p
    r -= alpha * q


def update_p(p: Vector, r: Vector, beta: float) -> None:
    """p = r + beta p (in place)."""
    p *= beta
    p += r


def inner(u: Vector, v: Vector) -> float:
    """u . v as :func:`~apgas.arrays.apps.total` adds it: row by row, then the rows."""
    return float(row_sums(u, v).sum())


def residual_rows(h: Vector, out: Vector) -> None:
    """``out`` = b - A x on some rows (``h``: those rows of x with their halo), b = 1."""
    laplacian(h, out)
    np.subtract(1.0, out, out=out)


# -- the reference ------------------------------------------------------------------------------
def sequential(n: int, iterations: int) -> dict[str, float]:
    """The same iterations on whole vectors in this process:
    ``{"checksum": sum of x, "residual": |b - Ax|}``."""
    check(n, iterations)
    x = np.zeros((n, n))
    r = np.ones((n, n))
    padded = np.zeros((n + 2, n))  # p between two rows of zeros: laplacian reads it in place
    p = padded[1:-1]
    p[...] = r
    q = np.empty((n, n))
    rho = inner(r, r)
    for _ in range(iterations):
        laplacian(padded, q)
        alpha = step_size(rho, inner(p, q))
        update_x_r(x, r, p, q, alpha)
        rho_next = inner(r, r)
        update_p(p, r, step_size(rho_next, rho))
        rho = rho_next
    padded[1:-1] = x
    residual_rows(padded, q)
    return {"checksum": float(row_sums(x).sum()), "residual": math.sqrt(inner(q, q))}


# -- distributed --------------------------------------------------------------------------------
def _fill_at(vectors: tuple[BlockArray, ...], value: float) -> None:
    for v in vectors:
        v.local()[...] = value


def _matvec_dot_at(p: BlockArray, q: BlockArray) -> Vector:
    """q = A p on this place's rows; the row sums of ``p * q`` (for ``p . q``)."""
    laplacian(p.halo(1, copy=False), q.local())
    return row_sums(p.local(), q.local())


def _update_x_r_at(x: BlockArray, r: BlockArray, p: BlockArray, q: BlockArray, alpha: float
                   ) -> Vector:
    """x += alpha p, r -= alpha q; the row sums of ``r * r`` (for ``r . r``)."""
    update_x_r(x.local(), r.local(), p.local(), q.local(), alpha)
    return row_sums(r.local(), r.local())


def _update_p_at(p: BlockArray, r: BlockArray, beta: float) -> None:
    update_p(p.local(), r.local(), beta)


def _residual_at(x: BlockArray, out: BlockArray) -> None:
    residual_rows(x.halo(1, copy=False), out.local())


def run(n: int, iterations: int, places: Sequence[apgas.Place | int] | None = None, *,
        malleable: bool = False, check_sizes: CheckSizes | None = None, check_every: int = CHECK_EVERY,
        commit_every: int = COMMIT_EVERY, resilient: bool = False,
        on_iteration: Callable[[int], None] | None = None) -> Outcome:
    """The iterations over the places, at place 0 inside ``apgas.run``; the options
    as for :func:`apgas.arrays.apps.jacobi.run`."""
    check(n, iterations)
    session = Session(malleable, check_sizes, check_every, on_iteration)
    follow = session.follows(places)
    session.start()
    x, r, p, q = vectors = tuple(BlockArray.zeros((n, n), np.float64, places=places, follow=follow,
                                                  resilient=resilient) for _ in range(4))
    try:
        at_owners(r, _fill_at, (r, p), 1.0)
        state = {"rho": total(r, r)}
        session.ready(vectors)
        try:
            loop = apgas.steps(iterations, commit_every=commit_every, arrays=vectors, state=state)
            for step in session.steps(loop, iterations):
                with step:
                    rho = state["rho"]
                    alpha = step_size(rho, at_owners_sum(p, _matvec_dot_at, p, q))
                    rho_next = at_owners_sum(p, _update_x_r_at, x, r, p, q, alpha)
                    at_owners(p, _update_p_at, p, r, step_size(rho_next, rho))
                    state["rho"] = rho_next
        finally:
            session.close()
        at_owners(x, _residual_at, x, q)
        values = {"checksum": total(x), "residual": math.sqrt(total(q, q))}
    finally:
        for v in vectors:
            v.free()
    return session.outcome(values, iterations)


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=1000,
                        help="grid size N (N*N unknowns); default 1000")
    parser.add_argument("--iterations", type=int, default=100, help="CG iterations; default 100")


def parameters(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as ``run``'s and ``sequential``'s keywords (checked)."""
    check(ns.n, ns.iterations)
    return {"n": ns.n, "iterations": ns.iterations}
