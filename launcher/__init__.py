"""Start place processes on hosts: ``local``, ``ssh``, ``srun`` and ``mpi``.

A :class:`Launcher` starts one place with the runtime's bootstrap data and
returns a handle whose ``poll()`` tells when the place process has ended. The
local launcher forks places from a warmed template process where it can
(:class:`ForkedPlace`, ``start_method`` ``fork``).
Other launchers come through the entry-point group ``apgas.launchers``: an
entry point names a :class:`Launcher` subclass, built with the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from ._base import LaunchedPlace, Launcher, PlaceProcess, checked_host, child_environment, place_command
from ._entry_points import load_entry_point
from ._forkserver import ForkedPlace
from ._hostnames import check_host
from ._hosts import HostSpecError, check_hosts, compress_hostlist, expand_hostlist, read_hostfile, slurm_hosts
from .local import LocalLauncher, default_start_method, is_local_host
from .mpi import MpiLauncher, mpi_rank_from_env
from .srun import SrunLauncher
from .ssh import SshLauncher

__all__ = ["Launcher", "PlaceProcess", "LaunchedPlace", "ForkedPlace", "LocalLauncher",
           "SshLauncher", "SrunLauncher", "MpiLauncher", "HostSpecError", "is_local_host", "place_command",
           "child_environment", "check_host", "check_hosts", "checked_host",
           "get_launcher", "launcher_names", "detect_launcher", "read_hostfile",
           "expand_hostlist", "compress_hostlist", "slurm_hosts", "mpi_rank_from_env", "default_start_method"]

_BUILTIN: dict[str, type[Launcher]] = {
    "local": LocalLauncher, "ssh": SshLauncher, "srun": SrunLauncher, "mpi": MpiLauncher}
GROUP = "apgas.launchers"


def launcher_names() -> list[str]:
    """Every launcher name: the built-ins, then the installed plugins."""
    return list(_BUILTIN) + sorted(ep.name for ep in entry_points(group=GROUP)
                                   if ep.name not in _BUILTIN)


def get_launcher(name: str, config: Any = None) -> Launcher:
    """Build the launcher called ``name``; ``ValueError`` names the known ones."""
    cls: Any = _BUILTIN.get(name)
    if cls is None:
        found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
        if not found:
            raise ValueError(f"unknown launcher {name!r}; available: {launcher_names()}")
        cls = load_entry_point(found[0])
        if not (isinstance(cls, type) and issubclass(cls, Launcher)):
            raise ValueError(f"entry point {name!r} of {GROUP} must name a Launcher subclass, "
                             f"got {cls!r}")
    return cls(config)


def detect_launcher(environ: Mapping[str, str], mpi: bool = True) -> str:
    """The launcher the surroundings call for: ``mpi`` under mpiexec, ``srun``
    inside a Slurm allocation, else ``local``."""
    if mpi and mpi_rank_from_env(environ) is not None:
        return "mpi"
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"):
        return "srun"
    return "local"
