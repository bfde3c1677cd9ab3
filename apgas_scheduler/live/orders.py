"""Orders to malleable jobs (grow, shrink, refuse), each sent from a thread
of its own so that a slow job holds up nobody; the reply is handed to the
engine, which confirms or undoes the resize."""

from __future__ import annotations

import time

from apgas import protocol
from apgas.order import send_order

from .core import SchedulerCore, log
from .records import Job

__all__ = ["OrdersMixin", "ORDER_TIMEOUT"]

ORDER_TIMEOUT = 120.0


class OrdersMixin(SchedulerCore):
    """Sending grow, shrink and refuse orders and taking in their replies."""

    def _grow_by(self, job: Job, count: int) -> None:
        """Reserve ``count`` free nodes for ``job`` and send the grow order."""
        hosts, counted = self.engine.begin_grow(job, count, self.now())
        self._send_grow(job, hosts, counted)

    def _send_grow(self, job: Job, hosts: list[str], counted: int) -> None:
        """The grow order for ``hosts`` (reserved by the engine), from a thread;
        ``counted`` of them were outstanding requests."""
        self._event("reserve", job=job.id, nodes=list(hosts))  # held from now, for the metrics
        self._spawn(self._grow, f"scheduler-grow-{job.id}", job, hosts, counted)

    def _send_shrink(self, job: Job, n: int) -> None:
        """The shrink order (the engine counted the shrink in flight), from a thread."""
        self._spawn(self._shrink, f"scheduler-shrink-{job.id}", job, n)

    def _refuse_excess(self) -> None:
        """Refuse the outstanding requests a job can no longer get."""
        for job, excess, reason in self.engine.excess_requests():
            self._spawn(self._refuse, f"scheduler-refuse-{job.id}", job, excess, reason)

    def _order(self, job: Job, line: str) -> list[str]:
        assert job.listen is not None
        return send_order(job.listen, line, ORDER_TIMEOUT, secret="" if job.plain else job.secret)

    def _grow(self, job: Job, hosts: list[str], counted: int = 0) -> None:
        """The grow order; ``counted`` of its nodes were outstanding requests,
        refused (with an order) if the grow fails."""
        started = time.monotonic()
        refuse = 0
        try:
            reply = self._order(job, protocol.grow(hosts))
            ok = not reply or not reply[0].startswith("error")  # ElasticJobScheduler's jobs say nothing
            problem = "" if ok else reply[0]
        except OSError as e:
            ok, problem = False, f"{type(e).__name__}: {e}"
        with self._lock:
            ok = ok and job.state == "running"
            kept = self.engine.finish_grow(job, hosts, ok, self.now())  # minus early releases
            if ok:
                self._event("grow", job=job.id, nodes=kept, duration=time.monotonic() - started)
                log.info("job %d grew by %s", job.id, ",".join(hosts))
            elif job.state == "running":
                self._event("grow_failed", job=job.id, nodes=hosts, reason=problem)
                log.warning("grow of job %d failed: %s", job.id, problem)
                if counted and job.ready:
                    refuse, job.busy = counted, True
        if refuse:
            self._refuse(job, refuse, f"the grow order for {','.join(hosts)} failed: {problem}")
        self._wake.set()

    def _refuse(self, job: Job, k: int, reason: str) -> None:
        """Tell ``job`` that ``k`` of its outstanding requested nodes will not come
        (the caller marked it busy and took them off ``job.requested``)."""
        reason = " | ".join(reason.splitlines())
        try:
            reply = self._order(job, protocol.refuse(k, reason))
            answer = reply[0] if reply else ""
        except OSError as e:
            answer = f"error {type(e).__name__}: {e}"
        with self._lock:
            job.busy = False
            self._event("refuse", job=job.id, nodes=k, reason=reason, reply=answer)
        if answer != f"ok refuse {k}":
            log.warning("job %d did not take the refusal of %d node(s): %r", job.id, k, answer)
        else:
            log.info("job %d: %d requested node(s) refused: %s", job.id, k, reason)
        self._wake.set()

    def _shrink(self, job: Job, n: int) -> None:
        started = time.monotonic()
        try:
            reply = self._order(job, protocol.shrink(n))
        except OSError as e:
            reply = [f"error {type(e).__name__}: {e}"]
        with self._lock:
            if reply and reply[0].startswith("error"):
                self.engine.finish_shrink(job, n, None, self.now())
                if job.state == "running":
                    self._event("shrink_failed", job=job.id, reason=reply[0])
                    log.warning("shrink of job %d failed: %s", job.id, reply[0])
            else:
                strangers = [h for h in reply if h not in job.nodes]
                if strangers:
                    log.warning("job %d released hosts it did not hold: %s", job.id, strangers)
                released = self.engine.finish_shrink(job, n, reply, self.now())
                self._event("shrink", job=job.id, nodes=released, duration=time.monotonic() - started)
        self._wake.set()
