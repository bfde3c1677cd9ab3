"""The first process of every job: it starts the job's program and stays, as its
parent, to record how it ended.

The scheduler starts it (as root, when it serves several users) with a fixed,
clean environment and no argument the job chose, like Slurm's
``slurmstepd``: nothing a user wrote reaches a process that still has the
scheduler's rights, so ``LD_PRELOAD``, ``LD_AUDIT`` and their kind in a job's
``env`` act only on the user's own program. It

1. enters the job's cgroup (writes its pid to ``cgroup.procs``, which needs the
   scheduler's rights), so that nothing of the job runs outside it;
2. becomes the *child subreaper* of what it starts (``PR_SET_CHILD_SUBREAPER``),
   and forks. The child closes what it must not keep (the outcome
   directory), turns the command, environment and directory into bytes and
   works out where on the job's ``PATH`` the program may be (so that it
   needs nothing of this Python after the switch: ``os.execvpe`` imports
   lazily, and the scheduler's Python may live where the user cannot read),
   becomes the job's user (groups, gid, uid; all three ids of each) and, as
   that user, changes to the job's directory, tells the scheduler it is ready
   (``.`` on ``argv[2]``), waits for its go (a byte on the spec's ``go_fd``)
   and ``execve``\\ s the first of those paths that is there. So the
   directory and the program are looked up with the user's rights: a job
   cannot learn whether a file of root's exists from the error it gets. Any
   failure, of whatever kind, is reported with its text. The scheduler
   records the job's start durably before it sends the go, so a program runs
   only for a start the scheduler's state knows of: a scheduler killed before
   its go closes the pipe (end of file), and the child exits without running
   anything.
3. The parent, the **supervisor**, never runs anything of the user's: it
   waits for the child, passes on the signals it is sent (TERM, INT, HUP,
   QUIT, USR1, USR2, ALRM) to it, reaps the orphans re-parented to it, and
   when the child has ended writes its exit status to the outcome directory (``<name>``, written as
   ``<name>.tmp`` and renamed, so it is whole or absent), then exits with the
   same status (a signal that would dump a core: ``128 + signal``). A
   scheduler that was down meanwhile reads the file (it is root's, in root's
   state directory: the user's program, which runs as another user and never
   held the directory open, cannot write or forge it). Before it exits, it
   ends what the program left (its children by then: TERM, KILL after the
   spec's ``grace`` seconds). A child that got no go (end of file) is
   recorded so (``"began": false``), and the supervisor leaves the job's
   cgroup and removes it: a restarted scheduler whose state has the start
   queues the job again (:func:`.containment.never_began`); one whose state
   has not knows nothing of this cgroup.

What to run comes as JSON on the descriptor ``argv[1]`` (read to its end):
``{"cgroup", "uid", "gid", "groups", "cwd", "env", "argv", "outcome_fd",
"outcome_name", "tag", "grace", "go_fd"}`` (``null`` for "leave as is"; ``outcome_fd`` is a
directory open for us, or null: record nothing). A failure to start is
written to the descriptor ``argv[2]`` as ``step NUL errno NUL text NUL
filename`` (before the child's ``.``, or after it for the exec) and the
process exits with 127, recording nothing; once the
program has exec'd (that descriptor is close-on-exec in the child, and a
pipe of its own tells the supervisor), the supervisor writes ``+`` there
instead and closes it. So the scheduler knows that the job started even if
its program has already exited 3, and nothing at all means the first process
died before it could say.

It runs as ``python -I -S -c <this source>``: the standard library only, no
site-packages, no ``PYTHON*`` variables.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM)
"""What the supervisor passes on to the job's program (others act on itself)."""
CORE_SIGNALS = {signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
                signal.SIGFPE, signal.SIGSEGV, signal.SIGSYS, signal.SIGXCPU, signal.SIGXFSZ}
"""Signals whose default action dumps a core: the supervisor does not raise them on itself."""
STARTED = b"+"
"""What the supervisor tells the scheduler on ``argv[2]`` once the program has exec'd."""
READY = b"."
"""What the child tells the scheduler on ``argv[2]`` once only its go is missing."""
NO_GO = b"-"
"""What the child tells the supervisor when the scheduler closed ``go_fd`` without a go."""


