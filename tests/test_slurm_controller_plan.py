"""The Slurm controller's pure parts: the order grammar in Slurm's job fields, and
the planner that runs our policies on ``squeue --json``/``sinfo --json`` documents
(shaped as Debian's Slurm 22.05 prints them)."""

from __future__ import annotations

import logging

import pytest

from apgas_scheduler.policies import get_policy
from apgas_scheduler.slurm import mailbox
from apgas_scheduler.slurm.controller import Controller
from apgas_scheduler.slurm.view import Planner, parse_jobs, parse_nodes

NODES = ["node1", "node2", "node3", "node4"]


def node(name: str, state: str = "allocated", partitions=("debug",)) -> dict:
    return {"name": name, "state": state, "partitions": list(partitions)}


def job(job_id: int, state: str, nodes: str = "", count: int = 1, *, max_nodes: int = 0,
        comment: str = "", admin: str = "", reason: str = "None", name: str = "j",
        tres_nodes: int | None = None, submit: int = 1000, start: int = 1010, user: int = 1000,
        limit: int | None = 60, resized: int = 0) -> dict:
    low = count if tres_nodes is None else tres_nodes
    return {"job_id": job_id, "user_id": user, "name": name, "job_state": state,
            "partition": "debug", "nodes": nodes, "node_count": count, "max_nodes": max_nodes,
            "time_limit": limit, "submit_time": submit, "start_time": start,
            "resize_time": resized, "state_reason": reason, "comment": comment,
            "admin_comment": admin, "tres_req_str": f"cpu={low},mem=1M,node={low},billing={low}"}


def sinfo(states: dict[str, str] | None = None) -> dict:
    return {"nodes": [node(n, (states or {}).get(n, "allocated")) for n in NODES], "errors": []}


def planner(policy: str = "thrifty", **options) -> Planner:
    return Planner(get_policy(policy, resize_interval=0), **options)


# -- the grammar -------------------------------------------------------------------------

def test_orders_and_answers_round_trip_and_nothing_else_parses():
    order = mailbox.Order(3, "shrink", 2)
    assert mailbox.order_text(order) == "apgas-order 3 shrink 2"
    assert mailbox.parse_order("apgas-order 3 shrink 2") == order
    assert mailbox.parse_answer("apgas ready 0") == mailbox.Answer("ready", 0)
    assert mailbox.parse_answer("apgas done 3") == mailbox.Answer("done", 3)
    assert mailbox.parse_answer("apgas off") == mailbox.Answer("off", 0)
    for text in ("", None, "apgas-order 0 shrink 2", "apgas-order 3 shrink 0", "apgas-order 3 kill 2",
                 "apgas-order 3 shrink 2; rm -rf /", "x apgas-order 3 shrink 2",
                 "apgas-order 3 shrink " + "9" * 300):
        assert mailbox.parse_order(text) is None, text
    for text in ("apgas ready", "apgas off 3", "apgas-order 3 shrink 2", "apgas done -1",
                 "apgas ready 0" + " " * 300):
        assert mailbox.parse_answer(text) is None, text
    with pytest.raises(ValueError):
        mailbox.order_text(mailbox.Order(1, "kill", 1))


# -- reading Slurm's documents -------------------------------------------------------------

def test_jobs_and_nodes_are_read_and_a_malformed_entry_is_skipped_with_its_reason(caplog):
    document = {"jobs": [job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
                         job(2, "PENDING", count=2, max_nodes=3, limit=None),
                         {"job_id": "x", "job_state": "RUNNING"}, "junk"], "errors": []}
    with caplog.at_level(logging.WARNING):
        jobs = parse_jobs(document)
    assert [j.id for j in jobs] == [1, 2]
    assert jobs[0].nodes == tuple(NODES) and jobs[0].min_nodes == 1 and jobs[0].max_nodes == 0
    assert (jobs[1].min_nodes, jobs[1].max_nodes, jobs[1].time_limit) == (2, 3, 365 * 86400.0)
    assert "skipped job 'x' of squeue: job_id is 'x', not a whole number" in caplog.text
    states = {"node1": "idle", "node2": "drained", "node3": "down", "node4": "mixed"}
    assert parse_nodes(sinfo(states), "debug") == ["node1", "node4"]
    assert parse_nodes(sinfo(), "other") == []
    with pytest.raises(ValueError, match="no job list"):
        parse_jobs({"errors": []})


