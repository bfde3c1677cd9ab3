"""Issue 40's attacks on whose processes a job's are (items 1, 2 and 6), each tried
as the user ``nobody`` against a root scheduler:

1. nobody starts processes carrying root's job's tag (``APGAS_SCHEDULER_JOB``,
   readable in the cgroup tree) to keep the job running and its node taken;
2. the daemon is SIGKILLed meanwhile and started again on its state: it must
   start, end the job and say what it could not end;
6. a job of nobody's whose start fails in a way that is no ``OSError`` (a bare
   program name, looked up after the switch of user with the scheduler's
   Python under ``/root``; a lone surrogate in its directory) is reported with
   words, never as a silent ``exit code 127``."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import test_scheduler_containment
from conftest import alive, eventually, wait_gone
from test_authentication import as_nobody
from test_scheduler_restart import Daemon

from apgas_scheduler.jobs import parse_job
from apgas_scheduler.live import containment

mode = test_scheduler_containment.mode  # the fixture: each attack with a cgroup and without
pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacks come from "
                                                           "the user nobody against a root scheduler")]


def tagged_as_nobody(tag: str) -> subprocess.Popen:
    """A process of nobody's, in a session of its own, with the job's tag in its environment."""
    return subprocess.Popen(["/bin/sleep", "60"], user="nobody", start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", containment.TAG_ENV: tag}, cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def tag_of(job_id: int) -> str | None:
    """The tag of job ``job_id``, read where an attacker reads it (the cgroup tree, world-
    readable) or, without a cgroup, from its processes (we are root here)."""
    base = containment.cgroup_base()
    names = [e.name.removeprefix("job-") for e in os.scandir(base)] if base else []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            names += [v.decode().split("=", 1)[1] for v in
                      Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                      if v.startswith(containment.TAG_ENV.encode() + b"=")]
        except OSError:
            pass
    return next((n for n in names if n.startswith(f"{job_id}-")), None)


def submit(sched, job: dict) -> int:
    return sched.submit(parse_job(job))


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def job_state(sched, job_id: int) -> dict:
    return next(j for j in sched.status()["jobs"] if j["id"] == job_id)


def test_processes_of_another_user_carrying_the_tag_do_not_hold_a_job(make_scheduler, mode):
    sched = make_scheduler(nodes=1, policy="fcfs", socket_mode=0o666)
    job_id = submit(sched, {"name": "root-short", "class": "rigid", "nodes": 1, "walltime": 60,
                            "command": ["/bin/sh", "-c", "sleep 1.5; exit 3"], "cwd": "/"})
    eventually(lambda: job_state(sched, job_id)["state"] == "running", "the job to run")
    identity = sched._jobs[job_id].identity
    if mode == "cgroup":  # what nobody sees: the cgroup tree is world-readable
        listed = os.listdir(Path(identity["cgroup"]).parent)
        assert f"job-{identity['tag']}" in listed
    squatters = [tagged_as_nobody(identity["tag"]) for _ in range(3)]
    try:
        t0 = time.monotonic()
        job = eventually(lambda: (j := job_state(sched, job_id))["state"] != "running" and j,
                         "the job to end", timeout=30)
        took = time.monotonic() - t0
        assert job["state"] == "failed" and job["reason"].startswith("exit code 3"), job
        assert took < 8, f"the job ended {took:.1f} s after its program: something held it"
        assert all(n["job"] is None for n in sched.status()["nodes"])
        assert all(p.poll() is None for p in squatters), "another user's processes were killed"
        assert not containment.members(identity) & {p.pid for p in squatters}
    finally:
        for p in squatters:
            p.kill()
            p.wait(5)


def test_a_restarted_daemon_starts_although_another_user_carries_a_jobs_tag(tmp_path, mode):
    d = Daemon(tmp_path)
    squatters: list[subprocess.Popen] = []
    try:
        d.start()
        job_id = d.request("submit", job={"name": "root-short", "class": "rigid", "nodes": 1,
                                          "walltime": 60, "cwd": "/",
                                          "command": ["/bin/sh", "-c", "sleep 1.5; exit 3"]})["id"]
        eventually(lambda: d.jobs()[job_id]["state"] == "running", "the job to run")
        tag = eventually(lambda: tag_of(job_id), "the job's tag")
        d.kill()
        squatters = [tagged_as_nobody(tag) for _ in range(2)]
        time.sleep(2.0)  # the job's program exits 3 while the daemon is down
        d.start()  # it used to die here: StillRunning, uncaught in _resume
        job = eventually(lambda: (j := d.jobs()[job_id])["state"] != "running" and j,
                         "the job to be recorded as ended", timeout=30)
        assert job["state"] == "failed" and "exit code 3" in job["reason"], job
        assert all(p.poll() is None for p in squatters), "another user's processes were killed"
    finally:
        for p in squatters:
            p.kill()
            p.wait(5)
        d.stop()


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def freezer():
    """A cgroup-v1 freezer group: a process frozen there cannot die, not even of
    SIGKILL, until it is thawed (a stand-in for a process stuck in the kernel)."""
    if not (FREEZER / "tasks").exists() or not os.access(FREEZER, os.W_OK):
        pytest.skip("needs a writable cgroup-v1 freezer hierarchy to make a process unkillable")
    group = FREEZER / f"apgas-test-{os.getpid()}"
    group.mkdir()
    yield group
    (group / "freezer.state").write_text("THAWED")
    for _ in range(100):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.05)


def test_a_restarted_daemon_says_what_it_could_not_end_and_frees_the_node_later(tmp_path,
                                                                                  monkeypatch,
                                                                                  freezer):
    monkeypatch.setenv(containment.CGROUPS_ENV, "0")  # the v2 cgroup would kill it regardless
    d = Daemon(tmp_path)
    try:
        d.start()
        mark = tmp_path / "stuck.pid"
        job_id = d.request("submit", job={
            "name": "stuck", "class": "rigid", "nodes": 1, "walltime": 60, "cwd": str(tmp_path),
            "command": ["/bin/sh", "-c", f"sleep 60 & echo $! > {mark}; sleep 60"]})["id"]
        stuck = int(eventually(lambda: mark.exists() and mark.read_text().strip(), "the pid"))
        d.kill()
        (freezer / "tasks").write_text(str(stuck))
        (freezer / "freezer.state").write_text("FROZEN")
        eventually(lambda: (freezer / "freezer.state").read_text().strip() == "FROZEN", "frozen")
        program = parent_of(stuck)
        os.kill(parent_of(program), signal.SIGKILL)  # its supervisor dies too (the OOM killer)
        d.start()  # ends what it can, says what it cannot, and serves
        job = d.jobs()[job_id]
        assert job["state"] == "running" and job["nodes"] == ["node0"], job  # its node: taken
        assert wait_gone([program], 2) == []  # what could end has ended
        (freezer / "freezer.state").write_text("THAWED")
        job = eventually(lambda: (j := d.jobs()[job_id])["state"] != "running" and j,
                         "the job to end once it can", timeout=40)
        assert job["state"] == "failed" and "the scheduler restarted" in job["reason"], job
        assert wait_gone([stuck], 5) == []
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        d.stop()
    assert "could not end what the earlier run left" in d.log and str(stuck) in d.log, d.log[-2000:]


# -- 6. a start that fails is told ---------------------------------------------------------

def test_a_bare_program_name_runs_for_another_user(make_scheduler, shared_dir):
    """``true`` (no path): found on the job's PATH as nobody, without this Python's
    modules, which live under /root here and which nobody cannot read."""
    sched = make_scheduler(nodes=1, policy="fcfs", socket_mode=0o666)
    reply = as_nobody(sched.socket_path, {"op": "submit", "job": {
        "name": "bare", "command": ["sh", "-c", "id -u > mark"], "class": "rigid", "nodes": 1,
        "walltime": 30, "cwd": str(shared_dir), "env": {"PATH": "/usr/bin:/bin"}}})
    assert reply.get("ok"), reply
    job = eventually(lambda: (j := job_state(sched, reply["id"]))["state"] not in
                     ("queued", "running") and j, "the job to end")
    assert job["state"] == "done", job
    assert (shared_dir / "mark").read_text().strip() == "65534"


def test_a_missing_program_for_another_user_is_named(make_scheduler, shared_dir):
    sched = make_scheduler(nodes=1, policy="fcfs", socket_mode=0o666)
    reply = as_nobody(sched.socket_path, {"op": "submit", "job": {
        "name": "missing", "command": ["no-such-program-xyz"], "class": "rigid", "nodes": 1,
        "walltime": 30, "cwd": str(shared_dir), "env": {"PATH": "/usr/bin:/bin"}}})
    assert reply.get("ok"), reply
    job = eventually(lambda: (j := job_state(sched, reply["id"]))["state"] not in
                     ("queued", "running") and j, "the job to end")
    assert job["state"] == "failed", job
    assert "no such program on the job's PATH" in job["reason"], job
    assert "'no-such-program-xyz'" in job["reason"] and "b'no-such" not in job["reason"], job


def test_a_lone_surrogate_in_a_jobs_directory_is_told(make_scheduler, shared_dir):
    """Refused at the entry, or failed with words: never ``exit code 127`` and an empty .err."""
    sched = make_scheduler(nodes=1, policy="fcfs", socket_mode=0o666)
    reply = as_nobody(sched.socket_path, {"op": "submit", "job": {
        "name": "surrogate", "command": ["/bin/true"], "class": "rigid", "nodes": 1,
        "walltime": 30, "cwd": str(shared_dir) + "/\ud800"}})
    if not reply.get("ok"):
        assert "cwd" in reply["error"], reply
        return
    job = eventually(lambda: (j := job_state(sched, reply["id"]))["state"] not in
                     ("queued", "running") and j, "the job to end")
    assert job["state"] == "failed" and "exit code 127" not in job["reason"], job
    assert "could not start" in job["reason"] and "surrogate" in job["reason"], job


def test_no_process_of_the_jobs_is_left_when_its_supervisor_is_the_subreaper(tmp_path, mode):
    """A double-forked child whose parent exits is re-parented to the supervisor (not to
    init), so it is found without a tag, also without a cgroup, and ended with the job."""
    out = tmp_path / "pid"
    h = containment.start(40, ["/bin/sh", "-c", f"(setsid sh -c 'echo $$ > {out}; "
                                                f"trap \"\" TERM; sleep 60' &) ; sleep 60"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    try:
        orphan = int(eventually(lambda: out.exists() and out.read_text().strip(), "the orphan"))
        assert orphan in containment.members(h.identity)
        containment.kill(h.identity, 0.3)
        assert wait_gone([orphan], 2) == []
        assert h.proc.wait(5) is not None
    finally:
        if out.exists() and alive(int(out.read_text() or 0)):
            os.kill(int(out.read_text()), signal.SIGKILL)
