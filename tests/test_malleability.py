"""Grow and shrink orders over the raw socket protocol (the client uses plain sockets)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import eventually
from orders import free_port, order

import apgas
from apgas import DeadPlaceError
from apgas.testing import FakeScheduler

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def every_name_is_local(monkeypatch):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    for var in ("APGAS_SCHEDULER", "APGAS_MALLEABLE_LISTEN", "APGAS_COMMUNICATOR"):
        monkeypatch.delenv(var, raising=False)


def ids(places) -> list[int]:
    return [p.id for p in places]


def tables_everywhere() -> list[list[tuple[int, str]]]:
    """Each live place's view of the place table."""
    return [apgas.at(p, lambda: [(q.id, q.host) for q in apgas.places()]) for p in apgas.places()]


def assert_same_table_everywhere(expected_ids: list[int]) -> None:
    views = tables_everywhere()
    assert all(view == views[0] for view in views), views
    assert [i for i, _ in views[0]] == expected_ids


class Recorder(apgas.MalleableHandler):
    """Releases the newest places; records every call and what each place saw."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pre_shrink(self, n):
        self.calls.append(("pre_shrink", n))
        return apgas.places()[-n:]

    def post_shrink(self, n, removed):
        self.calls.append(("post_shrink", n, ids(removed)))

    def pre_grow(self, n):
        self.calls.append(("pre_grow", n))

    def post_grow(self, n, continued, added):
        seen = tables_everywhere()
        assert all(set(ids(added)) <= {i for i, _ in view} for view in seen), seen
        self.calls.append(("post_grow", n, ids(continued), ids(added)))


def test_grow_and_shrink_sequence():
    def main():
        handler = Recorder()
        address = apgas.define_malleable_handler(handler).address
        assert order(address, "grow 2 nodeA nodeB") == ["ok grow 2 places 2 3"]
        assert_same_table_everywhere([0, 1, 2, 3])
        assert [p.host for p in apgas.places()][2:] == ["nodeA", "nodeB"]
        assert order(address, "shrink 1") == ["nodeB"]
        assert_same_table_everywhere([0, 1, 2])
        assert order(address, "grow 1 nodeC") == ["ok grow 1 places 4"]  # id 3 is never reused
        assert_same_table_everywhere([0, 1, 2, 4])
        assert order(address, "shrink 2") == ["nodeA", "nodeC"]
        assert_same_table_everywhere([0, 1])
        with pytest.raises(DeadPlaceError, match="it has left"):
            apgas.async_at(4, print)
        with pytest.raises(DeadPlaceError, match="it has left"):
            apgas.at(apgas.place(1), apgas.async_at, 2, print)
        return handler.calls

    assert apgas.run(main, places=2) == [
        ("pre_grow", 2), ("post_grow", 2, [0, 1], [2, 3]),
        ("pre_shrink", 1), ("post_shrink", 1, [3]),
        ("pre_grow", 1), ("post_grow", 1, [0, 1, 2], [4]),
        ("pre_shrink", 2), ("post_shrink", 2, [2, 4]),
    ]


def test_a_host_named_twice_gets_two_places():
    """As in the Java runtime, whose scripts (and the ElasticJobScheduler) send that."""
    def main():
        address = apgas.define_malleable_handler(Recorder()).address
        assert order(address, "grow 2 nodeA nodeA") == ["ok grow 2 places 1 2"]
        assert_same_table_everywhere([0, 1, 2])
        assert [p.host for p in apgas.places()] == [apgas.here().host, "nodeA", "nodeA"]
        assert apgas.at(apgas.place(1), os.getpid) != apgas.at(apgas.place(2), os.getpid)
        assert order(address, "shrink 2") == ["nodeA", "nodeA"]
        assert_same_table_everywhere([0])

    apgas.run(main, places=1)


def slow_task(ref: apgas.GlobalRef, seconds: float, began: apgas.GlobalRef | None = None) -> None:
    me = apgas.here().id
    if began is not None:  # says that it runs
        apgas.at(began.home, lambda: began.get().append(me))
    time.sleep(seconds)
    apgas.at(ref.home, lambda: ref.get().append(me))


def test_a_removed_place_finishes_its_tasks_first():
    def main():
        address = apgas.define_malleable_handler(Recorder()).address
        done: list[int] = []
        ref = apgas.GlobalRef(done)
        running: list[int] = []
        began = apgas.GlobalRef(running)
        failures: list[BaseException] = []

        def waiter():
            try:
                with apgas.finish():
                    apgas.async_at(apgas.place(2), slow_task, ref, 1.0, began)
                    apgas.async_at(apgas.place(1), slow_task, ref, 0.1, began)
            except BaseException as e:
                failures.append(e)

        thread = threading.Thread(target=waiter)
        thread.start()
        eventually(lambda: sorted(running) == [1, 2], "both tasks to run")
        host = apgas.place(2).host
        assert order(address, "shrink 1") == [host]
        assert 2 in done  # the shrink waited for place 2's task
        thread.join(30)
        return sorted(done), failures, ids(apgas.places())

    assert apgas.run(main, places=3) == ([1, 2], [], [0, 1])


def test_thirty_random_orders_in_quick_succession():
    def main():
        rng = random.Random(11)
        address = apgas.define_malleable_handler(Recorder()).address
        hosts_of: dict[int, str] = {p.id: p.host for p in apgas.places()}
        next_host = 0
        seen_ids = set(hosts_of)
        for _ in range(30):
            live = len(apgas.places())
            if live > 1 and (live >= 5 or rng.random() < 0.5):
                n = rng.randint(1, live - 1)
                expected = [p.host for p in apgas.places()[-n:]]
                assert order(address, f"shrink {n}") == expected
            else:
                n = rng.randint(1, 3)
                names = [f"node{next_host + i}" for i in range(n)]
                next_host += n
                reply = order(address, f"grow {n} " + " ".join(names))
                new_ids = [int(x) for x in reply[0].split()[4:]]
                assert not seen_ids & set(new_ids) and min(new_ids) > max(seen_ids)
                seen_ids.update(new_ids)
        views = tables_everywhere()
        assert all(view == views[0] for view in views)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, time.sleep, 0.01)
        return len(seen_ids)

    assert apgas.run(main, places=2) > 10


BAD_ORDERS = [
    ("frobnicate 2", "unknown order 'frobnicate'"),
    ("", "empty order"),
    ("grow", "grow needs a count"),
    ("shrink", "shrink needs a count"),
    ("shrink 0", "positive integer, got '0'"),
    ("shrink -1", "positive integer, got '-1'"),
    ("grow two a b", "positive integer, got 'two'"),
    ("grow 2 onlyone", "needs 2 host name(s), got 1"),
    ("grow 1 a b", "needs 1 host name(s), got 2"),
    ("shrink 1 please", "extra words ['please']"),
    ("shrink 3", "cannot shrink by 3: the program has 3 place(s)"),
    ("shrink 7", "cannot shrink by 7"),
    ("status now", "status takes no arguments"),
    ("grow 1 " + "x" * 5000, "longer than 4096 bytes"),
    (b"grow 1 \xff\xfe", "not UTF-8"),
]


def test_bad_orders_get_an_error_and_change_nothing():
    def main():
        address = apgas.define_malleable_handler(Recorder()).address
        before = tables_everywhere()
        for line, reason in BAD_ORDERS:
            reply = order(address, line)
            assert len(reply) == 1 and reply[0].startswith("error ") and reason in reply[0], (line, reply)
            assert tables_everywhere() == before
        # a connection that drops mid-order
        with socket.create_connection(address) as conn:
            conn.sendall(b"grow 1 nodeX")
        # a host that cannot be started
        os.environ["APGAS_LOCAL_HOSTS"] = ""
        try:
            reply = order(address, "grow 1 elsewhere.invalid")
        finally:
            os.environ["APGAS_LOCAL_HOSTS"] = "*"
        assert reply[0].startswith("error no place was added") and "elsewhere.invalid" in reply[0]
        assert tables_everywhere() == before
        # the job goes on and still takes good orders
        assert order(address, "grow 1 nodeY") == ["ok grow 1 places 4"]  # the failed grow used id 3
        assert order(address, "status") == ["status malleable 4", "place 0 " + apgas.here().host,
                                            "place 1 " + apgas.place(1).host,
                                            "place 2 " + apgas.place(2).host, "place 4 nodeY"]
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, time.sleep, 0.01)
        return ids(apgas.places())

    assert apgas.run(main, places=3) == [0, 1, 2, 4]


class Faulty(Recorder):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def pre_shrink(self, n):
        return {"zero": [apgas.place(0)], "short": [], "twice": [apgas.place(1), apgas.place(1)]}[self.mode]

    def pre_grow(self, n):
        raise ValueError("not now")


@pytest.mark.parametrize("mode", ["zero", "short", "twice"])
def test_handler_faults_are_refused(mode):
    def main():
        address = apgas.define_malleable_handler(Faulty(mode)).address
        n = 2 if mode == "twice" else 1
        reply = order(address, f"shrink {n}")
        assert reply[0].startswith(f"error pre_shrink({n}) must return {n} distinct live places")
        reply = order(address, "grow 1 nodeZ")
        assert reply == ["error the handler's pre_grow raised ValueError: not now"]
        return ids(apgas.places())

    assert apgas.run(main, places=3) == [0, 1, 2]


def test_orders_before_registration_and_after_disabling(monkeypatch):
    port = free_port()
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", f"127.0.0.1:{port}")

    def main():
        address = ("127.0.0.1", port)
        assert order(address, "grow 1 nodeA") == [
            "error the program is not malleable yet: no MalleableHandler is registered"]
        assert order(address, "status") == ["status rigid 2", f"place 0 {apgas.here().host}",
                                            f"place 1 {apgas.place(1).host}"]
        handler = Recorder()
        assert apgas.define_malleable_handler(handler).address == address
        with pytest.raises(apgas.ApgasError, match="registered once"):
            apgas.define_malleable_handler(Recorder())
        assert order(address, "grow 1 nodeA") == ["ok grow 1 places 2"]
        apgas.disable_malleable_handler()
        assert order(address, "shrink 1") == ["error the program is no longer malleable (disabled)"]
        with pytest.raises(apgas.ApgasError, match="disabled"):
            apgas.define_malleable_handler(Recorder())
        with pytest.raises(apgas.ApgasError, match="no malleable handler to disable"):
            apgas.disable_malleable_handler()
        return ids(apgas.places())

    assert apgas.run(main, places=2) == [0, 1, 2]


class SlowGrow(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def pre_grow(self, n):
        self.started.set()
        time.sleep(0.5)
        super().pre_grow(n)


def test_disabling_waits_for_the_order_in_progress():
    def main():
        handler = SlowGrow()
        address = apgas.define_malleable_handler(handler).address
        replies = []
        client = threading.Thread(target=lambda: replies.append(order(address, "grow 1 nodeA")))
        client.start()
        assert handler.started.wait(30)
        apgas.disable_malleable_handler()
        calls = list(handler.calls)
        client.join(30)
        return calls, replies

    calls, replies = apgas.run(main, places=1)
    assert calls == [("pre_grow", 1), ("post_grow", 1, [0], [1])]
    assert replies == [["ok grow 1 places 1"]]


def test_malleability_is_steered_from_place_zero():
    def main():
        with pytest.raises(apgas.ApgasError, match="steered from place 0"):
            apgas.at(apgas.place(1), apgas.define_malleable_handler, Recorder())
        with pytest.raises(TypeError, match="expected a MalleableHandler"):
            apgas.define_malleable_handler(object())

    apgas.run(main, places=2)


def test_ready_and_timing_messages_reach_the_scheduler(monkeypatch):
    scheduler = FakeScheduler()  # records, answers nothing
    monkeypatch.setenv("APGAS_SCHEDULER", "{}:{}".format(*scheduler.address))

    def main():
        address = apgas.define_malleable_handler(Recorder()).address
        assert order(address, "grow 1 nodeA")[0].startswith("ok")
        assert order(address, "shrink 1") == ["nodeA"]

    try:
        apgas.run(main, places=2)
        scheduler.take("APGAS-NotMalleable", timeout=5)
    finally:
        scheduler.close()
    lines = scheduler.lines
    assert lines[0] == "APGAS-Ready:127.0.0.1"
    kinds = [line.split(";")[0] for line in lines[1:-1]]
    assert kinds == ["readyTimeAPGAS", "preGrowTimeAPGAS", "placeStartTimeAPGAS", "postGrowTimeAPGAS",
                     "growTimeAPGAS", "preShrinkTimeAPGAS", "placeStopTimeAPGAS", "postShrinkTimeAPGAS",
                     "shrinkTimeAPGAS"]
    for line in lines[1:-1]:
        message, ip = line.split(":")
        what, n, ns = message.split(";")
        assert ip == "127.0.0.1" and int(n) in (1, 2) and int(ns) > 0
    assert lines[-1] == "APGAS-NotMalleable:127.0.0.1"


def test_order_tool(monkeypatch):
    port = free_port()
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", f"127.0.0.1:{port}")

    def tool(*words):
        return subprocess.run([sys.executable, "-m", "apgas.order", "--to", f"127.0.0.1:{port}", *words],
                              capture_output=True, text=True, timeout=30)

    def main():
        apgas.define_malleable_handler(Recorder())
        grown = tool("grow", "2", "nodeA", "nodeB")
        status = tool("status")
        shrunk = tool("shrink", "1")
        refused = tool("shrink", "9")
        return grown, status, shrunk, refused

    grown, status, shrunk, refused = apgas.run(main, places=1)
    assert (grown.returncode, grown.stdout) == (0, "ok grow 2 places 1 2\n")
    assert status.stdout.splitlines()[0] == "status malleable 3"
    assert (shrunk.returncode, shrunk.stdout) == (0, "nodeB\n")
    assert refused.returncode == 1 and refused.stdout.startswith("error cannot shrink by 9")
    unreachable = subprocess.run([sys.executable, "-m", "apgas.order", "--to", f"127.0.0.1:{port}",
                                  "status"], capture_output=True, text=True, timeout=30)
    assert unreachable.returncode == 2 and "cannot reach the job" in unreachable.stderr


def test_unknown_communicator_is_refused(monkeypatch):
    monkeypatch.setenv("APGAS_COMMUNICATOR", "carrier-pigeon")
    with pytest.raises(apgas.ConfigError, match="unknown communicator 'carrier-pigeon'"):
        apgas.run(lambda: None)


_tally = 0
_tally_lock = threading.Lock()


def tally() -> None:
    global _tally
    with _tally_lock:
        _tally += 1


def read_tally() -> int:
    global _tally
    with _tally_lock:
        value, _tally = _tally, 0
    return value


def roaming_tree(depth: int, fanout: int) -> None:
    """Counts itself at place 0, then spawns children on whatever places exist now."""
    apgas.at(0, tally)
    if depth == 0:
        return
    for i in range(fanout):
        ps = apgas.places()
        target = ps[(ps.index(apgas.here()) + i + 1) % len(ps)]
        try:
            apgas.async_at(target, roaming_tree, depth - 1, fanout)
        except DeadPlaceError:  # it left meanwhile: do the work here
            apgas.async_(roaming_tree, depth - 1, fanout)


@pytest.mark.parametrize("seed", range(int(os.environ.get("APGAS_TEST_SEEDS", "5"))))
def test_no_task_is_lost_while_places_come_and_go_under_reordering(seed):
    def main():
        address = apgas.define_malleable_handler(Recorder()).address
        results: list[int] = []
        errors: list[BaseException] = []

        def compute():
            try:
                for _ in range(4):
                    with apgas.finish():
                        for p in apgas.places():
                            apgas.async_at(p, roaming_tree, 4, 2)
                    results.append(read_tally())
            except BaseException as e:
                errors.append(e)

        worker = threading.Thread(target=compute, daemon=True)
        worker.start()
        assert order(address, "grow 2 nodeA nodeB")[0].startswith("ok")
        assert len(order(address, "shrink 2")) == 2
        assert order(address, "grow 1 nodeC")[0].startswith("ok")
        assert len(order(address, "shrink 1")) == 1
        worker.join(60)
        return results, errors

    results, errors = apgas.run(main, places=3, threads=2, chaos=f"{seed}:2")
    assert errors == []
    assert len(results) == 4 and all(r % 31 == 0 and r >= 3 * 31 for r in results), results


PLUGIN = '''
from apgas.malleable import MalleableCommunicator

class Recording(MalleableCommunicator):
    """A communicator found through the entry-point group apgas.communicators."""
    def start(self):
        self.messages = []
    def report(self, message):
        self.messages.append(message)
    def stop(self):
        self.messages.append("stopped")
'''


def test_communicators_come_from_entry_points(tmp_path, monkeypatch):
    (tmp_path / "fake_communicator.py").write_text(PLUGIN)
    info = tmp_path / "fake_communicator-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-communicator\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[apgas.communicators]\nrecording = fake_communicator:Recording\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("APGAS_COMMUNICATOR", "recording")

    def main():
        comm = apgas.define_malleable_handler(Recorder())
        added = comm.orders.grow(1, ["nodeA"])  # what a scheduler's order would call
        return type(comm).__name__, ids(added), comm, ids(apgas.places())

    name, added, comm, live = apgas.run(main, places=1)
    assert (name, added, live) == ("Recording", [1], [0, 1])
    assert comm.messages[0] == "APGAS-Ready" and comm.messages[-2:] == ["APGAS-NotMalleable", "stopped"]
    assert any(m.startswith("growTimeAPGAS;1;") for m in comm.messages)


def test_which_host_names_stand_for_this_machine(monkeypatch):
    from launcher import is_local_host
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "node1, node2")
    assert all(is_local_host(h) for h in ("localhost", "127.0.0.1", socket.gethostname(), "node1", "node2"))
    assert not is_local_host("node3")
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    assert is_local_host("node3")
