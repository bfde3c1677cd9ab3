"""The worker pool keeps its parallelism while workers block, and reuses its spares."""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest
from conftest import eventually

from apgas._core import pool as pool_module
from apgas._core.pool import WorkerPool, blocking

pytestmark = pytest.mark.timeout(30)


def test_a_blocked_worker_gets_a_spare_and_the_spare_is_reused():
    pool = WorkerPool(1, "test-pool")
    try:
        running = threading.Semaphore(0)
        peak = [0, 0]  # now, most at once
        lock = threading.Lock()

        def counted(release: threading.Event) -> None:
            with lock:
                peak[0] += 1
                peak[1] = max(peak)
            running.release()
            release.wait()
            with lock:
                peak[0] -= 1

        def blocker() -> None:
            for _ in range(50):  # many short waits, as a GLB thief's at() calls
                inner = threading.Event()
                with blocking():
                    pool.submit(lambda inner=inner: counted(inner))
                    assert running.acquire(timeout=5), "the spare did not run the job"
                    inner.set()

        done = threading.Event()
        pool.submit(lambda: (blocker(), done.set()))
        assert done.wait(20)
        assert pool.wait_idle(5)
        assert peak[1] == 1  # never more jobs at once than the pool's size
        assert pool._serial <= 3, f"{pool._serial} threads started for 50 blocking waits"
    finally:
        pool.shutdown()


def test_parked_spares_end_at_shutdown():
    pool = WorkerPool(1, "test-pool-2")
    started = threading.Event()

    def blocker() -> None:
        with blocking():
            pool.submit(started.set)
            assert started.wait(5)

    pool.submit(blocker)
    assert pool.wait_idle(5)
    with pool._lock:
        parked = pool._parked
    assert parked == 1
    pool.shutdown()
    eventually(lambda: pool._parked == 0, "the parked spare to end", timeout=5)


class _Wire:
    """Messages for a pool's leader: ``receive`` delivers one (the handler may give
    the pool a job), False once closed. Records which thread delivered and ran what."""

    def __init__(self, pool: WorkerPool, handler) -> None:
        self.pool, self.handler = pool, handler
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.delivered: list[tuple[int, int]] = []  # (message, delivering thread)
        self.stopped = threading.Event()

    def waiting(self) -> bool:
        return not self.inbox.empty()

    def receive(self) -> bool:
        message = self.inbox.get()
        if message is None:
            self.stopped.set()
            return False
        self.delivered.append((message, threading.get_ident()))
        self.handler(message)
        return True


def test_the_thread_that_receives_a_call_runs_it_and_another_receives_once_it_waits():
    pool = WorkerPool(2, "test-lf")
    ran: dict[int, int] = {}
    done = threading.Semaphore(0)

    def job(n: int) -> None:
        ran[n] = threading.get_ident()
        if n % 2:
            with blocking():  # a wait, declared: the receiving moves to an idle worker
                time.sleep(0.005)
        done.release()

    wire = _Wire(pool, lambda n: pool.submit_received(lambda: job(n)))
    pool.lead(wire.receive, wire.waiting)
    try:
        for n in range(20):
            # both workers wait for jobs (the last job's thread may still be counting it)
            eventually(lambda: len(pool._getting) == 2, "two idle workers", timeout=5)
            wire.inbox.put(n)
            assert done.acquire(timeout=5)
        assert pool.wait_idle(5)
        by = dict(wire.delivered)
        # a worker was idle every time: each job ran on the thread that read its message
        assert all(ran[n] == by[n] for n in range(20))
        moved = {n for n in range(1, 20) if by[n] != by[n - 1]}
        # the receiving moved after each wait, and never after a call that did not wait
        assert moved == set(range(2, 20, 2)), sorted(moved)
    finally:
        wire.inbox.put(None)
        pool.shutdown()
    assert wire.stopped.wait(5)


