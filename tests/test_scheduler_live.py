"""The live scheduler with real jobs: GLB programs, a foreign job, failures."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orders import free_port

from apgas import auth
from apgas_scheduler.client import SchedulerError, request
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live import access
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.metrics import compute_metrics, read_events
from apgas_scheduler.policies import get_policy

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def job(name: str, command: list[str], cls: str = "rigid", nodes: int = 1, max_nodes: int = 0,
        walltime: float = 60, **env: str) -> JobSpec:
    return JobSpec(name, tuple(command), cls, nodes, max_nodes or nodes, walltime,
                   tuple(sorted(env.items())), str(ROOT))


def wait_ended(sched: Scheduler, ids: list[int], timeout: float = 90) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in sched.status()["jobs"]}
        if all(jobs[i]["state"] in ("done", "failed", "cancelled") for i in ids):
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"jobs not ended in time: {sched.status()['jobs']}")


def bench(app: str, out: Path, *args: str) -> list[str]:
    return [PY, "-m", "glb.apps", app, *args, "--json", str(out)]


def wait_for(sched: Scheduler, what: str, check, timeout: float = 30) -> dict[int, dict]:
    """Poll the status until ``check(jobs by id)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in sched.status()["jobs"]}
        if check(jobs):
            return jobs
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout} s: {what}: {sched.status()['jobs']}")


def test_six_real_jobs_two_malleable_resized(make_scheduler, tmp_path):
    """Each malleable job is grown and then shrunk, by construction: the two start
    together on 4 nodes at their minimum of 1 with a maximum of 2, so that the 2
    idle nodes (nobody waits) go one to each, whichever registers first; then a
    rigid job of 2 makes minAgree take one node back from each (both hold 2)."""
    sched = make_scheduler(nodes=4, policy="malleable")
    out = tmp_path / "results"
    ids = [sched.submit(job("uts-m", bench("uts", out / "1.json", "--depth", "13", "--malleable"),
                            "malleable", 1, 2, APGAS_THREADS="2")),
           sched.submit(job("nq-m", bench("nqueens", out / "2.json", "-n", "16", "--malleable"),
                            "malleable", 1, 2))]
    wait_for(sched, "both malleable jobs grown to 2 nodes",
             lambda jobs: all(len(jobs[i]["nodes"]) == 2 and jobs[i]["grows"] for i in ids))
    ids.append(sched.submit(job("pi", bench("pi", out / "3.json", "--samples", "200000000"),
                                "rigid", 2)))
    wait_for(sched, "both malleable jobs shrunk for the rigid job",
             lambda jobs: all(jobs[i]["shrinks"] for i in ids[:2]))
    ids.append(sched.submit(job("bc", bench("bc", out / "4.json", "--scale", "9"), "moldable", 1, 2)))
    ids.append(sched.submit(job("uts", bench("uts", out / "5.json", "--depth", "10"), "rigid", 1)))
    ids.append(sched.submit(job("pi2", bench("pi", out / "6.json", "--samples", "10000000"), "rigid", 3)))
    jobs = wait_ended(sched, ids, timeout=100)
    assert [jobs[i]["state"] for i in ids] == ["done"] * 6, jobs
    for i in range(1, 7):
        record = json.loads((out / f"{i}.json").read_text())
        assert record["correct"] is True, record
    for i in ids[:2]:  # each of the two malleable jobs: at least one grow and one shrink
        assert jobs[i]["class"] == "malleable" and jobs[i]["grows"] >= 1 and jobs[i]["shrinks"] >= 1, \
            jobs[i]
    assert all(n["job"] is None for n in sched.status()["nodes"])
    metrics = compute_metrics(read_events(tmp_path / "events.jsonl"))
    assert metrics["max_overlap_violations"] == 0
    assert metrics["by_state"] == {"done": 6}


