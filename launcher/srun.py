"""Start places on the nodes of a Slurm allocation with ``srun``."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Mapping, Sequence

from ._base import Launcher, checked_host

__all__ = ["SrunLauncher"]


class SrunLauncher(Launcher):
    """One single-task job step per place: ``srun -N1 -n1 -w host ...``.

    It must run inside an allocation (``salloc``, ``sbatch``). Steps overlap so
    that several places may share a node, stdin goes to the one task so that
    the place sees end of file when its parent dies, and killing the srun
    client ends the step.
    """

    name = "srun"

    def command(self, host: str, argv: Sequence[str],
                env: Mapping[str, str] | None = None) -> list[str]:
        if not os.environ.get("SLURM_JOB_ID"):
            raise OSError("the srun launcher works inside a Slurm allocation (salloc or sbatch), "
                          "and SLURM_JOB_ID is not set")
        checked_host(host)  # and it goes as an option's value (--nodelist=host), never alone
        srun = shlex.split(getattr(self.config, "srun", "") or "srun")
        flags = ["--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                 "--input=0", "--kill-on-bad-exit=1", "--quiet", "--mpi=none",
                 f"--job-name=apgas-{Path(argv[0]).name}", f"--chdir={os.getcwd()}"]
        return [*srun, *flags, *argv]  # srun carries the local environment along
