"""Simulator speed: 5,000 jobs on 500 nodes under every policy (target: under 10 s each).

    python -m benchmarks.simspeed [--jobs 5000] [--nodes 500] [--share 0.5] [--json FILE]
    python -m benchmarks.simspeed --real-traces [--traces DIR] [--trace-sizes 10000,100000,0]
        [--trace-policies fcfs,easy,...] [--traces-json FILE] [--skip-synthetic]

The workload is ``apgas_scheduler.sim.workload.kit_like`` (seeded), half of its jobs
malleable (min = pref/2, max = 5 pref, rho in 0.0-0.3) with a
reconfiguration cost (which MEBF's feasibility test also uses); the MEBF
family runs with each expand policy (Handoff, the default, then Spare and
Intensive for basic MEBF); the evolving policies get ``uniform_evolving`` jobs
of the same count, the list scheduler under each of the evolving study's
variants (noX, 2X, 2X+c, infX, infX+c). Prints a table of wall seconds per
policy with the main metrics, and writes JSON. Nothing is asserted. Under a
minute on 2 cores (26 s of simulation in the recorded run).

With ``--real-traces``, then the four real traces of the Parallel Workloads
Archive (``REAL_TRACES``, read from ``--traces``, by default ``../shared/traces``
beside the checkout; skipped if absent) as they are, rigid, on the machine the
archive suggests, under every live policy, on their first 10,000 and 100,000
jobs and whole (``--trace-sizes``, 0 = whole): jobs simulated per second, and
the growth of the cost per job from the smallest size to the whole trace (1.0:
linear). The whole traces take 2-30 s each per policy: about a quarter of an
hour in all (732 s of simulation in the run of ``docs/results/simspeed_traces.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from apgas_scheduler.policies import get_policy, policy_names
from apgas_scheduler.policies.mebf import MEBF_POLICIES
from apgas_scheduler.sim import swf
from apgas_scheduler.sim import workload as wl
from apgas_scheduler.sim.listsched import PAPER_VARIANTS, schedule_evolving, schedule_rigid_baseline
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from benchmarks._harness import Column, Run, Table, harness, show


def variants() -> list[tuple[str, Any]]:
    """(label, run) for every policy and variant; ``run(jobs, evolving, nodes)`` -> metrics."""
    cost = Reconfig(alpha=1.0, beta=10.0, b=0.5)

    def live(name: str, **options: Any) -> Any:
        if name in MEBF_POLICIES:
            options["reconfig_cost"] = cost
        return lambda jobs, _, nodes: Simulator(
            nodes, get_policy(name, resize_interval=300, **options), reconfig=cost).run(jobs).metrics

    def listed(**options: Any) -> Any:
        return lambda _, ev, nodes: schedule_evolving(ev, nodes, **options).metrics(ev, nodes)

    out: list[tuple[str, Any]] = []
    for name in policy_names():
        if name == "evolving":  # the live evolving EASY: plain EASY on jobs that never ask
            continue
        out.append((name, live(name)))
        if name == "mebf":
            out += [(f"mebf {e}", live(name, expand=e)) for e in ("spare", "intensive")]
    out += [(f"evolving {v}", listed(**opts)) for v, opts in PAPER_VARIANTS.items()]
    out.append(("evolving-rigid", lambda _, ev, nodes: schedule_rigid_baseline(ev, nodes).metrics(ev, nodes)))
    return out


REAL_TRACES: dict[str, tuple[str, int]] = {
    "KTH-SP2": ("KTH-SP2-1996-2.1-cln.swf.gz", 1),
    "HPC2N": ("HPC2N-2002-2.1-cln.swf.gz", 2),
    "SDSC-BLUE": ("SDSC-BLUE-2000-4.2-cln.swf.gz", 8),
    "LLNL-Thunder": ("LLNL-Thunder-2007-1.1-cln.swf.gz", 4),
}
"""name: (file, processors per node as the traces' README suggests); the nodes
come from the header (``MaxProcs`` / processors per node)."""

TRACES_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces"


def load_trace(directory: Path, name: str, max_jobs: int | None = None) -> tuple[list[Any], int]:
    """A real trace's jobs (rigid) and the nodes of its machine."""
    file, ppn = REAL_TRACES[name]
    path = directory / file
    nodes, _ = swf.trace_cluster(swf.swf_header(path), ppn)
    return wl.read_swf(path, procs_per_node=ppn, max_jobs=max_jobs), int(nodes or 1)


SYNTHETIC = Table([Column("policy", 20, left=True), Column("seconds", 9, ".2f"), Column("makespan h", 12, ".1f"),
                   Column("utilization", 13, ".3f"), Column("turnaround h", 14, ".2f"), Column("resizes", 9)])


def trace_speed(directory: Path, sizes: list[int], policies: list[str]) -> list[dict[str, Any]]:
    """Seconds and jobs per second of every policy on every trace and size."""
    rows = []
    table = Table([Column("trace", 13, left=True), Column("policy", 14, left=True),
                   *(Column("whole" if n == 0 else str(n), 18) for n in sizes), Column("growth", 8, ".2f"),
                   Column("   (jobs/s at each size; growth: s/job whole over s/job first)", 0, left=True)])
    show("\n" + table.header())
    for name in REAL_TRACES:
        whole, nodes = load_trace(directory, name)
        for policy in policies:
            cells, runs = [], []
            for size in sizes:
                if size and size >= len(whole) and size != sizes[0]:
                    cells.append("-")
                    continue
                jobs = whole[:size] if size else whole
                started = time.perf_counter()
                metrics = Simulator(nodes, get_policy(policy)).run(jobs).metrics
                seconds = time.perf_counter() - started
                runs.append({"jobs": len(jobs), "seconds": seconds, "jobs_per_second": len(jobs) / seconds,
                             "mean_wait": metrics["mean_wait"], "utilization": metrics["utilization"]})
                cells.append(f"{len(jobs) / seconds:>10.0f} ({seconds:5.1f}s)")
            growth = (runs[-1]["seconds"] / runs[-1]["jobs"]) / (runs[0]["seconds"] / runs[0]["jobs"])
            rows.append({"trace": name, "nodes": nodes, "policy": policy, "runs": runs, "growth": growth})
            show(table.line([name, policy, *cells, growth]))
    return rows


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--json", type=Path, default=Path("bench-results/simspeed.json"))
    parser.add_argument("--real-traces", action="store_true",
                        help="also time the four real traces, whole (slow: about 15 minutes)")
    parser.add_argument("--traces", type=Path, default=TRACES_DIR, help="the real traces' directory")
    parser.add_argument("--trace-sizes", default="10000,100000,0", help="jobs per run (0: whole trace)")
    parser.add_argument("--trace-policies", default=",".join(policy_names()))
    parser.add_argument("--traces-json", type=Path, default=Path("bench-results/simspeed_traces.json"))
    parser.add_argument("--skip-synthetic", action="store_true", help="with --real-traces: only those")


def check(args: argparse.Namespace) -> str | None:
    if args.skip_synthetic and not args.real_traces:
        return "--skip-synthetic leaves nothing to run without --real-traces"
    return None


@harness("benchmarks.simspeed", __doc__, Path("bench-results/simspeed.json"), repeats=False,
         options=options, check=check, loggers=())
def main(run: Run) -> None:
    """The synthetic runs are the report (``--json``); the real traces' go to ``--traces-json``."""
    ns = run.args
    synthetic_report = None if ns.skip_synthetic else synthetic(ns)
    if synthetic_report is None:
        run.path = None
    else:
        run.report.update(synthetic_report)
    if not ns.real_traces:
        return
    if not ns.traces.is_dir():
        show(f"\nno real traces: {ns.traces} is not a directory (skipped)")
        return
    rows = trace_speed(ns.traces, [int(n) for n in ns.trace_sizes.split(",")],
                       [p for p in ns.trace_policies.split(",") if p])
    run.write(ns.traces_json, {"rows": rows})


def synthetic(ns: argparse.Namespace) -> dict[str, Any]:
    """Every policy on one synthetic workload: seconds and figures, printed as they come."""
    jobs = wl.make_malleable(wl.kit_like(1, ns.jobs, ns.nodes), ns.share, 1, total_nodes=ns.nodes,
                             rho=(0.0, 0.3))
    evolving = wl.uniform_evolving(1, ns.jobs, ns.nodes, spread=ns.jobs * 60.0)
    rows = []
    show(SYNTHETIC.header())
    for name, run in variants():
        started = time.perf_counter()
        metrics = run(jobs, evolving, ns.nodes)
        seconds = time.perf_counter() - started
        rows.append({"policy": name, "seconds": seconds, "metrics": metrics})
        show(SYNTHETIC.line([name, seconds, metrics["makespan"] / 3600, metrics["utilization"],
                             metrics["mean_turnaround"] / 3600, metrics.get("reconfigurations", 0)]))
    return {"jobs": ns.jobs, "nodes": ns.nodes, "share": ns.share, "runs": rows}


if __name__ == "__main__":
    sys.exit(main())