@pytest.mark.parametrize("protocol", ["signed", "plain"])
def test_foreign_job_is_grown_and_shrunk(make_scheduler, tmp_path, protocol):
    """A job written without apgas, signing its lines, or speaking them plain as
    Java's jobs do (the scheduler then needs --allow-plain-jobs)."""
    sched = make_scheduler(nodes=3, policy="malleable", allow_plain_jobs=protocol == "plain")
    log = tmp_path / "foreign.jsonl"
    spec = job("foreign", [PY, str(ROOT / "tests" / "foreign_job.py")], "malleable", 1, 3,
               FOREIGN_LOG=str(log), FOREIGN_UNTIL="shrink", FOREIGN_SECONDS="45")
    first = sched.submit(dataclasses.replace(spec, protocol=protocol))
    wait_for(sched, "the foreign job registers and gets the two idle nodes",
             lambda jobs: len(jobs[first]["nodes"]) == 3)
    second = sched.submit(job("rigid", [PY, "-c", "import time; time.sleep(0.5)"], "rigid", 2))
    jobs = wait_ended(sched, [first, second], timeout=60)
    assert jobs[first]["state"] == "done" and jobs[second]["state"] == "done", jobs
    held = [json.loads(line) for line in log.read_text().splitlines()]
    assert held[0] == {"order": "start", "hosts": ["node0"]}
    assert held[1]["order"].startswith("grow 2") and len(held[1]["hosts"]) == 3
    assert any(h["order"].startswith("shrink") for h in held), held
    assert all(n["job"] is None for n in sched.status()["nodes"])
    assert compute_metrics(read_events(tmp_path / "events.jsonl"))["max_overlap_violations"] == 0


@pytest.mark.parametrize("spec, reason", [
    (job("crash", [PY, "-c", "import sys; sys.exit(3)"]), "exit code 3"),
    (job("silent", [PY, "-c", "import time; time.sleep(30)"], "malleable", 1, 2),
     "killed: never sent APGAS-Ready within 1 s"),
    (job("long", [PY, "-c", "import time; time.sleep(30)"], walltime=1),
     "killed: ran past its walltime of 1 s"),
    (job("missing", ["/no/such/program"]), "could not start '/no/such/program' on node0"),
])
def test_failing_jobs_are_marked_with_the_reason_and_give_nodes_back(make_scheduler, spec, reason):
    sched = make_scheduler(nodes=2, policy="easy", register_timeout=1.0)
    jid = sched.submit(spec)
    after = sched.submit(job("after", [PY, "-c", "pass"], nodes=2))
    jobs = wait_ended(sched, [jid, after], timeout=30)
    assert jobs[jid]["state"] == "failed" and reason in jobs[jid]["reason"], jobs[jid]
    assert jobs[after]["state"] == "done"  # the nodes came back
    assert all(n["job"] is None for n in sched.status()["nodes"])


def test_cli_submit_status_cancel_and_bad_job_files(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=2, policy="fcfs")
    to = "{}:{}".format(*sched.address)
    good = tmp_path / "sleep.toml"
    good.write_text(f'name = "sleeper"\ncommand = ["{PY}", "-c", "import time; time.sleep(30)"]\n'
                    'class = "rigid"\nnodes = 2\nwalltime = 60\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ncommand = "x"\nclass = "elastic"\nnodes = 1\nwalltime = 5\n')
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "broken\n')

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "apgas_scheduler", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=30)

    done = cli("submit", "--to", to, str(good))
    assert done.returncode == 0 and done.stdout.strip() == "1", done
    refused = cli("submit", "--to", to, str(bad), str(broken))
    assert refused.returncode == 2
    assert f"{bad}: key 'class': must be one of ['rigid', 'moldable', 'malleable', 'evolving'], " \
           "got 'elastic'" in refused.stderr
    assert f"{broken}: not valid TOML" in refused.stderr
    too_big = tmp_path / "big.toml"
    too_big.write_text('name = "big"\ncommand = "true"\nclass = "rigid"\nnodes = 5\nwalltime = 5\n')
    wide = tmp_path / "wide.toml"
    wide.write_text('name = "wide"\ncommand = "true"\nclass = "moldable"\nmin_nodes = 3\n'
                    'max_nodes = 4\nwalltime = 5\n')
    quick = tmp_path / "quick.toml"
    quick.write_text('name = "quick"\ncommand = "true"\nclass = "rigid"\nnodes = 1\nwalltime = 5\n')
    # the daemon refuses two of three: the third is still submitted, each error names its file
    some = cli("submit", "--to", to, str(too_big), str(quick), str(wide))
    assert some.returncode == 1 and some.stdout.split() == ["2"], some
    assert some.stderr.splitlines() == [
        f"error: {too_big}: key 'nodes': job 'big' needs at least 5 node(s) and the pool has 2",
        f"error: {wide}: key 'min_nodes': job 'wide' needs at least 3 node(s) and the pool has 2"]
    mixed = cli("submit", "--to", to, str(broken), str(too_big))  # unreadable and refused: 2
    assert mixed.returncode == 2 and len(mixed.stderr.splitlines()) == 2, mixed
    status = json.loads(cli("status", "--to", to, "--json").stdout)
    assert [(j["id"], j["name"], j["state"], j["nodes"]) for j in status["jobs"]] == [
        (1, "sleeper", "running", ["node0", "node1"]), (2, "quick", "queued", [])]
    assert "sleeper" in cli("status", "--to", to).stdout
    assert cli("cancel", "--to", to, "1").stdout.strip() in ("running", "cancelled")
    jobs = wait_ended(sched, [1, 2], timeout=60)
    assert jobs[1]["state"] == "cancelled" and jobs[1]["reason"] == "cancelled by the user"
    assert jobs[2]["state"] == "done"
    assert "no job with id 7" in cli("cancel", "--to", to, "7").stderr
    assert cli("add-nodes", "--to", to, "node[2-3]").stdout.strip() == "node0,node1,node2,node3"
    with pytest.raises(SchedulerError, match="unknown request 'fly'"):
        request(sched.address, "fly")
    assert cli("shutdown", "--to", to).returncode == 0


