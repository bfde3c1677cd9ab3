"""List scheduling of evolving jobs (apgas_scheduler.sim.listsched): schedules worked out
by hand for tiny cases, the paper's claim against the rigid baseline on
seeded random workloads, and property tests of what every schedule must keep
(including that the base fit completes each job as early as a brute-force
search can)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apgas_scheduler.sim.listsched import (
    PAPER_VARIANTS,
    EvolvingJob,
    Schedule,
    evolving_policies,
    schedule_evolving,
    schedule_rigid_baseline,
)

J = EvolvingJob
EPS = 1e-9


def pieces(pieces: list[tuple[float, float, int, int]], job: int) -> list[tuple[float, float, int]]:
    """(from, to, nodes) of one job, in time order."""
    return sorted((a, b, n) for a, b, j, n in pieces if j == job)


# Case 1 (3 nodes): job 1 leaves 2 nodes free on [0, 2), 1 on [2, 5), all 3
# after. Job 2 (2, 1, 2 nodes for 2 s each) fits unexpanded only from 5; with
# expansion its 1-node step waits [4, 5) and it ends at 7 instead of 11.
CASE1 = [J(1, 0, ((2, 1), (3, 2))), J(2, 0, ((2, 2), (2, 1), (2, 2)))]

# Case 2 (4 nodes): job 1 holds 3 nodes on [0, 10); job 2's last step needs 2
# nodes, so it cannot run before 10. Expansion lets job 2 start earlier but
# only wastes nodes; compacting pushes its first steps back against the last.
CASE2 = [J(1, 0, ((10, 3),)), J(2, 0, ((2, 1), (2, 1), (2, 2)))]

# Case 3 (4 nodes): job 1 leaves 3 nodes free on [0, 3) and 1 on [3, 6).
# Only an unbounded expansion (1 s step held for 3 s) lets job 2 end at 9.
CASE3 = [J(1, 0, ((3, 1), (3, 3))), J(2, 0, ((3, 2), (1, 1), (3, 4)))]


@pytest.mark.parametrize("limit, compact, reserved", [
    (1, False, [(5, 7, 2), (7, 9, 1), (9, 11, 2)]),
    (1, True, [(5, 7, 2), (7, 9, 1), (9, 11, 2)]),
    # Step 2 placed at [2, 4), step 3 blocked until 5: held 3 s <= 2 * 2 s.
    (2, False, [(0, 2, 2), (2, 5, 1), (5, 7, 2)]),
    # Compacting cannot move step 2 to [3, 5): step 1 would then need 2
    # nodes on [2, 3) where only 1 is free.
    (2, True, [(0, 2, 2), (2, 5, 1), (5, 7, 2)]),
    (None, False, [(0, 2, 2), (2, 5, 1), (5, 7, 2)]),
    (None, True, [(0, 2, 2), (2, 5, 1), (5, 7, 2)]),
])
def test_case1_expansion_lets_the_job_finish_earlier(limit, compact, reserved):
    s = schedule_evolving(CASE1, 3, expand_limit=limit, compact=compact)
    assert (s.starts, s.ends) == ({1: 0, 2: reserved[0][0]}, {1: 5, 2: reserved[-1][1]})
    assert pieces(s.reserved, 1) == [(0, 2, 1), (2, 5, 2)]
    assert pieces(s.reserved, 2) == reserved
    first = reserved[0][0]
    assert pieces(s.usage, 2) == [(first, first + 2, 2), (reserved[1][0], reserved[1][0] + 2, 1),
                                  (reserved[2][0], reserved[2][0] + 2, 2)]


@pytest.mark.parametrize("limit, compact, reserved", [
    # noX: the whole profile slides until its 2-node step fits at 10.
    (1, False, [(6, 8, 1), (8, 10, 1), (10, 12, 2)]),
    # 2X: step 2 may be held twice its length: [6, 10) for a 2 s step, so
    # step 1 is delayed to [4, 6).
    (2, False, [(4, 6, 1), (6, 10, 1), (10, 12, 2)]),
    # Unbounded: step 2 runs at [2, 4) and holds its node until 10.
    (None, False, [(0, 2, 1), (2, 10, 1), (10, 12, 2)]),
    # Compacting keeps the end (12) and places steps as late as they fit.
    (2, True, [(6, 8, 1), (8, 10, 1), (10, 12, 2)]),
    (None, True, [(6, 8, 1), (8, 10, 1), (10, 12, 2)]),
])
def test_case2_expand_limit_and_compacting(limit, compact, reserved):
    s = schedule_evolving(CASE2, 4, expand_limit=limit, compact=compact)
    assert pieces(s.reserved, 2) == reserved
    assert [(a, b) for a, b, _ in pieces(s.usage, 2)] == [(a, a + 2) for a, _, _ in reserved]
    assert (s.starts[2], s.ends[2]) == (reserved[0][0], 12)
    assert pieces(s.reserved, 1) == pieces(s.usage, 1) == [(0, 10, 3)]


@pytest.mark.parametrize("limit, start, end", [(1, 6, 13), (2, 6, 13), (None, 0, 9)])
def test_case3_only_unbounded_expansion_ends_early(limit, start, end):
    s = schedule_evolving(CASE3, 4, expand_limit=limit)
    assert (s.starts[2], s.ends[2]) == (start, end)
    if limit is None:
        assert pieces(s.reserved, 2) == [(0, 3, 2), (3, 6, 1), (6, 9, 4)]
    else:
        # With l = 2 the 1 s step may wait 1 s at most, which forces step 1
        # into [4, 7) where 2 nodes are not free before 6.
        assert pieces(s.reserved, 2) == [(6, 9, 2), (9, 10, 1), (10, 13, 4)]


@pytest.mark.parametrize("jobs, nodes, reserved2, usage2", [
    (CASE1, 3, [(5, 11, 2)], [(5, 7, 2), (7, 9, 1), (9, 11, 2)]),
    (CASE2, 4, [(10, 16, 2)], [(10, 12, 1), (12, 14, 1), (14, 16, 2)]),
    (CASE3, 4, [(6, 13, 4)], [(6, 9, 2), (9, 10, 1), (10, 13, 4)]),
])
def test_rigid_baseline_reserves_the_peak_for_the_whole_run(jobs, nodes, reserved2, usage2):
    s = schedule_rigid_baseline(jobs, nodes)
    job1 = jobs[0]
    run1 = sum(d for d, _ in job1.profile)
    assert pieces(s.reserved, 1) == [(0, run1, max(n for _, n in job1.profile))]
    assert pieces(s.reserved, 2) == reserved2
    assert pieces(s.usage, 2) == usage2
    assert (s.starts[2], s.ends[2]) == (reserved2[0][0], reserved2[0][1])


def test_submit_times_and_arrival_order():
    # Listed first but submitted later, job 1 comes after job 2; job 3
    # arrives on an idle machine and starts when it arrives.
    jobs = [J(1, 1, ((4, 2),)), J(2, 0, ((3, 2),)), J(3, 20, ((1, 1), (1, 2)))]
    for s in (schedule_evolving(jobs, 2), schedule_rigid_baseline(jobs, 2)):
        assert s.starts == {2: 0, 1: 3, 3: 20}
        assert s.ends == {2: 3, 1: 7, 3: 22}


def test_later_jobs_backfill_without_delaying_earlier_ones():
    # Job 2 needs the whole machine, so waits for job 1's end; job 3, listed
    # after it, fits beside job 1's 1-node first step, ahead of job 2.
    jobs = [J(1, 0, ((2, 1), (2, 2))), J(2, 0, ((1, 2),)), J(3, 0, ((2, 1),))]
    s = schedule_evolving(jobs, 2)
    assert s.starts == {1: 0, 2: 4, 3: 0}
    assert s.ends == {1: 4, 2: 5, 3: 2}


def test_metrics_by_hand():
    s = schedule_evolving(CASE2, 4, expand_limit=None)
    m = s.metrics(CASE2, 4)
    used, held = 30 + (2 + 2 + 4), 30 + (2 + 8 + 4)
    assert m["jobs"] == 2
    assert m["makespan"] == 12
    assert m["used_node_seconds"] == used and m["reserved_node_seconds"] == held
    assert m["utilization"] == pytest.approx(used / (4 * 12))
    assert m["waste"] == pytest.approx((held - used) / held)
    assert m["mean_wait"] == 0
    assert m["mean_turnaround"] == m["mean_completion"] == 11
    assert m["last_completion"] == 12
    assert m["mean_slowdown"] == pytest.approx((10 / 10 + 12 / 6) / 2)
    assert m["mean_bounded_slowdown"] == pytest.approx((1 + 12 / 10) / 2)  # tau = 10 s
    empty = Schedule().metrics([], 4)
    assert empty["makespan"] is None and empty["utilization"] is None and empty["waste"] is None


def test_duck_typed_jobs_policies_and_bad_input():
    jobs = [SimpleNamespace(id=7, submit=0.0, profile=[(1.0, 1), (1.0, 2)])]
    policies = evolving_policies()
    assert set(policies) == {"evolving", "evolving-rigid"}
    for name, run in policies.items():
        assert run(jobs, 2).ends == {7: 2.0}, name
    for options in PAPER_VARIANTS.values():
        assert policies["evolving"](jobs, 2, **options).ends == {7: 2.0}
    with pytest.raises(ValueError, match="3 nodes"):
        schedule_evolving([J(1, 0, ((1, 3),))], 2)
    with pytest.raises(ValueError, match="empty"):
        schedule_rigid_baseline([J(1, 0, ())], 2)
    with pytest.raises(ValueError, match="positive"):
        schedule_evolving([J(1, 0, ((0, 1),))], 2)
    with pytest.raises(ValueError, match="unique"):
        schedule_evolving([J(1, 0, ((1, 1),)), J(1, 1, ((1, 1),))], 2)
    with pytest.raises(ValueError, match="at least 1"):
        schedule_evolving([], 2, expand_limit=0.5)


@pytest.mark.parametrize("seed", range(8))
def test_paper_claim_evolving_without_expansion_beats_rigid(seed):
    """Section 5: taking the evolution into account (noX) wastes nothing and
    completes no later than reserving the peak, on test cases drawn like the
    paper's (15-20 jobs of 1-10 steps, 500-3600 s, 1-75 nodes)."""
    rng = random.Random(seed)
    jobs = [J(i, 0.0, tuple((float(rng.randint(500, 3600)), rng.randint(1, 75))
                            for _ in range(rng.randint(1, 10))))
            for i in range(rng.randint(15, 20))]
    nox = schedule_evolving(jobs, 100).metrics(jobs, 100)
    rigid = schedule_rigid_baseline(jobs, 100).metrics(jobs, 100)
    assert nox["waste"] == 0 < rigid["waste"]
    assert nox["makespan"] <= rigid["makespan"]
    assert nox["mean_completion"] <= rigid["mean_completion"]
    assert nox["utilization"] >= rigid["utilization"]


