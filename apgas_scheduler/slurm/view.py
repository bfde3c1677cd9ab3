"""Slurm's state as our policies see it, and their decisions as orders: pure, no I/O.

The controller (:mod:`apgas_scheduler.slurm.controller`) reads ``squeue --json``
and ``sinfo --json`` and hands the documents here. :func:`parse_jobs` and
:func:`parse_nodes` turn them into plain records (a malformed entry is skipped
and said why, never trusted); :class:`Planner` builds the scheduling engine
(:class:`apgas_scheduler.engine.Engine`, the one the daemon and the simulator
use) from them, runs the policy, and turns its grows and shrinks of jobs that
opted in into :class:`~apgas_scheduler.slurm.mailbox.Order` s. Slurm starts every
job itself: the policy's starts are only the policy's view of what Slurm will do.

A job opted in when it runs our runtime with ``APGAS_COMMUNICATOR=slurm`` under
a node range (``sbatch --nodes=MIN-MAX``) and says ``apgas ready`` in its
``Comment`` (:mod:`~apgas_scheduler.slurm.mailbox`). Slurm keeps a running job's
minimum (``tres_req_str``'s ``node=``) but not its maximum, so the planner keeps
the range of every job it saw pending; for a job that started before it saw
it, the maximum is the size it had when the planner first saw it (the range
is never widened by what the job's user writes).

A pending job that asks for more than a node count and a time (a node list,
excluded nodes, features, a reservation, a dependency, licenses, contiguous
nodes: :data:`UNMODELLED`) is left to Slurm: the planner cannot tell which
nodes would let it start, and a shrink for it could free the wrong ones and
keep another user's job small while it still pends. It is not planned for
(said once per job in the log).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from apgas.protocol import ascii_int
from launcher import expand_hostlist

from .._model import Grow, Shrink
from ..engine import Engine, Tracked
from ..policies.planning import Policy
from . import mailbox
from .commands import COMPANION_NAME, EXPANSION_NAME

__all__ = ["SlurmJob", "parse_jobs", "parse_nodes", "Planner", "STARTABLE", "USABLE_STATES"]

log = logging.getLogger("apgas_scheduler.slurm.controller")

STARTABLE = ("Resources", "Priority", "None")
"""Why a pending job waits, for the reasons a resize can help it start."""

USABLE_STATES = ("idle", "allocated", "mixed", "completing")
"""Node states (``sinfo --json``'s ``state``) of nodes jobs may run on."""

UNMODELLED = ("required_nodes", "excluded_nodes", "features", "reservation", "dependency",
              "licenses", "contiguous", "burst_buffer", "batch_features")
"""``squeue --json`` fields of a pending job that say where or when it may start,
which the planner cannot model: such a job is not planned for (module docstring)."""

UNLIMITED = 365 * 86400.0
MAX_JOBS = 100_000
"""More jobs than this in one ``squeue`` answer are not read (the rest is skipped)."""

_NODE_REQ = re.compile(r"(?:^|,)node=([0-9]+)(?:,|$)")


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """One job of ``squeue --json``, with what the planner needs."""

    id: int
    user: int
    name: str
    state: str  # PENDING, RUNNING, ...
    partition: str
    nodes: tuple[str, ...]  # running: its nodes
    min_nodes: int
    max_nodes: int  # 0: not known (Slurm does not show it for running jobs)
    time_limit: float  # s
    submit: float
    start: float
    resize_time: float  # 0: never resized
    reason: str
    comment: str
    admin_comment: str
    constraints: tuple[str, ...] = ()  # what of UNMODELLED it asks (pending jobs)


def _int(entry: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, dict):  # newer data parsers: {"set": true, "number": 4}
        value = value.get("number") if value.get("set", True) else default
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} is {value!r}, not a whole number")
    return value


def _text(entry: Mapping[str, Any], key: str, limit: int = 4096) -> str:
    value = entry.get(key) or ""
    if isinstance(value, list):  # newer data parsers: ["RUNNING"]
        value = value[0] if value else ""
    if not isinstance(value, str):
        raise ValueError(f"{key} is {value!r}, not text")
    return value[:limit]


def parse_jobs(document: Mapping[str, Any]) -> list[SlurmJob]:
    """The jobs of a ``squeue --json`` document; entries that do not parse are skipped
    and logged with the reason."""
    entries = document.get("jobs")
    if not isinstance(entries, list):
        raise ValueError(f"squeue --json gave no job list: keys {sorted(document)[:10]}")
    jobs = []
    for entry in entries[:MAX_JOBS]:
        try:
            jobs.append(_job(entry))
        except (ValueError, TypeError, AttributeError) as e:
            ident = entry.get("job_id") if isinstance(entry, dict) else None
            log.warning("skipped job %r of squeue: %s", ident, e)
    return jobs


