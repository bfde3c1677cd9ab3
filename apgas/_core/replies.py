"""Reply channels: the thread that calls ``at`` receives its own reply.

Before, a reply reached the caller in two steps: the thread that receives for
the place read it, then woke the caller. Now a calling thread has a *reply
channel*: a DEALER socket of its own with a routing id of its own (``R`` and 8
random bytes, the *token*), connected to the ROUTER of each place it calls
and bound in-process. The ``at`` request travels on
the ordinary link, numbered and in the order of the pair, and carries the
token; the target routes the reply through its ROUTER straight to the
channel, and the caller, blocked on its channel, wakes once with the reply
in hand. Nobody else at the calling place wakes.

The target can do so when the thread that runs the call still receives for
its place (the ROUTER is its socket; :meth:`WorkerPool.while_receiving
<apgas._core.pool.WorkerPool.while_receiving>`), and when the channel's
connection is up (a first call to a place may beat it). Otherwise the reply
takes the link as before, and the thread that delivers it at the calling
place routes it on into the channel through its own ROUTER: one path for the
caller either way. It routes it through an in-process socket connected to
the channel's own endpoint, not through its ROUTER: a ROUTER learns an
in-process peer's routing id only later, and would refuse the reply.

What a channel accepts: a message that passes the transport's checks
(:meth:`Transport.open_message <apgas._core.transport.Transport.open_message>`:
shape, size, destination, MAC under the run's secret) and is the reply it
waits for: ``AT_REPLY`` from the called place, its token and its request id.
Request ids are unique within a run at a place and a run has its own secret,
so a reply sent again (or late) never matches a later wait, and is dropped
before anything is unpickled; that is why channel messages need no sequence
number (they carry 0, which the ordinary path always refuses).

A channel connects to a place when a call comes within
:data:`CONVERSATION_S` of the last one there (calls to every place in turn
connect nowhere), and only ``at`` uses one: the reply to
``immediate_at`` is never sent by the thread that receives, so it takes the
link and wakes its caller as before. Bounds: at most :data:`MAX_CHANNELS`
channels a place (beyond, a call takes the link both ways), each connected
to at most :data:`MAX_PEERS` places (the least recently called is
disconnected); the channels of threads that ended
are closed when a channel is made, and all of them when the transport closes.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import cast

import zmq

from .local_links import LocalConn, Reader, Spin
from .transport import Frame, Transport, recv_frames

__all__ = ["ReplyChannels", "Channel", "MAX_CHANNELS", "MAX_PEERS"]

log = logging.getLogger(__name__)

MAX_CHANNELS = 64
MAX_PEERS = 64
MAX_CALLED = 4096  # places called, not connected, that a channel remembers
CONVERSATION_S = 0.05  # a call this soon after the last one to its place connects the channel
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum on this path
LOOK_MS = 100
SPIN_S = 50e-6  # a caller of a place of this host reads its stream this long before it sleeps  # a waiting caller looks whether its call was given up (a death) this often


class Channel:
    """One thread's reply socket; used by that thread only, under ``lock``."""

    def __init__(self, transport: Transport, thread: threading.Thread) -> None:
        self.token = int.from_bytes(os.urandom(8), "big") >> 2 or 1  # 62 bits, shifted into `a`
        self.thread = weakref.ref(thread)
        self.lock = threading.Lock()
        self.closed = False
        self._transport = transport
        # endpoints, least recently called first -> the place's own stream if it is of this host
        self._peers: OrderedDict[str, LocalConn | None] = OrderedDict()
        self._local: dict[int, Reader] = {}  # place -> reader of its stream
        self._by_fd: dict[int, Reader] = {}
        self._inbox: collections.deque[tuple[int, int, int, int, list[memoryview]]] = \
            collections.deque()
        self._poller: select.poll | None = None
        self._spin = Spin()
        self._called: OrderedDict[str, float] = OrderedDict()  # not connected: last call
        sock = transport.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, routing_id(self.token))
        sock.setsockopt(zmq.RCVTIMEO, LOOK_MS)
        sock.setsockopt(zmq.MAXMSGSIZE, transport.max_message_bytes)
        transport.secure(sock)
        self.endpoint = f"inproc://apgas-reply-{id(transport)}-{self.token}"
        sock.bind(self.endpoint)  # replies that came by the link are routed on to here
        self._sock = sock

    def reach(self, endpoint: str, place: int) -> None:
        """Be connected to ``place``, whose ROUTER is at ``endpoint`` (before the request
        leaves), once calls there come within CONVERSATION_S of each other: calls to
        every place in turn (a broadcast, a collection) make no connections, their
        replies come by the link. A place of this host is reached by a Unix stream of
        the channel's own (:meth:`Transport.channel_link`), which its replies take
        from whichever thread sends them."""
        if endpoint in self._peers:
            self._peers.move_to_end(endpoint)
            return
        now = time.monotonic()
        last = self._called.pop(endpoint, None)
        if last is None or now - last > CONVERSATION_S:
            self._called[endpoint] = now
            if len(self._called) > MAX_CALLED:
                self._called.popitem(last=False)
            return
        if len(self._peers) >= MAX_PEERS:
            oldest, conn = self._peers.popitem(last=False)
            if conn is not None:
                self._drop(conn)
            else:
                try:
                    self._sock.disconnect(oldest)
                except zmq.ZMQError:
                    pass
        conn = self._transport.channel_link(place, self.token)
        if conn is None:
            self._sock.connect(endpoint)
        else:
            if self._poller is None:
                self._poller = select.poll()
                self._poller.register(cast(int, self._sock.getsockopt(zmq.FD)), select.POLLIN)
            self._local[place] = self._by_fd[conn.fileno] = \
                Reader(conn, self._transport.max_message_bytes)
            self._poller.register(conn.fileno, select.POLLIN)
        self._peers[endpoint] = conn

    def _drop_other(self, frames: Sequence[zmq.Frame], got: tuple[int, ...],
                    awaited: tuple[int, int, int, int]) -> None:
        """Drop a message that is not the awaited reply, never unpickled: the reply to
        an earlier request of this channel whose wait ended (a Ctrl-C) is expected."""
        if got[:3] == awaited[:3] and got[3] < awaited[3]:
            log.debug("dropped the late reply to request %d (its wait ended)", got[3])
        else:
            self._transport.reject_channel_message(frames, "not the awaited reply")

    def _drop(self, conn: LocalConn) -> None:
        """Close the stream to one place (its replies take the link from then on)."""
        reader = self._by_fd.pop(conn.fileno, None)
        if reader is not None:
            self._local.pop(conn.place, None)
            if self._poller is not None:
                self._poller.unregister(conn.fileno)
        conn.close()

    def wait(self, src: int, kind: int, req: int, settled: Callable[[], bool]
             ) -> tuple[memoryview, list[memoryview]] | None:
        """The reply ``kind`` to request ``req`` from place ``src``: (body, buffers), or
        None once ``settled()`` (an error, or a reply the channel could not take) or
        the transport closed."""
        if src in self._local:
            return self._wait_local(src, kind, req, settled)
        while True:
            try:
                frames = recv_frames(self._sock)
            except zmq.Again:
                if settled():
                    return None
                continue
            except zmq.ContextTerminated:
                self.close()
                return None
            opened = self._transport.open_message(frames, numbered=False)
            if isinstance(opened, str):
                self._transport.reject_channel_message(frames, opened)
                continue
            got_kind, got_src, a, b, _, parts = opened
            if (got_kind, got_src, a, b) == (kind, src, self.token, req):
                return parts[0], parts[1:]
            self._drop_other(frames, (got_kind, got_src, a, b), (kind, src, self.token, req))

    def _wait_local(self, src: int, kind: int, req: int, settled: Callable[[], bool]
                    ) -> tuple[memoryview, list[memoryview]] | None:
        """As :meth:`wait`, for a place of this host: its stream and the channel's socket
        (a reply that took the link comes there) at once."""
        awaited = (kind, src, self.token, req)
        spin_until = self._spin.deadline()
        poller = self._poller
        assert poller is not None, "a channel with a stream polls"
        while True:
            while self._inbox:
                got_kind, got_src, a, b, frames = self._inbox.popleft()
                if (got_kind, got_src, a, b) == awaited:
                    return frames[0], frames[1:]
                self._drop_other([], (got_kind, got_src, a, b), awaited)
            try:  # the socket's descriptor is edge-triggered: its events first, then wait
                events = self._sock.getsockopt(_EVENTS)
                if isinstance(events, int) and events & _POLLIN:
                    got = recv_frames(self._sock)
                    opened = self._transport.open_message(got, numbered=False)
                    if isinstance(opened, str):
                        self._transport.reject_channel_message(got, opened)
                    elif opened[:4] == awaited:
                        return opened[5][0], opened[5][1:]
                    else:
                        self._drop_other(got, opened[:4], awaited)
                    continue
            except zmq.ZMQError:  # the context ends: the transport closed
                self.close()
                return None
            reader = self._local.get(src)
            if reader is not None and spin_until:
                if time.perf_counter() < spin_until:
                    self._read(reader)  # a short call's reply comes within the spin
                    if self._inbox:
                        self._spin.ended(True)
                    continue
                spin_until = 0.0
                self._spin.ended(False)
            ready = poller.poll(LOOK_MS)
            for fd, _ in ready:
                reader = self._by_fd.get(fd)
                if reader is not None:
                    self._read(reader)
            if not ready and settled():
                return None
            if src not in self._local and not self._inbox:
                return self.wait(src, kind, req, settled)  # its stream ended: by the link

    def _read(self, reader: Reader) -> None:
        """Read what a place's stream holds into the inbox; drop the stream at its end."""
        why = reader.read(self._inbox)
        if why is not None:  # the place is gone, or broke the protocol
            if why != "closed by the peer":
                self._transport.reject_channel_message([], why)
            self._drop(reader.conn)
            self._peers = OrderedDict((e, c) for e, c in self._peers.items() if c is not reader.conn)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for reader in list(self._by_fd.values()):
                self._drop(reader.conn)
            self._sock.close(linger=0)


