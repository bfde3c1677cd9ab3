"""Job batches under the elastic scheduler: four policies, 0..100% malleable jobs.

    python -m benchmarks.jobbatch [--nodes 8] [--jobs 12] [--seeds 1]
        [--shares 0,20,40,60,80,100] [--policies fcfs,backfill,easy,malleable]
        [--spread SECONDS] [--repeats R] [--quick] [--json FILE] [--plot FILE]

The scheduler study of the malleable-APGAS paper (Posner et al.: 25-job
batches on 32 nodes, 10 seeds, 0..100% malleable jobs in steps of 20, FCFS,
Backfilling, EASY-Backfilling and minAgree) in miniature on this machine.

What is run. ``JOB_TABLE`` plays the part of the paper's Table 2: GLB
benchmark configurations (UTS, N-Queens, BC, Pi, a small and a large size
each), each with the node count it asks for as a rigid job (1, 2 or 4 of the
8 nodes, so that rigid jobs fragment the pool and queue), the node range it
accepts as a malleable job, a relative weight for the random choice and a
generous walltime estimate. Each seed draws a rigid batch of ``--jobs`` jobs
from the table by weight; the first fifth (rounded up) is submitted at t = 0,
the others at times drawn uniformly from [0, ``--spread``). For a share s, the
first round(s * jobs) jobs of a seeded permutation become malleable (class
"malleable", the node range, ``--malleable``), so the malleable subsets are
nested as the share grows, as in the paper. FCFS, Backfilling and EASY start
malleable jobs as moldable ones (with as many nodes as they may have);
minAgree starts them at their minimum and grows and shrinks them.

How it is measured. Each (seed, share, policy, repeat) gets a fresh
in-process ``apgas_scheduler.live.daemon.Scheduler`` on ``--nodes`` virtual nodes
(every node is this machine, ``APGAS_LOCAL_HOSTS='*'``), an event log and an
output folder in a temporary directory. A thread submits the jobs at their
times; the run ends when every job has ended (or after ``--timeout``
seconds: the run is then marked failed). The scheduler is shut down (which
kills whatever still runs), its threads are joined, and no process of the
run may be left (leftovers are killed and reported). Makespan, node
utilisation, mean wait, mean turnaround, grows, shrinks and node-overlap
violations come from the event log through
``apgas_scheduler.metrics.compute_metrics``; beside them, "CPU share": the CPU
time of the jobs' processes over (makespan x cores). Every job must end
"done" and its result JSON must say ``"correct": true``; results without a
built-in reference (BC above scale 10) are compared with one
``--sequential`` run of the same configuration. Failures are counted and
reported, never hidden.

The runs go in a seeded random order, so that a slow drift of the shared
machine becomes noise rather than a trend over the shares or the policies; a
run whose jobs got less than 90% of the cores over its makespan is flagged:
something else was using the machine (the same batch took 46.7 s with a CPU
share of 69% and 31.1 s with 99% half an hour later, for the same CPU time).
Figures (:mod:`benchmarks.jobbatch_report`): per (seed, share, policy) the
median over the repeats, then the mean over the seeds (the paper averages
over its batches). The comparison is the paper's: minAgree at 100%
malleable against the best policy at 0% by makespan, Backfilling left out
for its lack of fairness as in the paper, and against FCFS at 0% (the
paper's best: -13.09% makespan, +19.86% utilisation, -3.61% turnaround).
Times are reported, never asserted on.

Caveat: this machine has 2 cores and the 8 virtual nodes share them. Each
place runs one GLB worker (``--workers 1``, ``APGAS_THREADS=2``), so the
virtual nodes are oversubscribed: giving a job more nodes gives it a larger
share of the same 2 cores, not more capacity, and costs a process start
(about 0.35 s of CPU per place) and slower work stealing between places that
wait for their turn on a core. With the cores saturated, the makespan is
close to the batch's CPU time over the cores whatever the policy. Policy
differences therefore show mostly as idle gaps and as the order in which
jobs finish; moldable and malleable jobs pay for their extra places without
gaining cores. On this shared machine the same schedule can take 50% longer
from one run to the next, more than the policy effects: use ``--seeds`` and
``--repeats`` before reading anything into a difference. Utilisation counts
nodes held, as in the paper (a node reserved for a grow in flight counts as
held from its reservation). The figures are not those of a cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.metrics import compute_metrics, gantt, read_events
from apgas_scheduler.policies import get_policy
from benchmarks._harness import Run, harness, show
from benchmarks.jobbatch_report import PUBLISHED, SCHEDULER_METRICS, compare, plot, render, summarize

log = logging.getLogger("benchmarks.jobbatch")

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("fcfs", "backfill", "easy", "malleable")
SHARES = (0, 20, 40, 60, 80, 100)
THREADS_PER_PLACE = "2"   # APGAS_THREADS: one GLB worker and the runtime
SEQUENTIAL_TIMEOUT = 300.0
RUN_ORDER_SEED = 12345
SLOW_CPU_SHARE = 0.9      # a run whose jobs got less of the cores than this is flagged


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One row of the job table (the paper's Table 2 in miniature)."""

    name: str
    app: str
    args: tuple[str, ...]
    nodes: int          # as a rigid job
    min_nodes: int      # as a malleable job
    max_nodes: int
    weight: int         # relative chance of being drawn
    walltime: float     # the user's estimate, s: generous, since 8 nodes share 2 cores
    alone_s: float      # s, computation alone on `nodes` places here (2 cores), for the reader


