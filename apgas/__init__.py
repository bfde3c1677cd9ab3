"""APGAS for Python: places, tasks and finish over ZeroMQ.

>>> import apgas
>>> def main():
...     with apgas.finish():
...         for p in apgas.places():
...             apgas.async_at(p, print, "hello from", p)
>>> apgas.run(main, places=4)      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._core.place import Place
from ._core.refs import GlobalRef, PlaceLocal
from ._core.runtime import IMMEDIATE, TASK, UNCOUNTED, Finish, current
from ._malleability.orders import current as _current_orders
from ._malleability.steps import Step, steps
from ._run import run
from ._session import Session, init, shutdown
from .errors import ApgasError, ConfigError, DeadPlaceError, MultipleException, NotRunningError, RemoteError
from .evolving import GrowRefused, GrowRequest
from .malleable import MalleableCommunicator, MalleableHandler

__all__ = [
    "run", "init", "shutdown", "Session", "Place", "here", "places", "place", "finish",
    "async_", "async_at", "uncounted_async_at", "immediate_async_at", "at",
    "GlobalRef", "PlaceLocal",
    "MalleableHandler", "define_malleable_handler", "disable_malleable_handler",
    "request_grow", "release_places", "check_status", "GrowRequest", "GrowRefused",
    "steps", "Step",
    "ApgasError", "ConfigError", "DeadPlaceError", "MultipleException", "NotRunningError", "RemoteError",
]

T = TypeVar("T")


def here() -> Place:
    """The place this code runs at."""
    return current().here


def places() -> list[Place]:
    """The live places, sorted by id (ids may have gaps)."""
    return current().sorted_places()


def place(place_id: int) -> Place:
    """The live place with this id; ``DeadPlaceError`` if there is none."""
    return current().place(place_id)


def finish() -> Finish:
    """``with finish():`` waits for every task spawned in the body, transitively, on any place."""
    return Finish()


def async_(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Spawn a counted task here."""
    rt = current()
    rt.spawn(rt.id, fn, args, kwargs, TASK)


def async_at(place: Place | int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Spawn a counted task at ``place``; the enclosing ``finish`` waits for it."""
    current().spawn(place, fn, args, kwargs, TASK)


def uncounted_async_at(place: Place | int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Fire and forget a task at ``place``; no finish waits for it, failures are logged."""
    current().spawn(place, fn, args, kwargs, UNCOUNTED)


def immediate_async_at(place: Place | int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run a short, non-blocking, uncounted task on ``place``'s immediate pool."""
    current().spawn(place, fn, args, kwargs, IMMEDIATE)


def at(place: Place | int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` at ``place`` (and every task it spawns), wait, return its value or raise."""
    return current().at(place, fn, args, kwargs)


def define_malleable_handler(handler: MalleableHandler) -> MalleableCommunicator:
    """Make the program malleable (place 0, once): orders from now on go to ``handler``.

    Starts the communicator (``APGAS_COMMUNICATOR``, default ``socket``), which tells
    the scheduler the job is ready; returns it (``.address`` is where it listens for
    orders, None for a communicator that listens on no socket).
    """
    return _current_orders("apgas.define_malleable_handler").define(handler)


def disable_malleable_handler() -> None:
    """Make the program rigid again, for good; waits for an order in progress."""
    _current_orders("apgas.disable_malleable_handler").disable()


def request_grow(n: int) -> GrowRequest:
    """Ask the scheduler for ``n`` more places (place 0, evolving job); returns at once.

    The places come later with ordinary grow orders, through the handler; the
    returned :class:`GrowRequest` tells when they are all there or why not."""
    return _current_orders("apgas.request_grow").request_grow(n)


def release_places(places: list[Place] | list[int]) -> list[str]:
    """Give ``places`` back to the scheduler (place 0, evolving job).

    They are drained and stopped as for a shrink order: the handler's
    ``pre_shrink(n, chosen)`` moves their work away, then ``post_shrink``
    runs. Returns their hosts, which go back to the scheduler's pool."""
    return _current_orders("apgas.release_places").release(places)


def check_status(min: int, max: int, preferred: int | None = None, factor: int = 1) -> int:
    """Ask the scheduler what to do now, DMR-style, and do it; return the place count.

    The scheduler answers expand, shrink (within ``min``..``max``, towards
    ``preferred``, by powers of ``factor`` when it is above 1) or nothing;
    the resize runs through the handler before this returns. A call within
    ``APGAS_CHECK_INHIBIT`` seconds of the last one that asked is a no-op."""
    return _current_orders("apgas.check_status").check_status(min, max, preferred, factor)
