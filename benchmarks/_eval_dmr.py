"""DMR's workload study (Iserte et al., Table 4): fixed against flexible, at scale and in miniature.

    python -m benchmarks.evaluation --dmr [--out DIR]        # simulated: evaluation_dmr.json
    python -m benchmarks.evaluation --dmr-live [--out DIR]   # live: evaluation_dmr_live.json

Both draw their jobs with :func:`apgas_scheduler.sim.dmr_workload.dmr_workload`
(DMR's mix of CG, Jacobi and N-body, Table 1's sizes, Poisson arrivals); the
"fixed" version runs them rigid at their submitted size under EASY
backfilling (Slurm's backfill), the "flexible" one malleable under our DMR
policy (``dmr``, factor 2).

**Simulated** (:func:`simulate_study`): 50, 100, 200 and 400 jobs, seeds 0-4, on
64 nodes of 16 cores (our assumption: the paper gives no node count; 64 holds
its largest jobs, 32 nodes, twice, and its Fig. 6 peaks at 64 allocated nodes),
mean arrival 10 s, the fitted job models (:data:`~apgas_scheduler.sim.dmr_workload.MODELS`,
Amdahl) and their resize cost, a scheduling pass every 15 s (Table 1's
scheduling period, also DMR's checking inhibitor), and again with linear
speed-up (:data:`LINEAR_MODELS`). Mean job completion (submit to end), wait and
execution time, makespan, utilization (allocated node-seconds over nodes x
makespan: Table 4's "resource utilization rate"), mean allocated nodes and
resizes, the mean over the seeds (with their range), beside Table 4.

**Live** (:func:`live_study`): three batches (seeds 0-2) of 8 jobs of the mix,
each run fixed and then flexible on 8 virtual nodes of this machine (every
node is this machine), with Table 1 divided by 8 as the cluster is (CG and
Jacobi 1-4 nodes preferring 1, N-body 1-2 preferring 1) and a mean of 0.5 s
between arrivals (all come within seconds, so that a queue forms, as in
DMR's workloads). The jobs are the real applications of :mod:`apgas.arrays.apps`
at small sizes (:data:`LIVE_PROBLEMS`) under an in-process live scheduler, as
``benchmarks.jobbatch`` runs its batches (whose helpers it uses). Fixed jobs
run ``python -m apgas.arrays.apps APP ... --json`` rigid; flexible jobs the same
with ``--check``: they call ``apgas.check_status`` every few iterations with
their sizes (the app's Table 1 sizes divided by 8: :func:`job_main` sets them
and runs the app's own command line), each call at most once a second
(``APGAS_CHECK_INHIBIT``). Every job's printed values must equal its app's
``sequential(...)`` reference bit for bit. Completion, wait, execution,
allocated node-seconds and resizes come from the scheduler's event log. Two
cores carry all eight nodes: the figures show the mechanism at work, not a
cluster's speed-up.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from apgas_scheduler.policies import get_policy
from apgas_scheduler.sim.dmr_workload import (
    DMR_TABLE4,
    LINEAR_MODELS,
    MODELS,
    JobModel,
    dmr_workload,
    reconfig,
    reconfig_errors,
)
from apgas_scheduler.sim.simulator import Simulator
from apgas_scheduler.sim.workload import SimJob
from benchmarks._harness import Run

__all__ = ["SIM_SIZES", "SIM_NODES", "SIM_SEEDS", "LIVE_PROBLEMS", "simulate", "simulate_study",
           "live_batch", "live_study", "main_sim", "main_live", "job_main"]

ROOT = Path(__file__).resolve().parent.parent
SIM_SIZES = (50, 100, 200, 400)
SIM_NODES = 64
SIM_SEEDS = 5
PERIOD = 15.0            # s: Table 1's scheduling period (CG, Jacobi)
FACTOR = 2
METRICS = ("mean_completion", "mean_wait", "mean_execution", "makespan", "utilization",
           "mean_allocated_nodes", "resizes")
TABLE4_KEYS = ("utilization", "mean_wait", "mean_execution", "mean_completion")

LIVE_NODES = 8
LIVE_SCALE = 8           # DMR's 64 nodes -> 8: Table 1 divided by 8
LIVE_JOBS = 8
LIVE_SEEDS = (0, 1, 2)
LIVE_KEYS = ("mean_completion", "mean_wait", "mean_execution", "makespan", "node_seconds")
LIVE_ARRIVAL = 0.5
LIVE_PROBLEMS: dict[str, dict[str, int]] = {
    "cg": {"n": 700, "iterations": 300}, "jacobi": {"n": 1000, "iterations": 1500},
    "nbody": {"n": 3000, "steps": 25}}
LIVE_CHECK_EVERY = {"cg": 20, "jacobi": 50, "nbody": 1}
LIVE_INHIBIT = 1.0       # s between two check_status calls of a job
LIVE_RESIZE_INTERVAL = 2.0  # the policy's own asks (more than the jobs' checks: they come first)
LIVE_TIMEOUT = 300.0


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _pct(new: float | None, old: float | None) -> float | None:
    return 100.0 * (new - old) / old if new is not None and old else None


# -- simulated -------------------------------------------------------------------------------------

OTHER_POLICIES = ("thrifty", "malleable")
"""Our policy and minAgree, run on the flexible workloads beside DMR's own."""


