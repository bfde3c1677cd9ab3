"""Loading a plugin from its entry point, with an error that says whose it is.

The registries of launchers, communicators and policies all load plugins named
by entry points; a plugin that does not import (or names a missing attribute)
should be reported as that plugin's fault, naming the entry point, its value and
the distribution that declared it, not as a raw ImportError or AttributeError.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_entry_point"]


def load_entry_point(ep: Any, error: type[Exception] = ValueError, context: str = "") -> Any:
    """What ``ep`` names; ``error`` (with ``context`` in front) if it cannot be loaded."""
    try:
        return ep.load()
    except Exception as e:
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        raise error(f"{context}entry point {ep.name!r} of {ep.group} ({ep.value}) cannot be "
                    f"loaded: {type(e).__name__}: {e}; it is declared by {dist}: fix or "
                    "reinstall that distribution") from e
