"""Containment (issue 17, item 2): cancel, a walltime kill and a failed start end
every process a job started (children that ignore SIGTERM, call setsid or
double-fork), with a cgroup and with the fallback (a tag in the environment),
and the job's nodes are free only once all of them are gone; a job outlives
the daemon that started it and is adopted, checked and killed by another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import alive, wait_gone
from test_scheduler_live import job, wait_for

from apgas_scheduler.live import containment

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# Writes the pids of: itself, a child ignoring TERM, a setsid child ignoring TERM,
# a double-forked grandchild ignoring TERM (its parent exits); then sleeps.
ESCAPER = textwrap.dedent("""\
    import os, signal, sys, time
    out = sys.argv[1]
    r, w = os.pipe()
    for kind in ("child", "setsid", "double"):
        if os.fork() == 0:
            os.close(r)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if kind != "child":
                os.setsid()
            if kind == "double" and os.fork() != 0:
                os._exit(0)
            os.write(w, b"%d\\n" % os.getpid())
            os.close(w)
            while True:
                time.sleep(1)
    os.close(w)
    pids = [os.getpid()]
    with os.fdopen(r) as f:
        while len(pids) < 4:
            pids.append(int(f.readline()))
    with open(out + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.rename(out + ".tmp", out)
    time.sleep(120)
    """)


@pytest.fixture(params=["cgroup", "fallback"])
def mode(request, monkeypatch):
    """Each test with a cgroup per job (skipped where none can be made) and without."""
    if request.param == "fallback":
        monkeypatch.setenv(containment.CGROUPS_ENV, "0")
    elif containment.cgroup_base() is None:
        pytest.skip("no writable cgroup2 mount here")
    return request.param


def read_pids(path: Path, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"the job never wrote {path}"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def watch_free(sched, job_id: int, pids: list[int], timeout: float = 30) -> dict:
    """Poll until the job has ended; every time its node shows free, none of
    ``pids`` may be alive. Returns the job's final status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = sched.status()
        mine = [n for n in status["nodes"] if n["job"] == job_id]
        ended = [j for j in status["jobs"] if j["id"] == job_id and j["state"] != "running"]
        if not mine:
            left = [p for p in pids if alive(p)]
            assert not left, f"node free while processes {left} of job {job_id} run: {status}"
        if ended:
            assert not mine
            return ended[0]
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} did not end: {sched.status()}")


@pytest.mark.timeout(60)
def test_cancel_ends_every_process_and_frees_the_node_after(make_scheduler, tmp_path, mode):
    sched = make_scheduler(nodes=1, policy="easy")
    out = tmp_path / "pids"
    job_id = sched.submit(job("escaper", [PY, "-c", ESCAPER, str(out)]))
    pids = read_pids(out)
    try:
        identity = sched._jobs[job_id].identity
        assert (identity["cgroup"] is not None) == (mode == "cgroup"), identity
        assert set(pids) <= containment.members(identity)
        assert sched.cancel(job_id) == "running"
        t0 = time.monotonic()
        final = watch_free(sched, job_id, pids)
        assert final["state"] == "cancelled", final
        assert time.monotonic() - t0 >= 2  # the stubborn ones took the grace time and a KILL
        assert not any(alive(p) for p in pids)
        assert not containment.alive(identity)
        if identity["cgroup"]:
            assert not Path(identity["cgroup"]).exists()
    finally:
        kill_all(pids)


@pytest.mark.timeout(60)
def test_walltime_kill_ends_every_process(make_scheduler, tmp_path, mode):
    sched = make_scheduler(nodes=1, policy="easy")
    out = tmp_path / "pids"
    # walltime: time for the program to start and write its pids even on a loaded
    # machine (a kill before that would leave nothing to check)
    job_id = sched.submit(job("escaper", [PY, "-c", ESCAPER, str(out)], walltime=5))
    pids = read_pids(out)
    try:
        final = watch_free(sched, job_id, pids)
        assert final["state"] == "failed" and final["reason"].startswith("killed"), final
        assert not any(alive(p) for p in pids)
    finally:
        kill_all(pids)


