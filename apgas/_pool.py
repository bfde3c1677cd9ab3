"""Worker threads of a place that stay busy while some of them block.

A task that waits (a nested ``finish``, ``at``) declares it with
:func:`blocking`; the pool then adds a spare thread so that the queue keeps
moving, and retires spares once the blocked workers resume. This is the
role of ``ForkJoinPool.managedBlock`` in APGAS for Java. A retired spare
is parked for a while rather than ended: a worker that makes many short
``at`` calls (a GLB thief) would otherwise start a thread for each.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["WorkerPool", "blocking"]

log = logging.getLogger(__name__)
_local = threading.local()
SPARE_PARKED_S = 10.0  # s a retired spare waits to be needed again before it ends


class WorkerPool:
    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()  # None: stop
        self._lock = threading.Lock()
        self._threads = 0
        self._blocked = 0
        self._serial = 0
        self._unfinished = 0  # jobs submitted and not yet ended
        self._idle = threading.Condition(self._lock)
        self._parked = 0  # retired spares waiting to be needed (not in _threads)
        self._claims = 0  # parked spares called back, not yet awake
        self._closing = False
        self._wake = threading.Condition(self._lock)
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
            self._closing = True
            self._wake.notify_all()
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
        """One more working thread: a parked spare if there is one, else a new thread."""
        self._threads += 1
        if self._parked > self._claims:
            self._claims += 1
            self._wake.notify()
            return
        self._serial += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._serial}", daemon=True).start()

    def _park(self) -> bool:  # holds self._lock; the caller has left _threads
        """Wait to be called back by :meth:`_spawn`; False once parked too long or closing."""
        self._parked += 1
        try:
            deadline = time.monotonic() + SPARE_PARKED_S
            while not self._claims:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing:
                    return False
                self._wake.wait(remaining)
            self._claims -= 1  # _spawn counted this thread in _threads again
            return True
        finally:
            self._parked -= 1

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
                    if not self._park():
                        return
        with self._lock:
            self._threads -= 1


def blocking() -> contextlib.AbstractContextManager[None]:
    """Wrap a wait; on a pool thread, a spare thread keeps the pool's parallelism."""
    pool = getattr(_local, "pool", None)
    return _NOT_A_POOL_THREAD if pool is None else pool._blocking()


_NOT_A_POOL_THREAD = contextlib.nullcontext()
