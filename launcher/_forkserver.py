"""Places that start like forks: a warmed template process forks them on request.

A fresh interpreter per place (``python -m apgas._serve``) imports the runtime,
ZeroMQ and numpy every time, and on a small machine many of them at once compete
for the cores: start-up grows faster than the number of places. The launching
place instead starts one template (``python -m apgas._serve --fork-server FD``,
:mod:`launcher._forktemplate`) that imports all that once, creates no thread and
no ZeroMQ context, and waits on a private ``socketpair`` inherited by it alone.
Each request carries the new place's stdin, stdout and stderr as file
descriptors (``SCM_RIGHTS``, as :mod:`multiprocessing`'s forkserver does), its
arguments, environment and directory; the template forks a child that runs the
place exactly as ``python -m apgas._serve --parent P --place N`` would.

The place is a child of the launching place, as a fresh interpreter would be:
the template forks twice and the middle process exits at once, while the
launching place is a child subreaper (``PR_SET_CHILD_SUBREAPER``, set only
while requests are in flight), so the kernel hands the orphaned place to it.
It waits for the place's exit status itself (:class:`ForkedPlace` behaves like
:class:`subprocess.Popen`), and a place lives on whatever becomes of the template.

No orphans: the stdin pipe of a forked place comes from the launching place, so
its end of file still stops the place when the launching place is gone, and the
template exits when its socket reaches end of file (the launching place closed
it, or died). Any failure of the template makes the places waiting for it, and
all later ones, start as fresh interpreters, after one warning: no place start
is lost.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from ._base import LaunchedPlace, child_environment, stderr_hub

__all__ = ["ForkServer", "ForkedPlace", "fork_available", "shared_server", "report_broken",
           "stop_shared_server", "UNKNOWN_EXIT", "MAX_MESSAGE"]

log = logging.getLogger("apgas.launcher")

READY_TIMEOUT_S = 30.0   # the template's imports, on a busy machine
REPLY_TIMEOUT_S = 4.0   # silence of a template that has requests to answer (then: spawn)
STOP_TIMEOUT_S = 2.0
MAX_MESSAGE = 1 << 20
UNKNOWN_EXIT = 255       # a forked place whose status went elsewhere (someone else reaped it)
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
# variables read when the interpreter starts or numpy loads: a template started
# with other values cannot give them to a child, which then starts fresh
_START_PREFIXES = ("PYTHON", "LD_", "OMP_", "OPENBLAS_", "MKL_", "GOTO", "BLIS_", "MALLOC_")


@functools.lru_cache(maxsize=1)
def fork_available() -> bool:
    """Linux with pidfds (5.3+) and child subreapers (3.4+): what the fork server needs."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
        flag = ctypes.c_int(0)
        return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag)) == 0
    except (OSError, AttributeError):
        return False


def _prctl(option: int, value: int) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(value), 0, 0, 0)


