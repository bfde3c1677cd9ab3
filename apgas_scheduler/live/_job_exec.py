"""The first process of every job: it starts the job's program and stays, as its
parent, to record how it ended.

The scheduler starts it (as root, when it serves several users) with a fixed,
clean environment and no argument the job chose, like Slurm's
``slurmstepd``: nothing a user wrote reaches a process that still has the
scheduler's rights, so ``LD_PRELOAD``, ``LD_AUDIT`` and their kind in a job's
``env`` act only on the user's own program. It

1. enters the job's cgroup (writes its pid to ``cgroup.procs``, which needs the
   scheduler's rights), so that nothing of the job runs outside it;
2. forks. The child closes what it must not keep (the outcome directory),
   becomes the job's user (groups, gid, uid; all three ids of each) and, as
   that user, changes to the job's directory, finds the program on the job's
   ``PATH`` and ``execve``\\ s it with the job's environment. So the directory
   and the program are looked up with the user's rights: a job cannot learn
   whether a file of root's exists from the error it gets.
3. The parent, the **supervisor**, never runs anything of the user's: it
   waits for the child, passes on the signals it is sent (TERM, INT, HUP,
   QUIT, USR1, USR2, ALRM) to it, and when the child has ended writes its
   exit status to the outcome directory (``<name>``, written as
   ``<name>.tmp`` and renamed, so it is whole or absent), then exits with the
   same status (a signal that would dump a core: ``128 + signal``). A
   scheduler that was down meanwhile reads the file (it is root's, in root's
   state directory: the user's program, which runs as another user and never
   held the directory open, cannot write or forge it).

What to run comes as JSON on the descriptor ``argv[1]`` (read to its end):
``{"cgroup", "uid", "gid", "groups", "cwd", "env", "argv", "outcome_fd",
"outcome_name", "tag"}`` (``null`` for "leave as is"; ``outcome_fd`` is a
directory open for us, or null: record nothing). A failure to start is
written to the descriptor ``argv[2]`` as ``step NUL errno NUL text NUL
filename`` and the process exits with 127, recording nothing; once the
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


def main() -> None:
    spec_fd, error_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(error_fd, False)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    outcome_fd = spec.get("outcome_fd")
    if outcome_fd is not None:
        os.set_inheritable(outcome_fd, False)
    try:
        if spec["cgroup"]:
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
    except OSError as e:
        fail(error_fd, "cgroup", e)
    started_r, started_w = os.pipe2(os.O_CLOEXEC)  # the child writes to it if it cannot exec
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the child is known
    child = os.fork()
    if child == 0:
        try:
            become_the_job(spec, error_fd, started_w, outcome_fd)
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
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the job's input (a key, for ssh) is the program's alone
    os.dup2(devnull, 1)
    os.close(devnull)
    name, tag = spec.get("outcome_name"), spec.get("tag")
    del spec  # the job's environment (its key): not kept here longer than needed
    with os.fdopen(started_r, "rb") as started:
        ran = not started.read()
    if ran:  # the scheduler reads this once the program has exec'd, however soon it ends
        try:
            os.write(error_fd, STARTED)
        except OSError:
            pass  # the scheduler stopped listening: it kills us, or learns the end otherwise
    os.close(error_fd)
    while True:  # a stop (the program may have asked to be traced) is no end
        _, status = os.waitpid(child, 0)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            break
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    os.close(pidfd)
    if not ran:
        os._exit(127)  # it never became the job: nothing to record
    if outcome_fd is not None and name:
        record(outcome_fd, name, tag, status)
    end_like(status)


def fail(error_fd: int, step: str, e: OSError) -> None:
    report = [step, str(e.errno or 0), e.strerror or str(e), str(e.filename or "")]
    os.write(error_fd, "\0".join(report).encode(errors="replace"))
    os._exit(127)


def become_the_job(spec: dict, error_fd: int, started_w: int, outcome_fd: int | None) -> None:
    """In the child: drop what is the supervisor's, become the user, exec the program."""
    step = "user"
    try:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; the program must not
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if outcome_fd is not None:
            os.close(outcome_fd)
        if spec["groups"] is not None:
            os.setgroups(spec["groups"])
        if spec["gid"] is not None:
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        if spec["uid"] is not None:
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        step = "cwd"
        if spec["cwd"]:
            os.chdir(spec["cwd"])
        step = "exec"
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])  # PATH: the job's own
    except OSError as e:
        os.write(started_w, b"!")
        fail(error_fd, step, e)


def record(directory: int, name: str, tag: str | None, status: int) -> None:
    """Write how the job's program ended (``status``, as ``waitpid`` gave it) to
    ``name`` in ``directory``, whole (a temporary file renamed) and on disk. A
    failure is told on stderr (the job's ``.err``); the scheduler then knows
    only what it sees."""
    tmp = name + ".tmp"
    ended = {"tag": tag, "time": time.time(),
             "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
             "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
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
