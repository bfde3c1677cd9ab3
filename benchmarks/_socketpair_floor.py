"""The lowest floor of ``benchmarks.micro``: one byte each way over a Unix socketpair, and
the peers' table, every row a ratio to that floor from the same run (issue 54).

* :class:`SocketpairEcho` is a second process that holds one end of a
  ``socket.socketpair()`` (``AF_UNIX``, ``SOCK_STREAM``) and sends back every byte
  it reads; this side times ``send(1 byte)`` + ``recv(1)``. Nothing is pickled or
  framed: what two Python processes need at least for a round trip on this machine.
  The echo is a bare interpreter (``python -I -S -c``: no site, no imports of the
  checkout) started with ``subprocess``, given its end by ``pass_fds``; it ends
  when this side closes its end.
* :func:`peers_summary` and :func:`render_peers` make the peers' table: the floor,
  bare pyzmq, the pickled-call ping-pong, ``at()``, Charm4py and Ray, each as its
  median and p99 over the floor's, then the no-op task rates on 2 processes; and
  the goals of issue 54, reported as met or missed, never asserted.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import Samples, add_sample, fmt, median, percentile
from benchmarks._harness import Column, Table, Text

__all__ = ["SocketpairEcho", "round_trips", "floor_samples", "peers_summary", "render_peers"]

# The echo process: read one byte, send it back, until this side closes its end.
_ECHO = "import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\nwhile b := s.recv(1):\n    s.sendall(b)\n"
_PING = b"x"
STOP_WAIT_S = 5.0

# Issue 54's goals (reported, never asserted)
AT_OVER_FLOOR_GOAL = 3.0          # at() median at most 3x the socketpair floor's median
AT_P99_GOAL_US = 2000.0           # at() p99 at most 2 ms
BATCH2_GOAL_TASKS_S = 200_000.0   # a finish over counted no-op tasks on 2 places
BATCH2_OVER_POOL2_GOAL = 8.0      # ... which is 8x Pool(2)


class SocketpairEcho:
    """The other end of the floor: a process echoing each byte over a Unix socketpair.
    A context manager that ends it on exit (killed if it has not ended in ``STOP_WAIT_S`` s)."""

    def __init__(self) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _ECHO, str(theirs.fileno())],
                                          pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()   # the echo holds its own copy
        try:
            self.round_trips(1)   # started and answering
        except BaseException:
            self.close()
            raise

    def round_trips(self, calls: int) -> list[float]:
        """Seconds of each of ``calls`` round trips of one byte."""
        sock, times = self._sock, []
        for _ in range(calls):
            start = time.perf_counter()
            sock.send(_PING)
            if not sock.recv(1):
                raise ConnectionError(f"the socketpair echo (pid {self._proc.pid}) closed its end")
            times.append(time.perf_counter() - start)
        return times

    def close(self) -> None:
        """Close this end (the echo reads end of file and exits) and reap the echo."""
        self._sock.close()
        try:
            self._proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> SocketpairEcho:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def round_trips(calls: int, warmup: int = 0) -> list[float]:
    """Seconds of each of ``calls`` round trips with an echo of its own (after ``warmup`` more)."""
    with SocketpairEcho() as echo:
        echo.round_trips(warmup)
        return echo.round_trips(calls)


def floor_samples(samples: Samples, times: list[float]) -> None:
    """Add one repeat's round trips as ``socketpair_median_us`` and ``socketpair_p99_us``."""
    add_sample(samples, "socketpair_median_us", statistics.median(times) * 1e6)
    add_sample(samples, "socketpair_p99_us", percentile(times, 99) * 1e6)


# -- the peers' table ---------------------------------------------------------------------------

# (label, key of the median, key of the p99, who measured it: None, "charm" or "ray")
LATENCY_ROWS = [
    ("socketpair ping-pong, 1 B (the floor)", "socketpair_median_us", "socketpair_p99_us", None),
    ("bare pyzmq ping-pong, 100 B", "bare_median_us", "bare_p99_us", None),
    ("pickled-call ping-pong (pyzmq)", "pickled_median_us", "pickled_p99_us", None),
    ("apgas at(), place 0 -> 1", "rtt_median_us", "rtt_p99_us", None),
    ("Charm4py ret=True call, PE 0 -> 1", "charm_median_us", "charm_p99_us", "charm"),
    ("Ray actor method round trip", "ray_actor_median_us", "ray_actor_p99_us", "ray"),
    ("Ray task round trip", "ray_task_median_us", "ray_task_p99_us", "ray"),
]

RATE_ROWS = [
    ("Pool(2).map(chunksize=1)", "pool2_tasks_s", None),
    ("apgas finish, places 0 and 1", "batch2_tasks_s", None),
    ("Charm4py, 2 PEs: entry methods + waitQD", "charm2_tasks_s", "charm"),
    ("Ray, 2 tasks at a time", "ray2_tasks_s", "ray"),
]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


