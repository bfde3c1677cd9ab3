"""Scheduling policies on hand-made situations with exact expected decisions,
plus a property test of the invariants every policy must keep."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apgas_scheduler._model import CLASSES, Grow, JobView, Shrink, Start
from apgas_scheduler.policies import (
    FCFS,
    GATE,
    POLICIES,
    Backfilling,
    EasyBackfilling,
    EvolvingEasy,
    MinAgree,
    Policy,
    get_policy,
    grant_requests,
)
from apgas_scheduler.policies.dmr import DMR, dmr_answer

NOW = 100.0


def waiting(id: int, min: int, max: int | None = None, cls: str = "rigid",
            wall: float = 100.0, submit: float | None = None) -> JobView:
    """A queued job; submission order follows the id unless told."""
    if max is None:
        max = min
    return JobView(id=id, cls=cls, min_nodes=min, max_nodes=max, walltime=wall,  # type: ignore[arg-type]
                   submit=float(id) if submit is None else submit)


def running(id: int, nodes: int, min: int | None = None, max: int | None = None,
            cls: str = "malleable", start: float = 0.0, wall: float = 1000.0,
            last_resize: float | None = None, resizable: bool = True) -> JobView:
    """A running job (malleable and resizable unless told)."""
    return JobView(id=id, cls=cls, min_nodes=nodes if min is None else min,  # type: ignore[arg-type]
                   max_nodes=nodes if max is None else max, walltime=wall, submit=0.0,
                   nodes=nodes, start=start, last_resize=last_resize, resizable=resizable)


def decide(policy: Policy, queue, run=(), free: int = 0, total: int | None = None):
    if total is None:
        total = free + sum(j.nodes for j in run)
    return policy.decide(NOW, list(queue), list(run), free, total)


# -- FCFS ----------------------------------------------------------------------

def test_fcfs_starts_while_head_fits_and_stops_at_first_that_does_not():
    queue = [waiting(1, 1), waiting(2, 3), waiting(3, 1)]
    assert decide(FCFS(), queue, free=2, total=4) == [Start(1, 1)]


def test_fcfs_nothing_when_head_does_not_fit():
    assert decide(FCFS(), [waiting(1, 3), waiting(2, 1)], free=2, total=4) == []


def test_fcfs_uses_submission_order_then_id():
    queue = [waiting(3, 1, submit=5.0), waiting(2, 2, submit=5.0), waiting(1, 2, submit=9.0)]
    assert decide(FCFS(), queue, free=3, total=3) == [Start(2, 2), Start(3, 1)]


def test_job_larger_than_cluster_is_skipped_not_blocking():
    queue = [waiting(1, 5), waiting(2, 2)]
    for name in POLICIES:
        assert decide(get_policy(name), queue, free=4, total=4) == [Start(2, 2)], name


# -- moldable sizing --------------------------------------------------------------

@pytest.mark.parametrize("policy", [FCFS(), Backfilling(), EasyBackfilling()])
def test_moldable_extension_takes_min_of_max_and_free(policy):
    queue = [waiting(1, 2, 8, "moldable"), waiting(2, 1, 2, "malleable")]
    assert decide(policy, queue, free=5, total=8) == [Start(1, 5)]
    assert decide(policy, queue, free=9, total=9) == [Start(1, 8), Start(2, 1)]
    assert decide(policy, [waiting(1, 1, 2, "evolving")], free=9, total=9) == [Start(1, 1)]  # it asks itself


@pytest.mark.parametrize("policy", [FCFS(), Backfilling(), EasyBackfilling()])
def test_moldable_extension_refuses_below_min_and_rigid_take_exactly_min(policy):
    assert decide(policy, [waiting(1, 6, 8, "moldable")], free=5, total=8) == []
    assert decide(policy, [waiting(1, 3)], free=5, total=8) == [Start(1, 3)]


# -- Backfilling --------------------------------------------------------------------

def test_backfilling_starts_every_job_that_fits():
    queue = [waiting(1, 1), waiting(2, 3), waiting(3, 1), waiting(4, 1)]
    assert decide(Backfilling(), queue, free=2, total=4) == [Start(1, 1), Start(3, 1)]


def test_backfilling_ignores_walltimes():
    run = [running(9, 2, cls="rigid", wall=10.0, start=95.0)]
    queue = [waiting(1, 4), waiting(2, 1, wall=10_000.0)]
    assert decide(Backfilling(), queue, run, free=2) == [Start(2, 1)]


# -- EASY ---------------------------------------------------------------------------

def test_easy_backfills_short_job_but_not_long_job_that_would_delay_head():
    # The head needs all 4 nodes, free at 200 when job 9 ends: no extra nodes.
    run = [running(9, 2, cls="rigid", start=0.0, wall=200.0)]
    queue = [waiting(1, 4), waiting(2, 1, wall=500.0), waiting(3, 1, wall=50.0)]
    assert decide(EasyBackfilling(), queue, run, free=2) == [Start(3, 1)]
    # Ending exactly at the shadow time is fine.
    assert decide(EasyBackfilling(), [waiting(1, 4), waiting(2, 2, wall=100.0)], run, free=2) \
        == [Start(2, 2)]


def test_easy_long_jobs_use_only_the_extra_nodes():
    # At 200 there are 6 nodes for a head of 5: one extra node.
    run = [running(9, 3, cls="rigid", start=0.0, wall=200.0)]
    queue = [waiting(1, 5), waiting(2, 2, wall=999.0), waiting(3, 1, wall=999.0),
             waiting(4, 1, wall=999.0)]
    assert decide(EasyBackfilling(), queue, run, free=3) == [Start(3, 1)]


def test_easy_starts_heads_then_reserves_for_the_first_that_does_not_fit():
    run = [running(9, 2, cls="rigid", start=0.0, wall=200.0)]
    queue = [waiting(1, 1), waiting(2, 4), waiting(3, 1, wall=500.0), waiting(4, 1, wall=50.0)]
    # After job 1 (ends 200) the head needs 4 of the 5 nodes free at 200: one
    # extra node for the long job 3; the short job 4 ends before 200.
    assert decide(EasyBackfilling(), queue, run, free=3, total=5) == \
        [Start(1, 1), Start(3, 1), Start(4, 1)]


def test_easy_sizes_flexible_backfill_jobs():
    run = [running(9, 3, cls="rigid", start=0.0, wall=200.0)]
    # Head needs 5 of 6 at 200 (extra 1); 3 nodes free now.
    short = [waiting(1, 5), waiting(2, 1, 8, "moldable", wall=50.0)]
    assert decide(EasyBackfilling(), short, run, free=3) == [Start(2, 3)]
    long = [waiting(1, 5), waiting(2, 1, 8, "moldable", wall=500.0)]
    assert decide(EasyBackfilling(), long, run, free=3) == [Start(2, 1)]
    too_big = [waiting(1, 5), waiting(2, 2, 8, "moldable", wall=500.0)]
    assert decide(EasyBackfilling(), too_big, run, free=3) == []


def test_easy_overdue_running_job_is_expected_to_end_now():
    # Job 9 should have ended at 50: the head's shadow time is now, with
    # 4 - 3 = 1 extra node; a short job that still ends after now only gets that.
    run = [running(9, 2, cls="rigid", start=0.0, wall=50.0)]
    queue = [waiting(1, 3), waiting(2, 2, wall=1.0), waiting(3, 1, wall=1.0)]
    assert decide(EasyBackfilling(), queue, run, free=2) == [Start(3, 1)]


def test_easy_counts_nodes_in_transit_as_coming_back_now():
    # 1 node is neither free nor held (being released): with the free one the
    # head can have its 2 nodes now, so nothing may be backfilled.
    run = [running(9, 2, cls="rigid", start=0.0, wall=1000.0)]
    queue = [waiting(1, 2), waiting(2, 1, wall=999.0)]
    assert decide(EasyBackfilling(), queue, run, free=1, total=4) == []
    # Without the node in transit the shadow is 1000 with one extra node.
    assert decide(EasyBackfilling(), queue, run, free=1, total=3) == [Start(2, 1)]


# -- minAgree -----------------------------------------------------------------------

def test_min_agree_starts_malleable_at_min_and_moldable_as_large_as_possible():
    queue = [waiting(1, 2, 8, "malleable"), waiting(2, 1, 4, "moldable"),
             waiting(3, 1, 4, "evolving"), waiting(4, 1)]
    assert decide(MinAgree(), queue, free=8, total=8) == \
        [Start(1, 2), Start(2, 4), Start(3, 1), Start(4, 1)]


def test_min_agree_shrinks_largest_just_enough_for_head():
    run = [running(1, 5, 1, 8), running(2, 4, 1, 8), running(3, 2, 1, 8)]
    queue = [waiting(7, 4)]
    # Needs 3 more: 1 from job 1 (5), then 1 and 2 both hold 4 -> job 1, then job 2.
    assert decide(MinAgree(), queue, run, free=1) == [Shrink(1, 2), Shrink(2, 1)]


def test_min_agree_shrink_needs_head_min_only():
    run = [running(1, 6, 2, 8)]
    queue = [waiting(7, 2, 6, "moldable")]
    assert decide(MinAgree(), queue, run, free=1) == [Shrink(1, 1)]


def test_min_agree_shrinks_nothing_when_target_unreachable():
    run = [running(1, 5, 4, 8), running(2, 4, cls="rigid")]
    queue = [waiting(7, 4)]
    assert decide(MinAgree(), queue, run, free=1) == []


def test_min_agree_shrink_respects_resize_interval_and_resizable():
    queue = [waiting(7, 4)]
    recent = running(1, 8, 1, 8, last_resize=NOW - 5.0)
    busy = running(2, 8, 1, 8, resizable=False)
    rigid = running(3, 8, 1, 8, cls="moldable")
    ok = running(4, 4, 1, 8, last_resize=NOW - 10.0)
    assert decide(MinAgree(), queue, [recent, busy, rigid, ok], free=1) == [Shrink(4, 3)]
    assert decide(MinAgree(resize_interval=5.0), queue, [recent, busy, rigid, ok], free=1) == \
        [Shrink(1, 3)]
    assert decide(MinAgree(), queue, [recent, busy, rigid], free=1) == []


def test_min_agree_does_not_shrink_again_for_nodes_in_transit():
    run = [running(1, 6, 1, 8)]
    # 3 nodes on their way back + 1 free are enough for the head.
    assert decide(MinAgree(), [waiting(7, 4)], run, free=1, total=10) == []
    assert decide(MinAgree(), [waiting(7, 5)], run, free=1, total=10) == [Shrink(1, 1)]


def test_min_agree_backfills_before_shrinking():
    run = [running(1, 6, 1, 8, wall=1000.0, start=0.0)]
    queue = [waiting(7, 4), waiting(8, 1, wall=10.0)]
    # Job 8 ends long before the shadow time (1000); then the head still
    # needs 4 - (2 - 1) = 3 nodes from job 1.
    assert decide(MinAgree(), queue, run, free=2) == [Start(8, 1), Shrink(1, 3)]


def test_min_agree_grows_smallest_first_when_queue_empty():
    run = [running(1, 2, 1, 10), running(2, 3, 1, 10), running(3, 1, 1, 2),
           running(4, 1, cls="rigid")]
    # C(3) 1->2 (full), A(1) 2->3, A/B tie at 3 -> A 4, B 3->4.
    assert decide(MinAgree(), [], run, free=4) == [Grow(1, 2), Grow(2, 1), Grow(3, 1)]


def test_min_agree_grows_no_more_than_max():
    run = [running(1, 2, 1, 3), running(2, 1, 1, 2)]
    assert decide(MinAgree(), [], run, free=10) == [Grow(1, 1), Grow(2, 1)]


def test_min_agree_grow_respects_resize_interval_and_resizable():
    run = [running(1, 1, 1, 8, last_resize=NOW - 1.0), running(2, 1, 1, 8, resizable=False),
           running(3, 4, 1, 8)]
    assert decide(MinAgree(), [], run, free=2) == [Grow(3, 2)]
    assert decide(MinAgree(resize_interval=0.0), [], run, free=2) == [Grow(1, 2)]


def test_min_agree_does_not_grow_while_a_head_waits():
    run = [running(1, 2, 2, 8), running(2, 3, cls="rigid")]
    # The head cannot start and nobody can shrink: the idle nodes stay idle.
    assert decide(MinAgree(), [waiting(7, 6)], run, free=3) == []


def test_min_agree_does_not_grow_a_job_started_in_the_same_call():
    run = [running(1, 2, 1, 10)]
    assert decide(MinAgree(), [waiting(7, 2, 8, "malleable")], run, free=5) == \
        [Start(7, 2), Grow(1, 3)]


# -- evolving EASY: requests first, node by node -----------------------------------------

def asking(id: int, nodes: int, requested: int, since: float, max: int = 8,
           resizable: bool = True) -> JobView:
    """A running evolving job with ``requested`` nodes outstanding since ``since``."""
    return JobView(id=id, cls="evolving", min_nodes=1, max_nodes=max, walltime=1000.0,
                   submit=0.0, nodes=nodes, start=0.0, resizable=resizable,
                   requested=requested, requested_since=since)


def test_evolving_easy_grants_node_by_node_round_robin_oldest_request_first():
    run = [asking(1, 1, 3, since=10.0), asking(2, 1, 2, since=5.0)]
    # Round 1: job 2 (older request), then job 1; round 2: job 2 again; no node left.
    assert decide(EvolvingEasy(), [], run, free=3) == [Grow(2, 2), Grow(1, 1)]
    assert decide(EvolvingEasy(), [], run, free=9) == [Grow(2, 2), Grow(1, 3)]
    assert decide(EvolvingEasy(), [], run, free=1) == [Grow(2, 1)]


def test_evolving_easy_never_grants_beyond_the_maximum_nor_to_busy_or_unready_jobs():
    run = [asking(1, 3, 4, since=1.0, max=4), asking(2, 1, 2, since=2.0, resizable=False)]
    assert decide(EvolvingEasy(), [], run, free=6) == [Grow(1, 1)]


def test_evolving_easy_runs_easy_with_the_nodes_left():
    run = [asking(1, 1, 2, since=1.0)]
    queue = [waiting(5, 2), waiting(6, 1)]
    assert decide(EvolvingEasy(), queue, run, free=4) == [Grow(1, 2), Start(5, 2)]
    # The head does not fit in what is left; the granted nodes are not on their way back,
    # so a long job may not backfill before the head's reservation.
    assert decide(EvolvingEasy(), [waiting(5, 3), waiting(6, 1, wall=5000.0)], run,
                  free=3) == [Grow(1, 2), Start(6, 1)]
    assert decide(EvolvingEasy(), [waiting(5, 2, wall=10.0)], [], free=3) == [Start(5, 2)]
    assert decide(EvolvingEasy(), queue, run, free=0) == []


def test_evolving_easy_keeps_the_nodes_owed_to_a_priority_job():
    owed = JobView(id=5, cls="rigid", min_nodes=3, max_nodes=3, walltime=100.0, submit=5.0,
                   priority=True)
    run = [asking(1, 1, 2, since=1.0)]
    assert decide(EvolvingEasy(), [owed], run, free=3, total=4) == [Start(5, 3)]
    assert decide(EvolvingEasy(), [owed], run, free=4, total=5) == [Grow(1, 1), Start(5, 3)]
    assert grant_requests([owed], run, 2, 4) == ([], 2)  # with the 1 on its way: all owed
    assert grant_requests([owed], run, 2, 5) == ([Grow(1, 1)], 1)  # 2 on their way: 1 spare


def test_only_evolving_and_dmr_grant_requests_and_answer_checks():
    granting = {name for name in ("fcfs", "backfill", "easy", "malleable", "evolving", "dmr",
                                  "mebf") if get_policy(name).grants_requests}
    assert granting == {"evolving", "dmr"}
    with pytest.raises(NotImplementedError, match="policy easy does not grant evolving requests; "
                                                  "run the scheduler with --policy evolving or dmr"):
        EasyBackfilling().answer(NOW, asking(1, 1, 0, 0.0), [], [], 1, 2)
    assert GATE.format(name="fcfs").startswith("policy fcfs does not grant")
    # The others ignore requests: EASY never grows anyone.
    assert decide(EasyBackfilling(), [], [asking(1, 1, 2, since=1.0)], free=3) == []


# -- DMR's check_status answer for one job ----------------------------------------------

def check(nodes: int, min: int = 1, max: int = 8, preferred: int = 0, resizable: bool = True,
          id: int = 1) -> JobView:
    """The view of a job that calls check_status(min, max, preferred)."""
    return JobView(id=id, cls="evolving", min_nodes=min, max_nodes=max, walltime=1000.0,
                   submit=0.0, nodes=nodes, start=0.0, resizable=resizable, preferred=preferred)


def answer(job: JobView, queue=(), others=(), free: int = 0, factor: int = 1,
           total: int | None = None):
    run = [job, *others]
    if total is None:
        total = free + sum(j.nodes for j in run)
    return dmr_answer(NOW, job, list(queue), run, free, total, factor)


def test_check_expands_on_idle_nodes_when_nothing_waits():
    assert answer(check(2, max=6), free=3) == Grow(1, 3)
    assert answer(check(2, max=4), free=3) == Grow(1, 2)  # up to its maximum
    assert answer(check(4, max=4), free=3) is None
    assert DMR().answer(NOW, check(2, max=6), [], [check(2, max=6)], 3, 5) == Grow(1, 3)
    assert EvolvingEasy().answer(NOW, check(2, max=6), [], [check(2, max=6)], 3, 5) == Grow(1, 3)


def test_check_shrinks_when_the_head_of_the_queue_could_then_start():
    assert answer(check(4), [waiting(5, 3)], free=1) == Shrink(1, 2)
    # 1 + 1 is not enough: the head cannot start anyway, so the idle node is the job's
    assert answer(check(4, min=3), [waiting(5, 3)], free=1) == Grow(1, 1)
    assert answer(check(4, min=3, max=4), [waiting(5, 3)], free=1) is None
    assert answer(check(4), [waiting(5, 3)], free=1, total=7) is None  # 2 on their way back


def test_check_gives_nothing_to_a_busy_job_nor_idle_nodes_a_queued_job_takes():
    assert answer(check(2, resizable=False), free=3) is None
    assert answer(check(2, resizable=False), [waiting(5, 3)], free=1) is None
    assert answer(check(2), [waiting(5, 2)], free=3) == Grow(1, 1)  # EASY starts job 5 first


def test_check_moves_towards_the_preferred_size():
    head, rigid = [waiting(5, 9)], [running(2, 6, cls="rigid")]  # the head cannot start
    assert answer(check(6, preferred=4), head, rigid, free=0) == Shrink(1, 2)
    assert answer(check(2, preferred=4), head, rigid, free=3) == Grow(1, 2)
    assert answer(check(4, preferred=4), head, rigid, free=3) is None
    assert answer(check(4, preferred=4), free=3) == Grow(1, 3)  # nothing waits: up to max


def test_check_with_a_factor_takes_multiples_and_divisors():
    assert answer(check(2, max=16), free=10, factor=2) == Grow(1, 6)  # 2 -> 8
    assert answer(check(2, max=16), free=10) == Grow(1, 10)
    assert answer(check(8), [waiting(5, 3)], factor=2) == Shrink(1, 4)  # 8 -> 4


def test_check_outside_its_range_requests_an_action():
    assert answer(check(4, max=2), free=0) == Shrink(1, 2)
    assert answer(check(2, min=4), free=3) == Grow(1, 2)
    assert answer(check(2, min=6), free=3) is None


def test_dmr_leaves_jobs_that_ask_themselves_to_their_checks():
    silent = check(2, max=6)
    asks = JobView(**{**silent.__dict__, "asks": True})
    assert DMR(resize_interval=0.0).decide(NOW, [], [silent], 3, 5) == [Grow(1, 3)]
    assert DMR(resize_interval=0.0).decide(NOW, [], [asks], 3, 5) == []
    assert DMR().answer(NOW, asks, [], [asks], 3, 5) == Grow(1, 3)


def test_check_comes_after_the_other_jobs_requests():
    other = asking(2, 1, 2, since=1.0)
    assert answer(check(2, max=6), others=[other], free=3) == Grow(1, 1)


# -- registry -------------------------------------------------------------------------

def test_get_policy_by_name_with_options():
    assert set(POLICIES) == {"fcfs", "backfill", "easy", "malleable", "evolving"}
    for name, cls in POLICIES.items():
        policy = get_policy(name, resize_interval=3.0)
        assert type(policy) is cls and policy.name == name and policy.resize_interval == 3.0
    assert get_policy("malleable").resize_interval == 10.0


def test_get_policy_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match=r"'nope'; known: avg-agreement, .*backfill, dmr, easy, "
                                         r"evolving, fcfs, lending, malleable, mebf, .*thrifty"):
        get_policy("nope")


def test_negative_resize_interval_is_refused():
    with pytest.raises(ValueError, match="resize_interval"):
        MinAgree(resize_interval=-1.0)


# -- property: invariants of every policy ---------------------------------------------

@st.composite
def situations(draw):
    total = draw(st.integers(1, 24))
    ids = iter(range(1, 10_000))

    def limits(top: int) -> tuple[str, int, int]:
        cls = draw(st.sampled_from(CLASSES))
        low = draw(st.integers(1, top))
        high = low if cls == "rigid" else draw(st.integers(low, top))
        return cls, low, high

    run = []
    held = 0
    for _ in range(draw(st.integers(0, 6))):
        if held >= total:
            break
        cls, low, high = limits(total - held)
        nodes = draw(st.integers(low, min(high, total - held)))
        held += nodes
        run.append(JobView(
            id=next(ids), cls=cls, min_nodes=low, max_nodes=high,  # type: ignore[arg-type]
            walltime=draw(st.floats(1, 500)), submit=0.0, nodes=nodes,
            start=draw(st.floats(0, NOW)),
            last_resize=draw(st.none() | st.floats(0, NOW)), resizable=draw(st.booleans()),
            requested=draw(st.integers(0, 3)), requested_since=draw(st.floats(0, NOW))))
    in_transit = draw(st.integers(0, total - held))
    queue = []
    for _ in range(draw(st.integers(0, 8))):
        cls, low, high = limits(total + 2)
        queue.append(JobView(id=next(ids), cls=cls, min_nodes=low, max_nodes=high,  # type: ignore[arg-type]
                             walltime=draw(st.floats(1, 500)),
                             submit=float(draw(st.integers(0, 5)))))
    return queue, run, total - held - in_transit, total


@settings(max_examples=300, deadline=None)
@given(situations(), st.sampled_from([*sorted(POLICIES), "thrifty"]), st.sampled_from([0.0, 10.0]))
def test_policy_invariants(situation, name, interval):
    queue, run, free, total = situation
    policy = get_policy(name, resize_interval=interval)
    decisions = policy.decide(NOW, queue, run, free, total)
    assert decisions == policy.decide(NOW, queue, run, free, total)  # deterministic

    waiting_jobs = {j.id: j for j in queue}
    running_jobs = {j.id: j for j in run}
    seen = [d.job for d in decisions]
    assert len(seen) == len(set(seen))
    left = free
    for d in decisions:
        assert d.nodes >= 1
        if isinstance(d, Start):
            job = waiting_jobs[d.job]
            assert job.min_nodes <= d.nodes <= job.max_nodes
            if job.cls == "rigid":
                assert d.nodes == job.min_nodes
            left -= d.nodes
            assert left >= 0
        else:
            job = running_jobs[d.job]
            assert name in ("malleable", "evolving", "thrifty") and job.malleable and job.resizable
            if name == "evolving":  # it only grants requests, whenever they came
                assert isinstance(d, Grow) and d.nodes <= job.requested
            else:
                assert job.last_resize is None or NOW - job.last_resize >= interval
            if isinstance(d, Shrink):
                assert job.nodes - d.nodes >= job.min_nodes
            else:
                assert isinstance(d, Grow)
                assert job.nodes + d.nodes <= job.max_nodes
    grown = sum(d.nodes for d in decisions if isinstance(d, Grow))
    assert grown <= left
    assert not (grown and any(isinstance(d, Shrink) for d in decisions))