# Measured alone on this machine (computation only; a job adds ~0.5 s of start-up).
# Walltimes are several times what a job takes with its rigid share of a fully
# loaded machine (4 places per core), so that no walltime kill happens by accident.
JOB_TABLE: tuple[JobConfig, ...] = (
    JobConfig("uts-12", "uts", ("--depth", "12"), 1, 1, 2, 3, 40, 1.3),
    JobConfig("uts-13", "uts", ("--depth", "13"), 2, 1, 4, 2, 90, 2.9),
    JobConfig("nq-15", "nqueens", ("-n", "15"), 1, 1, 2, 2, 40, 1.1),
    JobConfig("nq-16", "nqueens", ("-n", "16"), 4, 2, 8, 1, 120, 3.6),
    JobConfig("bc-12", "bc", ("--scale", "12"), 1, 1, 2, 2, 40, 1.2),
    JobConfig("bc-13", "bc", ("--scale", "13"), 2, 1, 4, 2, 90, 2.7),
    JobConfig("pi-5e9", "pi", ("--samples", "5000000000"), 2, 1, 4, 2, 60, 1.3),
    JobConfig("pi-2e10", "pi", ("--samples", "20000000000"), 4, 2, 8, 1, 150, 5.0),
)
QUICK_TABLE = tuple(c for c in JOB_TABLE if c.name in ("uts-12", "nq-15", "bc-12", "pi-5e9"))
"""``--quick``: the smaller size of each application, so that a batch takes seconds."""


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """A job of a batch: its configuration and when it is submitted."""

    index: int
    config: JobConfig
    submit: float


@dataclasses.dataclass(frozen=True)
class Batch:
    """A rigid batch and the order in which its jobs become malleable."""

    seed: int
    jobs: tuple[BatchJob, ...]
    malleable_order: tuple[int, ...]   # job indices; a share takes a prefix

    def malleable(self, share: int) -> frozenset[int]:
        count = math.floor(share / 100 * len(self.jobs) + 0.5)
        return frozenset(self.malleable_order[:count])


def make_batch(seed: int, jobs: int, spread: float,
               table: tuple[JobConfig, ...] = JOB_TABLE) -> Batch:
    """``jobs`` jobs drawn from ``table`` by weight; the first fifth (rounded up) at
    t = 0, the rest uniform in [0, spread); jobs in submission order."""
    rng = random.Random(seed)
    configs = rng.choices(table, weights=[c.weight for c in table], k=jobs)
    at_zero = math.ceil(jobs / 5)
    times = [0.0] * at_zero + sorted(rng.uniform(0, spread) for _ in range(jobs - at_zero))
    order = list(range(jobs))
    rng.shuffle(order)
    return Batch(seed, tuple(BatchJob(i, c, t) for i, (c, t) in enumerate(zip(configs, times, strict=True))),
                 tuple(order))


