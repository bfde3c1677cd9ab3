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

import contextlib
import multiprocessing
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from benchmarks._common import Metric, Samples, fmt, median
from benchmarks._harness import Column, Table, Text

__all__ = ["Echo", "pool_rate", "floor_summary", "render_floor", "MESSAGE_BYTES"]

AT_OVER_BARE_TARGET = 1.5  # issue 32
BATCH_OVER_POOL_TARGET = 2.0  # issue 32: a finish against Pool.map(chunksize=1)


def floor_metrics(places: int) -> list[Metric]:
    """The rows of the floor table, for a run of ``places`` places."""
    return [
        Metric("bare_median_us", "bare pyzmq ping-pong (100 B): median", "us", False),
        Metric("bare_p99_us", "bare pyzmq ping-pong (100 B): p99", "us", False),
        Metric("pickled_median_us", "pickled-call ping-pong: median", "us", False),
        Metric("pickled_p99_us", "pickled-call ping-pong: p99", "us", False),
        Metric("rtt_median_us", "apgas at(): median", "us", False),
        Metric("rtt_p99_us", "apgas at(): p99", "us", False),
        Metric("pool2_tasks_s", "Pool(2).map(chunksize=1)", "tasks/s", True),
        Metric("batch2_tasks_s", "apgas finish over the same tasks, 2 places", "tasks/s", True),
        Metric(f"pool{places}_tasks_s", f"Pool({places}).map(chunksize=1)", "tasks/s", True),
        Metric("batch_tasks_s", f"apgas finish over the same tasks, {places} places", "tasks/s", True),
    ]


def floor_summary(samples: Samples, places: int) -> dict[str, Any]:
    """The runtime against its floor: medians, samples and the ratios with their targets."""
    metrics = floor_metrics(places)
    medians = {m.key: median(samples.get(m.key)) for m in metrics}

    def ratio(a: str, b: str) -> float | None:
        return medians[a] / medians[b] if medians[a] and medians[b] else None

    return {
        "medians": medians,
        "samples": {m.key: samples.get(m.key, []) for m in metrics},
        "at_over_bare_median": ratio("rtt_median_us", "bare_median_us"),
        "at_over_bare_p99": ratio("rtt_p99_us", "bare_p99_us"),
        "at_over_pickled_median": ratio("rtt_median_us", "pickled_median_us"),
        "batch2_over_pool2": ratio("batch2_tasks_s", "pool2_tasks_s"),
        f"batch{places}_over_pool{places}": ratio("batch_tasks_s", f"pool{places}_tasks_s"),
        "targets": {"at_over_bare": AT_OVER_BARE_TARGET, "batch_over_pool": BATCH_OVER_POOL_TARGET},
    }


def render_floor(floor: dict[str, Any], places: int) -> str:
    """The floor table: the runtime beside its floor, then the ratios against the targets."""
    table = Table([Column("against the floor (same run)", 52, left=True), Column("median of repeats", 18, gap=" ")],
                  rule=True)
    lines = [table.render([m.label, fmt(floor["medians"][m.key], m.unit)] for m in floor_metrics(places))]

    def verdict(value: float | None, target: float, at_most: bool) -> str:
        if value is None:
            return "-"
        met = value <= target if at_most else value >= target
        return f"{value:.2f}x ({'<=' if at_most else '>='} {target:g}x: {'met' if met else 'missed'})"

    for label, key, target, at_most in [
            ("at() / bare ping-pong, median", "at_over_bare_median", AT_OVER_BARE_TARGET, True),
            ("at() / bare ping-pong, p99", "at_over_bare_p99", AT_OVER_BARE_TARGET, True),
            ("finish / Pool(2), 2 places", "batch2_over_pool2", BATCH_OVER_POOL_TARGET, False),
            (f"finish / Pool({places}), {places} places", f"batch{places}_over_pool{places}",
             BATCH_OVER_POOL_TARGET, False)]:
        lines.append(table.line([label, Text(" " + verdict(floor[key], target, at_most))]))
    return "\n".join(lines)

MESSAGE_BYTES = 100
_BARE, _PICKLED, _STOP = b"B", b"P", b"S"


@contextlib.contextmanager
def connected(kind: int, endpoint: str) -> Iterator[zmq.Socket]:
    """In a peer process: a socket of ``kind`` connected to ``endpoint``, closed on exit."""
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


class SpawnedPeer:
    """A process spawned to run ``target(endpoint)``, and this side's socket of ``kind``
    bound to ``endpoint``, a free port of 127.0.0.1: the other end of a floor."""

    def __init__(self, kind: int, target: Callable[[str], None]) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(kind)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self._proc = multiprocessing.get_context("spawn").Process(
            target=target, args=(f"tcp://127.0.0.1:{port}",), daemon=True)
        self._proc.start()

    def stop(self, last: bytes, wait: float) -> None:
        """Send ``last`` (the peer ends on it); kill the peer if it has not ended in ``wait`` s."""
        try:
            self._sock.send(last)
        except zmq.ZMQError:
            pass
        self._proc.join(wait)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._sock.close()
        self._ctx.term()


def _serve_echo(endpoint: str) -> None:
    """The echo process: answer each message until told to stop."""
    with connected(zmq.ROUTER, endpoint) as sock:
        while True:
            route, message = sock.recv_multipart()
            mode = message[:1]
            if mode == _PICKLED:
                fn, args, kwargs = pickle.loads(memoryview(message)[1:])
                message = pickle.dumps((True, fn(*args, **kwargs)), 5)
            elif mode == _STOP:
                return
            sock.send_multipart([route, message])


class Echo(SpawnedPeer):
    """A peer process for ping-pongs; a context manager that stops it on exit."""

    def __init__(self) -> None:
        super().__init__(zmq.DEALER, _serve_echo)
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
        self.stop(_STOP, 5)

    def __enter__(self) -> Echo:
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
