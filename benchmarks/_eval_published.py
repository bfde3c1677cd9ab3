"""Our policies against every published one on the four archive traces (issue 45).

    python -m benchmarks.evaluation --published [--trace-jobs 10000] [--workers 2] [--out DIR]
        [--reuse FILE]
    python -m benchmarks.evaluation --frontier [--trace-jobs 10000] [--workers 2] [--out DIR]

The published policies: EASY, MEBF (its three variants, handoff expand), minAgree,
DMR and the Kassel group's nine strategies (``apgas_scheduler.policies.agreements``).
Ours: thrifty, its successor lending, and lending's successor sharing. Every
policy runs every case:

* **the grid**: each trace's first ``--trace-jobs`` jobs on the machine its README
  suggests, 20%, 50% and 100% malleable (``make_malleable``: min = pref/2,
  max = 5 pref) with seeds 1 and 2, Amdahl's law with serial fraction 0.05,
  resize interval 300 s, alpha = beta = 0.05 s (b = 0);
* **variations nobody tuned on** (``VARIATIONS``): other shares and seeds,
  arrivals 25% closer or farther apart, and two other reconfiguration costs.

Sharing is *first* in a case when its mean turnaround is below every published
policy's; the case is *won* when, in addition, it resizes no more than minAgree.
Where it resizes more, the *exchange rate* says what each resize beyond
minAgree's bought: the job-seconds of turnaround saved (over all jobs) per extra
resize. Each trace's workload is also run all
rigid under EASY (every job at its preferred size): the baseline of Zojer, Posner
and Özden (arXiv 2602.17318), whose ranges the page sets beside ours.

Writes ``evaluation_published.json``, ``.md`` and ``.png`` into ``--out``; prints a
line per simulation as it ends. About 900 simulations: some 40 minutes on 2 cores.

``--frontier`` runs lending alone at the loan thresholds of ``LENDS`` (and minAgree
and min-common-pool beside it) on the grid's seed-1 cases: what each threshold
buys in turnaround and costs in resizes (``evaluation_frontier.{json,md}``, 5 minutes).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from apgas_scheduler.policies import get_policy
from apgas_scheduler.policies.agreements import AGREEMENT_POLICIES
from apgas_scheduler.sim import workload as wl
from apgas_scheduler.sim.compare import COSTED
from apgas_scheduler.sim.incentive import as_rigid
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from benchmarks._harness import Run, markdown_head

__all__ = ["PUBLISHED", "OURS", "LENDS", "Case", "cases", "evaluate", "markdown", "main",
           "main_frontier"]

PUBLISHED = ("easy", "mebf", "mebf-shrink+", "mebf-expand+", "malleable", "dmr",
             *AGREEMENT_POLICIES)
OURS = ("thrifty", "lending", "sharing")
HEADLINE = "sharing"
"""The policy the verdicts are about."""
NAMES = {"easy": "EASY", "mebf": "MEBF", "mebf-shrink+": "MEBF shrink+",
         "mebf-expand+": "MEBF expand+", "malleable": "minAgree", "dmr": "DMR",
         "thrifty": "thrifty (ours)", "lending": "lending (ours)", "sharing": "sharing (ours)"}
COSTS = {"0.05": Reconfig(alpha=0.05, beta=0.05, b=0.0),
         "ours": Reconfig(alpha=1.0, beta=10.0, b=0.5),
         "0.5": Reconfig(alpha=0.5, beta=0.5, b=0.0)}
SHARES = (0.2, 0.5, 1.0)
SEEDS = (1, 2)
SERIAL = 0.05
RESIZE_INTERVAL = 300.0
LENDS = (0.0, 2.0, 5.0, 10.0, 20.0)
"""Lending's loan thresholds that ``--frontier`` tries (10: the default)."""
KEYS = ("jobs", "mean_turnaround", "mean_wait", "mean_bounded_slowdown", "utilization",
        "makespan", "reconfigurations")


