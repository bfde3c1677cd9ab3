"""The scheduler's attacks of the security audit of issue 52 (3, 4, 6, 7 and 11).

Each test plays one attack against the scheduler's pure state (the Slurm
planner, the engine, the parsers) or an in-process scheduler with fake
processes, and checks that it is refused or bounded, and what the system says.
"""

from __future__ import annotations

import logging
import types

import pytest
from conftest import eventually

from apgas import auth
from apgas.protocol import ascii_int
from apgas_scheduler._model import Start
from apgas_scheduler.engine import Engine, Tracked
from apgas_scheduler.jobs import JobSpec, parse_job
from apgas_scheduler.live.asks import Asks
from apgas_scheduler.live.core import SchedulerCore
from apgas_scheduler.live.processes import QUICK_ENDS, QUICK_RUN, REQUEUE_WINDOW, Processes
from apgas_scheduler.live.records import Job
from apgas_scheduler.live.server import Server
from apgas_scheduler.live.views import lost_places
from apgas_scheduler.metrics import read_events
from apgas_scheduler.policies import get_policy
from apgas_scheduler.sim import swf
from apgas_scheduler.slurm import mailbox
from apgas_scheduler.slurm.commands import _seconds
from apgas_scheduler.slurm.view import Planner, parse_jobs

pytestmark = pytest.mark.timeout(60)

NODES = ["node1", "node2", "node3", "node4"]
ODD_DIGITS = ["²", "٣", "１", "⁴", "𝟗"]  # str.isdigit() is True for each; int() fails or reads a digit


def squeue_job(job_id: int, state: str, nodes: str = "", count: int = 1, *, name: str = "j",
               reason: str = "None", comment: str = "", tres_nodes: int | None = None,
               submit: int = 1000, user: int = 1000, **extra: object) -> dict:
    """One entry of ``squeue --json`` (Slurm 22.05's shape)."""
    low = count if tres_nodes is None else tres_nodes
    return {"job_id": job_id, "user_id": user, "name": name, "job_state": state,
            "partition": "debug", "nodes": nodes, "node_count": count, "max_nodes": 0,
            "time_limit": 60, "submit_time": submit, "start_time": 1010, "resize_time": 0,
            "state_reason": reason, "comment": comment, "admin_comment": "",
            "tres_req_str": f"cpu={low},mem=1M,node={low},billing={low}", **extra}


# -- attack 3: one job name stopped the Slurm controller --------------------------------------

def test_ascii_int_takes_ascii_digits_only():
    assert ascii_int("0") == 0 and ascii_int("27100") == 27100
    for text in [*ODD_DIGITS, "", " 7", "7 ", "+7", "-7", "1_0", "7\n", "0x1f", "1e3", "9" * 65]:
        assert ascii_int(text) is None, repr(text)
    assert ascii_int("12", max_digits=1) is None


def test_a_held_job_named_companion_of_a_superscript_stops_no_pass_of_the_slurm_planner():
    """``apgas-companion-²`` (a held job of any user): every pass used to fail with
    "invalid literal for int()"; now it is an ordinary job and the pass resizes."""
    for digit in ODD_DIGITS:
        jobs = parse_jobs({"jobs": [
            squeue_job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
            squeue_job(2, "PENDING", count=2, reason="Resources", submit=1100),
            squeue_job(3, "PENDING", name=f"apgas-companion-{digit}", reason="JobHeldUser",
                       user=2000),
            squeue_job(4, "RUNNING", "node4", name=f"apgas-companion-{digit}", user=1000)]})
        planner = Planner(get_policy("thrifty", resize_interval=0))
        orders = planner.plan(1200.0, jobs, NODES)
        assert [(j.id, o.verb) for j, o in orders] == [(1, "shrink")], digit


def test_a_signature_time_of_odd_digits_is_an_auth_error_not_a_crash():
    for digit in ODD_DIGITS:
        line = f"{auth.TAG} 17{digit}0 {'a' * 16} {'b' * auth._MAC_HEX} {{\"op\": \"status\"}}"
        with pytest.raises(auth.AuthError, match="malformed signature"):
            auth.parse_signed(line)


