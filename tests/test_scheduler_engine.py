"""The scheduling engine alone (no sockets, no processes, no clock): its
transitions, the checks of decisions, the views, and evolving asks answered
through ``Policy.answer``."""

from __future__ import annotations

import logging

import pytest

from apgas_scheduler._model import Grow, Shrink, Start
from apgas_scheduler.engine import Engine, Tracked
from apgas_scheduler.policies import get_policy


def engine(policy: str = "evolving", nodes: int = 4) -> Engine:
    return Engine([f"n{i}" for i in range(nodes)], get_policy(policy, resize_interval=0))


def running(eng: Engine, job: Tracked, count: int, now: float = 0.0) -> Tracked:
    eng.submit(job)
    assert eng.admit(Start(job.id, count), now)
    eng.start(job, count, now)
    job.ready = True
    job.touch()
    return job


def test_refused_decisions_are_logged_with_their_reason(caplog):
    eng = engine()
    rigid = running(eng, Tracked(1, "rigid", 2, 2, 10.0, 0.0), 2)
    evo = running(eng, Tracked(2, "evolving", 1, 3, 10.0, 0.0), 1)
    eng.submit(Tracked(3, "rigid", 2, 2, 10.0, 0.0))
    cases = {
        Start(1, 2): "job 1 is running, not queued",
        Start(3, 1): "1 node(s) outside its [2, 2]",
        Start(3, 2): "2 node(s) asked, 1 free",
        Grow(1, 1): "job 1 is rigid; only malleable and evolving jobs are resized",
        Grow(2, 3): "4 node(s) outside its [1, 3]",
        Shrink(2, 1): "0 node(s) outside its [1, 3]",
        Grow(9, 1): "there is no job 9",
    }
    with caplog.at_level(logging.WARNING, logger="apgas_scheduler.engine"):
        for d, reason in cases.items():
            assert eng.refusal(d) == reason
            assert not eng.admit(d, 5.0)
    assert all(reason in caplog.text for reason in cases.values())
    assert eng.admit(Grow(2, 1), 5.0)
    hosts, _ = eng.begin_grow(evo, 1, 5.0)
    assert hosts == ["n3"] and eng.free == 0 and evo.view().nodes == 2
    assert eng.refusal(Shrink(2, 1)) == "job 2 takes no order now (not registered, or one in flight)"
    assert eng.finish_grow(evo, hosts, True, 6.0) == ["n3"]
    assert evo.nodes == ["n2", "n3"] and evo.view().resizable and rigid.view().nodes == 2


def test_a_shrink_in_flight_counts_as_done_and_its_nodes_come_back_later():
    eng = engine("malleable")
    job = running(eng, Tracked(1, "malleable", 1, 4, 10.0, 0.0), 4)
    eng.begin_shrink(job, 2, 1.0)
    assert job.view().nodes == 2 and not job.view().resizable and eng.free == 0
    assert eng.finish_shrink(job, 2, ["n3", "n2", "elsewhere"]) == ["n3", "n2"]
    assert eng.free == 2 and eng.free_nodes() == ["n2", "n3"] and job.view().nodes == 2
    assert eng.owner == {"n0": 1, "n1": 1, "n2": None, "n3": None}


def test_requests_are_granted_by_the_policy_pass():
    eng = engine()
    job = running(eng, Tracked(1, "evolving", 1, 3, 10.0, 0.0), 1)
    assert eng.request(job, 3, 1.0) == ("job 1 asks for 3 more node(s) but holds 1 and may "
                                        "have at most 3")
    assert eng.request(job, 2, 1.0) is None
    assert job.view().requested == 2 and job.view().requested_since == 1.0
    decisions = eng.decide(2.0)
    assert decisions == [Grow(1, 2)] and eng.admit(decisions[0], 2.0)
    hosts, counted = eng.begin_grow(job, 2, 2.0)
    assert hosts == ["n1", "n2"] and counted == 2 and job.requested == 0


def test_a_check_is_answered_through_the_policy_and_set_in_motion():
    """DMR's check_status, no sockets: expand on idle nodes, then shrink for a
    queued job, which then has priority over requests."""
    eng = engine("dmr")
    job = running(eng, Tracked(1, "evolving", 1, 4, 100.0, 0.0, asks=True), 1)
    d, hosts, _ = eng.answer_check(job, 1, 4, 0, 1, 1.0)
    assert d == Grow(1, 3) and hosts == ["n1", "n2", "n3"] and job.size == 4
    eng.finish_grow(job, hosts, True, 2.0)
    assert eng.answer_check(job, 1, 4, 0, 1, 3.0) == (None, [], 0)  # nothing waits
    eng.submit(Tracked(2, "rigid", 2, 2, 10.0, 3.0))
    d, _, _ = eng.answer_check(job, 1, 4, 0, 1, 4.0)
    assert d == Shrink(1, 2) and job.size == 2 and eng.priority == 2
    queue, _ = eng.views()
    assert queue[0].priority
    eng.finish_shrink(job, 2, ["n2", "n3"], 5.0)
    assert eng.decide(5.0) == [Start(2, 2)]
    with pytest.raises(ValueError, match=r"\[5, 6\] does not meet the job's limits \[1, 4\]"):
        eng.answer_check(job, 5, 6, 0, 1, 6.0)