# --- properties ---------------------------------------------------------------

SCHEDULERS = st.sampled_from([
    ("rigid", None, False), ("evolving", 1, False), ("evolving", 2, False),
    ("evolving", 2, True), ("evolving", None, False), ("evolving", None, True),
])


@st.composite
def workloads(draw, integral: bool = False, max_jobs: int = 7, max_steps: int = 4):
    """(jobs, nodes); times in half seconds unless ``integral``."""
    nodes = draw(st.integers(1, 6))
    unit = 1.0 if integral else 0.5
    jobs = []
    for i in range(draw(st.integers(0, max_jobs))):
        steps = draw(st.lists(st.tuples(st.integers(1, 6).map(lambda k: k * unit),
                                        st.integers(1, nodes)), min_size=1, max_size=max_steps))
        jobs.append(J(i, draw(st.integers(0, 8)) * unit, tuple(steps)))
    return jobs, nodes


def run(kind: str, limit: float | None, compact: bool, jobs: list[EvolvingJob],
        nodes: int) -> Schedule:
    if kind == "rigid":
        return schedule_rigid_baseline(jobs, nodes)
    return schedule_evolving(jobs, nodes, expand_limit=limit, compact=compact)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(workloads(), SCHEDULERS)
def test_schedule_invariants(workload, scheduler):
    jobs, nodes = workload
    kind, limit, compact = scheduler
    s = run(kind, limit, compact, jobs, nodes)
    ids = {j.id for j in jobs}
    assert set(s.starts) == set(s.ends) == ids
    assert {p[2] for p in s.usage} | {p[2] for p in s.reserved} <= ids

    for job in jobs:
        used, held = pieces(s.usage, job.id), pieces(s.reserved, job.id)
        assert s.starts[job.id] >= job.submit
        # The job computes each step of its profile once, in order.
        assert [(round(b - a, 9), n) for a, b, n in used] == [(d, n) for d, n in job.profile]
        assert all(b1 <= a2 + EPS for (_, b1, _), (a2, _, _) in zip(used, used[1:], strict=False))
        assert used[0][0] == held[0][0] == s.starts[job.id]
        assert used[-1][1] == pytest.approx(s.ends[job.id])
        # It holds nodes without a gap from start to end, and at least the
        # nodes each step computes with.
        assert all(b1 == a2 for (_, b1, _), (a2, _, _) in zip(held, held[1:], strict=False))
        assert held[-1][1] == pytest.approx(s.ends[job.id])
        for a, b, n in used:
            assert any(ha <= a + EPS and b <= hb + EPS and n <= hn for ha, hb, hn in held)
        if kind == "evolving":
            # One held piece per step; waits only after a step, within the limit.
            assert [n for _, _, n in held] == [n for _, n in job.profile]
            for (ha, hb, _), (ua, _ub, _), (d, _) in zip(held, used, job.profile, strict=True):
                assert ha == ua and hb - ha >= d - EPS
                if limit is not None:
                    assert hb - ha <= limit * d + EPS
            if limit == 1:
                assert held == used
            if not compact:
                # The first step is delayed, never expanded.
                assert held[0][1] - held[0][0] == pytest.approx(job.profile[0][0])

    # Never more nodes held than the cluster has (releases before acquisitions).
    events = sorted([(a, 1, n) for a, _, _, n in s.reserved] + [(b, 0, -n) for _, b, _, n in s.reserved])
    busy = 0
    for _, _, delta in events:
        busy += delta
        assert busy <= nodes