@pytest.mark.timeout(60)
def test_what_a_job_leaves_behind_is_ended_before_its_nodes_are_free(make_scheduler, tmp_path,
                                                                     mode):
    """The first process exits 0 and leaves a setsid child that ignores TERM."""
    sched = make_scheduler(nodes=1, policy="easy")
    out = tmp_path / "pids"
    code = ESCAPER.replace("time.sleep(120)", "pass")
    job_id = sched.submit(job("leaver", [PY, "-c", code, str(out)]))
    pids = read_pids(out)
    try:
        final = watch_free(sched, job_id, pids)
        assert final["state"] == "done", final
        assert not any(alive(p) for p in pids)
    finally:
        kill_all(pids)


def test_a_job_that_cannot_start_fails(make_scheduler, mode):
    sched = make_scheduler(nodes=1, policy="easy")
    job_id = sched.submit(job("missing", ["/no/such/program"]))
    jobs = wait_for(sched, "the job failed", lambda jobs: jobs[job_id]["state"] == "failed")
    assert "could not start '/no/such/program' on node0" in jobs[job_id]["reason"]
    assert all(n["job"] is None for n in sched.status()["nodes"])


def test_a_start_that_fails_leaves_no_cgroup(mode, tmp_path):
    tag = containment.new_tag(9)
    plain = tmp_path / "not-a-program"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    with pytest.raises(FileNotFoundError):
        containment.start(9, ["/no/such/program"], tag=tag)
    with pytest.raises(PermissionError):
        containment.start(9, [str(plain)], tag=tag)
    base = containment.cgroup_base()
    assert base is None or not (base / f"job-{tag}").exists()


DAEMON = """
import json, subprocess, sys
from apgas_scheduler.live import containment
h = containment.start(7, [sys.executable, "-c", sys.argv[1], sys.argv[2]],
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
print(json.dumps(h.identity), flush=True)
"""


@pytest.mark.timeout(60)
def test_a_job_outlives_its_daemon_and_is_adopted_and_killed_by_another(tmp_path, mode):
    out = tmp_path / "pids"
    daemon = subprocess.run([PY, "-c", DAEMON, ESCAPER, str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=30, env={**os.environ})
    assert daemon.returncode == 0, daemon.stderr
    identity = json.loads(daemon.stdout)  # as persisted: the daemon that started it is gone
    pids = read_pids(out)
    try:
        assert (identity["cgroup"] is not None) == (mode == "cgroup") and identity["supervised"]
        assert identity["pid"] == parent_of(pids[0])  # the supervisor, the program's parent
        assert containment.alive(identity)
        assert set(pids) <= containment.members(identity)
        proc = containment.adopt(identity)
        assert proc.poll() is None and not proc.ended
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.3)
        os.kill(pids[0], signal.SIGKILL)  # the program ends, and its supervisor (which records
        # nothing here: no outcome directory); the stubborn ones stay
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)
        assert containment.alive(identity)
        containment.kill(identity, 0.5)
        assert wait_gone(pids, 30) == []  # killed: ends on the event, however loaded
        assert proc.wait(30) is None and proc.ended  # no exit status for a job not ours
        assert not containment.alive(identity)
        containment.kill(identity, 0.5)  # again: nothing left, returns at once
    finally:
        kill_all(pids)


def test_alive_is_false_for_another_boot_or_a_reused_pid(tmp_path, mode):
    h = containment.start(8, [PY, "-c", "import time; time.sleep(60)"])
    try:
        assert containment.alive(h.identity)
        assert not containment.alive({**h.identity, "boot_id": "another-boot"})
        reused = {**h.identity, "start_time": h.identity["start_time"] - 1, "cgroup": None,
                  "tag": containment.new_tag(8)}
        assert not containment.alive(reused)  # its pid, but another process: not ours
    finally:
        containment.kill(h.identity, 0.0)
        h.proc.wait(30)
    assert not containment.alive(h.identity)


