"""The same-host path: places of one machine talk over Unix stream sockets that the
threads of the places read and write themselves, with no ZeroMQ I/O thread between.

How places find each other, who may connect, and why a stream needs neither a
MAC nor sequence numbers: :mod:`apgas._core.local_door`. A link never changes path
once open, so the order of the pair holds.

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
import logging
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence

__all__ = ["FIXED", "ALIGN", "LocalConn", "Reader", "Backlog", "Spin"]

log = logging.getLogger(__name__)

#: length of what follows (frame lengths and frames), kind, source place, a, b, frames
FIXED = struct.Struct("!IBiqqH")
_ONE = struct.Struct("!I")
ALIGN = 64  # frames after a message's first start this aligned (numpy buffers)
_ZEROS = memoryview(bytes(ALIGN))
_IOV = 512  # pieces per sendmsg (below IOV_MAX)
MAX_FRAMES = 4096
CHUNK = 256 * 1024  # bytes read at a time into one buffer that messages then slice
FIRST_CHUNK = 8 * 1024  # a stream's first buffer
SPIN_S = 50e-6  # s a thread reads a place of this host before it sleeps (see Spin)
MISSES = 4
RETRY = 32


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
            if sent == total:
                return True
            self._keep(data, sent)
        # the writer is told after the lock is released: it takes its own lock, then this
        # one, to drop a connection it emptied (the other order deadlocked the two)
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
        self._buf = bytearray(FIRST_CHUNK)  # small: most streams carry little (place 0 has a thousand)
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
        with self._cond:  # the pipe is written and closed under it
            if not self._running:
                return
            self._conns.add(conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            try:
                os.write(self._wake_w, b"w")
            except BlockingIOError:
                pass  # full: the writer is woken already

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
            try:
                for fd, _ in poller.poll():
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
            except OSError:  # closed by stop() after its wait
                return
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
        with self._cond:
            os.close(self._wake_r)
            os.close(self._wake_w)


class Spin:
    """How long a thread that waits for a place of this host reads before it sleeps.

    Waking a sleeping thread costs more than the whole exchange of a short call
    (10-40 us here), so a thread that expects an answer soon reads for up to
    :data:`SPIN_S` first, as MPI libraries and Charm++ do. Unlike them, it stops
    spinning where spinning does not pay: after :data:`MISSES` waits in a row that
    the spin did not end (the peer shares this core, or the calls are long), it
    sleeps at once, and tries a spin again only one wait in :data:`RETRY`.
    """

    __slots__ = ("misses", "waits")

    def __init__(self) -> None:
        self.misses = 0
        self.waits = 0

    def deadline(self) -> float:
        """Until when to spin for this wait (``time.perf_counter``); now for none."""
        now = time.perf_counter()
        self.waits += 1
        if self.misses < MISSES or self.waits % RETRY == 0:
            return now + SPIN_S
        return now

    def ended(self, in_time: bool) -> None:
        """The wait ended within its spin, or not."""
        self.misses = 0 if in_time else self.misses + 1