class Case(NamedTuple):
    """One workload: a trace, its malleable share and seed, the factor on its submit
    times (below 1: a heavier load) and the reconfiguration cost; ``varied`` names
    what differs from the grid ("" for the grid)."""

    trace: str
    share: float
    seed: int
    arrivals: float = 1.0
    cost: str = "0.05"
    varied: str = ""

    @property
    def label(self) -> str:
        return f"{int(round(self.share * 100))}% seed {self.seed}" + (
            f" ({self.varied})" if self.varied else "")


VARIATIONS = (
    Case("", 0.35, 3, varied="share 35%"),
    Case("", 0.8, 4, varied="share 80%"),
    Case("", 0.5, 5, arrivals=0.8, varied="load x1.25"),
    Case("", 0.5, 6, arrivals=1.25, varied="load x0.8"),
    Case("", 0.2, 7, cost="ours", varied="alpha 1 s, beta 10 s, b 0.5 s"),
    Case("", 0.5, 8, cost="0.5", varied="alpha = beta = 0.5 s"),
)
"""Cases nobody tuned on, on every trace (the seeds are new too)."""


def cases(traces: list[str]) -> list[Case]:
    """The grid, then the variations, trace by trace."""
    out = []
    for trace in traces:
        out += [Case(trace, share, seed) for share in SHARES for seed in SEEDS]
        out += [v._replace(trace=trace) for v in VARIATIONS]
    return out


# -- running -------------------------------------------------------------------------------

_TRACES: dict[str, tuple[list[Any], int]] = {}  # each worker's loaded traces


def _workload(directory: Path, max_jobs: int | None, case: Case) -> tuple[list[Any], int]:
    from benchmarks.simspeed import load_trace

    if case.trace not in _TRACES:
        _TRACES[case.trace] = load_trace(directory, case.trace, max_jobs)
    rigid, nodes = _TRACES[case.trace]
    jobs = wl.make_malleable(rigid, case.share, case.seed, total_nodes=nodes, serial=SERIAL)
    if case.arrivals != 1.0:
        jobs = wl.scale_arrivals(jobs, case.arrivals)
    return jobs, nodes


def _simulate(task: tuple[Path, int | None, Case, str]) -> tuple[Case, str, dict[str, Any], float]:
    """One policy on one case, in a worker ("rigid-easy": the all-rigid baseline)."""
    import logging

    logging.disable(logging.WARNING)  # a refused decision is counted by the property tests
    directory, max_jobs, case, policy = task
    jobs, nodes = _workload(directory, max_jobs, case)
    cost = COSTS[case.cost]
    name, _, lend = policy.partition("@")  # "lending@5": lending with lend = 5
    if policy == "rigid-easy":
        name, jobs = "easy", as_rigid(jobs)
    options: dict[str, Any] = {"reconfig_cost": cost} if name in COSTED else {}
    if lend:
        options["lend"] = float(lend)
    started = time.perf_counter()
    m = Simulator(nodes, get_policy(name, resize_interval=RESIZE_INTERVAL, **options),
                  reconfig=cost, model="amdahl").run(jobs).metrics
    figures = {k: m[k] for k in KEYS}
    figures["nodes"] = nodes
    figures["by_class"] = {c: {k: v[k] for k in ("jobs", "mean_wait", "mean_turnaround")}
                           for c, v in m["by_class"].items()}
    return case, policy, figures, time.perf_counter() - started