def simulate(jobs: Sequence[SimJob], flexible: bool, nodes: int = SIM_NODES,
             models: Mapping[str, JobModel] | None = None,
             other: str | None = None) -> dict[str, float]:
    """One run: fixed jobs under EASY, flexible ones under ``dmr`` (factor 2), or under
    ``other`` (one of ``OTHER_POLICIES``, with the cost model); the figures."""
    if other is not None:
        options = {"reconfig_cost": reconfig(models)} if other == "thrifty" else {}
        policy = get_policy(other, resize_interval=PERIOD, **options)
    else:
        policy = (get_policy("dmr", factor=FACTOR, resize_interval=PERIOD) if flexible
                  else get_policy("easy", resize_interval=PERIOD))
    result = Simulator(nodes, policy, reconfig=reconfig(models), model="amdahl",
                       interval=PERIOD).run(jobs)
    m = result.metrics
    if m["jobs"] != len(jobs):
        raise RuntimeError(f"{len(jobs) - m['jobs']} of {len(jobs)} jobs did not end "
                           f"({m['rejected']} rejected)")
    runs = [r["end"] - r["start"] for r in result.jobs.values()]
    return {"mean_completion": m["mean_turnaround"], "mean_wait": m["mean_wait"],
            "mean_execution": _mean(runs), "makespan": m["makespan"],
            "utilization": m["utilization"], "mean_allocated_nodes": m["utilization"] * nodes,
            "node_seconds": m["utilization"] * nodes * m["makespan"],
            "resizes": float(m["reconfigurations"])}


