"""Per-class metrics (``metrics["by_class"]``) in the simulator, the event log's
metrics and the command line, and the incentive to be malleable
(``apgas_scheduler.sim.incentive``), on workloads small enough to work out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_scheduler_metrics import TWO_JOBS, ev

from apgas_scheduler.__main__ import main
from apgas_scheduler.metrics import compute_metrics
from apgas_scheduler.policies import get_policy
from apgas_scheduler.sim.incentive import as_rigid, incentive, run_with_incentive
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from apgas_scheduler.sim.workload import SimJob
from apgas_scheduler.stats import JobTimes, summarize_by_class

# SimJob(id, submit, cls, min_nodes, max_nodes, preferred, runtime, estimate)
# FCFS on 4 nodes: 1 (rigid, 2 nodes) runs 0-10 beside 2 (malleable, started at its
# maximum 2) 0-20; 3 (rigid, all 4, submitted at 1) waits for both, 20-25; 4 (moldable,
# submitted at 2) behind it gets all 4 at 25 and runs 8 x 2/4 = 4 s, until 29.
MIXED = [SimJob(1, 0.0, "rigid", 2, 2, 2, 10.0, 10.0),
         SimJob(2, 0.0, "malleable", 1, 2, 2, 20.0, 20.0),
         SimJob(3, 1.0, "rigid", 4, 4, 4, 5.0, 5.0),
         SimJob(4, 2.0, "moldable", 1, 4, 2, 8.0, 8.0)]

MIXED_BY_CLASS = {
    # waits 0 and 19, turnarounds 10 and 24, run times 10 and 5
    "rigid": {"jobs": 2, "mean_wait": 9.5, "mean_turnaround": 17.0,
              "mean_slowdown": (10 / 10 + 24 / 5) / 2,
              "mean_bounded_slowdown": (1 + 24 / 10) / 2, "reconfigurations": 0},
    # waits 23, turns 27 around, runs 4 (bounded: counts as 10)
    "moldable": {"jobs": 1, "mean_wait": 23.0, "mean_turnaround": 27.0,
                 "mean_slowdown": 27 / 4, "mean_bounded_slowdown": 27 / 10, "reconfigurations": 0},
    "malleable": {"jobs": 1, "mean_wait": 0.0, "mean_turnaround": 20.0, "mean_slowdown": 1.0,
                  "mean_bounded_slowdown": 1.0, "reconfigurations": 0},
}


def approx(by_class: dict) -> dict:
    """``pytest.approx`` of each class's figures (it does not nest)."""
    return {cls: pytest.approx(figures) for cls, figures in by_class.items()}


def test_the_simulator_gives_each_class_present_its_figures():
    result = Simulator(4, get_policy("fcfs")).run(MIXED)
    by_class = result.metrics["by_class"]
    assert list(by_class) == ["rigid", "moldable", "malleable"]  # no evolving job: no entry
    assert by_class == approx(MIXED_BY_CLASS)
    assert sum(c["jobs"] for c in by_class.values()) == result.metrics["jobs"]


def test_the_event_log_gives_the_same_figures_per_class():
    result = Simulator(4, get_policy("fcfs"), record_events=True).run(MIXED)
    assert compute_metrics(result.events)["by_class"] == approx(MIXED_BY_CLASS)


def test_by_class_from_a_live_event_log_counts_resizes_and_unknown_classes():
    by_class = compute_metrics(TWO_JOBS)["by_class"]
    # rigid "pi": submitted 1, started 6, ended 10; malleable "uts": 0, 2, 12, one shrink
    assert by_class == approx({
        "rigid": {"jobs": 1, "mean_wait": 5.0, "mean_turnaround": 9.0, "mean_slowdown": 9 / 4,
                  "mean_bounded_slowdown": 1.0, "reconfigurations": 0},
        "malleable": {"jobs": 1, "mean_wait": 2.0, "mean_turnaround": 12.0,
                      "mean_slowdown": 12 / 10, "mean_bounded_slowdown": 12 / 10,
                      "reconfigurations": 1}})
    old_log = [ev(0, "pool", nodes=["n1"]), ev(0, "submit", job=1, name="a"),
               ev(1, "start", job=1, nodes=["n1"]), ev(3, "end", job=1, state="done")]
    assert list(compute_metrics(old_log)["by_class"]) == ["unknown"]  # no class in the log


def test_summarize_by_class_leaves_out_reconfigurations_it_does_not_know():
    out = summarize_by_class([JobTimes(0, 1, 5, cls="evolving"), JobTimes(0, 0, 2, cls="evolving",
                                                                          reconfigs=3)])
    # turnarounds 5 and 2, run times 4 and 2 (both below tau: bounded slowdowns 1)
    assert out == {"evolving": {"jobs": 2, "mean_wait": 0.5, "mean_turnaround": 3.5,
                                "mean_slowdown": (5 / 4 + 1) / 2, "mean_bounded_slowdown": 1.0}}
    assert summarize_by_class([]) == {}


