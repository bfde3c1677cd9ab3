"""The malleability and evolving line protocol, built and parsed in one place.

``docs/protocol.md`` describes it; the ElasticJobScheduler of malleable APGAS
for Java speaks the same lines. A job sends its scheduler one line per
connection, ``<message>:<ip>[:<job id>]`` (its communicator adds the address):
:data:`READY` (or :func:`ready`, which names the job's order port),
:data:`NOT_MALLEABLE`, :func:`timing` lines, :func:`place_lost`, and the
evolving asks :func:`request`, :func:`release` and :func:`check`. A
scheduler sends a job one order per connection (:func:`grow`, :func:`shrink`, :data:`STATUS`,
:func:`refuse`) and reads the reply lines (``apgas.order.send_order``).
"""

from __future__ import annotations

import dataclasses
import re

from launcher._digits import ascii_int  # numbers in text: ASCII digits only
from launcher._hostnames import MAX_HOST as MAX_HOST  # the grammar lives in the lower layer
from launcher._hostnames import check_host

__all__ = ["READY", "NOT_MALLEABLE", "PLACE_LOST", "STATUS", "JobMessage", "parse_message",
           "ready", "ready_port", "ejs_knows", "timing", "place_lost", "parse_timing", "request", "release", "check",
           "parse_check", "grow", "shrink", "refuse", "Order", "parse_order", "check_host", "ascii_int",
           "status_reply", "grow_reply", "refuse_reply", "error_reply"]

READY = "APGAS-Ready"
"""The job registered a handler: orders are welcome from now on. The bare line
is the ElasticJobScheduler's; :func:`ready` adds the order port."""
NOT_MALLEABLE = "APGAS-NotMalleable"
"""The job disabled its handler: it takes no more orders."""
PLACE_LOST = "APGAS-PlaceLost"
"""The start of :func:`place_lost`."""
STATUS = "status"
"""The order that asks a job for its state and places."""

_EVOLVING = "Evolving"


# -- job -> scheduler -------------------------------------------------------------------

def ready(port: int | None = None) -> str:
    """The ready line: bare :data:`READY` (``port`` None), or ``APGAS-Ready;<port>``,
    which names the port the job listens on for orders (an extension). A job our
    scheduler starts with the signed protocol binds a port the kernel gives it
    and reports it so, signed: the scheduler sends orders to no other port
    (``docs/protocol.md``). Both are of kind ``ready``."""
    if port is None:
        return READY
    if not 0 < port < 65536:
        raise ValueError(f"a port is in 1..65535, got {port}")
    return f"{READY};{port}"


def ready_port(message: JobMessage) -> int | None:
    """The order port a ready message names (:func:`ready`); None for the bare line
    (or a message of another kind). ValueError if the field is not a port."""
    if message.kind != "ready" or message.text == READY:
        return None
    field = message.fields[0]
    if not re.fullmatch(r"[0-9]{1,5}", field) or not 0 < int(field) < 65536:
        raise ValueError(f"the ready line's port must be a number in 1..65535, got {field[:20]!r}")
    return int(field)


def timing(event: str, n: int, ns: int, source: str = "APGAS") -> str:
    """A timing line, e.g. ``growTimeAPGAS;2;165802561``; GLB's own phases say
    ``GLB`` (``preGrowTimeGLB``), as the Java GLB's do."""
    return f"{event}Time{source};{n};{ns}"


def place_lost(host: str) -> str:
    """Place 0 lost its place on ``host`` without an order: its process died or it
    fell silent (heartbeats). No answer; the scheduler takes the node from the job
    (ours marks it down, since it may be broken)."""
    return f"{PLACE_LOST};{host}"


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


def ejs_knows(message: str) -> bool:
    """Whether the ElasticJobScheduler knows ``message``: the bare ready line, timing
    lines, requests and releases. It answers anything else with an error line,
    so a job sends it nothing else (``docs/protocol.md``); a ready line with a
    port is not its own either."""
    parsed = parse_message(message)
    if parsed.kind == "ready":
        return parsed.text == READY
    return parsed.kind in ("timing", "request", "release")


