"""The first process of every job, before it becomes the job (``execve``, same pid).

The scheduler starts it (as root, when it serves several users) with a fixed,
clean environment and no argument the job chose, like Slurm's
``slurmstepd``: nothing a user wrote reaches a process that still has the
scheduler's rights, so ``LD_PRELOAD``, ``LD_AUDIT`` and their kind in a job's
``env`` act only on the user's own program. In order it

1. enters the job's cgroup (writes its pid to ``cgroup.procs``, which needs the
   scheduler's rights), so that nothing of the job runs outside it;
2. becomes the job's user (groups, gid, uid; all three ids of each);
3. as that user: changes to the job's directory, finds the program on the job's
   ``PATH`` and ``execve``\\ s it with the job's environment.

So the directory and the program are looked up with the user's rights: a job
cannot learn whether a file of root's exists from the error it gets.

What to run comes as JSON on the descriptor ``argv[1]`` (read to its end):
``{"cgroup", "uid", "gid", "groups", "cwd", "env", "argv"}`` (``null`` for
"leave as is"). A failure is written to the descriptor ``argv[2]`` as
``step NUL errno NUL text NUL filename`` and the process exits with 127; that
descriptor is close-on-exec, so the scheduler reads nothing when ``execve``
succeeded (``subprocess`` reports its own child's errors so).

It runs as ``python -I -S -c <this source>``: the standard library only, no
site-packages, no ``PYTHON*`` variables.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    spec_fd, error_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(error_fd, False)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    step = "cgroup"
    try:
        if spec["cgroup"]:
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        step = "user"
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
        report = [step, str(e.errno or 0), e.strerror or str(e), str(e.filename or "")]
        os.write(error_fd, "\0".join(report).encode(errors="replace"))
        os._exit(127)


if __name__ == "__main__":
    main()
