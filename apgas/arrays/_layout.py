"""Layouts: which place holds which rows, as pure functions on tuples.

A layout is a tuple of ``(place id, start, stop)`` in block order; the blocks
are contiguous and cover ``range(rows)`` exactly once. Kept free of the
runtime so that the arithmetic is tested and reasoned about on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["Block", "Layout", "even", "overlaps", "find"]

Block = tuple[int, int, int]  # (place id, start row, stop row)
Layout = tuple[Block, ...]


def even(rows: int, place_ids: Sequence[int]) -> Layout:
    """Contiguous blocks over ``place_ids`` in the given order, sizes differing by at
    most one row: the first ``rows % k`` places get the extra rows."""
    size, extra = divmod(rows, len(place_ids))
    blocks = []
    start = 0
    for i, pid in enumerate(place_ids):
        stop = start + size + (1 if i < extra else 0)
        blocks.append((pid, start, stop))
        start = stop
    return tuple(blocks)


def overlaps(lo: int, hi: int, layout: Layout) -> Iterator[tuple[int, int, int, int, int]]:
    """The non-empty pieces of rows ``[lo, hi)`` by owner: ``(place, first, last, start, stop)``
    with ``[first, last)`` the global rows of the piece and ``[start, stop)`` the owner's block."""
    for pid, start, stop in layout:
        first, last = max(lo, start), min(hi, stop)
        if first < last:
            yield pid, first, last, start, stop


def find(layout: Layout, place_id: int) -> Block | None:
    """The block of ``place_id``, or None if the layout does not use that place."""
    for block in layout:
        if block[0] == place_id:
            return block
    return None
