"""The Kassel group's nine strategies (``apgas_scheduler.policies.agreements``) by
hand: start sizes, whom shrinks take from, whom grows go to, and how the three
hand-overs differ on the same promises. The simulator's invariants for all nine
are in ``test_scheduler_sim_properties``."""

from __future__ import annotations

import pytest

from apgas_scheduler._model import Grow, JobView, Shrink, Start
from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.agreements import AGREEMENT_POLICIES, AgreementStrategy
from apgas_scheduler.sim.simulator import Simulator
from apgas_scheduler.sim.workload import SimJob

NAMES = ["min-agreement", "avg-agreement", "pref-agreement", "min-common-pool",
         "avg-common-pool", "pref-common-pool", "min-steal-agreement", "avg-steal-agreement",
         "pref-steal-agreement"]


def queued(i, low, high, pref=0, cls="malleable", submit=0.0, walltime=100.0):
    return JobView(i, cls, low, high, walltime, submit + i * 1e-3, preferred=pref)


def running(i, nodes, low, high, pref=0, resizable=True):
    return JobView(i, "malleable", low, high, 1000.0, 0.0, nodes=nodes, start=0.0,
                   resizable=resizable, preferred=pref)


def rigid(i, n, submit=0.0):
    return queued(i, n, n, cls="rigid", submit=submit)


def test_the_nine_names_are_registered_in_the_issue_order():
    assert list(AGREEMENT_POLICIES) == NAMES
    for name in NAMES:
        policy = get_policy(name, resize_interval=5.0)
        assert isinstance(policy, AgreementStrategy) and policy.name == name
        assert policy.resize_interval == 5.0


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="sizing must be one of min, avg, pref, got 'max'"):
        AgreementStrategy(sizing="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handover"):
        AgreementStrategy(handover="lottery")  # type: ignore[arg-type]


@pytest.mark.parametrize("sizing, expected", [("min", 2), ("avg", 2), ("pref", 4)])
def test_start_sizes(sizing, expected):
    policy = get_policy(f"{sizing}-agreement")
    # alone, 10 idle nodes: min and avg start at the minimum, pref at the preferred size
    # (the rest goes to nobody: the job is not running yet)
    assert policy.decide(0.0, [queued(1, 2, 8, pref=4)], [], 10, 10) == [Start(1, expected)]
    # pref on too few nodes takes what is free, down to the minimum; a rigid job its size
    assert get_policy("pref-agreement").decide(0.0, [queued(1, 2, 8, pref=4)], [], 3, 3) \
        == [Start(1, 3)]
    assert policy.decide(0.0, [rigid(1, 3)], [], 10, 10) == [Start(1, 3)]


def test_min_shrinks_the_largest_surplus_first_and_only_what_is_needed():
    policy = get_policy("min-agreement")
    jobs = [running(1, 8, 2, 10), running(2, 5, 2, 10)]  # surplus 6 and 3
    assert policy.decide(0.0, [rigid(3, 4)], jobs, 0, 13) == [Shrink(1, 4)]
    # all or nothing: 10 is more than the 9 they can give together
    fresh = get_policy("min-agreement")
    assert fresh.decide(0.0, [rigid(3, 10)], jobs, 0, 13) == []


def test_avg_evens_the_shares_of_the_ranges():
    policy = get_policy("avg-agreement")
    # shares: job 1 holds (9-1)/(9-1) = 1.0, job 2 (5-1)/(9-1) = 0.5
    jobs = [running(1, 9, 1, 9), running(2, 5, 1, 9)]
    assert policy.decide(0.0, [rigid(3, 6)], jobs, 0, 14) == [Shrink(1, 5), Shrink(2, 1)]
    # grows go one node at a time to the lowest share
    grower = get_policy("avg-agreement")
    assert grower.decide(0.0, [], [running(1, 9, 1, 9), running(2, 1, 1, 9)], 6, 16) \
        == [Grow(2, 6)]
    grower = get_policy("avg-agreement")
    assert grower.decide(0.0, [], [running(1, 3, 1, 5), running(2, 1, 1, 9)], 6, 10) \
        == [Grow(1, 1), Grow(2, 5)]


def test_pref_tries_the_preferred_size_first_then_the_minimum_then_the_donors_minimum():
    donors = [running(1, 8, 2, 10, pref=6), running(2, 6, 2, 10, pref=4)]  # 2 + 2 above pref
    # the waiting job prefers 4: the donors give 2 each and keep their preferred sizes
    policy = get_policy("pref-agreement")
    assert policy.decide(0.0, [queued(3, 2, 8, pref=4)], donors, 0, 14) \
        == [Shrink(1, 2), Shrink(2, 2)]
    # it prefers 6: not above the preferred sizes; its minimum 3 is: largest surplus first
    policy = get_policy("pref-agreement")
    assert policy.decide(0.0, [queued(3, 3, 8, pref=6)], donors, 0, 14) \
        == [Shrink(1, 2), Shrink(2, 1)]
    # its minimum 7 only comes down to the donors' minimums (6 and 4 above them)
    policy = get_policy("pref-agreement")
    assert policy.decide(0.0, [queued(3, 7, 8, pref=8)], donors, 0, 14) == [Shrink(1, 6), Shrink(2, 1)]
    # the donors most above their *preferred* size give first in every try, as the
    # Kassel code orders them (pref_agreement.py: get_pref_job_priority): job 2 (3 above
    # its preferred 3) before job 1 (1 above 7), though job 1 holds more above its minimum
    donors = [running(1, 8, 2, 10, pref=7), running(2, 6, 2, 10, pref=3)]
    policy = get_policy("pref-agreement")
    assert policy.decide(0.0, [queued(3, 7, 8, pref=8)], donors, 0, 14) == [Shrink(1, 3), Shrink(2, 4)]


