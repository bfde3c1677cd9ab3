"""The place processes of a benchmark's run, seen from outside: find them under the
run's ``python -m glb.apps`` process (place 0, never listed), SIGKILL some at set
moments, and end the run's process group so nothing is left."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher._proctitle import serve_argv

__all__ = ["descendants", "place_processes", "kill_places", "track_group", "end_group",
           "kill_leftovers"]

log = logging.getLogger("benchmarks.places")

_groups: set[int] = set()          # process groups of runs not yet ended


def track_group(pgid: int) -> None:
    """Remember a run's process group, for :func:`kill_leftovers`."""
    _groups.add(pgid)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of ``pid`` from /proc, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()   # the name may hold spaces and parentheses
    return int(fields[1]), int(fields[2])


def _all_stats() -> dict[int, tuple[int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            out[int(name)] = st
    return out


def descendants(root: int) -> list[int]:
    """The living descendants of ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in _all_stats().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(found)


def place_processes(root: int) -> dict[int, int | None]:
    """The place processes below the ``glb.apps`` process ``root`` (place 0, never
    listed): pid -> place id, or None for a place whose command line does not say
    (a forked place without ``setproctitle`` has the fork template's). A place runs
    ``apgas._serve`` with its stdin a pipe from place 0; the template and its
    middle processes have ``/dev/null``."""
    places: dict[int, int | None] = {}
    for pid in descendants(root):
        try:
            argv = serve_argv(Path(f"/proc/{pid}/cmdline").read_bytes())
            stdin = os.readlink(f"/proc/{pid}/fd/0")
        except OSError:
            continue
        if argv is None or not stdin.startswith("pipe:") or pid == root:
            continue
        place = int(argv[argv.index("--place") + 1]) if "--place" in argv[:-1] else None
        if place != 0:
            places[pid] = place
    return places


def _group_members(pgid: int) -> list[int]:
    return [pid for pid, (_, group) in _all_stats().items() if group == pgid]


def end_group(proc: subprocess.Popen) -> list[int]:
    """Kill the run's process group; the members that outlived its leader, if any."""
    left = _group_members(proc.pid) if proc.poll() is not None else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait()
    _groups.discard(proc.pid)
    return left


def kill_leftovers() -> None:
    """Kill the process groups of runs that did not end (after an interruption)."""
    for pgid in list(_groups):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _groups.discard(pgid)


def kill_places(proc: subprocess.Popen, places: int, kills: list[float], rng: random.Random,
                 began: float) -> list[dict[str, Any]]:
    """Once all ``places`` - 1 place processes run, SIGKILL a random live one (never
    place 0) at each offset of ``kills`` (s); what was killed, and when."""
    deadline = time.monotonic() + 120
    while len(place_processes(proc.pid)) < places - 1:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.warning("the places never all ran (exit %s): no kill", proc.poll())
            return []
        time.sleep(0.05)
    ready = time.monotonic()
    killed: list[dict[str, Any]] = []
    for offset in sorted(kills):
        time.sleep(max(0.0, ready + offset - time.monotonic()))
        if proc.poll() is not None:
            log.warning("the run ended before the kill at %.2f s", offset)
            break
        live = sorted(set(place_processes(proc.pid)) - {k["pid"] for k in killed} - {proc.pid})
        if not live:
            break
        victim = rng.choice(live)
        assert victim != proc.pid   # place 0 is the glb.apps process: never killed
        os.kill(victim, signal.SIGKILL)
        killed.append({"pid": victim, "planned_s": offset, "at_s": time.monotonic() - ready})
    return [{**k, "places_ran_after_s": ready - began} for k in killed]
