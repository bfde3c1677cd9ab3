"""The live scheduler: a pool of nodes, a queue of jobs, a policy, real processes.

:class:`Scheduler` composes plain parts, each with one job, around ``core``
(:class:`.core.SchedulerCore`: the engine, its lock, the event log, the
threads, the clock): job processes (``processes``), orders to malleable jobs
(``orders``), evolving asks (``asks``) and the doors (``server``); it keeps the
clients' operations (submit, cancel, requeue, status, add-nodes, node-up), the
scheduling pass, the restart and the shutdown. The parts talk through the
engine and the log; a part that sets off another's work holds a reference to
that one only. One TCP port serves client requests and the jobs' messages;
orders go the other way, one connection and one thread each. Evolving
programs' asks are answered only under policies with ``grants_requests``
(``evolving``, ``dmr``). See docs/protocol.md.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import launcher as launchers
from apgas import auth
from apgas.lowlevel import Config
from apgas.serving import make_trusted_dir

from .._model import Grow, Start
from ..jobs import JobSpec
from ..policies.planning import Policy
from . import access, containment
from .asks import READY_WAIT, Asks
from .core import QUARANTINE, SchedulerCore, log
from .dashboard import Dashboard
from .orders import ORDER_TIMEOUT, Orders
from .processes import KILL_GRACE, NEVER_BEGAN, ORDER_PORT_BASE, ORDER_PORT_COUNT, Processes, ending
from .records import Job
from .resume import end_all_left, resumed_line, settle_pool
from .server import MAX_LINE, Requests, Server
from .state import claim_output_dir

__all__ = ["Scheduler", "Job", "ORDER_PORT_BASE", "ORDER_PORT_COUNT", "ORDER_TIMEOUT",
           "KILL_GRACE", "READY_WAIT", "MAX_LINE"]


class Scheduler:
    """Runs jobs on ``nodes`` under ``policy``; ``serve_forever`` until ``shutdown``."""

    def __init__(self, nodes: list[str], policy: Policy, *, host: str = "127.0.0.1",
                 port: int = 0, events: str | Path | None = None, interval: float = 5.0,
                 launcher: str = "local", register_timeout: float = 60.0,
                 output_dir: str | Path | None = None,
                 node_addresses: dict[str, str] | None = None,
                 order_port_base: int = ORDER_PORT_BASE,
                 key_file: str | Path | None = None, socket_path: str | Path | None = None,
                 socket_mode: int = 0o600, allow_plain_jobs: bool = False,
                 state_dir: str | Path | None = None,
                 dashboard: tuple[str, int] | None = None,
                 quarantine: float = QUARANTINE) -> None:
        """``node_addresses``: where to reach a node that is not this machine, when
        its name does not resolve to it (default: the name, resolved here);
        ``order_port_base``: see ``ORDER_PORT_BASE``; ``key_file``: the
        operator's key, which TCP requests must be signed with (made if missing;
        default ``access.default_key_file()``); ``output_dir``: where
        ``job-N.out``/``.err`` go (made 0711: each user opens their own files by
        name; default: with a ``state_dir``, beside it
        (:func:`.access.output_dir_beside`), else ``access.default_output_dir()``),
        refused (:class:`.state.OutputDirInUse`) if it serves another state
        (:func:`.state.claim_output_dir`), so that two states never share one
        ``job-N.out``; the key file and every
        directory must be the scheduler's user's and nobody else's to write
        (:class:`apgas.serving.UntrustedPath` otherwise); ``socket_path``, ``socket_mode``:
        the Unix socket for clients on this machine (default
        ``access.default_socket_path(port)``, operator only); ``allow_plain_jobs``:
        accept jobs that speak the unsigned ElasticJobScheduler protocol;
        ``state_dir``: where the durable state lives (default: beside the output
        directory, named like it plus ``.state``); a scheduler started on the state of an
        earlier one resumes it on the ``nodes`` given now (see :meth:`_resume`);
        ``dashboard``: serve the
        live page (:mod:`.dashboard`) at this address (off by default);
        ``quarantine``: seconds a node is out of service after one job lost its
        place there (0: until ``node-up``; see :meth:`.asks.Asks.place_lost`)."""
        if not 0 <= quarantine <= 365 * 86400:
            raise ValueError(f"the quarantine is 0 to {365 * 86400} s, got {quarantine!r}")
        if len(set(nodes)) != len(nodes) or not nodes:
            raise ValueError(f"the node names must be distinct and at least one, got {nodes}")
        _check_nodes(nodes)
        if not 0 < order_port_base <= 65535 - ORDER_PORT_COUNT:
            raise ValueError(f"the order port base must be in 1..{65535 - ORDER_PORT_COUNT}, "
                             f"got {order_port_base}")
        self.node_addresses = dict(node_addresses or {})
        self.order_port_base = order_port_base
        self.interval = interval
        self.register_timeout = register_timeout
        # APGAS_SSH and APGAS_SRUN give the commands (with options) the launcher runs
        self.launcher = launchers.get_launcher(launcher, Config(
            ssh=os.environ.get("APGAS_SSH") or "ssh", srun=os.environ.get("APGAS_SRUN") or "srun"))
        # the key, the output and the state only where nobody else can change them
        # (a planted key, a link to root's files, a queued job "of root's")
        self._key = auth.load_or_create_secret(key_file or access.default_key_file())
        if output_dir is None:
            output_dir = access.output_dir_beside(state_dir) if state_dir \
                else access.default_output_dir()
        self.output_dir = make_trusted_dir(output_dir, "the output directory", 0o711)
        self.allow_plain_jobs = allow_plain_jobs
        if allow_plain_jobs:
            log.warning("plain jobs allowed: their messages and orders are unsigned, so anyone who "
                        "can reach this port or their order ports can speak for them")
        with contextlib.ExitStack() as undo:  # a refused state, output directory or socket holds nothing
            self._output_fd = os.open(self.output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            undo.callback(os.close, self._output_fd)
            tcp = socket.create_server((host, port))
            undo.callback(tcp.close)
            out = self.output_dir
            state_dir = Path(state_dir) if state_dir else out.with_name(out.name + ".state")
            self.core = core = SchedulerCore(nodes, policy, events, state_dir)
            undo.callback(core.close)
            claim_output_dir(self._output_fd, self.output_dir, core.store.directory)
            self.address: tuple[str, int] = (host, tcp.getsockname()[1])
            self.socket_path = Path(socket_path or access.default_socket_path(self.address[1]))
            unix = access.listen_unix(self.socket_path, socket_mode)
            undo.pop_all()
        self.policy, self.engine = policy, core.engine
        core.quarantine = quarantine
        self.now = core.now  # the scheduler's clock, from its first start
        # where each job's first process records how its program ended: root's alone, as
        # the state is (a job's end read from a file others could write would be theirs to say)
        outcomes: Path | None = make_trusted_dir(core.store.directory / "outcomes",
                                                 "the jobs' outcomes", 0o700)
        earlier = core.store.nodes()  # an earlier run's pool, before this run records its own
        self._ids = itertools.count(core.store.last_id() + 1)  # ids are never reused
        self._requests: dict[tuple[int, str], int] = {}  # (owner, the client's key) -> job id
        self.processes = Processes(
            core, self.launcher, local=launcher == "local", address=self.address,
            # what jobs on other machines are told to send to: a wildcard is no address
            advertised=socket.gethostname() if host in ("", "0.0.0.0", "::") else host,
            output_dir=self.output_dir, output_fd=self._output_fd, outcomes=outcomes,
            node_addresses=self.node_addresses, order_port_base=order_port_base)
        self.orders = Orders(core)
        self.asks = Asks(core, self.orders)
        self.server = Server(core, tcp, unix, self.socket_path, key=self._key,
                             allow_plain_jobs=allow_plain_jobs, asks=self.asks,
                             requests=Requests(self.submit, self.status, self.cancel,
                                               self.add_nodes, self.nodes_up, self.shutdown,
                                               self.requeue))
        self.dashboard: Dashboard | None = None
        if dashboard is not None:
            self.dashboard = Dashboard(dashboard, access.dashboard_token(self._key), core.now,
                                       core.store.events(), f"apgas scheduler · {policy.name}")
            core.watchers.append(self.dashboard.add)
        self.resumed: str | None = None  # what was taken up from an earlier run, for the operator
        self.unended: list[int] = []  # jobs of that run whose processes would not end at the start
        self._adopted = self._resume(earlier, nodes)

    @property
    def _jobs(self) -> dict[int, Job]:
        """Every job, by id (for tests and benchmarks, as before the parts)."""
        return self.core.jobs

    @property
    def _threads(self) -> list[threading.Thread]:
        """The threads started so far, to join (tests, benchmarks)."""
        return self.core.threads

    # -- life cycle ----------------------------------------------------------------
    def serve_forever(self) -> None:
        """Accept requests and messages and schedule, until ``shutdown``."""
        core = self.core
        log.info("scheduler on %s:%d with %d node(s), policy %s", *self.address,
                 self.engine.total, self.policy.name)
        self.server.serve()
        if self.dashboard is not None:
            core.spawn(self.dashboard.serve_forever, "scheduler-dashboard")
        for job in self._adopted:
            core.spawn(self.processes.watch, f"scheduler-watch-{job.id}", job)
        self._adopted = []
        while not core.stopped.is_set():
            core.wake.wait(self.interval)
            core.wake.clear()
            if not core.stopped.is_set():
                self.schedule()
        self._finish()

    def start(self) -> Scheduler:
        """Serve from a thread of its own (tests, benchmarks)."""
        self.core.spawn(self.serve_forever, "scheduler-main")
        return self

    def shutdown(self) -> None:
        self.core.stopped.set()
        self.core.wake.set()

    def _finish(self) -> None:
        core, processes = self.core, self.processes
        with core.lock:
            for job in list(core.jobs.values()):
                if job.state == "queued":
                    processes.end(job, "cancelled", "the scheduler shut down")
                elif job.state == "running":
                    job.kill_reason = "the scheduler shut down"
                    processes.kill(job)
        deadline = time.monotonic() + KILL_GRACE + 2
        for job in list(core.jobs.values()):
            if job.proc is not None:
                try:
                    job.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    processes.end_all(job, 0.0)  # whatever is left, at once
        if self.dashboard is not None:
            self.dashboard.close()
        self.server.close()
        for t in core.threads:
            if t is not threading.current_thread():
                t.join(2.0)
        core.close()
        os.close(self._output_fd)

    def _resume(self, earlier: list[str], asked: list[str]) -> list[Job]:
        """Take up the jobs of an earlier run of this state (after a crash, a
        ``kill -9``, a reboot). Queued jobs stay queued, in order. A running job
        whose first process is provably still the same one is adopted again, on
        its nodes, with its key and order address. A running job whose program
        ended meanwhile, as its first process recorded (``containment.outcome``),
        ends as that record says (done, or failed with its exit code or
        signal), once whatever it left is killed; one whose program never began
        (the earlier run died before its go: ``containment.never_began``) is
        queued again, uncounted. Any other is killed (whatever
        may be left of it) and recorded as failed, before its nodes are free. Ended
        jobs stay in the status. ``earlier`` is the pool the state held, ``asked``
        the nodes given now: the pool becomes ``asked``, the other nodes leave it
        or, held by an adopted job, drain (:func:`.resume.settle_pool`), and the
        pool is recorded. ``self.resumed`` says what was taken up (logged).
        Returns the adopted jobs, to watch."""
        adopted: list[Job] = []
        meanwhile = unstarted = 0  # jobs whose end while we were down was recorded; never began
        stored = self.core.store.jobs()
        taken = collections.Counter(s.state if s.state == "queued" else
                                    "running" if s.state == "running" else "ended" for s in stored)
        # Whether each running job's first process still runs, asked once: a job that
        # ends between two askings would be neither adopted nor ended here (its cgroup,
        # and whatever it left, would stay). A job seen running is adopted, and its
        # watch ends what is left once it has ended, however soon that is.
        leads = {s.id: containment.leader_alive(s.identity) for s in stored
                 if s.state == "running" and s.identity}
        left = end_all_left([s for s in stored if s.id in leads and not leads[s.id]])
        with self.core.lock:
            for s in stored:
                job = Job(s.id, s.spec, s.submit, s.owner)
                job.secret, job.reason, job.listen, job.reports = s.secret, s.reason, s.listen, s.reports
                job.ready, job.disabled, job.grows, job.shrinks = s.ready, s.disabled, s.grows, s.shrinks
                job.identity, job.request = s.identity, s.request
                job.requeues, job.requeue_reason = s.requeues, s.requeue_reason
                if s.request is not None:
                    self._requests[s.owner, s.request] = s.id
                if s.state == "queued":
                    self.engine.submit(job)
                elif s.state == "running" and s.identity is not None and leads.get(s.id):
                    self.engine.submit(job)
                    self.engine.resume(job, s.nodes, s.start if s.start is not None else self.now())
                    job.proc = containment.adopt(s.identity)
                    adopted.append(job)
                    self.core.event("adopt", job=job.id, nodes=list(s.nodes))
                    log.info("job %d (%s) still runs on %s: adopted", job.id, s.spec.name,
                             ",".join(s.nodes))
                elif s.state == "running" and s.identity and s.id in left:
                    self._still_ending(job, s, left[s.id])
                    adopted.append(job)  # its watch goes on ending it; its nodes stay taken
                elif s.state == "running" and s.identity and containment.never_began(s.identity):
                    self.engine.submit(job)
                    self.processes.requeue(job, NEVER_BEGAN, counted=False)
                    containment.forget(s.identity)
                    unstarted += 1
                elif s.state == "running" and s.identity and \
                        (code := containment.outcome(s.identity)) is not None:
                    self.engine.submit(job)
                    job.start = s.start  # it ran; its nodes were never another's
                    state, reason = ending(code, f"{self.output_dir}/job-{job.id}.err")
                    self.processes.end(job, state, (reason + "; " if reason else "")
                                       + "it ended while the scheduler was down",
                                       self.processes.requeue_reason(job, code))
                    containment.forget(s.identity)
                    meanwhile += 1
                elif s.state == "running":
                    self.engine.submit(job)
                    self.processes.end(job, "failed", "the scheduler restarted and the job's "
                                       "first process had ended meanwhile (exit status unknown) "
                                       "or was not provably the same; what was left of it was "
                                       "killed", self.processes.requeue_reason(job, None, gone=True))
                else:
                    job.state, job.start, job.end, job.nodes = s.state, s.start, s.end, []
                    self.engine.jobs[job.id] = job
        self._drop_stale_outcomes(adopted)
        with self.core.lock:
            gone, draining = settle_pool(self.engine, asked)
            self.core.event("pool", nodes=list(self.core.owner),
                            **({"left": gone} if gone else {}),
                            **({"draining": list(draining)} if draining else {}))
        for node, job_id in draining.items():
            log.info("node %s drains: job %d runs on it, and it was not asked now", node, job_id)
        if stored or earlier:
            running = taken.pop("running", 0)
            taken["adopted"], taken["ended meanwhile"] = len(adopted), meanwhile
            taken["queued again (never began)"] = unstarted
            taken["failed at this start"] = running - len(adopted) - meanwhile - unstarted
            taken["adopted"] -= len(self.unended)
            taken["still ending (see the errors above)"] = len(self.unended)
            self.resumed = resumed_line(self.core.store.directory, taken, earlier, asked, gone,
                                        draining)
            log.info("%s", self.resumed)
        return adopted

    def _still_ending(self, job: Job, s: Any, why: Exception) -> None:
        """Resume a job of the earlier run whose leftovers would not end (a process
        stuck in the kernel): said in the log, its nodes stay taken, and its
        watch goes on ending it."""
        log.error("job %d (%s): could not end what the earlier run left: %s; its nodes %s stay "
                  "taken, and it is ended as soon as it can be", job.id, s.spec.name, why,
                  ",".join(s.nodes))
        self.engine.submit(job)
        self.engine.resume(job, s.nodes, s.start if s.start is not None else self.now())
        job.proc = containment.adopt(s.identity)
        code = containment.outcome(s.identity)
        if code is None:
            job.kill_reason = ("killed: the scheduler restarted and the job's first process had "
                               "ended meanwhile (exit status unknown) or was not provably the same")
        self.core.event("adopt", job=job.id, nodes=list(s.nodes))
        self.unended.append(job.id)

    def _drop_stale_outcomes(self, adopted: list[Job]) -> None:
        """Remove the outcome files of jobs whose end is in the state already (an
        earlier run stopped between recording an end and removing its file)."""
        if self.processes.outcomes is None:
            return
        recorded = (getattr(j, "identity", None) or {} for j in adopted)
        keep = {Path(i["outcome"]).name for i in recorded if i.get("outcome")}
        for entry in os.scandir(self.processes.outcomes):
            if entry.name not in keep and entry.name.removesuffix(".tmp") not in keep:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass

    # -- requests -------------------------------------------------------------------
    def submit(self, spec: JobSpec, where: str = "job", key: str = "",
               client: access.Client | None = None, request: str | None = None) -> int:
        """Queue ``spec`` for ``client`` (default: the operator), to run as that
        client's user; ``where`` (the job file) and ``key`` (the size key it
        gave: ``nodes`` or ``min_nodes``) name it in a refusal. ``request``: the
        client's key for this submit (:func:`.client.new_request_key`); a submit
        with a key this client used before is that job again (its id), not a
        second one, also after a restart, so that a client whose reply was lost
        may send it again."""
        owner = access.run_as(client or access.operator())
        if request is not None and not _REQUEST_KEY.fullmatch(request):
            raise ValueError(f"a submit's request key is 8 to 64 letters, digits, '-' or '_', "
                             f"got {request[:80]!r}")
        with self.core.lock:
            known = self._requests.get((owner, request)) if request is not None else None
            if known is not None:
                log.info("job %d: its submit came again (request %s); not a second job", known,
                         request)
                return known
            if spec.protocol == "plain" and not self.allow_plain_jobs:
                raise ValueError(f"{where}: key 'protocol': job {spec.name!r} speaks the plain "
                                 "protocol, which this scheduler does not accept (serve "
                                 "--allow-plain-jobs)")
            if spec.min_nodes > self.engine.total:
                key = key or ("nodes" if spec.min_nodes == spec.max_nodes else "min_nodes")
                raise ValueError(f"{where}: key {key!r}: job {spec.name!r} needs at least "
                                 f"{spec.min_nodes} node(s) and the pool has {self.engine.total}")
            job = Job(next(self._ids), spec, self.now(), owner)
            job.request = request
            if request is not None:
                self._requests[owner, request] = job.id
            self.engine.submit(job)
            self.core.event("submit", job=job.id, name=spec.name, **{"class": spec.cls},
                            min_nodes=spec.min_nodes, max_nodes=spec.max_nodes)
        log.info("job %d (%s) submitted", job.id, spec.name)
        self.core.wake.set()
        return job.id

    def cancel(self, job_id: int, client: access.Client | None = None) -> str:
        with self.core.lock:
            job = self.core.job(job_id)
            access.authorize(client or access.operator(), "cancel", job.owner)
            if job.state == "queued":
                self.processes.end(job, "cancelled", "cancelled by the user")
            elif job.state == "running":
                job.kill_reason = "cancelled by the user"
                self.processes.kill(job)
            else:
                raise ValueError(f"job {job_id} has already ended ({job.state})")
            return job.state

    def requeue(self, job_id: int, client: access.Client | None = None) -> str:
        """Put a job back in the queue (``requeue ID``; :meth:`.processes.Processes.ask_requeue`)."""
        client = client or access.operator()
        with self.core.lock:
            job = self.core.job(job_id)
            access.authorize(client, "requeue", job.owner)
            return self.processes.ask_requeue(job, client.user)

    def add_nodes(self, names: list[str]) -> list[str]:
        _check_nodes(names)  # ValueError naming the first that is no host name
        with self.core.lock:
            if not names:
                raise ValueError(f"new node names must be distinct and not in the pool, got {names}")
            kept = [n for n in names if n in self.engine.draining]
            self.engine.add_nodes(names)  # a draining node named stays, and drains no more
            self.core.event("pool", nodes=list(self.core.owner))
            if kept:
                log.info("node(s) %s added again: no longer draining", ",".join(kept))
        self.core.wake.set()
        return list(self.core.owner)

    def nodes_up(self, names: list[str]) -> list[str]:
        """Put nodes that are down back into service (the operator's ``node-up``): they
        are free again. ValueError, changing nothing, if one of them is not down.
        Returns the nodes still down."""
        with self.core.lock:
            down = self.engine.down
            wrong = [n for n in names if n not in down]
            if wrong or not names:
                raise ValueError(f"only nodes that are down can be brought up; not down: "
                                 f"{wrong or names}; down: {sorted(down) or 'none'}")
            for node in dict.fromkeys(names):
                self.engine.node_up(node)
            self.core.event("node_up", nodes=list(dict.fromkeys(names)))
            log.info("node(s) %s back in service", ",".join(names))
            still = sorted(down)
        self.core.wake.set()
        return still

    def status(self) -> dict[str, Any]:
        with self.core.lock:
            draining = self.engine.draining
            return {"time": self.now(), "policy": self.policy.name,
                    "address": f"{self.address[0]}:{self.address[1]}",
                    "jobs": [j.to_dict() for j in self.core.jobs.values()],
                    "nodes": [{"name": n, "job": j, **({"draining": True} if n in draining else {})}
                              for n, j in self.core.owner.items()]}

    # -- scheduling -----------------------------------------------------------------
    def schedule(self) -> None:
        """Enforce walltimes and registration, then apply the policy's decisions
        that the engine admits."""
        with self.core.lock:
            now = self.now()
            self.asks.end_quarantines()
            for job, _ in self.engine.overdue(now, self.register_timeout):
                self.processes.kill(job)  # type: ignore[arg-type]
            self.orders.refuse_excess()
            for d in self.engine.decide(now):
                if not self.engine.admit(d, now):
                    continue
                self.core.event("decision", job=d.job, decision=type(d).__name__.lower(),
                                nodes=d.nodes, policy=self.policy.name)
                job = self.core.jobs[d.job]
                if isinstance(d, Start):
                    self.processes.start(job, self.engine.free_nodes(d.nodes))
                elif isinstance(d, Grow):
                    self.orders.grow_by(job, d.nodes)
                else:
                    self.engine.begin_shrink(job, d.nodes, now)
                    self.orders.send_shrink(job, d.nodes)


_REQUEST_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")

def _check_nodes(names: list[str]) -> None:
    """ValueError naming the first of ``names`` that is no host name
    (``apgas.protocol.check_host``): a node name reaches ssh and srun."""
    from apgas import protocol

    for name in names:
        try:
            protocol.check_host(name)
        except ValueError as e:
            raise ValueError(f"node {e}") from None
