"""Malleability benchmark: start, grow and shrink, forked places beside fresh interpreters.

    python -m benchmarks.malleability [--repeats R] [--json FILE] [--quick]
                                      [--sizes 4,16,64] [--step 8] [--methods fork,spawn]
    python -m benchmarks.malleability --footprint [--sizes 64,128,256,512,1024] [--json FILE]

``--footprint`` measures instead what a place costs, from 64 to 1,024 places
(:mod:`benchmarks._footprint`: start time, descriptors, sockets, threads, RSS
and PSS per place and at place 0, and the connections of a GLB run).

Each repeat starts one malleable job (a small program under ``python``, one
worker thread per place, ``APGAS_LOCAL_HOSTS='*'`` so that every host name is
this machine) on N places with ``APGAS_START_METHOD`` set to each start method
in turn (``fork``: places forked from the local launcher's template;
``spawn``: a fresh interpreter per place), and ``APGAS_SCHEDULER`` pointing at
a fake scheduler of this benchmark, which collects the job's messages. It
measures the wall time from just before the launch until the ready message
arrives beside the job's own ``readyTimeAPGAS`` (``apgas.run`` called to every
place ready), then sends ``grow STEP`` and ``shrink STEP``, timing each on the
client side (grow: to the ``ok grow`` reply; shrink: to the connection
closing) beside the job's ``growTimeAPGAS`` and ``shrinkTimeAPGAS``. The start
methods alternate job by job, so that both see the same machine. Every figure
is the median of R repeats; times are reported, never asserted on.

The job and its places run in a process group of their own, which is
killed at the end of each repeat whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from apgas import protocol
from apgas.order import send_order
from apgas.testing import FakeScheduler
from benchmarks import _footprint
from benchmarks._common import Samples, add_sample, median
from benchmarks._harness import Run, harness, show

log = logging.getLogger("benchmarks.malleability")

SIZES = (4, 16, 64)
STEP = 8
METHODS = ("fork", "spawn")
THREADS = 1                # worker threads per place
JOIN_TIMEOUT_S = 120       # APGAS_JOIN_TIMEOUT of the job: fresh interpreters are slow in crowds
READY_TIMEOUT_S = 30.0     # launch to the ready message, plus one second per place
ORDER_TIMEOUT_S = 60.0     # one order, sent to connection closed
MESSAGE_TIMEOUT_S = 10.0   # a timing message after its order's reply
EXIT_TIMEOUT_S = 15.0      # the job's own exit once told to stop
KILL_TIMEOUT_S = 5.0       # after SIGTERM, before SIGKILL
SETTLE_S = 0.3             # pause between orders: leaving places exit, reports go out
MAX_FAILURES = 3           # failed repeats (retried) before giving up
# metric -> (target in s, the case it applies to: start method, number of places or None for all)
TARGETS: dict[str, tuple[float, str, int | None]] = {
    "ready_job_s": (1.5, "fork", 64), "grow_client_s": (0.3, "fork", None)}
METRICS = ("ready_wall_s", "ready_job_s", "grow_client_s", "grow_job_s", "shrink_client_s",
           "shrink_job_s")

# The job: registers a handler that releases the newest places, prints where it
# takes orders, and ends when a line (or end of file) arrives on its stdin.
JOB_PROGRAM = textwrap.dedent("""\
    import sys
    import apgas


    class Newest(apgas.MalleableHandler):
        def pre_shrink(self, n):
            return apgas.places()[-n:]


    def main():
        communicator = apgas.define_malleable_handler(Newest())
        print("orders %s %d" % communicator.address, flush=True)
        sys.stdin.readline()
        apgas.disable_malleable_handler()


    apgas.run(main, places=int(sys.argv[1]))
