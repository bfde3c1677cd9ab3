"""The accept loop every line server shares (``apgas.lowlevel.serve_connections``)
never stops serving: not after every descriptor was taken (EMFILE), not for
slow clients (a total deadline per connection), not for too many idle ones (a cap)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from apgas.lowlevel import LineTooLong, discard_rest, read_line, serve_connections

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


def test_connections_over_the_cap_are_closed_at_once_and_the_server_goes_on():
    with serving(max_connections=3, deadline=30.0) as (address, _):
        idle = [socket.create_connection(address, timeout=5) for _ in range(3)]
        try:
            time.sleep(0.3)  # all three accepted and held
            with socket.create_connection(address, timeout=5) as extra:
                start = time.monotonic()
                extra.sendall(b"ping\n")
                try:
                    assert extra.recv(100) == b""  # closed without an answer
                except ConnectionResetError:
                    pass
                assert time.monotonic() - start < 2
            idle.pop().close()
            deadline = time.monotonic() + 5
            while True:  # the freed slot comes back once its handler has seen the close
                try:
                    reply = ask(address)
                except ConnectionResetError:  # still over the cap: closed with our line unread
                    reply = b""
                if reply or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert reply == b"pong ping\n"
        finally:
            for conn in idle:
                conn.close()


_SERVER = textwrap.dedent("""
    import resource, socket, sys, logging
    from apgas.lowlevel import read_line, serve_connections

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
        assert time.monotonic() - start < 1
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
        from apgas_scheduler.daemon import Scheduler
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
