"""The one accept loop of every line server (the job's order port, the scheduler's
port, the test scheduler): it never stops serving on its own.

:func:`serve_connections` returns only when the listening socket is closed (or
shut down) or ``stopped()`` says so. Everything else is survived: when accept
fails for want of resources (EMFILE with every descriptor taken, ENFILE,
ENOBUFS, ENOMEM) the loop logs (rate-limited), backs off (10 ms doubling to
1 s) and tries again, so it serves again once the descriptors are back; a
connection aborted before it was accepted is skipped. At most
``max_connections`` connections are served at once; one over the cap is
accepted and closed at once (and logged, rate-limited), so idle connections
cannot take every descriptor or thread. Each connection is served in a thread
of its own, by ``handle(conn, deadline)``: ``deadline`` is the
:func:`time.monotonic` time by which its request must have arrived, ``deadline``
seconds after it was accepted, in all (not per receive: a client sending one
byte now and then is cut there). :func:`read_line` reads the request line
within it and within a size bound.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Callable

__all__ = ["serve_connections", "read_line", "discard_rest", "LineTooLong"]

log = logging.getLogger("apgas.serving")

BACKOFF_FIRST = 0.01  # s after the first failed accept; doubled after each further one
BACKOFF_MAX = 1.0
LOG_INTERVAL = 10.0  # s: a repeated complaint is logged at most this often

_CLOSED = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK}  # the listening socket is gone or shut down
_SKIP = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN}  # one connection's trouble


class LineTooLong(ValueError):
    """A request line longer than the bound; the message gives the bound."""


class _RateLimited:
    """Logs a complaint at once, then at most every LOG_INTERVAL s, with the count
    of those it kept quiet about."""

    def __init__(self, level: int = logging.WARNING) -> None:
        self.level = level
        self._last = -LOG_INTERVAL
        self._quiet = 0
        self._lock = threading.Lock()

    def __call__(self, message: str, *args: object, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < LOG_INTERVAL:
                self._quiet += 1
                return
            quiet, self._quiet, self._last = self._quiet, 0, now
        if quiet:
            message += f" ({quiet} more like it in the last {LOG_INTERVAL:g} s not logged)"
        log.log(self.level, message, *args, exc_info=exc_info)


def serve_connections(server: socket.socket, handle: Callable[[socket.socket, float], None], *,
                      name: str, max_connections: int = 256, deadline: float = 10.0,
                      stopped: Callable[[], bool] = lambda: False) -> None:
    """Accept connections on ``server`` in this thread until it is closed or ``stopped()``.

    Each connection is served by ``handle(conn, read_by)`` in a thread of its own:
    ``read_by`` is the ``time.monotonic()`` time, ``deadline`` s after the accept,
    by which the request must have been read (``read_line(conn, max_bytes,
    read_by)``). The connection's timeout is set to ``deadline`` too, so that no
    single send or receive of ``handle`` waits longer; ``handle`` may take
    longer in all when it has work to do (a grow order). The connection is
    closed when ``handle`` returns or raises (an exception is logged). ``name``
    names the server in the log and the threads. To stop: set what
    ``stopped`` reads, then ``server.shutdown(socket.SHUT_RDWR)`` (which wakes a
    blocked accept) and ``server.close()``.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    if not deadline > 0:
        raise ValueError(f"deadline must be a positive number of seconds, got {deadline}")
    busy = 0
    lock = threading.Lock()
    failed_accept = _RateLimited()
    skipped = _RateLimited(logging.DEBUG)
    over_cap = _RateLimited()
    no_thread = _RateLimited()
    crashed = _RateLimited(logging.ERROR)
    backoff = BACKOFF_FIRST

    def serve(conn: socket.socket, read_by: float) -> None:
        nonlocal busy
        try:
            with conn:
                handle(conn, read_by)
        except Exception:
            crashed("%s: serving a connection failed", name, exc_info=True)
        finally:
            with lock:
                busy -= 1

    while not stopped():
        try:
            conn, _ = server.accept()
        except TimeoutError:  # a server with a timeout: time to look at stopped()
            continue
        except OSError as e:
            if stopped() or server.fileno() == -1 or e.errno in _CLOSED:
                return
            if e.errno in _SKIP:
                skipped("%s: a connection was lost before it was accepted: %s", name, e)
                continue
            failed_accept("%s: accepting a connection failed (%s); trying again in %g s and "
                          "serving on", name, e, backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            continue
        backoff = BACKOFF_FIRST
        if stopped():
            conn.close()
            return
        with lock:
            full = busy >= max_connections
            if not full:
                busy += 1
        if full:
            over_cap("%s: %d connections are being served, the most allowed; a new one was "
                     "closed at once", name, max_connections)
            _close(conn)
            continue
        read_by = time.monotonic() + deadline
        try:
            conn.settimeout(deadline)
            threading.Thread(target=serve, args=(conn, read_by), name=f"{name}-conn",
                             daemon=True).start()
        except (RuntimeError, OSError) as e:  # no thread to be had (or the peer is gone)
            with lock:
                busy -= 1
            _close(conn)
            no_thread("%s: cannot serve a connection (%s); closed it", name, e)
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)


def read_line(conn: socket.socket, max_bytes: int, deadline: float, *,
              partial: bool = False) -> bytes | None:
    """One line from ``conn``, without its newline; ``None`` if the peer closes first
    (with ``partial``: what came before the close, if anything, counts as the line).

    ``deadline`` is a :func:`time.monotonic` time: the line must be complete by
    then, however the bytes trickle in (``TimeoutError`` if not). A line of more
    than ``max_bytes`` bytes is :class:`LineTooLong` (:func:`discard_rest` reads
    the rest, so that an error reply is not lost to a reset). What follows the
    newline is dropped: one line per connection. The connection's timeout is
    as it was afterwards (``serve_connections`` set it for sending the reply).
    """
    data = bytearray()
    previous = conn.gettimeout()
    try:
        while True:
            end = data.find(b"\n")
            if end >= 0:
                if end > max_bytes:
                    raise LineTooLong(f"line longer than {max_bytes} bytes")
                return bytes(data[:end])
            if len(data) > max_bytes:
                raise LineTooLong(f"line longer than {max_bytes} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole line within the deadline ({len(data)} bytes came)")
            conn.settimeout(left)
            chunk = conn.recv(min(65536, max_bytes + 2 - len(data)))
            if not chunk:
                return bytes(data) if partial and data else None
            data += chunk
    finally:
        try:
            conn.settimeout(previous)
        except OSError:
            pass


def discard_rest(conn: socket.socket, deadline: float, limit: int = 1 << 20) -> None:
    """Read and drop what the peer still sends, up to a newline, its close, ``limit``
    bytes or ``deadline`` (a monotonic time), whichever comes first; never raises."""
    seen = 0
    try:
        while seen < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            conn.settimeout(left)
            chunk = conn.recv(65536)
            if not chunk or b"\n" in chunk:
                return
            seen += len(chunk)
    except OSError:
        return


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass
