"""Evolving programs' asks on the scheduler's port: a request for more nodes,
a DMR check (answered through the policy's ``answer`` by the engine) and a
release of a place the program stopped itself; and, from any job, the loss
of a place it did not stop (``APGAS-PlaceLost``). The answer to an ask is one
line on the same connection; the order that carries out a resize follows
from a thread (:class:`.orders.Orders`)."""

from __future__ import annotations

import re
from typing import Any

from apgas import protocol
from apgas.serving import loggable

from .._model import Grow, Shrink
from ..policies.planning import GATE
from .core import SchedulerCore, log
from .orders import Orders
from .records import Job

__all__ = ["Asks", "READY_WAIT"]

READY_WAIT = 2.0
"""How long an evolving job's ask waits for its ready message: the two come on
separate connections, served by separate threads, so the ask may overtake it."""


class Asks:
    """Answering evolving requests and checks, and taking releases and lost
    places. A resize a check decides is carried out by ``orders``."""

    def __init__(self, core: SchedulerCore, orders: Orders) -> None:
        self.core = core
        self.orders = orders

    def release(self, job: Job, host: str) -> None:
        """The job stopped its place on ``host`` itself: the node goes back to the pool.
        Only a malleable or evolving job may: a rigid one still runs on all its nodes.
        The caller holds ``core.lock``."""
        event = self.core.event
        if not job.malleable:
            event("release_ignored", job=job.id, host=host)
            log.warning("job %d is %s and may not release %s; ignored", job.id, job.spec.cls, loggable(host))
            return
        kind = self.core.engine.release(job, host)  # held, or reserved for a grow in flight
        if kind == "shrink":
            event("shrink", job=job.id, nodes=[host], duration=0.0, requested=True)
        elif kind == "release":
            event("release", job=job.id, nodes=[host])  # before the grow was logged
        else:
            event("release_ignored", job=job.id, host=host)
            log.warning("job %d released %s, which it does not hold; ignored", job.id, loggable(host))

    def place_lost(self, job: Job, host: str) -> None:
        """The job lost its place on ``host`` without an order (the process died, or
        fell silent): the node leaves the job and is not given to another job, since
        it may be broken. Any job may say so of every node it holds, so one job's
        word takes the node from everyone only for ``core.quarantine`` seconds; once
        a job of another user has said it too (since the node's last ``node-up``),
        the node is down until the operator's ``node-up``. A host the job does not
        hold is refused (logged), and nothing changes. The caller holds ``core.lock``."""
        core, event, engine = self.core, self.core.event, self.core.engine
        until = core.now() + core.quarantine if core.quarantine > 0 else None
        if not engine.place_lost(job, host, job.owner, until):
            event("place_lost_refused", job=job.id, host=host)
            log.warning("job %d says it lost its place on %s, which it does not hold; refused, "
                        "nothing changed", job.id, loggable(host))
            return
        if until is not None and host in engine.quarantine:
            event("node_down", nodes=[host], job=job.id, owner=job.owner, until=round(until, 6),
                  reason=f"job {job.id} lost its place there; out of service for "
                         f"{core.quarantine:g} s (a quarantine)")
            log.warning("job %d lost its place on %s: the node is out of service for %g s, then "
                        "free again; down until node-up only if a job of another user loses a "
                        "place there too", job.id, host, core.quarantine)
        else:
            agree = len(engine.reporters.get(host, ())) > 1
            event("node_down", nodes=[host], job=job.id, owner=job.owner,
                  reason=f"job {job.id} lost its place there"
                         + (", as a job of another user had" if agree else ""))
            log.warning("job %d lost its place on %s%s: the node is down until an operator "
                        "brings it back (python -m apgas_scheduler node-up)", job.id, host,
                        ", as a job of another user had" if agree else "")
        event("shrink", job=job.id, nodes=[host], lost=True)  # an unplanned one

    def end_quarantines(self) -> None:
        """Put the nodes whose quarantine is over back in service (each scheduling
        pass). The caller holds ``core.lock``."""
        over = self.core.engine.end_quarantines(self.core.now())
        if over:
            self.core.event("node_up", nodes=over, quarantine=True)
            log.info("node(s) %s free again: their quarantine is over", ",".join(over))

    def answer(self, job: Job, parsed: protocol.JobMessage) -> str:
        """The one-line answer to an evolving request or check."""
        core = self.core
        kind, message = parsed.kind, parsed.text
        if not core.policy.grants_requests:
            answer = "error " + GATE.format(name=core.policy.name)
            with core.lock:
                core.event(kind, job=job.id, message=message, answer=answer)
            log.info("job %d: %s answered %s", job.id, loggable(message), loggable(answer))
            return answer
        with core.ready_cv:  # the job's ready message may still be on its way
            core.ready_cv.wait_for(lambda: job.ready or job.disabled or not job.malleable
                                   or job.state != "running", READY_WAIT)
            answer = (self._answer_request(job, parsed) if kind == "request"
                      else self._answer_check(job, parsed))
        log.info("job %d: %s answered %s", job.id, loggable(message), loggable(answer))
        core.wake.set()
        return answer

    def _answer_request(self, job: Job, parsed: protocol.JobMessage) -> str:
        """Queue ``n`` more nodes for ``job`` (granted by later passes), or refuse."""
        engine = self.core.engine
        message = parsed.text
        field = ";".join(parsed.fields)
        n = int(field) if re.fullmatch(r"[0-9]+", field) else 0
        problem = engine.ask_refusal(job)
        if n < 1:
            answer = f"error bad request {message!r}: the count must be a positive integer"
        elif problem:
            answer = f"error {problem}"
        else:
            problem = engine.request(job, n, self.core.now())
            answer = f"error {problem}" if problem else f"ok {n}"
        self.core.event("request", job=job.id, nodes=n, answer=answer)
        return answer

    def _answer_check(self, job: Job, parsed: protocol.JobMessage) -> str:
        """DMR's check_status for ``job``: the engine decides and sets the resize
        in motion before the answer leaves (so no pass undoes it); the order
        follows from a thread."""
        engine = self.core.engine
        fields: dict[str, Any] = {}
        try:
            low, high, preferred, factor = protocol.parse_check(parsed)
            fields = dict(min=low, max=high, preferred=preferred, factor=factor)
            problem = engine.ask_refusal(job)
            if problem:
                answer = f"error {problem}"
            elif job.busy or job.kill_reason:
                answer = "none"  # an order is in flight (or the job is being killed)
            else:
                d, hosts, counted = engine.answer_check(job, low, high, preferred, factor,
                                                        self.core.now())
                if isinstance(d, Grow):
                    self.orders.send_grow(job, hosts, counted)
                    answer = f"expand {job.size}"
                elif isinstance(d, Shrink):
                    self.orders.send_shrink(job, d.nodes)
                    answer = f"shrink {job.size}"
                else:
                    answer = "none"
        except ValueError as e:
            answer = f"error bad check {parsed.text!r}: {e}"
        self.core.event("check", job=job.id, **fields, answer=answer)
        return answer
