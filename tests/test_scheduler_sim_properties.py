"""The simulator as a whole, under every policy it runs: properties over random
small workloads (checked against a replay of its own event record), and exact
schedules worked out by hand for MEBF and DMR."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from apgas_scheduler._model import Grow, Shrink, Start
from apgas_scheduler.engine import Engine, Tracked
from apgas_scheduler.policies import get_policy, policy_names
from apgas_scheduler.policies.planning import Policy
from apgas_scheduler.sim.simulator import Reconfig, Simulator, runtime_on
from apgas_scheduler.sim.workload import SimJob, read_swf

DATA = Path(__file__).resolve().parent / "data"

# Every policy the discrete-event simulator takes for rigid/moldable/malleable jobs
# (compare.py sends "evolving" to the list scheduler, but the live evolving EASY runs
# here too: with jobs that never ask it is EASY, and must keep the same invariants).
SIM_POLICIES = ("fcfs", "backfill", "easy", "malleable", "evolving", "mebf", "mebf-shrink+",
                "mebf-expand+", "dmr", "thrifty", "min-agreement", "avg-agreement", "pref-agreement",
                "min-common-pool", "avg-common-pool", "pref-common-pool", "min-steal-agreement",
                "avg-steal-agreement", "pref-steal-agreement", "lending", "sharing")


def test_every_simulator_policy_is_covered():
    assert set(policy_names()) == set(SIM_POLICIES)


# -- random workloads ---------------------------------------------------------------------

# One job's raw draws; the node counts are fitted to the cluster in `workloads` (strategies
# built once here: building them inside each draw made generation the slow part).
_job_draws = st.tuples(
    st.sampled_from(["malleable", "rigid", "moldable", "malleable"]),
    st.integers(0, 19),                      # 0: a job too large for the cluster
    st.integers(0, 15), st.integers(0, 15), st.integers(0, 15),  # min, max, preferred
    st.one_of(st.integers(1, 500).map(float),
              st.floats(0.5, 500, allow_nan=False, allow_infinity=False)),  # run time
    st.one_of(st.none(), st.integers(1, 1000).map(float)),  # estimate (None: exact)
    st.one_of(st.integers(0, 30), st.integers(0, 300)),  # submit time (often crowded)
    st.sampled_from([0.0, 0.1, 0.3, 1.0]),   # rho
    st.sampled_from([None, 0.0, 0.2, 1.0]),  # Amdahl serial fraction
)


def _job(i, total, draws):
    cls, big, a, b, c, runtime, estimate, submit, rho, serial = draws
    low = total + 1 if big == 0 else 1 + a % total
    high = low if cls == "rigid" or big == 0 else low + b % (total - low + 1)
    pref = low + c % (high - low + 1)
    return SimJob(id=i + 1, submit=float(submit), cls=cls, min_nodes=low, max_nodes=high,
                  preferred=pref, runtime=runtime, estimate=estimate or runtime, rho=rho,
                  serial=serial)


# (total nodes, jobs): 1..16 nodes, 1..25 jobs of mixed classes with random submit times,
# run times, estimates (exact, over or under) and scalability; now and then a job too large
# for the cluster (the simulator leaves it out).
workloads = st.tuples(st.integers(1, 16), st.lists(_job_draws, min_size=1, max_size=25)).map(
    lambda tj: (tj[0], [_job(i, tj[0], d) for i, d in enumerate(tj[1])]))


reconfigs = st.one_of(
    st.just(Reconfig()),
    st.builds(Reconfig, alpha=st.sampled_from([0.0, 0.5, 2.0, 10.0]),
              beta=st.sampled_from([0.0, 3.0, 40.0]), b=st.sampled_from([0.0, 1.0])))


class _Warnings(logging.Handler):
    """Collects the simulator's warnings (an ignored decision, a policy that keeps deciding)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def simulate(total, jobs, policy, **options):
    handler = _Warnings()
    logger = logging.getLogger("apgas_scheduler.sim.simulator")
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False  # collected here, not by pytest
    try:
        result = Simulator(total, policy, record_events=True, **options).run(jobs)
    finally:
        logger.propagate = propagate
        logger.removeHandler(handler)
    return result, [m for m in handler.messages if "left out" not in m]


