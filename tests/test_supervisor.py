"""The supervisor of places on other hosts (``launcher/_supervise.py``) on this machine:
a stand-in for place 0 (a ZeroMQ ROUTER in a process of its own, which the tests kill
or stop) and stand-in places (small programs, stopped or busy), then a real run whose
places go through the test sshd. The virtual cluster's tests (``test_cross_host.py``)
do the same across hosts."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import alive, wait_gone

import apgas
import launcher
from launcher import _supervise
from launcher._base import supervised as supervised_command

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SECRET = "5e" * 32

# a stand-in place: says what it got, then ends at the end of its stdin with code 3 (as
# a place does), or with the code in argv[1] at once, or never reads it ("busy")
PLACE = """
import os, sys, time
line = sys.stdin.buffer.readline()
print("PLACE", os.getpid(), line.decode().strip(), flush=True)
if sys.argv[1:] == ["busy"]:
    time.sleep(600)
if sys.argv[1:]:
    sys.exit(int(sys.argv[1]))
sys.stdin.buffer.read()
sys.exit(3)
"""
PLACE_ZERO = """
import sys, time, zmq
from zmq.utils.monitor import recv_monitor_message
from apgas._core.zmtp_auth import Gatekeeper
from launcher._curve import keys_of
ctx = zmq.Context()
keys = keys_of(bytes.fromhex(sys.argv[1]))
Gatekeeper(ctx, keys, "zap").start()
router = ctx.socket(zmq.ROUTER)
keys.serve(router)  # as place 0's: the run's key only
monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
while True:
    recv_monitor_message(monitor)
    print("LINKED", flush=True)  # a supervisor's link is up
