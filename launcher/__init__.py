"""Start place processes on hosts.

A :class:`Launcher` starts one place with the runtime's bootstrap data and
returns a handle whose ``poll()`` tells when the place process has ended.
Only the ``local`` launcher exists so far.
"""

from __future__ import annotations

from ._base import Launcher, PlaceProcess, place_command
from .local import LocalLauncher, is_local_host

__all__ = ["Launcher", "PlaceProcess", "LocalLauncher", "is_local_host", "place_command", "get_launcher"]


def get_launcher(name: str = "local") -> Launcher:
    """Return the launcher called ``name``."""
    if name == "local":
        return LocalLauncher()
    raise ValueError(f"unknown launcher {name!r}; available: ['local']")
