"""Every place exits: after main, on errors, on Ctrl-C, and when place 0 is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import alive, wait_gone

import apgas
from apgas import DeadPlaceError, MultipleException

pytestmark = pytest.mark.timeout(90)

#: s: how long the places may take to go. Far below the tasks' 60 s sleep, so a place
#: that is not stopped still fails the test; no guess at how fast a loaded machine
#: ends processes (the shutdown's speed is measured by benchmarks, not here)
ENDS_WITHIN = 30.0

#: what a test's program runs first. Ctrl-C raises KeyboardInterrupt, as in a terminal,
#: also when the tests run where SIGINT is ignored (a background job of a shell without
#: job control: its children inherit that, and Python then installs no handler); and
#: SIGUSR1 writes every thread's stack to stderr (:func:`ended` asks for it)
PREAMBLE = ("import faulthandler, signal\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n")

PROGRAM = PREAMBLE + """
import os, sys, time
import apgas

def main():
    pids = [apgas.at(p, os.getpid) for p in apgas.places()]
    print("PIDS", *pids, flush=True)
    mode = sys.argv[1]
    if mode == "raise":
        raise RuntimeError("main failed")
    if mode == "sleep":
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, time.sleep, 60)

apgas.run(main, places=4)
"""


def ended(proc: subprocess.Popen) -> int:
    """Place 0's exit status, once it ends within :data:`ENDS_WITHIN`; else a failure that
    shows where each of its threads waits and how it takes signals."""
    try:
        return proc.wait(ENDS_WITHIN)
    except subprocess.TimeoutExpired:
        with open(f"/proc/{proc.pid}/status") as f:
            signals = [line for line in f.read().splitlines() if line.startswith(("Sig", "Shd"))]
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)  # faulthandler writes at once, from the signal handler
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"place 0 did not end in {ENDS_WITHIN} s; {signals}; it said:\n{err[-20000:]}")


def read_pids(proc) -> list[int]:
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return [int(x) for x in line.split()[1:]]


def test_all_places_exit_after_main_returns(script):
    proc = script(PROGRAM.replace("sys.argv[1]", "'return'"))
    pids = read_pids(proc)
    assert ended(proc) == 0
    assert wait_gone(pids, ENDS_WITHIN) == []


def test_all_places_exit_after_main_raises(script):
    proc = script(PROGRAM.replace("sys.argv[1]", "'raise'"))
    pids = read_pids(proc)
    assert ended(proc) != 0
    assert "main failed" in proc.stderr.read()
    assert wait_gone(pids, ENDS_WITHIN) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_term_at_place_zero_stops_every_place(script, sig):
    proc = script(PROGRAM.replace("sys.argv[1]", "'sleep'"))
    pids = read_pids(proc)
    time.sleep(0.3)  # the sleeping tasks have started
    os.kill(pids[0], sig)
    assert ended(proc) in (-sig, 128 + sig)  # ended by the signal, as a shell shows
    assert wait_gone(pids, ENDS_WITHIN) == []


CTRL_C_ON_ANOTHER_THREAD = PREAMBLE + """
import os, signal, sys, threading, time
import apgas

def ctrl_c_soon():  # its C handler runs on this thread: the main thread sleeps on
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

def main():
    print("PIDS", *[apgas.at(p, os.getpid) for p in apgas.places()], flush=True)
    threading.Thread(target=ctrl_c_soon, daemon=True).start()
    if sys.argv[1] == "finish":
        with apgas.finish():
            apgas.async_at(apgas.place(1), time.sleep, 60)
    else:
        apgas.at(apgas.place(1), time.sleep, 60)

