"""Our simulator against ElastiSim on the same job sets (issue 56, item 2).

    python -m benchmarks.elastisim_compare [--jobs DIR ...] [--json FILE] [--markdown FILE]
        [--shares 0,20,50,100] [--seed S1,S2] [--days 5] [--nodes 32]
        [--policies malleable,mebf,...] [--no-elastisim] [--timeout SECONDS]
    python -m benchmarks.elastisim_compare --merge FILE.json ... [--json FILE] [--markdown FILE]

**Job sets.** ``--jobs DIR`` names ElastiSim input folders (``configuration.json``,
``jobs.json``, ``application_model.json``, the platform XML). Without it the
Kassel group's generator (``MalleableJobScheduling/scripts/input_generation/
jsonGenerator.py``) makes one set per ``--seed`` and ``--shares`` entry into a scratch folder,
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

``--markdown`` writes the tables of ``docs/results/elastisim_compare.md``;
``--merge`` joins the JSON of earlier runs (one seed each, say) into one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
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
from benchmarks._elastisim_agreement import (
    KASSEL_EASY,
    KASSEL_EASY_OURS,
    KASSEL_ORIGINALS,
    RIGID_EASY,
    TIE,
    TOLERANCE,
    checks_text,
    compare_set,
    held_at_scheduling_points,
    markdown,
    table,
)
from benchmarks._elastisim_runs import (
    RunFailed,
    bridge_status,
    elastisim_status,
    load_helpers,
    run_elastisim,
)

log = logging.getLogger("benchmarks.elastisim_compare")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "elastisim"
KASSEL_TARBALL = "MalleableJobScheduling.tar.gz"

DEFAULT_POLICIES = ("malleable", "mebf", "min-agreement", "min-common-pool", "avg-agreement",
                    "pref-agreement", "thrifty", "lending")
DEFAULT_SHARES = (0, 20, 50, 100)
# The Kassel generator's options, as their runSimulations.sh passes them.
PARALLEL_PERCENTAGES = "0.999,0.995,0.99,0.985,0.98,0.975,0.97,0.965,0.96,0.955,0.95"
SCALING_FORMULA = "(1/((1-parallel_percentage)+parallel_percentage/num_nodes))"


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
                      nodes: int, split_time: float = 60.0, max_iterations: int = 1000) -> list[str]:
    """The Kassel generator's command for one job set (their runSimulations.sh;
    ``split_time`` and ``max_iterations``: the seconds of work per iteration of a
    malleable job at its preferred size and perfect scaling, and the most
    iterations, their ``dividation_split_time`` 60 and ``malleable_dividation_amount``
    1000)."""
    script = kassel / "scripts" / "input_generation" / "jsonGenerator.py"
    return [sys.executable, str(script), "-q", "-d", str(dest), "--seed", seed,
            "--total_time", str(round(days * 86400)),
            "--type_probabilities", f"{100 - share},0,{share}",
            "--flops_range", "5E12,4E17", "--node_range", f"1,{min(16, nodes)}",
            "--submit_range", "1", "--malleable_dividation_amount", str(max_iterations),
            "--dividation_split_time", repr(float(split_time)),
            "--application_model", "data/input/application_model.json",
            "--parallel_percentage", PARALLEL_PERCENTAGES,
            "--min_node_efficiency_threshold", "0.95", "--pref_node_efficiency_threshold", "0.8",
            "--max_node_efficiency_threshold", "0.5", "--scaling_formula", SCALING_FORMULA,
            "--flops_per_cluster_node", "1E12", "--num_cluster_nodes", str(nodes)]


def generate(kassel: Path, dest: Path, share: int, seed: str, days: float, nodes: int,
             split_time: float = 60.0, max_iterations: int = 1000) -> Path:
    """Run the Kassel generator into ``dest`` (made); returns ``dest``."""
    if not 0 <= share <= 100:
        raise ValueError(f"a malleable share is a percentage, not {share}")
    dest.mkdir(parents=True, exist_ok=True)
    command = generator_command(kassel, dest, share, seed, days, nodes, split_time, max_iterations)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          cwd=dest, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not (dest / "jobs.json").is_file():
        raise RuntimeError(f"the Kassel generator failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return dest


def repair_divide(input_dir: Path, split_time: float, max_iterations: int) -> list[int]:
    """Give every flexible job of a generated set the iterations (``divide``) that the
    Kassel generator's rule gives, ``min(max_iterations, max(1, flops // (pref *
    node speed) // split_time))``. The generator breaks the rule for the last job
    it draws: ``generate_jobs`` passes the flops still missing as the node speed,
    so that job gets one iteration, and ElastiSim can never resize it when it is
    malleable. Returns the indices in ``jobs.json`` of the jobs changed."""
    speed = read_input(input_dir).node_speed
    path = input_dir / "jobs.json"
    data = json.loads(path.read_text())
    changed = []
    for index, job in enumerate(data["jobs"]):
        args = job.get("arguments", {})
        if job.get("type") == "RIGID" or not {"flops", "divide", "num_nodes_pref"} <= args.keys():
            continue
        seconds = args["flops"] // (args["num_nodes_pref"] * speed)
        divide = min(max(1, seconds // split_time), float(max_iterations))
        if divide != args["divide"]:
            args["divide"] = divide
            changed.append(index)
    path.write_text(json.dumps(data, indent=4) + "\n")
    return changed


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
    # malleable jobs of one iteration, which ElastiSim never resizes, longest first
    fixed = sorted(((j.runtime, j.id) for j in malleable if jobset.iterations[j.id] <= 1), reverse=True)
    return {"jobs": len(jobset.jobs), "classes": classes, "nodes": jobset.nodes,
            "never_resized": [{"job": jid, "runtime": t} for t, jid in fixed],
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
                        "resizes": m.get("reconfigurations", 0),
                        "held_at_scheduling_points": held_at_scheduling_points(
                            jobset, result.decisions, m.get("makespan"))},
            "jobs": {jid: [r["start"], r["end"]] for jid, r in result.jobs.items()},
            "seconds": time.perf_counter() - started}


# -- ElastiSim ---------------------------------------------------------------------------------

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
        longest = [f"job {x['job']} ({x['runtime']:.0f} s)" for x in info["never_resized"]
                   if x["runtime"] >= 600][:3]
        if longest:
            print("  malleable with one iteration, never resized in ElastiSim (a grow ordered "
                  f"waits, its nodes reserved, until the job ends): {', '.join(longest)}", file=out)
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
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                   help="write the tables here, in Markdown")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: join these reports (of --json) into --json and --markdown")
    p.add_argument("--shares", default=",".join(map(str, DEFAULT_SHARES)),
                   help="malleable percentages of the generated sets (default 0,20,50,100)")
    p.add_argument("--seed", default="S1",
                   help="the generator's seeds (strings, as theirs), separated by commas")
    p.add_argument("--days", type=float, default=5.0, help="days of submissions to generate")
    p.add_argument("--nodes", type=int, default=32, help="nodes of the generated platform")
    p.add_argument("--split-time", type=float, default=60.0, metavar="SECONDS",
                   help="generated sets: seconds of work per iteration of a malleable job (at its "
                        "preferred size, scaling perfectly), their dividation_split_time")
    p.add_argument("--max-iterations", type=int, default=1000,
                   help="generated sets: the most iterations of a malleable job "
                        "(their malleable_dividation_amount)")
    p.add_argument("--repair-divide", action="store_true",
                   help="generated sets: give the generator's last job the iterations its rule "
                        "gives (it gets one: see repair_divide)")
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
    ns.seeds = [x for x in ns.seed.split(",") if x] or p.error("--seed: no seed")
    ns.command = shlex.join(["python", "-m", "benchmarks.elastisim_compare",
                             *(sys.argv[1:] if argv is None else argv)])
    for name in ns.policies:
        make_policy(name, 10.0)  # an unknown name fails here, listing the known ones
    try:
        ns.shares = [int(x) for x in ns.shares.split(",") if x]
    except ValueError:
        p.error(f"--shares {ns.shares!r}: percentages separated by commas")
    if any(not 0 <= s <= 100 for s in ns.shares) or not ns.shares:
        p.error(f"--shares {ns.shares}: percentages from 0 to 100")
    if ns.days <= 0 or ns.nodes < 1 or ns.timeout <= 0 or ns.resize_interval < 0 \
            or ns.split_time <= 0 or ns.max_iterations < 1:
        p.error("need --days > 0, --nodes >= 1, --timeout > 0, --resize-interval >= 0, "
                "--split-time > 0, --max-iterations >= 1")
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
    if ns.merge:
        return merge(ns)
    # the bridge imports our policies afresh for every run: a change to them during
    # the run makes the two sides differ (the report names the commit it started at)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT, stdin=subprocess.DEVNULL).stdout.strip() or None
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
                sets = [(f"{s}% malleable, seed {seed}",
                         generate(kassel, work / f"input-{seed}-{s}", s, seed, ns.days, ns.nodes,
                                  ns.split_time, ns.max_iterations))
                        for seed in ns.seeds for s in ns.shares]
                if ns.repair_divide:
                    for name, folder_in in sets:
                        changed = repair_divide(folder_in, ns.split_time, ns.max_iterations)
                        print(f"{name}: divide repaired for the jobs at {changed} of jobs.json")
            results = compare_sets(sets, ns, work, helpers, folder, skip)
        except (ElastiSimInputError, FileNotFoundError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    report = {"parameters": {k: (str(v) if isinstance(v, Path) else
                                 [str(x) for x in v] if k == "jobs" and v else v)
                             for k, v in vars(ns).items()},
              "tolerance": TOLERANCE, "tie": TIE, "skipped": skip, "sets": results,
              "commit": commit, "ended_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    write(ns, report)
    return 0


def write(ns: argparse.Namespace, report: dict[str, Any]) -> None:
    """``report`` to ``--json`` and its tables to ``--markdown``."""
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if ns.markdown:
        ns.markdown.parent.mkdir(parents=True, exist_ok=True)
        ns.markdown.write_text(markdown(report, ns.command))


def merge(ns: argparse.Namespace) -> int:
    """The reports of ``--merge`` as one: their sets in order, each run's parameters."""
    try:
        reports = [json.loads(path.read_text()) for path in ns.merge]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write(ns, {"parameters": [r["parameters"] for r in reports], "tolerance": TOLERANCE,
               "tie": TIE, "skipped": [r["skipped"] for r in reports],
               "sets": [s for r in reports for s in r["sets"]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
