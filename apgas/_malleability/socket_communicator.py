"""The default communicator: the line protocol of ``docs/protocol.md`` on a TCP socket.

:class:`SocketMalleableCommunicator` listens for the scheduler's orders (grow,
shrink, status, plus our signed extensions) and reports back on the
scheduler's socket; its public name is ``apgas.malleable.SocketMalleableCommunicator``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable

from .. import auth, ejs, protocol
from .._core.config import Config, parse_address
from ..errors import ApgasError, ConfigError
from ..serving._connections import LineTooLong, discard_rest, read_line, serve_connections
from .base import MalleableCommunicator, OrderError, Orders

__all__ = ["SocketMalleableCommunicator"]

log = logging.getLogger("apgas.malleable")


class SocketMalleableCommunicator(MalleableCommunicator):
    """The line protocol of ElasticJobScheduler over TCP (see ``docs/protocol.md``),
    every line signed (:mod:`apgas.auth`) with the job's secret.

    The secret is ``APGAS_JOB_SECRET``, which the scheduler gives each job. A
    job started by hand makes one and keeps it in a key file only its user can
    read (:func:`apgas.auth.order_key_path`), where ``python -m apgas.order``
    finds it. ``APGAS_PLAIN_PROTOCOL=1`` speaks plain lines instead, as the
    ElasticJobScheduler does: then anyone who can reach the order port can
    resize the job (see ``docs/security.md``).

    Plain lines and no ``APGAS_JOB_ID`` (which only our scheduler gives a job)
    mean the ElasticJobScheduler is on the other side, and the job speaks its
    dialect (``docs/protocol.md``): only the lines it knows, the sender's
    address without a job id, and no wait for answers it never sends. Every
    message carries the job's address: the listen address, or, when that is a
    wildcard (``0.0.0.0``), the local address of the connection to the scheduler.
    Under EJS the job also prints the Java runtime's ``[APGAS] Place startup
    time`` line, which EJS's analysis script reads, and warns of a shrink reply
    later than EJS waits for it (:data:`apgas.ejs.SHRINK_BUDGET`).

    Signed lines and an ``APGAS_JOB_ID`` mean our scheduler started the job: it
    is told to listen on port 0, binds a port the kernel gives it, and names
    that port in its signed ready line (:func:`apgas.protocol.ready`), where
    the scheduler learns it; a port chosen by the scheduler ahead of the job
    could be taken first by another user. Any other job sends the bare
    :data:`apgas.protocol.READY`.
    """

    MAX_LINE = 4096
    READ_TIMEOUT = 10.0
    ANSWER_TIMEOUT = 10.0  # for the scheduler's answer to an evolving request
    KEEP_FOR = 120.0  # s a report the scheduler cannot take (a restart) is kept to send again

    def __init__(self, orders: Orders, config: Config) -> None:
        super().__init__(orders, config)
        host, port = parse_address("APGAS_MALLEABLE_LISTEN", config.malleable_listen or "127.0.0.1:0")
        try:
            self._server = socket.create_server((host, port))
        except OSError as e:
            raise ConfigError(f"cannot listen for orders on {host}:{port} "
                              f"(APGAS_MALLEABLE_LISTEN): {e}") from e
        self._address: tuple[str, int] = (host, self._server.getsockname()[1])
        self._scheduler = parse_address("APGAS_SCHEDULER", config.scheduler) if config.scheduler else None
        self._ip = _own_address(host)  # None: a wildcard, so each connection's local address
        self._job_id = os.environ.get("APGAS_JOB_ID", "")
        self._plain = os.environ.get("APGAS_PLAIN_PROTOCOL", "").lower() in ("1", "true", "yes")
        self.ejs = self._plain and not self._job_id
        self._reports_port = bool(self._job_id) and not self._plain  # our scheduler, signed
        self._secret = os.environ.get("APGAS_JOB_SECRET", "")
        self._key_file = None
        if self._plain:
            log.warning("APGAS_PLAIN_PROTOCOL is set: orders on %s:%d are taken unsigned, so anyone "
                        "who can reach that port can resize this job", *self.address)
        elif not self._secret:
            self._secret = auth.new_secret()
            self._key_file = auth.write_key_file(auth.order_key_path(self.address[1]), self._secret)
            log.info("orders must be signed with the key in %s", self._key_file)
        self._guard = auth.ReplayGuard()
        self._closed = False
        self._retry = _Retry(self.config.scheduler, self.KEEP_FOR)  # of the kept reports
        self._outbox: queue.SimpleQueue[tuple[str, concurrent.futures.Future[str] | None] | None] = \
            queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_reports, name="apgas-reports", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` where the job listens for orders (``APGAS_MALLEABLE_LISTEN``;
        port 0 there means any free port, and this is the one taken)."""
        return self._address

    def start(self) -> None:
        log.info("listening for orders on %s:%d", *self.address)
        if self.ejs and self.attached:
            self._print_startup_time()
        self._sender.start()
        threading.Thread(target=serve_connections, args=(self._server, self._serve),
                         kwargs={"name": "apgas-orders", "deadline": self.READ_TIMEOUT,
                                 "max_connections": 64, "stopped": lambda: self._closed},
                         name="apgas-orders", daemon=True).start()

    def stop(self) -> None:
        """Stop listening; give the last messages up to 3 s to reach the scheduler."""
        if self._closed:
            return
        self._closed = True
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        if self._key_file is not None:
            try:
                self._key_file.unlink()
            except OSError:
                pass
        self._outbox.put(None)
        if self._sender.is_alive():
            self._sender.join(3.0)

    def _print_startup_time(self) -> None:
        """The Java runtime's startup line, for EJS's ``plotExperiments.py``. With a
        scheduler set, ``apgas.run`` starts the communicator right after the places of
        the start joined, so now is when Java's runtime prints it, and the time counts
        from the start of ``apgas.run`` (the Orders' clock, as ``readyTimeAPGAS``)."""
        print(ejs.startup_line((time.monotonic_ns() - self.orders.started_ns) / 1e9), flush=True)

    @property
    def attached(self) -> bool:
        return self._scheduler is not None

    @property
    def answers_asks(self) -> bool:
        return not self.ejs

    def report(self, message: str) -> None:
        """Queue a message; a thread sends them in order, so a slow scheduler delays no order.
        Towards our scheduler, signed, the ready line names the order port."""
        if message == protocol.READY and self._reports_port:
            message = protocol.ready(self.address[1])
        if self.ejs and not protocol.ejs_knows(message):
            log.debug("not sent (the ElasticJobScheduler does not know it): %s", message)
            return
        if self._scheduler is None:
            log.info("no scheduler to tell: %s", message)
        else:
            self._outbox.put((message, None))

    def ask(self, message: str) -> concurrent.futures.Future[str]:
        if self._scheduler is None:
            raise ApgasError("no scheduler is attached (APGAS_SCHEDULER is not set), so there is "
                             "nobody to ask; run the program as an evolving job of a scheduler")
        if not self.answers_asks:
            raise ApgasError(f"the ElasticJobScheduler at {self.config.scheduler} answers no "
                             f"question, so {message!r} cannot be asked (it knows only requests "
                             "and releases)")
        if self._closed:
            raise ApgasError("the communicator is stopped: the program is ending")
        answer: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._outbox.put((message, answer))
        return answer

    def _line(self, message: str, local_ip: str) -> str:
        """``<message>:<ip>``, then ``:<job id>`` towards our scheduler (never towards
        EJS, which would no longer know the address)."""
        line = f"{message}:{self._ip or local_ip}"
        return line if self.ejs or not self._job_id else f"{line}:{self._job_id}"

    def _send_reports(self) -> None:
        """Send each message on a connection of its own, in order. The answer to an
        ask is awaited on a thread of its own, so an unanswered ask holds back no
        later message; no connection is opened without a whole line to write.

        A report the scheduler cannot take (it restarts, say) is kept, with the
        reports after it, and sent again every few seconds and before each ask,
        for up to KEEP_FOR s: a lost ready line (``protocol.READY``) would have the job killed as
        one that never registered. An ask is never kept: it fails at once."""
        held: list[str] = []
        while True:
            try:
                item = self._outbox.get(timeout=self._retry.delay if held else None)
            except queue.Empty:
                self._flush(held)
                continue
            if item is None:
                self._flush(held, last=True)
                return
            message, answer = item
            if answer is None:
                held.append(message)
                self._flush(held)
                continue
            self._flush(held)
            try:
                self._tell(message, answer)
            except OSError as e:
                self._not_sent(message, answer, e)

    def _tell(self, message: str, answer: concurrent.futures.Future[str] | None) -> None:
        """One message on a connection of its own; OSError if it did not leave."""
        conn = socket.create_connection(self._scheduler, timeout=2.0)  # type: ignore[arg-type]
        try:
            line = self._line(message, conn.getsockname()[0])
            signed = line if self._plain else auth.sign(self._secret, line)  # as it leaves
            log.info("to scheduler%s: %s", ", awaiting an answer" if answer else "", line)
            conn.sendall(signed.encode() + b"\n")
        except OSError:
            conn.close()
            raise
        if answer is None:
            conn.close()
        else:
            threading.Thread(target=self._await_answer, args=(conn, line, answer),
                             name="apgas-answer", daemon=True).start()

    def _flush(self, held: list[str], last: bool = False) -> None:
        """Send the kept reports in order, up to the first the scheduler does not
        take; drop them all (saying which) once they were kept KEEP_FOR s, or when
        the program ends (``last``) and the scheduler still cannot be reached."""
        while held:
            try:
                self._tell(held[0], None)
            except OSError as e:
                if self._retry.failed(e, held[0]) and not last:
                    return
                log.warning("could not tell the scheduler at %s, gave up: %s", self.config.scheduler,
                            "; ".join(repr(m) for m in held))
                held.clear()
            else:
                held.pop(0)
        self._retry.reset()

    def _not_sent(self, message: str, answer: concurrent.futures.Future[str] | None,
                  e: OSError) -> None:
        log.warning("could not tell the scheduler at %s %r: %s", self.config.scheduler, message, e)
        if answer is not None and not answer.done():
            answer.set_exception(ApgasError(
                f"the scheduler at {self.config.scheduler} did not answer {message!r}: "
                f"{type(e).__name__}: {e}"))

    def _await_answer(self, conn: socket.socket, line: str,
                      answer: concurrent.futures.Future[str]) -> None:
        with conn:
            try:
                conn.settimeout(self.ANSWER_TIMEOUT)
                text = self._read_answer(conn)
            except OSError as e:
                self._not_sent(line, answer, e)
                return
        if text:
            answer.set_result(text)
        else:
            log.warning("the scheduler at %s closed the connection without answering %r",
                        self.config.scheduler, line)
            answer.set_exception(ApgasError(f"the scheduler at {self.config.scheduler} closed the "
                                            f"connection without answering {line!r}"))

    def _read_answer(self, conn: socket.socket) -> str:
        """One line (what came before the close, if no newline came), or "" if the
        scheduler closes without answering; OSError (TimeoutError) after
        ANSWER_TIMEOUT s of silence."""
        data = b""
        while b"\n" not in data and len(data) <= self.MAX_LINE:
            chunk = conn.recv(self.MAX_LINE)
            if not chunk:
                break
            data += chunk
        return data.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()

    # -- orders -----------------------------------------------------------------------
    def _serve(self, conn: socket.socket, read_by: float) -> None:
        with conn:
            try:
                line = self._read_line(conn, read_by)
            except OrderError as e:
                self._send(conn, [_error_line(e)])
                return
            except OSError as e:  # TimeoutError too: the line did not come in time
                log.warning("order connection failed before a whole line arrived: %s", e)
                return
            if line is None:
                log.warning("an order connection closed before its line ended; nothing changed")
                return
            arrived = time.monotonic()
            try:
                line = self._authentic(line)
            except auth.AuthError as e:
                log.warning("order refused: %s", e)
                self._send(conn, [protocol.error_reply(str(e))])
                return
            log.info("order: %s", line)
            try:
                replies = self._execute(line, lambda hosts: self._released(conn, hosts, arrived))
            except OrderError as e:
                log.warning("order %r refused: %s", line, e)
                replies = [_error_line(e)]
            self._send(conn, replies)

    def _authentic(self, line: str) -> str:
        """The order in a signed line; a plain one only in plain mode."""
        return auth.accept(line, None if self._plain else self._secret, self._guard,
                           "this job takes signed orders only, signed with its key (python -m "
                           "apgas.order --key-file PATH; see apgas.auth); plain orders need "
                           "APGAS_PLAIN_PROTOCOL=1 on the job's side")

    def _read_line(self, conn: socket.socket, read_by: float) -> str | None:
        try:
            raw = read_line(conn, self.MAX_LINE, read_by)
        except LineTooLong:
            discard_rest(conn, read_by)  # so that the error reply is not lost to a reset
            raise OrderError(f"order line longer than {self.MAX_LINE} bytes") from None
        if raw is None:
            return None
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise OrderError("order line is not UTF-8") from None

    def _execute(self, line: str, released: Callable[[list[str]], None]) -> list[str]:
        try:
            order = protocol.parse_order(line)
        except ValueError as e:
            raise OrderError(str(e)) from None
        if order.verb == protocol.STATUS:
            state, places = self.orders.status()
            return protocol.status_reply(state, [(p.id, p.host) for p in places])
        if order.verb == "refuse":
            self.orders.refused(order.n, order.reason)
            return [protocol.refuse_reply(order.n)]
        if order.verb == "shrink":
            self.orders.shrink(order.n, released)
            return []  # the released hosts went back already, before post_shrink
        added = self.orders.grow(order.n, list(order.hosts))
        return [protocol.grow_reply(order.n, [p.id for p in added])]

    def _released(self, conn: socket.socket, hosts: list[str], arrived: float) -> None:
        """Send a shrink's released hosts. EJS reads them within
        :data:`apgas.ejs.SHRINK_BUDGET` seconds only, and drops the shrink silently
        after that, so a later reply is worth a warning: the job goes on, but EJS
        no longer resizes it and still counts the nodes as the job's."""
        self._send(conn, hosts)
        took = time.monotonic() - arrived
        if self.ejs and took > ejs.SHRINK_BUDGET:
            log.warning("the shrink's reply %s went out %.1f s after the order, later than the "
                        "%g s the ElasticJobScheduler waits for it (apgas.ejs.SHRINK_BUDGET): EJS "
                        "has most likely dropped this shrink ('Error by shrink'), will not resize "
                        "this job again and still counts the released nodes as the job's; keep "
                        "pre_shrink short under EJS", hosts, took, ejs.SHRINK_BUDGET)

    @staticmethod
    def _send(conn: socket.socket, lines: list[str]) -> None:
        if not lines:
            return
        try:
            conn.sendall("".join(f"{line}\n" for line in lines).encode())
        except OSError as e:
            log.warning("could not send the reply %r: %s", lines, e)


def _own_address(host: str) -> str | None:
    """The address to put in messages for the listen ``host``; None for a wildcard,
    which no scheduler can map to a node (the connection's local address serves)."""
    if host in ("", "0.0.0.0", "::", "*"):
        return None
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _error_line(e: Exception) -> str:
    return protocol.error_reply(str(e))


SocketMalleableCommunicator.__module__ = "apgas.malleable"  # its public name (docs, pickles)


class _Retry:
    """When to try the kept reports again: every ``delay`` s (0.1 doubling to 2),
    until ``keep_for`` s after the first failure; warns once per outage."""

    def __init__(self, scheduler: str | None, keep_for: float) -> None:
        self.scheduler, self.keep_for = scheduler, keep_for
        self.delay, self.since = 0.1, None  # type: float, float | None

    def failed(self, e: OSError, message: str) -> bool:
        """One more failure to send ``message``: whether to keep it still."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("the scheduler at %s cannot be reached (%s): %r and the reports after it "
                        "are kept and sent again for up to %g s", self.scheduler, e, message,
                        self.keep_for)
        else:
            self.delay = min(2 * self.delay, 2.0)
        return now - self.since < self.keep_for

    def reset(self) -> None:
        self.delay, self.since = 0.1, None
