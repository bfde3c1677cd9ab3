"""The launcher interface, and the process handle every built-in launcher returns."""

from __future__ import annotations

import abc
import collections
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

from ._hostnames import check_host

__all__ = ["Launcher", "PlaceProcess", "LaunchedPlace", "StderrTail", "StderrHub", "stderr_hub",
           "place_command", "supervised", "child_environment", "checked_host"]


class PlaceProcess(Protocol):
    """Handle of a started place; the shape of :class:`subprocess.Popen`."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def last_error(self) -> str: ...


class Launcher(abc.ABC):
    """Starts place processes.

    The bootstrap mapping must reach the place's stdin as one JSON line, and
    that stdin must stay open while the launching place lives: its end of file
    tells the place that its parent is gone (no orphans, even across ssh and
    srun). A launcher is built with the runtime's configuration.
    """

    name: str = "?"

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        """Start place ``place_id`` on ``host``; raise ``OSError`` with the reason if it cannot."""
        checked_host(host)
        return LaunchedPlace(self.command(host, place_command(place_id, python)), bootstrap)

    def prepare(self, python: str = "") -> None:
        """Place 0 will start places soon: get ready now, in the background (the
        local launcher starts its fork server). Launching works without it."""

    def close(self) -> None:
        """``apgas.run`` ends: stop whatever :meth:`prepare` or :meth:`launch` left running."""

    def command(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                secret_names: Sequence[str] = (), cwd: str | None = None) -> list[str]:
        """The command line that runs ``argv`` on ``host`` in ``cwd`` (default: this
        directory; a command that runs here leaves it to the caller).

        ``env`` are variables the program needs there: the caller also sets them
        in the local process, and launchers that do not carry the local
        environment along (ssh) put them into the command, except those named in
        ``secret_names``: the program's side reads these from its stdin first, in
        the bytes :meth:`secret_input` gave for them (ssh: one block, in which
        values may hold any character but NUL), and they are in no command
        line. A launcher whose :meth:`secret_input` is ``None`` is never given
        any. The scheduler starts its jobs with this, naming every variable of
        the job (its key, its tag, its ``env``): nothing of a job's environment is
        in a command line that other users can read (``/proc/<pid>/cmdline``).
        Raise ``OSError`` if ``host`` cannot be reached.
        """
        raise OSError(f"the {self.name} launcher cannot run a command on a host")

    def secret_input(self, host: str, secret_env: Mapping[str, str]) -> bytes | None:
        """How ``secret_env`` (a job's key and environment) reaches the program on
        ``host`` without showing in any command line: ``None`` if the local
        environment does (the caller sets it there; local and srun carry it
        along), else the bytes to write to the process's stdin, for a command
        made by :meth:`command` with ``secret_names`` naming the same variables.
        OSError if a variable cannot be passed so (ssh: a name that is no
        variable name)."""
        return None


def checked_host(host: str) -> str:
    """``host`` if it is a host name (:func:`check_host`), else OSError naming it:
    a name such as ``-oProxyCommand=...`` must never reach ssh or srun."""
    try:
        return check_host(host)
    except ValueError as e:
        raise OSError(f"refused to start anything: {e}") from None


def place_command(place_id: int, python: str = "") -> list[str]:
    """The command line of a place process (the parent pid marks whose child it is)."""
    return [python or sys.executable, "-m", "apgas._serve",
            "--parent", str(os.getpid()), "--place", str(place_id)]


def supervised(argv: Sequence[str]) -> list[str]:
    """``argv`` (a place command) under its supervisor, run by the same Python: on
    another host it ends the place when place 0 is gone (:mod:`launcher._supervise`)."""
    return [argv[0], "-m", "launcher._supervise", "--", *argv]


_MPI_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_", "I_MPI_")


def child_environment() -> dict[str, str]:
    """This process's environment without mpiexec's rank variables: a place
    started by a launcher is not an MPI rank, and must not be taken for one."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_MPI_PREFIXES)}


def _pass_on(kept: collections.deque[str], lines: list[bytes]) -> None:
    """Keep ``lines`` (a place's stderr) in ``kept`` and write them to our stderr."""
    out = getattr(sys.stderr, "buffer", None)
    for line in lines:
        kept.append(line.decode(errors="replace").rstrip())
        try:
            if out is not None:
                out.write(line)
            else:
                sys.stderr.write(line.decode(errors="replace"))
        except (OSError, ValueError):
            pass
    if lines and out is not None:
        try:
            out.flush()
        except (OSError, ValueError):
            pass


class StderrTail:
    """Copies a place's stderr through to ours, keeping the last lines, so that a
    place that dies before joining can be reported with its own words
    (``ssh: Could not resolve hostname``, ``srun: error: ...``)."""

    def __init__(self, stream: IO[bytes], label: object, keep_lines: int = 8) -> None:
        self._stream = stream
        self._tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._copier = threading.Thread(target=self._copy, daemon=True, name=f"apgas-stderr-{label}")
        self._copier.start()

    def _copy(self) -> None:
        with self._stream:
            for line in self._stream:
                _pass_on(self._tail, [line])

    def text(self, ended: bool) -> str:
        """The kept lines; once the process has ended, after its last ones came."""
        if ended:
            self._copier.join(1.0)
        return "\n".join(line for line in self._tail if line)


class StderrHub:
    """One thread that copies the stderr of many places through, keeping each one's
    last lines like :class:`StderrTail`. Forked places use it: a thread per place
    would be started, and waited for until it runs, on the launch path."""

    class Tail:
        """One place's stderr: the kept lines, and whether its end has come."""

        def __init__(self, keep_lines: int) -> None:
            self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
            self.partial = b""
            self.done = threading.Event()

        def text(self, ended: bool) -> str:
            if ended:
                self.done.wait(1.0)
            return "\n".join(line for line in self.lines if line)

    def __init__(self) -> None:
        self._poll = select.epoll()
        self._tails: dict[int, StderrHub.Tail] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._copy, name="apgas-stderr", daemon=True).start()

    def add(self, fd: int, keep_lines: int = 8) -> StderrHub.Tail:
        """Copy ``fd`` (a pipe's read end, closed at its end of file) from now on."""
        tail = StderrHub.Tail(keep_lines)
        with self._lock:
            self._tails[fd] = tail
        self._poll.register(fd, select.EPOLLIN)
        return tail

    def _copy(self) -> None:
        while True:
            for fd, _ in self._poll.poll():
                with self._lock:
                    tail = self._tails.get(fd)
                if tail is None:
                    continue
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if data:
                    *whole, tail.partial = (tail.partial + data).split(b"\n")
                    _pass_on(tail.lines, [line + b"\n" for line in whole])
                    continue
                _pass_on(tail.lines, [tail.partial] if tail.partial else [])
                self._poll.unregister(fd)
                with self._lock:
                    del self._tails[fd]
                os.close(fd)
                tail.done.set()


