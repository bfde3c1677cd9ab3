"""``apgas-scheduler elastisim``: our policies as ElastiSim's scheduling algorithm,
against a stand-in ElastiSim (a PAIR socket bound here, as ElastiSim binds its
``zmq_url``) whose messages are shaped as the C++ source writes them
(``Job::toJson``, ``Node::toJson``, ``SchedulingInterface::invokeScheduling``), and
against a small model of how ElastiSim applies the answers, with its checks
(``handleSchedule``, ``Job::assignNode``, ``checkConfigurationValidity``,
``Node::expectJob``), for every registered policy. The real binary is in
``test_elastisim_real.py``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from apgas_scheduler.__main__ import main
from apgas_scheduler._model import Decision, Grow, JobView, Start
from apgas_scheduler.elastisim import bridge as es
from apgas_scheduler.policies import Policy, get_policy, policy_names

pytestmark = pytest.mark.timeout(60)

RIGID, MOLDABLE, MALLEABLE = 0, 1, 2
PENDING, RUNNING, PENDING_RECONFIGURATION, COMPLETED = 1, 4, 5, 7
FREE, ALLOCATED, RESERVED = 0, 1, 2


def arg(value: float | int | str) -> str:
    """An argument as ElastiSim sends it (``readStringMap``: std::to_string)."""
    if isinstance(value, float):
        return f"{value:f}"
    return str(value)


def job_json(jid: int, kind: int = RIGID, state: int = PENDING, *, nodes: Sequence[int] = (),
             size: int = 1, low: int = 1, high: int = 1, walltime: float = 0.0,
             submit: float = 0.0, start: float = -1.0, gpus: int = 0,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job as ``Job::toJson`` writes it."""
    out: dict[str, Any] = {"id": jid, "state": state, "type": kind, "walltime": walltime}
    if kind != RIGID:
        out.update(num_nodes_min=low, num_nodes_max=high, num_gpus_per_node_min=0,
                   num_gpus_per_node_max=0)
    else:
        out.update(num_nodes=size, num_gpus_per_node=0)
    out.update(submit_time=submit, start_time=start, end_time=-1.0, wait_time=-1.0,
               makespan=-1.0, turnaround_time=-1.0, assigned_nodes=list(nodes),
               assigned_num_gpus_per_node=gpus)
    if args:
        out["arguments"] = {k: arg(v) for k, v in args.items()}
    out.update(total_phase_count=1, completed_phases=0)
    return out


def node_json(nid: int, state: int = FREE, jobs: Sequence[int] = ()) -> dict[str, Any]:
    """A node as ``Node::toJson`` writes it."""
    return {"id": nid, "type": 0, "state": state, "assigned_jobs": list(jobs), "gpus": []}


def invocation(now: float, jobs: list[dict[str, Any]], nodes: list[dict[str, Any]],
               kind: int = 0, job_id: int | None = None) -> dict[str, Any]:
    """``SchedulingInterface::invokeScheduling``'s message."""
    out: dict[str, Any] = {"code": es.INVOKE_SCHEDULING, "time": now, "invocation_type": kind}
    if kind != 0:
        out["job_id"] = job_id
    out.update(jobs=jobs, nodes=nodes, pfs_read_bw=3e11, pfs_write_bw=3e11,
               pfs_read_utilization=0.0, pfs_write_utilization=0.0)
    return out