def simulate_study(sizes: Sequence[int] = SIM_SIZES, seeds: int = SIM_SEEDS, nodes: int = SIM_NODES,
                   models: Mapping[str, JobModel] | None = None) -> dict[str, Any]:
    """Per size and version, the figures' mean over the seeds, their range, and the
    change of flexible against fixed in %, beside DMR's Table 4 where it has the size."""
    out: dict[str, Any] = {}
    for size in sizes:
        runs: dict[str, list[dict[str, float]]] = {"fixed": [], "flexible": []}
        others: dict[str, list[dict[str, float]]] = {name: [] for name in OTHER_POLICIES}
        for seed in range(seeds):
            for version in runs:
                jobs = dmr_workload(seed, size, nodes=nodes, flexible=version == "flexible",
                                    factor=FACTOR, models=models)
                runs[version].append(simulate(jobs, version == "flexible", nodes, models))
                if version == "flexible":
                    for name in OTHER_POLICIES:
                        others[name].append(simulate(jobs, True, nodes, models, other=name))
        row: dict[str, Any] = {}
        for version, found in runs.items():
            row[version] = {k: _mean([r[k] for r in found]) for k in (*METRICS, "node_seconds")}
            row[version]["range"] = {k: [min(r[k] for r in found), max(r[k] for r in found)]
                                     for k in METRICS}
        row["change_pct"] = {k: _pct(row["flexible"][k], row["fixed"][k]) for k in (*METRICS, "node_seconds")}
        row["others"] = {}
        for name, found in others.items():
            mean = {k: _mean([r[k] for r in found]) for k in METRICS}
            row["others"][name] = {**mean, "vs_fixed_pct": {k: _pct(mean[k], row["fixed"][k]) for k in METRICS},
                                   "vs_dmr_pct": {k: _pct(mean[k], row["flexible"][k]) for k in METRICS}}
        if size in DMR_TABLE4:
            dmr: dict[str, dict[str, float | None]] = {
                v: dict(zip(TABLE4_KEYS, DMR_TABLE4[size][v], strict=True)) for v in ("fixed", "flexible")}
            for v in ("fixed", "flexible"):
                dmr[v]["utilization"] = DMR_TABLE4[size][v][0] / 100
            dmr["change_pct"] = {k: _pct(dmr["flexible"][k], dmr["fixed"][k]) for k in TABLE4_KEYS}
            row["dmr"] = dmr
        out[str(size)] = row
    return out


def _cell(ours: float, dmr: float | None, unit: str) -> str:
    fmt = (lambda x: f"{x:.1%}") if unit == "%" else (lambda x: f"{x:,.0f} s")
    return fmt(ours) + (f" ({fmt(dmr)})" if dmr is not None else "")


