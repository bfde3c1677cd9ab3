"""Thrifty, our policy: each of its three changes to minAgree, its EASY promise to
the head, its refusals, and one live run (the same object the simulator drives)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_scheduler_live import job, wait_ended, wait_for

from apgas_scheduler._model import Grow, JobView, Shrink, Start
from apgas_scheduler.metrics import compute_metrics, read_events
from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.thrifty import Thrifty
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from apgas_scheduler.sim.workload import SimJob

ROOT = Path(__file__).resolve().parent.parent
NOW = 1000.0


def queued(id: int, cls: str = "malleable", low: int = 1, high: int = 8, walltime: float = 100.0,
           submit: float = 0.0) -> JobView:
    return JobView(id, cls, low, high, walltime, submit)  # type: ignore[arg-type]


def running(id: int, nodes: int, *, low: int = 1, high: int = 8, left: float = 3600.0,
            serial: float | None = 0.05, last_resize: float | None = None) -> JobView:
    return JobView(id, "malleable", low, high, left, 0.0, nodes=nodes, start=0.0,  # type: ignore[arg-type]
                   resizable=True, preferred=nodes, expected_end=NOW + left, serial=serial,
                   last_resize=last_resize)


def test_a_malleable_job_alone_in_the_queue_starts_wide_and_one_of_several_at_its_minimum():
    policy = Thrifty()
    assert policy.decide(NOW, [queued(1, low=2, high=6)], [], 8, 8) == [Start(1, 6)]
    assert policy.decide(NOW, [queued(1, low=2, high=6), queued(2, low=2, high=6, submit=1.0)],
                         [], 8, 8) == [Start(1, 2), Start(2, 2)]


def test_each_change_can_be_turned_off_for_the_ablation():
    lone = [queued(1, low=2, high=6)]
    assert Thrifty(start_wide=False).decide(NOW, lone, [], 8, 8) == [Start(1, 2)]
    run = [JobView(9, "rigid", 4, 4, 50.0, 0.0, nodes=4, start=NOW - 1, expected_end=NOW + 50)]
    jobs = [queued(1, "rigid", 8, 8, 100.0, 0.0), queued(3, "rigid", 3, 3, 40.0, 2.0),
            queued(4, "rigid", 1, 1, 40.0, 3.0)]
    assert Thrifty(backfill="queue").decide(NOW, jobs, run, 4, 8) == [Start(3, 3), Start(4, 1)]


def test_the_least_gain_worth_a_grow_is_the_resize_interval_by_default():
    assert Thrifty(resize_interval=300.0).min_gain == 300.0
    assert Thrifty(resize_interval=15.0).min_gain == 15.0
    assert Thrifty(resize_interval=15.0, min_gain=0.0).min_gain == 0.0


def test_the_smallest_job_behind_the_head_is_backfilled_first_and_the_head_keeps_its_reservation():
    """4 free of 8; the head (rigid 8) can start when the running job ends at
    NOW + 50. Behind it: a long rigid 4 (would delay the head: never), a 3 x 40 s and
    a 1 x 40 s job. minAgree takes them in submission order (the 3, then the 1);
    thrifty takes the smaller area first, then what still fits."""
    run = [JobView(9, "rigid", 4, 4, 50.0, 0.0, nodes=4, start=NOW - 1, expected_end=NOW + 50)]
    head = queued(1, "rigid", 8, 8, 100.0, 0.0)
    long = queued(2, "rigid", 4, 4, 500.0, 1.0)
    three = queued(3, "rigid", 3, 3, 40.0, 2.0)
    one = queued(4, "rigid", 1, 1, 40.0, 3.0)
    assert Thrifty().decide(NOW, [head, long, three, one], run, 4, 8) == [Start(4, 1), Start(3, 3)]
    assert get_policy("malleable").decide(NOW, [head, long, three, one], run, 4, 8) == [
        Start(3, 3), Start(4, 1)]


def test_idle_nodes_go_only_to_grows_that_pay():
    """Two jobs on 2 nodes each, 4 idle, nobody waiting: the job with an hour left
    is grown (fewest nodes first, as minAgree), the one with 2 minutes left is not:
    two more nodes would save it less than ``min_gain``."""
    long, short = running(1, 2, left=3600.0), running(2, 2, left=120.0)
    assert Thrifty(min_gain=300.0).decide(NOW, [], [long, short], 4, 8) == [Grow(1, 2)]
    assert Thrifty(min_gain=0.0).decide(NOW, [], [long, short], 4, 8) == [Grow(1, 2), Grow(2, 2)]
    assert get_policy("malleable").decide(NOW, [], [long, short], 4, 8) == [Grow(1, 2), Grow(2, 2)]


def test_a_grow_must_gain_gamma_times_its_cost():
    job = running(1, 2, left=3600.0)
    gain = 3600.0 * (1 - job.runtime_on(8) / job.runtime_on(2))  # about 2,400 s
    cheap = Reconfig(alpha=gain / 2 / 6 - 1.0)  # cost just under half the gain
    dear = Reconfig(alpha=gain / 2 / 6 + 1.0)
    assert Thrifty(reconfig_cost=cheap).decide(NOW, [], [job], 6, 8) == [Grow(1, 6)]
    assert Thrifty(reconfig_cost=dear).decide(NOW, [], [job], 6, 8) == []


def test_a_waiting_head_shrinks_the_largest_job_and_nothing_when_it_cannot_start():
    a, b = running(1, 5, low=1), running(2, 3, low=1)
    head = queued(3, "rigid", 3, 3)
    assert Thrifty().decide(NOW, [head], [a, b], 0, 8) == [Shrink(1, 3)]
    six = queued(4, "rigid", 6, 6)  # largest first, ties to the lower id: 5,3 -> 1,1
    assert Thrifty().decide(NOW, [six], [a, b], 0, 8) == [Shrink(1, 4), Shrink(2, 2)]
    eight = queued(5, "rigid", 8, 8)  # the two can give 6 at most: nobody loses a node
    assert Thrifty().decide(NOW, [eight], [a, b], 0, 8) == []
    recent = running(1, 5, low=1, last_resize=NOW - 5)  # within resize_interval: 2 of 6 only
    assert Thrifty(resize_interval=10.0).decide(NOW, [six], [recent, b], 0, 8) == []


@pytest.mark.parametrize("options, word", [({"gamma": -1.0}, "gamma"), ({"min_gain": -5.0}, "-5.0"),
                                           ({"resize_interval": -1.0}, "resize_interval"),
                                           ({"backfill": "random"}, "'random'")])
def test_bad_options_are_refused_with_the_value(options, word):
    with pytest.raises(ValueError, match=word):
        get_policy("thrifty", **options)


def test_in_the_simulator_it_resizes_less_than_minagree_on_a_busy_mix():
    """A small busy mix of rigid and malleable jobs: thrifty's mean turnaround is no
    worse than minAgree's with fewer resizes, and its rigid jobs are no worse off
    than under EASY. (Simulated, so exact: 101,385 s against 102,119 s, 17 resizes
    against 21, rigid jobs 112,525 s against EASY's 126,097 s.)"""
    import random

    rng = random.Random(7)
    jobs = []
    for i in range(300):
        size = rng.choice([1, 2, 4, 8])
        run = rng.uniform(600, 20000)
        cls = "malleable" if i % 3 == 0 else "rigid"
        low, high = (max(1, size // 2), min(32, size * 5)) if cls == "malleable" else (size, size)
        jobs.append(SimJob(i + 1, i * 300.0, cls, low, high, size, run, run * rng.uniform(1, 3),
                           serial=0.05))
    cost = Reconfig(alpha=0.05, beta=0.05)

    def run_under(name: str):
        options = {"reconfig_cost": cost} if name == "thrifty" else {}
        return Simulator(32, get_policy(name, resize_interval=300, **options), reconfig=cost,
                         model="amdahl").run(jobs).metrics

    easy, mina, ours = run_under("easy"), run_under("malleable"), run_under("thrifty")
    assert ours["jobs"] == mina["jobs"] == 300
    assert ours["mean_turnaround"] <= mina["mean_turnaround"]
    assert ours["reconfigurations"] <= mina["reconfigurations"]
    assert ours["by_class"]["rigid"]["mean_turnaround"] <= easy["by_class"]["rigid"]["mean_turnaround"]


def test_live_a_lone_malleable_job_starts_wide_and_is_shrunk_for_a_rigid_one(make_scheduler, tmp_path):
    """Under thrifty a malleable job alone in the queue starts on all 3 nodes (minAgree
    starts it on 1 and grows it), and gives 2 back when a rigid job of 2 comes (it may
    be grown again once that one ended)."""
    sched = make_scheduler(nodes=3, policy="thrifty")
    log = tmp_path / "foreign.jsonl"
    first = sched.submit(job("foreign", [sys.executable, str(ROOT / "tests" / "foreign_job.py")],
                             "malleable", 1, 3, FOREIGN_LOG=str(log), FOREIGN_UNTIL="shrink",
                             FOREIGN_SECONDS="45"))
    wait_for(sched, "the malleable job starts on the 3 nodes",
             lambda jobs: len(jobs[first]["nodes"]) == 3)
    second = sched.submit(job("rigid", [sys.executable, "-c", "import time; time.sleep(0.3)"],
                              "rigid", 2))
    jobs = wait_ended(sched, [first, second], timeout=60)
    assert jobs[first]["state"] == jobs[second]["state"] == "done", jobs
    held = [json.loads(line) for line in log.read_text().splitlines()]
    assert held[0] == {"order": "start", "hosts": ["node0", "node1", "node2"]}, held
    assert held[1]["order"].startswith("shrink 2") and len(held[1]["hosts"]) == 1, held
    assert jobs[first]["shrinks"] >= 1, jobs[first]
    metrics = compute_metrics(read_events(tmp_path / "events.jsonl"))
    assert metrics["max_overlap_violations"] == 0 and metrics["by_state"] == {"done": 2}
