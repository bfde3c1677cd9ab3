"""Simulate one workload under several policies: a table, JSON and plots.

Used by ``python -m apgas_scheduler simulate`` (one policy) and ``compare``
(several). Workloads come from an SWF trace or a generator of
``apgas_scheduler.sim.workload``; evolving jobs with profiles go to the list
scheduler of ``apgas_scheduler.sim.listsched`` (policies ``evolving*``), everything else
to the discrete-event ``Simulator`` with the live policies, and, when the
workload has malleable jobs, a second time with them rigid for the incentive
(``apgas_scheduler.sim.incentive``) unless ``--no-incentive``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..policies import get_policy, policy_names
from ..policies.lending import LENDING_POLICIES
from ..policies.mebf import EXPAND_POLICIES, MEBF_POLICIES
from ..policies.sharing import SHARING_POLICIES
from ..policies.thrifty import THRIFTY_POLICIES
from . import swf
from . import workload as wl
from .incentive import run_with_incentive
from .simulator import Reconfig, Simulator

COSTED = {**MEBF_POLICIES, **THRIFTY_POLICIES, **LENDING_POLICIES, **SHARING_POLICIES}
"""The policies given the simulator's cost model: MEBF's family for its feasibility
test, ours for their grows."""

DEFAULT_SERIAL_FRACTION = 0.05
"""Serial fraction of ``--model amdahl`` for jobs that bring none (all jobs of a trace)."""

__all__ = ["add_workload_arguments", "add_policy_arguments", "check_options", "build_workload",
           "cluster_of",
           "simulate", "compare", "table", "class_table", "incentive_table"]

KEYS = ("makespan", "utilization", "mean_wait", "mean_turnaround", "mean_slowdown",
        "mean_bounded_slowdown", "reconfigurations")
CLASS_COLUMNS = ("mean_wait", "mean_turnaround", "mean_slowdown", "mean_bounded_slowdown",
                 "reconfigurations")
INCENTIVE_COLUMNS = ("mean_turnaround", "mean_turnaround_as_rigid", "ratio", "change_pct",
                     "mean_wait", "mean_wait_as_rigid")


def evolving_names() -> dict[str, Any]:
    from .listsched import evolving_policies

    return evolving_policies()


def all_policy_names() -> list[str]:
    """Every name ``simulate`` and ``compare`` know. "evolving" is both the live
    evolving EASY and the list scheduler of profiles; the simulator's jobs never
    ask, so the live one would be plain EASY there, and the name means the
    list scheduler."""
    return list(dict.fromkeys(policy_names() + list(evolving_names())))


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="a Standard Workload Format file, plain or compressed "
                                     "(.swf.gz, .swf.bz2, .swf.xz, as the archive ships them)")
    src.add_argument("--generate", choices=["apgas", "kit", "evolving"],
                     help="a synthetic workload instead of a trace")
    p.add_argument("--jobs", "--max-jobs", type=int, default=None,
                   help="jobs to generate, or to read at most from the trace")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes of the simulated cluster (a trace: by default its header's "
                        "MaxProcs / --procs-per-node, or MaxNodes)")
    p.add_argument("--procs-per-node", type=int, default=None,
                   help="SWF processors per node (default: 1 with --nodes, else MaxProcs / "
                        "MaxNodes of the trace's header when a whole number)")
    p.add_argument("--malleable-share", type=float, default=0.0,
                   help="share of jobs made malleable (min = pref/2, max = 5 pref)")
    p.add_argument("--no-incentive", action="store_true",
                   help="skip the incentive: by default a workload with malleable jobs is "
                        "simulated again with them rigid at their preferred size, to compare "
                        "their mean turnaround (twice the simulation time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arrival-scale", type=float, default=1.0,
                   help="multiply submit times (below 1: heavier load)")
    p.add_argument("--rho", type=float, default=None, help="scalability of the malleable jobs")
    p.add_argument("--model", choices=["rho", "amdahl"], default="rho",
                   help="run time on k nodes: rho (pref/k)**(1-rho), or Amdahl's law")
    p.add_argument("--serial-fraction", type=_serial_fraction, default=None, metavar="F",
                   help="with --model amdahl: serial fraction 0 <= F < 1 of the jobs that have "
                        f"none (every trace job; default {DEFAULT_SERIAL_FRACTION})")
    p.add_argument("--alpha", type=float, default=0.0, help="reconfiguration s per node changed")
    p.add_argument("--beta", type=float, default=0.0, help="reconfiguration s / new size")
    p.add_argument("--process-cost", type=float, default=0.0, help="b: s per process started/stopped")
    p.add_argument("--resize-interval", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=None,
                   help="also decide every this many simulated seconds (default: on events only)")


def _serial_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1): a serial fraction of 1 "
                                         "or more means no speed-up at all")
    return value


def _expand_limit(text: str) -> float:
    """An expand limit: a number >= 1, or "unbounded" (kept as inf)."""
    if text.strip().lower() in ("unbounded", "inf", "none"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'unbounded'") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"{text} must be at least 1 (1: no expansion) or "
                                         "'unbounded'")
    return value


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the policy families (each rejected if no chosen policy uses it)."""
    p.add_argument("--expand-policy", choices=EXPAND_POLICIES, default=None,
                   help="mebf, mebf-shrink+, mebf-expand+: which expands are worth it "
                        "(default handoff)")
    p.add_argument("--expand-limit", type=_expand_limit, default=None, metavar="N|unbounded",
                   help="evolving: a step may be held at most N times its duration "
                        "(default 1: no expansion)")
    p.add_argument("--compact", action="store_true", default=None,
                   help="evolving: compact each job after the base fit")


