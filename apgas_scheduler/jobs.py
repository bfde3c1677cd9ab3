"""Job files (TOML) and the job description the scheduler keeps.

A job file::

    name = "uts-small"
    command = ["python", "-m", "glb.apps", "uts", "--depth", "11", "--malleable"]
    class = "malleable"          # rigid | moldable | malleable | evolving
    min_nodes = 1                # or: nodes = 2 (rigid: exactly that many)
    max_nodes = 4
    walltime = 120               # seconds; past it the job is killed
    [env]
    APGAS_THREADS = "2"
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from pathlib import Path
from typing import Any, Mapping

from ._model import CLASSES

__all__ = ["JobSpec", "JobFileError", "load_job_file", "parse_job"]

_KEYS = {"name", "command", "class", "nodes", "min_nodes", "max_nodes", "walltime", "env", "cwd"}


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

    def to_dict(self) -> dict[str, Any]:
        """The TOML keys again, for the wire (``submit`` sends this)."""
        sizes = ({"nodes": self.min_nodes} if self.min_nodes == self.max_nodes
                 else {"min_nodes": self.min_nodes, "max_nodes": self.max_nodes})
        return {"name": self.name, "command": list(self.command), "class": self.cls, **sizes,
                "walltime": self.walltime, "env": dict(self.env), "cwd": self.cwd}


def load_job_file(path: str | Path) -> JobSpec:
    """Read and check a job file."""
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise JobFileError(f"{where}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise JobFileError(f"{where}: not valid TOML: {e}") from None
    spec = parse_job(data, where)
    cwd = Path(path).resolve().parent / spec.cwd  # relative to the job file
    if not cwd.is_dir():
        raise JobFileError(f"{where}: key 'cwd': no such directory {str(cwd)!r}")
    return dataclasses.replace(spec, cwd=str(cwd.resolve()))


def parse_job(data: Mapping[str, Any], where: str = "job") -> JobSpec:
    """Check a job description (a job file's table, or what ``submit`` sent)."""
    def bad(key: str, problem: str) -> JobFileError:
        return JobFileError(f"{where}: key {key!r}: {problem}")

    if not isinstance(data, Mapping):
        raise JobFileError(f"{where}: a job is a table of keys, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown key; known keys: {sorted(_KEYS)}")
    for key in ("name", "command", "class", "walltime"):
        if key not in data:
            raise JobFileError(f"{where}: key {key!r} is missing")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise bad("name", f"must be a non-empty string, got {name!r}")
    command = data["command"]
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as e:
            raise bad("command", f"cannot split {command!r}: {e}") from None
    if (not isinstance(command, list) or not command
            or not all(isinstance(c, str) and c for c in command)):
        raise bad("command", f"must be a string or a non-empty list of strings, got {data['command']!r}")
    cls = data["class"]
    if cls not in CLASSES:
        raise bad("class", f"must be one of {list(CLASSES)}, got {cls!r}")
    min_nodes, max_nodes = _sizes(data, cls, bad)
    walltime = data["walltime"]
    if isinstance(walltime, bool) or not isinstance(walltime, (int, float)) or not walltime > 0:
        raise bad("walltime", f"must be a positive number of seconds, got {walltime!r}")
    env = data.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                               and not isinstance(v, bool) for k, v in env.items()):
        raise bad("env", f"must be a table of NAME = \"value\", got {env!r}")
    cwd = data.get("cwd", "")
    if not isinstance(cwd, str):
        raise bad("cwd", f"must be a directory path, got {cwd!r}")
    return JobSpec(name.strip(), tuple(command), cls, min_nodes, max_nodes, float(walltime),
                   tuple(sorted((k, str(v)) for k, v in env.items())), cwd)


def _sizes(data: Mapping[str, Any], cls: str, bad) -> tuple[int, int]:
    def count(key: str) -> int:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(key, f"must be a whole number >= 1, got {value!r}")
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
