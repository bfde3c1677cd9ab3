"""DMR's workloads for the simulator: CG, Jacobi and N-body jobs, fixed or flexible.

The throughput study of the DMR API (Iserte et al., "DMR API: Improving cluster
productivity by turning applications into malleable", Parallel Computing 2018,
Section 7; ``../shared/papers/dmr-api-slurm-malleability.txt``) runs workloads
of 50, 100, 200 and 400 jobs of three applications, once "fixed" (rigid jobs)
and once "flexible" (the same jobs malleable, resized by its Slurm plug-in with
a factor of 2). :func:`dmr_workload` draws such a workload.

* **The mix.** Each job runs one of CG, Jacobi and N-body, drawn with equal
  chances: the paper's jobs are "randomly-sorted ... (with a fixed seed)" and
  it gives no shares.
* **Sizes** (nodes; the paper says processes, one a node): Table 1's minimum,
  maximum and preferred, :data:`TABLE1` (CG and Jacobi 2, 32, 8; N-body 1, 16,
  1). ``scale`` divides them (rounded up) for a smaller cluster; a maximum above
  ``nodes`` is lowered to the largest size that the preferred one times powers
  of ``factor`` reaches within ``nodes``, so that DMR's resizes by ``factor``
  still lead from the submitted size to the preferred one.
* **Arrivals**: a Poisson process with a mean of ``arrival_mean`` seconds
  between two submissions (exponential gaps; the first job at 0). The paper's
  "Poisson distribution of factor 10" is read as a mean of 10 s
  (:data:`ARRIVAL_MEAN`): its waits (4,115 s for 50 jobs, 31,788 s for 400)
  grow in proportion to the job count, as they do when the jobs arrive much
  faster than the cluster runs them.
* **Fixed**: rigid at the submitted size, Table 1's maximum ("the job
  submission of each application is launched with its maximum value"), or at
  the preferred size with ``fixed_at="preferred"``. **Flexible**: malleable
  within [minimum, maximum] with Table 1's preferred size, the run time given
  at that size. Both draw the same applications and submission times; a job's
  run time on k nodes is the same in both (only the class and the bounds
  differ).

**Job models** (:class:`JobModel`, :data:`MODELS`): Amdahl's law, the run time
at Table 1's maximum, and a resize cost of ``alpha + b`` seconds per node
changed (the simulator's ``Reconfig``, ``beta`` 0). Provenance:

========  ==========  ==========  =========  =====  ====================================
app       serial      at maximum  alpha      b      from
========  ==========  ==========  =========  =====  ====================================
cg        0.1598      564.9 s     0.143 s    0.010  ``docs/results/dmr_fit.json``
jacobi    0.3541      564.9 s     0.167 s    0.196  ``docs/results/dmr_fit.json``
nbody     0.0657      564.9 s     0.011 s    0.011  ``docs/results/dmr_fit.json``
========  ==========  ==========  =========  =====  ====================================

* ``serial``: Amdahl's serial fraction of one 16-core node (MareNostrum's),
  fitted by ``python -m benchmarks._dmr_fit --out docs/results`` (see its
  docstring): what an iteration of our app costs besides compute across two
  places (``S``) against its compute on one core (``C``), measured on this
  machine at the largest problems of ``benchmarks.dist`` (Jacobi 4000 x 4000,
  CG 3000 x 3000, N-body 8000 bodies), extrapolated to ``S / (S + C / 16)``;
  the fit's miss of the measured 1- and 2-place times is in that file
  (``amdahl.fit_error``).
* ``at maximum``: our assumption. The paper gives no run time per application;
  every application takes the mean execution time of Table 4's fixed jobs
  (:data:`DMR_FIXED_EXECUTION`, 564.9 s) at its maximum size, so our fixed
  jobs' execution time is Table 4's by construction, not a result.
* ``alpha``, ``b``: the mean re-spread of the arrays and the mean rest of our
  apps' grow and shrink orders of one place at those problem sizes (same
  file, ``resize``). The simulator charges one ``Reconfig`` for all jobs, so
  per-application costs cannot be expressed: :func:`reconfig` is the mean of
  the three (the mix's equal shares): 0.18 s per node changed, and
  :func:`reconfig_errors` says how far it is from each application's own: 17%
  above CG's 0.153 s, 51% below Jacobi's 0.363 s, 7 times N-body's 0.022 s; at
  most 0.19 s per node changed either way, against jobs of minutes.

:data:`LINEAR_MODELS` are the same with a serial fraction of 0 (the paper
says its applications scale linearly).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping

from .simulator import Reconfig
from .workload import SimJob

__all__ = ["APPS", "TABLE1", "ARRIVAL_MEAN", "DMR_FIXED_EXECUTION", "DMR_TABLE4", "JobModel", "MODELS",
           "LINEAR_MODELS", "MAX_JOBS", "sizes", "dmr_workload", "reconfig", "reconfig_errors"]

APPS = ("cg", "jacobi", "nbody")
#: DMR's Table 1: (minimum, maximum, preferred) processes, one a node
TABLE1: dict[str, tuple[int, int, int]] = {"cg": (2, 32, 8), "jacobi": (2, 32, 8), "nbody": (1, 16, 1)}
ARRIVAL_MEAN = 10.0
#: DMR's Table 4: jobs -> version -> (utilization %, mean wait, execution, completion s)
DMR_TABLE4: dict[int, dict[str, tuple[float, float, float, float]]] = {
    50: {"fixed": (98.71, 4115.02, 620.26, 4735.28), "flexible": (68.67, 1359.92, 900.3, 2260.22)},
    100: {"fixed": (97.39, 9750.34, 586.64, 10336.98), "flexible": (71.91, 2990.6, 858.16, 3848.76)},
    200: {"fixed": (98.38, 17466.2, 520.58, 17986.78), "flexible": (73.54, 6856.8, 825.88, 7676.67)},
    400: {"fixed": (98.38, 31788.39, 532.14, 32320.53), "flexible": (73.54, 13861.03, 843.19, 14704.22)},
}
DMR_FIXED_EXECUTION = round(sum(v["fixed"][2] for v in DMR_TABLE4.values()) / len(DMR_TABLE4), 1)
"""564.9 s: the mean execution time of Table 4's fixed jobs over its four workloads."""
MAX_JOBS = 1_000_000
MAX_NODES = 1_000_000


