"""Worker threads of a place that stay busy while some of them block.

A task that waits (a nested ``finish``, ``at``) declares it with
:func:`blocking`; the pool then adds a spare thread so that the queue keeps
moving, and retires spares once the blocked workers resume. This is the
role of ``ForkJoinPool.managedBlock`` in APGAS for Java.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Callable, Iterator

__all__ = ["WorkerPool", "blocking"]

log = logging.getLogger(__name__)
_local = threading.local()


class WorkerPool:
    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._blocked = 0
        self._serial = 0
        self._unfinished = 0  # jobs submitted and not yet ended
        self._idle = threading.Condition(self._lock)
        with self._lock:
            for _ in range(size):
                self._spawn()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._unfinished += 1
        self._queue.put(job)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has ended; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def shutdown(self) -> None:
        """Ask every thread to stop after its current job; does not wait."""
        with self._lock:
            count = self._threads
        for _ in range(count):
            self._queue.put(None)

    @contextlib.contextmanager
    def _blocking(self) -> Iterator[None]:
        with self._lock:
            self._blocked += 1
            if self._threads - self._blocked < self.size:
                self._spawn()
        try:
            yield
        finally:
            with self._lock:
                self._blocked -= 1

    def _spawn(self) -> None:  # holds self._lock
        self._threads += 1
        self._serial += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._serial}", daemon=True).start()

    def _work(self) -> None:
        _local.pool = self
        get = self._queue.get
        while True:
            job = get()
            if job is None:
                break
            try:
                job()
            except BaseException:  # jobs catch their own errors; this is a last resort
                log.exception("a job of %s failed", self._name)
            with self._lock:
                self._unfinished -= 1
                if self._unfinished == 0:
                    self._idle.notify_all()
                if self._threads - self._blocked > self.size:
                    self._threads -= 1
                    return
        with self._lock:
            self._threads -= 1


def blocking() -> contextlib.AbstractContextManager:
    """Wrap a wait; on a pool thread, a spare thread keeps the pool's parallelism."""
    pool = getattr(_local, "pool", None)
    return _NOT_A_POOL_THREAD if pool is None else pool._blocking()


_NOT_A_POOL_THREAD = contextlib.nullcontext()
