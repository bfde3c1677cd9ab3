"""The accept loop every line server shares (``apgas.serving.serve_connections``)
never stops serving: not after every descriptor was taken (EMFILE), not for
slow clients (a total deadline per connection), not for too many idle ones (a cap,
shared fairly per peer: the flooder's waiting connections are the ones evicted)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from apgas.serving import (
    LineTooLong,
    PeerLog,
    connection_peer,
    discard_rest,
    loggable,
    read_head,
    read_line,
    serve_connections,
)

pytestmark = pytest.mark.timeout(60)
MAX_LINE = 4096


def _echo(conn: socket.socket, read_by: float) -> None:
    try:
        line = read_line(conn, MAX_LINE, read_by)
    except LineTooLong as e:
        discard_rest(conn, read_by)  # else the close resets the connection, reply and all
        conn.sendall(f"error {e}\n".encode())
        return
    except OSError:
        return
    if line is not None:
        conn.sendall(b"pong " + line + b"\n")


@contextlib.contextmanager
def serving(handle=_echo, **options):
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    thread = threading.Thread(target=serve_connections, args=(server, handle),
                              kwargs={"name": "test", "stopped": stop.is_set, **options}, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[:2], thread
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        assert not thread.is_alive(), "the accept loop did not return after its socket closed"


def ask(address, line: bytes = b"ping", timeout: float = 5.0) -> bytes:
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(line + b"\n")
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    return data


def test_a_request_is_answered_and_the_loop_returns_when_the_socket_closes():
    with serving() as (address, _):
        assert ask(address) == b"pong ping\n"
        assert ask(address, b"x" * (MAX_LINE + 10)) == f"error line longer than {MAX_LINE} bytes\n".encode()


def test_a_failing_handler_ends_its_connection_only():
    def handle(conn, read_by):
        if read_line(conn, MAX_LINE, read_by) == b"boom":
            raise RuntimeError("boom")
        conn.sendall(b"fine\n")

    with serving(handle) as (address, _):
        assert ask(address, b"boom") == b""
        assert ask(address, b"hello") == b"fine\n"


def test_the_loop_returns_only_after_the_request_that_stopped_it_is_answered():
    """A ``shutdown`` request closes the server from its own handler; the process
    may exit when the loop returns, so the answer must be out by then."""
    server = socket.create_server(("127.0.0.1", 0))
    stop, answered = threading.Event(), threading.Event()
    release = threading.Event()

    def handle(conn, read_by):
        read_line(conn, MAX_LINE, read_by)
        stop.set()
        server.shutdown(socket.SHUT_RDWR)  # the accept loop ends now, the answer is still due
        release.wait(10)
        conn.sendall(b"stopped\n")
        answered.set()

    loop = threading.Thread(target=serve_connections, args=(server, handle),
                            kwargs={"name": "test", "stopped": stop.is_set, "drain": 30.0})
    loop.start()
    try:
        with socket.create_connection(server.getsockname()[:2], timeout=10) as conn:
            conn.sendall(b"shutdown\n")
            assert stop.wait(10)
            loop.join(0.2)
            assert loop.is_alive(), "the loop returned with a request still being answered"
            release.set()
            assert conn.recv(64) == b"stopped\n"
        loop.join(10)
        assert answered.is_set() and not loop.is_alive()
    finally:
        release.set()
        server.close()
        loop.join(10)


def test_the_drain_is_bounded_by_a_handler_that_never_ends():
    started, release = threading.Event(), threading.Event()

    def handle(conn, read_by):
        started.set()
        release.wait(30)

    with serving(handle, drain=0.2) as (address, thread):
        conn = socket.create_connection(address, timeout=10)
        assert started.wait(10)
    try:
        assert not thread.is_alive()  # serving() joined it within 5 s although the handler waits
    finally:
        release.set()
        conn.close()


def test_slow_clients_are_cut_at_the_total_deadline():
    """Slow-loris: one byte every 0.5 s, never a newline; cut at 2 s in all, while
    an ordinary request is answered at once."""
    cut_after: list[float] = []

    def slow_client(address):
        with socket.create_connection(address, timeout=10) as conn:
            start = time.monotonic()
            try:
                while time.monotonic() - start < 8:
                    conn.sendall(b"x")
                    conn.settimeout(0.5)
                    try:
                        if conn.recv(1) == b"":
                            break  # the server closed it
                    except TimeoutError:
                        pass
            except OSError:
                pass  # reset by the server
            cut_after.append(time.monotonic() - start)

    with serving(deadline=2.0) as (address, _):
        clients = [threading.Thread(target=slow_client, args=(address,)) for _ in range(10)]
        for c in clients:
            c.start()
        time.sleep(0.3)
        assert ask(address) == b"pong ping\n"
        for c in clients:
            c.join(15)
    assert len(cut_after) == 10
    assert all(1.5 <= t <= 3.5 for t in cut_after), cut_after


def test_connections_over_the_cap_are_closed_at_once_when_all_are_being_served():
    """Three slots, all taken by requests being handled (none waits to be read): a
    fourth connection is closed at once; once one is done, the next is served."""
    release, read = threading.Event(), threading.Semaphore(0)

    def handle(conn, read_by):
        line = read_line(conn, MAX_LINE, read_by)
        if line == b"hold":
            read.release()
            release.wait(10)
        conn.sendall(b"pong " + (line or b"") + b"\n")

    with serving(handle, max_connections=3, per_peer=3, deadline=30.0) as (address, _):
        held = [socket.create_connection(address, timeout=5) for _ in range(3)]
        try:
            for conn in held:
                conn.sendall(b"hold\n")
            assert all(read.acquire(timeout=5) for _ in held)  # all three being handled
            with socket.create_connection(address, timeout=5) as extra:
                start = time.monotonic()
                extra.sendall(b"ping\n")
                try:
                    assert extra.recv(100) == b""  # closed without an answer
                except ConnectionResetError:
                    pass
                assert time.monotonic() - start < 10  # at once: not at the 30 s deadline
            release.set()
            assert all(conn.recv(100) == b"pong hold\n" for conn in held)
            assert all(conn.recv(100) == b"" for conn in held)  # done: their slots are free
            assert ask(address) == b"pong ping\n"
        finally:
            release.set()
            for conn in held:
                conn.close()


class Peers:
    """Clients under made-up peer names (the server names each by its source port),
    and what their handlers saw: each handler counts its entry (so that the test
    knows the order of the accepts) and says how its read ended; a line "hold"
    is held (being handled) until ``release`` is set."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.seen: dict[int, str | None] = {}  # connection_peer, as the handler saw it
        self.entered = threading.Semaphore(0)
        self.ended: dict[int, str] = {}
        self.changed = threading.Condition()
        self.release = threading.Event()

    def peer(self, conn: socket.socket) -> str:
        return self.names[conn.getpeername()[1]]

    def handle(self, conn: socket.socket, read_by: float) -> None:
        port = conn.getpeername()[1]
        self.seen[port] = connection_peer(conn)
        self.entered.release()
        try:
            line = read_line(conn, MAX_LINE, read_by)
        except ConnectionAbortedError:
            line = None
        with self.changed:
            self.ended[port] = "read" if line is not None else "evicted"
            self.changed.notify_all()
        if line == b"hold":
            self.release.wait(10)
        if line is not None:
            conn.sendall(b"pong " + line + b"\n")

    def connect(self, address, name: str, served: bool = True) -> socket.socket:
        """A connection from ``name``; if ``served``, once its handler has begun."""
        conn = socket.socket()
        conn.settimeout(5)
        conn.bind(("127.0.0.1", 0))
        self.names[conn.getsockname()[1]] = name
        conn.connect(address)
        if served:
            assert self.entered.acquire(timeout=5), "the server never served the connection"
        return conn

    def ending(self, conn: socket.socket) -> str:
        """How the read of ``conn``'s handler ended, waiting for it up to 5 s."""
        port = conn.getsockname()[1]
        with self.changed:
            assert self.changed.wait_for(lambda: port in self.ended, timeout=5)
            return self.ended[port]


