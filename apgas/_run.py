"""``apgas.run``: start the places, run ``main`` at place 0, stop every place."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn, TypeVar

import launcher
from launcher import mpi as _mpi

from ._core import runtime as _runtime
from ._core.config import host_mismatch, load_config
from ._core.logs import setup_logging
from ._core.runtime import Finish, Runtime
from ._malleability import orders as _orders
from ._malleability.orders import Orders
from .errors import ApgasError

__all__ = ["run"]

T = TypeVar("T")
log = logging.getLogger("apgas.run")


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
    cfg = load_config({"places": places, "threads": threads, **config})
    under_mpi = cfg.launcher == "mpi"
    if under_mpi and (_mpi.mpi_rank_from_env(os.environ) or (0, 0))[0] != 0:
        # imported here: ``python -m apgas._serve`` must not find it imported by the package
        from ._serve import serve_rank

        serve_rank()  # ranks other than 0 serve as places, then exit
    if under_mpi:
        try:
            _mpi.claim_ranks()
        except OSError as e:
            raise ApgasError(str(e)) from None
    setup_logging(0, cfg.log_level)
    mismatch = host_mismatch(cfg, {"places": places, "threads": threads, **config})
    if mismatch:  # a warning, not an error: see the docstring
        log.warning("%s", mismatch)
    hosts = list(cfg.hosts) or [_runtime.default_host()]
    others = [hosts[i % len(hosts)] for i in range(1, cfg.places)]
    started = time.monotonic_ns()
    first = launcher.get_launcher(cfg.launcher, cfg)
    grower = launcher.get_launcher(cfg.grow_launcher, cfg)
    try:
        if others and not under_mpi:
            first.prepare(cfg.python)  # the local fork server imports while place 0 sets up
        elif cfg.communicator or cfg.scheduler or cfg.malleable_listen:
            grower.prepare(cfg.python)  # grows are expected
        rt = Runtime(0, hosts[0], secrets.token_bytes(32), cfg)
    except BaseException:
        _close(first, grower)
        raise
    orders = Orders(rt, started)
    _runtime.install(rt)
    _orders.install(orders)
    try:
        rt.launcher = grower
        rt.transport.start(rt.pool.lead)  # leader/followers: see apgas._core.pool
        if under_mpi:
            _mpi.start_ranks(rt, cfg.join_timeout)
        elif others:
            rt.start_places(others, first, cfg.join_timeout)
        rt.watch_children()
        log.info("%d place(s) ready in %.3f s", cfg.places, (time.monotonic_ns() - started) / 1e9)
        if cfg.communicator or cfg.scheduler or cfg.malleable_listen:
            orders.listen()  # under a scheduler: refuse orders until a handler comes
        with _terminate_as_exit(), Finish(solo=True):
            return main()
    finally:
        try:
            orders.close()
        finally:
            try:
                rt.shutdown()
            finally:
                _orders.install(None)
                _runtime.install(None)
                _close(first, grower)


def _close(*launchers: launcher.Launcher) -> None:
    """Stop what the launchers keep running (the fork server): no process stays behind."""
    for used in launchers:
        try:
            used.close()
        except Exception:
            log.exception("closing the %s launcher failed", used.name)


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