def test_submit_to_no_scheduler_names_the_files_not_submitted(tmp_path):
    port = free_port()  # nobody listens there
    files = []
    for name in ("a", "b"):
        files.append(tmp_path / f"{name}.toml")
        files[-1].write_text(f'name = "{name}"\ncommand = "true"\nclass = "rigid"\nnodes = 1\n'
                             'walltime = 5\n')
    done = subprocess.run([PY, "-m", "apgas_scheduler", "submit", "--to", f"127.0.0.1:{port}",
                           *map(str, files)], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.startswith(f"error: cannot reach the scheduler at 127.0.0.1:{port}")
    assert done.stderr.rstrip().endswith(f"not submitted: {files[0]}, {files[1]}"), done.stderr


def test_order_address_of_a_job_on_another_machine(tmp_path, monkeypatch):
    """On this machine a malleable job listens where the scheduler does; on another
    one at that node's address, and is told the scheduler's host name (the
    scheduler listens on every interface here). A signed job is told port 0 and
    has no order address until its ready line names the port; a plain job gets
    base + its id (or the next port free here). A message without a job id is
    matched by that address."""
    from apgas_scheduler.live.daemon import Job
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "here")
    sched = Scheduler(["here", "far", "lost"], get_policy("malleable"), host="0.0.0.0", port=0,
                      launcher="ssh", output_dir=tmp_path, node_addresses={"far": "192.0.2.7"},
                      order_port_base=30000)
    try:
        signed = job("m", [PY, "-c", "pass"], "malleable", 1, 3)
        spec = dataclasses.replace(signed, protocol="plain")
        mine, theirs = Job(1, signed, 0.0), Job(2, signed, 0.0)
        env = sched.processes.order_env(mine, "here")
        assert env["APGAS_MALLEABLE_LISTEN"] == "0.0.0.0:0" and mine.listen is None
        env = sched.processes.order_env(theirs, "far")
        assert env["APGAS_MALLEABLE_LISTEN"] == "192.0.2.7:0" and theirs.listen is None
        assert theirs.reports == "192.0.2.7"
        local, far, lost = Job(1, spec, 0.0), Job(5, spec, 0.0), Job(6, spec, 0.0)
        env = sched.processes.order_env(local, "here")
        assert env["APGAS_SCHEDULER"] == f"0.0.0.0:{sched.address[1]}"
        assert env["APGAS_MALLEABLE_LISTEN"] == f"0.0.0.0:{local.listen[1]}"  # type: ignore[index]
        assert 30001 <= local.listen[1] <= 31000  # type: ignore[index]
        env = sched.processes.order_env(far, "far")
        assert env == {"APGAS_COMMUNICATOR": "socket", "APGAS_MALLEABLE_LISTEN": "192.0.2.7:30005",
                       "APGAS_SCHEDULER": f"{socket.gethostname()}:{sched.address[1]}"}
        assert far.listen == ("192.0.2.7", 30005)
        far.state, sched._jobs[5] = "running", far
        assert sched.processes.order_env(Job(1005, spec, 0.0), "far")["APGAS_MALLEABLE_LISTEN"] == \
            "192.0.2.7:30006"  # 30005 is far's
        assert sched.server.find_job("192.0.2.7") is far and sched.server.find_job("192.0.2.8") is None
        with pytest.raises(OSError, match=r"cannot resolve node 'lost'.*--node-address lost=ADDRESS"):
            sched.processes.order_env(lost, "lost")
    finally:
        sched._finish()