def cut(conn: socket.socket) -> bool:
    """Whether the server closed ``conn`` (without an answer), waiting up to 5 s."""
    try:
        return conn.recv(100) == b""
    except ConnectionResetError:
        return True


def test_the_peer_with_the_most_pending_connections_loses_its_oldest():
    """Four slots: a holds three idle connections, b one. A newcomer of c evicts a's
    oldest (a has the most waiting); one of b, a tie at two with a, evicts a's
    oldest again (the oldest of those tied); b's and c's are never evicted,
    having fewer, and are answered."""
    peers = Peers()
    with serving(peers.handle, peer=peers.peer, max_connections=4, per_peer=4,
                 deadline=30.0) as (address, _):
        a1, a2, a3 = (peers.connect(address, "a") for _ in range(3))
        b1 = peers.connect(address, "b")
        with a1, a2, a3, b1:
            c1 = peers.connect(address, "c")
            assert cut(a1) and peers.ending(a1) == "evicted"
            b2 = peers.connect(address, "b")
            assert cut(a2) and peers.ending(a2) == "evicted"
            with c1, b2:
                for conn in (c1, b1, b2, a3):
                    conn.sendall(b"ping\n")
                    assert conn.recv(100) == b"pong ping\n"
                    assert peers.ending(conn) == "read"
    assert sorted(peers.seen.values()) == ["a", "a", "a", "b", "b", "c"]


