"""The scheduler's port: one TCP accept loop whose lines are either a client
request (a JSON object: submit, status, cancel, add-nodes, shutdown, answered
by one JSON line) or a job's message in the APGAS socket protocol (ready,
not malleable, timing reports, and evolving asks, see :mod:`.asks`)."""

from __future__ import annotations

import json
import socket
from typing import Any

from apgas import protocol

from .core import SchedulerCore, log
from .jobs import JobFileError, parse_job
from .records import Job

__all__ = ["ServerMixin", "MAX_LINE"]

MAX_LINE = 1 << 20


class ServerMixin(SchedulerCore):
    """Accepting connections and dispatching what comes in on them."""

    _server: socket.socket

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._spawn(self._serve, "scheduler-conn", conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10.0)
            data = b""
            try:
                while b"\n" not in data and len(data) <= MAX_LINE:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                return
            line = data.split(b"\n", 1)[0].decode(errors="replace").strip()
            if line.startswith("{"):
                reply = self._request(line)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass
            elif line:
                answer = self._message(line)
                if answer is not None:
                    try:
                        conn.sendall(answer.encode() + b"\n")
                    except OSError:
                        pass  # Java's jobs close without reading the answer

    def _request(self, line: str) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
            if op == "submit":
                data, where = request.get("job"), str(request.get("file", "job"))
                key = "min_nodes" if isinstance(data, dict) and "min_nodes" in data else "nodes"
                return {"ok": True, "id": self.submit(parse_job(data, where), where, key)}
            if op == "status":
                return {"ok": True, **self.status()}
            if op == "cancel":
                return {"ok": True, "state": self.cancel(request.get("id"))}
            if op == "add-nodes":
                names = request.get("nodes")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError(f"add-nodes needs a list of names, got {names!r}")
                return {"ok": True, "nodes": self.add_nodes(names)}
            if op == "shutdown":
                self.shutdown()
                return {"ok": True}
            raise ValueError(f"unknown request {op!r}; expected submit, status, cancel, "
                             "add-nodes or shutdown")
        except (ValueError, JobFileError) as e:
            return {"ok": False, "error": str(e)}

    def _message(self, line: str) -> str | None:
        """``<message>:<ip>[:<job id>]`` from a job (see docs/protocol.md); the
        answer to an evolving job's request or check, None for the others."""
        parsed = protocol.parse_message(line)
        message, rest = parsed.text, parsed.sender
        job = self._find_job(rest)
        if job is None:
            log.warning("message %r from no job of ours ignored", line)
            return f"error no job of ours matches {rest}" if parsed.is_ask else None
        if parsed.is_ask:
            return self._evolving_ask(job, parsed)
        with self._lock:
            if parsed.kind == "ready":
                job.ready, job.disabled = True, False
                self._event("ready", job=job.id)
                self._ready_cv.notify_all()
            elif parsed.kind == "not_malleable":
                job.ready, job.disabled = False, True
                self._event("rigid", job=job.id)
                self._drop_requests(job, f"the job sent {protocol.NOT_MALLEABLE}")
                self._ready_cv.notify_all()
            elif parsed.kind == "release":
                self._evolving_release(job, ";".join(parsed.fields))
            else:
                log.debug("job %d: %s", job.id, message)
        self._wake.set()
        return None

    def _find_job(self, rest: str) -> Job | None:
        ip, _, job_id = rest.rpartition(":")
        if job_id.isdigit() and int(job_id) in self._jobs:
            return self._jobs[int(job_id)]
        matches = [j for j in self._jobs.values()  # a foreign job without an id: by its address
                   if j.state == "running" and j.listen and (ip or job_id) in (j.reports, j.listen[0])]
        return matches[0] if len(matches) == 1 else None
