"""ZeroMQ transport of one place: a ROUTER socket for what arrives, a DEALER
per destination for what leaves, and one network thread that alone touches them.

Frames on the wire: ``[mac, header, body, *buffers]``. ``mac`` is an
HMAC-SHA256 of all other frames under the run's secret; a message whose MAC
does not verify is dropped and logged before anything is unpickled.
Messages between one pair of places are delivered in the order they were
sent (one TCP connection per pair); nothing else about order is promised.
"""

from __future__ import annotations

import collections
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
        self._dealers: dict[int, zmq.Socket] = {}
        self._outbox: collections.deque = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sleeping = False
        self._running = True
        self._chaos = random.Random(chaos[0] + place_id) if chaos else None
        self._chaos_delay = chaos[1] if chaos else 0.0
        self._held: list = []  # chaos: heap of (due, seq, dst, frames)
        self._held_last: dict[int, float] = {}
        self._held_seq = 0
        self._thread = threading.Thread(target=self._loop, name=f"apgas-net-{place_id}", daemon=True)

    # -- any thread ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def connect(self, place_id: int, endpoint: str) -> None:
        self._post(("connect", place_id, endpoint))

    def disconnect(self, place_id: int) -> None:
        self._post(("disconnect", place_id, None))

    def send(self, dst: int, kind: int, a: int, b: int, payload: Sequence = (b"",)) -> None:
        """Queue one message; ``payload`` is ``[body, *buffers]``."""
        header = HEADER.pack(kind, self.place_id, a, b)
        frames = [header, *payload]
        self._post((dst, frames))

    def close(self) -> None:
        if not self._running:
            return
        self._running = False
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        for sock in self._dealers.values():
            sock.close(linger=0)
        self._router.close(linger=0)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _post(self, item) -> None:
        self._outbox.append(item)
        if self._sleeping:
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # pipe full (a wake-up is pending anyway) or closed

    # -- network thread -----------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while self._running:
                self._sleeping = True
                if self._outbox:
                    timeout = 0
                elif self._held:
                    timeout = max(0, int((self._held[0][0] - time.monotonic()) * 1000) + 1)
                else:
                    timeout = None
                events = dict(poller.poll(timeout))
                self._sleeping = False
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 65536)
                    except BlockingIOError:
                        pass
                if self._router in events:
                    self._receive_some()
                self._send_queued()
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
        log.warning("dropped an unauthenticated message (%s) from peer %r; it was not unpickled",
                    why, bytes(frames[0].buffer))

    def _send_queued(self) -> None:
        outbox = self._outbox
        while outbox:
            item = outbox.popleft()
            if isinstance(item[0], str):
                self._control(*item)
            elif self._chaos is not None:
                self._hold(*item)
            else:
                self._send_now(*item)
        if self._held:
            now = time.monotonic()
            while self._held and self._held[0][0] <= now:
                _, _, dst, frames = heapq.heappop(self._held)
                self._send_now(dst, frames)

    def _hold(self, dst: int, frames: list) -> None:
        """Chaos hook: delay at random, keeping the order within each pair."""
        due = max(time.monotonic() + self._chaos.random() * self._chaos_delay,
                  self._held_last.get(dst, 0.0))
        self._held_last[dst] = due
        self._held_seq += 1
        heapq.heappush(self._held, (due, self._held_seq, dst, frames))

    def _send_now(self, dst: int, frames: list) -> None:
        sock = self._dealers.get(dst)
        if sock is None:
            log.debug("message to place %d dropped: not connected (place gone)", dst)
            return
        mac = _mac(self._secret, frames)
        last = len(frames)
        try:
            sock.send(mac, zmq.SNDMORE)
            for i, frame in enumerate(frames, 1):
                big = getattr(frame, "nbytes", len(frame)) >= _ZERO_COPY_MIN
                sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)
        except zmq.ZMQError as err:
            log.error("sending to place %d failed: %s", dst, err)

    def _control(self, op: str, place_id: int, endpoint: str | None) -> None:
        if op == "connect":
            old = self._dealers.pop(place_id, None)
            if old is not None:
                old.close(linger=0)
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.IDENTITY, b"p%d" % self.place_id)
            sock.connect(endpoint)
            self._dealers[place_id] = sock
        elif op == "disconnect":
            sock = self._dealers.pop(place_id, None)
            if sock is not None:
                sock.close(linger=0)
