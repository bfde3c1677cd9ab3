"""Places that stay up: ``apgas.init`` makes the calling process place 0 and keeps its
places until ``apgas.shutdown`` (or ``atexit``, or the end of ``with apgas.init():``),
as ``ray.init``, Dask's ``Client()`` and ipyparallel's clusters do for a notebook or a
REPL. ``apgas.run`` starts one the same way and stops it when ``main`` returns.

Between the two, the calling thread uses the places as ``main`` would: ``at``,
``finish``, ``apgas.steps``, GLB, arrays, a malleable handler. A Ctrl-C (a notebook's
interrupt) in a ``finish`` or an ``at`` interrupts what runs at every place
(:meth:`apgas._core.runtime.Runtime.interrupt`) and keeps the places.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
from typing import Any

import launcher
from launcher import mpi as _mpi

from ._core import runtime as _runtime
from ._core.config import Config, host_mismatch, load_config
from ._core.logs import setup_logging
from ._core.place import Place
from ._core.runtime import Runtime
from ._malleability import orders as _orders
from ._malleability.orders import Orders
from .errors import ApgasError

__all__ = ["Session", "init", "shutdown", "start"]

log = logging.getLogger("apgas.run")  # the name users filter on, from before sessions

_lock = threading.Lock()
_session: Session | None = None  # the one of apgas.init, until it is shut down


class Session:
    """The running places of this process (place 0): from :func:`apgas.init`, or the
    one :func:`apgas.run` holds while ``main`` runs. ``with`` shuts it down at the end."""

    def __init__(self, rt: Runtime, orders: Orders, first: launcher.Launcher,
                 grower: launcher.Launcher, config: Config) -> None:
        self._rt = rt
        self._orders = orders
        self._launchers = (first, grower)
        self.config = config
        self.started = time.time()
        self._closed = False

    @property
    def places(self) -> list[Place]:
        """The live places, sorted by id (a malleable session grows and shrinks)."""
        return [] if self._closed else self._rt.sorted_places()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        if self._closed:
            return "<apgas.Session: shut down>"
        places = self.places
        hosts: dict[str, list[int]] = {}
        for p in places:
            hosts.setdefault(p.host, []).append(p.id)
        where = ", ".join(f"{host}: {_ids(ids)}" for host, ids in hosts.items())
        return f"<apgas.Session: {len(places)} place(s), {self.config.threads} thread(s) each; {where}>"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown() if self is _session else self.close()

    def close(self) -> None:
        """Stop every place and this runtime (within about 2 s); nothing stays behind."""
        if self._closed:
            return
        self._closed = True
        try:
            self._orders.close()
        finally:
            try:
                self._rt.shutdown()
            finally:
                _orders.install(None)
                _runtime.install(None)
                for used in self._launchers:
                    try:
                        used.close()
                    except Exception:
                        log.exception("closing the %s launcher failed", used.name)


def _ids(ids: list[int]) -> str:
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"places {ids[0]}-{ids[-1]}"
    return ("place " if len(ids) == 1 else "places ") + ", ".join(map(str, ids))


def start(places: int | None, threads: int | None, config: dict[str, Any]) -> Session:
    """Start the places (this process is place 0); under ``mpiexec``, a rank other than 0
    serves as a place and exits here."""
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
    if mismatch:  # a warning, not an error: see apgas.run's docstring
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
        for used in (first, grower):
            used.close()
        raise
    orders = Orders(rt, started)
    _runtime.install(rt)
    _orders.install(orders)
    session = Session(rt, orders, first, grower, cfg)
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
    except BaseException:
        session.close()
        raise
    return session


def init(places: int | None = None, threads: int | None = None, **config: Any) -> Session:
    """Make this process place 0 and start ``places`` places that stay up until
    :func:`shutdown` (also called at exit, and at the end of ``with apgas.init(...):``).

    Takes the options of :func:`apgas.run` (launcher, hosts, ``APGAS_*``). In between,
    ``at``, ``finish``, ``apgas.steps``, GLB and arrays work from the calling thread,
    and ``apgas.run(main)`` runs ``main`` on these places. A Ctrl-C in a ``finish`` or
    an ``at`` interrupts what runs at every place and keeps the places."""
    global _session
    with _lock:
        running = _session
        if running is not None and not running.closed:
            raise ApgasError(f"a session is running already ({running!r}, started "
                             f"{time.time() - running.started:.0f} s ago); stop it with "
                             "apgas.shutdown() first, or use it as it is")
        if _runtime._runtime is not None:
            raise ApgasError("apgas.init() called inside a running program (apgas.run, or a "
                             "place); the places are up already: use them")
        _session = start(places, threads, config)
        _session._rt.keeps_places = True  # a Ctrl-C interrupts the places' work, not them
        atexit.register(shutdown)
        return _session


def shutdown() -> None:
    """Stop the places of :func:`init` (nothing if none run)."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        atexit.unregister(shutdown)
        session.close()
