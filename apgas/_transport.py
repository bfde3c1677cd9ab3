"""ZeroMQ transport of one place: a ROUTER socket for what arrives, a DEALER
per destination for what leaves.

One network thread owns the ROUTER and hands every arriving message to the
runtime. Sending threads use the DEALER of the destination directly, under
that socket's lock (a lock is the memory barrier ZeroMQ asks for when a
socket changes threads); skipping a hop through the network thread halves
the latency of ``at``.

Frames on the wire: ``[mac, header, body, *buffers]``. ``mac`` is an
HMAC-SHA256 of all other frames under the run's secret; a message whose MAC
does not verify is dropped and logged before anything is unpickled.
Messages between one pair of places arrive in the order they were sent (one
TCP connection per pair); nothing else about order is promised. The chaos
test hook keeps exactly that promise and nothing more: it delays every
message at random, so messages of different pairs overtake each other.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import logging
import os
import random
import struct
import threading
import time
from typing import Callable, Sequence

import zmq

__all__ = ["Transport", "HEADER"]

log = logging.getLogger(__name__)

#: kind (uint8), source place (int32), a (int64), b (int64)
HEADER = struct.Struct("!Biqq")
MAC_BYTES = 32
_ZERO_COPY_MIN = 64 * 1024

Handler = Callable[[int, int, int, int, memoryview, list], None]


def _mac(secret: bytes, frames: Sequence) -> bytes:
    if len(frames) == 2 and len(frames[1]) < 4096:  # one short digest is cheapest
        return hmac.digest(secret, bytes(frames[0]) + bytes(frames[1]), hashlib.sha256)
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for frame in frames:
        h.update(frame)
    return h.digest()


class _Link:
    """The DEALER towards one place, and the lock its users take."""

    __slots__ = ("sock", "lock", "endpoint")

    def __init__(self, sock: zmq.Socket, endpoint: str) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.endpoint = endpoint


class Transport:
    """Sends and receives authenticated multipart messages for one place."""

    def __init__(self, place_id: int, secret: bytes, interface: str, handler: Handler,
                 chaos: tuple[int, float] | None = None) -> None:
        self.place_id = place_id
        self.rejected = 0
        self._secret = secret
        self._handler = handler
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.RCVHWM, 0)
        port = self._router.bind_to_random_port(f"tcp://{interface}")
        self.endpoint = f"tcp://{interface}:{port}"
        self._links: dict[int, _Link] = {}
        self._links_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._running = True
        self._chaos = random.Random(chaos[0] * 1000 + place_id) if chaos else None
        self._chaos_delay = chaos[1] if chaos else 0.0
        self._chaos_lock = threading.Lock()
        self._held: list = []  # chaos: heap of (due, seq, dst, frames)
        self._held_last: dict[int, float] = {}
        self._held_seq = 0
        self._thread = threading.Thread(target=self._loop, name=f"apgas-net-{place_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def connect(self, place_id: int, endpoint: str) -> None:
        """Open the link to a place (kept if it already goes to ``endpoint``)."""
        with self._links_lock:
            link = self._links.get(place_id)
            if link is not None and link.endpoint == endpoint:
                return  # a new socket would drop what is queued on the old one
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(endpoint)
            self._links[place_id] = _Link(sock, endpoint)
        if link is not None:
            self._close_link(link)

    def disconnect(self, place_id: int) -> None:
        with self._links_lock:
            link = self._links.pop(place_id, None)
        if link is not None:
            self._close_link(link)

    def send(self, dst: int, kind: int, a: int, b: int, payload: Sequence = (b"",)) -> None:
        """Send one message; ``payload`` is ``[body, *buffers]``. Thread-safe."""
        frames = [HEADER.pack(kind, self.place_id, a, b), *payload]
        if self._chaos is None:
            self._send_now(dst, frames)
        else:
            self._hold(dst, frames)

    def close(self) -> None:
        if not self._running:
            return
        self._running = False
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        with self._links_lock:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            self._close_link(link)
        self._router.close(linger=0)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- sending ----------------------------------------------------------------
    def _send_now(self, dst: int, frames: list) -> None:
        link = self._links.get(dst)
        if link is None:
            log.debug("message to place %d dropped: no link (place gone)", dst)
            return
        mac = _mac(self._secret, frames)
        last = len(frames)
        try:
            with link.lock:
                sock = link.sock
                if sock.closed:
                    return
                sock.send(mac, zmq.SNDMORE)
                for i, frame in enumerate(frames, 1):
                    big = getattr(frame, "nbytes", 0) >= _ZERO_COPY_MIN
                    sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)
        except zmq.ZMQError as err:
            if self._running:
                log.error("sending to place %d failed: %s", dst, err)

    @staticmethod
    def _close_link(link: _Link) -> None:
        with link.lock:
            link.sock.close(linger=0)

    def _hold(self, dst: int, frames: list) -> None:
        """Chaos hook: delay at random, keeping the order within each pair."""
        with self._chaos_lock:
            due = max(time.monotonic() + self._chaos.random() * self._chaos_delay,  # type: ignore[union-attr]
                      self._held_last.get(dst, 0.0))
            self._held_last[dst] = due
            self._held_seq += 1
            heapq.heappush(self._held, (due, self._held_seq, dst, frames))
        self._wake()

    def _release_due(self) -> float | None:
        """Chaos hook: send what is due; return seconds until the next is."""
        while True:
            with self._chaos_lock:
                if not self._held:
                    return None
                wait = self._held[0][0] - time.monotonic()
                if wait > 0:
                    return wait
                _, _, dst, frames = heapq.heappop(self._held)
            self._send_now(dst, frames)

    # -- receiving (network thread) -------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # pipe full (a wake-up is pending anyway) or closed

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        timeout: int | None = None
        try:
            while self._running:
                events = dict(poller.poll(timeout))
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 65536)
                    except BlockingIOError:
                        pass
                if self._router in events:
                    self._receive_some()
                if self._chaos is not None:
                    wait = self._release_due()
                    timeout = None if wait is None else int(wait * 1000) + 1
        except zmq.ContextTerminated:
            pass
        except Exception:  # a bug here would hang every finish: make it loud
            log.critical("network thread failed", exc_info=True)
            raise

    def _receive_some(self) -> None:
        for _ in range(1000):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._deliver(frames)

    def _deliver(self, frames: list) -> None:
        # frames: [routing id, mac, header, body, *buffers]
        parts = [f.buffer for f in frames[1:]]
        if len(parts) < 3 or len(parts[0]) != MAC_BYTES or len(parts[1]) != HEADER.size:
            self._reject(frames, "malformed frames")
            return
        if not hmac.compare_digest(_mac(self._secret, parts[1:]), parts[0]):
            self._reject(frames, "bad MAC")
            return
        kind, src, a, b = HEADER.unpack(parts[1])
        try:
            self._handler(kind, src, a, b, parts[2], parts[3:])
        except Exception:
            log.exception("handling message kind %d from place %d failed", kind, src)

    def _reject(self, frames: list, why: str) -> None:
        self.rejected += 1
        log.warning("dropped an unauthenticated message (%s, %d frames); it was not unpickled",
                    why, len(frames) - 1)
