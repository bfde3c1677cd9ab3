"""N-Queens: count every way to place N non-attacking queens on an N x N board.

The first ``t`` rows (the threshold) are enumerated when the bag is made:
each valid placement of those rows, a *prefix*, is one task. A Numba kernel
solves a prefix completely with the bitboard search (columns and both
diagonals as bitmasks, an explicit stack instead of recursion).

A unit of ``NQueensBag.process`` (and so of GLB's per-place ``units``) is
one prefix. The application's throughput is reported in *solutions*: unlike
prefixes, they do not depend on ``t``, so runs with different thresholds and
the C reference (``nqueens_c.c``, timed by :func:`c_reference_seconds`) compare.

    python -m glb.apps.nqueens 14 16    # Numba on one core vs ``cc -O2``
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from ._app import App, Params

__all__ = ["APP", "NQueensBag", "NQueensResult", "REFERENCE", "c_reference_seconds", "prefixes"]

log = logging.getLogger("glb.apps.nqueens")

#: known solution counts (OEIS A000170), used by ``check``
REFERENCE = {1: 1, 2: 0, 3: 0, 4: 2, 5: 10, 6: 4, 7: 40, 8: 92, 9: 352, 10: 724, 11: 2680,
             12: 14200, 13: 73712, 14: 365596, 15: 2279184, 16: 14772512, 17: 95815104,
             18: 666090624}

MAX_N = 30  # masks are int64; beyond this the search would not end anyway
# the columns of a prefix: occupied columns, both diagonals as seen from the next row, and that
# row (for inspection: the kernel needs only the masks, it stops when every column is taken)
COLS, D1, D2, ROW = range(4)


# -- kernels ------------------------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
def _enumerate(n: int, t: int, out: np.ndarray) -> int:
    """Write the valid placements of rows 0..t-1 into ``out`` (as far as it fits); return their count.

    Called once with an empty ``out`` to count, then again to fill.
    """
    if t == 0:  # the empty board is the one prefix
        if out.shape[0] > 0:
            out[0, :] = 0
        return 1
    full = (np.int64(1) << n) - 1
    avail = np.zeros(t, np.int64)
    cs = np.zeros(t, np.int64)
    ls = np.zeros(t, np.int64)
    rs = np.zeros(t, np.int64)
    count = 0
    avail[0] = full
    depth = 0
    while depth >= 0:
        a = avail[depth]
        if a == 0:
            depth -= 1
            continue
        bit = a & -a
        avail[depth] = a ^ bit
        c = cs[depth] | bit
        left = ((ls[depth] | bit) << 1) & full
        right = (rs[depth] | bit) >> 1
        if depth + 1 == t:
            if count < out.shape[0]:
                out[count, COLS] = c
                out[count, D1] = left
                out[count, D2] = right
                out[count, ROW] = t
            count += 1
            continue
        depth += 1
        cs[depth] = c
        ls[depth] = left
        rs[depth] = right
        avail[depth] = full & ~(c | left | right)
    return count


@numba.njit(nogil=True, cache=True)
def _solve(n: int, tasks: np.ndarray) -> int:
    """Count the completions of every prefix in ``tasks`` (rows of cols, d1, d2, row)."""
    full = (np.int64(1) << n) - 1
    avail = np.empty(n + 1, np.int64)
    cs = np.empty(n + 1, np.int64)
    ls = np.empty(n + 1, np.int64)
    rs = np.empty(n + 1, np.int64)
    count = 0
    for i in range(tasks.shape[0]):
        if tasks[i, COLS] == full:  # the prefix is a whole solution
            count += 1
            continue
        cs[0] = tasks[i, COLS]
        ls[0] = tasks[i, D1]
        rs[0] = tasks[i, D2]
        avail[0] = full & ~(cs[0] | ls[0] | rs[0])
        depth = 0
        while depth >= 0:
            a = avail[depth]
            if a == 0:
                depth -= 1
                continue
            bit = a & -a  # the lowest free square of this row
            avail[depth] = a ^ bit
            c = cs[depth] | bit
            if c == full:
                count += 1
                continue
            left = ((ls[depth] | bit) << 1) & full
            right = (rs[depth] | bit) >> 1
            depth += 1
            cs[depth] = c
            ls[depth] = left
            rs[depth] = right
            avail[depth] = full & ~(c | left | right)
    return count


def prefixes(n: int, t: int) -> np.ndarray:
    """All valid placements of the first ``t`` rows, shape (count, 4), in a fixed order."""
    count = _enumerate(n, t, np.empty((0, 4), np.int64))
    out = np.empty((count, 4), np.int64)
    _enumerate(n, t, out)
    return out


# -- bag and result -------------------------------------------------------------------------------

class NQueensResult:
    """Solutions found and prefixes solved; folds in any order."""

    def __init__(self, solutions: int = 0, tasks: int = 0) -> None:
        self.solutions = solutions
        self.tasks = tasks

    def fold(self, other: NQueensResult) -> None:
        self.solutions += other.solutions
        self.tasks += other.tasks

    def __repr__(self) -> str:
        return f"NQueensResult(solutions={self.solutions}, tasks={self.tasks})"


class NQueensBag:
    """Prefixes still to solve, and the solutions of those already solved."""

    def __init__(self, n: int, tasks: np.ndarray | None = None) -> None:
        self.n = n
        self.tasks = np.empty((0, 4), np.int64) if tasks is None else tasks
        self.solutions = 0
        self.solved = 0

    def process(self, n: int) -> int:
        """Solve up to ``n`` prefixes, from the front (the kernel releases the GIL)."""
        k = min(n, len(self.tasks))
        if k:
            self.solutions += int(_solve(self.n, self.tasks[:k]))
            self.solved += k
            self.tasks = self.tasks[k:]
        return k

    def is_empty(self) -> bool:
        return len(self.tasks) == 0

    def is_splittable(self) -> bool:
        return len(self.tasks) >= 2

    def split(self, take_all: bool) -> NQueensBag | None:
        """Give away all prefixes, or the back half (loot carries work, never solutions)."""
        size = len(self.tasks)
        give = size if take_all else size // 2
        if give == 0:
            return None
        loot = NQueensBag(self.n, self.tasks[size - give:])
        self.tasks = self.tasks[:size - give]
        return loot

    def merge(self, other: NQueensBag) -> None:
        if len(other.tasks):
            self.tasks = np.concatenate((self.tasks, other.tasks))

    def submit(self, result: NQueensResult) -> None:
        result.fold(NQueensResult(self.solutions, self.solved))
        self.solutions = 0
        self.solved = 0


# -- the application --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    # dest "size": the driver's ``--n`` (GLB units per process call) owns ``n``
    parser.add_argument("-n", dest="size", type=int, default=16, help="board size (default: %(default)s)")
    parser.add_argument("-t", "--threshold", type=int, default=5,
                        help="rows placed before a prefix becomes a task (default: %(default)s)")


def params(ns: argparse.Namespace) -> Params:
    """Validate ``-n`` and ``-t``; errors name the bad value."""
    n, t = ns.size, ns.threshold
    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ValueError(f"-n (board size) must be an integer in 1..{MAX_N}, got {n!r}")
    if not isinstance(t, int) or not 0 <= t <= n:
        raise ValueError(f"-t (threshold) must be an integer in 0..{n} (the board size), got {t!r}")
    return {"n": n, "threshold": t}


def make_bag(p: Params) -> NQueensBag:
    return NQueensBag(p["n"], prefixes(p["n"], p["threshold"]))


def make_static_bag(p: Params, index: int, count: int) -> NQueensBag:
    """Every ``count``-th prefix from ``index``: neighbours cost alike, so shares even out."""
    tasks = prefixes(p["n"], p["threshold"])[index::count]
    return NQueensBag(p["n"], np.ascontiguousarray(tasks))


def make_result(p: Params) -> NQueensResult:
    return NQueensResult()


def sequential(p: Params) -> NQueensResult:
    """The kernel alone on the empty board: one task, no prefixes, no runtime."""
    n = p["n"]
    return NQueensResult(int(_solve(n, prefixes(n, 0))), 1)


def check(p: Params, value: int) -> bool | None:
    expected = REFERENCE.get(p["n"])
    return None if expected is None else value == expected


def warm_up() -> float:
    """Compile (or load) the kernels, for writable and read-only arrays (loot may be read-only)."""
    start = time.perf_counter()
    tasks = prefixes(6, 2)
    _solve(6, tasks)
    tasks.flags.writeable = False
    _solve(6, tasks)
    return time.perf_counter() - start


APP = App(
    name="nqueens",
    add_arguments=add_arguments,
    params=params,
    make_bag=make_bag,
    make_static_bag=make_static_bag,
    make_result=make_result,
    sequential=sequential,
    value=lambda r: r.solutions,
    units=lambda r: r.solutions,
    check=check,
    warm_up=warm_up,
    unit_name="solutions",
    default_n=64,  # prefixes per process call: about 3 ms at N=16, t=5
)


# -- the C reference ---------------------------------------------------------------------------------

def c_reference_seconds(n: int) -> tuple[int, float] | None:
    """Compile ``nqueens_c.c`` with ``cc -O2`` and time it on board size ``n``.

    Returns (solutions, seconds), or None without a working C compiler.
    """
    cc = shutil.which("cc")
    if cc is None:
        log.warning("no C compiler (cc) found: no C reference")
        return None
    source = Path(__file__).with_name("nqueens_c.c")
    with tempfile.TemporaryDirectory(prefix="nqueens_c") as tmp:
        exe = Path(tmp) / "nqueens_c"
        built = subprocess.run([cc, "-O2", "-o", str(exe), str(source)], capture_output=True, text=True)
        if built.returncode != 0:
            log.warning("cc -O2 %s failed: %s", source, built.stderr.strip())
            return None
        start = time.perf_counter()
        out = subprocess.run([str(exe), str(n)], capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
    return int(out.stdout.split()[0]), seconds


def compare(n: int) -> dict[str, float]:
    """Numba sequential vs C on board size ``n``: counts, seconds and their ratio."""
    warm_up()
    start = time.perf_counter()
    numba_count = sequential({"n": n, "threshold": 0}).solutions
    numba_s = time.perf_counter() - start
    ref = c_reference_seconds(n)
    row = {"n": n, "numba_solutions": numba_count, "numba_s": numba_s}
    if ref is not None:
        row.update(c_solutions=ref[0], c_s=ref[1], ratio=numba_s / ref[1])
    return row


def _compare_main(argv: list[str] | None = None) -> None:
    """``python -m glb.apps.nqueens [N ...]``: the numba kernel against the C reference."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m glb.apps.nqueens",
                                     description="Time the numba N-Queens kernel against the C "
                                                 "reference (needs a C compiler) on boards of N.")
    parser.add_argument("sizes", nargs="*", type=int, default=[14, 16], metavar="N")
    for size in parser.parse_args(argv).sizes:
        print(compare(size))


if __name__ == "__main__":
    _compare_main()
