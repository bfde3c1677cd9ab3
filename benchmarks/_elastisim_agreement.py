"""How ``benchmarks.elastisim_compare`` holds our simulator's runs against
ElastiSim's: relative differences, run times per job, the ranking of policies
(Kendall's tau-b), and the tables it prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from apgas_scheduler._model import Decision, Grow, Shrink, Start
from apgas_scheduler.sim.elastisim_jobs import JobSet

__all__ = ["TOLERANCE", "RIGID_EASY", "KASSEL_EASY", "KASSEL_EASY_OURS", "KASSEL_ORIGINALS",
           "relative", "runtime_check", "same_starts", "kendall_tau", "discordant", "best", "held_at_scheduling_points", "compare_set", "counterpart", "table", "checks_text", "markdown"]

TOLERANCE = 0.02
"""Largest relative difference of mean turnaround between the simulators for the
same rigid algorithm."""

RIGID_EASY = "easy"
KASSEL_EASY = "rigid_easy_backfill"
KASSEL_EASY_OURS = "kassel-easy*"
KASSEL_ORIGINALS = {f"{ours}-{handover}": f"{theirs}_{handover.replace('-', '_')}"
                    for ours, theirs in (("min", "min"), ("avg", "average"), ("pref", "pref"))
                    for handover in ("agreement", "common-pool", "steal-agreement")}
"""Our names of the nine Kassel strategies -> their scripts in ``scheduling_algorithms/``."""


def relative(a: float | None, b: float | None) -> float | None:
    """(a - b) / b, None when undefined."""
    if a is None or b is None or b == 0:
        return None
    return (a - b) / b


def _printed(x: float) -> float:
    """Half a unit in the last place of ``x`` as ElastiSim prints it (an ostream's six
    significant digits)."""
    return 0.5 * 10 ** (math.floor(math.log10(abs(x))) - 5) if x else 0.0


def runtime_check(jobset: JobSet, run: dict[str, Any], every_class: bool) -> dict[str, Any]:
    """Each job's start-to-end time in ``run`` (an ElastiSim run that never
    resizes: the Kassel EASY starts every job at its preferred size) against our
    run time at that size; only the rigid jobs unless ``every_class``. A job
    agrees when the difference is within what the CSV's rounding allows."""
    worst, which, checked, bad = 0.0, None, 0, []
    for job in jobset.jobs:
        if (job.cls != "rigid" and not every_class) or job.id not in run["jobs"]:
            continue
        start, end = run["jobs"][job.id]
        checked += 1
        error = abs((end - start) - job.runtime)
        if error > _printed(start) + _printed(end) + 1e-9 * job.runtime:
            bad.append(job.id)
        if error / job.runtime > worst:
            worst, which = error / job.runtime, job.id
    return {"checked": checked, "max_relative_error": worst, "job": which, "outside_rounding": bad,
            "ok": checked > 0 and not bad}


def held_at_scheduling_points(jobset: JobSet, decisions: Sequence[tuple[float, Decision]],
                              makespan: float | None) -> dict[str, float] | None:
    """What ElastiSim's scheduling points would cost our run's resizes: ElastiSim
    applies a resize at the end of the job's current iteration, half an iteration
    at the old size later on average, and the nodes moved sit idle until then
    (a grow's reserved, a shrink's still held). ``mean_delay``: that half
    iteration, averaged over the resizes; ``held_share``: the node-seconds idle so,
    over the nodes times the makespan; ``never``: our resizes of jobs of one
    iteration, which ElastiSim never carries out (left out of the other two).
    None without resizes."""
    size: dict[int, int] = {}
    delays, held, never = [], 0.0, 0
    for _, d in decisions:
        if isinstance(d, Start):
            size[d.job] = d.nodes
        elif isinstance(d, Grow | Shrink) and d.job in size:
            old = size[d.job]
            size[d.job] = old + d.nodes if isinstance(d, Grow) else old - d.nodes
            if jobset.iterations[d.job] <= 1:
                never += 1
                continue
            half = jobset.runtime_on(d.job, old) / jobset.iterations[d.job] / 2
            delays.append(half)
            held += d.nodes * half
    if not (delays or never) or not makespan:
        return None
    return {"mean_delay": sum(delays) / len(delays) if delays else 0.0,
            "held_share": held / (jobset.nodes * makespan), "never": never}


def same_starts(ours: dict[str, Any], theirs: dict[str, Any], within: float = 1.0) -> float:
    """The share of jobs that start within ``within`` seconds in both runs."""
    ids = [j for j in ours["jobs"] if j in theirs["jobs"] and ours["jobs"][j][0] is not None]
    if not ids:
        return 0.0
    same = sum(1 for j in ids if abs(ours["jobs"][j][0] - theirs["jobs"][j][0]) <= within)
    return same / len(ids)


