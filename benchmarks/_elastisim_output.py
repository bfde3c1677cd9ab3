"""What ``benchmarks.elastisim_policies`` reads from ElastiSim's output (the platform's
node speed, the reconfigurations it carried out) and the tables it prints."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["node_speed", "reconfigurations", "table", "summary", "mean", "tail"]


def mean(values: Iterator[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else math.nan


def tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


def node_speed(platform: Path) -> float:
    """The compute nodes' flop/s in a SimGrid platform file of the Kassel inputs."""
    found = re.findall(r'<cluster\b[^>]*\bspeed="([0-9.eE+-]+)f"', platform.read_text())
    if not found:
        raise ValueError(f"no cluster speed in {platform}")
    return float(found[0])


def reconfigurations(path: Path) -> int:
    """How many times a running job's node set changed, from ElastiSim's
    ``node_utilization.csv`` (``Time,Node,State,Running jobs,Expected jobs``: a row
    whenever a node's state changes). At each instant every job's set is the nodes
    that run it; a job's set that changes while it runs before and after (not its
    start, not its end) is one reconfiguration."""
    running: dict[str, set[str]] = {}  # node -> the jobs it runs
    held: dict[str, frozenset[str]] = {}  # job -> its nodes at the last instant
    count = 0

    def settle() -> None:
        nonlocal count
        now: dict[str, set[str]] = {}
        for node, jobs in running.items():
            for job in jobs:
                now.setdefault(job, set()).add(node)
        for job, nodes in now.items():
            before = held.get(job)
            if before and before != nodes:
                count += 1
            held[job] = frozenset(nodes)
        for job in [j for j in held if j not in now]:
            del held[job]

    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader, None)
        when = None
        for row in reader:
            if len(row) < 4:
                continue
            if row[0] != when and when is not None:
                settle()
            when = row[0]
            running[row[1]] = set() if row[3] == "none" else set(row[3].split(";"))
        settle()
    return count


# -- tables ---------------------------------------------------------------------------------

def _fmt(value: float | int | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def table(jobset: dict[str, Any], results: list[dict[str, Any]], nodes: int) -> str:
    """A Markdown table of one set's runs."""
    head = (f"{jobset['name']} ({jobset['jobs']} jobs, {jobset['malleable']}% malleable, "
            f"{nodes} nodes)\n\n")
    lines = ["| algorithm | mean turnaround (s) | mean wait (s) | makespan (s) | orders (grow+shrink) "
             "| reconfigurations | completed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['algorithm']} | {r['status']} | | | | | |")
            continue
        orders = (f"{r['orders']} ({r['grows']}+{r['shrinks']})" if r["orders"] is not None else "-")
        lines.append(f"| {r['algorithm']} | {_fmt(r['mean_turnaround'])} | {_fmt(r['mean_wait'])} | "
                     f"{_fmt(r['makespan'])} | {orders} | {_fmt(r['reconfigurations'])} | "
                     f"{r['completed']}/{r['jobs']} |")
    return head + "\n".join(lines)


def summary(report: dict[str, Any], base: str) -> str:
    """Per malleable share, each algorithm's mean turnaround over the seeds, as a
    share of ``base``'s (the Kassel original rigid EASY) on the same sets."""
    shares = sorted({s["malleable"] for s in report["sets"]})
    names = list(dict.fromkeys(r["algorithm"] for s in report["sets"] for r in s["results"]))
    lines = ["| algorithm | " + " | ".join(f"{m}% malleable" for m in shares) + " |",
             "| --- |" + " ---: |" * len(shares)]
    for name in names:
        cells = []
        for m in shares:
            ratios = []
            for s in report["sets"]:
                if s["malleable"] != m:
                    continue
                by = {r["algorithm"]: r for r in s["results"] if r["status"] == "ok"}
                if name in by and base in by and by[base]["mean_turnaround"]:
                    ratios.append(by[name]["mean_turnaround"] / by[base]["mean_turnaround"])
            cells.append(f"{mean(iter(ratios)):.2f}" if ratios else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    resizes = ["| algorithm | " + " | ".join(f"{m}% malleable" for m in shares) + " |",
               "| --- |" + " ---: |" * len(shares)]
    for name in names:
        cells = []
        for m in shares:
            runs = [r for s in report["sets"] if s["malleable"] == m for r in s["results"]
                    if r["algorithm"] == name and r["status"] == "ok"]
            cells.append(f"{sum(r['orders'] for r in runs)} / {sum(r['reconfigurations'] for r in runs)}"
                         if runs else "-")
        resizes.append(f"| {name} | " + " | ".join(cells) + " |")
    return ("Mean turnaround relative to the original rigid EASY (K:rigid_easy_backfill), "
            "mean over the seeds\n\n" + "\n".join(lines) +
            "\n\nResizes, summed over the seeds: orders sent / reconfigurations ElastiSim "
            "carried out\n\n" + "\n".join(resizes))