def test_a_job_message_naming_an_odd_digit_job_id_matches_no_job():
    server = Server.__new__(Server)
    server.core = types.SimpleNamespace(jobs={2: types.SimpleNamespace(state="running", reports="")})
    for digit in ODD_DIGITS:
        assert server.find_job(f"127.0.0.1:{digit}") is None, digit
    assert server.find_job("127.0.0.1:2") is server.core.jobs[2]


def test_slurm_time_limits_read_ascii_digits_only():
    assert _seconds("1-02:03:04") == ((24 + 2) * 3600 + 3 * 60 + 4)
    assert _seconds("²-00:00:10") == 10  # the odd day count is no number: no crash


def test_order_texts_and_trace_headers_keep_their_ascii_grammar():
    assert mailbox.parse_order("apgas-order 1 shrink ²") is None
    assert swf._positive({"MaxNodes": "٣"}, "MaxNodes") is None
    assert swf._positive({"MaxNodes": "144"}, "MaxNodes") == 144


# -- in-process scheduler parts, on a clock of the test's ------------------------------------

def spec(name: str, nodes: int, requeue: int = 0) -> JobSpec:
    return parse_job({"name": name, "command": ["true"], "class": "rigid", "nodes": nodes,
                      "walltime": 60, "requeue": requeue}, f"{name}.toml")


@pytest.fixture
def core(tmp_path):
    """A scheduler's shared state on 4 nodes under FCFS (its store in ``tmp_path``),
    with a clock the test sets (``core.clock[0]``)."""
    made = SchedulerCore(NODES, get_policy("fcfs"), None, tmp_path / "state")
    made.clock = [0.0]
    made.now = lambda: made.clock[0]
    yield made
    made.close()


def running(core: SchedulerCore, job_id: int, owner: int, nodes: int) -> Job:
    job = Job(job_id, spec(f"job{job_id}", nodes), core.now(), owner)
    core.engine.submit(job)
    core.engine.start(job, nodes, core.now())
    return job


def started(core: SchedulerCore) -> list[int]:
    return [d.job for d in core.engine.decide(core.now()) if isinstance(d, Start)]


# -- attack 4: one job's PlaceLost reports took every node from everyone ------------------------

def test_one_job_reporting_every_node_lost_quarantines_them_for_a_bounded_time(core):
    asks = Asks(core, orders=None)
    core.quarantine = 300.0
    attacker = running(core, 1, owner=1000, nodes=4)
    with core.lock:
        for node in NODES:
            asks.place_lost(attacker, node)
        core.engine.end(attacker, "failed", core.now())
        victim = Job(2, spec("victim", 4), core.now(), 1001)
        core.engine.submit(victim)
    assert core.engine.down == set(NODES) and started(core) == []  # the report takes the nodes
    assert core.engine.quarantine == dict.fromkeys(NODES, 300.0)
    down = [e for e in core.store.events() if e["event"] == "node_down"]
    assert [(e["until"], e["owner"]) for e in down] == [(300.0, 1000)] * 4
    assert "out of service for 300 s (a quarantine)" in down[0]["reason"]
    core.clock[0] = 299.0
    asks.end_quarantines()
    assert core.engine.free == 0
    core.clock[0] = 300.0
    asks.end_quarantines()  # each pass does
    assert core.engine.down == set() and core.engine.free == 4 and started(core) == [2]
    (up,) = [e for e in core.store.events() if e["event"] == "node_up"]
    assert up["nodes"] == NODES and up["quarantine"] is True