def evaluate(directory: Path, max_jobs: int | None, chosen: list[Case], workers: int,
             policies: tuple[str, ...] = ("rigid-easy", *PUBLISHED, *OURS),
             known: dict[Case, dict[str, Any]] | None = None) -> dict[Case, dict[str, Any]]:
    """{case: {policy: figures}} for every case and policy ("rigid-easy": the
    all-rigid baseline; "lending@5": lending with ``lend`` 5); the runs in ``known``
    are taken as they are."""
    known = known or {}
    tasks = [(directory, max_jobs, c, p) for c in chosen for p in policies
             if p not in known.get(c, {})]
    results = {c: {p: known[c][p] for p in policies if p in known.get(c, {})} for c in chosen}
    if not tasks:
        return results
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for done, (case, policy, figures, seconds) in enumerate(
                pool.imap_unordered(_simulate, tasks), 1):
            results.setdefault(case, {})[policy] = figures
            print(f"   [{done:>4}/{len(tasks)}] {case.trace:<13} {case.label:<40} {policy:<22} "
                  f"turnaround {figures['mean_turnaround'] / 3600:7.3f} h  resizes "
                  f"{figures['reconfigurations']:>6}  {seconds:5.1f} s", flush=True)
    return {c: {p: results[c][p] for p in policies} for c in chosen}


def reusable(path: Path, max_jobs: int | None) -> dict[Case, dict[str, Any]]:
    """The runs of an earlier ``evaluation_published.json`` made on the same jobs."""
    report = json.loads(path.read_text())
    if report.get("trace_jobs") != (max_jobs or 0):
        raise SystemExit(f"--reuse {path}: its runs are of the first {report.get('trace_jobs')} "
                         f"jobs, not {max_jobs or 0}")
    return {Case(*(row[f] for f in Case._fields)): row["runs"] for row in report["cases"]}


# -- reading -------------------------------------------------------------------------------

def verdict(runs: dict[str, Any], ours: str = HEADLINE) -> dict[str, Any]:
    """How ``ours`` fares in one case: the best published policy, the margins, whether
    it is first (``ahead``) and won, and the exchange rate against minAgree."""
    best = min(PUBLISHED, key=lambda p: runs[p]["mean_turnaround"])
    mine, theirs = runs[ours], runs["malleable"]
    turn = mine["mean_turnaround"]
    ahead = turn < runs[best]["mean_turnaround"]
    extra = mine["reconfigurations"] - theirs["reconfigurations"]
    return {"best_published": best,
            "vs_best_pct": _pct(turn, runs[best]["mean_turnaround"]),
            "resizes_vs_minagree": mine["reconfigurations"] / max(1, theirs["reconfigurations"]),
            "ahead": ahead, "within_budget": extra <= 0, "won": ahead and extra <= 0,
            "saved_per_extra_resize_s": ((theirs["mean_turnaround"] - turn) * mine["jobs"] / extra
                                         if extra > 0 else None)}


def _pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old if old else 0.0


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.3f}"


def markdown(report: dict[Case, dict[str, Any]], command: str) -> str:
    lines = [f"Produced by `{command}`. Mean turnaround in hours; resizes; sharing's "
             "margin over the best published policy, its resizes over minAgree's, and where "
             "it resizes more, the job-seconds of turnaround each extra resize saved.", ""]
    lines += markdown_head("trace", "case", "best published", "its turnaround", "its resizes",
                           "minAgree", "minAgree resizes", "lending", "lending resizes",
                           "sharing", "sharing resizes", "sharing vs best", "resizes / minAgree",
                           "saved per extra resize (s)", "first", "won", left=3)
    first = won = 0
    for case, runs in report.items():
        v = verdict(runs)
        first, won = first + v["ahead"], won + v["won"]
        b, m, lend, ours = (runs[v["best_published"]], runs["malleable"], runs["lending"],
                            runs[HEADLINE])
        rate = v["saved_per_extra_resize_s"]
        lines.append(
            f"| {case.trace} | {case.label} | {NAMES.get(v['best_published'], v['best_published'])} | "
            f"{_h(b['mean_turnaround'])} | {b['reconfigurations']:,} | {_h(m['mean_turnaround'])} | "
            f"{m['reconfigurations']:,} | {_h(lend['mean_turnaround'])} | {lend['reconfigurations']:,} | "
            f"{_h(ours['mean_turnaround'])} | {ours['reconfigurations']:,} | {v['vs_best_pct']:+.1f}% | "
            f"{v['resizes_vs_minagree']:.2f} | {'-' if rate is None else f'{rate:,.0f}'} | "
            f"{'yes' if v['ahead'] else 'no'} | {'yes' if v['won'] else 'no'} |")
    lines += ["", f"Sharing is first in {first} of {len(report)} cases, and within minAgree's "
              f"resizes as well in {won}.", "", *_by_class(report), "", *_zojer(report)]
    return "\n".join(lines) + "\n"


