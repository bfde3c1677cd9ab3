"""What every part of the live scheduler shares: the engine (the cluster's
state), the lock that guards it, the durable state and event log (:mod:`.state`),
the worker threads and the clock. The daemon's parts (processes, orders, asks,
server) are mixins on this base, each with one job."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apgas import protocol
from apgas.lowlevel import open_append

from ..engine import Engine
from ..jobs import JobSpec
from ..policies.planning import Policy
from . import access
from .records import Job
from .state import StateStore
from .views import down_nodes

__all__ = ["SchedulerCore", "log"]

log = logging.getLogger("scheduler")


class SchedulerCore:
    """The shared state; the mixins' methods below are what the others call."""

    def __init__(self, nodes: list[str], policy: Policy, events: str | Path | None,
                 state_dir: str | Path) -> None:
        self.policy = policy
        self._store = StateStore(state_dir)
        known = self._store.nodes()  # after a restart: the pool as it was, then new names
        pool = known + [n for n in nodes if n not in known]
        self.engine: Engine[str] = Engine(pool, policy, log)
        for node in down_nodes(self._store.events()):  # down stays down across a restart
            if node in self.engine.owner:
                self.engine.set_down(node)
        self._lock = threading.RLock()
        self._ready_cv = threading.Condition(self._lock)  # a job's ready message came
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        # the clock counts from the first start, across restarts
        self._t0 = time.monotonic() - (time.time() - self._store.started)
        self._events = os.fdopen(open_append(events, "the event log"), "a", buffering=1) \
            if events else None
        self._watchers: list[Callable[[dict[str, Any]], None]] = []  # see every event (the dashboard)

    @property
    def _jobs(self) -> dict[int, Job]:
        return self.engine.jobs  # type: ignore[return-value]

    @property
    def _owner(self) -> dict[str, int | None]:
        return self.engine.owner

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _event(self, kind: str, **fields: Any) -> None:
        """Log an event; with it, durably, the job it names (or the pool)."""
        record = {"t": round(self.now(), 6), "event": kind, **fields}
        log.debug("event %s", record)
        self._store.record(record, job=self.engine.jobs.get(fields.get("job", -1)),
                           nodes=list(self.engine.owner) if kind == "pool" else None)
        if self._events is not None:
            self._events.write(json.dumps(record) + "\n")
        for watch in self._watchers:
            watch(record)

    def _spawn(self, target: Callable, name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _job(self, job_id: Any) -> Job:
        job = self._jobs.get(job_id) if isinstance(job_id, int) else None
        if job is None:
            raise ValueError(f"no job with id {job_id!r}")
        return job

    def _drop_requests(self, job: Job, reason: str) -> None:
        """Forget a job's outstanding requests: it takes no more orders."""
        if job.requested:
            self._event("request_dropped", job=job.id, nodes=job.requested, reason=reason)
            log.info("job %d: %d requested node(s) dropped: %s", job.id, job.requested, reason)
            job.take_requested(job.requested)

    def nodes_up(self, names: list[str]) -> list[str]:
        """Put nodes that are down back into service (the operator's ``node-up``): they
        are free again. ValueError, changing nothing, if one of them is not down.
        Returns the nodes still down."""
        with self._lock:
            down = self.engine.down
            wrong = [n for n in names if n not in down]
            if wrong or not names:
                raise ValueError(f"only nodes that are down can be brought up; not down: "
                                 f"{wrong or names}; down: {sorted(down) or 'none'}")
            for node in dict.fromkeys(names):
                self.engine.node_up(node)
            self._event("node_up", nodes=list(dict.fromkeys(names)))
            log.info("node(s) %s back in service", ",".join(names))
            still = sorted(down)
        self._wake.set()
        return still

    # -- provided by the daemon and its mixins (last in the order, so theirs win) -----
    def submit(self, spec: JobSpec, where: str = "job", key: str = "",
               client: access.Client | None = None, request: str | None = None) -> int:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def cancel(self, job_id: int, client: access.Client | None = None) -> str:
        raise NotImplementedError

    def add_nodes(self, names: list[str]) -> list[str]:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def _evolving_ask(self, job: Job, parsed: protocol.JobMessage) -> str:
        raise NotImplementedError

    def _evolving_release(self, job: Job, host: str) -> None:
        raise NotImplementedError

    def _place_lost(self, job: Job, host: str) -> None:
        raise NotImplementedError

    def _end(self, job: Job, state: str, reason: str) -> None:
        raise NotImplementedError

    def _kill(self, job: Job) -> None:
        raise NotImplementedError

    def _send_grow(self, job: Job, hosts: list[str], counted: int) -> None:
        raise NotImplementedError

    def _send_shrink(self, job: Job, n: int) -> None:
        raise NotImplementedError