def node_index(name: str) -> int:
    assert name.startswith("n")
    return int(name[1:])


def check_run(total, jobs, result, warnings, reconfig, model, policy_name):
    accepted = {j.id: j for j in jobs if j.min_nodes <= total}
    assert result.metrics["rejected"] == len(jobs) - len(accepted)
    assert set(result.jobs) == set(accepted)
    # The policy's decisions are all possible: the simulator ignored none of them.
    assert warnings == []

    # -- replay the event record: who holds which node, when -----------------------------
    events = result.events
    assert events[0]["event"] == "pool" and len(events[0]["nodes"]) == total
    owner: dict[int, int] = {}  # node -> job
    held: dict[int, set[int]] = {}
    started, ended = Counter(), Counter()
    node_seconds = 0.0
    busy_at: list[tuple[float, int]] = []  # busy count after each event
    last_t = 0.0
    for e in events[1:]:
        t = e["t"]
        assert t >= last_t, "events out of time order"
        node_seconds += len(owner) * (t - last_t)
        last_t = t
        kind = e["event"]
        if kind == "submit":
            assert t == accepted[e["job"]].submit
            continue
        jid = e["job"]
        job = accepted[jid]
        if kind in ("start", "grow"):
            if kind == "start":
                assert started[jid] == 0 and t >= job.submit and t == result.jobs[jid]["start"]
                started[jid] += 1
                held[jid] = set()
            else:
                assert started[jid] == 1 and ended[jid] == 0 and job.cls == "malleable"
            for n in map(node_index, e["nodes"]):
                assert 0 <= n < total and n not in owner, f"node n{n} taken twice at {t}"
                owner[n] = jid
                held[jid].add(n)
        elif kind in ("shrink", "end"):
            assert started[jid] == 1 and ended[jid] == 0
            if kind == "shrink":
                assert job.cls == "malleable"
                freed = set(map(node_index, e["nodes"]))
                assert freed and freed <= held[jid]
            else:
                ended[jid] += 1
                assert t == result.jobs[jid]["end"]
                freed = set(held[jid])
            for n in freed:
                assert owner.pop(n) == jid
            held[jid] -= freed
        else:
            raise AssertionError(f"unexpected event {e}")
        assert len(owner) <= total
        if jid in held and ended[jid] == 0:
            # Nodes in transit after a shrink still count as the job's: between min and max.
            assert job.min_nodes <= len(held[jid]) <= job.max_nodes, (policy_name, e)
        busy_at.append((t, len(owner)))
    # Every accepted job started once and ended once, holding nothing at the end.
    assert all(started[j] == 1 and ended[j] == 1 for j in accepted)
    assert not owner

    # The timeline (busy nodes after each pass of the policy) agrees with the replay: each
    # step is a count the replay reaches at its time, and the last step at or before a
    # time is the count once that instant is over.
    reached: dict[float, set[int]] = {}
    settled: list[tuple[float, int]] = []
    before = 0
    for t, b in busy_at:
        reached.setdefault(t, {before}).add(b)
        if settled and settled[-1][0] == t:
            settled[-1] = (t, b)
        else:
            settled.append((t, b))
        before = b
    times = [t for t, _ in result.timeline]
    assert times == sorted(times)
    for t, b in result.timeline:
        assert 0 <= b <= total and b in reached.get(t, {b})
    for t, b in settled:
        steps = [s for s in result.timeline if s[0] <= t]
        assert (steps[-1][1] if steps else 0) == b

    # -- replay the decisions: allotments, and the work each job gets done ----------------
    alloc: dict[int, int] = {}
    progress: dict[int, float] = {}
    anchor: dict[int, float] = {}
    resizes = Counter()
    for t, d in result.decisions:
        job = accepted[d.job]
        if isinstance(d, Start):
            assert d.job not in alloc and t >= job.submit
            alloc[d.job], progress[d.job], anchor[d.job] = d.nodes, 0.0, t
            assert result.jobs[d.job]["start"] == t
        else:
            assert isinstance(d, (Grow, Shrink)) and job.cls == "malleable" and d.nodes >= 1
            assert t >= anchor[d.job], "resized while still reconfiguring"
            old = alloc[d.job]
            new = old + d.nodes if isinstance(d, Grow) else old - d.nodes
            progress[d.job] += (t - anchor[d.job]) / runtime_on(job, old, job.runtime, model)
            anchor[d.job] = t + reconfig.cost(old, new)
            alloc[d.job] = new
            resizes[d.job] += 1
        assert job.min_nodes <= alloc[d.job] <= job.max_nodes
    assert set(alloc) == set(accepted)
    for jid, job in accepted.items():
        rec = result.jobs[jid]
        assert rec["submit"] <= rec["start"] <= rec["end"]
        assert rec["reconfigs"] == resizes[jid]
        done = progress[jid] + (rec["end"] - anchor[jid]) / runtime_on(
            job, alloc[jid], job.runtime, model)
        assert done == pytest.approx(1.0, rel=1e-6), f"job {jid} did {done} of its work"
        if job.cls != "malleable":
            # Never resized: exactly its run time at the size it started with.
            assert rec["end"] - rec["start"] == pytest.approx(
                runtime_on(job, alloc[jid], job.runtime, model), rel=1e-9)

    # -- metrics --------------------------------------------------------------------------
    m = result.metrics
    if not accepted:
        assert m == {"jobs": 0, "rejected": len(jobs)}
        return
    assert m["jobs"] == len(accepted) and m["policy"] == policy_name
    numeric = {k: v for k, v in m.items() if isinstance(v, (int, float)) and k != "policy"}
    assert all(math.isfinite(v) for v in numeric.values()), m
    first = min(j.submit for j in accepted.values())
    last = max(r["end"] for r in result.jobs.values())
    assert m["makespan"] == pytest.approx(last - first) and m["makespan"] > 0
    # Utilization in [0, 1] (a float sum may overshoot 1 by rounding only) and equal to
    # the node-seconds of the replay.
    assert 0 < m["utilization"] <= 1 + 1e-9
    assert m["utilization"] == pytest.approx(node_seconds / (total * m["makespan"]), rel=1e-9)
    waits = [r["start"] - r["submit"] for r in result.jobs.values()]
    assert m["mean_wait"] == pytest.approx(sum(waits) / len(waits), rel=1e-9, abs=1e-9)
    assert m["mean_wait"] >= 0 and m["mean_turnaround"] > 0
    assert m["mean_slowdown"] >= 1 - 1e-9 and m["mean_bounded_slowdown"] >= 1
    assert m["reconfigurations"] == sum(resizes.values())
    assert m["reconfiguration_seconds"] >= 0
    if reconfig == Reconfig():
        assert m["reconfiguration_seconds"] == 0
    if policy_name == "fcfs":  # FCFS never lets a job overtake an earlier one
        order = [d.job for _, d in result.decisions if isinstance(d, Start)]
        assert order == sorted(order, key=lambda i: (accepted[i].submit, i))
    if policy_name in ("fcfs", "backfill", "easy", "evolving"):
        assert m["reconfigurations"] == 0


