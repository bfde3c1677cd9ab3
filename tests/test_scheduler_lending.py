"""Lending, our successor to thrifty (``apgas_scheduler.policies.lending``), by hand:
the loans it makes while jobs wait and those it refuses, thrifty's grows when nobody
waits, and its promises; then its successor sharing (``.sharing``): loans to every
running job while jobs wait, fewest first, if they can last. Their simulator
invariants are in ``test_scheduler_sim_properties``."""

from __future__ import annotations

import pytest

from apgas_scheduler._model import Grow, JobView, Shrink, Start
from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.lending import Lending
from apgas_scheduler.policies.sharing import Sharing


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


@pytest.mark.parametrize("policy_class", [Lending, Sharing])
def test_nobody_waiting_grows_as_thrifty_does(policy_class):
    # two jobs, 4 idle nodes: one at a time to the one holding the fewest, kept if they pay
    running = [job(1, 2, 1, 8, end=10_000.0), job(2, 4, 1, 8, end=10_000.0)]
    assert policy_class(10.0).decide(0.0, [], running, 4, 10) == [Grow(1, 3), Grow(2, 1)]
    # a job about to end gains too little from a grow (min_gain: the resize interval)
    ending = [job(1, 2, 1, 8, end=5.0)]
    assert policy_class(10.0).decide(0.0, [], ending, 4, 6) == []


@pytest.mark.parametrize("policy_class", [Lending, Sharing])
def test_waiting_jobs_are_promised_shrunk_nodes_and_start_when_enough_are_idle(policy_class):
    policy = policy_class(0.0)
    running = [job(1, 10, 2, 10, end=10_000.0)]
    queue = [rigid(2, 4, submit=1.0), rigid(3, 3, submit=2.0)]
    assert policy.decide(0.0, queue, running, 0, 10) == [Shrink(1, 7)]
    shrunk = job(1, 3, 2, 10, end=10_000.0, resizable=False)
    assert policy.decide(1.0, queue, [shrunk], 4, 10) == [Start(2, 4)]


# -- sharing, lending's successor ------------------------------------------------------

def test_sharing_is_registered_with_its_options():
    policy = get_policy("sharing", resize_interval=60.0, gamma=1.0, backfill="queue")
    assert isinstance(policy, Sharing) and policy.name == "sharing"
    assert (policy.resize_interval, policy.gamma, policy.min_gain) == (60.0, 1.0, 60.0)
    assert repr(policy) == "Sharing(resize_interval=60.0, gamma=1.0, min_gain=60.0, horizon=1800.0)"
    with pytest.raises(ValueError, match="backfill must be 'area' or 'queue', got 'random'"):
        Sharing(backfill="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="horizon must be >= 0 seconds, got -1"):
        Sharing(horizon=-1)
    with pytest.raises(TypeError):
        Sharing(lend=1.0)  # type: ignore[call-arg]  # no threshold: every loan is made


def test_sharing_lends_to_every_job_fewest_first_while_the_head_waits():
    # 12 nodes: a rigid job holds 6 until t=5000, two malleable jobs 1 (of 1..3) and 2 (of
    # 1..8), 3 idle; the head needs 9 and waits until 5000 whatever is shrunk
    running = [rigid(1, 6, running=True, end=5000.0), job(2, 1, 1, 3, end=8000.0),
               job(3, 2, 1, 8, end=8000.0)]
    head = rigid(4, 9, submit=1.0)
    # job 2 holds the fewest above its minimum: it is filled to its maximum first, job 3
    # gets the rest (lending lends to one job only, the one with the most room)
    assert Sharing(10.0).decide(0.0, [head], running, 3, 12) == [Grow(2, 2), Grow(3, 1)]
    assert Lending(10.0, lend=0.0).decide(0.0, [head], running, 3, 12) == [Grow(3, 3)]


def test_sharing_makes_no_loan_that_could_not_last_its_horizon():
    # as above, but job 2 ends at 1000 and the head's reservation is at 1500: job 2 could
    # keep a loan 1000 s, job 3 1500 s; with the half-hour horizon neither gets one
    running = [rigid(1, 6, running=True, end=1500.0), job(2, 1, 1, 3, end=1000.0),
               job(3, 2, 1, 8, end=8000.0)]
    head = rigid(4, 9, submit=1.0)
    assert Sharing(10.0).decide(0.0, [head], running, 3, 12) == []
    assert Sharing(10.0, horizon=1200.0).decide(0.0, [head], running, 3, 12) == [Grow(3, 3)]
    assert Sharing(10.0, horizon=0.0).decide(0.0, [head], running, 3, 12) == [Grow(2, 2), Grow(3, 1)]


def test_sharing_starts_a_malleable_job_alone_in_the_queue_wide():
    queue = [JobView(1, "malleable", 2, 8, 1000.0, 0.0, preferred=4)]
    assert Sharing(10.0).decide(0.0, queue, [], 10, 10) == [Start(1, 8)]