def main() -> None:
    spec_fd, error_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(error_fd, False)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    outcome_fd, go_fd = spec.get("outcome_fd"), spec["go_fd"]
    for fd in (outcome_fd, go_fd):
        if fd is not None:
            os.set_inheritable(fd, False)
    try:
        if spec["cgroup"]:
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
    except OSError as e:
        fail(error_fd, "cgroup", e)
    subreaper()  # orphans of the job become our children, not init's
    started_r, started_w = os.pipe2(os.O_CLOEXEC)  # the child writes to it if it cannot exec
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the child is known
    child = os.fork()
    if child == 0:
        try:
            become_the_job(spec, error_fd, started_w, outcome_fd, go_fd)
        finally:
            os._exit(127)  # never back into the supervisor's code
    pidfd = os.pidfd_open(child)  # signals go to this child, never to a pid reused after it

    def forward(sig: int, _frame: object) -> None:
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            pass  # it has ended (reaped or not): nothing to pass on

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    os.close(started_w)
    os.close(go_fd)  # the child's alone: it sees the end of file if the scheduler dies
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the job's input (a key, for ssh) is the program's alone
    os.dup2(devnull, 1)
    os.close(devnull)
    name, tag, grace = spec.get("outcome_name"), spec.get("tag"), float(spec.get("grace") or 3.0)
    cgroup = spec["cgroup"]
    del spec  # the job's environment (its key): not kept here longer than needed
    with os.fdopen(started_r, "rb") as started:
        said = started.read()
    ran = not said
    if ran:  # the scheduler reads this once the program has exec'd, however soon it ends
        try:
            os.write(error_fd, STARTED)
        except OSError:
            pass  # the scheduler stopped listening: it kills us, or learns the end otherwise
    os.close(error_fd)
    while True:  # a stop (the program may have asked to be traced) is no end; orphans
        pid, status = os.waitpid(-1, 0)  # of the job that ended are reaped on the way
        if pid == child and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            break
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    os.close(pidfd)
    if said == NO_GO:  # the scheduler died before its go: the program never began
        if outcome_fd is not None and name:
            record(outcome_fd, name, tag, None)
        if cgroup:
            leave(cgroup)
        os._exit(127)
    if not ran:
        os._exit(127)  # it never became the job: nothing to record
    if outcome_fd is not None and name:
        record(outcome_fd, name, tag, status)
    end_leftovers(grace)
    end_like(status)


def fail(error_fd: int, step: str, e: OSError) -> None:
    report = [step, str(e.errno or 0), e.strerror or str(e),
              os.fsdecode(e.filename) if e.filename else ""]
    os.write(error_fd, "\0".join(report).encode("utf-8", "backslashreplace"))
    os._exit(127)


