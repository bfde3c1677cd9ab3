"""Containment: keep a job's processes together, tell whether they are still
the same ones, end them all.

A job is started (:func:`start`) in a session and process group of its own
and, where the machine allows it, in a cgroup (v2) of its own. Its processes
carry a tag in their environment (``APGAS_SCHEDULER_JOB=<token>``), which
names its Slurm steps and its outcome file but never decides what is the
job's: any user can put any variable into the environment of their own
processes. The job's processes are:

* with a cgroup: every process in it. Nothing a job does without privileges
  takes a process out (``setsid``, double forks, ignoring SIGTERM: all stay);
  the first process enters it *before* it can fork: that process is
  :mod:`._job_exec`, which writes its own pid to ``cgroup.procs`` and forks
  the job's program, which becomes the job's user and only then applies the
  job's directory, environment and command (``exec``; never ``preexec_fn``:
  the daemon is threaded). The first process stays, as the program's parent
  (the *supervisor*), and records how it ended (below).
* without one (no writable ``cgroup2`` mount: not root and no delegation, a
  container; or ``APGAS_SCHEDULER_CGROUPS=0``): every descendant of the
  supervisor, which is the *child subreaper* of the job (a process whose
  parent ends, a double fork, is re-parented to it, not to init), plus every
  process of the job's user still in the job's process group or session. A
  scan reads only the ``/proc`` entries of those two users' processes
  (other users' cost one ``stat``), and never an environment. What escapes
  this fallback: a process that leaves the session while the supervisor is
  gone (killed by root or the OOM killer); a cgroup is the only complete
  answer.
* under Slurm (the job's command runs through ``srun`` in the allocation):
  also every step of the allocation named after the tag
  (``apgas-job-<tag>``, :func:`step_name`); ``srun`` names the job's own step
  so, and the srun launcher names the steps the job itself starts so too
  (it reads ``APGAS_STEP_NAME`` from the environment). :func:`kill` ends them
  with ``scancel`` and waits until ``squeue`` no longer lists them. Their
  processes on this machine are ``slurmstepd``'s, in Slurm's own cgroups.

Once the program has ended, its supervisor ends what it left (TERM, KILL
after the grace time: they are its children by then) and only then exits, so
nothing of the job outlives it unseen.

:func:`kill` sends TERM to every process of the job (again to those that
appear while it waits), KILL to what is left after the grace time (with a
cgroup: ``cgroup.kill``, which also catches a fork racing the signal), and
returns only when none is left; it raises :class:`StillRunning`, naming the
pids, after a bound. Signals go through pidfds, so a pid reused meanwhile is
never hit.

**When the daemon dies.** Nothing ties a job's lifetime to the daemon: the
job runs in its own session (no SIGHUP from a terminal), its own cgroup (not
the daemon's: a ``systemctl stop`` of a unit whose cgroup is the daemon's
does not reach it; put the scheduler unit under ``KillMode=process`` or
``Delegate=yes``), no ``PR_SET_PDEATHSIG``; its stdin is ``/dev/null`` (or a
pipe already closed after the ssh key went through). Its output goes to files.
So a job keeps running when the daemon is killed (``kill -9``, a crash), and a
restarted daemon re-adopts it from the persisted :attr:`Handle.identity`:
:func:`alive` tells whether its processes are provably the same ones (same
boot; the pid exists with the same start time, or the cgroup, the
supervisor's descendants or session, or the Slurm steps still have processes), :func:`adopt` watches it although it is no
child of ours, and :func:`kill` ends it.

**How a job ended, when the daemon did not see it.** The supervisor (the
job's first process, :attr:`Handle.identity` ``pid``) waits for the job's
program and, before it exits, writes its exit status to a file of the
outcome directory the daemon gave :func:`start` (``identity["outcome"]``:
root's, in its state directory; the program runs as the job's user, in
another process, and never holds the directory open). :func:`outcome` reads
it, so a restarted daemon records the true end of a job that ended while it
was down, and :class:`Adopted` reports it as its exit status; :func:`forget`
removes the file once the end is recorded. The supervisor passes on the
signals it is sent to the program; :func:`kill` sends TERM to the program
and the job's other processes but not to the supervisor, so each gets it
once, and the supervisor ends with the program (KILL, ``cgroup.kill``, end
it with everything else). Without such a record (the supervisor was killed,
or the job was started by an older scheduler, whose identity has no
``supervised``), an adopted job's exit status cannot be known (it is another
process's child): :class:`Adopted` reports ``None``.

Why one module: starting a job contained, telling its processes apart from
others and ending them are one mechanism seen from three sides (what
:func:`start` puts into a job is what :func:`members` looks for); split, each
part would have to know the others' conventions.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from apgas.protocol import ascii_int

__all__ = ["Handle", "RunAs", "JobProcess", "Adopted", "StillRunning", "start", "alive", "kill", "adopt", "members",
           "outcome", "never_began", "forget", "new_tag", "step_name", "cgroup_base", "TAG_ENV", "STEP_ENV",
           "CGROUPS_ENV"]

TAG_ENV = "APGAS_SCHEDULER_JOB"
"""The environment variable holding a job's tag, in each of its processes."""
STEP_ENV = "APGAS_STEP_NAME"
"""The name the srun launcher gives its steps (a job's own steps: :func:`step_name`)."""
CGROUPS_ENV = "APGAS_SCHEDULER_CGROUPS"
"""``0``: never use a cgroup (the fallback); anything else or unset: use one where possible."""
CGROUP_DIR = "apgas-scheduler"
"""Jobs' cgroups are ``<the daemon's cgroup>/apgas-scheduler/job-<tag>``."""
KILL_BOUND = 10.0
"""How long :func:`kill` goes on after the grace time before it gives up."""