def nodes_of(count: int, held: dict[int, int] | None = None,
             states: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """``count`` nodes; ``held``: {node: job running there}; ``states``: other states."""
    held, states = held or {}, states or {}
    return [node_json(n, states.get(n, ALLOCATED if n in held else FREE),
                      [held[n]] if n in held else []) for n in range(count)]


class Fake:
    """The ElastiSim end of the socket, and the bridge's thread."""

    def __init__(self, sock: zmq.Socket[bytes], thread: threading.Thread,
                 result: dict[str, Any]) -> None:
        self.sock, self.thread, self.result = sock, thread, result

    def ask(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        self.sock.send(json.dumps(message).encode())
        assert self.sock.poll(10_000), "no answer in 10 s"
        answer = json.loads(self.sock.recv())
        assert answer["code"] == es.SCHEDULED, answer
        return answer["jobs"]

    def finish(self) -> dict[str, Any]:
        self.sock.send(json.dumps({"code": es.FINALIZE}).encode())
        self.thread.join(10)
        assert not self.thread.is_alive(), "the bridge did not end at the finalize"
        assert "error" not in self.result, self.result
        return self.result["stats"]

    def error(self) -> BaseException:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the bridge is still waiting"
        assert "error" in self.result, self.result
        return self.result["error"]


@contextmanager
def elastisim(tmp_path: Path, target: Any, **options: Any) -> Iterator[Fake]:
    """A bound PAIR socket, and ``target(url)`` in a thread (``serve`` of a bridge, or
    the CLI); everything closed after, the thread joined."""
    url = f"ipc://{tmp_path}/es.ipc"
    assert len(url) < 100, url  # the limit of a Unix socket's path
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.SNDTIMEO, 10_000)
    sock.bind(url)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["stats"] = target(url)
        except BaseException as e:  # noqa: B036  (handed to the test)
            result["error"] = e

    thread = threading.Thread(target=run, name="elastisim-bridge", daemon=True)
    thread.start()
    try:
        yield Fake(sock, thread, result)
    finally:
        if thread.is_alive():
            try:
                sock.send(json.dumps({"code": es.FINALIZE}).encode())  # waits for it to connect
            except zmq.ZMQError:
                pass
            thread.join(15)
        sock.close(linger=0)
        ctx.term()
        assert not thread.is_alive()


def bridged(policy: str | Policy, **options: Any) -> tuple[es.Bridge, Any]:
    bridge = es.Bridge(get_policy(policy) if isinstance(policy, str) else policy)
    return bridge, lambda url: es.serve(bridge, url, idle_timeout=10, **options)


# -- the protocol --------------------------------------------------------------------------------

def test_fcfs_starts_the_head_on_free_nodes_and_finalize_ends_the_loop(tmp_path):
    bridge, target = bridged("fcfs")
    jobs = [job_json(0, size=2, walltime=100), job_json(1, size=4, walltime=100),
            job_json(2, size=1, walltime=100, submit=1)]
    with elastisim(tmp_path, target) as fake:
        answer = fake.ask(invocation(0.0, jobs, nodes_of(4), kind=1, job_id=0))
        assert answer == [{"id": 0, "assigned_node_ids": [0, 1], "assigned_num_gpus_per_node": 0,
                           "kill_flag": False}]  # job 1 does not fit: FCFS waits for it
        stats = fake.finish()
    assert stats == {"policy": "fcfs", "invocations": 1, "refused": 0, "finalized": True,
                     "decisions": {"start": 1, "grow": 0, "shrink": 0}}


def test_easy_backfills_a_job_that_ends_before_the_heads_reservation(tmp_path):
    # job 0 runs on nodes 0-1 until t=100; the head (4 nodes) waits for it. Job 2's
    # run time comes from its flops (5e13 flop on one node of 1e12 flop/s: 50 s) and
    # ends by then; job 3 (500 s) would delay the head.
    jobs = [job_json(0, state=RUNNING, size=2, nodes=[0, 1], start=0.0, walltime=100),
            job_json(1, size=4, walltime=100, submit=1),
            job_json(2, size=1, submit=2, args={"flops": 5e13, "parallel_percentage": 1.0}),
            job_json(3, size=1, walltime=500, submit=3)]
    message = invocation(10.0, jobs, nodes_of(4, held={0: 0, 1: 0}))
    bridge, target = bridged("easy")
    with elastisim(tmp_path, target) as fake:
        assert fake.ask(message) == [{"id": 2, "assigned_node_ids": [2],
                                      "assigned_num_gpus_per_node": 0, "kill_flag": False}]
        fake.finish()
    assert es.Bridge(get_policy("fcfs")).schedule(message) == []


def test_minagree_grows_then_shrinks_a_malleable_job_keeping_its_node_order(tmp_path):
    bridge, target = bridged(get_policy("malleable", resize_interval=10))
    elastic = {"kind": MALLEABLE, "low": 1, "high": 4, "walltime": 1000, "start": 0.0}
    with elastisim(tmp_path, target) as fake:
        # nobody waits: the idle nodes go to the running malleable job, after its own
        grow = fake.ask(invocation(5.0, [job_json(0, state=RUNNING, nodes=[2], **elastic)],
                                   nodes_of(4, held={2: 0})))
        assert grow == [{"id": 0, "assigned_node_ids": [2, 0, 1, 3],
                         "assigned_num_gpus_per_node": 0, "kill_flag": False}]
        # ElastiSim: PENDING_RECONFIGURATION, the new nodes reserved. Not resized again.
        pending = job_json(0, state=PENDING_RECONFIGURATION, nodes=[2, 0, 1, 3], **elastic)
        assert fake.ask(invocation(6.0, [pending], nodes_of(
            4, held={2: 0}, states={0: RESERVED, 1: RESERVED, 3: RESERVED}))) == []
        # later a rigid job of 2 nodes comes: the job gives back its last two nodes
        running = job_json(0, state=RUNNING, nodes=[2, 0, 1, 3], **elastic)
        queued = job_json(1, size=2, walltime=100, submit=30)
        everyone = {n: 0 for n in range(4)}
        shrink = fake.ask(invocation(30.0, [running, queued], nodes_of(4, held=everyone),
                                     kind=1, job_id=1))
        assert shrink == [{"id": 0, "assigned_node_ids": [2, 0],
                           "assigned_num_gpus_per_node": 0, "kill_flag": False}]
        # until its next scheduling point it runs on all four: nodes 1 and 3 are on
        # their way back; nothing starts on them and nobody shrinks again
        pending = job_json(0, state=PENDING_RECONFIGURATION, nodes=[2, 0], **elastic)
        assert fake.ask(invocation(31.0, [pending, queued], nodes_of(4, held=everyone))) == []
        # reconfigured: the rigid job starts on the two nodes given back
        running = job_json(0, state=RUNNING, nodes=[2, 0], **elastic)
        start = fake.ask(invocation(40.0, [running, queued], nodes_of(4, held={2: 0, 0: 0}),
                                    kind=4, job_id=0))
        assert start == [{"id": 1, "assigned_node_ids": [1, 3],
                          "assigned_num_gpus_per_node": 0, "kill_flag": False}]
        stats = fake.finish()
    assert stats["decisions"] == {"start": 1, "grow": 1, "shrink": 1}
    assert stats["invocations"] == 5 and stats["refused"] == 0


def test_lending_lends_an_idle_node_and_takes_it_back_for_a_waiting_job(tmp_path):
    bridge, target = bridged(get_policy("lending", resize_interval=10))
    elastic = {"kind": MALLEABLE, "low": 1, "high": 4, "walltime": 5000, "start": 0.0}
    rigid = job_json(1, state=RUNNING, size=2, nodes=[1, 2], start=0.0, walltime=1000)
    head = job_json(2, size=3, walltime=100, submit=5)
    with elastisim(tmp_path, target) as fake:
        # the head (3 nodes) waits for job 1 (on 2 nodes until t=1000); job 0 holds one
        # node and is lent the idle one meanwhile (1/4 of the cluster for 980 s pays)
        answer = fake.ask(invocation(20.0, [job_json(0, state=RUNNING, nodes=[0], **elastic),
                                            rigid, head], nodes_of(4, held={0: 0, 1: 1, 2: 1})))
        assert answer == [{"id": 0, "assigned_node_ids": [0, 3],
                           "assigned_num_gpus_per_node": 0, "kill_flag": False}]
        # a one-node job comes: job 0 gives the loan back (its last node), promised to it
        small = job_json(3, size=1, walltime=100, submit=100)
        answer = fake.ask(invocation(100.0, [job_json(0, state=RUNNING, nodes=[0, 3], **elastic),
                                             rigid, head, small],
                                     nodes_of(4, held={0: 0, 3: 0, 1: 1, 2: 1}), kind=1, job_id=3))
        assert answer == [{"id": 0, "assigned_node_ids": [0], "assigned_num_gpus_per_node": 0,
                           "kill_flag": False}]
        # back at job 0's scheduling point: the promise is kept on node 3
        answer = fake.ask(invocation(110.0, [job_json(0, state=RUNNING, nodes=[0], **elastic),
                                             rigid, head, small],
                                     nodes_of(4, held={0: 0, 1: 1, 2: 1}), kind=4, job_id=0))
        assert answer == [{"id": 3, "assigned_node_ids": [3], "assigned_num_gpus_per_node": 0,
                           "kill_flag": False}]
        stats = fake.finish()
    assert stats["decisions"] == {"start": 1, "grow": 1, "shrink": 1} and stats["refused"] == 0


class Unruly(Policy):
    """Decides what the state does not allow, and one thing it does."""

    name = "unruly"

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        return [Start(0, 5), Grow(1, 1), Start(1, 1), Start(2, 1), Start(2, 1), Start(9, 1)]


def test_a_refused_decision_is_logged_counted_and_not_sent(tmp_path, caplog):
    jobs = [job_json(0, size=2), job_json(1, state=RUNNING, size=1, nodes=[0], start=0.0),
            job_json(2, size=1)]
    bridge, target = bridged(Unruly())
    with caplog.at_level(logging.WARNING, logger="apgas_scheduler.elastisim"), \
            elastisim(tmp_path, target) as fake:
        answer = fake.ask(invocation(1.0, jobs, nodes_of(4, held={0: 1})))
        stats = fake.finish()
    assert [j["id"] for j in answer] == [2] and answer[0]["assigned_node_ids"] == [1]
    assert stats["refused"] == 5 and stats["decisions"]["start"] == 1
    said = "\n".join(r.getMessage() for r in caplog.records)
    for line in ("ignored Start(job=0, nodes=5) at t=1.0: 5 node(s) outside its [2, 2]",
                 "ignored Grow(job=1, nodes=1) at t=1.0: job 1 is rigid; only malleable",
                 "ignored Start(job=1, nodes=1) at t=1.0: job 1 is running, not queued",
                 "ignored Start(job=2, nodes=1) at t=1.0: job 2 is running, not queued",
                 "ignored Start(job=9, nodes=1) at t=1.0: there is no job 9"):
        assert line in said, said


@pytest.mark.parametrize("raw, words", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not an object: [1, 2]"),
    (json.dumps({"code": 123}).encode(), "code 0x7b"),
    (json.dumps(invocation("soon", [], [])).encode(), "'time' is 'soon', not a number"),  # type: ignore[arg-type]
    (json.dumps(invocation(0.0, [], [], kind=7)).encode(), "'invocation_type' is 7"),
    (json.dumps(invocation(0.0, [], [], kind=1)).encode(), "'job_id' is None"),
    (json.dumps(invocation(0.0, [dict(job_json(3, MALLEABLE, low=2, high=4), num_nodes_min="2")],
                           nodes_of(2))).encode(),
     "jobs[0] (job 3): 'num_nodes_min' is '2', not an integer"),
    (json.dumps(invocation(0.0, [job_json(4, MALLEABLE, low=3, high=2)], nodes_of(2))).encode(),
     "job 4): its nodes [3, 2]"),
    (json.dumps(invocation(0.0, [job_json(5, state=11)], nodes_of(2))).encode(), "'state' is 11"),
    (json.dumps(invocation(0.0, [job_json(6, state=RUNNING, nodes=[7])], nodes_of(2))).encode(),
     "job 6 is assigned node 7, which is not listed"),
    (json.dumps(invocation(0.0, [job_json(0, state=RUNNING, nodes=[1]),
                                 job_json(1, state=RUNNING, nodes=[1])], nodes_of(2))).encode(),
     "node 1 is assigned to job 0 and job 1"),
    (json.dumps(invocation(0.0, [job_json(0, state=RUNNING, nodes=[1, 1])], nodes_of(2))).encode(),
     "job 0 lists a node twice: [1, 1]"),
    (json.dumps(invocation(0.0, [job_json(-1)], nodes_of(2))).encode(), "'id' is -1, not a job id"),
    (json.dumps(invocation(0.0, [job_json(8, args={"flops": "lots"})], nodes_of(2))).encode(),
     "job 8: argument 'flops' is 'lots', not a number"),
    (json.dumps(invocation(0.0, [], [{"id": 0, "state": 0, "gpus": []}])).encode(),
     "nodes[0] (node 0) has no 'assigned_jobs'"),
])
def test_a_malformed_message_is_an_error_that_names_the_value(raw, words):
    with pytest.raises(es.ProtocolError) as e:
        es.Bridge(get_policy("easy")).handle(raw)
    assert words in str(e.value)


