"""The live scheduler: a pool of nodes, a queue of jobs, a policy, real processes.

One TCP port serves two kinds of lines: a JSON object is a request of the
command-line client (``submit``, ``status``, ``cancel``, ``add-nodes``,
``shutdown``), answered by one JSON line; anything else is a job's message in
the APGAS socket protocol (``apgas.protocol``: the ready message and the timing
reports). Orders to malleable jobs go the other way, one connection each
(grow, shrink, refuse), from a thread per order so that a slow job holds up
nobody.

Evolving programs ask on the same port (requests and checks) and get a
one-line answer on the same connection; only policies with
``grants_requests`` (``evolving``, ``dmr``) grant them. See docs/protocol.md.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from apgas import protocol
from apgas.order import send_order
import launcher as launchers

from ._model import Grow, JobView, Shrink, Start
from .jobs import JobFileError, JobSpec, parse_job
from .policies import GATE, Policy

__all__ = ["Scheduler", "Job"]

log = logging.getLogger("scheduler")

MAX_LINE = 1 << 20
ORDER_TIMEOUT = 120.0
KILL_GRACE = 3.0
READY_WAIT = 2.0
"""How long an evolving job's ask waits for its ready message: the two come on
separate connections, served by separate threads, so the ask may overtake it."""
ORDER_PORT_BASE = 27100
ORDER_PORT_COUNT = 1000
"""A malleable job whose first node is another machine listens for orders on
that node at ``ORDER_PORT_BASE + id`` (wrapping after ``ORDER_PORT_COUNT``
ports, skipping those our running jobs use there): a port on another
machine cannot be probed from here, and the protocol lets no job report
the port it bound."""


@dataclasses.dataclass
class Job:
    """A job and everything the scheduler knows of it."""

    id: int
    spec: JobSpec
    submit: float
    state: str = "queued"  # queued | running | done | failed | cancelled
    reason: str = ""
    nodes: list[str] = dataclasses.field(default_factory=list)
    start: float | None = None
    end: float | None = None
    proc: subprocess.Popen | None = None
    listen: tuple[str, int] | None = None  # where a malleable job takes orders
    reports: str = ""  # the address a malleable job puts into its messages
    ready: bool = False
    busy: bool = False  # an order is in flight
    shrinking: int = 0  # nodes a shrink in flight will give back
    requested: int = 0  # nodes an evolving job asked for and has not yet been given
    requested_since: float | None = None  # when the oldest of those requests came
    disabled: bool = False  # sent protocol.NOT_MALLEABLE
    last_resize: float | None = None
    kill_reason: str = ""
    grows: int = 0
    shrinks: int = 0

    @property
    def malleable(self) -> bool:
        return self.spec.cls in ("malleable", "evolving")

    def view(self, held: int = 0, priority: bool = False) -> JobView:
        """``held``: the nodes it owns, grow reservations included; a shrink in
        flight already counts as done, so that no pass shrinks twice for one need."""
        return JobView(self.id, self.spec.cls, self.spec.min_nodes, self.spec.max_nodes,  # type: ignore[arg-type]
                       self.spec.walltime, self.submit, held - self.shrinking, self.start,
                       self.last_resize, self.malleable and self.ready and not self.busy,
                       requested=self.requested, requested_since=self.requested_since,
                       priority=priority, asks=self.spec.cls == "evolving")

    def take_requested(self, k: int) -> None:
        """``k`` of the outstanding requested nodes are given or refused."""
        self.requested -= k
        if self.requested <= 0:
            self.requested, self.requested_since = 0, None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.spec.name, "class": self.spec.cls, "state": self.state,
                "nodes": list(self.nodes), "submit": self.submit, "start": self.start,
                "end": self.end, "reason": self.reason, "min_nodes": self.spec.min_nodes,
                "max_nodes": self.spec.max_nodes, "ready": self.ready, "grows": self.grows,
                "shrinks": self.shrinks, "requested": self.requested,
                "listen": f"{self.listen[0]}:{self.listen[1]}" if self.listen else None}


class Scheduler:
    """Runs jobs on ``nodes`` under ``policy``; ``serve_forever`` until ``shutdown``."""

    def __init__(self, nodes: list[str], policy: Policy, *, host: str = "127.0.0.1",
                 port: int = 0, events: str | Path | None = None, interval: float = 5.0,
                 launcher: str = "local", register_timeout: float = 60.0,
                 output_dir: str | Path = "scheduler-jobs",
                 node_addresses: dict[str, str] | None = None,
                 order_port_base: int = ORDER_PORT_BASE) -> None:
        """``node_addresses``: where to reach a node that is not this machine, when
        its name does not resolve to it (default: the name, resolved here);
        ``order_port_base``: see ``ORDER_PORT_BASE``."""
        if len(set(nodes)) != len(nodes) or not nodes:
            raise ValueError(f"the node names must be distinct and at least one, got {nodes}")
        if not 0 < order_port_base <= 65535 - ORDER_PORT_COUNT:
            raise ValueError(f"the order port base must be in 1..{65535 - ORDER_PORT_COUNT}, "
                             f"got {order_port_base}")
        self.node_addresses = dict(node_addresses or {})
        self.order_port_base = order_port_base
        self.policy = policy
        self.interval = interval
        self.register_timeout = register_timeout
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.launcher = launchers.get_launcher(launcher)
        self._local = launcher == "local"
        self._lock = threading.RLock()
        self._ready_cv = threading.Condition(self._lock)  # a job's ready message came
        self._priority: int | None = None  # a queued job a check's shrink was made for
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._owner: dict[str, int | None] = {n: None for n in nodes}
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._t0 = time.monotonic()
        self._events = open(events, "a", buffering=1) if events else None
        self._server = socket.create_server((host, port))
        self.address: tuple[str, int] = (host, self._server.getsockname()[1])
        # what jobs on other machines are told to send to: a wildcard is no address
        self._advertised = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        self._warned_loopback = False
        self._threads: list[threading.Thread] = []
        self._event("pool", nodes=list(nodes))

    # -- life cycle ----------------------------------------------------------------
    def serve_forever(self) -> None:
        """Accept requests and messages and schedule, until ``shutdown``."""
        log.info("scheduler on %s:%d with %d node(s), policy %s", *self.address,
                 len(self._owner), self.policy.name)
        self._spawn(self._accept, "scheduler-accept")
        while not self._stopped.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._stopped.is_set():
                self.schedule()
        self._finish()

    def start(self) -> "Scheduler":
        """Serve from a thread of its own (tests, benchmarks)."""
        self._spawn(self.serve_forever, "scheduler-main")
        return self

    def shutdown(self) -> None:
        self._stopped.set()
        self._wake.set()

    def _finish(self) -> None:
        with self._lock:
            for job in self._jobs.values():
                if job.state == "queued":
                    self._end(job, "cancelled", "the scheduler shut down")
                elif job.state == "running":
                    job.kill_reason = "the scheduler shut down"
                    self._kill(job)
        deadline = time.monotonic() + KILL_GRACE + 2
        for job in list(self._jobs.values()):
            if job.proc is not None:
                try:
                    job.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(job.proc.pid, signal.SIGKILL)
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._server.close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(2.0)
        if self._events is not None:
            self._events.close()
            self._events = None

    def _spawn(self, target: Callable, name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _event(self, kind: str, **fields: Any) -> None:
        record = {"t": round(self.now(), 6), "event": kind, **fields}
        log.debug("event %s", record)
        if self._events is not None:
            self._events.write(json.dumps(record) + "\n")

    # -- requests -------------------------------------------------------------------
    def submit(self, spec: JobSpec, where: str = "job", key: str = "") -> int:
        """Queue ``spec``; ``where`` (the job file) and ``key`` (the size key it
        gave: ``nodes`` or ``min_nodes``) name it in a refusal."""
        if spec.min_nodes > len(self._owner):
            key = key or ("nodes" if spec.min_nodes == spec.max_nodes else "min_nodes")
            raise ValueError(f"{where}: key {key!r}: job {spec.name!r} needs at least "
                             f"{spec.min_nodes} node(s) and the pool has {len(self._owner)}")
        with self._lock:
            job = Job(next(self._ids), spec, self.now())
            self._jobs[job.id] = job
            self._event("submit", job=job.id, name=spec.name, **{"class": spec.cls},
                        min_nodes=spec.min_nodes, max_nodes=spec.max_nodes)
        log.info("job %d (%s) submitted", job.id, spec.name)
        self._wake.set()
        return job.id

    def cancel(self, job_id: int) -> str:
        with self._lock:
            job = self._job(job_id)
            if job.state == "queued":
                self._end(job, "cancelled", "cancelled by the user")
            elif job.state == "running":
                job.kill_reason = "cancelled by the user"
                self._kill(job)
            else:
                raise ValueError(f"job {job_id} has already ended ({job.state})")
            return job.state

    def add_nodes(self, names: list[str]) -> list[str]:
        with self._lock:
            taken = [n for n in names if n in self._owner]
            if taken or len(set(names)) != len(names) or not names:
                raise ValueError(f"new node names must be distinct and not in the pool, got {names}")
            for n in names:
                self._owner[n] = None
            self._event("pool", nodes=list(self._owner))
        self._wake.set()
        return list(self._owner)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"time": self.now(), "policy": self.policy.name,
                    "address": f"{self.address[0]}:{self.address[1]}",
                    "jobs": [j.to_dict() for j in self._jobs.values()],
                    "nodes": [{"name": n, "job": j} for n, j in self._owner.items()]}

    def _job(self, job_id: Any) -> Job:
        job = self._jobs.get(job_id) if isinstance(job_id, int) else None
        if job is None:
            raise ValueError(f"no job with id {job_id!r}")
        return job

    # -- scheduling -----------------------------------------------------------------
    def schedule(self) -> None:
        """Enforce walltimes and registration, then apply the policy's decisions."""
        with self._lock:
            now = self.now()
            for job in self._jobs.values():
                if job.state != "running" or job.kill_reason:
                    continue
                if now - job.start > job.spec.walltime:  # type: ignore[operator]
                    job.kill_reason = f"killed: ran past its walltime of {job.spec.walltime:g} s"
                    self._kill(job)
                elif job.malleable and not job.ready and now - job.start > self.register_timeout:  # type: ignore[operator]
                    job.kill_reason = (f"killed: never sent {protocol.READY} within "
                                       f"{self.register_timeout:g} s")
                    self._kill(job)
            if self._priority is not None and self._jobs[self._priority].state != "queued":
                self._priority = None  # started (or gone): requests need not wait for it
            self._refuse_excess()
            queue, running, free = self._snapshot()
            decisions = self.policy.decide(now, queue, running, len(free), len(self._owner))
            for d in decisions:
                job = self._jobs[d.job]
                if isinstance(d, Start) and job.state == "queued":
                    free = self._start(job, free[:d.nodes], free[d.nodes:]) if d.nodes <= len(free) else free
                elif (isinstance(d, Grow) and job.state == "running" and not job.busy
                      and d.nodes <= len(free)):
                    hosts, free = free[:d.nodes], free[d.nodes:]
                    self._send_grow(job, hosts)
                elif isinstance(d, Shrink) and job.state == "running" and not job.busy:
                    self._send_shrink(job, d.nodes)

    def _snapshot(self) -> tuple[list[JobView], list[JobView], list[str]]:
        """What the policy sees: the queue, the running jobs and the idle nodes."""
        queue = [j.view(priority=j.id == self._priority) for j in self._jobs.values()
                 if j.state == "queued"]
        held = collections.Counter(self._owner.values())
        running = [j.view(held[j.id]) for j in self._jobs.values()
                   if j.state == "running" and not j.kill_reason]
        return queue, running, [n for n, j in self._owner.items() if j is None]

    def _held(self, job: Job) -> int:
        """The nodes a job owns (grow reservations included), less a shrink in flight."""
        return sum(owner == job.id for owner in self._owner.values()) - job.shrinking

    def _send_grow(self, job: Job, hosts: list[str]) -> None:
        """Reserve ``hosts`` for ``job`` and send it the grow order from a thread.
        The job counts every grow towards its outstanding requests, so we do too."""
        for n in hosts:
            self._owner[n] = job.id  # reserved: nobody else gets them meanwhile
        self._event("reserve", job=job.id, nodes=list(hosts))  # held from now, for the metrics
        job.busy = True
        counted = min(job.requested, len(hosts))
        job.take_requested(counted)
        self._spawn(self._grow, f"scheduler-grow-{job.id}", job, hosts, counted)

    def _send_shrink(self, job: Job, n: int) -> None:
        job.busy, job.shrinking = True, n
        self._spawn(self._shrink, f"scheduler-shrink-{job.id}", job, n)

    def _refuse_excess(self) -> None:
        """Refuse the outstanding requests a job can no longer get: it holds
        so many nodes now (a shrink failed, say) that they would pass its maximum."""
        for job in self._jobs.values():
            if job.state != "running" or not job.requested or job.busy:
                continue
            held = self._held(job)
            excess = min(job.requested, held + job.requested - job.spec.max_nodes)
            if excess > 0:
                job.take_requested(excess)
                job.busy = True
                reason = (f"job {job.id} holds {held} node(s) and may have at most "
                          f"{job.spec.max_nodes}")
                self._spawn(self._refuse, f"scheduler-refuse-{job.id}", job, excess, reason)

    def _drop_requests(self, job: Job, reason: str) -> None:
        """Forget a job's outstanding requests: it takes no more orders."""
        if job.requested:
            self._event("request_dropped", job=job.id, nodes=job.requested, reason=reason)
            log.info("job %d: %d requested node(s) dropped: %s", job.id, job.requested, reason)
            job.take_requested(job.requested)

    def _start(self, job: Job, nodes: list[str], rest: list[str]) -> list[str]:
        env = {"APGAS_HOSTS": ",".join(nodes), "APGAS_JOB_ID": str(job.id)}
        if self._local:
            env["APGAS_LOCAL_HOSTS"] = ",".join(self._owner)
        if job.malleable:
            try:
                env.update(self._order_env(job, nodes[0]))
            except OSError as e:
                self._end(job, "failed", str(e))
                return nodes + rest
        env.update(dict(job.spec.env))
        cwd = job.spec.cwd or os.getcwd()
        out = self.output_dir / f"job-{job.id}.out"
        err = self.output_dir / f"job-{job.id}.err"
        command = list(job.spec.command)
        if command[0] in ("python", "python3"):  # the scheduler's own Python, with apgas
            command[0] = sys.executable
        try:
            argv = self.launcher.command(nodes[0], command, env)
            with open(out, "wb") as o, open(err, "wb") as e:
                job.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=o,
                                            stderr=e, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        except OSError as e:
            self._end(job, "failed", f"could not start {job.spec.command[0]!r} on {nodes[0]}: {e}")
            return nodes + rest
        job.state, job.start, job.nodes = "running", self.now(), list(nodes)
        for n in nodes:
            self._owner[n] = job.id
        self._event("start", job=job.id, nodes=list(nodes))
        log.info("job %d (%s) started on %s", job.id, job.spec.name, ",".join(nodes))
        self._spawn(self._watch, f"scheduler-watch-{job.id}", job)
        return rest

    def _order_env(self, job: Job, first: str) -> dict[str, str]:
        """Where a malleable job listens for orders and sends its messages.

        On this machine (the local launcher, or a first node that
        ``launcher.is_local_host`` takes for this machine): the scheduler's own
        address and a port of the order port range (``ORDER_PORT_BASE``) that
        is free here. On another machine: the first node's address
        (``node_addresses``, else its name resolved here) and a port of that
        range; the job is told to send to the scheduler's advertised address.
        The range lies below the kernel's ephemeral ports, so no outgoing
        connection takes the port before the job binds it (a port found by
        binding port 0 could be). OSError if the node has no address or no port
        of the range is left."""
        host, port = self.address
        if self._local or launchers.is_local_host(first):
            listen, scheduler = (host, self._order_port(job, host, bindable=True)), f"{host}:{port}"
        else:
            given = self.node_addresses.get(first)
            try:
                address = given or socket.gethostbyname(first)
            except OSError as e:
                raise OSError(f"cannot resolve node {first!r}, where the job would listen for "
                              f"orders: {e}; give its address (serve --node-address "
                              f"{first}=ADDRESS)") from None
            listen, scheduler = (address, self._order_port(job, address)), f"{self._advertised}:{port}"
            if self._advertised.startswith("127.") or self._advertised == "localhost":
                if not self._warned_loopback:
                    log.warning("job %d runs on %s but the scheduler listens on %s: unless %s is "
                                "this machine, its messages cannot reach us (serve --host)",
                                job.id, first, self._advertised, first)
                self._warned_loopback = True
        job.listen = listen
        try:
            job.reports = socket.gethostbyname(listen[0])  # as the job's communicator does
        except OSError:
            job.reports = listen[0]
        return {"APGAS_COMMUNICATOR": "socket", "APGAS_SCHEDULER": scheduler,
                "APGAS_MALLEABLE_LISTEN": f"{listen[0]}:{listen[1]}"}

    def _order_port(self, job: Job, address: str, bindable: bool = False) -> int:
        """``order_port_base + id``, or the next port of the range that none of our
        running jobs listens on at ``address`` (and, if ``bindable``, that nothing
        on this machine listens on now)."""
        taken = {j.listen[1] for j in self._jobs.values()
                 if j.state == "running" and j.listen and j.listen[0] == address}
        for k in range(ORDER_PORT_COUNT):
            port = self.order_port_base + 1 + (job.id - 1 + k) % ORDER_PORT_COUNT
            if port not in taken and (not bindable or _bindable(address, port)):
                return port
        raise OSError(f"all {ORDER_PORT_COUNT} order ports from {self.order_port_base + 1} on "
                      f"{address} are taken by running jobs")

    def _watch(self, job: Job) -> None:
        assert job.proc is not None
        code = job.proc.wait()
        with self._lock:
            if job.kill_reason:
                state = "failed" if job.kill_reason.startswith("killed") else "cancelled"
                self._end(job, state, job.kill_reason)
            elif code == 0:
                self._end(job, "done", "")
            else:
                self._end(job, "failed", f"exit code {code}; see {self.output_dir}/job-{job.id}.err")
        self._wake.set()

    def _end(self, job: Job, state: str, reason: str) -> None:
        job.state, job.reason, job.end = state, reason, self.now()
        self._drop_requests(job, f"the job ended ({state})")
        for n, owner in self._owner.items():
            if owner == job.id:
                self._owner[n] = None
        job.nodes = []
        self._event("end", job=job.id, state=state, reason=reason)
        log.info("job %d (%s) %s%s", job.id, job.spec.name, state, f": {reason}" if reason else "")
        self._wake.set()

    def _kill(self, job: Job) -> None:
        if job.proc is None or job.proc.poll() is not None:
            return
        try:
            os.killpg(job.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return

        def hard_kill(proc: subprocess.Popen = job.proc) -> None:
            try:
                proc.wait(KILL_GRACE)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._spawn(hard_kill, f"scheduler-kill-{job.id}")

    # -- orders to malleable jobs ---------------------------------------------------
    def _order(self, job: Job, line: str) -> list[str]:
        assert job.listen is not None
        return send_order(job.listen, line, ORDER_TIMEOUT)

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
            job.busy = False
            if ok and job.state == "running":
                kept = [h for h in hosts if self._owner.get(h) == job.id]  # minus early releases
                job.nodes += kept
                job.grows += 1
                job.last_resize = self.now()
                self._event("grow", job=job.id, nodes=kept, duration=time.monotonic() - started)
                log.info("job %d grew by %s", job.id, ",".join(hosts))
            else:
                for n in hosts:
                    if self._owner.get(n) == job.id and n not in job.nodes:
                        self._owner[n] = None
                if job.state == "running":
                    job.last_resize = self.now()  # do not retry at once
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
            job.busy, job.shrinking = False, 0
            if reply and reply[0].startswith("error"):
                self._priority = None  # the nodes it was waiting for do not come
                if job.state == "running":
                    job.last_resize = self.now()
                    self._event("shrink_failed", job=job.id, reason=reply[0])
                    log.warning("shrink of job %d failed: %s", job.id, reply[0])
            else:
                released = [h for h in reply if h in job.nodes]
                strangers = [h for h in reply if h not in job.nodes]
                if strangers:
                    log.warning("job %d released hosts it did not hold: %s", job.id, strangers)
                self._release(job, released)
                job.shrinks += 1
                job.last_resize = self.now()
                self._event("shrink", job=job.id, nodes=released, duration=time.monotonic() - started)
        self._wake.set()

    def _release(self, job: Job, hosts: list[str]) -> None:
        for h in hosts:
            job.nodes.remove(h)
            if self._owner.get(h) == job.id:
                self._owner[h] = None

    # -- the port: client requests and job messages ---------------------------------
    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._spawn(self._serve, "scheduler-conn", conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10.0)
            data = b""
            try:
                while b"\n" not in data and len(data) <= MAX_LINE:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                return
            line = data.split(b"\n", 1)[0].decode(errors="replace").strip()
            if line.startswith("{"):
                reply = self._request(line)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass
            elif line:
                answer = self._message(line)
                if answer is not None:
                    try:
                        conn.sendall(answer.encode() + b"\n")
                    except OSError:
                        pass  # Java's jobs close without reading the answer

    def _request(self, line: str) -> dict[str, Any]:
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
            if op == "submit":
                data, where = request.get("job"), str(request.get("file", "job"))
                key = "min_nodes" if isinstance(data, dict) and "min_nodes" in data else "nodes"
                return {"ok": True, "id": self.submit(parse_job(data, where), where, key)}
            if op == "status":
                return {"ok": True, **self.status()}
            if op == "cancel":
                return {"ok": True, "state": self.cancel(request.get("id"))}
            if op == "add-nodes":
                names = request.get("nodes")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError(f"add-nodes needs a list of names, got {names!r}")
                return {"ok": True, "nodes": self.add_nodes(names)}
            if op == "shutdown":
                self.shutdown()
                return {"ok": True}
            raise ValueError(f"unknown request {op!r}; expected submit, status, cancel, "
                             "add-nodes or shutdown")
        except (ValueError, JobFileError) as e:
            return {"ok": False, "error": str(e)}

    def _message(self, line: str) -> str | None:
        """``<message>:<ip>[:<job id>]`` from a job (see docs/protocol.md); the
        answer to an evolving job's request or check, None for the others."""
        parsed = protocol.parse_message(line)
        message, rest = parsed.text, parsed.sender
        job = self._find_job(rest)
        if job is None:
            log.warning("message %r from no job of ours ignored", line)
            return f"error no job of ours matches {rest}" if parsed.is_ask else None
        if parsed.is_ask:
            return self._evolving_ask(job, parsed)
        with self._lock:
            if parsed.kind == "ready":
                job.ready, job.disabled = True, False
                self._event("ready", job=job.id)
                self._ready_cv.notify_all()
            elif parsed.kind == "not_malleable":
                job.ready, job.disabled = False, True
                self._event("rigid", job=job.id)
                self._drop_requests(job, f"the job sent {protocol.NOT_MALLEABLE}")
                self._ready_cv.notify_all()
            elif parsed.kind == "release":
                self._evolving_release(job, ";".join(parsed.fields))
            else:
                log.debug("job %d: %s", job.id, message)
        self._wake.set()
        return None

    def _evolving_release(self, job: Job, host: str) -> None:
        """The job stopped its place on ``host`` itself: the node goes back to the pool."""
        # may arrive before the grow's reply is handled: held or reserved both count
        if self._owner.get(host) == job.id:
            if host in job.nodes:
                job.nodes.remove(host)
                self._event("shrink", job=job.id, nodes=[host], duration=0.0, requested=True)
            else:
                self._event("release", job=job.id, nodes=[host])  # before it was logged
            self._owner[host] = None
        else:
            self._event("release_ignored", job=job.id, host=host)
            log.warning("job %d released %r, which it does not hold; ignored", job.id, host)

    def _evolving_ask(self, job: Job, parsed: protocol.JobMessage) -> str:
        """The one-line answer to an evolving request or check."""
        kind, message = parsed.kind, parsed.text
        if not self.policy.grants_requests:
            answer = "error " + GATE.format(name=self.policy.name)
            with self._lock:
                self._event(kind, job=job.id, message=message, answer=answer)
            log.info("job %d: %s answered %r", job.id, message, answer)
            return answer
        with self._ready_cv:  # the job's ready message may still be on its way
            self._ready_cv.wait_for(lambda: job.ready or job.disabled or not job.malleable
                                    or job.state != "running", READY_WAIT)
            answer = (self._answer_request(job, parsed) if kind == "request"
                      else self._answer_check(job, parsed))
        log.info("job %d: %s answered %r", job.id, message, answer)
        self._wake.set()
        return answer

    def _refusal(self, job: Job) -> str | None:
        """Why ``job`` may not ask now, or None."""
        if not job.malleable:
            return f"job {job.id} is {job.spec.cls}; only evolving and malleable jobs may ask for places"
        if job.state != "running":
            return f"job {job.id} is {job.state}, not running"
        if job.disabled:
            return f"job {job.id} sent {protocol.NOT_MALLEABLE}; it takes no more orders"
        if not job.ready:
            return f"job {job.id} has not sent {protocol.READY}; it takes no orders yet"
        return None

    def _answer_request(self, job: Job, parsed: protocol.JobMessage) -> str:
        """Queue ``n`` more nodes for ``job`` (granted by later passes), or refuse."""
        message = parsed.text
        field = ";".join(parsed.fields)
        n = int(field) if re.fullmatch(r"[0-9]+", field) else 0
        problem = self._refusal(job)
        if n < 1:
            answer = f"error bad request {message!r}: the count must be a positive integer"
        elif problem:
            answer = f"error {problem}"
        elif (held := self._held(job)) + job.requested + n > job.spec.max_nodes:
            more = f", has asked for {job.requested} more already," if job.requested else ""
            answer = (f"error job {job.id} asks for {n} more node(s) but holds {held}{more} "
                      f"and may have at most {job.spec.max_nodes}")
        else:
            job.requested += n
            if job.requested_since is None:
                job.requested_since = self.now()
            answer = f"ok {n}"
        self._event("request", job=job.id, nodes=n, answer=answer)
        return answer

    def _answer_check(self, job: Job, parsed: protocol.JobMessage) -> str:
        """DMR's check_status for ``job``: decide, reserve or mark the shrink, then
        answer; the order follows from a thread."""
        fields: dict[str, Any] = {}
        try:
            low, high, preferred, factor = protocol.parse_check(parsed)
            fields = dict(min=low, max=high, preferred=preferred, factor=factor)
            problem = self._refusal(job)
            if problem:
                answer = f"error {problem}"
            elif job.busy or job.kill_reason:
                answer = "none"  # an order is in flight (or the job is being killed)
            else:
                answer = self._decide_check(job, low, high, preferred, factor)
        except ValueError as e:
            answer = f"error bad check {parsed.text!r}: {e}"
        self._event("check", job=job.id, **fields, answer=answer)
        return answer

    def _decide_check(self, job: Job, low: int, high: int, preferred: int, factor: int) -> str:
        """The policy's DMR answer for the job's own range within its limits; the
        resize is set in motion before the answer leaves, so no pass undoes it."""
        lo, hi = max(low, job.spec.min_nodes), min(high, job.spec.max_nodes)
        if lo > hi:
            raise ValueError(f"[{low}, {high}] does not meet the job's limits "
                             f"[{job.spec.min_nodes}, {job.spec.max_nodes}]")
        now = self.now()
        queue, running, free = self._snapshot()
        preferred = min(max(preferred, lo), hi) if preferred else 0
        view = dataclasses.replace(next(v for v in running if v.id == job.id), min_nodes=lo,
                                   max_nodes=hi, preferred=preferred)
        d = self.policy.answer(now, view, queue, running, len(free), len(self._owner), factor)
        job.last_resize = now
        if isinstance(d, Grow) and d.nodes <= len(free):
            self._send_grow(job, free[:d.nodes])
            return f"expand {view.nodes + d.nodes}"
        if isinstance(d, Shrink):
            self._send_shrink(job, d.nodes)
            waiting = sorted((j for j in queue if j.min_nodes <= len(self._owner)),
                             key=lambda j: (j.submit, j.id))
            if waiting:  # DMR: the job the shrink makes room for comes first
                self._priority = waiting[0].id
            return f"shrink {view.nodes - d.nodes}"
        return "none"

    def _find_job(self, rest: str) -> Job | None:
        ip, _, job_id = rest.rpartition(":")
        if job_id.isdigit() and int(job_id) in self._jobs:
            return self._jobs[int(job_id)]
        matches = [j for j in self._jobs.values()  # a foreign job without an id: by its address
                   if j.state == "running" and j.listen and (ip or job_id) in (j.reports, j.listen[0])]
        return matches[0] if len(matches) == 1 else None


def _bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    try:
        with socket.create_server((host, port)):
            return True
    except OSError:
        return False
