"""Malleability benchmark: start to ready, grow and shrink orders.

    python -m benchmarks.malleability [--repeats R] [--json FILE] [--quick]

Each repeat starts one malleable job (a small program under ``python`` on 2
places, ``APGAS_LOCAL_HOSTS='*'`` so that every host name is this machine)
with ``APGAS_SCHEDULER`` pointing at a fake scheduler of this benchmark, which
collects the job's messages. It measures the wall time from just before the
launch until the ready message arrives, then sends the orders grow 1, shrink 1,
grow 2, shrink 2, grow 4, shrink 4, timing each on the client side (grow: to
the ``ok grow`` reply; shrink: to the connection closing) beside the job's
own ``readyTimeAPGAS``, ``growTimeAPGAS`` and ``shrinkTimeAPGAS``. Every
figure is the median of R repeats; the table shows the targets and the
figures of APGAS for Java. Times are reported, never asserted on.

The job and its places run in a process group of their own, which is
killed at the end of each repeat whatever happened.
"""

from __future__ import annotations

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
from benchmarks._common import (Metric, Samples, add_sample, fmt, fmt_target, machine_info, median,
                                meets, parse_args, setup_logging, write_json)

log = logging.getLogger("benchmarks.malleability")

INITIAL_PLACES = 2
ORDERS: tuple[tuple[str, int], ...] = (
    ("grow", 1), ("shrink", 1), ("grow", 2), ("shrink", 2), ("grow", 4), ("shrink", 4))
READY_TIMEOUT_S = 30.0     # launch to the ready message
ORDER_TIMEOUT_S = 60.0     # one order, sent to connection closed
MESSAGE_TIMEOUT_S = 10.0   # a timing message after its order's reply
EXIT_TIMEOUT_S = 15.0      # the job's own exit once told to stop
KILL_TIMEOUT_S = 5.0       # after SIGTERM, before SIGKILL
SETTLE_S = 0.2             # pause between orders: leaving places exit, reports go out
MAX_FAILURES = 3           # failed repeats (retried) before giving up

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


# -- parameters and metrics ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Params:
    """Sizes of one benchmark session."""

    repeats: int
    initial_places: int = INITIAL_PLACES
    orders: tuple[tuple[str, int], ...] = ORDERS


def make_params(repeats: int | None, quick: bool) -> Params:
    """5 repeats, or 1 for a smoke test (``--quick``)."""
    return Params(repeats=repeats or (1 if quick else 5))


# metric key -> (seconds, what) of APGAS for Java, for the same kind of figure
JAVA_REFERENCE: dict[str, tuple[float, str]] = {
    "ready_wall_s": (6.0, ""),
    "grow2_client_s": (14.1, "3.8 places"),
    "shrink2_client_s": (6.3, "2.6 places"),
}
TARGETS = {"ready_wall_s": 1.5, "grow2_client_s": 1.5, "shrink2_client_s": 0.5}


def _order_metrics(verb: str, n: int) -> list[Metric]:
    """The client's and the job's figure of one order."""
    until = "reply" if verb == "grow" else "close"
    client, job = f"{verb}{n}_client_s", f"{verb}{n}_job_s"
    return [Metric(client, f"{verb} by {n}: order to {until} (client)", "s", False, TARGETS.get(client)),
            Metric(job, f"{verb} by {n}: job's {verb}TimeAPGAS", "s", False, TARGETS.get(job))]


def make_metrics(params: Params) -> list[Metric]:
    """The table's rows: ready, then each order in the sequence."""
    metrics = [
        Metric("ready_wall_s", f"ready, {params.initial_places} places: launch to {protocol.READY}",
               "s", False, TARGETS["ready_wall_s"]),
        Metric("ready_job_s", "ready: job's readyTimeAPGAS", "s", False),
    ]
    for verb, n in sorted(set(params.orders), key=lambda o: (o[0] != "grow", o[1])):
        metrics += _order_metrics(verb, n)
    return metrics


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
    add_sample(samples, f"grow{n}_client_s", reply.first_line_s)
    add_sample(samples, f"grow{n}_job_s", scheduler.take("growTimeAPGAS", n, MESSAGE_TIMEOUT_S).seconds)


def shrink(job: Job, scheduler: FakeScheduler, n: int, samples: Samples) -> None:
    """Shrink by ``n`` places; record the client's and the job's time."""
    reply = timed_order(job.address, ["shrink", str(n)])
    if len(reply.lines) != n:
        raise BenchmarkError(f"shrink {n} released {reply.lines}, expected {n} host(s)")
    add_sample(samples, f"shrink{n}_client_s", reply.closed_s)
    add_sample(samples, f"shrink{n}_job_s", scheduler.take("shrinkTimeAPGAS", n, MESSAGE_TIMEOUT_S).seconds)


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


def _job_env(scheduler: FakeScheduler) -> dict[str, str]:
    env = dict(os.environ)
    env.update(APGAS_SCHEDULER="%s:%d" % scheduler.address, APGAS_LOCAL_HOSTS="*",
               APGAS_MALLEABLE_LISTEN="127.0.0.1:0")
    return env