TIE = 1e-3
"""Mean turnarounds closer than this (relative) rank as a tie."""


def _sign(a: float, b: float) -> int:
    if abs(a - b) <= TIE * max(abs(a), abs(b)):
        return 0
    return 1 if a > b else -1


def kendall_tau(first: dict[str, float], second: dict[str, float]) -> float | None:
    """Kendall's tau-b between two scorings of the same names (1: the same order,
    -1: reversed), with :data:`TIE` for ties; None when undefined."""
    names = [n for n in first if n in second]
    concordant = discordant = tied_first = tied_second = pairs = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs += 1
            x, y = _sign(first[a], first[b]), _sign(second[a], second[b])
            tied_first += x == 0
            tied_second += y == 0
            concordant += x * y > 0
            discordant += x * y < 0
    denominator = math.sqrt((pairs - tied_first) * (pairs - tied_second))
    return (concordant - discordant) / denominator if denominator else None


def discordant(first: dict[str, float], second: dict[str, float]) -> list[dict[str, Any]]:
    """The pairs that the two scorings order oppositely, each with its gaps: (b - a) / a
    in each scoring, ``a`` the first's better."""
    names = [n for n in first if n in second]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _sign(first[a], first[b]) * _sign(second[a], second[b]) < 0:
                x, y = (a, b) if first[a] < first[b] else (b, a)
                out.append({"pair": [x, y], "gap_ours": relative(first[y], first[x]),
                            "gap_elastisim": relative(second[y], second[x])})
    return out


def best(scores: dict[str, float]) -> list[str]:
    """The names with the least score (ties included)."""
    low = min(scores.values())
    return sorted(n for n, v in scores.items() if _sign(v, low) == 0)


def compare_set(ours: list[dict[str, Any]], theirs: list[dict[str, Any]],
                jobset: JobSet, malleable: Sequence[str]) -> dict[str, Any]:
    """The checks of one set (see the module docstring)."""
    mine = {r["policy"]: r for r in ours}
    es = {(r["policy"], r["label"].endswith("(Kassel)")): r for r in theirs}
    checks: dict[str, Any] = {}
    pairs = {"easy": (RIGID_EASY, (RIGID_EASY, False)),
             "kassel_easy": (KASSEL_EASY_OURS, (KASSEL_EASY, True))}
    for key, (ours_name, theirs_key) in pairs.items():
        if ours_name in mine and theirs_key in es:
            a, b = mine[ours_name], es[theirs_key]
            diff = relative(b["metrics"]["mean_turnaround"], a["metrics"]["mean_turnaround"])
            checks[key] = {"ours": ours_name, "elastisim": b["label"], "turnaround_difference": diff,
                           "same_starts": same_starts(a, b),
                           "ok": diff is not None and abs(diff) <= TOLERANCE}
    if RIGID_EASY in mine and (KASSEL_EASY, True) in es:
        checks["easy_vs_kassel"] = {
            "turnaround_difference": relative(es[(KASSEL_EASY, True)]["metrics"]["mean_turnaround"],
                                              mine[RIGID_EASY]["metrics"]["mean_turnaround"]),
            "expected": "no agreement: the Kassel strategy never backfills (module docstring)"}
    if (KASSEL_EASY, True) in es:
        checks["runtimes"] = runtime_check(jobset, es[(KASSEL_EASY, True)], True)
    elif (RIGID_EASY, False) in es:
        checks["runtimes"] = runtime_check(jobset, es[(RIGID_EASY, False)], False)
    originals = {p: {"ours": mine[p]["metrics"]["mean_turnaround"],
                     "bridge": es[(p, False)]["metrics"]["mean_turnaround"] if (p, False) in es else None,
                     "original": es[(KASSEL_ORIGINALS[p], True)]["metrics"]["mean_turnaround"]}
                 for p in malleable if p in mine and (KASSEL_ORIGINALS.get(p), True) in es}
    if originals:
        checks["kassel_originals"] = originals
    names = [p for p in malleable if p in mine and (p, False) in es
             and mine[p]["metrics"]["mean_turnaround"] is not None
             and es[(p, False)]["metrics"]["mean_turnaround"] is not None]
    if len(names) >= 2:
        first = {p: mine[p]["metrics"]["mean_turnaround"] for p in names}
        second = {p: es[(p, False)]["metrics"]["mean_turnaround"] for p in names}
        checks["ranking"] = {"ours": sorted(names, key=first.__getitem__),
                             "elastisim": sorted(names, key=second.__getitem__),
                             "kendall_tau": kendall_tau(first, second),
                             "discordant": discordant(first, second),
                             "best_ours": best(first), "best_elastisim": best(second),
                             "same_best": bool(set(best(first)) & set(best(second)))}
    return checks


# -- output ------------------------------------------------------------------------------------

