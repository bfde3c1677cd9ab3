"""Talk to a running scheduler: one JSON line out, one JSON line back.

The request goes signed with the operator's key over TCP, or plain over the
scheduler's Unix socket, where the kernel tells the scheduler who is asking
(see :mod:`.access`). Without either given, the operator's default key file
is used if this user can read it, else the Unix socket of that port in this
user's socket directory or root's (:func:`.access.socket_candidates`).

The client knows whom it talks to, too: before anything is sent, the socket
file and the process listening on it (or on a port of this machine) must be
root's, this user's or the user named as the scheduler's; a socket or a port
that another user took while no scheduler ran is refused, saying whose it is.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

from apgas import auth
from apgas.serving import loggable, owner_name, peer_is_local, peer_uid

from .live import access

__all__ = ["request", "submit", "new_request_key", "SchedulerError", "SchedulerUnreachable",
           "MAX_ERROR"]

log = logging.getLogger("apgas_scheduler.client")

MAX_ERROR = 2000
"""Characters of a refusal's reason that a SchedulerError keeps (escaped: the
reason may quote a client's text, e.g. a job's name)."""


class SchedulerError(RuntimeError):
    """The scheduler refused a request (the message says why) or cannot be reached."""


class SchedulerUnreachable(SchedulerError):
    """The scheduler cannot be reached, or sent no valid reply; ``sent``: whether
    the request went out (then it may have been carried out)."""

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


def _door(address: tuple[str, int], key: str | None, socket_path: str | Path | None
          ) -> tuple[str | None, Path | None]:
    """The key to sign with, or the Unix socket to use."""
    if socket_path is not None or key is not None:
        return key, Path(socket_path) if socket_path is not None else None
    key_file = access.default_key_file()
    try:
        return auth.read_secret(key_file), None
    except (OSError, auth.AuthError) as e:
        candidates = access.socket_candidates(address[1])
        for unix in candidates:
            if os.path.lexists(unix):
                return None, unix
        raise SchedulerError(f"no way in to the scheduler at {address[0]}:{address[1]}: cannot read "
                             f"the operator's key {key_file} ({e}) and there is no Unix socket "
                             f"{' or '.join(map(str, candidates))}; give --key-file or --socket"
                             ) from None


def _trusted_uids(scheduler_uid: int | None) -> set[int]:
    """Whom a client talks to: root, itself, and the scheduler's user if named."""
    return {0, os.geteuid()} | ({scheduler_uid} if scheduler_uid is not None else set())


def _refuse(where: str, what: str, uid: int, trusted: set[int]) -> SchedulerError:
    others = sorted(trusted - {0, os.geteuid()})
    named = ", ".join(owner_name(u) for u in others)
    return SchedulerError(
        f"refusing to talk to {where}: {what} {owner_name(uid)}, not root, you"
        + (f" or {named}" if named else "") + "; another user may be posing as the scheduler. "
        "If the scheduler really runs as that user, say so with --scheduler-user")