def _job(entry: Mapping[str, Any]) -> SlurmJob:
    state = _text(entry, "job_state")
    listed = _text(entry, "nodes")
    nodes = tuple(expand_hostlist(listed)) if state == "RUNNING" and listed else ()
    count = _int(entry, "node_count", 0)
    limit = entry.get("time_limit")
    if isinstance(limit, dict):
        limit = limit.get("number") if limit.get("set") and not limit.get("infinite") else None
    requested = _NODE_REQ.search(_text(entry, "tres_req_str"))
    if state == "PENDING":
        low, high = count, _int(entry, "max_nodes", 0)
    else:
        low, high = int(requested.group(1)) if requested else len(nodes), 0
    return SlurmJob(
        id=_int(entry, "job_id"), user=_int(entry, "user_id"), name=_text(entry, "name", 200),
        state=state, partition=_text(entry, "partition", 200), nodes=nodes,
        min_nodes=max(1, low), max_nodes=max(0, high),
        time_limit=UNLIMITED if not isinstance(limit, int) or isinstance(limit, bool) else limit * 60.0,
        submit=float(_int(entry, "submit_time", 0)), start=float(_int(entry, "start_time", 0)),
        resize_time=float(_int(entry, "resize_time", 0)), reason=_text(entry, "state_reason", 200),
        comment=_text(entry, "comment", mailbox.MAX_TEXT + 1),
        admin_comment=_text(entry, "admin_comment", mailbox.MAX_TEXT + 1),
        constraints=tuple(k for k in UNMODELLED if _asks(entry.get(k))))


def _asks(value: Any) -> bool:
    """Whether a constraint field of ``squeue --json`` asks anything: text other than
    empty or ``(null)``, a non-empty list, true, or a set number (newer parsers)."""
    if isinstance(value, str):
        return value.strip() not in ("", "(null)")
    if isinstance(value, dict):
        return bool(value.get("set", True)) and _asks(value.get("number", value.get("value")))
    return bool(value)


def parse_nodes(document: Mapping[str, Any], partition: str | None) -> list[str]:
    """The usable nodes of ``partition`` (all partitions: None) in a ``sinfo --json``
    document: up and not drained, in Slurm's order."""
    entries = document.get("nodes")
    if not isinstance(entries, list):
        raise ValueError(f"sinfo --json gave no node list: keys {sorted(document)[:10]}")
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        states = entry.get("state")
        states = [states] if isinstance(states, str) else states if isinstance(states, list) else []
        flags = entry.get("state_flags") or []
        words = {str(s).lower() for s in [*states, *flags]}
        if not words & set(USABLE_STATES) or words & {"drain", "draining", "drained", "down",
                                                       "fail", "maintenance", "reserved"}:
            continue
        parts = entry.get("partitions") or []
        if partition is not None and partition not in parts:
            continue
        found.append(entry["name"])
    return found


def _with_companions(jobs: list[SlurmJob]) -> list[SlurmJob]:
    """A job's companion allocations (running jobs of the same user named
    ``apgas-companion-<job>``, where Slurm cannot grow jobs) count as its nodes;
    a companion of a job of somebody else is an ordinary job."""
    owners = {j.id: j for j in jobs if j.state == "RUNNING"}
    extra: dict[int, list[str]] = {}
    merged = set()
    for job in jobs:
        prefix, _, of = job.name.rpartition("-")
        number = ascii_int(of) if prefix == COMPANION_NAME else None
        owner = owners.get(number) if number is not None else None
        if job.state == "RUNNING" and owner is not None and owner.user == job.user:
            extra.setdefault(owner.id, []).extend(job.nodes)
            merged.add(job.id)
    return [dataclasses.replace(j, nodes=j.nodes + tuple(extra[j.id])) if j.id in extra else j
            for j in jobs if j.id not in merged]


@dataclasses.dataclass
class _Sent:
    seq: int
    at: float
    warned: bool = False


