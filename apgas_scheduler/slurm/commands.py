"""Slurm's commands as functions: what the slurm communicator asks Slurm and tells it.

Every call runs one client command (``scontrol``, ``salloc``, ``scancel``,
``squeue``, ``sinfo``) with a timeout, and fails with :class:`SlurmError`
carrying Slurm's own words. The resize mechanism is the one of the DMR
paper's Slurm plug-in (Iserte et al.), done with plain commands:

- grow: an allocation of ``n`` nodes that depends on the job
  (``salloc --no-shell --dependency=expand:<job>``, no step, or Slurm refuses
  to hand its nodes over), then ``scontrol update JobId=<it> NumNodes=0``,
  ``scancel <it>`` and ``scontrol update JobId=<job> NumNodes=ALL``;
- shrink: ``scontrol update JobId=<job> NodeList=<the nodes kept>``.

An update may answer "Job update not available right now, the DB index is
being set, try again in a bit" while accounting catches up; it is retried.
(With ``AccountingStorageType=accounting_storage/none`` it never stops
answering that after a job's first resize: Slurm needs slurmdbd for this.)

Run inside the job, ``scontrol update`` writes ``slurm_job_<id>_resize.sh``
into its working directory: the job's new ``SLURM_*`` node variables, which
``srun`` trusts. Updates run in a directory of their own, and
:func:`update_job` returns what that script sets, so the program's
environment follows the job (and the user's directory gets no scripts).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
import subprocess
import tempfile
import time
from pathlib import Path

from apgas.errors import ApgasError
from apgas.protocol import ascii_int
from launcher import expand_hostlist

__all__ = ["SlurmError", "JobInfo", "PartitionView", "show_job", "job_text", "set_comment", "expansion_permitted",
           "allocate_expansion", "allocate_companion", "COMPANION_NAME", "update_job", "merge_expansion", "shrink_job", "partition_view", "cancel"]

log = logging.getLogger("apgas.slurm")

COMMAND_TIMEOUT = 15.0
RETRY_FOR = 20.0  # s to retry an update Slurm is not ready for
_RETRY = ("not available right now", "try again", "Socket timed out", "Unable to contact slurm")
_PAIR = re.compile(r"(\w[\w:/]*)=(\S*)")
EXPANSION_NAME = "apgas-expand"


class SlurmError(ApgasError):
    """A Slurm command failed; the message has Slurm's own words."""


def _execute(args: list[str] | tuple[str, ...], timeout: float,
             cwd: str | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run a Slurm command; it and what it said (its output lines, joined with `` | ``).
    SlurmError when the command is missing; TimeoutExpired is the caller's."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} not found: the slurm communicator needs Slurm's client "
                         "commands on the PATH") from None
    said = " | ".join(line.strip() for line in (done.stderr + done.stdout).splitlines()
                      if line.strip())
    return done, said


def run(*args: str, timeout: float = COMMAND_TIMEOUT, retry_for: float = 0.0,
        cwd: str | None = None) -> str:
    """Run a Slurm command and return its output; retry for ``retry_for`` s while
    Slurm says to try again."""
    deadline = time.monotonic() + retry_for
    delay = 0.1
    while True:
        try:
            done, said = _execute(args, timeout, cwd)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(args)} did not finish within {timeout:g} s") from None
        if done.returncode == 0:
            return done.stdout
        if any(text in said for text in _RETRY) and time.monotonic() < deadline:
            log.debug("%s: %s; trying again", " ".join(args), said)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        raise SlurmError(f"{' '.join(args)} failed: {said or f'exit code {done.returncode}'}")


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """What ``scontrol show job`` says of a job that matters for resizing."""

    id: str
    state: str
    nodes: list[str]
    partition: str
    fields: dict[str, str]


def show_job(job_id: str) -> JobInfo:
    """The job as Slurm sees it now."""
    text = run("scontrol", "--oneliner", "show", "job", job_id)
    fields = dict(_PAIR.findall(text))
    nodes = fields.get("NodeList", "")
    return JobInfo(job_id, fields.get("JobState", "?"),
                   expand_hostlist(nodes) if nodes and nodes != "(null)" else [],
                   fields.get("Partition", ""), fields)