# -- planning ------------------------------------------------------------------------------

def test_a_malleable_job_is_shrunk_so_that_a_pending_rigid_job_starts():
    plan = planner()
    jobs = parse_jobs({"jobs": [
        job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
        job(2, "PENDING", count=2, reason="Resources", submit=1100)]})
    orders = plan.plan(1200.0, jobs, NODES)
    assert [(j.id, o) for j, o in orders] == [(1, mailbox.Order(1, "shrink", 2))]


def test_jobs_that_did_not_opt_in_are_never_ordered():
    plan = planner()
    for comment in ("", "my own note", "apgas off", "apgas-order 1 shrink 2"):
        jobs = parse_jobs({"jobs": [
            job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment=comment),
            job(2, "PENDING", count=2, reason="Resources")]})
        assert plan.plan(1200.0, jobs, NODES) == [], comment
    # a job without a node range is not malleable, whatever its comment says
    jobs = parse_jobs({"jobs": [job(1, "RUNNING", "node[1-4]", 4, comment="apgas ready 0"),
                                job(2, "PENDING", count=2, reason="Resources")]})
    assert planner().plan(1200.0, jobs, NODES) == []


def test_idle_nodes_no_pending_job_can_use_go_to_the_malleable_job_up_to_its_maximum():
    plan = planner()
    pending = parse_jobs({"jobs": [job(1, "PENDING", count=1, max_nodes=3)]})
    plan.plan(1000.0, pending, NODES)  # seen pending: its range is remembered
    running = parse_jobs({"jobs": [job(1, "RUNNING", "node1", 1, comment="apgas ready 0")]})
    orders = plan.plan(1100.0, running, NODES)
    assert [(j.id, o) for j, o in orders] == [(1, mailbox.Order(1, "grow", 2))]
    # a job first seen running keeps the size it had then as its maximum
    fresh = planner()
    wide = parse_jobs({"jobs": [job(5, "RUNNING", "node[1-3]", 3, tres_nodes=1,
                                    comment="apgas ready 0")]})
    assert fresh.plan(1000.0, wide, NODES) == []  # one node idle, but 3 is its most
    shrunk = parse_jobs({"jobs": [job(5, "RUNNING", "node1", 1, tres_nodes=1,
                                      comment="apgas done 1", admin="apgas-order 1 shrink 2")]})
    [(_, order)] = fresh.plan(1100.0, shrunk, NODES)
    assert order == mailbox.Order(2, "grow", 2)


def test_one_order_at_a_time_and_a_silent_job_gets_no_other(caplog):
    plan = planner(order_timeout=30)
    docs = {"jobs": [job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0",
                         admin="apgas-order 1 shrink 2"),
                     job(2, "PENDING", count=2, reason="Resources")]}
    assert plan.plan(1200.0, parse_jobs(docs), NODES) == []  # order 1 is in flight
    with caplog.at_level(logging.WARNING):
        assert plan.plan(1240.0, parse_jobs(docs), NODES) == []
    assert "job 1 has not answered order 1 (apgas-order 1 shrink 2) within 30 s" in caplog.text
    docs["jobs"][0]["comment"] = "apgas failed 1"  # it answered: orders go on, numbered after
    [(_, order)] = plan.plan(1250.0, parse_jobs(docs), NODES)
    assert order == mailbox.Order(2, "shrink", 2)


