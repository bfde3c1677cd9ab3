"""A submit sent again is one job: the client's request key makes a submit whose reply
was lost (a crash, a restart) safe to send again, also across a restart."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from orders import free_address

from apgas_scheduler import client
from apgas_scheduler.client import SchedulerError, SchedulerUnreachable, request
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.live.state import DB_NAME, StateStore
from apgas_scheduler.policies import get_policy
from benchmarks.scheduler_crash import Serve

pytestmark = pytest.mark.timeout(60)
JOB = {"name": "once", "command": ["/bin/true"], "class": "rigid", "nodes": 1, "walltime": 30}


def test_the_same_key_twice_is_one_job(make_scheduler):
    s = make_scheduler(nodes=1, policy="fcfs")
    key = client.new_request_key()
    first = request(s.address, "submit", job=JOB, request=key)["id"]
    assert request(s.address, "submit", job=JOB, request=key)["id"] == first
    other = request(s.address, "submit", job=JOB, request=client.new_request_key())["id"]
    assert other != first and len(s.status()["jobs"]) == 2
    assert request(s.address, "submit", job=JOB)["id"] not in (first, other)  # no key: always new


@pytest.mark.parametrize("key", ["short", "x" * 65, "has space!", 7])
def test_a_bad_key_is_refused_saying_why(make_scheduler, key):
    s = make_scheduler(nodes=1, policy="fcfs")
    with pytest.raises(SchedulerError, match="request key"):
        request(s.address, "submit", job=JOB, request=key)
    assert s.status()["jobs"] == []


def test_a_key_holds_across_a_restart(tmp_path):
    def start() -> Scheduler:
        return Scheduler(["n0"], get_policy("fcfs"), port=0, interval=0.2,
                         output_dir=tmp_path / "out", state_dir=tmp_path / "state").start()

    key = client.new_request_key()
    s = start()
    try:
        first = client.submit(s.address, JOB, request_key=key)
    finally:
        s.shutdown()
        for t in list(s._threads):
            t.join(10)
    s = start()
    try:
        assert client.submit(s.address, JOB, request_key=key) == first
        assert [j["id"] for j in s.status()["jobs"]] == [first]
    finally:
        s.shutdown()
        for t in list(s._threads):
            t.join(10)


class LosesFirstReply:
    """A port in front of the scheduler that passes each request on but drops the
    first reply, as a scheduler killed between its commit and its answer would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = self.server.getsockname()
        self.passed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                with socket.create_connection(self.target, timeout=10) as upstream:
                    upstream.sendall(line)
                    reply = upstream.makefile("rb").readline()
                self.passed += 1
                if self.passed > 1:
                    conn.sendall(reply)

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.server.close()


def test_a_submit_whose_reply_was_lost_is_sent_again_and_runs_once(make_scheduler):
    s = make_scheduler(nodes=1, policy="fcfs")
    proxy = LosesFirstReply(s.address)
    try:
        job_id = client.submit(proxy.address, JOB, retry_for=30)  # lost, sent again, answered
    finally:
        proxy.close()
    assert proxy.passed == 2
    assert [j["id"] for j in s.status()["jobs"]] == [job_id]  # the scheduler saw it twice: one job


def test_without_a_retry_the_caller_hears_that_the_submit_went_out(make_scheduler):
    s = make_scheduler(nodes=1, policy="fcfs")
    proxy = LosesFirstReply(s.address)
    try:
        with pytest.raises(SchedulerUnreachable) as lost:
            client.submit(proxy.address, JOB)
    finally:
        proxy.close()
    assert lost.value.sent and len(s.status()["jobs"]) == 1
    with pytest.raises(SchedulerUnreachable) as refused:
        client.submit(free_address(), JOB)  # nobody listens there

    assert not refused.value.sent


