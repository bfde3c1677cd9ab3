"""The job's side of the controller's orders: read them from the job's ``AdminComment``
when woken (``SIGURG``) or every ``APGAS_SLURM_POLL`` seconds, and answer in its
``Comment`` (:mod:`apgas_scheduler.slurm.mailbox` has both grammars)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from . import commands as slurmctl
from . import mailbox

__all__ = ["Inbox"]

log = logging.getLogger("apgas.slurm")


class Inbox:
    """Hands each new order of job ``job_id`` to ``deliver`` (on its own thread, one
    at a time, in order); :meth:`answer` tells the controller how it went."""

    def __init__(self, job_id: str, deliver: Callable[[mailbox.Order], None],
                 poll: float) -> None:
        self.job_id = job_id
        self._deliver = deliver
        self._poll = poll
        self._wake = threading.Event()
        self._stopping = False
        self._seen = 0  # the last order handed over (or found at start: never replayed)
        self._previous: Any = None
        self._thread = threading.Thread(target=self._watch, name="apgas-slurm-orders", daemon=True)

    def open(self) -> None:
        """Take orders from now on: wake on ``SIGURG`` (from the main thread; elsewhere
        by polling alone), skip the order already there, and say ``apgas ready``."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGURG, self._on_signal)
        elif self._poll <= 0:
            log.warning("orders of slurm-controller are read only at a signal, and the "
                        "handler was defined off the main thread: set APGAS_SLURM_POLL")
        found = mailbox.parse_order(slurmctl.job_text(self.job_id, "admin_comment"))
        self._seen = found.seq if found else 0
        self.answer("ready", self._seen)
        self._thread.start()
        log.info("job %s takes orders of slurm-controller (woken by SIG%s, read every %s)",
                 self.job_id, mailbox.WAKE_SIGNAL,
                 f"{self._poll:g} s" if self._poll > 0 else "signal only")

    def close(self) -> None:
        """No more orders: ``apgas off``, and the signal handler as it was."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGURG, self._previous)
        try:
            slurmctl.set_comment(self.job_id, mailbox.answer_text(mailbox.Answer("off", 0)))
        except slurmctl.SlurmError as e:
            log.warning("could not say apgas off in job %s's Comment: %s", self.job_id, e)

    def answer(self, state: str, seq: int) -> None:
        try:
            slurmctl.set_comment(self.job_id, mailbox.answer_text(mailbox.Answer(state, seq)))
        except slurmctl.SlurmError as e:
            log.warning("could not answer the controller (apgas %s %d): %s", state, seq, e)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._wake.set()

    def _watch(self) -> None:
        while not self._stopping:
            self._wake.wait(self._poll if self._poll > 0 else None)
            self._wake.clear()
            if self._stopping:
                return
            try:
                order = mailbox.parse_order(slurmctl.job_text(self.job_id, "admin_comment"))
            except slurmctl.SlurmError as e:
                log.warning("could not read job %s's orders: %s", self.job_id, e)
                continue
            if order is not None and order.seq > self._seen:
                self._seen = order.seq
                log.info("order from slurm-controller: %s", mailbox.order_text(order))
                self._deliver(order)
