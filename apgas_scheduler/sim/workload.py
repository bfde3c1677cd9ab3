"""Workloads for the simulator: jobs read from Standard Workload Format (SWF)
traces or drawn by seeded generators that follow the studies we compare with.

A trace gives rigid jobs; :func:`make_malleable` turns a nested, seeded subset
of them into malleable (or moldable) jobs and :func:`scale_arrivals` makes the
load heavier or lighter, as the MEBF study does with the KIT trace. The
generators imitate the three studies when no trace is at hand:
:func:`apgas_job_batch` (the malleable-APGAS job batches), :func:`uniform_evolving`
(the evolving-jobs study's uniform synthetic cases) and :func:`kit_like`
(a synthetic stand-in for the KIT ForHLR II trace). :func:`write_swf` writes
any of them back as a trace.

Every generator takes a seed and uses its own ``random.Random`` only, so the
same arguments give the same jobs on every run.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import math
import random
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from .._model import CLASSES
from .swf import WorkloadError, job_records, swf_header, trace_cluster

__all__ = [
    "SimJob", "WorkloadError", "read_swf", "swf_header", "trace_cluster", "write_swf",
    "make_malleable", "scale_arrivals", "RHO_CLASSES", "MEBF_INTENSIVE",
    "APGAS_TABLE", "APGAS_WORK_UNIT", "ApgasConfig", "apgas_job_batch",
    "uniform_evolving", "kit_like",
]

# The MEBF study's scalability classes (low, medium, high): rho ranges for make_malleable.
RHO_CLASSES: dict[str, tuple[float, float]] = {
    "low": (0.2, 0.3), "medium": (0.1, 0.2), "high": (0.0, 0.1),
}
# The MEBF study's "intensive" workloads: arrival times reduced by 25 %.
MEBF_INTENSIVE = 0.75


@dataclasses.dataclass(frozen=True)
class SimJob:
    """A job of a simulated workload.

    ``runtime`` is the real run time and ``estimate`` the user's estimate,
    both at ``preferred`` nodes. The estimate may be *smaller* than the run
    time (traces hold such jobs: they were killed or over-ran their limit);
    we keep it as given and the engine and policies must cope. ``rho`` is the
    scalability of ``JobView.runtime_on``; ``serial`` an Amdahl serial fraction
    for engines that choose that model instead. An evolving job's ``profile``
    lists its (duration, nodes) steps; its rigid view is ``preferred`` =
    ``max_nodes`` and ``runtime`` = the sum of the durations.
    """

    id: int
    submit: float
    cls: str
    min_nodes: int
    max_nodes: int
    preferred: int
    runtime: float
    estimate: float
    rho: float = 0.0
    serial: float | None = None
    profile: tuple[tuple[float, int], ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        # Fail where a bad job is made, not deep inside a simulation.
        if self.cls not in CLASSES:
            raise ValueError(f"job {self.id}: unknown class {self.cls!r}")
        if not 1 <= self.min_nodes <= self.preferred <= self.max_nodes:
            raise ValueError(f"job {self.id}: need 1 <= min_nodes <= preferred <= max_nodes, "
                             f"got {self.min_nodes}, {self.preferred}, {self.max_nodes}")
        if self.cls == "rigid" and self.min_nodes != self.max_nodes:
            raise ValueError(f"job {self.id}: a rigid job has min_nodes == max_nodes")
        if not (self.submit >= 0 and self.runtime > 0 and self.estimate > 0):
            raise ValueError(f"job {self.id}: need submit >= 0, runtime > 0 and estimate > 0")
        if self.rho < 0 or (self.serial is not None and not 0 <= self.serial <= 1):
            raise ValueError(f"job {self.id}: need rho >= 0 and 0 <= serial <= 1")
        if (self.cls == "evolving") != bool(self.profile):
            raise ValueError(f"job {self.id}: evolving jobs, and only they, have a profile")
        if self.profile:
            sizes = [n for _, n in self.profile]
            if any(d <= 0 for d, _ in self.profile) or (min(sizes), max(sizes)) != (
                    self.min_nodes, self.max_nodes):
                raise ValueError(f"job {self.id}: profile steps must have positive durations "
                                 "and span min_nodes..max_nodes")

    @property
    def area(self) -> float:
        """Node-seconds at the preferred size (the demand of the rigid view)."""
        return self.preferred * self.runtime


# -- SWF (reading: apgas_scheduler.sim.swf) ------------------------------------------------------

def read_swf(path: str | PathLike[str], *, procs_per_node: int = 1, max_jobs: int | None = None,
             stats: dict[str, float] | None = None) -> list[SimJob]:
    """The jobs of an SWF trace as rigid ``SimJob`` s, sorted by submission.

    The file may be plain or gzip, bzip2 or xz compressed (as the Parallel
    Workloads Archive ships it; told by its first bytes) and is streamed.
    Nodes are ``ceil(processors / procs_per_node)`` with the requested
    processors (field 8), or the allocated ones (field 5) when unknown. Jobs
    with no run time or no processors (field 4 or both processor fields
    <= 0: cancelled before they started) are skipped. ``estimate`` is the
    requested time (field 9), or the run time when unknown; an estimate below
    the run time is kept. Submit times are made relative to the earliest kept
    job. ``max_jobs`` stops after that many kept jobs.

    Pass a dict as ``stats`` to learn what was read: ``jobs`` (kept),
    ``skipped`` and ``first_submit`` (the absolute submit time that became 0).

    Raises ``WorkloadError`` (naming file, line and cause) for a line without
    18 numeric fields, a job number that is not an integer, an unknown
    (negative) submit time of a job that is kept, bytes that are not text or
    a corrupt compressed stream.
    """
    kept, skipped = job_records(path, procs_per_node, max_jobs)
    first = min((k[0] for k in kept), default=0.0)
    if stats is not None:
        stats.update(jobs=len(kept), skipped=skipped, first_submit=first)
    jobs = [SimJob(id=i, submit=s - first, cls="rigid", min_nodes=n, max_nodes=n, preferred=n,
                   runtime=r, estimate=e) for s, i, r, e, n in kept]
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def _num(x: float) -> str:
    """Whole numbers without a fraction; others exactly (``repr`` reads back equal)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def write_swf(jobs: Sequence[SimJob], path: str | PathLike[str],
              header: str | Sequence[str] = (), *, procs_per_node: int = 1) -> None:
    """Write ``jobs`` as an SWF trace that :func:`read_swf` reads back.

    Only the rigid view survives (SWF has no node ranges): ``preferred *
    procs_per_node`` processors allocated and requested, ``runtime`` and
    ``estimate``, status 1 (completed), every other field -1; a name ending
    in ``.gz``, ``.bz2`` or ``.xz`` is written compressed so. ``header``
    lines (a string may hold several) are written as ``;`` comments after
    ``Version`` and before ``MaxJobs``.
    """
    lines = header.splitlines() if isinstance(header, str) else list(header)
    out = ["; Version: 2.2"]
    out += [line if line.startswith(";") else f"; {line}" for line in lines]
    out.append(f"; MaxJobs: {len(jobs)}")
    for j in jobs:
        procs = j.preferred * procs_per_node
        fields = [j.id, _num(j.submit), -1, _num(j.runtime), procs, -1, -1, procs,
                  _num(j.estimate), -1, 1] + [-1] * 7
        out.append(" ".join(str(f) for f in fields))
    data = ("\n".join(out) + "\n").encode("utf-8")
    openers: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
    opener = openers.get(Path(path).suffix, open)
    with opener(path, "wb") as f:  # compressed as its name says, like the archive's traces
        f.write(data)


