"""Heartbeats: a place that stops answering (SIGSTOP here; a cut link in the virtual
cluster tests) is declared dead like one that exited, a busy one is not, and places
whose place 0 falls silent end by themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, eventually, wait_gone

import apgas
from apgas import DeadPlaceError, MultipleException
from apgas._core.heartbeat import parse_heartbeat

pytestmark = pytest.mark.timeout(60)

FAST = "0.2:1"  # ping every 0.2 s, dead after 1 s of silence


@pytest.fixture(autouse=True)
def fast_heartbeat(monkeypatch):
    monkeypatch.setenv("APGAS_HEARTBEAT", FAST)


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped: the kernel stops a process's
    threads asynchronously, and a fast place answers a message in the meantime."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    eventually(stopped, f"process {pid} to stop", timeout=5)


def sleep_long() -> None:
    time.sleep(60)


def stop_soon(pid: int, stopped: list) -> None:
    time.sleep(0.3)
    os.kill(pid, signal.SIGSTOP)
    stopped.append(time.monotonic())


def test_a_stopped_place_fails_its_finish_and_the_others_go_on():
    def main():
        import threading

        victim = apgas.place(2)
        pid = apgas.at(victim, os.getpid)
        stopped: list[float] = []
        threading.Thread(target=stop_soon, args=(pid, stopped)).start()
        with pytest.raises(MultipleException) as info:
            with apgas.finish():
                apgas.async_at(victim, sleep_long)
                apgas.async_at(apgas.place(1), time.sleep, 0.1)
        detected = time.monotonic() - stopped[0]
        dead = [e for e in info.value.exceptions if isinstance(e, DeadPlaceError)]
        assert len(dead) == 1 and dead[0].place_id == 2
        assert "no answer to heartbeats for 1 s" in str(dead[0]), dead[0]
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, time.sleep, 0.01)
        return detected, pid, [p.id for p in apgas.places()]

    detected, pid, live = apgas.run(main, places=3)
    assert live == [0, 1]
    # the 1 s timeout at least; at most far below the 60 s the task would run
    assert 0.8 <= detected < 30.0, detected
    assert wait_gone([pid], 30) == []  # the stopped process was killed, not left behind


def test_at_a_stopped_place_raises_dead_place_error():
    def main():
        pid = apgas.at(apgas.place(1), os.getpid)
        stop(pid)
        start = time.monotonic()
        with pytest.raises(DeadPlaceError, match="place 1"):
            apgas.at(apgas.place(1), os.getpid)
        return time.monotonic() - start, pid

    waited, pid = apgas.run(main, places=2)
    assert waited < 30.0  # not for ever
    assert wait_gone([pid], 30) == []


def spin_with_the_gil(seconds: float) -> float:
    """A numba loop that holds the GIL (no nogil: nothing in Python runs) until this
    process has had ``seconds`` of CPU time (libc's ``clock``), so at least that long
    however busy the machine is; returns the wall time it held it."""
    import ctypes

    import numba

    clock = ctypes.CDLL(None).clock
    clock.restype, clock.argtypes = ctypes.c_long, []
    ticks = int(seconds * 1_000_000)  # CLOCKS_PER_SEC, as POSIX fixes it

    @numba.njit
    def spin(ticks):
        start = clock()
        x = 1.0
        while clock() - start < ticks:
            for _ in range(1000):
                x = (x * 1.0000001) % 7.3
        return x

    spin(0)  # compiled first
    start = time.monotonic()
    spin(ticks)
    return time.monotonic() - start


def test_a_place_busy_in_a_long_call_that_holds_the_gil_is_not_declared_dead():
    pytest.importorskip("numba")

    def main():
        spun = apgas.at(apgas.place(1), spin_with_the_gil, 3.0)  # 3 x the timeout
        return spun, [p.id for p in apgas.places()]

    spun, live = apgas.run(main, places=2)
    assert spun >= 2.5 and live == [0, 1]


PROGRAM = """
import os, sys, time, apgas
def main():
    print("PLACES", apgas.at(apgas.place(1), os.getpid), flush=True)
    time.sleep(60)
apgas.run(main, places=2)
"""


def test_places_end_by_themselves_when_place_0_falls_silent(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "APGAS_HEARTBEAT": FAST}, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PLACES "), line
        place = int(line.split()[1])
        os.kill(proc.pid, signal.SIGSTOP)  # place 0 hangs; its pipes stay open
        eventually(lambda: not alive(place), "place 1 gone after place 0 fell silent", 30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_heartbeat_settings_are_checked(monkeypatch):
    assert parse_heartbeat("0.5:4") == (0.5, 4.0)
    assert parse_heartbeat("2") == (2.0, 20.0)
    assert parse_heartbeat("0") is None and parse_heartbeat("off") is None
    for bad in ("fast", "1:2:3", "-1:5", "1:0"):
        monkeypatch.setenv("APGAS_HEARTBEAT", bad)
        with pytest.raises(apgas.ConfigError, match=f"APGAS_HEARTBEAT must be .*got '{bad}'"):
            apgas.run(lambda: None)


def test_the_default_heartbeat_stretches_with_places_a_core(monkeypatch):
    from apgas._core.config import default_heartbeat, load_config

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_heartbeat(0.5) == default_heartbeat(64) == "1:10"
    assert load_config({"places": 128}, {}).heartbeat == "1:10"  # 64 a core
    assert load_config({"places": 1024}, {}).heartbeat == "8:80"  # place 0 answers 1,024 pings
    assert load_config({"places": 1024, "hosts": "a,b,c,d"}, {}).heartbeat == "2:20"
    assert load_config({"places": 1024}, {"APGAS_HEARTBEAT": "1:10"}).heartbeat == "1:10"  # as given
    assert parse_heartbeat(load_config({"places": 1000}, {}).heartbeat) == (7.8125, 78.125)
