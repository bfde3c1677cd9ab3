"""The same-host path: places of one machine talk over Unix stream sockets that the
threads of the places read and write themselves, with no ZeroMQ I/O thread between.

Every place listens on an *abstract* Unix socket (Linux: a name in the network
namespace, no file) whose name is a hash of the run's secret and the place's TCP
endpoint, so a place that knows both finds it and nobody else can guess it. A place
that opens a link to a place of its own network namespace connects there first;
where nothing listens (another host, another namespace of a virtual cluster, an
older place), the link stays on ZeroMQ. A link never changes path once open, so the
order of the pair holds.

Who may connect (:func:`handshake_accept`), checked in this order:

1. the kernel's peer credentials (``SO_PEERCRED``) name this place's own user: any
   other user's connection is closed before one byte of it is read;
2. the connector proves it holds the run's secret and the acceptor proves it back
   (a keyed BLAKE2b over both sides' fresh nonces, the two place ids and the
   connection's purpose); a process of the same user but another run is refused;
3. the connector names this place as its destination.

Why no MAC on each message, as on the TCP path: the MAC there protects against
someone on the network path who forges, alters or replays frames. A connected Unix
stream has no such path: the kernel hands its bytes only to the two sockets, in
order, and a third process can neither inject into nor replay on it. Both ends were
authenticated once, above, by the same secret that keys the MAC; who could still
act on the stream is a process able to ptrace one of the places (the same user),
which reads the secret from memory on the TCP path too. Order and freshness come
from the stream itself, so messages carry no sequence number either.

A message on a stream: :data:`FIXED` (the length of what follows, kind, source,
``a``, ``b``, the number of frames), one ``uint32`` length per frame, then the
frames. The reader checks the length against ``max_message_bytes`` before it keeps
anything, and the source against the connection's authenticated place.

Writes never block a thread of the place: a socket that is full keeps the rest in a
backlog, in order, and one writer thread (:class:`Backlog`) sends it on when the
peer reads; later messages queue behind it. Two places that send each other much
at once therefore cannot deadlock, as ZeroMQ's unbounded queues could not either.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import logging
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["FIXED", "LocalConn", "Reader", "Backlog", "Door", "address_of", "connect",
           "LocalRefused", "LINK", "CHANNEL"]

log = logging.getLogger(__name__)

#: length of what follows (frame lengths and frames), kind, source place, a, b, frames
FIXED = struct.Struct("!IBiqqH")
_ONE = struct.Struct("!I")
ALIGN = 64  # frames after a message's first start this aligned (numpy buffers)
_ZEROS = memoryview(bytes(ALIGN))
_IOV = 512  # pieces per sendmsg (below IOV_MAX)
MAX_FRAMES = 4096
CHUNK = 256 * 1024  # bytes read at a time into one buffer that messages then slice
HANDSHAKE_S = 2.0  # s an acceptor gives a connector (of the same user) to prove the secret
CONNECT_S = 5.0
MAX_CONNS = 4096  # accepted connections a place keeps (links and reply channels)
LINK, CHANNEL = b"L", b"C"
_MAGIC = b"APGL1"
_HELLO = struct.Struct("!5scii Q16s")  # magic, purpose, source, destination, token, nonce
_NONCE = 16
_MAC = 32
_OK = b"\x01"


class LocalRefused(Exception):
    """A same-host connection was not made: the link takes ZeroMQ."""


def address_of(secret: bytes, endpoint: str) -> bytes:
    """The abstract socket name of the place whose TCP endpoint is ``endpoint``."""
    digest = hashlib.blake2b(endpoint.encode(), key=secret[:64], digest_size=15).hexdigest()
    return b"\0apgas-" + digest.encode()


def _mac(secret: bytes, role: bytes, hello: bytes, nonce: bytes) -> bytes:
    return hashlib.blake2b(role + hello + nonce, key=secret[:64], digest_size=_MAC).digest()


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
    """Connect to the place ``dst`` at ``endpoint`` over its abstract socket and prove
    the secret both ways; :class:`LocalRefused` if it is not of this host and namespace,
    or does not prove the secret."""
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
        sock.sendall(hello)
        answer = _recv_exact(sock, _NONCE + _MAC)
        nonce, proof = answer[:_NONCE], answer[_NONCE:]
        if not hmac.compare_digest(proof, _mac(secret, b"A", hello, nonce)):
            raise LocalRefused(f"the place at {endpoint} did not prove the run's secret")
        sock.sendall(_mac(secret, b"C", hello, nonce))
        if _recv_exact(sock, 1) != _OK:
            raise LocalRefused(f"the place at {endpoint} refused the connection")
        sock.settimeout(None)
        return LocalConn(sock, dst)
    except (LocalRefused, OSError) as e:
        sock.close()
        raise LocalRefused(str(e)) from None
    except BaseException:
        sock.close()
        raise


def handshake_accept(secret: bytes, place_id: int, sock: socket.socket
                     ) -> tuple[bytes, int, int] | str:
    """Check a connection just accepted: (purpose, source place, token), or why not."""
    uid = _peer_uid(sock)
    if uid != os.geteuid():  # before one byte of it is read
        return f"a process of uid {uid}, another user, connected"
    sock.settimeout(HANDSHAKE_S)
    try:
        hello = _recv_exact(sock, _HELLO.size)
        magic, purpose, src, dst, token, _ = _HELLO.unpack(hello)
        if magic != _MAGIC or purpose not in (LINK, CHANNEL) or dst != place_id or src < 0:
            return "a malformed or misdirected hello"
        nonce = os.urandom(_NONCE)
        sock.sendall(nonce + _mac(secret, b"A", hello, nonce))
        if not hmac.compare_digest(_recv_exact(sock, _MAC), _mac(secret, b"C", hello, nonce)):
            return f"place {src} (as it said) did not prove the run's secret"
    except (OSError, LocalRefused) as e:
        return f"the handshake failed: {e}"
    sock.settimeout(None)
    return purpose, src, token


class LocalConn:
    """One authenticated stream to place ``place``. Writes from any thread, under
    ``lock``; never blocks (a full socket's rest waits in the backlog)."""

    __slots__ = ("sock", "place", "lock", "backlog", "closed", "fileno", "_owner")

    def __init__(self, sock: socket.socket, place: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.place = place
        self.lock = threading.Lock()
        self.backlog: deque[memoryview] = deque()  # under lock: bytes not yet written, in order
        self.closed = False
        self.fileno = sock.fileno()
        self._owner: Backlog | None = None

    def put(self, backlog: Backlog, kind: int, src: int, a: int, b: int,
            payload: Sequence[bytes | memoryview]) -> bool:
        """Write one message; False if the connection is broken (the peer is gone)."""
        if len(payload) == 1 and type(payload[0]) is bytes:  # most messages: one short frame
            size = len(payload[0])
            data = [memoryview(FIXED.pack(4 + size, kind, src, a, b, 1) + _ONE.pack(size)
                               + payload[0])]
            total = data[0].nbytes
        else:
            data, total = _pieces(kind, src, a, b, payload)
        with self.lock:
            if self.closed:
                return False
            if self.backlog:
                self._keep(data, 0)
                return True
            try:
                sent = self.sock.send(data[0]) if len(data) == 1 else _write(self.sock, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.closed = True
                return False
            if sent < total:
                self._keep(data, sent)
                backlog.add(self)
            return True

    def _keep(self, data: list[memoryview], sent: int) -> None:
        """Keep what was not written, copied (the caller may reuse its buffers)."""
        for piece in data:
            if sent >= piece.nbytes:
                sent -= piece.nbytes
                continue
            self.backlog.append(memoryview(bytes(piece[sent:])))
            sent = 0

    def write_backlog(self) -> bool:
        """Write what the backlog holds as far as the socket takes it; True once empty."""
        with self.lock:
            while self.backlog and not self.closed:
                piece = self.backlog[0]
                try:
                    sent = self.sock.send(piece)
                except BlockingIOError:
                    return False
                except OSError:
                    self.closed = True
                    self.backlog.clear()
                    return True
                if sent < piece.nbytes:
                    self.backlog[0] = piece[sent:]
                    return False
                self.backlog.popleft()
            return True

    def close(self) -> None:
        """Close; what was written is still read by the peer, what the backlog holds is
        written first if the socket takes it at once."""
        if self.backlog:
            self.write_backlog()
        with self.lock:
            self.closed = True
            self.backlog.clear()
        try:
            self.sock.close()
        except OSError:
            pass


def _pieces(kind: int, src: int, a: int, b: int, payload: Sequence[bytes | memoryview]
            ) -> tuple[list[memoryview], int]:
    """A message's pieces for ``sendmsg``: the head, then the frames, each frame after the
    first at a multiple of :data:`ALIGN` from the message's start (zeros between): the
    reader places large messages at aligned addresses, so numpy buffers arrive aligned
    (and compute as they would where they were made)."""
    frames = [memoryview(f).cast("B") if type(f) is not bytes else memoryview(f) for f in payload]
    sizes = [f.nbytes for f in frames]
    pieces: list[memoryview] = [memoryview(b"")]
    offset = FIXED.size + 4 * len(frames)
    for i, frame in enumerate(frames):
        pad = (-offset) % ALIGN if i else 0
        if pad:
            pieces.append(_ZEROS[:pad])
            offset += pad
        pieces.append(frame)
        offset += frame.nbytes
    pieces[0] = memoryview(FIXED.pack(offset - FIXED.size, kind, src, a, b, len(frames))
                           + struct.pack(f"!{len(frames)}I", *sizes))
    return pieces, offset


def _write(sock: socket.socket, pieces: list[memoryview]) -> int:
    """Write as much of ``pieces`` as the socket takes now; the bytes written."""
    sent = 0
    for i in range(0, len(pieces), _IOV):
        group = pieces[i:i + _IOV]
        want = sum(p.nbytes for p in group)
        try:
            n = sock.sendmsg(group)
        except BlockingIOError:
            return sent
        sent += n
        if n < want:
            return sent
    return sent


def _address(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _aligned(size: int) -> tuple[bytearray, int]:
    """A buffer of at least ``size`` bytes from an offset at an ALIGN-aligned address."""
    buf = bytearray(size + ALIGN)
    return buf, (-_address(buf)) % ALIGN


class Reader:
    """Reads one connection's messages as they come, never waiting for the rest of one;
    a message's frames are slices of a buffer that is never reused."""

    __slots__ = ("conn", "max_bytes", "_buf", "_start", "_end")

    def __init__(self, conn: LocalConn, max_bytes: int) -> None:
        self.conn = conn
        self.max_bytes = max_bytes
        self._buf = bytearray(CHUNK)
        self._start = self._end = 0

    def read(self, out: deque[tuple[int, int, int, int, list[memoryview]]]) -> str | None:
        """Read what the socket holds and append each whole message to ``out`` as
        (kind, source, a, b, frames); None, or why the connection must be closed
        (its end, a message over the limit, a malformed one)."""
        need = self._room()
        if isinstance(need, str):
            return need
        try:
            n = self.conn.sock.recv_into(memoryview(self._buf)[self._end:])
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            return f"reading failed: {e}"
        if n == 0:
            return "closed by the peer"
        self._end += n
        return self._parse(out)

    def _room(self) -> str | None:
        """Make room to read into: a new buffer when the message being read does not fit
        in this one, or too little is left after it. A message of several frames is
        read from an aligned address."""
        have = self._end - self._start
        if have >= FIXED.size:
            length = FIXED.unpack_from(self._buf, self._start)[0]
            if length > self.max_bytes + (4 + ALIGN) * MAX_FRAMES:
                return f"a message of {length:,} bytes, over the limit of {self.max_bytes:,}"
            whole = FIXED.size + length
            if len(self._buf) - self._start >= whole:
                return None
            size = max(CHUNK, whole)
        elif len(self._buf) - self._end >= 4096:
            return None
        else:
            size = CHUNK
        fresh, offset = _aligned(size)
        fresh[offset:offset + have] = self._buf[self._start:self._end]
        self._buf, self._start, self._end = fresh, offset, offset + have
        return None

    def _parse(self, out: deque[tuple[int, int, int, int, list[memoryview]]]) -> str | None:
        buf = self._buf
        while self._end - self._start >= FIXED.size:
            start = self._start
            length, kind, src, a, b, count = FIXED.unpack_from(buf, start)
            if length > self.max_bytes + (4 + ALIGN) * MAX_FRAMES:
                return f"a message of {length:,} bytes, over the limit of {self.max_bytes:,}"
            if count == 0 or count > MAX_FRAMES or 4 * count > length:
                return f"a malformed message ({count} frames in {length} bytes)"
            if self._end - start < FIXED.size + length:
                return None
            sizes = struct.unpack_from(f"!{count}I", buf, start + FIXED.size)
            if src != self.conn.place:
                return f"a message said to be from place {src} on the link of place {self.conn.place}"
            if count > 1 and (_address(buf) + start) % ALIGN:
                # read unaligned (it came with others): copied to an aligned buffer
                whole = FIXED.size + length
                own, offset = _aligned(whole)
                own[offset:offset + whole] = buf[start:start + whole]
                frames = _frames(own, offset, count, sizes, length)
            else:
                frames = _frames(buf, start, count, sizes, length)
            if frames is None:
                return "a malformed message (its frames' lengths do not add up)"
            out.append((kind, src, a, b, frames))
            self._start = start + FIXED.size + length
        return None


def _frames(buf: bytearray, start: int, count: int, sizes: Sequence[int], length: int
            ) -> list[memoryview] | None:
    """The frames of the message at ``start`` (see :func:`_pieces`), or None if its
    lengths do not add up to ``length``."""
    view = memoryview(buf)
    pos = FIXED.size + 4 * count
    frames = []
    for i, size in enumerate(sizes):
        if i:
            pos += (-pos) % ALIGN
        frames.append(view[start + pos:start + pos + size])
        pos += size
    return frames if pos == FIXED.size + length else None


class Backlog:
    """One thread that writes the backlogs of full sockets as their peers read them."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._conns: set[LocalConn] = set()
        self._thread: threading.Thread | None = None
        self._running = True
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def add(self, conn: LocalConn) -> None:
        with self._cond:
            if not self._running:
                return
            self._conns.add(conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:
            pass

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._running:
                    return
                conns = [c for c in self._conns if not c.closed]
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for conn in conns:
                poller.register(conn.fileno, select.POLLOUT)
            for fd, _ in poller.poll():
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
            for conn in conns:
                if conn.write_backlog():
                    with self._cond:
                        with conn.lock:
                            if not conn.backlog:
                                self._conns.discard(conn)

    def stop(self) -> None:
        with self._cond:
            self._running = False
        try:
            os.write(self._wake_w, b"s")
        except BlockingIOError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        os.close(self._wake_r)
        os.close(self._wake_w)


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
            purpose, src, token = checked
            conn = LocalConn(sock, src)
            self._count += 1
            self._notify(purpose, conn, token)
            try:
                sock.send(_OK)  # after the transport has it: the connector may use it at once
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
