"""A scheduler crash loses no job's exit status: the operator's test, measured.

    python -m benchmarks.scheduler_crash [--jobs 300] [--nodes 8] [--threads 4]
        [--down 0.3] [--fail-every 10] [--sleep-every 0] [--sleep 0.4] [--door tcp|unix]
        [--keep] [--json FILE]

What is run. ``python -m apgas_scheduler serve`` on ``--nodes`` virtual nodes
(every node is this machine, ``APGAS_LOCAL_HOSTS='*'``), with its own key,
socket, output and state in a temporary directory. ``--threads`` client
threads submit ``--jobs`` short rigid jobs of 1 or 2 nodes between them,
each with ``apgas_scheduler.client.submit(retry_for=60)`` over TCP (or, with
``--door unix``, the scheduler's Unix socket): a submit whose reply is lost,
or that finds no scheduler, is sent again with the same request key. A job is ``sh -c 'echo $$ >> marks/$APGAS_JOB_ID; exit C'``, as
short as ``true`` but leaving a mark for each time it ran; every
``--fail-every``-th job exits 3, the others 0, and every ``--sleep-every``-th
sleeps ``--sleep`` s first (so that some run across the crash; 0: none).
When half of the submits have been answered, the daemon is SIGKILLed, and
``--down`` s later it is started again on the same state, as an operator
would. Then every job is waited for, the scheduler is shut down and its
state database read.

What is reported. The jobs that ended while the daemon was down (their
reason says so) and how many of those have their true outcome; every job's
outcome against the expected one (done for exit 0, failed with "exit code 3"
for exit 3); jobs whose outcome is "exit status unknown"; the jobs adopted at
the restart; duplicates (jobs in the state that no client was given, or an
id given for two submits); jobs whose program ran more than once or never;
processes, cgroups and outcome files left behind. Times are the whole run's,
the daemon's down time (SIGKILL to the restarted daemon's first line) and
the longest submit (first try to answer, retries included).

:func:`run` is the scenario; ``tests/test_scheduler_crash_outcomes.py`` runs
it smaller and asserts that every figure is exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Run, harness, show

log = logging.getLogger("benchmarks.scheduler_crash")
ROOT = Path(__file__).resolve().parent.parent
MEANWHILE = "it ended while the scheduler was down"


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run of the scenario."""

    jobs: int = 300
    nodes: int = 8
    threads: int = 4
    down: float = 0.3        # s between the SIGKILL and the restart
    fail_every: int = 10     # every k-th job exits 3 (0: none)
    sleep_every: int = 0     # every k-th job sleeps first (0: none)
    sleep: float = 0.4
    kill_after: float = 0.5  # the share of the submits answered before the SIGKILL
    door: str = "tcp"        # how the clients reach it: "tcp" (signed) or "unix" (its socket)
    timeout: float = 300.0   # s for the whole run


def expected_code(plan: Plan, i: int) -> int:
    return 3 if plan.fail_every and i % plan.fail_every == plan.fail_every - 1 else 0


def job_of(plan: Plan, i: int, work: Path) -> dict[str, Any]:
    """The ``i``-th job: its mark, perhaps a sleep, its exit code; its name says what it expects."""
    code = expected_code(plan, i)
    nap = plan.sleep if plan.sleep_every and i % plan.sleep_every == plan.sleep_every - 1 else 0
    script = f'echo $$ >> {work / "marks"}/"$APGAS_JOB_ID"' + (f"; sleep {nap:g}" if nap else "") \
        + f"; exit {code}"
    return {"name": f"j{i}-exit{code}", "class": "rigid", "nodes": 1 + i % 2, "walltime": 60,
            "cwd": str(work), "command": ["/bin/sh", "-c", script]}