def routing_id(token: int) -> bytes:
    """The routing id of the channel with ``token`` (ZeroMQ's own ids begin with 0)."""
    return b"R" + token.to_bytes(8, "big")


class ReplyChannels:
    """The reply channels of one place's threads, made at their first ``at``."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._by_thread: dict[int, Channel] = {}
        self._by_token: dict[int, Channel] = {}
        self._forwarders: dict[int, zmq.Socket[bytes]] = {}  # token -> socket connected to it
        self._closed = False

    def forward(self, token: int, src: int, kind: int, req: int, payload: Sequence[Frame]) -> bool:
        """Hand a reply that came by the link to the channel with ``token`` (signed as
        from ``src``); False if there is no such channel or it cannot take it."""
        frames = self._transport.unnumbered(self._transport.place_id, kind, src, token, req,
                                            payload)
        with self._lock:
            channel = self._by_token.get(token)
            if frames is None or channel is None or channel.closed:
                return False
            sock = self._forwarders.get(token)
            if sock is None:
                sock = self._forwarders[token] = self._transport.context.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(channel.endpoint)  # in-process: usable at once
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                return False
            return True

    def mine(self) -> Channel | None:
        """This thread's channel (made now if need be), or None: too many, or closing."""
        ident = threading.get_ident()
        channel = self._by_thread.get(ident)
        if channel is not None and not channel.closed and channel.thread() is threading.current_thread():
            return channel  # (an ident is reused by a later thread: that one gets its own)
        with self._lock:
            if self._closed:
                return None
            self._sweep()
            if len(self._by_thread) >= MAX_CHANNELS and ident not in self._by_thread:
                return None
            try:
                channel = Channel(self._transport, threading.current_thread())
            except zmq.ZMQError as e:  # out of sockets: the link will do
                log.debug("no reply channel: %s", e)
                return None
            self._by_thread[ident] = channel
            self._by_token[channel.token] = channel
            return channel

    def _sweep(self) -> None:  # holds self._lock
        """Close the channels of threads that ended (their idents may be reused)."""
        for ident, channel in list(self._by_thread.items()):
            thread = channel.thread()
            if channel.closed or thread is None or not thread.is_alive():
                if channel.lock.acquire(blocking=False):
                    self._close(channel)
                    channel.lock.release()
                    del self._by_thread[ident]

    def close(self) -> None:
        """Close every channel not in use; one in use closes itself when the context ends."""
        with self._lock:
            self._closed = True
            for channel in self._by_thread.values():
                if channel.lock.acquire(blocking=False):
                    self._close(channel)
                    channel.lock.release()
            for sock in self._forwarders.values():
                sock.close(linger=0)
            self._forwarders.clear()
            self._by_thread.clear()

    def _close(self, channel: Channel) -> None:  # holds self._lock and channel.lock
        channel.close()
        self._by_token.pop(channel.token, None)
        sock = self._forwarders.pop(channel.token, None)
        if sock is not None:
            sock.close(linger=0)