_EXEC_SOURCE = Path(__file__).with_name("_job_exec.py").read_text()
"""The job's first process until it ``exec``\\ s the job (:mod:`._job_exec`): read
once, when the scheduler loads, so what runs is what was loaded."""
_EXEC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""All of that process's environment (and the tag): nothing of the job's."""
START_TIMEOUT = 30.0
"""s the job's program has to reach ``execve`` (an unreachable directory, say)."""
_STARTED = b"+"
"""What the first process reports once the job's program has exec'd (:mod:`._job_exec`)."""
_READY = b"."
"""What the first process reports once only the go is missing (:mod:`._job_exec`)."""
OUTCOME_SUFFIX = ".exit"
"""An outcome file is ``job-<tag>.exit`` in the outcome directory."""


class JobProcess(Protocol):
    """What the scheduler needs of a job's first process: our child
    (:class:`subprocess.Popen`) or, after a restart, an :class:`Adopted` one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...


class StillRunning(RuntimeError):
    """Processes of a job outlived :func:`kill`'s bound; ``pids`` names them."""

    def __init__(self, message: str, pids: list[int]) -> None:
        super().__init__(message)
        self.pids = pids


@dataclass
class Handle:
    """A started job: ``proc`` is its first process (our child, the supervisor:
    it exits as the job's program did), ``identity`` a JSON-able dict naming
    all of it, for :func:`alive`, :func:`kill`, :func:`adopt`,
    :func:`outcome`, also in another daemon process (keys: ``pid``,
    ``start_time``, ``boot_id``, ``cgroup`` (path or None), ``tag``, ``slurm``
    (``{"job": id, "step_name": name}`` or None), ``uid`` (the job's user) and
    ``supervisor_uid`` (the scheduler's), ``supervised`` (True: the
    first process is a supervisor, not the program), ``outcome`` (the file it
    records the program's end in, or None))."""

    proc: subprocess.Popen
    identity: dict[str, Any] = field(default_factory=dict)


# -- identity -------------------------------------------------------------------------------

def new_tag(job_id: int | str) -> str:
    """A tag for a job: its id and a random token (never reused)."""
    return f"{job_id}-{secrets.token_hex(8)}"