apgas.run(main, places=2)
"""


@pytest.mark.parametrize("wait", ["finish", "at"])
def test_ctrl_c_ends_a_wait_whenever_it_comes(script, wait):
    """A Ctrl-C handled while the main thread is not in Python code (here: on another
    thread, as when it comes just before a wait begins) still ends the program's
    wait, not the 60 s the task would take."""
    proc = script(CTRL_C_ON_ANOTHER_THREAD.replace("sys.argv[1]", repr(wait)))
    pids = read_pids(proc)
    assert ended(proc) == -signal.SIGINT, proc.stderr.read()
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert wait_gone(pids, ENDS_WITHIN) == []


def test_places_exit_by_themselves_when_place_zero_is_killed(script):
    proc = script(PROGRAM.replace("sys.argv[1]", "'sleep'"))
    pids = read_pids(proc)
    time.sleep(0.3)
    os.kill(pids[0], signal.SIGKILL)
    ended(proc)
    assert wait_gone(pids[1:], ENDS_WITHIN) == []


def test_cli_runs_a_script_with_its_arguments(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("import sys, apgas\n"
                    "print(sys.argv[1:], [p.id for p in apgas.places()], __name__)\n")
    out = subprocess.run([sys.executable, "-m", "apgas", "-n", "3", "-t", "1", str(path), "a", "-x"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['a', '-x'] [0, 1, 2] __main__"


def test_cli_reports_a_missing_script():
    out = subprocess.run([sys.executable, "-m", "apgas", "-n", "2", "no/such.py"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 2 and "script 'no/such.py' not found" in out.stderr


def sleep_long() -> None:
    time.sleep(60)


def kill_place_soon(pid: int) -> None:
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()


def test_finish_raises_dead_place_error_when_a_place_is_killed():
    def main():
        victim = apgas.place(2)
        pid = apgas.at(victim, os.getpid)
        kill_place_soon(pid)
        start = time.monotonic()
        with pytest.raises(MultipleException) as info:
            with apgas.finish():
                apgas.async_at(victim, sleep_long)
                apgas.async_at(apgas.place(1), time.sleep, 0.1)
        waited = time.monotonic() - start
        dead = [e for e in info.value.exceptions if isinstance(e, DeadPlaceError)]
        assert len(dead) == 1 and dead[0].place_id == 2
        # the program goes on with the remaining places
        with pytest.raises(DeadPlaceError):
            apgas.async_at(victim, sleep_long)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, time.sleep, 0.01)
        return waited, [p.id for p in apgas.places()], apgas.at(apgas.place(3), lambda: 3)

    waited, live, three = apgas.run(main, places=4)
    assert waited < 5.0
    assert live == [0, 1, 3] and three == 3


def test_at_raises_dead_place_error_when_its_place_is_killed():
    def main():
        pid = apgas.at(apgas.place(1), os.getpid)
        kill_place_soon(pid)
        with pytest.raises(DeadPlaceError, match="place 1"):
            apgas.at(apgas.place(1), sleep_long)
        return alive(pid)

    assert apgas.run(main, places=2) is False


def test_a_place_that_cannot_start_is_reported(monkeypatch):
    with pytest.raises(apgas.ApgasError, match="exited with code"):
        apgas.run(lambda: None, places=2, python="/bin/false")
    with pytest.raises(apgas.ApgasError, match="could not be started on host 'elsewhere.invalid'"):
        apgas.run(lambda: None, hosts="localhost,elsewhere.invalid")


def test_bad_configuration_is_reported(monkeypatch):
    with pytest.raises(apgas.ConfigError, match="places must be an integer >= 1, got 0"):
        apgas.run(lambda: None, places=0)
    monkeypatch.setenv("APGAS_PLACES", "many")
    with pytest.raises(apgas.ConfigError, match="APGAS_PLACES .* got 'many'"):
        apgas.run(lambda: None)
    monkeypatch.delenv("APGAS_PLACES")
    monkeypatch.setenv("APGAS_HOSTS", "localhost,127.0.0.1,localhost")
    assert apgas.run(lambda: [p.host for p in apgas.places()]) == ["localhost", "127.0.0.1", "localhost"]
    with pytest.raises(apgas.ConfigError, match="unknown configuration option"):
        apgas.run(lambda: None, placez=2)
