"""Tasks and reports to one place travel in batches (issue 44, item 2): the order of the
pair holds, a lone message leaves at once, a waiting batch leaves without being asked,
and a malformed batch is dropped whole before anything of it is unpickled."""

from __future__ import annotations

import random
import threading
import time

import pytest

import apgas
from apgas._core import batch as batching
from apgas._core.transport import BATCH_S, HEADER, ROUTE, Transport

pytestmark = pytest.mark.timeout(60)
SECRET = b"b" * 32


class _Inbox:
    """A handler that keeps (kind, a, b, body) in arrival order."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int, int, bytes]] = []
        self.cond = threading.Condition()

    def __call__(self, kind, src, a, b, body, buffers) -> None:
        with self.cond:
            self.got.append((kind, a, b, bytes(body)))
            self.cond.notify_all()

    def wait_for(self, n: int, timeout: float = 10) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, timeout), \
                f"{len(self.got)} of {n} messages arrived"


@pytest.fixture(params=[True, False], ids=["same-host", "zeromq"])
def pair(request):
    """Two transports of one host, over the same-host path or ZeroMQ (as across hosts)."""
    inbox = _Inbox()
    receiver = Transport(1, SECRET, "127.0.0.1", inbox, same_host=request.param)
    sender = Transport(0, SECRET, "127.0.0.1", lambda *a: None, same_host=request.param)
    receiver.start()
    sender.start()
    sender.connect(1, receiver.endpoint)
    yield sender, receiver, inbox
    sender.close()
    receiver.close()


def _wire_messages(sender: Transport) -> int:
    """Messages the sender put on its link to place 1 so far (its sequence number)."""
    return sender._links[1].seq & ((1 << 40) - 1)


def test_a_stream_leaves_in_few_messages_and_arrives_in_order(pair):
    sender, receiver, inbox = pair
    rng = random.Random(3)
    sent = []
    for i in range(2000):
        may_wait = rng.random() < 0.9  # every tenth message may not wait: it goes after the rest
        body = bytes(rng.randrange(0, 300))
        sender.send(1, 5 if may_wait else 6, i, -i, (body,), batch=may_wait)
        sent.append((5 if may_wait else 6, i, -i, body))
    sender.flush()
    inbox.wait_for(len(sent))
    assert inbox.got == sent
    assert _wire_messages(sender) < len(sent) / 2, "the stream was not batched"
    assert receiver.rejected == 0


def test_a_lone_message_leaves_at_once(pair):
    sender, _, inbox = pair
    time.sleep(2 * BATCH_S)
    sender.send(1, 5, 1, 2, (b"alone",), batch=True)
    assert _wire_messages(sender) == 1  # on the wire before send() returned: nothing waited
    inbox.wait_for(1)


def test_a_waiting_batch_leaves_without_a_flush(pair):
    sender, _, inbox = pair
    for i in range(5):
        sender.send(1, 5, i, 0, (b"x",), batch=True)
    inbox.wait_for(5, timeout=30)  # the flusher sends it, about BATCH_S later


def test_messages_from_many_threads_keep_each_threads_order(pair):
    sender, _, inbox = pair

    def stream(t: int) -> None:
        for i in range(300):
            sender.send(1, 5, t, i, (b"y" * (i % 50),), batch=True)

    threads = [threading.Thread(target=stream, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    inbox.wait_for(1200)
    for t in range(4):
        assert [b for _, a, b, _ in inbox.got if a == t] == list(range(300))


def _forge(sender: Transport, count: int, body: bytes) -> None:
    """A batch signed with the run's secret whose body says other than its header:
    what a bug, not an attacker (who lacks the secret), could send."""
    link = sender._links[1]
    with link.lock:
        sock = link.sock if link.sock is not None else sender._open(link, 1)
        sender._put(link, sock, 1, batching.BATCH, count, 0, (body,), None)


@pytest.mark.parametrize("count, body", [
    (3, batching.encode_entry(5, 0, 0, b"a") * 2),  # fewer entries than counted
    (1, batching.encode_entry(5, 0, 0, b"a") + b"junk"),  # bytes after the last
    (1, batching.ENTRY.pack(5, 0, 0, 999) + b"short"),  # an entry longer than the batch
    (1, batching.encode_entry(batching.BATCH, 1, 0, b"")),  # a batch in a batch
    (0, b""),  # no entries
])
def test_a_malformed_batch_is_dropped_whole_and_the_link_goes_on(pair, count, body):
    sender, receiver, inbox = pair
    _forge(sender, count, body)
    sender.send(1, 5, 7, 7, (b"after",))
    inbox.wait_for(1)
    assert inbox.got == [(5, 7, 7, b"after")]  # nothing of the malformed batch was handed on
    assert receiver.rejected == 1
    assert next(iter(receiver.rejected_by)).startswith("malformed batch")


def test_entries_parse_back():
    items = [(1, -5, 2**40, b""), (13, 0, -1, b"z" * 1000)]
    body = b"".join(batching.encode_entry(*item) for item in items)
    got = batching.entries(memoryview(body), len(items))
    assert [(k, a, b, bytes(v)) for k, a, b, v in got] == items
    assert HEADER.size + ROUTE.size < batching.ENTRY.size + 40  # an entry is smaller than a message


# -- in a run: a burst of tasks does not wait for the spawner -------------------------------

_started: list[float] = []


def note_start() -> None:
    _started.append(time.monotonic())


def last_start() -> float:
    return max(_started)


def test_a_burst_of_tasks_starts_while_its_spawner_computes():
    def main() -> float:
        apgas.at(1, started_count)  # this module is imported at place 1 before the clock runs
        # (the first task leaves at once, the other 49 in a batch: none waits for the finish)
        with apgas.finish():
            spawned = time.monotonic()
            for _ in range(50):
                apgas.async_at(1, note_start)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:  # computes, never waits: no flush from this thread
                pass
        return apgas.at(1, last_start) - spawned

    assert apgas.run(main, places=2) < 1.0  # not at the finish, 2 s on


def started_count() -> int:
    return len(_started)


def spawn_more(n: int) -> None:
    """A task that spawns tasks: they and this place's report travel in batches too."""
    for _ in range(n):
        apgas.async_at(apgas.places()[0], note_start)


def test_finishes_over_streams_of_tasks_are_exact():
    def main() -> list[int]:
        _started.clear()
        totals = []
        for _ in range(3):
            with apgas.finish():
                for i in range(3000):
                    apgas.async_at(apgas.places()[i % 3], note_start)
                for p in apgas.places()[1:]:
                    apgas.async_at(p, spawn_more, 500)
            totals.append(sum(apgas.at(p, started_count) for p in apgas.places()))
        return totals

    assert apgas.run(main, places=3) == [4000, 8000, 12000]
