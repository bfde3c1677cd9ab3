"""Where places may run: host files, ``APGAS_HOSTS`` and Slurm's node lists."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["read_hostfile", "expand_hostlist", "expand_tasks_per_node", "slurm_hosts"]


class HostSpecError(ValueError):
    """A host file or node list that cannot be read; the message names the culprit."""


def read_hostfile(path: str | Path) -> tuple[str, ...]:
    """Read a host file: one host per line, repeated ``k`` times for ``k`` slots.

    ``host slots=k`` (Open MPI) and ``host:k`` (MPICH) say the same in one line;
    ``#`` starts a comment.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise HostSpecError(f"cannot read host file {str(path)!r}: {e.strerror or e}") from None
    hosts: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([^\s:=]+)(?::(\d+)|\s+slots\s*=\s*(\d+))?", line)
        if match is None:
            raise HostSpecError(f"host file {str(path)!r} line {number}: expected 'host', "
                                f"'host:slots' or 'host slots=N', got {raw.strip()!r}")
        slots = int(match.group(2) or match.group(3) or 1)
        if slots < 1:
            raise HostSpecError(f"host file {str(path)!r} line {number}: slots must be >= 1, "
                                f"got {raw.strip()!r}")
        hosts += [match.group(1)] * slots
    if not hosts:
        raise HostSpecError(f"host file {str(path)!r} names no host")
    return tuple(hosts)


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm host list such as ``node[1-3,07],login`` (zero padding kept)."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", spec):
        hosts += _expand_one(part, spec)
    if not hosts:
        raise HostSpecError(f"empty Slurm host list {spec!r}")
    return hosts


def _expand_one(part: str, spec: str) -> list[str]:
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", part)
    if match is None:
        return [part]
    prefix, ranges, rest = match.groups()
    tails = _expand_one(rest, spec) if rest else [""]
    names = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise HostSpecError(f"bad range {item!r} in Slurm host list {spec!r}")
        for n in range(int(low), int(high or low) + 1):
            names += [f"{prefix}{n:0{len(low)}d}{tail}" for tail in tails]
    return names


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` such as ``2(x3),1`` into ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise HostSpecError(f"bad SLURM_TASKS_PER_NODE {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_hosts(nodelist: str, tasks_per_node: str = "") -> tuple[str, ...]:
    """The allocation's hosts, each repeated once per task Slurm gave it."""
    nodes = expand_hostlist(nodelist)
    counts = expand_tasks_per_node(tasks_per_node) if tasks_per_node else [1] * len(nodes)
    if len(counts) != len(nodes):
        counts = [1] * len(nodes)
    return tuple(node for node, k in zip(nodes, counts) for _ in range(max(1, k)))