def counterpart(run: dict[str, Any]) -> str:
    """The name of our run of the algorithm that ``run`` ran."""
    if run["simulator"] == "ours" or not run["label"].endswith("(Kassel)"):
        return str(run["policy"])
    if run["policy"] == KASSEL_EASY:
        return KASSEL_EASY_OURS
    return next((ours for ours, theirs in KASSEL_ORIGINALS.items() if theirs == run["policy"]),
                str(run["policy"]))


def _hours(value: float | None) -> str:
    return f"{value / 3600:>10.3f}" if value is not None else f"{'-':>10}"


def table(name: str, info: dict[str, Any], runs: Sequence[dict[str, Any]]) -> str:
    mine = {r["policy"]: r for r in runs if r["simulator"] == "ours"}
    classes = ", ".join(f"{n} {c}" for c, n in info["classes"].items())
    lines = [f"{name}: {info['jobs']} jobs ({classes}), {info['nodes']} nodes of "
             f"{info['node_speed']:g} flop/s"
             + (f", offered load {info['offered_load']:.2f}" if info["offered_load"] else ""),
             f"{'simulator':<10}{'policy':<34}{'turnaround h':>13}{'wait h':>10}{'makespan h':>12}"
             f"{'resizes':>9}{'vs ours':>9}"]
    for r in runs:
        m = r["metrics"]
        label = r.get("label", r["policy"])
        base = mine.get(counterpart(r))
        diff = relative(m["mean_turnaround"], base["metrics"]["mean_turnaround"]) \
            if r["simulator"] != "ours" and base else None
        lines.append(f"{r['simulator']:<10}{label:<34}{_hours(m['mean_turnaround']):>13}"
                     f"{_hours(m['mean_wait'])}{_hours(m['makespan']):>12}{m['resizes']:>9}"
                     + (f"{diff:>+9.1%}" if diff is not None else f"{'':>9}"))
    return "\n".join(lines)


def checks_text(checks: dict[str, Any]) -> str:
    lines = []
    rt = checks.get("runtimes")
    if rt:
        lines.append(f"  run times of {rt['checked']} jobs against ElastiSim's: largest difference "
                     f"{rt['max_relative_error']:.1e} (job {rt['job']}), "
                     f"{len(rt['outside_rounding'])} beyond the CSV's rounding -> "
                     f"{'agree' if rt['ok'] else 'DISAGREE'}")
    for key in ("easy", "kassel_easy"):
        c = checks.get(key)
        if c:
            lines.append(f"  {c['ours']} (ours) vs {c['elastisim']}: mean turnaround "
                         f"{c['turnaround_difference']:+.2%}, same start (1 s) for "
                         f"{c['same_starts']:.0%} of the jobs -> "
                         f"{'agree' if c['ok'] else 'DISAGREE'} (tolerance {TOLERANCE:.0%})")
    c = checks.get("easy_vs_kassel")
    if c and c["turnaround_difference"] is not None:
        lines.append(f"  easy (ours) vs {KASSEL_EASY} (Kassel): {c['turnaround_difference']:+.1%}; "
                     "theirs never backfills")
    for p, t in checks.get("kassel_originals", {}).items():
        bridge = "-" if t["bridge"] is None else f"{t['bridge'] / 3600:.3f} h"
        lines.append(f"  {p}: ours {t['ours'] / 3600:.3f} h, in ElastiSim {bridge}, the Kassel "
                     f"script {KASSEL_ORIGINALS[p]} in ElastiSim {t['original'] / 3600:.3f} h")
    c = checks.get("ranking")
    if c:
        lines.append(f"  ranking by mean turnaround, ours:      {', '.join(c['ours'])}")
        lines.append(f"  ranking by mean turnaround, ElastiSim: {', '.join(c['elastisim'])}")
        tau = "undefined" if c["kendall_tau"] is None else f"{c['kendall_tau']:+.2f}"
        lines.append(f"  Kendall's tau-b {tau} (ties within {TIE:.1%}); best: ours "
                     f"{', '.join(c['best_ours'])}, ElastiSim {', '.join(c['best_elastisim'])}")
        for d in c.get("discordant", []):
            lines.append(f"  swapped: {d['pair'][0]} ahead of {d['pair'][1]} by "
                         f"{d['gap_ours']:.2%} in ours, behind by {-d['gap_elastisim']:.2%} in ElastiSim")
    return "\n".join(lines)


# -- the run -----------------------------------------------------------------------------------


# -- the Markdown of docs/results --------------------------------------------------------------

def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:+.{digits}%}"


