"""The thread that calls ``at`` receives its own reply (issue 44, item 1): straight from
the target's ROUTER when it can, through the link and its own place's ROUTER when not;
exact under many threads and deaths, bounded, and never fooled by a reply it does not
wait for."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import apgas
import apgas.lowlevel
from apgas._core.replies import MAX_CHANNELS, Channel, routing_id
from apgas._core.runtime import AT_REPLY, current
from apgas._core.transport import Transport
from apgas.errors import DeadPlaceError

pytestmark = pytest.mark.timeout(90)


def link_messages_to(place: int) -> int:
    """Messages this place has sent on its link to ``place`` (its sequence number)."""
    return current().transport._links[place].seq & ((1 << 40) - 1)


def twice(x: int) -> int:
    return 2 * x


def via(hop: int, x: int) -> int:
    """A call that waits for another: the receiving moves, the reply takes the link."""
    return apgas.at(hop, twice, x)


def test_a_reply_comes_straight_to_the_caller():
    def main() -> tuple[int, int, int]:
        for i in range(20):  # the channel's connection is up after the first calls
            assert apgas.at(1, twice, i) == 2 * i
        before = apgas.at(1, link_messages_to, 0)
        for i in range(200):
            assert apgas.at(1, twice, i) == 2 * i
        after = apgas.at(1, link_messages_to, 0)
        return after - before, len(current().replies._by_thread), current().transport.rejected

    by_link, channels, rejected = apgas.run(main, places=2)
    # 1 for the measuring call itself; every reply of the 200 came through the ROUTER
    assert by_link <= 2, f"{by_link} replies took the link"
    assert channels == 1 and rejected == 0


def test_replies_that_take_the_link_reach_the_waiting_caller_too():
    def main() -> tuple[list[int], int]:
        before = apgas.at(1, link_messages_to, 0)
        got = [apgas.at(1, via, 2, i) for i in range(20)]
        got += [apgas.lowlevel.immediate_at(1, twice, i) for i in range(20)]
        got += [apgas.at(p, twice, i) for p in (2, 3) for i in range(10)]
        return got, apgas.at(1, link_messages_to, 0) - before

    # over ZeroMQ (places of other hosts): on one host, a reply takes the caller's own
    # stream from whichever thread sends it (tests/test_local_links.py)
    got, by_link = apgas.run(main, places=4, same_host=False)
    assert got == [2 * i for i in range(20)] * 2 + [2 * i for i in range(10)] * 2
    assert by_link >= 40  # the replies of calls that wait and of immediate calls


def test_the_first_reply_to_a_new_channel_is_not_lost():
    """Each new thread's first calls reply by the link, handed on to a channel made a
    moment before (a ROUTER would not know it yet); the second connects the channel."""
    def main() -> list[int]:
        got: list[int] = []

        def first_call(i: int) -> None:
            got.append(apgas.at(1, twice, i) + apgas.at(1, twice, i) - apgas.at(1, twice, i))

        for i in range(40):
            th = threading.Thread(target=first_call, args=(i,))
            th.start()
            th.join(10)
            assert not th.is_alive(), f"the first call of thread {i} never got its reply"
        return got

    assert apgas.run(main, places=2) == [2 * i for i in range(40)]


def test_many_threads_calling_many_places_get_their_own_replies():
    def main() -> list[tuple[int, int]]:
        rng = random.Random(5)
        wrong: list[tuple[int, int]] = []

        def caller(t: int) -> None:
            r = random.Random(t)
            for i in range(150):
                x = t * 1000 + i
                target = r.randrange(1, 4)
                if r.random() < 0.2:
                    time.sleep(r.random() * 0.002)
                value = apgas.at(target, via, r.randrange(1, 4), x) if i % 10 == 0 \
                    else apgas.at(target, twice, x)
                if value != 2 * x:
                    wrong.append((x, value))

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(rng.randrange(6, 9))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return wrong

    assert apgas.run(main, places=4, threads=4) == []


def test_more_callers_than_channels_still_get_their_replies():
    def main() -> tuple[int, int]:
        results: list[int] = []
        lock = threading.Lock()
        go = threading.Barrier(MAX_CHANNELS + 8)

        def caller(t: int) -> None:
            go.wait()
            value = sum(apgas.at(1, twice, t) for _ in range(3))
            with lock:
                results.append(value)

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(MAX_CHANNELS + 8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(results) == sorted(6 * t for t in range(MAX_CHANNELS + 8))
        most = len(current().replies._by_thread)
        apgas.at(1, twice, 0)  # the main thread's channel: those of the ended threads close
        return most, len(current().replies._by_thread)

    most, after = apgas.run(main, places=2)
    assert most <= MAX_CHANNELS
    assert after == 1


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def wait_forever() -> None:
    time.sleep(60)


def test_a_caller_waiting_on_its_channel_learns_of_the_death():
    def main() -> float:
        apgas.at(1, twice, 1)
        threading.Timer(0.5, lambda: apgas.uncounted_async_at(1, die)).start()
        started = time.monotonic()
        with pytest.raises(DeadPlaceError):
            apgas.at(1, wait_forever)
        return time.monotonic() - started

    assert apgas.run(main, places=2) < 10


# -- a channel alone, against a transport whose ROUTER this test owns -------------------------

def test_a_channel_takes_only_the_reply_it_waits_for():
    secret = b"c" * 32
    caller = Transport(0, secret, "127.0.0.1", lambda *a: None)
    target = Transport(1, secret, "127.0.0.1", lambda *a: None)  # not started: this thread owns it
    stranger = Transport(1, b"x" * 32, "127.0.0.1", lambda *a: None)
    channel = Channel(caller, threading.current_thread())
    try:
        channel.reach(target.endpoint, 1)
        channel.reach(target.endpoint, 1)  # connects at the second call
        rid = routing_id(channel.token)
        deadline = time.monotonic() + 5
        while not target.route(0, rid, AT_REPLY, channel.token, 7, [b"early"]):
            assert time.monotonic() < deadline, "the channel never connected"
            time.sleep(0.01)
        assert channel.wait(1, AT_REPLY, 7, lambda: False) == (memoryview(b"early"), [])
        # a reply to request 7 sent again (late, as after a Ctrl-C ended its wait: dropped
        # without a warning), one for another token, one under another secret, and one for
        # another place: each dropped, none unpickled; then the awaited one is taken
        assert target.route(0, rid, AT_REPLY, channel.token, 7, [b"replayed"])
        assert target.route(0, rid, AT_REPLY, channel.token + 1, 8, [b"other token"])
        assert target.route(5, rid, AT_REPLY, channel.token, 8, [b"other place"])
        assert target.route(0, rid, AT_REPLY, channel.token, 8, [b"yes"])
        body, buffers = channel.wait(1, AT_REPLY, 8, lambda: False)
        assert bytes(body) == b"yes" and buffers == []
        assert dict(caller.rejected_by) == {"not the awaited reply": 1, "wrong destination": 1}
        # a place under another secret never gets past the handshake: it cannot reach the
        # channel at all (before CURVE, its reply came and failed the MAC)
        failed = stranger._router.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        channel.reach(stranger.endpoint, 1)
        channel.reach(stranger.endpoint, 1)
        event = recv_monitor_message(failed) if failed.poll(10_000) else None
        assert event is not None and event["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED, event
        assert not stranger.route(0, rid, AT_REPLY, channel.token, 9, [b"forged"])
        stranger._router.disable_monitor()
        failed.close(linger=0)
        # nothing waits forever: a given-up wait ends at its next look
        assert channel.wait(1, AT_REPLY, 10, lambda: True) is None
    finally:
        channel.close()
        for t in (caller, target, stranger):
            t.close()


def main_channel_peers() -> int:
    return len(current().replies._by_thread[threading.get_ident()]._peers)


def test_calls_to_every_place_in_turn_connect_nowhere():
    def main() -> tuple[int, int]:
        for _ in range(2):  # a broadcast, then a collection a while later
            for p in apgas.places()[1:]:
                apgas.at(p, twice, 1)
            time.sleep(0.1)
        broadcast = main_channel_peers()
        for _ in range(3):  # a conversation with one place
            apgas.at(1, twice, 1)
        return broadcast, main_channel_peers()

    assert apgas.run(main, places=5) == (0, 1)
