"""Lifeline graphs over the positions of the live places (ids may have gaps)."""

from __future__ import annotations

__all__ = ["lifelines"]


def lifelines(strategy: str, members: list[int], me: int) -> list[int]:
    """The places ``me`` asks for work when it has none (never itself)."""
    if me not in members or len(members) < 2:
        return []
    count = len(members)
    pos = members.index(me)
    if strategy == "binary":
        near = [(pos - 1) // 2, 2 * pos + 1, 2 * pos + 2] if pos else [1, 2]
    else:
        near = _hypercube(pos, count)
    seen: list[int] = []
    for p in near:
        if 0 <= p < count and p != pos and members[p] not in seen:
            seen.append(members[p])
    return seen


def _hypercube(pos: int, count: int) -> list[int]:
    """Base 2, dimension ceil(log2 count): flip each bit of the position; a
    neighbour beyond the last place wraps to the position modulo ``count``."""
    dimension = max(1, (count - 1).bit_length())
    return [(pos ^ (1 << d)) % count for d in range(dimension)]
