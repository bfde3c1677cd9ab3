"""Simulate one workload under several policies: a table, JSON and plots.

Used by ``python -m scheduler simulate`` (one policy) and ``compare``
(several). Workloads come from an SWF trace or a generator of
``scheduler.workload``; evolving jobs with profiles go to the list
scheduler of ``scheduler.evolving`` (policies ``evolving*``), everything else
to the discrete-event ``Simulator`` with the live policies.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from . import workload as wl
from .policies import get_policy, policy_names
from .simulator import Reconfig, Simulator

__all__ = ["add_workload_arguments", "build_workload", "simulate", "compare", "table"]

KEYS = ("makespan", "utilization", "mean_wait", "mean_turnaround", "mean_slowdown",
        "mean_bounded_slowdown", "reconfigurations")


def evolving_names() -> dict[str, Any]:
    from .evolving import evolving_policies

    return evolving_policies()


def all_policy_names() -> list[str]:
    """Every name ``simulate`` and ``compare`` know. "evolving" is both the live
    evolving EASY and the list scheduler of profiles; the simulator's jobs never
    ask, so the live one would be plain EASY there, and the name means the
    list scheduler."""
    return list(dict.fromkeys(policy_names() + list(evolving_names())))


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="a Standard Workload Format file")
    src.add_argument("--generate", choices=["apgas", "kit", "evolving"],
                     help="a synthetic workload instead of a trace")
    p.add_argument("--jobs", type=int, default=None, help="jobs to generate, or to read at most")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the simulated cluster")
    p.add_argument("--procs-per-node", type=int, default=1, help="SWF processors per node")
    p.add_argument("--malleable-share", type=float, default=0.0,
                   help="share of jobs made malleable (min = pref/2, max = 5 pref)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply submit times (below 1: heavier load)")
    p.add_argument("--rho", type=float, default=None, help="scalability of the malleable jobs")
    p.add_argument("--model", choices=["rho", "amdahl"], default="rho")
    p.add_argument("--alpha", type=float, default=0.0, help="reconfiguration s per node changed")
    p.add_argument("--beta", type=float, default=0.0, help="reconfiguration s / new size")
    p.add_argument("--process-cost", type=float, default=0.0, help="b: s per process started/stopped")
    p.add_argument("--resize-interval", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=None,
                   help="also decide every this many simulated seconds (default: on events only)")


def build_workload(ns: argparse.Namespace) -> list[Any]:
    if ns.trace:
        jobs = wl.read_swf(ns.trace, procs_per_node=ns.procs_per_node, max_jobs=ns.jobs)
    elif ns.generate == "apgas":  # the study's own node ranges for its malleable jobs
        return _scaled(wl.apgas_job_batch(ns.seed, jobs=ns.jobs or 25, nodes=ns.nodes,
                                          share=ns.malleable_share, rho=ns.rho or 0.0), ns)
    elif ns.generate == "kit":
        jobs = wl.kit_like(ns.seed, ns.jobs or 1000, ns.nodes)
    else:
        jobs = wl.uniform_evolving(ns.seed, ns.jobs, ns.nodes)
    if ns.malleable_share:
        jobs = wl.make_malleable(jobs, ns.malleable_share, ns.seed, total_nodes=ns.nodes,
                                 rho=ns.rho)
    return _scaled(jobs, ns)


def _scaled(jobs: list[Any], ns: argparse.Namespace) -> list[Any]:
    return wl.scale_arrivals(jobs, ns.arrival_scale) if ns.arrival_scale != 1.0 else jobs


def simulate(jobs: list[Any], policy: str, ns: argparse.Namespace) -> dict[str, Any]:
    """One policy on one workload: metrics, seconds taken, utilization timeline."""
    started = time.perf_counter()
    evolving = evolving_names()
    if policy in evolving:
        schedule = evolving[policy](jobs, ns.nodes)
        metrics = schedule.metrics(jobs, ns.nodes)
        timeline = _steps(schedule.usage)
    else:
        sim = Simulator(ns.nodes, get_policy(policy, resize_interval=ns.resize_interval),
                        reconfig=Reconfig(ns.alpha, ns.beta, ns.process_cost), model=ns.model,
                        interval=ns.interval)
        result = sim.run(jobs)
        metrics, timeline = result.metrics, result.timeline
    return {"policy": policy, "metrics": metrics, "seconds": time.perf_counter() - started,
            "timeline": timeline}


def _steps(pieces: list[tuple[float, float, int, int]]) -> list[tuple[float, int]]:
    changes: dict[float, int] = {}
    for start, end, _, n in pieces:
        changes[start] = changes.get(start, 0) + n
        changes[end] = changes.get(end, 0) - n
    busy, out = 0, []
    for t in sorted(changes):
        busy += changes[t]
        out.append((t, busy))
    return out


def compare(jobs: list[Any], policies: list[str], ns: argparse.Namespace) -> list[dict[str, Any]]:
    return [simulate(jobs, p, ns) for p in policies]


def table(runs: list[dict[str, Any]]) -> str:
    head = f"{'policy':<22}" + "".join(f"{k.replace('mean_', ''):>18}" for k in KEYS) + f"{'sim s':>8}"
    lines = [head]
    for r in runs:
        cells = []
        for k in KEYS:
            v = r["metrics"].get(k)
            cells.append(f"{'-':>18}" if v is None else f"{v:>18.3f}" if isinstance(v, float) else f"{v:>18}")
        lines.append(f"{r['policy']:<22}" + "".join(cells) + f"{r['seconds']:>8.2f}")
    return "\n".join(lines)


def write_json(path: str | Path, runs: list[dict[str, Any]], ns: argparse.Namespace) -> None:
    params = {k: v for k, v in vars(ns).items() if k not in ("func",)}
    slim = [{k: v for k, v in r.items() if k != "timeline"} for r in runs]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"parameters": params, "runs": slim}, indent=2, default=str) + "\n")


def plot(path: str | Path, runs: list[dict[str, Any]], nodes: int, title: str = "") -> None:
    """Turnaround and bounded slowdown per policy, utilization over time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    names = [r["policy"] for r in runs]
    for i, key in enumerate(("mean_turnaround", "mean_bounded_slowdown")):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.bar(range(len(runs)), [r["metrics"].get(key) or 0 for r in runs], color="tab:blue")
        ax.set_xticks(range(len(runs)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(key.replace("_", " "))
    ax = fig.add_subplot(1, 3, 3)
    for r in runs:
        steps = r["timeline"]
        if steps:
            ax.step([t / 3600 for t, _ in steps], [b / nodes for _, b in steps], where="post",
                    label=r["policy"], linewidth=0.8)
    ax.set_xlabel("hours")
    ax.set_title("utilization over time")
    ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
