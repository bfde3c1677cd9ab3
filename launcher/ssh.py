"""Start places on other hosts through ``ssh``."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ._base import LaunchedPlace, Launcher, PlaceProcess, checked_host, place_command, supervised
from .local import is_local_host

__all__ = ["SshLauncher"]


class SshLauncher(Launcher):
    """``ssh host 'cd <cwd> && exec python -m apgas._serve ...'`` per place.

    The bootstrap line travels over ssh's stdin, and so does its end of file:
    when the launching place dies, ssh closes the remote stdin and the place
    exits. Hosts that are this machine are started directly, without ssh.
    The ssh command (``APGAS_SSH``, default ``ssh``) may carry options such as
    ``ssh -F cluster.conf``; BatchMode is forced so that a missing key fails at
    once instead of asking for a password nobody will type. The host comes after
    ``--`` and must pass :func:`launcher.check_host`: it is never read as an option.

    On the host the place runs under its supervisor (:mod:`launcher._supervise`),
    which ends it when place 0 dies, is cut off, or kills this ssh client
    (declaring the place dead): sshd alone would leave a stopped place there,
    and a cut link gives it no end of file.
    """

    name = "ssh"

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        checked_host(host)
        argv = place_command(place_id, python)
        return LaunchedPlace(self.command(host, argv if is_local_host(host) else supervised(argv)),
                             bootstrap)

    def command(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                secret_names: Sequence[str] = (), cwd: str | None = None) -> list[str]:
        """``secret_names``: variables read from stdin on the remote side, one line
        each, in this order (see :meth:`secret_input`); never in the command."""
        checked_host(host)
        if is_local_host(host):
            return list(argv)
        ssh = shlex.split(getattr(self.config, "ssh", "") or "ssh")
        variables = [f"{k}={v}" for k, v in (env or {}).items()]
        run = shlex.join(["env", *variables, *argv] if variables else list(argv))
        secrets = "".join(f"IFS= read -r {shlex.quote(name)} && export {shlex.quote(name)} && "
                          for name in secret_names)
        where = shlex.quote(cwd or os.getcwd())
        remote = f"cd {where} && {secrets}exec {run}"  # a missing directory says so
        return [*ssh, "-T", "-o", "BatchMode=yes", "--", host, remote]

    def secret_input(self, host: str, secret_env: Mapping[str, str]) -> bytes | None:
        if is_local_host(host) or not secret_env:
            return None
        return "".join(f"{value}\n" for value in secret_env.values()).encode()
