"""The template of the fork server: its loop, run by ``python -m apgas._serve --fork-server FD``.

The launching place's side, and why places are forked at all, are in
:mod:`launcher._forkserver`. The loop is single-threaded on purpose: a fork
copies only the calling thread, so no lock can be held by a thread that is not
there. Each request is forked twice: the middle process forks the place, tells
the template its pid and exits, so the place is orphaned at once and adopted by
the launching place (a child subreaper meanwhile), which then owns its exit
status. The template answers once the middle process has exited: the adoption
has happened when the launching place hears of the pid. Middle processes of
several requests run side by side, so a crowded machine, slow to schedule
each of them, does not make the template wait for one after the other.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from ._forkserver import MAX_MESSAGE

__all__ = ["serve_forks"]


def serve_forks(fd: int, run: Callable[[list[str]], int]) -> int:
    """Fork a place per request on the socket ``fd`` until it reaches end of file.

    ``run`` is the place's main, given the place's arguments; it never returns
    into here. Middle processes run side by side: the answer to a request goes
    out when its middle process has exited, tagged with the request's id.
    """
    for std in (0, 1, 2):  # held open, so that no received descriptor takes their numbers
        try:
            os.fstat(std)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_RDWR), std)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is place 0's to handle
    sock = socket.socket(fileno=fd)
    env: dict[str, str] = dict(os.environ)  # a request without one means: the last one
    middles: dict[int, tuple[object, int, int]] = {}  # its pidfd -> request id, pid, pid pipe
    poller = select.poll()  # not select: a thousand requests in flight pass descriptor 1023
    poller.register(sock, select.POLLIN)
    _send(sock, {"ready": os.getpid()})
    while True:
        ready = {fd for fd, _ in poller.poll()}
        for pidfd in ready & middles.keys():
            poller.unregister(pidfd)
            _send(sock, _middle_done(pidfd, *middles.pop(pidfd)))
        if fd not in ready:
            continue
        try:
            data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        except ConnectionResetError:
            return 0
        if not data:
            return 0  # the launching place closed its end, or died
        try:
            request = json.loads(data)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
                _send(sock, {"id": request.get("id"), "error": "bad request"})
                continue
            env = request.setdefault("env", env)
            started = _start_middle(sock, request, fds, run)
            if isinstance(started, str):
                _send(sock, {"id": request["id"], "error": started})
            else:
                middles[started[0]] = (request["id"], *started[1:])
                poller.register(started[0], select.POLLIN)
        finally:
            for f in fds:
                os.close(f)


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except (BrokenPipeError, ConnectionResetError):
        pass  # the launching place is gone: the next receive ends the loop


def _start_middle(sock: socket.socket, request: dict, fds: Sequence[int],
                  run: Callable[[list[str]], int]) -> tuple[int, int, int] | str:
    """Fork the middle process, which forks the place, writes its pid and exits:
    the middle's pidfd, pid and pid pipe, or why not."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid_r, pid_w = os.pipe()
    try:
        middle = os.fork()
    except OSError as e:
        os.close(pid_r)
        os.close(pid_w)
        return f"fork failed: {e}"
    if middle == 0:
        try:
            place = os.fork()
            if place == 0:
                _become_place(sock, request, fds, run)
            os.write(pid_w, struct.pack("i", place))
        finally:
            os._exit(0)
    os.close(pid_w)
    return os.pidfd_open(middle), middle, pid_r


def _middle_done(pidfd: int, request_id: object, middle: int, pid_r: int) -> dict:
    """The middle process has exited: the place is the launching place's now."""
    os.waitpid(middle, 0)
    try:
        told = os.read(pid_r, 4)
    finally:
        os.close(pid_r)
        os.close(pidfd)
    if len(told) != 4:
        return {"id": request_id, "error": "the middle process could not fork the place"}
    return {"id": request_id, "forked": struct.unpack("i", told)[0]}


def _become_place(sock: socket.socket, request: dict, fds: Sequence[int],
                  run: Callable[[list[str]], int]) -> NoReturn:
    """In the forked place: hold no descriptor of the template, then run the place."""
    code = 1
    try:
        sock.detach()  # closed below with every other inherited descriptor
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # no other place's pipes, no template socket
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv[1:] = request["args"]
        random = sys.modules.get("numpy.random")
        if random is not None:
            random.seed()  # each place its own global stream, as a fresh interpreter has
        code = run(list(request["args"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001  (whatever it was, this process must not return)
        traceback.print_exc()
    finally:
        os._exit(code)