# -- transformations ------------------------------------------------------------------------

def _count(share: float, n: int) -> int:
    if not 0.0 <= share <= 1.0:
        raise ValueError("share must be within [0, 1]")
    return math.floor(share * n + 0.5)   # half up: 50 % of 5 jobs is 3


def _chosen(seed: int | str, n: int, share: float) -> set[int]:
    """Indices of the first round(share * n) jobs of a seeded permutation: the
    permutation does not depend on ``share``, so larger shares hold smaller ones."""
    order = list(range(n))
    random.Random(f"malleable:{seed}").shuffle(order)
    return set(order[:_count(share, n)])


def _draw(rng: random.Random, value: float | tuple[float, float]) -> float:
    return rng.uniform(*value) if isinstance(value, tuple) else float(value)


def make_malleable(jobs: Sequence[SimJob], share: float, seed: int, *, min_factor: float = 0.5,
                   max_factor: float = 5.0, total_nodes: int | None = None,
                   cls: str = "malleable", rho: float | tuple[float, float] | None = None,
                   serial: float | tuple[float, float] | None = None) -> list[SimJob]:
    """A copy of ``jobs`` in which a seeded random subset of round(share * len)
    jobs (half up) becomes ``cls`` ("malleable" or "moldable").

    The subsets are nested: with the same seed and job count, the subset for a
    larger share contains the one for a smaller share, so that results along
    the share axis differ by the added jobs only (as in both studies). A
    chosen job keeps its preferred size, run time and estimate and gets
    ``min_nodes = max(1, floor(preferred * min_factor))`` and ``max_nodes =
    floor(preferred * max_factor)`` capped at ``total_nodes`` but never below
    the preferred size (the MEBF study: half and five times the size in the
    trace).

    ``rho`` (and likewise ``serial``): None keeps each job's value, a number
    sets it, a (low, high) pair draws it uniformly per job, e.g.
    ``RHO_CLASSES["medium"]``. Scalability belongs to the application, so it
    is set on *every* job, rigid ones included, and a job's draw does not
    depend on ``share``. A chosen job that is not rigid keeps its class and range.
    """
    if cls not in ("malleable", "moldable"):
        raise ValueError("cls must be 'malleable' or 'moldable'")
    if not 0.0 < min_factor <= 1.0 or max_factor < 1.0:
        raise ValueError("need 0 < min_factor <= 1 <= max_factor")
    chosen = _chosen(seed, len(jobs), share)
    rho_rng, serial_rng = random.Random(f"rho:{seed}"), random.Random(f"serial:{seed}")
    out = []
    for i, job in enumerate(jobs):
        changes: dict[str, Any] = {}
        if rho is not None:
            changes["rho"] = _draw(rho_rng, rho)
        if serial is not None:
            changes["serial"] = _draw(serial_rng, serial)
        if i in chosen and job.cls == "rigid":
            p = job.preferred
            high = math.floor(p * max_factor)
            if total_nodes is not None:
                high = min(high, total_nodes)
            changes.update(cls=cls, min_nodes=max(1, math.floor(p * min_factor)),
                           max_nodes=max(p, high))
        out.append(dataclasses.replace(job, **changes) if changes else job)
    return out


