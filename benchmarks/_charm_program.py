"""The Charm4py program that ``benchmarks._charm_peers`` starts with charmrun, once per repeat:

    python -m charmrun.start +p2 benchmarks/_charm_program.py CALLS TASKS WARMUP ++local ++quiet

Not imported by the harness (it needs charm4py, and charmrun starts it on every PE).
A ``Group`` puts one :class:`Peer` chare on each PE; the main function (PE 0) then

* times CALLS calls ``peers[1].noop(ret=True).get()``: a method of the chare on the
  other PE (another process), waited for through its future;
* sends TASKS one-way ``noop(i)`` calls, round robin to the chares of PE 0 and PE 1,
  and waits for quiescence (``charm.waitQD()``: Charm++'s way to know every message
  sent was processed, as a finish knows its tasks ended); the chares' counts are
  checked against TASKS.

Both are done WARMUP times (10 x WARMUP tasks) first. One short line goes to stdout:
:data:`TAG` followed by JSON, ``{"calls": n, "median_s": m, "p99_s": p, "tasks": n, "tasks_s": rate,
"pes": 2}`` (not every time: charmrun relays a PE's output in pieces of 16 KB, and a line
of 2,000 times would arrive cut in two).
"""

import json
import math
import statistics
import time

from charm4py import Chare, Group, charm

TAG = "CHARM4PY-RESULT "


class Peer(Chare):
    """One per PE: counts the no-op calls it ran."""

    def __init__(self):
        self.ran = 0

    def noop(self, *args):
        self.ran += 1

    def count(self):
        return self.ran


def round_trips(peer, calls):
    """Seconds of each of ``calls`` ``peer.noop(ret=True).get()``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        peer.noop(ret=True).get()
        times.append(time.perf_counter() - start)
    return times


def task_rate(peers, tasks):
    """Tasks per second of ``tasks`` one-way no-op calls dealt round robin, until quiescence."""
    before = sum(p.count(ret=True).get() for p in peers)
    start = time.perf_counter()
    for i in range(tasks):
        peers[i % len(peers)].noop(i)
    charm.waitQD()
    elapsed = time.perf_counter() - start
    ran = sum(p.count(ret=True).get() for p in peers) - before
    if ran != tasks:
        raise RuntimeError(f"{ran} of {tasks} no-op calls ran before quiescence")
    return tasks / elapsed


def p99(values):
    """The nearest-rank 99th percentile, as ``benchmarks._common.percentile`` computes it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def main(args):
    calls, tasks, warmup = (int(a) for a in args[1:4])
    if charm.numPes() < 2:
        charm.abort(f"run on 2 PEs (+p2), not {charm.numPes()}")
    group = Group(Peer)
    peers = [group[pe] for pe in range(2)]
    round_trips(peers[1], warmup)
    task_rate(peers, 10 * warmup)
    times = round_trips(peers[1], calls)
    rate = task_rate(peers, tasks)
    print(TAG + json.dumps({"calls": calls, "median_s": statistics.median(times), "p99_s": p99(times),
                            "tasks": tasks, "tasks_s": rate, "pes": charm.numPes()}), flush=True)
    charm.exit()


if __name__ == "__main__":
    charm.start(main)
