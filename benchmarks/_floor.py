"""The floors the runtime is measured against: bare ZeroMQ, pickled messages, a process pool.

* :class:`Echo` is a second process with a ROUTER that answers every message
  of a DEALER: as it came (the bare ping-pong of a 100-byte message), or, for
  a pickled call ``(fn, args, kwargs)``, with the pickled ``(True, result)``
  (what ``at()`` does, without the runtime around it). Both use the same
  sockets and the same process, in the same run as the runtime's figures.
* :func:`pool_rate` runs the same no-op tasks through ``multiprocessing.Pool.map``
  with ``chunksize=1``, one task per message.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from typing import Any, Callable

import zmq

__all__ = ["Echo", "pool_rate", "MESSAGE_BYTES"]

MESSAGE_BYTES = 100
_BARE, _PICKLED, _STOP = b"B", b"P", b"S"


def _serve_echo(endpoint: str) -> None:
    """The echo process: answer each message until told to stop."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        while True:
            route, message = sock.recv_multipart()
            mode = message[:1]
            if mode == _PICKLED:
                fn, args, kwargs = pickle.loads(memoryview(message)[1:])
                message = pickle.dumps((True, fn(*args, **kwargs)), 5)
            elif mode == _STOP:
                return
            sock.send_multipart([route, message])
    finally:
        sock.close()
        ctx.term()


class Echo:
    """A peer process for ping-pongs; a context manager that stops it on exit."""

    def __init__(self) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        spawn = multiprocessing.get_context("spawn")
        self._proc = spawn.Process(target=_serve_echo, args=(f"tcp://127.0.0.1:{port}",),
                                   daemon=True)
        self._proc.start()
        self.bare(1)  # connected and answering

    def bare(self, calls: int) -> list[float]:
        """Seconds of each of ``calls`` round trips of a 100-byte message."""
        sock, message = self._sock, _BARE + bytes(MESSAGE_BYTES - 1)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            sock.send(message)
            sock.recv()
            times.append(time.perf_counter() - start)
        return times

    def pickled(self, calls: int, fn: Callable[..., Any]) -> list[float]:
        """Seconds of each of ``calls`` pickled calls of ``fn()`` answered with its pickled result."""
        sock = self._sock
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            sock.send(_PICKLED + pickle.dumps((fn, (), {}), 5))
            ok, _ = pickle.loads(sock.recv())
            times.append(time.perf_counter() - start)
        return times

    def close(self) -> None:
        self._sock.send(_STOP)
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._sock.close()
        self._ctx.term()

    def __enter__(self) -> "Echo":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pool_rate(fn: Callable[[int], Any], tasks: int, workers: int, repeats: int) -> list[float]:
    """Tasks per second of ``Pool(workers).map(fn, range(tasks), chunksize=1)``, once per repeat."""
    rates = []
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(fn, range(workers * 10), chunksize=1)  # started and warm
        for _ in range(repeats):
            start = time.perf_counter()
            pool.map(fn, range(tasks), chunksize=1)
            rates.append(tasks / (time.perf_counter() - start))
    return rates
