"""What the dashboard costs the scheduler daemon, and screenshots of its views.

    python -m benchmarks.dashboard [--nodes 8] [--jobs 10] [--spread 20] [--seed 0]
        [--idle 20] [--pages 0,1,4] [--logs 100,1000,5000] [--json FILE]
        [--screenshots DIR] [--quick]

The daemon runs as its own process (``python -m apgas_scheduler serve
--dashboard``) on ``--nodes`` virtual nodes (all this machine) under the
malleable policy; its CPU time is read from ``/proc/<pid>/stat`` (user +
system, without its jobs). Measured:

* idle (no job) for ``--idle`` seconds with 0, 1 and 4 pages open;
* a batch of ``--jobs`` malleable GLB jobs (``benchmarks.jobbatch``'s job
  table, seeded, submitted over ``--spread`` seconds, grown and shrunk by the
  policy) with 0, 1 and 4 pages open, each on a fresh daemon, in that order;
* one model of a long log: simulated batches of ``--logs`` jobs on 64 nodes,
  and so the most models a second the daemon makes for it (its gaps stretch
  to five times a model's cost).

Pages are headless Chromium tabs (``benchmarks._browser``) kept open on the
live page. The table gives the daemon's CPU seconds, wall seconds and CPU
share (CPU / wall) of each run. With ``--screenshots DIR``, the run with one
page saves the live page once a grow and a shrink are on it
(``dashboard_live.png``), then ``report --html`` of that run
(``dashboard_report.png``) and the timeline of one of its jobs, which ran
with ``APGAS_TIMELINE`` (``timeline.png``). A batch in which the policy never
shrank a job while another ran (few jobs, a long ``--spread``) still gets its
``dashboard_live.png``, of the page at the batch's end, and a warning says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from apgas import auth
from apgas_scheduler.client import request

from ._browser import headless_chromium
from ._harness import Column, Run, Table, harness, show
from .jobbatch import job_spec, make_batch

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def daemon_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` itself (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclasses.dataclass
class Daemon:
    proc: subprocess.Popen
    address: tuple[str, int]
    url: str
    key: str
    directory: Path

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        return request(self.address, op, key=self.key, **fields)


@contextlib.contextmanager
def daemon(directory: Path, nodes: int):
    """A scheduler daemon with its dashboard on a free loopback port."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "operator.key"
    env = {**os.environ, "APGAS_LOCAL_HOSTS": "*"}
    with open(directory / "daemon.err", "w") as err:  # the daemon holds its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", f"node[0-{nodes - 1}]",
             "--port", "0", "--policy", "malleable", "--interval", "0.5", "--resize-interval", "2",
             "--dashboard", "0", "--key-file", str(key), "--socket", str(directory / "s.sock"),
             "--output-dir", str(directory / "out"), "--log", str(directory / "events.jsonl")],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
    try:
        listening = re.search(r"listening on (\S+):(\d+)", proc.stdout.readline())
        url = proc.stdout.readline().strip().removeprefix("dashboard at ")
        if not listening or not url.startswith("http://"):
            raise RuntimeError(f"the daemon did not start: see {directory / 'daemon.err'}")
        yield Daemon(proc, (listening[1], int(listening[2])), url, auth.read_secret(key), directory)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def pages(url: str, count: int):
    """``count`` open tabs of the live page (one browser), or none."""
    if count == 0:
        yield None
        return
    with headless_chromium(1400, 1300) as web:
        web.get(url)
        for _ in range(count - 1):
            web.switch_to.new_window("tab")
            web.get(url)
        web.switch_to.window(web.window_handles[0])
        yield web


