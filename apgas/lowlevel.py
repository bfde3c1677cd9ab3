"""The supported low-level face of ``apgas``, for libraries built on the runtime.

``glb`` and the scheduler use these instead of the runtime's private modules;
they stay stable where the ``_``-prefixed modules may change. Programs need
only ``import apgas``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._config import Config, parse_address
from ._durable import DamagedFile, read_sealed, write_atomically
from ._gate import Gate
from ._peers import peer_is_local, peer_key, peer_uid
from ._pool import blocking
from ._runtime import current, current_finish
from ._serving import (
    LOG_TEXT,
    LineTooLong,
    PeerLog,
    connection_peer,
    discard_rest,
    loggable,
    read_head,
    read_line,
    serve_connections,
)
from ._timeline import MAX_SAMPLES, sample_interval
from ._timeline import current as current_timeline
from ._transport import _digest as payload_digest
from ._trusted_paths import (
    UntrustedPath,
    make_trusted_dir,
    open_append,
    open_new_file,
    owner_name,
    trusted_dir,
    trusted_file,
    trusted_location,
)
from ._webview import CONTENT_SECURITY_POLICY, render_page
from .errors import ApgasError

__all__ = ["Config", "blocking", "immediate_at", "parse_address", "removable", "watch_deaths", "on_resize",
           "current_finish", "spawn_under",
           # what the place-to-place MAC covers of a bulk payload (to measure its cost)
           "payload_digest",
           "serve_connections",
           "read_line", "discard_rest", "LineTooLong",
           # fair service: who a peer is, its share of a server, logs it cannot flood
           "peer_uid", "peer_key", "peer_is_local", "read_head", "connection_peer", "PeerLog",
           "loggable", "LOG_TEXT",
           # the run timeline (APGAS_TIMELINE): place 0's writer, GLB's load samples
           "current_timeline", "sample_interval", "MAX_SAMPLES",
           # one self-contained HTML page from a view model (the dashboard, the reports)
           "render_page", "CONTENT_SECURITY_POLICY",
           # files and directories a daemon may trust (nobody else can change them)
           "UntrustedPath", "trusted_dir", "trusted_file", "trusted_location", "make_trusted_dir",
           "open_new_file", "open_append", "owner_name",
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
    orders = current().orders
    if orders is None:
        raise ApgasError("on_resize: orders are carried out at place 0; call it there")
    return orders.add_listener(listener)
