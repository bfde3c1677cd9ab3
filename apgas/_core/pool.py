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
a call, a worker waits for jobs and nothing else is queued or waits to be
read, the leader runs the call itself (:meth:`WorkerPool.submit_received`):
no hand-off between the receipt and the run, and no thread woken for it. The
receiving stays with the leader while the call runs and moves only when it
must: when the call waits (:func:`blocking`), or when the call is still
running at the standby's next look (every :data:`STANDBY_S`: a call that
computes long, or waits without saying so), the receiving is offered to the
workers through the job queue. A worker that takes the offer receives from
then on; if none took it by the end of the call, the leader takes it back
and receives on. Only the leader delivers messages, one at a time, so what
the runtime does on delivery keeps the order of the wire. When no worker
waits, the job is queued as any other and the leader goes on receiving.

Why not offer at once, as before: on 2 cores the woken worker competed with
the call for the GIL, and a short call (a GLB steal, an ``at`` round trip)
paid for a thread it never needed. A message that arrives while a call
runs inline waits for the call's end, its first wait, or the standby's
look; a call that computes for longer than that is better sent with
``async_at`` anyway.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["WorkerPool", "blocking", "on_pool_thread"]

log = logging.getLogger(__name__)
_local = threading.local()
SPARE_PARKED_S = 10.0  # s a retired spare waits to be needed again before it ends
STANDBY_S = 0.1  # s between two looks of the standby at a call run by the leader
STANDBY_IDLE = 10  # looks without a call before the standby sleeps until the next one

Job = Callable[[], None]
T = TypeVar("T")


class _Lead:
    """The receiving, offered to an idle worker through the job queue; the leader whose
    call it was offered for takes it back if nobody took it by the end of that call."""

    __slots__ = ("state",)
    OFFERED, TAKEN, REVOKED = range(3)

    def __init__(self, state: int) -> None:
        self.state = state  # under the pool's lock


class _Inline:
    """A call the leader runs while it holds the receiving; ``offer`` once the receiving
    was offered for it (by the call's first wait or by the standby)."""

    __slots__ = ("looked", "offer")

    def __init__(self) -> None:
        self.looked = False  # under the pool's lock: the standby saw it running
        self.offer: _Lead | None = None  # under the pool's lock