def scale_arrivals(jobs: Sequence[SimJob], factor: float) -> list[SimJob]:
    """Submit times multiplied by ``factor``: below 1 the same jobs arrive
    closer together, a heavier load (the MEBF study's intensive workloads use
    ``MEBF_INTENSIVE`` = 0.75)."""
    if not factor > 0:
        raise ValueError("factor must be > 0")
    return [dataclasses.replace(j, submit=j.submit * factor) for j in jobs]


# -- the malleable-APGAS job batches --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ApgasConfig:
    """A row of the job table: a GLB program configuration at a rigid size,
    its relative selection weight, the node range it accepts as a malleable
    job, and its work relative to the smallest configuration of its program."""

    name: str
    nodes: int
    weight: float
    min_nodes: int
    max_nodes: int
    work: float


def _rows(name: str, work: float, low: int, high: int,
          sizes: Sequence[tuple[int, float]]) -> list[ApgasConfig]:
    return [ApgasConfig(name, n, w, low, high, work) for n, w in sizes]


# Configurations, rigid sizes, weights and malleable ranges as in the study's Table 2
# (its public experiment scripts). Work: our assumption, see apgas_job_batch.
APGAS_TABLE: tuple[ApgasConfig, ...] = tuple(
    _rows("uts-d18", 1.0, 1, 4, [(2, 1.5), (4, 0.5)])
    + _rows("uts-d19", 4.0, 2, 16, [(2, 1.5), (4, 1.0), (8, 1.0)])
    + _rows("uts-d20", 16.0, 8, 16, [(8, 1.0), (16, 0.5)])
    + _rows("nqueens-17", 1.0, 1, 8, [(2, 1.5), (4, 1.0)])
    + _rows("nqueens-18", 7.0, 8, 16, [(8, 1.0), (16, 0.5)])
    + _rows("bc-2^17", 1.0, 1, 4, [(2, 1.5), (4, 1.0)])
    + _rows("bc-2^18", 4.0, 2, 16, [(2, 1.5), (4, 1.0), (8, 0.5)])
    + _rows("bc-2^19", 16.0, 8, 16, [(8, 1.0), (16, 0.5)])
    + _rows("pi-8e10", 1.0, 1, 4, [(2, 1.5), (4, 1.0)])
    + _rows("pi-6e11", 7.5, 4, 16, [(4, 1.5), (8, 1.0), (16, 0.5)])
    + _rows("pi-1.2e12", 15.0, 8, 16, [(8, 1.0), (16, 0.5)])
)
APGAS_DEMAND = 8 * 3600.0 / 25   # node-seconds per job: 8 node-hours per 25-job batch
_MEAN_WORK = sum(c.weight * c.work for c in APGAS_TABLE) / sum(c.weight for c in APGAS_TABLE)
APGAS_WORK_UNIT = APGAS_DEMAND / _MEAN_WORK   # node-seconds of one unit of work (about 207)