def render_sim(study: dict[str, Any]) -> str:
    lines = ["| jobs | version | utilization (DMR) | mean wait (DMR) | mean execution (DMR) | "
             "mean completion (DMR) | makespan | mean allocated nodes | resizes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size, row in study.items():
        dmr = row.get("dmr", {})
        for version in ("fixed", "flexible", "change_pct"):
            ours, theirs = row[version], dmr.get(version, {})
            if version == "change_pct":
                cells = [f"**{ours[k]:+.0f}%**" + (f" ({theirs[k]:+.0f}%)" if k in theirs else "")
                         for k in TABLE4_KEYS]
                extra = [f"{ours[k]:+.0f}%" if ours[k] is not None else "-"
                         for k in ("makespan", "mean_allocated_nodes")] + ["-"]
                lines.append(f"| {size} | change | {' | '.join(cells)} | {' | '.join(extra)} |")
                continue
            cells = [_cell(ours[k], theirs.get(k), "%" if k == "utilization" else "s")
                     for k in TABLE4_KEYS]
            lines.append(f"| {size} | {version} | {' | '.join(cells)} | {ours['makespan']:,.0f} s | "
                         f"{ours['mean_allocated_nodes']:.1f} | {ours['resizes']:.0f} |")
    return "\n".join(lines)


def render_others(study: dict[str, Any]) -> str:
    """The flexible workloads under DMR's policy, ours and minAgree."""
    names = {"flexible": "dmr (DMR's)", "thrifty": "thrifty (ours)", "malleable": "minAgree"}
    lines = ["| jobs | policy | mean wait | mean completion | vs fixed | vs dmr | resizes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for size, row in study.items():
        fixed, dmr = row["fixed"], row["flexible"]
        for name, m in (("flexible", dmr), *row["others"].items()):
            lines.append(f"| {size} | {names[name]} | {m['mean_wait']:,.0f} s | "
                         f"{m['mean_completion']:,.0f} s | "
                         f"{_pct(m['mean_completion'], fixed['mean_completion']):+.0f}% | "
                         f"{_pct(m['mean_completion'], dmr['mean_completion']):+.0f}% | "
                         f"{m['resizes']:.0f} |")
    return "\n".join(lines)


def main_sim(run: Run, out: Path) -> int:
    """``--dmr``: the simulated study with the fitted and the linear models."""
    began = time.monotonic()
    studies = {"fitted": simulate_study(models=MODELS), "linear": simulate_study(models=LINEAR_MODELS)}
    cost = reconfig(MODELS)
    report = {"command": "python -m benchmarks.evaluation --dmr",
              "nodes": SIM_NODES, "cores_per_node": 16, "seeds": SIM_SEEDS, "factor": FACTOR,
              "period_s": PERIOD, "arrival_mean_s": 10.0,
              "models": {name: {app: vars(m) for app, m in ms.items()}
                         for name, ms in (("fitted", MODELS), ("linear", LINEAR_MODELS))},
              "reconfig": vars(cost), "reconfig_errors": reconfig_errors(MODELS),
              "studies": studies, "elapsed_seconds": time.monotonic() - began}
    run.write(out / "evaluation_dmr.json", report)
    for name, study in studies.items():
        print(f"DMR's workload, {name} models, {SIM_NODES} nodes, mean of {SIM_SEEDS} seeds; "
              "in brackets DMR's Table 4")
        print(render_sim(study))
        print(f"The flexible workloads under DMR's policy, ours and minAgree ({name} models)")
        print(render_others(study))
    return 0


# -- live --------------------------------------------------------------------------------------

def job_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks._eval_dmr job APP MIN,MAX,PREFERRED,FACTOR ARGS...``: the
    app's own command line (``python -m apgas.arrays.apps APP ARGS...``) with its
    ``--check`` sizes set to the ones given (Table 1 scaled to the pool)."""
    from apgas.arrays.apps import _cli

    if len(argv) < 2:
        raise SystemExit("usage: python -m benchmarks._eval_dmr job APP MIN,MAX,PREFERRED,FACTOR ARGS...")
    app, text, *rest = argv
    try:
        low, high, pref, factor = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"check sizes must be MIN,MAX,PREFERRED,FACTOR (whole numbers), got {text!r}") from None
    if not 1 <= low <= pref <= high or factor < 1:
        raise SystemExit(f"check sizes need 1 <= MIN <= PREFERRED <= MAX and FACTOR >= 1, got {text!r}")
    module: Any = _cli.load(app)
    module.CHECK = (low, high, pref, factor)
    return _cli.main([app, *rest])


def _command(job: SimJob, flexible: bool, problem: Mapping[str, int]) -> tuple[str, ...]:
    args = [x for k, v in problem.items() for x in (f"--{k}", str(v))]
    if not flexible:
        return (sys.executable, "-m", "apgas.arrays.apps", job.name, *args, "--json")
    sizes = f"{job.min_nodes},{job.max_nodes},{job.preferred},{FACTOR}"
    return (sys.executable, "-m", "benchmarks._eval_dmr", "job", job.name, sizes, *args, "--check",
            "--check-every", str(LIVE_CHECK_EVERY[job.name]), "--json")


def _printed(path: Path) -> dict[str, Any] | None:
    """The JSON line the app printed (``--json``), or None."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("{"):
            try:
                found: dict[str, Any] = json.loads(line)
                return found
            except json.JSONDecodeError:
                return None
    return None


def _kill_new(before: set[int]) -> int:
    """Kill (and count) the processes below this one that were not there before the run."""
    from benchmarks.jobbatch import _descendants

    left = [pid for pid in _descendants() if pid not in before]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def live_batch(jobs: Sequence[SimJob], flexible: bool, *, nodes: int = LIVE_NODES,
               problems: Mapping[str, Mapping[str, int]] = LIVE_PROBLEMS,
               timeout: float = LIVE_TIMEOUT) -> dict[str, Any]:
    """Run ``jobs`` (from :func:`dmr_workload`, their ``name`` the app) on ``nodes``
    virtual nodes under a fresh live scheduler with policy ``dmr``; the figures of the
    event log, each job's row and verdict, and the failures (none when all is well)."""
    from apgas.arrays.apps import _cli
    from apgas_scheduler.jobs import JobSpec
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.metrics import compute_metrics, node_intervals, read_events
    from benchmarks.jobbatch import _children_cpu, _descendants, _wait_ended

    references = {app: _cli.load(app).sequential(**problems[app]) for app in {j.name for j in jobs}}
    cpu_before = _children_cpu()
    ours_before = set(_descendants())  # a caller's processes (a test's fixtures) are not ours
    old = os.environ.get("APGAS_LOCAL_HOSTS")
    os.environ["APGAS_LOCAL_HOSTS"] = "*"  # every node name is this machine
    try:
        with tempfile.TemporaryDirectory(prefix="dmr-live-") as tmp:
            work = Path(tmp)
            sched = Scheduler([f"node{i}" for i in range(nodes)],
                              get_policy("dmr", factor=FACTOR, resize_interval=LIVE_RESIZE_INTERVAL),
                              events=work / "events.jsonl", interval=0.5, output_dir=work / "out")
            sched.start()
            stop = threading.Event()
            ids: dict[int, SimJob] = {}
            env = (("APGAS_CHECK_INHIBIT", str(LIVE_INHIBIT)),)

            def submit_all() -> None:
                t0 = time.monotonic()
                for job in jobs:
                    if stop.wait(max(0.0, t0 + job.submit - time.monotonic())):
                        return
                    spec = JobSpec(f"{job.name}#{job.id}", _command(job, flexible, problems[job.name]),
                                   job.cls, job.min_nodes, job.max_nodes, timeout, env, str(ROOT))
                    ids[sched.submit(spec)] = job

            submitter = threading.Thread(target=submit_all, name="dmr-live-submit", daemon=True)
            submitter.start()
            try:
                error = _wait_ended(sched, submitter, len(jobs), timeout)
            finally:
                stop.set()
                submitter.join()
                sched.shutdown()  # kills what still runs
                for t in list(sched._threads):
                    t.join(10)
            status = {j["id"]: j for j in sched.status()["jobs"]}
            leftovers = _kill_new(ours_before)
            events = read_events(work / "events.jsonl")
            rows, failures = [], ([error] if error else []) + (
                [f"leftover processes: {leftovers}"] if leftovers else [])
            for jid, job in sorted(ids.items()):
                s = status[jid]
                printed = _printed(work / "out" / f"job-{jid}.out")
                correct = printed is not None and printed.get("results") == references[job.name]
                if s["state"] != "done" or not correct:
                    failures.append(f"{s['name']}: {s['state']} ({s['reason']}), "
                                    f"result {'right' if correct else 'wrong or missing'}")
                rows.append({"name": s["name"], "app": job.name, "class": s["class"],
                             "min_nodes": s["min_nodes"], "max_nodes": s["max_nodes"],
                             "submit": s["submit"], "start": s["start"], "end": s["end"],
                             "state": s["state"], "grows": s["grows"], "shrinks": s["shrinks"],
                             "places": printed and printed.get("places"),
                             "final_places": printed and printed.get("final_places"),
                             "seconds": printed and printed.get("seconds"),
                             "results": printed and printed.get("results"), "correct": correct})
    finally:
        if old is None:
            os.environ.pop("APGAS_LOCAL_HOSTS", None)
        else:
            os.environ["APGAS_LOCAL_HOSTS"] = old
    m = compute_metrics(events)
    node_seconds = sum(b - a for ivs in node_intervals(events).values() for a, b, _ in ivs)
    ran = [r["end"] - r["start"] for r in rows if r["end"] is not None and r["start"] is not None]
    cpu = _children_cpu() - cpu_before
    return {"version": "flexible" if flexible else "fixed", "mean_completion": m["mean_turnaround"],
            "mean_wait": m["mean_wait"], "mean_execution": _mean(ran), "makespan": m["makespan"],
            "utilization": m["utilization"], "node_seconds": node_seconds,
            "mean_allocated_nodes": node_seconds / m["makespan"] if m["makespan"] else None,
            "grows": m["grows"], "shrinks": m["shrinks"], "by_state": m["by_state"],
            "overlaps": m["max_overlap_violations"], "checked": sum(r["correct"] for r in rows),
            "cpu_seconds": cpu, "cpu_share": cpu / (m["makespan"] * (os.cpu_count() or 1))
            if m["makespan"] else None, "failures": failures, "jobs": rows}


def live_study(seed: int = 0, jobs: int = LIVE_JOBS, nodes: int = LIVE_NODES, scale: int = LIVE_SCALE,
               arrival_mean: float = LIVE_ARRIVAL,
               problems: Mapping[str, Mapping[str, int]] = LIVE_PROBLEMS,
               timeout: float = LIVE_TIMEOUT) -> dict[str, Any]:
    """The same drawn jobs fixed, then flexible; each run's figures and the change in %."""
    runs = {}
    for version in ("fixed", "flexible"):
        batch = dmr_workload(seed, jobs, nodes=nodes, flexible=version == "flexible", factor=FACTOR,
                             arrival_mean=arrival_mean, scale=scale)
        runs[version] = live_batch(batch, version == "flexible", nodes=nodes, problems=problems,
                                   timeout=timeout)
    change = {k: _pct(runs["flexible"][k], runs["fixed"][k]) for k in LIVE_KEYS
              if runs["fixed"][k] and runs["flexible"][k] is not None}
    return {"seed": seed, "jobs": jobs, "nodes": nodes, "scale": scale, "arrival_mean_s": arrival_mean,
            "problems": {k: dict(v) for k, v in problems.items()}, "runs": runs, "change_pct": change}


def render_live(studies: Sequence[dict[str, Any]]) -> str:
    lines = ["| batch | version | mean completion | mean wait | mean execution | makespan | allocated "
             "node-seconds | mean allocated nodes | grows / shrinks | results checked | CPU share |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for study in studies:
        for r in study["runs"].values():
            lines.append(f"| seed {study['seed']} | {r['version']} | {r['mean_completion']:.1f} s | "
                         f"{r['mean_wait']:.1f} s | {r['mean_execution']:.1f} s | {r['makespan']:.1f} s | "
                         f"{r['node_seconds']:.0f} | {r['mean_allocated_nodes']:.2f} | "
                         f"{r['grows']} / {r['shrinks']} | {r['checked']} of {len(r['jobs'])} | "
                         f"{r['cpu_share']:.0%} |")
        c = study["change_pct"]
        lines.append(f"| seed {study['seed']} | change | " + " | ".join(
            f"**{c[k]:+.0f}%**" if k in c else "-" for k in LIVE_KEYS) + " | | | | |")
    return "\n".join(lines)


def main_live(run: Run, out: Path, seeds: Sequence[int] = LIVE_SEEDS) -> int:
    """``--dmr-live``: the miniature on this machine, one batch per seed; exit 1 if any
    job failed or was wrong."""
    began = time.monotonic()
    studies = [live_study(seed) for seed in seeds]
    mean_change = {k: _mean([s["change_pct"][k] for s in studies]) for k in LIVE_KEYS
                   if all(k in s["change_pct"] for s in studies)}
    report = {"command": "python -m benchmarks.evaluation --dmr-live",
              "batches": studies, "mean_change_pct": mean_change,
              "elapsed_seconds": time.monotonic() - began}
    run.write(out / "evaluation_dmr_live.json", report)
    print(f"DMR's workload in miniature: {LIVE_JOBS} jobs on {LIVE_NODES} virtual nodes "
          f"({os.cpu_count()} cores), Table 1 / {LIVE_SCALE}, {len(studies)} batch(es)")
    print(render_live(studies))
    print("mean change, flexible against fixed: " + ", ".join(f"{k} {v:+.0f}%" for k, v in mean_change.items()))
    failures = [f for s in studies for r in s["runs"].values() for f in r["failures"]]
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        sys.exit(job_main(sys.argv[2:]))
    sys.exit("python -m benchmarks._eval_dmr job APP MIN,MAX,PREFERRED,FACTOR ARGS... (a job of "
             "--dmr-live); the studies: python -m benchmarks.evaluation --dmr or --dmr-live")
