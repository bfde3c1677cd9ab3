"""What each step of issue 44 bought: thread wake-ups and CPU per ``at()`` round trip and
per task, commit beside commit, with the bare ZeroMQ ping-pong in the same run.

    python -m benchmarks.handoffs [REV ...] [--rounds 2] [--calls 3000] [--tasks 30000] [--json FILE] [--quick]

Wall-clock latency on this shared 2-core machine moves by 20-50% from one
minute to the next; what a design change removes is steadier: the context
switches of both processes (a thread that sleeps and is woken is a voluntary
switch) and the CPU they spend, per operation. For each tree (every REV,
checked out into a temporary git worktree, then this tree) a fresh process
runs two places and measures, from ``getrusage`` at both places:

- ``at(1, noop)`` from place 0's main thread, ``--calls`` times;
- one finish over ``--tasks`` no-op tasks dealt to places 0 and 1.

The bare floor is a pyzmq DEALER/ROUTER ping-pong of 100 bytes between two
processes, counted the same way. The trees take turns ``--rounds`` times;
medians over the rounds. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from benchmarks._common import checked_out, run_in_tree
from benchmarks._harness import Column, Run, Table, compared, harness

log = logging.getLogger("benchmarks.handoffs")
RUN_TIMEOUT_S = 900
# before issue 44; the call run where it is read; + batches; + reply channels
DEFAULT_REVS = ("83dba40", "eba9091", "32df8c4", "2664aef")

# Runs in the measured tree's own Python path; needs only apgas.run, at and async_at.
PROBE = """
import json, os, resource, sys, time
import apgas

def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw

def measure(kind, n):
    ps = apgas.places()
    before = [usage(), apgas.at(ps[1], usage)]
    start = time.perf_counter()
    if kind == "at":
        for _ in range(n):
            apgas.at(ps[1], os.getpid)  # functions pickled by name, as a program's own are
    else:
        with apgas.finish():
            for i in range(n):
                apgas.async_at(ps[i % 2], abs, i)
    wall = time.perf_counter() - start
    after = [usage(), apgas.at(ps[1], usage)]
    total = [sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) for k in range(3)]
    return {"wall_us": wall / n * 1e6, "cpu_us": total[0] / n * 1e6,
            "voluntary": total[1] / n, "involuntary": total[2] / n}

def main():
    calls, tasks = int(sys.argv[1]), int(sys.argv[2])
    measure("at", 300)
    return {"at": measure("at", calls), "tasks": measure("tasks", tasks)}

if __name__ == "__main__":
    print(json.dumps({"apgas": apgas.__file__, **apgas.run(main, places=2)}))
"""

METRICS = (("wall_us", "wall", "us"), ("cpu_us", "CPU, both places", "us"),
           ("voluntary", "voluntary switches", ""), ("involuntary", "involuntary switches", ""))


def _usage() -> tuple[float, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


def _echo(endpoint: str, report: Any) -> None:
    """The bare floor's other process: answer every message; report usage on b"U"."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.connect(endpoint)
    while True:
        route, message = sock.recv_multipart()
        if message == b"U":
            report.put(_usage())
        elif message == b"S":
            break
        else:
            sock.send_multipart([route, message])
    sock.close(0)
    ctx.term()


def bare(calls: int) -> dict[str, float]:
    """The bare ping-pong's figures per round trip, both processes counted."""
    spawn = multiprocessing.get_context("spawn")
    report = spawn.Queue()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    peer = spawn.Process(target=_echo, args=(f"tcp://127.0.0.1:{port}", report), daemon=True)
    peer.start()
    try:
        message = b"B" * 100
        for _ in range(300):
            sock.send(message)
            sock.recv()
        sock.send(b"U")
        before = [_usage(), report.get(timeout=30)]
        start = time.perf_counter()
        for _ in range(calls):
            sock.send(message)
            sock.recv()
        wall = time.perf_counter() - start
        after = [_usage()]
        sock.send(b"U")
        after.append(report.get(timeout=30))
        total = [sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) for k in range(3)]
        return {"wall_us": wall / calls * 1e6, "cpu_us": total[0] / calls * 1e6,
                "voluntary": total[1] / calls, "involuntary": total[2] / calls}
    finally:
        sock.send(b"S")
        peer.join(10)
        if peer.is_alive():
            peer.kill()
        sock.close(0)
        ctx.term()


def compare(revs: list[str], rounds: int, calls: int, tasks: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {"bare": []}
    with checked_out(revs, "apgas-handoffs-") as trees:
        for name in trees:
            samples[name] = []
        for r in range(rounds):
            samples["bare"].append({"at": bare(calls)})
            for name, tree in trees.items():
                log.info("round %d/%d: %s", r + 1, rounds, name)
                samples[name].append(run_in_tree(tree, PROBE, [str(calls), str(tasks)],
                                                 RUN_TIMEOUT_S))
    medians = {name: {op: {key: statistics.median(run[op][key] for run in runs)
                           for key, _, _ in METRICS}
                      for op in runs[0]}
               for name, runs in samples.items()}
    return {"revs": revs, "rounds": rounds, "calls": calls, "tasks": tasks, "medians": medians,
            "samples": samples}


def render(report: dict[str, Any]) -> str:
    table = Table([Column("tree", 12, left=True), Column("operation", 10, left=True, gap=" "),
                   *(Column(label, 22 if unit else 20, ".1f" if unit else ".2f", f" {unit}" if unit else "",
                            gap=" ") for _, label, unit in METRICS)], rule=True)
    rows = [[name[:12], op, *(figures[key] for key, _, _ in METRICS)]
            for name, ops in report["medians"].items() for op, figures in ops.items()]
    return "\n".join([table.render(rows), "",
                      f"per operation, both processes; medians of {report['rounds']} alternating "
                      f"round(s) of {report['calls']} calls and {report['tasks']} tasks"])


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revs", nargs="*", default=list(DEFAULT_REVS),
                        help=f"commits to measure beside this tree (default {' '.join(DEFAULT_REVS)})")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of every tree")
    parser.add_argument("--calls", type=int, default=3000, help="at() round trips a run")
    parser.add_argument("--tasks", type=int, default=30000, help="tasks in the finish of a run")


def check(args: argparse.Namespace) -> str | None:
    if args.quick:
        args.rounds, args.calls, args.tasks, args.revs = 1, 300, 3000, []
    if min(args.rounds, args.calls, args.tasks) < 1:
        return "--rounds, --calls and --tasks must be at least 1"
    return None


@harness("benchmarks.handoffs", __doc__, Path("bench-results/handoffs.json"),
         quick="one round of 300 calls and 3,000 tasks, this tree only: a smoke test",
         repeats=False, options=options, check=check, loggers=(log.name,))
def main(run: Run) -> int:
    args = run.args
    return compared(run, lambda: compare(list(args.revs), args.rounds, args.calls, args.tasks), render)


if __name__ == "__main__":
    sys.exit(main())
