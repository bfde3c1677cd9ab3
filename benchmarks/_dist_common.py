"""What the parts of benchmarks.dist share: sizes, the test pattern of their arrays."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from apgas.arrays import BlockArray

__all__ = ["MiB", "GiB", "COLS", "ROW_BYTES", "CHECK_MAX", "mib", "fill_here", "check",
           "side_by_side"]

MiB = 1 << 20
GiB = 1 << 30
COLS = 1024                          # float64 columns: one row is 8 KiB
ROW_BYTES = COLS * 8
CHECK_MAX = 16 * MiB                 # arrays this small are gathered and compared after each step


def mib(size: int) -> str:
    return f"{size / GiB:g} GiB" if size >= GiB else f"{size / MiB:g} MiB"


def fill_here(a: BlockArray) -> None:
    """Row i of ``a`` (all at this place) holds i."""
    block = a.local()
    block[:] = np.arange(len(block), dtype=block.dtype)[:, None]


def check(a: BlockArray) -> None:
    """RuntimeError unless row i of ``a`` holds i everywhere (made by :func:`fill_here`)."""
    rows = a.shape[0]
    if a.shape[0] * ROW_BYTES <= CHECK_MAX:
        ok = bool(np.array_equal(a.gather(), np.broadcast_to(np.arange(rows, dtype=np.float64)[:, None],
                                                              a.shape)))
    else:
        ok = a.sum() == COLS * rows * (rows - 1) // 2
    if not ok:
        raise RuntimeError(f"{a!r} lost or misplaced rows on the way ({a.layout})")


def side_by_side(target: Callable[..., None], argses: Sequence[tuple[Any, ...]],
                 timeout: float) -> list[float]:
    """Each process's seconds: one spawned process per entry of ``argses``, all let go
    together. ``target(*args, start, out)`` waits on the barrier ``start``, works, and
    sends its seconds on the pipe end ``out``; a process still alive ``timeout``
    seconds after it answered is killed."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(argses))
    pipes = [ctx.Pipe(duplex=False) for _ in argses]
    procs = [ctx.Process(target=target, args=(*args, start, w), daemon=True)
             for args, (_, w) in zip(argses, pipes, strict=True)]
    for p in procs:
        p.start()
    try:
        for _, w in pipes:
            w.close()
        return [float(r.recv()) for r, _ in pipes]
    finally:
        for p in procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join()
