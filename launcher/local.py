"""Start places as subprocesses of this machine."""

from __future__ import annotations

import functools
import os
import socket
from typing import Mapping, Sequence

from ._base import Launcher, checked_host

__all__ = ["LocalLauncher", "is_local_host"]


@functools.lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return frozenset(names)


def is_local_host(host: str) -> bool:
    """True for this machine's names and for names listed in ``APGAS_LOCAL_HOSTS``
    (comma-separated; ``*`` stands for every name)."""
    extra = {h.strip() for h in os.environ.get("APGAS_LOCAL_HOSTS", "").split(",") if h.strip()}
    return host in _own_names() or host.startswith("127.") or host in extra or "*" in extra


class LocalLauncher(Launcher):
    """Places on this machine, as child processes."""

    name = "local"

    def command(self, host: str, argv: Sequence[str],
                env: Mapping[str, str] | None = None) -> list[str]:
        checked_host(host)
        if not is_local_host(host):
            raise OSError(f"host {host!r} is not this machine; list it in APGAS_LOCAL_HOSTS "
                          "to run its places here, or choose a launcher that reaches it "
                          "(APGAS_LAUNCHER=ssh or srun)")
        return list(argv)
