"""Our policies against the Kassel group's originals, in ElastiSim (issue 56).

``python -m benchmarks.elastisim_policies [--jobs N] [--seeds S1 S2 ...]
[--malleable 20,50,100] [--input DIR ...] [--reconfiguration-cost SECONDS] [--json FILE] [--quick]``

For every seed and malleable share it generates one job set with the Kassel
generator (``scripts/input_generation/jsonGenerator.py`` of
MalleableJobScheduling: 16 nodes, one day of submissions, about 100 jobs, the
given share malleable and the rest rigid, as in their ``runSimulations.sh``;
``--reconfiguration-cost SECONDS`` adds to its application model, which as
published costs nothing to reconfigure, an ``on_reconfiguration`` phase of about
SECONDS that ElastiSim runs at every reconfiguration: a data redistribution, an
all-to-all among the job's new nodes of SECONDS of each node's link bandwidth,
overlapped with SECONDS of computation on each node, since moving its distributed
data is what resizing costs a malleable program and the part of it ElastiSim
simulates: ``benchmarks/_elastisim_reconfig.py`` says why this form, and sets
reports at several costs side by side), and runs on it, each in ElastiSim (the build that ``.ci/install-services`` makes;
``tests/_elastisim.py`` finds it):

* the Kassel originals: their rigid EASY backfill and the nine malleable
  strategies (min/average/pref x agreement/common_pool/steal_agreement), each
  their own Python script connected to ElastiSim;
* ours, through ``apgas-scheduler elastisim``: the nine agreement strategies
  (``min-agreement`` ... ``pref-steal-agreement``), ``easy``, ``malleable``
  (minAgree), ``lending``, ``sharing`` and ``mebf``.

From each run it reads ElastiSim's ``job_statistics.csv`` (mean turnaround,
mean wait, the makespan: the last end less the first submit) and counts the
resizes twice: the *orders* (grows and shrinks sent: the bridge's ``--stats``
for ours, the EXPAND and SHRINK rows of the strategy's ``event.csv`` for
theirs: one per job and invocation, since a job they shrink and grow at once gets
one node list) and the *reconfigurations* ElastiSim carried out, read from its
``node_utilization.csv`` (a running job whose node set changes). It prints a
table per set and writes everything as JSON.

Each run has a folder of its own under one temporary folder (removed at the
end), ElastiSim and the algorithm each in a process group of its own; a run
over ``--timeout`` is killed (both groups) and reported as such; at most
``--jobs`` runs (default 2) go at once. Ctrl-C or SIGTERM end every run
started and remove the folder.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from ._common import machine_info, setup_logging, write_json
from ._elastisim_output import mean, node_speed, reconfigurations, summary, table, tail
from ._elastisim_reconfig import add_reconfiguration_cost

log = logging.getLogger("benchmarks.elastisim_policies")

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "_elastisim.py"

#: the Kassel originals: rigid EASY, then sizing x hand-over as their files name them
KASSEL_SIZINGS = {"min": "min", "avg": "average", "pref": "pref"}
KASSEL_HANDOVERS = {"agreement": "agreement", "common-pool": "common_pool",
                    "steal-agreement": "steal_agreement"}
KASSEL_EASY = "rigid_easy_backfill"
KASSEL = [KASSEL_EASY] + [f"{s}_{h}" for h in KASSEL_HANDOVERS.values() for s in KASSEL_SIZINGS.values()]
#: ours (registry names): the nine, then EASY, minAgree, lending, sharing and MEBF
OURS = [f"{s}-{h}" for h in KASSEL_HANDOVERS for s in KASSEL_SIZINGS] + ["easy", "malleable", "lending",
                                                                         "sharing", "mebf"]
#: each of ours that has an original: {our name: the original's file name}
COUNTERPART = {f"{s}-{h}": f"{KASSEL_SIZINGS[s]}_{KASSEL_HANDOVERS[h]}"
               for s in KASSEL_SIZINGS for h in KASSEL_HANDOVERS} | {"easy": KASSEL_EASY}

#: the generator's settings (as tests/test_elastisim_real.py runs it): 16 nodes of
#: 1e11 flop/s, jobs of 1e13 to 3.8e15 flops, one day of submissions: ~100 jobs
NODES = 16
TOTAL_TIME = 86400
QUICK_TIME = 7200  # ~8 jobs
FLOPS_RANGE = "1e13,3.8e15"
SPLIT_TIME = 600  # seconds between two scheduling points of a flexible job
QUICK_ALGORITHMS = ["K:min_agreement", "min-agreement", "lending"]
RUN_TIMEOUT = 900.0


# -- the build's helpers --------------------------------------------------------------------

def helpers() -> ModuleType:
    """``tests/_elastisim.py`` (find, prepare_input, run_elastisim, run_strategy, stop)."""
    spec = importlib.util.spec_from_file_location("_elastisim", HELPERS)
    if spec is None or spec.loader is None or not HELPERS.is_file():
        raise RuntimeError(f"{HELPERS} (the helpers of the ElastiSim build) is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- algorithms and runs --------------------------------------------------------------------

def algorithm_names(names: list[str] | None) -> list[str]:
    """The algorithms to run: the Kassel originals as ``K:<their file>``, then ours."""
    every = [f"K:{k}" for k in KASSEL] + OURS
    if not names:
        return every
    from apgas_scheduler.policies import policy_names
    known = set(every) | set(policy_names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(every)} "
                         "and any registered policy")
    return names


@dataclasses.dataclass
class JobSet:
    seed: str
    malleable: int  # percent of the jobs
    folder: Path  # the generated input
    jobs: int = 0

    @property
    def name(self) -> str:
        return f"{self.seed}/{self.malleable}%"


@dataclasses.dataclass
class Result:
    set: str
    algorithm: str
    status: str = "ok"  # ok | timeout | failed
    seconds: float = 0.0
    jobs: int = 0
    completed: int = 0
    mean_turnaround: float | None = None
    mean_wait: float | None = None
    makespan: float | None = None
    orders: int | None = None  # grows + shrinks sent
    grows: int | None = None
    shrinks: int | None = None
    reconfigurations: int | None = None  # node-set changes ElastiSim carried out
    refused: int | None = None  # ours: decisions the bridge did not send
    error: str = ""


class Runner:
    """Runs algorithms on job sets in ElastiSim, and ends whatever it started."""

    def __init__(self, es: ModuleType, build: Path, work: Path, timeout: float,
                 reconfiguration_cost: float = 0.0) -> None:
        self.es, self.build, self.work, self.timeout = es, build, work, timeout
        self.reconfiguration_cost = reconfiguration_cost
        self.phase: dict[str, Any] | None = None  # the on_reconfiguration phase added
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.cancelled = threading.Event()

    def generate(self, seed: str, malleable: int, total_time: int) -> JobSet:
        """A job set of the Kassel generator: ``malleable`` percent malleable, the rest rigid."""
        folder = self.work / f"input-{seed}-{malleable}"
        script = self.build / self.es.KASSEL / "scripts" / "input_generation" / "jsonGenerator.py"
        subprocess.run([sys.executable, str(script), "-q", "-d", str(folder), "--seed", seed,
                        "--total_time", str(total_time), "--num_cluster_nodes", str(NODES),
                        "--flops_range", FLOPS_RANGE, "--dividation_split_time", str(SPLIT_TIME),
                        "--type_probabilities", f"{100 - malleable},0,{malleable}"],
                       check=True, timeout=120, capture_output=True, cwd=self.work,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        return self._prepared(folder, seed, malleable)

    def adopt(self, source: Path) -> JobSet:
        """An ElastiSim input folder as it is (the Kassel repository's ``input_files/small``),
        named after the folder; its share is that of its malleable jobs."""
        folder = self.work / f"input-{source.name}"
        shutil.copytree(source, folder)
        return self._prepared(folder, source.name)

    def _prepared(self, folder: Path, name: str, share: int | None = None) -> JobSet:
        """The input in ``folder`` with the reconfiguration phase asked for; ``share``: the
        generator's malleable probability (None: the share of its malleable jobs)."""
        jobs = json.loads((folder / "jobs.json").read_text())["jobs"]
        if share is None:
            share = round(100 * sum(j.get("type") == "MALLEABLE" for j in jobs) / max(1, len(jobs)))
        self.phase = add_reconfiguration_cost(folder, self.reconfiguration_cost,
                                              node_speed(folder / "crossbar.xml"))
        return JobSet(name, share, folder, len(jobs))

    def _track(self, proc: subprocess.Popen) -> subprocess.Popen:
        with self._lock:
            self._live.add(proc)
        if self.cancelled.is_set():
            self._end(proc)
        return proc

    def _end(self, proc: subprocess.Popen) -> None:
        self.es.stop(proc)
        with self._lock:
            self._live.discard(proc)

    def stop_all(self) -> None:
        """End every process group this runner started and has not ended."""
        self.cancelled.set()
        with self._lock:
            live = list(self._live)
        for proc in live:
            self._end(proc)

    def run(self, jobset: JobSet, algorithm: str) -> Result:
        result = Result(jobset.name, algorithm, jobs=jobset.jobs)
        if self.cancelled.is_set():
            result.status, result.error = "failed", "cancelled"
            return result
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{jobset.seed}-{jobset.malleable}-{algorithm}")
        folder = Path(tempfile.mkdtemp(prefix=label[:40] + "-", dir=self.work))
        config = self.es.prepare_input(folder, jobset.folder)
        settings = json.loads(config.read_text())
        stats = folder / "stats.json"
        began = time.monotonic()
        sim = algo = None
        try:
            sim = self._track(self.es.run_elastisim(self.build / "build" / "elastisim", config))
            if algorithm.startswith("K:"):
                algo = self._track(self.es.run_strategy(self.build, algorithm[2:], config))
                algo_log = folder / f"{algorithm[2:]}.log"
            else:
                algo_log = folder / "bridge.log"
                algo = self._track(self._bridge(folder, algorithm, settings, stats, algo_log))
            deadline = began + self.timeout
            code = _wait(algo, deadline, self.cancelled)
            sim_code = _wait(sim, min(deadline, time.monotonic() + 60), self.cancelled)
            if code is None or sim_code is None:
                result.status = "timeout" if not self.cancelled.is_set() else "failed"
                result.error = ("cancelled" if self.cancelled.is_set() else
                                f"not done in {self.timeout:g} s; algorithm: {tail(algo_log)}; "
                                f"ElastiSim: {tail(folder / 'elastisim.log')}")
            elif code != 0 or sim_code != 0:
                result.status = "failed"
                result.error = (f"exit {code} (algorithm) and {sim_code} (ElastiSim); algorithm: "
                                f"{tail(algo_log)}; ElastiSim: {tail(folder / 'elastisim.log')}")
        finally:
            for proc in (algo, sim):
                if proc is not None:
                    self._end(proc)
        result.seconds = time.monotonic() - began
        if result.status == "ok":
            try:
                self._measure(result, settings, stats if not algorithm.startswith("K:")
                              else folder / "output" / "event.csv")
            except (OSError, ValueError, KeyError) as e:
                result.status, result.error = "failed", f"its output: {e}"
        return result

    def _bridge(self, folder: Path, policy: str, settings: dict[str, Any], stats: Path,
                out: Path) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        with open(out, "wb") as f:
            return subprocess.Popen(
                [sys.executable, "-m", "apgas_scheduler", "elastisim", "--policy", policy,
                 "--url", settings["zmq_url"], "--stats", str(stats),
                 "--node-speed", repr(node_speed(Path(settings["platform_file"])))],
                cwd=folder, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)

    def _measure(self, result: Result, settings: dict[str, Any], counts: Path) -> None:
        with open(settings["job_statistics"], newline="") as f:
            rows = list(csv.DictReader(f))
        done = [r for r in rows if r["Status"] == "completed"]
        result.completed = len(done)
        if rows:
            result.mean_turnaround = mean(float(r["Turnaround Time"]) for r in rows)
            result.mean_wait = mean(float(r["Wait Time"]) for r in rows)
            result.makespan = (max(float(r["End Time"]) for r in rows)
                               - min(float(r["Submit Time"]) for r in rows))
        if counts.name == "stats.json":
            stats = json.loads(counts.read_text())
            result.grows, result.shrinks = stats["decisions"]["grow"], stats["decisions"]["shrink"]
            result.refused = stats["refused"]
        else:  # the strategy's event log (none if it never wrote an event): a row per
            # agreement, so a job shrunk for two waiting jobs at once has two SHRINK rows
            # for one order: one order per job, kind and invocation
            kinds: set[tuple[str, str, str]] = set()
            if counts.is_file():
                with open(counts, newline="") as f:
                    kinds = {(r["Time"], r["Jobs"], r["Event"]) for r in csv.DictReader(f)
                             if r["Event"] in ("EXPAND", "SHRINK")}
            events = [kind for _, _, kind in kinds]
            result.grows, result.shrinks = events.count("EXPAND"), events.count("SHRINK")
            # a job shrunk and grown in one invocation gets one node list: one order
            result.orders = len({(when, job) for when, job, _ in kinds})
        if result.orders is None:
            result.orders = result.grows + result.shrinks
        result.reconfigurations = reconfigurations(Path(settings["node_utilization"]))


def _wait(proc: subprocess.Popen, deadline: float, cancelled: threading.Event) -> int | None:
    """The exit code of ``proc``, or None at ``deadline`` or when cancelled."""
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if cancelled.is_set() or time.monotonic() >= deadline:
            return None
        try:
            return proc.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            continue


# -- the harness ----------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.elastisim_policies",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="runs at once (default 2; each is ElastiSim and an algorithm in lockstep)")
    p.add_argument("--seeds", nargs="+", default=None, metavar="SEED",
                   help="the generator's seeds, one job set per seed and share (default S1 S2 S3; "
                        "--quick: S1)")
    p.add_argument("--malleable", default=None, metavar="PERCENTS",
                   help="malleable shares in percent, the rest rigid (default 20,50,100; --quick: 50)")
    p.add_argument("--algorithms", nargs="+", default=None, metavar="NAME",
                   help="only these: K:<Kassel file> (K:min_agreement ...) or a policy of ours "
                        "(default: the ten originals and our thirteen)")
    p.add_argument("--input", type=Path, nargs="+", default=None, metavar="DIR",
                   help="run these ElastiSim input folders as they are instead of generating sets "
                        "(the Kassel repository's: <build>/MalleableJobScheduling/input_files/small)")
    p.add_argument("--total-time", type=int, default=None, metavar="SECONDS",
                   help=f"the generator's submission span (default {TOTAL_TIME}: ~100 jobs)")
    p.add_argument("--reconfiguration-cost", type=float, default=0.0, metavar="SECONDS",
                   help="give every reconfiguration about SECONDS in ElastiSim: an on_reconfiguration "
                        "phase redistributing the job's data (default 0: the Kassel model as published)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT, metavar="SECONDS",
                   help=f"a run's limit, then it is killed (default {RUN_TIMEOUT:g})")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="run in this new folder and keep it (inputs, logs, ElastiSim's output) "
                        "instead of a temporary one")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the results here")
    p.add_argument("--quick", action="store_true",
                   help=f"a tiny check: seed S1, 50%% malleable, {QUICK_TIME} s of submissions "
                        f"(~8 jobs), {', '.join(QUICK_ALGORITHMS)}")
    ns = p.parse_args(argv)
    if ns.jobs < 1:
        p.error(f"--jobs must be at least 1, got {ns.jobs}")
    if ns.quick:
        ns.seeds, ns.malleable = ns.seeds or ["S1"], ns.malleable or "50"
        ns.total_time = ns.total_time or QUICK_TIME
        ns.algorithms = ns.algorithms or QUICK_ALGORITHMS
    ns.seeds, ns.total_time = ns.seeds or ["S1", "S2", "S3"], ns.total_time or TOTAL_TIME
    try:
        ns.malleable = [int(m) for m in (ns.malleable or "20,50,100").split(",")]
    except ValueError:
        p.error(f"--malleable must be percents separated by commas, got {ns.malleable!r}")
    if any(not 0 <= m <= 100 for m in ns.malleable):
        p.error(f"--malleable: each share must lie in [0, 100], got {ns.malleable}")
    for folder in ns.input or []:
        if not (folder / "jobs.json").is_file() or not (folder / "configuration.json").is_file():
            p.error(f"--input {folder}: not an ElastiSim input folder (no jobs.json and "
                    "configuration.json)")
    if ns.total_time <= 0 or ns.timeout <= 0:
        p.error("--total-time and --timeout must be > 0")
    if not 0 <= ns.reconfiguration_cost < float("inf"):
        p.error(f"--reconfiguration-cost must be >= 0 seconds, got {ns.reconfiguration_cost:g}")
    try:
        ns.algorithms = algorithm_names(ns.algorithms)
    except ValueError as e:
        p.error(str(e))
    return ns