# Found by hypothesis (seed 3, avg-steal-agreement): 7 nodes; job 4 (malleable 1..4, rho 1)
# starts at 0 and grows to 4; at 1, jobs 5 and 6 (2 nodes each) come: 5 starts on 2 of the
# 3 idle nodes, 4 is shrunk by 2 for 6 (a free shrink: its nodes come back at its release
# event, after the passes of the instant) and the pass that started 5 is followed by another,
# in which 4 showed 2 nodes and took orders: it was grown by the idle node while still
# holding the 2 on their way back, 5 nodes of its 4. Jobs 1-3 (too large) are left out.
_SHRINK_THEN_GROW = (7, [_job(i, 7, d) for i, d in enumerate(
    3 * [("malleable", 0, 0, 0, 0, 1.0, None, 0, 0.0, None)]
    + [("malleable", 1, 0, 10, 0, 2.0, None, 0, 1.0, None)]
    + 2 * [("malleable", 1, 1, 0, 0, 1.0, None, 1, 0.0, None)])])


# A passing run takes about half a second per policy; a failing one shrinks its example,
# which takes up to hypothesis's own cap of 300 s (its MAX_SHRINKING_SECONDS; about 45 s for
# the example above on a quiet machine, more with four workers on two cores). The timeout is
# above that cap, so that a failure is reported with its example, never as a timeout.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("policy_name", SIM_POLICIES)
@settings(max_examples=100, deadline=None)
@example(workload=_SHRINK_THEN_GROW, reconfig=Reconfig(), model="rho", resize_interval=0.0,
         interval=None, expand="handoff", factor=1)