def job_spec(job: BatchJob, malleable: bool, result: Path, pool: int) -> JobSpec:
    """The scheduler's job description: rigid at its size, or malleable over its range."""
    c = job.config
    command = [sys.executable, "-m", "glb.apps", c.app, *c.args, "--workers", "1",
               *(["--malleable"] if malleable else []), "--json", str(result)]
    low, high = (c.min_nodes, min(c.max_nodes, pool)) if malleable else (c.nodes, c.nodes)
    return JobSpec(f"{c.name}#{job.index}", tuple(command), "malleable" if malleable else "rigid",
                   low, high, c.walltime, (("APGAS_THREADS", THREADS_PER_PLACE),), str(ROOT))


# -- one run --------------------------------------------------------------------------------

def _descendants() -> list[int]:
    """Process ids below this process (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_leftovers() -> int:
    """Kill (and count) processes of ours still alive after a run's shutdown."""
    left = _descendants()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        log.error("%d process(es) left after the run: %s (killed)", len(left), left)
        time.sleep(0.5)
    return len(left)


def _wait_ended(sched: Scheduler, submitter: threading.Thread, total: int, timeout: float) -> str:
    """Poll until all ``total`` jobs have been submitted and ended; "" or the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = sched.status()["jobs"]
        if (not submitter.is_alive() and len(jobs) == total
                and all(j["state"] in ("done", "failed", "cancelled") for j in jobs)):
            return ""
        time.sleep(0.2)
    states = {j["name"]: j["state"] for j in sched.status()["jobs"]}
    return f"not all jobs ended within {timeout:g} s: {states}"


def run_batch(batch: Batch, share: int, policy: str, args: argparse.Namespace,
              references: dict[str, Any]) -> dict[str, Any]:
    """One batch under one policy on a fresh scheduler; metrics, jobs and failures."""
    malleable = batch.malleable(share)
    cpu_before = _children_cpu()
    with tempfile.TemporaryDirectory(prefix="jobbatch-") as tmp:
        work = Path(tmp)
        results = {job.index: work / "results" / f"{job.index}.json" for job in batch.jobs}
        sched = Scheduler([f"node{i}" for i in range(args.nodes)],
                          get_policy(policy, resize_interval=args.resize_interval),
                          events=work / "events.jsonl", interval=args.interval,
                          output_dir=work / "out")
        sched.start()
        stop = threading.Event()

        def submit_all() -> None:
            t0 = time.monotonic()
            for job in batch.jobs:
                if stop.wait(max(0.0, t0 + job.submit - time.monotonic())):
                    return
                sched.submit(job_spec(job, job.index in malleable, results[job.index], args.nodes))

        submitter = threading.Thread(target=submit_all, name="jobbatch-submit", daemon=True)
        submitter.start()
        try:
            error = _wait_ended(sched, submitter, len(batch.jobs), args.timeout)
        finally:
            stop.set()
            submitter.join()
            sched.shutdown()  # kills what still runs
            for t in list(sched._threads):  # as tests/test_scheduler_live.py does
                t.join(10)
        jobs = sched.status()["jobs"]
        leftovers = _kill_leftovers()
        cpu = _children_cpu() - cpu_before
        events = read_events(work / "events.jsonl")
        metrics = compute_metrics(events)
        records = [_read_result(results[j.index]) for j in batch.jobs]
        failures = [] if not error else [error]
        failures += [f"leftover processes: {leftovers}"] if leftovers else []
        rows = []
        for job, status, record in zip(batch.jobs, jobs, records, strict=False):  # a failed batch has no status for jobs it never submitted
            verdict = _verdict(job.config, record, references)
            if status["state"] != "done":
                failures.append(f"{status['name']}: {status['state']} ({status['reason']})")
            elif verdict is not True:
                failures.append(f"{status['name']}: result {verdict}")
            rows.append({"name": status["name"], "class": status["class"],
                         "min_nodes": status["min_nodes"], "max_nodes": status["max_nodes"],
                         "submit": status["submit"], "start": status["start"], "end": status["end"],
                         "state": status["state"], "reason": status["reason"],
                         "grows": status["grows"], "shrinks": status["shrinks"],
                         "seconds": record.get("seconds") if record else None,
                         "places": record.get("places") if record else None,
                         "correct": verdict})
    for failure in failures:
        log.error("seed %d, %d%%, %s: %s", batch.seed, share, policy, failure)
    makespan = metrics["makespan"]
    return {"seed": batch.seed, "share": share, "policy": policy, "malleable_jobs": sorted(malleable),
            **{k: metrics[k] for k in SCHEDULER_METRICS}, "cpu_seconds": cpu,
            "cpu_share": cpu / (makespan * (os.cpu_count() or 1)) if makespan else None,
            "mean_grow_seconds": metrics["mean_grow_seconds"],
            "mean_shrink_seconds": metrics["mean_shrink_seconds"], "by_state": metrics["by_state"],
            "failures": failures, "jobs": rows, "events": events}


def _children_cpu() -> float:
    """CPU seconds of the ended child processes (a job's places are reaped into it)."""
    t = os.times()
    return t.children_user + t.children_system


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _verdict(config: JobConfig, record: dict[str, Any] | None, references: dict[str, Any]) -> Any:
    """True if the result is right; else why not ("missing", False, "differs from sequential")."""
    if record is None:
        return "missing"
    if record.get("correct") is not None:
        return record["correct"]
    if config.name not in references:
        references[config.name] = _sequential(config)
    return True if _same(record.get("result"), references[config.name]) else "differs from sequential"


def _sequential(config: JobConfig) -> Any:
    """The result of one ``--sequential`` run, for configurations without a built-in reference."""
    log.info("sequential reference for %s", config.name)
    with tempfile.TemporaryDirectory(prefix="jobbatch-ref-") as tmp:
        out = Path(tmp) / "ref.json"
        proc = subprocess.run([sys.executable, "-m", "glb.apps", config.app, *config.args,
                               "--sequential", "--json", str(out)], cwd=ROOT, capture_output=True,
                              text=True, timeout=SEQUENTIAL_TIMEOUT)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"sequential {config.name} failed: {proc.stderr[-2000:]}")
        return json.loads(out.read_text())["result"]