@dataclasses.dataclass(frozen=True)
class JobModel:
    """An application's run time and resize cost (see the module's docstring)."""

    serial: float          # Amdahl's serial fraction, against one node
    seconds: float         # run time at Table 1's maximum
    alpha: float = 0.0     # s per node changed: the arrays' re-spread
    b: float = 0.0         # s per node changed: places started or stopped, the order

    def __post_init__(self) -> None:
        if not (isinstance(self.serial, (int, float)) and 0 <= self.serial < 1):
            raise ValueError(f"a job model's serial fraction must be in [0, 1), got {self.serial!r}")
        if not (isinstance(self.seconds, (int, float)) and 0 < self.seconds < math.inf):
            raise ValueError(f"a job model's seconds must be positive and finite, got {self.seconds!r}")
        for name in ("alpha", "b"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"a job model's {name} must be >= 0 and finite, got {value!r}")

    def time(self, k: int, reference: int) -> float:
        """Run time on ``k`` nodes, ``seconds`` being the time on ``reference`` nodes."""
        s = self.serial
        return self.seconds * (s + (1 - s) / k) / (s + (1 - s) / reference)


MODELS: dict[str, JobModel] = {
    "cg": JobModel(0.1598, DMR_FIXED_EXECUTION, 0.143, 0.010),
    "jacobi": JobModel(0.3541, DMR_FIXED_EXECUTION, 0.167, 0.196),
    "nbody": JobModel(0.0657, DMR_FIXED_EXECUTION, 0.011, 0.011),
}
"""Fitted from our runs: ``python -m benchmarks._dmr_fit --out docs/results``."""
LINEAR_MODELS: dict[str, JobModel] = {app: dataclasses.replace(m, serial=0.0) for app, m in MODELS.items()}


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    return value