def test_evolving_job_request_is_granted_and_a_release_returns_the_node(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=4, policy="evolving")  # grants requests, never grows on its own
    log, go = tmp_path / "evolving.jsonl", tmp_path / "go"
    jid = sched.submit(job("evolving", [PY, str(ROOT / "tests" / "foreign_job.py")], "evolving",
                           1, 3, FOREIGN_LOG=str(log), FOREIGN_UNTIL="grow", FOREIGN_SECONDS="45",
                           FOREIGN_REQUEST="2", FOREIGN_RELEASE="1", FOREIGN_HOLD=str(go)))
    # the job's messages come one a connection, as Java's do, and are served in parallel:
    # the job stays until its release is seen (one that came after its end would free
    # nothing more than the end does)
    deadline = time.monotonic() + 45
    while not any(e["event"] in ("shrink", "release") for e in read_events(tmp_path / "events.jsonl")):
        assert time.monotonic() < deadline, "the release was never taken"
        time.sleep(0.05)
    go.touch()
    jobs = wait_ended(sched, [jid], timeout=60)
    assert jobs[jid]["state"] == "done", jobs
    held = [json.loads(line) for line in log.read_text().splitlines()]
    assert held[1]["order"] == "grow 2 node1 node2"
    assert held[1]["hosts"] == ["node0", "node1"]  # node2 given back at once
    events = read_events(tmp_path / "events.jsonl")
    assert [(e["job"], e["nodes"], e["answer"]) for e in events if e["event"] == "request"] == [
        (jid, 2, "ok 2")]
    assert any(e["event"] in ("shrink", "release") and e["nodes"] == ["node2"] for e in events)
    assert compute_metrics(events)["max_overlap_violations"] == 0


def test_garbage_on_the_port_is_refused_and_the_scheduler_goes_on(make_scheduler):
    import socket
    sched = make_scheduler(nodes=1, policy="fcfs")
    key = auth.read_secret(access.default_key_file())
    with socket.create_connection(sched.address) as conn:
        conn.sendall(auth.sign(key, '{"op": "submit", "job"').encode() + b"\n")
        reply = json.loads(conn.makefile().readline())
    assert not reply["ok"] and "Expecting" in reply["error"]
    with socket.create_connection(sched.address) as conn:
        conn.sendall(auth.sign(key, '{"op": "submit", "job": 7}').encode() + b"\n")
        reply = json.loads(conn.makefile().readline())
    assert reply == {"ok": False, "error": "job: a job is a table of keys, got int"}
    with socket.create_connection(sched.address) as conn:
        conn.sendall(b"APGAS-Ready:10.0.0.1:99\n")  # a message from no job of ours: logged
    assert request(sched.address, "status")["jobs"] == []


def test_the_simulator_makes_the_live_decisions_given_the_live_run_times(make_scheduler, tmp_path):
    """Same policy object, same batch: the simulator, fed the run times measured live,
    starts the same jobs on as many nodes in the same order."""
    from apgas_scheduler.sim.simulator import Simulator
    from apgas_scheduler.sim.workload import SimJob

    sched = make_scheduler(nodes=3, policy="easy")
    batch = [("a", 2, 2, 1.2), ("b", 3, 3, 0.4), ("c", 1, 1, 2.0), ("d", 1, 1, 0.3),
             ("e", 1, 2, 0.6), ("f", 2, 2, 0.3)]
    # walltimes seconds apart from every estimate they are compared with: a launch's
    # latency never turns a backfill decision
    walltime = {name: 10 * d + 2 for name, _, _, d in batch}
    ids = [sched.submit(job(name, [PY, "-c", f"import time; time.sleep({d})"],
                            "rigid" if lo == hi else "moldable", lo, hi, walltime=walltime[name]))
           for name, lo, hi, d in batch]
    wait_ended(sched, ids, timeout=60)
    events = read_events(tmp_path / "events.jsonl")
    live = [(e["job"], len(e["nodes"])) for e in events if e["event"] == "start"]
    submit = {e["job"]: e["t"] for e in events if e["event"] == "submit"}
    ends = [e["t"] for e in events if e["event"] == "end"]
    # The simulator starts a job at the event that let it start (its submit, or another
    # job's end); the live scheduler a little later, by a latency that grows with the
    # load. A run timed from that event ends in the simulation when it ended live, so
    # both see the ends in one order, however close two of them came.
    began = {e["job"]: max([submit[e["job"]], *(t for t in ends if t <= e["t"])])
             for e in events if e["event"] == "decision"}
    ran = {e["job"]: e["t"] - began[e["job"]] for e in events if e["event"] == "end"}
    # a sleep does not speed up with more nodes: rho = 1 makes the model say so
    jobs = [SimJob(i, submit[i], "rigid" if lo == hi else "moldable", lo, hi, hi, ran[i],
                   walltime[name], rho=1.0) for i, (name, lo, hi, _) in zip(ids, batch, strict=True)]
    simulated = Simulator(3, get_policy("easy")).run(jobs)
    assert [(d.job, d.nodes) for _, d in simulated.decisions] == live


