"""The launcher interface."""

from __future__ import annotations

import abc
import os
import sys
from typing import Any, Mapping, Protocol

__all__ = ["Launcher", "PlaceProcess", "place_command"]


class PlaceProcess(Protocol):
    """Handle of a started place; the shape of :class:`subprocess.Popen`."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Launcher(abc.ABC):
    """Starts place processes. The bootstrap mapping must reach the place's stdin as
    one JSON line, and that stdin must stay open while the launching place lives:
    its end-of-file tells the place that its parent is gone."""

    name: str = "?"

    @abc.abstractmethod
    def launch(self, place_id: int, host: str, bootstrap: Mapping[str, Any],
               python: str = "") -> PlaceProcess:
        """Start place ``place_id`` on ``host``; raise with the reason if it cannot start."""


def place_command(place_id: int, python: str = "") -> list[str]:
    """The command line of a place process (the parent pid marks whose child it is)."""
    return [python or sys.executable, "-m", "apgas._serve",
            "--parent", str(os.getpid()), "--place", str(place_id)]
