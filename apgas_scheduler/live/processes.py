"""Job processes: start a job on its nodes (with the environment that tells a
malleable job where to take orders and where to report), watch it end, kill
it (TERM, then KILL after a grace period).

Every job is started through :mod:`.containment`: its own session, process
group and (where possible) cgroup, a tag in its environment, and under Slurm
steps named after the tag. Killing a job (cancel, walltime, registration,
shutdown, a failed start) ends every process of it, and a job's nodes are
free only once every process of it is gone: when its first process exits,
whatever it left behind is ended too (TERM, KILL after ``KILL_GRACE``) before
its end is recorded. ``job.identity`` (a JSON-able dict) names the job's
processes for a restarted daemon (``containment.alive``/``adopt``/``kill``).
A job's first process records how its program ended in ``outcomes`` (the
state directory's), so that an end the daemon did not see (it was down) is
known too (``containment.outcome``); the file goes once the end is in the
state.

A job with ``requeue = N`` goes back to the queue instead of ending, at
most N times (:meth:`Processes.requeue_reason` says when; docs/scheduler.md,
"Requeue"): it keeps its id and spec, takes a fresh submit time (behind the
jobs queued meanwhile), and its next start appends to its ``job-N.out``/``.err``.
A job lost :data:`QUICK_ENDS` runs in a row, each within :data:`QUICK_RUN` s of
its start, is not requeued again by itself but ends failed (held back), and a
job that ended more than :data:`REQUEUE_WINDOW` s ago is not requeued on request.

A job's start is in the state before its program begins: its first process
waits, ready, for a go that is sent once the ``start`` event is recorded
(``containment.start``'s ``ready``). A daemon killed in between leaves a
start whose program never began (its first process records that and
exits, ``containment.never_began``): the restarted daemon queues the job
again, uncounted (:data:`NEVER_BEGAN`), instead of running it twice or
calling it failed."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import launcher as launchers
from apgas import auth
from apgas.serving import open_new_file

from . import containment
from .core import SchedulerCore, log
from .records import Job

__all__ = ["Processes", "ORDER_PORT_BASE", "ORDER_PORT_COUNT", "KILL_GRACE", "ending",
           "LOST_SIGNALS", "NEVER_BEGAN", "REQUEUE_WINDOW", "QUICK_RUN", "QUICK_ENDS"]

KILL_GRACE = 3.0
REQUEUE_WINDOW = 600.0
"""Seconds after its end within which an ended job may be requeued on request; later it
is refused (submit it again): a requeue is for a run that just went wrong, not a
place in the queue kept for later."""
QUICK_RUN = 60.0
QUICK_ENDS = 3
"""A job whose runs were lost ``QUICK_ENDS`` times in a row, each within ``QUICK_RUN``
s of its start, is not requeued by itself again (it ends failed, held back, and its
owner may requeue it): a job that keeps dying (or kills itself) does not hold nodes
over and over while other jobs wait."""
LOST_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                          signal.SIGPWR})
"""Signals that, when they end a job's program (its place 0) and the scheduler did not
send them, say the job was lost rather than that it failed: SIGKILL (the OOM killer, a
``kill -9``), SIGTERM and SIGHUP (a machine shutting down, a node's daemon, a hang-up),
SIGINT, SIGPWR (power failing). Not the program's own faults (SIGSEGV, SIGBUS, SIGILL,
SIGFPE, SIGABRT, SIGTRAP, SIGSYS), nor SIGQUIT (a core asked for), SIGXCPU and SIGXFSZ
(its limits), SIGPIPE, SIGUSR1/2 or SIGALRM (its own business)."""
NEVER_BEGAN = ("the scheduler stopped between recording the job's start and letting its "
               "program begin; the program never ran")
"""Why a job whose start never began is queued again (not counted as a requeue)."""
ORDER_PORT_BASE = 27100
ORDER_PORT_COUNT = 1000
"""The fixed order ports, for plain-protocol jobs only (``protocol = "plain"``,
which cannot report a port): such a job listens for orders at
``ORDER_PORT_BASE + id`` (wrapping after ``ORDER_PORT_COUNT`` ports,
skipping those our running jobs use there, and on this machine those
something listens on now). The port is known, and shown in ``status``,
before the job binds it, so another user may bind it first: part of what
the compatibility mode exposes. A signed job binds a port the kernel gives
it and reports it in its signed ready line instead (``Processes.order_env``)."""


class Processes:
    """Starting, watching and killing job processes, and recording their ends.
    The callers of ``start``, ``end`` and ``kill`` hold ``core.lock``."""

    def __init__(self, core: SchedulerCore, launcher: launchers.Launcher, *, local: bool,
                 address: tuple[str, int], advertised: str, output_dir: Path, output_fd: int,
                 outcomes: Path | None, node_addresses: dict[str, str],
                 order_port_base: int) -> None:
        """``address``: where the scheduler listens, ``advertised`` the host that
        jobs on other machines are told; ``output_fd``: ``output_dir``, open (files
        are made through it); ``outcomes``: where jobs' first processes record
        how their programs ended."""
        self.core = core
        self.launcher = launcher
        self.local = local
        self.address = address
        self.advertised = advertised
        self.output_dir = output_dir
        self.output_fd = output_fd
        self.outcomes = outcomes
        self.node_addresses = node_addresses
        self.order_port_base = order_port_base
        self._warned_loopback = False

    def start(self, job: Job, nodes: list[str]) -> None:
        """Start ``job`` on ``nodes`` (the first free ones); a job that cannot
        start ends as failed and leaves the nodes free."""
        tag = containment.new_tag(job.id)
        env = {"APGAS_HOSTS": ",".join(nodes), "APGAS_JOB_ID": str(job.id),
               containment.TAG_ENV: tag}
        slurm_job = None
        if self.launcher.name == "srun":  # its steps (and those it starts) are named after the tag
            env[containment.STEP_ENV] = containment.step_name(tag)
            slurm_job = os.environ.get("SLURM_JOB_ID")
        if self.local:
            env["APGAS_LOCAL_HOSTS"] = ",".join(self.core.owner)
        elif self.launcher.name == "ssh":  # its grows reach the other nodes the same way
            env["APGAS_LAUNCHER"] = "ssh"
            env["APGAS_SSH"] = getattr(self.launcher.config, "ssh", "ssh")
        if job.malleable:
            try:
                env.update(self.order_env(job, nodes[0]))
            except OSError as e:
                self.end(job, "failed", str(e))
                return
        env.update(dict(job.spec.env))
        private = {} if job.plain else {"APGAS_JOB_SECRET": job.secret}  # never in an argv
        if job.plain:
            env["APGAS_PLAIN_PROTOCOL"] = "1"
        user, login = _user_of(job.owner)
        cwd = job.spec.cwd or login.get("HOME") or os.getcwd()
        command = list(job.spec.command)
        if command[0] in ("python", "python3"):  # the scheduler's own Python, with apgas
            command[0] = sys.executable

        def started(handle: containment.Handle) -> None:
            """Durably before the program begins (it waits for this to return)."""
            job.proc, job.identity = handle.proc, handle.identity
            taken = self.core.engine.start(job, len(nodes), self.core.now())
            assert taken == nodes, (taken, nodes)
            self.core.event("start", job=job.id, nodes=list(nodes))

        try:
            # the key, the tag and the job's env: in no command line (ssh: on stdin)
            hidden = {**env, **private}
            stdin = self.launcher.secret_input(nodes[0], hidden)
            argv = self.launcher.command(nodes[0], command, env, cwd=cwd,
                                         secret_names=list(hidden) if stdin is not None else ())
            # ssh and srun enter the job's directory on its node (the launcher wrapped the
            # command); a job that runs here enters it here, as its user
            here = argv == command
            base = os.environ if user is None else {"PATH": os.environ.get("PATH", os.defpath)}
            with self._output_files(job, user) as (out, err):
                handle = containment.start(
                    job.id, argv, env={**base, **env, **private, **login},
                    cwd=cwd if here else None, user=user,
                    stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                    stdout=out, stderr=err, tag=tag, slurm_job=slurm_job,
                    outcome_dir=self.outcomes, ready=started)
            if stdin is not None:
                assert handle.proc.stdin is not None
                handle.proc.stdin.write(stdin)
                handle.proc.stdin.close()
        except OSError as e:
            if job.proc is not None:  # its start is recorded, but its exec or key failed
                self.end_all(job, 0.0)
                job.proc.wait()
            self.end(job, "failed", f"could not start {job.spec.command[0]!r:.200} on {nodes[0]}: {e}")
            return
        log.info("job %d (%s) started on %s", job.id, job.spec.name, ",".join(nodes))
        self.core.spawn(self.watch, f"scheduler-watch-{job.id}", job)

    @contextlib.contextmanager
    def _output_files(self, job: Job, user: containment.RunAs | None) -> Iterator[tuple[int, int]]:
        """``job-N.out`` and ``job-N.err``, new in the output directory (never
        through a link someone planted) and the job's user's, for the start; a
        requeued job's own files again, appended to (:func:`_reopen`)."""
        fds: list[int] = []
        uid = user.uid if user is not None else os.geteuid()
        try:
            for suffix in ("out", "err"):
                name = f"job-{job.id}.{suffix}"
                fd = _reopen(self.output_fd, name, uid) if job.requeues else None
                fds.append(open_new_file(self.output_fd, name) if fd is None else fd)
                if user is not None and fd is None:
                    os.fchown(fds[-1], user.uid, user.gid)
            if job.requeues:
                os.write(fds[1], f"apgas-scheduler: job {job.id} starts again after requeue "
                                 f"{job.requeues} of {job.spec.requeue}: {job.requeue_reason}\n"
                                 .encode(errors="backslashreplace"))
            yield fds[0], fds[1]
        finally:
            for fd in fds:
                os.close(fd)

    def order_env(self, job: Job, first: str) -> dict[str, str]:
        """Where a malleable job listens for orders and sends its messages.

        The address: on this machine (the local launcher, or a first node that
        ``launcher.is_local_host`` takes for this machine) the scheduler's own;
        on another machine the first node's (``node_addresses``, else its name
        resolved here), and the job is told to send to the scheduler's
        advertised address. ``job.reports`` is that address as the job's
        communicator resolves it.

        The port: a signed job is told port 0, binds a port the kernel gives
        it, and names it in its signed ready line (``protocol.ready(port)``);
        ``job.listen`` stays None until the server has verified that line, so
        no order goes out and ``status`` shows no port before (a port chosen
        here could be bound first by any user who reads ``status``). A plain
        job cannot report a port: it gets one of the fixed range
        (``ORDER_PORT_BASE``), free here if the node is this machine, and
        ``job.listen`` is set now. The range lies below the kernel's ephemeral
        ports, so no outgoing connection takes such a port before the job binds
        it; another user still can. OSError if the node has no address or no
        port of the range is left.
        ``APGAS_MAX_PLACES`` is left to the job (default 256): a job may run
        several places per node, so ``max_nodes`` is no bound on its places; the
        engine bounds the scheduler's own grows by ``max_nodes``, and nobody
        else can sign an order."""
        host, port = self.address
        here = self.local or launchers.is_local_host(first)
        if here:
            address, scheduler = host, f"{host}:{port}"
        else:
            given = self.node_addresses.get(first)
            try:
                address = given or socket.gethostbyname(first)
            except OSError as e:
                raise OSError(f"cannot resolve node {first!r}, where the job would listen for "
                              f"orders: {e}; give its address (serve --node-address "
                              f"{first}=ADDRESS)") from None
            scheduler = f"{self.advertised}:{port}"
            if self.advertised.startswith("127.") or self.advertised == "localhost":
                if not self._warned_loopback:
                    log.warning("job %d runs on %s but the scheduler listens on %s: unless %s is "
                                "this machine, its messages cannot reach us (serve --host)",
                                job.id, first, self.advertised, first)
                self._warned_loopback = True
        # plain: a fixed port, known now; signed: the one the job reports (server.py)
        job.listen = (address, self._order_port(job, address, bindable=here)) if job.plain else None
        try:
            job.reports = socket.gethostbyname(address)  # as the job's communicator does
        except OSError:
            job.reports = address
        return {"APGAS_COMMUNICATOR": "socket", "APGAS_SCHEDULER": scheduler,
                "APGAS_MALLEABLE_LISTEN": f"{address}:{job.listen[1] if job.listen else 0}"}

    def _order_port(self, job: Job, address: str, bindable: bool = False) -> int:
        """``order_port_base + id``, or the next port of the range that none of our
        running jobs listens on at ``address`` (and, if ``bindable``, that nothing
        on this machine listens on now)."""
        taken = {j.listen[1] for j in self.core.jobs.values()
                 if j.state == "running" and j.listen and j.listen[0] == address}
        for k in range(ORDER_PORT_COUNT):
            port = self.order_port_base + 1 + (job.id - 1 + k) % ORDER_PORT_COUNT
            if port not in taken and (not bindable or _bindable(address, port)):
                return port
        raise OSError(f"all {ORDER_PORT_COUNT} order ports from {self.order_port_base + 1} on "
                      f"{address} are taken by running jobs")

    def watch(self, job: Job) -> None:
        """Wait for the job's first process, then end whatever it left behind (or
        what a kill is ending), and only then record its end (its nodes are free)."""
        assert job.proc is not None
        code = job.proc.wait()
        identity = getattr(job, "identity", None) or {}
        recorded = containment.outcome(identity)  # the program's own status, as its parent saw it
        if recorded is not None:
            code = recorded
        while not self.end_all(job, KILL_GRACE) and not self.core.stopped.is_set():
            time.sleep(1.0)  # a process that will not die (D state): its nodes stay taken
        with self.core.lock:
            why = self.requeue_reason(job, code)
            if containment.never_began(identity) and (job.requeue_asked or not job.kill_reason):
                self.requeue(job, NEVER_BEGAN, counted=False)  # adopted before it said so
            elif why:
                self.requeue(job, why)
            elif job.kill_reason:
                state = "failed" if job.kill_reason.startswith("killed") else "cancelled"
                self.end(job, state, job.kill_reason)
            elif code is None:  # adopted after a restart, nothing recorded: nobody can tell
                self.end(job, "done", "exit status unknown (adopted after a scheduler restart)")
            else:
                self.end(job, *ending(code, f"{self.output_dir}/job-{job.id}.err"))
            containment.forget(identity)  # its end is in the state now (seen with its file gone)
        self.core.wake.set()

    def requeue_reason(self, job: Job, code: int | None, gone: bool = False) -> str:
        """Why ``job``, whose run ended with ``code`` (Popen's; None: unknown), goes
        back to the queue, or "" if it does not: it was asked to (``requeue_asked``);
        else never if the scheduler stopped it (walltime, cancel, shutdown) or it has
        used its ``requeue`` times; else if its program (its place 0) was killed by one
        of ``LOST_SIGNALS``, or its first process was ``gone`` without a status when
        the scheduler restarted (the machine rebooted), or it failed after a node of
        it was marked down (a place lost without an order)."""
        if job.requeue_asked:
            return job.requeue_asked
        if job.kill_reason or job.requeues >= job.spec.requeue:
            return ""
        why = _lost(job, code, gone)
        if why and self._keeps_dying(job):
            job.held_back = (f"not requeued again: its last {job.quick_ends} runs each ended within "
                        f"{QUICK_RUN:g} s of their start (the last: {why}); its owner may "
                        "requeue it")
            return ""
        return why

    def _keeps_dying(self, job: Job) -> bool:
        """Count a run lost soon after its start; whether ``QUICK_ENDS`` came in a row."""
        quick = job.start is not None and self.core.now() - job.start < QUICK_RUN
        job.quick_ends = job.quick_ends + 1 if quick else 0
        return job.quick_ends >= QUICK_ENDS

    def requeue(self, job: Job, reason: str, counted: bool = True) -> None:
        """Put ``job`` (running, with every process ended, or ended) back in the queue:
        its nodes free and its requests dropped, a fresh key for its next run, which
        appends to its output. Not ``counted``: its program never began, so its
        ``requeue`` is not used (nor its last reason changed). The caller holds
        ``core.lock``."""
        self.core.drop_requests(job, "the job was requeued")
        job.requeue_asked = job.held_back = ""
        if counted:
            job.requeue_reason = reason
            job.reason = f"requeued ({job.requeues + 1} of {job.spec.requeue}): {reason}"
        else:
            job.reason = f"queued again: {reason}"
        job.listen, job.reports, job.identity = None, "", None
        job.secret = auth.new_secret()  # whatever the last run left knows the old one
        self.core.engine.requeue(job, self.core.now(), counted)
        self.core.event("requeue", job=job.id, reason=reason, count=job.requeues)
        log.info("job %d (%s) %s", job.id, job.spec.name, job.reason)
        self.core.wake.set()

    def ask_requeue(self, job: Job, who: str) -> str:
        """``requeue ID`` by ``who``: a running job is killed (its processes end) and then
        queued again; an ended job that did not end ``done`` is queued again at once.
        Either counts towards its ``requeue``. ValueError, changing nothing, for a
        queued job, a done one, one being stopped, or one with no requeue left. The
        caller holds ``core.lock`` and has checked who may."""
        if job.state == "queued":
            raise ValueError(f"job {job.id} is not running (queued)")
        if job.state == "done":
            raise ValueError(f"job {job.id} has ended done; submit it again to run it again")
        if job.requeues >= job.spec.requeue:
            raise ValueError(f"job {job.id} may go back to the queue {job.spec.requeue} time(s) "
                             f"(requeue = {job.spec.requeue} in its job file) and has "
                             f"{'used them' if job.requeues else 'none'}")
        ago = self.core.now() - job.end if job.end is not None else 0.0
        if job.state != "running" and ago > REQUEUE_WINDOW:
            raise ValueError(f"job {job.id} ended ({job.state}) {ago:.0f} s ago; a job is requeued "
                             f"within {REQUEUE_WINDOW:g} s of its end: submit it again")
        reason = f"requeued by {who}"
        if job.state != "running":
            job.quick_ends = 0  # its owner asked: counted afresh
            self.requeue(job, reason)
            return job.state
        if job.requeue_asked or job.kill_reason:
            raise ValueError(f"job {job.id} is being stopped already: "
                             f"{job.requeue_asked or job.kill_reason}")
        job.requeue_asked = job.kill_reason = reason  # no order or resize meanwhile
        self.core.event("requeue_asked", job=job.id, by=who)
        self.kill(job)
        return "requeueing"

    def end_all(self, job: Job, grace: float) -> bool:
        """End every process of ``job`` (TERM, KILL after ``grace``); False if some
        outlived the bound (logged)."""
        identity = getattr(job, "identity", None)
        if not identity:
            return True
        try:
            containment.kill(identity, grace)
        except containment.StillRunning as e:
            log.error("job %d: %s", job.id, e)
            return False
        except OSError as e:
            log.error("job %d: could not end its processes: %s", job.id, e)
            return False
        return True

    def end(self, job: Job, state: str, reason: str, requeue: str = "") -> None:
        """Record ``job``'s end: its nodes are free, its requests dropped; or, given
        why it goes back to the queue (``requeue``: :meth:`requeue_reason`), requeue it."""
        if requeue:
            self.requeue(job, requeue)
            return
        job.reason = f"{reason}; {job.held_back}" if reason and job.held_back else reason or job.held_back
        self.core.drop_requests(job, f"the job ended ({state})")
        self.core.engine.end(job, state, self.core.now())
        self.core.event("end", job=job.id, state=state, reason=reason)
        log.info("job %d (%s) %s%s", job.id, job.spec.name, state, f": {reason}" if reason else "")
        self.core.wake.set()

    def kill(self, job: Job) -> None:
        """Start ending every process of ``job`` (TERM, then KILL after
        ``KILL_GRACE``); its watch records the end once none is left."""
        if job.proc is None or job.proc.poll() is not None:
            return  # not started, or its watch is already ending what is left
        if not getattr(job, "identity", None):
            try:
                os.killpg(job.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return
        self.core.spawn(self.end_all, f"scheduler-kill-{job.id}", job, KILL_GRACE)


def ending(code: int, err: str) -> tuple[str, str]:
    """The state and reason of a job whose program ended with ``code`` (Popen's:
    ``-N`` for signal N); ``err`` names its error output."""
    if code == 0:
        return "done", ""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return "failed", f"killed by signal {-code}{name}; see {err}"
    return "failed", f"exit code {code}; see {err}"


def _lost(job: Job, code: int | None, gone: bool) -> str:
    """Why ``job``'s run, ended with ``code``, was lost rather than failed, or ""."""
    if code is not None and code < 0 and -code in LOST_SIGNALS:
        return f"its program (place 0) was killed by signal {-code} ({signal.Signals(-code).name})"
    if gone:
        return "its first process was gone, with no exit status, when the scheduler restarted"
    if code and job.lost:
        return f"it failed ({_code(code)}) after losing {job.lost} place(s) on nodes now down"
    return ""


def _code(code: int) -> str:
    return f"exit code {code}" if code > 0 else f"signal {-code}"


def _reopen(directory: int, name: str, uid: int) -> int | None:
    """A requeued job's output file ``name`` open to append, if it still is the
    job's user's regular file (never through a link); None: make a new one."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=directory)
    except OSError:
        return None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
        return fd
    os.close(fd)
    return None


def _bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    try:
        with socket.create_server((host, port)):
            return True
    except OSError:
        return False


def _user_of(uid: int) -> tuple[containment.RunAs | None, dict[str, str]]:
    """How to run a process as ``uid`` when that is not us (we are root then,
    ``access.run_as`` saw to it): its uid, group and groups, and its login
    variables; (None, {}) for ourselves."""
    if uid == os.geteuid():
        return None, {}
    entry = pwd.getpwuid(uid)
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return (containment.RunAs(uid, entry.pw_gid, groups),
            {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name})
