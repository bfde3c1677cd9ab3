"""Issue 28's floods, each failing against a real scheduler: one user's idle
connections lock no one else out (6), a dashboard slowloris is cut at its deadline
while the operator's page loads (7), and a flood of refused lines writes almost
nothing to the log (8). Also: who a peer is, told by the kernel, from both ends.

The attackers run as the user ``nobody`` with the system Python (no apgas there),
so these tests need root to act as another user."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from apgas import auth
from apgas.serving import _connections as _serving
from apgas.serving import _peers, peer_is_local, peer_key, peer_uid
from apgas_scheduler.client import request
from apgas_scheduler.live.dashboard import HEAD_DEADLINE, PER_CLIENT

pytestmark = pytest.mark.timeout(120)
SYSTEM_PY = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root to act as the users nobody and daemon")
NOBODY, DAEMON = 65534, 1
SHARE = 64  # connections one user may hold at each door of the scheduler: a quarter of its 256


@contextlib.contextmanager
def as_user(user: str, code: str, *args: str):
    """``code`` running as ``user`` (system Python), its stdin and stdout piped; its
    stdin closed and the process reaped on leaving."""
    proc = subprocess.Popen([SYSTEM_PY, "-c", code, *args], user=user, cwd="/", text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


ASK_STATUS = """
import socket, sys
print("ready", flush=True)
for _ in sys.stdin:                     # a status over the Unix socket for each line
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(sys.argv[1])
        s.sendall(b'{"op": "status"}\\n')
        print(s.makefile().readline().strip(), flush=True)
