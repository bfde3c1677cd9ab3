"""The places' TCP ports keep nothing of a stranger's (issue 52, attacks 5, 9 and 10).

The attacker is a process of the user ``nobody`` (when the tests run as root;
else of this user, which changes nothing over TCP) speaking raw ZMTP with the
standard library only, as the audit's did. The victim is a place's transport.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import zmq

from apgas._core.transport import Transport
from launcher._curve import HANDSHAKE_S, keys_of

pytestmark = pytest.mark.timeout(60)

SYSTEM_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
AS = {"user": "nobody"} if os.geteuid() == 0 else {}
MiB = 1024 * 1024

# A ZMTP 3.0 peer with the NULL mechanism (RFC 23), from the standard library.
ZMTP = textwrap.dedent("""
    import socket, struct, sys, time

    def greeting(as_server):
        return (b"\\xff" + bytes(8) + b"\\x7f" + b"\\x03\\x00" + b"NULL".ljust(20, b"\\0")
                + bytes([as_server]) + bytes(31))

    def command(name, props):
        body = bytes([len(name)]) + name
        for k, v in props.items():
            body += bytes([len(k)]) + k + struct.pack(">I", len(v)) + v
        return b"\\x04" + bytes([len(body)]) + body

    def frame(data, more):
        if len(data) < 256:
            return bytes([1 if more else 0, len(data)]) + data
        return bytes([3 if more else 2]) + struct.pack(">Q", len(data)) + data

    def read_all(conn, until):
        got = b""
        conn.settimeout(0.2)
        while time.monotonic() < until:
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                if b"MARKER" in got:
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got
""")

FLOOD = ZMTP + textwrap.dedent("""
    # a client: greeting, READY, then frames with MORE that never end a message
    host, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conn = socket.create_connection((host, port))
    sent = 0
    try:
        conn.sendall(greeting(0) + command(b"READY", {b"Socket-Type": b"DEALER"}))
        chunk = frame(bytes(1 << 20), more=True)
        while sent < total:
            conn.sendall(chunk)
            sent += len(chunk)
        print("sent", sent, "open", flush=True)
    except OSError as e:
        print("sent", sent, "cut", type(e).__name__, flush=True)
""")

HOLD = ZMTP + textwrap.dedent("""
    # many clients that connect, greet (or not) and then say nothing
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conns = [socket.create_connection((host, port)) for _ in range(n)]
    for i, c in enumerate(conns):
        if i % 2:
            c.sendall(greeting(0))
    print("holding", flush=True)
    start = time.monotonic()
    closed = set()
    while len(closed) < n and time.monotonic() - start < float(sys.argv[4]):
        for i, c in enumerate(conns):
            if i in closed:
                continue
            c.settimeout(0.01)
            try:
                while c.recv(4096):
                    pass
                closed.add(i)
            except socket.timeout:
                pass
            except OSError:
                closed.add(i)
    print("closed", len(closed), "after", round(time.monotonic() - start, 1), flush=True)
""")

SQUAT = ZMTP + textwrap.dedent("""
    # a NULL server on a port a place left: what does the run send it?
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
    conn.sendall(greeting(1) + command(b"READY", {b"Socket-Type": b"ROUTER"}))
    got = read_all(conn, time.monotonic() + float(sys.argv[1]))
    print(len(got), b"MARKER" in got, flush=True)
""")


def attacker(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([SYSTEM_PY, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            text=True, cwd="/", **AS)  # type: ignore[call-overload]


@pytest.fixture
def place():
    received: list[object] = []
    transport = Transport(1, os.urandom(32), "127.0.0.1", lambda *a: received.append(a))
    transport.start()
    try:
        yield transport
    finally:
        transport.close()


def port_of(transport: Transport) -> int:
    return int(transport.endpoint.rsplit(":", 1)[1])


def test_a_strangers_endless_message_is_cut_at_the_greeting(place):
    """Attack 5: raw frames with MORE that never end took places from 31 to 543 MiB."""
    proc = attacker(FLOOD, "127.0.0.1", port_of(place), 256 * MiB)
    try:
        out, _ = proc.communicate(timeout=40)
    finally:
        proc.kill()
    words = out.split()
    assert words[0] == "sent" and words[2] == "cut", out  # the place hung up on it
    assert int(words[1]) < 64 * MiB, f"the place took {int(words[1]) / MiB:.0f} MiB first: {out}"


def test_connections_that_never_finish_the_handshake_are_closed(place):
    """Attack 9: held ZMTP connections used a place's descriptors up (EMFILE)."""
    n = 20
    proc = attacker(HOLD, "127.0.0.1", port_of(place), n, HANDSHAKE_S + 20)
    try:
        assert proc.stdout.readline().strip() == "holding"
        out, _ = proc.communicate(timeout=HANDSHAKE_S + 30)
    finally:
        proc.kill()
    words = out.split()
    assert words[:2] == ["closed", str(n)], f"connections still held: {out}"
    assert float(words[3]) <= HANDSHAKE_S + 10, out


def test_a_process_on_a_port_the_place_left_receives_nothing(place):
    """Attack 10: links and reply channels reconnect to a place that ended; another user
    who binds its port was handed the run's messages."""
    proc = attacker(SQUAT, 20)
    try:
        squatted = f"tcp://127.0.0.1:{int(proc.stdout.readline())}"
        place.connect(7, squatted)  # place 7 "ended"; its port is the attacker's now
        place.send(7, 200, 1, 2, [b"MARKER secret payload"])
        out, _ = proc.communicate(timeout=40)
    finally:
        proc.kill()
    size, marker = out.split()
    assert marker == "False", f"the squatter got the message: {out}"
    assert int(size) <= 64, f"the squatter got more than a greeting: {out}"


def test_a_client_with_the_runs_key_is_served(place):
    """The other side: a socket holding the run's key gets through (as places and the
    launcher's supervisor do), one without it does not."""
    ctx = zmq.Context()
    try:
        good, bad = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        keys = place._keys
        keys.connect_as_client(good)
        stranger = keys_of(os.urandom(32))
        bad.setsockopt(zmq.CURVE_SERVERKEY, keys.public)  # knows the public key only
        bad.setsockopt(zmq.CURVE_PUBLICKEY, stranger.public)
        bad.setsockopt(zmq.CURVE_SECRETKEY, stranger.secret)
        events = {}
        for name, sock in (("good", good), ("bad", bad)):
            monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                              | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            sock.connect(place.endpoint)
            events[name] = (sock, monitor)
        results = {}
        for name, (sock, monitor) in events.items():
            assert monitor.poll(10_000), f"no handshake outcome for the {name} client"
            results[name] = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
        assert results == {"good": zmq.EVENT_HANDSHAKE_SUCCEEDED,
                           "bad": zmq.EVENT_HANDSHAKE_FAILED_AUTH}, results
    finally:
        ctx.term()


def test_the_key_pair_is_the_runs_own():
    secret = os.urandom(32)
    assert keys_of(secret).public == keys_of(secret).public
    assert keys_of(secret).public != keys_of(os.urandom(32)).public
    assert zmq.curve_public(keys_of(secret).secret) == keys_of(secret).public

