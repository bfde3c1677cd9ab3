"""Grow and shrink through Slurm beside the local launcher, in one run.

    python -m benchmarks.slurm_resize [--repeats R] [--json FILE] [--quick]

One evolving program asks for one more place (``apgas.request_grow(1)``, timed
until the place has joined) and gives it back (``apgas.release_places``,
timed until it returns), R times in a row, on two routes:

- ``slurm``: ``APGAS_COMMUNICATOR=slurm`` inside a 1-node exclusive
  ``salloc`` of a private 3-node Slurm on 127.0.0.1 (slurmctld, slurmd,
  slurmdbd on MariaDB, munge: ``tests/_slurm.py``): the grow is a Slurm
  expansion job merged into the program's job, then ``srun`` starts the
  place; the release stops the place, then ``scontrol update`` gives the
  node back.
- ``local``: the same program under a scripted scheduler
  (:class:`apgas.testing.FakeScheduler`) that grants each request at once
  with a ``grow`` order; places are local subprocesses.

Figures are medians of the R rounds, and the first grow alone (in later
rounds the node given back just before comes again, and Slurm refuses steps
on it within the second it was given back, so the communicator waits for the
next second); nothing is asserted. Without Slurm (or
without slurmdbd, which repeated resizes need) the slurm row says why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from apgas.testing import FakeScheduler
from benchmarks._common import median, run_probe, scratch
from benchmarks._harness import Column, Run, Table, harness, show, skipped

log = logging.getLogger("benchmarks.slurm_resize")
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300.0

PROBE = '''
import json, sys, time
import apgas

class Chosen(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return list(chosen) if chosen is not None else apgas.places()[-n:]

def main():
    apgas.define_malleable_handler(Chosen())
    grows, shrinks = [], []
    for _ in range(int(sys.argv[1])):
        t = time.perf_counter()
        added = apgas.request_grow(1).result(timeout=120)
        grows.append(time.perf_counter() - t)
        t = time.perf_counter()
        apgas.release_places(added)
        shrinks.append(time.perf_counter() - t)
    return {"grow": grows, "shrink": shrinks, "places": len(apgas.places())}

print("PROBE " + json.dumps(apgas.run(main)), flush=True)
'''


def _run(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    return run_probe(command, env, ROOT, RUN_TIMEOUT_S, lambda probe: probe["places"] == 1)


def _local(probe: Path, rounds: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from orders import free_address

    job = free_address()

    def grant(message: str, fake: FakeScheduler) -> str | None:
        if message.startswith("Evolving;Request"):
            fake.later("grow 1 localhost")
            return "ok 1"
        return None

    with FakeScheduler(grant, job=job) as fake:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "APGAS_SCHEDULER": "{}:{}".format(*fake.address),
               "APGAS_MALLEABLE_LISTEN": "{}:{}".format(*job)}
        return _run([sys.executable, str(probe), str(rounds)], env)


def _slurm(probe: Path, rounds: int, work: Path, stack: contextlib.ExitStack) -> dict[str, Any] | str:
    sys.path.insert(0, str(ROOT / "tests"))
    from _slurm import SlurmUnavailable, start_slurm

    try:
        slurm = start_slurm(work / "slurm")
    except (SlurmUnavailable, RuntimeError) as e:
        return f"skipped: {e}"
    stack.callback(slurm.stop)
    if not slurm.resizable:
        return f"skipped: {slurm.not_resizable}"
    env = {**slurm.env, "PYTHONUNBUFFERED": "1", "APGAS_COMMUNICATOR": "slurm",
           **{k: v for k, v in os.environ.items() if k.startswith("PY")}}
    return _run(["salloc", "--nodes=1", "--ntasks-per-node=1", "--exclusive", "--quiet", "--time=10",
                 "--kill-command=SIGKILL", sys.executable, str(probe), str(rounds)], env)


TABLE = Table([Column("route", 7, left=True), Column("first grow 1", 14, ".3f", " s"),
               Column("grow 1 (median)", 17, ".3f", " s"), Column("max", 9, ".3f", " s"),
               Column("shrink 1 (median)", 19, ".3f", " s"), Column("max", 9, ".3f", " s")])


@harness("benchmarks.slurm_resize", __doc__, Path("bench-results/slurm_resize.json"), "3 rounds")
def main(run: Run) -> None:
    rounds = run.args.repeats or (3 if run.args.quick else 10)
    with scratch("apgas-slurm-resize-") as (work, stack):
        probe = work / "probe.py"
        probe.write_text(PROBE)
        runs = {"local": _local(probe, rounds), "slurm": _slurm(probe, rounds, work, stack)}
    routes: dict[str, Any] = {}
    lines = []
    for name, got in runs.items():
        if isinstance(got, str):
            routes[name] = {"skipped": got}
            lines.append(skipped(name, got))
            continue
        row = {"grow": median(got["grow"]), "grow_max": max(got["grow"]), "grow_first": got["grow"][0],
               "shrink": median(got["shrink"]), "shrink_max": max(got["shrink"]), "samples": got}
        routes[name] = row
        lines.append([name, *(row[k] for k in ("grow_first", "grow", "grow_max", "shrink", "shrink_max"))])
    run.report.update(rounds=rounds, routes=routes)
    show("\n" + TABLE.render(lines))


if __name__ == "__main__":
    sys.exit(main())
