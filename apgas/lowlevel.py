"""The runtime's low-level face, for libraries built on it (as trio's ``lowlevel``).

Hooks into a running runtime: calls that skip the task queue, finishes spawned
into from any thread, deaths and resizes to watch, the timeline, and the pause
and the files a checkpoint needs. ``glb`` and ``apgas.arrays`` use these instead of
the runtime's private modules; they stay stable where the ``_``-prefixed ones may
change. Programs need only ``import apgas``; servers and daemons find their
utilities in :mod:`apgas.serving`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._core.config import Config, parse_address
from ._core.durable import DamagedFile, read_sealed, write_atomically
from ._core.gate import Gate
from ._core.pool import blocking
from ._core.runtime import current, current_finish
from ._core.transport import _digest as payload_digest
from ._malleability.orders import current as _current_orders
from ._timeline.recorder import MAX_SAMPLES, sample_interval
from ._timeline.recorder import current as current_timeline

__all__ = ["Config", "parse_address", "blocking", "immediate_at", "removable", "watch_deaths",
           "on_resize", "listen_for_orders", "current_finish", "spawn_under",
           # what the place-to-place MAC covers of a bulk payload (to measure its cost)
           "payload_digest",
           # the run timeline (APGAS_TIMELINE): place 0's writer, GLB's load samples
           "current_timeline", "sample_interval", "MAX_SAMPLES",
           # checkpoints: files whole or absent after a crash; a pause for consistent copies
           "write_atomically", "read_sealed", "DamagedFile", "Gate"]


T = TypeVar("T")


def immediate_at(place: int, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` at ``place`` on its immediate pool and return the result.

    Meant for short calls that must not queue behind busy worker tasks (steal
    requests, registrations); ``fn`` must not block."""
    return current().at(place, fn, args, {}, immediate=True)


def watch_deaths(watcher: Callable[[int, str, str], None]) -> Callable[[], None]:
    """Call ``watcher(place_id, host, reason)`` for every place that dies from now on
    (a failure, not a shrink); returns a function that stops it. The watcher runs on a
    runtime thread: it must return quickly and must not call other places."""
    return current().watch_deaths(watcher)


def spawn_under(fref: tuple[int, int], place: int, fn: Callable[..., Any], *args: Any) -> bool:
    """Spawn ``fn(*args)`` at ``place`` as a task of the finish ``fref`` (from
    :func:`current_finish`, opened at this place), from any thread; False if that
    finish has ended, so nothing was spawned. ``DeadPlaceError`` if ``place`` is gone."""
    return current().spawn_under(fref, place, fn, args)


def removable(place: int) -> bool:
    """Whether ``place`` may leave on a shrink (mpiexec ranks and place 0 may not)."""
    return current().removable(place)


def on_resize(listener: Any) -> Callable[[], None]:
    """Tell ``listener`` of every grow and shrink order (and ``apgas.release_places``),
    at place 0, inside the order: ``listener.before_shrink(leaving)`` after the
    handler's ``pre_shrink`` chose the places and before they are removed;
    ``listener.after_grow(added)`` after the places joined and before the handler's
    ``post_grow``; ``listener.place_lost(places)``, if defined, when places are lost
    without an order (while a handler or scheduler listens). A listener that raises
    fails the order. Returns a function that removes the listener. Place 0 only."""
    return _current_orders("apgas.lowlevel.on_resize").add_listener(listener)


def listen_for_orders() -> Any:
    """Start the communicator now, if it has not started (orders are refused until a
    handler comes), and return it: its ``.address`` is the port it bound, where
    ``APGAS_MALLEABLE_LISTEN`` may ask for port 0 (any free port). Place 0 only."""
    return _current_orders("apgas.lowlevel.listen_for_orders").listen()
