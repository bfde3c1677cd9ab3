"""Worker threads of a place that stay busy while some of them block, and
that take turns at receiving (leader/followers).

A task that waits (a nested ``finish``, ``at``) declares it with
:func:`blocking`; while it waits, a job that would queue for lack of a
worker gets a spare thread, so that the queue keeps moving; spares retire
once the blocked workers resume. A wait with nothing queued costs no
thread at all: a GLB thief's short ``at`` calls wake nobody. This is the
role of ``ForkJoinPool.managedBlock`` in APGAS for Java. A retired spare
is parked for a while rather than ended: a worker that makes many short
``at`` calls (a GLB thief) would otherwise start a thread for each.

Leader/followers (:meth:`WorkerPool.lead`): one thread of the pool, the
leader, receives messages; the others wait for jobs. When a message brings
a job and a worker is idle, the leader makes that worker the new leader and
runs the job itself (:meth:`WorkerPool.submit_received`), so a call is run
by the thread that read it: no hand-off between the receipt and the run.
Only the leader delivers messages, one at a time, so what the runtime does
on delivery keeps the order of the wire. When no worker is idle, the job is
queued as any other and the leader goes on receiving: someone always
receives, whatever the jobs do.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["WorkerPool", "blocking"]

log = logging.getLogger(__name__)
_local = threading.local()
SPARE_PARKED_S = 10.0  # s a retired spare waits to be needed again before it ends

Job = Callable[[], None]


class _Idle:
    """A thread waiting for a job; a held lock is the cheapest one-shot wake-up."""

    __slots__ = ("latch", "job")

    def __init__(self) -> None:
        self.latch = threading.Lock()
        self.latch.acquire()
        self.job: Job | None = None  # None: stop


def _lead_token() -> None:  # the job "become the leader": never run as a job
    raise AssertionError("the leader token is not a job")


class WorkerPool:
    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._lock = threading.Lock()
        self._jobs: collections.deque[Job] = collections.deque()
        self._idle_threads: list[_Idle] = []  # waiting for a job; the last one idled first taken
        self._threads = 0  # threads that run jobs (the leader is not one of them)
        self._blocked = 0
        self._serial = 0
        self._unfinished = 0  # jobs submitted and not yet ended
        self._idle = threading.Condition(self._lock)
        self._parked = 0  # retired spares waiting to be needed (not in _threads)
        self._claims = 0  # parked spares called back, not yet awake
        self._closing = False
        self._wake = threading.Condition(self._lock)
        self._receive: Callable[[], bool] | None = None  # the leader's, once lead() was called
        self._waiting: Callable[[], bool] = bool
        with self._lock:
            for _ in range(size):
                self._spawn()

    def submit(self, job: Job) -> None:
        with self._lock:
            self._unfinished += 1
            self._give(job)

    def _give(self, job: Job) -> None:  # holds self._lock
        if self._idle_threads:
            waiter = self._idle_threads.pop()
            waiter.job = job
            waiter.latch.release()
            return
        self._jobs.append(job)
        if self._threads - self._blocked < self.size:
            self._spawn()  # workers wait in blocking(): a spare takes the job

    def lead(self, receive: Callable[[], bool], waiting: Callable[[], bool]) -> None:
        """Start receiving: one more thread calls ``receive()`` until it returns False.

        ``receive`` reads and delivers one message; while it delivers, the
        thread may be given a job by :meth:`submit_received`. ``waiting()``
        says whether more messages wait to be read: then the leader queues the
        job and reads on (a stream of tasks is worked off by the workers while
        one thread reads, without a hand-over per message).
        """
        self._receive = receive
        self._waiting = waiting
        self._serial += 1
        threading.Thread(target=self._start_leading, name=f"{self._name}-{self._serial}",
                         daemon=True).start()

    def submit_received(self, job: Job) -> None:
        """Submit a job of the message being delivered; on the leader with a worker
        idle, that worker leads from now on and the job runs here once delivered."""
        with self._lock:
            self._unfinished += 1
            if getattr(_local, "leading", False) and self._idle_threads \
                    and getattr(_local, "inline", None) is None and not self._waiting():
                waiter = self._idle_threads.pop()  # leaves the workers, this thread joins them:
                waiter.job = _lead_token  # _threads, which counts the workers, stays
                waiter.latch.release()
                _local.inline = job
            else:
                self._give(job)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has ended; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def shutdown(self) -> None:
        """Ask every thread to stop after the jobs already queued; does not wait.
        The leader stops when its ``receive`` returns False."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            for waiter in self._idle_threads:
                waiter.job = None
                waiter.latch.release()
            self._idle_threads.clear()

    @contextlib.contextmanager
    def _blocking(self) -> Iterator[None]:
        with self._lock:
            self._blocked += 1
            # a spare only for jobs that wait: a short wait (a steal's at()) costs no thread
            # wake-up, and a job queued later gets its spare from _give
            if self._jobs and self._threads - self._blocked < self.size:
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

    def _next(self, me: _Idle) -> Job | None:
        """The next job, the leader token, or None to stop."""
        with self._lock:
            if self._jobs:
                return self._jobs.popleft()
            if self._closing:
                return None
            self._idle_threads.append(me)
        me.latch.acquire()
        job, me.job = me.job, None
        return job

    def _start_leading(self) -> None:
        self._work(_lead_token)

    def _lead(self) -> bool:
        """Receive until a message gives this thread a job; run it, then True (work on).
        False once receiving has stopped."""
        receive = self._receive
        assert receive is not None, "a leader token is only given once lead() was called"
        _local.leading = True
        try:
            while receive():
                job = _local.inline
                if job is not None:
                    break
            else:
                return False
        finally:
            _local.leading = False
            _local.inline = None
        self._run(job)
        return True

    def _run(self, job: Job) -> None:
        try:
            job()
        except BaseException:  # jobs catch their own errors; this is a last resort
            log.exception("a job of %s failed", self._name)

    def _work(self, first: Job | None = None) -> None:
        _local.pool = self
        _local.inline = None
        me = _Idle()
        while True:
            job = first or self._next(me)
            first = None
            if job is None:
                break
            if job is _lead_token:
                if not self._lead():
                    return  # receiving stopped; a leader is not counted in _threads
            else:
                self._run(job)
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