def idle_cost(directory: Path, nodes: int, seconds: float, count: int) -> dict[str, Any]:
    with daemon(directory, nodes) as d, pages(d.url, count):
        time.sleep(1.0)  # the pages load
        cpu0, t0 = daemon_cpu(d.proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu, wall = daemon_cpu(d.proc.pid) - cpu0, time.monotonic() - t0
    return {"run": "idle", "pages": count, "cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
            "cpu_share": round(cpu / wall, 4)}


def batch_cost(directory: Path, args: argparse.Namespace, count: int,
               shots: Path | None) -> dict[str, Any]:
    batch = make_batch(args.seed, args.jobs, args.spread)
    timeline = directory / "timeline.jsonl"
    with daemon(directory, args.nodes) as d, pages(d.url, count) as web:
        cpu0, t0 = daemon_cpu(d.proc.pid), time.monotonic()
        ids: list[int] = []

        def submit_all() -> None:
            for job in batch.jobs:
                time.sleep(max(0.0, job.submit - (time.monotonic() - t0)))
                spec = job_spec(job, True, directory / f"result-{job.index}.json", args.nodes)
                if job.index == 0:
                    spec = dataclasses.replace(spec, env=spec.env + (("APGAS_TIMELINE",
                                                                      str(timeline)),))
                ids.append(d.ask("submit", job=spec.to_dict())["id"])

        submitter = threading.Thread(target=submit_all, daemon=True)
        submitter.start()
        shot = web is not None and shots is not None and count == 1  # the run with one page
        marked = False  # a view with a grow and a shrink was saved
        while True:
            jobs = d.ask("status")["jobs"]
            if shot and sum(j["state"] == "running" for j in jobs) >= 2 and _marked(web):
                web.save_screenshot(str(shots / "dashboard_live.png"))  # the latest such view
                marked = True
            if not submitter.is_alive() and len(jobs) == len(batch.jobs) and all(
                    j["state"] in ("done", "failed", "cancelled") for j in jobs):
                break
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"the batch did not end in {args.timeout} s")
            time.sleep(0.5)
        cpu, wall = daemon_cpu(d.proc.pid) - cpu0, time.monotonic() - t0
        states = sorted(j["state"] for j in jobs)
        if shot and not marked:  # never silently without the picture
            time.sleep(2.5)  # the page's next update, with the last end
            web.save_screenshot(str(shots / "dashboard_live.png"))
            print(f"warning: no view of this batch showed a grow and a shrink while two jobs ran "
                  f"({sum(j['grows'] for j in jobs)} grow(s), {sum(j['shrinks'] for j in jobs)} "
                  f"shrink(s)); {shots / 'dashboard_live.png'} shows the page at the batch's end "
                  "(more --jobs or a shorter --spread make the policy shrink)", file=sys.stderr)
    row = {"run": "batch", "pages": count, "cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
           "cpu_share": round(cpu / wall, 4), "jobs": len(jobs),
           "done": states.count("done"), "grows": sum(j["grows"] for j in jobs),
           "shrinks": sum(j["shrinks"] for j in jobs)}
    if count == 1 and shots is not None:
        _static_shots(directory, timeline, shots)
    return row


def _marked(web: Any) -> bool:
    """The live page shows a grow and a shrink."""
    return all(web.find_elements("css selector", f"#nodes .mark.{kind}") for kind in ("grow", "shrink"))


def _static_shots(directory: Path, timeline: Path, shots: Path) -> None:
    report = directory / "report.html"
    subprocess.run([sys.executable, "-m", "apgas_scheduler", "report",
                    str(directory / "events.jsonl"), "--html", str(report)],
                   check=True, capture_output=True, timeout=120, cwd=ROOT)
    views = [(report, "dashboard_report.png")]
    if timeline.exists():
        drawn = directory / "timeline.html"
        subprocess.run([sys.executable, "-m", "apgas", "timeline", str(timeline), "--html",
                        str(drawn)], check=True, capture_output=True, timeout=120, cwd=ROOT)
        views.append((drawn, "timeline.png"))
    with headless_chromium(1400, 1300) as web:
        for page, name in views:
            web.get(page.as_uri())
            time.sleep(0.5)
            web.save_screenshot(str(shots / name))