class Serve:
    """``python -m apgas_scheduler serve`` in a process of its own; its output lines
    are collected by a thread, its log goes to a file (a pipe left unread would
    stop it once full)."""

    def __init__(self, work: Path, nodes: int) -> None:
        self.work, self.nodes = work, nodes
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> list[str]:
        """Start it; the lines it printed before it served (listening, and what it resumed)."""
        self.starts += 1
        env = {**os.environ, "APGAS_LOCAL_HOSTS": "*"}
        err = open(self.work / f"serve-{self.starts}.log", "w")  # noqa: SIM115 (the child's)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "apgas_scheduler", "serve", "--nodes",
                 f"node[0-{self.nodes - 1}]", "--port", str(self.port), "--policy", "fcfs",
                 "--interval", "0.2", "--output-dir", str(self.work / "out"),
                 "--state-dir", str(self.work / "state"), "--socket", str(self.work / "s.sock"),
                 "--key-file", str(self.work / "key")],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, text=True, start_new_session=True)
        finally:
            err.close()
        lines: list[str] = []
        first = self.proc.stdout.readline()  # type: ignore[union-attr]
        if "listening" not in first:
            self.proc.wait(10)
            raise RuntimeError(f"serve did not start: {first!r}; see {self.work}/serve-{self.starts}.log")
        lines.append(first.strip())
        if self.starts > 1:  # a restart says what it took up, at once
            lines.append(self.proc.stdout.readline().strip())  # type: ignore[union-attr]
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        self.lines += lines
        return lines

    def _drain(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line.rstrip())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        from apgas_scheduler.client import SchedulerError, request

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            request(self.address, "shutdown", key=self.key())
            self.proc.wait(30)
        except (SchedulerError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)

    def key(self) -> str:
        from apgas import auth

        return auth.read_secret(self.work / "key")

    def status(self) -> dict[str, Any]:
        from apgas_scheduler.client import request

        return request(self.address, "status", key=self.key())


def run(plan: Plan, work: Path) -> dict[str, Any]:
    """The scenario in ``work`` (an empty directory of ours); its figures."""
    from apgas_scheduler import client
    from apgas_scheduler.live import containment
    from apgas_scheduler.live.state import StateStore

    (work / "marks").mkdir()
    serve = Serve(work, plan.nodes)
    t0 = time.monotonic()
    serve.start()
    key = serve.key()
    door: dict[str, Any] = {"key": key} if plan.door == "tcp" else {"socket_path": work / "s.sock"}
    given: dict[int, int] = {}   # submit number -> the id the client was given
    errors: list[str] = []
    latencies: list[float] = []  # s from a submit's first try to its answer
    lock = threading.Lock()
    half = threading.Event()
    target = max(1, int(plan.jobs * plan.kill_after))

    def submitter(k: int) -> None:
        for i in range(k, plan.jobs, plan.threads):
            began = time.monotonic()
            try:
                job_id = client.submit(serve.address, job_of(plan, i, work), retry_for=60, **door)
            except client.SchedulerError as e:
                with lock:
                    errors.append(f"submit {i}: {e}")
                continue
            with lock:
                given[i] = job_id
                latencies.append(time.monotonic() - began)
                if len(given) >= target:
                    half.set()

    threads = [threading.Thread(target=submitter, args=(k,), daemon=True)
               for k in range(plan.threads)]
    for t in threads:
        t.start()
    resumed = ""
    try:
        if not half.wait(plan.timeout):
            raise RuntimeError(f"only {len(given)} of {plan.jobs} submits answered in {plan.timeout} s")
        killed = time.monotonic()
        serve.kill()  # at once: a request now would wait for the pass that holds the lock
        running_at_kill = _running_in(work / "state")
        time.sleep(plan.down)
        lines = serve.start()
        back = time.monotonic()
        resumed = lines[-1]
        for t in threads:
            t.join(max(1.0, plan.timeout - (time.monotonic() - t0)))
        deadline = t0 + plan.timeout
        while True:
            jobs = serve.status()["jobs"]
            if len(given) + len(errors) == plan.jobs and \
                    all(j["state"] not in ("queued", "running") for j in jobs):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every job ended within {plan.timeout} s")
            time.sleep(0.2)
        seconds = time.monotonic() - t0
    finally:
        serve.stop()
        for t in threads:
            t.join(5)
    store = StateStore(work / "state")
    try:
        stored = store.jobs()
        adopted = sum(e["event"] == "adopt" for e in store.events())
    finally:
        store.close()
    left_processes, left_cgroups = 0, 0
    for s in stored:
        if s.identity:
            if containment.alive(s.identity):
                left_processes += 1
                containment.kill(s.identity, 0.0)
            if s.identity.get("cgroup") and os.path.exists(s.identity["cgroup"]):
                left_cgroups += 1
    by_id = {s.id: s for s in stored}
    numbers = {job_id: i for i, job_id in given.items()}
    wrong: list[str] = []
    meanwhile = meanwhile_true = unknown = 0
    for s in stored:
        code = int(s.spec.name.rsplit("exit", 1)[1])
        true = (s.state == "done") if code == 0 else \
            (s.state == "failed" and s.reason.startswith(f"exit code {code}"))
        if not true:
            wrong.append(f"job {s.id} ({s.spec.name}): {s.state}: {s.reason}")
        if s.reason.endswith(MEANWHILE):
            meanwhile += 1
            meanwhile_true += true
        unknown += "unknown" in s.reason
    runs = {s.id: _marks(work / "marks" / str(s.id)) for s in stored}
    outcomes = work / "state" / "outcomes"  # none before the jobs recorded their ends
    outcomes_left = os.listdir(outcomes) if outcomes.exists() else []
    return {
        "plan": dataclasses.asdict(plan),
        "submits": plan.jobs, "submit_errors": errors, "ids_given": len(given),
        "jobs_in_state": len(stored),
        "duplicates": len([s for s in stored if s.id not in numbers])
        + (len(given) - len(set(given.values()))),
        "running_at_kill": running_at_kill, "adopted": adopted,
        "ended_while_down": meanwhile, "ended_while_down_true": meanwhile_true,
        "true_outcomes": len(stored) - len(wrong), "wrong_outcomes": wrong,
        "unknown_status": unknown,
        "ran_twice": sorted(j for j, n in runs.items() if n > 1),
        "never_ran": sorted(j for j, n in runs.items() if n == 0),
        "processes_left": left_processes, "cgroups_left": left_cgroups,
        "outcome_files_left": len(outcomes_left),
        "seconds": round(seconds, 3), "down_seconds": round(back - killed, 3),
        "longest_submit_seconds": round(max(latencies, default=0.0), 3),
        "resumed": resumed, "missing_ids": sorted(set(numbers) - set(by_id)),
    }


