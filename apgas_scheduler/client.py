"""Talk to a running scheduler: one JSON line out, one JSON line back.

The request goes signed with the operator's key over TCP, or plain over the
scheduler's Unix socket, where the kernel tells the scheduler who is asking
(see :mod:`.access`). Without either given, the operator's default key file
is used if this user can read it, else the default Unix socket of that port.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from apgas import auth

from . import access

__all__ = ["request", "SchedulerError", "SchedulerUnreachable"]


class SchedulerError(RuntimeError):
    """The scheduler refused a request (the message says why) or cannot be reached."""


class SchedulerUnreachable(SchedulerError):
    """The scheduler cannot be reached, or sent no valid reply."""


def _door(address: tuple[str, int], key: str | None, socket_path: str | Path | None
          ) -> tuple[str | None, Path | None]:
    """The key to sign with, or the Unix socket to use."""
    if socket_path is not None or key is not None:
        return key, Path(socket_path) if socket_path is not None else None
    key_file = access.default_key_file()
    try:
        return auth.read_secret(key_file), None
    except (OSError, auth.AuthError) as e:
        unix = access.default_socket_path(address[1])
        if unix.is_socket():
            return None, unix
        raise SchedulerError(f"no way in to the scheduler at {address[0]}:{address[1]}: cannot read "
                             f"the operator's key {key_file} ({e}) and there is no Unix socket "
                             f"{unix}; give --key-file or --socket") from None


def request(address: tuple[str, int], op: str, timeout: float = 30.0, *, key: str | None = None,
            socket_path: str | Path | None = None, **fields: Any) -> dict[str, Any]:
    """Send one request; return the reply, or raise ``SchedulerError`` with its reason."""
    key, unix = _door(address, key, socket_path)
    line = json.dumps({"op": op, **fields})
    where = str(unix) if unix else f"{address[0]}:{address[1]}"
    try:
        if unix is not None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout)
            conn.connect(str(unix))
        else:
            conn = socket.create_connection(address, timeout=timeout)
            line = auth.sign(key or "", line)
        with conn:
            conn.sendall(line.encode() + b"\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError as e:
        raise SchedulerUnreachable(f"cannot reach the scheduler at {where}: {e}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise SchedulerUnreachable(f"the scheduler at {where} sent no valid reply "
                                   f"({data[:200]!r})") from None
    if not reply.get("ok"):
        raise SchedulerError(reply.get("error", "refused"))
    return reply