_RELATIONS = {"<": lambda v, t: v < t, "<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t}


def _goal(name: str, value: float | None, relation: str, target: float, unit: str) -> dict[str, Any]:
    """One goal: ``value relation target`` met, missed, or None without a value."""
    met = None if value is None else _RELATIONS[relation](value, target)
    return {"goal": name, "value": value, "relation": relation, "target": target, "unit": unit, "met": met}


def peers_summary(samples: Samples, skipped: dict[str, str | None]) -> dict[str, Any]:
    """The peers' medians over the floor's (latency rows: median and p99 each over the floor's;
    rate rows: tasks/s, over Pool(2) and times the floor's median round trip), and the goals.
    ``skipped`` gives, for "charm" and "ray", why its rows were not measured (None: they were)."""
    left_out = {key for _, *keys, who in LATENCY_ROWS + RATE_ROWS if who and skipped.get(who) for key in keys}
    m = {key: median(values) for key, values in samples.items() if key not in left_out}
    floor_med, floor_p99 = m.get("socketpair_median_us"), m.get("socketpair_p99_us")
    latency: list[dict[str, Any]] = []
    for label, med_key, p99_key, who in LATENCY_ROWS:
        med, p99 = m.get(med_key), m.get(p99_key)
        latency.append({"label": label, "median_key": med_key, "p99_key": p99_key, "median_us": med,
                        "p99_us": p99, "median_over_floor": _ratio(med, floor_med),
                        "p99_over_floor": _ratio(p99, floor_p99), "skipped": skipped.get(who) if who else None})
    rates: list[dict[str, Any]] = []
    for label, key, who in RATE_ROWS:
        rate = m.get(key)
        rates.append({"label": label, "key": key, "tasks_s": rate, "over_pool2": _ratio(rate, m.get("pool2_tasks_s")),
                      "tasks_per_floor_round_trip": rate * floor_med / 1e6 if rate and floor_med else None,
                      "skipped": skipped.get(who) if who else None})
    at_med, at_p99, charm_med = m.get("rtt_median_us"), m.get("rtt_p99_us"), m.get("charm_median_us")
    goals = [
        _goal("at() median / socketpair floor median", _ratio(at_med, floor_med), "<=", AT_OVER_FLOOR_GOAL, "x"),
        _goal("at() median / Charm4py median", _ratio(at_med, charm_med), "<", 1.0, "x"),
        _goal("at() p99", at_p99, "<=", AT_P99_GOAL_US, "us"),
        _goal("finish over no-op tasks, 2 places", m.get("batch2_tasks_s"), ">=", BATCH2_GOAL_TASKS_S, "tasks/s"),
        _goal("finish, 2 places / Pool(2)", _ratio(m.get("batch2_tasks_s"), m.get("pool2_tasks_s")), ">=",
              BATCH2_OVER_POOL2_GOAL, "x"),
    ]
    keys = sorted({r["median_key"] for r in latency} | {r["p99_key"] for r in latency} | {r["key"] for r in rates})
    return {"floor": "socketpair", "skipped": skipped, "latency": latency, "rates": rates, "goals": goals,
            "samples": {k: samples.get(k, []) for k in keys}}


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _goal_value(value: float | None, unit: str) -> str:
    return _times(value) if unit == "x" else fmt(value, unit)


def render_peers(summary: dict[str, Any]) -> str:
    """The peers' table: each round trip over the floor's, the task rates, then issue 54's goals."""
    latency = Table([Column("round trips, against the floor (same run)", 40, left=True),
                     Column("median", 12, gap=" "), Column("/ floor", 9, gap=" "),
                     Column("p99", 12, gap=" "), Column("/ floor", 9, gap=" ")], rule=True)
    lines = [latency.render(
        [r["label"], Text(" " + r["skipped"])] if r["skipped"] else
        [r["label"], fmt(r["median_us"], "us"), _times(r["median_over_floor"]), fmt(r["p99_us"], "us"),
         _times(r["p99_over_floor"])] for r in summary["latency"])]
    rates = Table([Column("no-op tasks, 2 processes (same run)", 40, left=True),
                   Column("tasks/s", 12, gap=" "), Column("/ Pool(2)", 9, gap=" "),
                   Column("per floor round trip", 22, gap=" ")], rule=True)
    lines += ["", rates.render(
        [r["label"], Text(" " + r["skipped"])] if r["skipped"] else
        [r["label"], fmt(r["tasks_s"], "tasks/s"), _times(r["over_pool2"]),
         "-" if r["tasks_per_floor_round_trip"] is None else f"{r['tasks_per_floor_round_trip']:.2f}"]
        for r in summary["rates"])]
    goals = Table([Column("issue 54's goals (reported, not asserted)", 58, left=True),
                   Column("value", 12, gap=" "), Column("goal", 0, left=True, gap="  ")], rule=True)
    lines += ["", goals.render(
        [g["goal"], _goal_value(g["value"], g["unit"]),
         f"{g['relation']} {_goal_value(g['target'], g['unit'])}: "
         f"{'n/a' if g['met'] is None else 'met' if g['met'] else 'missed'}"] for g in summary["goals"])]
    return "\n".join(lines)
