"""A cost per reconfiguration for ``benchmarks.elastisim_policies`` (issue 56), and the
report that sets runs at several costs side by side.

The Kassel application model (``application_model.json`` of their generator) has
no reconfiguration cost: a job resized goes on at once on its new nodes. ElastiSim
runs a workload's ``on_reconfiguration`` phase on a job's new node set, behind a
barrier, every time the job is reconfigured (``Application::operator()``), so the
phase added here is paid by every reconfiguration ElastiSim carries out, on every
node of the job, and nowhere else (rigid jobs never run it).

The phase is one ``cpu`` task, "Redistribute", of ``SECONDS`` of the job's state
moved and re-partitioned:

* a data redistribution: an ``ALL_TO_ALL`` communication among the job's new nodes
  of ``SECONDS * B * num_nodes`` bytes in all (``B`` the bytes per second of a
  node's link in the platform file: 100 Gbit/s in the Kassel crossbar), so each
  node sends and receives ``SECONDS * B`` bytes (ElastiSim splits an all-to-all's
  bytes over the ``n (n - 1)`` pairs): ``SECONDS`` on its link, whatever the
  number of nodes;
* overlapped with ``SECONDS * speed`` flops on each node (``UNIFORM``; ElastiSim
  runs a cpu task's flops and its bytes at once when they are not ``coupled``):
  the unpacking and re-partitioning, and the cost of a job reconfigured to one
  node, which has no one to exchange data with (ElastiSim's all-to-all of one node
  moves nothing).

Why this form: what a malleable MPI program pays to change its node set is
mostly moving its distributed data to the new layout (and rebuilding its
communicators and partitions); a data redistribution on the platform's links is
the part of that ElastiSim can simulate, and it shows in ElastiSim's
``network_activity.csv``. A pure delay (an ``idle`` task) would cost the same time
but says nothing about what the nodes do; a redistribution through the parallel
file system (``pfs_write`` then ``pfs_read``, a checkpoint-restart) couples every
job that reconfigures at once through the shared PFS links, so its cost would not
be ``SECONDS``. Neither flops nor bytes are scaled with the job's work: the Kassel
jobs carry no memory footprint, so the cost is the same for every job; it is a
parameter of the study, not a measurement.

``python -m benchmarks._elastisim_reconfig REPORT.json ... [--json FILE] [--md FILE]``
sets the reports of ``elastisim_policies --reconfiguration-cost C --json REPORT``
side by side: per cost and malleable share, each algorithm's mean turnaround as a
share of the original rigid EASY's (mean over the seeds), its reconfigurations,
and the exchange rates of ``sharing`` against minAgree (``malleable``) and against
the best original.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["link_bandwidth", "reconfiguration_phase", "add_reconfiguration_cost", "combine",
           "markdown", "main"]

BASE = "K:rigid_easy_backfill"
ORIGINAL = "K:"
OURS = "sharing"
AGAINST = "malleable"  # minAgree

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


def link_bandwidth(platform: Path) -> float:
    """Bytes per second of a compute node's link: the ``bw`` of the platform's
    ``<cluster>`` (SimGrid units: ``100Gbps`` is bits, ``12.5GBps`` bytes)."""
    found = re.findall(r'<cluster\b[^>]*\bbw="([0-9.eE+-]+)\s*([kKmMgGtTpP]?i?)([bB])ps"',
                       platform.read_text())
    if not found:
        raise ValueError(f"no cluster bandwidth in {platform}")
    value, prefix, unit = found[0]
    scale = _UNITS[prefix.lower()]
    return float(value) * scale / (8 if unit == "b" else 1)


def reconfiguration_phase(seconds: float, speed: float, bandwidth: float) -> dict[str, Any]:
    """ElastiSim's ``on_reconfiguration`` phase of about ``seconds`` (module doc)."""
    return {"tasks": [{
        "type": "cpu", "name": "Redistribute",
        "flops": seconds * speed, "computation_pattern": "UNIFORM",
        "bytes": f"{seconds * bandwidth!r}*num_nodes", "communication_pattern": "ALL_TO_ALL"}]}