def _connect_unix(path: Path, trusted: set[int], timeout: float) -> socket.socket:
    """A connection to the scheduler's socket at ``path``, once the socket file and
    the process listening on it (``SO_PEERCRED``) are shown to be a trusted user's:
    nothing of the request, its job's environment included, goes to anyone else."""
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode):
        raise SchedulerError(f"refusing to talk to {path}: it is not a socket")
    if st.st_uid not in trusted:
        raise _refuse(str(path), "the socket belongs to", st.st_uid, trusted)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        conn.connect(str(path))
        uid = peer_uid(conn)  # SO_PEERCRED
        if uid is None:
            raise SchedulerError(f"refusing to talk to {path}: the kernel did not say which "
                                 "user listens there")
        if uid not in trusted:
            raise _refuse(str(path), "the process listening there runs as", uid, trusted)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_tcp(address: tuple[str, int], trusted: set[int], timeout: float) -> socket.socket:
    """A connection to the scheduler's port; when it is on this machine, only once
    the process listening there is shown to be a trusted user's (a port nobody
    listened on can be taken by anyone)."""
    conn = socket.create_connection(address, timeout=timeout)
    try:
        uid = peer_uid(conn)
        local = peer_is_local(conn)
        # A connection the server has not accepted yet may name no owner (always so for
        # a root server, and for any on older kernels): ask again until it is accepted,
        # unless the other end reset or closed it meanwhile (a scheduler killed with the
        # connection in its queue): then nothing went out and the caller may try again.
        deadline, pause = time.monotonic() + timeout, 0.005
        while uid is None and local and time.monotonic() < deadline:
            if _hung_up(conn):
                raise SchedulerUnreachable(f"cannot reach the scheduler at {address[0]}:"
                                           f"{address[1]}: the connection was closed before it "
                                           "was taken (the scheduler stopped?)", sent=False)
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
            uid = peer_uid(conn)
        if local and uid is None:
            raise SchedulerUnreachable(f"cannot reach the scheduler at {address[0]}:{address[1]}: "
                                       f"it did not take the connection within {timeout:g} s, so "
                                       "whose it is cannot be told")
        if uid is not None and uid not in trusted:
            raise _refuse(f"{address[0]}:{address[1]}", "the process listening there runs as",
                          uid, trusted)
    except BaseException:
        conn.close()
        raise
    return conn


def _hung_up(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` reset or closed it; nothing is read from it
    (a peek, and only once poll says it would not block)."""
    try:
        poller = select.poll()
        poller.register(conn, select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return False  # nothing came: not closed
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset (ECONNRESET), or no longer a connection
        return True


def request(address: tuple[str, int], op: str, timeout: float = 30.0, *, key: str | None = None,
            socket_path: str | Path | None = None, scheduler_uid: int | None = None,
            **fields: Any) -> dict[str, Any]:
    """Send one request; return the reply, or raise ``SchedulerError`` with its reason.
    ``scheduler_uid``: the user the scheduler runs as, when that is neither root
    nor us (else a socket or a local port of another user is refused)."""
    key, unix = _door(address, key, socket_path)
    trusted = _trusted_uids(scheduler_uid)
    line = json.dumps({"op": op, **fields})
    where = str(unix) if unix else f"{address[0]}:{address[1]}"
    sent = False
    try:
        if unix is not None:
            conn = _connect_unix(unix, trusted, timeout)
        else:
            conn = _connect_tcp(address, trusted, timeout)
            line = auth.sign(key or "", line)
        with conn:
            conn.sendall(line.encode() + b"\n")
            sent = True
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError as e:
        raise SchedulerUnreachable(f"cannot reach the scheduler at {where}: {e}", sent) from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise SchedulerUnreachable(f"the scheduler at {where} sent no valid reply "
                                   f"({data[:200]!r})", True) from None
    if not reply.get("ok"):
        raise SchedulerError(loggable(str(reply.get("error", "refused")), MAX_ERROR))
    return reply


def new_request_key() -> str:
    """A fresh key for one submit: the scheduler makes one job of every submit with
    the same key from the same user, so a submit may be sent again safely."""
    return secrets.token_hex(16)


def submit(address: tuple[str, int], job: dict[str, Any], *, retry_for: float = 0.0,
           request_key: str | None = None, **door: Any) -> int:
    """Submit ``job`` (a job file's table) and return its id. When the scheduler
    cannot be reached, or its reply is lost (a crash, a restart), send the same
    submit again for up to ``retry_for`` seconds: it carries one request key, so
    the scheduler runs it once however often it arrives. ``door``: ``key``,
    ``socket_path``, ``scheduler_uid``, ``file`` as for :func:`request`."""
    key = request_key or new_request_key()
    deadline = time.monotonic() + retry_for
    pause = 0.05
    while True:
        try:
            return int(request(address, "submit", job=job, request=key, **door)["id"])
        except SchedulerUnreachable:
            if time.monotonic() + pause > deadline:
                raise
            log.info("the scheduler at %s:%d did not answer; sending the submit again",
                     *address)
            time.sleep(pause)
            pause = min(2 * pause, 1.0)
