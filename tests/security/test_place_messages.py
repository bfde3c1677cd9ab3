"""Place messages cannot be replayed, redirected, forged or inflated (issue 16, item 5).

Each test plays one attack against real places and checks both that it is
refused and that the computation goes on unharmed. Messages are captured by
wrapping the DEALER of a link at place 0 (what the transport puts on the
wire) and sent again from a fresh ZeroMQ socket, as an attacker on the
machine would. Since places speak CURVE (:mod:`apgas._core.zmtp_auth`), a
socket without the run's key is refused at the handshake (see
test_zmtp_auth.py); so the injecting socket here holds the key: these tests
show what the MAC and the sequence numbers still refuse from a peer past the
handshake. The runs keep every link on TCP (``same_host=False``): a link between
places of one host is a Unix stream, which has no wire to tap or inject into, and
whose own checks are tested in tests/test_local_links.py.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import apgas
from apgas._core.config import load_config
from apgas._core.runtime import TABLE, TASK, current
from apgas._core.transport import ENVELOPE_BYTES, HEADER, MAC_BYTES, ROUTE, Transport

MiB = 1024 * 1024

pytestmark = pytest.mark.timeout(60)

# -- at the places ---------------------------------------------------------------------------

_count = 0
_lock = threading.Lock()


def bump() -> None:
    global _count
    with _lock:
        _count += 1


def count() -> int:
    return _count


def status() -> tuple[str, int, dict]:
    """This place's endpoint, its rejected counter and the counts per reason."""
    t = current().transport
    return t.endpoint, t.rejected, dict(t.rejected_by)


def peak_rss_kib() -> int:
    """VmHWM of this place: the most resident memory it ever had."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


def whoami() -> int:
    return apgas.here().id


# -- capture and replay ----------------------------------------------------------------------

class Wiretap:
    """Stands in for a link's DEALER: records every message it sends, then sends it.

    A short message travels as one frame, envelope and body; it is recorded as
    the two (a place accepts that split too: the MAC covers the same bytes)."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._parts: list[bytes] = []
        self.messages: list[list[bytes]] = []

    @property
    def closed(self) -> bool:
        return self._sock.closed

    def send(self, frame, flags: int = 0, copy: bool = True):
        self._parts.append(bytes(frame))
        if len(self._parts) == 1 and len(self._parts[0]) > ENVELOPE_BYTES and not flags & zmq.SNDMORE:
            self._parts = [self._parts[0][:ENVELOPE_BYTES], self._parts[0][ENVELOPE_BYTES:]]
        if not flags & zmq.SNDMORE:
            self.messages.append(self._parts)
            self._parts = []
        return self._sock.send(frame, flags, copy=copy)

    def close(self, linger=None) -> None:
        self._sock.close(linger=linger)

    def of_kind(self, kind: int) -> list[list[bytes]]:
        return [m for m in self.messages if HEADER.unpack_from(m[0], MAC_BYTES)[0] == kind]


def tap(place: int) -> Wiretap:
    """Put a wiretap on place 0's link to ``place``."""
    link = current().transport._links[place]
    with link.lock:
        wiretap = Wiretap(link.sock)
        link.sock = wiretap
    return wiretap


def keyed(sock: zmq.Socket, transport: Transport | None = None) -> zmq.Socket:
    """``sock``, made a client of the run's CURVE key (``transport``'s, else this place's)."""
    (transport or current().transport).secure(sock)
    return sock


def inject(endpoint: str, *messages: list[bytes], transport: Transport | None = None) -> None:
    """Send ``messages`` from a fresh socket past the handshake (see the module)."""
    ctx = zmq.Context()
    sock = keyed(ctx.socket(zmq.DEALER), transport)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    for frames in messages:
        sock.send_multipart(frames)
    sock.close()
    ctx.term()


