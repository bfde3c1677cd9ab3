"""Evolving programs under the live scheduler: how fast the asks are answered,
and what an evolving GLB job gains.

    python -m benchmarks.evolving [--repeats R] [--json FILE] [--quick]

1. **Latencies.** A scheduler in this process (policy ``evolving``, 4 node
   names that are all this machine, scheduling pass every 5 s as by default:
   an ask wakes it) runs one evolving job that measures, at place 0, R times
   each: ``request_grow(1)`` until the place has joined, ``release_places``
   of that place, ``check_status`` answered ``expand`` (until the places
   have joined), the same answered ``shrink`` when a rigid job is queued,
   and a check answered ``none``.
2. **Evolving GLB.** UTS (depth 13, 1 worker per place) as a job of a
   2-node pool, three ways, one after the other, R times each in turn:
   rigid on 1 node, rigid on 2 nodes, and evolving (``--evolving``, 1 to 2
   nodes: it starts on 1 and asks for the second when its place is busy).
   Reported: the computation's time (from the job's JSON), its turnaround
   under the scheduler, the places it ended with, and whether the result was
   correct. The machine has 2 cores, so 2 nodes is all the real capacity.

Medians of R; times are reported, never asserted on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.policies import get_policy
from benchmarks._common import median
from benchmarks._harness import Run, harness, show

log = logging.getLogger("benchmarks.evolving")

ROOT = Path(__file__).resolve().parent.parent
JOB_TIMEOUT = 300.0
UTS_ARGS = ("--depth", "13")

# The job of part 1: every figure is measured at place 0, in seconds.
LATENCY_JOB = textwrap.dedent("""\
    import json, os, sys, time
    from pathlib import Path
    import apgas

    class Handler(apgas.MalleableHandler):
        def pre_shrink(self, n, chosen=None):
            return chosen if chosen is not None else apgas.places()[-n:]

    def timed(fn):
        start = time.perf_counter()
        value = fn()
        return time.perf_counter() - start, value

    def main():
        repeats = int(os.environ["REPEATS"])
        out = Path(os.environ["RESULT"])
        figures = {"request_grow": [], "release": [], "check_expand": [], "check_shrink": [],
                   "check_none": []}
        apgas.define_malleable_handler(Handler())
        for _ in range(repeats):
            seconds, added = timed(lambda: apgas.request_grow(1).result(timeout=60))
            figures["request_grow"].append(seconds)
            figures["release"].append(timed(lambda: apgas.release_places(added))[0])
            seconds, count = timed(lambda: apgas.check_status(1, 4))
            assert count == 4, count
            figures["check_expand"].append(seconds)
            seconds, count = timed(lambda: apgas.check_status(4, 4))
            assert count == 4, count
            figures["check_none"].append(seconds)
            (out.parent / "queue").write_text("")       # the driver queues a rigid job
            while not (out.parent / "queued").exists():
                time.sleep(0.01)
            (out.parent / "queued").unlink()
            seconds, count = timed(lambda: apgas.check_status(1, 4))
            figures["check_shrink"].append(seconds)
            while len(apgas.places()) > 1:               # back to one place for the next round
                apgas.release_places(apgas.places()[-1:])
        out.write_text(json.dumps(figures))

    apgas.run(main)
""")


def _wait_job(sched: Scheduler, job_id: int, timeout: float = JOB_TIMEOUT,
              on_wait: Any = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = next(j for j in sched.status()["jobs"] if j["id"] == job_id)
        if job["state"] not in ("queued", "running"):
            return job
        if time.monotonic() > deadline:
            sched.cancel(job_id)
            raise RuntimeError(f"job {job_id} ({job['name']}) did not end within {timeout} s")
        if on_wait is not None:
            on_wait()
        time.sleep(0.02)


def _scheduler(nodes: int, tmp: Path, interval: float = 5.0) -> Scheduler:
    names = [f"node{i}" for i in range(nodes)]
    os.environ["APGAS_LOCAL_HOSTS"] = ",".join(names)
    return Scheduler(names, get_policy("evolving"), interval=interval, output_dir=tmp / "out",
                     events=tmp / "events.jsonl").start()


def latencies(repeats: int) -> dict[str, dict[str, float | None]]:
    """Part 1: the job measures its asks; the driver queues a rigid job for each shrink."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "job.py").write_text(LATENCY_JOB)
        sched = _scheduler(4, tmp)
        try:
            env = (("APGAS_CHECK_INHIBIT", "0"), ("APGAS_THREADS", "2"), ("REPEATS", str(repeats)),
                   ("RESULT", str(tmp / "result.json")))
            job_id = sched.submit(JobSpec("latency", (sys.executable, str(tmp / "job.py")),
                                          "evolving", 1, 4, JOB_TIMEOUT, env, str(ROOT)))

            def queue_rigid() -> None:
                if (tmp / "queue").exists():
                    (tmp / "queue").unlink()
                    sched.submit(JobSpec("rigid", (sys.executable, "-c", "pass"), "rigid", 3, 3,
                                         30.0, (), str(ROOT)))
                    (tmp / "queued").write_text("")

            job = _wait_job(sched, job_id, on_wait=queue_rigid)
            if job["state"] != "done":
                raise RuntimeError(f"the latency job {job['state']}: {job['reason']}; "
                                   f"{(tmp / 'out' / f'job-{job_id}.err').read_text()[-2000:]}")
            figures = json.loads((tmp / "result.json").read_text())
        finally:
            sched.shutdown()
    return {k: {"median": median(v), "min": min(v), "max": max(v)} for k, v in figures.items()}


