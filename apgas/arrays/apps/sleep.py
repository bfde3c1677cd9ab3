"""Flexible Sleep (DMR's FS): steps that sleep, with data that moves on every resize.

K steps; in each, every place holding data sleeps T seconds (in parallel), then
the job reaches a reconfiguring point, where orders are carried out. The job
holds a float64 BlockArray of B bytes in all (default 1 GiB) that follows the
places, so each grow or shrink moves data as DMR's FS does; its elements are
0, 1, 2, ..., so the sum (the checksum) is exact and shows any lost or
misplaced row. The per-resize times say what the moves cost. The data is
resilient: the steps of :func:`apgas.steps` copy it at their commits, and a
lost place (not place 0) rolls it back.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import apgas
from apgas.arrays import BlockArray

from . import CheckSizes, Outcome, Session, at_owners

__all__ = ["CHECK", "CHECK_EVERY", "COMMIT_EVERY", "GiB", "parse_bytes", "fill", "expected", "intact",
           "sequential", "run", "add_arguments", "parameters"]

log = logging.getLogger("apgas.arrays.apps.sleep")

GiB = 1 << 30
#: DMR's Table 1 for FS: 1 to 20 processes, no preferred size; resizes by a factor of 2
CHECK: CheckSizes = (1, 20, None, 2)
#: steps between two ``check_status`` calls: every step ends at a reconfiguring point
CHECK_EVERY = 1
#: steps between two commits of ``apgas.steps``: 0, only the commits before the first step
#: and after each order (a commit copies all the data, as a resize moves it)
COMMIT_EVERY = 0

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"1G"``, ``"256M"``, ``"64KiB"``, ``"4096"`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"--bytes takes a size such as 4096, 256M or 1G, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def check(steps: int, seconds: float, nbytes: int) -> None:
    """ValueError unless the problem makes sense."""
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"sleep needs --steps >= 0, got {steps!r}")
    if not seconds >= 0:  # also NaN
        raise ValueError(f"sleep needs --seconds >= 0, got {seconds!r}")
    if not isinstance(nbytes, int) or nbytes < 8:
        raise ValueError(f"sleep needs --bytes of at least 8 (one float64), got {nbytes!r}")


# -- kernels ------------------------------------------------------------------------------------
def fill(block: npt.NDArray[np.float64], first: int) -> None:
    """Elements ``first..`` of the data: their own indices."""
    block[...] = np.arange(first, first + len(block), dtype=np.float64)


def expected(nbytes: int) -> float:
    """The checksum of intact data of ``nbytes`` (``nbytes // 8`` elements): 0 + 1 + ... +
    (M - 1). The float64 sum is exact while that stays below 2**53 (up to 1 GiB)."""
    m = nbytes // 8
    return float(m * (m - 1) // 2)


def intact(checksum: float, nbytes: int) -> bool:
    """Whether ``checksum`` is that of intact data (exactly, where the sum is exact)."""
    want = expected(nbytes)
    return checksum == want if want < 2.0 ** 53 else math.isclose(checksum, want, rel_tol=1e-12)


# -- the reference ------------------------------------------------------------------------------
def sequential(steps: int, seconds: float, nbytes: int = GiB) -> dict[str, float]:
    """The same steps in this process: ``{"checksum": S}``."""
    check(steps, seconds, nbytes)
    data = np.empty(nbytes // 8)
    fill(data, 0)
    for _ in range(steps):
        time.sleep(seconds)
    return {"checksum": float(data.sum())}


# -- distributed --------------------------------------------------------------------------------
def _fill_at(a: BlockArray) -> None:
    fill(a.local(), a.rows().start)


def run(steps: int, seconds: float, nbytes: int = GiB,
        places: Sequence[apgas.Place | int] | None = None, *, malleable: bool = False,
        check_sizes: CheckSizes | None = None, check_every: int = CHECK_EVERY,
        commit_every: int = COMMIT_EVERY, resilient: bool = False,
        on_iteration: Callable[[int], None] | None = None) -> Outcome:
    """The steps over the places, at place 0 inside ``apgas.run``; the options as for
    :func:`apgas.arrays.apps.jacobi.run`."""
    check(steps, seconds, nbytes)
    session = Session(malleable, check_sizes, check_every, on_iteration)
    follow = session.follows(places)
    session.start()
    data = BlockArray.zeros((nbytes // 8,), np.float64, places=places, follow=follow,
                            resilient=resilient)
    try:
        at_owners(data, _fill_at, data)
        session.ready([data])
        try:
            loop = apgas.steps(steps, commit_every=commit_every, arrays=[data])
            for step in session.steps(loop, steps):
                with step:
                    at_owners(data, time.sleep, seconds)
        finally:
            session.close()
        values = {"checksum": float(data.sum())}
    finally:
        data.free()
    if not intact(values["checksum"], nbytes):
        log.error("the data changed: checksum %r, expected %r", values["checksum"], expected(nbytes))
    return session.outcome(values, steps)


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=25, help="steps; default 25 (DMR's)")
    parser.add_argument("--seconds", type=float, default=1.0, help="sleep per step; default 1")
    parser.add_argument("--bytes", type=_bytes_option, default=GiB, dest="nbytes", metavar="B",
                        help="data held in all, e.g. 256M or 1G; default 1G")


def _bytes_option(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parameters(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as ``run``'s and ``sequential``'s keywords (checked)."""
    check(ns.steps, ns.seconds, ns.nbytes)
    return {"steps": ns.steps, "seconds": ns.seconds, "nbytes": ns.nbytes}