def model_cost(jobs: int, nodes: int = 64) -> dict[str, Any]:
    """What one model of a long log costs: a simulated batch of ``jobs``
    malleable jobs (the simulator's events are the live scheduler's kinds)."""
    from apgas_scheduler.live.dashboard import COST_FACTOR, MIN_GAP
    from apgas_scheduler.live.views import dashboard_model
    from apgas_scheduler.policies import get_policy
    from apgas_scheduler.sim.simulator import Simulator
    from apgas_scheduler.sim.workload import apgas_job_batch

    batch = apgas_job_batch(0, jobs=jobs, nodes=nodes, spread=60.0 * jobs, share=1.0)
    events = Simulator(nodes, get_policy("malleable"), record_events=True).run(batch).events
    began = time.perf_counter()
    text = json.dumps(dashboard_model(events), separators=(",", ":"))
    cost = time.perf_counter() - began
    return {"jobs": jobs, "nodes": nodes, "events": len(events), "model_s": round(cost, 4),
            "model_kib": len(text) // 1024,
            "max_models_per_s": round(1 / max(MIN_GAP, COST_FACTOR * cost), 2)}


COSTS = Table([Column("jobs", 6), Column("events", 8, gap=" "), Column("one model s", 12, ".3f", gap=" "),
               Column("model KiB", 10, gap=" "), Column("models/s at most", 17, ".2f", gap=" ")])
RUNS = Table([Column("run", 6, left=True), Column("pages", 5, gap=" "), Column("daemon CPU s", 13, ".2f", gap=" "),
              Column("wall s", 8, ".1f", gap=" "), Column("CPU share", 10, ".2f", "%", gap=" "),
              Column("jobs", 0, left=True, gap="  ")])


def cost_table(rows: list[dict[str, Any]]) -> str:
    return COSTS.render([r[k] for k in ("jobs", "events", "model_s", "model_kib", "max_models_per_s")]
                        for r in rows)


def table(rows: list[dict[str, Any]]) -> str:
    return RUNS.render([r["run"], r["pages"], r["cpu_s"], r["wall_s"], 100 * r["cpu_share"],
                        f"{r['done']}/{r['jobs']} done, {r['grows']} grows, {r['shrinks']} shrinks"
                        if r["run"] == "batch" else ""] for r in rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--spread", type=float, default=20.0, help="submissions over S s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--idle", type=float, default=20.0, help="s of each idle measurement")
    parser.add_argument("--pages", default="0,1,4", help="pages open, one run each")
    parser.add_argument("--logs", default="100,1000,5000",
                        help="simulated batches whose one model is timed (jobs each)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=Path("bench-results/dashboard.json"))
    parser.add_argument("--screenshots", type=Path, default=None, metavar="DIR")
    parser.add_argument("--quick", action="store_true", help="3 jobs, 5 s idle: a smoke test")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    for name in ("pages", "logs"):
        try:
            setattr(args, name, [int(p) for p in getattr(args, name).split(",") if p])
        except ValueError:
            return f"--{name}: expected comma-separated counts, got {getattr(args, name)!r}"
    if args.quick:
        args.jobs, args.idle, args.spread, args.logs = 3, 5.0, 4.0, [100]
    if args.screenshots and 1 not in args.pages:
        return "--screenshots are taken in the run with one page: include 1 in --pages"
    return None


@harness("benchmarks.dashboard", __doc__, repeats=False,
         options=options, check=check, loggers=(), whole_doc=True, needs=lambda args: ["numba",
         *(["selenium"] if args.screenshots or any(args.pages) else [])])
def main(run: Run) -> None:
    args = run.args
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="apgas-dashboard-bench-") as tmp:
        for count in args.pages:
            rows.append(idle_cost(Path(tmp) / f"idle-{count}", args.nodes, args.idle, count))
            show(table(rows[-1:]).splitlines()[-1])
        for count in args.pages:
            rows.append(batch_cost(Path(tmp) / f"batch-{count}", args, count, args.screenshots))
            show(table(rows[-1:]).splitlines()[-1])
    show(table(rows))
    costs = [model_cost(n) for n in args.logs]
    show(cost_table(costs))
    run.report.update({"nodes": args.nodes, "jobs": args.jobs, "seed": args.seed, "spread": args.spread,
                       "rows": rows, "models": costs})


parse = main.parse


if __name__ == "__main__":
    sys.exit(main())