def check_options(policies: list[str], ns: argparse.Namespace) -> None:
    """Reject an option that no chosen policy uses, or one for another model."""
    if getattr(ns, "expand_policy", None) is not None and not any(p in MEBF_POLICIES for p in policies):
        raise ValueError(f"--expand-policy {ns.expand_policy} applies only to the mebf policies "
                         f"({', '.join(MEBF_POLICIES)})")
    evolving = "evolving" in policies
    if getattr(ns, "expand_limit", None) is not None and not evolving:
        raise ValueError("--expand-limit applies only to the evolving policy")
    if getattr(ns, "compact", None) and not evolving:
        raise ValueError("--compact applies only to the evolving policy")
    if ns.serial_fraction is not None and ns.model != "amdahl":
        raise ValueError(f"--serial-fraction {ns.serial_fraction} applies only to --model amdahl")


def check_workload(jobs: list[Any], policies: list[str], ns: argparse.Namespace) -> None:
    """The evolving list schedulers place evolution profiles: refuse a workload
    without them (an SWF trace, the kit or apgas generators) up front."""
    chosen = [p for p in policies if p in evolving_names()]
    bare = next((j for j in jobs if not getattr(j, "profile", None)), None)
    if chosen and bare is not None:
        source = f"the trace {ns.trace}" if ns.trace else f"--generate {ns.generate}"
        raise ValueError(
            f"{', '.join(chosen)}: evolving policies need evolving jobs with profiles "
            f"(e.g. --generate evolving), and job {bare.id} from {source} has none")


def policy_label(policy: str, ns: argparse.Namespace) -> str:
    """The policy's name with the options that change it, for tables and plots."""
    if policy in MEBF_POLICIES and getattr(ns, "expand_policy", None):
        return f"{policy} {ns.expand_policy}"
    if policy == "evolving":
        limit = getattr(ns, "expand_limit", None)
        label = policy if limit in (None, 1) else f"{policy} {limit:g}X"  # inf prints as infX
        return label + ("+c" if getattr(ns, "compact", None) else "")
    return policy


def cluster_of(ns: argparse.Namespace) -> None:
    """Fill in ``ns.nodes`` and ``ns.procs_per_node`` the command left out: from
    the trace's header (``MaxNodes``, ``MaxProcs``; see ``swf.trace_cluster``);
    a generated workload needs ``--nodes``."""
    if not ns.trace:
        if ns.nodes is None:
            raise ValueError(f"--generate {ns.generate} needs --nodes")
        ns.procs_per_node = ns.procs_per_node or 1
        return
    if ns.nodes is not None:
        ns.procs_per_node = ns.procs_per_node or 1
        return
    nodes, ppn = swf.trace_cluster(swf.swf_header(ns.trace), ns.procs_per_node)
    ns.procs_per_node = ppn
    if ns.nodes is None:
        if nodes is None:
            raise ValueError(f"{ns.trace}: the header has no MaxNodes or MaxProcs; give --nodes")
        ns.nodes = nodes


def build_workload(ns: argparse.Namespace) -> list[Any]:
    cluster_of(ns)
    if ns.trace:
        jobs = wl.read_swf(ns.trace, procs_per_node=ns.procs_per_node, max_jobs=ns.jobs,
                           stats=_stats(ns))
    elif ns.generate == "apgas":  # the study's own node ranges for its malleable jobs
        jobs = wl.apgas_job_batch(ns.seed, jobs=ns.jobs or 25, nodes=ns.nodes,
                                  share=ns.malleable_share, rho=ns.rho or 0.0)
    elif ns.generate == "kit":
        jobs = wl.kit_like(ns.seed, ns.jobs or 1000, ns.nodes)
    else:
        jobs = wl.uniform_evolving(ns.seed, ns.jobs, ns.nodes)
    if ns.malleable_share and ns.generate != "apgas":
        jobs = wl.make_malleable(jobs, ns.malleable_share, ns.seed, total_nodes=ns.nodes,
                                 rho=ns.rho)
    if ns.model == "amdahl":
        serial = DEFAULT_SERIAL_FRACTION if ns.serial_fraction is None else ns.serial_fraction
        jobs = [j if j.serial is not None else dataclasses.replace(j, serial=serial) for j in jobs]
    return _scaled(jobs, ns)


def _stats(ns: argparse.Namespace) -> dict[str, float]:
    """Where ``read_swf`` reports what it read (``jobs``, ``skipped``), kept on ``ns``."""
    ns.swf_stats = {}
    return ns.swf_stats


