"""The launcher interface, and the process handle every built-in launcher returns."""

from __future__ import annotations

import abc
import collections
import json
import os
import subprocess
import sys
import threading
from typing import Any, Mapping, Protocol, Sequence

__all__ = ["Launcher", "PlaceProcess", "LaunchedPlace", "place_command", "child_environment",
           "checked_host"]


class PlaceProcess(Protocol):
    """Handle of a started place; the shape of :class:`subprocess.Popen`."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


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

    def command(self, host: str, argv: Sequence[str],
                env: Mapping[str, str] | None = None) -> list[str]:
        """The command line that runs ``argv`` on ``host`` in this directory.

        ``env`` are variables the program needs there: the caller also sets them
        in the local process, and launchers that do not carry the local
        environment along (ssh) put them into the command. The scheduler starts
        its jobs with this; raise ``OSError`` if ``host`` cannot be reached.
        """
        raise OSError(f"the {self.name} launcher cannot run a command on a host")

    def secret_input(self, host: str, secret_env: Mapping[str, str]) -> bytes | None:
        """How ``secret_env`` (a job's key) reaches the program on ``host`` without
        showing in any command line: ``None`` if the local environment does
        (the caller sets it there; local and srun carry it along), else the
        bytes to write to the process's stdin, for a command made by
        :meth:`command` with ``secret_names``."""
        return None


def checked_host(host: str) -> str:
    """``host`` if it is a host name (``apgas.protocol.check_host``), else OSError naming it:
    a name such as ``-oProxyCommand=...`` must never reach ssh or srun."""
    from apgas.protocol import check_host  # here: apgas imports this package on its way in

    try:
        return check_host(host)
    except ValueError as e:
        raise OSError(f"refused to start anything: {e}") from None


def place_command(place_id: int, python: str = "") -> list[str]:
    """The command line of a place process (the parent pid marks whose child it is)."""
    return [python or sys.executable, "-m", "apgas._serve",
            "--parent", str(os.getpid()), "--place", str(place_id)]


_MPI_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_", "I_MPI_")


def child_environment() -> dict[str, str]:
    """This process's environment without mpiexec's rank variables: a place
    started by a launcher is not an MPI rank, and must not be taken for one."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_MPI_PREFIXES)}


class LaunchedPlace:
    """A place started as a child process (directly, or via ssh or srun).

    Its stderr passes through to ours, and the last lines are kept so that a
    place that dies before joining can be reported with its own words
    (``ssh: Could not resolve hostname``, ``srun: error: ...``).
    """

    def __init__(self, command: Sequence[str], bootstrap: Mapping[str, Any],
                 env: Mapping[str, str] | None = None, keep_lines: int = 8) -> None:
        self.command = list(command)
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                      close_fds=True, env=child_environment() if env is None
                                      else dict(env))
        self.pid = self._proc.pid
        self.stdin = self._proc.stdin
        self._tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._copier = threading.Thread(target=self._copy_stderr, daemon=True,
                                        name=f"apgas-stderr-{self.pid}")
        self._copier.start()
        assert self.stdin is not None
        try:
            self.stdin.write(json.dumps(dict(bootstrap)).encode() + b"\n")
            self.stdin.flush()
        except BrokenPipeError:
            pass  # it died at once: poll() and last_error() tell why

    def _copy_stderr(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._tail.append(line.decode(errors="replace").rstrip())
            try:
                if out is not None:
                    out.write(line)
                    out.flush()
                else:
                    sys.stderr.write(line.decode(errors="replace"))
            except (OSError, ValueError):
                pass

    def last_error(self) -> str:
        """The last lines the process wrote to stderr (after it ended: all of them)."""
        if self._proc.poll() is not None:
            self._copier.join(1.0)
        return "\n".join(line for line in self._tail if line)

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)

    def kill(self) -> None:
        self._proc.kill()

    def terminate(self) -> None:
        self._proc.terminate()
