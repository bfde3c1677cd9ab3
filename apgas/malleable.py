"""Malleability: a running program gains and loses places on a scheduler's orders.

Two seams, one on each side of the runtime:

- The program registers a :class:`MalleableHandler` with
  ``apgas.define_malleable_handler``; the runtime calls it before and after
  each change of the places.
- A :class:`MalleableCommunicator` receives the scheduler's orders and calls
  the runtime's side of them, an :class:`Orders` (its ``orders`` attribute),
  which carries them out through the handler; it reports back what the
  runtime tells it. The default, :class:`SocketMalleableCommunicator`, speaks
  the line protocol of ``docs/protocol.md``; others are plugins, found by
  :func:`communicator_class` (``APGAS_COMMUNICATOR``). ``docs/communicators.md``
  is the guide to writing one, with a complete example.
"""

from __future__ import annotations

import abc
import concurrent.futures
import importlib
import importlib.metadata
import logging
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from . import auth, ejs, protocol
from ._config import Config, parse_address
from ._place import Place
from ._serving import LineTooLong, discard_rest, read_line, serve_connections
from .errors import ApgasError, ConfigError

__all__ = ["MalleableHandler", "MalleableCommunicator", "Orders", "SocketMalleableCommunicator",
           "OrderError", "communicator_class"]

log = logging.getLogger("apgas.malleable")


class MalleableHandler(abc.ABC):
    """What a program does around a change of its places.

    Subclass it, implement :meth:`pre_shrink` (the one abstract method), override
    the other hooks as needed, and register an instance at place 0 with
    ``apgas.define_malleable_handler``. All calls run at place 0, one order at a
    time (never two hooks at once), on the thread that carries out the order
    (the communicator's, or the program's own for ``release_places``), and may
    use every APGAS construct.

    A hook that raises fails its order: the communicator's ``orders.grow`` or
    ``orders.shrink`` raises :class:`OrderError` naming the hook and the
    exception (the scheduler gets ``error <reason>``). An exception in
    ``pre_grow`` or ``pre_shrink`` changes nothing; one in ``post_grow`` or
    ``post_shrink`` comes after the places changed, which stays so.
    """

    @abc.abstractmethod
    def pre_shrink(self, n: int, chosen: list[Place] | None = None) -> list[Place]:
        """Choose ``n`` places to release (never place 0), move their work away, return them.

        Called first on a shrink order for ``n`` places. Return a list of ``n``
        distinct live places other than place 0; anything else fails the order
        and nothing is removed. Once it returns, every place gets the new place
        table (``async_at`` to the chosen places then raises ``DeadPlaceError``),
        each chosen place runs the tasks it still has to their end and stops,
        their hosts go back to the scheduler, and :meth:`post_shrink` is called.

        ``chosen`` is given when the program released places itself
        (``apgas.release_places``): move their work away and return them.
        A handler without the ``chosen`` parameter serves scheduler orders only."""

    def post_shrink(self, n: int, removed: list[Place]) -> None:
        """Called once the ``removed`` places have stopped and their hosts went back to
        the scheduler (the communicator's ``released`` callback ran). They are no
        longer in ``apgas.places()``; ``async_at`` to them raises
        ``DeadPlaceError``. Does nothing unless overridden."""

    def pre_grow(self, n: int) -> None:
        """Called on a grow order for ``n`` places, before they join the program.
        Does nothing unless overridden."""

    def post_grow(self, n: int, continued: list[Place], added: list[Place]) -> None:
        """Called once every place knows the ``added`` places (new ids, never reused),
        which are now in ``apgas.places()``; ``continued`` are the places there were
        before. Give the new places work here. Not called when the places could
        not start (the order fails and nothing changed). Does nothing unless
        overridden."""

    def on_place_lost(self, places: list[Place]) -> None:
        """Called when ``places`` were lost without an order (an unplanned shrink):
        their process died, or they fell silent (``APGAS_HEARTBEAT``). Does nothing
        unless overridden.

        - It runs at place 0, on a thread of its own (``apgas-place-lost``, not a
          worker), after the runtime has removed ``places`` from ``apgas.places()``
          and failed whatever waited on them (``DeadPlaceError``); it may use every
          APGAS construct.
        - It is called only while this handler is registered, and never for places
          that left by a shrink order or ``release_places``. A place that a shrink
          chose and that dies before it has left is lost: that order ends with an
          error, and this call follows it.
        - Each lost place comes in exactly one call. The places whose loss the
          runtime learnt before the call began (while it waited for an order in
          progress, say) come together; one lost while it runs comes in the next
          call. So several places lost at once may come in one call or several.
        - It is serialized with orders: it holds the lock that grow and shrink
          orders, ``release_places`` and ``disable_malleable_handler`` take, so it
          never runs in the middle of an order (an order that comes meanwhile waits
          for it). So it must not call ``release_places`` or
          ``disable_malleable_handler`` itself (they would wait for it forever);
          start a thread for that.
        - An exception it raises is logged, and the program goes on.

        The scheduler hears of each loss (``APGAS-PlaceLost;<host>``; not the
        ElasticJobScheduler, which does not know that line) before this call, also
        while no handler is registered.
        """