def apgas_job_batch(seed: int, jobs: int = 25, nodes: int = 32, spread: float = 600.0,
                    first: int = 5, *, share: float = 0.0, cls: str = "malleable",
                    rho: float = 0.0, estimate_factor: float = 1.0) -> list[SimJob]:
    """A job batch of the malleable-APGAS study: ``jobs`` rigid jobs drawn by
    weight from ``APGAS_TABLE``, the first ``first`` submitted at 0 and the
    others at times uniform in [0, ``spread``), ids 1.. in submission order.

    ``share`` makes a nested seeded subset (as :func:`make_malleable`) ``cls``
    jobs with the table's node range (capped at ``nodes``), the study's way
    of building its 20..100 % malleable batches from a rigid one.

    Assumptions (the run times of the study's Fig. 6 are not in our copy of
    the text): (1) work relative to the smallest configuration of each program
    grows with problem size - UTS (geometric tree, branching factor 4) x4 per
    depth level, N-Queens x7 from 17 to 18 (the ratio of solution counts),
    BC x4 per doubling of the graph (Brandes' algorithm on a sparse graph is
    O(n m)), Pi linear in the samples; the smallest configurations of the four
    programs cost the same (the table gives them the same sizes). (2) Units
    are scaled so that the expected demand of a 25-job batch is the study's 8
    node-hours (one unit is about 207 node-seconds). (3) Strong scaling as the
    ``rho`` model, linear by default (the study chose node ranges where the
    programs scale strongly): run time at the rigid size k is ``work * unit /
    k ** (1 - rho)``. The mean run time then is about 208 s, near the 195 s
    mean computation time the study reports for rigid batches. (4) The
    estimate is ``estimate_factor`` times the run time.
    """
    if jobs < 0 or first < 0 or spread < 0 or estimate_factor <= 0 or nodes < 1 or rho < 0:
        raise ValueError("need jobs >= 0, first >= 0, spread >= 0, nodes >= 1, rho >= 0, "
                         "estimate_factor > 0")
    if cls not in ("malleable", "moldable"):
        raise ValueError("cls must be 'malleable' or 'moldable'")
    rng = random.Random(f"apgas:{seed}")
    configs = rng.choices(APGAS_TABLE, weights=[c.weight for c in APGAS_TABLE], k=jobs)
    at_zero = min(first, jobs)
    times = [0.0] * at_zero + sorted(rng.uniform(0.0, spread) for _ in range(jobs - at_zero))
    chosen = _chosen(seed, jobs, share)
    out = []
    for i, (c, t) in enumerate(zip(configs, times, strict=True)):
        runtime = c.work * APGAS_WORK_UNIT / c.nodes ** (1.0 - rho)
        low, high = (c.min_nodes, max(c.nodes, min(c.max_nodes, nodes))) if i in chosen \
            else (c.nodes, c.nodes)
        out.append(SimJob(id=i + 1, submit=t, cls=cls if i in chosen else "rigid",
                          min_nodes=low, max_nodes=high, preferred=c.nodes, runtime=runtime,
                          estimate=runtime * estimate_factor, rho=rho, name=c.name))
    return out


# -- the evolving-jobs study's uniform cases ------------------------------------------------

