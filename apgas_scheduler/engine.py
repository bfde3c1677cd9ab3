"""The scheduling engine: the cluster's state and its transitions, shared by
the live daemon and the simulator so that both schedule by the same rules.

Pure state: no I/O, no threads and no clock of its own (``now`` is passed
in). It holds the nodes and their owners, the queued and running jobs, the
resizes in flight, the evolving jobs' outstanding requests and DMR's
priority job; it builds the :class:`JobView` s policies see, checks every
decision before it is applied (:meth:`Engine.admit`: a decision the state
does not allow is refused with a logged reason) and answers evolving asks
through :meth:`Policy.answer`. The daemon adds processes and sockets around
it, the simulator an event clock and a run-time model.

A resize is two steps, since it takes time: ``begin_grow`` reserves the
nodes at once (nobody else gets them), ``finish_grow`` confirms or frees
them; ``begin_shrink`` counts the nodes as on their way back (the views no
longer show them as the job's), ``finish_shrink`` frees those released.

A node whose place a job lost without an order (``place_lost``) is *down*:
it leaves the job and goes to nobody, since it may be broken; policies see a
cluster without it. Given a quarantine's end, one job's report keeps it down
only until then (``end_quarantines``), since any job may say it of any node it
holds; a second reporter (another user's job) keeps it down until ``node_up``.

A node may be *drained* (``drain``: a restarted live scheduler was not given it
again): free, it leaves the pool at once; held, it stays its job's while the job
holds it but is no capacity for new work (not free, not usable, never a grow's),
and leaves the pool (``left`` says so, for the driver to record) as soon as the
job gives it back. ``add_nodes`` of a draining node keeps it.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Iterable
from typing import Any

from apgas import protocol

from ._model import Decision, Grow, JobView, Shrink, Start
from ._nodes import Node, NodePool
from .policies.planning import JobQueue, Policy

__all__ = ["Engine", "Tracked", "Node"]



@dataclasses.dataclass(eq=False)
class Tracked:
    """A job as the engine knows it. Its view is cached (``cached``) so that a
    pass over thousands of unchanged jobs builds no new views: whoever changes
    an attribute calls :meth:`touch` (the engine's transitions do; the daemon's
    record does it on every assignment)."""

    id: int
    cls: str
    min_nodes: int
    max_nodes: int
    walltime: float  # the user's estimate, at the preferred size
    submit: float
    preferred: int = 0
    rho: float = 0.0
    serial: float | None = None  # Amdahl's serial fraction, when the driver knows it
    asks: bool = False  # it calls check_status itself (live evolving programs)
    state: str = "queued"  # queued | running | done | failed | cancelled
    nodes: list[Any] = dataclasses.field(default_factory=list)  # held, confirmed
    reserved: list[Any] = dataclasses.field(default_factory=list)  # held for grows in flight
    start: float | None = None
    end: float | None = None
    ready: bool = False  # takes orders (a malleable job that registered)
    disabled: bool = False  # said it takes no more orders
    busy: bool = False  # a resize (or refusal) is in flight
    shrinking: int = 0  # nodes shrinks in flight will give back
    requested: int = 0  # nodes it asked for and was not yet given
    requested_since: float | None = None  # when the oldest of those requests came
    last_resize: float | None = None
    stopping: str = ""  # why it is being stopped; it is then no longer scheduled
    expected_end: float | None = None  # the driver's estimate (the simulator's)
    priority: bool = False  # a queued job a check's shrink made room for
    grows: int = 0
    shrinks: int = 0
    requeues: int = 0  # times it went back to the queue (see Engine.requeue)
    lost: int = 0  # places lost without an order (nodes now down) in this run
    cached: JobView | None = dataclasses.field(default=None, repr=False)

    def touch(self) -> None:
        """Forget the cached view (after a change)."""
        self.cached = None

    @property
    def malleable(self) -> bool:
        return self.cls in ("malleable", "evolving")

    @property
    def held(self) -> int:
        """The nodes it owns, grow reservations included."""
        return len(self.nodes) + len(self.reserved)

    @property
    def takes_orders(self) -> bool:
        """Whether it may be resized now: a malleable job that registered, with no
        order in flight (``busy``) and no shrink whose nodes are still on their
        way back (a driver may not hold it ``busy`` then: the simulator's free
        shrink ends at its release event, after the passes of its instant)."""
        return self.malleable and self.ready and not self.busy and not self.shrinking

    @property
    def size(self) -> int:
        """What policies see it hold: a shrink in flight counts as done, so that
        no pass shrinks twice for one need."""
        return len(self.nodes) + len(self.reserved) - self.shrinking

    def view(self) -> JobView:
        view = self.cached
        if view is None:
            view = self.cached = JobView(self.id, self.cls, self.min_nodes, self.max_nodes,  # type: ignore[arg-type]
                           self.walltime, self.submit, self.size, self.start, self.last_resize,
                           self.takes_orders, self.preferred,
                           self.rho, self.expected_end, self.requested, self.requested_since,
                           self.priority, self.asks, self.serial)
        return view

    def take_requested(self, k: int) -> None:
        """``k`` of the outstanding requested nodes are given or refused."""
        self.requested -= k
        if self.requested <= 0:
            self.requested, self.requested_since = 0, None
        self.cached = None


class Engine(NodePool[Node]):
    """The state of one cluster under one policy; see the module docstring.

    ``log`` receives the refused decisions (the driver's logger, so that each
    driver's warnings stay where its users look)."""

    def __init__(self, nodes: Iterable[Node], policy: Policy,
                 log: logging.Logger | None = None) -> None:
        self.policy = policy
        self.log = log or logging.getLogger("apgas_scheduler.engine")
        self.jobs: dict[int, Tracked] = {}
        self.queue: dict[int, Tracked] = {}  # in submission order
        self._order = JobQueue()  # the queue sorted, as policies see it (see decide)
        self.running: dict[int, Tracked] = {}
        self.priority: int | None = None
        super().__init__(nodes)

    # -- jobs --------------------------------------------------------------------------
    def submit(self, job: Tracked) -> None:
        self.jobs[job.id] = job
        self.queue[job.id] = job
        self._order.add(job)

    def start(self, job: Tracked, count: int, now: float) -> list[Node]:
        """Start a queued job on the first ``count`` free nodes (see :meth:`admit`)."""
        del self.queue[job.id]
        self._order.remove(job.id)
        self.running[job.id] = job
        job.nodes = self._take(job, count)
        job.state, job.start = "running", now
        job.cached = None
        return job.nodes

    def resume(self, job: Tracked, nodes: list[Node], start: float) -> None:
        """A queued job runs already on exactly ``nodes`` (a live scheduler adopts
        it after a restart): they leave the free set, whoever was first in line."""
        taken = set(nodes)
        if any(self.owner.get(n, -1) is not None for n in taken):
            raise ValueError(f"job {job.id} cannot resume on {sorted(taken, key=str)}: "
                             "not all free nodes of the pool")
        del self.queue[job.id]
        self._order.remove(job.id)
        self.running[job.id] = job
        self._free = [i for i in self._free if self._pool[i] not in taken]
        heapq.heapify(self._free)
        for n in nodes:
            self.owner[n] = job.id
        job.nodes, job.state, job.start = list(nodes), "running", start
        job.cached = None

    def end(self, job: Tracked, state: str, now: float) -> int:
        """The job ended (or left the queue): its nodes come back. Returns how many
        requested nodes were dropped with it."""
        if self.queue.pop(job.id, None) is not None:
            self._order.remove(job.id)
        self.running.pop(job.id, None)
        self._give([n for n in (*job.nodes, *job.reserved) if self.owner.get(n) == job.id])
        dropped = job.requested
        job.take_requested(dropped)
        job.state, job.end, job.nodes, job.reserved, job.shrinking = state, now, [], [], 0
        job.cached = None
        if self.priority == job.id:
            self.set_priority(None)
        return dropped

    def requeue(self, job: Tracked, now: float, counted: bool = True) -> None:
        """The job (running, or ended) goes back to the queue: its nodes come back as
        at an end, and it waits to start again with its id, behind the jobs already
        queued: its submit time is ``now``, as a new submit's (an old one would let a
        job bank its place: cancelled at once and requeued later, or killing itself
        and coming back first, ahead of every job submitted since); one more of its
        requeues. Not ``counted``: its program never began (the scheduler stopped
        before its go), so it keeps its requeues and its place."""
        self.end(job, "queued", now)
        job.start = job.end = None
        if counted:
            job.submit = now
        job.requeues, job.lost, job.stopping = job.requeues + counted, 0, ""
        job.ready = job.disabled = job.busy = False
        self.submit(job)

    def overdue(self, now: float, register_timeout: float) -> list[tuple[Tracked, str]]:
        """Running jobs to stop: past their walltime, or malleable ones that never
        answered (neither registered nor said they went rigid: a job that
        registered and then disabled its handler is ``disabled``, not ``ready``,
        and runs on); each is marked ``stopping`` with the reason."""
        out = []
        for job in self.running.values():
            if job.stopping or job.start is None:
                continue
            if now - job.start > job.walltime:
                job.stopping = f"killed: ran past its walltime of {job.walltime:g} s"
            elif (job.malleable and not (job.ready or job.disabled)
                  and now - job.start > register_timeout):
                job.stopping = (f"killed: never sent {protocol.READY} within "
                                f"{register_timeout:g} s")
            else:
                continue
            job.cached = None
            out.append((job, job.stopping))
        return out

    # -- the policy ---------------------------------------------------------------------
    def views(self) -> tuple[list[JobView], list[JobView]]:
        """What the policy sees: the queue and the running jobs (not those being stopped)."""
        if self.priority is not None and self.priority not in self.queue:
            self.set_priority(None)  # started (or gone): requests need not wait for it
        queue = [j.cached or j.view() for j in self.queue.values()]
        running = [j.cached or j.view() for j in self.running.values() if not j.stopping]
        return queue, running

    def decide(self, now: float) -> list[Decision]:
        """The policy's decisions. It gets the queue as a :class:`JobQueue`: a
        sequence of views kept sorted as jobs come and go, read lazily, so that
        a pass costs what the policy reads (FCFS: the head; EASY: the head and
        the jobs that fit), not the whole queue."""
        if self.priority is not None and self.priority not in self.queue:
            self.set_priority(None)
        if len(self._order) != len(self.queue):  # someone changed the dict directly
            self._order = JobQueue(self.queue.values())
            self._order.flagged_id = self.priority
        running = [j.cached or j.view() for j in self.running.values() if not j.stopping]
        return self.policy.decide(now, self._order, running, len(self._free), self.usable)

    def refusal(self, d: Decision) -> str | None:
        """Why the state does not allow ``d`` now, or None."""
        job = self.jobs.get(d.job)
        if job is None:
            return f"there is no job {d.job}"
        if isinstance(d, Start):
            if job.state != "queued":
                return f"job {job.id} is {job.state}, not queued"
            if not job.min_nodes <= d.nodes <= job.max_nodes:
                return f"{d.nodes} node(s) outside its [{job.min_nodes}, {job.max_nodes}]"
            if d.nodes > len(self._free):
                return f"{d.nodes} node(s) asked, {len(self._free)} free"
            return None
        if not isinstance(d, (Grow, Shrink)):
            return f"not a decision: {d!r}"
        if job.state != "running" or job.stopping:
            return f"job {job.id} is {job.state}{' and stopping' if job.stopping else ''}"
        if not job.malleable:
            return f"job {job.id} is {job.cls}; only malleable and evolving jobs are resized"
        if not job.takes_orders:
            return f"job {job.id} takes no order now (not registered, or one in flight)"
        if d.nodes < 1:
            return f"a resize by {d.nodes} node(s)"
        if (reason := self._range_refusal(job, d, job.min_nodes, job.max_nodes)) is not None:
            return reason
        if isinstance(d, Grow) and d.nodes > len(self._free):
            return f"{d.nodes} node(s) asked, {len(self._free)} free"
        return None

    @staticmethod
    def _range_refusal(job: Tracked, d: Grow | Shrink, low: int, high: int) -> str | None:
        """Why resizing ``job`` by ``d`` would take it out of ``[low, high]``, or
        None. A grow counts every node the job holds, those a shrink in flight
        gives back included (they are its until they are back), so that it never
        holds more than ``high``, whatever the policy saw; a shrink counts them
        as gone already."""
        if isinstance(d, Grow):
            if job.held + d.nodes > high:
                back = (f" ({job.shrinking} of the {job.held} it holds on their way back)"
                        if job.shrinking else "")
                return f"{job.held + d.nodes} node(s) outside its [{low}, {high}]{back}"
            return None
        if job.size - d.nodes < low:
            return f"{job.size - d.nodes} node(s) outside its [{low}, {high}]"
        return None

    def admit(self, d: Decision, now: float) -> bool:
        """Whether ``d`` may be applied; a refusal is logged with its reason."""
        reason = self.refusal(d)
        if reason is not None:
            self.log.warning("ignored %s at t=%.1f: %s", d, now, reason)
        return reason is None

    # -- resizes -----------------------------------------------------------------------
    def begin_grow(self, job: Tracked, count: int, now: float,
                   hold: bool = True) -> tuple[list[Node], int]:
        """Reserve ``count`` free nodes for ``job``; returns them and how many of its
        outstanding requests they count towards (the job counts every grow so).
        ``hold``: the job takes no other order until :meth:`finish_grow`."""
        hosts = self._take(job, count)
        job.reserved = job.reserved + hosts
        job.busy = job.busy or hold
        job.last_resize = now
        counted = min(job.requested, count)
        job.take_requested(counted)  # touches
        return hosts, counted

    def finish_grow(self, job: Tracked, hosts: list[Node], ok: bool,
                    now: float | None = None) -> list[Node]:
        """The grow is over: on success the reserved ``hosts`` still held become the
        job's (returned), else they are freed. ``now``: the resize counts from then."""
        kept = [h for h in hosts if h in job.reserved and self.owner.get(h) == job.id]
        job.reserved = [h for h in job.reserved if h not in hosts]
        job.busy = False
        if ok and job.state == "running":
            job.nodes = job.nodes + kept
            job.grows += 1
        else:
            self._give(kept)
            kept = []
        if now is not None and job.state == "running":
            job.last_resize = now
        job.cached = None
        return kept

    def begin_shrink(self, job: Tracked, count: int, now: float, hold: bool = True) -> None:
        job.shrinking += count
        job.busy = job.busy or hold
        job.last_resize = now
        job.cached = None

    def finish_shrink(self, job: Tracked, count: int, released: list[Node] | None,
                      now: float | None = None) -> list[Node]:
        """The shrink by ``count`` is over; ``released`` (None: it failed) go back
        to the pool, those the job does not hold excepted. Returns those freed."""
        job.shrinking = max(0, job.shrinking - count)
        job.busy = False
        if released is None:
            self.set_priority(None)  # the nodes it was waiting for do not come
            freed: list[Node] = []
        else:
            freed = [h for h in released if h in job.nodes]
            job.nodes = [h for h in job.nodes if h not in freed]
            self._give([h for h in freed if self.owner.get(h) == job.id])
            job.shrinks += 1
        if now is not None and job.state == "running":
            job.last_resize = now
        job.cached = None
        return freed

    def release(self, job: Tracked, host: Node) -> str:
        """The job stopped its place on ``host`` itself: "shrink" (a node it held),
        "release" (one reserved for a grow in flight) or "ignored" (not its)."""
        if self.owner.get(host) != job.id:
            return "ignored"
        kind = "shrink" if host in job.nodes else "release"
        job.nodes = [h for h in job.nodes if h != host]
        job.reserved = [h for h in job.reserved if h != host]
        self._give([host])
        job.cached = None
        return kind

    # -- nodes that are down ------------------------------------------------------------
    def place_lost(self, job: Tracked, host: Node, reporter: Any = None,
                   until: float | None = None) -> bool:
        """The job lost its place on ``host`` without an order (it died or fell
        silent): the node leaves the job, held or reserved for a grow in flight, and
        goes down, not back to the pool, since it may be broken (a draining one
        leaves the pool): until ``until`` if ``reporter`` (the job's owner) is the
        first to say so, else until ``node_up`` (:meth:`report_lost`). False, and
        nothing changes, if the job does not hold it."""
        if self.owner.get(host) != job.id:
            return False
        job.nodes = [h for h in job.nodes if h != host]
        job.reserved = [h for h in job.reserved if h != host]
        if host in self.draining:  # it was leaving anyway: gone, not down
            self._remove([host])
        else:
            self.owner[host] = None
            self.down.add(host)
            self.report_lost(host, reporter, until)
        job.lost += 1
        job.cached = None
        return True

    # -- evolving asks -----------------------------------------------------------------
    def ask_refusal(self, job: Tracked) -> str | None:
        """Why ``job`` may not ask for nodes now, or None."""
        if not job.malleable:
            return (f"job {job.id} is {job.cls}; only evolving and malleable jobs may ask "
                    "for places")
        if job.state != "running":
            return f"job {job.id} is {job.state}, not running"
        if job.disabled:
            return f"job {job.id} sent {protocol.NOT_MALLEABLE}; it takes no more orders"
        if not job.ready:
            return f"job {job.id} has not sent {protocol.READY}; it takes no orders yet"
        return None

    def request(self, job: Tracked, n: int, now: float) -> str | None:
        """Record a request for ``n`` more nodes (granted by later passes), or say
        why not (the maximum; :meth:`ask_refusal` is the caller's)."""
        if job.size + job.requested + n > job.max_nodes:  # a shrink in flight counts as done
            more = f", has asked for {job.requested} more already," if job.requested else ""
            return (f"job {job.id} asks for {n} more node(s) but holds {job.size}{more} "
                    f"and may have at most {job.max_nodes}")
        job.requested += n
        if job.requested_since is None:
            job.requested_since = now
        job.cached = None
        return None

    def answer_check(self, job: Tracked, low: int, high: int, preferred: int, factor: int,
                     now: float) -> tuple[Decision | None, list[Node], int]:
        """DMR's check_status for ``job`` with its own range (within its limits):
        the policy's answer, already set in motion (a grow's nodes reserved, a
        shrink counted, the queue's first job given priority), with the grow's
        nodes and the requests it counts towards. ValueError: the range misses
        the job's limits."""
        lo, hi = max(low, job.min_nodes), min(high, job.max_nodes)
        if lo > hi:
            raise ValueError(f"[{low}, {high}] does not meet the job's limits "
                             f"[{job.min_nodes}, {job.max_nodes}]")
        queue, running = self.views()
        preferred = min(max(preferred, lo), hi) if preferred else 0
        view = dataclasses.replace(job.view(), min_nodes=lo, max_nodes=hi, preferred=preferred)
        d = self.policy.answer(now, view, queue, running, len(self._free), self.usable, factor)
        job.last_resize = now
        job.cached = None
        if isinstance(d, Grow | Shrink) and d.nodes > 0 and (
                reason := self._range_refusal(job, d, lo, hi)) is not None:
            self.log.warning("ignored %s (check of job %d) at t=%.1f: %s", d, job.id, now, reason)
            return None, [], 0
        if isinstance(d, Grow) and 0 < d.nodes <= len(self._free):
            hosts, counted = self.begin_grow(job, d.nodes, now)
            return d, hosts, counted
        if isinstance(d, Shrink) and 0 < d.nodes < job.size:
            self.begin_shrink(job, d.nodes, now)
            first = min((j for j in self.queue.values() if j.min_nodes <= self.usable),
                        key=lambda j: (j.submit, j.id), default=None)
            if first is not None:  # DMR: the job the shrink makes room for comes first
                self.set_priority(first.id)
            return d, [], 0
        return None, [], 0

    def set_priority(self, job_id: int | None) -> None:
        if self.priority is not None and self.priority in self.jobs:
            self.jobs[self.priority].priority = False
            self.jobs[self.priority].cached = None
        self.priority = self._order.flagged_id = job_id
        if job_id is not None:
            self.jobs[job_id].priority = True
            self.jobs[job_id].cached = None

    def excess_requests(self) -> list[tuple[Tracked, int, str]]:
        """Outstanding requests a job can no longer get (it holds so many nodes
        now, a shrink failed say, that they would pass its maximum): taken off
        its requests, the job marked busy for the refusal; (job, count, why)."""
        out = []
        for job in self.running.values():
            if not job.requested or job.busy:
                continue
            excess = min(job.requested, job.size + job.requested - job.max_nodes)
            if excess > 0:
                job.busy = True
                job.take_requested(excess)  # touches
                out.append((job, excess, f"job {job.id} holds {job.size} node(s) and may have "
                                         f"at most {job.max_nodes}"))
        return out
