"""Issue 41, item 3: a job with ``requeue = N`` goes back to the queue, at most N
times, when its place 0 was lost (its program killed by a signal the scheduler did
not send: ``LOST_SIGNALS``), a node of it was marked down and it then failed, or
its owner or the operator asked (``apgas-scheduler requeue ID``). It keeps its id,
spec and output files (appended); a job that fails by itself, or one the scheduler
killed, ends as before."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eventually, wait_gone

from apgas import auth, protocol
from apgas_scheduler.__main__ import _status_table
from apgas_scheduler.client import SchedulerError, request
from apgas_scheduler.jobs import JobFileError, JobSpec, load_job_file, parse_job
from apgas_scheduler.live.processes import LOST_SIGNALS
from apgas_scheduler.live.records import Job
from apgas_scheduler.live.state import DB_NAME, StateStore
from apgas_scheduler.live.views import dashboard_model
from apgas_scheduler.metrics import compute_metrics, read_events

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = shutil.which("apgas-scheduler", path=str(Path(PY).parent)) or ""
UTS_RESULT = 66106929  # UTS geometric, depth 12 (glb.apps uts --depth 12)
SYSTEM_PY = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"


def job(name: str, command: list[str], nodes: int = 1, requeue: int = 0, walltime: float = 120,
        cwd: Path = ROOT) -> JobSpec:
    return JobSpec(name, tuple(command), "rigid", nodes, nodes, walltime, (), str(cwd),
                   requeue=requeue)


def counted(path: Path, script: str) -> list[str]:
    """A shell job that counts its runs in ``path`` (``$run``: 1, 2, ...), says so on
    its output, then runs ``script``."""
    return ["/bin/sh", "-c", f'echo x >> {path}; run=$(wc -l < {path}); echo "run $run"; {script}']


def jobs_of(sched) -> dict[int, dict]:
    return {j["id"]: j for j in sched.status()["jobs"]}


def ended(sched, jid: int, timeout: float = 60) -> dict:
    return eventually(lambda: jobs_of(sched)[jid]["state"] in ("done", "failed", "cancelled")
                      and jobs_of(sched)[jid], f"job {jid} ends", timeout)


def children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def program_of(sched, jid: int) -> int:
    """The job's program (its place 0): the one child of its first process, the
    supervisor (``job.identity["pid"]``)."""
    def found():
        identity = getattr(sched._jobs[jid], "identity", None) or {}
        kids = children(identity["pid"]) if identity.get("pid") else []
        return kids[0] if len(kids) == 1 else None
    return eventually(found, f"job {jid}'s program runs")


def events_of(tmp_path: Path, kind: str) -> list[dict]:
    return [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == kind]


# -- (a) place 0 killed: requeued, resumed from its checkpoint, exact -------------------

def test_a_checkpointing_job_whose_place_0_is_killed_is_requeued_and_ends_exact(
        make_scheduler, tmp_path):
    sched = make_scheduler(nodes=2, policy="fcfs")
    ckpt, record = tmp_path / "ckpt", tmp_path / "uts.json"
    uts = [PY, "-m", "glb.apps", "uts", "--depth", "12", "--places", "2", "--checkpoint",
           str(ckpt), "--checkpoint-interval", "0.05", "--json", str(record)]
    # the shell says each run began on the .out, then becomes the program (exec)
    command = ["/bin/sh", "-c", 'echo "run begins"; exec "$@"', "sh", *uts]
    jid = sched.submit(job("uts-ckpt", command, requeue=2))
    program = program_of(sched, jid)
    eventually(lambda: list(ckpt.glob("glb-*.snapshot")), "a snapshot is written", 90)
    first_run = [sched._jobs[jid].identity["pid"], *descendants(sched._jobs[jid].identity["pid"])]
    assert len(first_run) >= 3, first_run  # the supervisor, place 0 and place 1
    os.kill(program, signal.SIGKILL)
    eventually(lambda: jobs_of(sched)[jid]["requeues"] == 1, "the job is requeued")
    assert wait_gone(first_run, 10) == []  # nothing of the first run is left
    done = ended(sched, jid, 120)
    err = (sched.output_dir / f"job-{jid}.err").read_text()
    assert done["state"] == "done", (done, err)
    assert done["requeues"] == 1 and done["requeue"] == 2
    assert done["requeue_reason"] == "its program (place 0) was killed by signal 9 (SIGKILL)"
    result = json.loads(record.read_text())
    assert result["correct"] is True and result["result"] == UTS_RESULT
    assert result["checkpoints"]["resumed_from"] is not None, result["checkpoints"]
    out = (sched.output_dir / f"job-{jid}.out").read_text()
    assert out.count("run begins") == 2 and f"result {UTS_RESULT}" in out, out  # appended
    assert f"job {jid} starts again after requeue 1 of 2: its program (place 0) was killed " \
           "by signal 9 (SIGKILL)" in err
    (event,) = events_of(tmp_path, "requeue")
    assert (event["job"], event["count"]) == (jid, 1) and "SIGKILL" in event["reason"]
    assert [e["job"] for e in events_of(tmp_path, "start")] == [jid, jid]
    status = sched.status()
    table = _status_table({**status, "nodes": [{**n, "down": False} for n in status["nodes"]]})
    assert "1/2" in table and "last requeue: its program (place 0) was killed" in table, table
    metrics = compute_metrics(read_events(tmp_path / "events.jsonl"))
    assert metrics["requeues"] == 1 and metrics["requeued_jobs"] == 1
    assert metrics["by_state"] == {"done": 1} and metrics["max_overlap_violations"] == 0
    rows = next(s for s in dashboard_model(read_events(tmp_path / "events.jsonl"))["sections"]
                if s["id"] == "jobs")["rows"]
    assert rows[0][3] == "done" and rows[0][-2:] == [1, done["requeue_reason"]]


# -- (b), (c): failing by itself, or with no requeue allowed: ends as before -------------

def test_a_job_that_exits_1_by_itself_is_not_requeued(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=1, policy="fcfs")
    jid = sched.submit(job("fails", counted(tmp_path / "runs", "exit 1"), requeue=2))
    done = ended(sched, jid)
    assert (done["state"], done["requeues"]) == ("failed", 0), done
    assert done["reason"].startswith("exit code 1")
    assert (tmp_path / "runs").read_text() == "x\n" and events_of(tmp_path, "requeue") == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_with_requeue_0_a_killed_job_fails_as_before(make_scheduler, tmp_path, sig):
    sched = make_scheduler(nodes=1, policy="fcfs")
    jid = sched.submit(job("no-requeue", [PY, "-c", "import time; time.sleep(60)"]))
    os.kill(program_of(sched, jid), sig)
    done = ended(sched, jid)
    assert (done["state"], done["requeues"]) == ("failed", 0), done
    assert done["reason"].startswith(f"killed by signal {int(sig)} ({sig.name})"), done
    assert events_of(tmp_path, "requeue") == []


def test_a_program_s_own_fault_is_not_requeued_and_the_limit_holds(make_scheduler, tmp_path):
    """SIGSEGV and SIGABRT are the program's own; SIGKILL twice with requeue = 1: once
    back in the queue, then failed."""
    sched = make_scheduler(nodes=1, policy="fcfs")
    crash = sched.submit(job("segv", [PY, "-c", "import os, signal; os.kill(os.getpid(), "
                                           "signal.SIGSEGV)"], requeue=3))
    abort = sched.submit(job("abrt", [PY, "-c", "import os; os.abort()"], requeue=3))
    for jid in (crash, abort):
        done = ended(sched, jid)
        assert (done["state"], done["requeues"]) == ("failed", 0), done
    once = sched.submit(job("once", counted(tmp_path / "runs", "sleep 60"), requeue=1))
    os.kill(program_of(sched, once), signal.SIGKILL)
    eventually(lambda: jobs_of(sched)[once]["requeues"] == 1
               and jobs_of(sched)[once]["state"] == "running", "the job runs again")
    eventually(lambda: (tmp_path / "runs").read_text() == "x\nx\n", "its second run starts")
    os.kill(program_of(sched, once), signal.SIGKILL)
    done = ended(sched, once)
    assert (done["state"], done["requeues"]) == ("failed", 1), done
    assert done["reason"].startswith("killed by signal 9 (SIGKILL)")


def test_which_signals_count_as_a_lost_place_0(make_scheduler):
    sched = make_scheduler(nodes=1, policy="fcfs")
    assert LOST_SIGNALS == {signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                            signal.SIGPWR}
    reason = sched.processes.requeue_reason
    spec = job("x", ["true"], requeue=1)
    for sig in signal.Signals:
        if sig in (signal.SIGSTOP, signal.SIGCONT, signal.SIGCHLD):
            continue
        got = reason(Job(1, spec, 0.0), -int(sig))
        assert bool(got) == (sig in LOST_SIGNALS), (sig, got)
    assert not reason(Job(1, spec, 0.0), 1) and not reason(Job(1, spec, 0.0), 0)
    assert reason(Job(1, spec, 0.0), None, gone=True).startswith("its first process was gone")
    lost = Job(1, spec, 0.0)
    lost.lost = 1
    assert "after losing 1 place(s)" in reason(lost, 1) and not reason(lost, 0)
    killed = Job(1, spec, 0.0)
    killed.kill_reason = "killed: ran past its walltime of 1 s"  # the scheduler's own kill
    assert not reason(killed, -9) and not reason(killed, None, gone=True)
    used = Job(1, spec, 0.0)
    used.requeues = 1
    assert not reason(used, -9)
    assert not reason(Job(1, job("x", ["true"]), 0.0), -9)  # requeue = 0


def test_a_job_killed_for_its_walltime_is_never_requeued(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=1, policy="fcfs")
    jid = sched.submit(job("long", [PY, "-c", "import time; time.sleep(60)"], requeue=2,
                           walltime=1))
    done = ended(sched, jid, 30)
    assert (done["state"], done["requeues"]) == ("failed", 0), done
    assert done["reason"] == "killed: ran past its walltime of 1 s"


# -- a node marked down -------------------------------------------------------------------

def tell(sched, job_id: int, message: str, secret: str) -> None:
    """A job's signed message to the scheduler's port."""
    with socket.create_connection(sched.address, timeout=10) as conn:
        conn.sendall(auth.sign(secret, f"{message}:127.0.0.1:{job_id}").encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        conn.recv(100)


def test_a_job_that_fails_after_a_node_of_it_went_down_is_requeued(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=3, policy="fcfs")
    go = tmp_path / "go"
    script = f'if [ "$run" = 1 ]; then while [ ! -e {go} ]; do sleep 0.05; done; exit 1; fi'
    jid = sched.submit(job("losing", counted(tmp_path / "runs", script), nodes=2, requeue=1))
    eventually(lambda: jobs_of(sched)[jid]["state"] == "running", "the job runs")
    lost = jobs_of(sched)[jid]["nodes"][1]
    tell(sched, jid, protocol.place_lost(lost), sched._jobs[jid].secret)
    go.touch()
    done = ended(sched, jid)
    assert (done["state"], done["requeues"]) == ("done", 1), done
    assert done["requeue_reason"] == "it failed (exit code 1) after losing 1 place(s) on nodes now down"
    down = [n["name"] for n in request(sched.address, "status")["nodes"] if n["down"]]
    assert down == [lost]
    starts = events_of(tmp_path, "start")
    assert len(starts) == 2 and lost not in starts[1]["nodes"]  # the second run: healthy nodes


# -- (d) the operator's and the owner's requeue ------------------------------------------

def cli(sched, *args: str) -> subprocess.CompletedProcess:
    """``apgas-scheduler ARGS --to THE_SCHEDULER`` (signed with the operator's key)."""
    to = "{}:{}".format(*sched.address)
    command = [CLI] if CLI else [PY, "-m", "apgas_scheduler"]
    return subprocess.run([*command, args[0], "--to", to, *args[1:]], capture_output=True,
                          text=True, cwd=ROOT, timeout=30)


def test_the_operator_requeues_a_running_job(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=1, policy="fcfs")
    runs = tmp_path / "runs"
    jid = sched.submit(job("long", counted(runs, 'if [ "$run" = 1 ]; then sleep 60; fi'),
                           requeue=1))
    queued = sched.submit(job("later", ["true"], requeue=1))
    program = program_of(sched, jid)
    said = cli(sched, "requeue", str(queued))
    assert said.returncode == 1 and f"error: job {queued} is not running (queued)" in said.stderr
    said = cli(sched, "requeue", str(jid))
    assert said.returncode == 0 and said.stdout.strip() == "requeueing", said
    assert wait_gone([program], 10) == []
    done = ended(sched, jid)
    assert (done["state"], done["requeues"]) == ("done", 1), done
    assert done["requeue_reason"] == f"requeued by {pwd.getpwuid(os.getuid()).pw_name}"
    assert (sched.output_dir / f"job-{jid}.out").read_text() == "run 1\nrun 2\n"  # appended
    said = cli(sched, "requeue", str(jid))  # done: nothing to requeue
    assert said.returncode == 1 and "has ended done" in said.stderr
    assert ended(sched, queued)["state"] == "done"
    said = cli(sched, "requeue", "99")
    assert said.returncode == 1 and "no job with id 99" in said.stderr
    text = cli(sched, "status")
    assert text.returncode == 0 and "1/1" in text.stdout, text.stdout
    status = json.loads(cli(sched, "status", "--json").stdout)
    mine = next(j for j in status["jobs"] if j["id"] == jid)
    assert (mine["requeues"], mine["requeue"]) == (1, 1)
    (asked,) = events_of(tmp_path, "requeue_asked")
    assert asked["job"] == jid


def test_a_requeue_beyond_the_limit_or_of_a_job_without_one_is_refused(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=2, policy="fcfs")
    plain = sched.submit(job("plain", [PY, "-c", "import time; time.sleep(60)"]))
    program_of(sched, plain)
    with pytest.raises(SchedulerError, match=rf"job {plain} may go back to the queue 0 time\(s\) "
                                             r"\(requeue = 0 in its job file\) and has none"):
        request(sched.address, "requeue", id=plain)
    assert jobs_of(sched)[plain]["state"] == "running"  # nothing changed
    for bad in ("7", None, True, 1.5):
        with pytest.raises(SchedulerError, match="requeue needs a job id"):
            request(sched.address, "requeue", id=bad)
    sched.cancel(plain)
    assert ended(sched, plain)["state"] == "cancelled"


def test_an_ended_job_that_failed_is_requeued_at_once_and_the_count_survives_a_restart(
        make_scheduler, tmp_path):
    state, output = tmp_path / "state", tmp_path / "jobs"
    sched = make_scheduler(nodes=1, policy="fcfs", state_dir=state, output_dir=output)
    jid = sched.submit(job("flaky", counted(tmp_path / "runs", '[ "$run" = 2 ]'), requeue=1))
    assert ended(sched, jid)["state"] == "failed"
    assert request(sched.address, "requeue", id=jid)["state"] == "queued"
    done = ended(sched, jid)
    assert (done["state"], done["requeues"]) == ("done", 1), done
    with pytest.raises(SchedulerError, match="has ended done"):
        request(sched.address, "requeue", id=jid)
    sched.shutdown()
    for t in list(sched._threads):
        t.join(10)
    again = make_scheduler(nodes=1, policy="fcfs", state_dir=state, output_dir=output)
    after = jobs_of(again)[jid]
    assert (after["state"], after["requeues"], after["requeue"]) == ("done", 1, 1)
    assert after["requeue_reason"].startswith("requeued by ")
    metrics = compute_metrics(read_events(state))
    assert metrics["requeues"] == 1 and metrics["by_state"] == {"done": 1}


def as_nobody(unix_path: Path, req: dict) -> dict:
    """A request over the Unix socket as the user nobody (the system's Python)."""
    code = ("import json, socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode() + b'\\n')\n"
            "print(s.makefile().readline())\n")
    out = subprocess.run([SYSTEM_PY, "-c", code, str(unix_path), json.dumps(req)], user="nobody",
                         capture_output=True, text=True, timeout=30, cwd="/")
    return json.loads(out.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the other user's requests come "
                                               "from the user nobody to a root scheduler")
def test_another_user_requeues_only_their_own_jobs(make_scheduler, shared_dir):
    sched = make_scheduler(nodes=2, policy="fcfs", socket_mode=0o666)
    mine = sched.submit(job("root's", [PY, "-c", "import time; time.sleep(60)"], requeue=1))
    program_of(sched, mine)
    refused = as_nobody(sched.socket_path, {"op": "requeue", "id": mine})
    assert not refused["ok"] and refused["error"] == ("not allowed: nobody may requeue only "
                                                     "their own jobs; this one is root's"), refused
    assert jobs_of(sched)[mine]["requeues"] == 0
    runs = shared_dir / "runs"
    theirs = {"name": "nobody's", "class": "rigid", "nodes": 1, "walltime": 60, "requeue": 1,
              "cwd": str(shared_dir), "command": counted(runs, 'if [ "$run" = 1 ]; then sleep 60; fi')}
    reply = as_nobody(sched.socket_path, {"op": "submit", "job": theirs})
    assert reply["ok"], reply
    eventually(lambda: runs.exists(), "nobody's job runs")
    assert as_nobody(sched.socket_path, {"op": "requeue", "id": reply["id"]}) == \
        {"ok": True, "state": "requeueing"}
    done = ended(sched, reply["id"])
    assert (done["state"], done["requeues"]) == ("done", 1), done
    assert done["requeue_reason"] == "requeued by nobody"
    out = sched.output_dir / f"job-{reply['id']}.out"
    assert out.read_text() == "run 1\nrun 2\n" and out.stat().st_uid == done["owner"]  # theirs still
    sched.cancel(mine)


# -- (e) the key ---------------------------------------------------------------------------

BASE = {"name": "j", "command": "true", "class": "rigid", "nodes": 1, "walltime": 5}


@pytest.mark.parametrize("value", [-1, 101, 1.5, True, "2", [1], 10**30])
def test_bad_requeue_values_are_refused_with_the_key_and_the_range(value):
    with pytest.raises(JobFileError, match=r"job: key 'requeue': must be a whole number from 0 to "
                                           r"100 \(how many times the job may go back to the "
                                           r"queue\), got "):
        parse_job({**BASE, "requeue": value})


def test_the_requeue_key_from_a_file_over_the_wire_and_back(tmp_path, make_scheduler):
    path = tmp_path / "j.toml"
    path.write_text('name = "j"\ncommand = "true"\nclass = "rigid"\nnodes = 1\nwalltime = 5\n'
                    'requeue = 3\n')
    spec = load_job_file(path)
    assert spec.requeue == 3 and spec.to_dict()["requeue"] == 3
    assert parse_job(spec.to_dict()) == spec
    assert "requeue" not in parse_job(BASE).to_dict() and parse_job(BASE).requeue == 0
    path.write_text(path.read_text().replace("requeue = 3", "requeue = 500"))
    with pytest.raises(JobFileError, match=f"{path}: key 'requeue': must be a whole number"):
        load_job_file(path)
    sched = make_scheduler(nodes=1, policy="fcfs")
    with pytest.raises(SchedulerError, match="key 'requeue': must be a whole number from 0 to 100"):
        request(sched.address, "submit", job={**BASE, "requeue": -3})
    assert sched.status()["jobs"] == []
    jid = request(sched.address, "submit", job={**BASE, "requeue": 4})["id"]
    assert jobs_of(sched)[jid]["requeue"] == 4


# -- older states --------------------------------------------------------------------------

def test_a_state_written_without_requeues_loads(tmp_path):
    """A schema-2 state (no requeue columns) whose job specs have no requeue key: taken
    up with requeue = 0 and no requeues, and written on as schema 3."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / DB_NAME)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE nodes (position INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY, spec TEXT NOT NULL, owner INTEGER NOT NULL, secret TEXT NOT NULL,
            state TEXT NOT NULL, submit REAL NOT NULL, start REAL, end_time REAL, reason TEXT NOT NULL,
            nodes TEXT NOT NULL, listen TEXT, reports TEXT NOT NULL, ready INTEGER NOT NULL,
            disabled INTEGER NOT NULL, grows INTEGER NOT NULL, shrinks INTEGER NOT NULL,
            identity TEXT, request TEXT);
        CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '2'), ('started', '0.0');
    """)
    spec = {**BASE, "walltime": 5.0, "env": {}, "cwd": "", "protocol": "signed"}
    for jid, status in ((1, "done"), (2, "queued")):
        db.execute("INSERT INTO jobs VALUES (?, ?, 0, 's', ?, 0, NULL, NULL, '', '[]', NULL, '', "
                   "0, 0, 0, 0, NULL, 'key-12345678')", (jid, json.dumps(spec), status))
    db.commit()
    db.close()
    (state / DB_NAME).chmod(0o600)
    store = StateStore(state)
    try:
        done, queued = store.jobs()
        assert (done.state, done.spec.requeue, done.requeues, done.requeue_reason) == \
            ("done", 0, 0, "")
        assert queued.request == "key-12345678"
        job_ = Job(2, queued.spec, 0.0)
        job_.requeues, job_.requeue_reason = 1, "asked"
        store.record({"t": 1.0, "event": "requeue", "job": 2}, job=job_)
        assert [(j.id, j.requeues, j.requeue_reason) for j in store.jobs()] == \
            [(1, 0, ""), (2, 1, "asked")]
    finally:
        store.close()
    again = StateStore(state)  # schema 3 now: opened as it is
    try:
        assert [j.requeues for j in again.jobs()] == [0, 1]
    finally:
        again.close()


