"""ZeroMQ transport of one place: a ROUTER socket for what arrives, a DEALER
per destination for what leaves.

One network thread owns the ROUTER and hands every arriving message to the
runtime. Sending threads use the DEALER of the destination directly, under
that socket's lock (a lock is the memory barrier ZeroMQ asks for when a
socket changes threads); skipping a hop through the network thread halves
the latency of ``at``.

Frames on the wire: ``[mac + header, body, *buffers]``. ``mac`` is an
HMAC-SHA256 of the header and all other frames under the run's secret; a
message whose MAC does not verify is dropped and logged before anything is
unpickled.
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
import random
import socket
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


def _mac(secret: bytes, header: bytes, frames: Sequence) -> bytes:
    if len(frames) == 1 and len(frames[0]) < 4096:  # one short digest is cheapest
        return hmac.digest(secret, header + bytes(frames[0]), hashlib.sha256)
    h = hmac.new(secret, header, digestmod=hashlib.sha256)
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
        wildcard = interface in ("*", "0.0.0.0")
        port = self._router.bind_to_random_port("tcp://*" if wildcard else f"tcp://{interface}")
        # bound to every interface: others reach this place by its host name
        self.endpoint = f"tcp://{socket.getfqdn() if wildcard else interface}:{port}"
        self._stop_endpoint = f"inproc://apgas-stop-{id(self)}"
        self._router.bind(self._stop_endpoint)
        self._links: dict[int, _Link] = {}
        self._links_lock = threading.Lock()
        self._running = True
        self._chaos = random.Random(chaos[0] * 1000 + place_id) if chaos else None
        self._chaos_delay = chaos[1] if chaos else 0.0
        self._chaos_cond = threading.Condition()
        self._held: list = []  # chaos: heap of (due, seq, dst, header, payload)
        self._held_last: dict[int, float] = {}
        self._held_seq = 0
        self._thread = threading.Thread(target=self._loop, name=f"apgas-net-{place_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self._chaos is not None:
            threading.Thread(target=self._release_held, name=f"apgas-chaos-{self.place_id}",
                             daemon=True).start()

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

    def disconnect(self, place_id: int, linger_ms: int = 0) -> None:
        """Close the link to a place; ``linger_ms`` lets queued messages still leave."""
        with self._links_lock:
            link = self._links.pop(place_id, None)
        if link is not None:
            self._close_link(link, linger_ms)

    def send(self, dst: int, kind: int, a: int, b: int, payload: Sequence = (b"",),
             guard: Callable[[], bool] | None = None) -> bool:
        """Send one message; ``payload`` is ``[body, *buffers]``. Thread-safe.

        ``guard`` is checked under the lock that orders the messages to ``dst``:
        if it is false, nothing is sent and False is returned. A message sent
        after ``guard`` turned false (and after the message that made it so)
        can therefore never overtake that message.
        """
        header = HEADER.pack(kind, self.place_id, a, b)
        if self._chaos is None:
            return self._send_now(dst, header, payload, guard)
        return self._hold(dst, header, payload, guard)

    def close(self, linger_ms: int = 0) -> None:
        """Stop; with ``linger_ms`` > 0, wait that long for queued messages to leave."""
        if not self._running:
            return
        if linger_ms > 0:
            self._flush_held()
        self._running = False
        with self._chaos_cond:
            self._chaos_cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            stop = self._ctx.socket(zmq.DEALER)  # wakes the blocking receive
            stop.connect(self._stop_endpoint)
            stop.send(b"stop")
            self._thread.join(timeout=2.0)
            stop.close(linger=0)
        with self._links_lock:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            self._close_link(link, linger_ms)
        self._router.close(linger=0)
        self._ctx.term()

    # -- sending ----------------------------------------------------------------
    def _send_now(self, dst: int, header: bytes, payload: Sequence,
                  guard: Callable[[], bool] | None = None) -> bool:
        link = self._links.get(dst)
        if link is None:
            log.debug("message to place %d dropped: no link (place gone)", dst)
            return guard is None
        envelope = _mac(self._secret, header, payload) + header
        last = len(payload) - 1
        try:
            with link.lock:
                if guard is not None and not guard():
                    return False
                sock = link.sock
                if sock.closed:
                    return True
                sock.send(envelope, zmq.SNDMORE)
                for i, frame in enumerate(payload):
                    big = getattr(frame, "nbytes", 0) >= _ZERO_COPY_MIN
                    sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)
        except zmq.ZMQError as err:
            if self._running:
                log.error("sending to place %d failed: %s", dst, err)
        return True

    @staticmethod
    def _close_link(link: _Link, linger_ms: int = 0) -> None:
        with link.lock:
            link.sock.close(linger=linger_ms)

    def _hold(self, dst: int, header: bytes, payload: Sequence,
              guard: Callable[[], bool] | None = None) -> bool:
        """Chaos hook: delay at random, keeping the order within each pair."""
        with self._chaos_cond:
            if guard is not None and not guard():
                return False
            due = max(time.monotonic() + self._chaos.random() * self._chaos_delay,  # type: ignore[union-attr]
                      self._held_last.get(dst, 0.0))
            self._held_last[dst] = due
            self._held_seq += 1
            heapq.heappush(self._held, (due, self._held_seq, dst, header, payload))
            self._chaos_cond.notify()
        return True

    def _release_held(self) -> None:
        """Chaos hook thread: send each held message when it is due."""
        while True:
            with self._chaos_cond:
                while self._running:
                    wait = self._held[0][0] - time.monotonic() if self._held else None
                    if wait is not None and wait <= 0:
                        break
                    self._chaos_cond.wait(wait)
                if not self._running:
                    return
                # sent under the lock: a flush at close must not overtake it
                _, _, dst, header, payload = heapq.heappop(self._held)
                self._send_now(dst, header, payload)

    def _flush_held(self) -> None:
        """Chaos hook: send everything still held, in order, before an orderly close."""
        with self._chaos_cond:
            while self._held:
                _, _, dst, header, payload = heapq.heappop(self._held)
                self._send_now(dst, header, payload)

    # -- receiving (network thread) -------------------------------------------------
    def _loop(self) -> None:
        recv = self._router.recv_multipart
        try:
            while True:
                frames = recv(copy=False)
                if not self._running:
                    return
                self._deliver(frames)
        except zmq.ContextTerminated:
            pass
        except Exception:  # a bug here would hang every finish: make it loud
            log.critical("network thread failed", exc_info=True)
            raise

    def _deliver(self, frames: list) -> None:
        # frames: [routing id, mac + header, body, *buffers]
        if len(frames) < 3 or len(frames[1]) != MAC_BYTES + HEADER.size:
            self._reject(frames, "malformed frames")
            return
        envelope = frames[1].bytes
        parts = [f.buffer for f in frames[2:]]
        header = envelope[MAC_BYTES:]
        if not hmac.compare_digest(_mac(self._secret, header, parts), envelope[:MAC_BYTES]):
            self._reject(frames, "bad MAC")
            return
        kind, src, a, b = HEADER.unpack(header)
        try:
            self._handler(kind, src, a, b, parts[0], parts[1:])
        except Exception:
            log.exception("handling message kind %d from place %d failed", kind, src)

    def _reject(self, frames: list, why: str) -> None:
        self.rejected += 1
        log.warning("dropped an unauthenticated message (%s, %d frames); it was not unpickled",
                    why, len(frames) - 1)
