"""A communicator plugin for a scheduler that writes its orders to a file.

The guide to this example is ``docs/communicators.md``. The job and its
scheduler share a directory, ``FILE_COMMUNICATOR_DIR``, that only the user who
runs the job can write:

- the scheduler appends orders to ``DIR/orders``, one a line: ``grow <n>
  <host>...``, ``shrink <n>``, ``status``, ``refuse <n> <reason>`` (the lines
  of ``docs/protocol.md``), and ``answer <id> <text>`` for the job's asks;
- the job appends to ``DIR/replies``: for the order on line ``k`` of the orders
  file (1 = the first) exactly one final line, ``<k> ok ...`` or ``<k> error
  <reason>``, after, for a shrink, ``<k> released <host>...`` as soon as the
  places have left; ``report <message>`` for each message of the runtime,
  the lines of ``apgas.protocol`` as the runtime builds them (``report``
  and ``protocol.READY`` first: orders are welcome from now on); ``ask <id>
  <message>`` for a question of an evolving program.

The job makes both files anew when its communicator starts. Run a malleable
program under it (``examples/`` is on ``sys.path`` when the program is there;
otherwise put it on ``PYTHONPATH``)::

    mkdir -m 700 jobdir
    FILE_COMMUNICATOR_DIR=jobdir APGAS_COMMUNICATOR=file_communicator:FileCommunicator \\
        APGAS_LOCAL_HOSTS='*' python examples/malleable_hello.py

and give it orders as the scheduler would, from another shell: this file's
command line appends one order and prints the job's replies to it::

    python examples/file_communicator.py jobdir grow 2 nodeA nodeB
    python examples/file_communicator.py jobdir shrink 1

What it trusts: that only this user writes the directory (checked, with
``apgas.serving.trusted_dir``). Orders are not authenticated: whoever can
write the directory can resize the job, as they could kill it. A plugin whose
orders cross a network or a shared file system must authenticate each one
(``apgas.auth`` signs and checks lines).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import itertools
import logging
import os
import sys
import threading
import time
from pathlib import Path

from apgas import protocol
from apgas.errors import ApgasError, ConfigError
from apgas.lowlevel import Config
from apgas.malleable import MalleableCommunicator, OrderError, Orders
from apgas.serving import UntrustedPath, open_new_file, trusted_dir

DIR_VARIABLE = "FILE_COMMUNICATOR_DIR"
ORDERS, REPLIES = "orders", "replies"
VERBS = "grow, shrink, status, refuse or answer"

# Under "apgas", so that the runtime's log handler prints it with the place's prefix.
log = logging.getLogger("apgas.file_communicator")


def order_dir(path: str | os.PathLike[str]) -> Path:
    """``path``, checked: a directory of this user that nobody else can write
    (nor any directory above it); ``ConfigError`` says what is wrong."""
    try:
        return trusted_dir(path, f"the order directory ({DIR_VARIABLE})")
    except UntrustedPath as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"the order directory {DIR_VARIABLE}={os.fspath(path)!r}: "
                          f"{e.strerror or e}") from None


class FileCommunicator(MalleableCommunicator):
    """Orders from ``DIR/orders``, replies and reports to ``DIR/replies``."""

    POLL = 0.05  # s between two looks at the orders file
    MAX_LINE = 4096  # bytes: a longer order line is refused
    ANSWER_TIMEOUT = 10.0  # s an ask waits for its answer line

    # -- the runtime's calls ------------------------------------------------------------
    def __init__(self, orders: Orders, config: Config) -> None:
        super().__init__(orders, config)
        where = os.environ.get(DIR_VARIABLE, "")
        if not where:
            raise ConfigError(f"the file communicator needs {DIR_VARIABLE}: a directory that only "
                              "you can write, where the scheduler appends orders to 'orders'")
        self.directory = order_dir(where)
        self._lock = threading.Lock()  # the replies file and the asks, from any thread
        self._stopped = threading.Event()
        self._asks: dict[int, tuple[concurrent.futures.Future[str], threading.Timer]] = {}
        self._ask_ids = itertools.count(1)
        self._dir_fd = self._replies_fd = self._orders_fd = -1
        self._watcher = threading.Thread(target=self._watch, name="file-orders", daemon=True)

    def start(self) -> None:
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # Both files anew: the orders and replies of an earlier run are gone.
        self._replies_fd = open_new_file(self._dir_fd, REPLIES)
        os.close(open_new_file(self._dir_fd, ORDERS))
        self._orders_fd = os.open(ORDERS, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  dir_fd=self._dir_fd)
        log.info("taking orders from %s", self.directory / ORDERS)
        self._watcher.start()

    def report(self, message: str) -> None:
        """``message`` is a line the runtime built with ``apgas.protocol``
        (``protocol.READY`` first): written as it is, never spelled here, so that
        the plugin follows the protocol wherever it changes."""
        self._write(f"report {message}")

    @property
    def attached(self) -> bool:
        return True  # the scheduler reads the replies file

    def ask(self, message: str) -> concurrent.futures.Future[str]:
        if self._stopped.is_set():
            raise ApgasError("the file communicator is stopped: the program is ending")
        answer: concurrent.futures.Future[str] = concurrent.futures.Future()
        with self._lock:
            ident = next(self._ask_ids)
            timer = threading.Timer(self.ANSWER_TIMEOUT, self._expire, args=(ident, message))
            timer.daemon = True
            self._asks[ident] = (answer, timer)
        self._write(f"ask {ident} {message}")
        timer.start()
        return answer

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._watcher.is_alive():
            self._watcher.join(5.0)  # it closes the orders file
        elif self._watcher.ident is None and self._orders_fd >= 0:  # start() failed half-way
            os.close(self._orders_fd)
        with self._lock:
            asks, self._asks = self._asks, {}
            for fd in (self._replies_fd, self._dir_fd):
                if fd >= 0:
                    os.close(fd)
            self._replies_fd = self._dir_fd = -1
        for answer, timer in asks.values():  # outside the lock: callbacks run here
            timer.cancel()
            answer.set_exception(ApgasError("the program is ending: no answer will be read"))

    # -- orders (the file-orders thread) ------------------------------------------------
    def _watch(self) -> None:
        """Read whole lines as they are appended and carry each out in turn."""
        offset, number, pending, skipping = 0, 0, b"", False
        try:
            while not self._stopped.wait(self.POLL):
                try:
                    size = os.fstat(self._orders_fd).st_size
                    if size < offset:
                        log.warning("%s was truncated: reading it from its start again",
                                    self.directory / ORDERS)
                        offset, number, pending, skipping = 0, 0, b"", False
                    data = os.pread(self._orders_fd, size - offset, offset) if size > offset else b""
                except OSError as e:
                    log.warning("cannot read %s: %s", self.directory / ORDERS, e)
                    continue
                offset += len(data)
                pending += data
                while b"\n" in pending:
                    raw, pending = pending.split(b"\n", 1)
                    if skipping:  # the end of a line refused as too long
                        skipping = False
                        continue
                    number += 1
                    self._carry_out(number, raw)
                if skipping:
                    pending = b""
                elif len(pending) > self.MAX_LINE:
                    number += 1
                    self._reply(number, protocol.error_reply(
                        f"order line longer than {self.MAX_LINE} bytes"))
                    pending, skipping = b"", True
        finally:
            os.close(self._orders_fd)

    def _carry_out(self, number: int, raw: bytes) -> None:
        """One order line: its final reply is ``ok ...`` or ``error <reason>``."""
        try:
            if len(raw) > self.MAX_LINE:
                raise OrderError(f"order line longer than {self.MAX_LINE} bytes")
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise OrderError("order line is not UTF-8") from None
            log.info("order %d: %s", number, line)
            reply = self._execute(number, line)
        except OrderError as e:
            log.warning("order %d refused: %s", number, e)
            reply = protocol.error_reply(str(e))
        except Exception as e:  # a bug must not end the thread that takes the orders
            log.exception("order %d failed", number)
            reply = protocol.error_reply(f"{type(e).__name__}: {e}")
        self._reply(number, reply)

    def _execute(self, number: int, line: str) -> str:
        words = line.split()
        if words and words[0] == "answer":
            return self._answer(words[1:])
        if words and words[0] not in ("grow", "shrink", "status", "refuse"):
            raise OrderError(f"unknown order {words[0]!r}; expected {VERBS}")
        try:
            order = protocol.parse_order(line)  # host names checked too
        except ValueError as e:
            raise OrderError(str(e)) from None
        if order.verb == protocol.STATUS:
            state, places = self.orders.status()
            return f"ok status {state} {len(places)} " + " ".join(f"{p.id}@{p.host}" for p in places)
        if order.verb == "refuse":
            self.orders.refused(order.n, order.reason)
            return protocol.refuse_reply(order.n)
        if order.verb == "shrink":
            # released: called with the hosts as soon as the places have left, before
            # the handler's post_shrink; the scheduler may reuse them from then on
            self.orders.shrink(order.n, lambda hosts: self._reply(number, "released " + " ".join(hosts)))
            return f"ok shrink {order.n}"
        added = self.orders.grow(order.n, list(order.hosts))
        return protocol.grow_reply(order.n, [p.id for p in added])

    # -- asks ---------------------------------------------------------------------------
    def _answer(self, words: list[str]) -> str:
        if not words or not words[0].isdigit():
            raise OrderError("answer needs the id of an ask: answer <id> <text>")
        ident = int(words[0])
        with self._lock:
            waiting = self._asks.pop(ident, None)
        if waiting is None:
            raise OrderError(f"no ask {ident} is waiting for an answer (answered already, or "
                             f"not answered within {self.ANSWER_TIMEOUT:g} s)")
        answer, timer = waiting
        timer.cancel()
        answer.set_result(" ".join(words[1:]))
        return f"ok answer {ident}"

    def _expire(self, ident: int, message: str) -> None:
        with self._lock:
            waiting = self._asks.pop(ident, None)
        if waiting is not None:
            waiting[0].set_exception(ApgasError(
                f"the scheduler did not answer ask {ident} ({message}) within "
                f"{self.ANSWER_TIMEOUT:g} s: no 'answer {ident} ...' line in {self.directory / ORDERS}"))

    # -- the replies file ---------------------------------------------------------------
    def _reply(self, number: int, text: str) -> None:
        self._write(f"{number} {text}")

    def _write(self, line: str) -> None:
        """Append one line; from any thread, quick (a local file), never calls orders."""
        data = (" | ".join(line.splitlines()) + "\n").encode()
        with self._lock:
            if self._replies_fd < 0:
                log.debug("not written (the communicator is stopped): %s", line)
                return
            try:
                os.write(self._replies_fd, data)
            except OSError as e:
                log.warning("cannot write %r to %s: %s", line, self.directory / REPLIES, e)


# -- the scheduler's side: append an order, wait for its replies -------------------------
def send(directory: str | os.PathLike[str], order: str, timeout: float = 60.0) -> list[str]:
    """Append ``order`` to the job's orders file in ``directory`` and return its
    reply lines, without the line number, the final ``ok ...`` or ``error ...``
    last. ``TimeoutError`` if it has not come within ``timeout`` seconds."""
    if "\n" in order or not order.strip():
        raise ValueError(f"an order is one non-empty line, got {order!r}")
    where = order_dir(directory)
    number = _append(where / ORDERS, order.strip())
    prefix = f"{number} "
    lines: list[str] = []
    offset, rest = 0, b""
    deadline = time.monotonic() + timeout
    with open(where / REPLIES, "rb") as replies:
        while True:
            replies.seek(offset)
            data = replies.read()
            offset += len(data)
            *whole, rest = (rest + data).split(b"\n")
            for raw in whole:
                text = raw.decode("utf-8", errors="replace")
                if text.startswith(prefix):
                    lines.append(text[len(prefix):])
                    if text[len(prefix):].startswith(("ok", "error")):
                        return lines
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to order {number} ({order!r}) within {timeout:g} s "
                                   f"in {where / REPLIES}")
            time.sleep(0.02)


def _append(path: Path, line: str) -> int:
    """Append ``line`` to the orders file; its line number. Under an exclusive lock,
    so that two writers number their lines right."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: no job takes orders there yet") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        before = os.pread(fd, size, 0) if size else b""
        if before and not before.endswith(b"\n"):  # a line cut short ends here (and is refused)
            os.write(fd, b"\n")
            before += b"\n"
        os.write(fd, line.encode() + b"\n")
        return before.count(b"\n") + 1
    finally:
        os.close(fd)  # and the lock with it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Give a job that runs under the file communicator one order, as its "
                    "scheduler would, and print the job's replies to it.")
    parser.add_argument("directory", help="the job's FILE_COMMUNICATOR_DIR")
    parser.add_argument("order", nargs="+", help=f"the order: {VERBS}, with its words")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    args = parser.parse_args(argv)
    try:
        lines = send(args.directory, " ".join(args.order), args.timeout)
    except (ConfigError, ValueError, OSError) as e:  # TimeoutError is an OSError
        print(f"file_communicator: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 1 if lines[-1].startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())
