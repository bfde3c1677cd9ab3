"""The scheduler's doors: a TCP port whose lines are either a client request
(a JSON object: submit, status, cancel, requeue, add-nodes, node-up, shutdown, answered
by one JSON line) or a job's message in the APGAS socket protocol (ready, not
malleable, a lost place, timing reports, and evolving asks, see :mod:`.asks`);
and a Unix socket for clients on this machine.

Every line must show who sent it (:mod:`.access`): over TCP, a request is
signed with the operator's key and a job's message with that job's own key
(so a job speaks only for itself); over the Unix socket the kernel names the
client. Anything else is refused, logged, and changes nothing; only a job
submitted as ``protocol = "plain"`` to a scheduler serving with
``--allow-plain-jobs`` may send plain lines.

No client can deny the others: the slots are shared per user (or remote
address) by ``serve_connections``, each line must be whole within
:data:`READ_DEADLINE`, and a refusal is logged at most once per
:data:`apgas.serving.PeerLog` interval per peer, with a client's text cut
short (:func:`apgas.serving.loggable`), so that a flood fills no disk.

The server only reads, checks and dispatches: a client's request goes to the
daemon's operations (:class:`Requests`), a job's ask, release or lost place
to :class:`.asks.Asks`; it changes the engine itself only for a job's ready
and not-malleable messages.

A signed job's ready line names the port it bound for orders
(:func:`apgas.protocol.ready`): only that line, verified with the job's key,
sets where its orders go (``job.listen``). A plain job's port is the fixed one
it was given at its start; its ready line does not change it."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apgas import auth, protocol
from apgas.serving import (
    LineTooLong,
    PeerLog,
    connection_peer,
    discard_rest,
    loggable,
    read_line,
    serve_connections,
)

from ..jobs import JobFileError, JobSpec, parse_job
from . import access
from .asks import Asks
from .core import SchedulerCore, log
from .records import Job
from .requests import MAX_REQUEST, parse_request

__all__ = ["Server", "Requests", "MAX_LINE"]

MAX_LINE = MAX_REQUEST
READ_DEADLINE = 5.0  # s from connecting to the end of its line


@dataclass(frozen=True)
class Requests:
    """The daemon's operations a client may ask for, one per request (the
    server checks who asks; each operation checks what it is asked)."""

    submit: Callable[[JobSpec, str, str, access.Client, str | None], int]
    status: Callable[[], dict[str, Any]]
    cancel: Callable[[int, access.Client], str]
    add_nodes: Callable[[list[str]], list[str]]
    nodes_up: Callable[[list[str]], list[str]]
    shutdown: Callable[[], None]
    requeue: Callable[[int, access.Client], str]


class Server:
    """Accepting connections on the TCP port and the Unix socket and
    dispatching what comes in on them."""

    def __init__(self, core: SchedulerCore, tcp: socket.socket, unix: socket.socket,
                 socket_path: Path, *, key: str, allow_plain_jobs: bool, asks: Asks,
                 requests: Requests) -> None:
        """``tcp`` and ``unix``: the listening sockets, the server's to close;
        ``key``: the operator's, which TCP requests must be signed with."""
        self.core = core
        self.tcp = tcp
        self.unix = unix
        self.socket_path = socket_path
        self._key = key
        self._guard = auth.ReplayGuard()
        self.allow_plain_jobs = allow_plain_jobs
        self.asks = asks
        self.requests = requests
        self._refused = PeerLog(log)  # refusals, at most once per interval per peer

    def serve(self) -> None:
        """Accept on both doors, from threads of their own, until ``core.stopped``."""
        self.core.spawn(self._accept, "scheduler-accept", self.tcp)
        self.core.spawn(self._accept, "scheduler-accept-unix", self.unix)

    def close(self) -> None:
        """Close both doors (which ends the accepting threads) and the socket's file."""
        for server in (self.tcp, self.unix):
            try:
                server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            except OSError:
                pass
            server.close()
        try:
            self.socket_path.unlink()
        except OSError:
            pass

    def _accept(self, server: socket.socket) -> None:
        unix = server.family == socket.AF_UNIX
        serve_connections(server, lambda conn, read_by: self._serve(conn, read_by, unix),
                          name="scheduler-unix" if unix else "scheduler", max_connections=256,
                          deadline=READ_DEADLINE, stopped=self.core.stopped.is_set)

    def _serve(self, conn: socket.socket, read_by: float, unix: bool = False) -> None:
        peer = connection_peer(conn) or "?"
        with conn:
            try:
                raw = read_line(conn, MAX_LINE, read_by, partial=True)  # EOF ends a line too
            except LineTooLong as e:
                discard_rest(conn, read_by)
                self._reply(conn, {"ok": False, "error": f"request {e}"})
                return
            except OSError:
                return
            if raw is None:
                return
            line = raw.decode(errors="replace").strip()
            reply: dict[str, Any] | str | None
            if unix:
                reply = self._unix_request(conn, line, peer)
            elif auth.is_signed(line) or line.startswith("{"):
                reply = self._tcp_line(line, peer)
            else:
                reply = self._message(line, None, peer) if line else None
            if reply is not None:
                self._reply(conn, reply)

    @staticmethod
    def _reply(conn: socket.socket, reply: dict[str, Any] | str) -> None:
        text = reply if isinstance(reply, str) else json.dumps(reply)
        try:
            conn.sendall(text.encode() + b"\n")
        except OSError:
            pass  # Java's jobs close without reading the answer

    def _unix_request(self, conn: socket.socket, line: str, peer: str = "?") -> dict[str, Any]:
        try:
            client = access.unix_client(conn)
        except OSError as e:
            return {"ok": False, "error": f"cannot tell who is asking: {e}"}
        if not line.startswith("{"):
            return {"ok": False, "error": "the Unix socket takes JSON requests only"}
        return self._request(line, client, peer)

    def _tcp_line(self, line: str, peer: str = "?") -> dict[str, Any] | str | None:
        """A signed request or job message; an unsigned request is refused."""
        if line.startswith("{"):
            self._refused(peer, "unsigned request over TCP from %s refused", peer)
            return {"ok": False, "error": "unsigned request refused: over TCP, requests must be "
                    "signed with the operator's key (python -m apgas_scheduler does that with "
                    f"{access.default_key_file()}); on this machine, use the Unix socket "
                    f"{self.socket_path}"}
        try:
            signed = auth.parse_signed(line)
        except auth.AuthError as e:
            self._refused(peer, "line from %s refused: %s", peer, loggable(str(e)))
            return {"ok": False, "error": str(e)}
        if not signed.line.startswith("{"):
            return self._message(signed.line, signed, peer)
        try:
            self._guard.check(self._key, signed)
        except auth.AuthError as e:
            self._refused(peer, "request from %s refused: %s", peer, loggable(str(e)))
            return {"ok": False, "error": f"request refused: {e}"}
        return self._request(signed.line, access.operator(), peer)

    def _request(self, line: str, client: access.Client, peer: str = "?") -> dict[str, Any]:
        try:
            request = parse_request(line)
            op = request.get("op")
            access.authorize(client, str(op))
            if op == "submit":
                data, where = request.get("job"), str(request.get("file", "job"))
                key = "min_nodes" if isinstance(data, dict) and "min_nodes" in data else "nodes"
                again = request.get("request")  # the client's key: a repeat is the same job
                if again is not None and not isinstance(again, str):
                    raise ValueError(f"a submit's request key is a string, got {again!r:.80}")
                return {"ok": True, "id": self.requests.submit(parse_job(data, where), where, key,
                                                               client, again)}
            if op == "status":
                return {"ok": True, **self._with_down(self.requests.status())}
            if op in ("cancel", "requeue"):
                job_id = request.get("id")
                if not isinstance(job_id, int) or isinstance(job_id, bool):
                    raise ValueError(f"{op} needs a job id (an integer), got {job_id!r:.80}")
                act = self.requests.cancel if op == "cancel" else self.requests.requeue
                return {"ok": True, "state": act(job_id, client)}
            if op == "add-nodes":
                names = request.get("nodes")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError(f"add-nodes needs a list of names, got {names!r}")
                return {"ok": True, "nodes": self.requests.add_nodes(names)}
            if op == "node-up":  # the operator's: refused to others above (access.OPERATOR_ONLY)
                names = request.get("nodes")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError(f"node-up needs a list of names, got {names!r:.200}")
                return {"ok": True, "down": self.requests.nodes_up(names)}
            if op == "shutdown":
                self.requests.shutdown()
                return {"ok": True}
            raise ValueError(f"unknown request {op!r}; expected submit, status, cancel, "
                             "requeue, add-nodes, node-up or shutdown")
        except PermissionError as e:
            self._refused(peer, "request from %s refused: %s", peer, loggable(str(e)))
            return {"ok": False, "error": f"not allowed: {e}"}
        except (ValueError, JobFileError) as e:
            return {"ok": False, "error": str(e)}

    def _message(self, line: str, signed: auth.Signed | None, peer: str = "?") -> str | None:
        """``<message>:<ip>[:<job id>]`` from a job (see docs/protocol.md), signed
        with that job's key (or plain, from a plain job); the answer to an
        evolving job's request or check, None for the others."""
        parsed = protocol.parse_message(line)
        message, rest = parsed.text, parsed.sender
        job = self.find_job(rest)
        if job is None:
            self._refused(peer, "message %s from %s, no job of ours, ignored", loggable(line), peer)
            return f"error no job of ours matches {rest}" if parsed.is_ask else None
        try:
            if signed is not None:
                self._guard.check(job.secret, signed)
            elif not (job.plain and self.allow_plain_jobs):
                raise auth.AuthError(f"unsigned message {line[:60]!r}: job {job.id} must sign "
                                     "its messages (APGAS_JOB_SECRET)")
        except auth.AuthError as e:
            self._refused(peer, "message for job %d from %s refused: %s", job.id, peer,
                          loggable(str(e)))
            return f"error {e}" if parsed.is_ask else None
        if parsed.is_ask:
            return self.asks.answer(job, parsed)
        core = self.core
        with core.lock:
            if parsed.kind == "ready":
                problem = self._take_order_port(job, parsed, signed)
                if problem:
                    self._refused(peer, "job %d's ready line %s from %s: %s; it takes no orders",
                                  job.id, loggable(line), peer, problem)
                    return None
                job.ready, job.disabled = True, False
                core.event("ready", job=job.id)
                core.ready_cv.notify_all()
            elif parsed.kind == "not_malleable":
                job.ready, job.disabled = False, True
                core.event("rigid", job=job.id)
                core.drop_requests(job, f"the job sent {protocol.NOT_MALLEABLE}")
                core.ready_cv.notify_all()
            elif parsed.kind == "release":
                self.asks.release(job, ";".join(parsed.fields))
            elif parsed.kind == "place_lost":
                self.asks.place_lost(job, ";".join(parsed.fields))
            elif (timing := protocol.parse_timing(parsed)) is not None:
                name, n, ns = timing
                core.event("timing", job=job.id, name=name[:40], n=n, seconds=ns / 1e9)
            else:
                log.debug("job %d: %s", job.id, loggable(message))
        core.wake.set()
        return None

    @staticmethod
    def _take_order_port(job: Job, parsed: protocol.JobMessage, signed: auth.Signed | None) -> str:
        """Set where ``job`` takes orders from its verified ready line; what is
        wrong with the line, else "". A signed job's orders go to the port its
        line names, at the address it was told (``job.reports``); a plain line
        proves nothing, so a plain job keeps its fixed port. The caller holds
        ``core.lock`` and has checked the line's signature."""
        try:
            port = protocol.ready_port(parsed)
        except ValueError as e:
            return str(e)
        if job.plain or signed is None:
            return "" if job.listen is not None else "a plain job without an order port"
        if port is not None:
            job.listen = (job.reports, port)  # stored with the ready event
        elif job.listen is None:
            return (f"it names no port, and a job started with the signed protocol listens on the "
                    f"port the kernel gave it: {protocol.READY};<port> (docs/protocol.md)")
        return ""

    def _with_down(self, status: dict[str, Any]) -> dict[str, Any]:
        """The status with each node's ``down``: out of service since a job lost its
        place there (until ``node-up``), and for a quarantined one ``quarantine``,
        the seconds left before it is free again."""
        with self.core.lock:
            down, now = set(self.core.engine.down), self.core.now()
            left = {n: round(max(0.0, t - now), 1) for n, t in self.core.engine.quarantine.items()}
        return {**status, "nodes": [{**n, "down": n["name"] in down,
                                     **({"quarantine": left[n["name"]]} if n["name"] in left else {})}
                                    for n in status["nodes"]]}

    def find_job(self, rest: str) -> Job | None:
        """The job a message's sender (``<ip>[:<job id>]``) names, if exactly one."""
        jobs = self.core.jobs
        ip, _, job_id = rest.rpartition(":")
        number = protocol.ascii_int(job_id)
        if number is not None and number in jobs:
            return jobs[number]
        matches = [j for j in jobs.values()  # a foreign job without an id: by its address
                   if j.state == "running" and j.reports
                   and (ip or job_id) in (j.reports, j.listen[0] if j.listen else j.reports)]
        return matches[0] if len(matches) == 1 else None