def test_metrics_and_the_dashboard_take_a_log_with_requeues():
    events = [{"t": 0, "event": "pool", "nodes": ["a", "b"]},
              {"t": 0, "event": "submit", "job": 1, "name": "j", "class": "rigid"},
              {"t": 1, "event": "start", "job": 1, "nodes": ["a", "b"]},
              {"t": 3, "event": "requeue", "job": 1, "reason": "lost", "count": 1},
              {"t": 4, "event": "start", "job": 1, "nodes": ["b"]},
              {"t": 6, "event": "end", "job": 1, "state": "failed", "reason": "exit code 1"},
              {"t": 7, "event": "requeue", "job": 1, "reason": "requeued by root", "count": 2},
              {"t": 8, "event": "start", "job": 1, "nodes": ["a"]},
              {"t": 9, "event": "end", "job": 1, "state": "done", "reason": ""}]
    m = compute_metrics(events)
    assert (m["requeues"], m["requeued_jobs"], m["by_state"], m["jobs"]) == (2, 1, {"done": 1}, 1)
    assert m["mean_wait"] == 1 and m["mean_turnaround"] == 9 and m["max_overlap_violations"] == 0
    model = dashboard_model(events[:4])
    rows = next(s for s in model["sections"] if s["id"] == "jobs")["rows"]
    assert rows[0][3] == "queued" and rows[0][4] == 0 and rows[0][-2:] == [1, "lost"]
    queue = next(s for s in model["sections"] if s["id"] == "utilization")["series"][2]
    assert queue["points"][-1] == [3.0, 1]  # waiting again