def test_as_rigid_keeps_everything_but_the_sizes_of_malleable_jobs():
    jobs = [*MIXED, SimJob(5, 3.0, "malleable", 2, 8, 4, 30.0, 40.0, rho=0.2, serial=0.1,
                           name="m"),
            SimJob(6, 4.0, "evolving", 1, 3, 3, 5.0, 5.0, profile=((2.0, 1), (3.0, 3)))]
    rigid = as_rigid(jobs)
    assert [j.id for j in rigid] == [j.id for j in jobs]
    for before, after in zip(jobs, rigid, strict=True):
        if before.cls == "malleable":
            assert (after.cls, after.min_nodes, after.max_nodes, after.preferred) == (
                "rigid", before.preferred, before.preferred, before.preferred)
            assert dataclasses.replace(after, cls=before.cls, min_nodes=before.min_nodes,
                                       max_nodes=before.max_nodes) == before
        else:
            assert after == before  # moldable and evolving jobs stay as they are


# One malleable job alone on 4 idle nodes (Amdahl, serial fraction 0.2; 100 s at its
# preferred 2 nodes): "malleable" starts it at its minimum, 1, and grows it to 4 at
# once; the grow costs alpha x 3 = 3 s, then it runs 100 x (0.2 + 0.8/4) / (0.2 + 0.8/2)
# = 200/3 s. Rigid at 2 nodes it takes its 100 s.
ALONE = [SimJob(1, 0.0, "malleable", 1, 4, 2, 100.0, 100.0, serial=0.2)]


def test_a_lone_malleable_job_grows_and_ends_sooner_than_rigid():
    result = run_with_incentive(4, lambda: get_policy("malleable"), ALONE,
                                reconfig=Reconfig(alpha=1.0), model="amdahl")
    turnaround = 3 + 200 / 3
    assert result.jobs[1]["end"] == pytest.approx(turnaround)
    assert result.metrics["by_class"]["malleable"]["reconfigurations"] == 1
    assert result.metrics["incentive"] == pytest.approx({
        "jobs": 1, "mean_turnaround": turnaround, "mean_turnaround_as_rigid": 100.0,
        "ratio": turnaround / 100, "change_pct": turnaround - 100,
        "mean_wait": 0.0, "mean_wait_as_rigid": 0.0})
    assert result.metrics["incentive"]["ratio"] < 1


def test_no_incentive_without_malleable_jobs():
    rigid_only = [j for j in MIXED if j.cls != "malleable"]
    result = run_with_incentive(4, lambda: get_policy("fcfs"), rigid_only)
    assert "incentive" not in result.metrics
    assert incentive(result, result, rigid_only) is None


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_simulate_and_compare_put_by_class_and_incentive_into_their_json(tmp_path, capsys):
    workload = ["--generate", "kit", "--jobs", "40", "--nodes", "32", "--malleable-share", "0.5"]
    out = _run_cli(["simulate", *workload, "--policy", "malleable", "--json",
                    str(tmp_path / "s.json")], capsys)
    metrics = json.loads((tmp_path / "s.json").read_text())
    assert set(metrics["by_class"]) == {"rigid", "malleable"}
    assert {"jobs", "mean_wait", "mean_turnaround", "mean_bounded_slowdown"} <= set(
        metrics["by_class"]["malleable"])
    assert metrics["incentive"]["jobs"] == metrics["by_class"]["malleable"]["jobs"] == 20
    assert "incentive: the malleable jobs against the same jobs submitted rigid" in out
    assert any(line.split()[:2] == ["malleable", "malleable"] for line in out.splitlines())

    _run_cli(["compare", *workload, "--policies", "easy,mebf", "--no-incentive", "--json",
              str(tmp_path / "c.json")], capsys)
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert [set(r["metrics"]["by_class"]) for r in runs] == [{"rigid", "malleable"}] * 2
    assert all("incentive" not in r["metrics"] for r in runs)


def test_report_gives_by_class(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in TWO_JOBS))
    metrics = json.loads(_run_cli(["report", str(log), "--json"], capsys))
    assert set(metrics["by_class"]) == {"rigid", "malleable"} and "incentive" not in metrics
    lines = [line.split() for line in _run_cli(["report", str(log)], capsys).splitlines()]
    assert ["max_overlap_violations", "0"] in lines
    assert ["malleable", "1", "2.000", "12.000", "1.200", "1.200", "1"] in lines