def wait_rejected(place: int, at_least: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        _, rejected, by = apgas.at(place, status)
        if rejected >= at_least:
            return by
        assert time.monotonic() < deadline, f"place {place} rejected {rejected} < {at_least}: {by}"
        time.sleep(0.02)


def route(message: list[bytes]) -> tuple[int, int]:
    return ROUTE.unpack_from(message[0], MAC_BYTES + HEADER.size)


# -- the attacks -----------------------------------------------------------------------------

def test_a_replayed_task_message_does_not_run_again():
    def main():
        _, before, _ = apgas.at(1, status)
        wiretap = tap(1)
        with apgas.finish():
            apgas.async_at(apgas.place(1), bump)
        assert apgas.at(1, count) == 1
        [task] = wiretap.of_kind(TASK)
        endpoint = apgas.at(1, status)[0]
        inject(endpoint, task, task, task)  # three replays
        by = wait_rejected(1, before + 3)
        assert by["replayed or stale: old sequence number"] == 3
        assert apgas.at(1, count) == 1  # it ran once
        with apgas.finish():  # the place and its link still work
            for _ in range(5):
                apgas.async_at(apgas.place(1), bump)
        return apgas.at(1, count)

    assert apgas.run(main, places=2, threads=2, same_host=False) == 6


def test_b_an_old_place_table_replayed_after_a_shrink_is_dropped():
    def main():
        rt = current()
        wiretap = tap(3)
        rt.remove_places([1])  # shrink: the new table {0, 2, 3} goes to place 3
        rt.remove_places([2])  # and then {0, 3}
        tables = wiretap.of_kind(TABLE)
        assert len(tables) == 2
        endpoint, before, _ = apgas.at(3, status)
        inject(endpoint, tables[0])  # the table from before the second shrink: place 2 in it
        by = wait_rejected(3, before + 1)
        assert by["replayed or stale: old sequence number"] == 1
        assert apgas.at(3, lambda: [p.id for p in apgas.places()]) == [0, 3]
        with apgas.finish():  # the computation continues
            for p in apgas.places():
                for _ in range(3):
                    apgas.async_at(p, bump)
        return [apgas.at(p, count) for p in apgas.places()]

    assert apgas.run(main, places=4, threads=2, same_host=False) == [3, 3]


def test_c_a_message_for_place_1_replayed_to_place_2_is_dropped():
    def main():
        wiretap = tap(1)
        with apgas.finish():
            for _ in range(20):  # place 0 -> 1 numbers now run ahead of place 0 -> 2
                apgas.async_at(apgas.place(1), bump)
        tasks = wiretap.of_kind(TASK)
        assert route(tasks[-1])[0] == 1
        endpoint, before, _ = apgas.at(2, status)
        inject(endpoint, tasks[-1])
        by = wait_rejected(2, before + 1)
        assert by == {"wrong destination": 1}
        assert apgas.at(2, count) == 0 and apgas.at(1, count) == 20
        with apgas.finish():
            apgas.async_at(apgas.place(2), bump)
        return apgas.at(2, count)

    assert apgas.run(main, places=3, threads=2, same_host=False) == 1


def test_d_oversize_frames_are_cut_off_before_they_are_read():
    def main():
        endpoint, before, _ = apgas.at(1, status)
        peak = apgas.at(1, peak_rss_kib)
        # two attackers at once, each with a 64 MiB frame (limit: 16 MiB)
        ctx = zmq.Context()
        socks, monitors = [], []
        for _ in range(2):
            sock = keyed(ctx.socket(zmq.DEALER))
            sock.setsockopt(zmq.LINGER, 0)
            monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.connect(endpoint)
            socks.append(sock)
        big = bytes(64 * MiB)
        for sock in socks:
            sock.send_multipart([bytes(ENVELOPE_BYTES), big], copy=False)
        for monitor in monitors:  # the place hangs up on each of them
            assert monitor.poll(10_000), "the place did not cut the oversize sender off"
            assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        for sock in socks:
            sock.disable_monitor()
            sock.close()
        for monitor in monitors:
            monitor.close(linger=0)
        ctx.term()
        del big
        grown_mib = (apgas.at(1, peak_rss_kib) - peak) / 1024
        assert grown_mib < 16, f"place 1 grew by {grown_mib:.0f} MiB"
        # a message of many frames, each under the limit, together over it: dropped as too large
        inject(endpoint, [bytes(ENVELOPE_BYTES)] + [bytes(6 * MiB)] * 3)
        by = wait_rejected(1, before + 1)
        assert by == {"too large": 1}
        # the place keeps serving, big messages under the limit included
        return apgas.at(1, lambda data: len(data), bytes(15 * MiB))

    assert apgas.run(main, places=2, threads=2, max_message_bytes=16 * MiB, same_host=False) == 15 * MiB


def test_e_a_message_over_the_limit_fails_loudly_at_the_sender():
    def main():
        data = bytes(17 * MiB)
        errors = []
        with pytest.raises(apgas.ApgasError) as e:
            apgas.at(1, len, data)
        errors.append(str(e.value))
        with pytest.raises(apgas.MultipleException) as e:  # a task: the finish must not wait for it
            with apgas.finish():
                apgas.async_at(apgas.place(1), len, data)
        [error] = e.value.exceptions
        assert isinstance(error, apgas.ApgasError)
        errors.append(str(error))
        with pytest.raises(apgas.ApgasError, match="too large to send back"):
            apgas.at(1, bytes, 17 * MiB)  # the reply is too large
        with pytest.raises(apgas.MultipleException) as e:  # the exceptions of a finish
            with apgas.finish():
                apgas.async_at(apgas.place(1), raise_big)
        assert "too large to report" in str(e.value.exceptions[0])
        return errors, apgas.at(1, len, bytes(MiB))

    errors, still = apgas.run(main, places=2, threads=2, max_message_bytes=16 * MiB, same_host=False)
    assert still == MiB
    for text in errors:
        found = re.search(r"a message of ([\d,]+) bytes from place 0 to place 1 is larger than "
                          r"the limit of 16,777,216 bytes; raise the option max_message_bytes "
                          r"\(APGAS_MAX_MESSAGE_BYTES\)", text)
        assert found, text
        assert 17 * MiB < int(found[1].replace(",", "")) < 17 * MiB + 4096


def raise_big() -> None:
    raise ValueError(bytes(17 * MiB))


def test_f_forged_and_altered_messages_are_dropped():
    def main():
        wiretap = tap(1)
        apgas.at(1, bump)
        [message] = [m for m in wiretap.messages if len(m) == 2]
        endpoint, before, _ = apgas.at(1, status)
        envelope = message[0]
        _, seq = route(message)
        signed_at = MAC_BYTES + HEADER.size
        far_ahead = envelope[:signed_at] + ROUTE.pack(1, seq + 10**9)  # MAC not redone
        flipped = bytes([message[1][0] ^ 1]) + message[1][1:]
        forged = [
            [far_ahead, message[1]],  # a number far ahead
            [far_ahead + message[1]],  # the same as one frame
            [far_ahead, flipped],  # and the payload changed
            [bytes(MAC_BYTES) + far_ahead[MAC_BYTES:], message[1]],  # and a made-up MAC
            [envelope, flipped],  # the payload changed
            [envelope, message[1], b"extra frame"],  # a frame added
            [envelope[:-1], message[1]],  # cut short
            [bytes(ENVELOPE_BYTES), message[1]],  # all zero: for place 0
        ]
        inject(endpoint, *forged)
        by = wait_rejected(1, before + len(forged))
        assert by == {"bad MAC": 4, "replayed or stale: old sequence number": 2,
                      "malformed frames": 1, "wrong destination": 1}, by
        # the forged number far ahead did not move the place's counter: real messages still pass
        for _ in range(3):
            apgas.at(1, bump)
        return apgas.at(1, count)

    assert apgas.run(main, places=2, threads=2, same_host=False) == 4


# -- links, logging, configuration -------------------------------------------------------------

def _pair(handler):
    secret = b"s" * 32
    receiver = Transport(1, secret, "127.0.0.1", handler)
    sender = Transport(0, secret, "127.0.0.1", lambda *a: None)
    receiver.start()
    sender.start()
    return sender, receiver


def test_a_link_made_again_is_still_accepted():
    got: list[int] = []
    arrived = threading.Condition()

    def handler(kind, src, a, b, body, buffers):
        with arrived:
            got.append(b)
            arrived.notify_all()

    def wait_for(n: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(got) >= n, 10)

    sender, receiver = _pair(handler)
    try:
        port = receiver.endpoint.rsplit(":", 1)[1]
        sender.connect(1, receiver.endpoint)
        for i in range(10):
            sender.send(1, 1, 0, i)
        wait_for(10)
        sender.disconnect(1)
        sender.connect(1, receiver.endpoint)  # a new link to the same place
        for i in range(10, 20):
            sender.send(1, 1, 0, i)
        wait_for(20)
        sender.connect(1, f"tcp://localhost:{port}")  # a new endpoint: the DEALER is replaced
        for i in range(20, 30):
            sender.send(1, 1, 0, i)
        wait_for(30)
    finally:
        sender.close()
        receiver.close()
    assert got == list(range(30)) and receiver.rejected == 0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_dropped_messages_are_logged_then_summarized():
    sender, receiver = _pair(lambda *a: None)
    logger = logging.getLogger("apgas._core.transport")
    handler = _Lines()
    logger.addHandler(handler)
    try:
        inject(receiver.endpoint, *[[b"junk", b"x", b"y"]] * 50, transport=receiver)
        deadline = time.monotonic() + 10
        while receiver.rejected < 50:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        receiver.close()  # says what it has not said yet
    finally:
        logger.removeHandler(handler)
        sender.close()
        receiver.close()
    lines = handler.lines
    assert len(lines) == 6, lines
    assert all("malformed frames" in line for line in lines[:5])
    assert "summarized every" in lines[4]
    assert "dropped 45 more message(s)" in lines[5] and "50 dropped in all" in lines[5]
    assert receiver.rejected == 50


def test_max_message_bytes_option():
    assert load_config({}, {}).max_message_bytes == 256 * MiB
    assert load_config({}, {"APGAS_MAX_MESSAGE_BYTES": "1048576"}).max_message_bytes == MiB
    assert load_config({"max_message_bytes": 5000}, {}).max_message_bytes == 5000
    with pytest.raises(apgas.ConfigError, match="APGAS_MAX_MESSAGE_BYTES"):
        load_config({}, {"APGAS_MAX_MESSAGE_BYTES": "lots"})
    with pytest.raises(apgas.ConfigError, match="max_message_bytes"):
        load_config({"max_message_bytes": 10}, {})


def test_the_limit_reaches_every_place():
    def main():
        return apgas.at(1, lambda: current().transport.max_message_bytes)

    assert apgas.run(main, places=2, threads=1, max_message_bytes=3 * MiB, same_host=False) == 3 * MiB
