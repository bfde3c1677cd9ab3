"""Start places as subprocesses of this machine: forked from a warmed template
(:mod:`launcher._forkserver`, ``start_method`` ``fork``), or fresh interpreters."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from . import _forkserver
from ._base import LaunchedPlace, Launcher, PlaceProcess, checked_host, child_environment, place_command

log = logging.getLogger("apgas.launcher")

__all__ = ["LocalLauncher", "is_local_host"]


@functools.lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return frozenset(names)


def is_local_host(host: str) -> bool:
    """True for this machine's names and for names listed in ``APGAS_LOCAL_HOSTS``
    (comma-separated; ``*`` stands for every name)."""
    extra = {h.strip() for h in os.environ.get("APGAS_LOCAL_HOSTS", "").split(",") if h.strip()}
    return host in _own_names() or host.startswith("127.") or host in extra or "*" in extra


def default_start_method() -> str:
    """``fork`` where the fork server works (Linux with pidfds), else ``spawn``."""
    return "fork" if _forkserver.fork_available() else "spawn"


class LocalLauncher(Launcher):
    """Places on this machine, as child processes.

    With ``start_method`` ``fork`` (the default on Linux) a place is forked
    from this process's template, which has imported the runtime once; with
    ``spawn``, or a ``python`` other than this one, it is a fresh interpreter.
    A template that fails makes every later place a fresh interpreter, after
    one warning.
    """

    name = "local"

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        command = self.command(host, place_command(place_id, python))
        server = self._fork_server(python)
        env = child_environment()
        if server is not None and server.usable_for(env):
            return server.fork(command, bootstrap, env)
        if server is not None:
            log.info("place %d starts as a fresh interpreter: the fork server's start-time "
                     "variables (PYTHON*, LD_*, OMP_*, ...) differ from this environment's", place_id)
        return LaunchedPlace(command, bootstrap, env)

    def prepare(self, python: str = "") -> None:
        """Start the fork server now, while place 0 sets itself up."""
        self._fork_server(python)

    def close(self) -> None:
        _forkserver.stop_shared_server()

    def _fork_server(self, python: str) -> _forkserver.ForkServer | None:
        method = getattr(self.config, "start_method", None) or default_start_method()
        if method != "fork" or python not in ("", sys.executable) or not _forkserver.fork_available():
            return None
        return _forkserver.shared_server(preload=getattr(self.config, "preload", ""))

    def command(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                secret_names: Sequence[str] = (), cwd: str | None = None) -> list[str]:
        """``argv`` itself: the host must be this machine. ``secret_names`` are never
        read from stdin here, the local environment carries them."""
        checked_host(host)
        if not is_local_host(host):
            raise OSError(f"host {host!r} is not this machine; list it in APGAS_LOCAL_HOSTS "
                          "to run its places here, or choose a launcher that reaches it "
                          "(APGAS_LAUNCHER=ssh or srun)")
        return list(argv)
