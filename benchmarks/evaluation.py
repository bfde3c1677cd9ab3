"""The simulator against the published studies: three comparisons, one table each.

    python -m benchmarks.evaluation [--quick] [--json FILE] [--plot FILE]
    python -m benchmarks.evaluation --real-traces [--trace-jobs 10000] [--traces DIR] [--out DIR]

1. MEBF against EASY backfilling (the MEBF study): a KIT-like workload
   (``apgas_scheduler.sim.workload.kit_like``; the real KIT trace is not here) of 1,000
   and 5,000 jobs on 512 nodes, arrivals scaled by 0.75 ("intensive"), every
   job malleable (min = pref/2, max = 5 pref), medium scalability (rho in
   0.1-0.2), reconfiguration cost alpha = 1 s per node changed, beta = 10 s,
   b = 0.5 s per process (our constants), and again with alpha = beta = 0.05,
   b = 0 (the top of the study's range [0.005, 0.05], read as seconds). MEBF's
   feasibility test uses the same cost model the simulator charges.
   Published: 33-49% shorter mean turnaround.
2. minAgree with 100% malleable jobs against the best rigid run (the
   malleable-APGAS study): its job batches (``apgas_job_batch``: 25 jobs on 32
   nodes, 10 seeds), 0 and 100% malleable, FCFS, Backfilling, EASY and
   minAgree, a reconfiguration cost of 0.5 s per process (our grows and
   shrinks take 0.01-0.1 s, the study's a few seconds). Published: makespan
   -13.09%, utilization +19.86%, turnaround -3.61% against FCFS at 0%.
3. Evolving jobs (the evolving-applications study): its uniform synthetic
   cases (``uniform_evolving``, 15-20 jobs on 75 nodes, 20 seeds) under the
   evolving-aware list scheduler without expansion (noX), with expand limit
   2 and unbounded, with compacting, and the rigid baseline that reserves each
   job's maximum for its whole run. Published: less waste and earlier
   completion than the baseline.

4. (``--real-traces``, alone) the four real traces of the Parallel Workloads
   Archive (``benchmarks.simspeed.REAL_TRACES``, on the machines the archive
   suggests): EASY against MEBF (handoff) and minAgree with 20% and 100% of
   the jobs malleable (``make_malleable``: min = pref/2, max = 5 pref, medium
   scalability, seed 1), reconfiguration cost alpha = 1 s, beta = 10 s, b =
   0.5 s, resize interval 300 s, on the first ``--trace-jobs`` jobs of each
   (0: whole). Writes ``evaluation_traces.{json,md}`` into ``--out`` (``bench-results``).

Prints the tables, writes JSON and a PNG (``--json``, ``--plot``: by default in
``bench-results/``; the committed figures are in ``docs/results/``); nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.mebf import MEBF
from apgas_scheduler.sim import workload as wl
from apgas_scheduler.sim.listsched import PAPER_VARIANTS, schedule_evolving, schedule_rigid_baseline
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from benchmarks._harness import Run, harness


def _pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old


COSTS = {"ours": Reconfig(alpha=1.0, beta=10.0, b=0.5),
         "study range": Reconfig(alpha=0.05, beta=0.05, b=0.0)}
"""Reconfiguration costs of comparison 1: our constants, and the top of the
MEBF study's range for alpha and beta ([0.005, 0.05]; it gives no b)."""


