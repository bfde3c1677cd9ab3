"""The live scheduler's side of evolving programs, with a raw-socket stand-in job.

The test speaks for the job towards the scheduler (``Evolving;Request``,
``Evolving;Check``, ``Evolving;Release``, ...) and reads the answers; the job
process (tests/evolving_job.py) only takes the orders and logs them.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import apgas_scheduler.live.asks as asks
from apgas import auth
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.metrics import compute_metrics, read_events

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
FAKE = str(ROOT / "tests" / "evolving_job.py")
GATE = ("error policy easy does not grant evolving requests; run the scheduler with "
        "--policy evolving or dmr")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sched_factory(make_scheduler):
    """Start a scheduler on ``nodes`` fake node names (all this machine); shut down after."""
    return lambda nodes=4, policy="evolving": make_scheduler(nodes=nodes, policy=policy)


class FakeJob:
    """A submitted stand-in job: send its messages, read its order log."""

    def __init__(self, sched: Scheduler, tmp_path: Path, name: str = "evo", cls: str = "evolving",
                 nodes: int = 1, max_nodes: int = 4, **env: str) -> None:
        self.sched = sched
        self.log = tmp_path / f"{name}.jsonl"
        env = {"FAKE_LOG": str(self.log), **env}
        self.id = sched.submit(JobSpec(name, (PY, FAKE), cls, nodes, max_nodes, 60.0,
                                       tuple(sorted(env.items())), str(ROOT)))

    def wait_listening(self) -> FakeJob:
        wait_for(lambda: self.log.exists() and self.orders(), f"job {self.id} to listen")
        return self

    def ask(self, message: str) -> str:
        """Send ``<message>:<ip>:<id>`` signed with the job's key, as the job does, and
        return the answer line ('' if none)."""
        return ask(self.sched, auth.sign(self.sched._jobs[self.id].secret,
                                         f"{message}:127.0.0.1:{self.id}"))

    def ready(self) -> FakeJob:
        self.ask(f"APGAS-Ready;{self.orders()[0]['port']}")  # the port the job bound
        wait_for(lambda: self.state()["ready"], f"job {self.id} to be ready")
        return self

    def orders(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def order_lines(self) -> list[str]:
        return [o["order"] for o in self.orders()][1:]  # without "listening"

    def state(self) -> dict[str, Any]:
        return next(j for j in self.sched.status()["jobs"] if j["id"] == self.id)


def ask(sched: Scheduler, line: str) -> str:
    with socket.create_connection(sched.address, timeout=10) as conn:
        conn.sendall(line.encode() + b"\n")
        return conn.makefile().readline().strip()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def owners(sched: Scheduler) -> dict[str, int | None]:
    return {n["name"]: n["job"] for n in sched.status()["nodes"]}


def events(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == kind]


# -- requests -------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["evolving", "dmr"])
def test_request_is_granted_with_one_grow_order(sched_factory, tmp_path, policy):
    sched = sched_factory(nodes=4, policy=policy)
    job = FakeJob(sched, tmp_path, max_nodes=3).wait_listening().ready()
    assert job.ask("Evolving;Request;2") == "ok 2"
    wait_for(lambda: job.order_lines(), "the grow order")
    assert job.order_lines() == ["grow 2 node1 node2"]
    wait_for(lambda: job.state()["nodes"] == ["node0", "node1", "node2"], "the grow to count")
    assert job.state()["requested"] == 0
    assert [(e["job"], e["nodes"], e["answer"]) for e in events(tmp_path, "request")] == [
        (job.id, 2, "ok 2")]
    assert compute_metrics(read_events(tmp_path / "events.jsonl"))["max_overlap_violations"] == 0


def test_requests_are_additive_and_refused_beyond_the_maximum(sched_factory, tmp_path):
    sched = sched_factory(nodes=2)
    busy = FakeJob(sched, tmp_path, "rigid", cls="rigid", nodes=1, max_nodes=1)
    job = FakeJob(sched, tmp_path, max_nodes=3).wait_listening().ready()
    busy.wait_listening()
    assert job.ask("Evolving;Request;3") == (
        f"error job {job.id} asks for 3 more node(s) but holds 1 and may have at most 3")
    assert job.ask("Evolving;Request;1") == "ok 1"  # no idle node: it stays outstanding
    assert job.ask("Evolving;Request;1") == "ok 1"
    assert job.ask("Evolving;Request;1") == (
        f"error job {job.id} asks for 1 more node(s) but holds 1, has asked for 2 more "
        "already, and may have at most 3")
    time.sleep(0.5)  # no event marks "no grant": a wrong one would have come by now
    assert job.state()["requested"] == 2 and job.order_lines() == []
    sched.cancel(busy.id)  # its node comes free: one of the two is granted
    wait_for(lambda: job.order_lines(), "the grow order")
    assert job.order_lines() == ["grow 1 node0"]
    wait_for(lambda: job.state()["requested"] == 1, "the request to be counted")


def test_requests_and_checks_are_refused_under_easy(sched_factory, tmp_path):
    sched = sched_factory(nodes=2, policy="easy")
    job = FakeJob(sched, tmp_path, max_nodes=2).wait_listening().ready()
    assert job.ask("Evolving;Request;1") == GATE
    assert job.ask("Evolving;Check;1;2;0;1") == GATE
    time.sleep(0.5)  # no event marks "no order": a wrong grant would have come by now
    assert job.order_lines() == [] and job.state()["requested"] == 0
    assert [e["answer"] for e in events(tmp_path, "check")] == [GATE]


def test_bad_asks_are_refused_with_the_value(sched_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(asks, "READY_WAIT", 0.2)
    sched = sched_factory(nodes=3)
    job = FakeJob(sched, tmp_path, max_nodes=3).wait_listening()
    rigid = FakeJob(sched, tmp_path, "rigid", cls="rigid", nodes=1, max_nodes=1).wait_listening()
    not_ready = f"error job {job.id} has not sent APGAS-Ready; it takes no orders yet"
    assert job.ask("Evolving;Request;1") == not_ready
    assert job.ask("Evolving;Check;1;2;0;1") == not_ready
    job.ready()
    for count in ("x", "0", "-1", "", "1.5"):
        assert job.ask(f"Evolving;Request;{count}") == (
            f"error bad request 'Evolving;Request;{count}': the count must be a positive integer")
    assert job.ask("Evolving;Request") == (
        "error bad request 'Evolving;Request': the count must be a positive integer")
    bad_checks = {
        "1;2;0": "expected <min>;<max>;<preferred>;<factor>, got 3 field(s)",
        "1;two;0;1": "max 'two' is not a whole number",
        "0;2;0;1": "min must be at least 1, got 0",
        "3;2;0;1": "max 2 is below min 3",
        "1;2;5;1": "preferred 5 is outside [1, 2] (0: none)",
        "1;2;0;0": "factor must be at least 1, got 0",
        "5;8;0;1": "[5, 8] does not meet the job's limits [1, 3]",
    }
    for fields, reason in bad_checks.items():
        assert job.ask(f"Evolving;Check;{fields}") == f"error bad check 'Evolving;Check;{fields}': {reason}"
    assert rigid.ask("Evolving;Request;1") == (
        f"error job {rigid.id} is rigid; only evolving and malleable jobs may ask for places")
    assert ask(sched, "Evolving;Request;1:10.0.0.1:99") == "error no job of ours matches 10.0.0.1:99"
    assert ask(sched, "Evolving;Check;1;2;0;1:10.0.0.1:99") == "error no job of ours matches 10.0.0.1:99"
    job.ask("APGAS-NotMalleable")
    gone = f"error job {job.id} sent APGAS-NotMalleable; it takes no more orders"
    wait_for(lambda: job.ask("Evolving;Request;1") == gone, "the refusal after NotMalleable")
    assert job.ask("Evolving;Check;1;2;0;1") == gone
    assert job.order_lines() == []


def test_not_malleable_drops_outstanding_requests(sched_factory, tmp_path):
    sched = sched_factory(nodes=2)
    FakeJob(sched, tmp_path, "rigid", cls="rigid", nodes=1, max_nodes=1).wait_listening()
    job = FakeJob(sched, tmp_path, max_nodes=2).wait_listening().ready()
    assert job.ask("Evolving;Request;1") == "ok 1"
    job.ask("APGAS-NotMalleable")
    wait_for(lambda: job.state()["requested"] == 0, "the request to be dropped")
    assert [e["nodes"] for e in events(tmp_path, "request_dropped")] == [1]


# -- checks ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["evolving", "dmr"])
def test_check_expands_on_idle_nodes_then_the_grow_order_comes(sched_factory, tmp_path, policy):
    sched = sched_factory(nodes=4, policy=policy)  # dmr leaves an evolving job to its checks
    hold = tmp_path / "answer-the-grow"  # the grow stays in flight until this file exists
    job = FakeJob(sched, tmp_path, max_nodes=4, FAKE_HOLD_GROW=str(hold)).wait_listening().ready()
    assert job.ask("Evolving;Check;1;3;0;1") == "expand 3"
    assert job.state()["nodes"] == ["node0"] and owners(sched)["node2"] == job.id  # reserved
    assert job.ask("Evolving;Check;1;4;0;1") == "none"  # the grow is still in flight
    hold.touch()
    wait_for(lambda: len(job.state()["nodes"]) == 3, "the grow")
    assert job.order_lines() == ["grow 2 node1 node2"]
    assert [e["answer"] for e in events(tmp_path, "check")] == ["expand 3", "none"]
    check = events(tmp_path, "check")[0]
    assert (check["job"], check["min"], check["max"], check["preferred"], check["factor"]) == (
        job.id, 1, 3, 0, 1)


def test_check_shrinks_for_a_queued_job_which_starts_before_any_request(sched_factory, tmp_path):
    sched = sched_factory(nodes=4)
    job = FakeJob(sched, tmp_path, max_nodes=4).wait_listening().ready()
    assert job.ask("Evolving;Check;1;4;0;1") == "expand 4"
    wait_for(lambda: len(job.state()["nodes"]) == 4, "the grow")
    assert job.ask("Evolving;Check;1;4;0;1") == "none"  # all nodes held, nothing waits
    rigid = FakeJob(sched, tmp_path, "rigid", cls="rigid", nodes=2, max_nodes=2)
    time.sleep(0.5)  # a negative check: no event marks "not started"
    assert rigid.state()["state"] == "queued"
    assert job.ask("Evolving;Check;1;4;0;1") == "shrink 2"
    assert job.ask("Evolving;Request;1") == "ok 1"  # must not take a node the rigid job is owed
    wait_for(lambda: rigid.state()["state"] == "running", "the queued job to start")
    assert sorted(rigid.state()["nodes"]) == ["node2", "node3"]
    assert job.order_lines()[1] == "shrink 2"
    time.sleep(0.5)  # no event marks "no grant": a wrong one would have come by now
    assert job.order_lines() == ["grow 3 node1 node2 node3", "shrink 2"]
    assert job.state()["requested"] == 1
    sched.cancel(rigid.id)  # its nodes come free: now the request is granted
    wait_for(lambda: len(job.order_lines()) == 3, "the grow for the request")
    assert job.order_lines()[2] in ("grow 1 node2", "grow 1 node3")


# -- releases and refusals ------------------------------------------------------------

def test_release_returns_the_node_to_the_pool(sched_factory, tmp_path):
    sched = sched_factory(nodes=3)
    job = FakeJob(sched, tmp_path, max_nodes=3).wait_listening().ready()
    assert job.ask("Evolving;Request;1") == "ok 1"
    wait_for(lambda: job.state()["nodes"] == ["node0", "node1"], "the grow")
    assert job.ask("Evolving;Release;node1") == ""  # no answer
    wait_for(lambda: owners(sched)["node1"] is None, "node1 to be free")
    assert job.state()["nodes"] == ["node0"]
    job.ask("Evolving;Release;node2")  # not its node: logged and ignored
    wait_for(lambda: events(tmp_path, "release_ignored"), "the release to be ignored")
    assert owners(sched) == {"node0": job.id, "node1": None, "node2": None}
    assert [e["host"] for e in events(tmp_path, "release_ignored")] == ["node2"]
    assert job.ask("Evolving;Request;2") == "ok 2"  # both idle nodes may be asked for again
    wait_for(lambda: len(job.state()["nodes"]) == 3, "the second grow")


def test_refuse_order_when_the_grow_for_a_request_fails(sched_factory, tmp_path):
    sched = sched_factory(nodes=3)
    job = FakeJob(sched, tmp_path, max_nodes=3, FAKE_GROW_ERROR="no place was added: boom")
    job.wait_listening().ready()
    assert job.ask("Evolving;Request;2") == "ok 2"
    wait_for(lambda: len(job.order_lines()) == 2, "the grow and the refusal")
    grow, refuse = job.order_lines()
    assert grow == "grow 2 node1 node2"
    assert refuse == ("refuse 2 the grow order for node1,node2 failed: "
                      "error no place was added: boom")
    wait_for(lambda: events(tmp_path, "refuse"), "the refusal to be logged")
    assert events(tmp_path, "refuse")[0]["reply"] == "ok refuse 2"
    assert job.state()["requested"] == 0 and owners(sched)["node1"] is None
    compute_metrics(read_events(tmp_path / "events.jsonl"))  # new event kinds do not upset it


def test_refuse_order_when_a_failed_shrink_leaves_no_room(sched_factory, tmp_path):
    sched = sched_factory(nodes=4)
    hold = tmp_path / "answer-the-shrink"  # the shrink stays in flight until this file exists
    job = FakeJob(sched, tmp_path, max_nodes=4, FAKE_HOLD_SHRINK=str(hold),
                  FAKE_SHRINK_ERROR="the handler's pre_shrink raised ValueError: no")
    job.wait_listening().ready()
    assert job.ask("Evolving;Check;1;4;0;1") == "expand 4"
    wait_for(lambda: len(job.state()["nodes"]) == 4, "the grow")
    rigid = FakeJob(sched, tmp_path, "rigid", cls="rigid", nodes=2, max_nodes=2)
    time.sleep(0.5)
    assert job.ask("Evolving;Check;1;4;0;1") == "shrink 2"
    assert job.ask("Evolving;Request;2") == "ok 2"  # room for it once the shrink is done...
    hold.touch()
    wait_for(lambda: len(job.order_lines()) == 3, "the shrink and the refusal")
    assert job.order_lines()[1:] == [  # ... but the shrink fails
        "shrink 2", f"refuse 2 job {job.id} holds 4 node(s) and may have at most 4"]
    assert job.state()["requested"] == 0 and rigid.state()["state"] == "queued"
    assert [e["reply"] for e in events(tmp_path, "refuse")] == ["ok refuse 2"]
