"""Start places on other hosts through ``ssh``."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ._base import LaunchedPlace, Launcher, PlaceProcess, checked_host, place_command, supervised
from .local import is_local_host

__all__ = ["SshLauncher", "environment_block", "READ_ENVIRONMENT"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
END = "."
"""The line that ends the block of variables on stdin."""
READ_ENVIRONMENT = (
    "{ _apgas_env= && while IFS= read -r _apgas_line && [ \"$_apgas_line\" != " + END + " ]; "
    "do _apgas_env=\"$_apgas_env$_apgas_line\n\"; done; "
    "[ \"$_apgas_line\" = " + END + " ] || { echo 'apgas: the environment did not come on "
    "stdin' >&2; exit 125; }; eval \"$_apgas_env\" || exit 125; } && ")
"""POSIX sh that reads the block :func:`environment_block` made from stdin (line by
line: the shell's ``read`` takes no byte past the block, so the rest of stdin is
the program's) and exports its variables; no value is in it, so none is in any
command line. Without the whole block (no end line) nothing runs."""


def _quoted(value: str) -> str:
    """``value`` in single quotes for sh, each of its newlines as ``'"<newline>"'``:
    every line after the first begins with ``"`` and so is never the end line."""
    return "'" + value.replace("'", "'\\''").replace("\n", "'\"\n\"'") + "'"


def environment_block(variables: Mapping[str, str]) -> bytes:
    """The bytes that :data:`READ_ENVIRONMENT` turns back into ``variables``: one
    ``export NAME='value'`` per variable, then the end line. A value may hold any
    character but NUL (newlines, quotes, ``$``, backslashes: all arrive as they
    are); it is encoded as the environment of a process here would be (UTF-8,
    undecodable bytes as their surrogates). OSError for a name that is no
    variable name, or a value that cannot be an environment's."""
    lines = []
    for name, value in variables.items():
        if _NAME.fullmatch(name) is None:
            raise OSError(f"cannot pass {name[:80]!r} to the program: not a variable name")
        if "\0" in value:
            raise OSError(f"cannot pass {name} to the program: its value holds a NUL character")
        lines.append(f"export {name}={_quoted(value)}\n")
    try:
        return ("".join(lines) + END + "\n").encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise OSError(f"cannot pass the environment to the program: {e}") from None


class SshLauncher(Launcher):
    """``ssh host 'cd <cwd> && exec python -m apgas._serve ...'`` per place.

    The bootstrap line travels over ssh's stdin, and so does its end of file:
    when the launching place dies, ssh closes the remote stdin and the place
    exits. Hosts that are this machine are started directly, without ssh.
    The ssh command (``APGAS_SSH``, default ``ssh``) may carry options such as
    ``ssh -F cluster.conf``; BatchMode is forced so that a missing key fails at
    once instead of asking for a password nobody will type. The host comes after
    ``--`` and must pass :func:`launcher.check_host`: it is never read as an option.

    A command's variables named as ``secret_names`` (the scheduler names every
    variable of a job: its key, its tag, its ``env``) come over stdin too, ahead
    of the rest (:meth:`secret_input`), never in ssh's command line, which every
    user of this machine and of the host can read.

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
        """``secret_names``: variables the remote side reads from stdin first, as
        the block :meth:`secret_input` makes (:data:`READ_ENVIRONMENT`); a variable
        of ``env`` named there is left out of the command, the others go into it."""
        checked_host(host)
        if is_local_host(host):
            return list(argv)
        ssh = shlex.split(getattr(self.config, "ssh", "") or "ssh")
        private = set(secret_names)
        variables = [f"{k}={v}" for k, v in (env or {}).items() if k not in private]
        run = shlex.join(["env", *variables, *argv] if variables else list(argv))
        where = shlex.quote(cwd or os.getcwd())
        read = READ_ENVIRONMENT if private else ""
        remote = f"cd {where} && {read}exec {run}"  # a missing directory says so
        return [*ssh, "-T", "-o", "BatchMode=yes", "--", host, remote]

    def secret_input(self, host: str, secret_env: Mapping[str, str]) -> bytes | None:
        """The block of ``secret_env`` (:func:`environment_block`) for the stdin of a
        command made with those ``secret_names``; None on this machine."""
        if is_local_host(host) or not secret_env:
            return None
        return environment_block(secret_env)