def test_ending_frees_everything_and_drops_requests():
    eng = engine()
    job = running(eng, Tracked(1, "evolving", 1, 4, 10.0, 0.0), 2)
    eng.request(job, 1, 0.0)
    eng.begin_grow(eng.jobs[1], 1, 0.0)
    eng.request(job, 1, 0.0)
    assert eng.end(job, "done", 3.0) == 1
    assert eng.free == 4 and job.state == "done" and not eng.running
    assert [j for j, _ in eng.overdue(100.0, 1.0)] == []


def test_a_drained_free_node_leaves_at_once_and_a_held_one_when_given_back():
    """A restarted live scheduler not given a node again drains it: free, it goes at
    once; held, it stays its job's, is no capacity for new work (not free, not
    usable, never a grow's) and goes when the job gives it back."""
    eng = engine("malleable")
    job = running(eng, Tracked(1, "malleable", 1, 4, 100.0, 0.0), 2)  # on n0, n1
    assert eng.drain("n3") is True and "n3" not in eng.owner and eng.left == ["n3"]
    assert eng.drain("n1") is False and eng.owner["n1"] == 1
    assert (eng.total, eng.usable, eng.free, eng.free_nodes()) == (2, 2, 1, ["n2"])
    assert eng.refusal(Grow(1, 2)) == "2 node(s) asked, 1 free"
    eng.submit(Tracked(2, "rigid", 2, 2, 10.0, 0.0))
    assert eng.refusal(Start(2, 2)) == "2 node(s) asked, 1 free"
    hosts, _ = eng.begin_grow(job, 1, 1.0)
    assert hosts == ["n2"]  # the only free one, never the draining n1
    eng.finish_grow(job, hosts, True, 2.0)
    eng.begin_shrink(job, 1, 3.0)
    assert eng.finish_shrink(job, 1, ["n1"], 4.0) == ["n1"]
    assert "n1" not in eng.owner and not eng.draining and eng.left == ["n3", "n1"]
    assert eng.free_nodes() == [] and eng.total == eng.usable == 2
    eng.end(job, "done", 5.0)
    assert eng.free_nodes() == ["n0", "n2"]  # in pool order, indices rebuilt
    with pytest.raises(ValueError, match="node n1 is not in the pool"):
        eng.drain("n1")


def test_a_drained_node_leaves_when_its_job_ends_releases_or_loses_it():
    eng = engine("fcfs")
    job = running(eng, Tracked(1, "rigid", 2, 2, 100.0, 0.0), 2)
    eng.drain("n0")
    eng.end(job, "done", 1.0)
    assert list(eng.owner) == ["n1", "n2", "n3"] and eng.free == 3 and eng.left == ["n0"]
    eng = engine("malleable")
    job = running(eng, Tracked(1, "malleable", 1, 4, 100.0, 0.0), 3)
    for node in ("n0", "n1"):
        eng.drain(node)
    assert eng.release(job, "n0") == "shrink" and "n0" not in eng.owner
    assert eng.place_lost(job, "n1") and "n1" not in eng.owner and not eng.down  # gone, not down
    assert eng.usable == 2 and eng.free == 1


def test_a_drained_node_added_again_stops_draining_and_a_down_one_just_leaves():
    eng = engine("fcfs")
    job = running(eng, Tracked(1, "rigid", 1, 1, 100.0, 0.0), 1)
    eng.drain("n0")
    assert eng.total == 3
    eng.add_nodes(["n0", "n9"])  # the operator gives it back (and a new one)
    assert not eng.draining and eng.total == eng.usable == 5 and eng.owner["n0"] == 1
    eng.end(job, "done", 1.0)
    assert eng.owner["n0"] is None and "n0" in eng.free_nodes() and eng.left == []
    with pytest.raises(ValueError, match="not in the pool"):
        eng.add_nodes(["n1"])
    eng.set_down("n2")
    assert eng.drain("n2") is True and "n2" not in eng.down and eng.usable == 4
