"""The scheduler hears that a job lost a place (``APGAS-PlaceLost``, issue 30): the node
leaves the job and is down, given to nobody until the operator's ``node-up``, also
across a restart; lines naming hosts the job does not hold, or not signed by it, change
nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apgas import auth, protocol
from apgas_scheduler.client import SchedulerError, request
from apgas_scheduler.engine import Engine, Tracked
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.live.views import dashboard_model
from apgas_scheduler.metrics import compute_metrics, read_events
from apgas_scheduler.policies import get_policy

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def job(name: str, command: list[str], cls: str = "rigid", nodes: int = 1, max_nodes: int = 0,
        walltime: float = 60, **env: str) -> JobSpec:
    return JobSpec(name, tuple(command), cls, nodes, max_nodes or nodes, walltime,
                   tuple(sorted(env.items())), str(ROOT))


def sleeper(nodes: int = 1, seconds: float = 30) -> JobSpec:
    return job("sleeper", [PY, "-c", f"import time; time.sleep({seconds})"], nodes=nodes)


def jobs_of(sched: Scheduler) -> dict[int, dict]:
    return {j["id"]: j for j in sched.status()["jobs"]}


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout} s: {what}")


def nodes_of(sched: Scheduler) -> dict[str, dict]:
    """The nodes as a client sees them (``status``), by name."""
    return {n["name"]: n for n in request(sched.address, "status")["nodes"]}


def tell(sched: Scheduler, job_id: int, message: str, secret: str | None) -> None:
    """A job message to the scheduler's port, signed with ``secret`` (None: plain)."""
    line = f"{message}:127.0.0.1:{job_id}"
    with socket.create_connection(sched.address, timeout=10) as conn:
        conn.sendall((auth.sign(secret, line) if secret else line).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        conn.recv(100)  # the scheduler has handled it once it closes


def test_a_malleable_job_loses_a_place_its_node_goes_down_and_the_job_grows_elsewhere(
        make_scheduler, tmp_path):
    """The job (tests/place_lost_job.py) grows from 1 to 3 nodes; its place on the second
    node is killed. That node goes down: out of the job, given to no job (a rigid job of 3
    runs on the other three, one of 4 waits), until node-up. The job is grown onto the
    healthy node left, which its program waits for, and ends."""
    sched = make_scheduler(nodes=4, policy="malleable")
    jid = sched.submit(job("losing", [PY, str(ROOT / "tests" / "place_lost_job.py")], "malleable",
                           1, 3, REGROW_TO="3"))
    out = sched.output_dir / f"job-{jid}.out"

    def three_places():
        lines = out.read_text().splitlines() if out.exists() else []
        places = [json.loads(line[7:]) for line in lines if line.startswith("PLACES ")]
        return places[-1] if places and len(places[-1]) == 3 else None

    # the job may print its places before the scheduler has taken in the grow's end
    places = wait_for("the job runs 3 places, on the 3 nodes the scheduler gave it",
                      lambda: len(jobs_of(sched)[jid]["nodes"]) == 3 and three_places())
    _, victim, pid = places[1]
    assert victim in jobs_of(sched)[jid]["nodes"]
    os.kill(pid, signal.SIGKILL)
    wait_for("the node is down", lambda: nodes_of(sched)[victim]["down"])
    done = wait_for("the job ends", lambda: jobs_of(sched)[jid]["state"] in ("done", "failed")
                    and jobs_of(sched)[jid])
    assert done["state"] == "done", (done, (sched.output_dir / f"job-{jid}.err").read_text())
    said = dict(line.split(" ", 1) for line in out.read_text().splitlines() if " " in line)
    assert json.loads(said["LOST"]) == [[places[1][0], victim]]

    after = sched.submit(sleeper(nodes=3, seconds=0.2))
    big = sched.submit(sleeper(nodes=4, seconds=0.2))
    wait_for("the job of 3 ends", lambda: jobs_of(sched)[after]["state"] == "done")
    time.sleep(1.0)  # several passes (every 0.2 s): the job of 4 cannot start
    assert jobs_of(sched)[big]["state"] == "queued"
    status = nodes_of(sched)
    assert 0 < status[victim].pop("quarantine") <= 300  # one job's word: out for 300 s at most
    assert status[victim] == {"name": victim, "job": None, "down": True}
    assert [n for n, s in status.items() if s["down"]] == [victim]

    cli = subprocess.run([PY, "-m", "apgas_scheduler", "node-up", "--to",
                          "{}:{}".format(*sched.address), victim],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert cli.returncode == 0 and cli.stdout == "still down: none\n", cli
    wait_for("the job of 4 runs once the node is back",
             lambda: jobs_of(sched)[big]["state"] == "done")

    events = read_events(tmp_path / "events.jsonl")
    kinds = [(e["event"], e.get("job")) for e in events]
    down_at = kinds.index(("node_down", jid))
    up_at = kinds.index(("node_up", None))
    given = [i for i, e in enumerate(events) if e["event"] in ("start", "grow", "reserve")
             and victim in e.get("nodes", ())]
    assert not [i for i in given if down_at < i < up_at], events
    assert events[down_at + 1] == {**events[down_at + 1], "event": "shrink", "job": jid,
                                   "nodes": [victim], "lost": True}
    grew_after = [e for e in events[down_at:up_at] if e["event"] == "grow" and e["job"] == jid]
    assert grew_after and victim not in grew_after[0]["nodes"]
    assert compute_metrics(events)["max_overlap_violations"] == 0
    page = dashboard_model(events[:up_at])
    assert f"1 node(s) down: {victim}" in page["subtitle"]
    marks = [m for s in page["sections"] if s["id"] == "nodes" for m in s["marks"]]
    assert any(m["label"] == f"job {jid} lost its place on {victim}, now down" for m in marks)


def test_a_place_lost_line_for_a_host_the_job_does_not_hold_is_refused(make_scheduler, caplog,
                                                                        tmp_path):
    """Another job's node, a free node, a name outside the pool: refused and logged,
    nothing changes. Unsigned, or signed with another job's key: refused like any line."""
    sched = make_scheduler(nodes=3, policy="fcfs")
    first, second = sched.submit(sleeper()), sched.submit(sleeper())
    wait_for("both run", lambda: all(j["state"] == "running" for j in jobs_of(sched).values()))
    mine, theirs = (jobs_of(sched)[i]["nodes"][0] for i in (first, second))
    free = next(n for n in nodes_of(sched) if n not in (mine, theirs))
    secret = sched._jobs[first].secret
    before = sched.status()
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        for host in (theirs, free, "nodeX"):
            tell(sched, first, protocol.place_lost(host), secret)
        tell(sched, first, protocol.place_lost(mine), None)  # unsigned
        tell(sched, first, protocol.place_lost(mine), sched._jobs[second].secret)  # not its key
    after = sched.status()
    assert after["nodes"] == before["nodes"] and not any(n["down"] for n in nodes_of(sched).values())
    assert [j["nodes"] for j in after["jobs"]] == [j["nodes"] for j in before["jobs"]]
    for host in (theirs, free, "nodeX"):
        assert (f"job {first} says it lost its place on {host}, which it does not hold; refused, "
                "nothing changed") in caplog.text
    assert "must sign its messages" in caplog.text
    events = read_events(tmp_path / "events.jsonl")
    assert [e["host"] for e in events if e["event"] == "place_lost_refused"] == [theirs, free, "nodeX"]
    assert not any(e["event"] == "node_down" for e in events)
    with pytest.raises(SchedulerError, match=f"only nodes that are down can be brought up; not "
                                             f"down: \\['{free}'\\]; down: none"):
        request(sched.address, "node-up", nodes=[free])


def test_a_down_node_stays_down_across_a_restart(make_scheduler, tmp_path):
    state, output = tmp_path / "state", tmp_path / "jobs"
    sched = make_scheduler(nodes=2, policy="fcfs", state_dir=state, output_dir=output)
    jid = sched.submit(sleeper())
    wait_for("it runs", lambda: jobs_of(sched)[jid]["state"] == "running")
    node = jobs_of(sched)[jid]["nodes"][0]
    tell(sched, jid, protocol.place_lost(node), sched._jobs[jid].secret)
    assert nodes_of(sched)[node]["down"] and jobs_of(sched)[jid]["nodes"] == []
    sched.shutdown()
    for t in list(sched._threads):
        t.join(10)
    again = make_scheduler(nodes=2, policy="fcfs", state_dir=state, output_dir=output)
    assert [n for n, s in nodes_of(again).items() if s["down"]] == [node]
    two = again.submit(sleeper(nodes=2, seconds=0.1))
    time.sleep(0.6)
    assert jobs_of(again)[two]["state"] == "queued"
    assert request(again.address, "node-up", nodes=[node]) == {"ok": True, "down": []}
    wait_for("the job of 2 runs", lambda: jobs_of(again)[two]["state"] == "done")


def test_the_engine_takes_a_lost_node_out_of_the_cluster_policies_see():
    engine: Engine[str] = Engine(["a", "b", "c"], get_policy("easy"))
    job = Tracked(1, "malleable", 1, 3, 60.0, 0.0)
    engine.submit(job)
    engine.start(job, 3, 0.0)
    assert not engine.place_lost(job, "x") and not engine.place_lost(Tracked(2, "rigid", 1, 1, 1, 0), "a")
    assert engine.place_lost(job, "b")
    assert (job.nodes, engine.down, engine.free, engine.usable, engine.total) == (["a", "c"], {"b"}, 0, 2, 3)
    engine.end(job, "done", 1.0)
    assert engine.free_nodes() == ["a", "c"] and engine.owner["b"] is None
    engine.node_up("b")
    assert engine.free_nodes() == ["a", "b", "c"] and engine.down == set()
    engine.set_down("c")
    assert engine.free_nodes() == ["a", "b"] and engine.usable == 2
    with pytest.raises(ValueError, match="not a free node"):
        engine.set_down("c")
