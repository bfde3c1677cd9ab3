"""The one grammar for host names, in the lowest layer: launchers check every host
before it reaches ssh or srun, and grow orders, host files, node lists and the
scheduler use the same check (``apgas.protocol.check_host`` is this function;
``launcher`` imports nothing of ``apgas``, which imports ``launcher``)."""

from __future__ import annotations

import re

__all__ = ["check_host", "MAX_HOST"]

MAX_HOST = 253
"""The longest host name, in characters (DNS's limit)."""
_HOST = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*", re.ASCII)


def check_host(name: str) -> str:
    """``name`` if it is a host name every launcher may pass on; else ValueError naming it.

    Letters, digits, ``-``, ``.``, ``_`` and ``:`` (an IPv6 address, a port),
    1 to 253 characters, and never a leading ``-``: a host name reaches ssh,
    srun and the like, and one that starts with ``-`` would be read as an option
    (``-oProxyCommand=...``). The one grammar for host names, wherever they
    come from (grow orders, host files, ``APGAS_HOSTS``, node lists, the scheduler).
    """
    if not isinstance(name, str):
        raise ValueError(f"a host name must be a string, got {type(name).__name__} {_shown(name)}")
    if not name:
        raise ValueError("empty host name")
    if len(name) > MAX_HOST:
        raise ValueError(f"host name {_shown(name)} is longer than {MAX_HOST} characters "
                         f"({len(name)})")
    if name.startswith("-"):
        raise ValueError(f"host name {_shown(name)} starts with '-' (it would be read as an option)")
    if _HOST.fullmatch(name) is None:
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "-._:"))})
        raise ValueError(f"host name {_shown(name)} has characters other than letters, digits, "
                         f"'-', '.', '_' and ':': {''.join(bad)!r}")
    return name


def _shown(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"
