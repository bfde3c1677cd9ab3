"""Sessions (issue 55): ``apgas.init`` keeps the places up between calls, as a notebook
needs; a Ctrl-C in a finish or an ``at`` stops what runs at every place within a
second and keeps the places; an error in a task comes back and the places stay."""

from __future__ import annotations

import _thread
import linecache
import os
import signal
import threading
import time

import pytest

import apgas
from apgas._core.interrupts import Interrupted, Interrupts

pytestmark = pytest.mark.timeout(60)


def whoami() -> tuple[int, int]:
    return apgas.here().id, os.getpid()


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


def _interrupt_main_soon(started: threading.Event) -> threading.Thread:
    """A Ctrl-C at the main thread once ``started`` is set (what SIGINT's handler does)."""
    def press() -> None:
        if started.wait(30):
            _thread.interrupt_main()
    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def session():
    # Ctrl-C raises KeyboardInterrupt, as in a notebook or a REPL (a pytest-xdist worker
    # ignores SIGINT, and _thread.interrupt_main then does nothing)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    s = apgas.init(places=3, threads=1)
    try:
        yield s
    finally:
        apgas.shutdown()
        signal.signal(signal.SIGINT, old)


def test_a_session_keeps_its_places_between_calls_and_says_which(session):
    pids = dict(apgas.at(p, whoami) for p in apgas.places())
    assert sorted(pids) == [0, 1, 2] and pids[0] == os.getpid()
    assert "3 place(s), 1 thread(s) each" in repr(session) and "places 0-2" in repr(session)
    with apgas.finish():
        for p in apgas.places():
            apgas.async_at(p, whoami)
    assert dict(apgas.at(p, whoami) for p in apgas.places()) == pids  # the same processes
    assert apgas.run(lambda: [p.id for p in apgas.places()]) == [0, 1, 2]  # run uses them
    with pytest.raises(apgas.ApgasError, match=r"a session is running already .*apgas.shutdown\(\)"):
        apgas.init(places=2)


def test_shutdown_and_the_end_of_a_with_block_stop_every_place():
    with apgas.init(places=2, threads=1) as s:
        pid = apgas.at(1, os.getpid)
    assert repr(s) == "<apgas.Session: shut down>"
    with pytest.raises(apgas.NotRunningError):
        apgas.places()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the place outlived the session"
        time.sleep(0.01)
    apgas.shutdown()  # none running: nothing to do
    with apgas.init(places=2, threads=1):  # and a new one starts
        assert len(apgas.places()) == 2


def test_a_ctrl_c_in_a_finish_stops_the_tasks_everywhere_and_keeps_the_places(session):
    pids = dict(apgas.at(p, whoami) for p in apgas.places())
    started = threading.Event()
    _interrupt_main_soon(started)
    with pytest.raises(KeyboardInterrupt):
        with apgas.finish():
            for p in apgas.places():
                for _ in range(3):  # one runs, two wait in the queue (1 thread a place)
                    apgas.async_at(p, spin, 60)
            started.set()
            pressed = time.monotonic()
            spin(60)  # the body itself, in the main thread, is what the Ctrl-C hits first
    assert time.monotonic() - pressed < 1.5
    begun = time.monotonic()
    with apgas.finish():  # every worker is free: nothing of the 9 tasks runs or waits
        for p in apgas.places():
            apgas.async_at(p, spin, 0)
    assert time.monotonic() - begun < 1.0
    assert dict(apgas.at(p, whoami) for p in apgas.places()) == pids


def test_a_ctrl_c_in_an_at_stops_the_call_at_its_place(session):
    started = threading.Event()
    _interrupt_main_soon(started)
    started.set()
    with pytest.raises(KeyboardInterrupt):
        apgas.at(1, spin, 60)
    begun = time.monotonic()
    assert apgas.at(1, whoami)[0] == 1  # the place's one worker is free again
    assert time.monotonic() - begun < 1.0


def test_an_error_in_a_task_is_raised_and_names_the_cells_line(session):
    """A function defined in a notebook cell: its file exists only in linecache (as
    IPython keeps cells); the remote traceback shows the cell's line all the same."""
    cell = "/tmp/ipykernel_0/apgas-test-cell.py"
    source = "def fails(x):\n    return 1 / x  # the cell's line\n"
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    namespace = {"__name__": "__main__"}
    exec(compile(source, cell, "exec"), namespace)
    try:
        with pytest.raises(ZeroDivisionError) as info:
            apgas.at(2, namespace["fails"], 0)
        assert "return 1 / x  # the cell's line" in info.value.remote_traceback
        assert cell in info.value.remote_traceback
        assert apgas.at(2, whoami)[0] == 2  # the place is up
    finally:
        del linecache.cache[cell]


def test_interrupts_reach_only_the_programs_code():
    interrupts = Interrupts()
    inside, outcome = threading.Event(), []

    def task() -> None:
        try:
            interrupts.run(interrupts.stamp(), lambda: (inside.set(), spin(30)))
        except Interrupted:
            outcome.append("interrupted")
        spin(0.05)  # the runtime's code after the task: never hit
        outcome.append("after")

    stale = interrupts.stamp()
    thread = threading.Thread(target=task)
    thread.start()
    assert inside.wait(10)
    assert interrupts.begin() == 1
    assert interrupts.wait_quiet(5)
    thread.join(5)
    assert outcome == ["interrupted", "after"]
    with pytest.raises(Interrupted, match="before it started"):
        interrupts.run(stale, spin, 0)  # queued before the interrupt: never starts
    assert interrupts.stamp() == -1  # held while the interrupt goes round
    interrupts.end()
    assert interrupts.run(interrupts.stamp(), lambda: 7) == 7


def _add_one(a) -> None:
    block = a.local()
    block += 1.0


def test_steps_arrays_and_orders_work_from_the_calling_thread(session):
    """What a notebook does across cells: a followed array, a step loop, a handler and a
    grow order between steps; the result is numpy's."""
    from apgas.arrays import BlockArray
    from apgas.order import send_order

    class Newest(apgas.MalleableHandler):
        def pre_shrink(self, n, chosen=None):
            return apgas.places()[-n:]

    import numpy as np

    x = np.arange(60 * 3, dtype=np.float64).reshape(60, 3)
    a = BlockArray.from_array(x, follow=True)
    address = apgas.define_malleable_handler(Newest()).address
    for step in apgas.steps(6, arrays=[a]):
        with step:
            with apgas.finish():
                for p in apgas.places():
                    apgas.async_at(p, _add_one, a)
        if step.index == 2:  # between two steps, as from another cell
            assert send_order(address, f"grow 1 {apgas.here().host}", 60)[0].startswith("ok grow 1")
    assert len(apgas.places()) == 4
    assert np.array_equal(a.gather(), x + 6)
    a.free()
