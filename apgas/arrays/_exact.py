"""Exact sums whose value does not depend on the layout (``apgas.arrays.exact_sum``).

A float sum added in another order rounds differently, so a sum of partial
sums, one per block, changes in its last bits with the number of places. Here
nothing is rounded before the end: every finite float64 is ``m * 2**(s - 1126)``
with ``m`` an integer of 53 bits and ``0 <= s <= 2097``, so a place sums its
numbers exactly as one Python integer per column (numpy adds the mantissas of
equal ``s`` in int64, split in two halves that cannot overflow; Python shifts
and adds the few group sums). Place 0 adds the places' integers, exact in any
order, and rounds once (``int / int`` is correctly rounded in CPython), which is
also what ``math.fsum`` returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from . import _blocks

__all__ = ["column_sums", "rounded", "at_place"]

Array = npt.NDArray[Any]
Part = int | float  # an exact column sum: an int (times 2**-_SCALE, or plain for ints), or a non-finite float

_SCALE = 1126  # a finite float64 is an integer times 2**-1126: 53 bits of mantissa below 2**-1074
_SHIFTS = 2098  # s = exponent + 1073 lies in 0..2097
_HALF = 26  # mantissas split in 27 (signed) + 26 bits: group sums of 2**36 rows fit int64


def column_sums(x: Array) -> list[Part]:
    """The exact sum of each column of the 2-d ``x`` (ints, bools or floats)."""
    if x.dtype.kind in "biu":
        return _int_column_sums(x)
    if x.dtype.kind != "f":
        raise TypeError(f"exact_sum adds real numbers, not {x.dtype}")
    x = x.astype(np.float64, copy=False)  # float16/32 convert exactly
    sums: list[Part] = [0] * x.shape[1]
    finite = np.isfinite(x)
    if not finite.all():
        for c in np.flatnonzero(~finite.all(axis=0)).tolist():
            with np.errstate(invalid="ignore"):  # inf - inf is nan, as in any order
                sums[c] = float(x[~finite[:, c], c].sum())
        x = np.where(finite, x, 0.0)
    m, e = np.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1
    mant = (m * 2.0**53).astype(np.int64).ravel()
    key = (np.arange(x.shape[1]) * _SHIFTS + (e + 1073)).ravel()
    keep = mant != 0
    mant, key = mant[keep], key[keep]
    order = np.argsort(key, kind="stable")
    key, mant = key[order], mant[order]
    if not len(key):
        return sums
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    high = np.add.reduceat(mant >> _HALF, starts)
    low = np.add.reduceat(mant & ((1 << _HALF) - 1), starts)
    for k, h, lo in zip(key[starts].tolist(), high.tolist(), low.tolist(), strict=True):
        c, s = divmod(k, _SHIFTS)
        if isinstance(sums[c], int):
            sums[c] += ((h << _HALF) + lo) << s
    return sums


def _int_column_sums(x: Array) -> list[Part]:
    """Exact column sums of integers: halves of 32 bits summed apart (no overflow below 2**31 rows)."""
    wide = x.astype(np.uint64 if x.dtype.kind == "u" else np.int64, copy=False)
    high = (wide >> 32).sum(axis=0, dtype=wide.dtype).tolist()
    low = (wide & 0xFFFFFFFF).sum(axis=0, dtype=np.uint64).tolist()
    return [(int(h) << 32) + int(lo) for h, lo in zip(high, low, strict=True)]


def rounded(parts: list[list[Part]], floats: bool) -> list[Any]:
    """Per column, the places' exact sums added and rounded once (floats), or the int."""
    out: list[Any] = []
    for column in zip(*parts, strict=True):
        special = [p for p in column if isinstance(p, float)]
        exact = sum(p for p in column if isinstance(p, int))
        if special:
            with np.errstate(invalid="ignore"):
                out.append(float(np.sum(special)))
        else:
            out.append(exact / (1 << _SCALE) if floats else exact)
    return out


def at_place(aid: _blocks.ArrayId, flat: bool) -> list[Part]:
    """At an owner: the exact column sums of its block (``flat``: of all its elements)."""
    block = _blocks.whole(aid)
    x = block.reshape(-1, 1) if flat else block.reshape(len(block), -1)
    return column_sums(x)
