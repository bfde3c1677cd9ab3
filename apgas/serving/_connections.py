"""The one accept loop of every line server (the job's order port, the scheduler's
port and socket, its dashboard, the test scheduler): it never stops serving on
its own, and no client can take it from the others.

:func:`serve_connections` returns only when the listening socket is closed (or
shut down) or ``stopped()`` says so. Everything else is survived: when accept
fails for want of resources (EMFILE with every descriptor taken, ENFILE,
ENOBUFS, ENOMEM) the loop logs (rate-limited), backs off (10 ms doubling to
1 s) and tries again; a connection aborted before it was accepted is skipped.

Slots are shared fairly among peers (a user of this machine, :mod:`._peers`,
else a remote address), because idle connections cost an attacker nothing. A
connection is *pending* from its accept until its request has been read
(:func:`read_line`, :func:`read_head`), and must be read within ``deadline``
seconds in all, however slowly its bytes trickle. At most ``max_connections``
are in flight: when a new one comes and all are taken, the oldest pending
connection of the peer with the most pending ones (the newcomer counted) is
evicted: shut down, so that its reader ends with ``ConnectionAbortedError``.
A peer never holds more than ``per_peer`` (a quarter of the slots): its own
oldest pending one makes room for its newcomer. So a flood evicts only the
flooder's connections, and a client with fewer pending connections than
another is never the one evicted. Only when every slot is being handled is a
newcomer closed at once. Evictions and refusals are logged rate-limited per
peer (:class:`PeerLog`), and client text in logs goes through
:func:`loggable`, so that a flood cannot fill the disk either.

Fairness acts on accepted connections only: the kernel's queue of those not
yet accepted is first come, first served, and a client finding it full is
refused (a Unix socket) or must resend its SYN a second later (TCP). So the
loop deepens it to :data:`BACKLOG` (the kernel caps it at ``somaxconn``):
deeper than one user's flood, whose queued connections it then drains,
evicting as it goes.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from ._complaints import PeerLog, RateLimited
from ._peers import peer_key

__all__ = ["serve_connections", "read_line", "read_head", "discard_rest", "LineTooLong",
           "connection_peer"]

log = logging.getLogger("apgas.serving")

BACKOFF_FIRST = 0.01  # s after the first failed accept; doubled after each further one
BACKOFF_MAX = 1.0
BACKLOG = 4096  # connections the kernel queues for accept (Linux's default somaxconn)
DRAIN = 1.0  # s the loop waits, when it ends, for requests being handled to be answered

_CLOSED = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK}  # the listening socket is gone or shut down
_SKIP = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN}  # one connection's trouble
_PENDING, _READ, _EVICTED = "pending", "read", "evicted"


class LineTooLong(ValueError):
    """A request line (or head) longer than the bound; the message gives the bound."""


class _Connection(socket.socket):
    """An accepted connection whose close is ordered with evictions (under ``_lock``),
    so that an eviction never shuts down a descriptor number reused since."""

    def close(self) -> None:
        with _lock:
            super().close()


class _Slot:
    """A connection in flight: its peer, its state, the loop whose slot it takes."""

    __slots__ = ("peer", "state", "loop")

    def __init__(self, peer: str, loop: _Loop) -> None:
        self.peer, self.state, self.loop = peer, _PENDING, loop


_lock = threading.Lock()  # the slots of every loop, and closing their connections
_slots: dict[socket.socket, _Slot] = {}


class _Admission(NamedTuple):
    """What :meth:`_Loop.admit` did with a newcomer."""

    taken: bool
    evicted: socket.socket | None
    evictee: str  # the evicted one's peer
    capped: bool  # the newcomer's peer holds its share: it made room (or was refused)


class _Loop:
    """The slots of one listening socket: who holds how many, who waits to be read
    (per peer, oldest first). Used under ``_lock`` only."""

    def __init__(self, max_connections: int, per_peer: int) -> None:
        self.max, self.per_peer = max_connections, per_peer
        self.in_flight = 0
        self.held: dict[str, int] = {}
        self.pending: dict[str, dict[socket.socket, int]] = {}
        self.accepted = 0

    def admit(self, conn: socket.socket, peer: str) -> _Admission:
        """Take ``conn`` from ``peer`` in, evicting a pending connection to make room
        if need be (shut it down under ``_lock``, with the answer)."""
        victim: socket.socket | None = None
        capped = self.held.get(peer, 0) >= self.per_peer
        if capped:
            victim = next(iter(self.pending.get(peer, ())), None)
        elif self.in_flight >= self.max:
            victim = self._most_pending(peer)
        if victim is None and (capped or self.in_flight >= self.max):
            return _Admission(False, None, "", capped)
        evictee = ""
        if victim is not None:
            slot = _slots[victim]
            self._forget(victim, slot)
            slot.state, evictee = _EVICTED, slot.peer
        self.accepted += 1
        _slots[conn] = _Slot(peer, self)
        self.pending.setdefault(peer, {})[conn] = self.accepted
        self.held[peer] = self.held.get(peer, 0) + 1
        self.in_flight += 1
        return _Admission(True, victim, evictee, capped)

    def _most_pending(self, newcomer: str) -> socket.socket | None:
        """The oldest pending connection of the peer with the most pending ones, the
        newcomer's counted (ties: the oldest connection goes); None if that is the
        newcomer itself, or nothing is pending."""
        own = self.pending.get(newcomer, {})
        best: tuple[int, int] = (len(own) + 1, -(next(iter(own.values()), self.accepted + 1)))
        chosen = next(iter(own), None)
        for peer, conns in self.pending.items():
            if peer != newcomer and conns:
                conn, order = next(iter(conns.items()))
                if (len(conns), -order) > best:
                    best, chosen = (len(conns), -order), conn
        return chosen

    def mark_read(self, conn: socket.socket, slot: _Slot) -> None:
        if slot.state == _PENDING:
            self._unpend(conn, slot)
            slot.state = _READ

    def release(self, conn: socket.socket, slot: _Slot) -> None:
        if slot.state != _EVICTED:
            self._forget(conn, slot)

    def _forget(self, conn: socket.socket, slot: _Slot) -> None:
        if slot.state == _PENDING:
            self._unpend(conn, slot)
        self.in_flight -= 1
        left = self.held[slot.peer] - 1
        if left:
            self.held[slot.peer] = left
        else:
            del self.held[slot.peer]

    def _unpend(self, conn: socket.socket, slot: _Slot) -> None:
        conns = self.pending[slot.peer]
        del conns[conn]
        if not conns:
            del self.pending[slot.peer]


def connection_peer(conn: socket.socket) -> str | None:
    """The peer key (``"uid N"``, ``"ip ADDRESS"``) of a connection being served by
    :func:`serve_connections`; None for any other socket."""
    slot = _slots.get(conn)
    return slot.peer if slot is not None else None


def _claim(conn: socket.socket) -> None:
    """Mark ``conn``'s request read, unless it was evicted first (ConnectionAbortedError):
    decided under the lock, so exactly one of the two wins."""
    with _lock:
        slot = _slots.get(conn)
        if slot is None:
            return
        if slot.state == _EVICTED:
            raise ConnectionAbortedError("evicted: the server needed the slot for another client")
        slot.loop.mark_read(conn, slot)


def _evicted(conn: socket.socket) -> bool:
    slot = _slots.get(conn)
    return slot is not None and slot.state == _EVICTED


def serve_connections(server: socket.socket, handle: Callable[[socket.socket, float], None], *,
                      name: str, max_connections: int = 256, deadline: float = 10.0,
                      stopped: Callable[[], bool] = lambda: False, per_peer: int | None = None,
                      peer: Callable[[socket.socket], str] = peer_key,
                      backlog: int = BACKLOG, drain: float = DRAIN) -> None:
    """Accept connections on ``server`` in this thread until it is closed or ``stopped()``.

    Each connection is served by ``handle(conn, read_by)`` in a thread of its own:
    ``read_by`` is the ``time.monotonic()`` time, ``deadline`` s after the accept,
    by which the request must have been read (``read_line(conn, max_bytes,
    read_by)`` or :func:`read_head`). The connection's timeout is set to
    ``deadline`` too, so that no single send or receive of ``handle`` waits
    longer; ``handle`` may take longer in all when it has work to do (a grow
    order). The connection is closed when ``handle`` returns or raises (an
    exception is logged). ``peer(conn)`` names the client whose share of the
    slots the connection takes (default :func:`apgas.serving._peers.peer_key`);
    ``per_peer`` (default a quarter of ``max_connections``) is that share. See
    the module's doc for who is evicted when; ``server``'s queue of connections
    not yet accepted is made ``backlog`` deep. ``name`` names the server in the
    log and the threads. To stop: set what ``stopped`` reads, then
    ``server.shutdown(socket.SHUT_RDWR)`` (which wakes a blocked accept) and
    ``server.close()``. Before returning, the loop waits up to ``drain`` s for the
    connections being handled, so that a request that stopped the server (a
    ``shutdown``) still gets its answer before the process may exit.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    if not deadline > 0:
        raise ValueError(f"deadline must be a positive number of seconds, got {deadline}")
    share = max(1, max_connections // 4) if per_peer is None else per_peer
    if not 1 <= share <= max_connections:
        raise ValueError(f"per_peer must be in 1..{max_connections}, got {per_peer}")
    slots = _Loop(max_connections, share)
    try:
        server.listen(backlog)  # on a listening socket: only the depth of its queue changes
    except OSError:
        pass  # closed already: the loop below returns at once
    failed_accept = RateLimited(log)
    skipped = RateLimited(log, logging.DEBUG)
    evicted, refused = PeerLog(log), PeerLog(log)
    no_thread = RateLimited(log)
    crashed = RateLimited(log, logging.ERROR)
    backoff = BACKOFF_FIRST
    handlers: set[threading.Thread] = set()  # under _lock

    def serve(conn: socket.socket, read_by: float) -> None:
        try:
            handle(conn, read_by)
        except Exception:
            crashed("%s: serving a connection failed", name, exc_info=True)
        finally:
            with _lock:
                slot = _slots.pop(conn, None)
                if slot is not None:
                    slots.release(conn, slot)
                handlers.discard(threading.current_thread())
            conn.close()  # after the release: a client that saw its end finds the slot free

    try:
        while not stopped():
            try:
                accepted, _ = server.accept()
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
            conn = _Connection(accepted.family, accepted.type, accepted.proto, fileno=accepted.detach())
            if stopped():
                conn.close()
                return
            try:
                who = peer(conn)
            except Exception:
                crashed("%s: cannot tell who a connection is from", name, exc_info=True)
                who = "unknown"
            with _lock:
                admitted = slots.admit(conn, who)
                if admitted.evicted is not None:
                    try:
                        admitted.evicted.shutdown(socket.SHUT_RDWR)  # its reader wakes and gives up
                    except OSError:
                        pass  # closed already
            if admitted.evicted is not None:
                evicted(admitted.evictee, "%s: %s", name,
                            f"{who} holds {_count(share)}, the most one client may; its oldest "
                            "unread one was closed for a new one" if admitted.capped else
                            f"all {max_connections} connections are taken; the oldest unread one of "
                            f"{admitted.evictee}, who has the most unread, was closed for one of {who}")
            if not admitted.taken:
                refused(who, "%s: %s", name,
                            f"{who} holds {_count(share)}, the most one client may, all being "
                            "served; a new one was closed at once" if admitted.capped else
                            f"all {max_connections} connections are being served; a new one of "
                            f"{who} was closed at once")
                conn.close()
                continue
            read_by = time.monotonic() + deadline
            handler = threading.Thread(target=serve, args=(conn, read_by), name=f"{name}-conn",
                                       daemon=True)
            try:
                conn.settimeout(deadline)
                with _lock:
                    handlers.add(handler)
                handler.start()
            except (RuntimeError, OSError) as e:  # no thread to be had (or the peer is gone)
                with _lock:
                    handlers.discard(handler)
                    slot = _slots.pop(conn, None)
                    if slot is not None:
                        slots.release(conn, slot)
                conn.close()
                no_thread("%s: cannot serve a connection (%s); closed it", name, e)
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
    finally:
        _drain(handlers, drain)

def _drain(handlers: set[threading.Thread], within: float) -> None:
    """Wait up to ``within`` s in all for ``handlers`` to end."""
    until = time.monotonic() + within
    with _lock:
        waiting = list(handlers)
    for handler in waiting:
        handler.join(max(0.0, until - time.monotonic()))


def _count(n: int) -> str:
    return f"{n} connection{'' if n == 1 else 's'}"


def read_line(conn: socket.socket, max_bytes: int, deadline: float, *,
              partial: bool = False) -> bytes | None:
    """One line from ``conn``, without its newline; ``None`` if the peer closes first
    (with ``partial``: what came before the close, if anything, counts as the line).

    ``deadline`` is a :func:`time.monotonic` time: the line must be complete by
    then, however the bytes trickle in (``TimeoutError`` if not). A line of more
    than ``max_bytes`` bytes is :class:`LineTooLong` (:func:`discard_rest` reads
    the rest, so that an error reply is not lost to a reset). What follows the
    newline is dropped: one line per connection. A connection evicted by
    :func:`serve_connections` before its line was whole raises
    ``ConnectionAbortedError`` (never a partial line). The connection's timeout
    is as it was afterwards (``serve_connections`` set it for sending the reply).
    """
    def complete(data: bytearray) -> int | None:
        end = data.find(b"\n")
        if end > max_bytes or (end < 0 and len(data) > max_bytes):
            raise LineTooLong(f"line longer than {max_bytes} bytes")
        return end if end >= 0 else None

    data = _read_until(conn, complete, max_bytes + 2, deadline, "line")
    if data is None:
        return None
    end = data.find(b"\n")
    if end < 0 and not partial:
        return None
    _claim(conn)
    return bytes(data[:end] if end >= 0 else data)


def read_head(conn: socket.socket, max_bytes: int, deadline: float) -> bytes | None:
    """An HTTP request head from ``conn``: its request line and header lines through
    the blank line that ends them (which it includes); ``None`` if the peer closes
    first. Like :func:`read_line`: all of it by ``deadline`` (``TimeoutError``),
    at most ``max_bytes`` (:class:`LineTooLong`), ``ConnectionAbortedError`` if
    evicted; what follows the head (a body) is dropped."""
    def complete(data: bytearray) -> int | None:
        ends = [at + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (at := data.find(mark)) >= 0]
        end = min(ends) if ends else None
        if (end if end is not None else len(data)) > max_bytes:
            raise LineTooLong(f"request head longer than {max_bytes} bytes")
        return end

    data = _read_until(conn, complete, max_bytes + 4, deadline, "request head")
    if data is None or complete(data) is None:
        return None
    _claim(conn)
    return bytes(data[:complete(data)])


def _read_until(conn: socket.socket, complete: Callable[[bytearray], int | None], most: int,
                deadline: float, what: str) -> bytearray | None:
    """Bytes from ``conn`` until ``complete`` finds the end in them (or raises), the
    peer closes (what came, or None if nothing), ``deadline`` passes (TimeoutError)
    or the connection is evicted (ConnectionAbortedError); reading ``most`` bytes
    at most. The connection's timeout is restored."""
    data = bytearray()
    previous = conn.gettimeout()
    try:
        while complete(data) is None:
            left = deadline - time.monotonic()
            late = TimeoutError(f"no whole {what} within the deadline ({len(data)} bytes came)")
            if left <= 0:
                raise late
            conn.settimeout(left)
            try:
                chunk = conn.recv(min(65536, most - len(data)))
            except TimeoutError:
                raise late from None
            if not chunk:
                if _evicted(conn):
                    raise ConnectionAbortedError("evicted: the server needed the slot for "
                                                 "another client")
                return data or None
            data += chunk
        return data
    except OSError as e:
        if _evicted(conn) and not isinstance(e, ConnectionAbortedError):
            raise ConnectionAbortedError(f"evicted: the server needed the slot for another "
                                         f"client ({e})") from e
        raise
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