def test_a_node_is_down_until_node_up_only_when_jobs_of_two_users_lost_places_there(core):
    asks = Asks(core, orders=None)
    core.quarantine = 10.0
    with core.lock:
        first = running(core, 1, owner=1000, nodes=1)
        asks.place_lost(first, "node1")
        core.engine.end(first, "failed", core.now())
        core.clock[0] = 10.0
        asks.end_quarantines()
        again = running(core, 2, owner=1000, nodes=1)  # the same user's second job: quarantine
        asks.place_lost(again, "node1")
        assert core.engine.quarantine == {"node1": 20.0}
        core.engine.end(again, "failed", core.now())
        core.clock[0] = 20.0
        asks.end_quarantines()
        other = running(core, 3, owner=2000, nodes=1)  # another user's job agrees
        asks.place_lost(other, "node1")
    assert "node1" in core.engine.down and core.engine.quarantine == {}
    assert list(core.store.events())[-2]["reason"] == "job 3 lost its place there, as a job of " \
                                                "another user had"
    core.clock[0] = 10 ** 6
    asks.end_quarantines()
    assert "node1" in core.engine.down  # until the operator's node-up
    core.engine.node_up("node1")
    assert core.engine.reporters == {} and "node1" not in core.engine.down


def test_a_quarantine_and_its_reporters_survive_a_restart(tmp_path):
    events = [{"t": 0, "event": "pool", "nodes": NODES},
              {"t": 1, "event": "node_down", "nodes": ["node1"], "job": 1, "owner": 1000,
               "until": 301.0},
              {"t": 2, "event": "node_down", "nodes": ["node2"], "job": 1},  # an older log's
              {"t": 3, "event": "node_down", "nodes": ["node3"], "job": 1, "owner": 1000,
               "until": 5.0},
              {"t": 5, "event": "node_up", "nodes": ["node3"], "quarantine": True}]
    down, reporters = lost_places(events)
    assert down == {"node1": 301.0, "node2": None}
    assert reporters == {"node1": {1000}, "node2": {None}, "node3": {1000}}


# -- attacks 6 and 7: a requeued job kept its place in the queue ---------------------------------

def processes(core: SchedulerCore, tmp_path) -> Processes:
    return Processes(core, None, local=True, address=("127.0.0.1", 0),  # type: ignore[arg-type]
                     advertised="127.0.0.1", output_dir=tmp_path, output_fd=-1, outcomes=None,
                     node_addresses={}, order_port_base=27100)


def test_a_job_cancelled_at_once_and_requeued_later_queues_behind_the_jobs_since(core, tmp_path):
    """Attack 6: submit with ``requeue = 100``, cancel at once, requeue later: it came
    back with its first submit time, ahead of every job submitted meanwhile."""
    procs = processes(core, tmp_path)
    with core.lock:
        banked = Job(1, spec("banked", 4, requeue=100), core.now(), 1000)
        core.engine.submit(banked)
        procs.end(banked, "cancelled", "cancelled by the user")
        core.clock[0] = 2.0
        honest = Job(2, spec("honest", 4), core.now(), 1001)
        core.engine.submit(honest)
        core.clock[0] = 3.0
        assert procs.ask_requeue(banked, "user 1000") == "queued"
    assert banked.submit == 3.0 and started(core) == [2]  # behind the job submitted meanwhile


def test_a_job_that_ended_long_ago_is_not_requeued(core, tmp_path):
    procs = processes(core, tmp_path)
    with core.lock:
        old = Job(1, spec("old", 1, requeue=100), core.now(), 1000)
        core.engine.submit(old)
        procs.end(old, "cancelled", "cancelled by the user")
        core.clock[0] = REQUEUE_WINDOW + 1.0
        with pytest.raises(ValueError, match=r"job 1 ended \(cancelled\) 601 s ago; a job is "
                                             r"requeued within 600 s of its end: submit it again"):
            procs.ask_requeue(old, "user 1000")
    assert old.state == "cancelled" and old.requeues == 0


