"""ZeroMQ transport of one place: a ROUTER socket for what arrives, a DEALER
per destination for what leaves.

One thread at a time owns the ROUTER and hands every arriving message to the
runtime (:meth:`Transport.receive`): the transport's own network thread, or
the threads of a worker pool taking turns (leader/followers, see
:mod:`apgas._core.pool`; the pool's lock is the memory barrier ZeroMQ asks for
when a socket changes threads). Senders use the destination's DEALER
directly, under its lock (the same barrier).

Frames on the wire: ``[mac + header + route + body]`` for a payload of one
frame under 4 KiB (most messages: one frame, one send), else
``[mac + header + route, body, *buffers]``.

* ``header`` (:data:`HEADER`): kind, source place, and the two integers
  ``a`` and ``b`` the runtime gives every message;
* ``route`` (:data:`ROUTE`): the destination place and a sequence number;
* ``mac``: keyed BLAKE2b-256 (RFC 7693's MAC mode; one pass, 0.6 us here
  against HMAC-SHA256's 2.2) under the run's secret of ``header + route +
  tail``. ``tail`` is ``0x01 + body`` for one frame under 4 KiB, else ``0x02 +
  digest``: the BLAKE2b of the frames, their number and lengths, computed
  outside the link's lock so that large payloads hash in parallel. The MAC
  is taken under the lock, where the sequence number is assigned.

Two kinds of message have rules of their own:

* a *batch* (kind 0, :mod:`apgas._core.batch`): many small messages to one
  place in one, numbered, signed and checked once; the receiver hands its
  entries on in order. :meth:`Transport.send` with ``batch=True`` lets a
  message wait for one (tasks and finish reports do); anything else to the
  same place sends what waits first, so the order of the pair holds.
* a message to a *reply channel* (:mod:`apgas._core.replies`): sent through
  the ROUTER to a caller's own socket, with sequence number 0 (which the
  numbered path always refuses); the channel takes only the reply it waits
  for.

Sequence numbers count per link (one DEALER towards one place): a link's
first message has number ``(generation << 40) + 1`` and each next one is one
more, assigned under the link's lock in the order the messages go on the
wire (the chaos hook assigns them when it releases a message, which keeps
the order of the pair). The generation grows each time a link to the same
place is made again (:meth:`Transport.connect` with a new endpoint, or after
:meth:`Transport.disconnect`), so a new link's numbers are above its
predecessor's. A receiver accepts a message only if

1. it has the right shape and its payload is at most ``max_message_bytes``
   (ZeroMQ's ``MAXMSGSIZE`` also cuts off, before reading it, any single
   frame above that limit, and disconnects its sender);
2. its destination is this place;
3. its sequence number is above the last one accepted from its source;
4. its MAC verifies.

Anything else is dropped, counted in :attr:`Transport.rejected` (and per
reason in :attr:`Transport.rejected_by`) and logged, rate-limited, before
anything is unpickled. Numbers may have gaps (a message lost with a closed
socket); they are not used to detect loss.

What this protects against, for an attacker who can read and write the
network (or loopback) but does not know the run's secret:

* forged or altered messages (the MAC covers every frame, their number and
  lengths, the destination and the sequence number);
* a captured message sent again, from any socket, to the same place: its
  number is not above the last accepted one (replays of a place table from
  before a shrink included);
* a message captured on its way to one place sent to another: wrong
  destination;
* a message captured in an earlier run: every run has a fresh secret, which
  is the epoch between runs (within a run the sequence numbers do that
  work; there is no separate epoch number);
* huge frames: dropped before they are read, and a sender gets
  :class:`MessageTooLarge` (an :class:`~apgas.errors.ApgasError` naming the
  size, the limit and the option) instead of its link being cut.

What it does not protect:

* confidentiality: payloads are not encrypted, anyone on the path reads them;
* the secret itself: it travels to the places on their stdin (over ssh for
  remote hosts, by MPI broadcast under mpiexec) and sits in their memory;
  whoever can read those, or ptrace the processes, owns the run;
* suppression and delay: an attacker who can drop or hold back messages on
  the path makes work get lost or wait (a gap in the numbers is accepted);
* denial of service in general: junk still costs a receive and, with a valid
  shape, up to one hash of ``max_message_bytes``; ZeroMQ limits single
  frames only, so a peer can still make a place buffer a message of many
  frames each under the limit before it is counted and dropped;
* ordering across a link's replacement: a message of the old link that
  arrives after the first message of the new one is dropped as stale (it
  would have broken the order of the pair anyway).

A place never sends a message to itself through the transport (the runtime
runs local work directly); if it did, the message would go through a link
like any other and be checked the same way.

Messages between one pair of places arrive in the order they were sent (one
TCP connection or one Unix stream per pair); nothing else about order is promised.

A link to a place of this host and network namespace is a Unix stream instead
(:mod:`apgas._core.local_links`, which says why it needs neither the MAC nor the
numbers): chosen when the link opens and kept for its life, written by the
sending thread, read by the thread that receives, which then waits on the
ROUTER and the streams at once.

Why one module of over 500 lines: the wire format, the numbering, the MAC
and the receiver's checks are one protocol, each half of which is only
correct against the other; the chaos hook must number messages as they
are released, inside the same lock. The chaos
test hook keeps exactly that promise and nothing more: it delays every
message at random, so messages of different pairs overtake each other.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import hmac
import logging
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import zmq
from blake3 import blake3

from launcher._curve import keys_of

from ..errors import ApgasError
from . import batch as batching
from . import local_door
from .config import is_wildcard
from .heartbeat import LinkWatcher
from .heartbeat import configure as configure_heartbeat
from .limits import zmq_context
from .local_door import Door, LocalRefused
from .local_links import Backlog, LocalConn, Reader, Spin
from .zmtp_auth import Gatekeeper

__all__ = ["Transport", "HEADER", "ROUTE", "MessageTooLarge", "DEFAULT_MAX_MESSAGE_BYTES"]

log = logging.getLogger(__name__)

#: kind (uint8), source place (int32), a (int64), b (int64)
HEADER = struct.Struct("!Biqq")
#: destination place (int32), sequence number (uint64)
ROUTE = struct.Struct("!iQ")
MAC_BYTES = 32
ENVELOPE_BYTES = MAC_BYTES + HEADER.size + ROUTE.size
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GENERATION_SHIFT = 40  # a link's sequence numbers: (generation << 40) + 1, + 2, ...
_ZERO_COPY_MIN = 64 * 1024
_DIRECT_MAX = 4096  # a body this short is MACed itself: one hash instead of two
_DIRECT, _DIGESTED = b"\x01", b"\x02"
# socket options and flags as plain ints: pyzmq's enums cost microseconds a message
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_NOW, _MORE_NOW = int(zmq.NOBLOCK), int(zmq.NOBLOCK | zmq.SNDMORE)
_LOG_FIRST = 5  # dropped messages logged one by one; later ones are summarized
_LOG_INTERVAL = 10.0  # s between two summary lines
BATCH_S = 0.001  # s: a message this soon after the last one to its place waits for more
_BATCH_ENTRY_MAX = 2048  # bytes: a larger message is sent as itself
_BATCH_MAX = 256  # entries, or 256 KiB: a full batch is sent at once
_BATCH_BYTES_MAX = 256 * 1024

#: a frame of a message's payload (:func:`apgas._core.serialization.dumps`)
Frame = bytes | memoryview
#: handler(kind, source place, a, b, body, buffers)
Handler = Callable[[int, int, int, int, memoryview, list[memoryview]], None]


def recv_frames(sock: zmq.Socket[bytes]) -> list[zmq.Frame]:
    """The frames of the next message, without copies. Frame by frame: ``Frame.more`` is
    cheaper than ``recv_multipart``'s RCVMORE lookups."""
    recv = sock.recv
    frame = recv(copy=False)
    frames = [frame]
    while frame.more:
        frame = recv(copy=False)
        frames.append(frame)
    return frames