def glb_runs(repeats: int) -> dict[str, dict[str, Any]]:
    """Part 2: UTS rigid on 1 and 2 nodes and evolving over 1..2, in turn."""
    kinds = {"rigid 1 node": ("rigid", 1, 1, ()), "rigid 2 nodes": ("rigid", 2, 2, ()),
             "evolving 1..2 nodes": ("evolving", 1, 2, ("--evolving",))}
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sched = _scheduler(2, tmp, interval=0.5)
        try:
            for r in range(repeats):
                for kind, (cls, low, high, extra) in kinds.items():
                    result = tmp / f"{r}-{len(samples[kind])}-{cls}{low}.json"
                    command = (sys.executable, "-m", "glb.apps", "uts", *UTS_ARGS, "--workers", "1",
                               *extra, "--json", str(result))
                    job_id = sched.submit(JobSpec(kind, command, cls, low, high, JOB_TIMEOUT,
                                                  (("APGAS_THREADS", "2"),), str(ROOT)))
                    job = _wait_job(sched, job_id)
                    record = json.loads(result.read_text()) if result.exists() else {}
                    samples[kind].append({
                        "state": job["state"], "correct": record.get("correct"),
                        "seconds": record.get("seconds"), "turnaround": job["end"] - job["submit"],
                        "grows": job["grows"], "shrinks": job["shrinks"]})
                    log.info("%s: %s, %.2f s computing, %d grow(s), %d shrink(s)", kind,
                             job["state"], record.get("seconds") or float("nan"), job["grows"],
                             job["shrinks"])
        finally:
            sched.shutdown()
    return {kind: {"seconds": median([s["seconds"] for s in runs if s["seconds"] is not None]),
                   "turnaround": median([s["turnaround"] for s in runs]),
                   "grows": median([s["grows"] for s in runs]),
                   "shrinks": median([s["shrinks"] for s in runs]),
                   "all_correct": all(s["correct"] is True and s["state"] == "done" for s in runs),
                   "runs": runs}
            for kind, runs in samples.items()}


def render(lat: dict[str, dict[str, float | None]], glb: dict[str, dict[str, Any]]) -> str:
    lines = ["ask (at place 0, median / min / max)         seconds"]
    names = {"request_grow": "request_grow(1) until the place joined",
             "release": "release_places of one place",
             "check_expand": "check_status answered expand 1 -> 4",
             "check_shrink": "check_status answered shrink (a job queued)",
             "check_none": "check_status answered none"}
    for key, label in names.items():
        f = lat[key]
        lines.append(f"{label:<45} {f['median']:.3f} / {f['min']:.3f} / {f['max']:.3f}")
    base = glb["rigid 1 node"]["seconds"]
    lines += ["", f"UTS {' '.join(UTS_ARGS)} on a 2-node pool   computing  speed-up  turnaround  "
                  "grows/shrinks  correct"]
    for kind, g in glb.items():
        speed = base / g["seconds"] if base and g["seconds"] else float("nan")
        lines.append(f"{kind:<38} {g['seconds']:8.2f} s  {speed:7.2f}x  {g['turnaround']:8.2f} s  "
                     f"{g['grows']:g}/{g['shrinks']:g}{'':10}{g['all_correct']}")
    return "\n".join(lines)


@harness("benchmarks.evolving", __doc__, Path("bench-results/evolving.json"), "1 repeat of each",
         needs=lambda args: ["numba"], loggers=("benchmarks.evolving",))
def main(run: Run) -> int:
    repeats = run.args.repeats or (1 if run.args.quick else 5)
    started = time.monotonic()
    lat = latencies(repeats)
    glb = glb_runs(repeats)
    show(render(lat, glb))
    run.report.update(repeats=repeats, latencies=lat, glb=glb, elapsed_seconds=time.monotonic() - started)
    return 0 if all(g["all_correct"] for g in glb.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