class OrderError(ApgasError):
    """An order that was refused or failed; goes back as ``error <reason>``.

    Nothing was changed, except where the reason says otherwise: a hook of the
    handler that raised after the places changed (``post_grow``,
    ``post_shrink``), or a shrink whose chosen place died before it had left (the
    chosen places that did leave went back, reported as ``Evolving;Release;<host>``)."""


class Orders(Protocol):
    """The runtime's side of the orders: what a communicator calls, as ``self.orders``.

    The runtime gives each communicator one, at place 0. Call its methods from
    a thread of the communicator's own (never from inside :meth:`~MalleableCommunicator.report`,
    :meth:`~MalleableCommunicator.ask` or a ``released`` callback, which may run
    while an order holds the order lock: they would wait for themselves).
    Orders run one at a time: a second ``grow`` or ``shrink`` waits for the
    first, and, in a program that uses ``apgas.steps``, for the step in
    progress to end.
    """

    started_ns: int
    """When ``apgas.run`` started (``time.monotonic_ns()``); the timing lines count from it."""

    def grow(self, n: int, hosts: list[str]) -> list[Place]:
        """Start ``n`` places, one on each of ``hosts`` (a host named twice gets two),
        through the handler (``pre_grow``, the places join, ``post_grow``); return
        the places added, with new ids.

        Blocks until the order is done: the places started (up to
        ``APGAS_JOIN_TIMEOUT`` each) and the handler's hooks returned. Raises
        :class:`OrderError` when the order is refused or fails: no handler is
        registered (or no longer), ``len(hosts) != n``, the program would pass
        ``APGAS_MAX_PLACES``, a place did not start (then none was added), or a
        hook of the handler raised. The timing lines go to
        :meth:`MalleableCommunicator.report` before it returns."""

    def shrink(self, n: int, released: Callable[[list[str]], None]) -> list[str]:
        """Remove ``n`` places chosen by the handler's ``pre_shrink``; return their hosts.

        ``released`` is a callback, not a list: it is called once, with the
        host names of the removed places (a host that had two places comes
        twice), as soon as those places have left, before the handler's
        ``post_shrink`` runs. Send the hosts back to the scheduler there, so that
        it can reuse them at once, however long ``post_shrink`` takes. It runs on
        the thread that called ``shrink``, under the order lock: it must return
        quickly, must not raise, and must not call ``orders``.

        Blocks until ``post_shrink`` returned, then returns the same host names.
        Raises :class:`OrderError` when the order is refused or fails: no handler,
        ``n`` not below the number of places (place 0 always stays), a bad choice
        by ``pre_shrink`` or a hook that raised, or a chosen place that died
        before it had left (then ``released`` is not called, and the hosts of the
        chosen places that did leave come as ``Evolving;Release;<host>`` reports)."""

    def status(self) -> tuple[str, list[Place]]:
        """The program's state (``rigid`` until a handler is registered, ``malleable``,
        ``disabled`` or ``closed``) and its live places, sorted by id."""

    def refused(self, n: int, reason: str) -> None:
        """The scheduler will not grant ``n`` of the places the program asked for
        (``apgas.request_grow``): the newest outstanding requests are refused with
        ``reason`` until ``n`` is covered (:class:`apgas.GrowRefused`)."""

    def order_failed(self, reason: str) -> None:
        """An order the scheduler announced in its answer to a check (``expand k``,
        ``shrink k``) cannot be carried out: a ``check_status`` waiting for it
        returns at once, with the places the program has."""