_hub: StderrHub | None = None
_hub_lock = threading.Lock()


def stderr_hub() -> StderrHub:
    """This process's :class:`StderrHub`, started on first use."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = StderrHub()
        return _hub


def _forget_hub_after_fork() -> None:
    global _hub, _hub_lock
    _hub, _hub_lock = None, threading.Lock()  # its thread did not come along


os.register_at_fork(after_in_child=_forget_hub_after_fork)


class LaunchedPlace:
    """A place started as a child process (directly, or via ssh or srun).

    Its stderr passes through to ours, and the last lines are kept for error
    messages (:class:`StderrTail`).
    """

    def __init__(self, command: Sequence[str], bootstrap: Mapping[str, Any],
                 env: Mapping[str, str] | None = None, keep_lines: int = 8) -> None:
        self.command = list(command)
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                      close_fds=True, env=child_environment() if env is None
                                      else dict(env))
        self.pid = self._proc.pid
        self.stdin = self._proc.stdin
        assert self._proc.stderr is not None and self.stdin is not None
        self._tail = StderrTail(self._proc.stderr, self.pid, keep_lines)
        try:
            self.stdin.write(json.dumps(dict(bootstrap)).encode() + b"\n")
            self.stdin.flush()
        except BrokenPipeError:
            pass  # it died at once: poll() and last_error() tell why

    def last_error(self) -> str:
        """The last lines the process wrote to stderr (after it ended: all of them)."""
        return self._tail.text(self._proc.poll() is not None)

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)

    def kill(self) -> None:
        self._proc.kill()

    def terminate(self) -> None:
        self._proc.terminate()
