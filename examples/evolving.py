"""An evolving program: it asks the scheduler for places, asks what to do
DMR-style, and gives a place back, while its places compute.

    python examples/evolving.py

Run like this, it plays both parts on this machine: it starts a scheduler on
four node names (policy ``evolving``), submits itself as an evolving job of
1 to 4 nodes, waits for the end and prints what the job printed and the
scheduler's record. Started by a scheduler (``APGAS_SCHEDULER`` is set), it
is the job. As a job file for ``python -m apgas_scheduler submit``:

    name = "evolving-example"
    command = ["python", "examples/evolving.py"]
    class = "evolving"
    min_nodes = 1
    max_nodes = 4
    walltime = 120
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import apgas

ROOT = Path(__file__).resolve().parent.parent


class Handler(apgas.MalleableHandler):
    """Nothing of this program's lives on a place between two steps, so a
    change needs no work moved: the handler only chooses and reports."""

    def pre_shrink(self, n, chosen=None):
        return chosen if chosen is not None else apgas.places()[-n:]

    def post_shrink(self, n, removed):
        print(f"  - released {[f'{p.id}@{p.host}' for p in removed]}", flush=True)

    def post_grow(self, n, continued, added):
        print(f"  + joined   {[f'{p.id}@{p.host}' for p in added]}", flush=True)


def sum_of_squares(upto: int) -> int:
    """One step of work, spread over every place there is now."""
    total = 0
    places = apgas.places()
    parts = [apgas.at(p, lambda k=k: sum(i * i for i in range(k, upto, len(places))))
             for k, p in enumerate(places)]
    for part in parts:
        total += part
    return total


def show(what: str) -> None:
    ids = [f"{p.id}@{p.host}" for p in apgas.places()]
    print(f"{what:<44} {len(ids)} place(s): {' '.join(ids)}", flush=True)


def job() -> None:
    apgas.define_malleable_handler(Handler())
    show("started")
    expected = sum(i * i for i in range(200_000))

    request = apgas.request_grow(2)  # returns at once
    print(f"asked for 2 more: {request}", flush=True)
    request.result(timeout=60)
    show("the request was granted")
    assert sum_of_squares(200_000) == expected

    too_many = apgas.request_grow(5)
    too_many.wait(30)
    print(f"asked for 5 more: {too_many.state}: {too_many.reason}", flush=True)

    count = apgas.check_status(1, 4)  # a node is idle and nobody waits: expand
    show(f"check_status(1, 4) answered, now {count}")
    show(f"check_status again at once: {apgas.check_status(1, 4)} (inhibited)")
    assert sum_of_squares(200_000) == expected

    hosts = apgas.release_places([apgas.places()[-1]])
    show(f"released the newest place, {hosts[0]} went back")
    assert sum_of_squares(200_000) == expected
    print("every step's result was exact", flush=True)


def drive() -> int:
    """Start a scheduler here, run this file as its evolving job, print the record."""
    from apgas_scheduler.jobs import JobSpec
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.metrics import compute_metrics, read_events
    from apgas_scheduler.policies import get_policy

    nodes = [f"node{i}" for i in range(4)]
    os.environ.setdefault("APGAS_LOCAL_HOSTS", ",".join(nodes))  # the names stand for this machine
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        sched = Scheduler(nodes, get_policy("evolving"), interval=0.5, events=events,
                          output_dir=Path(tmp) / "out", state_dir=Path(tmp) / "state")
        server = threading.Thread(target=sched.serve_forever, daemon=True)
        server.start()
        spec = JobSpec("evolving-example", (sys.executable, str(Path(__file__).resolve())),
                       "evolving", 1, 4, 120.0, (("APGAS_THREADS", "2"),), str(ROOT))
        job_id = sched.submit(spec)
        print(f"scheduler on {sched.address[0]}:{sched.address[1]} with node0..node3, "
              f"policy evolving; job {job_id} submitted\n", flush=True)
        while (state := _state(sched, job_id)) in ("queued", "running"):
            time.sleep(0.2)
        output = Path(tmp) / "out" / f"job-{job_id}.out"
        print(output.read_text() if output.exists() else "(no output)", end="")
        reason = next(j["reason"] for j in sched.status()["jobs"] if j["id"] == job_id)
        sched.shutdown()
        server.join(10)
        metrics = compute_metrics(read_events(events))
        print(f"\njob {job_id}: {state}{f' ({reason})' if reason else ''}; scheduler's record: {metrics['grows']} grow(s), "
              f"{metrics['shrinks']} shrink(s), utilization {metrics['utilization']:.0%}")
        if state != "done":
            errors = Path(tmp) / "out" / f"job-{job_id}.err"
            if errors.exists():
                print(errors.read_text()[-3000:], file=sys.stderr)
            return 1
    return 0


def _state(sched, job_id: int) -> str:
    return next(j["state"] for j in sched.status()["jobs"] if j["id"] == job_id)


if __name__ == "__main__":
    if os.environ.get("APGAS_SCHEDULER"):
        apgas.run(job)
    else:
        sys.exit(drive())