def add_reconfiguration_cost(folder: Path, seconds: float, speed: float) -> dict[str, Any] | None:
    """Give the application model of the generated set in ``folder`` an
    ``on_reconfiguration`` phase of about ``seconds``; the phase, or None for 0."""
    if seconds <= 0:
        return None
    phase = reconfiguration_phase(seconds, speed, link_bandwidth(folder / "crossbar.xml"))
    model_file = folder / "application_model.json"
    model = json.loads(model_file.read_text())
    model["on_reconfiguration"] = phase
    model_file.write_text(json.dumps(model, indent=4) + "\n")
    return phase


# -- several costs side by side -------------------------------------------------------------

def _ok(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["algorithm"]: r for r in s["results"] if r["status"] == "ok"}


def _totals(report: dict[str, Any], name: str, share: int | None) -> tuple[float, int, int] | None:
    """Total turnaround (sum over jobs and sets), reconfigurations and sets of ``name``
    on the sets of ``share`` (None: all) where every algorithm finished; None if it
    did not run on one of them."""
    turnaround, reconfs, sets = 0.0, 0, 0
    for s in report["sets"]:
        if share is not None and s["malleable"] != share:
            continue
        by = _ok(s)
        if name not in by:
            return None
        turnaround += by[name]["mean_turnaround"] * by[name]["jobs"]
        reconfs += by[name]["reconfigurations"]
        sets += 1
    return (turnaround, reconfs, sets) if sets else None


def _rate(ours: tuple[float, int, int], other: tuple[float, int, int]) -> dict[str, Any]:
    saved, extra = other[0] - ours[0], ours[1] - other[1]
    rate = saved / extra if extra > 0 else None
    verdict = ("fewer or as many reconfigurations and less turnaround" if extra <= 0 and saved >= 0
               else "more reconfigurations and more turnaround" if extra > 0 and saved < 0
               else "fewer reconfigurations, more turnaround" if extra <= 0
               else "more reconfigurations, less turnaround")
    return {"turnaround_saved": saved, "extra_reconfigurations": extra,
            "seconds_saved_per_extra_reconfiguration": rate, "verdict": verdict}


def _exchange(report: dict[str, Any], share: int | None, names: list[str]) -> dict[str, Any]:
    ours = _totals(report, OURS, share)
    out: dict[str, Any] = {}
    if ours is None:
        return out
    against = _totals(report, AGAINST, share)
    if against is not None:
        out[AGAINST] = _rate(ours, against)
    originals = {n: t for n in names if n.startswith(ORIGINAL) and (t := _totals(report, n, share))}
    if originals:
        best = min(originals, key=lambda n: originals[n][0])
        out["best_original"] = {"algorithm": best} | _rate(ours, originals[best])
    return out


def combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The reports (one per cost) side by side: per cost, share and algorithm the
    mean turnaround relative to the original rigid EASY (mean over seeds), the
    reconfigurations and orders (sums over seeds), and the exchange rates."""
    costs = []
    for report in sorted(reports, key=lambda r: r["settings"].get("reconfiguration_cost", 0)):
        names = list(dict.fromkeys(r["algorithm"] for s in report["sets"] for r in s["results"]))
        shares = sorted({s["malleable"] for s in report["sets"]})
        rows: dict[str, Any] = {}
        for name in names:
            rows[name] = {}
            for m in shares:
                ratios, reconfs, orders, runs = [], 0, 0, 0
                for s in report["sets"]:
                    by = _ok(s)
                    if s["malleable"] != m or name not in by:
                        continue
                    runs += 1
                    reconfs += by[name]["reconfigurations"]
                    orders += by[name]["orders"]
                    if BASE in by and by[BASE]["mean_turnaround"]:
                        ratios.append(by[name]["mean_turnaround"] / by[BASE]["mean_turnaround"])
                rows[name][str(m)] = {
                    "turnaround_ratio": sum(ratios) / len(ratios) if ratios else None,
                    "reconfigurations": reconfs if runs else None, "orders": orders if runs else None,
                    "runs": runs}
        costs.append({
            "reconfiguration_cost": report["settings"].get("reconfiguration_cost", 0),
            "phase": report["settings"].get("reconfiguration_phase"),
            "command": report.get("command"), "shares": shares, "algorithms": rows,
            "exchange": {"all": _exchange(report, None, names)}
                        | {str(m): _exchange(report, m, names) for m in shares},
            "failed": [f"{r['algorithm']} on {s['name']}" for s in report["sets"]
                       for r in s["results"] if r["status"] != "ok"]})
    return {"base": BASE, "ours": OURS, "against": AGAINST, "costs": costs,
            "reports": sorted(reports, key=lambda r: r["settings"].get("reconfiguration_cost", 0))}


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def _rate_text(x: dict[str, Any]) -> str:
    rate = x["seconds_saved_per_extra_reconfiguration"]
    return (f"{_num(x['turnaround_saved'], 0)} s saved, {x['extra_reconfigurations']:+d} "
            f"reconfigurations: " + (f"**{_num(rate, 0)} s per extra reconfiguration**"
                                     if rate is not None else f"**{x['verdict']}**"))


def markdown(combined: dict[str, Any]) -> str:
    """A table per cost, then the exchange rates."""
    out = ["# ElastiSim: reconfiguration costs (issue 56)", "",
           "Written by `python -m benchmarks._elastisim_reconfig` from "
           "`python -m benchmarks.elastisim_policies --reconfiguration-cost C` at each cost C; "
           "every run is in `elastisim_reconfiguration.json`. Each cell: mean turnaround as a share "
           f"of the original rigid EASY's ({BASE}) on the same set, mean over the seeds / "
           "reconfigurations ElastiSim carried out, summed over the seeds. The cost is an "
           "`on_reconfiguration` phase added to the Kassel application model: a data "
           "redistribution (all-to-all, C seconds of each node's link) overlapped with C seconds "
           "of computation on each node (see `benchmarks/_elastisim_reconfig.py`).", ""]
    for cost in combined["costs"]:
        shares = cost["shares"]
        out += [f"## {cost['reconfiguration_cost']:g} s per reconfiguration", "",
                f"`{cost['command']}`", "",
                "| algorithm | " + " | ".join(f"{m}% malleable" for m in shares) + " |",
                "| --- |" + " ---: |" * len(shares)]
        for name, cells in cost["algorithms"].items():
            out.append(f"| {name} | " + " | ".join(
                f"{_num(c['turnaround_ratio'])} / {c['reconfigurations']}"
                if c["runs"] else "-" for c in (cells[str(m)] for m in shares)) + " |")
        out += ["", f"Exchange rate of {OURS}: seconds of total turnaround (sum over the jobs "
                "and seeds) saved per extra reconfiguration", "",
                f"| malleable share | against minAgree ({AGAINST}) | against the best original |",
                "| --- | --- | --- |"]
        for key in [str(m) for m in shares] + ["all"]:
            x = cost["exchange"].get(key, {})
            best = x.get("best_original")
            out.append(f"| {key + '%' if key != 'all' else 'all sets'} | "
                       f"{_rate_text(x[AGAINST]) if AGAINST in x else '-'} | "
                       f"{best['algorithm'] + ': ' + _rate_text(best) if best else '-'} |")
        if cost["failed"]:
            out += ["", "Runs that did not finish: " + ", ".join(cost["failed"])]
        out.append("")
    out += ["## Across the costs (all nine sets)", "",
            f"| cost per reconfiguration | {OURS} vs {AGAINST}: turnaround saved / extra "
            "reconfigurations | seconds saved per extra reconfiguration | against the best original |",
            "| ---: | ---: | ---: | --- |"]
    for cost in combined["costs"]:
        x = cost["exchange"].get("all", {})
        m, best = x.get(AGAINST), x.get("best_original")
        out.append(f"| {cost['reconfiguration_cost']:g} s | "
                   + (f"{_num(m['turnaround_saved'], 0)} s / {m['extra_reconfigurations']:+d} | "
                      f"{_num(m['seconds_saved_per_extra_reconfiguration'], 0)} | " if m else "- | - | ")
                   + (f"{best['algorithm']}: {_rate_text(best)}" if best else "-") + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._elastisim_reconfig",
                                description="set elastisim_policies reports at several "
                                            "reconfiguration costs side by side")
    p.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    p.add_argument("--json", type=Path, default=None, metavar="FILE")
    p.add_argument("--md", type=Path, default=None, metavar="FILE")
    ns = p.parse_args(argv)
    combined = combine([json.loads(f.read_text()) for f in ns.reports])
    text = markdown(combined)
    print(text)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(combined, indent=2, default=str) + "\n")
    if ns.md:
        ns.md.parent.mkdir(parents=True, exist_ok=True)
        ns.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
