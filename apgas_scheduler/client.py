"""Talk to a running scheduler: one JSON line out, one JSON line back."""

from __future__ import annotations

import json
import socket
from typing import Any

__all__ = ["request", "SchedulerError", "SchedulerUnreachable"]


class SchedulerError(RuntimeError):
    """The scheduler refused a request (the message says why) or cannot be reached."""


class SchedulerUnreachable(SchedulerError):
    """The scheduler cannot be reached, or sent no valid reply."""


def request(address: tuple[str, int], op: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
    """Send one request; return the reply, or raise ``SchedulerError`` with its reason."""
    try:
        with socket.create_connection(address, timeout=timeout) as conn:
            conn.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError as e:
        raise SchedulerUnreachable(f"cannot reach the scheduler at {address[0]}:{address[1]}: {e}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise SchedulerUnreachable(f"the scheduler at {address[0]}:{address[1]} sent no valid reply "
                             f"({data[:200]!r})") from None
    if not reply.get("ok"):
        raise SchedulerError(reply.get("error", "refused"))
    return reply
