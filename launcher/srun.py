"""Start places on the nodes of a Slurm allocation with ``srun``."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._base import LaunchedPlace, Launcher, PlaceProcess, checked_host, place_command, supervised
from ._digits import ascii_int

__all__ = ["SrunLauncher"]


class SrunLauncher(Launcher):
    """One single-task job step per place: ``srun -N1 -n1 -w host ...``.

    It must run inside an allocation (``salloc``, ``sbatch``). Steps overlap so
    that several places may share a node, stdin goes to the one task so that
    the place sees end of file when its parent dies, and killing the srun
    client ends the step: slurmstepd kills its tasks at once, also a stopped
    one (measured: 0.05 s), so a place that place 0 declares dead goes. A host
    cut off from the network, or place 0 gone while the place is stopped, gives
    Slurm nothing to act on for minutes: the place runs under its supervisor
    (:mod:`launcher._supervise`), which watches place 0 itself.

    Steps are named ``apgas-<program>``, or ``$APGAS_STEP_NAME`` (from ``env``, else
    this process's environment) when set: the scheduler names a job's steps
    after the job, and the steps the job starts inherit the name, so that
    cancelling the job can ``scancel`` all of them.
    """

    name = "srun"

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        return LaunchedPlace(self.command(host, supervised(place_command(place_id, python))),
                             bootstrap)

    def command(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                secret_names: Sequence[str] = (), cwd: str | None = None) -> list[str]:
        """An ``srun`` step on ``host``; ``secret_names`` are never read from stdin here,
        srun carries the local environment (and the secrets in it) along."""
        if not os.environ.get("SLURM_JOB_ID"):
            raise OSError("the srun launcher works inside a Slurm allocation (salloc or sbatch), "
                          "and SLURM_JOB_ID is not set")
        checked_host(host)  # and it goes as an option's value (--nodelist=host), never alone
        srun = shlex.split(getattr(self.config, "srun", "") or "srun")
        flags = [*_companion(host), "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                 "--input=0", "--kill-on-bad-exit=1", "--quiet", "--mpi=none",
                 f"--job-name={_step_name(env) or 'apgas-' + Path(argv[0]).name}",
                 f"--chdir={cwd or os.getcwd()}"]
        return [*srun, *flags, *argv]  # srun carries the local environment along


def _companion(host: str) -> list[str]:
    """``--jobid=<it>`` when ``host`` is in a companion allocation of this job
    (``APGAS_SLURM_COMPANIONS=node=jobid,...``, kept by the slurm communicator)."""
    for pair in os.environ.get("APGAS_SLURM_COMPANIONS", "").split(","):
        node, _, job = pair.partition("=")
        if node == host and ascii_int(job) is not None:
            return [f"--jobid={job}"]
    return []


def _step_name(env: Mapping[str, str] | None) -> str:
    """``APGAS_STEP_NAME`` from ``env`` or our environment, if it is a safe name."""
    name = (env or {}).get("APGAS_STEP_NAME") or os.environ.get("APGAS_STEP_NAME", "")
    return name if name.replace("-", "").replace("_", "").isalnum() else ""
