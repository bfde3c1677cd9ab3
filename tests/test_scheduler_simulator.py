"""The simulator: exact schedules for tiny workloads, invariants, speed-independent results."""

from __future__ import annotations

import dataclasses

import pytest

from apgas_scheduler._model import Grow, Shrink, Start
from apgas_scheduler.metrics import compute_metrics
from apgas_scheduler.policies import get_policy
from apgas_scheduler.sim.simulator import Reconfig, Simulator, runtime_on


@dataclasses.dataclass(frozen=True)
class J:
    id: int
    submit: float
    cls: str
    min_nodes: int
    max_nodes: int
    preferred: int
    runtime: float
    estimate: float = 0.0
    rho: float = 0.0
    serial: float | None = None
    profile: tuple = ()
    name: str = ""

    def __post_init__(self):
        if not self.estimate:
            object.__setattr__(self, "estimate", self.runtime)


def rigid(i, submit, nodes, runtime, estimate=0.0):
    return J(i, submit, "rigid", nodes, nodes, nodes, runtime, estimate)


def spans(result):
    return {i: (r["start"], r["end"]) for i, r in result.jobs.items()}


# A: 3 nodes 0-10; B: the head, all 4 nodes; C: small but long, arrives at 1
BLOCKED = [rigid(1, 0, 3, 10), rigid(2, 0, 4, 5), rigid(3, 1, 1, 20)]


@pytest.mark.parametrize("policy, expected", [
    ("fcfs", {1: (0, 10), 2: (10, 15), 3: (15, 35)}),
    ("backfill", {1: (0, 10), 2: (21, 26), 3: (1, 21)}),      # C jumps ahead and delays B
    ("easy", {1: (0, 10), 2: (10, 15), 3: (15, 35)}),         # C would delay the head: no
    ("malleable", {1: (0, 10), 2: (10, 15), 3: (15, 35)}),
])
def test_rigid_schedules_by_hand(policy, expected):
    result = Simulator(4, get_policy(policy)).run(BLOCKED)
    assert spans(result) == expected
    assert result.metrics["makespan"] == max(e for _, e in expected.values())


def test_easy_backfills_a_job_that_ends_before_the_shadow_time():
    jobs = [rigid(1, 0, 3, 10), rigid(2, 0, 4, 5), rigid(3, 1, 1, 20, estimate=8)]
    result = Simulator(4, get_policy("easy")).run(jobs)
    assert spans(result) == {1: (0, 10), 2: (21, 26), 3: (1, 21)}  # its estimate was wrong


def test_minagree_grows_a_lone_malleable_job_at_once():
    m = J(1, 0, "malleable", 1, 4, 2, runtime=8)  # 16 s of work on one node, 4 s on four
    result = Simulator(4, get_policy("malleable", resize_interval=0)).run([m])
    assert spans(result) == {1: (0, 4)}
    assert [d for _, d in result.decisions] == [Start(1, 1), Grow(1, 3)]
    costly = Simulator(4, get_policy("malleable", resize_interval=0), reconfig=Reconfig(alpha=1)).run([m])
    assert spans(costly) == {1: (0, 7)}  # 3 s to add three nodes, then 4 s
    assert costly.metrics["reconfiguration_seconds"] == 3


def test_minagree_shrinks_the_malleable_job_for_a_rigid_arrival():
    m = J(1, 0, "malleable", 1, 4, 2, runtime=8)
    r = rigid(2, 2, 2, 5)
    result = Simulator(4, get_policy("malleable", resize_interval=0), record_events=True).run([m, r])
    # m: half its work done on 4 nodes by t=2, the other half on 2 nodes takes 4 s
    assert spans(result) == {1: (0, 6), 2: (2, 7)}
    assert [d for _, d in result.decisions] == [Start(1, 1), Grow(1, 3), Shrink(1, 2), Start(2, 2)]
    live_like = compute_metrics(result.events)  # the live scheduler's metrics agree
    assert live_like["makespan"] == pytest.approx(result.metrics["makespan"])
    assert live_like["utilization"] == pytest.approx(result.metrics["utilization"])
    assert live_like["max_overlap_violations"] == 0


def test_shrink_cost_keeps_nodes_in_transit():
    m = J(1, 0, "malleable", 1, 4, 2, runtime=8)
    r = rigid(2, 2, 2, 5)
    result = Simulator(4, get_policy("malleable", resize_interval=0),
                       reconfig=Reconfig(alpha=1)).run([m, r])
    # growing 1 -> 4 costs 3 s (m computes from t=3), at t=2 it is still reconfiguring:
    # no shrink then; it shrinks at 3 (2 s), so r starts at 5
    assert spans(result)[2] == (5, 10)