def sizes(app: str, nodes: int = 64, factor: int = 2, scale: int = 1) -> tuple[int, int, int]:
    """(minimum, maximum, preferred) nodes of ``app``: Table 1 divided by ``scale``
    (rounded up), the maximum lowered to the largest ``preferred * factor ** i``
    within ``nodes`` when it does not fit. ValueError for an unknown app or a
    cluster smaller than the preferred size."""
    if app not in TABLE1:
        raise ValueError(f"unknown application {app!r}; DMR's are {', '.join(APPS)}")
    _int("nodes", nodes, 1, MAX_NODES)
    _int("factor", factor, 1, 64)
    _int("scale", scale, 1, 64)
    low, high, pref = (max(1, math.ceil(x / scale)) for x in TABLE1[app])
    if pref > nodes:
        raise ValueError(f"{app} prefers {pref} nodes (Table 1 / {scale}); nodes={nodes} is too few")
    if high > nodes:
        high = nodes
        if factor > 1:
            high = pref
            while high * factor <= nodes:
                high *= factor
    return low, high, pref


def dmr_workload(seed: int, jobs: int, *, nodes: int = 64, flexible: bool = True, factor: int = 2,
                 arrival_mean: float = ARRIVAL_MEAN, models: Mapping[str, JobModel] | None = None,
                 scale: int = 1, fixed_at: str = "max", estimate_factor: float = 1.0) -> list[SimJob]:
    """``jobs`` jobs of DMR's mix for a cluster of ``nodes`` nodes, ids 1.. in
    submission order (see the module's docstring). ``models``: per application
    (default :data:`MODELS`); ``estimate_factor``: the user's estimate over the run
    time (1: exact). The same ``seed`` gives the same applications and submission
    times whatever ``flexible``, ``fixed_at``, ``models`` or ``nodes``.

    ValueError, naming the value, for a seed or counts that are not whole
    numbers in range, a mean or factor that is not positive and finite, models
    missing an application, or ``fixed_at`` other than "max" and "preferred"."""
    _int("seed", seed, -(2 ** 63), 2 ** 63 - 1)
    _int("jobs", jobs, 0, MAX_JOBS)
    if not (isinstance(arrival_mean, (int, float)) and 0 < arrival_mean <= 1e7):
        raise ValueError(f"arrival_mean must be in (0, 1e7] seconds, got {arrival_mean!r}")
    if not (isinstance(estimate_factor, (int, float)) and 1 <= estimate_factor <= 1000):
        raise ValueError(f"estimate_factor must be in [1, 1000], got {estimate_factor!r}")
    if fixed_at not in ("max", "preferred"):
        raise ValueError(f"fixed_at must be 'max' or 'preferred', got {fixed_at!r}")
    models = MODELS if models is None else models
    if missing := [app for app in APPS if not isinstance(models.get(app), JobModel)]:
        raise ValueError(f"models must give a JobModel for each of {APPS}; missing or wrong: {missing}")
    table = {app: sizes(app, nodes, factor, scale) for app in APPS}
    rng = random.Random(f"dmr:{seed}")
    out: list[SimJob] = []
    t = 0.0
    for i in range(jobs):
        app = rng.choice(APPS)
        if i:
            t += rng.expovariate(1.0 / arrival_mean)
        low, high, pref = table[app]
        model = models[app]
        reference = max(1, math.ceil(TABLE1[app][1] / scale))
        if flexible:
            cls, low, size = "malleable", low, pref
        else:
            size = high if fixed_at == "max" else pref
            cls, low, high = "rigid", size, size
        runtime = model.time(size, reference)
        out.append(SimJob(id=i + 1, submit=t, cls=cls, min_nodes=low, max_nodes=high, preferred=size,
                          runtime=runtime, estimate=runtime * estimate_factor, serial=model.serial,
                          name=app))
    return out


def reconfig(models: Mapping[str, JobModel] | None = None) -> Reconfig:
    """One resize cost for all jobs (the simulator charges one): the mean of the
    applications' ``alpha`` and ``b`` (equal shares of the mix), ``beta`` 0."""
    ms = [(MODELS if models is None else models)[app] for app in APPS]
    return Reconfig(alpha=sum(m.alpha for m in ms) / len(ms), beta=0.0, b=sum(m.b for m in ms) / len(ms))


def reconfig_errors(models: Mapping[str, JobModel] | None = None) -> dict[str, float]:
    """Per application, how far :func:`reconfig`'s cost per node changed is from its
    own, relative to its own."""
    models = MODELS if models is None else models
    one = reconfig(models)
    return {app: abs(one.alpha + one.b - (m.alpha + m.b)) / (m.alpha + m.b)
            for app, m in ((a, models[a]) for a in APPS)}
