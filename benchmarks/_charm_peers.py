"""Charm4py beside the runtime: the Charm4py side of ``benchmarks.micro`` (issue 54).

Charm4py programs start under its launcher, not as a library: each repeat runs
``benchmarks/_charm_program.py`` as ``python -m charmrun.start +p2 ... ++local ++quiet``
(the wheel's ``charmrun`` with its netlrts build: 2 processes, one PE each, started
locally without ssh) in a process group of its own, and reads the one JSON line it
prints: the median and p99 seconds of the ``ret=True`` calls of a chare's method on the
other PE, and the rate of one-way no-op calls dealt to both PEs until quiescence.

Charm4py is optional (the ``bench`` extra). When it is not importable, or its program
fails, prints nothing or outlives :data:`TIMEOUT_S`, a result says
``skipped: <reason>`` instead of raising, and :class:`MicroCharm` stops trying for the
rest of the run. Whatever the outcome, the program's process group is killed if anything
of it is left.

Two things to know when reading its figures: a Charm++ PE that waits polls the network
instead of sleeping, so both PEs keep a core busy while they run (round trips gain,
anything else on the 2 cores loses); and the netlrts build listens on all interfaces
(TCP and UDP, ephemeral ports) for as long as the program runs, a second or so per
repeat; no charmrun option found binds it to the loopback.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import Samples, add_sample, tagged_results

log = logging.getLogger("benchmarks.charm")

PROGRAM = Path(__file__).resolve().parent / "_charm_program.py"
TAG = "CHARM4PY-RESULT "   # as in _charm_program.TAG (that module imports charm4py)
PES = 2
TIMEOUT_S = 120.0
LEFTOVER_WAIT_S = 5.0
INSTALL_HINT = '.venv/bin/pip install -e ".[bench]" (charm4py>=1.1)'


def unavailable() -> str | None:
    """Why Charm4py cannot be run here ("skipped: ..."), or None."""
    for module in ("charm4py", "charmrun"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError) as e:
            return f"skipped: {module} is not importable ({e}); {INSTALL_HINT}"
        if not found:
            return f"skipped: {module} is not importable; {INSTALL_HINT}"
    return None


def command(calls: int, tasks: int, warmup: int) -> list[str]:
    """The command line of one run of the program."""
    return [sys.executable, "-m", "charmrun.start", f"+p{PES}", str(PROGRAM), str(calls), str(tasks), str(warmup),
            "++local", "++quiet"]


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left to init are not counted)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(group) == pgid and state not in ("Z", "X"):
                members.append(int(entry))
    return sorted(members)


def _end_group(pgid: int, wait: float = LEFTOVER_WAIT_S) -> None:
    """Give what is left of process group ``pgid`` (charmrun's node programs) ``wait`` s to
    end, then kill it, by the group's id."""
    end = time.monotonic() + wait
    while (left := group_members(pgid)) and time.monotonic() < end:
        time.sleep(0.05)
    if left:
        log.warning("charm4py: processes %s of group %d outlived charmrun: killed", left, pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _reason(what: str, out: str, err: str) -> str:
    last = next((line.strip() for line in reversed((err + "\n" + out).splitlines()) if line.strip()), "")
    return f"skipped: {what}" + (f" ({last[:200]})" if last else "")


def run_program(calls: int, tasks: int, warmup: int, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """One run of the Charm4py program: ``{"skipped": None, "median_s": m, "p99_s": p, "tasks_s": rate, ...}``,
    or ``{"skipped": "skipped: <reason>"}`` if Charm4py is missing, fails or times out."""
    if reason := unavailable():
        return {"skipped": reason}
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(command(calls, tasks, warmup), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as e:
        return {"skipped": f"skipped: charmrun did not start ({e})"}
    try:
        found, out, err = tagged_results(proc, TAG, timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"skipped: the Charm4py program gave no result in {timeout:g} s (killed)"}
    finally:
        _end_group(proc.pid)
    if proc.returncode != 0 or not found:
        return {"skipped": _reason(f"the Charm4py program exited with {proc.returncode} and no result"
                                   if not found else f"the Charm4py program exited with {proc.returncode}",
                                   out, err)}
    return {"skipped": None, **found[-1], "seconds": time.perf_counter() - start}


def add_samples(samples: Samples, result: dict[str, Any]) -> None:
    """Add one run's ``charm_median_us``, ``charm_p99_us`` and ``charm2_tasks_s``."""
    add_sample(samples, "charm_median_us", result["median_s"] * 1e6)
    add_sample(samples, "charm_p99_us", result["p99_s"] * 1e6)
    add_sample(samples, f"charm{PES}_tasks_s", result["tasks_s"])


class MicroCharm:
    """Charm4py's figures of the micro run, one program run per repeat; after a first
    failure (or without Charm4py) :attr:`skipped` says why, and the later repeats do nothing."""

    def __init__(self, warmup_calls: int, timeout: float = TIMEOUT_S) -> None:
        self.warmup_calls, self.timeout = warmup_calls, timeout
        self.skipped: str | None = unavailable()
        self.runs: list[float] = []   # seconds of each program run, start-up included

    def repeat(self, calls: int, tasks: int, samples: Samples) -> None:
        """Run the program once and add its samples (nothing once skipped)."""
        if self.skipped:
            return
        result = run_program(calls, tasks, self.warmup_calls, self.timeout)
        if result["skipped"]:
            self.skipped = result["skipped"]
            log.warning("charm4py: %s", self.skipped)
            return
        add_samples(samples, result)
        self.runs.append(result["seconds"])
