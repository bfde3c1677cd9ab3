"""Issue 30, item 5: a scheduler crash loses no job's exit status.

A job's first process (``apgas_scheduler/live/_job_exec.py``) stays as its
program's parent, the supervisor, and records how the program ended in the
state directory's ``outcomes``; a daemon that was SIGKILLed and started again
records the true outcome of a job that ended meanwhile, and of a job it
adopted. The operator's scenario (many short jobs from several client
threads, the daemon SIGKILLed halfway and restarted 0.3 s later) runs here
smaller (``benchmarks.scheduler_crash`` runs it whole); the others are
deterministic: a job that ends while the daemon is down, the signals a job
gets, and (as root) what the job's user can do to the records."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, eventually, wait_gone
from test_scheduler_live import job

from apgas_scheduler.client import request
from apgas_scheduler.live import containment
from benchmarks import scheduler_crash
from benchmarks.scheduler_crash import MEANWHILE, Plan, Serve

pytestmark = pytest.mark.timeout(60)
NOBODY = 65534


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def status_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":"))


# -- the operator's scenario, smaller -------------------------------------------------------------

def test_a_crash_halfway_through_many_short_jobs_loses_no_exit_status(tmp_path):
    """30 jobs (every fifth exits 3, every third sleeps 1 s first, so that some run
    across the crash) from 4 threads on 8 nodes; the daemon SIGKILLed when half are
    submitted, started again 0.3 s later. Every job ends exactly as its program did,
    once, none twice, nothing left. (60 jobs had no more running across the crash,
    3 to 6 under load, as 30 have: the SIGKILL comes about as early; they only took
    twice as long.)"""
    work = tmp_path / "w"
    work.mkdir()
    plan = Plan(jobs=30, nodes=8, threads=4, down=0.3, fail_every=5, sleep_every=3, sleep=1.0,
                door="unix", timeout=50)
    r = scheduler_crash.run(plan, work)
    assert r["submit_errors"] == [] and r["ids_given"] == plan.jobs
    assert r["jobs_in_state"] == plan.jobs and r["duplicates"] == 0 and r["missing_ids"] == []
    assert r["wrong_outcomes"] == [] and r["true_outcomes"] == plan.jobs and r["unknown_status"] == 0
    assert r["ended_while_down"] == r["ended_while_down_true"]
    assert r["ended_while_down"] + r["adopted"] >= 1, r  # some job ran across the crash
    assert r["ran_twice"] == [] and r["never_ran"] == []
    assert r["processes_left"] == 0 and r["cgroups_left"] == 0 and r["outcome_files_left"] == 0


# -- a job that ends while the daemon is down ----------------------------------------------------------

def waiter(work: Path, name: str, end: str, nodes: int = 1) -> dict:
    """A job that writes its pid, waits for ``go-<name>``, then ends with ``end``."""
    return {"name": name, "class": "rigid", "nodes": nodes, "walltime": 60, "cwd": str(work),
            "command": ["/bin/sh", "-c", f"echo $$ > {name}.pid; while [ ! -e go-{name} ]; "
                        f"do sleep 0.05; done; {end}"]}


def test_jobs_that_end_while_the_daemon_is_down_get_their_true_outcome(tmp_path):
    """Killed daemon; then three programs end (exit 0, exit 3, killed by SIGUSR1)
    and a fourth runs on; restarted daemon: the three are recorded as they
    ended, the fourth is adopted and, when it exits 5, recorded so."""
    serve = Serve(tmp_path, nodes=4)
    serve.start()
    try:
        ends = {"ok": "exit 0", "three": "exit 3", "usr1": "kill -USR1 $$", "later": "exit 5"}
        ids = {name: request(serve.address, "submit", key=serve.key(), job=waiter(tmp_path, name, end))["id"]
               for name, end in ends.items()}
        pids = {name: int(eventually(lambda n=name: (tmp_path / f"{n}.pid").exists()
                                     and (tmp_path / f"{n}.pid").read_text().strip(), f"{name} to run"))
                for name in ends}
        supervisors = {name: parent_of(pid) for name, pid in pids.items()}
        outcomes = tmp_path / "state" / "outcomes"
        st = outcomes.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        serve.kill()
        for name in ("ok", "three", "usr1"):
            (tmp_path / f"go-{name}").touch()
        ended = [pids[n] for n in ("ok", "three", "usr1")] + \
            [supervisors[n] for n in ("ok", "three", "usr1")]
        assert wait_gone(ended, 30) == []
        assert alive(pids["later"]) and alive(supervisors["later"])
        assert len(list(outcomes.iterdir())) == 3  # recorded while nobody could see them end
        lines = serve.start()
        assert "3 ended meanwhile" in lines[-1] and "1 adopted" in lines[-1], lines
        jobs = {j["name"]: j for j in serve.status()["jobs"]}
        assert jobs["ok"]["state"] == "done" and jobs["ok"]["reason"] == MEANWHILE
        assert jobs["three"]["state"] == "failed"
        assert jobs["three"]["reason"].startswith("exit code 3; see ")
        assert jobs["three"]["reason"].endswith(MEANWHILE)
        assert jobs["usr1"]["state"] == "failed"
        assert jobs["usr1"]["reason"].startswith("killed by signal 10 (SIGUSR1)")
        assert jobs["later"]["state"] == "running"
        assert len(list(outcomes.iterdir())) == 0  # their ends are in the state now
        (tmp_path / "go-later").touch()
        later = eventually(lambda: (j := next(j for j in serve.status()["jobs"]
                                              if j["id"] == ids["later"]))["state"] != "running" and j,
                           "the adopted job to end")
        assert later["state"] == "failed" and later["reason"].startswith("exit code 5; see "), later
        assert wait_gone(list(pids.values()) + list(supervisors.values()), 30) == []
        assert list(outcomes.iterdir()) == []
    finally:
        serve.stop()
        for name in ("ok", "three", "usr1", "later"):
            (tmp_path / f"go-{name}").touch()  # a test that failed early leaves no waiter


def test_a_stale_outcome_file_is_removed_at_a_restart(tmp_path):
    serve = Serve(tmp_path, nodes=1)
    serve.start()
    try:
        serve.kill()
        stale = tmp_path / "state" / "outcomes" / "job-99-0123456789abcdef.exit"
        stale.write_text('{"tag": "99-0123456789abcdef", "code": 0, "signal": null}')
        serve.start()
        assert not stale.exists()
    finally:
        serve.stop()


# -- signals -------------------------------------------------------------------------------------------

SENDERS = """
import os, signal, sys, time
out = sys.argv[1]
wanted = {signal.SIGTERM, signal.SIGUSR1}
signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
with open(out + ".pid", "w") as f:
    f.write(str(os.getpid()))