def step_name(tag: str) -> str:
    """The Slurm step name of the job tagged ``tag``."""
    return f"apgas-job-{tag}"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` from the state on (field 3 is index 0), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].decode().split()


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot, ``/proc/<pid>/stat`` field 22)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _running(fields: list[str] | None) -> bool:
    return fields is not None and fields[0] not in ("Z", "X")


# -- cgroups ----------------------------------------------------------------------------------

def _cgroup2_mounts() -> list[Path]:
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    found.append(Path(parts[1].replace("\\040", " ")))
    except OSError:
        pass
    return found


def _own_cgroup() -> str:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


def cgroup_base() -> Path | None:
    """Where jobs' cgroups go (``<mount><our cgroup>/apgas-scheduler``, made if
    missing), or None when no cgroup2 mount is there to write to, or
    ``APGAS_SCHEDULER_CGROUPS=0``."""
    if os.environ.get(CGROUPS_ENV, "").strip() in ("0", "no", "off", "false"):
        return None
    own = _own_cgroup().lstrip("/")
    for mount in _cgroup2_mounts():
        for parent in (mount / own, mount):  # ours if it is visible here, else the root
            if not (parent / "cgroup.procs").exists():
                continue
            base = parent / CGROUP_DIR
            try:
                base.mkdir(exist_ok=True)
            except OSError:
                continue
            if os.access(base, os.W_OK) and os.access(parent / "cgroup.procs", os.W_OK):
                return base
    return None


def _make_cgroup(tag: str, use: bool | None) -> Path | None:
    base = cgroup_base() if use is not False else None
    if base is None:
        if use:
            raise OSError(errno.ENOTSUP, "no writable cgroup2 mount for the job's cgroup")
        return None
    path = base / f"job-{tag}"
    try:
        path.mkdir()
    except OSError:
        if use:
            raise
        return None
    if not os.access(path / "cgroup.procs", os.W_OK):
        _remove_cgroup(path)
        if use:
            raise OSError(errno.EACCES, "cannot write to cgroup.procs", str(path))
        return None
    return path


def _cgroup_pids(path: str | Path) -> set[int]:
    try:
        return {int(p) for p in Path(path, "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def _remove_cgroup(path: str | Path) -> None:
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return
            time.sleep(0.02)


# -- starting ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunAs:
    """The user a job runs as, when that is not the scheduler's: uid, gid, groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def start(job_id: int | str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          cwd: str | None = None, user: RunAs | None = None, stdin: Any = subprocess.DEVNULL,
          stdout: Any = None, stderr: Any = None, tag: str | None = None,
          cgroup: bool | None = None, slurm_job: str | None = None,
          outcome_dir: str | os.PathLike[str] | None = None, grace: float = 3.0,
          ready: Callable[[Handle], None] | None = None) -> Handle:
    """Start ``argv`` as job ``job_id``, contained: its own session and process
    group, its own cgroup when possible (``cgroup``: None where possible, False
    never, True or OSError), the tag ``tag`` (default: :func:`new_tag`) in its
    environment ``env`` (default: ours), in ``cwd``, as ``user`` (default: us),
    with ``stdin``/``stdout``/``stderr`` as :class:`subprocess.Popen` takes them.
    Everything of the job is applied by :mod:`._job_exec` after it became the
    user. ``slurm_job``: the allocation whose steps named :func:`step_name`
    belong to the job (the command runs through srun). ``outcome_dir``: a
    directory of the scheduler's own (nobody else may write it) where the
    supervisor records how the program ended (:func:`outcome`); None: nowhere.
    OSError if it cannot start (as the user found: the directory or the
    program missing or not theirs to use); nothing is left behind then. Once the
    program has ended, its supervisor ends what it left (TERM, KILL after
    ``grace`` seconds) before it exits itself.

    ``ready(handle)`` is called once everything but the ``exec`` is done (the
    handle's ``identity`` is whole), and the program begins only after it has
    returned: the scheduler records the start durably there, so a program
    never runs for a start its state does not know. If it raises, or this
    process dies first, the program never begins (:func:`never_began`), and
    what it raised comes out of here with nothing left behind."""
    tag = tag or new_tag(job_id)
    job_env = {**(os.environ if env is None else env), TAG_ENV: tag}
    name = f"job-{tag}{OUTCOME_SUFFIX}"
    outcome_fd = None if outcome_dir is None else \
        os.open(outcome_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        path = _make_cgroup(tag, cgroup)
    except BaseException:
        if outcome_fd is not None:
            os.close(outcome_fd)
        raise
    spec = {"cgroup": str(path) if path is not None else None, "cwd": cwd, "env": job_env,
            "argv": list(argv), "uid": user.uid if user else None,
            "gid": user.gid if user else None, "groups": list(user.groups) if user else None,
            "outcome_fd": outcome_fd, "outcome_name": name, "tag": tag, "grace": grace}
    spec_r, spec_w = os.pipe()
    error_r, error_w = os.pipe()
    go_r, go_w = os.pipe()  # never inherited by another child: its end of file means "no go"
    spec["go_fd"] = go_r
    inherited = (spec_r, error_w, go_r) + ((outcome_fd,) if outcome_fd is not None else ())
    identity: dict[str, Any] = {}

    def go() -> None:
        if ready is not None:
            ready(Handle(proc, identity))
        try:
            os.write(go_w, b"!")
        except BrokenPipeError:
            pass  # the child is gone: its report (or its end) tells

    with os.fdopen(spec_w, "wb") as spec_file, os.fdopen(error_r, "rb", buffering=0) as errors:
        try:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _EXEC_SOURCE, str(spec_r), str(error_w)],
                    env={**_EXEC_ENV, TAG_ENV: tag}, cwd="/", stdin=stdin, stdout=stdout,
                    stderr=stderr, pass_fds=inherited, start_new_session=True)
            finally:
                for fd in inherited:
                    os.close(fd)
            identity.update(
                {"pid": proc.pid, "start_time": start_time(proc.pid), "boot_id": boot_id(),
                 "cgroup": str(path) if path is not None else None, "tag": tag,
                 "slurm": {"job": str(slurm_job), "step_name": step_name(tag)} if slurm_job else None,
                 "supervised": True, "uid": user.uid if user else os.geteuid(),
                 "supervisor_uid": os.geteuid(),
                 "outcome": str(Path(outcome_dir, name)) if outcome_dir is not None else None})
            failure = _hand_over(proc, spec, spec_file, errors, go)
        except BaseException:
            if identity:  # ``ready`` raised: it never had its go
                kill(identity, 0.0)
                proc.wait()
                forget(identity)
            if path is not None:
                _remove_cgroup(path)
            raise
        finally:
            os.close(go_w)  # without a go sent, the child ends without running the program
    if failure is not None:
        proc.wait()
        kill(identity, 0.0)  # whatever may have got away (nothing, unless the first process crashed)
        if path is not None:
            _remove_cgroup(path)
        forget(identity)
        raise failure
    return Handle(proc, identity)


def _hand_over(proc: subprocess.Popen, spec: dict[str, Any], spec_file: Any,
               errors: Any, go: Callable[[], None]) -> OSError | None:
    """Give the first process what to run, call ``go`` once it is ready for its
    go; the OSError it met, or None once it ``exec``\\ ed the job."""
    try:
        spec_file.write(json.dumps(spec).encode())
        spec_file.close()
    except BrokenPipeError:
        pass  # it died before reading: its error (or exit) tells
    report = _report(proc, spec, errors, b"", until_ready=True)
    # ready; or started at once (its child was killed before it could say ready: a
    # program killed as it began, as the supervisor sees it), which is a start too
    if isinstance(report, bytes) and report.startswith((_READY, _STARTED)):
        go()
        report = _report(proc, spec, errors, report.removeprefix(_READY), until_ready=False)
    if isinstance(report, OSError):
        return report
    if report == _STARTED:  # however soon the program ended after that
        return None
    if not report:  # died before it could say why
        proc.wait()
        return ChildProcessError(errno.ECHILD, "the job's first process exited with "
                                 f"{proc.returncode} before it started the job")
    step, number, text, filename = (report.decode(errors="replace").split("\0") + ["", "", ""])[:4]
    where = {"cgroup": "entering the job's cgroup", "user": "becoming the job's user",
             "cwd": "the job's directory", "exec": "the job's program",
             "command": "the job's command, directory or environment"}.get(step, step)
    # OSError(errno, ...) is the subclass of that errno: FileNotFoundError, PermissionError...
    return OSError(ascii_int(number) or 0, f"{where}: {text}", filename or None)


# -- finding the processes ---------------------------------------------------------------------------

def _report(proc: subprocess.Popen, spec: dict[str, Any], errors: Any, report: bytes,
            until_ready: bool) -> bytes | OSError:
    """What the first process says on ``errors`` (after ``report``), to its end or,
    ``until_ready``, to its ready (or started) byte; a TimeoutError, its
    processes killed, if that takes ``START_TIMEOUT``."""
    deadline = time.monotonic() + START_TIMEOUT
    while len(report) < 65536 and not (until_ready and report[:1] in (_READY, _STARTED)):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([errors], [], [], left)[0]:
            try:  # the supervisor and its child, which has not left their group before its exec
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            return TimeoutError(errno.ETIMEDOUT, f"the job did not start within {START_TIMEOUT:g} s "
                                f"(is its directory {spec['cwd']!r} reachable?)")
        chunk = errors.read(65536)
        if not chunk:
            break
        report += chunk
    return report


def _same_boot(identity: Mapping[str, Any]) -> bool:
    return not identity.get("boot_id") or identity["boot_id"] == boot_id()


def _scan(uids: set[int] | None) -> dict[int, list[str]]:
    """``/proc/<pid>/stat`` fields (:func:`_stat`) of every process but ours owned by
    one of ``uids`` (None: by anyone). The owner comes from one ``stat`` of the
    ``/proc`` entry, so other users' processes cost no read: a scan stays cheap
    however many processes others run, and reads nothing they control."""
    mine = os.getpid()
    found: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if ascii_int(name) in (None, mine):
            continue
        if uids is not None:
            try:
                if os.stat(f"/proc/{name}").st_uid not in uids:
                    continue
            except OSError:
                continue
        fields = _stat(int(name))
        if fields is not None:
            found[int(name)] = fields
    return found


def _owners(identity: Mapping[str, Any]) -> set[int] | None:
    """Whose processes can be the job's: its user's and, for its supervisor, the
    scheduler's (None for an identity recorded before ``uid`` was: anyone's)."""
    uid = identity.get("uid")
    return None if uid is None else {int(uid), int(identity.get("supervisor_uid", uid))}


def _fallback_members(identity: Mapping[str, Any]) -> set[int]:
    """Without a cgroup: the supervisor's descendants (it is a child subreaper, so a
    double fork stays below it), and the job user's processes still in the job's
    process group or session. Never a process of another user, never by anything
    a process can set about itself (its environment)."""
    pid, since = identity.get("pid"), identity.get("start_time")
    if not pid:
        return set()
    procs = _scan(_owners(identity))
    found: set[int] = set()
    if since is not None and pid in procs and int(procs[pid][19]) == since:
        children: dict[int, list[int]] = {}
        for p, fields in procs.items():
            children.setdefault(int(fields[1]), []).append(p)
        todo = [pid]
        while todo:
            kids = children.get(todo.pop(), [])
            found.update(kids)
            todo.extend(kids)
    if _group_is_ours(pid, since):
        uid = identity.get("uid")
        for p, fields in procs.items():
            if (int(fields[2]) == pid or int(fields[3]) == pid) \
                    and (since is None or int(fields[19]) >= since) \
                    and (uid is None or _owner(p) == uid):
                found.add(p)
    return found


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _group_is_ours(leader: int, since: int | None) -> bool:
    """Whether the process group and session numbered ``leader`` are still the
    job's: yes if the leader runs with its start time, or is gone (a pid stays
    taken while a group or session of that number has a member); no if another
    process has its pid now (then our group had emptied first)."""
    now = start_time(leader)
    return now is None or since is None or now == since


def members(identity: Mapping[str, Any]) -> set[int]:
    """The live (not zombie) processes of the job on this machine: those in its
    cgroup, or without one :func:`_fallback_members`; and its first process."""
    if not _same_boot(identity):
        return set()
    pid, since = identity.get("pid"), identity.get("start_time")
    if identity.get("cgroup"):
        found = _cgroup_pids(identity["cgroup"])
    else:
        found = _fallback_members(identity)
    if pid and since is not None and start_time(pid) == since:
        found.add(pid)
    found.discard(os.getpid())
    return {p for p in found if _running(_stat(p))}


def _slurm_steps(identity: Mapping[str, Any]) -> list[str]:
    """The ids (``job.step``) of the job's Slurm steps still listed ([] without Slurm)."""
    slurm = identity.get("slurm")
    if not slurm:
        return []
    try:
        out = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={slurm['job']}",
                              "--format=%i %j"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    steps = []
    for line in out.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip() == slurm["step_name"]:
            steps.append(parts[0])
    return steps


def leader_alive(identity: Mapping[str, Any]) -> bool:
    """Whether the job's first process (the one the scheduler started) still runs:
    same boot, and its pid exists with the same start time."""
    if not identity or not _same_boot(identity):
        return False
    fields = _stat(int(identity["pid"]))
    return _running(fields) and int(fields[19]) == identity.get("start_time")  # type: ignore[index]


def alive(identity: Mapping[str, Any]) -> bool:
    """Whether the job is provably still the same processes: same boot, and its
    first pid exists with the same start time, or its cgroup (or, without one,
    the supervisor's descendants or the job's session) still has processes, or
    its Slurm steps are still listed."""
    if not identity or not _same_boot(identity):
        return False
    return bool(members(identity)) or bool(_slurm_steps(identity))


# -- ending ----------------------------------------------------------------------------------------------

def _signal(pids: Iterable[int], sig: int, identity: Mapping[str, Any]) -> None:
    """Send ``sig`` to each of ``pids`` that is still the job's (checked after the
    pidfds are open, so a reused pid is never hit). A supervisor gets only KILL,
    and without a cgroup only once nothing else of the job is left (it is the
    subreaper that keeps the job's orphans findable): it passes other signals
    on to the program, which gets them here itself."""
    supervisor = identity.get("pid") if identity.get("supervised") else None
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            if pid == supervisor and sig != signal.SIGKILL:
                continue
            try:
                fds[pid] = os.pidfd_open(pid)
            except OSError:
                continue
        if not fds:
            return
        ours = members(identity)
        if supervisor in fds and not identity.get("cgroup") and ours - {supervisor}:
            ours.discard(supervisor)
        for pid, fd in fds.items():
            if pid in ours:
                try:
                    signal.pidfd_send_signal(fd, sig)
                    if sig == signal.SIGTERM:
                        signal.pidfd_send_signal(fd, signal.SIGCONT)  # a stopped one must see it
                except OSError:
                    pass
    finally:
        for fd in fds.values():
            os.close(fd)


def _cancel_steps(identity: Mapping[str, Any]) -> None:
    steps = _slurm_steps(identity)
    if steps:
        try:
            subprocess.run(["scancel", "--quiet", *steps], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


def kill(identity: Mapping[str, Any], grace: float, bound: float = KILL_BOUND) -> None:
    """End every process of the job: TERM (and its Slurm steps: ``scancel``),
    KILL what is left after ``grace`` seconds; return when none is left (and the
    steps are gone), then remove the cgroup. :class:`StillRunning` (naming the
    pids) if some outlive ``grace + bound`` seconds. Safe to call from several
    threads at once and on a job already gone."""
    if not identity or not _same_boot(identity):
        return
    cgroup = identity.get("cgroup")
    _cancel_steps(identity)
    t0 = time.monotonic()
    termed: set[int] = set()
    killed = False
    pause = 0.01
    while True:
        left = members(identity)
        steps = _slurm_steps(identity) if identity.get("slurm") else []
        if not left and not steps:
            break
        elapsed = time.monotonic() - t0
        if elapsed >= grace:
            if cgroup and not killed:
                try:
                    Path(cgroup, "cgroup.kill").write_text("1")
                except OSError:
                    pass
            _signal(left, signal.SIGKILL, identity)
            if steps and not killed:
                _cancel_steps(identity)
            killed = True
        else:
            _signal(left - termed, signal.SIGTERM, identity)
            termed |= left
        if elapsed >= grace + bound:
            raise StillRunning(f"job {identity.get('tag')}: processes {sorted(left)}"
                               + (f" and Slurm steps {steps}" if steps else "")
                               + f" still run {elapsed:.1f} s after they were told to end",
                               sorted(left))
        time.sleep(pause)
        pause = min(pause * 2, 0.1 if not steps else 0.5)
    if cgroup:
        _remove_cgroup(cgroup)


# -- adopting ----------------------------------------------------------------------------------------------

def outcome(identity: Mapping[str, Any]) -> int | None:
    """How the job's program ended, as its supervisor recorded it, in the shape of
    Popen's ``returncode`` (its exit code, or ``-N`` for signal N); None when
    nothing is recorded (it still runs, its supervisor was killed, or it was
    started without an outcome directory or by an older scheduler). Only a
    record of this job (its tag) counts; it holds across a reboot."""
    record = _record(identity)
    if record is None:
        return None
    sig, code = record.get("signal"), record.get("code")
    if type(sig) is int and sig > 0:
        return -sig
    return code if type(code) is int else None


def never_began(identity: Mapping[str, Any]) -> bool:
    """Whether the job's supervisor recorded that its program never began: the
    scheduler that started it died between the start and its go (the start may
    be in the state; the program never ran, so the job can simply be queued
    again)."""
    record = _record(identity)
    return record is not None and record.get("began") is False


def _record(identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """The outcome record of this job (its tag), or None."""
    path = identity.get("outcome")
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("tag") != identity.get("tag"):
        return None
    return record


def forget(identity: Mapping[str, Any]) -> None:
    """Remove the job's outcome file (once its end is recorded elsewhere)."""
    path = identity.get("outcome")
    for name in (path, f"{path}.tmp") if path else ():
        try:
            os.unlink(name)
        except OSError:
            pass


class Adopted:
    """A job started by another daemon process (ours no longer knows it as a
    child): ``poll()``/``wait(timeout)`` in the shape of Popen's, ``None`` while
    it runs. It has ended when its supervisor has recorded how its program
    ended (:func:`outcome`: then ``returncode`` is that status, and what the
    program left behind may still run, as with a child of ours), or else when
    no process of it is left (:func:`alive` is false); ``ended`` says so, and
    ``returncode`` is None if no status was recorded (only its parent could
    reap it). ``pid`` is its first process."""

    def __init__(self, identity: Mapping[str, Any]) -> None:
        self.identity = dict(identity)
        self.pid: int = int(identity.get("pid") or 0)
        self.returncode: int | None = None
        self.ended = False
        self._fd: int | None = None
        if self.pid and _same_boot(identity) and start_time(self.pid) == identity.get("start_time"):
            try:
                self._fd = os.pidfd_open(self.pid)
            except OSError:
                self._fd = None
            if self._fd is not None and start_time(self.pid) != identity.get("start_time"):
                os.close(self._fd)  # reused between the check and the open
                self._fd = None

    def poll(self) -> int | None:
        if self.ended:
            return self.returncode
        if self.identity.get("supervised") and not leader_alive(self.identity):
            code = outcome(self.identity)  # written before the supervisor exited
            if code is not None:
                self.ended, self.returncode = True, code
                self._close()
                return code
        if not alive(self.identity):
            self.ended, self.returncode = True, outcome(self.identity)
            self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Until the job has ended (``subprocess.TimeoutExpired`` after ``timeout``);
        returns its recorded exit status, or None if none was recorded."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            if self.ended:
                return self.returncode
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"job {self.identity.get('tag')}", timeout or 0)
            if self._fd is None:
                time.sleep(left)
            elif select.select([self._fd], [], [], left)[0]:  # the first process ended
                self._close()

    def kill(self) -> None:
        kill(self.identity, 0.0)

    def send_signal(self, sig: int) -> None:
        _signal(members(self.identity), sig, self.identity)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self._close()


def adopt(identity: Mapping[str, Any]) -> Adopted:
    """Watch the job named by ``identity`` although it is not our child (after a
    daemon restart); see :class:`Adopted`."""
    return Adopted(identity)