def _same(a: Any, b: Any) -> bool:
    """Equal, floats up to a relative 1e-6 (summation order differs between runs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


# -- command line ---------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=8, help="virtual nodes (default 8)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per batch (default 12, 5 with --quick)")
    parser.add_argument("--seeds", type=int, default=1, help="batches, seeds 0..N-1 (default 1)")
    parser.add_argument("--shares", type=_ints, default=None,
                        help="malleable shares in %% (default 0,20,...,100; 0,100 with --quick)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated, of {} (default all)".format(",".join(POLICIES)))
    parser.add_argument("--spread", type=float, default=None,
                        help="submissions spread over [0, SPREAD) s (default 20, 6 with --quick)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each batch (default 1)")
    parser.add_argument("--interval", type=float, default=0.5, help="scheduling pass every S s")
    parser.add_argument("--resize-interval", type=float, default=2.0,
                        help="minAgree: least time between two resizes of a job (default 2 s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="a run's limit in s")
    parser.add_argument("--quick", action="store_true",
                        help="shares 0 and 100, 5 of the smaller jobs over 6 s: a smoke test of about a minute")
    parser.add_argument("--json", type=Path, default=Path("bench-results/jobbatch.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench-results/jobbatch.png"),
                        help="the PNG; the Gantt chart goes beside it as *_gantt.png")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    args.jobs = args.jobs or (5 if args.quick else 12)
    args.shares = args.shares or ([0, 100] if args.quick else list(SHARES))
    args.spread = args.spread if args.spread is not None else (6.0 if args.quick else 20.0)
    args.policies = list(dict.fromkeys(p for p in args.policies.split(",") if p))
    if unknown := [p for p in args.policies if p not in POLICIES]:
        return f"unknown policies {unknown}; choose from {list(POLICIES)}"
    if bad := [s for s in args.shares if not 0 <= s <= 100]:
        return f"shares are percentages 0..100, got {bad}"
    biggest = max(c.nodes for c in JOB_TABLE)
    if args.nodes < biggest:
        return f"--nodes must be at least {biggest} (the largest rigid job)"
    if min(args.jobs, args.seeds, args.repeats) < 1 or args.spread < 0:
        return "--jobs, --seeds and --repeats must be >= 1 and --spread >= 0"
    return None


@harness("benchmarks.jobbatch", __doc__, options=options,
         check=check, loggers=(log.name,), needs=lambda args: ["numba", "tqdm", "matplotlib"])
def main(ctx: Run) -> int:
    args = ctx.args
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    os.environ["APGAS_LOCAL_HOSTS"] = "*"   # every node name is this machine
    table = QUICK_TABLE if args.quick else JOB_TABLE
    batches = [make_batch(seed, args.jobs, args.spread, table) for seed in range(args.seeds)]
    plan = [(b, s, p, r) for b in batches for s in args.shares for p in args.policies
            for r in range(args.repeats)]
    random.Random(RUN_ORDER_SEED).shuffle(plan)  # slow drifts of the machine: noise, not a trend
    log.info("%d run(s): %d seed(s) x %d share(s) x %d polic(ies) x %d repeat(s), %d jobs on %d nodes",
             len(plan), args.seeds, len(args.shares), len(args.policies), args.repeats, args.jobs,
             args.nodes)
    references: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    with logging_redirect_tqdm(), tqdm(plan, desc="jobbatch", unit="run") as bar:
        for batch, share, policy, repeat in bar:
            bar.set_postfix_str(f"seed {batch.seed} {share}% {policy}")
            run = run_batch(batch, share, policy, args, references)
            run.update(repeat=repeat, order=len(runs))
            runs.append(run)
            log.info("seed %d %3d%% %-9s makespan %.1f s, utilisation %.0f%%, turnaround %.1f s, "
                     "%d grow(s), %d shrink(s), CPU share %.0f%%, %d failure(s)", batch.seed, share,
                     policy, run["makespan"] or 0, 100 * (run["utilization"] or 0),
                     run["mean_turnaround"] or 0, run["grows"], run["shrinks"],
                     100 * (run["cpu_share"] or 0), len(run["failures"]))
    runs.sort(key=lambda r: (r["seed"], r["share"], args.policies.index(r["policy"]), r["repeat"]))
    elapsed = time.monotonic() - started
    summary = summarize(runs, args.shares, args.policies)
    comparison = compare(summary, args.policies)
    failures = sum(len(r["failures"]) for r in runs)

    shown = next((r for r in runs if r["policy"] == "malleable" and r["share"] == max(args.shares)),
                 runs[-1])  # the first seed's, runs being sorted
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    gantt_path = args.plot.with_name(args.plot.stem + "_gantt.png")
    gantt(shown["events"], gantt_path, f"seed {shown['seed']}, {shown['share']}% malleable, "
          f"{shown['policy']}: {args.jobs} jobs on {args.nodes} virtual nodes (2 cores)")
    plot(summary, args.shares, args.policies, args.plot,
         f"{args.jobs} GLB jobs on {args.nodes} virtual nodes sharing {os.cpu_count()} cores, "
         f"mean of {args.seeds} seed(s)")
    log.info("plots in %s and %s", args.plot, gantt_path)

    for run in runs:
        if run is not shown:
            del run["events"]
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    ctx.report.update({
        "params": params, "elapsed_seconds": elapsed,
        "job_table": [dataclasses.asdict(c) for c in table],
        "batches": [{"seed": b.seed, "malleable_order": list(b.malleable_order),
                     "jobs": [{"index": j.index, "config": j.config.name, "submit": j.submit}
                              for j in b.jobs]} for b in batches],
        "summary": summary, "comparison": comparison, "published": PUBLISHED,
        "failures": failures, "gantt_run": {k: shown[k] for k in ("seed", "share", "policy")},
        "runs": runs,
    })
    show(render(summary, comparison, args.shares, args.policies, failures))
    slow = [r for r in runs if r["cpu_share"] is not None and r["cpu_share"] < SLOW_CPU_SHARE]
    if slow:
        show(f"{len(slow)} run(s) got less than {SLOW_CPU_SHARE:.0%} of the cores (something else "
              "ran on the machine; compare with care): " + ", ".join(
                  f"{r['share']}% {r['policy']} ({r['cpu_share']:.0%})" for r in slow))
    show(f"{len(runs)} run(s) in {elapsed:.0f} s")
    return 1 if failures else 0


parse = main.parse


if __name__ == "__main__":
    sys.exit(main())
