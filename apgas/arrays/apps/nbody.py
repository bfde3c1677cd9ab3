"""N-body: all-pairs gravity with kick-drift-kick leapfrog, distributed by bodies.

N bodies at ``numpy.random.default_rng(seed).random((N, 3))``, at rest, of mass
1/N; G = 1, softening eps = 0.01 and dt = 0.001::

    a_i = sum_{j != i} m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)

Each step kicks the velocities by dt/2, drifts the positions by dt, computes
the accelerations anew and kicks by dt/2 again. The values are the energy
(kinetic plus potential, the potential being ``-sum_{i<j} m_i m_j /
sqrt(r^2 + eps^2)``) and the sum of the positions.

Positions, velocities and accelerations are BlockArrays of shape (N, 3) that
follow the places, kept at the commits of :func:`apgas.steps` (a step follows
from them alone). Each place computes the accelerations of its own bodies
against all positions, which place 0 gathers and sends to every place once a
step. A body's acceleration is computed by the same expressions whatever the
places (chunks of rows, elementwise products, a sum along each row), and the
final sums add the rows' sums in row order (:func:`~apgas.arrays.apps.total`), so
the values are the same bit for bit on any places and through any resizes.

The kernels (:func:`accelerations`, :func:`potential_rows`) are compiled with
numba when it is installed (the ``apps`` extra): a loop over the bodies, each
body's sum taken in body order, about 6 times faster than the numpy form on
4000 bodies (43 ms against 258 ms for all accelerations; numpy makes seven
(rows, N) temporaries a pass and is bound by memory). Without numba the numpy
form runs (:data:`KERNELS` says which); both give the same values on any
places, the two differ in the last bits (summation order).
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

from . import CheckSizes, Outcome, Session, at_owners, row_sums, total

__all__ = ["CHECK", "CHECK_EVERY", "COMMIT_EVERY", "EPS", "DT", "KERNELS", "positions", "accelerations",
           "potential_rows", "kick", "drift", "sequential", "run", "add_arguments", "parameters"]

log = logging.getLogger("apgas.arrays.apps.nbody")

Array = npt.NDArray[np.float64]

EPS = 0.01
DT = 0.001
#: DMR's Table 1 for N-body: 1 to 16 processes, 1 preferred; resizes by a factor of 2
CHECK: CheckSizes = (1, 16, 1, 2)
#: steps between two ``check_status`` calls (DMR's N-body runs only 25 steps)
CHECK_EVERY = 1
#: steps between two commits of ``apgas.steps`` (copies of x, v and a: 72 bytes a body)
COMMIT_EVERY = 5
CHUNK = 256  # rows of bodies per pass of the numpy kernels: bounds the (rows, N) temporaries


def check(n: int, steps: int, seed: int) -> None:
    """ValueError unless the problem makes sense."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"nbody needs --n >= 2 bodies, got {n!r}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"nbody needs --steps >= 0, got {steps!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"nbody needs --seed >= 0, got {seed!r}")


# -- kernels ------------------------------------------------------------------------------------
def positions(n: int, seed: int) -> Array:
    """The starting positions."""
    return np.random.default_rng(seed).random((n, 3))


def _pairs(xi: Array, xs: Array) -> tuple[Array, Array, Array, Array]:
    """dx, dy, dz (x_j - x_i) and r^2 + eps^2 for the bodies ``xi`` against all ``xs``."""
    dx = xs[None, :, 0] - xi[:, 0, None]
    dy = xs[None, :, 1] - xi[:, 1, None]
    dz = xs[None, :, 2] - xi[:, 2, None]
    r2 = dx * dx + dy * dy + dz * dz + EPS * EPS
    return dx, dy, dz, r2


def _accelerations_numpy(xi: Array, xs: Array, out: Array) -> None:
    m = 1.0 / len(xs)
    for lo in range(0, len(xi), CHUNK):
        dx, dy, dz, r2 = _pairs(xi[lo:lo + CHUNK], xs)
        w = m / (r2 * np.sqrt(r2))
        for k, d in enumerate((dx, dy, dz)):
            d *= w
            out[lo:lo + CHUNK, k] = d.sum(axis=1)


def _potential_rows_numpy(first: int, xi: Array, xs: Array, out: Array) -> None:
    j = np.arange(len(xs))
    for lo in range(0, len(xi), CHUNK):
        *_, r2 = _pairs(xi[lo:lo + CHUNK], xs)
        inv = 1.0 / np.sqrt(r2)
        inv[j[None, :] <= (first + lo + np.arange(len(inv)))[:, None]] = 0.0
        out[lo:lo + CHUNK] = inv.sum(axis=1)


def _accelerations_loop(xi: Array, xs: Array, out: Array) -> None:
    n = xs.shape[0]
    m = 1.0 / n
    eps2 = EPS * EPS
    for i in range(xi.shape[0]):
        x0, x1, x2 = xi[i, 0], xi[i, 1], xi[i, 2]
        ax = ay = az = 0.0
        for j in range(n):  # in order: the same sum whatever block row i is in
            dx = xs[j, 0] - x0
            dy = xs[j, 1] - x1
            dz = xs[j, 2] - x2
            r2 = dx * dx + dy * dy + dz * dz + eps2
            w = m / (r2 * math.sqrt(r2))
            ax += dx * w
            ay += dy * w
            az += dz * w
        out[i, 0] = ax
        out[i, 1] = ay
        out[i, 2] = az


def _potential_rows_loop(first: int, xi: Array, xs: Array, out: Array) -> None:
    eps2 = EPS * EPS
    for i in range(xi.shape[0]):
        x0, x1, x2 = xi[i, 0], xi[i, 1], xi[i, 2]
        s = 0.0
        for j in range(first + i + 1, xs.shape[0]):
            dx = xs[j, 0] - x0
            dy = xs[j, 1] - x1
            dz = xs[j, 2] - x2
            s += 1.0 / math.sqrt(dx * dx + dy * dy + dz * dz + eps2)
        out[i] = s