def mebf_vs_easy(sizes: list[int], seeds: int, cost: Reconfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        rows: dict[str, list[float]] = {}
        for seed in range(seeds):
            jobs = wl.kit_like(seed, size, 512)
            jobs = wl.make_malleable(jobs, 1.0, seed, total_nodes=512, rho=wl.RHO_CLASSES["medium"])
            jobs = wl.scale_arrivals(jobs, wl.MEBF_INTENSIVE)
            policies = {"EASY": get_policy("easy", resize_interval=300)}
            for expand in ("handoff", "spare", "intensive"):
                policies[f"MEBF {expand}"] = MEBF(expand=expand, resize_interval=300, reconfig_cost=cost)
            for name, policy in policies.items():
                m = Simulator(512, policy, reconfig=cost).run(jobs).metrics
                rows.setdefault(name, []).append(m["mean_turnaround"])
        base = statistics.mean(rows["EASY"])
        out[str(size)] = {name: {"mean_turnaround": statistics.mean(v),
                                 "vs_easy_pct": _pct(statistics.mean(v), base)}
                          for name, v in rows.items()}
    return out


def minagree_vs_rigid(seeds: int) -> dict[str, Any]:
    cost = Reconfig(b=0.5)
    runs: dict[str, dict[str, list[float]]] = {}
    for share in (0.0, 1.0):
        for name in ("fcfs", "backfill", "easy", "malleable"):
            key = f"{name} {int(share * 100)}%"
            for seed in range(seeds):
                jobs = wl.apgas_job_batch(seed, share=share)
                m = Simulator(32, get_policy(name, resize_interval=10), reconfig=cost,
                              interval=5.0).run(jobs).metrics
                for metric in ("makespan", "utilization", "mean_turnaround"):
                    runs.setdefault(key, {}).setdefault(metric, []).append(m[metric])
    means = {k: {m: statistics.mean(v) for m, v in d.items()} for k, d in runs.items()}
    rigid = {k: v for k, v in means.items() if k.endswith(" 0%") and not k.startswith("backfill")}
    best = min(rigid, key=lambda k: rigid[k]["makespan"])  # the study left Backfilling out (unfair)
    ours = means["malleable 100%"]
    return {"means": means, "best_rigid": best, "minagree_100_vs_best_rigid_pct": {
        m: _pct(ours[m], means[best][m]) for m in ("makespan", "utilization", "mean_turnaround")},
        "published_pct": {"makespan": -13.09, "utilization": 19.86, "mean_turnaround": -3.61}}


def evolving_vs_rigid(seeds: int) -> dict[str, Any]:
    rows: dict[str, dict[str, list[float]]] = {}
    for seed in range(seeds):
        jobs = wl.uniform_evolving(seed, None, 75)
        schedules = {name: schedule_evolving(jobs, 75, **opts) for name, opts in PAPER_VARIANTS.items()}
        schedules["rigid baseline"] = schedule_rigid_baseline(jobs, 75)
        for name, s in schedules.items():
            m = s.metrics(jobs, 75)
            for metric in ("waste", "makespan", "mean_completion", "utilization"):
                rows.setdefault(name, {}).setdefault(metric, []).append(m[metric])
    return {name: {m: statistics.mean(v) for m, v in d.items()} for name, d in rows.items()}


TRACE_POLICIES = ("easy", "mebf", "malleable")
TRACE_SHARES = (0.2, 1.0)
TRACE_METRICS = ("mean_turnaround", "mean_wait", "utilization", "makespan")


def real_traces(directory: Path, max_jobs: int | None) -> dict[str, Any]:
    """Comparison 4: {trace: {"nodes", "jobs", "runs": {"policy share%": metrics}}}."""
    from benchmarks.simspeed import REAL_TRACES, load_trace

    cost = COSTS["ours"]
    out: dict[str, Any] = {}
    for name in REAL_TRACES:
        rigid, nodes = load_trace(directory, name, max_jobs)
        runs: dict[str, Any] = {}
        for share in TRACE_SHARES:
            jobs = wl.make_malleable(rigid, share, 1, total_nodes=nodes,
                                     rho=wl.RHO_CLASSES["medium"])
            for policy in TRACE_POLICIES:
                options: dict[str, Any] = {"reconfig_cost": cost} if policy == "mebf" else {}
                m = Simulator(nodes, get_policy(policy, resize_interval=300, **options),
                              reconfig=cost).run(jobs).metrics
                runs[f"{policy} {int(share * 100)}%"] = {k: m[k] for k in (
                    *TRACE_METRICS, "reconfigurations", "jobs")}
                print(f"   {name:<13} {policy:<10} {int(share * 100):>3}%  " + "  ".join(
                    f"{k} {m[k]:.4g}" for k in TRACE_METRICS), flush=True)
        out[name] = {"nodes": nodes, "jobs": len(rigid), "runs": runs}
    return out


def traces_markdown(report: dict[str, Any], command: str) -> str:
    lines = [f"Produced by `{command}`.", "",
             "| trace (nodes, jobs) | policy | malleable | mean turnaround h | mean wait h | "
             "utilization | makespan d | resizes | turnaround vs EASY |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, t in report.items():
        for key, m in t["runs"].items():
            policy, share = key.split()
            base = t["runs"][f"easy {share}"]["mean_turnaround"]
            lines.append(f"| {name} ({t['nodes']}, {t['jobs']:,}) | {policy} | {share} | "
                         f"{m['mean_turnaround'] / 3600:.2f} | {m['mean_wait'] / 3600:.2f} | "
                         f"{m['utilization']:.3f} | {m['makespan'] / 86400:.1f} | "
                         f"{m['reconfigurations']} | {_pct(m['mean_turnaround'], base):+.1f}% |")
    return "\n".join(lines) + "\n"


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer seeds, 1,000 jobs only")
    parser.add_argument("--json", type=Path, default=Path("bench-results/evaluation.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench-results/evaluation.png"))
    parser.add_argument("--real-traces", action="store_true", help="only comparison 4 (real traces)")
    parser.add_argument("--trace-jobs", type=int, default=10000, help="jobs per trace (0: whole)")
    parser.add_argument("--traces", type=Path, default=None, help="the real traces' directory")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="where comparison 4 writes evaluation_traces.{json,md} (default: %(default)s)")
    parser.add_argument("--dmr", action="store_true", help="only DMR's workload study, simulated at "
                        "50-400 jobs on 64 nodes (benchmarks._eval_dmr): evaluation_dmr.json into --out")
    parser.add_argument("--dmr-live", action="store_true", help="only DMR's workload study in miniature, "
                        "live on this machine: evaluation_dmr_live.json into --out")
    parser.add_argument("--policies", action="store_true", help="only our policy against EASY, MEBF "
                        "and minAgree on the real traces (benchmarks._eval_policies): "
                        "evaluation_policies.{json,md} into --out")
    parser.add_argument("--published", action="store_true", help="only our policies against every "
                        "published one (the Kassel group's nine included) on the real traces, the grid "
                        "and the variations of benchmarks._eval_published: evaluation_published."
                        "{json,md,png} into --out (about 25 minutes on 2 cores)")
    parser.add_argument("--frontier", action="store_true", help="only lending at several loan "
                        "thresholds beside minAgree and min-common-pool, on the grid's seed-1 cases: "
                        "evaluation_frontier.{json,md} into --out (about 5 minutes)")
    parser.add_argument("--reuse", type=Path, default=None, metavar="FILE",
                        help="with --published: take from FILE (an earlier evaluation_published.json) "
                             "the runs it holds and simulate only the others (a policy added since); "
                             "the simulations are deterministic, so the tables are the same")
    parser.add_argument("--workers", type=int, default=2,
                        help="processes that run --published's and --frontier's simulations "
                             "(default: %(default)s)")
    parser.add_argument("--fairness", action="store_true", help="only each job class's figures and "
                        "the incentive to be malleable on the real traces: evaluation_fairness.{json,md} "
                        "into --out")


def _alone(ns: argparse.Namespace) -> bool:
    """Whether a study was asked for alone (it writes its own files into --out)."""
    return bool(ns.real_traces or ns.policies or ns.fairness or ns.dmr or ns.dmr_live
                or ns.published or ns.frontier)


@harness("benchmarks.evaluation", __doc__, Path("bench-results/evaluation.json"),
         "fewer seeds, 1,000 jobs only", repeats=False, options=options, loggers=(),
         needs=lambda ns: [] if _alone(ns) else ["matplotlib"])
def main(run: Run) -> int:
    """Comparisons 1-3 are the report (``--json``); each study asked for alone writes its own
    files into ``--out``."""
    ns = run.args
    if _alone(ns):
        run.path = None
    if ns.published or ns.frontier:  # issue 45: benchmarks/_eval_published.py
        from benchmarks import _eval_published

        if ns.workers < 1:
            print(f"--workers must be at least 1, got {ns.workers}", file=sys.stderr)
            return 2
        if ns.frontier:
            return _eval_published.main_frontier(run, ns.out, ns.traces, ns.trace_jobs or None,
                                                  ns.workers)
        return _eval_published.main(run, ns.out, ns.traces, ns.trace_jobs or None, ns.workers,
                                    reuse=ns.reuse)
    if ns.policies or ns.fairness:  # issue 33, questions 1 and 2: benchmarks/_eval_policies.py
        from benchmarks import _eval_policies

        return _eval_policies.main(run, ns.out, ns.traces, ns.trace_jobs or None,
                                   policies=ns.policies, fairness=ns.fairness)
    if ns.dmr or ns.dmr_live:  # DMR's study (issue 33): benchmarks/_eval_dmr.py
        from benchmarks import _eval_dmr

        return max(_eval_dmr.main_sim(run, ns.out) if ns.dmr else 0,
                   _eval_dmr.main_live(run, ns.out) if ns.dmr_live else 0)
    if ns.real_traces:
        from benchmarks.simspeed import TRACES_DIR

        print(f"4. real traces, first {ns.trace_jobs or 'all'} jobs, EASY vs MEBF vs minAgree")
        traces = real_traces(ns.traces or TRACES_DIR, ns.trace_jobs or None)
        ns.out.mkdir(parents=True, exist_ok=True)
        run.write(ns.out / "evaluation_traces.json", {"trace_jobs": ns.trace_jobs, "traces": traces})
        command = "python -m benchmarks.evaluation --real-traces" + (
            f" --trace-jobs {ns.trace_jobs}" if ns.trace_jobs != 10000 else "")
        (ns.out / "evaluation_traces.md").write_text(traces_markdown(traces, command))
        return 0
    sizes, seeds = ([1000] if ns.quick else [1000, 5000]), (1 if ns.quick else 3)
    costs = {name: mebf_vs_easy(sizes, seeds, cost) for name, cost in COSTS.items()}
    mebf = costs["ours"]
    print("1. MEBF vs EASY, KIT-like intensive workload, 512 nodes, 100% malleable, medium scalability")
    for cost_name, results in costs.items():
        c = COSTS[cost_name]
        print(f"   reconfiguration cost {cost_name}: alpha {c.alpha}, beta {c.beta}, b {c.b}")
        for size, rows in results.items():
            for name, r in rows.items():
                print(f"   {size:>5} jobs  {name:<15} turnaround {r['mean_turnaround'] / 3600:8.2f} h"
                      f"  {r['vs_easy_pct']:+6.1f}% vs EASY   (published: -33% to -49%)")
    apgas = minagree_vs_rigid(3 if ns.quick else 10)
    print(f"2. malleable-APGAS batches, 32 nodes (best rigid run: {apgas['best_rigid']})")
    for k, v in apgas["means"].items():
        print(f"   {k:<16} makespan {v['makespan']:7.0f} s  utilization {v['utilization']:.3f}"
              f"  turnaround {v['mean_turnaround']:6.0f} s")
    for m, v in apgas["minagree_100_vs_best_rigid_pct"].items():
        print(f"   minAgree 100% vs best rigid: {m:<16} {v:+6.2f}%  (published {apgas['published_pct'][m]:+.2f}%)")
    evolving = evolving_vs_rigid(5 if ns.quick else 20)
    print("3. evolving jobs, uniform cases, 75 nodes")
    for name, v in evolving.items():
        print(f"   {name:<15} waste {v['waste']:.3f}  makespan {v['makespan']:7.0f} s"
              f"  mean completion {v['mean_completion']:7.0f} s  utilization {v['utilization']:.3f}")
    run.report.update({"mebf_vs_easy": mebf, "mebf_vs_easy_study_cost_range": costs["study range"],
                       "minagree_vs_rigid": apgas, "evolving_vs_rigid": evolving})
    _plot(ns.plot, run.report)
    return 0


def _plot(path: Path, report: dict[str, Any]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 3, 1)
    for i, (size, rows) in enumerate(report["mebf_vs_easy"].items()):
        names = list(rows)
        ax.bar([j + 0.4 * i for j in range(len(names))], [rows[n]["mean_turnaround"] / 3600 for n in names],
               width=0.4, label=f"{size} jobs")
        ax.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=30, ha="right", fontsize=8)
    ax.set_title("KIT-like: mean turnaround (h)")
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 3, 2)
    means = report["minagree_vs_rigid"]["means"]
    ax.bar(range(len(means)), [v["makespan"] for v in means.values()], color="tab:green")
    ax.set_xticks(range(len(means)), list(means), rotation=40, ha="right", fontsize=8)
    ax.set_title("APGAS batches: makespan (s)")
    ax = fig.add_subplot(1, 3, 3)
    ev = report["evolving_vs_rigid"]
    ax.bar(range(len(ev)), [v["waste"] for v in ev.values()], color="tab:red")
    ax.set_xticks(range(len(ev)), list(ev), rotation=30, ha="right", fontsize=8)
    ax.set_title("evolving jobs: waste (share of reserved node-time)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