def _scaled(jobs: list[Any], ns: argparse.Namespace) -> list[Any]:
    return wl.scale_arrivals(jobs, ns.arrival_scale) if ns.arrival_scale != 1.0 else jobs


def make_policy(policy: str, ns: argparse.Namespace) -> Any:
    """A live policy built with the command's options. The MEBF family gets
    its expand policy and, for its feasibility test, the reconfiguration
    cost model the simulator charges (alpha, beta, process cost); thrifty
    and lending get that cost model for their grows."""
    options: dict[str, Any] = {"resize_interval": ns.resize_interval}
    if policy in COSTED:
        options["reconfig_cost"] = reconfig_of(ns)
    if policy in MEBF_POLICIES and getattr(ns, "expand_policy", None):
        options["expand"] = ns.expand_policy
    return get_policy(policy, **options)


def reconfig_of(ns: argparse.Namespace) -> Reconfig:
    return Reconfig(ns.alpha, ns.beta, ns.process_cost)


def simulate(jobs: list[Any], policy: str, ns: argparse.Namespace) -> dict[str, Any]:
    """One policy on one workload: metrics, seconds taken, utilization timeline."""
    started = time.perf_counter()
    evolving = evolving_names()
    if policy in evolving:
        options: dict[str, Any] = {}
        if policy == "evolving":
            limit = getattr(ns, "expand_limit", None)
            options = {"expand_limit": None if limit == math.inf else (limit or 1),
                       "compact": bool(getattr(ns, "compact", False))}
        schedule = evolving[policy](jobs, ns.nodes, **options)
        metrics = schedule.metrics(jobs, ns.nodes)
        timeline = _steps(schedule.usage)
    else:
        sim_options = {"reconfig": reconfig_of(ns), "model": ns.model, "interval": ns.interval}
        if getattr(ns, "no_incentive", False):
            result = Simulator(ns.nodes, make_policy(policy, ns), **sim_options).run(jobs)
        else:
            result = run_with_incentive(ns.nodes, lambda: make_policy(policy, ns), jobs,
                                        **sim_options)
        metrics, timeline = result.metrics, result.timeline
    return {"policy": policy_label(policy, ns), "metrics": metrics,
            "seconds": time.perf_counter() - started, "timeline": timeline}


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


def _cells(figures: dict[str, Any], keys: Sequence[str]) -> str:
    values = [figures.get(k) for k in keys]
    return "".join(f"{'-':>18}" if v is None else f"{v:>18.3f}" if isinstance(v, float) else f"{v:>18}"
                   for v in values)


def _heads(keys: Sequence[str]) -> str:
    def head(key: str) -> str:
        name = key.replace("mean_", "")
        return f"rigid {name.removesuffix('_as_rigid')}" if name.endswith("_as_rigid") else name

    return "".join(f"{head(k):>18}" for k in keys)


def table(runs: list[dict[str, Any]]) -> str:
    head = f"{'policy':<22}" + _heads(KEYS) + f"{'sim s':>8}"
    lines = [head]
    for r in runs:
        lines.append(f"{r['policy']:<22}" + _cells(r["metrics"], KEYS) + f"{r['seconds']:>8.2f}")
    return "\n".join(lines)


def class_table(rows: Sequence[tuple[str | None, dict[str, Any]]]) -> str:
    """One row per (label, class) of each metrics' ``by_class`` (a label None:
    no policy column, as ``report`` prints it); "" when none has one."""
    lines = []
    for label, metrics in rows:
        for cls, figures in (metrics.get("by_class") or {}).items():
            lines.append(("" if label is None else f"{label:<22}") + f"{cls:<10}{figures['jobs']:>8}"
                         + _cells(figures, CLASS_COLUMNS))
    if not lines:
        return ""
    first = "" if all(label is None for label, _ in rows) else f"{'policy':<22}"
    return "\n".join([first + f"{'class':<10}{'jobs':>8}" + _heads(CLASS_COLUMNS), *lines])


def incentive_table(runs: list[dict[str, Any]]) -> str:
    """The runs' incentive (``metrics["incentive"]``): the malleable jobs against
    the same jobs submitted rigid; "" when no run has one."""
    found = [(r["policy"], r["metrics"]["incentive"]) for r in runs if r["metrics"].get("incentive")]
    if not found:
        return ""
    lines = ["incentive: the malleable jobs against the same jobs submitted rigid",
             f"{'policy':<22}{'jobs':>8}" + _heads(INCENTIVE_COLUMNS)]
    lines += [f"{label:<22}{figures['jobs']:>8}" + _cells(figures, INCENTIVE_COLUMNS)
              for label, figures in found]
    return "\n".join(lines)


def write_json(path: str | Path, runs: list[dict[str, Any]], ns: argparse.Namespace) -> None:
    params = {k: v for k, v in vars(ns).items() if k not in ("func", "swf_stats")}
    if params.get("expand_limit") == math.inf:
        params["expand_limit"] = "unbounded"
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
