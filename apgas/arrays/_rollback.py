"""Roll-back of resilient arrays for ``apgas.steps``: commits and restores.

A commit copies every block of an array at its place and sends one more copy
to a *buddy*, the next place holding rows (a block of place 0, which dies
only with the program, has no buddy). A restore puts the rows back as they
were at a commit, evenly over the live places: each block from its place's
own copy, or from its buddy's if its place was lost. The copies themselves
live in :mod:`apgas.arrays._blocks` (``save``, ``push_copy``, ``forget``).
Everything here runs at place 0, while the step loop keeps orders out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import apgas

from . import _blocks
from ._layout import Layout, even

if TYPE_CHECKING:
    from . import BlockArray

__all__ = ["Commit", "commit", "forget", "restore"]


class Commit(NamedTuple):
    """What a commit of one array kept: its tag, the layout then, each owner's buddy."""

    tag: int
    layout: Layout
    buddies: dict[int, int]


def commit(a: BlockArray, tag: int) -> Commit:
    """Copy every block of ``a`` at its place and at its buddy under ``tag``."""
    layout = a.layout
    owners = [pid for pid, start, stop in layout if stop > start]
    buddies = {o: owners[(i + 1) % len(owners)] if len(owners) > 1 else a.home
               for i, o in enumerate(owners) if o != 0}
    buddies = {o: b for o, b in buddies.items() if b != o}
    with apgas.finish():
        for o in owners:
            apgas.async_at(o, _blocks.save, a.id, tag, buddies.get(o))
    return Commit(tag, layout, buddies)


def forget(a: BlockArray, keep: int | None) -> None:
    """Drop the copies of ``a`` of every commit but ``keep``, at the live places."""
    with apgas.finish():
        for p in apgas.places():
            apgas.async_at(p, _blocks.forget, a.id, keep)


def restore(a: BlockArray, kept: Commit) -> None:
    """Put the rows of ``a`` back as they were at ``kept``, evenly over the live places.
    ApgasError naming the rows lost with both their copies. The copies stay (a loss
    during the restore restores again from them)."""
    live = [p.id for p in apgas.places()]
    sources: list[tuple[int, int, int]] = []
    missing: list[str] = []
    for owner, start, stop in kept.layout:
        if stop <= start:
            continue
        buddy = kept.buddies.get(owner)
        source = owner if owner in live else buddy if buddy in live else None
        if source is None:
            missing.append(f"{start}:{stop} (place {owner} and its buddy, place {buddy})")
        else:
            sources.append((source, owner, start))
    if missing:
        raise apgas.ApgasError(f"{a!r} cannot be rolled back: rows " + ", ".join(missing)
                               + " were lost with both their copies; free() the array and "
                                 "make it again")
    new = even(a.shape[0], live)
    with apgas.finish():  # a restore cut short by a loss may have left staging buffers
        for pid in live:
            apgas.async_at(pid, _blocks.unstage, a.id)
    with apgas.finish():
        for source, owner, start in sources:
            apgas.async_at(source, _blocks.push_copy, a.id, kept.tag, owner, start, new)
    with apgas.finish():
        for pid in dict.fromkeys(live + [a.home]):
            apgas.async_at(pid, _blocks.commit, a.id, new, a.home, a.shape[1:], a.dtype)