SCHEDULER_IN_ALLOCATION = """
import json, os, sys, time
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.policies import get_policy
import launcher
out, base, program = sys.argv[1], int(sys.argv[2]), sys.argv[3]
nodes = launcher.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
sched = Scheduler(nodes, get_policy("malleable", resize_interval=0.5), interval=0.2,
                  output_dir=out, events=os.path.join(out, "events.jsonl"), launcher="srun", order_port_base=base,
                  node_addresses={n: "127.0.0.1" for n in nodes},
                  socket_path=os.path.join(out, "scheduler.sock")).start()  # not left in /tmp

def jobs():
    return {j["id"]: j for j in sched.status()["jobs"]}

def wait(check):
    deadline = time.monotonic() + 60
    while not check(jobs()) and time.monotonic() < deadline:
        time.sleep(0.05)

m = sched.submit(JobSpec("m", (sys.executable, program), "malleable", 1, 3, 90, (), os.getcwd()))
wait(lambda j: len(j[m]["nodes"]) == 3 or j[m]["state"] in ("done", "failed"))
r = sched.submit(JobSpec("r", (sys.executable, "-c", "pass"), "rigid", 2, 2, 60, (), os.getcwd()))
wait(lambda j: all(x["state"] in ("done", "failed", "cancelled") for x in j.values()))
print("STATUS " + json.dumps(sched.status()), flush=True)
sched.shutdown()
"""


def test_a_malleable_job_under_srun_listens_on_its_first_node(slurm_cluster, tmp_path):
    """The scheduler inside a 3-node allocation starts a malleable job with srun on
    node1, which is not this machine's name: the job listens at node1's address
    (given as 127.0.0.1: the fixture's NodeAddr) on the port the kernel gave it
    there (not base + its id: it is a signed job), which its ready line named, is grown
    onto node2 and node3 (places that are srun steps there), then shrunk for a
    rigid job of 2."""
    port = free_port()  # the order port base (+ 1); a signed job 1 does not listen there
    environ = {k: v for k, v in slurm_cluster.env.items() if not k.startswith("APGAS_")}
    proc = subprocess.Popen(["salloc", "--nodes=3", "--quiet", "--time=5", "--kill-command=SIGKILL",
                             PY, "-c", SCHEDULER_IN_ALLOCATION, str(tmp_path), str(port - 1),
                             str(ROOT / "tests" / "reporting_job.py")],
                            cwd=ROOT, env={**environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.communicate()
    status = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("STATUS ")]
    assert proc.returncode == 0 and status, (out, err)
    m, r = status[0]["jobs"]
    job_out = (tmp_path / "job-1.out").read_text()
    assert (m["state"], r["state"]) == ("done", "done"), (
        m, r, job_out, (tmp_path / "events.jsonl").read_text(), (tmp_path / "job-1.err").read_text())
    assert m["listen"] and f"LISTEN {m['listen']}" in job_out  # the port its ready line named
    assert m["listen"].startswith("127.0.0.1:") and m["listen"] != f"127.0.0.1:{port}"
    assert m["grows"] == 1 and m["shrinks"] == 1, m
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
             for line in job_out.splitlines() if line.startswith(("GROWN ", "SHRUNK "))}
    assert lines["GROWN"] == [[0, "node1", "node1"], [1, "node2", "node2"], [2, "node3", "node3"]]
    assert lines["SHRUNK"] == [[0, "node1", "node1"]]
