"""``apgas-scheduler slurm-controller``: our policies resize the malleable jobs of a Slurm.

It runs beside slurmctld as the Slurm operator (SlurmUser, root, or a user with
``AdminLevel=Operator``), and every ``--interval`` seconds:

1. reads Slurm's state: ``squeue --json`` and ``sinfo --json`` (two calls to
   slurmctld a pass, however many jobs there are);
2. runs the policy on it (:class:`apgas_scheduler.slurm.view.Planner`: the
   scheduling engine and policy objects the daemon and the simulator use);
3. sends each grow or shrink to its job (:mod:`apgas_scheduler.slurm.mailbox`):
   ``scontrol update JobId=J AdminComment="apgas-order N shrink K"``, then
   ``scancel --signal=URG --full J``.

The job carries the order out itself (its places leave, then it gives the
nodes back, or it asks Slurm for more), so Slurm stays in charge: it starts
every job, and only jobs that opted in are ever ordered. Calls to slurmctld
are counted (``Controller.calls``) and logged every minute.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..policies import get_policy
from . import commands, mailbox
from .view import Planner, parse_jobs, parse_nodes

__all__ = ["Controller", "run_controller"]

log = logging.getLogger("apgas_scheduler.slurm.controller")

Run = Callable[..., str]


class Controller:
    """One policy over one Slurm; :meth:`step` is one pass, :meth:`serve` the loop."""

    def __init__(self, planner: Planner, run: Run = commands.run) -> None:
        self.planner = planner
        self._run = run
        self.calls: collections.Counter[str] = collections.Counter()  # command -> calls
        self.sent: list[tuple[int, mailbox.Order]] = []

    def call(self, *args: str) -> str:
        self.calls[args[0]] += 1
        return self._run(*args)

    def read(self) -> tuple[list[Any], list[str]]:
        """Slurm's jobs and usable nodes, now."""
        jobs = parse_jobs(_document(self.call("squeue", "--json"), "squeue --json"))
        nodes = parse_nodes(_document(self.call("sinfo", "--json"), "sinfo --json"),
                            self.planner.partition)
        return jobs, nodes

    def step(self, now: float | None = None) -> list[tuple[int, mailbox.Order]]:
        """One pass: read, plan, send; the orders sent."""
        jobs, nodes = self.read()
        sent = []
        for job, order in self.planner.plan(time.time() if now is None else now, jobs, nodes):
            try:
                self.send(job.id, order)
            except commands.SlurmError as e:
                log.error("order %s to job %d not sent: %s%s", mailbox.order_text(order), job.id,
                          e, _PERMISSION if "ermission" in str(e) or "denied" in str(e) else "")
                continue
            log.info("job %d (%s, %d node(s)): %s", job.id, job.name, len(job.nodes),
                     mailbox.order_text(order))
            sent.append((job.id, order))
        self.sent.extend(sent)
        return sent

    def send(self, job_id: int, order: mailbox.Order) -> None:
        self.call("scontrol", "update", f"JobId={job_id}",
                  f"AdminComment={mailbox.order_text(order)}")
        try:
            self.call("scancel", f"--signal={mailbox.WAKE_SIGNAL}", "--full", str(job_id))
        except commands.SlurmError as e:  # it reads the order at its next poll
            log.warning("job %d: the wake-up signal failed (%s); it reads the order at its "
                        "next poll", job_id, e)

    def serve(self, interval: float, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; a failed pass is logged, not fatal."""
        minute, counted = time.monotonic(), sum(self.calls.values())
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except (commands.SlurmError, ValueError) as e:
                log.warning("pass failed: %s", e)
            if started - minute >= 60:
                total = sum(self.calls.values())
                log.info("%d call(s) to slurmctld in the last %.0f s (%s)", total - counted,
                         started - minute, ", ".join(f"{k} {v}" for k, v in sorted(self.calls.items())))
                minute, counted = started, total
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


_PERMISSION = ("; the controller must run as the Slurm operator: SlurmUser, root, or a user "
               "with AdminLevel=Operator (sacctmgr modify user NAME set adminlevel=operator)")


def _document(text: str, what: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} gave no JSON ({e}): {text[:200]!r}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{what} gave {type(document).__name__}, not an object")
    errors = document.get("errors")
    if errors:
        raise ValueError(f"{what} reported errors: {str(errors)[:300]}")
    return document


def _check_operator() -> None:
    """Warn when this user is neither root nor SlurmUser (it may still be an operator)."""
    if os.geteuid() == 0:
        return
    try:
        config = commands.run("scontrol", "show", "config")
    except commands.SlurmError as e:
        raise SystemExit(f"slurm-controller: cannot reach Slurm: {e}") from None
    slurm_user = next((line.split("=", 1)[1].strip().split("(")[0] for line in config.splitlines()
                       if line.split("=", 1)[0].strip() == "SlurmUser"), "")
    me = pwd.getpwuid(os.geteuid()).pw_name
    if me != slurm_user:
        log.warning("running as %s, not as root or SlurmUser (%s): orders are refused unless "
                    "%s is a Slurm operator", me, slurm_user or "?", me)


def run_controller(policy: str, partition: str | None, interval: float,
                   resize_interval: float, order_timeout: float) -> int:
    """The command: runs until SIGTERM or SIGINT."""
    if interval <= 0:
        raise ValueError(f"--interval must be above 0 seconds, got {interval:g}")
    controller = Controller(Planner(get_policy(policy, resize_interval=resize_interval),
                                    partition, order_timeout))
    _check_operator()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    log.info("slurm-controller: policy %s, partition %s, a pass every %g s", policy,
             partition or "(all)", interval)
    controller.serve(interval, stop)
    log.info("slurm-controller stopped after %d order(s); calls to slurmctld: %s",
             len(controller.sent), dict(controller.calls))
    return 0