""")


class BenchmarkError(Exception):
    """One repeat failed: an order was refused, a message or the job did not come."""


# -- parameters -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Params:
    """Sizes of one benchmark session."""

    repeats: int
    sizes: tuple[int, ...] = SIZES
    step: int = STEP
    methods: tuple[str, ...] = METHODS


def make_params(repeats: int | None, quick: bool, sizes: tuple[int, ...] = (), step: int = STEP,
                methods: tuple[str, ...] = ()) -> Params:
    """3 repeats, or 1 for a smoke test (``--quick``, which also stops at 16 places)."""
    return Params(repeats=repeats or (1 if quick else 3),
                  sizes=sizes or (SIZES[:2] if quick else SIZES), step=step, methods=methods or METHODS)


# -- orders ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Reply:
    """The reply to one order and when it came, in seconds after the order was sent."""

    lines: list[str]
    first_line_s: float
    closed_s: float


def timed_order(address: tuple[str, int], words: list[str]) -> Reply:
    """Send one order line; time the first reply line and the connection closing."""
    start = time.perf_counter()
    first: list[float] = []
    lines = send_order(address, words, ORDER_TIMEOUT_S,
                       on_first_line=lambda: first.append(time.perf_counter()))
    closed = time.perf_counter()
    if lines and lines[0].startswith("error"):
        raise BenchmarkError(f"order {' '.join(words)!r} refused: {lines[0]}")
    return Reply(lines, (first[0] if first else closed) - start, closed - start)


def grow(job: Job, scheduler: FakeScheduler, n: int, samples: Samples) -> None:
    """Grow by ``n`` places on fresh host names; record the client's and the job's time."""
    hosts = [job.new_host() for _ in range(n)]
    reply = timed_order(job.address, ["grow", str(n), *hosts])
    if not reply.lines or not reply.lines[0].startswith(f"ok grow {n} "):
        raise BenchmarkError(f"unexpected reply to grow {n}: {reply.lines}")
    add_sample(samples, "grow_client_s", reply.first_line_s)
    add_sample(samples, "grow_job_s", scheduler.take("growTimeAPGAS", n, MESSAGE_TIMEOUT_S).seconds)


def shrink(job: Job, scheduler: FakeScheduler, n: int, samples: Samples) -> None:
    """Shrink by ``n`` places; record the client's and the job's time."""
    reply = timed_order(job.address, ["shrink", str(n)])
    if len(reply.lines) != n:
        raise BenchmarkError(f"shrink {n} released {reply.lines}, expected {n} host(s)")
    add_sample(samples, "shrink_client_s", reply.closed_s)
    add_sample(samples, "shrink_job_s", scheduler.take("shrinkTimeAPGAS", n, MESSAGE_TIMEOUT_S).seconds)


def check_places(job: Job, expected: int) -> None:
    """The job is still malleable with ``expected`` places."""
    reply = timed_order(job.address, ["status"])
    if not reply.lines or reply.lines[0] != f"status malleable {expected}":
        raise BenchmarkError(f"expected {expected} places, the job says {reply.lines}")


# -- the job process ------------------------------------------------------------------------

class Job:
    """A running malleable job: its process, its stdout and where it takes orders."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._stdout: queue.Queue[str | None] = queue.Queue()
        self._hosts = 0
        self.address: tuple[str, int] = ("", 0)
        threading.Thread(target=self._read_stdout, name="job-stdout", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._stdout.put(line.rstrip("\n"))
        self._stdout.put(None)

    def wait_address(self, timeout: float) -> None:
        """Read the ``orders HOST PORT`` line the job prints once malleable."""
        try:
            line = self._stdout.get(timeout=timeout)
        except queue.Empty:
            raise BenchmarkError(f"the job printed no order address within {timeout:g} s") from None
        words = (line or "").split()
        if len(words) != 3 or words[0] != "orders":
            raise BenchmarkError(f"expected 'orders HOST PORT' from the job, got {line!r}")
        self.address = (words[1], int(words[2]))

    def new_host(self) -> str:
        """A host name not used before in this job (all stand for this machine)."""
        self._hosts += 1
        return f"node{self._hosts}"


def _job_env(scheduler: FakeScheduler, method: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(APGAS_SCHEDULER="{}:{}".format(*scheduler.address), APGAS_LOCAL_HOSTS="*",
               APGAS_MALLEABLE_LISTEN="127.0.0.1:0", APGAS_START_METHOD=method,
               APGAS_THREADS=str(THREADS), APGAS_JOIN_TIMEOUT=str(JOIN_TIMEOUT_S))
    return env


def launch_job(scheduler: FakeScheduler, places: int, method: str) -> Job:
    """Start the job program in a process group of its own."""
    proc = subprocess.Popen([sys.executable, "-c", JOB_PROGRAM, str(places)],
                            env=_job_env(scheduler, method), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    return Job(proc)


def stop_job(job: Job) -> None:
    """Ask the job to end (a line on its stdin); it must exit 0 in time."""
    assert job.proc.stdin is not None
    with contextlib.suppress(OSError):
        job.proc.stdin.write("stop\n")
        job.proc.stdin.close()
    try:
        code = job.proc.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchmarkError(f"the job did not exit within {EXIT_TIMEOUT_S:g} s of being told to") from None
    if code != 0:
        raise BenchmarkError(f"the job exited with code {code}")


def kill_job(job: Job) -> None:
    """Make sure nothing of the job is left: SIGTERM, then SIGKILL its process group."""
    if job.proc.poll() is None:
        log.warning("terminating the job (pid %d)", job.proc.pid)
        job.proc.terminate()  # place 0 then stops its places
        try:
            job.proc.wait(timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    if _group_alive(job.proc.pid):
        log.warning("killing what is left of the job's process group %d", job.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGKILL)
    job.proc.wait(timeout=KILL_TIMEOUT_S)
    for stream in (job.proc.stdin, job.proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# -- one repeat -----------------------------------------------------------------------------

def run_repeat(places: int, method: str, step: int) -> tuple[Samples, list[str]]:
    """One job: ready, grow, shrink. The samples, and every line the job sent."""
    samples: Samples = {}
    with FakeScheduler() as scheduler:
        start = time.perf_counter()
        job = launch_job(scheduler, places, method)
        try:
            ready = scheduler.take(protocol.READY, timeout=READY_TIMEOUT_S + places)
            add_sample(samples, "ready_wall_s", ready.arrived - start)
            add_sample(samples, "ready_job_s", scheduler.take("readyTimeAPGAS", timeout=MESSAGE_TIMEOUT_S).seconds)
            job.wait_address(MESSAGE_TIMEOUT_S)
            time.sleep(SETTLE_S)
            grow(job, scheduler, step, samples)
            time.sleep(SETTLE_S)
            shrink(job, scheduler, step, samples)
            check_places(job, places)
            stop_job(job)
        finally:
            kill_job(job)
        return samples, list(scheduler.lines)


Case = tuple[str, int]  # start method, places


def measure(params: Params) -> tuple[dict[Case, Samples], dict[Case, list[list[str]]], int]:
    """Every case's samples and job messages, and the number of failed repeats. The
    cases take turns, so that a change in the machine's load falls on all of them."""
    samples: dict[Case, Samples] = {}
    messages: dict[Case, list[list[str]]] = {}
    failures = 0
    for repeat in range(params.repeats):
        for places in params.sizes:
            for method in params.methods:
                case = (method, places)
                while True:
                    try:
                        got, lines = run_repeat(places, method, params.step)
                        break
                    except (BenchmarkError, OSError) as e:  # TimeoutError: a message did not come
                        failures += 1
                        log.warning("%s, %d places failed (%d so far): %s", method, places, failures, e)
                        if failures >= MAX_FAILURES:
                            return samples, messages, failures
                for key, values in got.items():
                    for value in values:
                        add_sample(samples.setdefault(case, {}), key, value)
                messages.setdefault(case, []).append(lines)
                log.info("repeat %d/%d, %s, %d places: %s", repeat + 1, params.repeats, method,
                         places, ", ".join(f"{k}={v[0]:.3f}" for k, v in got.items()))
    return samples, messages, failures


# -- report ---------------------------------------------------------------------------------

def target_of(metric: str, method: str, places: int) -> float | None:
    """The target a case's figure has, if any."""
    found = TARGETS.get(metric)
    if found is None or found[1] != method or found[2] not in (None, places):
        return None
    return found[0]


def summarize(samples: dict[Case, Samples]) -> list[dict[str, Any]]:
    """One JSON-ready record per case: per metric the median, range, samples and target."""
    rows = []
    for (method, places), case in sorted(samples.items(), key=lambda c: (c[0][1], c[0][0])):
        row: dict[str, Any] = {"method": method, "places": places}
        for metric in METRICS:
            values = case.get(metric, [])
            mid = median(values)
            target = target_of(metric, method, places)
            row[metric] = {"median": mid, "min": min(values, default=None),
                           "max": max(values, default=None), "samples": values, "target": target,
                           "meets_target": None if target is None or mid is None else mid <= target}
        rows.append(row)
    return rows


def _cell(figure: dict[str, Any]) -> str:
    if figure["median"] is None:
        return "-"
    verdict = "" if figure["target"] is None else (
        f" (<= {figure['target']:g}: {'met' if figure['meets_target'] else 'missed'})")
    return f"{figure['median']:.3f} s{verdict}"


def growth(rows: list[dict[str, Any]], method: str) -> str:
    """How the job's start time grows from the smallest to the largest size."""
    mine = [r for r in rows if r["method"] == method and r["ready_job_s"]["median"]]
    if len(mine) < 2:
        return ""
    small, large = mine[0], mine[-1]
    ratio = large["ready_job_s"]["median"] / small["ready_job_s"]["median"]
    return (f"{method}: {large['places'] / small['places']:g}x the places, "
            f"{ratio:.1f}x the start time")


def render_table(rows: list[dict[str, Any]], params: Params, failures: int) -> str:
    """The table printed at the end (Markdown, as docs/results.md shows it)."""
    lines = [f"| places | start method | start: launch to ready (wall) | start: apgas.run to ready "
             f"(job) | grow {params.step} | shrink {params.step} |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['places']} | {r['method']} | {_cell(r['ready_wall_s'])} | "
                     f"{_cell(r['ready_job_s'])} | {_cell(r['grow_client_s'])} | "
                     f"{_cell(r['shrink_client_s'])} |")
    lines += [
        "",
        f"medians of {params.repeats} repeat(s); one job per repeat and case, {THREADS} worker "
        f"thread per place; grow: order sent to reply, shrink: order sent to connection closed",
        "start-time growth: " + "; ".join(g for g in (growth(rows, m) for m in params.methods) if g),
        f"failed repeats (retried): {failures}",
    ]
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------

def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats of each case (default 3, or 1 with --quick)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/malleability.json"),
                        help="where to write the results (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="one repeat of 4 and 16 places: a smoke test")
    parser.add_argument("--sizes", default="", help="numbers of places to start with "
                        f"(default {','.join(map(str, SIZES))})")
    parser.add_argument("--step", type=int, default=STEP, help="places of the grow and the "
                        "shrink (default %(default)s)")
    parser.add_argument("--methods", default="", help=f"start methods (default {','.join(METHODS)})")
    parser.add_argument("--footprint", action="store_true", help="measure what a place costs "
                        "instead (default sizes 64,128,256,512,1024; JSON: "
                        "bench-results/footprint.json)")
    parser.add_argument("--no-glb", action="store_true", help="--footprint without the GLB run")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    if args.step < 1:
        return "--step must be at least 1"
    try:
        args.sizes = tuple(int(n) for n in args.sizes.split(",")) if args.sizes else ()
    except ValueError:
        return f"--sizes must be numbers separated by commas, got {args.sizes!r}"
    if any(n < 1 for n in args.sizes):
        return "--sizes must be at least 1"
    args.methods = tuple(args.methods.split(",")) if args.methods else ()
    if any(m not in METHODS for m in args.methods):
        return f"--methods must be among {','.join(METHODS)}, got {','.join(args.methods)}"
    return None


@harness("benchmarks.malleability", __doc__, options=options,
         check=check, loggers=(log.name,))
def main(run: Run) -> int:
    args = run.args
    if args.footprint:
        return footprint_main(run)
    params = make_params(args.repeats, args.quick, args.sizes, args.step, args.methods)
    log.info("malleability: %s", params)
    samples, messages, failures = measure(params)
    rows = summarize(samples)
    run.report.update({"params": dataclasses.asdict(params), "threads_per_place": THREADS,
                       "failures": failures, "results": rows,
                       "job_messages": {f"{m} {n}": lines for (m, n), lines in messages.items()}})
    show(render_table(rows, params, failures))
    return 0 if rows else 1


def footprint_main(run: Run) -> int:
    """``--footprint``: one job per size; the table, and JSON (bench-results/footprint.json)."""
    args = run.args
    if args.json == Path("bench-results/malleability.json"):
        run.path = Path("bench-results/footprint.json")
    _footprint.kill_on_signal()
    rows = _footprint.measure(args.sizes or _footprint.SIZES, glb=not args.no_glb)
    run.report.update({"threads_per_place": _footprint.THREADS, "results": rows})
    show(_footprint.render_table(rows))
    return 0 if rows and all("error" not in r for r in rows) else 1


parse_command_line = main.parse


if __name__ == "__main__":
    sys.exit(main())