def job_text(job_id: str, field: str) -> str:
    """A text field of the job as ``squeue --json`` gives it (``admin_comment``,
    ``comment``): exact, where ``scontrol show job`` prints the fields one after
    the other and a ``Comment`` could hold a line that reads like another field."""
    text = run("squeue", "--json", f"--jobs={job_id}")
    try:
        jobs = json.loads(text).get("jobs", [])
    except (json.JSONDecodeError, AttributeError):
        raise SlurmError(f"squeue --json --jobs={job_id} gave no JSON: {text[:200]!r}") from None
    for job in jobs:
        if isinstance(job, dict) and str(job.get("job_id")) == job_id:
            value = job.get(field)
            return value if isinstance(value, str) else ""
    raise SlurmError(f"squeue does not know job {job_id}")


def set_comment(job_id: str, text: str) -> None:
    """Set the job's ``Comment`` (its user may): the job's answers to the controller."""
    run("scontrol", "update", f"JobId={job_id}", f"Comment={text}", retry_for=RETRY_FOR)


def expansion_permitted() -> bool:
    """Whether slurm.conf has ``SchedulerParameters=permit_job_expansion``."""
    for line in run("scontrol", "show", "config").splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "SchedulerParameters":
            return "permit_job_expansion" in value
    return False


def allocate_expansion(job_id: str, n: int, partition: str, timeout: float) -> str:
    """A new allocation of ``n`` whole nodes that may join job ``job_id``; its id.

    It runs no step (a step would keep Slurm from handing its nodes over). When
    Slurm gives no nodes within ``timeout`` s, or refuses, it is cancelled and
    SlurmError says why, in Slurm's words."""
    name = f"{EXPANSION_NAME}-{job_id}"
    return _allocate(["salloc", f"--nodes={n}", "--exclusive", "--no-shell", f"--job-name={name}",
                      f"--dependency=expand:{job_id}"], n, partition, timeout, f"--name={name}")


COMPANION_NAME = "apgas-companion"


