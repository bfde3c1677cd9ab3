"""Pi: a Monte Carlo estimate from random points in the unit square.

The samples are cut into chunks of a fixed size. Chunk ``c`` draws from its
own splitmix64 stream, seeded from (the sample seed, ``c``) alone, so the hit
count is the same bit for bit however chunks are split, stolen or spread
over places and workers. (Numba's ``np.random`` keeps per-thread state,
which would tie the numbers to the thread that drew them.)

A point is one 64-bit draw: two 31-bit coordinates, compared in integers
(``x² + y² < 2⁶²``). The lattice bias is about 2⁻³¹, far below the
statistical error of any feasible sample count.

A unit of ``PiBag.process`` (and of GLB's per-place ``units``) is one chunk;
the application's units are samples.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterable

import numba
import numpy as np

from glb.bags import RangeBag

from ._app import App, Params

__all__ = ["APP", "PiBag", "PiResult", "chunk_count", "hits"]

MASK64 = (1 << 64) - 1
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
LOW31 = np.uint64((1 << 31) - 1)
RADIUS2 = np.uint64(1 << 62)  # (2³¹)²: the quarter circle over 31-bit coordinates
S27, S30, S31, S33 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(33)


# -- kernels ------------------------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
def _mix(z: np.uint64) -> np.uint64:
    """The splitmix64 finaliser: a bijection that scrambles every bit."""
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)


@numba.njit(nogil=True, cache=True)
def _chunk_hits(seed: np.uint64, chunk: int, samples: int) -> int:
    """Points of chunk ``chunk`` inside the quarter circle; its stream depends on (seed, chunk) only."""
    state = _mix(_mix(seed + GOLDEN) + np.uint64(chunk))
    inside = 0
    for _ in range(samples):
        state += GOLDEN
        z = _mix(state)
        x = z >> S33
        y = z & LOW31
        if x * x + y * y < RADIUS2:
            inside += 1
    return inside


@numba.njit(nogil=True, cache=True)
def _hits(seed: np.uint64, lo: int, hi: int, chunk: int, samples: int) -> int:
    """Hits of chunks ``lo..hi-1``; the last chunk of all may be short."""
    inside = 0
    for c in range(lo, hi):
        inside += _chunk_hits(seed, c, min(chunk, samples - c * chunk))
    return inside


def hits(seed: int, lo: int, hi: int, chunk: int, samples: int) -> int:
    """Hits of chunks ``lo..hi-1`` of ``samples`` samples in chunks of ``chunk``."""
    return int(_hits(np.uint64(seed & MASK64), lo, hi, chunk, samples))


def chunk_count(samples: int, chunk: int) -> int:
    return -(-samples // chunk)


def samples_in(lo: int, hi: int, chunk: int, samples: int) -> int:
    """Samples of chunks ``lo..hi-1``."""
    return min(hi * chunk, samples) - min(lo * chunk, samples)


# -- bag and result -------------------------------------------------------------------------------

class PiResult:
    """Hits inside the quarter circle, out of samples; folds in any order."""

    def __init__(self, hits: int = 0, samples: int = 0) -> None:
        self.hits = hits
        self.samples = samples

    def fold(self, other: PiResult) -> None:
        self.hits += other.hits
        self.samples += other.samples

    def estimate(self) -> float:
        return 4.0 * self.hits / self.samples if self.samples else math.nan

    def __repr__(self) -> str:
        return f"PiResult(hits={self.hits}, samples={self.samples})"


class PiBag(RangeBag):
    """Ranges [lo, hi) of chunk indices still to draw, and the hits of those drawn."""

    def __init__(self, seed: int, chunk: int, samples: int,
                 ranges: Iterable[tuple[int, int]] = ()) -> None:
        super().__init__(ranges=ranges)
        self.seed, self.chunk, self.samples = seed, chunk, samples

    def work(self, lo: int, hi: int) -> PiResult:
        """Draw chunks ``lo..hi-1`` (the kernel releases the GIL)."""
        return PiResult(hits(self.seed, lo, hi, self.chunk, self.samples),
                        samples_in(lo, hi, self.chunk, self.samples))


# -- the application --------------------------------------------------------------------------------

def _count(text: str) -> int:
    """An integer, also written like ``2e8`` or ``200_000_000``."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=_count, default=4_000_000_000,
                        help="points to draw (default: %(default)s, a few seconds on one core)")
    parser.add_argument("--chunk-size", dest="chunk", type=_count, default=1 << 16,
                        help="samples per chunk, the unit GLB moves; it changes the streams "
                             "and so the estimate (default: %(default)s)")
    parser.add_argument("--sample-seed", dest="seed", type=_count, default=0,
                        help="seed of every chunk's stream (default: %(default)s)")


def params(ns: argparse.Namespace) -> Params:
    """Validate ``--samples``, ``--chunk-size`` and ``--sample-seed``; errors name the bad value."""
    for flag, value, low, high in (("--samples", ns.samples, 1, 1 << 62),
                                   ("--chunk-size", ns.chunk, 1, 1 << 40),
                                   ("--sample-seed", ns.seed, 0, MASK64)):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"{flag} must be an integer in {low}..{high}, got {value!r}")
    return {"samples": ns.samples, "chunk": ns.chunk, "seed": ns.seed}


def make_bag(p: Params) -> PiBag:
    return PiBag(p["seed"], p["chunk"], p["samples"], [(0, chunk_count(p["samples"], p["chunk"]))])


def make_static_bag(p: Params, index: int, count: int) -> PiBag:
    """Worker ``index`` of ``count`` gets one contiguous block of chunks."""
    total = chunk_count(p["samples"], p["chunk"])
    lo, hi = total * index // count, total * (index + 1) // count
    return PiBag(p["seed"], p["chunk"], p["samples"], [(lo, hi)])


def make_result(p: Params) -> PiResult:
    return PiResult()


def sequential(p: Params) -> PiResult:
    """Every chunk in one kernel call, no runtime."""
    total = chunk_count(p["samples"], p["chunk"])
    return PiResult(hits(p["seed"], 0, total, p["chunk"], p["samples"]), p["samples"])


def check(p: Params, value: float) -> bool:
    """Within 6 standard errors of pi (a false alarm about once in 500 million seeds)."""
    q = math.pi / 4
    return abs(value - math.pi) <= 6 * 4 * math.sqrt(q * (1 - q) / p["samples"])


def warm_up() -> float:
    """Compile (or load) the kernel."""
    start = time.perf_counter()
    hits(0, 0, 2, 8, 12)
    return time.perf_counter() - start


APP = App(
    name="pi",
    add_arguments=add_arguments,
    params=params,
    make_bag=make_bag,
    make_static_bag=make_static_bag,
    make_result=make_result,
    sequential=sequential,
    value=lambda r: r.estimate(),
    units=lambda r: r.samples,
    check=check,
    warm_up=warm_up,
    unit_name="samples",
    default_n=64,  # chunks per process call: about 2 ms with the default chunk size
)