def _running_in(state: Path) -> int:
    """The jobs a (dead) scheduler's database says are running."""
    import sqlite3

    db = sqlite3.connect(f"file:{state / 'scheduler.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'running'").fetchone()[0]
    finally:
        db.close()


def _marks(path: Path) -> int:
    try:
        return len(path.read_text().split())
    except FileNotFoundError:
        return 0


ROWS = [("submits", "submits"), ("jobs_in_state", "jobs in the state"),
        ("duplicates", "duplicates"), ("running_at_kill", "running at the SIGKILL"),
        ("adopted", "adopted at the restart"), ("ended_while_down", "ended while it was down"),
        ("ended_while_down_true", "  of those, with their true outcome"),
        ("true_outcomes", "jobs with their true outcome"), ("unknown_status", "exit status unknown"),
        ("ran_twice", "jobs that ran twice"), ("never_ran", "jobs that never ran"),
        ("processes_left", "jobs with processes left"), ("cgroups_left", "cgroups left"),
        ("outcome_files_left", "outcome files left"), ("down_seconds", "daemon down (s)"),
        ("longest_submit_seconds", "longest submit, retries included (s)"),
        ("seconds", "whole run (s)")]


def table(result: dict[str, Any]) -> str:
    lines = []
    for key, label in ROWS:
        value = result[key]
        lines.append(f"{label:<38} {len(value) if isinstance(value, list) else value}")
    lines.append(f"{'restart said':<38} {result['resumed']}")
    for what in ("wrong_outcomes", "submit_errors"):
        for line in result[what][:20]:
            lines.append(f"  {what}: {line}")
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    defaults = Plan()
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--down", type=float, default=defaults.down,
                        help="seconds between the SIGKILL and the restart")
    parser.add_argument("--fail-every", type=int, default=defaults.fail_every,
                        help="every k-th job exits 3 (0: none)")
    parser.add_argument("--sleep-every", type=int, default=defaults.sleep_every,
                        help="every k-th job sleeps --sleep s first (0: none)")
    parser.add_argument("--sleep", type=float, default=defaults.sleep)
    parser.add_argument("--door", choices=("tcp", "unix"), default=defaults.door,
                        help="the clients send over TCP, signed with the key, or over the "
                        "Unix socket (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/scheduler_crash.json"))
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")


def check(args: argparse.Namespace) -> str | None:
    if args.jobs < 2 or args.nodes < 2 or args.threads < 1:
        return "--jobs and --nodes must be at least 2, --threads at least 1"
    return None


@harness("benchmarks.scheduler_crash", __doc__, Path("bench-results/scheduler_crash.json"), repeats=False,
         options=options, check=check)
def main(job: Run) -> int:
    args = job.args
    plan = Plan(jobs=args.jobs, nodes=args.nodes, threads=args.threads, down=args.down,
                fail_every=args.fail_every, sleep_every=args.sleep_every, sleep=args.sleep,
                door=args.door)
    work = Path(tempfile.mkdtemp(prefix="apgas-crash-"))
    try:
        result = run(plan, work)
    finally:
        if args.keep:
            log.info("the run's directory: %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    show(table(result))
    job.report["result"] = result
    exact = not (result["duplicates"] or result["wrong_outcomes"] or result["submit_errors"]
                 or result["processes_left"] or result["outcome_files_left"])
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
