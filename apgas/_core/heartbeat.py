"""Heartbeats: a place that stops answering is taken for dead, like one that exited.

A place on a host that vanished from the network, or whose process is
stopped or hung in the kernel, sends no end of file: TCP would keep its
connection for hours and a ``finish`` waiting on it would hang. So every
link (the DEALER towards a place) carries ZeroMQ's own heartbeats (ZMTP
PING and PONG, ``ZMQ_HEARTBEAT_IVL``/``_TIMEOUT``/``_TTL``): every
``interval`` seconds a ping goes out, and when nothing at all comes back
within ``timeout`` seconds libzmq drops the connection. A socket monitor
reports the drop, and :class:`LinkWatcher` calls back with the place's id.

Why a busy place is not declared dead: pings are answered by libzmq's I/O
thread, in C, which never takes Python's GIL. A place deep in a long numba
call or any C code that holds the GIL answers like an idle one; only a
place whose process does not run (stopped, hung in the kernel, gone with
its host) or cannot be reached falls silent. The default timeout (10 s)
leaves room for a host so overloaded that the I/O thread waits seconds for
a core. ``APGAS_HEARTBEAT=<interval>:<timeout>`` (seconds) changes it, ``0``
turns it off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import ConfigError

__all__ = ["LinkWatcher", "parse_heartbeat", "configure"]

log = logging.getLogger(__name__)

# how often the watcher looks for links added or forgotten (a drop wakes it at once):
# at 100 ms, 256 idle places took 0.3 of a core. A watcher that slept until a
# monitor reported (one poll over a wake-up pipe and every monitor) lost work in
# the resilient GLB tests (2 to 4 in 30 runs of three places killed together): back
# to a bounded poll until that is understood
_POLL_MS = 500


def parse_heartbeat(spec: str) -> tuple[float, float] | None:
    """``interval:timeout`` in seconds (``interval`` alone: timeout 10 times it);
    None for ``0`` or ``off``. ConfigError names a bad value."""
    text = str(spec).strip().lower()
    if text in ("0", "off", "none", ""):
        return None
    parts = text.split(":")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or not all(0 < v < 6500 for v in values):
        raise ConfigError(f"APGAS_HEARTBEAT must be '<interval>:<timeout>' in seconds (each "
                          f"above 0 and below 6500), or 0 to turn heartbeats off; got {spec!r}")
    interval, timeout = values if len(values) == 2 else (values[0], values[0] * 10)
    return interval, timeout


def configure(sock: zmq.Socket[bytes], heartbeat: tuple[float, float]) -> None:
    """Make ``sock`` (before it connects) ping every interval and drop its connection
    after ``timeout`` s of silence; the peer drops it after as long without traffic."""
    interval, timeout = heartbeat
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(interval * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, round(timeout * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, round(timeout * 1000)))


class LinkWatcher:
    """Watches links for dropped connections; ``on_lost(place_id)`` runs on its thread."""

    def __init__(self, on_lost: Callable[[int], None], name: str) -> None:
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._monitors: dict[zmq.Socket[bytes], int] = {}  # monitor socket -> place
        self._closing: list[zmq.Socket[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, place_id: int, sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """Watch ``sock`` (call from the thread that made it, before it is shared);
        returns the monitor socket to :meth:`forget` later."""
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        with self._lock:  # hands the monitor over to the watching thread
            self._monitors[monitor] = place_id
        return monitor

    def forget(self, monitor: zmq.Socket[bytes]) -> None:
        """Stop watching; the watching thread closes the monitor."""
        with self._lock:
            if self._monitors.pop(monitor, None) is not None:
                self._closing.append(monitor)

    def stop(self) -> None:
        """Stop the thread and close every monitor (before the context ends)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)
        with self._lock:
            monitors = list(self._monitors) + self._closing
            self._monitors.clear()
            self._closing.clear()
        for monitor in monitors:
            monitor.close(linger=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                closing, self._closing = self._closing, []
                watched = dict(self._monitors)
            for monitor in closing:
                monitor.close(linger=0)
            if not watched:
                self._stop.wait(_POLL_MS / 1000)
                continue
            poller = zmq.Poller()
            for monitor in watched:
                poller.register(monitor, zmq.POLLIN)
            try:
                ready = poller.poll(_POLL_MS)
            except zmq.ZMQError:
                continue  # a monitor closed meanwhile
            for monitor, _ in ready:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                with self._lock:
                    still = self._monitors.get(monitor)
                if event["event"] == zmq.EVENT_DISCONNECTED and still is not None:
                    try:
                        self._on_lost(still)
                    except Exception:
                        log.exception("handling the loss of the link to place %d failed", still)