def run(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The report, or None if ElastiSim is not built (the reason is logged)."""
    es = helpers()
    build, why = es.find()
    if build is None:
        log.error("%s", why)
        return None
    report: dict[str, Any] = {
        "command": "python -m benchmarks.elastisim_policies " + " ".join(
            shlex.quote(a) for a in (ns.argv if ns.argv is not None else sys.argv[1:])),
        "settings": {"seeds": ns.seeds, "malleable": ns.malleable, "nodes": NODES,
                     "total_time": ns.total_time, "flops_range": FLOPS_RANGE,
                     "dividation_split_time": SPLIT_TIME, "algorithms": ns.algorithms,
                     "timeout": ns.timeout, "build": str(build),
                     "reconfiguration_cost": ns.reconfiguration_cost},
        "machine": machine_info(), "sets": []}
    with contextlib.ExitStack() as stack:
        if ns.keep is not None:
            ns.keep.mkdir(parents=True)
            work = ns.keep.resolve()
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="es-policies-")))
        runner = Runner(es, build, work, ns.timeout, ns.reconfiguration_cost)
        try:
            sets = ([runner.adopt(d) for d in ns.input] if ns.input else
                    [runner.generate(seed, m, ns.total_time) for seed in ns.seeds for m in ns.malleable])
            report["settings"]["reconfiguration_phase"] = runner.phase
            for s in sets:
                log.info("set %s: %d jobs", s.name, s.jobs)
            plan = [(s, a) for s in sets for a in ns.algorithms]
            results: dict[tuple[str, str], Result] = {}
            began = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(max_workers=ns.jobs) as pool:
                futures = {pool.submit(runner.run, s, a): (s, a) for s, a in plan}
                try:
                    for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                        s, a = futures[future]
                        r = future.result()
                        results[s.name, a] = r
                        log.info("[%d/%d] %s on %s: %s in %.1f s%s", done, len(plan), a, s.name,
                                 r.status, r.seconds,
                                 f" (turnaround {r.mean_turnaround:.0f} s, orders {r.orders}, "
                                 f"reconfigurations {r.reconfigurations})" if r.status == "ok"
                                 else f": {r.error}")
                except BaseException:
                    runner.stop_all()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
            log.info("%d runs in %.0f s", len(plan), time.monotonic() - began)
        finally:
            runner.stop_all()
        for s in sets:
            report["sets"].append({
                "name": s.name, "seed": s.seed, "malleable": s.malleable, "jobs": s.jobs,
                "results": [dataclasses.asdict(results[s.name, a]) for a in ns.algorithms]})
    return report


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    ns.argv = argv
    setup_logging("benchmarks")
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        report = run(ns)
    except KeyboardInterrupt:
        log.error("interrupted: every run ended%s",
                  f", their folder kept in {ns.keep}" if ns.keep else ", their folder removed")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if report is None:
        return 2
    for s in report["sets"]:
        print(table(s, s["results"], NODES), end="\n\n")
    print(summary(report, f"K:{KASSEL_EASY}"))
    if ns.json:
        write_json(ns.json, report, log)
    failed = [f"{r['algorithm']} on {s['name']}" for s in report["sets"] for r in s["results"]
              if r["status"] != "ok"]
    if failed:
        log.error("%d run(s) did not finish: %s", len(failed), ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