@dataclasses.dataclass(frozen=True)
class JobMessage:
    """One line a job sent: the message and the sender part after the first ``:``."""

    text: str
    sender: str

    @property
    def kind(self) -> str:
        """``ready`` (with or without a port), ``not_malleable``, ``place_lost``,
        ``request``, ``check``, ``release``, ``timing`` or ``other``."""
        if self.text == NOT_MALLEABLE:
            return "not_malleable"
        name, *rest = self.text.split(";")
        if name == READY and len(rest) <= 1:  # APGAS-Ready, or APGAS-Ready;<port>
            return "ready"
        if name == PLACE_LOST:
            return "place_lost"
        if name == _EVOLVING and rest and rest[0] in ("Request", "Check", "Release"):
            return rest[0].lower()
        if name.endswith(("TimeAPGAS", "TimeGLB")):
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


def parse_timing(message: JobMessage) -> tuple[str, int, int] | None:
    """The name, place count and nanoseconds of a :func:`timing` line; None if the
    message is none, or its fields are not two whole numbers (of at most 19 digits)."""
    fields = message.fields
    if message.kind != "timing" or len(fields) != 2 or not all(
            re.fullmatch(r"[0-9]{1,19}", f) for f in fields):
        return None
    return message.text.split(";")[0], int(fields[0]), int(fields[1])


def parse_check(message: JobMessage) -> tuple[int, int, int, int]:
    """min, max, preferred, factor of a check; ValueError says what is wrong."""
    fields = message.fields
    if len(fields) != 4:
        raise ValueError(f"expected <min>;<max>;<preferred>;<factor>, got {len(fields)} field(s)")
    values = []
    for name, field in zip(("min", "max", "preferred", "factor"), fields, strict=True):
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


@dataclasses.dataclass(frozen=True)
class Order:
    """One order a job received: ``verb`` and its count, hosts (grow) or reason (refuse)."""

    verb: str
    n: int = 0
    hosts: tuple[str, ...] = ()
    reason: str = ""


_VERBS = "grow, shrink, status or refuse"


def parse_order(line: str) -> Order:
    """The order on ``line``; ValueError says what is wrong, with the words given."""
    words = line.split()
    if not words:
        raise ValueError(f"empty order; expected {_VERBS}")
    verb, args = words[0], words[1:]
    if verb == STATUS:
        if args:
            raise ValueError(f"status takes no arguments, got {args}")
        return Order(verb)
    if verb not in ("grow", "shrink", "refuse"):
        raise ValueError(f"unknown order {verb!r}; expected {_VERBS}")
    if not args:
        raise ValueError(f"{verb} needs a count")
    n = _positive(args[0])
    if verb == "refuse":
        return Order(verb, n, reason=" ".join(args[1:]) or "no reason given")
    if verb == "shrink":
        if len(args) != 1:
            raise ValueError(f"shrink takes one count, got extra words {args[1:]}")
        return Order(verb, n)
    try:
        hosts = tuple(check_host(host) for host in args[1:])
    except ValueError as e:
        raise ValueError(f"grow: {e}") from None
    return Order(verb, n, hosts=hosts)


def _positive(word: str) -> int:
    n = ascii_int(word)
    if n is None or n < 1:
        raise ValueError(f"the count must be a positive integer, got {word!r}")
    return n


# -- the job's replies ------------------------------------------------------------------

def status_reply(state: str, places: list[tuple[int, str]]) -> list[str]:
    """``status <state> <count>``, then ``place <id> <host>`` per place."""
    return [f"status {state} {len(places)}"] + [f"place {pid} {host}" for pid, host in places]


def grow_reply(n: int, place_ids: list[int]) -> str:
    return f"ok grow {n} places {' '.join(str(p) for p in place_ids)}"


def refuse_reply(n: int) -> str:
    return f"ok refuse {n}"


def error_reply(reason: str) -> str:
    """An error reply is one line: a reason of several lines is joined with ``" | "``."""
    return "error " + " | ".join(part.strip() for part in reason.splitlines() if part.strip())
