"""Job files (TOML) and the job description the scheduler keeps.

A job file::

    name = "uts-small"
    command = ["python", "-m", "glb.apps", "uts", "--depth", "11", "--malleable"]
    class = "malleable"          # rigid | moldable | malleable | evolving
    min_nodes = 1                # or: nodes = 2 (rigid: exactly that many)
    max_nodes = 4
    walltime = 120               # seconds; past it the job is killed
    requeue = 2                  # back to the queue at most twice if place 0 or a node is lost
    [env]
    APGAS_THREADS = "2"
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import tomllib
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._model import CLASSES

__all__ = ["JobSpec", "JobFileError", "load_job_file", "parse_job", "MAX_NODES", "MAX_WALLTIME",
           "MAX_NAME", "MAX_COMMAND", "MAX_ENV", "MAX_CWD", "MAX_REQUEUE", "shown"]

_KEYS = {"name", "command", "class", "nodes", "min_nodes", "max_nodes", "walltime", "env", "cwd",
         "protocol", "requeue"}
PROTOCOLS = ("signed", "plain")
MAX_NODES = 1_000_000
"""No job asks for more nodes than this (``nodes``, ``min_nodes``, ``max_nodes``)."""
MAX_WALLTIME = 366 * 24 * 3600.0
"""No job runs longer than a year (``walltime``, in seconds)."""
MAX_NAME = 200
"""Characters in a job's name: it is logged and shown to every user (``status``)."""
MAX_COMMAND = 64 * 1024
"""Characters in a job's command, its words together."""
MAX_ENV = 64 * 1024
"""Characters in a job's ``env``, its names and values together."""
MAX_CWD = 4096
"""Characters in a job's ``cwd`` (Linux's PATH_MAX)."""
MAX_REQUEUE = 100
"""Times a job may go back to the queue (``requeue``; docs/scheduler.md, "Requeue")."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for an error message about
    a value that may be huge (a 1000-digit number, a megabyte of text)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int past the digit limit, a deep structure
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


class JobFileError(ValueError):
    """A job description that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    name: str
    command: tuple[str, ...]
    cls: str
    min_nodes: int
    max_nodes: int
    walltime: float
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    #: "signed" (apgas.auth), or "plain" for a job speaking the ElasticJobScheduler's
    #: unsigned lines, which a scheduler accepts only with --allow-plain-jobs
    protocol: str = "signed"
    #: how many times it may go back to the queue (its place 0 or a node lost, or asked)
    requeue: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The TOML keys again, for the wire (``submit`` sends this)."""
        sizes = ({"nodes": self.min_nodes} if self.min_nodes == self.max_nodes
                 else {"min_nodes": self.min_nodes, "max_nodes": self.max_nodes})
        return {"name": self.name, "command": list(self.command), "class": self.cls, **sizes,
                "walltime": self.walltime, "env": dict(self.env), "cwd": self.cwd,
                "protocol": self.protocol, **({"requeue": self.requeue} if self.requeue else {})}


def load_job_file(path: str | Path) -> JobSpec:
    """Read and check a job file."""
    where = _plain(str(path))
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise JobFileError(f"{where}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise JobFileError(f"{where}: not valid TOML: {e}") from None
    spec = parse_job(data, str(path))
    cwd = Path(path).resolve().parent / spec.cwd  # relative to the job file
    if not cwd.is_dir():
        raise JobFileError(f"{where}: key 'cwd': no such directory {str(cwd)!r}")
    return dataclasses.replace(spec, cwd=str(cwd.resolve()))


def parse_job(data: object, where: str = "job", *, stored: bool = False) -> JobSpec:
    """Check a job description (a job file's table, or what ``submit`` sent: anything,
    refused with the reason unless it is a table of the known keys).

    Its texts are bounded: the name to ``MAX_NAME`` characters, the command to
    ``MAX_COMMAND``, ``env`` to ``MAX_ENV``, ``cwd`` to ``MAX_CWD``. The name,
    which the scheduler logs and shows to every user, must be printable
    (``str.isprintable``: no control character such as a newline, a tab, ESC,
    a C1 control or DEL, no format character, no lone surrogate): such a name
    is refused, not escaped, so that the name everyone sees is the one given.

    ``stored``: a job the scheduler's state holds, which an older version may
    have taken with any name: its name is escaped and cut instead
    (:func:`apgas.serving.loggable`), and its other texts are not bounded."""
    where = _plain(where)

    def bad(key: str, problem: str) -> JobFileError:
        return JobFileError(f"{where}: key {key!r}: {problem}")

    if not isinstance(data, Mapping):
        raise JobFileError(f"{where}: a job is a table of keys, got {type(data).__name__}")
    unknown = sorted((k for k in data if k not in _KEYS), key=str)
    if unknown:  # all of them at once: a user fixes a file in one go
        named = ", ".join(shown(k) for k in unknown[:20]) + (
            f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
        raise JobFileError(f"{where}: key{'s' if len(unknown) > 1 else ''} {named}: unknown "
                           f"key{'s' if len(unknown) > 1 else ''}; known keys: {sorted(_KEYS)}")
    for key in ("name", "command", "class", "walltime"):
        if key not in data:
            raise JobFileError(f"{where}: key {key!r} is missing")
    name = data["name"]
    if not isinstance(name, str) or not name.strip() or ("\0" in name and not stored):
        raise bad("name", f"must be a non-empty string, got {shown(name)}")
    if stored:
        name = _stored_name(name)
    if len(name) > MAX_NAME:
        raise bad("name", f"is {len(name)} characters long; at most {MAX_NAME} are taken")
    if not name.isprintable():
        at = next(i for i, c in enumerate(name) if not c.isprintable())
        raise bad("name", f"must be printable text: character {at + 1} is "
                          f"{_character(name[at])}; got {shown(name)}")
    command = data["command"]
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as e:
            raise bad("command", f"cannot split {shown(command)}: {e}") from None
    if (not isinstance(command, list) or not command
            or not all(isinstance(c, str) and c and "\0" not in c for c in command)):
        raise bad("command", f"must be a string or a non-empty list of strings, "
                             f"got {shown(data['command'])}")
    if not stored:
        _bounded(bad, "command", sum(map(len, command)), MAX_COMMAND)
    cls = data["class"]
    if not isinstance(cls, str) or cls not in CLASSES:
        raise bad("class", f"must be one of {list(CLASSES)}, got {shown(cls)}")
    min_nodes, max_nodes = _sizes(data, cls, bad)
    walltime = _walltime(data["walltime"], bad)
    env = _env(data.get("env", {}), bad)
    cwd = data.get("cwd", "")
    if not isinstance(cwd, str) or "\0" in cwd:
        raise bad("cwd", f"must be a directory path, got {shown(cwd)}")
    if not stored:
        _bounded(bad, "env", sum(len(k) + len(v) for k, v in env), MAX_ENV)
        _bounded(bad, "cwd", len(cwd), MAX_CWD)
    protocol = data.get("protocol", "signed")
    if protocol not in PROTOCOLS:
        raise bad("protocol", f"must be one of {list(PROTOCOLS)}, got {shown(protocol)}")
    requeue = data.get("requeue", 0)
    if isinstance(requeue, bool) or not isinstance(requeue, int) or not 0 <= requeue <= MAX_REQUEUE:
        raise bad("requeue", f"must be a whole number from 0 to {MAX_REQUEUE} (how many times "
                             f"the job may go back to the queue), got {shown(requeue)}")
    return JobSpec(name.strip(), tuple(command), cls, min_nodes, max_nodes, walltime, env, cwd,
                   protocol, requeue)


def _plain(text: str, limit: int = MAX_NAME) -> str:
    """``text`` (a client's) as a message may show it: itself if printable and at
    most ``limit`` characters long, else escaped and cut (``loggable``)."""
    if text.isprintable() and len(text) <= limit:
        return text
    from apgas.serving import loggable

    return loggable(text, limit)


def _stored_name(name: str) -> str:
    """A stored job's name as the rules of :func:`parse_job` take it: escaped, and cut
    to ``MAX_NAME`` (the same again for a name that already is)."""
    name = _plain(name, len(name))
    return name if len(name) <= MAX_NAME else f"{name[:MAX_NAME - 3]}..."


def _character(c: str) -> str:
    """``U+001B, a control character``: what a character that is not printable is."""
    kinds = {"Cc": "a control character", "Cs": "a lone surrogate", "Cf": "a format character",
             "Co": "a private-use character", "Cn": "not an assigned character",
             "Zl": "a line separator", "Zp": "a paragraph separator",
             "Zs": "a space other than ' '"}
    return f"U+{ord(c):04X}, {kinds.get(unicodedata.category(c), 'not printable')}"


def _bounded(bad, key: str, size: int, limit: int) -> None:
    if size > limit:
        raise bad(key, f"{size} characters in all; at most {limit} are taken")


def _walltime(value: Any, bad) -> float:
    """A finite number of seconds in (0, MAX_WALLTIME]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad("walltime", f"must be a positive number of seconds, got {shown(value)}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        seconds = math.inf
    if math.isnan(seconds) or seconds <= 0:
        raise bad("walltime", f"must be a positive number of seconds, got {shown(value)}")
    if seconds > MAX_WALLTIME:  # inf too
        raise bad("walltime", f"must be at most {MAX_WALLTIME:.0f} seconds (a year), "
                              f"got {shown(value)}")
    return seconds


def _env(env: Any, bad) -> tuple[tuple[str, str], ...]:
    """NAME = value pairs: names a process environment takes, values without NUL."""
    if not isinstance(env, Mapping):
        raise bad("env", f"must be a table of NAME = \"value\", got {shown(env)}")
    pairs = []
    for k, v in env.items():
        if not isinstance(k, str) or _ENV_NAME.fullmatch(k) is None:
            raise bad("env", f"{shown(k)} is not a variable name (letters, digits and _)")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise bad("env", f"must be a table of NAME = \"value\", got {k} = {shown(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise bad("env", f"{k} = {shown(v)} is not a finite number")
        try:
            text = str(v)
        except ValueError:  # an int past Python's digit limit
            raise bad("env", f"{k} = {shown(v)} is too long a number") from None
        if "\0" in text:
            raise bad("env", f"{k} = {shown(v)} contains a NUL character")
        if k == "APGAS_HOSTS":
            _env_hosts(text, bad)
        pairs.append((k, text))
    return tuple(sorted(pairs))


def _env_hosts(value: str, bad) -> None:
    from apgas.protocol import check_host

    for host in value.split(","):
        try:
            check_host(host.strip())
        except ValueError as e:
            raise bad("env", f"APGAS_HOSTS: {e}") from None


def _sizes(data: Mapping[str, Any], cls: str, bad) -> tuple[int, int]:
    def count(key: str) -> int:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(key, f"must be a whole number >= 1, got {shown(value)}")
        if value > MAX_NODES:
            raise bad(key, f"must be a whole number from 1 to {MAX_NODES}, got {shown(value)}")
        return value

    if "nodes" in data:
        if "min_nodes" in data or "max_nodes" in data:
            raise bad("nodes", "give nodes, or min_nodes and max_nodes, not both")
        n = count("nodes")
        return n, n
    if cls == "rigid":
        raise bad("nodes", "a rigid job needs nodes = N")
    for key in ("min_nodes", "max_nodes"):
        if key not in data:
            raise bad(key, f"is missing (a {cls} job needs min_nodes and max_nodes, or nodes)")
    low, high = count("min_nodes"), count("max_nodes")
    if low > high:
        raise bad("max_nodes", f"must be >= min_nodes ({low}), got {high}")
    return low, high