def _earliest_completion(others: list[tuple[float, float, int, int]], nodes: int,
                         job: EvolvingJob, limit: float | None) -> int:
    """Brute force over integer step starts (enough when all times are
    integers): the earliest end of ``job`` held as its profile, delayed and
    expanded within ``limit``, on top of ``others``."""
    horizon = int(max([job.submit] + [b for _, b, _, _ in others]))

    def fits(n: int, a: int, b: int) -> bool:
        return all(sum(k for x, y, _, k in others if x <= t < y) + n <= nodes for t in range(a, b))

    steps = [(int(d), n) for d, n in job.profile]
    best: int | None = None

    def place(i: int, s: int) -> None:
        nonlocal best
        d, n = steps[i]
        if (best is not None and s + sum(x for x, _ in steps[i:]) >= best) or not fits(n, s, s + d):
            return
        if i == len(steps) - 1:
            best = s + d
            return
        # Step i holds its nodes until the next one starts: l * d at most.
        top = max(s + d, horizon) if limit is None else s + int(limit * d)
        for nxt in range(s + d, top + 1):
            if nxt > s + d and not fits(n, nxt - 1, nxt):
                break
            place(i + 1, nxt)

    for s in range(int(job.submit), horizon + 1):
        place(0, s)
    assert best is not None
    return best


