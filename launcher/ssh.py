"""Start places on other hosts through ``ssh``."""

from __future__ import annotations

import os
import shlex
from typing import Any, Mapping

from ._base import Launcher, LaunchedPlace, PlaceProcess, place_command
from .local import is_local_host

__all__ = ["SshLauncher"]


class SshLauncher(Launcher):
    """``ssh host 'cd <cwd> && exec python -m apgas._serve ...'`` per place.

    The bootstrap line travels over ssh's stdin, and so does its end of file:
    when the launching place dies, ssh closes the remote stdin and the place
    exits. Hosts that are this machine are started directly, without ssh.
    The ssh command (``APGAS_SSH``, default ``ssh``) may carry options such as
    ``ssh -F cluster.conf``; BatchMode is forced so that a missing key fails at
    once instead of asking for a password nobody will type.
    """

    name = "ssh"

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        command = place_command(place_id, python)
        if is_local_host(host):
            return LaunchedPlace(command, bootstrap)
        ssh = shlex.split(getattr(self.config, "ssh", "") or "ssh")
        remote = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec {shlex.join(command)}"
        return LaunchedPlace([*ssh, "-T", "-o", "BatchMode=yes", host, remote], bootstrap)