class MessageTooLarge(ApgasError):
    """A message is larger than ``max_message_bytes``; it was not sent."""


def _nbytes(frame: Frame) -> int:
    if isinstance(frame, memoryview):
        return frame.nbytes
    if isinstance(frame, (bytes, bytearray)):
        return len(frame)
    return memoryview(frame).nbytes


def _digest(frames: Sequence[Frame], sizes: Sequence[int]) -> bytes | None:
    """What the MAC covers of the payload besides its body: None for one frame under
    4 KiB (MACed itself), else a BLAKE3-256 hash of the frames, their number and their
    lengths (collision resistant; 5.8 GB/s a core where BLAKE2b does 1.0: bulk data)."""
    if len(sizes) == 1 and sizes[0] < _DIRECT_MAX:
        return None
    h = blake3(struct.pack(f"!{len(sizes) + 1}Q", len(sizes), *sizes))
    for frame in frames:
        h.update(frame)
    return h.digest()


class _Mac:
    """Keyed BLAKE2b under the run's secret; the keyed state is made once and copied."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: bytes) -> None:
        self._keyed = hashlib.blake2b(key=secret, digest_size=MAC_BYTES)  # keys up to 64 bytes

    def __call__(self, signed: Frame, body: Frame, digest: bytes | None) -> bytes:
        """MAC of ``signed`` and either a short ``body`` itself or the payload's ``digest``."""
        h = self._keyed.copy()
        h.update(b"".join((signed, _DIRECT, body)) if digest is None
                 else b"".join((signed, _DIGESTED, digest)))
        return h.digest()


class _Link:
    """The DEALER towards one place, the lock its users take, and its sequence numbers.

    The socket is made at the first send (:meth:`Transport._open`), unless the
    link is watched by heartbeats: a place that joins a run of 64 would
    otherwise open 63 connections it may never use.
    """

    __slots__ = ("place", "sock", "lock", "endpoint", "seq", "monitor", "closed", "batch",
                 "batch_bytes", "sent_at", "watch")

    def __init__(self, place: int, endpoint: str, generation: int) -> None:
        self.place = place
        #: under ``lock``: a Unix stream to a place of this host, or a DEALER
        self.sock: LocalConn | zmq.Socket[bytes] | None = None
        self.watch: zmq.Socket[bytes] | None = None  # a local link's heartbeats' DEALER
        self.lock = threading.Lock()
        self.endpoint = endpoint
        self.seq = generation << GENERATION_SHIFT  # of the last message sent; under ``lock``
        self.monitor: zmq.Socket[bytes] | None = None  # the heartbeat watcher's, if this link is watched
        self.closed = False  # under ``lock``: never opened again
        self.batch: list[bytes] = []  # under ``lock``: entries waiting to leave as one message
        self.batch_bytes = 0  # under ``lock``
        self.sent_at = 0.0  # under ``lock``: when the last message left (time.monotonic)