def test_min_grows_the_fewest_above_minimum_first_up_to_maximum():
    policy = get_policy("min-agreement")
    jobs = [running(1, 5, 1, 8), running(2, 3, 2, 6)]  # 4 and 1 above their minimum
    assert policy.decide(0.0, [], jobs, 5, 13) == [Grow(1, 2), Grow(2, 3)]


def test_pref_grows_to_preferred_first_then_to_maximum():
    policy = get_policy("pref-agreement")
    jobs = [running(1, 2, 1, 8, pref=6), running(2, 5, 1, 8, pref=6)]
    # 4 and 1 bring both to 6; the sixth node goes to the first of the two, now level
    assert policy.decide(0.0, [], jobs, 6, 13) == [Grow(1, 5), Grow(2, 1)]
    policy = get_policy("pref-agreement")
    assert policy.decide(0.0, [], jobs, 12, 19) == [Grow(1, 6), Grow(2, 3)]


def test_grows_and_shrinks_wait_for_the_resize_interval():
    policy = get_policy("min-agreement", resize_interval=10.0)
    recent = JobView(1, "malleable", 1, 8, 1000.0, 0.0, nodes=4, start=0.0, last_resize=5.0,
                     resizable=True)
    assert policy.decide(12.0, [], [recent], 4, 8) == []
    assert policy.decide(15.0, [], [recent], 4, 8) == [Grow(1, 4)]
    busy = running(1, 4, 1, 8, resizable=False)
    assert policy.decide(15.0, [rigid(2, 2)], [busy], 0, 4) == []


def _promise_two(handover):
    """12 nodes: job 1 (malleable, min 1) holds 10, 2 idle. Rigid job 2 needs 4 and job 3
    needs 3: neither fits, so job 1 is shrunk by 7 and they are promised 4 and 3."""
    policy = get_policy(f"min-{handover}")
    queue = [rigid(2, 4), rigid(3, 3)]
    assert policy.decide(0.0, queue, [running(1, 10, 1, 12)], 2, 12) == [Shrink(1, 7)]
    return policy, queue


@pytest.mark.parametrize("handover, when_three_are_back", [
    ("agreement", []),                  # job 2's own four are not all back
    ("steal-agreement", [Start(3, 3)]),  # job 3 takes the three promised ones that are back
    ("common-pool", [Start(2, 4)]),      # job 2 takes three promised and one idle node
])
def test_the_three_hand_overs(handover, when_three_are_back):
    policy, queue = _promise_two(handover)
    shrunk = running(1, 3, 1, 12, resizable=False)
    # nothing back yet: the 2 idle nodes are nobody's promise, but nobody fits them
    assert policy.decide(1.0, queue, [shrunk], 2, 12) == []
    # three of the seven are back (5 idle, 4 on their way)
    assert policy.decide(2.0, queue, [shrunk], 5, 12) == when_three_are_back
    # all seven back (9 idle): every hand-over starts what is left, oldest promise first
    rest = [j for j in queue if j.id not in {d.job for d in when_three_are_back}]
    now_running = [shrunk, *(JobView(d.job, "rigid", d.nodes, d.nodes, 100.0, 0.0, nodes=d.nodes,
                                     start=2.0) for d in when_three_are_back)]
    starts = policy.decide(3.0, rest, now_running, 9 - sum(d.nodes for d in when_three_are_back), 12)
    assert starts[: len(rest)] == [Start(j.id, j.min_nodes) for j in rest]


def test_promised_nodes_are_kept_from_other_jobs_and_a_cancelled_promise_is_dropped():
    policy, queue = _promise_two("agreement")
    shrunk = running(1, 3, 1, 12, resizable=False)
    late = rigid(4, 2, submit=1.0)
    # 7 back and 2 idle: jobs 2 and 3 take theirs; the late job fits the 2 others
    assert policy.decide(1.0, [*queue, late], [shrunk], 9, 12) \
        == [Start(2, 4), Start(3, 3), Start(4, 2)]
    policy, queue = _promise_two("agreement")
    # job 2 was cancelled: its promise goes, and the 4 nodes are anyone's
    assert policy.decide(1.0, [queue[1], late], [shrunk], 9, 12) == [Start(3, 3), Start(4, 2)]


@pytest.mark.parametrize("name", NAMES)
def test_a_small_workload_runs_to_the_end_under_each(name):
    jobs = [SimJob(1, 0.0, "malleable", 2, 8, 4, 400.0, 400.0),
            SimJob(2, 10.0, "rigid", 4, 4, 4, 100.0, 100.0),
            SimJob(3, 20.0, "malleable", 1, 6, 2, 200.0, 200.0),
            SimJob(4, 30.0, "rigid", 7, 7, 7, 50.0, 50.0)]
    result = Simulator(8, get_policy(name, resize_interval=0.0)).run(jobs)
    assert result.metrics["jobs"] == 4
    assert all(r["end"] is not None for r in result.jobs.values())
    assert result.metrics["reconfigurations"] > 0  # the malleable jobs were resized