def test_a_call_that_runs_long_without_saying_it_waits_hands_the_receiving_on():
    pool = WorkerPool(2, "test-lf-standby")
    release, started = threading.Event(), threading.Event()
    delivered: list[int] = []

    def poll_until_released() -> None:  # waits for a later message, undeclared
        started.set()
        while not release.is_set():
            time.sleep(0.001)

    def handler(n: int) -> None:
        delivered.append(n)
        if n == 0:
            pool.submit_received(poll_until_released)
        elif n == 1:
            release.set()

    wire = _Wire(pool, handler)
    pool.lead(wire.receive, wire.waiting)
    try:
        eventually(lambda: len(pool._getting) == 2, "two idle workers", timeout=5)
        wire.inbox.put(0)
        assert started.wait(5)
        wire.inbox.put(1)
        # read once the standby saw the call at two looks in a row (STANDBY_S apart)
        assert release.wait(30), "message 1 was never read: the receiving stayed with the call"
        assert pool.wait_idle(5)
        assert delivered == [0, 1]
        assert wire.delivered[0][1] != wire.delivered[1][1]
    finally:
        release.set()
        wire.inbox.put(None)
        pool.shutdown()
    assert wire.stopped.wait(5)


def test_receiving_goes_on_while_every_worker_is_blocked():
    pool = WorkerPool(1, "test-lf-busy")
    release = threading.Event()
    order: list[int] = []
    started = threading.Semaphore(0)

    def handler(n: int) -> None:
        order.append(n)  # what delivery does keeps the order of the wire
        if n < 3:
            pool.submit_received(lambda: (started.release(), release.wait(10)))

    wire = _Wire(pool, handler)
    pool.lead(wire.receive, wire.waiting)
    try:
        for n in range(3):  # three jobs that block, on a pool of one worker: no spare is asked for
            wire.inbox.put(n)
        assert started.acquire(timeout=5)
        for n in range(3, 50):
            wire.inbox.put(n)
        eventually(lambda: len(order) == 50, "every message delivered", timeout=5)
        assert order == list(range(50))
        release.set()
        assert pool.wait_idle(5)
    finally:
        release.set()
        wire.inbox.put(None)
        pool.shutdown()
    assert wire.stopped.wait(5)


def test_random_delays_lose_no_job_and_keep_the_pool_size():
    rng = random.Random(7)
    pool = WorkerPool(2, "test-lf-random")
    running = [0, 0]  # now, most at once
    lock = threading.Lock()
    ran: list[int] = []

    def job(n: int, delay: float) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(delay)
        with lock:
            running[0] -= 1
            ran.append(n)

    wire = _Wire(pool, lambda m: pool.submit_received(lambda: job(*m)))
    pool.lead(wire.receive, wire.waiting)
    try:
        for n in range(300):
            wire.inbox.put((n, rng.choice((0.0, 0.0, 0.0005, 0.002))))
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.002)
        eventually(lambda: len(ran) == 300, "every job run", timeout=20)
        assert pool.wait_idle(5)
        assert sorted(ran) == list(range(300))
        assert running[1] <= 2, f"{running[1]} jobs at once on a pool of 2"
    finally:
        wire.inbox.put(None)
        pool.shutdown()
    assert wire.stopped.wait(5)


def test_the_standby_of_an_idle_pool_sleeps_until_the_next_call():
    pool = WorkerPool(1, "test-lf-asleep")
    done = threading.Event()
    wire = _Wire(pool, lambda n: pool.submit_received(done.set))
    pool.lead(wire.receive, wire.waiting)
    try:
        wait = pool_module.STANDBY_S * (pool_module.STANDBY_IDLE + 5)
        eventually(lambda: pool._standby_asleep, "the standby to fall asleep", timeout=wait + 5)
        eventually(lambda: len(pool._getting) == 1, "an idle worker", timeout=5)
        wire.inbox.put(0)  # a call run by the leader wakes it
        assert done.wait(5)
        assert not pool._standby_asleep  # woken as the call began (it falls asleep 1 s later)
    finally:
        wire.inbox.put(None)
        pool.shutdown()
    assert wire.stopped.wait(5)
