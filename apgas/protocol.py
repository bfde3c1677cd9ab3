"""The malleability and evolving line protocol, built and parsed in one place.

``docs/protocol.md`` describes it; the ElasticJobScheduler of malleable APGAS
for Java speaks the same lines. A job sends its scheduler one line per
connection, ``<message>:<ip>[:<job id>]`` (its communicator adds the address):
:data:`READY`, :data:`NOT_MALLEABLE`, :func:`timing` lines, and the evolving
asks :func:`request`, :func:`release` and :func:`check`. A scheduler sends a
job one order per connection (:func:`grow`, :func:`shrink`, :data:`STATUS`,
:func:`refuse`) and reads the reply lines (``apgas.order.send_order``).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["READY", "NOT_MALLEABLE", "STATUS", "JobMessage", "parse_message", "timing",
           "request", "release", "check", "parse_check", "grow", "shrink", "refuse"]

READY = "APGAS-Ready"
"""The job registered a handler: orders are welcome from now on."""
NOT_MALLEABLE = "APGAS-NotMalleable"
"""The job disabled its handler: it takes no more orders."""
STATUS = "status"
"""The order that asks a job for its state and places."""

_EVOLVING = "Evolving"


# -- job -> scheduler -------------------------------------------------------------------

def timing(event: str, n: int, ns: int) -> str:
    """A timing line, e.g. ``growTimeAPGAS;2;165802561``."""
    return f"{event}TimeAPGAS;{n};{ns}"


def request(n: int) -> str:
    """Ask for ``n`` more places (answered ``ok <n>`` or ``error ...``)."""
    return f"{_EVOLVING};Request;{n}"


def release(host: str) -> str:
    """The job stopped its place on ``host`` itself (no answer)."""
    return f"{_EVOLVING};Release;{host}"


def check(low: int, high: int, preferred: int | None, factor: int) -> str:
    """Ask whether to change size within ``low..high`` (answered ``expand k``,
    ``shrink k``, ``none`` or ``error ...``)."""
    return f"{_EVOLVING};Check;{low};{high};{preferred or 0};{factor}"


@dataclasses.dataclass(frozen=True)
class JobMessage:
    """One line a job sent: the message and the sender part after the first ``:``."""

    text: str
    sender: str

    @property
    def kind(self) -> str:
        """``ready``, ``not_malleable``, ``request``, ``check``, ``release``, ``timing`` or ``other``."""
        if self.text == READY:
            return "ready"
        if self.text == NOT_MALLEABLE:
            return "not_malleable"
        name, *rest = self.text.split(";")
        if name == _EVOLVING and rest and rest[0] in ("Request", "Check", "Release"):
            return rest[0].lower()
        if name.endswith("TimeAPGAS"):
            return "timing"
        return "other"

    @property
    def fields(self) -> list[str]:
        """What follows the name (and, for an evolving message, its verb)."""
        parts = self.text.split(";")
        return parts[2:] if parts[0] == _EVOLVING else parts[1:]

    @property
    def is_ask(self) -> bool:
        """A request or a check: the job waits for a one-line answer."""
        return self.kind in ("request", "check")


def parse_message(line: str) -> JobMessage:
    """Split ``<message>:<ip>[:<job id>]``."""
    text, _, sender = line.partition(":")
    return JobMessage(text, sender)


def parse_check(message: JobMessage) -> tuple[int, int, int, int]:
    """min, max, preferred, factor of a check; ValueError says what is wrong."""
    fields = message.fields
    if len(fields) != 4:
        raise ValueError(f"expected <min>;<max>;<preferred>;<factor>, got {len(fields)} field(s)")
    values = []
    for name, field in zip(("min", "max", "preferred", "factor"), fields):
        if not re.fullmatch(r"[0-9]+", field):
            raise ValueError(f"{name} {field!r} is not a whole number")
        values.append(int(field))
    low, high, preferred, factor = values
    if low < 1:
        raise ValueError(f"min must be at least 1, got {low}")
    if high < low:
        raise ValueError(f"max {high} is below min {low}")
    if preferred and not low <= preferred <= high:
        raise ValueError(f"preferred {preferred} is outside [{low}, {high}] (0: none)")
    if factor < 1:
        raise ValueError(f"factor must be at least 1, got {factor}")
    return low, high, preferred, factor


# -- scheduler -> job -------------------------------------------------------------------

def grow(hosts: list[str]) -> str:
    """Add one place on each of ``hosts``."""
    return f"grow {len(hosts)} {' '.join(hosts)}"


def shrink(n: int) -> str:
    """Remove ``n`` places (the reply names their hosts)."""
    return f"shrink {n}"


def refuse(n: int, reason: str) -> str:
    """``n`` of the places the job asked for will not come."""
    return f"refuse {n} {reason}"
