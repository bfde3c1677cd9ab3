"""What every part of the live scheduler shares: the engine (the cluster's state),
the lock that guards it, the durable state and event log (:mod:`.state`), the
worker threads and the clock. Each part of the daemon (:mod:`.processes`,
:mod:`.orders`, :mod:`.asks`, :mod:`.server`) is a plain object handed this one:
the parts talk through the engine and the log, not through one shared ``self``."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apgas.serving import loggable, open_append

from ..engine import Engine
from ..policies.planning import Policy
from .records import Job
from .state import StateStore
from .views import lost_places

__all__ = ["SchedulerCore", "log", "EscapeFilter", "QUARANTINE"]

QUARANTINE = 300.0
"""Seconds a node is out of service after one job said it lost its place there
(``APGAS-PlaceLost``), unless a job of another user says so too (then it is
down until ``node-up``). Any job may say it of every node it holds."""


class EscapeFilter(logging.Filter):
    """Escapes a log record's message that is not printable (a newline, ESC, a
    C1 control, DEL, a lone surrogate: :func:`apgas.serving.loggable`), so that
    no text in it starts a line of the log or acts on a terminal. A second
    guard: the clients' texts are bounded and checked where they come in, and
    logged through ``loggable``. Tracebacks (``exc_info``) keep their lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # logging reports a bad format itself
            return True
        if not message.isprintable():
            record.msg, record.args = loggable(message, len(message)), None
        return True


log = logging.getLogger("scheduler")
log.addFilter(EscapeFilter())  # also where no handler of ours is (a scheduler in a test)


class SchedulerCore:
    """The shared state. Whoever changes the engine or a job holds ``lock``;
    ``wake`` asks the daemon for a scheduling pass."""

    def __init__(self, nodes: list[str], policy: Policy, events: str | Path | None,
                 state_dir: str | Path) -> None:
        self.policy = policy
        self.store = StateStore(state_dir)
        # after a restart: the pool is the nodes asked now, in the order of the earlier
        # pool, then new names; besides, until the restart settles them (the daemon's
        # _resume), the nodes not asked that the earlier run's running jobs held
        known = self.store.nodes()
        held = [n for s in self.store.jobs() if s.state == "running" for n in s.nodes]
        asked = [n for n in known if n in nodes] + [n for n in nodes if n not in known]
        self.engine: Engine[str] = Engine(
            asked + [n for n in dict.fromkeys(held) if n not in nodes], policy, log)
        down, reporters = lost_places(self.store.events())  # down stays down across a restart
        for node, until in down.items():
            if node in nodes:
                self.engine.set_down(node, until)  # a quarantine ends when it would have
        for node, seen in reporters.items():
            if node in self.engine.owner:
                self.engine.reporters[node] = set(seen)
        self.quarantine = QUARANTINE  # the daemon's --quarantine
        self.lock = threading.RLock()
        self.ready_cv = threading.Condition(self.lock)  # a job's ready message came
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        # the clock counts from the first start, across restarts
        self._t0 = time.monotonic() - (time.time() - self.store.started)
        self._events = os.fdopen(open_append(events, "the event log"), "a", buffering=1) \
            if events else None
        self.watchers: list[Callable[[dict[str, Any]], None]] = []  # see every event (the dashboard)

    @property
    def jobs(self) -> dict[int, Job]:
        return self.engine.jobs  # type: ignore[return-value]

    @property
    def owner(self) -> dict[str, int | None]:
        return self.engine.owner

    def now(self) -> float:
        return time.monotonic() - self._t0

    def event(self, kind: str, **fields: Any) -> None:
        """Log an event; with it, durably, the job it names (or the pool). Drained
        nodes that left the pool with the change it records (``engine.left``) are
        recorded right after, as a ``pool`` event (a restart then knows them gone)."""
        record = {"t": round(self.now(), 6), "event": kind, **fields}
        log.debug("event %s", record)
        self.store.record(record, job=self.engine.jobs.get(fields.get("job", -1)),
                          nodes=list(self.engine.owner) if kind == "pool" else None)
        if self._events is not None:
            self._events.write(json.dumps(record) + "\n")
        for watch in self.watchers:
            watch(record)
        if self.engine.left and kind != "pool":  # drained nodes that left with this change
            left, self.engine.left = self.engine.left, []
            log.info("node(s) %s drained: out of the pool", ",".join(left))
            self.event("pool", nodes=list(self.engine.owner), left=left)

    def spawn(self, target: Callable, name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads = [x for x in self.threads if x.is_alive()] + [t]
        t.start()

    def job(self, job_id: Any) -> Job:
        job = self.jobs.get(job_id) if isinstance(job_id, int) else None
        if job is None:
            raise ValueError(f"no job with id {job_id!r}")
        return job

    def drop_requests(self, job: Job, reason: str) -> None:
        """Forget a job's outstanding requests: it takes no more orders."""
        if job.requested:
            self.event("request_dropped", job=job.id, nodes=job.requested, reason=reason)
            log.info("job %d: %d requested node(s) dropped: %s", job.id, job.requested, reason)
            job.take_requested(job.requested)

    def close(self) -> None:
        """Close the event log and the state, once every thread is done with them."""
        if self._events is not None:
            self._events.close()
            self._events = None
        self.store.close()