def test_a_peer_over_its_share_makes_room_from_its_own_connections(caplog):
    """A share of two of eight slots: a's third connection evicts a's oldest idle
    one though slots are free; with both of a's being handled, a's next one is
    closed at once. b is served throughout; each case is logged."""
    peers = Peers()
    with caplog.at_level("WARNING", logger="apgas.serving"), \
            serving(peers.handle, peer=peers.peer, max_connections=8, per_peer=2,
                    deadline=30.0) as (address, _):
        a1, a2 = peers.connect(address, "a"), peers.connect(address, "a")
        a3 = peers.connect(address, "a")
        b1 = peers.connect(address, "b")
        with a1, a2, a3, b1:
            assert cut(a1) and peers.ending(a1) == "evicted"
            for conn in (a2, a3, b1):
                conn.sendall(b"hold\n")
                assert peers.ending(conn) == "read"
            with peers.connect(address, "a", served=False) as a4:
                assert cut(a4)
            peers.release.set()
            assert [c.recv(100) for c in (a2, a3, b1)] == [b"pong hold\n"] * 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("a holds 2 connections, the most one client may; its oldest unread one was "
               "closed" in m for m in messages), messages
    assert any("a holds 2 connections, the most one client may, all being served; a new one "
               "was closed at once" in m for m in messages), messages


def test_a_read_and_an_eviction_racing_are_decided_once():
    """A line arriving as an eviction comes: either the reader gets the whole line
    and the connection is not evicted, or it is evicted and the reader gets
    ConnectionAbortedError, never both, never a partial line; 300 times."""
    from apgas.serving import _connections as _serving

    for _ in range(300):
        loop = _serving._Loop(max_connections=4, per_peer=1)
        a, b = socket.socketpair()
        newcomer, other = socket.socketpair()
        with a, b, newcomer, other:
            with _serving._lock:
                assert loop.admit(a, "p").taken
            go = threading.Barrier(2)
            outcome: dict[str, object] = {}

            def read(a=a, go=go, outcome=outcome):
                go.wait()
                try:
                    outcome["line"] = read_line(a, MAX_LINE, time.monotonic() + 5, partial=True)
                except ConnectionAbortedError:
                    outcome["line"] = "aborted"

            reader = threading.Thread(target=read)
            reader.start()
            b.sendall(b"whole line\n")
            go.wait()
            with _serving._lock:
                admitted = loop.admit(newcomer, "p")
                if admitted.evicted is not None:
                    admitted.evicted.shutdown(socket.SHUT_RDWR)
            reader.join(5)
            if admitted.evicted is a:
                assert outcome["line"] == "aborted" and admitted.taken
            else:
                assert outcome["line"] == b"whole line" and not admitted.taken
            with _serving._lock:
                for conn in (a, newcomer):
                    slot = _serving._slots.pop(conn, None)
                    if slot is not None:
                        loop.release(conn, slot)
            assert loop.in_flight == 0 and not loop.held and not loop.pending


