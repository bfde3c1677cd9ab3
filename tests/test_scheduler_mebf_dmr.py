"""MEBF and DMR on hand-made situations with exact expected decisions, plus a
property test of the invariants every named variant must keep."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apgas_scheduler._model import CLASSES, Grow, JobView, Shrink, Start
from apgas_scheduler.policies import EasyBackfilling, Policy
from apgas_scheduler.policies.dmr import DMR, DMR_POLICIES
from apgas_scheduler.policies.mebf import MEBF, MEBF_POLICIES

NOW = 100.0
EXPANDS = ("handoff", "spare", "intensive")


def waiting(id: int, min: int, max: int | None = None, cls: str = "rigid", wall: float = 100.0,
            preferred: int = 0, rho: float = 0.0) -> JobView:
    """A queued job; submission order follows the id."""
    return JobView(id=id, cls=cls, min_nodes=min, max_nodes=min if max is None else max,  # type: ignore[arg-type]
                   walltime=wall, submit=float(id), preferred=preferred, rho=rho)


def running(id: int, nodes: int, min: int = 1, max: int | None = None, cls: str = "malleable",
            rho: float = 0.0, preferred: int = 0, wall: float = 1000.0,
            expected_end: float | None = None, last_resize: float | None = None,
            resizable: bool = True) -> JobView:
    """A running job, started at 0 (malleable, resizable, linear unless told);
    with the default walltime it has 900 s to go at NOW."""
    if cls == "rigid":
        min = max = nodes
    return JobView(id=id, cls=cls, min_nodes=min, max_nodes=nodes if max is None else max,  # type: ignore[arg-type]
                   walltime=wall, submit=0.0, nodes=nodes, start=0.0, last_resize=last_resize,
                   resizable=resizable, preferred=preferred, rho=rho, expected_end=expected_end)


def decide(policy: Policy, queue=(), run=(), free: int = 0, total: int | None = None):
    if total is None:
        total = free + sum(j.nodes for j in run)
    return policy.decide(NOW, list(queue), list(run), free, total)


# -- MEBF: starts and backfilling -----------------------------------------------------

def test_mebf_starts_at_preferred_size_or_adapts_down_to_minimum():
    queue = [waiting(1, 2, 8, cls="malleable", preferred=4),
             waiting(2, 1, 6, cls="moldable", preferred=3), waiting(3, 2)]
    assert decide(MEBF(), queue, free=5) == [Start(1, 4), Start(2, 1)]


def test_mebf_backfills_with_the_run_time_at_the_size_the_job_gets():
    # The head (10 nodes) can start at 1000, when the rigid job ends; 2 nodes idle.
    run = [running(1, 8, cls="rigid")]
    fits = waiting(6, 1, 4, cls="malleable", wall=500.0, preferred=2)  # 500 s on 2 nodes
    slow = waiting(6, 1, 4, cls="malleable", wall=500.0, preferred=4)  # 1000 s on 2 nodes
    assert decide(MEBF(), [waiting(5, 10), fits], run, free=2) == [Start(6, 2)]
    assert decide(MEBF(), [waiting(5, 10), slow], run, free=2) == []
    # EASY trusts the walltime whatever the size, and would delay the head.
    assert decide(EasyBackfilling(), [waiting(5, 10), slow], run, free=2) == [Start(6, 2)]


# -- MEBF: shrink -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MEBF_POLICIES))
def test_every_variant_shrinks_for_the_head_when_no_node_is_idle(name):
    run = [running(1, 10, min=2, rho=0.1)]
    # share_factor 0.4 of 10 nodes = 4, just what the head needs.
    assert decide(MEBF_POLICIES[name](), [waiting(5, 4)], run) == [Shrink(1, 4)]


def test_shrink_takes_least_scalable_first_and_at_most_its_share():
    run = [running(1, 5, rho=0.1), running(2, 5, rho=0.3)]
    # Job 2 scales worse: it gives its share (floor(0.4 * 5) = 2), job 1 the rest.
    assert decide(MEBF(), [waiting(5, 3)], run) == [Shrink(2, 2), Shrink(1, 1)]


def test_shrink_only_if_the_shares_cover_the_head():
    run = [running(1, 5, rho=0.1), running(2, 5, rho=0.3)]
    assert decide(MEBF(), [waiting(5, 5)], run) == []  # shares 2 + 2 < 5
    assert decide(MEBF(share_factor=0.6), [waiting(5, 5)], run) == [Shrink(2, 3), Shrink(1, 2)]


def test_no_shrink_while_nodes_on_their_way_back_cover_the_head():
    run = [running(1, 6)]
    assert decide(MEBF(), [waiting(5, 4)], run, free=0, total=10) == []
    assert decide(MEBF(), [waiting(5, 6)], run, free=0, total=10) == [Shrink(1, 2)]


def test_shrink_never_below_minimum_and_never_rigid_or_moldable():
    run = [running(1, 4, min=3), running(2, 4, cls="rigid"), running(3, 4, cls="moldable", min=1)]
    assert decide(MEBF(), [waiting(5, 1)], run) == [Shrink(1, 1)]
    assert decide(MEBF(), [waiting(5, 2)], run) == []


def test_only_resizable_jobs_outside_the_resize_interval_are_shrunk():
    head = [waiting(5, 4)]
    assert decide(MEBF(), head, [running(1, 10, last_resize=95.0)]) == []
    assert decide(MEBF(resize_interval=5.0), head, [running(1, 10, last_resize=95.0)]) == [Shrink(1, 4)]
    assert decide(MEBF(), head, [running(1, 10, resizable=False)]) == []


# -- MEBF: feasibility (theta, gamma) -----------------------------------------------------

def test_theta_no_shrink_of_a_job_about_to_end():
    head = [waiting(5, 4)]
    # 200 s left of a 1000 s estimate: less than theta = 0.5 of it.
    assert decide(MEBF(), head, [running(1, 10, expected_end=300.0)]) == []
    assert decide(MEBF(), head, [running(1, 10, expected_end=700.0)]) == [Shrink(1, 4)]
    assert decide(MEBF(theta=0.1), head, [running(1, 10, expected_end=300.0)]) == [Shrink(1, 4)]


def test_gamma_no_shrink_that_lengthens_a_job_too_much():
    run = [running(1, 10, min=2)]
    # 10 -> 2 nodes: 900 s left become 4500 s, more than gamma = 2 times 900.
    assert decide(MEBF(share_factor=0.8), [waiting(5, 8)], run) == []
    assert decide(MEBF(share_factor=0.8, gamma=5.0), [waiting(5, 8)], run) == [Shrink(1, 8)]


def test_gamma_counts_the_reconfiguration_cost():
    run = [running(1, 10)]
    costly = MEBF(reconfig_cost=lambda job, old, new: 400.0)  # 900 * 10/6 + 400 > 1800
    assert decide(costly, [waiting(5, 4)], run) == []
    cheap = MEBF(reconfig_cost=lambda job, old, new: 200.0)  # 1500 + 200 <= 1800
    assert decide(cheap, [waiting(5, 4)], run) == [Shrink(1, 4)]


# -- MEBF: variants on a gap that nothing fits --------------------------------------------

@pytest.mark.parametrize("name, expand, expected", [
    ("mebf", "intensive", []),                          # basic leaves the gap
    ("mebf-shrink+", "intensive", [Shrink(1, 3)]),      # shrinks although 2 nodes are idle
    ("mebf-expand+", "handoff", []),                    # 2 more nodes: not more than its 8
    ("mebf-expand+", "spare", []),                      # nor more than 0.5 * 8
    ("mebf-expand+", "intensive", [Grow(1, 2)]),        # any amount
])
def test_variants_on_idle_nodes_too_few_for_the_head(name, expand, expected):
    run = [running(1, 8, min=2, max=16, rho=0.1), running(2, 2, cls="rigid")]
    assert decide(MEBF_POLICIES[name](expand=expand), [waiting(5, 5)], run, free=2) == expected


def test_expand_plus_gives_nothing_while_nodes_come_back_for_the_head():
    run = [running(1, 4, max=16)]
    assert decide(MEBF_POLICIES["mebf-expand+"](expand="intensive"), [waiting(5, 5)], run,
                  free=2, total=10) == []


# -- MEBF: expand policies with an empty queue ---------------------------------------------

@pytest.mark.parametrize("free, expand, expected", [
    (5, "handoff", [Grow(1, 5)]), (5, "spare", [Grow(1, 5)]), (5, "intensive", [Grow(1, 5)]),
    (3, "handoff", []), (3, "spare", [Grow(1, 3)]), (3, "intensive", [Grow(1, 3)]),
    (2, "handoff", []), (2, "spare", []), (2, "intensive", [Grow(1, 2)]),
])
def test_expand_policies_differ_in_the_least_amount_worth_it(free, expand, expected):
    # Handoff: more than the job's 4 nodes; Spare: more than 0.5 * 4; Intensive: any.
    run = [running(1, 4, max=16)]
    assert decide(MEBF(expand=expand), [], run, free=free) == expected


@pytest.mark.parametrize("expand, expected", [
    ("handoff", [Grow(2, 6)]),
    ("spare", [Grow(2, 6)]),  # the last node is no more than 0.5 * 2: kept spare
    ("intensive", [Grow(2, 6), Grow(1, 1)]),
])
def test_expand_goes_to_the_most_scalable_job_first(expand, expected):
    run = [running(1, 2, max=8, rho=0.2), running(2, 2, max=8, rho=0.05)]
    assert decide(MEBF(expand=expand), [], run, free=7) == expected


def test_expand_skips_a_job_about_to_end_and_jobs_started_in_this_call():
    run = [running(1, 4, max=10, expected_end=200.0), running(2, 4, max=10)]
    queue = [waiting(5, 1, 4, cls="malleable", preferred=2)]
    assert decide(MEBF(expand="intensive"), queue, run, free=6) == [Start(5, 2), Grow(2, 4)]


def test_mebf_registry_and_options():
    assert {n: f().name for n, f in MEBF_POLICIES.items()} == {
        "mebf": "mebf", "mebf-shrink+": "mebf-shrink+", "mebf-expand+": "mebf-expand+"}
    policy = MEBF_POLICIES["mebf-expand+"](expand="spare", spare_ratio=0.25, resize_interval=3.0)
    assert (policy.variant, policy.expand, policy.spare_ratio, policy.resize_interval) == (
        "expand+", "spare", 0.25, 3.0)
    for bad in ({"variant": "both"}, {"expand": "greedy"}, {"gamma": 0.0}, {"share_factor": 1.5}):
        with pytest.raises(ValueError):
            MEBF(**bad)  # type: ignore[arg-type]


# -- DMR -------------------------------------------------------------------------------

def test_dmr_starts_like_easy_with_the_moldable_extension():
    queue = [waiting(1, 2, 8, cls="malleable", preferred=4), waiting(2, 3)]
    assert decide(DMR(), queue, free=10) == [Start(1, 8)]


def test_dmr_expands_on_idle_nodes_when_nothing_waits():
    run = [running(1, 4, max=10), running(2, 4, max=6, preferred=4), running(3, 2, cls="rigid")]
    assert decide(DMR(), [], run, free=8) == [Grow(1, 6), Grow(2, 2)]


def test_dmr_shrinks_jobs_without_preference_so_the_head_starts():
    run = [running(1, 8, min=2), running(2, 4, min=1)]
    assert decide(DMR(), [waiting(5, 7)], run) == [Shrink(1, 6), Shrink(2, 1)]
    assert decide(DMR(), [waiting(5, 10)], run) == []  # 6 + 3 nodes are not enough


def test_dmr_moves_towards_the_preferred_size_while_jobs_wait():
    head = [waiting(5, 16)]
    above = [running(1, 8, min=2, max=16, preferred=4), running(2, 12, cls="rigid")]
    assert decide(DMR(), head, above) == [Shrink(1, 4)]
    below = [running(1, 4, min=2, max=16, preferred=8), running(2, 14, cls="rigid")]
    assert decide(DMR(), head, below, free=2) == [Grow(1, 2)]
    # With nothing waiting, the preference gives way to the maximum.
    assert decide(DMR(), [], above) == []
    assert decide(DMR(), [], below, free=2) == [Grow(1, 2)]
    assert decide(DMR(), [], [running(1, 8, max=16, preferred=8)], free=3) == [Grow(1, 3)]


def test_dmr_does_not_shrink_below_the_preference_for_a_queued_job():
    # The paper's trace: five jobs at their preferred 8 nodes, a 32-node job waits.
    run = [running(i, 8, min=2, max=32, preferred=8) for i in range(1, 6)]
    assert decide(DMR(), [waiting(9, 32)], run, free=24) == []


def test_dmr_wide_optimization_grows_when_the_head_cannot_start_anyway():
    run = [running(1, 4, min=4, max=10), running(2, 4, cls="rigid")]
    assert decide(DMR(), [waiting(5, 9)], run, free=2) == [Grow(1, 2)]
    # ... but not while nodes coming back let the head start.
    assert decide(DMR(), [waiting(5, 5)], run, free=2, total=13) == []


def test_dmr_preferred_shrink_counts_towards_the_head():
    run = [running(1, 8, min=2, max=16, preferred=6), running(2, 6, min=2)]
    # Job 1 gives 2 going to its preference, so job 2 only needs to give 1.
    assert decide(DMR(), [waiting(5, 3)], run) == [Shrink(1, 2), Shrink(2, 1)]


def test_dmr_factor_resizes_by_multiples_and_divisors():
    assert decide(DMR(factor=2), [], [running(1, 4, max=16)], free=10) == [Grow(1, 4)]
    assert decide(DMR(), [], [running(1, 4, max=16)], free=10) == [Grow(1, 10)]
    # 8 -> 4 frees more than the 3 the head needs; 8 -> 5 is not a divisor.
    assert decide(DMR(factor=2), [waiting(5, 3)], [running(1, 8)]) == [Shrink(1, 4)]
    assert decide(DMR(factor=2), [waiting(5, 3)], [running(1, 6, min=4)]) == []


def test_dmr_request_an_action_brings_a_job_back_inside_its_limits():
    low = JobView(id=1, cls="malleable", min_nodes=4, max_nodes=8, walltime=100.0, submit=0.0,
                  nodes=2, start=0.0, resizable=True)
    assert decide(DMR(), [], [low], free=3) == [Grow(1, 2)]


def test_dmr_honours_resize_interval_and_job_class():
    head = [waiting(5, 4)]
    assert decide(DMR(), head, [running(1, 8, last_resize=95.0)]) == []
    assert decide(DMR(resize_interval=0.0), head, [running(1, 8, last_resize=95.0)]) == [Shrink(1, 4)]
    assert decide(DMR(), head, [running(1, 8, cls="moldable")]) == []
    assert decide(DMR(), head, [running(1, 8, cls="evolving")]) == [Shrink(1, 4)]
    assert decide(DMR(), [], [running(1, 8, max=9, resizable=False)], free=1) == []


def test_dmr_registry_and_options():
    assert DMR_POLICIES["dmr"](factor=2, resize_interval=1.0).name == "dmr"
    with pytest.raises(ValueError):
        DMR(factor=0)


# -- property: invariants of every named policy ----------------------------------------------

def _policies() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [(n, {"expand": e}) for n in MEBF_POLICIES for e in EXPANDS]
    out += [(n, {"expand": "intensive", "reconfig_cost": lambda j, old, new: 5.0 * abs(new - old)})
            for n in MEBF_POLICIES]
    out += [("dmr", {"factor": f}) for f in (1, 2, 3)]
    return out


REGISTRY = {**MEBF_POLICIES, **DMR_POLICIES}
POLICY_CASES = _policies()


@st.composite
def situations(draw):
    total = draw(st.integers(1, 24))
    ids = iter(range(1, 10_000))

    def job_limits(top: int) -> tuple[str, int, int, int]:
        cls = draw(st.sampled_from(CLASSES))
        low = draw(st.integers(1, top))
        high = low if cls == "rigid" else draw(st.integers(low, top))
        preferred = draw(st.just(0) | st.integers(low, high))
        return cls, low, high, preferred

    run = []
    held = 0
    for _ in range(draw(st.integers(0, 6))):
        if held >= total:
            break
        cls, low, high, preferred = job_limits(total - held)
        nodes = draw(st.integers(low, min(high, total - held)))
        held += nodes
        run.append(JobView(
            id=next(ids), cls=cls, min_nodes=low, max_nodes=high,  # type: ignore[arg-type]
            walltime=draw(st.floats(1, 500)), submit=0.0, nodes=nodes,
            start=draw(st.floats(0, NOW)), last_resize=draw(st.none() | st.floats(0, NOW)),
            resizable=draw(st.booleans()), preferred=preferred, rho=draw(st.floats(0, 0.5)),
            expected_end=draw(st.none() | st.floats(0, 2 * NOW + 500))))
    in_transit = draw(st.integers(0, total - held))
    queue = []
    for _ in range(draw(st.integers(0, 8))):
        cls, low, high, preferred = job_limits(total + 2)
        queue.append(JobView(id=next(ids), cls=cls, min_nodes=low, max_nodes=high,  # type: ignore[arg-type]
                             walltime=draw(st.floats(1, 500)), submit=float(draw(st.integers(0, 5))),
                             preferred=preferred, rho=draw(st.floats(0, 0.5))))
    return queue, run, total - held - in_transit, total


@settings(max_examples=400, deadline=None)
@given(situations(), st.sampled_from(range(len(POLICY_CASES))), st.sampled_from([0.0, 10.0]))
def test_policy_invariants(situation, case, interval):
    queue, run, free, total = situation
    name, options = POLICY_CASES[case]
    policy = REGISTRY[name](resize_interval=interval, **options)
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
            assert job.malleable and job.resizable
            assert job.last_resize is None or NOW - job.last_resize >= interval
            if isinstance(d, Shrink):
                assert job.nodes - d.nodes >= job.min_nodes
            else:
                assert isinstance(d, Grow)
                assert job.nodes + d.nodes <= job.max_nodes
    grown = sum(d.nodes for d in decisions if isinstance(d, Grow))
    assert grown <= left
    if name != "dmr":  # MEBF either shrinks or expands, never both at once
        assert not (grown and any(isinstance(d, Shrink) for d in decisions))