@given(workload=workloads, reconfig=reconfigs, model=st.sampled_from(["rho", "amdahl"]),
       resize_interval=st.sampled_from([0.0, 10.0]),
       interval=st.sampled_from([None, None, 25.0]),
       expand=st.sampled_from(["handoff", "spare", "intensive"]), factor=st.sampled_from([1, 2]))
def test_simulator_invariants(policy_name, workload, reconfig, model, resize_interval, interval,
                              expand, factor):
    total, jobs = workload
    options = {"expand": expand} if policy_name.startswith("mebf") else \
        {"factor": factor} if policy_name == "dmr" else {}
    policy = get_policy(policy_name, resize_interval=resize_interval, **options)
    result, warnings = simulate(total, jobs, policy, reconfig=reconfig, model=model,
                                interval=interval)
    check_run(total, jobs, result, warnings, reconfig, model, policy_name)


class _GrowToMax(Policy):
    """Keeps the contract and no more: grows every job that takes orders to the maximum
    its view allows, and answers every check so."""

    name = "grow-to-max"

    def decide(self, now, queue, running, free, total):
        return [Grow(j.id, j.max_nodes - j.nodes) for j in running
                if j.resizable and j.nodes < j.max_nodes]

    def answer(self, now, job, queue, running, free, total, factor=1):
        return Grow(job.id, job.max_nodes - job.nodes)


def test_no_grow_past_the_maximum_with_a_shrink_in_flight(caplog):
    """A job whose shrink is in flight holds the nodes it gives back until they are back
    (a free shrink in the simulator does not even hold it busy): it takes no order, and
    a grow by what its view leaves (2 nodes shown of 4) is refused, in a pass or as the
    answer to a check, whatever the policy."""
    engine: Engine[int] = Engine(range(7), _GrowToMax(0.0), logging.getLogger("test.engine"))
    job = Tracked(4, "malleable", 1, 4, 10.0, 0.0, ready=True)
    engine.submit(job)
    engine.start(job, 4, 0.0)
    engine.begin_shrink(job, 2, 1.0, hold=False)
    assert (job.size, job.held, job.busy) == (2, 4, False)
    assert not job.view().resizable and engine.decide(1.0) == []
    assert "no order now" in (engine.refusal(Grow(4, 2)) or "")
    with caplog.at_level(logging.WARNING, "test.engine"):
        assert engine.answer_check(job, 1, 4, 4, 1, 1.0) == (None, [], 0)
    assert "6 node(s) outside its [1, 4]" in caplog.text and job.held == 4
    engine.finish_shrink(job, 2, job.nodes[2:], 1.0)
    assert engine.refusal(Grow(4, 2)) is None and engine.refusal(Grow(4, 3)) is not None