def test_read_head_reads_through_the_blank_line_within_bounds():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\nbody")
        assert read_head(a, 100, time.monotonic() + 1) == b"GET / HTTP/1.0\r\nHost: x\r\n\r\n"
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"GET / HTTP/1.0\nHost: x\n\n")
        assert read_head(a, 100, time.monotonic() + 1) == b"GET / HTTP/1.0\nHost: x\n\n"
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"GET / HTTP/1.0\r\nX: " + b"y" * 200)
        with pytest.raises(LineTooLong, match="request head longer than 100 bytes"):
            read_head(a, 100, time.monotonic() + 1)
    a, b = socket.socketpair()
    with a:
        b.sendall(b"GET / HTTP/1.0\r\n")
        b.close()
        assert read_head(a, 100, time.monotonic() + 1) is None


def test_read_head_cuts_a_trickle_at_the_whole_deadline():
    """A header byte every 0.2 s: each read comes well within any per-read timeout,
    yet the head is cut at its deadline, 1 s after it began."""
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle():
        for byte in b"GET / HTTP/1.0\r\nX-Slow: " + b"z" * 100:
            if stop.wait(0.2):
                return
            with contextlib.suppress(OSError):
                b.sendall(bytes([byte]))

    writer = threading.Thread(target=trickle)
    writer.start()
    with a, b:
        a.settimeout(0.5)  # per read, never reached
        start = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match="no whole request head"):
                read_head(a, 8192, start + 1.0)
            assert 0.9 <= time.monotonic() - start < 5  # the deadline, not the 20 s trickle
        finally:
            stop.set()
            writer.join(5)


def test_peer_log_says_a_peer_at_once_then_once_per_interval_with_a_count():
    import logging

    now = [100.0]
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test.peerlog")
    logger.propagate = False
    logger.addHandler(Keep())
    said = PeerLog(logger, interval=10.0, max_peers=3, max_lines=4, clock=lambda: now[0])
    assert said("uid 1", "refused %s", "x")
    assert not said("uid 1", "refused %s", "y") and not said("uid 1", "refused %s", "z")
    assert said("uid 2", "refused %s", "w")                  # another peer: at once
    now[0] += 10.0
    assert said("uid 1", "refused %s", "v")
    assert records == ["refused x", "refused w",
                       "refused v (2 more from uid 1 in the last 10 s not logged)"]
    for i in range(3, 10):  # many peers: at most max_lines (4) lines per interval in all
        said(f"ip 10.0.0.{i}", "refused")
    assert len(records) == 3 + 3  # "refused v" opened this interval
    now[0] += 10.0
    assert said("uid 9", "refused")
    assert records[-1].startswith("refused (") and "from other peers not logged" in records[-1]
    assert len(said._peers) <= 3


def test_loggable_cuts_and_escapes_a_clients_text():
    assert loggable("short") == "short"
    assert loggable("x" * 1000) == "x" * 200 + "... (800 more characters)"
    assert loggable(b"y" * 300, 10) == "y" * 10 + "... (290 more bytes)"
    assert "\n" not in loggable("line\nforged log line")


_SERVER = textwrap.dedent("""
    import resource, socket, sys, logging
    from apgas.serving import read_line, serve_connections

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
    server = socket.create_server(("127.0.0.1", 0), backlog=512)
    print(server.getsockname()[1], flush=True)

    def handle(conn, read_by):
        line = read_line(conn, 4096, read_by)
        if line is not None:
            conn.sendall(b"pong " + line + b"\\n")

    serve_connections(server, handle, name="nofile", max_connections=1000, deadline=60.0)
""")