def test_the_srun_launcher_names_steps_after_the_job(monkeypatch):
    import launcher

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    srun = launcher.get_launcher("srun")
    argv = srun.command("node1", ["python", "x.py"], {containment.STEP_ENV: "apgas-job-3-ab"})
    assert "--job-name=apgas-job-3-ab" in argv
    monkeypatch.setenv(containment.STEP_ENV, "apgas-job-4-cd")  # inside the job: inherited
    assert "--job-name=apgas-job-4-cd" in srun.command("node1", ["python", "x.py"])
    monkeypatch.delenv(containment.STEP_ENV)
    assert "--job-name=apgas-python" in srun.command("node1", ["python", "x.py"])


SCHEDULER_IN_ALLOCATION = """
import json, os, subprocess, sys, time
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.policies import get_policy
import launcher
out, code = sys.argv[1], sys.argv[2]
nodes = launcher.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
sched = Scheduler(nodes, get_policy("easy"), interval=0.2, output_dir=out,
                  launcher=launcher.detect_launcher(os.environ, mpi=False),
                  socket_path=os.path.join(out, "scheduler.sock"))  # not left in /tmp
sched.start()
spec = JobSpec("stubborn", (sys.executable, "-c", code, out + "/pids"), "rigid", 1, 1, 60, (),
               os.getcwd())
job_id = sched.submit(spec)
while not os.path.exists(out + "/pids"):
    time.sleep(0.05)
pids = [int(p) for p in open(out + "/pids").read().split()]
identity = sched._jobs[job_id].identity
steps = subprocess.run(["squeue", "--steps", "--noheader", "--format=%i %j"], capture_output=True,
                       text=True).stdout
sched.cancel(job_id)
seen_alive_while_free = []
while True:
    status = sched.status()
    free = all(n["job"] != job_id for n in status["nodes"])
    if free:
        seen_alive_while_free += [p for p in pids if os.path.exists(f"/proc/{p}") and
                                  open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
                                  not in "ZX"]
    if status["jobs"][0]["state"] != "running":
        break
    time.sleep(0.02)
after = subprocess.run(["squeue", "--steps", "--noheader", "--format=%i %j"], capture_output=True,
                       text=True).stdout
print("RESULT " + json.dumps({"identity": identity, "pids": pids, "steps": steps, "after": after,
                              "state": status["jobs"][0]["state"],
                              "alive_while_free": seen_alive_while_free}), flush=True)
sched.shutdown()
"""

STUBBORN_STEP = textwrap.dedent("""\
    import os, signal, sys, time
    out = sys.argv[1]
    r, w = os.pipe()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, b"%d\\n" % os.getpid())
        while True:
            time.sleep(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid(), int(os.fdopen(r).readline())]
    with open(out + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.rename(out + ".tmp", out)
    time.sleep(120)
    """)


@pytest.mark.timeout(120)
def test_cancel_under_slurm_cancels_the_jobs_steps(slurm_cluster, tmp_path):
    environ = {**slurm_cluster.env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(["salloc", "--nodes=1", "--quiet", "--time=5",
                             "--kill-command=SIGKILL", PY, "-c", SCHEDULER_IN_ALLOCATION,
                             str(tmp_path), STUBBORN_STEP],
                            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, (out, err)
    r = results[0]
    pids = r["pids"]
    try:
        name = r["identity"]["slurm"]["step_name"]
        assert name in r["steps"], r  # the job's command ran as a step named after it
        assert name not in r["after"], r  # cancelled: the step is gone
        assert r["state"] == "cancelled" and r["alive_while_free"] == [], r
        assert wait_gone(pids, 30) == []
    finally:
        kill_all(pids)