def markdown(report: dict[str, Any], command: str) -> str:
    """The tables of a report (the JSON that ``--json`` writes): one line per set,
    then per set each algorithm in both simulators."""
    sets = report["sets"]
    params = report["parameters"]
    runs = [q.get("command") for q in (params if isinstance(params, list) else [])]
    lines = ["# Our simulator against ElastiSim", "",
             *(f"Run: `{c}`" + "  " for c in runs if c), "Written by `" + command + "`.", "",
             f"Tolerance for rigid EASY: {report['tolerance']:.0%} of mean turnaround; "
             f"mean turnarounds within {report['tie']:.1%} rank as a tie.", "",
             "| set | jobs | run times (Kassel EASY) | easy vs easy (bridge) | same starts "
             "| kassel-easy\\* vs rigid_easy_backfill | same starts | Kendall's tau-b "
             "| swapped pairs (widest gap, ours / ElastiSim) | best: ours / ElastiSim |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in sets:
        c = s["checks"]
        rt, ez, ke, rk = (c.get(k) or {} for k in ("runtimes", "easy", "kassel_easy", "ranking"))
        runtimes = (f"{rt['checked']} jobs, max {rt['max_relative_error']:.1e}, "
                    f"{'agree' if rt['ok'] else 'DISAGREE'}") if rt else "-"
        tau = rk.get("kendall_tau")
        best_of = (f"{', '.join(rk['best_ours'])} / {', '.join(rk['best_elastisim'])}"
                   if rk else "-")
        swaps = rk.get("discordant", [])
        wide = max(swaps, key=lambda d: max(abs(d["gap_ours"]), abs(d["gap_elastisim"])),
                   default=None)
        swapped = (f"{len(swaps)} ({wide['gap_ours']:.2%} / {-wide['gap_elastisim']:.2%})"
                   if wide else ("0" if rk else "-"))
        same = {k: (f"{x['same_starts']:.0%}" if x else "-") for k, x in (("e", ez), ("k", ke))}
        lines.append(f"| {s['name']} | {s['jobs']} | {runtimes} "
                     f"| {_pct(ez.get('turnaround_difference'))} | {same['e']} "
                     f"| {_pct(ke.get('turnaround_difference'))} | {same['k']} "
                     f"| {'-' if tau is None else f'{tau:+.2f}'} | {swapped} | {best_of} |")
    for s in sets:
        lines += ["", f"## {s['name']}", "",
                  f"{s['jobs']} jobs ({', '.join(f'{n} {c}' for c, n in s['classes'].items())}) "
                  f"on {s['nodes']} nodes"
                  + (f", offered load {s['offered_load']:.2f}" if s.get("offered_load") else "")
                  + ". Mean turnaround and wait in hours; *resizes*: ours carried out / "
                  "ElastiSim's carried out (orders sent); *idle at scheduling points*: the "
                  "node-seconds our resizes would leave idle in ElastiSim, waiting half an "
                  "iteration at the old size (mean wait in brackets; *never*: resizes of jobs of "
                  "one iteration, which ElastiSim never carries out), over nodes x makespan.", "",
                  "| algorithm | turnaround ours | ElastiSim | difference | wait ours | ElastiSim "
                  "| resizes | idle at scheduling points | rank ours | rank ElastiSim |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        long_fixed = [f"job {x['job']} ({x['runtime']:.0f} s)" for x in s.get("never_resized", [])
                      if x["runtime"] >= 600]
        if long_fixed:
            lines[-4] += (" Malleable with one iteration, so never resized in ElastiSim: "
                          + ", ".join(long_fixed) + ".")
        lines[-4] += "".join(f" {note}." for note in s.get("recomputed", []))
        mine = {r["policy"]: r for r in s["runs"] if r["simulator"] == "ours"}
        theirs = {counterpart(r): r for r in s["runs"] if r["simulator"] != "ours"}
        rk = s["checks"].get("ranking") or {}
        for name, r in mine.items():
            e = theirs.get(name)
            m, em = r["metrics"], (e["metrics"] if e else None)
            label = f"{name} / {e['label']}" if e else name
            label = label.replace("*", "\\*")
            resizes = f"{m['resizes']} / {em['resizes']} ({em['orders']})" if em else f"{m['resizes']}"
            held = m.get("held_at_scheduling_points")
            resizes += (f" | {held['held_share']:.1%} ({held['mean_delay']:.0f} s"
                        + (f"; {held['never']} never" if held.get("never") else "") + ")"
                        if held else " | -")
            rank = (f"{rk['ours'].index(name) + 1} | {rk['elastisim'].index(name) + 1}"
                    if name in rk.get("ours", []) else "- | -")
            lines.append(f"| {label} | {_hours(m['mean_turnaround']).strip()} "
                         f"| {_hours(em['mean_turnaround']).strip() if em else '-'} "
                         f"| {_pct(relative(em['mean_turnaround'], m['mean_turnaround'])) if em else '-'} "
                         f"| {_hours(m['mean_wait']).strip()} "
                         f"| {_hours(em['mean_wait']).strip() if em else '-'} | {resizes} | {rank} |")
    return "\n".join(lines) + "\n"
