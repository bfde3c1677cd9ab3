"""The live scheduler with real jobs: GLB programs, a foreign job, failures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.client import SchedulerError, request
from scheduler.daemon import Scheduler
from scheduler.jobs import JobSpec
from scheduler.metrics import compute_metrics, read_events
from scheduler.policies import get_policy

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def job(name: str, command: list[str], cls: str = "rigid", nodes: int = 1, max_nodes: int = 0,
        walltime: float = 60, **env: str) -> JobSpec:
    return JobSpec(name, tuple(command), cls, nodes, max_nodes or nodes, walltime,
                   tuple(sorted(env.items())), str(ROOT))


@pytest.fixture
def make_scheduler(tmp_path):
    """Start a scheduler in this process on ``nodes`` fake node names (all this machine)."""
    running: list[Scheduler] = []

    def start(nodes: int = 4, policy: str = "malleable", **options) -> Scheduler:
        monkey_hosts = [f"node{i}" for i in range(nodes)]
        sched = Scheduler(monkey_hosts, get_policy(policy, resize_interval=options.pop("resize", 0.5)),
                          port=0, events=tmp_path / "events.jsonl", interval=0.2,
                          output_dir=tmp_path / "out", **options)
        running.append(sched.start())
        return sched

    import os
    old = os.environ.get("APGAS_LOCAL_HOSTS")
    os.environ["APGAS_LOCAL_HOSTS"] = "*"
    yield start
    for sched in running:
        sched.shutdown()
    for sched in running:
        for t in list(sched._threads):
            t.join(10)
    if old is None:
        os.environ.pop("APGAS_LOCAL_HOSTS", None)
    else:
        os.environ["APGAS_LOCAL_HOSTS"] = old


def wait_ended(sched: Scheduler, ids: list[int], timeout: float = 90) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in sched.status()["jobs"]}
        if all(jobs[i]["state"] in ("done", "failed", "cancelled") for i in ids):
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"jobs not ended in time: {sched.status()['jobs']}")


def bench(app: str, out: Path, *args: str) -> list[str]:
    return [PY, "-m", "benchmarks", app, *args, "--json", str(out)]


def test_six_real_jobs_two_malleable_resized(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=4, policy="malleable")
    out = tmp_path / "results"
    ids = [sched.submit(job("uts-m", bench("uts", out / "1.json", "--depth", "13", "--malleable"),
                            "malleable", 1, 4, APGAS_THREADS="2"))]
    time.sleep(2.5)  # alone: minAgree gives it the idle nodes
    ids.append(sched.submit(job("pi", bench("pi", out / "2.json", "--samples", "200000000"),
                                "rigid", 2)))
    ids.append(sched.submit(job("nq-m", bench("nqueens", out / "3.json", "-n", "12", "--malleable"),
                                "malleable", 1, 3)))
    ids.append(sched.submit(job("bc", bench("bc", out / "4.json", "--scale", "9"), "moldable", 1, 2)))
    ids.append(sched.submit(job("uts", bench("uts", out / "5.json", "--depth", "10"), "rigid", 1)))
    ids.append(sched.submit(job("pi2", bench("pi", out / "6.json", "--samples", "10000000"), "rigid", 3)))
    jobs = wait_ended(sched, ids, timeout=100)
    assert [jobs[i]["state"] for i in ids] == ["done"] * 6, jobs
    for i in range(1, 7):
        record = json.loads((out / f"{i}.json").read_text())
        assert record["correct"] is True, record
    resized = [jobs[i]["grows"] + jobs[i]["shrinks"] for i in ids if jobs[i]["class"] == "malleable"]
    assert jobs[ids[0]]["grows"] >= 1 and jobs[ids[0]]["shrinks"] >= 1, jobs[ids[0]]
    assert sum(resized) >= 2
    assert all(n["job"] is None for n in sched.status()["nodes"])
    metrics = compute_metrics(read_events(tmp_path / "events.jsonl"))
    assert metrics["max_overlap_violations"] == 0
    assert metrics["by_state"] == {"done": 6}


def test_foreign_job_is_grown_and_shrunk(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=3, policy="malleable")
    log = tmp_path / "foreign.jsonl"
    first = sched.submit(job("foreign", [PY, str(ROOT / "tests" / "foreign_job.py")], "malleable",
                             1, 3, FOREIGN_LOG=str(log), FOREIGN_SECONDS="6"))
    time.sleep(1.5)  # it registers and gets the two idle nodes
    second = sched.submit(job("rigid", [PY, "-c", "import time; time.sleep(0.5)"], "rigid", 2))
    jobs = wait_ended(sched, [first, second], timeout=30)
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
    to = "%s:%d" % sched.address
    good = tmp_path / "sleep.toml"
    good.write_text(f'name = "sleeper"\ncommand = ["{PY}", "-c", "import time; time.sleep(30)"]\n'
                    'class = "rigid"\nnodes = 2\nwalltime = 60\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ncommand = "x"\nclass = "elastic"\nnodes = 1\nwalltime = 5\n')
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "broken\n')

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "scheduler", *args], capture_output=True, text=True,
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
    big = cli("submit", "--to", to, str(too_big))
    assert big.returncode == 1 and "needs at least 5 node(s) and the pool has 2" in big.stderr
    time.sleep(0.5)
    status = json.loads(cli("status", "--to", to, "--json").stdout)
    assert [(j["id"], j["name"], j["state"], j["nodes"]) for j in status["jobs"]] == [
        (1, "sleeper", "running", ["node0", "node1"])]
    assert "sleeper" in cli("status", "--to", to).stdout
    assert cli("cancel", "--to", to, "1").stdout.strip() in ("running", "cancelled")
    jobs = wait_ended(sched, [1], timeout=15)
    assert jobs[1]["state"] == "cancelled" and jobs[1]["reason"] == "cancelled by the user"
    assert "no job with id 7" in cli("cancel", "--to", to, "7").stderr
    assert cli("add-nodes", "--to", to, "node[2-3]").stdout.strip() == "node0,node1,node2,node3"
    with pytest.raises(SchedulerError, match="unknown request 'fly'"):
        request(sched.address, "fly")
    assert cli("shutdown", "--to", to).returncode == 0


def test_evolving_job_request_is_granted_and_a_release_returns_the_node(make_scheduler, tmp_path):
    sched = make_scheduler(nodes=4, policy="evolving")  # grants requests, never grows on its own
    log = tmp_path / "evolving.jsonl"
    jid = sched.submit(job("evolving", [PY, str(ROOT / "tests" / "foreign_job.py")], "evolving",
                           1, 3, FOREIGN_LOG=str(log), FOREIGN_SECONDS="2", FOREIGN_REQUEST="2",
                           FOREIGN_RELEASE="1"))
    jobs = wait_ended(sched, [jid], timeout=30)
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
    with socket.create_connection(sched.address) as conn:
        conn.sendall(b'{"op": "submit", "job"\n')
        reply = json.loads(conn.makefile().readline())
    assert not reply["ok"] and "Expecting" in reply["error"]
    with socket.create_connection(sched.address) as conn:
        conn.sendall(b'{"op": "submit", "job": 7}\n')
        reply = json.loads(conn.makefile().readline())
    assert reply == {"ok": False, "error": "job: a job is a table of keys, got int"}
    with socket.create_connection(sched.address) as conn:
        conn.sendall(b"APGAS-Ready:10.0.0.1:99\n")  # a message from no job of ours: logged
    assert request(sched.address, "status")["jobs"] == []


def test_the_simulator_makes_the_live_decisions_given_the_live_run_times(make_scheduler, tmp_path):
    """Same policy object, same batch: the simulator, fed the run times measured live,
    starts the same jobs on as many nodes in the same order."""
    from scheduler.simulator import Simulator
    from scheduler.workload import SimJob

    sched = make_scheduler(nodes=3, policy="easy")
    batch = [("a", 2, 2, 1.2), ("b", 3, 3, 0.4), ("c", 1, 1, 2.0), ("d", 1, 1, 0.3),
             ("e", 1, 2, 0.6), ("f", 2, 2, 0.3)]
    ids = [sched.submit(job(name, [PY, "-c", f"import time; time.sleep({d})"],
                            "rigid" if lo == hi else "moldable", lo, hi, walltime=3 * d + 1))
           for name, lo, hi, d in batch]
    wait_ended(sched, ids, timeout=60)
    events = read_events(tmp_path / "events.jsonl")
    live = [(e["job"], len(e["nodes"])) for e in events if e["event"] == "start"]
    span = {e["job"]: e["t"] for e in events if e["event"] == "start"}
    ran = {e["job"]: e["t"] - span[e["job"]] for e in events if e["event"] == "end"}
    submit = {e["job"]: e["t"] for e in events if e["event"] == "submit"}
    # a sleep does not speed up with more nodes: rho = 1 makes the model say so
    jobs = [SimJob(i, submit[i], "rigid" if lo == hi else "moldable", lo, hi, hi, ran[i], 3 * d + 1,
                   rho=1.0) for i, (_, lo, hi, d) in zip(ids, batch)]
    simulated = Simulator(3, get_policy("easy")).run(jobs)
    assert [(d.job, d.nodes) for _, d in simulated.decisions] == live