def all_stopped(pid: int, within: float) -> bool:
    """Whether every thread of ``pid`` is stopped (state T) within ``within`` s: a
    SIGSTOP is not in force before each thread has noticed it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended
        if states and all(state == "T" for state in states):
            return True
        time.sleep(0.01)
    return False


def test_a_connection_closed_before_it_was_taken_fails_at_once(monkeypatch):
    """A client waiting for the server to take its connection (a server that names
    no owner until then: root's, or any on older kernels) hears at once, not after
    its timeout, that the server closed its port, and that nothing went out."""
    queued = threading.Event()
    asked: list[int] = []

    def no_owner_yet(conn: socket.socket) -> None:
        asked.append(1)
        if len(asked) > 1:  # asked again: the client waits to be taken
            queued.set()
        return None

    monkeypatch.setattr(client, "peer_uid", no_owner_yet)
    listener = socket.create_server(("127.0.0.1", 0))  # listens, never accepts
    caught: list[tuple[BaseException, float]] = []

    def ask() -> None:
        try:
            request(listener.getsockname(), "status", timeout=30, key="k" * 32)
        except BaseException as e:  # noqa: BLE001 (looked at below)
            caught.append((e, time.monotonic()))

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        assert queued.wait(10), "the client never connected"
    finally:
        listener.close()  # the queued connection is reset
        closed = time.monotonic()
    asker.join(40)
    assert not asker.is_alive() and len(caught) == 1
    error, ended = caught[0]
    assert isinstance(error, SchedulerUnreachable) and not error.sent, error
    # timed from the close, not the connect (a loaded machine may be slow to get there);
    # the client's 30 s timeout ran from before it
    seconds = ended - closed
    assert seconds < 10, f"{seconds:.1f} s: the client waited for its timeout"


def test_a_tcp_submit_survives_a_daemon_killed_with_it_in_its_queue(tmp_path, monkeypatch):
    """serve stopped, a submit with retry_for over TCP connects (its connection waits
    in serve's queue), serve is SIGKILLed and started again 0.3 s later: the submit
    is sent again at once, not after the client's 30 s connect timeout, and is one job."""
    serve = Serve(tmp_path, nodes=1)
    serve.start()
    connected = threading.Event()  # once it waits to be taken, or knows its server
    nameless: list[bool] = []  # whether the queued connection named no owner
    real_peer_uid = client.peer_uid

    def watched(conn: socket.socket) -> int | None:
        uid = real_peer_uid(conn)
        nameless.append(uid is None)
        if uid is not None or len(nameless) > 1:
            connected.set()
        return uid

    monkeypatch.setattr(client, "peer_uid", watched)
    failures: list[SchedulerUnreachable] = []
    real_request = client.request

    def counted(*args, **kwargs):
        try:
            return real_request(*args, **kwargs)
        except SchedulerUnreachable as e:
            failures.append(e)
            raise

    monkeypatch.setattr(client, "request", counted)
    outcome: list[tuple[int | BaseException, float]] = []

    def submit() -> None:
        try:
            outcome.append((client.submit(serve.address, JOB, retry_for=30, key=serve.key()),
                            time.monotonic()))
        except BaseException as e:  # noqa: BLE001 (looked at below)
            outcome.append((e, time.monotonic()))

    submitter = threading.Thread(target=submit, daemon=True)
    try:
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGSTOP)
        assert all_stopped(serve.proc.pid, 10), "serve did not stop"  # takes no connection now
        submitter.start()
        assert connected.wait(10), "the client never connected"
        waited_unnamed = all(nameless)  # the server never named itself: root's, an older kernel
        serve.kill()
        time.sleep(0.3)
        serve.start()
        restarted = time.monotonic()
        submitter.join(40)
        assert not submitter.is_alive() and len(outcome) == 1
        job_id, ended = outcome[0]
        assert isinstance(job_id, int), job_id
        # timed from the restart, not the connect (a loaded machine may be slow to start
        # serve again); the client's 30 s connect timeout ran from before it
        seconds = ended - restarted
        assert seconds < 10, f"{seconds:.1f} s: the submit waited for the client's timeout"
        assert [j["id"] for j in serve.status()["jobs"]] == [job_id]
        assert failures, "the submit was never sent again"
        if waited_unnamed:  # the client was waiting to be taken: it knew nothing went out
            assert not failures[0].sent, failures[0]
    finally:
        serve.stop()
        submitter.join(5)


def test_a_state_of_the_previous_schema_is_taken_up(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / DB_NAME)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE nodes (position INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY, spec TEXT NOT NULL, owner INTEGER NOT NULL, secret TEXT NOT NULL,
            state TEXT NOT NULL, submit REAL NOT NULL, start REAL, end_time REAL, reason TEXT NOT NULL,
            nodes TEXT NOT NULL, listen TEXT, reports TEXT NOT NULL, ready INTEGER NOT NULL,
            disabled INTEGER NOT NULL, grows INTEGER NOT NULL, shrinks INTEGER NOT NULL,
            identity TEXT);
        CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1'), ('started', '0.0');
    """)
    spec = {**JOB, "walltime": 30.0, "env": {}, "cwd": ""}
    db.execute("INSERT INTO jobs VALUES (1, ?, 0, 's', 'done', 0, 1, 2, '', '[]', NULL, '', 0, 0, "
               "0, 0, NULL)", (json.dumps(spec),))
    db.commit()
    db.close()
    (state / DB_NAME).chmod(0o600)
    store = StateStore(state)
    try:
        (job,) = store.jobs()
        assert (job.id, job.state, job.request) == (1, "done", None)
    finally:
        store.close()