def test_a_malformed_message_ends_the_loop_with_the_error(tmp_path):
    bridge, target = bridged("easy")
    with elastisim(tmp_path, target) as fake:
        fake.sock.send(json.dumps({"code": es.INVOKE_SCHEDULING, "time": 0.0}).encode())
        error = fake.error()
    assert isinstance(error, es.ProtocolError)
    assert "the invocation has no 'invocation_type'" in str(error)


def test_elastisim_going_away_or_an_oversized_message_ends_the_loop(tmp_path):
    bridge, target = bridged("easy", max_message=4096)
    with elastisim(tmp_path, target) as fake:
        fake.ask(invocation(0.0, [], nodes_of(2)))
        fake.sock.send(json.dumps(invocation(1.0, [job_json(i) for i in range(40)],
                                             nodes_of(2))).encode())
        error = fake.error()
    assert "closed the connection before its finalize" in str(error)
    assert "over 4096 bytes" in str(error)
    bridge, target = bridged("easy")
    with elastisim(tmp_path, target) as fake:
        fake.ask(invocation(0.0, [], nodes_of(2)))
        fake.sock.close(linger=0)  # ElastiSim died
        assert "closed the connection" in str(fake.error())


def test_the_subcommand_writes_its_counts_and_names_the_known_policies(tmp_path, capsys):
    stats = tmp_path / "stats.json"
    cli = lambda url: main(["elastisim", "--policy", "easy", "--url", url,  # noqa: E731
                            "--stats", str(stats)])
    with elastisim(tmp_path, cli) as fake:
        fake.ask(invocation(0.0, [job_json(0, size=1, walltime=10)], nodes_of(1), kind=1, job_id=0))
        assert fake.finish() == 0
    written = json.loads(stats.read_text())
    assert written["decisions"]["start"] == 1 and written["invocations"] == 1
    assert written["policy"] == "easy" and written["finalized"] is True
    assert main(["elastisim", "--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'nope'; known:" in err and "lending" in err and "fcfs" in err


# -- every policy against a model of ElastiSim ---------------------------------------------------

class Model:
    """ElastiSim's bookkeeping, as far as answers go: it applies each answer as
    ``handleSchedule`` does and fails where ElastiSim would abort or where a node
    would be given twice. Jobs follow the application model of the Kassel inputs
    (Amdahl, ``flops`` and ``parallel_percentage``); a reconfiguration takes effect
    at the next step (its scheduling point), and an ended job's nodes are
    deallocated then (before, they are busy and no active job holds them)."""

    SPEED = 1e12

    def __init__(self, nodes: int, jobs: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.specs = jobs
        self.state = {j["id"]: 0 for j in jobs}  # TO_BE_SUBMITTED
        self.assigned: dict[int, list[int]] = {}
        self.executing: dict[int, list[int]] = {}
        self.listed: dict[int, list[int]] = {}  # what toJson shows: kept after the end
        self.leaving: dict[int, list[int]] = {}  # ended jobs' nodes, deallocated at the next step
        self.done: dict[int, float] = {}  # work done, in flop
        self.now = 0.0

    def _speedup(self, jid: int, n: int) -> float:
        p = float(self.specs[jid]["arguments"]["parallel_percentage"])
        return 1 / ((1 - p) + p / n)

    def running_on(self, node: int) -> list[int]:
        return [j for where in (self.executing, self.leaving) for j, nodes in where.items()
                if node in nodes]

    def expected(self, node: int) -> list[int]:
        return [j for j, nodes in self.assigned.items()
                if node in nodes and node not in self.executing.get(j, [])]

    def message(self) -> dict[str, Any]:
        jobs = []
        for spec in self.specs:
            jid = spec["id"]
            if self.state[jid] == 0:
                continue
            jobs.append(dict(spec, state=self.state[jid], assigned_nodes=self.listed.get(jid, [])))
        nodes = []
        for n in range(self.nodes):
            state = ALLOCATED if self.running_on(n) else RESERVED if self.expected(n) else FREE
            nodes.append(node_json(n, state, self.running_on(n)))
        return invocation(self.now, jobs, nodes)

    def apply(self, answer: list[dict[str, Any]]) -> None:
        given: set[int] = set()
        for change in answer:
            jid, ids = change["id"], change["assigned_node_ids"]
            spec, state = self.specs[jid], self.state[jid]
            assert not change["kill_flag"]
            assert len(set(ids)) == len(ids) and not given & set(ids), f"a node given twice: {answer}"
            given |= set(ids)
            low, high = ((spec["num_nodes"],) * 2 if spec["type"] == RIGID
                         else (spec["num_nodes_min"], spec["num_nodes_max"]))
            assert low <= len(ids) <= high, f"job {jid}: {len(ids)} nodes outside [{low}, {high}]"
            new = [n for n in ids if n not in self.executing.get(jid, [])]
            for n in new:
                others = [j for j in self.running_on(n) + self.expected(n) if j != jid]
                assert not others, f"node {n} given to job {jid} while job(s) {others} hold it"
            self.listed[jid] = list(ids)
            if state == PENDING:
                self.state[jid], spec["start_time"] = RUNNING, self.now
                self.assigned[jid] = self.executing[jid] = list(ids)
                self.done[jid] = 0.0
            elif spec["type"] == MALLEABLE and state == RUNNING:
                assert ids != self.executing[jid], f"job {jid} listed unchanged"
                self.assigned[jid], self.state[jid] = list(ids), PENDING_RECONFIGURATION
            else:
                raise AssertionError(f"ElastiSim aborts: job {jid} (type {spec['type']}) "
                                     f"in state {state} listed")

    def step(self, dt: float) -> None:
        self.now += dt
        self.leaving.clear()
        for jid, state in self.state.items():
            if state in (RUNNING, PENDING_RECONFIGURATION):
                n = len(self.executing[jid])
                self.done[jid] += dt * self.SPEED * self._speedup(jid, n)
                if self.done[jid] >= float(self.specs[jid]["arguments"]["flops"]):
                    self.state[jid] = COMPLETED  # nodes expected by it are free at once
                    self.leaving[jid] = self.executing.pop(jid)
                    self.assigned.pop(jid)
                elif state == PENDING_RECONFIGURATION:  # its scheduling point
                    self.executing[jid] = self.assigned[jid]
                    self.state[jid] = RUNNING
            elif state == 0 and self.specs[jid]["submit_time"] <= self.now:
                self.state[jid] = PENDING


def workload() -> list[dict[str, Any]]:
    """Rigid, moldable and malleable jobs of the Kassel generator's kind."""
    jobs = []
    for i in range(14):
        kind = (RIGID, MALLEABLE, MOLDABLE, MALLEABLE)[i % 4]
        size = (1, 2, 4, 3, 2, 6, 1)[i % 7]
        args = {"flops": 1e12 * (60 + 37 * (i % 5)) * size, "parallel_percentage": 0.99,
                "num_nodes_pref": size, "divide": 1}
        jobs.append(job_json(i, kind, size=size, low=max(1, size // 2), high=min(8, 2 * size),
                             submit=float((0, 0, 0, 0, 100, 150, 160, 170, 400, 410, 420, 700, 705,
                                           710)[i]), args=args))
    return jobs


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", policy_names())
def test_every_policy_finishes_every_job_and_gives_no_node_twice(name):
    model = Model(8, workload())
    bridge = es.Bridge(get_policy(name))
    for _ in range(2000):
        model.step(5.0)
        if all(s == COMPLETED for s in model.state.values()):
            break
        answer = bridge.handle(json.dumps(model.message()).encode())
        assert answer is not None
        model.apply(answer["jobs"])
    assert all(s == COMPLETED for s in model.state.values()), model.state
    assert bridge.stats["refused"] == 0, bridge.stats
    assert bridge.stats["decisions"]["start"] == len(model.specs)
    if name not in ("fcfs", "backfill", "easy", "evolving"):  # those never resize on their own
        assert bridge.stats["decisions"]["grow"] + bridge.stats["decisions"]["shrink"] > 0
