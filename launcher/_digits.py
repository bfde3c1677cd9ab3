"""The one parser of numbers written in text, in the lowest layer (``launcher``
imports nothing of ``apgas``; ``apgas.protocol.ascii_int`` is this function).

Every number read from text (a job id in a job name, a port, a signature's time,
an environment variable, a /proc field) accepts ASCII digits only.
``str.isdigit`` is True for ``'²'`` and ``'٣'``: ``int('²')`` then raises, so a
check-then-convert turns one odd name into an exception in whoever reads it (a
single job named ``apgas-companion-²`` stopped every pass of the Slurm
controller); and ``int`` itself takes ``' 7'``, ``'+7'``, ``'1_0'`` and ``'٣'``.
"""

from __future__ import annotations

import re

__all__ = ["ascii_int"]

_DIGITS = re.compile(r"[0-9]+")


def ascii_int(text: str, max_digits: int = 64) -> int | None:
    """The number ``text`` writes in 1 to ``max_digits`` ASCII digits, else None
    (a sign, a space, an underscore or any other digit make it no number)."""
    if not isinstance(text, str) or len(text) > max_digits or not _DIGITS.fullmatch(text):
        return None
    return int(text)
