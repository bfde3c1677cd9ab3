"""Our simulator against ElastiSim on the same job sets (issue 56, item 2).

    python -m benchmarks.elastisim_compare [--jobs DIR ...] [--json FILE]
        [--shares 0,20,50,100] [--seed S1] [--days 5] [--nodes 32]
        [--policies malleable,mebf,...] [--no-elastisim] [--timeout SECONDS]

**Job sets.** ``--jobs DIR`` names ElastiSim input folders (``configuration.json``,
``jobs.json``, ``application_model.json``, the platform XML). Without it the
Kassel group's generator (``MalleableJobScheduling/scripts/input_generation/
jsonGenerator.py``) makes one set per ``--shares`` entry into a scratch folder,
with the command line of their ``runSimulations.sh`` (``--type_probabilities
R,0,M``, flops 5e12..4e17, 1..16 nodes per job, parallel percentages 0.95..0.999,
the efficiency thresholds 0.95/0.8/0.5, 60 s per iteration, nodes of 1e12 flop/s)
for ``--days`` days on ``--nodes`` nodes: 5 days on 32 nodes give about 100 jobs.
The generator draws each job from the seed and its index, so the sets of one seed
hold the same jobs and differ in which are malleable (the 20% ones are among the
50% ones). The generator comes from the ElastiSim build's folder, else from the
tarball in ``../shared/elastisim``; ``--kassel DIR`` names another copy.

**Our side.** :mod:`apgas_scheduler.sim.elastisim_jobs` reads each set (run time
and Amdahl serial fraction from the application model, as ElastiSim computes
them; its module docstring says what maps to what). Our ``Simulator`` runs it on
the platform's nodes, ``model="amdahl"``, free resizes (``Reconfig()``, as the
Kassel model has no reconfiguration phase) and a decision every
``scheduling_interval`` seconds (ElastiSim's periodic invocation), with

* ``easy``: our rigid EASY backfilling;
* ``kassel-easy*``: the Kassel ``rigid_easy_backfill.py`` as it runs (below);
* ``--policies``: our malleable policies (on the sets with malleable jobs).

**ElastiSim's side** (when ``tests/_elastisim.py`` finds a build; ``--no-elastisim``
skips it): the same input in the real ElastiSim with the Kassel strategy
``rigid_easy_backfill.py`` (run from its folder with ``elastisim_python`` on the
path), and with each of our policies through ``apgas-scheduler elastisim``, the
bridge that lets our policies answer ElastiSim. Its ``job_statistics.csv`` gives
the same figures. Checked:

* **the run times**: each job's time from start to end in ElastiSim under the
  Kassel EASY (which starts every job at its preferred size and never resizes)
  against our run time, within the rounding of ElastiSim's CSV (six significant
  digits);
* **rigid EASY**: the mean turnaround of ``easy`` in both simulators, and of the
  Kassel strategy against ``kassel-easy*``, must agree within :data:`TOLERANCE`;
* **the malleable policies**: whether both simulators rank them alike by mean
  turnaround (Kendall's tau over the pairs).

**The Kassel EASY as it runs.** ``rigid_easy_backfill.py`` is not EASY. Its
``delays_head`` compares a time with ``get_estimated_runtime()``, which is flops
per node (about 1e16), so every job behind the head "delays" it; and the loop
removes the started head from the list it iterates over, so at most one job
starts per invocation. It is FCFS that starts the head when it fits, one job per
invocation (a submit, an end, a scheduling point, or the 60 s tick).
``kassel-easy*`` does that in our simulator, to tell the simulators apart from
the strategies; our ``easy`` backfills and is not expected to match it.

Resizes are those carried out: ours from the simulator, ElastiSim's from its
``node_utilization.csv`` (``elastisim_policies.reconfigurations``). The orders sent
are in the JSON (``orders``): a resize ordered in a job's last iteration is never
carried out.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from apgas_scheduler._model import Decision, JobView, Start
from apgas_scheduler.policies import Policy, get_policy
from apgas_scheduler.sim.compare import COSTED
from apgas_scheduler.sim.elastisim_jobs import ElastiSimInputError, JobSet, read_input
from apgas_scheduler.sim.simulator import Reconfig, Simulator
from apgas_scheduler.stats import JobTimes, summarize
from benchmarks.elastisim_policies import reconfigurations

log = logging.getLogger("benchmarks.elastisim_compare")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "elastisim"
HELPERS = ROOT / "tests" / "_elastisim.py"
KASSEL_TARBALL = "MalleableJobScheduling.tar.gz"

TOLERANCE = 0.02
"""Largest relative difference of mean turnaround between the simulators for the
same rigid algorithm."""

RIGID_EASY = "easy"
KASSEL_EASY = "rigid_easy_backfill"
KASSEL_EASY_OURS = "kassel-easy*"
DEFAULT_POLICIES = ("malleable", "mebf", "min-agreement", "min-common-pool", "avg-agreement",
                    "pref-agreement", "thrifty", "lending")
DEFAULT_SHARES = (0, 20, 50, 100)
KASSEL_ORIGINALS = {f"{ours}-{handover}": f"{theirs}_{handover.replace('-', '_')}"
                    for ours, theirs in (("min", "min"), ("avg", "average"), ("pref", "pref"))
                    for handover in ("agreement", "common-pool", "steal-agreement")}
"""Our names of the nine Kassel strategies -> their scripts in ``scheduling_algorithms/``."""

# The Kassel generator's options, as their runSimulations.sh passes them.
PARALLEL_PERCENTAGES = "0.999,0.995,0.99,0.985,0.98,0.975,0.97,0.965,0.96,0.955,0.95"
SCALING_FORMULA = "(1/((1-parallel_percentage)+parallel_percentage/num_nodes))"


class RunFailed(RuntimeError):
    """An ElastiSim run that did not end as it should; the message says how."""


# -- the Kassel EASY, as it runs ---------------------------------------------------------------

class KasselEasyAsRun(Policy):
    """``rigid_easy_backfill.py`` as it behaves: the head of the queue starts at its
    preferred size when it fits, and nothing else; one start per invocation (a
    second pass at the same instant starts nothing)."""

    name = KASSEL_EASY_OURS

    def __init__(self) -> None:
        super().__init__(0.0)
        self._started_at: float | None = None

    def decide(self, now: float, queue: Sequence[JobView], running: Sequence[JobView],
               free: int, total: int) -> list[Decision]:
        if not queue or now == self._started_at:
            return []
        head = queue[0]
        size = head.min_nodes if head.cls == "rigid" else head.pref
        if size > free:
            return []
        self._started_at = now
        return [Start(head.id, size)]


# -- job sets ----------------------------------------------------------------------------------

def kassel_folder(explicit: Path | None, helpers: ModuleType | None, scratch: Path) -> Path:
    """The MalleableJobScheduling folder: ``explicit``, the ElastiSim build's copy,
    or the shared tarball unpacked into ``scratch``."""
    if explicit is not None:
        return explicit
    if helpers is not None:
        folder, _ = helpers.find()
        if folder is not None and (folder / "MalleableJobScheduling").is_dir():
            return Path(folder) / "MalleableJobScheduling"
    tarball = SHARED / KASSEL_TARBALL
    if not tarball.is_file():
        raise FileNotFoundError(f"no Kassel generator: give --kassel DIR (no ElastiSim build, "
                                f"no {tarball})")
    with tarfile.open(tarball) as tar:
        tar.extractall(scratch, filter="data")
    return scratch / "MalleableJobScheduling"


def generator_command(kassel: Path, dest: Path, share: int, seed: str, days: float,
                      nodes: int) -> list[str]:
    """The Kassel generator's command for one job set (their runSimulations.sh)."""
    script = kassel / "scripts" / "input_generation" / "jsonGenerator.py"
    return [sys.executable, str(script), "-q", "-d", str(dest), "--seed", seed,
            "--total_time", str(round(days * 86400)),
            "--type_probabilities", f"{100 - share},0,{share}",
            "--flops_range", "5E12,4E17", "--node_range", f"1,{min(16, nodes)}",
            "--submit_range", "1", "--malleable_dividation_amount", "1000",
            "--dividation_split_time", "60", "--application_model", "data/input/application_model.json",
            "--parallel_percentage", PARALLEL_PERCENTAGES,
            "--min_node_efficiency_threshold", "0.95", "--pref_node_efficiency_threshold", "0.8",
            "--max_node_efficiency_threshold", "0.5", "--scaling_formula", SCALING_FORMULA,
            "--flops_per_cluster_node", "1E12", "--num_cluster_nodes", str(nodes)]