"""


@contextlib.contextmanager
def place_zero() -> Iterator[tuple[subprocess.Popen, str]]:
    """A process whose ROUTER stands for place 0's; its endpoint."""
    proc = subprocess.Popen([sys.executable, "-c", PLACE_ZERO, SECRET], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        yield proc, f"tcp://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()  # stopped or not
        proc.wait()


def linked(zero: subprocess.Popen) -> None:
    """Wait until a supervisor's link to the stand-in place 0 is up."""
    assert zero.stdout.readline().strip() == "LINKED"


def boot(endpoint: str, heartbeat: str = "0.2:1") -> dict:
    return {"place": 1, "host": "h", "parent_endpoint": endpoint, "secret": SECRET,
            "config": {"heartbeat": heartbeat}}


@contextlib.contextmanager
def supervised(bootstrap: dict, *args: str) -> Iterator[tuple[subprocess.Popen, int, str]]:
    """The supervisor running PLACE with ``args``; it, the place's pid, the line it got."""
    sup = subprocess.Popen([sys.executable, "-m", "launcher._supervise", "--", sys.executable,
                            "-c", PLACE, *args], cwd=ROOT, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    place = None
    try:
        sup.stdin.write(json.dumps(bootstrap).encode() + b"\n")
        sup.stdin.flush()
        _, pid, line = sup.stdout.readline().decode().split(" ", 2)
        place = int(pid)
        yield sup, place, line.strip()
    finally:
        for pid in (place, sup.pid):
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
        sup.wait()
        for stream in (sup.stdin, sup.stdout, sup.stderr):
            with contextlib.suppress(OSError):
                stream.close()


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not _supervise._is_stopped(pid):
        assert time.monotonic() < deadline, f"{pid} did not stop"
        time.sleep(0.005)


def gone(pids: list[int], limit: float) -> float:
    """Seconds until every one of ``pids`` has ended; fails after ``limit``."""
    began = time.monotonic()
    left = wait_gone(pids, limit)
    assert left == [], f"{left} still running after {limit} s"
    return time.monotonic() - began


def test_the_place_gets_its_line_and_the_supervisor_ends_as_it_did():
    with place_zero() as (_, endpoint):
        with supervised(boot(endpoint), "5") as (sup, place, line):
            assert json.loads(line) == boot(endpoint)
            assert SECRET not in Path(f"/proc/{sup.pid}/cmdline").read_text()  # stdin only
            assert sup.wait(10) == 5
        with supervised(boot(endpoint), "busy") as (sup, place, _):
            os.kill(place, signal.SIGTERM)  # ended by a signal: the supervisor by the same
            assert sup.wait(10) == -signal.SIGTERM
        with supervised(boot(endpoint), "busy") as (sup, place, _):
            sup.send_signal(signal.SIGTERM)  # passed on to the place
            assert sup.wait(10) == -signal.SIGTERM and not alive(place)


def test_end_of_stdin_lets_a_running_place_end_by_itself_and_kills_a_stopped_one():
    with place_zero() as (_, endpoint):
        with supervised(boot(endpoint)) as (sup, place, _):
            sup.stdin.close()
            assert sup.wait(10) == 3  # the place saw its stdin end, as without a supervisor
        with supervised(boot(endpoint)) as (sup, place, _):
            stop(place)
            sup.stdin.close()
            gone([place, sup.pid], 30)  # far below the never of a stopped place nobody kills
            assert sup.wait() == -signal.SIGKILL
            assert b"place 1 (pid" in sup.stderr.read()


@pytest.mark.parametrize("how", ["killed", "stopped", "never there"])
def test_a_stopped_place_is_killed_when_place_0_is_gone(how):
    with place_zero() as (zero, endpoint):
        if how == "never there":
            endpoint = endpoint.rpartition(":")[0] + ":1"  # nothing listens there
        # killed: a heartbeat timeout far above the bound below, which the link's end must meet
        with supervised(boot(endpoint, "0.2:30" if how == "killed" else "0.2:1")) as (sup, place, _):
            if how != "never there":
                linked(zero)
            stop(place)
            began = time.monotonic()
            if how == "killed":
                os.kill(zero.pid, signal.SIGKILL)
            elif how == "stopped":  # silent, as behind a cut link: heartbeats notice
                os.kill(zero.pid, signal.SIGSTOP)
            wait_gone([place, sup.pid], 40)
            took = time.monotonic() - began
            assert not alive(place) and not alive(sup.pid)
            assert sup.wait() == -signal.SIGKILL
            if how == "killed":
                assert took < 10.0, took  # at once, not after the 30 s heartbeat timeout
            elif how == "stopped":  # the 1 s timeout, up to a 0.2 s interval; the upper
                assert 0.9 < took < 20.0, took  # bound leaves room for load, far below never
            assert b"killed" in sup.stderr.read()


def test_a_busy_place_that_ignores_its_stdin_is_killed_after_the_grace():
    with place_zero() as (zero, endpoint):
        with supervised(boot(endpoint), "busy") as (sup, place, _):
            linked(zero)
            began = time.monotonic()
            os.kill(zero.pid, signal.SIGKILL)
            took = gone([place, sup.pid], 30)
            # not before the grace; the upper bound leaves room for load, far below the
            # 600 s the busy place would run
            assert _supervise.GRACE_S - 0.1 < took < _supervise.GRACE_S + 20, took
            assert time.monotonic() - began >= _supervise.GRACE_S - 0.1


def test_a_killed_supervisor_takes_its_place_along():
    with place_zero() as (_, endpoint):
        with supervised(boot(endpoint), "busy") as (sup, place, _):
            sup.kill()
            gone([place], 30)  # far below the 600 s the busy place would run


def test_the_supervisor_sleeps():
    def cpu(pid: int) -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    with place_zero() as (_, endpoint):
        with supervised(boot(endpoint, "1:10"), "busy") as (sup, _, _):
            before = cpu(sup.pid)
            time.sleep(2)
            assert cpu(sup.pid) - before <= 0.05


WATCHED_RANK = """
import json, sys, time
from launcher.mpi import stand_down, start_watchdog
watchdog = start_watchdog(json.loads(sys.argv[1]))
if sys.argv[2] == "stand down":
    stand_down(watchdog)
print(watchdog.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("stand_down", [False, True])
def test_the_watchdog_of_a_rank_kills_it_when_place_0_is_gone_unless_it_stood_down(stand_down):
    with place_zero() as (zero, endpoint):
        rank = subprocess.Popen([sys.executable, "-c", WATCHED_RANK, json.dumps(boot(endpoint)),
                                 "stand down" if stand_down else "watch"],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            watchdog = int(rank.stdout.readline())
            if stand_down:
                time.sleep(0.5)  # no link to wait for: it stood down
            else:
                linked(zero)
            os.kill(rank.pid, signal.SIGSTOP)
            os.kill(zero.pid, signal.SIGKILL)
            if stand_down:
                gone([watchdog], 30)  # it left; the rank stays
                assert rank.poll() is None
            else:  # far below the never of a stopped rank nobody kills
                gone([rank.pid, watchdog], 30)
                assert rank.wait() == -signal.SIGKILL
        finally:
            if rank.poll() is None:
                rank.kill()
            rank.wait()


def test_the_ssh_launcher_supervises_places_on_other_hosts_and_srun_every_place(monkeypatch):
    made: list[list[str]] = []
    for module in ("ssh", "srun"):
        monkeypatch.setattr(getattr(launcher, module), "LaunchedPlace",
                            lambda command, bootstrap: made.append(command))
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    ssh, srun = launcher.SshLauncher(), launcher.SrunLauncher()
    ssh.launch(1, "node7", {})
    ssh.launch(2, "localhost", {})
    srun.launch(3, "node8", {})
    remote = shlex.split(made[0][-1])
    assert remote[remote.index("exec") + 1:][:5] == [sys.executable, "-m", "launcher._supervise",
                                                     "--", sys.executable]
    assert made[1] == launcher.place_command(2)  # this machine: place 0 ends it itself
    expected = supervised_command(launcher.place_command(3))
    assert made[2][-len(expected):] == expected and made[2][0] == "srun"


def test_a_stopped_place_started_through_ssh_is_gone_soon_after_it_is_declared_dead(sshd,
                                                                                   monkeypatch):
    monkeypatch.setenv("APGAS_LAUNCHER", "ssh")
    monkeypatch.setenv("APGAS_SSH", shlex.join(sshd.command))
    monkeypatch.delenv("APGAS_LOCAL_HOSTS", raising=False)

    def main() -> tuple[float, list[int]]:
        place = apgas.at(apgas.places()[1], os.getpid)
        with open(f"/proc/{place}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(place, signal.SIGSTOP)  # sshd alone would keep it stopped for ever
        began = time.monotonic()
        while len(apgas.places()) == 3 and time.monotonic() - began < 30:
            time.sleep(0.02)
        left = wait_gone([place, supervisor], 30)
        return time.monotonic() - began, left

    took, left = apgas.run(main, hosts="localhost,sshhost1,sshhost2", heartbeat="0.2:1")
    # the 1 s timeout and the supervisor's kill, with room for load: far below for ever
    assert left == [] and took < 30, took


def watchdogs_of(ranks: list[int]) -> list[int]:
    """Pids of the watchdogs (``launcher._supervise --pid``) of ``ranks`` still running."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"launcher._supervise" in args and b"--pid" in args \
                and int(args[args.index(b"--pid") + 1]) in ranks and alive(int(entry)):
            found.append(int(entry))
    return found


STOPPED_RANK = """
import apgas, json, os, signal, time
def main():
    pids = [apgas.at(p, os.getpid) for p in apgas.places()]
    print("PIDS " + json.dumps(pids), flush=True)
    os.kill(pids[1], signal.SIGSTOP)
    time.sleep(0.5)
apgas.run(main)
"""


def test_under_mpiexec_a_stopped_rank_ends_with_place_0_instead_of_hanging_the_job():
    pytest.importorskip("mpi4py")
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip("mpiexec not found (pip install mpich)")
    proc = subprocess.Popen([str(mpiexec), "-n", "3", sys.executable, "-c", STOPPED_RANK], cwd=ROOT,
                            env={**os.environ, "APGAS_LOCAL_HOSTS": "*", "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)  # without its watchdog, the rank hangs the job
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    pids = json.loads(next(line for line in out.splitlines() if line.startswith("PIDS "))[5:])
    assert wait_gone(pids, 30) == []
    assert wait_gone(watchdogs_of(pids), 30) == []
    assert proc.returncode != 0, (out, err)  # mpiexec reports the rank it lost


SILENT_RANK = """
import apgas, json, os, signal, time
def main():
    pids = [apgas.at(p, os.getpid) for p in apgas.places()]
    print("PIDS " + json.dumps(pids), flush=True)
    os.kill(pids[1], signal.SIGSTOP)
    start = time.monotonic()
    while 1 in [p.id for p in apgas.places()] and time.monotonic() - start < 60:
        time.sleep(0.05)
    print("DECLARED " + json.dumps(time.monotonic() - start), flush=True)
apgas.run(main)
"""


@pytest.mark.timeout(120)
def test_under_mpiexec_place_0_declares_a_silent_rank_dead_within_the_heartbeat():
    """An mpiexec rank's handle cannot tell whether the rank ended, so its silence
    decides, as for any place (it used to stay in the table for good)."""
    pytest.importorskip("mpi4py")
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip("mpiexec not found (pip install mpich)")
    proc = subprocess.Popen([str(mpiexec), "-n", "3", sys.executable, "-c", SILENT_RANK], cwd=ROOT,
                            env={**os.environ, "APGAS_LOCAL_HOSTS": "*", "PYTHONUNBUFFERED": "1",
                                 "APGAS_HEARTBEAT": "0.5:3"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    pids = json.loads(next(line for line in out.splitlines() if line.startswith("PIDS "))[5:])
    declared = json.loads(next(line for line in out.splitlines() if line.startswith("DECLARED "))[9:])
    # the 3 s timeout, with room for load; far below the 60 s the program waits
    assert declared < 30, (out, err[-3000:])
    assert wait_gone(pids, 30) == []
