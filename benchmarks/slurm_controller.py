"""Our policy on Slurm (``apgas-scheduler slurm-controller``): a pending job's wait, and
the controller's own cost.

    python -m benchmarks.slurm_controller [--repeats R] [--json FILE] [--quick]

On a private 4-node Slurm on 127.0.0.1 (``tests/_slurm.py``, with slurmdbd), two
parts:

- **wait**: a malleable GLB job (``sbatch --nodes=1-4``, ``APGAS_COMMUNICATOR=slurm``,
  ``tests/slurm_job.py``'s ``controlled`` mode: ``UNITS`` units of work that each
  sleep, so that the nodes, which share this machine's cores, still scale) holds
  all nodes; a rigid 2-node job of 5 s is submitted. Without the controller Slurm
  starts it when the malleable job ends; with ``slurm-controller --policy thrifty
  --interval 1`` the malleable job is shrunk for it and grown back afterwards.
  Per round: the rigid job's wait (Slurm's start time less its submit time),
  the malleable job's run time, and the time until both are done.
- **cost**: the controller (in this process, every call counted) over a queue
  of 100 pending jobs behind a job that holds every node, for 60 s (20 s with
  ``--quick``) at the default interval of 5 s: calls to slurmctld a minute and
  the time of a pass. A pass over a generated ``squeue`` of 10,000 jobs (no
  Slurm) shows how the planning scales.

Without Slurm (or slurmdbd) the Slurm parts say why; nothing is asserted.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from apgas_scheduler.policies import get_policy
from apgas_scheduler.slurm import commands
from apgas_scheduler.slurm.controller import Controller
from apgas_scheduler.slurm.view import Planner, parse_jobs
from benchmarks._common import median, scratch
from benchmarks._harness import Column, Run, Table, harness, show, skipped

log = logging.getLogger("benchmarks.slurm_controller")
ROOT = Path(__file__).resolve().parent.parent
PROG = ROOT / "tests" / "slurm_job.py"
UNITS, UNIT_SLEEP = 800, 0.1  # 20 s on 4 places


def _squeue(cluster: Any) -> dict[str, dict[str, Any]]:
    out = cluster.run("squeue", "--json", timeout=30).stdout
    return {j["name"]: j for j in json.loads(out)["jobs"]}


def _until(what: str, predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _tail(path: Path) -> str:
    try:
        return path.read_text()[-2000:]
    except OSError as e:
        return str(e)


def _sbatch(cluster: Any, name: str, *options: str, env: dict[str, str] | None = None) -> int:
    if not any(o.startswith("--output=") for o in options):
        options = ("--output=/dev/null", *options)
    done = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", *options], env={**cluster.env, **(env or {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {name} failed: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def _round(cluster: Any, work: Path, controlled: bool) -> dict[str, float]:
    """One malleable job holding every node, one rigid 2-node job behind it."""
    signals = work / f"signals-{time.monotonic_ns()}"
    signals.mkdir()
    (signals / "go").touch()
    env = {"APGAS_COMMUNICATOR": "slurm", "APGAS_SLURM_POLL": "5", "MODE": "controlled",
           "SIGNALS": str(signals), "UNITS": str(UNITS), "UNIT_SLEEP": str(UNIT_SLEEP),
           "PYTHONPATH": str(ROOT)}
    (work / "malleable.out").unlink(missing_ok=True)
    _sbatch(cluster, "malleable", "--nodes=1-4", "--exclusive", "--time=10",
            f"--output={work / 'malleable.out'}", f"--wrap=exec {sys.executable} {PROG}", env=env)
    started = _until("the malleable job taking orders",
                     lambda: (j := _squeue(cluster).get("malleable", {})).get("comment")
                     == "apgas ready 0" and j, 90)
    controller = None
    if controlled:
        controller = subprocess.Popen([sys.executable, "-m", "apgas_scheduler", "slurm-controller",
                                       "--policy", "thrifty", "--interval", "1",
                                       "--resize-interval", "2"], env=cluster.env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _sbatch(cluster, "rigid", "--nodes=2", "--exclusive", "--time=1", "--wrap=sleep 5")
        rigid, ended = _watch(cluster, 300)
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(30)
    if "RESULT " not in _tail(work / "malleable.out"):
        raise RuntimeError(f"the malleable job gave no result: {_tail(work / 'malleable.out')}")
    return {"rigid_wait": rigid["start_time"] - rigid["submit_time"],
            "malleable_run": ended["malleable"] - started["start_time"],
            "makespan": max(ended.values()) - started["start_time"]}


def _watch(cluster: Any, timeout: float) -> tuple[dict[str, Any], dict[str, float]]:
    """Poll squeue (every 0.2 s) until both jobs are gone: the rigid job as it ran, and
    when each was last seen (Slurm forgets ended jobs here: MinJobAge)."""
    rigid: dict[str, Any] = {}
    ended: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the jobs did not end within {timeout:g} s")
        jobs, now = _squeue(cluster), time.time()
        if jobs.get("rigid", {}).get("job_state") == "RUNNING" and not rigid:
            rigid = jobs["rigid"]
        for name in ("malleable", "rigid"):
            if jobs.get(name, {}).get("job_state") in (None, *ENDED) and name not in ended:
                ended[name] = now
        time.sleep(0.2)
    return rigid, ended


def _cost(cluster: Any, seconds: float) -> dict[str, Any]:
    """The controller over 100 pending jobs, every call to slurmctld counted."""
    _sbatch(cluster, "holder", "--nodes=4", "--exclusive", "--time=5", "--wrap=sleep 300")
    _until("the holder running",
           lambda: _squeue(cluster).get("holder", {}).get("job_state") == "RUNNING", 60)
    for i in range(100):
        _sbatch(cluster, f"queued-{i}", "--nodes=1", "--time=1", "--wrap=sleep 1")
    passes: list[float] = []
    controller = Controller(Planner(get_policy("thrifty")), commands.run)
    stop = threading.Event()
    step = controller.step

    def timed(now: float | None = None) -> Any:
        started = time.perf_counter()
        try:
            return step(now)
        finally:
            passes.append(time.perf_counter() - started)

    controller.step = timed  # type: ignore[method-assign]
    # Slurm's commands of this process talk to the private cluster meanwhile
    with mock.patch.dict(os.environ, {k: cluster.env[k] for k in ("SLURM_CONF", "PATH")}):
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        controller.serve(5.0, stop)
        timer.cancel()
    cluster.run("scancel", "--partition=debug")
    calls = sum(controller.calls.values())
    return {"queued": 100, "seconds": seconds, "passes": len(passes),
            "calls": dict(controller.calls), "calls_per_minute": calls * 60 / seconds,
            "pass_median_s": median(passes), "pass_max_s": max(passes)}


def _planning(jobs: int) -> dict[str, Any]:
    """One pass of the planner over a generated squeue of ``jobs`` jobs on 1,024 nodes."""
    nodes = [f"n{i}" for i in range(1024)]
    entries = []
    for i in range(jobs):
        running = i < 200
        entries.append({"job_id": i + 1, "user_id": 1000 + i % 50, "name": f"j{i}",
                        "job_state": "RUNNING" if running else "PENDING", "partition": "p",
                        "nodes": ",".join(nodes[i * 5:i * 5 + 5]) if running else "",
                        "node_count": 5, "max_nodes": 10 if i % 3 == 0 else 0,
                        "time_limit": 60, "submit_time": 1000 + i, "start_time": 2000,
                        "resize_time": 0, "state_reason": "Priority",
                        "comment": "apgas ready 0" if i % 4 == 0 else "", "admin_comment": "",
                        "tres_req_str": "cpu=5,node=2"})
    document = {"jobs": entries}
    times = []
    for _ in range(5):
        planner = Planner(get_policy("thrifty"))
        started = time.perf_counter()
        parsed = parse_jobs(document)
        planner.plan(5000.0, parsed, nodes)
        times.append(time.perf_counter() - started)
    return {"jobs": jobs, "nodes": len(nodes), "pass_median_s": statistics.median(times)}


WAIT = Table([Column("controller", 11, left=True), Column("rigid job waited", 18, ".1f", " s"),
              Column("malleable run", 15, ".1f", " s"), Column("both done", 11, ".1f", " s")])
COST = Table([Column("what", 34, left=True), Column("calls/min", 11, ".1f"),
              Column("pass (median)", 15, ".4f", " s"), Column("max", 10, ".4f", " s")])


@harness("benchmarks.slurm_controller", __doc__, Path("bench-results/slurm_controller.json"),
         "one round, 20 s of cost")
def main(run: Run) -> None:
    rounds = run.args.repeats or (1 if run.args.quick else 3)
    sys.path.insert(0, str(ROOT / "tests"))
    from _slurm import SlurmUnavailable, start_slurm

    report: dict[str, Any] = {"rounds": rounds}
    wait_rows: list[Any] = []
    cost_rows: list[Any] = []
    with scratch("apgas-slurm-controller-") as (work, stack):
        work.chmod(0o755)
        try:
            cluster = start_slurm(work / "slurm", nodes=4, cpus=2)
            stack.callback(cluster.stop)
            reason = "" if cluster.resizable else cluster.not_resizable
        except (SlurmUnavailable, RuntimeError) as e:
            reason = str(e)
        if reason:
            wait_rows.append(skipped("both", reason))
            cost_rows.append(skipped("Slurm", reason))
            report["skipped"] = reason
        else:
            for controlled in (False, True):
                samples = [_round(cluster, work, controlled) for _ in range(rounds)]
                name = "thrifty" if controlled else "none"
                row = {k: median([s[k] for s in samples]) for k in samples[0]}
                report[name] = {**row, "samples": samples}
                wait_rows.append([name, row["rigid_wait"], row["malleable_run"], row["makespan"]])
                log.info("%s: %s", name, row)
            cost = _cost(cluster, 20.0 if run.args.quick else 60.0)
            report["cost"] = cost
            cost_rows.append(["100 queued jobs, --interval 5", cost["calls_per_minute"],
                              cost["pass_median_s"], cost["pass_max_s"]])
    planning = _planning(10_000)
    report["planning"] = planning
    cost_rows.append(["generated: 10,000 jobs, 1,024 nodes", None, planning["pass_median_s"], None])
    run.report.update(report)
    show("\n" + WAIT.render(wait_rows), "\n" + COST.render(cost_rows))


if __name__ == "__main__":
    sys.exit(main())