@settings(max_examples=150, deadline=None, derandomize=True)
@given(workloads(integral=True, max_jobs=4, max_steps=3), st.sampled_from([1, 2, None]),
       st.booleans())
def test_each_job_completes_as_early_as_possible(workload, limit, compact):
    """Section 4.2: the base fit gives each job, on what the jobs before it
    hold, the earliest completion its expand limit allows; compacting keeps it."""
    jobs, nodes = workload
    s = schedule_evolving(jobs, nodes, expand_limit=limit, compact=compact)
    for k, job in enumerate(sorted(jobs, key=lambda j: j.submit)):
        before = {j.id for j in sorted(jobs, key=lambda j: j.submit)[:k]}
        others = [p for p in s.reserved if p[2] in before]
        assert s.ends[job.id] == _earliest_completion(others, nodes, job, limit)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(workloads(max_steps=1), st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)),
                                        min_size=2, max_size=5),
       st.sampled_from([2, None]))
def test_compacting_keeps_the_end_and_starts_no_earlier(workload, profile, limit):
    """Single-step jobs are placed alike with and without compacting, so the
    last job sees the same occupation in both runs."""
    jobs, nodes = workload
    last = J(99, 8.0, tuple((float(d), min(n, nodes)) for d, n in profile))
    base = schedule_evolving(jobs + [last], nodes, expand_limit=limit)
    packed = schedule_evolving(jobs + [last], nodes, expand_limit=limit, compact=True)
    assert packed.ends[99] == pytest.approx(base.ends[99])
    assert packed.starts[99] >= base.starts[99]
    assert pieces(packed.reserved, 99)[-1][1] - pieces(packed.reserved, 99)[-1][0] == profile[-1][0]
