"""Orders to malleable jobs (grow, shrink, refuse), each sent from a thread
of its own so that a slow job holds up nobody; the reply is handed to the
engine, which confirms or undoes the resize.

An order goes only to ``job.listen``: for a signed job, the port its verified
ready line named (:mod:`.server`), never one chosen ahead of the job; the
engine resizes no job before its ready message, and evolving asks wait for
it (:mod:`.asks`)."""

from __future__ import annotations

import time

from apgas import protocol
from apgas.order import send_order

from .core import SchedulerCore, log
from .records import Job

__all__ = ["Orders", "ORDER_TIMEOUT"]

ORDER_TIMEOUT = 120.0


class Orders:
    """Sending grow, shrink and refuse orders and taking in their replies. The
    callers hold ``core.lock``; the threads take it only for the replies."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    def grow_by(self, job: Job, count: int) -> None:
        """Reserve ``count`` free nodes for ``job`` and send the grow order."""
        hosts, counted = self.core.engine.begin_grow(job, count, self.core.now())
        self.send_grow(job, hosts, counted)

    def send_grow(self, job: Job, hosts: list[str], counted: int) -> None:
        """The grow order for ``hosts`` (reserved by the engine), from a thread;
        ``counted`` of them were outstanding requests."""
        self.core.event("reserve", job=job.id, nodes=list(hosts))  # held from now, for the metrics
        self.core.spawn(self._grow, f"scheduler-grow-{job.id}", job, hosts, counted)

    def send_shrink(self, job: Job, n: int) -> None:
        """The shrink order (the engine counted the shrink in flight), from a thread."""
        self.core.spawn(self._shrink, f"scheduler-shrink-{job.id}", job, n)

    def refuse_excess(self) -> None:
        """Refuse the outstanding requests a job can no longer get."""
        for job, excess, reason in self.core.engine.excess_requests():
            self.core.spawn(self._refuse, f"scheduler-refuse-{job.id}", job, excess, reason)

    @staticmethod
    def _order(job: Job, line: str) -> list[str]:
        """Send ``line`` to where ``job`` takes orders; OSError (the order failed)
        if it has not told us where (no verified ready line)."""
        if job.listen is None:
            raise OSError(f"job {job.id} has not reported where it takes orders "
                          f"({protocol.READY};<port>); no order goes out before")
        return send_order(job.listen, line, ORDER_TIMEOUT, secret="" if job.plain else job.secret)

    def _grow(self, job: Job, hosts: list[str], counted: int = 0) -> None:
        """The grow order; ``counted`` of its nodes were outstanding requests,
        refused (with an order) if the grow fails."""
        core = self.core
        started = time.monotonic()
        refuse = 0
        try:
            reply = self._order(job, protocol.grow(hosts))
            ok = not reply or not reply[0].startswith("error")  # ElasticJobScheduler's jobs say nothing
            problem = "" if ok else reply[0]
        except OSError as e:
            ok, problem = False, f"{type(e).__name__}: {e}"
        with core.lock:
            ok = ok and job.state == "running"
            kept = core.engine.finish_grow(job, hosts, ok, core.now())  # minus early releases
            if ok:
                core.event("grow", job=job.id, nodes=kept, duration=time.monotonic() - started)
                log.info("job %d grew by %s", job.id, ",".join(hosts))
            elif job.state == "running":
                core.event("grow_failed", job=job.id, nodes=hosts, reason=problem)
                log.warning("grow of job %d failed: %s", job.id, problem)
                if counted and job.ready:
                    refuse, job.busy = counted, True
        if refuse:
            self._refuse(job, refuse, f"the grow order for {','.join(hosts)} failed: {problem}")
        core.wake.set()

    def _refuse(self, job: Job, k: int, reason: str) -> None:
        """Tell ``job`` that ``k`` of its outstanding requested nodes will not come
        (the caller marked it busy and took them off ``job.requested``)."""
        reason = " | ".join(reason.splitlines())
        try:
            reply = self._order(job, protocol.refuse(k, reason))
            answer = reply[0] if reply else ""
        except OSError as e:
            answer = f"error {type(e).__name__}: {e}"
        with self.core.lock:
            job.busy = False
            self.core.event("refuse", job=job.id, nodes=k, reason=reason, reply=answer)
        if answer != f"ok refuse {k}":
            log.warning("job %d did not take the refusal of %d node(s): %r", job.id, k, answer)
        else:
            log.info("job %d: %d requested node(s) refused: %s", job.id, k, reason)
        self.core.wake.set()

    def _shrink(self, job: Job, n: int) -> None:
        core = self.core
        started = time.monotonic()
        try:
            reply = self._order(job, protocol.shrink(n))
        except OSError as e:
            reply = [f"error {type(e).__name__}: {e}"]
        with core.lock:
            if reply and reply[0].startswith("error"):
                core.engine.finish_shrink(job, n, None, core.now())
                if job.state == "running":
                    core.event("shrink_failed", job=job.id, reason=reply[0])
                    log.warning("shrink of job %d failed: %s", job.id, reply[0])
            else:
                strangers = [h for h in reply if h not in job.nodes]
                if strangers:
                    log.warning("job %d released hosts it did not hold: %s", job.id, strangers)
                released = core.engine.finish_shrink(job, n, reply, core.now())
                core.event("shrink", job=job.id, nodes=released, duration=time.monotonic() - started)
        core.wake.set()