"""


def unix_status(asker: subprocess.Popen) -> dict:
    """``status`` over the Unix socket, asked by ``asker`` (``ASK_STATUS`` run as its
    user, started once: no interpreter's start in the time an ask takes)."""
    asker.stdin.write("status\n")  # type: ignore[union-attr]
    asker.stdin.flush()  # type: ignore[union-attr]
    return json.loads(asker.stdout.readline())  # type: ignore[union-attr]


# -- who is at the other end ---------------------------------------------------------------

LISTEN = """
import socket, sys
family = socket.AF_INET6 if sys.argv[1] == "::" else socket.AF_INET
server = socket.create_server((sys.argv[1], 0), family=family, dualstack_ipv6=sys.argv[1] == "::")
print(server.getsockname()[1], flush=True)
if sys.stdin.readline():      # accept when told
    conn = server.accept()[0]
    print("accepted", flush=True)
    sys.stdin.readline()
"""

CONNECT = """
import socket, sys
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(conn.getsockname()[1], flush=True)
if sys.argv[2] == "hang up":
    conn.sendall(b"bye")
    conn.close()
    print("closed", flush=True)
sys.stdin.readline()
"""


def both_ways(conn: socket.socket) -> tuple[int | None, int | None]:
    """The owner of ``conn``'s other end by sock_diag and by /proc/net/tcp*."""
    (peer, peer_port), (local, local_port) = conn.getpeername()[:2], conn.getsockname()[:2]
    ends = (_peers._address(peer), peer_port, _peers._address(local), local_port)
    return _peers._diag_owner(*ends), _peers._proc_owner(*ends)


@needs_root
@pytest.mark.parametrize("host", ["127.0.0.1", "::"])
def test_a_client_learns_who_listens_on_a_local_port(host):
    """A port squatted by nobody (IPv4, or dual-stack IPv6 reached over IPv4): the
    client sees uid 65534 both before and after nobody accepts, by either lookup."""
    with as_user("nobody", LISTEN, host) as squatter:
        port = int(squatter.stdout.readline())  # type: ignore[union-attr]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            assert peer_uid(conn) == NOBODY and both_ways(conn) == (NOBODY, NOBODY)
            squatter.stdin.write("accept\n")  # type: ignore[union-attr]
            squatter.stdin.flush()  # type: ignore[union-attr]
            assert squatter.stdout.readline() == "accepted\n"  # type: ignore[union-attr]
            assert peer_uid(conn) == NOBODY and both_ways(conn) == (NOBODY, NOBODY)
            assert peer_key(conn) == f"uid {NOBODY}" and peer_is_local(conn)


@needs_root
def test_a_server_learns_who_connects_and_no_hang_up_passes_for_root():
    """Over TCP and a Unix socket a server tells nobody's connection from its own;
    a client that sent its line and hung up is never taken for root."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    with server, socket.create_connection(server.getsockname()) as mine:
        with server.accept()[0] as accepted:
            assert peer_uid(accepted) == os.geteuid() and peer_uid(mine) == os.geteuid()
        for mode in ("stay", "hang up"):
            with as_user("nobody", CONNECT, str(server.getsockname()[1]), mode) as client:
                port = int(client.stdout.readline())  # type: ignore[union-attr]
                if mode == "hang up":
                    assert client.stdout.readline() == "closed\n"  # type: ignore[union-attr]
                with server.accept()[0] as theirs:
                    assert theirs.getpeername()[1] == port
                    if mode == "stay":
                        assert peer_uid(theirs) == NOBODY and both_ways(theirs) == (NOBODY, NOBODY)
                    else:
                        assert peer_uid(theirs) in (NOBODY, None)  # never 0
                        assert peer_key(theirs) in (f"uid {NOBODY}", "ip 127.0.0.1")
    shared = Path(tempfile.mkdtemp(prefix="apgas-peer-"))  # where nobody may go
    shared.chmod(0o755)
    path = shared / "peer.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.settimeout(10)
    with unix:
        unix.bind(str(path))
        path.chmod(0o666)
        unix.listen()
        code = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); sys.stdin.readline()"
        with as_user("nobody", code, str(path)):
            with unix.accept()[0] as theirs:
                assert peer_uid(theirs) == NOBODY and peer_key(theirs) == f"uid {NOBODY}"
    shutil.rmtree(shared)


def test_a_peer_that_hung_up_before_the_accept_costs_no_walk_of_the_socket_table(monkeypatch):
    """A client that connects and hangs up before the server accepts leaves its end an
    entry without a socket (FIN_WAIT, then TIME_WAIT): the server learns that from one
    sock_diag lookup, without walking /proc/net/tcp, which the churn of a flood fills
    with tens of thousands of entries: a walk for each of the flood's connections
    still queued when it ends kept the accept loop from root's status for over a minute."""
    walked: list[tuple] = []
    monkeypatch.setattr(_peers, "_proc_owner", lambda *ends: walked.append(ends))
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        socket.create_connection(server.getsockname()).close()  # its FIN goes out at once
        with server.accept()[0] as gone:
            assert gone.recv(1) == b""  # the client's FIN: its end has left ESTABLISHED
            uid = peer_uid(gone)  # its owner, if still named; never root for a hang-up
            assert uid is None or uid == os.geteuid() != 0, uid
        with socket.create_connection(server.getsockname()) as mine, server.accept()[0] as theirs:
            assert peer_uid(theirs) == os.geteuid() and peer_uid(mine) == os.geteuid()
    assert walked == []


# -- (6) one user's idle connections lock no one out ---------------------------------------

FLOOD = """
import errno, json, selectors, socket, sys, time
host, port, path, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
doors = [(socket.AF_INET, (host, port)), (socket.AF_UNIX, path)]
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, None)
later, cut, told = [], [0, 0], set()

def connect(door):
    s = socket.socket(doors[door][0], socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(doors[door][1])
    except OSError as e:
        if e.errno != errno.EINPROGRESS:   # a Unix socket's full backlog: again soon
            s.close()
            later.append(door)
            return
    sel.register(s, selectors.EVENT_READ, door)

for door in (0, 1):
    for _ in range(count):
        connect(door)
print("holding", flush=True)
end = time.monotonic() + 90
while time.monotonic() < end:
    events = sel.select(0.005 if later else 0.5)
    if any(key.data is None for key, _ in events):
        break                               # stdin closed: the test is done
    for key, _ in events:
        try:
            gone = key.fileobj.recv(4096) == b""
        except OSError:
            gone = True
        if gone:                            # cut by the server: again at once
            sel.unregister(key.fileobj)
            key.fileobj.close()
            cut[key.data] += 1
            if key.data not in told:
                told.add(key.data)
                print("cut", key.data, flush=True)
            connect(key.data)
    retry, later[:] = list(later), []
    for door in retry:
        connect(door)
print(json.dumps(cut), flush=True)
"""


def held_by(peer: str) -> list[int]:
    """How many connections each accept loop keeps in flight for ``peer``."""
    with _serving._lock:
        counts = Counter(id(slot.loop) for slot in _serving._slots.values()
                         if slot.peer == peer and slot.state != "evicted")
    return sorted(counts.values())


@needs_root
def test_one_users_idle_connections_lock_no_one_else_out(make_scheduler, tmp_path):
    """nobody holds its share of idle connections to the TCP port and to the Unix
    socket (mode 0666) and keeps 8 more queued at each, opening a new one for each
    the scheduler cuts. Meanwhile root's status over both doors, daemon's over the
    socket and a job's signed message each get through, 10 times in 10; nobody never
    holds more than its quarter; and once nobody is gone, what it left queued (each
    a connection hung up before it was accepted) is cleared for root's status."""
    s = make_scheduler(nodes=2, policy="fcfs", socket_mode=0o666)
    started = threading.Event()

    def watch(record: dict) -> None:  # the scheduler's every event, as it happens
        if record["event"] == "start":
            started.set()

    s.core.watchers.append(watch)
    job = request(s.address, "submit", job={"name": "j", "command": ["/bin/sh", "-c", "sleep 60"],
                                            "class": "rigid", "nodes": 1, "walltime": 90,
                                            "cwd": str(tmp_path)})["id"]
    assert started.wait(30), "the job did not start"
    took: dict[str, list[float]] = {"tcp": [], "unix": [], "daemon": [], "job": []}
    with as_user("daemon", ASK_STATUS, str(s.socket_path)) as daemon, \
            as_user("nobody", FLOOD, *map(str, s.address), str(s.socket_path),
                    str(SHARE + 8)) as flood:
        assert daemon.stdout.readline() == "ready\n"  # type: ignore[union-attr]
        lines = [flood.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        assert sorted(lines) == ["cut 0\n", "cut 1\n", "holding\n"], lines  # both doors full
        for _ in range(10):
            for door, ask in (
                    ("tcp", lambda: request(s.address, "status", timeout=20)),
                    ("unix", lambda: request(s.address, "status", timeout=20,
                                             socket_path=s.socket_path)),
                    ("daemon", lambda: unix_status(daemon)),
                    ("job", lambda: job_asks(s, job))):
                start = time.monotonic()
                assert ask()["ok"], door
                took[door].append(time.monotonic() - start)
            assert all(n <= SHARE for n in held_by(f"uid {NOBODY}"))
        flood.stdin.close()  # type: ignore[union-attr]
        cut = json.loads(flood.stdout.readline())  # type: ignore[union-attr]
    print(f"\nduring the flood ({cut[0]} TCP and {cut[1]} Unix connections of nobody cut): "
          + "; ".join(f"{door} max {max(t):.3f} s, median {sorted(t)[5]:.3f} s"
                      for door, t in took.items()))
    assert cut[0] > 0 and cut[1] > 0
    assert request(s.address, "status")["ok"]


def job_asks(s, job: int) -> dict:
    """The job's own signed ask over TCP; answered (fcfs grows no job) if it got in."""
    line = auth.sign(s._jobs[job].secret, f"Evolving;Request;1:127.0.0.1:{job}")
    with socket.create_connection(s.address, timeout=20) as conn:
        conn.sendall(line.encode() + b"\n")
        answer = conn.makefile().readline()
    return {"ok": answer.startswith("error policy fcfs"), "answer": answer}


# -- (7) a dashboard slowloris -------------------------------------------------------------

SLOWLORIS = """
import json, selectors, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
began = {}
for _ in range(count):
    s = socket.create_connection((host, port))
    s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\nX-Slow: ")
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    began[s] = time.monotonic()
print("connected", flush=True)
lived, tick, end = [], time.monotonic() + 1, time.monotonic() + 30
while began and time.monotonic() < end:
    for key, _ in sel.select(max(0.0, tick - time.monotonic())):
        try:
            gone = key.fileobj.recv(4096) == b""
        except OSError:
            gone = True
        if gone:
            lived.append(time.monotonic() - began.pop(key.fileobj))
            sel.unregister(key.fileobj)
            key.fileobj.close()
    if time.monotonic() >= tick:               # one more header byte each, every second
        tick += 1
        for s in began:
            try:
                s.send(b"a")
            except OSError:
                pass
print(json.dumps({"lived": lived, "left": len(began)}), flush=True)
"""


def load_page(address: tuple[str, int], token: str) -> float:
    """The operator's page, token traded for the cookie as a browser does; the time taken."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.request("GET", f"/?token={token}")
    redirect = conn.getresponse()
    assert redirect.status == 303, redirect.status
    cookie = redirect.getheader("Set-Cookie", "").split(";")[0]
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.request("GET", "/", headers={"Cookie": cookie})
    page = conn.getresponse()
    assert page.status == 200 and b'"stream":"/stream"' in page.read()
    return time.monotonic() - start


@needs_root
def test_a_dashboard_slowloris_is_cut_at_the_deadline_and_the_page_loads(make_scheduler):
    """40 connections of nobody send a header byte every second and never end their
    head. Beyond nobody's share they are evicted at once; the rest are cut at the
    head deadline, however the bytes trickle. The operator's page loads every time."""
    s = make_scheduler(nodes=1, policy="fcfs", dashboard=("127.0.0.1", 0))
    address, token = s.dashboard.address, s.dashboard.url.rpartition("token=")[2]
    loads: list[float] = []
    with as_user("nobody", SLOWLORIS, *map(str, address), "40") as slow:
        assert slow.stdout.readline() == "connected\n"  # type: ignore[union-attr]
        attack = time.monotonic()
        for _ in range(5):
            loads.append(load_page(address, token))
            threading.Event().wait(0.6)  # pacing: loads spread over the attack
        during = time.monotonic() - attack
        result = json.loads(slow.stdout.readline())  # type: ignore[union-attr]
    lived = sorted(result["lived"])
    print(f"\npage loads during the slowloris: {', '.join(f'{t:.3f}' for t in loads)} s; "
          f"slow connections lived {lived[0]:.2f} .. {lived[-1]:.2f} s")
    assert result["left"] == 0 and len(lived) == 40
    assert lived[-1] < HEAD_DEADLINE + 1.5, lived  # the trickle bought no time
    survivors = [t for t in lived if t > 1]
    assert len(survivors) <= PER_CLIENT and min(survivors) > during, lived  # alive throughout
    assert load_page(address, token) < 5


# -- (8) filling the disk -------------------------------------------------------------------

class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_flood_of_refused_megabyte_lines_writes_almost_nothing_to_the_log(make_scheduler):
    """200 lines of 1 MiB to the TCP port, unsigned job messages, forged signed lines
    and unsigned requests in turn: each refused, a few short lines logged in all,
    and the scheduler answers at once after."""
    s = make_scheduler(nodes=1, policy="fcfs")
    kept = Kept()
    loggers = [logging.getLogger(name) for name in ("scheduler", "apgas.serving")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(kept)
        logger.setLevel(logging.DEBUG)
    size = 1 << 20
    forger = auth.new_secret()
    kinds = [b"APGAS-Ready:" + b"x" * (size - 16) + b":99",
             auth.sign(forger, "APGAS-Ready:1.2.3.4:" + "y" * (size - 200)).encode(),
             b'{"op": "submit", "job": "' + b"z" * (size - 30) + b'"}']
    start = time.monotonic()
    try:
        for i in range(200):
            line = kinds[i % 3]
            assert len(line) <= size
            with socket.create_connection(s.address, timeout=20) as conn:
                conn.sendall(line + b"\n")
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):
                    pass
        took = time.monotonic() - start
        assert request(s.address, "status", timeout=10)["ok"]
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(kept)
            logger.setLevel(level)
    logged = [m for m in kept.messages if not m.startswith("event ")]
    print(f"\n200 lines of 1 MiB in {took:.2f} s; logged {len(logged)} lines, "
          f"{sum(map(len, logged))} characters: {logged}")
    assert logged and all(len(m) < 300 for m in logged), logged
    assert sum(map(len, logged)) < 4000