class _Subreaper:
    """This process adopts its orphaned descendants while place starts are in flight
    (and only then: an orphan it adopts by chance stays its zombie)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_set = False

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                flag = ctypes.c_int(0)
                _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag))
                self._was_set = bool(flag.value)  # someone else's setting stays
                if not self._was_set:
                    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and not self._was_set:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)


_subreaper = _Subreaper()


def _start_values(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_START_PREFIXES)}


class ForkServer:
    """The launching place's end of one template process.

    Requests are pipelined: :meth:`fork` returns once the request is sent, and
    the reader thread hands each reply to its pending :class:`ForkedPlace` (by
    the request's id), so the template forks place after place without waiting
    for this process to be scheduled in between.
    """

    def __init__(self, python: str = "", preload: str = "") -> None:
        """``preload``: comma-separated modules the template imports too (``APGAS_PRELOAD``)."""
        self.python = python or sys.executable
        self._env = child_environment()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [self.python, "-m", "apgas._serve", "--parent", str(os.getpid()),
                 "--fork-server", str(theirs.fileno()), "--preload", preload],
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=self._env)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._send_lock = threading.Lock()       # requests leave in the order of _pending
        self._cond = threading.Condition()       # _pending and the template's state
        self._pending: dict[int, ForkedPlace] = {}  # by request id, oldest first
        self._ids = itertools.count()
        self._started = time.monotonic()
        self._heard_at = 0.0                     # the template's last message (0: not ready yet)
        self._last_env: dict[str, str] = {}
        self._closing = False
        self.lost = ""                           # why the template is gone, once it is
        threading.Thread(target=self._read, name="apgas-forkserver", daemon=True).start()

    def usable_for(self, env: Mapping[str, str]) -> bool:
        """Whether a child can have ``env``: the start-time variables are the template's."""
        return not self.lost and _start_values(env) == _start_values(self._env)

    def fork(self, argv: Sequence[str], bootstrap: Mapping[str, Any], env: Mapping[str, str],
             keep_lines: int = 8) -> ForkedPlace:
        """Ask for a place running ``argv[3:]``; its handle comes back at once. If the
        template fails to fork it, the handle starts a fresh interpreter instead."""
        place = ForkedPlace(self, argv, bootstrap, env, keep_lines)
        stdout = _stdout_fd()
        failed = ""
        with self._send_lock:
            request: dict[str, Any] = {"id": next(self._ids), "args": list(argv[3:]),
                                       "cwd": os.getcwd()}
            if env != self._last_env:  # the template keeps the last one: requests stay small
                request["env"] = self._last_env = dict(env)
            with self._cond:
                if self.lost:
                    failed = f"the fork server is gone: {self.lost}"
                else:
                    _subreaper.hold()  # before the middle process exits: its orphan is ours
                    self._pending[request["id"]] = place
            try:
                if not failed:
                    socket.send_fds(self._sock, [json.dumps(request).encode()],
                                    [place._child_stdin, stdout, place._child_stderr])
            except OSError as e:
                self.kill(f"a request could not be sent: {e}")  # the reader fails it, as all pending
            finally:
                if stdout != 1:
                    os.close(stdout)
                place._sent()
        if failed:
            place._failed(failed)
        return place

    def _read(self) -> None:
        """Dispatch the template's messages: ready, then forked or error per request."""
        why = "its socket closed"
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                msg = json.loads(data)
                with self._cond:
                    self._heard_at = time.monotonic()
                if "ready" in msg:
                    continue
                with self._cond:
                    place = self._pending.pop(msg["id"])
                _subreaper.release()
                if "forked" in msg:
                    place._forked(msg["forked"])
                else:
                    place._failed(str(msg.get("error", msg)))
        except (OSError, ValueError, KeyError) as e:
            why = f"{type(e).__name__}: {e}"
        code = self.proc.poll()
        with self._cond:
            self.lost = self.lost or (why if code is None else f"it exited with code {code}")
            self._cond.notify_all()
            pending, self._pending = list(self._pending.values()), {}
        if not self._closing:
            report_broken(self, self.lost)
        for place in pending:
            _subreaper.release()
            place._failed(f"the fork server is gone: {self.lost}")

    def overdue(self) -> bool:
        """The template hangs (not ready in time, or silent for long with requests to
        answer; a slow one that answers is not): end it, so that waiting places start afresh."""
        with self._cond:
            if not self._pending or self.lost:
                return False
            if not self._heard_at:
                late = time.monotonic() - self._started > READY_TIMEOUT_S
            else:
                oldest = next(iter(self._pending.values())).sent_at
                late = time.monotonic() - max(oldest, self._heard_at) > REPLY_TIMEOUT_S
        if late:
            self.kill("it did not answer in time")
        return late

    def kill(self, why: str) -> None:
        """End the template at once (it failed); the places it forked are not its own."""
        with self._cond:
            self.lost = self.lost or why
            self._cond.notify_all()
        self.proc.kill()
        self.close()

    def close(self) -> None:
        """Close the socket: the template exits, and its reader here ends."""
        self._closing = self._closing or not self.lost
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` is readable within ``timeout`` s: ``poll``, as ``select`` fails on
    descriptors above 1023, which place 0 of a thousand places holds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, round(timeout * 1000))))


def _stdout_fd() -> int:
    """Our stdout for the child (places print there), or /dev/null if it is closed."""
    try:
        os.fstat(1)
        return 1
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


class ForkedPlace:
    """A place forked by the template: the :class:`launcher.PlaceProcess` handle.

    The process is this process's child (see :mod:`launcher._forkserver`), so
    ``poll``, ``wait`` and the signals work as with :class:`subprocess.Popen`.
    The bootstrap line is written once the fork is confirmed; if the template
    fails first, the place starts as a fresh interpreter
    (:class:`launcher.LaunchedPlace`) and this handle speaks for it.
    """

    def __init__(self, server: ForkServer, command: Sequence[str], bootstrap: Mapping[str, Any],
                 env: Mapping[str, str], keep_lines: int) -> None:
        self.command = list(command)
        self.returncode: int | None = None
        self.sent_at = time.monotonic()
        self._server = server
        self._bootstrap = dict(bootstrap)
        self._env = dict(env)
        self._keep_lines = keep_lines
        self._pid = -1
        self._pidfd = -1
        self._spawned: LaunchedPlace | None = None
        self._error = ""
        self._started = threading.Event()  # forked, or replaced by a fresh interpreter
        self._lock = threading.Lock()      # reaping and signalling: never a recycled pid
        self._child_stdin, stdin_w = os.pipe()
        stderr_r, self._child_stderr = os.pipe()
        self._stdin = open(stdin_w, "wb")  # noqa: SIM115  (the place's lifetime)
        self._tail = stderr_hub().add(stderr_r, keep_lines)

    # -- called by the server ---------------------------------------------------------------
    def _sent(self) -> None:
        """The template has (or never will have) the child's ends of the pipes."""
        os.close(self._child_stdin)
        os.close(self._child_stderr)

    def _forked(self, pid: int) -> None:
        self._pid = pid
        try:
            self._pidfd = os.pidfd_open(pid)  # our child, not reaped yet: surely this process
        except OSError:
            pass  # gone and reaped by someone else already: poll() says so
        try:
            self._stdin.write(json.dumps(self._bootstrap).encode() + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it died at once (or was closed): poll() and last_error() tell why
        self._started.set()

    def _failed(self, why: str) -> None:
        """Not forked: a child forked all the same reads end of file, and exits."""
        self._stdin.close()
        report_broken(self._server, why)
        log.info("place %s not forked (%s): it starts as a fresh interpreter", self.command[-1], why)
        try:
            self._spawned = LaunchedPlace(self.command, self._bootstrap, self._env, self._keep_lines)
        except OSError as e:
            self._error = f"it could not start as a fresh interpreter either: {e}"
            self.returncode = 127
        self._started.set()

    # -- the PlaceProcess face ----------------------------------------------------------------
    def _await_start(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._started.wait(0.05 if deadline is None else
                                     min(0.05, max(0.0, deadline - time.monotonic()))):
            self._server.overdue()
            if deadline is not None and time.monotonic() >= deadline:
                return self._started.is_set()
        return True

    @property
    def pid(self) -> int:
        self._await_start(None)
        return self._spawned.pid if self._spawned is not None else self._pid

    @property
    def stdin(self) -> IO[bytes] | None:
        return self._spawned.stdin if self._spawned is not None else self._stdin

    def __del__(self) -> None:
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)

    def _reap(self) -> int | None:
        """Collect the exit status if the process has ended (the forked case)."""
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self._pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
                except ChildProcessError:  # not ours after all: someone else has its status
                    if self._pidfd < 0 or _readable(self._pidfd, 0.0):
                        self.returncode = UNKNOWN_EXIT
                if self.returncode is not None and self._pidfd >= 0:
                    os.close(self._pidfd)  # ended: no signal goes to it any more
                    self._pidfd = -1
            return self.returncode

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._started.is_set():
            self._server.overdue()
            return None
        if self._spawned is not None:
            return self._spawned.poll()
        return self._reap()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.returncode is None and not self._await_start(timeout):
            raise subprocess.TimeoutExpired(self.command, timeout or 0)
        if self._spawned is not None:
            return self._spawned.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        while self._reap() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.command, timeout or 0)
            if self._pidfd >= 0:  # readable once the process has ended
                _readable(self._pidfd, 0.5 if left is None else min(0.5, left))
            else:
                time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        self._await_start(None)
        if self._spawned is not None:
            self._spawned.kill() if sig == signal.SIGKILL else self._spawned.terminate()
            return
        with self._lock:
            if self.returncode is None:  # not reaped by us: the pidfd (or pid) is still its own
                try:
                    if self._pidfd >= 0:
                        signal.pidfd_send_signal(self._pidfd, sig)
                    else:
                        os.kill(self._pid, sig)
                except ProcessLookupError:
                    pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def last_error(self) -> str:
        """The last lines the place wrote to stderr (after it ended: all of them)."""
        if self._spawned is not None:
            return self._spawned.last_error()
        return self._error or self._tail.text(self.poll() is not None)


# -- the launching place's one template -------------------------------------------------------

_shared: ForkServer | None = None
_shared_owner = 0
_shared_lock = threading.Lock()
_broken = ""  # why this process's template failed: places start as fresh interpreters


def shared_server(python: str = "", preload: str = "") -> ForkServer | None:
    """This process's template, started on first use (with ``preload``); None once
    it failed (after one warning): places then start as fresh interpreters until
    the run ends."""
    global _shared, _shared_owner, _broken
    if _shared is not None and _shared.lost:
        report_broken(_shared, _shared.lost)
    with _shared_lock:
        if _broken:
            return None
        if _shared is not None and _shared_owner == os.getpid():
            return _shared
        try:
            _shared, _shared_owner = ForkServer(python, preload), os.getpid()
        except OSError as e:
            _broken = str(e)
            log.warning("the fork server could not start (%s); places start as fresh "
                        "interpreters", e)
            return None
        return _shared


def report_broken(server: ForkServer, why: str) -> None:
    """The template failed: warn once, and start fresh interpreters from now on."""
    global _broken
    with _shared_lock:
        if server is _shared and not _broken:
            _broken = why
            log.warning("the fork server failed (%s); places start as fresh interpreters now", why)


def stop_shared_server() -> None:
    """Stop this process's template (``apgas.run`` ends): no process stays behind.
    A later run starts a new one."""
    global _shared, _broken
    with _shared_lock:
        server, _shared, _broken = _shared, None, ""
    if server is not None and _shared_owner == os.getpid():
        server.close()


def _forget_after_fork() -> None:
    """A fork of the launching place must not keep its template alive."""
    global _shared, _broken, _subreaper
    server, _shared, _broken, _subreaper = _shared, None, "", _Subreaper()
    if server is not None:
        server._sock.close()


os.register_at_fork(after_in_child=_forget_after_fork)