def test_pending_expansions_and_jobs_held_for_other_reasons_are_not_made_room_for():
    plan = planner()
    for pending in (job(2, "PENDING", count=2, reason="Dependency"),
                    job(2, "PENDING", count=2, reason="Resources", name="apgas-expand-1")):
        jobs = parse_jobs({"jobs": [
            job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"), pending]})
        assert plan.plan(1200.0, jobs, NODES) == []


def test_the_controller_reads_twice_a_pass_and_sends_each_order_with_its_wake_up():
    import json

    calls: list[tuple[str, ...]] = []
    squeue = {"jobs": [job(1, "RUNNING", "node[1-4]", 4, tres_nodes=1, comment="apgas ready 0"),
                       *[job(10 + i, "PENDING", count=2, reason="Priority") for i in range(100)]],
              "errors": []}

    def run(*args: str, **kwargs) -> str:
        calls.append(args)
        return {"squeue": json.dumps(squeue), "sinfo": json.dumps(sinfo())}.get(args[0], "")

    controller = Controller(planner(), run)
    sent = controller.step(1200.0)
    assert sent == [(1, mailbox.Order(1, "shrink", 2))]
    assert calls[2:] == [("scontrol", "update", "JobId=1", "AdminComment=apgas-order 1 shrink 2"),
                         ("scancel", "--signal=URG", "--full", "1")]
    squeue["jobs"][0]["admin_comment"] = "apgas-order 1 shrink 2"
    assert controller.step(1201.0) == []  # in flight: reads only
    assert dict(controller.calls) == {"squeue": 2, "sinfo": 2, "scontrol": 1, "scancel": 1}


def test_a_companion_allocation_counts_as_its_jobs_nodes_only_for_the_same_user():
    plan = planner()
    pending = job(9, "PENDING", count=2, reason="Resources")
    jobs = parse_jobs({"jobs": [
        job(1, "RUNNING", "node[1-2]", 2, tres_nodes=1, comment="apgas ready 0"),
        job(2, "RUNNING", "node[3-4]", 2, name="apgas-companion-1"), pending]})
    plan.ranges[1] = (1, 4)
    [(owner, order)] = plan.plan(1200.0, jobs, NODES)
    assert owner.id == 1 and owner.nodes == tuple(NODES) and order == mailbox.Order(1, "shrink", 2)
    # somebody else naming a job after ours gains nothing: it is their own rigid job
    strangers = parse_jobs({"jobs": [
        job(1, "RUNNING", "node[1-2]", 2, tres_nodes=1, comment="apgas ready 0"),
        job(2, "RUNNING", "node[3-4]", 2, name="apgas-companion-1", user=666),
        job(9, "PENDING", count=1, reason="Resources")]})
    fresh = planner()
    fresh.ranges[1] = (1, 4)
    [(owner, order)] = fresh.plan(1200.0, strangers, NODES)
    assert owner.nodes == ("node1", "node2") and order == mailbox.Order(1, "shrink", 1)


def test_the_job_reads_its_order_from_squeues_json_not_from_text_a_comment_can_imitate(monkeypatch):
    """``scontrol show job`` prints ``Comment=... AdminComment=...`` one after the
    other: a Comment of ``x AdminComment=apgas-order 9 shrink 3`` would read there
    like an order. The job reads ``squeue --json``'s exact fields instead."""
    import json

    from apgas_scheduler.slurm import commands

    fields = job(7, "RUNNING", "node1", 1, comment="x AdminComment=apgas-order 9 shrink 3")
    monkeypatch.setattr(commands, "run", lambda *args, **kw: json.dumps({"jobs": [fields]}))
    assert commands.job_text("7", "admin_comment") == ""
    assert mailbox.parse_order(commands.job_text("7", "admin_comment")) is None
    fields["admin_comment"] = "apgas-order 2 grow 1"
    assert mailbox.parse_order(commands.job_text("7", "admin_comment")) == mailbox.Order(2, "grow", 1)
    with pytest.raises(commands.SlurmError, match="squeue does not know job 8"):
        commands.job_text("8", "admin_comment")
