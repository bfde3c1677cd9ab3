"""What the parts of benchmarks.dist share: sizes, the test pattern of their arrays."""

from __future__ import annotations

import numpy as np

from apgas.dist import BlockArray

__all__ = ["MiB", "GiB", "COLS", "ROW_BYTES", "CHECK_MAX", "mib", "fill_here", "check"]

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
