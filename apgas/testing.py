"""A scripted stand-in for the batch scheduler, to test malleable and evolving programs.

Point a program at it with ``APGAS_SCHEDULER=host:port`` (its :attr:`FakeScheduler.address`):
it records every line the job sends (ready, timings, evolving asks), answers the
asks as a script says, and can send the job orders, as a real scheduler would.
The project's own tests and the malleability benchmark use it too::

    def script(message, fake):
        if message.startswith("Evolving;Request"):
            fake.later("grow 1 nodeB")      # grant it a moment later, by an order
            return "ok 1"
        return None                         # no answer to anything else

    with FakeScheduler(script, job=("127.0.0.1", 27100)) as fake:
        ...                                 # run the program
        fake.take("growTimeAPGAS")          # wait for the job's report
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
import threading
import time
from collections.abc import Callable

from . import auth, protocol
from .order import send_order
from .serving._connections import read_line

__all__ = ["FakeScheduler", "Received", "Script"]

#: ``script(message, fake)`` answers one line from the job (``message`` is the line
#: without its ``:sender`` part): the answer line, ``None`` to close the connection
#: without answering, or :attr:`FakeScheduler.SILENT` to hold it open, then close.
Script = Callable[[str, "FakeScheduler"], "str | None"]

_MAX_LINE = 65536


@dataclasses.dataclass(frozen=True)
class Received:
    """One line from the job, e.g. ``growTimeAPGAS;2;165802561:127.0.0.1``."""

    line: str
    arrived: float  #: :func:`time.perf_counter` when it was read

    @property
    def message(self) -> protocol.JobMessage:
        return protocol.parse_message(self.line)

    @property
    def name(self) -> str:
        """The first field: ``growTimeAPGAS``, ``Evolving``, the ready message ..."""
        return self.message.text.split(";")[0]

    @property
    def fields(self) -> list[str]:
        """What follows the name: ``[n, ns]`` for a timing."""
        return self.message.fields

    @property
    def seconds(self) -> float:
        """The time a timing message reports (ValueError if it is not one)."""
        try:
            return int(self.fields[1]) / 1e9
        except (IndexError, ValueError):
            raise ValueError(f"not a timing message: {self.line!r}") from None


def _no_answer(message: str, fake: FakeScheduler) -> None:
    return None


class FakeScheduler:
    """Listens on ``host`` like the scheduler, one line per connection (the job's
    communicator opens one per message). ``job`` is where the job takes orders,
    for :meth:`later`; without it, the port a ready line names
    (:func:`apgas.protocol.ready`, :attr:`reported`) serves. Use it as a
    context manager, or call :meth:`close`.

    Signed lines (:mod:`apgas.auth`) are recorded without their signature. With
    ``secret`` (the job's ``APGAS_JOB_SECRET``) the signatures are checked, lines
    that fail go to :attr:`refused` instead, and orders are signed with it;
    without, orders are signed with the key of a job started by hand, if any."""

    SILENT = "<silent>"

    def __init__(self, script: Script | None = None, job: tuple[str, int] | None = None, *,
                 host: str = "127.0.0.1", silence: float = 1.0, secret: str | None = None) -> None:
        self.script = script or _no_answer
        self.secret = secret
        #: (line, reason) of every line refused for its signature
        self.refused: list[tuple[str, str]] = []
        self._guard = auth.ReplayGuard()
        self.job = job
        #: the order address the job's ready line named (its address and port), if any
        self.reported: tuple[str, int] | None = None
        self.silence = silence
        #: every line received, in order
        self.lines: list[str] = []
        #: the reply lines of each order sent by :meth:`later`
        self.replies: list[list[str]] = []
        self._pending: list[Received] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._server = socket.create_server((host, 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        threading.Thread(target=self._accept, name="fake-scheduler", daemon=True).start()

    def __enter__(self) -> FakeScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        """One connection at a time, unlike ``apgas.serving.serve_connections``: the
        job sends its messages one connection after the other, and tests read
        them in that order."""
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError as e:
                if self._server.fileno() < 0 or e.errno in (errno.EBADF, errno.EINVAL):
                    return  # closed
                time.sleep(0.05)  # out of descriptors, say: try again
                continue
            with conn, contextlib.suppress(OSError):  # one bad client ends only its connection
                raw = read_line(conn, _MAX_LINE, time.monotonic() + 5.0, partial=True)
                if raw is not None:
                    self._handle(conn, raw.decode(errors="replace").strip())

    def _handle(self, conn: socket.socket, line: str) -> None:
        try:
            line = auth.accept(line, self.secret, self._guard, "unsigned line")
        except auth.AuthError as e:
            self.refused.append((line, str(e)))
            return
        if not line:
            return
        message = protocol.parse_message(line)
        with contextlib.suppress(ValueError):
            port = protocol.ready_port(message)
            if port is not None:
                self.reported = (message.sender.partition(":")[0], port)
        with self._cond:
            self.lines.append(line)
            self._pending.append(Received(line, time.perf_counter()))
            self._cond.notify_all()
        answer = self.script(line.split(":")[0], self)
        if answer == self.SILENT:
            time.sleep(self.silence)
        elif answer is not None:
            conn.sendall(answer.encode() + b"\n")

    def messages(self, prefix: str = "Evolving") -> list[str]:
        """The messages (without their sender) of the lines starting with ``prefix``."""
        with self._cond:
            return [line.split(":")[0] for line in self.lines if line.startswith(prefix)]

    def take(self, name: str, n: int | None = None, timeout: float = 30.0) -> Received:
        """Wait for, remove and return the first line not taken yet called ``name``
        (about ``n`` places, for a timing); TimeoutError naming what came instead."""
        def find() -> Received | None:
            return next((r for r in self._pending
                         if r.name == name and (n is None or r.fields[:1] == [str(n)])), None)

        with self._cond:
            found = self._cond.wait_for(find, timeout)
            if found is None:
                about = "" if n is None else f" about {n}"
                raise TimeoutError(f"no {name} message{about} within {timeout:g} s; "
                                   f"got {self.lines}")
            self._pending.remove(found)
            return found

    def later(self, *orders: str) -> None:
        """Send the job these orders one by one, from a thread (as the scheduler does),
        to ``job``, else to the address the job's ready line named."""
        job = self.job or self.reported
        if job is None:
            raise ValueError("this FakeScheduler was made without the job's order address (job=), "
                             "and no ready line named one")

        def send() -> None:
            for line in orders:
                self.replies.append(send_order(job, line, timeout=60.0, secret=self.secret))

        thread = threading.Thread(target=send, name="fake-scheduler-orders", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout: float = 30.0) -> None:
        """Wait for the orders sent by :meth:`later`."""
        for thread in self._threads:
            thread.join(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._server.close()