until = None
while until is None or time.monotonic() < until:
    got = signal.sigtimedwait(wanted, 0.1)
    if got is not None:
        with open(out, "a") as f:
            f.write(f"{signal.Signals(got.si_signo).name} {got.si_pid}\\n")
        if got.si_signo == signal.SIGTERM and until is None:
            until = time.monotonic() + 1.0  # a second TERM would come within this
"""


def test_a_cancel_reaches_the_program_once_and_the_supervisor_ends_with_it(make_scheduler, tmp_path):
    """The cancel's TERM comes to the program from the scheduler, once (not also
    through the supervisor); a signal sent to the supervisor alone is passed
    on (it comes from the supervisor); the supervisor ends with the program."""
    sched = make_scheduler(nodes=1, policy="fcfs")
    out = tmp_path / "signals"
    job_id = sched.submit(job("senders", [sys.executable, "-c", SENDERS, str(out)]))
    pid = int(eventually(lambda: Path(f"{out}.pid").exists() and Path(f"{out}.pid").read_text().strip(),
                         "the program to run"))
    supervisor = parent_of(pid)
    assert supervisor == sched._jobs[job_id].identity["pid"]
    os.kill(supervisor, signal.SIGUSR1)  # as an operator might: passed on
    eventually(lambda: out.exists() and "SIGUSR1" in out.read_text(), "the USR1 to reach the program")
    sched.cancel(job_id)
    final = eventually(lambda: (j := next(j for j in sched.status()["jobs"] if j["id"] == job_id))
                       ["state"] != "running" and j, "the cancel", timeout=20)
    assert final["state"] == "cancelled", final
    assert out.read_text().splitlines() == [f"SIGUSR1 {supervisor}", f"SIGTERM {os.getpid()}"]
    assert not alive(pid) and not alive(supervisor)


def test_the_program_starts_with_no_signal_ignored_or_blocked(make_scheduler, tmp_path):
    """Python ignores SIGPIPE and SIGXFSZ, and the supervisor blocks the signals it
    passes on while it forks: the program gets neither."""
    sched = make_scheduler(nodes=1, policy="fcfs")
    out = tmp_path / "mask"
    job_id = sched.submit(job("mask", ["/bin/sh", "-c", f"grep -E '^Sig(Ign|Blk)' /proc/self/status > {out}"]))
    eventually(lambda: next(j for j in sched.status()["jobs"] if j["id"] == job_id)["state"] == "done",
               "the job")
    fields = dict(line.split(":") for line in out.read_text().splitlines())
    assert int(fields["SigIgn"], 16) == 0 and int(fields["SigBlk"], 16) == 0, fields


# -- the record itself -----------------------------------------------------------------------------------

@pytest.mark.parametrize("end, code, recorded", [
    ("exit 7", 7, 7),
    ("kill -TERM $$", -signal.SIGTERM, -signal.SIGTERM),
    ("kill -SEGV $$", 128 + signal.SIGSEGV, -signal.SIGSEGV),  # the supervisor dumps no core
])
def test_the_supervisor_records_and_exits_as_the_program_did(tmp_path, end, code, recorded):
    outcomes = tmp_path / "outcomes"
    outcomes.mkdir(mode=0o700)
    h = containment.start(3, ["/bin/sh", "-c", end], outcome_dir=outcomes, cgroup=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert h.proc.wait(30) == code
    assert containment.outcome(h.identity) == recorded
    path = Path(h.identity["outcome"])
    assert path.parent == outcomes and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert containment.outcome({**h.identity, "tag": "another"}) is None  # only its own record
    containment.forget(h.identity)
    assert list(outcomes.iterdir()) == [] and containment.outcome(h.identity) is None


def test_a_program_that_fails_at_once_has_started_all_the_same(tmp_path):
    """A program that exits 1 as soon as it runs is a job that started and failed,
    not one that could not start (the first process says when it has exec'd; a
    first process that had exited 1 before it was looked at used to count as a
    start that failed, about one time in three)."""
    outcomes = tmp_path / "outcomes"
    outcomes.mkdir(mode=0o700)
    for _ in range(20):
        h = containment.start(4, ["/bin/false"], outcome_dir=outcomes, cgroup=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert h.proc.wait(30) == 1 and containment.outcome(h.identity) == 1
        containment.forget(h.identity)


LEAVER = """
import json, os, subprocess, sys
from apgas_scheduler.live import containment
h = containment.start(5, ["/bin/sh", "-c", "setsid sleep 30 & echo $! > " + sys.argv[2] + "; exit 4"],
                      outcome_dir=sys.argv[1], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
print(json.dumps(h.identity), flush=True)
"""


def test_an_adopted_job_reports_the_recorded_status_of_its_program(tmp_path):
    """Started by another daemon process, which is gone: once its program has
    exited 4, :class:`Adopted` says 4, and what it left behind (a setsid child,
    re-parented to the supervisor, its subreaper) was ended by the supervisor
    before it exited."""
    import json

    outcomes = tmp_path / "outcomes"
    outcomes.mkdir(mode=0o700)
    left = tmp_path / "left"
    daemon = subprocess.run([sys.executable, "-c", LEAVER, str(outcomes), str(left)],
                            cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                            text=True, timeout=30)
    assert daemon.returncode == 0, daemon.stderr
    identity = json.loads(daemon.stdout)
    sleeper = int(eventually(lambda: left.exists() and left.read_text().strip(), "the leftover"))
    try:
        proc = containment.adopt(identity)
        assert proc.wait(30) == 4 and proc.ended
        assert wait_gone([sleeper], 10) == []  # far below its 30 s sleep, had it been left
        assert not containment.alive(identity)
        containment.kill(identity, 0.5)  # nothing left: returns at once
    finally:
        if alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


# -- what the job's user can do to the records (root) ---------------------------------------------------

PROBE = """
while [ ! -e {out}/go ]; do sleep 0.05; done
for f in /proc/self/fd/*; do readlink "$f"; done > {out}/fds
echo '{{"tag": "x", "code": 0}}' > {outcomes}/job-forged.exit 2> {out}/forge.err; echo $? > {out}/forge.rc
kill -0 $PPID 2> /dev/null; echo $? > {out}/signal.rc
id -u > {out}/uid
exit 3
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job runs as nobody")
def test_the_jobs_user_can_neither_write_nor_hold_the_outcomes_nor_signal_its_supervisor(tmp_path):
    """The program runs as nobody, the supervisor as root: the program holds no
    descriptor of the outcome directory, cannot write there, cannot signal its
    supervisor; what is recorded is its true exit code, in a file of root's."""
    import tempfile

    outcomes = tmp_path / "outcomes"
    outcomes.mkdir(mode=0o700)
    out = Path(tempfile.mkdtemp(prefix="apgas-outcome-probe-"))  # nobody writes its findings here
    out.chmod(0o777)
    try:
        user = containment.RunAs(NOBODY, NOBODY, (NOBODY,))
        h = containment.start(6, ["/bin/sh", "-c", PROBE.format(out=out, outcomes=outcomes)],
                              env={"PATH": "/usr/bin:/bin"}, cwd="/", user=user,
                              outcome_dir=outcomes, cgroup=False, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        program = next(int(p) for p in os.listdir("/proc") if p.isdigit()
                       and alive(int(p)) and parent_of(int(p)) == h.proc.pid)
        assert status_field(h.proc.pid, "Uid").split() == ["0"] * 4  # the supervisor: root
        assert status_field(program, "Uid").split() == [str(NOBODY)] * 4
        (out / "go").touch()
        assert h.proc.wait(30) == 3
        assert (out / "uid").read_text().split() == [str(NOBODY)]
        assert str(outcomes) not in (out / "fds").read_text()
        assert (out / "forge.rc").read_text().strip() != "0"
        assert (out / "signal.rc").read_text().strip() != "0"  # EPERM: root's process
        assert [p.name for p in outcomes.iterdir()] == [Path(h.identity["outcome"]).name]
        st = Path(h.identity["outcome"]).stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
        assert containment.outcome(h.identity) == 3
    finally:
        (out / "go").touch()
        subprocess.run(["rm", "-rf", str(out)], timeout=10)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job runs as nobody")
def test_a_shared_schedulers_outcomes_are_roots_alone(make_scheduler, tmp_path):
    """A job of nobody's, under a root scheduler, that tries to write a record into
    the state's outcome directory: refused; its own end is recorded as it was."""
    sched = make_scheduler(nodes=1, policy="fcfs", socket_mode=0o666)
    outcomes = sched.processes.outcomes
    assert outcomes is not None and outcomes.stat().st_uid == 0
    script = (f"echo '{{}}' > {outcomes}/job-forged.exit; echo rc=$?; ls {outcomes}; echo ls=$?; "
              "exit 3")
    reply = submit_as_nobody(sched.socket_path, {"op": "submit", "job": {
        "name": "forger", "class": "rigid", "nodes": 1, "walltime": 30, "cwd": "/",
        "command": ["/bin/sh", "-c", script]}})
    assert reply.get("ok"), reply
    final = eventually(lambda: (j := next(j for j in sched.status()["jobs"] if j["id"] == reply["id"]))
                       ["state"] not in ("queued", "running") and j, "the job to end")
    assert final["state"] == "failed" and final["reason"].startswith("exit code 3"), final
    printed = (sched.output_dir / f"job-{reply['id']}.out").read_text()
    assert "rc=0" not in printed and "ls=0" not in printed, printed
    assert not (outcomes / "job-forged.exit").exists()
    eventually(lambda: list(outcomes.iterdir()) == [], "its own record to go, its end being in "
               "the state")


def submit_as_nobody(unix_path: Path, req: dict) -> dict:
    """Send a request over the Unix socket as the user nobody (the system's Python, no apgas)."""
    import json
    import shutil

    code = ("import json, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\n"
            "s.sendall(sys.argv[2].encode() + b'\\n')\n"
            "print(s.makefile().readline())\n")
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    out = subprocess.run([python, "-c", code, str(unix_path), json.dumps(req)], user="nobody",
                         capture_output=True, text=True, timeout=30, cwd="/")
    return json.loads(out.stdout)
