"""ElastiSim job sets as :class:`~apgas_scheduler.sim.workload.SimJob` s, so that
one job set runs through ElastiSim (TU Darmstadt, on SimGrid) and through our
simulator.

:func:`read_input` takes an ElastiSim input folder (``configuration.json``,
``jobs.json``, the application models and the platform XML: what the Kassel
group's ``jsonGenerator.py`` writes) and gives a :class:`JobSet`: the jobs, the
node count and a node's speed from the platform, the scheduling interval, and
``notes`` naming what in the input our simulator does not model.

**How ElastiSim runs a job (from its source at commit 9bc6344)**

* A job's application model is a list of phases, each repeated ``iterations``
  times; a phase is a list of tasks. A ``cpu`` task's ``flops`` is a formula
  (:mod:`.elastisim_input` says how ElastiSim fills in and evaluates it).
* ``computation_pattern`` ``UNIFORM`` gives **every node** that many flops
  (``createVector`` fills the vector with the value); ``ALL_RANKS`` (or
  ``TOTAL``) spreads it over the nodes. Each node runs its share as one SimGrid
  activity at its host's speed (one core: the ``speed`` of the platform XML).
* A phase's ``iterations``, when a string, is the argument-substituted text read
  with ``std::stoi`` (not evaluated: ``"divide"`` with divide 396.0 gives 396);
  a task's ``iterations`` is evaluated per node count and truncated.

The Kassel model (``application_model.json`` of their inputs) is one phase of
``divide`` iterations of one UNIFORM cpu task of
``(flops/divide)/(1/((1-parallel_percentage)+parallel_percentage/num_nodes))``
flops, so on ``n`` nodes of speed ``S`` the job runs

    T(n) = floor(divide) * (flops / divide) * ((1 - p) + p / n) / S

seconds (``p`` = ``parallel_percentage``): Amdahl's law, with ``flops / S``
the run time on one node and serial fraction ``1 - p``. A malleable job reaches
a scheduling point after every iteration (``divide`` is about the run time over
60 s, at most 1,000), and ElastiSim resizes it only there.

**What maps to what**

==============================  ==============================================
ElastiSim                       ours
==============================  ==============================================
job type RIGID / MOLDABLE /     ``cls`` rigid / moldable / malleable
MALLEABLE
``num_nodes`` (rigid)           ``min_nodes = max_nodes = preferred``
``num_nodes_min/max``           ``min_nodes``, ``max_nodes``
argument ``num_nodes_pref``     ``preferred``; without it ``(min + max) // 2``
                                (the Kassel extension's ``Job`` class, whose
                                fallback then calls a ``Logger.log`` that does
                                not exist: their strategies need the
                                argument); a rigid job's is its ``num_nodes``
``submit_time``                 ``submit``
order of submission             ``id``: 0, 1, ... in ``submit_time`` order, ties
                                in file order (ElastiSim's ``stable_sort`` and
                                ids, as in ``job_statistics.csv``)
T(n) from the model             ``runtime`` = T(preferred); ``serial`` from
                                T(1) and T(2) (for the Kassel model exactly
                                ``1 - parallel_percentage``), checked against
                                T at the job's other sizes; run with
                                ``Simulator(model="amdahl")``
``walltime`` (whole seconds)    ``estimate``; without one (the Kassel inputs)
                                the exact run time at the preferred size, as
                                ``apgas-scheduler elastisim`` estimates it
compute hosts of the platform   ``Simulator(nodes)``; the hosts' speed is
                                ``JobSet.node_speed`` (all must be equal)
``scheduling_interval``         ``Simulator(interval=...)``: a decision every
                                that many seconds besides submits and ends
==============================  ==============================================

What does not map (listed in ``JobSet.notes`` when the input uses it, or
refused with an :class:`ElastiSimInputError` when no run time can be given):

* **Scheduling points.** ElastiSim applies a resize of a malleable job at the
  job's next scheduling point, the end of its current iteration: the job runs
  on at its old size until then, a shrink's nodes stay with it and a grow's
  wait reserved. Ours applies it at once. ElastiSim also invokes the algorithm
  at every scheduling point (``schedule_on_scheduling_point``); ours decides at
  submits, ends, the ends of reconfigurations and the interval.
* **Reconfiguration cost.** ElastiSim charges a resize the model's
  ``on_reconfiguration`` and ``on_expansion`` phases; the Kassel model has
  none, so a resize is free there, and the harness runs ours with
  ``Reconfig()`` (free too). Models that have these phases, or ``on_init``,
  are refused.
* **I/O, communication, GPUs, delays.** ``pfs_*``, ``bb_*``, ``gpu``,
  ``busy_wait``, ``idle`` and ``sequence`` tasks, a cpu task's ``bytes``, and
  patterns other than UNIFORM and ALL_RANKS are refused: our jobs only compute.
* **Walltime.** ElastiSim kills a job at its walltime; ours lets it finish (a
  note names such jobs).
* ``min_scheduling_interval``, oversubscription (refused), sensing, and
  invocations switched off at submits or ends: notes.
* **The Kassel strategies' own estimate** is ``flops / num_nodes_min``
  (``get_estimated_runtime``): flops per node, not seconds. Their EASY compares
  it with a time, so that it never backfills; see ``benchmarks/elastisim_compare.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from .elastisim_input import (
    ElastiSimInputError,
    Platform,
    argument_text,
    at_nodes,
    evaluate,
    read_platform,
    show,
    stoi,
    substitute,
)
from .workload import SimJob

__all__ = ["ElastiSimInputError", "Platform", "JobSet", "read_input", "read_platform",
           "read_jobs", "evaluate"]

_TYPES = {"rigid": "rigid", "moldable": "moldable", "malleable": "malleable"}
_UNIFORM, _SPREAD = "uniform", "spread"
_PATTERNS = {"uniform": _UNIFORM, "all_ranks": _SPREAD, "total": _SPREAD}
_ONE_TIME_PHASES = ("on_init", "on_reconfiguration", "on_expansion")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# relative tolerance of the check that T(n) follows Amdahl's law
_AMDAHL_RTOL = 1e-9


# -- application models ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Task:
    flops: str  # the formula, arguments substituted; num_nodes still in it
    pattern: str
    iterations: str  # the task's iteration formula, arguments substituted


@dataclasses.dataclass(frozen=True)
class _Phase:
    iterations: int
    tasks: tuple[_Task, ...]
    scheduling_point: bool
    final_scheduling_point: bool


@dataclasses.dataclass(frozen=True)
class _Model:
    """A job's workload: its phases with the job's arguments in place."""

    phases: tuple[_Phase, ...]
    where: str

    def seconds(self, nodes: int, speed: float) -> float:
        total = 0.0
        for p, phase in enumerate(self.phases):
            per_iteration = 0.0
            for t, task in enumerate(phase.tasks):
                where = f"{self.where}, phase {p}, task {t}"
                flops = evaluate(at_nodes(task.flops, nodes), f"{where}: flops")
                if task.pattern == _SPREAD:
                    flops /= nodes
                reps = math.floor(evaluate(at_nodes(task.iterations, nodes), f"{where}: iterations"))
                if flops < 0 or reps < 0:
                    raise ElastiSimInputError(f"{where}: {flops:g} flops x {reps} iterations on "
                                              f"{nodes} node(s) is negative")
                per_iteration += reps * flops / speed
            total += phase.iterations * per_iteration
        return total

    def iterations(self) -> int:
        return sum(p.iterations for p in self.phases)

    def resizable(self) -> bool:
        """Whether a malleable job has any scheduling point (the last iteration of
        all never has one)."""
        for i, phase in enumerate(self.phases):
            last = i == len(self.phases) - 1
            points = phase.iterations - 1 if (last or not phase.final_scheduling_point) \
                else phase.iterations
            if phase.scheduling_point and points > 0:
                return True
        return False


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ElastiSimInputError(f"{path}: not a readable {what} ({e})") from None


def _model(raw: Any, path: Path, arguments: Mapping[str, str], where: str) -> _Model:
    where = f"{where}, model {path.name}"
    if not isinstance(raw, dict):
        raise ElastiSimInputError(f"{where}: the model is {show(raw)}, not an object")
    for key in _ONE_TIME_PHASES:
        if raw.get(key) is not None:
            raise ElastiSimInputError(f"{where}: phase {key!r} is not modelled by our simulator "
                                      "(an initialization, reconfiguration or expansion cost)")
    phases = raw.get("phases")
    if not isinstance(phases, list) or not phases:
        raise ElastiSimInputError(f"{where}: 'phases' is {show(phases)}, not a list of phases")
    out = []
    for p, phase in enumerate(phases):
        at = f"{where}, phase {p}"
        if not isinstance(phase, dict):
            raise ElastiSimInputError(f"{at} is {show(phase)}, not an object")
        its = phase.get("iterations", 1)
        if isinstance(its, str):
            count = stoi(substitute(its, arguments), f"{at}: iterations {its!r}")
        elif isinstance(its, int) and not isinstance(its, bool):
            count = its
        else:
            raise ElastiSimInputError(f"{at}: iterations {show(its)} is neither a whole number "
                                      "nor a string (ElastiSim would run it once)")
        if count < 1:
            raise ElastiSimInputError(f"{at}: iterations {show(its)} gives {count}, not 1 or "
                                      "more (a phase without iterations never ends in ElastiSim)")
        flags = {}
        for key in ("scheduling_point", "final_scheduling_point", "barrier"):
            flag = phase.get(key, True)
            if not isinstance(flag, bool):
                raise ElastiSimInputError(f"{at}: {key} is {show(flag)}, not true or false")
            flags[key] = flag
        tasks = phase.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise ElastiSimInputError(f"{at}: 'tasks' is {show(tasks)}, not a list of tasks")
        out.append(_Phase(count, tuple(_task(t, f"{at}, task {i}", arguments)
                                       for i, t in enumerate(tasks)),
                          flags["scheduling_point"], flags["final_scheduling_point"]))
    return _Model(tuple(out), where)


def _task(raw: Any, where: str, arguments: Mapping[str, str]) -> _Task:
    if not isinstance(raw, dict):
        raise ElastiSimInputError(f"{where} is {show(raw)}, not an object")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind.lower() != "cpu":
        raise ElastiSimInputError(f"{where}: a task of type {show(kind)}: our jobs only "
                                  "compute (cpu tasks); I/O, GPU, delay and sequence tasks are "
                                  "not modelled")
    if raw.get("bytes") is not None:
        raise ElastiSimInputError(f"{where}: a cpu task with 'bytes' communicates; our simulator "
                                  "does not model communication")
    flops = raw.get("flops")
    if isinstance(flops, bool) or not isinstance(flops, str | int | float):
        raise ElastiSimInputError(f"{where}: flops {show(flops)} is neither a number nor a "
                                  "formula")
    pattern = raw.get("computation_pattern")
    kind_of = _PATTERNS.get(pattern.lower()) if isinstance(pattern, str) else None
    if kind_of is None:
        raise ElastiSimInputError(f"{where}: computation_pattern {show(pattern)} is not "
                                  "UNIFORM or ALL_RANKS (the patterns that load every node alike)")
    its = raw.get("iterations", 1)
    if isinstance(its, str):
        iterations = substitute(its, arguments)
    elif isinstance(its, int) and not isinstance(its, bool) and its >= 0:
        iterations = str(its)
    else:
        raise ElastiSimInputError(f"{where}: iterations {show(its)} is neither a whole number "
                                  "nor a formula (ElastiSim would run it once)")
    text = substitute(flops, arguments) if isinstance(flops, str) \
        else argument_text(float(flops), f"{where}: flops")
    return _Task(text, kind_of, iterations)


# -- jobs --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JobSet:
    """An ElastiSim input as our simulator's workload.

    ``jobs``: ids 0.. as ElastiSim numbers them. ``nodes`` and ``node_speed``:
    the platform's compute nodes. ``scheduling_interval``: ElastiSim's periodic
    invocation in seconds (0: none). ``iterations``: per job, its phases'
    iterations (a malleable job's scheduling points are one fewer).
    ``runtime_on(job, n)``: the run time on ``n`` nodes as ElastiSim computes it.
    ``notes``: what the input uses that our simulator does not model."""

    jobs: tuple[SimJob, ...]
    nodes: int
    node_speed: float
    scheduling_interval: float
    iterations: Mapping[int, int]
    notes: tuple[str, ...]
    source: Path
    models: Mapping[int, _Model] = dataclasses.field(repr=False, default_factory=dict)

    def runtime_on(self, job: int, nodes: int) -> float:
        return self.models[job].seconds(nodes, self.node_speed)


def _int(raw: Mapping[str, Any], key: str, where: str, low: int = 1) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ElastiSimInputError(f"{where}: {key} is {show(value)}, not a whole number "
                                  f">= {low}")
    return value


def _fit_amdahl(model: _Model, speed: float, sizes: Sequence[int], where: str) -> float:
    """The serial fraction ``s`` with T(n) = T(1) * (s + (1 - s) / n), from T(1) and
    T(2), checked at ``sizes``."""
    t1, t2 = model.seconds(1, speed), model.seconds(2, speed)
    if not t1 > 0:
        raise ElastiSimInputError(f"{where}: the job computes nothing (0 s on one node); "
                                  "our simulator needs a run time > 0")
    parallel = 2 * (t1 - t2)
    serial = (t1 - parallel) / t1
    if -1e-12 < serial < 0:
        serial = 0.0
    if 1 < serial < 1 + 1e-12:
        serial = 1.0
    for n in sorted(set(sizes)):
        expected, got = t1 * (serial + (1 - serial) / n), model.seconds(n, speed)
        if not 0 <= serial <= 1 or abs(expected - got) > _AMDAHL_RTOL * max(got, expected):
            raise ElastiSimInputError(
                f"{where}: its run time does not follow Amdahl's law (T(1) = {t1:g} s, "
                f"T(2) = {t2:g} s, T({n}) = {got:g} s where the law gives {expected:g} s); "
                "our simulator cannot run it as ElastiSim does")
    return serial


def _resolve(name: str, folder: Path, where: str) -> Path:
    """A path of an ElastiSim input as the file in ``folder``: as given (absolute,
    or relative to ``folder``), else its name in ``folder`` (the Kassel inputs name
    ``data/input/...``, where their container mounts the folder)."""
    given = Path(name)
    for candidate in (given if given.is_absolute() else folder / given, folder / given.name):
        if candidate.is_file():
            return candidate
    raise ElastiSimInputError(f"{where} names {name!r}, and neither it nor {folder / given.name} "
                              "is a file")


def read_jobs(jobs_file: str | PathLike[str], platform: Platform, *,
              model_folder: str | PathLike[str] | None = None,
              notes: list[str] | None = None) -> tuple[list[SimJob], dict[int, _Model]]:
    """The jobs of ``jobs_file`` on ``platform``, in ElastiSim's order (its ids),
    and each one's workload model. Application models are looked up as
    :func:`read_input` does, in ``model_folder`` (default: the jobs file's).
    ``notes`` receives what our simulator does not model."""
    path = Path(jobs_file)
    folder = Path(model_folder) if model_folder is not None else path.parent
    raw = _load_json(path, "jobs file")
    if not isinstance(raw, dict) or not isinstance(raw.get("jobs"), list):
        raise ElastiSimInputError(f"{path}: no list 'jobs' (an ElastiSim jobs file is "
                                  "{{\"jobs\": [...]}})")
    cache: dict[Path, Any] = {}
    entries = []
    for index, job in enumerate(raw["jobs"]):
        where = f"{path}: jobs[{index}]"
        if not isinstance(job, dict):
            raise ElastiSimInputError(f"{where} is {show(job)}, not an object")
        submit = job.get("submit_time")
        if isinstance(submit, bool) or not isinstance(submit, int | float) \
                or not math.isfinite(submit) or submit < 0:
            raise ElastiSimInputError(f"{where}: submit_time is {show(submit)}, not a number >= 0")
        entries.append((float(submit), index, job, where))
    entries.sort(key=lambda e: e[0])  # stable: ties keep the file's order, as ElastiSim's
    jobs: list[SimJob] = []
    models: dict[int, _Model] = {}
    for jid, (submit, index, job, where) in enumerate(entries):
        kind = job.get("type")
        cls = _TYPES.get(kind.lower()) if isinstance(kind, str) else None
        if cls is None:
            raise ElastiSimInputError(f"{where}: type is {show(kind)}, not RIGID, MOLDABLE or "
                                      "MALLEABLE")
        args_raw = job.get("arguments", {})
        if args_raw is None:
            args_raw = {}
        if not isinstance(args_raw, dict):
            raise ElastiSimInputError(f"{where}: arguments is {show(args_raw)}, not an object")
        arguments = {}
        for key, value in args_raw.items():
            if not _NAME.match(key):
                raise ElastiSimInputError(f"{where}: argument name {key!r} is not a plain name "
                                          "(ElastiSim replaces it in formulas as a pattern)")
            arguments[key] = argument_text(value, f"{where}: argument {key!r}")
        gpu_keys = ("num_gpus_per_node",) if cls == "rigid" else ("num_gpus_per_node_min",
                                                                  "num_gpus_per_node_max")
        for key in gpu_keys:
            if job.get(key) not in (None, 0):
                raise ElastiSimInputError(f"{where}: {key} is {show(job.get(key))}; our "
                                          "simulator has no GPUs")
        if cls == "rigid":
            low = high = pref = _int(job, "num_nodes", where)
        else:
            low, high = _int(job, "num_nodes_min", where), _int(job, "num_nodes_max", where)
            if low > high:
                raise ElastiSimInputError(f"{where}: num_nodes_min {low} is above num_nodes_max "
                                          f"{high}")
            pref = (low + high) // 2
            if "num_nodes_pref" in args_raw:
                text = arguments["num_nodes_pref"]
                if not re.fullmatch(r"[+-]?\d+", text.strip()):
                    raise ElastiSimInputError(f"{where}: argument num_nodes_pref is "
                                              f"{show(args_raw['num_nodes_pref'])}, not a whole "
                                              "number (the Kassel extension reads it with int())")
                pref = int(text)
            if not low <= pref <= high:
                raise ElastiSimInputError(f"{where}: argument num_nodes_pref {pref} is outside "
                                          f"[num_nodes_min, num_nodes_max] = [{low}, {high}]")
        model_name = job.get("application_model")
        if not isinstance(model_name, str):
            raise ElastiSimInputError(f"{where}: application_model is {show(model_name)}, not a "
                                      "path")
        model_path = _resolve(model_name, folder, f"{where}: application_model")
        if model_path not in cache:
            cache[model_path] = _load_json(model_path, "application model")
        model = _model(cache[model_path], model_path, arguments, f"{where} (job {jid})")
        sizes = [1, 2, low, pref, high, (low + high) // 2]
        serial = _fit_amdahl(model, platform.speed, sizes, f"{where} (job {jid})")
        if "parallel_percentage" in arguments:  # the Kassel model: 1 - p, without the fit's noise
            try:
                exact = 1 - float(arguments["parallel_percentage"])
            except ValueError:
                exact = math.nan
            if abs(exact - serial) <= 1e-9:
                serial = exact
        runtime = model.seconds(pref, platform.speed)
        walltime = job.get("walltime")
        estimate = runtime
        if walltime is not None:
            if isinstance(walltime, bool) or not isinstance(walltime, int) or walltime < 0:
                raise ElastiSimInputError(f"{where}: walltime is {show(walltime)}, not a whole "
                                          "number of seconds >= 0 (ElastiSim would ignore it)")
            if walltime > 0:
                estimate = float(walltime)
                if runtime > walltime and notes is not None:
                    notes.append(f"job {jid} runs {runtime:.1f} s at {pref} node(s), beyond its "
                                 f"walltime {walltime} s: ElastiSim kills it there, ours does not")
        if cls == "malleable" and not model.resizable() and notes is not None:
            notes.append(f"job {jid} ({runtime:.0f} s at {pref} node(s)) is malleable with no scheduling "
                         "point: ElastiSim never resizes it (a grow waits, its nodes held), ours may")
        models[jid] = model
        jobs.append(SimJob(id=jid, submit=submit, cls=cls, min_nodes=low, max_nodes=high,
                           preferred=pref, runtime=runtime, estimate=estimate, serial=serial,
                           name=f"{cls}-{args_raw.get('id', index)}"))
    return jobs, models


def read_input(folder: str | PathLike[str]) -> JobSet:
    """The ElastiSim input in ``folder`` (its ``configuration.json``, or that file
    itself): the platform and jobs files it names, found as given or by name in
    the folder, and each job's application model likewise."""
    given = Path(folder)
    config_file = given if given.is_file() else given / "configuration.json"
    base = config_file.parent
    config = _load_json(config_file, "ElastiSim configuration")
    if not isinstance(config, dict):
        raise ElastiSimInputError(f"{config_file}: not an object")
    for key in ("jobs_file", "platform_file"):
        if not isinstance(config.get(key), str):
            raise ElastiSimInputError(f"{config_file}: {key} is {show(config.get(key))}, not a path")
    interval = config.get("scheduling_interval", 0)
    if isinstance(interval, bool) or not isinstance(interval, int | float) \
            or not math.isfinite(interval) or interval < 0:
        raise ElastiSimInputError(f"{config_file}: scheduling_interval is {show(interval)}, not a "
                                  "number of seconds >= 0")
    flags = {}
    for key in ("schedule_on_job_submit", "schedule_on_job_finalize",
                "schedule_on_scheduling_point", "allow_oversubscription", "sensing"):
        value = config.get(key, False)
        if not isinstance(value, bool):
            raise ElastiSimInputError(f"{config_file}: {key} is {show(value)}, not true or false")
        flags[key] = value
    if interval == 0 and not (flags["schedule_on_job_submit"] and flags["schedule_on_job_finalize"]):
        raise ElastiSimInputError(f"{config_file}: with scheduling_interval 0 the algorithm must "
                                  "be invoked on submits and ends (ElastiSim refuses it too)")
    if flags["allow_oversubscription"]:
        raise ElastiSimInputError(f"{config_file}: allow_oversubscription is true; our nodes run "
                                  "one job at a time")
    notes: list[str] = []
    if not flags["schedule_on_job_submit"] or not flags["schedule_on_job_finalize"]:
        notes.append("ElastiSim is not invoked at every submit and end; ours decides at both")
    minimum = config.get("min_scheduling_interval", 0)
    if isinstance(minimum, int | float) and not isinstance(minimum, bool) and minimum > 0:
        notes.append(f"min_scheduling_interval {minimum} s: ElastiSim skips invocations closer "
                     "together; ours does not")
    if flags["sensing"]:
        notes.append("sensing: ElastiSim's utilization sampling has no counterpart")
    platform = read_platform(_resolve(config["platform_file"], base,
                                      f"{config_file}: platform_file"))
    jobs_file = _resolve(config["jobs_file"], base, f"{config_file}: jobs_file")
    jobs, models = read_jobs(jobs_file, platform, model_folder=base, notes=notes)
    for job in jobs:
        if job.min_nodes > platform.nodes:
            notes.append(f"job {job.id} needs {job.min_nodes} nodes, the platform has "
                         f"{platform.nodes}: ElastiSim never ends, ours leaves it out")
    if any(j.cls == "malleable" for j in jobs):
        invoked = " (and invokes the algorithm there)" if flags["schedule_on_scheduling_point"] else ""
        notes.append(f"malleable jobs: ElastiSim resizes them at the end of an iteration{invoked}, "
                     "ours at once")
    return JobSet(tuple(jobs), platform.nodes, platform.speed, float(interval),
                  {j.id: models[j.id].iterations() for j in jobs}, tuple(notes), config_file,
                  models)
