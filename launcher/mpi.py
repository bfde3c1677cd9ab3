"""Places from the ranks of ``mpiexec``: ``mpiexec -n 4 python script.py`` gives 4 places.

The ranks exchange what they need with mpi4py (rank 0 gathers the ranks'
host names and broadcasts its endpoint and the job's secret); then rank 0
runs ``main`` and the other ranks serve as places 1..n-1 over the runtime's
own sockets. mpiexec owns the rank processes: they stay until the job ends
(``MPI_Finalize`` waits for every rank), cannot be removed by a shrink, and if
one dies mpiexec ends them all. Growth goes through another launcher.

mpiexec does not end a rank whose host is cut off, nor a stopped rank when
place 0 is gone, so each rank other than 0 starts a watchdog beside it
(:func:`start_watchdog`, :mod:`launcher._supervise`) that ends it then. A
stopped rank stays while place 0 runs on: mpiexec would answer its end by
ending the whole job, place 0 included.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._base import Launcher, PlaceProcess, child_environment
from ._digits import ascii_int

log = logging.getLogger("apgas.launcher")

__all__ = ["MpiLauncher", "mpi_rank_from_env", "start_ranks", "claim_ranks", "load_mpi",
           "start_watchdog", "stand_down"]

_claimed = False  # the ranks serve one apgas.run: after it they have finalized and exited

# variables that mpiexec (MPICH's hydra, Open MPI, PMIx, Slurm's PMI) sets in every rank
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


def mpi_rank_from_env(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``(rank, size)`` when this process was started by mpiexec, else ``None``."""
    rank = next((n for v in _RANK_VARS if (n := ascii_int(environ.get(v, ""))) is not None), None)
    size = next((n for v in _SIZE_VARS if (n := ascii_int(environ.get(v, ""))) is not None), None)
    if rank is None or size is None:
        return None
    return rank, size


def load_mpi() -> Any:
    """mpi4py's ``MPI`` module, or OSError saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise OSError("the mpi launcher needs mpi4py and an MPI library: "
                      "pip install 'apgas[mpi]' (mpi4py and mpich from PyPI)") from e
    return MPI


class _Rank:
    """Handle of a place that mpiexec started: it is not ours to wait for or kill."""

    removable = False

    def __init__(self, rank: int) -> None:
        self.pid = -1
        self.rank = rank

    def poll(self) -> int | None:
        return None  # if a rank dies, mpiexec ends the whole job

    def wait(self, timeout: float | None = None) -> int:
        return 0  # it ends in MPI_Finalize, together with rank 0

    def kill(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    def last_error(self) -> str:
        return ""


class MpiLauncher(Launcher):
    """Hands out the ranks mpiexec started; it cannot start processes of its own."""

    name = "mpi"

    def __init__(self, config: Any = None, size: int | None = None) -> None:
        super().__init__(config)
        self.size = size

    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        if self.size is None or not 0 < place_id < self.size:
            raise OSError(f"mpiexec started {self.size or 'no'} rank(s) and MPI cannot add "
                          f"place {place_id}; growth goes through APGAS_GROW_LAUNCHER "
                          "(local, ssh or srun)")
        return _Rank(place_id)


def claim_ranks() -> None:
    """At rank 0, before a run: the ranks are there only for the first ``apgas.run``.

    The other ranks leave when it ends (``MPI_Finalize``), so a second run would
    wait for them for ever; it fails at once instead, saying why."""
    global _claimed
    if _claimed:
        raise OSError("under mpiexec the ranks serve the first apgas.run() only (they "
                      "finalize and exit when it ends); run everything in one main(), or "
                      "start the program without mpiexec")
    _claimed = True


def start_ranks(rt: Any, timeout: float) -> list[Any]:
    """At rank 0: make places of the other ranks; returns them once all joined."""
    MPI = load_mpi()
    comm = MPI.COMM_WORLD
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    comm.bcast(rt.bootstrap(None, None), root=0)
    return rt.start_places(hosts[1:], MpiLauncher(rt.config, comm.Get_size()), timeout)


def start_watchdog(bootstrap: Mapping[str, Any]) -> subprocess.Popen[bytes] | None:
    """At a rank other than 0: start its watchdog (``python -m launcher._supervise
    --pid``), which SIGKILLs this process when place 0's link is lost and this
    process has neither ended nor called :func:`stand_down` within a second.
    None (and a warning) if it cannot start: the rank serves unwatched."""
    line = json.dumps({"place": bootstrap.get("place"),
                       "parent_endpoint": bootstrap.get("parent_endpoint"),
                       "secret": bootstrap.get("secret"),  # its link proves it (CURVE); stdin only
                       "config": {"heartbeat": bootstrap.get("config", {}).get("heartbeat")}})
    env = child_environment()  # not a rank itself
    root = str(Path(__file__).resolve().parent.parent)  # where this package is found
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "launcher._supervise", "--pid", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True, env=env)
        assert watchdog.stdin is not None
        watchdog.stdin.write(line.encode() + b"\n")
        watchdog.stdin.flush()
    except OSError as e:
        log.warning("rank %s runs without a watchdog (%s): it stays if place 0 is cut off "
                    "while it cannot end by itself", bootstrap.get("place"), e)
        return None
    return watchdog


def stand_down(watchdog: subprocess.Popen[bytes] | None) -> None:
    """Place 0 asked this rank to stop: its watchdog ends, the rank finalizes."""
    if watchdog is not None and watchdog.stdin is not None:
        try:
            watchdog.stdin.close()
        except OSError:
            pass
