"""A scheduler that dies (SIGKILL) and is started again on its state resumes: jobs
are known, queued ones stay queued, a running one is adopted, ids are not reused,
no node is held twice, nothing is left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, eventually
from orders import free_port

from apgas_scheduler.client import request
from apgas_scheduler.metrics import compute_metrics, read_events

pytestmark = pytest.mark.timeout(120)


class Daemon:
    """``python -m apgas_scheduler serve`` on one node, in a process of its own."""

    def __init__(self, tmp: Path, nodes: str = "node0", policy: str = "fcfs") -> None:
        self.tmp, self.nodes, self.policy = tmp, nodes, policy
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = ""

    def start(self) -> Daemon:
        env = {**os.environ, "APGAS_LOCAL_HOSTS": "*"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", self.nodes, "--port",
             str(self.port), "--policy", self.policy, "--interval", "0.2", "--resize-interval",
             "0.5", "--output-dir",
             str(self.tmp / "out"), "--state-dir", str(self.tmp / "state"),
             "--socket", str(self.tmp / "s.sock")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "listening" in self.proc.stdout.readline()
        return self

    def request(self, op: str, **fields):
        return request(("127.0.0.1", self.port), op, **fields)

    def jobs(self) -> dict[int, dict]:
        return {j["id"]: j for j in self.request("status")["jobs"]}

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> None:
        """Shut it down; what it logged is then ``self.log``."""
        if self.proc and self.proc.poll() is None:
            self.request("shutdown")
            self.proc.wait(30)
        if self.proc and not self.proc.stderr.closed:
            self.log = self.proc.stderr.read()
        self._close()

    def _close(self) -> None:
        """Close our ends of its pipes."""
        if self.proc:
            self.proc.stdout.close()
            self.proc.stderr.close()


def sleeper(tmp: Path, name: str, seconds: float | None) -> dict:
    """A rigid job that writes its pid, sleeps (None: until the file ``<name>.go``
    exists, so that it outlasts a restart however slow), then writes when it ended."""
    mark = tmp / name
    wait = f"sleep {seconds}" if seconds is not None else f"while [ ! -e {mark}.go ]; do sleep 0.05; done"
    return {"name": name, "class": "rigid", "nodes": 1, "walltime": 60, "cwd": str(tmp),
            "command": ["/bin/sh", "-c", f"echo $$ > {mark}.pid; {wait}; touch {mark}.done"]}


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()
    for mark in tmp_path.glob("*.pid"):  # a test that failed midway leaves no job behind
        (tmp_path / f"{mark.stem}.go").touch()
        with contextlib.suppress(ValueError, OSError):
            pid = int(mark.read_text())
            if str(mark) in Path(f"/proc/{pid}/cmdline").read_text():  # still that job's shell
                os.kill(pid, signal.SIGKILL)


def test_a_killed_scheduler_resumes_its_jobs(daemon, tmp_path):
    daemon.start()
    first = daemon.request("submit", job=sleeper(tmp_path, "first", None))["id"]
    second = daemon.request("submit", job=sleeper(tmp_path, "second", 0.5))["id"]
    eventually(lambda: daemon.jobs()[first]["state"] == "running", "the first job to run")
    assert daemon.jobs()[second]["state"] == "queued"
    pid = int(eventually(lambda: (tmp_path / "first.pid").exists() and (tmp_path / "first.pid").read_text(),
                   "the first job's pid"))
    daemon.kill()
    assert alive(pid)  # the job outlives the daemon...
    daemon.start()     # ...and the new daemon takes it up
    jobs = daemon.jobs()
    assert jobs[first]["state"] == "running" and jobs[first]["nodes"] == ["node0"]
    assert jobs[second]["state"] == "queued"
    third = daemon.request("submit", job=sleeper(tmp_path, "third", 0.1))["id"]
    assert third == second + 1  # ids are not reused
    (tmp_path / "first.go").touch()
    eventually(lambda: all(j["state"] == "done" for j in daemon.jobs().values()), "every job to end")
    assert (tmp_path / "first.done").exists() and (tmp_path / "second.done").exists()
    assert not alive(pid)
    metrics = compute_metrics(read_events(tmp_path / "state"))
    assert metrics["max_overlap_violations"] == 0
    starts = [e["job"] for e in read_events(tmp_path / "state") if e["event"] == "start"]
    assert starts == [first, second, third]  # the second started once, after the first


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("supervisor", ["records", "killed too"])
def test_a_job_gone_while_the_scheduler_was_down_frees_its_node(daemon, tmp_path, supervisor):
    """Its program killed while the scheduler was down: failed, with the signal its
    supervisor recorded; with the supervisor killed too, nothing says how it
    ended: failed, "exit status unknown". Either way the second job gets the node."""
    daemon.start()
    first = daemon.request("submit", job=sleeper(tmp_path, "first", 30))["id"]
    second = daemon.request("submit", job=sleeper(tmp_path, "second", 0.1))["id"]
    pid = int(eventually(lambda: (tmp_path / "first.pid").exists() and (tmp_path / "first.pid").read_text(),
                   "the first job's pid"))
    leader = parent_of(pid)
    daemon.kill()
    if supervisor == "killed too":
        os.kill(leader, signal.SIGKILL)
        eventually(lambda: not alive(leader), "the supervisor to die")
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: not alive(pid) and not alive(leader), "the first job to die")
    daemon.start()
    jobs = eventually(lambda: (j := daemon.jobs())[second]["state"] == "done" and j, "the second job")
    assert jobs[first]["state"] == "failed"
    if supervisor == "records":
        assert jobs[first]["reason"].startswith("killed by signal 9 (SIGKILL)")
        assert jobs[first]["reason"].endswith("it ended while the scheduler was down")
    else:
        assert "restarted" in jobs[first]["reason"] and "unknown" in jobs[first]["reason"]
    assert list((tmp_path / "state" / "outcomes").iterdir()) == []


def test_a_second_scheduler_on_the_same_state_is_refused(daemon, tmp_path):
    daemon.start()
    other = subprocess.run([sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", "n0",
                            "--port", "0", "--state-dir", str(tmp_path / "state"),
                            "--output-dir", str(tmp_path / "out2"), "--socket",
                            str(tmp_path / "s2.sock")],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "another scheduler uses the state directory" in other.stderr
    assert daemon.request("status")["ok"]


def test_report_reads_the_database(daemon, tmp_path):
    daemon.start()
    jid = daemon.request("submit", job=sleeper(tmp_path, "one", 0.1))["id"]
    eventually(lambda: daemon.jobs()[jid]["state"] == "done", "the job to end")
    out = subprocess.run([sys.executable, "-m", "apgas_scheduler", "report", str(tmp_path / "state"),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["jobs"] == 1


def test_an_adopted_malleable_job_takes_orders_again(tmp_path):
    """Its key and order address (the port its signed ready line named) survive the
    restart: the new scheduler shrinks it for a rigid job."""
    daemon = Daemon(tmp_path, nodes="node[0-2]", policy="malleable").start()
    try:
        root = Path(__file__).resolve().parent.parent
        m = daemon.request("submit", job={
            "name": "m", "class": "malleable", "min_nodes": 1, "max_nodes": 3, "walltime": 60,
            "cwd": str(root), "command": ["python", "examples/malleable_hello.py", "--seconds", "40"]})["id"]
        eventually(lambda: len(daemon.jobs()[m]["nodes"]) == 3, "the malleable job to grow onto every node")
        listen = daemon.jobs()[m]["listen"]
        daemon.kill()
        daemon.start()
        assert daemon.jobs()[m]["state"] == "running" and len(daemon.jobs()[m]["nodes"]) == 3
        assert daemon.jobs()[m]["listen"] == listen and listen.startswith("127.0.0.1:")
        r = daemon.request("submit", job=sleeper(tmp_path, "rigid", 0.2) | {"nodes": 2})["id"]
        jobs = eventually(lambda: (j := daemon.jobs())[r]["state"] == "done" and j, "the rigid job", 60)
        assert jobs[m]["shrinks"] >= 1 and jobs[m]["state"] == "running"
        daemon.request("cancel", id=m)
        eventually(lambda: daemon.jobs()[m]["state"] == "cancelled", "the cancel")
    finally:
        daemon.stop()
