"""``apgas.run``: start the places, run ``main`` at place 0, stop every place."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn, TypeVar

from . import _session
from ._core import runtime as _runtime
from ._core.runtime import Finish
from .errors import ApgasError

__all__ = ["run"]

T = TypeVar("T")


def run(main: Callable[[], T], *, places: int | None = None, threads: int | None = None,
        **config: Any) -> T:
    """Start the runtime, run ``main`` at place 0, shut every place down, return ``main``'s value.

    Tasks that ``main`` spawns without an enclosing ``finish`` are waited for
    before ``run`` returns. Called again while a runtime runs (a script under
    ``python -m apgas``), it just calls ``main`` on the running places.

    Places go to the host slots in order, cycled when there are more places
    than slots; place 0 takes the first. When a scheduler handed the job its
    hosts (``APGAS_HOSTS``, ``APGAS_HOSTFILE``, a Slurm allocation) and
    ``places`` (or ``APGAS_PLACES``) asks for another number, ``run`` logs a
    warning that names the number, the hosts, which of them get more places
    than slots or none, and what to do; then it starts the places asked for.
    A warning, not an error: the program computes the same either way, only
    slower or with idle nodes, and sharing nodes on purpose is legitimate
    (several places per node, or ``salloc`` running place 0 outside the
    allocation). Giving ``hosts=`` or ``hostfile=`` to ``run`` is such a choice
    and is not warned about.
    """
    active = _runtime._runtime
    if active is not None:
        if active.id != 0:
            raise ApgasError(f"apgas.run() called at place {active.id}; only place 0 runs main")
        with Finish(solo=True):
            return main()
    session = _session.start(places, threads, config)
    try:
        with _terminate_as_exit(), Finish(solo=True):
            return main()
    finally:
        session.close()


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM at place 0 unwinds like Ctrl-C, so every place is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: FrameType | None) -> NoReturn:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
