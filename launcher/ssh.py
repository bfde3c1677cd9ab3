"""Start places on other hosts through ``ssh``."""

from __future__ import annotations

import os
import shlex
from typing import Mapping, Sequence

from ._base import Launcher, checked_host
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
    ``--`` and must pass ``apgas.protocol.check_host``: it is never read as an option.
    """

    name = "ssh"

    def command(self, host: str, argv: Sequence[str],
                env: Mapping[str, str] | None = None) -> list[str]:
        checked_host(host)
        if is_local_host(host):
            return list(argv)
        ssh = shlex.split(getattr(self.config, "ssh", "") or "ssh")
        variables = [f"{k}={v}" for k, v in (env or {}).items()]
        run = shlex.join(["env", *variables, *argv] if variables else list(argv))
        remote = f"cd {shlex.quote(os.getcwd())} && exec {run}"  # a missing directory says so
        return [*ssh, "-T", "-o", "BatchMode=yes", "--", host, remote]