def uniform_evolving(seed: int, jobs: int | None = None, nodes: int = 75, *,
                     steps: tuple[int, int] = (1, 10),
                     duration: tuple[float, float] = (500.0, 3600.0),
                     step_nodes: tuple[int, int] = (1, 75), spread: float = 0.0) -> list[SimJob]:
    """A synthetic test case of the evolving-applications study (Klein and
    Pérez): a uniform choice of the number of applications (``jobs``, or
    within [15, 20] when None), of each one's number of steps (``steps``), and
    of each step's duration in seconds (``duration``) and node count
    (``step_nodes``, capped at the ``nodes`` of the cluster so every step
    fits). The study schedules a queue offline, so all jobs are submitted at
    0 unless ``spread`` > 0 spreads them uniformly over [0, spread).

    Each job is "evolving" with its steps as ``profile``; ``min_nodes`` and
    ``max_nodes`` are its smallest and largest step, and its rigid view (the
    study's baseline) is ``preferred = max_nodes`` for ``runtime`` = the sum
    of the durations (also the estimate: the jobs are fully predictable).
    """
    lo, hi = step_nodes[0], min(step_nodes[1], nodes)
    if not (1 <= lo <= hi and 1 <= steps[0] <= steps[1] and 0 < duration[0] <= duration[1]
            and spread >= 0):
        raise ValueError("bad ranges for steps, duration, step_nodes or nodes")
    rng = random.Random(f"evolving:{seed}")
    count = rng.randint(15, 20) if jobs is None else jobs
    submits = sorted(rng.uniform(0.0, spread) if spread > 0 else 0.0 for _ in range(count))
    out = []
    for i, submit in enumerate(submits):
        profile = tuple((rng.uniform(*duration), rng.randint(lo, hi))
                        for _ in range(rng.randint(*steps)))
        sizes = [n for _, n in profile]
        total = sum(d for d, _ in profile)
        out.append(SimJob(id=i + 1, submit=submit, cls="evolving", min_nodes=min(sizes),
                          max_nodes=max(sizes), preferred=max(sizes), runtime=total,
                          estimate=total, profile=profile, name=f"evolving-{len(profile)}"))
    return out


# -- a KIT-like trace -----------------------------------------------------------------------

# Common wall-time requests (s) that users round their estimates up to; 72 h is
# ForHLR II's longest wall time.
_LIMITS = (900, 1800, 3600, 7200, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600, 48 * 3600, 72 * 3600)


def kit_like(seed: int, jobs: int, nodes: int, *, load: float = 0.9,
             min_runtime: float = 60.0, max_runtime: float = 72 * 3600.0,
             max_size: int | None = None) -> list[SimJob]:
    """A synthetic rigid workload in the manner of the KIT ForHLR II trace the
    MEBF study uses, for when no trace is at hand. It imitates the features
    of production traces that matter to backfilling, not the exact KIT
    statistics (which we do not have here):

    * sizes: a third of the jobs use one node; the others a log-uniform size
      from 2 to ``max_size`` (default ``nodes // 8``), three in four of them
      rounded to a power of two;
    * run times: log-uniform in [``min_runtime``, ``max_runtime``] (72 h is
      the machine's wall-time limit), whole seconds;
    * estimates: users over-estimate: the run time times a log-uniform factor
      in [1, 10] rounded up to a common wall-time request (15 min .. 72 h);
      one job in ten ran into its limit (run time = estimate);
    * arrivals: Poisson, at the rate that makes the offered load (node-seconds
      asked per node-second of the cluster) about ``load``; whole seconds.

    All jobs are rigid with ``rho`` 0; use :func:`make_malleable` and
    :func:`scale_arrivals` for the study's malleable and intensive variants.
    """
    top = max(1, nodes // 8) if max_size is None else max_size
    if jobs < 0 or nodes < 1 or not 1 <= top <= nodes or load <= 0 \
            or not 1 <= min_runtime <= max_runtime:
        raise ValueError("need jobs >= 0, 1 <= max_size <= nodes, load > 0, "
                         "1 <= min_runtime <= max_runtime")
    rng = random.Random(f"kit:{seed}")

    def log_uniform(a: float, b: float) -> float:
        return math.exp(rng.uniform(math.log(a), math.log(b)))

    shapes = []
    for _ in range(jobs):
        size = 1
        if top > 1 and rng.random() >= 1 / 3:
            x = log_uniform(2, top + 1)
            size = min(top, 2 ** round(math.log2(x)) if rng.random() < 0.75 else int(x))
        runtime = float(round(log_uniform(min_runtime, max_runtime)))
        wish = runtime * log_uniform(1.0, 10.0)
        estimate = float(next((t for t in _LIMITS if t >= wish), max(_LIMITS[-1], runtime)))
        if rng.random() < 0.1:
            runtime = estimate
        shapes.append((size, runtime, estimate))
    mean_area = sum(s * r for s, r, _ in shapes) / max(1, jobs)
    gap = mean_area / (load * nodes)   # mean inter-arrival time
    t, out = 0.0, []
    for i, (size, runtime, estimate) in enumerate(shapes):
        if i:
            t += rng.expovariate(1.0 / gap)
        out.append(SimJob(id=i + 1, submit=float(round(t)), cls="rigid", min_nodes=size,
                          max_nodes=size, preferred=size, runtime=runtime, estimate=estimate,
                          name="kit-like"))
    return out