# -- exact schedules by hand ----------------------------------------------------------------

def spans(result):
    return {i: (r["start"], r["end"]) for i, r in result.jobs.items()}


def approx_spans(expected):
    return {i: (pytest.approx(s, abs=1e-9), pytest.approx(e, abs=1e-9))
            for i, (s, e) in expected.items()}


# 4 nodes, free reconfiguration, linear speed-up (rho 0), resize_interval 10, estimates exact.
# A: malleable 1..4 nodes, preferred 4, 100 s at 4 nodes (400 node-s of work);
# B: rigid 1 node, 30 s, arrives at 20; C: rigid 2 nodes, 10 s, arrives at 30.
ABC = [SimJob(1, 0.0, "malleable", 1, 4, 4, 100.0, 100.0),
       SimJob(2, 20.0, "rigid", 1, 1, 1, 30.0, 30.0),
       SimJob(3, 30.0, "rigid", 2, 2, 2, 10.0, 10.0)]

# Common to the variants up to t=50:
#  t=0   A starts at its preferred 4 nodes (queue empty, nothing idle to expand with).
#  t=20  B waits with no node idle: every variant shrinks. A's share is floor(0.4*4) = 1,
#        just B's need; feasible (80 s left >= theta*100, 80*4/3 <= 2*80). A has done 0.2
#        of its work; B starts at once on the node A gives back (shrinks cost nothing) and
#        ends at 50; A, on 3 nodes (133.3 s for all its work), would end 20 + 0.8*133.3.
#  t=30  C waits, no node idle: A's share of 3 nodes is floor(1.2) = 1 < C's 2: no shrink.
#  t=50  B ends, 1 node idle, C still needs 1 more. A has done 0.2 + 30/133.3 = 0.425.
# basic: leaves the gap; C starts when A ends at 20 + 0.8*400/3 = 380/3 = 126.67.
# shrink+: shrinks A by 1 anyway (its share, 76.7 s left at 3 nodes, 115 s at 2: feasible);
#        C starts at 50 and ends at 60. A, on 2 nodes (200 s in all), needs 0.575*200 = 115 s
#        more: ends at 165. At 60 the 2 idle nodes are not more than A's 2 (handoff): no grow.
# expand+ (intensive expand): gives A the idle node (any amount, feasible); A, on 4 nodes
#        again, needs 0.575*100 = 57.5 s more: ends at 107.5; C starts then, ends at 117.5.
@pytest.mark.parametrize("name, options, expected", [
    ("mebf", {}, {1: (0, 380 / 3), 2: (20, 50), 3: (380 / 3, 410 / 3)}),
    ("mebf-shrink+", {}, {1: (0, 165), 2: (20, 50), 3: (50, 60)}),
    ("mebf-expand+", {"expand": "intensive"}, {1: (0, 107.5), 2: (20, 50), 3: (107.5, 117.5)}),
])
def test_mebf_variants_by_hand(name, options, expected):
    result = Simulator(4, get_policy(name, **options)).run(ABC)
    assert spans(result) == approx_spans(expected)
    assert result.metrics["reconfigurations"] == {"mebf": 1, "mebf-shrink+": 2,
                                                  "mebf-expand+": 2}[name]
    decided = [(t, d) for t, d in result.decisions if not isinstance(d, Start)]
    assert decided == {"mebf": [(20, Shrink(1, 1))],
                       "mebf-shrink+": [(20, Shrink(1, 1)), (50, Shrink(1, 1))],
                       "mebf-expand+": [(20, Shrink(1, 1)), (50, Grow(1, 1))]}[name]