def launch_job(scheduler: FakeScheduler, places: int) -> Job:
    """Start the job program in a process group of its own."""
    proc = subprocess.Popen([sys.executable, "-c", JOB_PROGRAM, str(places)], env=_job_env(scheduler),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
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

def run_repeat(params: Params) -> tuple[Samples, list[str]]:
    """One job: ready, then every order. The samples, and every line the job sent."""
    samples: Samples = {}
    with FakeScheduler() as scheduler:
        start = time.perf_counter()
        job = launch_job(scheduler, params.initial_places)
        try:
            ready = scheduler.take(protocol.READY, timeout=READY_TIMEOUT_S)
            add_sample(samples, "ready_wall_s", ready.arrived - start)
            add_sample(samples, "ready_job_s", scheduler.take("readyTimeAPGAS", timeout=MESSAGE_TIMEOUT_S).seconds)
            job.wait_address(MESSAGE_TIMEOUT_S)
            _run_orders(job, scheduler, params, samples)
            stop_job(job)
        finally:
            kill_job(job)
        return samples, list(scheduler.lines)


def _run_orders(job: Job, scheduler: FakeScheduler, params: Params, samples: Samples) -> None:
    """Send the orders in turn, checking the number of places at the end."""
    places = params.initial_places
    for verb, n in params.orders:
        time.sleep(SETTLE_S)
        if verb == "grow":
            grow(job, scheduler, n, samples)
            places += n
        else:
            shrink(job, scheduler, n, samples)
            places -= n
    check_places(job, places)


def measure(params: Params) -> tuple[list[Samples], list[list[str]], int]:
    """Every repeat's samples and job messages, and the number of failed repeats."""
    repeats: list[Samples] = []
    messages: list[list[str]] = []
    failures = 0
    while len(repeats) < params.repeats:
        try:
            samples, lines = run_repeat(params)
        except (BenchmarkError, OSError) as e:  # TimeoutError: a message did not come
            failures += 1
            log.warning("repeat failed (%d so far): %s", failures, e)
            if failures >= MAX_FAILURES:
                break
            continue
        repeats.append(samples)
        messages.append(lines)
        log.info("repeat %d/%d: %s", len(repeats), params.repeats,
                 ", ".join(f"{k}={v[0]:.3f}" for k, v in samples.items()))
    return repeats, messages, failures


def merge(repeats: list[Samples]) -> Samples:
    """One list of values per metric, one value per repeat."""
    merged: Samples = {}
    for samples in repeats:
        for key, values in samples.items():
            for value in values:
                add_sample(merged, key, value)
    return merged


# -- report ---------------------------------------------------------------------------------

def summarize(metrics: list[Metric], samples: Samples) -> list[dict[str, Any]]:
    """One JSON-ready record per metric: median, samples, target, Java's figure."""
    rows = []
    for m in metrics:
        values = samples.get(m.key, [])
        mid = median(values)
        java = JAVA_REFERENCE.get(m.key)
        rows.append({
            "metric": m.key, "label": m.label, "unit": m.unit, "median": mid,
            "min": min(values) if values else None, "max": max(values) if values else None,
            "target": m.target, "meets_target": meets(m, mid),
            "java_s": java[0] if java else None, "java_note": java[1] if java else None,
            "samples": values,
        })
    return rows


def _fmt_java(row: dict[str, Any]) -> str:
    if row["java_s"] is None:
        return ""
    return f"{row['java_s']:g} s" + (f" ({row['java_note']})" if row["java_note"] else "")


def _fmt_range(row: dict[str, Any]) -> str:
    if row["min"] is None:
        return "-"
    return f"{row['min']:.3f}-{row['max']:.3f}"


def render_table(metrics: list[Metric], rows: list[dict[str, Any]], params: Params, failures: int) -> str:
    """The table printed at the end."""
    header = f"{'metric':<46} {'median':>9} {'min-max':>13}  {'target':<22} APGAS for Java"
    lines = [header, "-" * (len(header) + 10)]
    for m, row in zip(metrics, rows):
        lines.append(f"{m.label:<46} {fmt(row['median'], m.unit):>9} {_fmt_range(row):>13}  "
                     f"{fmt_target(m, row['meets_target']):<22} {_fmt_java(row)}".rstrip())
    orders = ", ".join(f"{verb} {n}" for verb, n in params.orders)
    lines += [
        "",
        f"medians of {params.repeats} repeat(s), one job per repeat started on "
        f"{params.initial_places} places, orders: {orders}",
        "client: order sent -> first reply line (grow) or connection closed (shrink); "
        "job: the job's own timing message",
        f"failed repeats (retried): {failures}",
    ]
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "python -m benchmarks.malleability", __doc__ or "",
                      Path("bench-results/malleability.json"), "one repeat: a smoke test")
    setup_logging(log.name)
    params = make_params(args.repeats, args.quick)
    info = machine_info()
    log.info("malleability (%d repeats)", params.repeats)
    repeats, messages, failures = measure(params)
    metrics = make_metrics(params)
    rows = summarize(metrics, merge(repeats))
    write_json(args.json, {"machine": info, "params": dataclasses.asdict(params),
                           "failures": failures, "results": rows, "job_messages": messages}, log)
    print(render_table(metrics, rows, params, failures))
    return 0 if repeats else 1


if __name__ == "__main__":
    sys.exit(main())
