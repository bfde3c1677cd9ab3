"""Log lines prefixed with the place id, at the level of ``APGAS_LOG_LEVEL``."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]

_LOGGERS = ("apgas", "glb", "launcher")
_handler: logging.Handler | None = None


def setup_logging(place_id: int, level: str) -> None:
    """(Re)install the place-prefixed stderr handler on the project's loggers."""
    global _handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [place {place_id}] %(levelname)s %(name)s: %(message)s"))
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _handler is not None:
            logger.removeHandler(_handler)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    _handler = handler