class MalleableCommunicator(abc.ABC):
    """The seam to a batch scheduler: receives its orders, reports back.

    Subclass it to plug in a scheduler (``docs/communicators.md``). The runtime
    builds one at place 0, when the program registers its handler (or, if
    ``APGAS_COMMUNICATOR``, ``APGAS_SCHEDULER`` or ``APGAS_MALLEABLE_LISTEN`` is
    set, when ``apgas.run`` starts), and calls ``__init__(orders, config)``,
    then :meth:`start`, on that thread, and :meth:`stop` at the end of
    ``apgas.run``, on the thread that runs it. In between it calls
    :meth:`report` and :meth:`ask` from any thread.

    ``__init__(orders, config)`` keeps ``orders`` (the runtime's side, an
    :class:`Orders`) and ``config`` (the program's configuration,
    ``apgas.lowlevel.Config``) as ``self.orders`` and ``self.config``. A
    subclass calls it first, then checks its own settings and raises
    ``ConfigError`` on a bad one (``apgas.run`` or ``define_malleable_handler``
    then fails with it); it starts no thread before :meth:`start`.

    The communicator, on threads of its own, turns each order into a call of
    ``self.orders`` (an :class:`Orders`): ``grow(n, hosts)``,
    ``shrink(n, released)``, ``status()``, ``refused(n, reason)`` or
    ``order_failed(reason)``, and sends the outcome back (the places added, the
    hosts released, or the :class:`OrderError`'s reason). Orders that arrive
    before the handler is registered, or after it is disabled, are refused by
    ``orders`` with an :class:`OrderError`.

    Threading rules: :meth:`report` and :meth:`ask` may be called on any thread,
    several at once, also while an order holds the order lock, so they must
    be thread-safe, return quickly (queue what may block) and never call
    ``orders``. ``orders.grow`` and ``orders.shrink`` block for the whole order.
    """

    def __init__(self, orders: Orders, config: Config) -> None:
        """Keep ``orders`` and ``config`` as ``self.orders`` and ``self.config`` (see the class)."""
        self.orders = orders
        self.config = config

    @abc.abstractmethod
    def start(self) -> None:
        """Begin receiving orders: start the communicator's threads and return.

        Called once, right after ``__init__``. Orders may come at once: the
        ones that come before the handler is registered are refused by
        ``orders`` (the scheduler should wait for the report of
        :data:`apgas.protocol.READY`)."""

    @abc.abstractmethod
    def report(self, message: str) -> None:
        """Send one message to the scheduler, after those reported before it; no
        answer is awaited.

        ``message`` is a line of :mod:`apgas.protocol` (``docs/protocol.md``):
        :data:`~apgas.protocol.READY` (the handler is registered: orders are
        welcome), :data:`~apgas.protocol.NOT_MALLEABLE` (disabled, or the program
        is ending), :func:`~apgas.protocol.timing` lines (``growTimeAPGAS;<n>;<ns>``
        and the like, after each order), :func:`~apgas.protocol.place_lost` (a
        place died without an order), :func:`~apgas.protocol.release` (the
        program released a place itself, or a failed shrink's place did leave)
        and, when :attr:`answers_asks` is false, :func:`~apgas.protocol.request`. A communicator may drop lines its scheduler
        does not know. Called on any thread: see the threading rules above."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop receiving orders and end the communicator's threads.

        Called once, at the end of ``apgas.run`` (also when ``main`` raised),
        after the last order has finished and the last report was made; orders
        that still arrive are refused by ``orders``. Return within a few
        seconds: give pending messages a bounded time to leave, and fail the
        futures of unanswered asks."""

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the communicator listens for orders, as ``(host, port)``, if it
        listens on a socket; None (this default) if it listens nowhere, as the
        ``slurm`` communicator or one that reads a file."""
        return None

    @property
    def attached(self) -> bool:
        """Whether a scheduler is on the other side to hear reports and take asks.
        The evolving calls (``request_grow``, ``release_places``, ``check_status``)
        need one and raise ``ApgasError`` otherwise. False by default."""
        return False

    @property
    def answers_asks(self) -> bool:
        """Whether the scheduler answers asks (True by default). The
        ElasticJobScheduler does not: then ``request_grow`` sends its request
        with :meth:`report` and it stays pending until its grow orders come, and
        ``check_status`` raises ``ApgasError``; :meth:`ask` is not called."""
        return True

    def ask(self, message: str) -> concurrent.futures.Future[str]:
        """Send ``message`` after those reported before it and return at once; the
        future gets the scheduler's one-line answer.

        The runtime asks ``Evolving;Request;<n>`` (``apgas.request_grow``;
        answered ``ok <n>`` or ``error <reason>``, and the places come later with
        grow orders) and ``Evolving;Check;<min>;<max>;<preferred>;<factor>``
        (``apgas.check_status``; answered ``expand <k>``, ``shrink <k>``,
        ``none`` or ``error <reason>``, and the order for ``k`` places follows).
        The future gets an :class:`ApgasError` naming the scheduler when it
        cannot be reached, closes without answering or does not answer in time
        (``check_status`` waits 15 s; a request whose future never ends stays
        pending for good). A future that gets "" counts as no answer too. Set
        its result on any thread, never while holding a lock that ``report``
        takes (its callbacks run on that thread). Called on any thread.

        Raise :class:`ApgasError` at once if nothing can be asked (this default
        does)."""
        raise ApgasError(f"the {type(self).__name__} cannot ask the scheduler anything")


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
    """

    MAX_LINE = 4096
    READ_TIMEOUT = 10.0
    ANSWER_TIMEOUT = 10.0  # for the scheduler's answer to an evolving request

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
        """Queue a message; a thread sends them in order, so a slow scheduler delays no order."""
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
        later message; no connection is opened without a whole line to write."""
        while (item := self._outbox.get()) is not None:
            message, answer = item
            try:
                conn = socket.create_connection(self._scheduler, timeout=2.0)  # type: ignore[arg-type]
            except OSError as e:
                self._not_sent(message, answer, e)
                continue
            try:
                line = self._line(message, conn.getsockname()[0])
                signed = line if self._plain else auth.sign(self._secret, line)  # as it leaves
                log.info("to scheduler%s: %s", ", awaiting an answer" if answer else "", line)
                conn.sendall(signed.encode() + b"\n")
            except OSError as e:
                conn.close()
                self._not_sent(message, answer, e)
                continue
            if answer is None:
                conn.close()
            else:
                threading.Thread(target=self._await_answer, args=(conn, line, answer),
                                 name="apgas-answer", daemon=True).start()

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
                           "this job takes signed orders only (see apgas.auth; python -m "
                           "apgas.order signs them); plain orders need APGAS_PLAIN_PROTOCOL=1 "
                           "on the job's side")

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


def communicator_class(name: str) -> type[MalleableCommunicator]:
    """The communicator class that ``name`` (``APGAS_COMMUNICATOR``) stands for:

    - ``socket`` or "": :class:`SocketMalleableCommunicator`;
    - ``module:Class``: the class ``Class`` of ``module``, imported at place 0
      from ``sys.path`` (where the program's own directory is), for a plugin
      that is not installed as a package;
    - any other name: the entry point of that name in the group
      ``apgas.communicators`` (``slurm`` is one).

    ``ConfigError`` names what is wrong: an unknown name, a module that cannot be
    imported, or an object that is no subclass of :class:`MalleableCommunicator`."""
    if name in ("", "socket"):
        return SocketMalleableCommunicator
    if ":" in name:
        return _class_named(name)
    found = importlib.metadata.entry_points(group="apgas.communicators", name=name)
    for entry in found:
        return _communicator(name, entry.value, entry.load())
    known = ["socket"] + [e.name for e in importlib.metadata.entry_points(group="apgas.communicators")]
    raise ConfigError(f"unknown communicator {name!r} (APGAS_COMMUNICATOR); known: {known}, "
                      "or module:Class")


_MODULE_CLASS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _class_named(name: str) -> type[MalleableCommunicator]:
    """The class of a ``module:Class`` value of ``APGAS_COMMUNICATOR``."""
    if not _MODULE_CLASS.fullmatch(name):
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR) must be a name, or "
                          "module:Class such as file_communicator:FileCommunicator")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR): cannot import "
                          f"{module_name!r}: {e}") from None
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR): module "
                          f"{module_name!r} has no {class_name!r}") from None
    return _communicator(name, name, cls)


def _communicator(name: str, where: str, cls: object) -> type[MalleableCommunicator]:
    if not (isinstance(cls, type) and issubclass(cls, MalleableCommunicator)):
        raise ConfigError(f"the communicator {name!r} ({where}, APGAS_COMMUNICATOR) is "
                          f"{cls!r}, not a subclass of apgas.malleable.MalleableCommunicator")
    return cls


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