def _by_class(report: dict[Case, dict[str, Any]]) -> list[str]:
    """Each class's mean turnaround under sharing against the best published policy's."""
    lines = ["Per class (mean turnaround in hours, sharing against the best published "
             "policy of the case):", "",
             *markdown_head("trace", "case", "best published", "rigid", "rigid, sharing",
                            "malleable", "malleable, sharing", left=3)]
    for case, runs in report.items():
        best = verdict(runs)["best_published"]
        cells = []
        for cls in ("rigid", "malleable"):
            theirs, ours = (runs[best]["by_class"].get(cls), runs[HEADLINE]["by_class"].get(cls))
            cells += ([_h(theirs["mean_turnaround"]),
                       f"{_h(ours['mean_turnaround'])} ({_pct(ours['mean_turnaround'], theirs['mean_turnaround']):+.1f}%)"]
                      if theirs and ours else ["-", "-"])
        lines.append(f"| {case.trace} | {case.label} | {NAMES.get(best, best)} | " + " | ".join(cells) + " |")
    return lines


ZOJER = {"mean_turnaround": (-67, -37), "makespan": (-65, -16), "mean_wait": (-99, -73),
         "utilization": (5, 52)}
"""Zojer, Posner and Özden's ranges against rigid scheduling (Cori, Eagle, Theta in
ElastiSim), in percent."""


def zojer_changes(report: dict[Case, dict[str, Any]], policy: str) -> dict[str, list[float]]:
    """The grid's changes of ``policy`` against the all-rigid EASY run, in percent
    (none where the baseline's figure is 0: on LLNL-Thunder no job waits under it)."""
    out: dict[str, list[float]] = {k: [] for k in ZOJER}
    for case, runs in report.items():
        if case.varied:
            continue
        for key in ZOJER:
            if runs["rigid-easy"][key]:
                out[key].append(_pct(runs[policy][key], runs["rigid-easy"][key]))
    return out


def _zojer(report: dict[Case, dict[str, Any]]) -> list[str]:
    lines = ["Against EASY with every job rigid at its preferred size, over the grid (4 traces, "
             "20/50/100% malleable, 2 seeds): the range of the change, and the median (wait: "
             "without LLNL-Thunder, where no job waits under that baseline).", "",
             *markdown_head("policy", "turnaround", "makespan", "wait", "utilization")]
    for policy in ("sharing", "lending", "thrifty", "malleable", "min-common-pool"):
        changes = zojer_changes(report, policy)
        lines.append(f"| {NAMES.get(policy, policy)} | " + " | ".join(
            f"{min(v):+.0f}% to {max(v):+.0f}% (median {statistics.median(v):+.0f}%)" if v else "-"
            for v in changes.values()) + " |")
    lines.append("| Zojer et al. (Cori, Eagle, Theta) | " + " | ".join(
        f"{lo:+d}% to {hi:+d}%" for lo, hi in ZOJER.values()) + " |")
    return lines


