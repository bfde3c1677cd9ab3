"""The simulator: exact schedules for tiny workloads, invariants, speed-independent results."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler._model import Grow, Shrink, Start
from scheduler.metrics import compute_metrics
from scheduler.policies import get_policy
from scheduler.simulator import Reconfig, Simulator, runtime_on


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
    return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True, text=True,
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