def test_the_server_serves_again_after_every_descriptor_was_taken(tmp_path):
    """EMFILE: with its RLIMIT_NOFILE lowered to 64, a server gets 150 idle
    connections; once they close, an ordinary request is answered."""
    program = tmp_path / "server.py"
    program.write_text(_SERVER)
    proc = subprocess.Popen([sys.executable, str(program), "64"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    idle: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        address = ("127.0.0.1", port)
        for _ in range(150):
            idle.append(socket.create_connection(address, timeout=5))
        deadline = time.monotonic() + 10
        while not any("Too many open files" in line for line in said):
            assert time.monotonic() < deadline, f"the server never ran out of descriptors: {said}"
            time.sleep(0.05)
        for conn in idle:
            conn.close()
        idle.clear()
        assert ask(address, timeout=10) == b"pong ping\n"
        assert ask(address) == b"pong ping\n"
        assert proc.poll() is None, said
        assert any("serving on" in line for line in said), said
    finally:
        for conn in idle:
            conn.close()
        proc.kill()
        proc.wait()
        reader.join(5)


def test_read_line_enforces_size_deadline_and_close():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"one\ntwo\n")
        assert read_line(a, 10, time.monotonic() + 1) == b"one"
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x" * 11)
        with pytest.raises(LineTooLong, match="longer than 10 bytes"):
            read_line(a, 10, time.monotonic() + 1)
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"partial")
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            read_line(a, 10, start + 0.3)
        assert time.monotonic() - start < 10  # the deadline, not for ever
    a, b = socket.socketpair()
    with a:
        b.sendall(b"no newline")
        b.close()
        assert read_line(a, 100, time.monotonic() + 1) is None
    a, b = socket.socketpair()
    with a:
        a.settimeout(7.0)
        b.sendall(b"no newline")
        b.close()
        assert read_line(a, 100, time.monotonic() + 1, partial=True) == b"no newline"
        assert a.gettimeout() == 7.0  # as it was, for the reply


# -- the real servers: the scheduler's port and a job's order port ---------------------------

SERVERS = {
    "scheduler": """
        from apgas_scheduler.live.daemon import Scheduler
        from apgas_scheduler.policies import get_policy
        s = Scheduler(["n0"], get_policy("fcfs"), port=0, output_dir=sys.argv[2],
                      socket_path=sys.argv[2] + "/scheduler.sock")  # it is killed: not in /tmp
        print(s.address[1], flush=True)
        s.serve_forever()
    """,
    "job": """
        import apgas
        from launch_prog import Newest
        def main():
            print(apgas.define_malleable_handler(Newest()).address[1], flush=True)
            sys.stdin.readline()
        apgas.run(main, places=1)
    """,
}


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_the_real_servers_serve_again_after_every_descriptor_was_taken(server, tmp_path):
    """The attack of issue 16 on the scheduler and on a job's order port: more idle
    connections than the process may hold files, then closed; it answers again."""
    import os
    from pathlib import Path

    from apgas.order import send_order
    from apgas_scheduler.client import request

    program = tmp_path / "serve.py"
    program.write_text("import resource, sys\n"
                       "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                       "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))\n"
                       + textwrap.dedent(SERVERS[server]))
    tests = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
           "APGAS_MALLEABLE_LISTEN": "127.0.0.1:0"}
    proc = subprocess.Popen([sys.executable, str(program), "128", str(tmp_path)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        port = int(proc.stdout.readline())
        idle = []
        for _ in range(300):
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        time.sleep(0.5)  # it has met EMFILE by now
        for conn in idle:
            conn.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                if server == "scheduler":
                    assert request(("127.0.0.1", port), "status", timeout=3)["ok"]
                else:
                    assert send_order(("127.0.0.1", port), "status", 3)[0] == "status malleable 1"
                break
            except (OSError, AssertionError):
                assert time.monotonic() < deadline, f"the {server} stopped serving"
                time.sleep(0.2)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
