"""Simulator speed: 5,000 jobs on 500 nodes under every policy (target: under 10 s each).

    python -m benchmarks.simspeed [--jobs 5000] [--nodes 500] [--share 0.5] [--json FILE]

The workload is ``apgas_scheduler.workload.kit_like`` (seeded), half of its jobs
malleable (min = pref/2, max = 5 pref, rho in 0.0-0.3) with a
reconfiguration cost (which MEBF's feasibility test also uses); the MEBF
family runs with each expand policy (Handoff, the default, then Spare and
Intensive for basic MEBF); the evolving policies get ``uniform_evolving`` jobs
of the same count, the list scheduler under each of the evolving study's
variants (noX, 2X, 2X+c, infX, infX+c). Prints a table of wall seconds per
policy with the main metrics, and writes JSON. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info
from apgas_scheduler import workload as wl
from apgas_scheduler.listsched import PAPER_VARIANTS, schedule_evolving, schedule_rigid_baseline
from apgas_scheduler.mebf import MEBF_POLICIES
from apgas_scheduler.policies import get_policy, policy_names
from apgas_scheduler.simulator import Reconfig, Simulator


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simspeed", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--share", type=float, default=0.5)
    p.add_argument("--json", type=Path, default=Path("bench-results/simspeed.json"))
    ns = p.parse_args(argv)
    jobs = wl.make_malleable(wl.kit_like(1, ns.jobs, ns.nodes), ns.share, 1, total_nodes=ns.nodes,
                             rho=(0.0, 0.3))
    evolving = wl.uniform_evolving(1, ns.jobs, ns.nodes, spread=ns.jobs * 60.0)
    rows = []
    print(f"{'policy':<20}{'seconds':>9}{'makespan h':>12}{'utilization':>13}{'turnaround h':>14}{'resizes':>9}")
    for name, run in variants():
        started = time.perf_counter()
        metrics = run(jobs, evolving, ns.nodes)
        seconds = time.perf_counter() - started
        rows.append({"policy": name, "seconds": seconds, "metrics": metrics})
        print(f"{name:<20}{seconds:>9.2f}{metrics['makespan'] / 3600:>12.1f}"
              f"{metrics['utilization']:>13.3f}{metrics['mean_turnaround'] / 3600:>14.2f}"
              f"{metrics.get('reconfigurations', 0):>9}", flush=True)
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps({"machine": machine_info(), "jobs": ns.jobs, "nodes": ns.nodes,
                                   "share": ns.share, "runs": rows}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
