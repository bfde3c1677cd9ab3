"""A scheduler that behaves like the ElasticJobScheduler (EJS) on the wire.

Written from ``../shared/ejs-wire.md`` (EJS's source, commit bbc307e82c5f), so
that a job that keeps EJS's receiver alive here keeps the real one alive too:

- one receiver thread reads **one** line per connection and never closes it;
- ``APGAS-Ready:<ip>`` registers the job when ``<ip>`` is the job's first node,
  and is ignored otherwise (EJS null-checks it);
- a line with ``Time`` in it, ``Evolving;Request`` and ``Evolving;Release``
  whose address is not the first node's, a release of an unknown node, a time
  that is no number, or a connection closed before a line: EJS throws inside
  its catch-all and its receiver ends for good; here :attr:`EjsLike.dead` says why
  and the receiver stops too;
- a request is never answered; one node is granted per request, by a
  ``grow 1 <node> `` order, once ``cooldown`` seconds passed since the last
  resize (60 s in EJS);
- ``grow`` orders end in a space and are closed at once, nothing read; a
  ``shrink <k>`` reads ``k`` lines, each within ``shrink_timeout`` seconds
  (20 s in EJS), and on a timeout the job is no longer malleable.
"""

from __future__ import annotations

import socket
import threading
import time

__all__ = ["EjsLike", "point_job_at"]


class EjsLike:
    """Drives one job on the nodes ``nodes`` (node id -> IP); ``first`` is the job's
    first node, where it listens for orders at ``job_port``."""

    def __init__(self, nodes: dict[str, str], first: str, job_port: int, *,
                 cooldown: float = 60.0, shrink_timeout: float = 20.0) -> None:
        self.nodes = dict(nodes)
        self.first = first
        self.job = (nodes[first], job_port)
        self.cooldown = cooldown
        self.shrink_timeout = shrink_timeout
        self.held = {first}  # the job's nodes
        self.ready = threading.Event()
        self.malleable = True
        self.dead: str | None = None  # why the receiver ended, as EJS's would
        self.lines: list[str] = []
        self.unknown: list[str] = []  # lines EJS would answer "undefined Message"
        self.ignored: list[str] = []  # ready lines whose address EJS does not know
        self.requests = 0
        self.granted: list[str] = []
        self.last_resize = 0.0
        self._changed = threading.Condition()
        self._open: list[socket.socket] = []  # EJS never closes a job's connection
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = self._server.getsockname()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._receive, daemon=True),
                         threading.Thread(target=self._grant, daemon=True)]
        for thread in self._threads:
            thread.start()

    # -- the receiver ----------------------------------------------------------------
    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._open.append(conn)
            conn.settimeout(10.0)
            try:
                line = conn.makefile("rb").readline()
            except OSError:
                line = b""
            if not line.endswith(b"\n"):
                self._die(f"connection closed without a whole line: {line!r}")
                return
            try:
                self._parse(line.decode().rstrip("\n"), conn)
            except Exception as e:  # EJS's catch-all ends its receiver here
                self._die(f"{type(e).__name__}: {e}")
                return

    def _parse(self, line: str, conn: socket.socket) -> None:
        with self._changed:
            self.lines.append(line)
            self._changed.notify_all()
        if line.startswith("APGAS-Ready:"):
            if line[len("APGAS-Ready:"):] == self.nodes[self.first]:
                self.ready.set()
            else:
                self.ignored.append(line)
            return
        message, _, ip = line.partition(":")
        if "Time" in line:
            self._node_by_ip(ip)
            int(message.split(";")[2])  # Long.parseLong
            return
        if message.startswith("Evolving;Request;"):
            self._node_by_ip(ip)
            with self._changed:
                self.requests += 1
                self._changed.notify_all()
            return  # no answer, the connection stays open
        if message.startswith("Evolving;Release;"):
            self._node_by_ip(ip)
            node = message.split(";")[2]
            if node not in self.nodes:
                raise LookupError(f"release of unknown node {node!r} (a NullPointerException)")
            with self._changed:
                self.held.discard(node)
            return
        self.unknown.append(line)
        reply = b"Undefined Evolving Message\n" if line.startswith("Evolving;") else b"undefined Message\n"
        conn.sendall(reply)

    def _node_by_ip(self, ip: str) -> str:
        if ip != self.nodes[self.first]:
            raise LookupError(f"no node has address {ip!r} (a NullPointerException)")
        return self.first

    def _die(self, why: str) -> None:
        with self._changed:
            self.dead = why
            self._changed.notify_all()

    # -- grants and orders -----------------------------------------------------------
    def _grant(self) -> None:
        while not self._stop.wait(0.05):
            with self._changed:
                due = (self.requests > len(self.granted) and self.ready.is_set() and self.malleable
                       and time.monotonic() - self.last_resize >= self.cooldown)
                free = [n for n in self.nodes if n not in self.held]
            if due and free:
                try:
                    self.grow([free[0]])
                except OSError:                   # the job ended after its ready line
                    return
                with self._changed:
                    self.granted.append(free[0])

    def grow(self, nodes: list[str]) -> None:
        """``grow <k> <ids> `` to the job; closed at once, nothing read."""
        with self._changed:
            self.held.update(nodes)
            self.last_resize = time.monotonic()
        with socket.create_connection(self.job, timeout=5) as conn:
            conn.sendall(f"grow {len(nodes)} {' '.join(nodes)} \n".encode())

    def shrink(self, k: int) -> list[str]:
        """``shrink <k>``, then ``k`` lines, each within ``shrink_timeout`` s; known node
        ids go back. A line that does not come ends the job's malleability."""
        with self._changed:
            self.last_resize = time.monotonic()
        lines: list[str] = []
        with socket.create_connection(self.job, timeout=5) as conn:
            conn.sendall(f"shrink {k}\n".encode())
            conn.settimeout(self.shrink_timeout)
            reader = conn.makefile("rb")
            try:
                for _ in range(k):
                    line = reader.readline().decode().strip()
                    lines.append(line)
                    with self._changed:
                        self.held.discard(line)
            except OSError:
                self.malleable = False  # "Error by shrink"
        return lines

    def wait_for(self, prefix: str, count: int = 1, timeout: float = 30.0) -> list[str]:
        """The lines that start with ``prefix``, once ``count`` came (TimeoutError if not)."""
        def found() -> list[str]:
            return [line for line in self.lines if line.startswith(prefix)]

        with self._changed:
            if not self._changed.wait_for(lambda: len(found()) >= count or self.dead, timeout):
                raise TimeoutError(f"{count} line(s) {prefix!r} not within {timeout} s; "
                                   f"got {self.lines}")
            if self.dead:
                raise AssertionError(f"the receiver ended as EJS's would: {self.dead}")
            return found()

    def close(self) -> None:
        self._stop.set()
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._server.close()
        for conn in self._open:
            conn.close()
        for thread in self._threads:
            thread.join(5)


def point_job_at(scheduler: EjsLike, monkeypatch, listen: str) -> None:
    """Set this process's environment as ``python -m apgas ejs-env`` sets a job's
    under ``scheduler``: plain lines, no job id, the socket communicator, orders
    taken on ``listen`` at the port the scheduler sends them to."""
    monkeypatch.setenv("APGAS_SCHEDULER", "{}:{}".format(*scheduler.address))
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", f"{listen}:{scheduler.job[1]}")
    monkeypatch.setenv("APGAS_PLAIN_PROTOCOL", "1")
    monkeypatch.delenv("APGAS_JOB_ID", raising=False)
    monkeypatch.delenv("APGAS_COMMUNICATOR", raising=False)
