"""Lending, our successor to thrifty (``apgas_scheduler.policies.lending``), by hand:
the loans it makes while jobs wait and those it refuses, thrifty's grows when nobody
waits, and its promises. Its simulator invariants are in ``test_scheduler_sim_properties``."""

from __future__ import annotations

import pytest

from apgas_scheduler._model import Grow, JobView, Shrink, Start
from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.lending import Lending


def job(i, nodes, low, high, *, end=1000.0, resizable=True):
    return JobView(i, "malleable", low, high, end, 0.0, nodes=nodes, start=0.0,
                   resizable=resizable, expected_end=end)


def rigid(i, n, walltime=100.0, submit=0.0, running=False, end=None):
    if running:
        return JobView(i, "rigid", n, n, walltime, submit, nodes=n, start=0.0, expected_end=end)
    return JobView(i, "rigid", n, n, walltime, submit)


def test_registered_with_its_options():
    policy = get_policy("lending", resize_interval=60.0, lend=2.0, gamma=1.0)
    assert isinstance(policy, Lending) and policy.name == "lending"
    assert (policy.resize_interval, policy.lend, policy.gamma, policy.min_gain) == (60.0, 2.0, 1.0, 60.0)
    with pytest.raises(ValueError, match="lend must be >= 0, got 2.0, 60.0 and -1"):
        Lending(60.0, gamma=2.0, lend=-1)
    with pytest.raises(ValueError, match="backfill must be 'area' or 'queue', got 'random'"):
        Lending(backfill="random")  # type: ignore[arg-type]


def test_a_long_loan_of_many_nodes_is_made_while_the_head_waits():
    # 10 nodes: a rigid job holds 6 until t=5000, the malleable job 2 (of 1..10), 2 idle;
    # the head needs 8: it waits until 5000 whatever is shrunk (the malleable job can give 1)
    policy = Lending(10.0, lend=0.5)
    running = [rigid(1, 6, running=True, end=5000.0), job(2, 2, 1, 10, end=8000.0)]
    head = rigid(3, 8, submit=1.0)
    # the 2 idle nodes (a fifth of the cluster) would be lent until 5000: 0.2 x 5000 s = 100
    # resize intervals of 10 s, more than 0.5
    assert policy.decide(0.0, [head], running, 2, 10) == [Grow(2, 2)]


def test_a_short_or_small_loan_is_refused():
    running = [rigid(1, 6, running=True, end=50.0), job(2, 2, 1, 10, end=8000.0)]
    head = rigid(3, 8, submit=1.0)
    # the head takes the nodes at 50: 0.2 x 50 s = 1 interval of 10 s, less than 2
    assert Lending(10.0, lend=2.0).decide(0.0, [head], running, 2, 10) == []
    # with 0, every loan is made (as min-common-pool)
    assert Lending(10.0, lend=0.0).decide(0.0, [head], running, 2, 10) == [Grow(2, 2)]


def test_nobody_waiting_grows_as_thrifty_does():
    # two jobs, 4 idle nodes: one at a time to the one holding the fewest, kept if they pay
    running = [job(1, 2, 1, 8, end=10_000.0), job(2, 4, 1, 8, end=10_000.0)]
    assert Lending(10.0).decide(0.0, [], running, 4, 10) == [Grow(1, 3), Grow(2, 1)]
    # a job about to end gains too little from a grow (min_gain: the resize interval)
    ending = [job(1, 2, 1, 8, end=5.0)]
    assert Lending(10.0).decide(0.0, [], ending, 4, 6) == []


def test_waiting_jobs_are_promised_shrunk_nodes_and_start_when_enough_are_idle():
    policy = Lending(0.0)
    running = [job(1, 10, 2, 10, end=10_000.0)]
    queue = [rigid(2, 4, submit=1.0), rigid(3, 3, submit=2.0)]
    assert policy.decide(0.0, queue, running, 0, 10) == [Shrink(1, 7)]
    shrunk = job(1, 3, 2, 10, end=10_000.0, resizable=False)
    assert policy.decide(1.0, queue, [shrunk], 4, 10) == [Start(2, 4)]