# The same basic case with a reconfiguration cost of 2 s per node changed: A's shrink at
# 20 takes 2 s, during which A computes nothing and its node is in transit, so B starts at
# 22 (ends 52). A resumes at 22 on 3 nodes with 0.8 of its work left: ends 22 + 0.8*400/3
# = 128.67; C, as in basic, waits for it (at 30 A's share is still 1 < 2): 128.67 .. 138.67.
def test_mebf_basic_by_hand_with_a_reconfiguration_cost():
    result = Simulator(4, get_policy("mebf"), reconfig=Reconfig(alpha=2.0)).run(ABC)
    a_end = 22 + 0.8 * 400 / 3
    assert spans(result) == approx_spans({1: (0, a_end), 2: (22, 52), 3: (a_end, a_end + 10)})
    assert result.metrics["reconfiguration_seconds"] == 2


# tests/data/tiny.swf at 4 processors per node, submit times from 1000 made relative:
#   job 1: t=0,   2 nodes, 3600 s (estimate 7200)  -> made malleable 1..4, preferred 2
#   job 2: t=60,  1 node,   120 s (estimate 600)
#   job 4: t=200, 4 nodes,  900 s (estimate 900)
#   job 5: t=500, 1 node,  4000 s (estimate 3600, too low)
#   job 7: t=800, 2 nodes, 30.5 s (estimate 60)
# DMR, 4 nodes, free reconfiguration, linear speed-up, resize_interval 10. Job 1 holds
# 7200 node-s of work (1800 s on 4 nodes, 3600 s on 2); fractions done in brackets.
#  t=0    1 starts with all 4 nodes (EASY with the moldable extension: as many as it may).
#  t=60   2 waits; 1 asks and, above its preference, shrinks to 2 [60/1800 = 1/30 done];
#         2 starts on the 1 node it needs at once (ends 180), 1 node idle.
#  t=180  2 ends, nothing waits: 1 grows to its maximum 4 [+120/3600: 2/30 done].
#  t=200  4 waits: 1 shrinks to its preference 2 [+20/1800: 7/90 done, 83/90 left, i.e.
#         3320 s on 2 nodes: ends 3520]. 4 (4 nodes) cannot start: 2 nodes idle; the
#         shadow time is 1's estimated end 200 + 83/90*7200 = 6840.
#  t=500  5 backfills (500 + 3600 <= 6840) on 1 node: ends 4500. 1 stays at its preference.
#  t=800  7 (2 nodes) does not fit on the 1 idle node.
#  t=3520 1 ends, 3 nodes idle; 4's shadow is 5's estimated end 4100: 7 backfills
#         (3520 + 60 <= 4100), ends 3550.5.
#  t=4500 5 ends (400 s late); 4 starts, ends 5400.
def test_dmr_on_the_tiny_swf_trace_by_hand():
    jobs = read_swf(DATA / "tiny.swf", procs_per_node=4)
    assert [(j.id, j.submit, j.preferred, j.runtime, j.estimate) for j in jobs] == [
        (1, 0, 2, 3600, 7200), (2, 60, 1, 120, 600), (4, 200, 4, 900, 900),
        (5, 500, 1, 4000, 3600), (7, 800, 2, 30.5, 60)]
    jobs[0] = dataclasses.replace(jobs[0], cls="malleable", min_nodes=1, max_nodes=4)
    result = Simulator(4, get_policy("dmr")).run(jobs)
    assert spans(result) == approx_spans({1: (0, 3520), 2: (60, 180), 4: (4500, 5400),
                                          5: (500, 4500), 7: (3520, 3550.5)})
    assert [(t, d) for t, d in result.decisions if not isinstance(d, Start)] == [
        (60, Shrink(1, 2)), (180, Grow(1, 2)), (200, Shrink(1, 2))]
    assert result.metrics["makespan"] == 5400
    # 1: 4 nodes 0-60, 2 to 180, 4 to 200, 2 to 3520; 2: 120; 5: 4000; 7: 61; 4: 3600.
    busy = 4 * 60 + 2 * 120 + 4 * 20 + 2 * 3320 + 120 + 4000 + 61 + 3600
    assert result.metrics["utilization"] == pytest.approx(busy / (4 * 5400))
