"""The door of the same-host path (:mod:`apgas._core.local_links`): the abstract Unix
socket a place listens on, and the handshake that decides who gets a stream.

Every place listens on an *abstract* Unix socket (Linux: a name in the network
namespace, no file) whose name is a keyed hash of the place's TCP endpoint under
the run's secret, so a place that knows both finds it and nobody else can guess it.
A place that opens a link to a place of its own network namespace connects there
first; where nothing listens (another host, another namespace of a virtual cluster),
the link stays on ZeroMQ.

Who may connect (:func:`handshake_accept`), checked in this order:

1. the kernel's peer credentials (``SO_PEERCRED``) name this place's own user: any
   other user's connection is closed before one byte of it is read;
2. the connector proves it holds the run's secret (a keyed BLAKE2b of its hello:
   a fresh nonce, the two place ids, the connection's purpose), and the acceptor
   proves it back over the same hello; a process of the same user but another run
   is refused. One message each way: during a start of a thousand places, place 0
   takes as many handshakes, each waiting for its GIL. A hello could be replayed
   only by whoever read it off the stream, which takes ptrace rights over a place
   (and with them the secret itself);
3. the connector names this place as its destination.

Why no MAC on each message, as on the TCP path: the MAC there protects against
someone on the network path who forges, alters or replays frames. A connected Unix
stream has no such path: the kernel hands its bytes only to the two sockets, in
order, and a third process can neither inject into nor replay on it. Both ends were
authenticated once, above, by the same secret that keys the MAC; who could still
act on the stream is a process able to ptrace one of the places (the same user),
which reads the secret from memory on the TCP path too. Order and freshness come
from the stream itself, so messages carry no sequence number either.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable

from .local_links import LocalConn

__all__ = ["Door", "LocalRefused", "address_of", "connect", "LINK", "CHANNEL"]

log = logging.getLogger(__name__)

HANDSHAKE_S = 2.0  # s an acceptor gives a connector (of the same user) to prove the secret
CONNECT_S = 5.0
MAX_CONNS = 4096  # accepted connections a place keeps (links and reply channels)
LINK, CHANNEL = b"L", b"C"
_MAGIC = b"APGL1"
_HELLO = struct.Struct("!5scii Q16s")  # magic, purpose, source, destination, token, nonce
_NONCE = 16
_MAC = 32


class LocalRefused(Exception):
    """A same-host connection was not made: the link takes ZeroMQ."""


def address_of(secret: bytes, endpoint: str) -> bytes:
    """The abstract socket name of the place whose TCP endpoint is ``endpoint``."""
    digest = hashlib.blake2b(endpoint.encode(), key=secret[:64], digest_size=15).hexdigest()
    return b"\0apgas-" + digest.encode()


def _mac(secret: bytes, role: bytes, hello: bytes) -> bytes:
    return hashlib.blake2b(role + hello, key=secret[:64], digest_size=_MAC).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise LocalRefused("the peer closed the connection during the handshake")
        data += more
    return data


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def connect(secret: bytes, endpoint: str, purpose: bytes, src: int, dst: int, token: int = 0
            ) -> LocalConn:
    """Connect to the place ``dst`` at ``endpoint`` over its abstract socket, prove the
    secret and have the place prove it back; :class:`LocalRefused` if it is not of this
    host and namespace, or does not prove the secret."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_S)
        try:
            sock.connect(address_of(secret, endpoint))
        except OSError as e:
            raise LocalRefused(f"nothing of this run listens for {endpoint} here: {e}") from None
        if _peer_uid(sock) != os.geteuid():
            raise LocalRefused(f"the socket of {endpoint} belongs to another user")
        hello = _HELLO.pack(_MAGIC, purpose, src, dst, token, os.urandom(_NONCE))
        sock.sendall(hello + _mac(secret, b"C", hello))
        answer = _recv_exact(sock, _MAC)
        if not hmac.compare_digest(answer, _mac(secret, b"A", hello)):
            raise LocalRefused(f"the place at {endpoint} did not prove the run's secret")
        sock.settimeout(None)
        return LocalConn(sock, dst)
    except (LocalRefused, OSError) as e:
        sock.close()
        raise LocalRefused(str(e)) from None
    except BaseException:
        sock.close()
        raise


def handshake_accept(secret: bytes, place_id: int, sock: socket.socket
                     ) -> tuple[bytes, int, int, bytes] | str:
    """Check a connection just accepted: (purpose, source place, token, this place's
    proof to send back once the connection is taken), or why not."""
    uid = _peer_uid(sock)
    if uid != os.geteuid():  # before one byte of it is read
        return f"a process of uid {uid}, another user, connected"
    sock.settimeout(HANDSHAKE_S)
    try:
        hello_and_proof = _recv_exact(sock, _HELLO.size + _MAC)
    except (OSError, LocalRefused) as e:
        return f"the handshake failed: {e}"
    hello, proof = hello_and_proof[:_HELLO.size], hello_and_proof[_HELLO.size:]
    magic, purpose, src, dst, token, _ = _HELLO.unpack(hello)
    if magic != _MAGIC or purpose not in (LINK, CHANNEL) or dst != place_id or src < 0:
        return "a malformed or misdirected hello"
    if not hmac.compare_digest(proof, _mac(secret, b"C", hello)):
        return f"place {src} (as it said) did not prove the run's secret"
    sock.settimeout(None)
    return purpose, src, token, _mac(secret, b"A", hello)


class Door:
    """A place's listener: accepts, checks and hands on connections (its own thread)."""

    def __init__(self, secret: bytes, place_id: int, endpoint: str) -> None:
        self._secret = secret
        self._place_id = place_id
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(address_of(secret, endpoint))  # OSError: the transport goes without
        self._sock.listen(128)
        self.refused = 0
        #: accepted connections for the transport: (purpose, conn, token)
        self._address = address_of(secret, endpoint)
        self._running = True
        self._count = 0
        self._thread = threading.Thread(target=self._loop, name=f"apgas-door-{place_id}",
                                        daemon=True)

    def start(self, on_accept: Callable[[bytes, LocalConn, int], None]) -> None:
        """Accept from now on; ``on_accept(purpose, conn, token)`` takes each connection."""
        self._notify = on_accept
        self._thread.start()

    def _loop(self) -> None:
        while self._running:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return  # closed
            if not self._running:
                sock.close()
                return
            checked = handshake_accept(self._secret, self._place_id, sock) \
                if self._count < MAX_CONNS else f"over {MAX_CONNS} connections"
            if isinstance(checked, str):
                self.refused += 1
                log.warning("place %d refused a same-host connection: %s", self._place_id, checked)
                sock.close()
                continue
            purpose, src, token, answer = checked
            conn = LocalConn(sock, src)
            self._count += 1
            self._notify(purpose, conn, token)
            try:  # the proof back, once the transport has it: the connector may use it at once
                sock.send(answer)
            except OSError:
                conn.close()

    def forget(self) -> None:
        """One accepted connection was closed."""
        self._count -= 1

    def close(self) -> None:
        self._running = False
        if self._thread.is_alive():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as knock:  # wakes accept()
                try:
                    knock.connect(self._address)
                except OSError:
                    pass
            self._thread.join(timeout=2.0)
        self._sock.close()