def allocate_companion(job_id: str, n: int, partition: str, timeout: float,
                       end: datetime.datetime | None) -> tuple[str, list[str]]:
    """A companion allocation of ``n`` whole nodes for job ``job_id`` (where Slurm
    cannot grow a job: no ``permit_job_expansion``): an ordinary job of the same
    user, named ``apgas-companion-<job>``, whose nodes the job's places run on as
    its steps (``srun --jobid=<it>``). It ends when the job would (``--deadline``
    is not enough: its time limit is the job's time left), and SlurmError says why
    Slurm gave none within ``timeout`` s (a request left queued is cancelled; the
    job's granted companions stay). Its id and nodes."""
    name = f"{COMPANION_NAME}-{job_id}"
    args = ["salloc", f"--nodes={n}", "--exclusive", "--no-shell", f"--job-name={name}"]
    if end is not None:
        left = max(1, int((end - datetime.datetime.now()).total_seconds() // 60))
        args.append(f"--time={left}")
    companion = _allocate(args, n, partition, timeout, f"--name={name}", "--state=PENDING")
    return companion, show_job(companion).nodes


def _allocate(args: list[str], n: int, partition: str, timeout: float, *leftovers: str) -> str:
    """Run ``salloc`` (``args``) for ``n`` nodes within ``timeout`` s; the allocation's id.
    When Slurm gives none in time, or refuses, ``scancel leftovers`` cancels what the
    request may have left queued, and SlurmError says why, in Slurm's words."""
    args = [*args, f"--immediate={max(1, round(timeout))}"]
    if partition:
        args.append(f"--partition={partition}")
    try:
        done, said = _execute(args, timeout + 15)
    except subprocess.TimeoutExpired:
        _cancel_named(*leftovers)
        raise SlurmError(f"salloc gave no node within {timeout + 15:g} s") from None
    granted = re.search(r"Granted job allocation ([0-9]+)", said)
    if done.returncode != 0 or granted is None:
        _cancel_named(*leftovers)
        raise SlurmError(f"Slurm gave no {n} node(s) within {timeout:g} s: "
                         f"{said or f'salloc exit code {done.returncode}'}")
    return granted.group(1)


_EXPORT = re.compile(r"""export (\w+)=(?:"([^"]*)"|'([^']*)'|(\S*))""")
_UNSET = re.compile(r"unset (\w+)")


def update_job(job_id: str, setting: str) -> dict[str, str | None]:
    """``scontrol update JobId=<job> <setting>``; the job's new ``SLURM_*`` variables
    as Slurm's resize script sets them (None: unset), empty when it wrote none."""
    with tempfile.TemporaryDirectory(prefix="apgas-slurm-") as scratch:
        run("scontrol", "update", f"JobId={job_id}", setting, retry_for=RETRY_FOR, cwd=scratch)
        script = Path(scratch) / f"slurm_job_{job_id}_resize.sh"
        try:
            text = script.read_text()
        except OSError:
            return {}
    changes: dict[str, str | None] = {}
    for line in text.splitlines():
        if (found := _EXPORT.match(line.strip())) is not None:
            changes[found.group(1)] = next(g for g in found.groups()[1:] if g is not None)
        elif (found := _UNSET.match(line.strip())) is not None:
            changes[found.group(1)] = None
    return changes


def merge_expansion(job_id: str, expansion_id: str) -> dict[str, str | None]:
    """Hand the expansion's nodes to the job; the job's new variables (:func:`update_job`)."""
    try:
        update_job(expansion_id, "NumNodes=0")
    finally:
        cancel(expansion_id)
    return update_job(job_id, "NumNodes=ALL")


def shrink_job(job_id: str, keep: list[str]) -> dict[str, str | None]:
    """Give back every node of the job but ``keep``; the job's new variables.

    Slurm kills what still runs on the nodes given back, so their places must
    have stopped first."""
    return update_job(job_id, f"NodeList={','.join(keep)}")


def cancel(job_id: str) -> None:
    try:
        run("scancel", job_id)
    except SlurmError as e:
        log.warning("%s", e)


def _cancel_named(*selection: str) -> None:
    """``scancel`` the jobs ``selection`` names (a request a salloc left queued)."""
    try:
        run("scancel", *selection)
    except SlurmError as e:
        log.warning("%s", e)


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """A job of the partition other than ours, as squeue shows it."""

    id: str
    nodes: int
    limit: float  # s, the job's time limit
    time: float  # epoch s: submit (pending) or start (running)
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class PartitionView:
    idle: int
    total: int
    pending: list[SlurmJob]
    running: list[SlurmJob]


def partition_view(partition: str, own: str) -> PartitionView:
    """The partition now: idle and usable nodes, pending and running jobs other than
    ``own`` and its expansions."""
    idle = total = 0
    for line in run("sinfo", "--noheader", f"--partition={partition}", "--format=%D %t").splitlines():
        count, state = line.split()
        number = ascii_int(count)
        if number is None:
            raise SlurmError(f"sinfo gave a node count that is no number: {line!r:.200}")
        if state.rstrip("*~#$@^-") in ("idle", "alloc", "mix", "comp", "resv", "plnd"):
            total += number
            if state == "idle":
                idle += number
    jobs: dict[str, list[SlurmJob]] = {"PD": [], "R": []}
    out = run("squeue", "--noheader", f"--partition={partition}", "--states=PD,R",
              "--format=%i|%t|%D|%l|%V|%S|%j|%r")
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 8:
            continue
        job_id, state, nodes, limit, submit, start, name, reason = fields
        size = ascii_int(nodes)
        if job_id == own or name.startswith((EXPANSION_NAME, COMPANION_NAME)) or state not in jobs \
                or size is None:
            continue
        when = _epoch(submit if state == "PD" else start)
        jobs[state].append(SlurmJob(job_id, size, _seconds(limit), when, reason))
    return PartitionView(idle, total, jobs["PD"], jobs["R"])


def _epoch(stamp: str) -> float:
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()


def _seconds(limit: str) -> float:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``UNLIMITED`` in seconds (a year for no limit)."""
    if limit in ("UNLIMITED", "INFINITE", "NOT_SET", "N/A"):
        return 365 * 86400.0
    days, _, clock = limit.rpartition("-")
    parts = [n for p in clock.split(":") if (n := ascii_int(p)) is not None]
    while len(parts) < 3:
        parts.insert(0, 0)
    return ((ascii_int(days) or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]