def subreaper() -> None:
    """Become the child subreaper of everything the job starts: a process whose
    parent ends (a double fork) is re-parented to us, not to init, so without a
    cgroup the scheduler still finds it among our descendants, and we end it."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux's libc: the scheduler's session scan is what is left


def candidates(spec: dict) -> list[bytes]:
    """The paths the program may be at, in order: itself if it names a path, else
    each directory of the job's ``PATH`` with its name, as ``execvpe`` tries
    them. Worked out before the switch of user, so that nothing of this Python
    is needed after it (``os.execvpe`` imports lazily, from wherever the
    scheduler's Python lives, which the user may not read). Which of them
    exists is found as the user, by ``execve`` itself: the error a job gets
    says nothing about files the user cannot see."""
    argv0 = os.fsencode(spec["argv"][0])
    if b"/" in argv0:
        return [argv0]
    path = os.fsencode(spec["env"].get("PATH", os.defpath))
    return [os.path.join(d or b".", argv0) for d in path.split(b":")]


def leave(cgroup: str) -> None:
    """Move out of the job's cgroup (to its parent, where the scheduler made it) and
    remove it: nothing of the job ran in it, and a scheduler whose state has
    no record of this start cannot know it."""
    try:
        with open(os.path.join(os.path.dirname(cgroup), "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
        os.rmdir(cgroup)
    except OSError:
        pass  # a scheduler that knows the start removes it (containment.kill)


def become_the_job(spec: dict, error_fd: int, started_w: int, outcome_fd: int | None,
                   go_fd: int) -> None:
    """In the child: drop what is the supervisor's, become the user, wait for the
    scheduler's go, exec the program. Every failure is reported with its text,
    whatever its kind; no go (the scheduler died) ends the child silently."""
    step = "command"
    try:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if outcome_fd is not None:
            os.close(outcome_fd)
        # everything the exec needs, as bytes, before the switch: a lone surrogate fails here
        argv = [os.fsencode(a) for a in spec["argv"]]
        env = {os.fsencode(k): os.fsencode(v) for k, v in spec["env"].items()}
        cwd = os.fsencode(spec["cwd"]) if spec["cwd"] else None
        paths = candidates(spec)
        step = "user"
        if spec["groups"] is not None:
            os.setgroups(spec["groups"])
        if spec["gid"] is not None:
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        if spec["uid"] is not None:
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        step = "cwd"
        if cwd is not None:
            os.chdir(cwd)
        try:
            os.write(error_fd, READY)
            go = os.read(go_fd, 1)
        except OSError:  # EPIPE (SIGPIPE is still ignored here): the scheduler is gone
            go = b""
        if not go:  # the scheduler died: its state may not have this start
            os.write(started_w, NO_GO)
            os._exit(127)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; the program must not
            signal.signal(sig, signal.SIG_DFL)
        step = "exec"
        first: OSError | None = None
        for path in paths:  # execvpe's rule: the first error other than "not here" counts
            try:
                os.execve(path, argv, env)
            except (FileNotFoundError, NotADirectoryError) as e:
                first = first or e
            except OSError as e:
                if first is None or isinstance(first, (FileNotFoundError, NotADirectoryError)):
                    first = e
        if len(paths) > 1 and isinstance(first, (FileNotFoundError, NotADirectoryError)):
            first = FileNotFoundError(2, "no such program on the job's PATH", spec["argv"][0])
        raise first or FileNotFoundError(2, "the job's PATH is empty", spec["argv"][0])
    except BaseException as e:  # noqa: BLE001 - anything: it is told, never a silent 127
        os.write(started_w, b"!")
        fail(error_fd, step, e if isinstance(e, OSError) else
             OSError(0, f"{type(e).__name__}: {e}"))


def end_leftovers(grace: float) -> None:
    """End what the program left running, all of it re-parented to us (we are its
    subreaper): TERM, KILL after ``grace`` seconds, until we have no child.
    They are our children, unreaped, so a pid here is never another's."""
    deadline = time.monotonic() + grace
    me, termed = os.getpid(), set()
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child left
        kids = children(me)
        if not kids:
            return
        late = time.monotonic() >= deadline
        for kid in kids:
            if late or kid not in termed:
                try:
                    os.kill(kid, signal.SIGKILL if late else signal.SIGTERM)
                    if not late:
                        os.kill(kid, signal.SIGCONT)
                except OSError:
                    pass
        termed |= set(kids)
        time.sleep(0.02)


def children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from ``/proc/<pid>/stat``)."""
    found = []
    for name in os.listdir("/proc"):
        if not (name.isascii() and name.isdigit()):  # apgas.protocol.ascii_int's rule
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == parent and fields[0] != b"Z":
            found.append(int(name))
    return found


def record(directory: int, name: str, tag: str | None, status: int | None) -> None:
    """Write how the job's program ended (``status``, as ``waitpid`` gave it; None:
    it never began, ``"began": false``) to ``name`` in ``directory``, whole (a
    temporary file renamed) and on disk. A failure is told on stderr (the
    job's ``.err``); the scheduler then knows only what it sees."""
    tmp = name + ".tmp"
    ended: dict = {"tag": tag, "time": time.time(), "code": None, "signal": None}
    if status is None:
        ended["began"] = False
    elif os.WIFEXITED(status):
        ended["code"] = os.WEXITSTATUS(status)
    elif os.WIFSIGNALED(status):
        ended["signal"] = os.WTERMSIG(status)
    try:
        try:
            os.unlink(tmp, dir_fd=directory)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=directory)
        try:
            os.write(fd, json.dumps(ended).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError as e:
        try:
            os.write(2, f"apgas-scheduler: could not record the job's exit status: {e}\n".encode())
        except OSError:
            pass


def end_like(status: int) -> None:
    """Exit as the job's program did: its code, or its signal (raised on ourselves,
    except one that would dump a core: then 128 + the signal, as a shell says).

    ``launcher._supervise`` has a twin of this: this module runs as ``python -I
    -S -c`` with the scheduler's rights and imports nothing of the project."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in CORE_SIGNALS:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 127)


if __name__ == "__main__":
    main()