def _rows(report: dict[Case, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for case, runs in report.items():
        yield {**case._asdict(), "label": case.label, "verdict": verdict(runs),
               "verdict_lending": verdict(runs, "lending"), "verdict_thrifty": verdict(runs, "thrifty"),
               "runs": runs}


def plot(path: Path, report: dict[Case, dict[str, Any]]) -> None:
    """Each policy's turnaround over the best published policy's against its resizes
    over minAgree's, one point per case."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for policy in ("sharing", "lending", "thrifty", "malleable", "min-common-pool", "pref-common-pool",
                   "min-agreement", "mebf", "dmr"):
        xs, ys = [], []
        for runs in report.values():
            best = min(runs[p]["mean_turnaround"] for p in PUBLISHED)
            xs.append(runs[policy]["reconfigurations"] / max(1, runs["malleable"]["reconfigurations"]))
            ys.append(runs[policy]["mean_turnaround"] / best)
        ax.scatter(xs, ys, label=NAMES.get(policy, policy), s=18)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("resizes / minAgree's (log)")
    ax.set_ylabel("mean turnaround / best published policy's")
    ax.set_ylim(0.8, 1.6)
    ax.set_title("Every case: below 1 and left of 1 wins")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(run: Run, out: Path, traces_dir: Path | None, max_jobs: int | None, workers: int,
         traces: list[str] | None = None, reuse: Path | None = None) -> int:
    """``--published`` of ``benchmarks.evaluation``: JSON, Markdown and PNG into ``out``
    (``reuse``: an earlier JSON whose runs are taken, :func:`reusable`)."""
    from benchmarks.simspeed import REAL_TRACES, TRACES_DIR

    names = traces or list(REAL_TRACES)
    print(f"every published policy, thrifty, lending and sharing on {', '.join(names)}, first "
          f"{max_jobs or 'all'} jobs, {workers} worker(s)")
    report = evaluate(traces_dir or TRACES_DIR, max_jobs, cases(names), workers,
                      known=reusable(reuse, max_jobs) if reuse else None)
    out.mkdir(parents=True, exist_ok=True)
    tail = f" --trace-jobs {max_jobs or 0}" if max_jobs != 10000 else ""
    command = f"python -m benchmarks.evaluation --published{tail}"
    run.write(out / "evaluation_published.json", {
        "trace_jobs": max_jobs or 0, "serial_fraction": SERIAL, "resize_interval": RESIZE_INTERVAL,
        "costs": {k: vars(c) for k, c in COSTS.items()}, "zojer_ranges_pct": ZOJER,
        "cases": list(_rows(report))})
    text = markdown(report, command)
    (out / "evaluation_published.md").write_text(text)
    plot(out / "evaluation_published.png", report)
    print(text)
    return 0


def main_frontier(run: Run, out: Path, traces_dir: Path | None, max_jobs: int | None,
                  workers: int) -> int:
    """``--frontier``: lending at each of ``LENDS`` on the grid's seed-1 cases."""
    from benchmarks.simspeed import REAL_TRACES, TRACES_DIR

    chosen = [c for c in cases(list(REAL_TRACES)) if not c.varied and c.seed == 1]
    policies = ("malleable", "min-common-pool", *(f"lending@{lend:g}" for lend in LENDS))
    report = evaluate(traces_dir or TRACES_DIR, max_jobs, chosen, workers, policies)
    tail = f" --trace-jobs {max_jobs or 0}" if max_jobs != 10000 else ""
    run.write(out / "evaluation_frontier.json", {
        "trace_jobs": max_jobs or 0, "lends": LENDS, "cases": list(
            {**c._asdict(), "label": c.label, "runs": r} for c, r in report.items())})
    lines = [f"Produced by `python -m benchmarks.evaluation --frontier{tail}`. Mean turnaround in "
             "hours / resizes.", "",
             *markdown_head("trace", "case", "minAgree", "min-common-pool",
                            *(f"lending, lend {lend:g}" for lend in LENDS), left=2)]
    for case, runs in report.items():
        lines.append(f"| {case.trace} | {case.label} | " + " | ".join(
            f"{_h(runs[p]['mean_turnaround'])} / {runs[p]['reconfigurations']:,}" for p in policies) + " |")
    text = "\n".join(lines) + "\n"
    (out / "evaluation_frontier.md").write_text(text)
    print(text)
    return 0
