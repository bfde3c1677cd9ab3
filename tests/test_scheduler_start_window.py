"""A daemon killed while it starts a job: the program runs at most once per start
the state knows of, and the job's outcome is exact.

The daemon used to start a job's program first and record its ``start`` in
the state afterwards: SIGKILLed in between, it came back with the job still
queued and ran its program a second time (the crash benchmark saw it as
``ran_twice``, about one run in ten under load), leaking the first start's
cgroup. Now the job's first process does everything but the exec, waits for
the daemon's go, and the daemon sends it only once the start is durable.

Here the window is hit exactly: a ``sitecustomize`` on the daemon's
``PYTHONPATH`` wraps ``SchedulerCore.event`` to SIGSTOP the daemon just before
or just after it records the ``start`` (the job's first process is up and
ready then), and the test SIGKILLs it there and starts it again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import alive, eventually, wait_gone

from apgas_scheduler.live.processes import NEVER_BEGAN
from apgas_scheduler.live.state import read_db_events
from benchmarks.scheduler_crash import Serve

pytestmark = pytest.mark.timeout(90)

STOPPER = """
import os, signal, sys

_where = os.environ.get("APGAS_TEST_STOP_AT_START")
if _where:
    sys.path.insert(0, os.getcwd())  # the daemon's code, as ``-m`` will find it (not yet on the path)
    from apgas_scheduler.live import core

    _event = core.SchedulerCore.event

    def _stopping(self, kind, **fields):
        if kind == "start" and _where == "before":
            os.kill(os.getpid(), signal.SIGSTOP)
        _event(self, kind, **fields)
        if kind == "start" and _where != "before":
            os.kill(os.getpid(), signal.SIGSTOP)

    core.SchedulerCore.event = _stopping
"""


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                if name.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def cgroup_of(pid: int) -> Path | None:
    """The job's cgroup (cgroup v2) that ``pid`` is in, or None (no cgroup of a job)."""
    with open(f"/proc/{pid}/cgroup") as f:
        line = next((x for x in f if x.startswith("0::")), "0::/")
    name = line[3:].strip()
    if "/job-" not in name:
        return None
    with open("/proc/self/mounts") as f:
        mounts = [x.split()[1] for x in f if x.split()[2] == "cgroup2"]
    return next(Path(m + name) for m in mounts if Path(m + name).exists())


@pytest.mark.parametrize("where", ["before", "after", "after-adopted"])
def test_a_daemon_killed_while_it_starts_a_job_runs_its_program_once(tmp_path, monkeypatch, where):
    """Killed before the start is recorded (the job is still queued in the state),
    after it (running in the state, no go sent), or after it with the job's first
    process held until the restarted daemon has adopted it: the program never
    began before the kill, ran exactly once after the restart, and the job ends
    done with no requeue used; the first start leaves no process, cgroup or
    outcome file."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STOPPER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("APGAS_TEST_STOP_AT_START", where)
    marks = tmp_path / "marks"
    serve = Serve(tmp_path, nodes=1)
    serve.start()
    daemon = serve.proc
    assert daemon is not None
    first: list[int] = []
    try:
        from apgas_scheduler.client import request

        job = {"name": "once", "class": "rigid", "nodes": 1, "walltime": 60, "cwd": str(tmp_path),
               "command": ["/bin/sh", "-c", f"echo $$ >> {marks}; exit 0"]}
        job_id = request(serve.address, "submit", key=serve.key(), job=job)["id"]
        eventually(lambda: state_of(daemon.pid) == "T", "the daemon to stop at the job's start")
        supervisor, = children_of(daemon.pid)
        first = [supervisor, *children_of(supervisor)]  # and its child, ready for the go
        assert len(first) == 2 and not marks.exists()  # everything but the exec is done
        cgroup = cgroup_of(supervisor)
        db = tmp_path / "state" / "scheduler.db"
        starts = [e for e in read_db_events(db) if e["event"] == "start"]
        assert len(starts) == (0 if where == "before" else 1), starts
        if where == "after-adopted":
            os.kill(supervisor, signal.SIGSTOP)  # alive when the daemon comes back
        serve.kill()
        monkeypatch.delenv("APGAS_TEST_STOP_AT_START")
        if where == "after-adopted":
            assert wait_gone(first[1:], 30) == []  # the child saw no go and ended
            lines = serve.start()
            assert "1 adopted" in lines[-1], lines
            os.kill(supervisor, signal.SIGCONT)
        else:
            assert wait_gone(first, 30) == []  # no go: they end by themselves, nothing ran
            assert cgroup is None or not cgroup.exists()  # the first process removed it
            lines = serve.start()
            if where == "after":
                assert "1 queued again (never began)" in lines[-1], lines
        final = eventually(lambda: (j := next(j for j in serve.status()["jobs"] if j["id"] == job_id))
                           ["state"] not in ("queued", "running") and j, "the job to end")
        assert final["state"] == "done" and final["reason"] == "", final
        assert final["requeues"] == 0, final
        assert len(marks.read_text().split()) == 1  # its program ran once
        assert wait_gone(first, 30) == [] and (cgroup is None or not cgroup.exists())
        serve.stop()
        events = [e for e in read_db_events(db) if e.get("job") == job_id]
        kinds = [e["event"] for e in events]
        if where == "before":  # the state never knew the first start
            assert kinds == ["submit", "decision", "decision", "start", "end"], kinds
        else:
            assert kinds[:3] == ["submit", "decision", "start"], kinds
            assert kinds[-4:] == ["requeue", "decision", "start", "end"], kinds
            requeue = events[-4]
            assert requeue["reason"] == NEVER_BEGAN and requeue["count"] == 0, requeue
        assert list((tmp_path / "state" / "outcomes").iterdir()) == []
    finally:
        for pid in first:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        serve.stop()
