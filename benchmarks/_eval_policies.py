"""Our policy (``thrifty``) against EASY, MEBF and minAgree on the four real traces,
and what each policy does to each kind of user (issue 33, questions 1 and 2).

    python -m benchmarks.evaluation --policies [--trace-jobs 10000] [--out DIR]
    python -m benchmarks.evaluation --fairness [--trace-jobs 10000] [--out DIR]

The setting of the issue: the first 10,000 jobs of each trace on the machine its
README suggests, 20% and 100% of them malleable (``make_malleable`` seed 1: min =
pref/2, max = 5 pref), Amdahl's law with serial fraction 0.05 for every job, resize
interval 300 s, and two reconfiguration costs: alpha = beta = 0.05 s (b = 0; the
MEBF study's range) and ours (alpha = 1 s, beta = 10 s, b = 0.5 s). MEBF and
thrifty are given the cost model the simulator charges.

Each policy also runs the workload with every malleable job submitted rigid
(:func:`apgas_scheduler.sim.incentive.as_rigid`; one run per policy and cost,
since that workload is the same at both shares): the malleable jobs' incentive
is their mean turnaround against that run's. Thrifty also runs without each of
its changes in turn (``ABLATION``). Both flags run the same simulations (about
110 runs, 2 minutes) and write ``evaluation_policies`` or
``evaluation_fairness`` ``.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apgas_scheduler.policies import get_policy
from apgas_scheduler.sim import workload as wl
from apgas_scheduler.sim.compare import COSTED
from apgas_scheduler.sim.incentive import as_rigid, incentive
from apgas_scheduler.sim.simulator import Reconfig, SimResult, Simulator
from benchmarks._harness import Run, markdown_head

__all__ = ["POLICIES", "COSTS", "SHARES", "trace_runs", "policies_markdown",
           "fairness_markdown", "main"]

POLICIES = ("easy", "mebf", "malleable", "thrifty")
NAMES = {"easy": "EASY", "mebf": "MEBF", "malleable": "minAgree", "thrifty": "thrifty (ours)"}
COSTS = {"study": Reconfig(alpha=0.05, beta=0.05, b=0.0),
         "ours": Reconfig(alpha=1.0, beta=10.0, b=0.5)}
SHARES = (0.2, 1.0)
SERIAL = 0.05
RESIZE_INTERVAL = 300.0
KEYS = ("jobs", "mean_turnaround", "mean_wait", "mean_bounded_slowdown", "utilization",
        "makespan", "reconfigurations")


ABLATION: dict[str, dict[str, Any]] = {
    "thrifty": {},
    "backfill in queue order": {"backfill": "queue"},
    "no start-wide": {"start_wide": False},
    "every grow (min_gain = gamma = 0)": {"min_gain": 0.0, "gamma": 0.0},
}
"""Thrifty without each of its changes to minAgree in turn (section 5's ablation)."""


def _simulate(nodes: int, policy: str, cost: Reconfig, jobs: list[Any],
              **extra: Any) -> SimResult:
    options: dict[str, Any] = {"reconfig_cost": cost} if policy in COSTED else {}
    return Simulator(nodes, get_policy(policy, resize_interval=RESIZE_INTERVAL, **options, **extra),
                     reconfig=cost, model="amdahl").run(jobs)


def trace_runs(directory: Path, max_jobs: int | None) -> dict[str, Any]:
    """{trace: {"nodes", "jobs", "runs": {"cost share% policy": metrics with by_class
    and incentive}}}."""
    from benchmarks.simspeed import REAL_TRACES, load_trace

    out: dict[str, Any] = {}
    for name in REAL_TRACES:
        rigid, nodes = load_trace(directory, name, max_jobs)
        runs: dict[str, Any] = {}
        for cost_name, cost in COSTS.items():
            as_rigid_runs: dict[str, SimResult] = {}
            for share in SHARES:
                jobs = wl.make_malleable(rigid, share, 1, total_nodes=nodes, serial=SERIAL)
                for policy in POLICIES:
                    result = _simulate(nodes, policy, cost, jobs)
                    if policy not in as_rigid_runs:
                        as_rigid_runs[policy] = _simulate(nodes, policy, cost, as_rigid(jobs))
                    m = result.metrics
                    runs[f"{cost_name} {_label(share)} {policy}"] = {
                        **{k: m[k] for k in KEYS}, "by_class": m["by_class"],
                        "incentive": incentive(result, as_rigid_runs[policy], jobs)}
                    print(f"   {name:<13} {cost_name:<5} {int(share * 100):>3}% {policy:<9} "
                          f"turnaround {m['mean_turnaround'] / 3600:6.3f} h  "
                          f"resizes {m['reconfigurations']:>6}", flush=True)
        ablation: dict[str, Any] = {}
        for share in SHARES:
            jobs = wl.make_malleable(rigid, share, 1, total_nodes=nodes, serial=SERIAL)
            for variant, extra in ABLATION.items():
                m = _simulate(nodes, "thrifty", COSTS["study"], jobs, **extra).metrics
                ablation[f"{_label(share)} {variant}"] = {k: m[k] for k in KEYS}
        out[name] = {"nodes": nodes, "jobs": len(rigid), "runs": runs, "ablation": ablation}
    return out


def _label(share: float) -> str:
    return f"{int(share * 100)}%"


def _cases(report: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(trace, its report, share label), in the tables' order."""
    for name, t in report.items():
        for share in SHARES:
            yield name, t, _label(share)


def _pct(new: float, old: float) -> str:
    return f"{100.0 * (new - old) / old:+.1f}%"


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.3f}"


def policies_markdown(report: dict[str, Any], command: str) -> str:
    """Question 1: mean turnaround and resizes of every policy, both costs."""
    figures = ("vs EASY", "vs minAgree", "resizes")
    lines = [f"Produced by `{command}`. Mean turnaround in hours; the best of each trace and share in bold.",
             "", *markdown_head("trace (nodes)", "malleable", "policy", "turnaround, alpha = beta = 0.05 s",
                                *figures, "turnaround, our costs", *figures, left=3)]
    for name, t, pc in _cases(report):
        best = {c: min(t["runs"][f"{c} {pc} {p}"]["mean_turnaround"] for p in POLICIES)
                for c in COSTS}
        for policy in POLICIES:
            cells = []
            for c in COSTS:
                m = t["runs"][f"{c} {pc} {policy}"]
                easy = t["runs"][f"{c} {pc} easy"]["mean_turnaround"]
                mina = t["runs"][f"{c} {pc} malleable"]["mean_turnaround"]
                turn = _h(m["mean_turnaround"])
                if m["mean_turnaround"] == best[c]:
                    turn = f"**{turn}**"
                cells += [turn, _pct(m["mean_turnaround"], easy),
                          _pct(m["mean_turnaround"], mina), f"{m['reconfigurations']:,}"]
            lines.append(f"| {name} ({t['nodes']}) | {pc} | {NAMES[policy]} | "
                         + " | ".join(cells) + " |")
    lines += ["", "Thrifty without each of its changes (alpha = beta = 0.05 s): mean turnaround "
              "in hours, against thrifty and against minAgree, and resizes.", "",
              *markdown_head("trace", "malleable", "variant", "turnaround", "vs thrifty", "vs minAgree",
                             "resizes", left=3)]
    for name, t, pc in _cases(report):
        ours = t["ablation"][f"{pc} thrifty"]["mean_turnaround"]
        mina = t["runs"][f"study {pc} malleable"]["mean_turnaround"]
        for variant in ABLATION:
            m = t["ablation"][f"{pc} {variant}"]
            lines.append(f"| {name} | {pc} | {variant} | {_h(m['mean_turnaround'])} | "
                         f"{_pct(m['mean_turnaround'], ours)} | "
                         f"{_pct(m['mean_turnaround'], mina)} | {m['reconfigurations']:,} |")
    return "\n".join(lines) + "\n"


def fairness_markdown(report: dict[str, Any], command: str, cost: str = "study") -> str:
    """Question 2: each class's mean turnaround, the rigid jobs against EASY's, the
    malleable jobs against themselves submitted rigid (the incentive)."""
    lines = [f"Produced by `{command}`; reconfiguration cost alpha = beta = 0.05 s (the "
             "JSON has our costs too). Mean turnaround in hours.", "",
             *markdown_head("trace", "malleable", "policy", "rigid jobs", "rigid vs EASY", "malleable jobs",
                            "the same jobs submitted rigid", "incentive", "malleable mean wait", "as rigid",
                            left=3)]
    for name, t, pc in _cases(report):
        easy_rigid = t["runs"][f"{cost} {pc} easy"]["by_class"].get("rigid")
        for policy in POLICIES:
            m = t["runs"][f"{cost} {pc} {policy}"]
            rigid = m["by_class"].get("rigid")
            inc = m["incentive"] or {}
            vs = (_pct(rigid["mean_turnaround"], easy_rigid["mean_turnaround"])
                  if rigid and easy_rigid else "-")
            lines.append(
                f"| {name} | {pc} | {NAMES[policy]} | "
                f"{_h(rigid['mean_turnaround']) if rigid else '-'} | {vs} | "
                f"{_h(inc.get('mean_turnaround'))} | {_h(inc.get('mean_turnaround_as_rigid'))} | "
                f"{'-' if inc.get('change_pct') is None else format(inc['change_pct'], '+.1f') + '%'} | "
                f"{_h(inc.get('mean_wait'))} | {_h(inc.get('mean_wait_as_rigid'))} |")
    return "\n".join(lines) + "\n"


def main(run: Run, out: Path, traces: Path | None, max_jobs: int | None, *, policies: bool,
         fairness: bool) -> int:
    """``--policies`` and ``--fairness`` of ``benchmarks.evaluation``: their JSON and Markdown into ``out``."""
    from benchmarks.simspeed import TRACES_DIR

    print(f"real traces, first {max_jobs or 'all'} jobs: EASY, MEBF, minAgree, thrifty "
          "(Amdahl, serial fraction 0.05)")
    report = trace_runs(traces or TRACES_DIR, max_jobs)
    out.mkdir(parents=True, exist_ok=True)
    tail = f" --trace-jobs {max_jobs or 0}" if max_jobs != 10000 else ""
    payload = {"trace_jobs": max_jobs or 0, "serial_fraction": SERIAL,
               "resize_interval": RESIZE_INTERVAL,
               "costs": {k: vars(c) for k, c in COSTS.items()}, "traces": report}
    for wanted, stem, render in ((policies, "evaluation_policies", policies_markdown),
                                 (fairness, "evaluation_fairness", fairness_markdown)):
        if wanted:
            command = f"python -m benchmarks.evaluation --{stem.split('_')[1]}{tail}"
            run.write(out / f"{stem}.json", payload)
            text = render(report, command)
            (out / f"{stem}.md").write_text(text)
            print(text)
    return 0