def test_a_requeued_job_queues_behind_the_jobs_submitted_before_its_requeue():
    """Attacks 6 and 7 in the engine: the requeue is a fresh submit time."""
    engine = Engine(NODES, get_policy("fcfs"))
    first = Tracked(1, "rigid", 4, 4, 60.0, submit=0.0)
    engine.submit(first)
    engine.start(first, 4, 1.0)
    engine.submit(Tracked(2, "rigid", 4, 4, 60.0, submit=2.0))
    engine.requeue(first, 5.0)
    assert first.submit == 5.0
    assert [d.job for d in engine.decide(5.0) if isinstance(d, Start)] == [2]


@pytest.mark.timeout(120)
def test_a_job_that_kills_itself_neither_runs_ahead_of_others_nor_forever(make_scheduler,
                                                                            tmp_path):
    """Attack 7: a job with ``requeue = 100`` that SIGKILLs itself ran back to back, first
    in the queue every time, while a job submitted meanwhile waited. Now each requeue
    queues it behind that job, and after QUICK_ENDS quick deaths it ends failed."""
    sched = make_scheduler(nodes=1, policy="fcfs")
    runs, go = tmp_path / "runs", tmp_path / "go"
    script = (f"echo x >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; kill -9 $$")
    dying = sched.submit(JobSpec("dying", ("/bin/sh", "-c", script), "rigid", 1, 1, 60.0, (),
                                 str(tmp_path), requeue=100))
    eventually(lambda: runs.exists(), "the dying job runs")
    waiting = sched.submit(JobSpec("waiting", ("true",), "rigid", 1, 1, 60.0, (), str(tmp_path)))
    go.touch()
    done = eventually(lambda: (j := sched.status()["jobs"])[dying - 1]["state"] == "failed"
                      and j, "the dying job is given up", 90)
    starts = [e["job"] for e in read_events(tmp_path / "events.jsonl") if e["event"] == "start"]
    assert starts == [dying, waiting, dying, dying], starts
    assert done[waiting - 1]["state"] == "done"
    assert done[dying - 1]["requeues"] == QUICK_ENDS - 1 == 2
    assert done[dying - 1]["reason"].startswith("killed by signal 9 (SIGKILL); see ")
    assert (f"not requeued again: its last {QUICK_ENDS} runs each ended within {QUICK_RUN:g} s "
            "of their start (the last: its program (place 0) was killed by signal 9 (SIGKILL)); "
            "its owner may requeue it") in done[dying - 1]["reason"]


# -- attack 11: the Slurm planner shrank others for a job it cannot place -----------------------

@pytest.mark.parametrize("constraint", [{"required_nodes": "node4"}, {"excluded_nodes": "node[1-2]"},
                                        {"features": "gpu"}, {"reservation": "maint"},
                                        {"dependency": "afterok:7"}, {"licenses": "matlab:1"},
                                        {"contiguous": True}])
def test_the_slurm_planner_shrinks_nobody_for_a_pending_job_it_cannot_model(constraint, caplog):
    jobs = parse_jobs({"jobs": [
        squeue_job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0", user=1000),
        squeue_job(2, "PENDING", count=2, reason="Resources", submit=1100, user=2000,
                   **constraint)]})
    planner = Planner(get_policy("thrifty", resize_interval=0))
    with caplog.at_level(logging.INFO, logger="apgas_scheduler.slurm.controller"):
        assert planner.plan(1200.0, jobs, NODES) == []
        assert planner.plan(1300.0, jobs, NODES) == []  # and keeps it so while it pends
    (name,) = constraint
    said = [r.getMessage() for r in caplog.records if "cannot model" in r.getMessage()]
    assert said == [f"pending job 2 asks for {name}, which the planner cannot model: no job is "
                    "resized for it (Slurm starts it where it may)"]  # once
    unconstrained = parse_jobs({"jobs": [
        squeue_job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
        squeue_job(2, "PENDING", count=2, reason="Resources", submit=1100,
                   required_nodes="", excluded_nodes="(null)", contiguous=False)]})
    orders = Planner(get_policy("thrifty", resize_interval=0)).plan(1200.0, unconstrained, NODES)
    assert [(j.id, o.verb) for j, o in orders] == [(1, "shrink")]
