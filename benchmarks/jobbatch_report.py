"""The report of ``python -m benchmarks.jobbatch``: per (share, policy) figures from the
runs, the comparison with the paper, the tables and the plot."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import median
from benchmarks._harness import Column, Table

__all__ = ["SCHEDULER_METRICS", "METRICS", "PUBLISHED", "summarize", "compare", "render", "plot"]

SCHEDULER_METRICS = ("makespan", "utilization", "mean_wait", "mean_turnaround", "grows", "shrinks",
                     "max_overlap_violations")   # from the event log
METRICS = (*SCHEDULER_METRICS, "cpu_seconds", "cpu_share")  # + CPU time of the jobs, its share of the cores
# minAgree at 100% malleable against FCFS at 0% (the paper's best policy at 0%), in %
PUBLISHED = {"makespan": -13.09, "utilization": 19.86, "mean_turnaround": -3.61}


def summarize(runs: list[dict[str, Any]], shares: list[int], policies: list[str]) -> list[dict[str, Any]]:
    """Per (share, policy): the median over repeats of each seed, then the mean over seeds."""
    out = []
    for share in shares:
        for policy in policies:
            mine = [r for r in runs if r["share"] == share and r["policy"] == policy]
            if not mine:
                continue
            row: dict[str, Any] = {"share": share, "policy": policy, "runs": len(mine),
                                   "failures": sum(len(r["failures"]) for r in mine)}
            for key in METRICS:
                per_seed = [median([r[key] for r in mine if r["seed"] == s and r[key] is not None])
                            for s in sorted({r["seed"] for r in mine})]
                per_seed = [v for v in per_seed if v is not None]
                row[key] = statistics.fmean(per_seed) if per_seed else None
            out.append(row)
    return out


def _cell(summary: list[dict[str, Any]], share: int, policy: str) -> dict[str, Any] | None:
    return next((r for r in summary if r["share"] == share and r["policy"] == policy), None)


def _change(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else (new - old) / old * 100


def compare(summary: list[dict[str, Any]], policies: list[str]) -> dict[str, Any] | None:
    """minAgree at 100% against the best policy at 0% (by makespan, Backfilling left
    out as in the paper) and against FCFS at 0%; changes in %."""
    ours = _cell(summary, 100, "malleable")
    candidates = [c for p in policies if p != "backfill" and (c := _cell(summary, 0, p))
                  and c["makespan"] is not None]
    if ours is None or not candidates:
        return None
    best = min(candidates, key=lambda c: c["makespan"])
    out: dict[str, Any] = {"published_vs_fcfs_0": PUBLISHED}
    for label, base in (("vs_best_0", best), ("vs_fcfs_0", _cell(summary, 0, "fcfs"))):
        if base is not None:
            out[label] = {"baseline": base["policy"],
                          **{k: _change(ours[k], base[k]) for k in PUBLISHED}}
    return out


def _grid(summary: list[dict[str, Any]], shares: list[int], policies: list[str], title: str,
          cell: Callable[[dict[str, Any]], str]) -> list[str]:
    """Rows = shares, columns = policies."""
    table = Table([Column("share", 6, unit="%"), *(Column(p, 24, left=True, gap="  " if i == 0 else "")
                                                   for i, p in enumerate(policies))], title=title)
    return table.render([share, *(cell(c) + ("!" if c["failures"] else "")
                                  if (c := _cell(summary, share, p)) and c["makespan"] is not None else "-"
                                  for p in policies)] for share in shares).split("\n")


def render(summary: list[dict[str, Any]], comparison: dict[str, Any] | None,
           shares: list[int], policies: list[str], failures: int) -> str:
    """The tables (share x policy) and the comparison with the paper."""
    lines = _grid(summary, shares, policies, "makespan s / utilisation / mean turnaround s",
                  lambda c: f"{c['makespan']:.1f} / {c['utilization']:.0%} / {c['mean_turnaround']:.1f}")
    lines += [""] + _grid(summary, shares, policies,
                          "mean wait s / CPU share (jobs' CPU time / cores x makespan) / grows+shrinks",
                          lambda c: f"{c['mean_wait']:.1f} / {c['cpu_share']:.0%} / "
                                    f"{(c['grows'] or 0) + (c['shrinks'] or 0):g}")
    if comparison:
        table = Table([Column("minAgree at 100% malleable, change against", 46, left=True),
                       Column("makespan", 9, gap=" "), Column("utilis.", 9, gap=" "),
                       Column("turnaround", 11, gap=" ")])
        rows = [(f"here: {comparison[k]['baseline']} at 0% (best w/o backfill)"
                 if k == "vs_best_0" else "here: fcfs at 0%", comparison[k])
                for k in ("vs_best_0", "vs_fcfs_0") if k in comparison]
        rows.append(("paper: fcfs at 0% (32 nodes, 10 batches)", comparison["published_vs_fcfs_0"]))
        lines += ["", table.render([label, *(_pct(values[k]) for k in ("makespan", "utilization", "mean_turnaround"))]
                                   for label, values in rows)]
    lines += ["", f"failures: {failures}" + ("  (cells marked ! had failures)" if failures else "")]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def plot(summary: list[dict[str, Any]], shares: list[int], policies: list[str], path: Path,
         title: str) -> None:
    """Three panels against the malleable share, one line per policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("makespan", "makespan [s]", 1), ("utilization", "node utilisation [%]", 100),
              ("mean_turnaround", "mean turnaround [s]", 1))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        for p in policies:
            points = [(s, c[key] * scale) for s in shares
                      if (c := _cell(summary, s, p)) and c[key] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=p)
        ax.set_xlabel("malleable / moldable jobs [%]")
        ax.set_ylabel(label)
        ax.set_xticks(shares)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