class Transport:
    """Sends and receives authenticated multipart messages for one place."""

    def __init__(self, place_id: int, secret: bytes, interface: str, handler: Handler,
                 chaos: tuple[int, float] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 heartbeat: tuple[float, float] | None = None,
                 on_link_lost: Callable[[int], None] | None = None,
                 watched: Callable[[int], bool] = lambda place_id: True,
                 same_host: bool = True) -> None:
        """``heartbeat`` (interval, timeout) makes every link ping its place
        (:mod:`apgas._core.heartbeat`); ``on_link_lost(place)`` is then called when a
        link for which ``watched(place)`` holds drops its connection. ``same_host``:
        links to places of this host and network namespace take Unix streams
        (:mod:`apgas._core.local_links`)."""
        self.place_id = place_id
        self._heartbeat = heartbeat
        self._watched = watched
        self._watcher = LinkWatcher(on_link_lost, f"apgas-heartbeat-{place_id}") \
            if heartbeat and on_link_lost else None
        self.rejected = 0
        self.rejected_by: collections.Counter[str] = collections.Counter()
        self.max_message_bytes = max_message_bytes
        self._mac = _Mac(secret)
        self._handler = handler
        self._last_seq: dict[int, int] = {}  # source place -> last sequence number accepted
        self._unlogged: collections.Counter[str] = collections.Counter()
        self._summary_at = 0.0
        self._ctx = zmq_context()  # MAX_SOCKETS from RLIMIT_NOFILE: libzmq's 1,023 ends near 340 places
        self._keys = keys_of(secret)
        self._gatekeeper = Gatekeeper(self._ctx, self._keys, f"apgas-zap-{place_id}")
        self._gatekeeper.start()  # before the ROUTER binds: no connection without its check
        self._router = self._ctx.socket(zmq.ROUTER)
        self._keys.serve(self._router)  # nobody without the run's key gets a frame buffered
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.RCVHWM, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # per frame
        # a reply routed to a reply channel that is not connected (yet) fails, not vanishes
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        wildcard = is_wildcard(interface)
        port = self._router.bind_to_random_port("tcp://*" if wildcard else f"tcp://{interface}")
        # bound to every interface: others reach this place by its host name
        self.endpoint = f"tcp://{socket.getfqdn() if wildcard else interface}:{port}"
        self._stop_endpoint = f"inproc://apgas-stop-{id(self)}"
        self._router.bind(self._stop_endpoint)
        self._stop = self._ctx.socket(zmq.DEALER)  # made now: close() works out of descriptors too
        self._secret = secret
        self._door: Door | None = None
        if same_host and hasattr(socket, "SO_PEERCRED"):
            try:
                self._door = Door(secret, place_id, self.endpoint)
            except OSError as e:  # the name is taken: this place goes without
                log.warning("place %d has no same-host path: %s", place_id, e)
        self._backlog = Backlog(f"apgas-backlog-{place_id}")
        self._readers: dict[int, Reader] = {}  # fd -> reader of an accepted link (the receiver's)
        self._ready: collections.deque[tuple[int, int, int, int, list[memoryview]]] = \
            collections.deque()  # read from local links, not yet delivered (the receiver's)
        self._arrived: collections.deque[LocalConn] = collections.deque()  # accepted links
        self._replies_to: dict[int, LocalConn] = {}  # token -> reply channel of a local caller
        self._local_lock = threading.Lock()
        self._poller = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r, select.POLLIN)
        self._poller.register(cast(int, self._router.getsockopt(zmq.FD)), select.POLLIN)
        self._look_local = False  # the receiver looks at local links before the ROUTER
        self._spin = Spin()  # the receiver's (apgas._core.local_links.Spin)
        self._links: dict[int, _Link] = {}
        self._generations: dict[int, int] = {}  # place -> links made to it so far
        self._links_lock = threading.Lock()
        #: called by close() before the context ends (reply channels close their sockets)
        self.on_close: list[Callable[[], None]] = []
        self._batching: set[int] = set()  # places whose link has a batch waiting
        self._flush_cond = threading.Condition()
        self._flush_armed = False  # under _flush_cond: the flusher will look within BATCH_S
        self._running = True
        self._chaos = random.Random(chaos[0] * 1000 + place_id) if chaos else None
        self._chaos_delay = chaos[1] if chaos else 0.0
        self._chaos_cond = threading.Condition()
        # chaos: heap of (due, n, dst, kind, a, b, payload, digest, batch)
        self._held: list[tuple[float, int, int, int, int, int, Sequence[Frame], bytes | None,
                               bool]] = []
        self._held_last: dict[int, float] = {}
        self._held_seq = 0
        self._thread = threading.Thread(target=self._loop, name=f"apgas-net-{place_id}", daemon=True)
        self._receiving = False  # started, and not yet stopped
        self._receiver = 0  # the ident of the thread that received last
        self._stopped = threading.Event()  # set when receiving has stopped

    def start(self, lead: Callable[[Callable[[], bool], Callable[[], bool]], None] | None = None
              ) -> None:
        """Start receiving: on a network thread of the transport's own, or with
        ``lead(receive, waiting)``, by threads that take turns at calling
        :meth:`receive` (:meth:`waiting` is for them too)."""
        self._receiving = True
        threading.Thread(target=self._flush_loop, name=f"apgas-batch-{self.place_id}",
                         daemon=True).start()
        if self._door is not None:
            self._door.start(self._accepted)
        if lead is None:
            self._thread.start()
        else:
            lead(self.receive, self.waiting)
        if self._watcher is not None:
            self._watcher.start()
        if self._chaos is not None:
            threading.Thread(target=self._release_held, name=f"apgas-chaos-{self.place_id}",
                             daemon=True).start()

    def connect(self, place_id: int, endpoint: str) -> None:
        """Open the link to a place (kept if it already goes to ``endpoint``)."""
        with self._links_lock:
            link = self._links.get(place_id)
            if link is not None and link.endpoint == endpoint:
                return  # a new socket would drop what is queued on the old one
            generation = self._generations.get(place_id, -1) + 1
            self._generations[place_id] = generation  # numbers above every earlier link's
            new = self._links[place_id] = _Link(place_id, endpoint, generation)
            if self._watcher is not None and self._watched(place_id):
                with new.lock:
                    self._open(new, place_id)  # heartbeats watch it from now on
        if link is not None:
            self._close_link(link)

    def _open(self, link: _Link, place_id: int) -> LocalConn | zmq.Socket[bytes]:
        """Make and connect the link's socket (caller holds ``link.lock``): a Unix stream
        if the place is of this host, else a DEALER; a watched local link keeps a DEALER
        too, for heartbeats only."""
        if self._door is not None:
            try:
                conn = local_door.connect(self._secret, link.endpoint, local_door.LINK,
                                           self.place_id, place_id)
            except LocalRefused as e:
                log.debug("link to place %d takes ZeroMQ: %s", place_id, e)
            else:
                if self._heartbeat is not None and self._watcher is not None \
                        and self._watched(place_id):
                    link.watch = self._dealer(link, place_id)
                link.sock = conn
                return conn
        sock = link.sock = self._dealer(link, place_id)
        return sock

    def _dealer(self, link: _Link, place_id: int) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        self._keys.connect_as_client(sock)
        if self._heartbeat is not None:
            configure_heartbeat(sock, self._heartbeat)
            if self._watcher is not None and self._watched(place_id):
                link.monitor = self._watcher.watch(place_id, sock)
        sock.connect(link.endpoint)
        return sock

    def disconnect(self, place_id: int, linger_ms: int = 0) -> None:
        """Close the link to a place; ``linger_ms`` lets queued messages still leave."""
        with self._links_lock:
            link = self._links.pop(place_id, None)
        if link is not None:
            self._close_link(link, linger_ms)

    def send(self, dst: int, kind: int, a: int, b: int, payload: Sequence[Frame] = (b"",),
             guard: Callable[[], bool] | None = None, batch: bool = False) -> bool:
        """Send one message; ``payload`` is ``[body, *buffers]``. Thread-safe.

        ``guard`` is checked under the lock that orders the messages to ``dst``:
        if it is false, nothing is sent and False is returned. A message sent
        after ``guard`` turned false (and after the message that made it so)
        can therefore never overtake that message.

        ``batch``: the message may wait to leave with others to ``dst`` as one
        (:mod:`apgas._core.batch`): it does when it is small and comes within
        :data:`BATCH_S` of the last message to ``dst``, until :meth:`flush`, a
        full batch, the next message to ``dst`` that may not wait, or at most
        about :data:`BATCH_S` more. The order of the pair is kept either way.

        Raises :class:`MessageTooLarge` (nothing is sent) if the payload is
        larger than ``max_message_bytes``: the receiver would drop it and cut
        the link.
        """
        sizes = self._sizes(dst, payload)
        digest = _digest(payload, sizes)  # outside the link's lock: large payloads hash in parallel
        batch = batch and digest is None and sizes[0] <= _BATCH_ENTRY_MAX
        if self._chaos is None:
            return self._send_now(dst, kind, a, b, payload, digest, guard, batch)
        return self._hold(dst, kind, a, b, payload, digest, guard, batch)

    def _sizes(self, dst: int, payload: Sequence[Frame]) -> list[int]:
        """The sizes of a message's frames; :class:`MessageTooLarge` if they pass the limit."""
        sizes = [_nbytes(payload[0])] if len(payload) == 1 else [_nbytes(f) for f in payload]
        total = sum(sizes)
        if total > self.max_message_bytes:
            raise MessageTooLarge(
                f"a message of {total:,} bytes from place {self.place_id} to place {dst} is larger "
                f"than the limit of {self.max_message_bytes:,} bytes; raise the option "
                "max_message_bytes (APGAS_MAX_MESSAGE_BYTES) or send the data in smaller pieces")
        return sizes

    def endpoint_of(self, place_id: int) -> str | None:
        """The endpoint of the link to a place, if there is one."""
        link = self._links.get(place_id)
        return None if link is None else link.endpoint

    def secure(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` (before it connects to a place) a client of the run's CURVE key
        (:mod:`launcher._curve`): the reply channels' sockets."""
        self._keys.connect_as_client(sock)

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The place's ZeroMQ context (reply channels make their sockets in it)."""
        return self._ctx

    def reject_channel_message(self, frames: Sequence[zmq.Frame], why: str) -> None:
        """Count and log a message a reply channel refused, as the ROUTER's own."""
        self._reject([None, *frames], why)

    def route(self, dst: int, channel: bytes, kind: int, a: int, b: int,
              payload: Sequence[Frame]) -> bool:
        """Send a message through this place's ROUTER to a reply channel
        (:mod:`apgas._core.replies`) of place ``dst`` that is connected to it; only
        for the thread that receives now. False if the channel is not connected (yet)
        or cannot take it."""
        frames = self.unnumbered(dst, kind, self.place_id, a, b, payload)
        if frames is None:
            return False
        send, last = self._router.send, len(frames) - 1
        try:
            send(channel, _MORE_NOW)  # refused here if the channel is unknown or full
            for i, frame in enumerate(frames):
                send(frame, _MORE_NOW if i < last else _NOW)
        except zmq.ZMQError:  # EHOSTUNREACH: not connected (yet); EAGAIN: full
            return False
        return True

    def unnumbered(self, dst: int, kind: int, src: int, a: int, b: int,
                   payload: Sequence[Frame]) -> list[Frame] | None:
        """The signed frames of a message to a reply channel at place ``dst``, or None
        if it is too large. Unnumbered: a channel takes one message, the awaited one,
        and the ordinary path refuses number 0."""
        sizes = [_nbytes(f) for f in payload]
        if sum(sizes) > self.max_message_bytes:
            return None
        digest = _digest(payload, sizes)
        envelope = self._envelope(HEADER.pack(kind, src, a, b) + ROUTE.pack(dst, 0), payload, digest)
        return [envelope] if digest is None else [envelope, *payload]

    def _envelope(self, signed: bytes, payload: Sequence[Frame], digest: bytes | None) -> bytes:
        """A message's first frame: its MAC and ``signed`` (header and route), and the
        body itself when it is short enough to be MACed directly (``digest`` None)."""
        if digest is None:
            body = payload[0]
            return b"".join((self._mac(signed, body, None), signed, body))
        return self._mac(signed, payload[0], digest) + signed

    def flush(self) -> bool:
        """Send every batch that waits (for a thread about to wait); True if one left."""
        if not self._batching:
            return False
        sent = False
        for dst in list(self._batching):
            link = self._links.get(dst)
            if link is None:
                self._batching.discard(dst)
                continue
            try:
                with link.lock:
                    if link.batch and link.sock is not None and not link.sock.closed:
                        self._put_batch(link, link.sock, dst)
                        sent = True
            except zmq.ZMQError as err:
                if self._running:
                    log.error("sending to place %d failed: %s", dst, err)
        return sent

    def close(self, linger_ms: int = 0) -> None:
        """Stop; with ``linger_ms`` > 0, wait that long for queued messages to leave."""
        if not self._running:
            return
        if linger_ms > 0:
            self._flush_held()
        self.flush()
        self._running = False
        with self._chaos_cond:
            self._chaos_cond.notify_all()
        with self._flush_cond:
            self._flush_cond.notify_all()
        if self._receiving and threading.get_ident() != self._receiver:
            self._stop.connect(self._stop_endpoint)  # wakes the blocking receive
            self._stop.send(b"stop")
            self._stopped.wait(timeout=2.0)
        self._stop.close(linger=0)
        if self._door is not None:
            self._door.close()
        with self._links_lock:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            self._close_link(link, linger_ms)
        self._backlog.stop()
        with self._local_lock:
            conns = [*self._replies_to.values(), *self._arrived,
                     *(r.conn for r in self._readers.values())]
            self._replies_to.clear()
            self._arrived.clear()
            self._readers.clear()
            os.close(self._wake_w)  # under the lock: the door's thread writes no more
            self._wake_w = -1
        for conn in conns:
            conn.close()
        os.close(self._wake_r)
        if self._watcher is not None:
            self._watcher.stop()
        for hook in self.on_close:
            hook()
        self._router.close(linger=0)
        self._gatekeeper.stop()
        self._ctx.term()
        if self._unlogged:
            self._log_summary(time.monotonic())

    # -- sending ----------------------------------------------------------------
    def _send_now(self, dst: int, kind: int, a: int, b: int, payload: Sequence[Frame],
                  digest: bytes | None, guard: Callable[[], bool] | None = None,
                  batch: bool = False) -> bool:
        link = self._links.get(dst)
        if link is None:
            log.debug("message to place %d dropped: no link (place gone)", dst)
            return guard is None
        try:
            with link.lock:
                if guard is not None and not guard():
                    return False
                sock = link.sock
                if sock is None:
                    if link.closed:
                        return True
                    sock = self._open(link, dst)
                elif sock.closed:
                    return True
                now = time.monotonic()
                if batch and (link.batch or now - link.sent_at < BATCH_S):
                    entry = batching.encode_entry(kind, a, b, payload[0])
                    link.batch.append(entry)
                    link.batch_bytes += len(entry)
                    if len(link.batch) >= _BATCH_MAX or link.batch_bytes >= _BATCH_BYTES_MAX:
                        self._put_batch(link, sock, dst)
                    elif len(link.batch) == 1:
                        self._batching.add(dst)
                        self._arm_flusher()
                    return True
                if link.batch:  # what waits leaves first: the order of the pair
                    self._put_batch(link, sock, dst)
                self._put(link, sock, dst, kind, a, b, payload, digest)
                link.sent_at = now
        except zmq.ZMQError as err:
            if self._running:
                log.error("sending to place %d failed: %s", dst, err)
        return True

    def _put(self, link: _Link, sock: LocalConn | zmq.Socket[bytes], dst: int, kind: int, a: int,
             b: int, payload: Sequence[Frame], digest: bytes | None) -> None:
        """Number, sign and send one message (the caller holds ``link.lock``); on a Unix
        stream, write it as it is (:mod:`apgas._core.local_links`)."""
        if type(sock) is LocalConn:
            link.seq += 1  # counts the link's messages (the stream needs no numbers)
            if not sock.put(self._backlog, kind, self.place_id, a, b, payload) and self._running:
                log.debug("message to place %d dropped: its same-host link broke", dst)
            return
        sock = cast(zmq.Socket[bytes], sock)
        # numbered here, under the lock: in the order the messages go on the wire
        link.seq += 1
        envelope = self._envelope(HEADER.pack(kind, self.place_id, a, b) + ROUTE.pack(dst, link.seq),
                                  payload, digest)
        if digest is None:  # one frame: envelope and body
            sock.send(envelope)
            return
        sock.send(envelope, zmq.SNDMORE)
        last = len(payload) - 1
        for i, frame in enumerate(payload):
            big = getattr(frame, "nbytes", 0) >= _ZERO_COPY_MIN
            sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)

    def _put_batch(self, link: _Link, sock: LocalConn | zmq.Socket[bytes], dst: int) -> None:
        """Send the link's waiting entries as one message (the caller holds ``link.lock``)."""
        body = b"".join(link.batch)
        count = len(link.batch)
        link.batch.clear()
        link.batch_bytes = 0
        self._batching.discard(dst)
        link.sent_at = time.monotonic()
        self._put(link, sock, dst, batching.BATCH, count, 0, (body,), _digest((body,), (len(body),)))

    def _arm_flusher(self) -> None:
        """Make sure a batch that waits leaves within about BATCH_S (the flusher thread)."""
        if self._flush_armed:
            return
        with self._flush_cond:
            if not self._flush_armed:
                self._flush_armed = True
                self._flush_cond.notify()

    def _flush_loop(self) -> None:
        """Send waiting batches every BATCH_S while there are any; sleep otherwise."""
        while True:
            with self._flush_cond:
                while self._running and not self._flush_armed:
                    self._flush_cond.wait()
                if not self._running:
                    return
            time.sleep(BATCH_S)
            with self._flush_cond:
                self._flush_armed = False
            if self.flush():  # a stream goes on: look again without being woken
                with self._flush_cond:
                    self._flush_armed = True

    def _close_link(self, link: _Link, linger_ms: int = 0) -> None:
        if link.monitor is not None and self._watcher is not None:
            self._watcher.forget(link.monitor)  # a link closed on purpose is not lost
        with self._local_lock:  # the place's reply channels here
            gone = [t for t, c in self._replies_to.items() if c.place == link.place]
            conns = [self._replies_to.pop(t) for t in gone]
        for conn in conns:
            self._forget(conn)
        with link.lock:
            link.closed = True
            if link.sock is not None:
                if link.batch and not link.sock.closed:
                    try:
                        self._put_batch(link, link.sock, link.place)
                    except zmq.ZMQError:
                        pass
                if isinstance(link.sock, LocalConn):
                    link.sock.close()  # what was written is read by the place all the same
                else:
                    link.sock.close(linger=linger_ms)
            if link.watch is not None:
                link.watch.close(linger=0)

    def _hold(self, dst: int, kind: int, a: int, b: int, payload: Sequence[Frame], digest: bytes | None,
              guard: Callable[[], bool] | None = None, batch: bool = False) -> bool:
        """Chaos hook: delay at random, keeping the order within each pair.

        The sequence number is given when the message is released (by
        :meth:`_send_now`), which happens in the order of the pair.
        """
        rng = self._chaos
        assert rng is not None, "messages are held only when chaos is configured"
        with self._chaos_cond:
            if guard is not None and not guard():
                return False
            due = max(time.monotonic() + rng.random() * self._chaos_delay,
                      self._held_last.get(dst, 0.0))
            self._held_last[dst] = due
            self._held_seq += 1
            heapq.heappush(self._held, (due, self._held_seq, dst, kind, a, b, payload, digest, batch))
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
                dst, kind, a, b, payload, digest, batch = heapq.heappop(self._held)[2:]
                self._send_now(dst, kind, a, b, payload, digest, None, batch)

    def _flush_held(self) -> None:
        """Chaos hook: send everything still held, in order, before an orderly close."""
        with self._chaos_cond:
            while self._held:
                self._send_now(*heapq.heappop(self._held)[2:8])

    # -- receiving (one thread at a time: the own network thread, or a pool's leader) ----
    def _loop(self) -> None:
        while self.receive():
            pass

    def receive(self) -> bool:
        """Read one message and hand it to the handler if it passes the checks; False
        once the transport is closing. Called by one thread at a time.

        With a same-host path, the thread waits on the ROUTER and the Unix streams
        at once (``poll``; the ROUTER's descriptor is edge-triggered, so its events
        are read before every wait), and takes them in turn so that neither starves."""
        self._receiver = threading.get_ident()
        try:
            if self._door is None:
                frames = recv_frames(self._router)
            else:
                spin_until: float | None = None
                while True:
                    if self._ready or (self._look_local and self._read_local(0)):
                        self._look_local = False
                        if not self._running:
                            return self._stop_receiving()
                        self._deliver_local(*self._ready.popleft())
                        return True
                    events = self._router.getsockopt(_EVENTS)
                    if isinstance(events, int) and events & _POLLIN:
                        frames = recv_frames(self._router)
                        self._look_local = bool(self._readers)
                        break
                    if spin_until is None:
                        spin_until = self._spin.deadline() if self._readers else 0.0
                    if spin_until and time.perf_counter() < spin_until:
                        # the next message of a conversation comes within the spin
                        if self._read_local(0):
                            self._spin.ended(True)
                        continue
                    if spin_until:
                        spin_until = 0.0
                        self._spin.ended(False)
                    self._read_local(-1)
        except zmq.ContextTerminated:
            return self._stop_receiving()
        except Exception:  # a bug here would hang every finish: make it loud
            log.critical("receiving failed", exc_info=True)
            raise
        if not self._running:
            return self._stop_receiving()
        self._deliver(frames)
        return True

    def _read_local(self, timeout: int) -> bool:
        """Wait up to ``timeout`` ms (-1: until something comes) for the ROUTER, a local
        link or a new one; read the links that have data. True if a message is ready."""
        for fd, _ in self._poller.poll(timeout):
            if fd == self._wake_r:
                os.read(self._wake_r, 4096)
                with self._local_lock:
                    while self._arrived:
                        conn = self._arrived.popleft()
                        self._readers[conn.fileno] = Reader(conn, self.max_message_bytes)
                        self._poller.register(conn.fileno, select.POLLIN)
                continue
            reader = self._readers.get(fd)
            if reader is None:
                continue  # the ROUTER: its events are read by receive()
            why = reader.read(self._ready)
            if why is not None:
                if why != "closed by the peer":
                    self._reject([None], f"same-host link of place {reader.conn.place}: {why}")
                self._poller.unregister(fd)
                del self._readers[fd]
                self._forget(reader.conn)
        return bool(self._ready)

    def _deliver_local(self, kind: int, src: int, a: int, b: int, parts: list[memoryview]) -> None:
        """Hand on a message read from a local link (its stream authenticated its source)."""
        items = self._items(kind, a, b, parts, [None])
        if items is not None:
            self._hand_on(src, items, parts[1:])

    def _items(self, kind: int, a: int, b: int, parts: list[memoryview],
               frames: Sequence[zmq.Frame | None]) -> list[tuple[int, int, int, memoryview]] | None:
        """The messages a message holds: itself, or a batch's entries (None, rejected,
        if the batch is malformed: nothing of it is handed on)."""
        if kind != batching.BATCH:
            return [(kind, a, b, parts[0])]
        try:
            if len(parts) != 1:
                raise batching.MalformedBatch("a batch of more than one frame")
            return batching.entries(parts[0], a)
        except batching.MalformedBatch as e:
            self._reject(frames, f"malformed batch: {e}")
            return None

    def _hand_on(self, src: int, items: list[tuple[int, int, int, memoryview]],
                 buffers: list[memoryview]) -> None:
        for kind, a, b, body in items:
            try:
                self._handler(kind, src, a, b, body, buffers)
            except Exception:
                log.exception("handling message kind %d from place %d failed", kind, src)

    def waiting(self) -> bool:
        """Whether a message waits to be read; only for the thread that receives."""
        if self._ready:
            return True
        events = self._router.getsockopt(_EVENTS)  # plain ints: no enum on this path
        if isinstance(events, int) and events & _POLLIN:
            return True
        return bool(self._readers) and self._read_local(0)

    # -- the same-host path's connections (apgas._core.local_links) ---------------------
    def _accepted(self, purpose: bytes, conn: LocalConn, token: int) -> None:
        """The door's thread: a link is read by the receiver from now on; a reply
        channel takes the replies to its caller."""
        with self._local_lock:
            if not self._running or self._wake_w < 0:
                old: LocalConn | None = conn
            elif purpose == local_door.LINK:
                self._arrived.append(conn)
                old = None
                try:
                    os.write(self._wake_w, b"c")  # under the lock: close() shuts it under it
                except BlockingIOError:
                    pass  # full: the receiver is woken already
            else:
                old = self._replies_to.get(token)
                self._replies_to[token] = conn
        if old is not None:
            self._forget(old)

    def _forget(self, conn: LocalConn) -> None:
        conn.close()
        if self._door is not None:
            self._door.forget()

    def reply_local(self, dst: int, token: int, kind: int, a: int, b: int,
                    payload: Sequence[Frame]) -> bool:
        """Send a reply straight to the reply channel ``token`` of a caller at place
        ``dst`` of this host, from any thread; False if it has no local channel here.
        Raises :class:`MessageTooLarge` as :meth:`send` does."""
        conn = self._replies_to.get(token)
        if conn is None or conn.place != dst:
            return False
        self._sizes(dst, payload)
        if conn.put(self._backlog, kind, self.place_id, a, b, payload):
            return True
        with self._local_lock:
            if self._replies_to.get(token) is conn:
                del self._replies_to[token]
        self._forget(conn)
        return False

    def channel_link(self, dst: int, token: int) -> LocalConn | None:
        """A reply channel's own Unix stream to place ``dst`` if the link there is one
        (None: the channel takes ZeroMQ)."""
        link = self._links.get(dst)
        if link is None or type(link.sock) is not LocalConn:
            return None
        try:
            return local_door.connect(self._secret, link.endpoint, local_door.CHANNEL,
                                       self.place_id, dst, token)
        except LocalRefused as e:
            log.debug("reply channel to place %d takes ZeroMQ: %s", dst, e)
            return None

    def _stop_receiving(self) -> bool:
        self._receiving = False
        self._stopped.set()
        return False

    def open_message(self, frames: Sequence[zmq.Frame], numbered: bool = True
                     ) -> tuple[int, int, int, int, int, list[memoryview]] | str:
        """Check a message's frames ``[mac + header + route (+ body), *payload]``: shape,
        size, destination, sequence number (if ``numbered``) and MAC. Returns (kind,
        source, a, b, sequence number, [body, *buffers]), or why it is refused."""
        if not frames or len(frames[0]) < ENVELOPE_BYTES or \
                (len(frames) > 1 and len(frames[0]) != ENVELOPE_BYTES):
            return "malformed frames"
        first = frames[0].buffer
        if len(frames) == 1:  # one frame: envelope and a short body
            parts = [first[ENVELOPE_BYTES:]]
            sizes = [parts[0].nbytes]
            if sizes[0] >= _DIRECT_MAX:
                return "malformed frames"
        else:
            parts = [f.buffer for f in frames[1:]]
            sizes = [parts[0].nbytes] if len(parts) == 1 else [p.nbytes for p in parts]
            if sum(sizes) > self.max_message_bytes:
                return "too large"
        signed = first[MAC_BYTES:ENVELOPE_BYTES]
        dst, seq = ROUTE.unpack_from(signed, HEADER.size)
        if dst != self.place_id:
            return "wrong destination"
        kind, src, a, b = HEADER.unpack_from(signed)
        if numbered and seq <= self._last_seq.get(src, 0):
            return "replayed or stale: old sequence number"
        if not hmac.compare_digest(self._mac(signed, parts[0], _digest(parts, sizes)),
                                   first[:MAC_BYTES]):
            return "bad MAC"
        return kind, src, a, b, seq, parts

    def _deliver(self, frames: list[zmq.Frame]) -> None:
        # frames: [routing id, mac + header + route (+ body), *payload frames]
        opened = self.open_message(frames[1:])
        if isinstance(opened, str):
            self._reject(frames, opened)
            return
        kind, src, a, b, seq, parts = opened
        items = self._items(kind, a, b, parts, frames)
        if items is None:
            return
        self._last_seq[src] = seq
        self._hand_on(src, items, parts[1:])

    def _reject(self, frames: Sequence[zmq.Frame | None], why: str) -> None:
        """Count a dropped message; log the first few, then a summary every interval."""
        self.rejected += 1
        self.rejected_by[why] += 1
        if self.rejected <= _LOG_FIRST:
            more = f"; later drops are summarized every {_LOG_INTERVAL:.0f} s" \
                if self.rejected == _LOG_FIRST else ""
            log.warning("dropped a message (%s, %d frames); it was not unpickled%s", why,
                        len(frames) - 1, more)
            self._summary_at = time.monotonic()
            return
        self._unlogged[why] += 1
        now = time.monotonic()
        if now - self._summary_at >= _LOG_INTERVAL:
            self._log_summary(now)

    def _log_summary(self, now: float) -> None:
        counts = ", ".join(f"{n} {why}" for why, n in self._unlogged.most_common())
        log.warning("dropped %d more message(s) in %.0f s (%s); %d dropped in all; none was "
                    "unpickled", sum(self._unlogged.values()), now - self._summary_at, counts,
                    self.rejected)
        self._unlogged.clear()
        self._summary_at = now
