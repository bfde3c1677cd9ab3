"""A restarted scheduler's pool is the nodes asked now (a node no longer asked
leaves, or drains while an adopted job runs on it), and each state has its own
output directory (issue 45). Real daemons, as in test_scheduler_restart."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, eventually
from test_scheduler_restart import Daemon as RestartDaemon

from apgas.serving import UntrustedPath
from apgas_scheduler.client import SchedulerError
from apgas_scheduler.live.state import OUTPUT_MARKER, OutputDirInUse, claim_output_dir

pytestmark = pytest.mark.timeout(120)


class Daemon(RestartDaemon):
    """``python -m apgas_scheduler serve`` in a process of its own; ``output``
    None: no ``--output-dir``. ``resumed``: the line it printed about the state
    it took up ("" if none)."""

    def __init__(self, tmp: Path, nodes: str, state: str = "state", output: str | None = "out",
                 name: str = "s") -> None:
        super().__init__(tmp, nodes)
        self.state, self.output, self.name = state, output, name
        self.resumed = ""

    def argv(self) -> list[str]:
        out = ["--output-dir", str(self.tmp / self.output)] if self.output else []
        return [sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", self.nodes,
                "--port", str(self.port), "--policy", "fcfs", "--interval", "0.2", *out,
                "--state-dir", str(self.tmp / self.state),
                "--socket", str(self.tmp / f"{self.name}.sock")]

    def start(self) -> Daemon:
        earlier = (self.tmp / self.state / "scheduler.db").exists()  # it says what it resumed
        self.proc = subprocess.Popen(self.argv(), env={**os.environ, "APGAS_LOCAL_HOSTS": "*"},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "listening" in self.proc.stdout.readline()
        self.resumed = self.proc.stdout.readline().strip() if earlier else ""
        return self

    def nodes_view(self) -> dict[str, dict]:
        return {n["name"]: n for n in self.request("status")["nodes"]}


def stored_pool(state: Path) -> list[str]:
    db = sqlite3.connect(f"file:{state / 'scheduler.db'}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT name FROM nodes ORDER BY position")]
    finally:
        db.close()


def stored_events(state: Path) -> list[dict]:
    from apgas_scheduler.live.state import read_db_events

    return read_db_events(state / "scheduler.db")


def sleeper(tmp: Path, name: str, seconds: float | None, nodes: int = 1) -> dict:
    """None: it runs until the file ``<name>.go`` exists (it outlasts a restart however slow)."""
    mark = tmp / name
    wait = f"sleep {seconds}" if seconds is not None else f"while [ ! -e {mark}.go ]; do sleep 0.05; done"
    return {"name": name, "class": "rigid", "nodes": nodes, "walltime": 60, "cwd": str(tmp),
            "command": ["/bin/sh", "-c", f"echo $$ > {mark}.pid; {wait}; touch {mark}.done"]}


@pytest.fixture
def daemons():
    """Daemons to start; every one still running is shut down at the end."""
    made: list[Daemon] = []
    yield made
    for d in made:
        d.stop()


def test_a_restart_on_other_nodes_takes_only_those(tmp_path, daemons):
    first = Daemon(tmp_path, "a[0-1]").start()
    daemons.append(first)
    job = first.request("submit", job=sleeper(tmp_path, "one", 0.1))["id"]
    eventually(lambda: first.jobs()[job]["state"] == "done", "the first job")
    first.stop()
    second = Daemon(tmp_path, "b[0-1]").start()
    daemons.append(second)
    assert second.resumed == (
        f"resumed the state in {tmp_path / 'state'}: 1 job(s) (1 ended); pool b[0-1] as asked, "
        "2 node(s) (all new); a[0-1] left (not asked now); a different --state-dir starts afresh")
    assert list(second.nodes_view()) == ["b0", "b1"]
    assert stored_pool(tmp_path / "state") == ["b0", "b1"]
    two = second.request("submit", job=sleeper(tmp_path, "two", 0.1, nodes=2))["id"]
    jobs = eventually(lambda: (j := second.jobs())[two]["state"] == "done" and j, "the 2-node job")
    assert jobs[two]["nodes"] == [] or set(jobs[two]["nodes"]) <= {"b0", "b1"}
    starts = [e for e in stored_events(tmp_path / "state") if e["event"] == "start"]
    assert starts[-1]["job"] == two and starts[-1]["nodes"] == ["b0", "b1"]


def test_a_node_an_adopted_job_runs_on_drains_then_leaves(tmp_path, daemons):
    """The job keeps it and ends fine; no other job gets it meanwhile; then it leaves
    the pool, in the state too: a third start does not see it."""
    first = Daemon(tmp_path, "a[0-1]").start()
    daemons.append(first)
    long = first.request("submit", job=sleeper(tmp_path, "long", None))["id"]
    pid = int(eventually(lambda: (tmp_path / "long.pid").exists()
                         and (tmp_path / "long.pid").read_text(), "the long job's pid"))
    assert first.jobs()[long]["nodes"] == ["a0"]
    first.kill()
    second = Daemon(tmp_path, "a1,b0").start()
    daemons.append(second)
    assert second.resumed.endswith(
        "pool a1,b0 as asked, 2 node(s) (b0 new); a0 drains (job 1 runs on it, not asked now: "
        "it leaves the pool when the job gives it back); a different --state-dir starts afresh")
    view = second.nodes_view()
    assert view["a0"] == {"name": "a0", "job": long, "draining": True, "down": False}
    assert "draining" not in view["a1"] and "draining" not in view["b0"]
    others = [second.request("submit", job=sleeper(tmp_path, f"o{i}", 0.3, nodes=n))["id"]
              for i, n in ((1, 2), (2, 1), (3, 1))]
    eventually(lambda: all((j := second.jobs())[o]["state"] == "done" for o in others) and j,
               "the other jobs")
    assert second.jobs()[long]["state"] == "running" and alive(pid)  # they ran meanwhile
    (tmp_path / "long.go").touch()
    eventually(lambda: second.jobs()[long]["state"] == "done", "the long job to end")
    assert (tmp_path / "long.done").exists()
    eventually(lambda: "a0" not in second.nodes_view(), "a0 to leave the pool")
    assert stored_pool(tmp_path / "state") == ["a1", "b0"]
    events = stored_events(tmp_path / "state")
    assert not [e for e in events if e["event"] in ("start", "grow", "reserve")
                and e.get("job") != long and "a0" in e["nodes"]]
    assert [e for e in events if e["event"] == "pool" and e.get("left") == ["a0"]]
    second.stop()
    third = Daemon(tmp_path, "a1,b0").start()
    daemons.append(third)
    assert "a0" not in third.resumed and "(none new)" in third.resumed
    assert list(third.nodes_view()) == ["a1", "b0"]


def test_a_draining_node_added_again_stays(tmp_path, daemons):
    first = Daemon(tmp_path, "a[0-1]").start()
    daemons.append(first)
    long = first.request("submit", job=sleeper(tmp_path, "long", None))["id"]
    eventually(lambda: (tmp_path / "long.pid").exists(), "the long job to start")
    first.kill()
    second = Daemon(tmp_path, "a1").start()
    daemons.append(second)
    assert second.nodes_view()["a0"].get("draining")
    with pytest.raises(SchedulerError, match="needs at least 2 node"):  # a0 is no capacity now
        second.request("submit", job=sleeper(tmp_path, "two", 0.1, nodes=2))
    assert second.request("add-nodes", nodes=["a0"])["nodes"] == ["a1", "a0"]
    assert "draining" not in second.nodes_view()["a0"]
    two = second.request("submit", job=sleeper(tmp_path, "two", 0.1, nodes=2))["id"]
    (tmp_path / "long.go").touch()
    eventually(lambda: second.jobs()[long]["state"] == "done", "the long job to end")
    eventually(lambda: second.jobs()[two]["state"] == "done", "the 2-node job, on a0 too")
    assert stored_pool(tmp_path / "state") == ["a1", "a0"]


def test_each_state_has_its_own_output_directory(tmp_path, daemons):
    """Two schedulers, each with its own --state-dir and no --output-dir, at once:
    each job-1.out is its own; an output directory another state marked is refused,
    with one clear line, and that state's files stay as they were."""
    one = Daemon(tmp_path, "n0", state="s1", output=None, name="one").start()
    two = Daemon(tmp_path, "n0", state="s2", output=None, name="two").start()
    daemons.extend([one, two])
    for d, text in ((one, "first"), (two, "second")):
        job = {"name": text, "class": "rigid", "nodes": 1, "walltime": 60, "cwd": str(tmp_path),
               "command": ["/bin/sh", "-c", f"echo {text}"]}
        assert d.request("submit", job=job)["id"] == 1
    for d in (one, two):
        eventually(lambda d=d: d.jobs()[1]["state"] == "done", "the job")
    assert (tmp_path / "s1.jobs" / "job-1.out").read_text() == "first\n"
    assert (tmp_path / "s2.jobs" / "job-1.out").read_text() == "second\n"
    assert oct((tmp_path / "s1.jobs").stat().st_mode & 0o777) == "0o711"
    assert (tmp_path / "s1.jobs" / OUTPUT_MARKER).read_text() == f"{tmp_path / 's1'}\n"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "s1.jobs").iterdir()}
    third = Daemon(tmp_path, "n0", state="s3", output="s1.jobs", name="three")
    out = subprocess.run(third.argv(), env={**os.environ, "APGAS_LOCAL_HOSTS": "*"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"error: the output directory {tmp_path / 's1.jobs'} holds the job output of the "
        f"scheduler whose state is '{tmp_path / 's1'}' ({tmp_path / 's1.jobs' / OUTPUT_MARKER} "
        f"says so), not of this state '{tmp_path / 's3'}': give this scheduler an output "
        "directory of its own (--output-dir) or serve it on that state (--state-dir)\n")
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "s1.jobs").iterdir()}
    assert after == before and one.request("status")["ok"]
    one.stop()  # not running: still refused
    again = subprocess.run(third.argv(), env={**os.environ, "APGAS_LOCAL_HOSTS": "*"},
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "s1.jobs holds the job output" in again.stderr


def test_an_output_directory_serves_one_state(tmp_path):
    """Claimed at first use (an older one without a marker too), kept by its state,
    refused to another; a marker that is a link is refused."""
    out = tmp_path / "out"
    out.mkdir(mode=0o711)
    (out / "job-1.out").write_text("an older scheduler's\n")
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        claim_output_dir(fd, out, tmp_path / "a")
        claim_output_dir(fd, out, tmp_path / "a")  # its own again
        with pytest.raises(OutputDirInUse, match=f"output directory {out} holds .* state is "
                                                 f"'{tmp_path / 'a'}'.* not of this state "
                                                 f"'{tmp_path / 'b'}'"):
            claim_output_dir(fd, out, tmp_path / "b")
        assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "job-1.out"]
        os.unlink(out / OUTPUT_MARKER)
        os.symlink(tmp_path / "elsewhere", out / OUTPUT_MARKER)
        with pytest.raises(UntrustedPath, match="marker"):
            claim_output_dir(fd, out, tmp_path / "a")
    finally:
        os.close(fd)


def test_in_process_a_refused_output_directory_leaves_nothing_open(tmp_path, monkeypatch):
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    sched = Scheduler(["n0"], get_policy("fcfs"), port=0, state_dir=tmp_path / "a")
    assert sched.output_dir == tmp_path / "a.jobs"
    try:
        with pytest.raises(OutputDirInUse, match="a.jobs holds the job output"):
            Scheduler(["n0"], get_policy("fcfs"), port=0, state_dir=tmp_path / "b",
                      output_dir=tmp_path / "a.jobs")
        # b's state lock was let go: b can be served (with its own output)
        Scheduler(["n0"], get_policy("fcfs"), port=0, state_dir=tmp_path / "b")._finish()
    finally:
        sched._finish()
