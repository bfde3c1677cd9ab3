"""The simulation driver of ``simulate`` and ``compare`` (``apgas_scheduler.sim.compare``),
in process: option parsing and checks, the cluster a trace or a generator gives,
the workload built, the evolving list scheduler's timeline, and the outputs (tables,
JSON, plot)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from apgas_scheduler.__main__ import build_parser
from apgas_scheduler.sim import compare as cmp
from apgas_scheduler.sim.workload import uniform_evolving

DATA = Path(__file__).resolve().parent / "data"
TINY = str(DATA / "tiny.swf")  # MaxNodes 4, MaxProcs 16; 7 records, 5 kept


def options(*argv: str) -> argparse.Namespace:
    """The namespace ``compare`` gets for these arguments (every default filled in)."""
    return build_parser().parse_args(["compare", "--policies", "easy", *argv])


# -- option values ----------------------------------------------------------------------------

def test_serial_fraction_accepts_zero_to_below_one_and_names_a_bad_value():
    assert cmp._serial_fraction("0") == 0.0 and cmp._serial_fraction("0.25") == 0.25
    with pytest.raises(argparse.ArgumentTypeError, match=r"not a number: 'half'"):
        cmp._serial_fraction("half")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^1 is not in \[0, 1\)"):
        cmp._serial_fraction("1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^-0.1 is not in \[0, 1\)"):
        cmp._serial_fraction("-0.1")


def test_expand_limit_is_a_number_of_at_least_one_or_unbounded():
    for text in ("unbounded", " INF ", "none"):
        assert cmp._expand_limit(text) == math.inf
    assert cmp._expand_limit("1") == 1.0 and cmp._expand_limit("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match="'lots' is neither a number nor 'unbounded'"):
        cmp._expand_limit("lots")
    for bad in ("0.5", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{bad} must be at least 1"):
            cmp._expand_limit(bad)


def test_check_options_names_the_option_no_chosen_policy_uses():
    cmp.check_options(["mebf"], options("--generate", "kit", "--expand-policy", "spare"))
    cmp.check_options(["evolving"], options("--generate", "evolving", "--expand-limit", "2",
                                            "--compact"))
    cases = [
        (["easy", "fcfs"], ("--expand-policy", "spare"), "--expand-policy spare applies only to the mebf"),
        (["mebf"], ("--expand-limit", "3"), "--expand-limit applies only to the evolving policy"),
        (["evolving-rigid"], ("--compact",), "--compact applies only to the evolving policy"),
        (["easy"], ("--serial-fraction", "0.2"), "--serial-fraction 0.2 applies only to --model amdahl"),
    ]
    for policies, extra, message in cases:
        with pytest.raises(ValueError, match=message):
            cmp.check_options(policies, options("--generate", "kit", *extra))


def test_check_workload_names_a_job_without_a_profile_and_its_source():
    trace = options("--trace", TINY)
    jobs = cmp.build_workload(trace)
    cmp.check_workload(jobs, ["easy"], trace)  # only the evolving policies need profiles
    with pytest.raises(ValueError, match=rf"^evolving, evolving-rigid: .* job 1 from the trace {TINY} has none"):
        cmp.check_workload(jobs, ["easy", "evolving", "evolving-rigid"], trace)
    kit = options("--generate", "kit", "--jobs", "3", "--nodes", "8")
    with pytest.raises(ValueError, match="from --generate kit has none"):
        cmp.check_workload(cmp.build_workload(kit), ["evolving"], kit)
    evolving = options("--generate", "evolving", "--jobs", "3", "--nodes", "8")
    cmp.check_workload(cmp.build_workload(evolving), ["evolving"], evolving)


# -- the cluster and the workload ---------------------------------------------------------------

def test_a_generated_workload_needs_nodes():
    with pytest.raises(ValueError, match="--generate kit needs --nodes"):
        cmp.cluster_of(options("--generate", "kit"))
    ns = options("--generate", "apgas", "--nodes", "6")
    cmp.cluster_of(ns)
    assert (ns.nodes, ns.procs_per_node) == (6, 1)


def test_a_trace_sizes_the_cluster_from_its_header_unless_nodes_are_given():
    ns = options("--trace", TINY)
    cmp.cluster_of(ns)
    assert (ns.nodes, ns.procs_per_node) == (4, 4)  # 16 processors on 4 nodes
    ns = options("--trace", TINY, "--procs-per-node", "8")
    cmp.cluster_of(ns)
    assert (ns.nodes, ns.procs_per_node) == (2, 8)
    ns = options("--trace", TINY, "--nodes", "10")
    cmp.cluster_of(ns)
    assert (ns.nodes, ns.procs_per_node) == (10, 1)


def test_a_trace_without_a_machine_size_asks_for_nodes(tmp_path):
    bare = tmp_path / "bare.swf"
    bare.write_text("; Computer: nowhere\n1 0 0 60 2 -1 -1 2 60 -1 1 1 1 1 1 1 -1 -1\n")
    with pytest.raises(ValueError, match=f"^{bare}: the header has no MaxNodes or MaxProcs; give --nodes"):
        cmp.cluster_of(options("--trace", str(bare)))
    ns = options("--trace", str(bare), "--nodes", "2")
    assert [(j.id, j.min_nodes) for j in cmp.build_workload(ns)] == [(1, 2)]


def test_a_trace_workload_counts_its_skipped_records():
    ns = options("--trace", TINY, "--jobs", "4")
    jobs = cmp.build_workload(ns)
    assert [j.id for j in jobs] == [1, 2, 4, 5]  # 3 has no run time
    assert ns.swf_stats["skipped"] == 1 and ns.nodes == 4


def test_generated_workloads_follow_their_options():
    ns = options("--generate", "apgas", "--nodes", "16", "--seed", "4")
    assert len(cmp.build_workload(ns)) == 25  # the study's batch size by default
    ns = options("--generate", "kit", "--jobs", "30", "--nodes", "16", "--malleable-share", "1",
                 "--model", "amdahl")
    jobs = cmp.build_workload(ns)
    assert len(jobs) == 30 and {j.cls for j in jobs} == {"malleable"}
    assert {j.serial for j in jobs} == {cmp.DEFAULT_SERIAL_FRACTION}
    ns = options("--generate", "evolving", "--jobs", "5", "--nodes", "12", "--model", "amdahl",
                 "--serial-fraction", "0.3")
    assert {j.serial for j in cmp.build_workload(ns)} == {0.3}
    late = cmp.build_workload(options("--generate", "kit", "--jobs", "10", "--nodes", "16",
                                      "--arrival-scale", "2"))
    early = cmp.build_workload(options("--generate", "kit", "--jobs", "10", "--nodes", "16"))
    assert [j.submit for j in late] == pytest.approx([2 * j.submit for j in early])


# -- the evolving list scheduler ----------------------------------------------------------------

def test_steps_turn_usage_pieces_into_busy_nodes_over_time():
    pieces = [(0.0, 10.0, 1, 2), (5.0, 15.0, 2, 3), (10.0, 12.0, 3, 1)]
    assert cmp._steps(pieces) == [(0.0, 2), (5.0, 5), (10.0, 4), (12.0, 3), (15.0, 0)]
    assert cmp._steps([]) == []


def test_an_evolving_run_keeps_within_the_cluster_and_ends_idle():
    ns = options("--generate", "evolving", "--nodes", "12", "--expand-limit", "unbounded",
                 "--compact")
    ns.policies = "evolving,evolving-rigid"
    jobs = uniform_evolving(5, 6, 12)
    runs = cmp.compare(jobs, ["evolving", "evolving-rigid"], ns)
    assert [r["policy"] for r in runs] == ["evolving infX+c", "evolving-rigid"]
    for r in runs:
        busy = [b for _, b in r["timeline"]]
        assert busy[-1] == 0 and max(busy) <= 12 and min(busy) >= 0
        times = [t for t, _ in r["timeline"]]
        assert times == sorted(times) and times[-1] == pytest.approx(r["metrics"]["makespan"])
    plain = cmp.simulate(jobs, "evolving", options("--generate", "evolving", "--nodes", "12"))
    assert plain["policy"] == "evolving" and plain["metrics"]["waste"] == 0.0


# -- outputs ------------------------------------------------------------------------------------

def test_tables_without_classes_or_incentive_are_empty():
    runs = [{"policy": "easy", "metrics": {"makespan": 10.0, "jobs": 2}, "seconds": 0.5}]
    assert cmp.class_table([("easy", {}), ("fcfs", {"by_class": {}})]) == ""
    assert cmp.incentive_table(runs) == ""
    lines = cmp.table(runs).splitlines()
    assert lines[0].split()[:3] == ["policy", "makespan", "utilization"]
    assert lines[1].split() == ["easy", "10.000", "-", "-", "-", "-", "-", "-", "0.50"]


def test_write_json_keeps_the_parameters_and_drops_timelines(tmp_path):
    ns = options("--generate", "evolving", "--nodes", "12", "--expand-limit", "unbounded")
    ns.func, ns.swf_stats = print, {"jobs": 1}
    runs = [{"policy": "evolving infX", "metrics": {"makespan": 3.0}, "seconds": 0.1,
             "timeline": [(0.0, 2), (3.0, 0)]}]
    out = tmp_path / "deep" / "runs.json"
    cmp.write_json(out, runs, ns)
    written = json.loads(out.read_text())
    assert written["parameters"]["expand_limit"] == "unbounded"
    assert written["parameters"]["nodes"] == 12 and written["parameters"]["generate"] == "evolving"
    assert "func" not in written["parameters"] and "swf_stats" not in written["parameters"]
    assert written["runs"] == [{"policy": "evolving infX", "metrics": {"makespan": 3.0}, "seconds": 0.1}]


def test_plot_writes_a_png(tmp_path):
    runs = [{"policy": "a", "metrics": {"mean_turnaround": 5.0, "mean_bounded_slowdown": None},
             "timeline": [(0.0, 2), (3600.0, 4), (7200.0, 0)]},
            {"policy": "b", "metrics": {"mean_turnaround": 7.0, "mean_bounded_slowdown": 1.5},
             "timeline": []}]
    out = tmp_path / "cmp.png"
    cmp.plot(out, runs, 4, title="two runs")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
