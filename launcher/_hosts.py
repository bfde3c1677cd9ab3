"""Where places may run: host files, ``APGAS_HOSTS`` and Slurm's node lists."""

from __future__ import annotations

import re
from pathlib import Path

from ._hostnames import check_host

__all__ = ["read_hostfile", "expand_hostlist", "compress_hostlist", "expand_tasks_per_node", "slurm_hosts",
           "check_hosts", "MAX_HOSTS"]

MAX_HOSTS = 100_000
"""At most this many hosts (slots counted) from one host file, node list or task count."""


class HostSpecError(ValueError):
    """A host file or node list that cannot be read; the message names the culprit."""


def check_hosts(names: list[str] | tuple[str, ...], where: str) -> None:
    """HostSpecError naming ``where`` and the first name that is no host name
    (:func:`check_host`: one that starts with ``-`` would reach ssh as an option)."""
    for name in names:
        try:
            check_host(name)
        except ValueError as e:
            raise HostSpecError(f"{where}: {e}") from None


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
        where = f"host file {str(path)!r} line {number}"
        check_hosts([re.sub(r":[0-9]+$", "", line.split()[0])], where)  # before the shape: -o...=
        match = re.fullmatch(r"([^\s:=]+)(?::(\d+)|\s+slots\s*=\s*(\d+))?", line)
        if match is None:
            raise HostSpecError(f"host file {str(path)!r} line {number}: expected 'host', "
                                f"'host:slots' or 'host slots=N', got {raw.strip()!r}")
        slots = int(match.group(2) or match.group(3) or 1)
        if slots < 1:
            raise HostSpecError(f"host file {str(path)!r} line {number}: slots must be >= 1, "
                                f"got {raw.strip()!r}")
        if len(hosts) + slots > MAX_HOSTS:
            raise HostSpecError(f"host file {str(path)!r} line {number}: more than {MAX_HOSTS} "
                                "slots in all")
        hosts += [match.group(1)] * slots
    if not hosts:
        raise HostSpecError(f"host file {str(path)!r} names no host")
    return tuple(hosts)


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm host list such as ``node[1-3,07],login`` (zero padding kept)."""
    _check_brackets(spec)
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", spec):
        hosts += _expand_one(part, spec, MAX_HOSTS - len(hosts))
    if not hosts:
        raise HostSpecError(f"empty Slurm host list {_cut(spec)}")
    check_hosts(hosts, f"Slurm host list {_cut(spec)}")
    return hosts


def compress_hostlist(names: list[str]) -> str:
    """``node0,node1,node2,gpu`` as ``node[0-2],gpu``: runs of numbered names shortened,
    in their order; :func:`expand_hostlist` gives the names back."""
    runs: list[tuple[str, int, int] | str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(0|[1-9][0-9]*)", name)
        last = runs[-1] if runs else None
        if m and isinstance(last, tuple) and last[0] == m[1] and last[2] + 1 == int(m[2]):
            runs[-1] = (last[0], last[1], int(m[2]))
        else:
            runs.append((m[1], int(m[2]), int(m[2])) if m else name)
    return ",".join(r if isinstance(r, str) else f"{r[0]}{r[1]}" if r[1] == r[2]
                    else f"{r[0]}[{r[1]}-{r[2]}]" for r in runs)


def _cut(spec: str, limit: int = 60) -> str:
    text = repr(spec)
    return text if len(text) <= limit else f"{text[:limit]}...({len(spec)} chars)"


def _check_brackets(spec: str) -> None:
    """HostSpecError unless every ``[`` is closed by a ``]`` before the next ``[`` (Slurm
    does not nest them): ``node[`` would otherwise read as a host named ``node``."""
    opened = False
    for char in spec:
        if char == "[" and opened or char == "]" and not opened:
            raise HostSpecError(f"unbalanced {char!r} in Slurm host list {_cut(spec)}")
        if char in "[]":
            opened = char == "["
    if opened:
        raise HostSpecError(f"unclosed '[' in Slurm host list {_cut(spec)}")


def _too_many(spec: str) -> HostSpecError:
    return HostSpecError(f"Slurm host list {_cut(spec)} names more than {MAX_HOSTS} hosts")


def _expand_one(part: str, spec: str, room: int) -> list[str]:
    """The names of one part, at most ``room`` of them (else HostSpecError)."""
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", part)
    if match is None:
        if room < 1:
            raise _too_many(spec)
        return [part]
    prefix, ranges, rest = match.groups()
    tails = _expand_one(rest, spec, room) if rest else [""]
    names: list[str] = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not re.fullmatch(r"[0-9]{1,9}", low) or (high and not re.fullmatch(r"[0-9]{1,9}", high)):
            raise HostSpecError(f"bad range {_cut(item)} in Slurm host list {_cut(spec)}")
        count = (int(high or low) - int(low) + 1) * len(tails)
        if len(names) + max(count, 0) > room:
            raise _too_many(spec)
        for n in range(int(low), int(high or low) + 1):
            names += [f"{prefix}{n:0{len(low)}d}{tail}" for tail in tails]
    return names


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` such as ``2(x3),1`` into ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"([0-9]{1,9})(?:\(x([0-9]{1,9})\))?", item.strip())
        if match is None:
            raise HostSpecError(f"bad SLURM_TASKS_PER_NODE {_cut(spec)}")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise HostSpecError(f"SLURM_TASKS_PER_NODE {_cut(spec)} names more than {MAX_HOSTS} nodes")
        counts += [int(match.group(1))] * repeat
    return counts


def slurm_hosts(nodelist: str, tasks_per_node: str = "") -> tuple[str, ...]:
    """The allocation's hosts, each repeated once per task Slurm gave it."""
    nodes = expand_hostlist(nodelist)
    counts = expand_tasks_per_node(tasks_per_node) if tasks_per_node else [1] * len(nodes)
    if len(counts) != len(nodes):
        counts = [1] * len(nodes)
    if sum(max(1, k) for k in counts) > MAX_HOSTS:
        raise HostSpecError(f"SLURM_TASKS_PER_NODE {_cut(tasks_per_node)} gives more than "
                            f"{MAX_HOSTS} tasks")
    return tuple(node for node, k in zip(nodes, counts, strict=True) for _ in range(max(1, k)))