try:
    import numba
except ImportError:  # the numpy kernels: the same values up to summation order, ~6x slower
    KERNELS = "numpy"
    _accelerations, _potential_rows = _accelerations_numpy, _potential_rows_numpy
else:
    KERNELS = "numba"
    # no fastmath: a vectorised sum's order would depend on the alignment of each place's
    # copy of the positions, and the values must not depend on the places; nogil: the
    # runtime's threads of the place keep running while a kernel does
    _accelerations = numba.njit(nogil=True, cache=True)(_accelerations_loop)
    _potential_rows = numba.njit(nogil=True, cache=True)(_potential_rows_loop)


def accelerations(xi: Array, xs: Array, out: Array) -> None:
    """``out`` = the accelerations of the bodies at ``xi`` (some rows of ``xs``) from all
    the bodies at ``xs``. A body's own term is 0 (its dx, dy, dz are)."""
    _accelerations(xi, xs, out)


def potential_rows(first: int, xi: Array, xs: Array, out: Array) -> None:
    """``out[i]`` = sum over j > first + i of 1 / sqrt(r^2 + eps^2), for the bodies at
    ``xi``, rows ``first..`` of ``xs`` (the potential is ``-m^2`` times the total)."""
    _potential_rows(first, xi, xs, out)


def kick(v: Array, a: Array) -> None:
    """v += dt/2 a."""
    v += (0.5 * DT) * a


def drift(x: Array, v: Array) -> None:
    """x += dt v."""
    x += DT * v


def energy(n: int, vv: float, potential_sum: float) -> float:
    """Kinetic plus potential energy from sum(v^2) and the sum of :func:`potential_rows`."""
    m = 1.0 / n
    return 0.5 * m * vv - m * m * potential_sum


# -- the reference ------------------------------------------------------------------------------
def sequential(n: int, steps: int, seed: int = 0) -> dict[str, float]:
    """The same steps on all the bodies in this process:
    ``{"energy": E, "checksum": sum of the positions}``."""
    check(n, steps, seed)
    x = positions(n, seed)
    v = np.zeros((n, 3))
    a = np.empty((n, 3))
    accelerations(x, x, a)
    for _ in range(steps):
        kick(v, a)
        drift(x, v)
        accelerations(x, x, a)
        kick(v, a)
    phi = np.empty(n)
    potential_rows(0, x, x, phi)
    return {"energy": energy(n, float(row_sums(v, v).sum()), float(row_sums(phi).sum())),
            "checksum": float(row_sums(x).sum())}


# -- distributed --------------------------------------------------------------------------------
def _accelerate_at(x: BlockArray, a: BlockArray, xs: Array) -> None:
    accelerations(x.local(), xs, a.local())


def _kick_drift_at(x: BlockArray, v: BlockArray, a: BlockArray) -> None:
    kick(v.local(), a.local())
    drift(x.local(), v.local())


def _accelerate_kick_at(x: BlockArray, v: BlockArray, a: BlockArray, xs: Array) -> None:
    accelerations(x.local(), xs, a.local())
    kick(v.local(), a.local())


def _potential_at(x: BlockArray, phi: BlockArray, xs: Array) -> None:
    potential_rows(x.rows().start, x.local(), xs, phi.local())


def run(n: int, steps: int, seed: int = 0, places: Sequence[apgas.Place | int] | None = None, *,
        malleable: bool = False, check_sizes: CheckSizes | None = None, check_every: int = CHECK_EVERY,
        commit_every: int = COMMIT_EVERY, resilient: bool = False,
        on_iteration: Callable[[int], None] | None = None) -> Outcome:
    """The steps over the places, at place 0 inside ``apgas.run``; the options as for
    :func:`apgas.arrays.apps.jacobi.run`."""
    check(n, steps, seed)
    session = Session(malleable, check_sizes, check_every, on_iteration)
    follow = session.follows(places)
    session.start()
    start = positions(n, seed)
    x = BlockArray.from_array(start, places=places, follow=follow, resilient=resilient)
    v = BlockArray.zeros((n, 3), np.float64, places=places, follow=follow, resilient=resilient)
    a = BlockArray.zeros((n, 3), np.float64, places=places, follow=follow, resilient=resilient)
    bodies = [x, v, a]
    try:
        at_owners(x, _accelerate_at, x, a, start)
        session.ready(bodies)
        try:
            loop = apgas.steps(steps, commit_every=commit_every, arrays=bodies)
            for step in session.steps(loop, steps):
                with step:
                    at_owners(x, _kick_drift_at, x, v, a)
                    at_owners(x, _accelerate_kick_at, x, v, a, x.gather())
        finally:
            session.close()
        phi = BlockArray.zeros((n,), np.float64, places=places, follow=follow)
        bodies.append(phi)
        at_owners(x, _potential_at, x, phi, x.gather())
        values = {"energy": energy(n, total(v, v), total(phi)), "checksum": total(x)}
    finally:
        for b in bodies:
            b.free()
    return session.outcome(values, steps)


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=2000, help="bodies; default 2000")
    parser.add_argument("--steps", type=int, default=25, help="leapfrog steps; default 25 (DMR's)")
    parser.add_argument("--seed", type=int, default=0, help="positions' seed; default 0")


def parameters(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as ``run``'s and ``sequential``'s keywords (checked)."""
    check(ns.n, ns.steps, ns.seed)
    return {"n": ns.n, "steps": ns.steps, "seed": ns.seed}