class Planner:
    """One policy over Slurm's jobs; :meth:`plan` is one pass. It remembers the node
    ranges it saw and the orders in flight, nothing else: Slurm holds the state."""

    def __init__(self, policy: Policy, partition: str | None = None,
                 order_timeout: float = 120.0) -> None:
        self.policy = policy
        self.partition = partition
        self.order_timeout = order_timeout
        self.ranges: dict[int, tuple[int, int]] = {}
        self._sent: dict[int, _Sent] = {}
        self._unmodelled: set[int] = set()  # pending jobs left to Slurm, said once each

    def plan(self, now: float, jobs: Iterable[SlurmJob],
             nodes: list[str]) -> list[tuple[SlurmJob, mailbox.Order]]:
        """The orders of one pass: ``(job, order)`` for the jobs the policy grows or shrinks."""
        jobs = _with_companions([j for j in jobs
                                 if self.partition is None or j.partition == self.partition])
        for job in jobs:
            if job.state == "PENDING" and job.max_nodes > job.min_nodes:
                self.ranges[job.id] = (job.min_nodes, job.max_nodes)
        live = {j.id for j in jobs}
        self.ranges = {k: v for k, v in self.ranges.items() if k in live}
        self._sent = {k: v for k, v in self._sent.items() if k in live}
        self._unmodelled &= live
        engine: Engine[str] = Engine(nodes, self.policy, log)
        by_id: dict[int, SlurmJob] = {}
        pool = set(nodes)
        for job in jobs:
            if self._track(job, now, pool, engine) is not None:
                by_id[job.id] = job
        orders = []
        for decision in engine.decide(now):
            if not isinstance(decision, Grow | Shrink) or not engine.admit(decision, now):
                continue
            job = by_id[decision.job]
            verb = "grow" if isinstance(decision, Grow) else "shrink"
            order = mailbox.Order(self._next_seq(job), verb, decision.nodes)
            self._sent[job.id] = _Sent(order.seq, now)
            orders.append((job, order))
            # one order per job and pass; later decisions see it in flight
            engine.jobs[job.id].busy = True
            engine.jobs[job.id].touch()
        return orders

    def _next_seq(self, job: SlurmJob) -> int:
        given = mailbox.parse_order(job.admin_comment)
        answer = mailbox.parse_answer(job.comment)
        return max(given.seq if given else 0, answer.seq if answer else 0) + 1

    def _track(self, job: SlurmJob, now: float, pool: set[str],
               engine: Engine[str]) -> Tracked | None:
        if job.state == "PENDING":
            if job.reason not in STARTABLE or job.name.startswith((EXPANSION_NAME, COMPANION_NAME)):
                return None
            if job.constraints:
                self._leave_to_slurm(job)
                return None
            cls = "moldable" if job.max_nodes > job.min_nodes else "rigid"
            tracked = Tracked(job.id, cls, job.min_nodes, max(job.min_nodes, job.max_nodes),
                              job.time_limit, job.submit)
            engine.submit(tracked)
            return tracked
        if job.state != "RUNNING":
            return None
        held = [n for n in job.nodes if n in pool and engine.owner.get(n) is None]
        if not held:
            return None  # on nodes outside the pool, or sharing nodes counted already
        low, high = self.ranges.setdefault(job.id, (job.min_nodes, len(job.nodes)))
        high = max(high, low)
        ready, busy = self._opted_in(job, now, low, high)
        tracked = Tracked(job.id, "malleable" if ready else "rigid", low if ready else len(held),
                          high if ready else len(held), job.time_limit, job.submit,
                          ready=ready, busy=busy,
                          last_resize=job.resize_time or None)
        engine.submit(tracked)
        engine.resume(tracked, held, job.start or now)
        return tracked

    def _leave_to_slurm(self, job: SlurmJob) -> None:
        """Say once that a pending job with constraints the planner cannot model is not
        planned for: no job is shrunk for it."""
        if job.id not in self._unmodelled:
            self._unmodelled.add(job.id)
            log.info("pending job %d asks for %s, which the planner cannot model: no job is "
                     "resized for it (Slurm starts it where it may)", job.id,
                     ", ".join(job.constraints))

    def _opted_in(self, job: SlurmJob, now: float, low: int, high: int) -> tuple[bool, bool]:
        """Whether the job takes orders, and whether one is in flight (or unanswered
        for longer than the order timeout: then it takes no more until it answers)."""
        answer = mailbox.parse_answer(job.comment)
        if answer is None or not answer.takes_orders or high <= low:
            return False, False
        given = mailbox.parse_order(job.admin_comment)
        if given is None or given.seq <= answer.seq:
            self._sent.pop(job.id, None)
            return True, False
        sent = self._sent.setdefault(job.id, _Sent(given.seq, now))
        if now - sent.at > self.order_timeout and not sent.warned:
            sent.warned = True
            log.warning("job %d has not answered order %d (%s) within %g s; it gets no "
                        "other order until it does", job.id, given.seq,
                        mailbox.order_text(given), self.order_timeout)
        return True, True
