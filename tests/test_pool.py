"""The worker pool keeps its parallelism while workers block, and reuses its spares."""

from __future__ import annotations

import threading

import pytest
from conftest import eventually

from apgas._pool import WorkerPool, blocking

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