def test_models():
    j = J(1, 0, "malleable", 1, 8, 2, runtime=100, rho=0.0)
    assert runtime_on(j, 4, 100) == 50
    assert runtime_on(dataclasses.replace(j, rho=1.0), 4, 100) == 100
    amdahl = dataclasses.replace(j, serial=0.5)
    assert runtime_on(amdahl, 1, 100, "amdahl") == pytest.approx(100 * 1.0 / 0.75)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one node"):
        Simulator(0, get_policy("fcfs"))
    with pytest.raises(ValueError, match="model must be"):
        Simulator(2, get_policy("fcfs"), model="magic")
    result = Simulator(2, get_policy("fcfs")).run([rigid(1, 0, 3, 5), rigid(2, 0, 1, 5)])
    assert result.metrics["rejected"] == 1 and result.metrics["jobs"] == 1


def run_cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "apgas_scheduler", *args], capture_output=True, text=True,
                          timeout=120)


def test_simulate_and_compare_from_the_command_line(tmp_path):
    out = tmp_path / "m.json"
    done = run_cli("simulate", "--trace", "tests/data/sample_200.swf", "--nodes", "64",
                   "--policy", "easy", "--malleable-share", "0.5", "--json", str(out))
    assert done.returncode == 0, done.stderr
    import json
    metrics = json.loads(out.read_text())
    for key in ("makespan", "utilization", "mean_wait", "mean_turnaround", "mean_slowdown",
                "mean_bounded_slowdown", "reconfigurations"):
        assert key in metrics
    assert 0 < metrics["utilization"] <= 1 and metrics["jobs"] == 200
    plot = tmp_path / "cmp.png"
    done = run_cli("compare", "--generate", "evolving", "--nodes", "75", "--policies",
                   "evolving,evolving-rigid", "--plot", str(plot), "--json", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_errors_name_the_problem():
    bad = run_cli("simulate", "--trace", "tests/data/bad_line.swf", "--nodes", "4", "--policy", "easy")
    assert bad.returncode == 2 and "bad_line.swf:6: expected 18 fields, found 17" in bad.stderr
    unknown = run_cli("simulate", "--generate", "kit", "--nodes", "4", "--policy", "foo")
    assert unknown.returncode == 2 and "unknown policy 'foo'; known: fcfs" in unknown.stderr


def test_policy_options_reach_the_policies():
    import argparse
    import math

    from apgas_scheduler.policies.mebf import MEBF
    from apgas_scheduler.sim import compare as cmp

    ns = argparse.Namespace(resize_interval=30.0, alpha=0.01, beta=0.05, process_cost=0.5,
                            expand_policy="spare")
    policy = cmp.make_policy("mebf-shrink+", ns)
    assert isinstance(policy, MEBF) and policy.expand == "spare" and policy.variant == "shrink+"
    # the feasibility test counts what the simulator charges
    assert policy.reconfig_cost(None, 4, 8) == Reconfig(0.01, 0.05, 0.5).cost(4, 8) == 0.04 + 0.05 / 8 + 2
    assert cmp.policy_label("mebf", ns) == "mebf spare"
    for limit, compact, label in ((None, None, "evolving"), (2.0, True, "evolving 2X+c"),
                                  (math.inf, False, "evolving infX")):
        assert cmp.policy_label("evolving", argparse.Namespace(expand_limit=limit, compact=compact)) == label


def test_policy_options_from_the_command_line(tmp_path):
    import json

    runs = {}
    for extra in ([], ["--expand-limit", "2"], ["--expand-limit", "unbounded", "--compact"]):
        out = tmp_path / "e.json"
        done = run_cli("compare", "--generate", "evolving", "--nodes", "75", "--seed", "3",
                       "--policies", "evolving", "--json", str(out), *extra)
        assert done.returncode == 0, done.stderr
        run = json.loads(out.read_text())["runs"][0]
        runs[run["policy"]] = run["metrics"]
    assert set(runs) == {"evolving", "evolving 2X", "evolving infX+c"}
    assert runs["evolving"]["waste"] == 0.0  # no expansion, no waste
    done = run_cli("compare", "--generate", "kit", "--jobs", "100", "--nodes", "64", "--malleable-share",
                   "1", "--alpha", "0.01", "--beta", "0.01", "--policies", "mebf",
                   "--expand-policy", "intensive")
    assert done.returncode == 0 and "mebf intensive" in done.stdout, done.stderr
    turnaround = {}
    for serial in ("0", "0.5"):
        out = tmp_path / f"a{serial}.json"
        done = run_cli("simulate", "--generate", "kit", "--jobs", "100", "--nodes", "64",
                       "--malleable-share", "1", "--policy", "malleable", "--model", "amdahl",
                       "--serial-fraction", serial, "--json", str(out))
        assert done.returncode == 0, done.stderr
        turnaround[serial] = json.loads(out.read_text())["mean_turnaround"]
    assert turnaround["0.5"] != turnaround["0"]  # the serial fraction reaches the model


def test_policy_option_errors_name_option_and_value():
    cases = [
        (["simulate", "--generate", "kit", "--nodes", "8", "--policy", "easy", "--model", "amdahl",
          "--serial-fraction", "1.5"], "argument --serial-fraction: 1.5 is not in [0, 1)"),
        (["simulate", "--generate", "kit", "--nodes", "8", "--policy", "easy",
          "--serial-fraction", "0.1"], "--serial-fraction 0.1 applies only to --model amdahl"),
        (["simulate", "--generate", "evolving", "--nodes", "8", "--policy", "evolving",
          "--expand-limit", "0.5"], "argument --expand-limit: 0.5 must be at least 1"),
        (["simulate", "--generate", "evolving", "--nodes", "8", "--policy", "evolving",
          "--expand-limit", "lots"], "argument --expand-limit: 'lots' is neither a number"),
        (["simulate", "--generate", "kit", "--nodes", "8", "--policy", "mebf",
          "--expand-policy", "greedy"], "argument --expand-policy: invalid choice: 'greedy'"),
        (["simulate", "--generate", "kit", "--nodes", "8", "--policy", "easy",
          "--expand-policy", "spare"], "--expand-policy spare applies only to the mebf policies"),
        (["simulate", "--generate", "kit", "--nodes", "8", "--policy", "easy", "--compact"],
         "--compact applies only to the evolving policy"),
        (["simulate", "--trace", "tests/data/tiny.swf", "--nodes", "4", "--policy", "evolving"],
         "evolving policies need evolving jobs with profiles (e.g. --generate evolving)"),
    ]
    for args, message in cases:
        done = run_cli(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_simulate_says_how_many_jobs_were_left_out_and_why():
    done = run_cli("simulate", "--trace", "tests/data/tiny.swf", "--nodes", "4", "--policy", "easy")
    assert done.returncode == 0, done.stderr
    assert ("2 job(s) simulated on 4 node(s) (3 left out: they need more than 4 node(s) at "
            "--procs-per-node 1; 2 trace record(s) skipped: no run time") in done.stdout
    done = run_cli("simulate", "--trace", "tests/data/tiny.swf", "--nodes", "4", "--procs-per-node", "4",
                   "--policy", "easy")
    assert "5 job(s) simulated on 4 node(s) (2 trace record(s) skipped" in done.stdout


def test_evolving_timeline_queries_match_a_segment_by_segment_scan():
    """The window-jumping fit and the sliced peaks of the evolving list
    scheduler give what the plain left-to-right scans give."""
    import random

    from apgas_scheduler.sim.listsched import _Timeline

    def fit(tl, ts, d, limit):
        k = max(i for i, t in enumerate(tl.times) if t <= ts)
        end = ts + d
        while tl.times[k] < end:
            if tl.used[k] > limit:
                ts, end = tl.times[k + 1], tl.times[k + 1] + d
            k += 1
        return ts

    def peaks(tl, a, b):
        k = max(i for i, t in enumerate(tl.times) if t <= a)
        inside = [i for i in range(k, len(tl.times)) if tl.times[i] < b]
        peak = max(tl.used[i] for i in inside)
        last = max(i for i in inside if tl.used[i] == peak)
        first = min(i for i in inside if tl.used[i] == peak)
        return (peak, min(tl.times[last + 1], b)), (peak, max(tl.times[first], a))

    rng = random.Random(7)
    for _ in range(30):
        tl = _Timeline()
        for _ in range(rng.randint(1, 40)):
            a = rng.choice([rng.uniform(0, 100), float(rng.randint(0, 100))])
            tl.add(a, a + rng.choice([rng.uniform(0.1, 30), float(rng.randint(1, 30))]), rng.randint(1, 4))
        for _ in range(40):
            ts, d, limit = rng.uniform(-5, 120), rng.uniform(0.05, 25), rng.randint(0, 8)
            assert tl.earliest_fit(ts, d, limit) == fit(tl, ts, d, limit)
            a = rng.uniform(-5, 120)
            b = a + rng.uniform(0.01, 40)
            assert (tl.peak_last(a, b), tl.peak_first(a, b)) == peaks(tl, a, b)
