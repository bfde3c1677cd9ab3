"""Part 4 of :mod:`benchmarks.dist`: the data-parallel applications' efficiency on 2 places.

Jacobi, CG and N-body (:mod:`apgas.arrays.apps`) at sizes where an iteration's
compute dominates, each timed as ``sequential(...)`` (numpy, or numba for
N-body's kernels, in one process) and as ``run(...)`` over 2 places, taking
turns, ``repeats`` times. Both run inside one ``apgas.run(places=2)``, at place
0 (the sequential one while place 1 idles), so the 2-place time excludes the
start of the places: it is the time of the ``run`` call, from making the arrays
to the final sums. Efficiency = T_seq / (2 x T_2), from the best times and from
the medians. The 2-place values must equal the sequential ones exactly.

The 2-place ``run(...)`` is timed twice in each repeat: with ``resilient=False``
(the iterations alone, as before the apps kept copies: the efficiency and its
ratio to the ceiling are this one's) and as the apps run by default, their
arrays resilient and copied at the commits of ``apgas.steps`` (before the first
iteration and every ``COMMIT_EVERY`` of the app): ``two_resilient_s`` and
``efficiency_resilient_*``, what the copies cost.

The ceiling each efficiency is read against: two places share this machine's
memory bandwidth, so a memory-bound kernel (Jacobi's sweep, CG's stencil and
vector updates) cannot reach 1.0; its ceiling is that of
:func:`benchmarks.dist.bandwidth_ceiling` (a Jacobi sweep alone against two
processes on half the grid each): for Jacobi with the app's own sweep (numba
when installed: one pass over memory, so it saturates the bandwidth sooner and
its ceiling is lower), for CG with numpy's (CG's kernels are numpy). N-body's kernel is compute-bound (numba,
no temporaries): its ceiling is :func:`compute_ceiling`, the same kernel on all
the bodies alone against two processes side by side on half the bodies each.
Both ceilings are measured again at the start of every repeat, beside the
runs they judge (the machine is shared: a neighbour's load that comes and goes
weighs on both alike). What is left below the ceiling (efficiency / ceiling)
is the runtime's.

A module of its own (package-private) so that :mod:`benchmarks.dist` stays the
driver of the parts.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

import apgas
from apgas.arrays.apps import cg, jacobi, nbody
from benchmarks._dist_common import side_by_side

__all__ = ["SIZES", "efficiency", "compute_ceiling", "compute_once", "ratios", "render_efficiency"]

TARGET = 0.9           # efficiency, where the problem is large enough
TARGET_CEILING = 0.95  # efficiency / ceiling
_MODULES: dict[str, Any] = {"jacobi": jacobi, "cg": cg, "nbody": nbody}

#: per mode, each app's problem (``sequential``'s and ``run``'s keywords): about 7, 1
#: and 0.05 s sequentially here
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "full": {"jacobi": {"n": 4000, "iterations": 100}, "cg": {"n": 3000, "iterations": 50},
             "nbody": {"n": 8000, "steps": 25}},
    "quick": {"jacobi": {"n": 2000, "iterations": 50}, "cg": {"n": 1500, "iterations": 40},
              "nbody": {"n": 4000, "steps": 10}},
    "tiny": {"jacobi": {"n": 200, "iterations": 5}, "cg": {"n": 100, "iterations": 5},
             "nbody": {"n": 200, "steps": 2}},
}
_WARM = {"jacobi": {"n": 50, "iterations": 2}, "cg": {"n": 50, "iterations": 2},
         "nbody": {"n": 64, "steps": 1}}


@dataclasses.dataclass
class _Times:
    seq: list[float] = dataclasses.field(default_factory=list)
    two: list[float] = dataclasses.field(default_factory=list)
    resilient: list[float] = dataclasses.field(default_factory=list)
    equal: list[bool] = dataclasses.field(default_factory=list)
    values: dict[str, float] = dataclasses.field(default_factory=dict)


def _timed(fn: Callable[..., Any], **kw: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    value = fn(**kw)
    return time.perf_counter() - began, value


def _measure(sizes: dict[str, dict[str, int]], repeats: int, ceilings: Callable[[], None],
             progress: Callable[[str], None] | None) -> dict[str, _Times]:
    """At place 0 of a 2-place run: in each repeat, the ceilings' runs (``ceilings()``,
    in processes of their own while the places idle), then every app's sequential and
    2-place runs in turn: a noisy machine weighs on the ceilings and the apps alike."""
    for app, mod in _MODULES.items():  # numba's compilation (or cache), pages, imports
        mod.sequential(**_WARM[app])
        mod.run(**_WARM[app])
    found = {app: _Times() for app in sizes}
    for rep in range(repeats):
        ceilings()
        for app, kw in sizes.items():
            mod, t = _MODULES[app], found[app]
            kinds = ("seq", "two", "resilient")
            values: dict[str, dict[str, float]] = {}
            for which in kinds[rep % 3:] + kinds[:rep % 3]:  # in turn: the noise falls on all
                if which == "seq":
                    took, values[which] = _timed(mod.sequential, **kw)
                else:
                    took, outcome = _timed(mod.run, **kw, resilient=which == "resilient")
                    values[which] = outcome.values
                getattr(t, which).append(took)
            t.equal.append(values["seq"] == values["two"] == values["resilient"])
            t.values = values["seq"]
            if progress is not None:
                progress(f"efficiency {app} {kw}, repeat {rep + 1}/{repeats}: sequential "
                         f"{t.seq[-1]:.3f} s, 2 places {t.two[-1]:.3f} s, resilient "
                         f"{t.resilient[-1]:.3f} s, {'equal' if t.equal[-1] else 'DIFFERENT'} values")
    return found


# -- the compute ceiling ----------------------------------------------------------------------

def _nbody_worker(rows: slice, n: int, times: int, start: Any, out: Connection) -> None:
    """A process of :func:`compute_ceiling`: ``times`` accelerations of bodies ``rows``
    against all ``n``, started together with the other processes; sends the seconds."""
    xs = nbody.positions(n, 0)
    acc = np.empty((n, 3))
    nbody.accelerations(xs[:2], xs, acc[:2])  # compiled (or loaded), pages touched
    start.wait()
    began = time.perf_counter()
    for _ in range(times):
        nbody.accelerations(xs[rows], xs, acc[rows])
    out.send(time.perf_counter() - began)
    out.close()


def compute_ceiling(n: int, times: int, repeats: int,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """N-body's ceiling on two places: ``times`` accelerations of all ``n`` bodies in
    one process, against two processes side by side on half the bodies each (the
    work of two places without the runtime), interleaved; ratio t(alone) / (2 x
    t(pair)) from the medians (``ratio_best`` from the best times)."""
    alone: list[float] = []
    pair: list[float] = []
    for rep in range(repeats):
        a, p = compute_once(n, times)
        alone.append(a)
        pair.append(p)
        if progress is not None:
            progress(f"compute ceiling, repeat {rep + 1}/{repeats}: alone {a:.3f} s, "
                     f"pair {p:.3f} s, ratio {a / (2 * p):.2f}")
    return ratios(f"N-body accelerations ({nbody.KERNELS})", {"n": n, "times": times}, alone, pair)


def compute_once(n: int, times: int) -> tuple[float, float]:
    """One repeat of :func:`compute_ceiling`: (alone, the slower of the pair) in seconds."""
    half = n // 2
    return (side_by_side(_nbody_worker, [(slice(0, n), n, times)], 60)[0],
            max(side_by_side(_nbody_worker, [(slice(0, half), n, times),
                                             (slice(half, n), n, times)], 60)))


def ratios(kernel: str, problem: dict[str, int], alone: list[float], pair: list[float]
           ) -> dict[str, Any]:
    """A ceiling from its times: t(alone) / (2 x t(pair)), medians and best."""
    t1, t2 = statistics.median(alone), statistics.median(pair)
    return {"kernel": kernel, **problem, "repeats": len(alone), "alone_s": alone, "pair_s": pair,
            "alone_median_s": t1, "pair_median_s": t2, "ratio": t1 / (2 * t2),
            "ratio_best": min(alone) / (2 * min(pair))}


# -- the part -----------------------------------------------------------------------------------

def efficiency(mode: str, repeats: int, bandwidth_once: Callable[[], tuple[float, float]],
               progress: Callable[[str], None] | None = None,
               jacobi_once: Callable[[], tuple[float, float]] | None = None) -> dict[str, Any]:
    """The part. ``bandwidth_once()`` runs one repeat of the memory-bandwidth ceiling
    (:func:`benchmarks.dist.bandwidth_ceiling`'s kernel and grid): (alone, pair) seconds;
    it and N-body's :func:`compute_once` run at the start of every repeat, so each
    ceiling is measured beside the figures it judges. ``jacobi_once``: the same with
    the Jacobi app's own kernel (numba: one pass over memory), Jacobi's ceiling; the
    numpy sweep's stays CG's (numpy kernels)."""
    sizes = SIZES[mode]
    nb = sizes["nbody"]
    times = min(nb["steps"] + 1, 10)
    mem: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    jac: tuple[list[float], list[float]] = ([], [])
    once_jacobi = jacobi_once or bandwidth_once

    def ceilings() -> None:
        for name, got, once in (("memory-bandwidth", mem, bandwidth_once),
                                ("jacobi-kernel", jac, once_jacobi),
                                ("compute", cpu, lambda: compute_once(nb["n"], times))):
            a, p = once()
            got[0].append(a)
            got[1].append(p)
            if progress is not None:
                progress(f"efficiency: {name} ceiling, repeat {len(got[0])}/{repeats}: alone "
                         f"{a:.3f} s, pair {p:.3f} s, ratio {a / (2 * p):.2f}")

    found = apgas.run(lambda: _measure(sizes, repeats, ceilings, progress), places=2)
    bandwidth = ratios("numpy 5-point Jacobi sweep (part 3's grid)", {}, *mem)
    own = ratios(f"the Jacobi app's sweep ({jacobi.KERNELS}, part 3's grid)", {}, *jac)
    compute = ratios(f"N-body accelerations ({nbody.KERNELS})", {"n": nb["n"], "times": times}, *cpu)
    rows = []
    for app, kw in sizes.items():
        t = found[app]
        ceiling = {"nbody": compute, "jacobi": own}.get(app, bandwidth)
        best = min(t.seq) / (2 * min(t.two))
        median = statistics.median(t.seq) / (2 * statistics.median(t.two))
        rows.append({
            "app": app, "problem": kw, "seq_s": t.seq, "two_s": t.two,
            "two_resilient_s": t.resilient, "commit_every": _MODULES[app].COMMIT_EVERY,
            "two_resilient_best_s": min(t.resilient),
            "two_resilient_median_s": statistics.median(t.resilient),
            "efficiency_resilient_best": min(t.seq) / (2 * min(t.resilient)),
            "efficiency_resilient_median": statistics.median(t.seq) / (2 * statistics.median(t.resilient)),
            "seq_best_s": min(t.seq), "seq_median_s": statistics.median(t.seq),
            "two_best_s": min(t.two), "two_median_s": statistics.median(t.two),
            "efficiency_best": best, "efficiency_median": median,
            "ceiling": ceiling["ratio"], "ceiling_best": ceiling["ratio_best"],
            "ceiling_kind": {"nbody": "compute (N-body kernel, two processes)",
                             "jacobi": "memory bandwidth (the app's own sweep, two processes)"
                             }.get(app, "memory bandwidth (numpy Jacobi sweep, two processes)"),
            "of_ceiling_best": best / ceiling["ratio_best"],
            "of_ceiling_median": median / ceiling["ratio"],
            "equal": all(t.equal), "values": t.values})
    return {"places": 2, "repeats": repeats, "nbody_kernels": nbody.KERNELS, "target": TARGET,
            "target_of_ceiling": TARGET_CEILING, "compute_ceiling": compute,
            "bandwidth_ceiling": bandwidth, "jacobi_ceiling": own,
            "jacobi_kernels": jacobi.KERNELS,
            "timing": "inside one apgas.run(places=2), at place 0: the places' start excluded; "
                      "2-place time = the run() call (arrays made, iterations, final sums)",
            "rows": rows}


def render_efficiency(e: dict[str, Any]) -> str:
    every = ", ".join(f"{r['app']} {r.get('commit_every', '?')}" for r in e["rows"])
    lines = ["| app | problem | T_seq best (median) | T_2 best (median) | efficiency best (median) "
             "| ceiling best (median) | efficiency / ceiling best (median) | resilient: T_2, efficiency "
             "best (median) | values equal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in e["rows"]:
        problem = " ".join(f"{k}={v}" for k, v in r["problem"].items())
        lines.append(
            f"| {r['app']} | {problem} | {r['seq_best_s']:.3f} s ({r['seq_median_s']:.3f}) "
            f"| {r['two_best_s']:.3f} s ({r['two_median_s']:.3f}) "
            f"| {r['efficiency_best']:.2f} ({r['efficiency_median']:.2f}) "
            f"| {r['ceiling_best']:.2f} ({r['ceiling']:.2f}) "
            f"| {r['of_ceiling_best']:.2f} ({r['of_ceiling_median']:.2f}) "
            f"| {r['two_resilient_best_s']:.3f} s ({r['two_resilient_median_s']:.3f}), "
            f"{r['efficiency_resilient_best']:.2f} ({r['efficiency_resilient_median']:.2f}) "
            f"| {r['equal']} |")
    lines.append(
        f"\n{e['repeats']} repeat(s), sequential and 2 places in turn, inside one "
        f"apgas.run(places=2) (the places' start excluded); efficiency = T_seq / (2 T_2), "
        f"target {e['target']}; ceilings measured at the start of each repeat: Jacobi the "
        f"memory-bandwidth ceiling with its own sweep ({e['jacobi_kernels']}), CG with part 3's numpy "
        f"sweep (part 3's grid), N-body its kernel ({e['nbody_kernels']}) alone against two processes on half the "
        f"bodies each; target efficiency / ceiling {e['target_of_ceiling']}. T_2 and the efficiency: "
        f"run(resilient=False), the iterations alone; resilient: run() as the apps run by default, "
        f"arrays copied at the commits of apgas.steps (before the first iteration, then every "
        f"{every} iterations; 0: no more)")
    return "\n".join(lines)