def generate(kassel: Path, dest: Path, share: int, seed: str, days: float, nodes: int) -> Path:
    """Run the Kassel generator into ``dest`` (made); returns ``dest``."""
    if not 0 <= share <= 100:
        raise ValueError(f"a malleable share is a percentage, not {share}")
    dest.mkdir(parents=True, exist_ok=True)
    command = generator_command(kassel, dest, share, seed, days, nodes)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          cwd=dest, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not (dest / "jobs.json").is_file():
        raise RuntimeError(f"the Kassel generator failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return dest


def describe(jobset: JobSet) -> dict[str, Any]:
    classes: dict[str, int] = {}
    for j in jobset.jobs:
        classes[j.cls] = classes.get(j.cls, 0) + 1
    malleable = [j for j in jobset.jobs if j.cls == "malleable"]
    # seconds between two scheduling points of a malleable job at its preferred size
    steps = [j.runtime / jobset.iterations[j.id] for j in malleable if jobset.iterations[j.id] > 1]
    # node-seconds asked per node-second over the submission window (when it is longer
    # than any job: else there is no load to speak of)
    span = max(j.submit for j in jobset.jobs) - min(j.submit for j in jobset.jobs)
    return {"jobs": len(jobset.jobs), "classes": classes, "nodes": jobset.nodes,
            "node_speed": jobset.node_speed, "scheduling_interval": jobset.scheduling_interval,
            "iteration_seconds": ({"mean": sum(steps) / len(steps), "max": max(steps)}
                                  if steps else None),
            "offered_load": (sum(j.area for j in jobset.jobs) / (jobset.nodes * span)
                             if span > max(j.runtime for j in jobset.jobs) else None),
            "notes": list(jobset.notes)}


# -- our simulator -----------------------------------------------------------------------------

def make_policy(name: str, resize_interval: float) -> Policy:
    if name == KASSEL_EASY_OURS:
        return KasselEasyAsRun()
    options: dict[str, Any] = {"resize_interval": resize_interval}
    if name in COSTED:
        options["reconfig_cost"] = Reconfig()
    return get_policy(name, **options)


def run_ours(jobset: JobSet, policy: str, resize_interval: float) -> dict[str, Any]:
    """One policy on the set in our simulator: metrics and per-job times."""
    started = time.perf_counter()
    sim = Simulator(jobset.nodes, make_policy(policy, resize_interval), reconfig=Reconfig(),
                    model="amdahl", interval=jobset.scheduling_interval or None)
    result = sim.run(jobset.jobs)
    m = result.metrics
    return {"simulator": "ours", "policy": policy,
            "metrics": {"jobs": m.get("jobs", 0), "makespan": m.get("makespan"),
                        "mean_wait": m.get("mean_wait"), "mean_turnaround": m.get("mean_turnaround"),
                        "mean_bounded_slowdown": m.get("mean_bounded_slowdown"),
                        "resizes": m.get("reconfigurations", 0)},
            "jobs": {jid: [r["start"], r["end"]] for jid, r in result.jobs.items()},
            "seconds": time.perf_counter() - started}


# -- ElastiSim ---------------------------------------------------------------------------------

def load_helpers() -> tuple[ModuleType | None, str]:
    """``tests/_elastisim.py`` (find, prepare_input, run_elastisim, run_strategy,
    stop), or None and why not."""
    if not HELPERS.is_file():
        return None, f"{HELPERS.relative_to(ROOT)} (the helpers that run ElastiSim) is missing"
    spec = importlib.util.spec_from_file_location("_elastisim_helpers", HELPERS)
    if spec is None or spec.loader is None:
        return None, f"{HELPERS} cannot be loaded"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, ""


def elastisim_status(helpers: ModuleType | None, reason: str) -> tuple[Path | None, str]:
    """The ElastiSim build folder, or None and why the ElastiSim runs are skipped."""
    if helpers is None:
        return None, reason
    folder, why = helpers.find()
    return (Path(folder), "") if folder is not None else (None, why)


def bridge_status() -> str:
    """Why our policies cannot run in ElastiSim ("" if they can): the bridge
    ``apgas-scheduler elastisim`` must be there."""
    if importlib.util.find_spec("apgas_scheduler.elastisim") is None:
        return "the bridge (apgas_scheduler/elastisim.py, `apgas-scheduler elastisim`) is missing"
    proc = subprocess.run([sys.executable, "-m", "apgas_scheduler", "elastisim", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          stdin=subprocess.DEVNULL, env=_env())
    if proc.returncode != 0:
        return "`apgas-scheduler elastisim` is not a subcommand yet (apgas_scheduler/__main__.py)"
    return ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def read_job_statistics(path: Path) -> dict[int, dict[str, Any]]:
    """ElastiSim's ``job_statistics.csv``: id -> submit, start, end, type, status."""
    out: dict[int, dict[str, Any]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            out[int(row["ID"])] = {"submit": float(row["Submit Time"]),
                                   "start": float(row["Start Time"]), "end": float(row["End Time"]),
                                   "type": row["Type"], "status": row["Status"]}
    return out


def _kassel_resizes(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, newline="", encoding="utf-8") as f:
        return sum(1 for row in csv.DictReader(f) if row.get("Event") in ("EXPAND", "SHRINK"))


def run_elastisim(helpers: ModuleType, folder: Path, input_dir: Path, work: Path, jobset: JobSet,
                  *, strategy: str | None = None, policy: str | None = None,
                  resize_interval: float = 10.0, timeout: float = 900.0) -> dict[str, Any]:
    """The set in the real ElastiSim, with the Kassel ``strategy`` or our ``policy``
    through the bridge; metrics and per-job times like :func:`run_ours`."""
    work.mkdir(parents=True)
    config = helpers.prepare_input(work, input_dir)
    settings = json.loads(config.read_text())
    started = time.perf_counter()
    sim = helpers.run_elastisim(folder / "build" / "elastisim", config)
    algorithm: subprocess.Popen[bytes] | None = None
    try:
        if strategy is not None:
            algorithm = helpers.run_strategy(folder, strategy, config)
        else:
            with open(work / "bridge.log", "wb") as out:
                algorithm = subprocess.Popen(
                    [sys.executable, "-m", "apgas_scheduler", "elastisim", "--policy", str(policy),
                     "--url", settings["zmq_url"], "--stats", str(work / "bridge.json"),
                     "--node-speed", repr(jobset.node_speed),
                     "--resize-interval", repr(resize_interval)],
                    cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            codes = sim.poll(), algorithm.poll()
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() > deadline:
                raise RunFailed(f"not done after {timeout:g} s")
            time.sleep(0.1)
    finally:
        for proc in (sim, algorithm):
            if proc is not None and proc.poll() is None:
                helpers.stop(proc)
    if sim.returncode != 0 or algorithm.returncode != 0:
        logs = sorted(work.glob("*.log"))
        tail = "; ".join(f"{p.name}: {p.read_text(errors='replace').strip()[-300:]}" for p in logs)
        raise RunFailed(f"ElastiSim exited {sim.returncode}, the algorithm {algorithm.returncode} "
                        f"({tail})")
    stats_file = Path(settings["job_statistics"])
    if not stats_file.is_file():
        raise RunFailed(f"ElastiSim wrote no {stats_file}")
    rows = read_job_statistics(stats_file)
    times = [JobTimes(r["submit"], r["start"], r["end"], cls=r["type"]) for r in rows.values()]
    summary = summarize(times)
    label = f"{strategy} (Kassel)" if strategy else f"{policy} (bridge)"
    if strategy:
        orders = _kassel_resizes(work / "output" / "event.csv")
        counts: dict[str, Any] = {}
    else:
        counts = json.loads((work / "bridge.json").read_text())
        orders = counts["decisions"]["grow"] + counts["decisions"]["shrink"]
    utilization = Path(settings["node_utilization"])
    resizes = reconfigurations(utilization) if utilization.is_file() else orders
    return {"simulator": "ElastiSim", "policy": strategy or policy, "label": label,
            "metrics": {"jobs": len(rows), "makespan": summary["makespan"],
                        "mean_wait": summary["mean_wait"],
                        "mean_turnaround": summary["mean_turnaround"],
                        "mean_bounded_slowdown": summary["mean_bounded_slowdown"],
                        "resizes": resizes, "orders": orders,
                        "killed": sum(1 for r in rows.values() if r["status"] != "completed")},
            "jobs": {jid: [r["start"], r["end"]] for jid, r in rows.items()},
            "bridge": counts, "seconds": time.perf_counter() - started}


# -- comparisons -------------------------------------------------------------------------------

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
    return "\n".join(lines)


# -- the run -----------------------------------------------------------------------------------

@contextlib.contextmanager
def _scratch(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="elastisim-compare-") as tmp:
        yield Path(tmp)


def compare_sets(sets: Sequence[tuple[str, Path]], ns: argparse.Namespace, work: Path,
                 helpers: ModuleType | None, folder: Path | None, skip: dict[str, str],
                 out: Any = None) -> list[dict[str, Any]]:
    out = out or sys.stdout
    results = []
    for name, input_dir in sets:
        jobset = read_input(input_dir)
        info = describe(jobset)
        has_malleable = any(j.cls == "malleable" for j in jobset.jobs)
        policies = [RIGID_EASY, KASSEL_EASY_OURS] + (list(ns.policies) if has_malleable else [])
        runs: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for p in policies:
            runs.append(run_ours(jobset, p, ns.resize_interval))
            if folder is None or helpers is None:
                continue
            slug = "".join(ch if ch.isalnum() else "-" for ch in f"{name}-{p}")
            todo: list[tuple[str, dict[str, Any]]] = []
            if p == KASSEL_EASY_OURS:
                todo.append((f"es-{slug}", {"strategy": KASSEL_EASY}))
            elif not skip.get("bridge"):
                todo.append((f"es-{slug}", {"policy": p, "resize_interval": ns.resize_interval}))
            if ns.kassel_originals and p in KASSEL_ORIGINALS:
                todo.append((f"kassel-{slug}", {"strategy": KASSEL_ORIGINALS[p]}))
            for where, options in todo:
                try:
                    run = run_elastisim(helpers, folder, input_dir, work / where, jobset,
                                        timeout=ns.timeout, **options)
                except RunFailed as e:
                    log.error("%s, %s in ElastiSim: %s", name, p, e)
                    skip["failed"] = skip.get("failed", "") + f"{name}/{p}: {e}\n"
                    continue
                theirs.append(run)
                runs.append(run)
        checks = compare_set([r for r in runs if r["simulator"] == "ours"], theirs, jobset,
                             ns.policies) if theirs else {}
        print(table(name, info, runs), file=out)
        if checks:
            print(checks_text(checks), file=out)
        for note in info["notes"][:3]:
            print(f"  note: {note}", file=out)
        if len(info["notes"]) > 3:
            print(f"  note: ... and {len(info['notes']) - 3} more (in the JSON)", file=out)
        print(file=out)
        results.append({"name": name, "input": str(input_dir), **info,
                        "runs": [{k: v for k, v in r.items() if k != "jobs"} for r in runs],
                        "checks": checks})
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.elastisim_compare",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=Path, action="append", default=None, metavar="DIR",
                   help="an ElastiSim input folder (again for more); default: generate sets")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the results here")
    p.add_argument("--shares", default=",".join(map(str, DEFAULT_SHARES)),
                   help="malleable percentages of the generated sets (default 0,20,50,100)")
    p.add_argument("--seed", default="S1", help="the generator's seed (a string, as theirs)")
    p.add_argument("--days", type=float, default=5.0, help="days of submissions to generate")
    p.add_argument("--nodes", type=int, default=32, help="nodes of the generated platform")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="our malleable policies to compare")
    p.add_argument("--resize-interval", type=float, default=10.0,
                   help="least seconds between two resizes of a job, in both simulators")
    p.add_argument("--no-elastisim", action="store_true", help="our simulator only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per ElastiSim run")
    p.add_argument("--kassel-originals", action="store_true",
                   help="also run the Kassel group's own scripts of the agreement strategies "
                        "among --policies in ElastiSim")
    p.add_argument("--kassel", type=Path, default=None, metavar="DIR",
                   help="a MalleableJobScheduling folder (for its generator)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="work here and keep the inputs and ElastiSim's outputs")
    ns = p.parse_args(argv)
    ns.policies = [x for x in ns.policies.split(",") if x]
    for name in ns.policies:
        make_policy(name, 10.0)  # an unknown name fails here, listing the known ones
    try:
        ns.shares = [int(x) for x in ns.shares.split(",") if x]
    except ValueError:
        p.error(f"--shares {ns.shares!r}: percentages separated by commas")
    if any(not 0 <= s <= 100 for s in ns.shares) or not ns.shares:
        p.error(f"--shares {ns.shares}: percentages from 0 to 100")
    if ns.days <= 0 or ns.nodes < 1 or ns.timeout <= 0 or ns.resize_interval < 0:
        p.error("need --days > 0, --nodes >= 1, --timeout > 0, --resize-interval >= 0")
    return ns


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that the runs' finally blocks stop ElastiSim


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, before)


def _main(argv: list[str] | None) -> int:
    try:
        ns = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    helpers, reason = load_helpers()
    folder, why = (None, "--no-elastisim") if ns.no_elastisim else elastisim_status(helpers, reason)
    skip: dict[str, str] = {}
    if folder is None:
        skip["elastisim"] = why
        print(f"ElastiSim runs skipped: {why}\n")
    else:
        bridge = bridge_status()
        if bridge:
            skip["bridge"] = bridge
            print(f"Our policies in ElastiSim skipped: {bridge}\n")
    with _scratch(ns.keep) as work:
        try:
            if ns.jobs:
                sets = [(d.name, d) for d in ns.jobs]
            else:
                kassel = kassel_folder(ns.kassel, helpers, work)
                sets = [(f"{s}% malleable, seed {ns.seed}",
                         generate(kassel, work / f"input-{s}", s, ns.seed, ns.days, ns.nodes))
                        for s in ns.shares]
            results = compare_sets(sets, ns, work, helpers, folder, skip)
        except (ElastiSimInputError, FileNotFoundError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if ns.json:
        report = {"parameters": {k: (str(v) if isinstance(v, Path) else
                                     [str(x) for x in v] if k == "jobs" and v else v)
                                 for k, v in vars(ns).items()},
                  "tolerance": TOLERANCE, "tie": TIE,
                  "skipped": skip, "sets": results}
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