class WorkerPool:
    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._queue: queue.SimpleQueue[Job | _Lead | None] = queue.SimpleQueue()  # None: stop
        self._lock = threading.Lock()
        self._threads = 0  # threads that run jobs (the leader is not one of them)
        self._blocked = 0
        self._serial = 0
        self._unfinished = 0  # jobs submitted and not yet ended
        self._idle = threading.Condition(self._lock)
        self._parked = 0  # retired spares waiting to be needed (not in _threads)
        self._claims = 0  # parked spares called back, not yet awake
        self._closing = False
        self._wake = threading.Condition(self._lock)
        self._standby_wake = threading.Condition(self._lock)
        self._standby_asleep = False  # under _lock: the standby waits for the next call
        self._getting: list[None] = []  # one entry per worker waiting for a job (atomic list ops)
        self._revoked = 0  # offers of the receiving taken back and still queued
        self._receive: Callable[[], bool] | None = None  # the leader's, once lead() was called
        self._waiting: Callable[[], bool] = bool
        self._inline: _Inline | None = None  # under _lock: the call the leader runs, if any
        #: called by a thread of the pool about to wait (for a job, or in blocking()):
        #: the runtime sends the messages that wait to leave in batches
        self.before_wait: Callable[[], object] = _nothing
        with self._lock:
            for _ in range(size):
                self._spawn()

    def submit(self, job: Job) -> None:
        with self._lock:
            self._unfinished += 1
            if not self._getting and self._threads - self._blocked < self.size:
                self._spawn()  # workers wait in blocking(): a spare takes the job
        self._queue.put(job)

    def lead(self, receive: Callable[[], bool], waiting: Callable[[], bool]) -> None:
        """Start receiving: one more thread calls ``receive()`` until it returns False.

        ``receive`` reads and delivers one message; while it delivers, the
        thread may be given a job by :meth:`submit_received`. ``waiting()``
        says whether more messages wait to be read: then the leader queues the
        job and reads on.
        """
        self._receive = receive
        self._waiting = waiting
        self._serial += 1
        threading.Thread(target=self._work, args=(_Lead(_Lead.TAKEN),),
                         name=f"{self._name}-{self._serial}", daemon=True).start()
        threading.Thread(target=self._standby, name=f"{self._name}-standby", daemon=True).start()

    def submit_received(self, job: Job) -> None:
        """Submit a job of the message being delivered. On the leader, with a worker
        waiting for jobs and nothing else queued or waiting to be read, the job runs
        here once delivered (no hand-off before it runs) and the receiving stays here
        until the job waits or outlives a look of the standby."""
        if getattr(_local, "leading", False) and self._getting and _local.inline is None \
                and self._queue.qsize() <= self._revoked and not self._waiting():
            # an offer made later queues behind no job (a revoked offer ahead is skipped)
            with self._lock:
                self._unfinished += 1
            _local.inline = job
        else:
            self.submit(job)

    def while_receiving(self, fn: Callable[[], T]) -> T | None:
        """``fn()`` if this thread receives for the place now (the leader, in a call it
        runs and has not offered the receiving for), else None; the receiving cannot
        move while ``fn`` runs. For a reply sent through the place's own ROUTER."""
        call = getattr(_local, "call", None)
        if call is None:
            return None
        with self._lock:
            if call.offer is not None or self._inline is not call:
                return None
            return fn()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted job has ended; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def shutdown(self) -> None:
        """Ask every thread to stop after the jobs already queued; does not wait.
        The leader stops when its ``receive`` returns False."""
        with self._lock:
            count = self._threads
            self._closing = True
            self._wake.notify_all()
            self._standby_wake.notify_all()
        for _ in range(count):
            self._queue.put(None)

    @contextlib.contextmanager
    def _blocking(self) -> Iterator[None]:
        self.before_wait()
        with self._lock:
            call = getattr(_local, "call", None)
            if call is not None and call.offer is None:
                self._offer(call)  # the leader's call waits: another thread receives
            self._blocked += 1
            # a spare only for jobs that wait: a short wait (a steal's at()) costs no thread
            # wake-up, and a job queued later gets its spare from submit()
            if not self._queue.empty() and self._threads - self._blocked < self.size:
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

    def _offer(self, call: _Inline) -> None:  # holds self._lock
        """Offer the receiving, held by the leader that runs ``call``, to the workers."""
        call.offer = _Lead(_Lead.OFFERED)
        self._queue.put(call.offer)

    def _standby(self) -> None:
        """Every STANDBY_S: offer the receiving if the leader's call ran at the last look
        too (it computes long, or waits without :func:`blocking`). After STANDBY_IDLE
        looks without a call it sleeps until the next call: an idle place costs nothing."""
        quiet = 0
        with self._lock:
            while not self._closing:
                call = self._inline
                if call is None:
                    quiet += 1
                else:
                    quiet = 0
                    if call.offer is None:
                        if call.looked:
                            self._offer(call)
                        call.looked = True
                if quiet >= STANDBY_IDLE:
                    self._standby_asleep = True
                    self._standby_wake.wait()  # the next call or shutdown() wakes it
                    quiet = 0
                else:
                    self._standby_wake.wait(STANDBY_S)

    def _lead(self) -> bool:
        """Receive until a message gives this thread a job and the receiving moves on while
        it runs; True once the job ran (this thread then works on), False once receiving
        stopped."""
        receive = self._receive
        assert receive is not None, "the receiving is only offered once lead() was called"
        _local.leading = True
        try:
            while True:
                while receive():
                    job = _local.inline
                    if job is not None:
                        break
                else:
                    return False
                _local.inline = None
                _local.leading = False
                call = _local.call = _Inline()
                with self._lock:
                    self._inline = call
                    if self._standby_asleep:
                        self._standby_asleep = False
                        self._standby_wake.notify()
                try:
                    self._run(job)
                finally:
                    _local.call = None
                with self._lock:
                    if self._inline is call:
                        self._inline = None
                    offer = call.offer
                    if offer is not None and offer.state == _Lead.TAKEN:
                        return True  # a worker receives now (the swap keeps _threads)
                    if offer is not None:
                        offer.state = _Lead.REVOKED  # nobody took it: this thread receives on
                        self._revoked += 1  # until a worker takes it out of the queue
                    self._job_ended()
                _local.leading = True
        finally:
            _local.leading = False
            _local.inline = None

    def _run(self, job: Job) -> None:
        try:
            job()
        except BaseException:  # jobs catch their own errors; this is a last resort
            log.exception("a job of %s failed", self._name)

    def _job_ended(self) -> None:  # holds self._lock
        self._unfinished -= 1
        if self._unfinished == 0:
            self._idle.notify_all()

    def _work(self, first: _Lead | None = None) -> None:
        _local.pool = self
        _local.inline = None
        _local.call = None
        get, getting = self._queue.get, self._getting
        while True:
            if first is None:
                if self._queue.empty():
                    self.before_wait()
                getting.append(None)
                job = get()
                getting.pop()
            else:
                job, first = first, None
            if job is None:
                break
            if isinstance(job, _Lead):
                with self._lock:
                    if job.state == _Lead.REVOKED:
                        self._revoked -= 1
                        continue  # its leader received on
                    job.state = _Lead.TAKEN
                if not self._lead():
                    return  # receiving stopped; a leader is not counted in _threads
            else:
                self._run(job)
            with self._lock:
                self._job_ended()
                if self._threads - self._blocked > self.size:
                    self._threads -= 1
                    if not self._park():
                        return
        with self._lock:
            self._threads -= 1


def _nothing() -> None:
    pass


def on_pool_thread() -> bool:
    """Whether this thread is a worker of a pool (it runs tasks, not a program's own code)."""
    return getattr(_local, "pool", None) is not None


def blocking() -> contextlib.AbstractContextManager[None]:
    """Wrap a wait; on a pool thread, a spare thread keeps the pool's parallelism."""
    pool = getattr(_local, "pool", None)
    return _NOT_A_POOL_THREAD if pool is None else pool._blocking()


_NOT_A_POOL_THREAD = contextlib.nullcontext()
