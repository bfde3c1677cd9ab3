"""Job models for DMR's workload study, fitted from our Jacobi, CG and N-body on this machine.

    python -m benchmarks._dmr_fit [--out DIR] [--repeats 3] [--node-cores 16] [--quick]

Writes ``DIR/dmr_fit.json`` (default ``bench-results``); the models of
:mod:`apgas_scheduler.sim.dmr_workload` copy its figures (from ``--out docs/results``).

What is measured, per application (:mod:`apgas.arrays.apps`, at the problem sizes
``n`` of :data:`FIT_PROBLEMS`, the largest of ``benchmarks.dist``'s efficiency
study), inside one ``apgas.run(places=2)`` at place 0, ``repeats`` times:

* one iteration of ``run(...)`` on 1 place (``places=[0]``) and on 2 places,
  from the times at which the run passes its reconfiguring points
  (``on_iteration``; the first iteration, the arrays' first touch, left out),
  median over the iterations: ``t1`` and ``t2``; the values must equal the
  reference's (``sequential(...)``) bit for bit;
* the same on a problem so small (``n`` = 64) that its compute is nothing:
  what an iteration costs besides its compute, ``o1`` on 1 place and ``o2`` on
  2 (task rounds, halos, the reductions at place 0: the runtime's and the
  communication's);
* the two places' ceiling on this machine (they share its memory bandwidth
  and cores): the app's kernel alone on the whole problem against two
  processes side by side on half of it each, ``e`` = t(alone) / (2 t(pair)),
  with :mod:`benchmarks._dist_ceiling` (Jacobi with its own sweep, CG with
  numpy's, its kernels being numpy) and :mod:`benchmarks._dist_efficiency`
  (N-body's kernel);
* then, in an ``apgas.run(places=1)`` of its own, malleable, three grow orders
  (1 -> 2 places) and three shrink orders (2 -> 1) between the iterations
  (orders to the run's socket, every host name this machine), each timed by the
  application (``Outcome.resizes``: the whole order and, within it, the
  re-spread of the arrays); the values must equal the reference's.

How the fit goes. Amdahl's law per iteration: ``t(k) = S + C / k``, ``S`` the
part that does not shrink with the places, ``C`` the compute. ``S`` is the
measured ``o2`` (the cost of an iteration across places), ``C = t1 - o1`` (an
iteration on 1 place less its own overhead). Two places here can only be
checked, not fitted: they share 2 cores with each other and with whatever else
runs, so their speed-up says more about the machine than about the app (a
ceiling of 0.5 leaves nothing to fit). The fit error is the larger of the
model's relative miss of ``t1`` (``S + C``) and its median miss of the 2-place
times, each against ``S + C / (2 e)`` with the ceiling ``e`` measured just
before it (the compute of two places slowed as this machine slowed it then);
a neighbour's load that comes and goes between the two shows in that miss.
The serial fraction here (one core a place) is ``S / (S + C)``.

Extrapolation to a node of 16 cores (MareNostrum's, DMR's platform): the
compute of a node is ``node-cores`` times a core's (an app whose places used
all the cores of their node), what does not shrink with the places stays as
measured, so the serial fraction of one node is ``S / (S + C / 16)``. Both
are assumptions: a memory-bound kernel (Jacobi, CG) gains less than 16 from
16 cores, and the communication of InfiniBand differs from this machine's
loopback; and Amdahl's ``S`` does not grow with the places, where N-body's
gather of all positions does. The fraction depends on the problem size (a
larger grid has more compute per halo), which DMR does not give.

Resize cost, in the form the simulator charges (``alpha dN + beta / N + b dN``,
MEBF's): ``alpha`` the mean re-spread of the arrays per node changed, ``b``
the mean rest of an order (places started or stopped, the order's round
trips), ``beta`` 0: grows and shrinks of one node give no second size to
separate a term in ``1 / N``. Its error: the larger relative miss of the
mean grow and the mean shrink (the model is symmetric, the orders are not),
and the same in seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apgas
from apgas.arrays.apps import cg, jacobi, nbody
from apgas.order import send_order
from benchmarks._dist_ceiling import bandwidth_once
from benchmarks._dist_efficiency import SIZES, compute_once
from benchmarks._harness import Run, harness, show

__all__ = ["FIT_PROBLEMS", "NODE_CORES", "fit_amdahl", "fit_resize", "node_serial", "measure", "main"]

log = logging.getLogger("benchmarks.dmr_fit")

MODULES: dict[str, Any] = {"jacobi": jacobi, "cg": cg, "nbody": nbody}
STEPS = {"jacobi": "iterations", "cg": "iterations", "nbody": "steps"}
#: per mode and app: the problem (``benchmarks.dist``'s largest, or quick, ``n``) and the
#: iterations of a timed run
FIT_PROBLEMS: dict[str, dict[str, tuple[dict[str, int], int]]] = {
    "full": {"jacobi": ({"n": SIZES["full"]["jacobi"]["n"]}, 30),
             "cg": ({"n": SIZES["full"]["cg"]["n"]}, 8), "nbody": ({"n": SIZES["full"]["nbody"]["n"]}, 6)},
    "quick": {app: ({"n": SIZES["quick"][app]["n"]}, 5) for app in MODULES},
}
TINY = ({"n": 64}, 60)   # the problem whose iterations are all overhead, and its iterations
NODE_CORES = 16          # MareNostrum's nodes: two 8-core Xeon E5-2670
RESIZE_CYCLES = 3        # grow then shrink, this many times
ORDER_TIMEOUT = 120.0


def _kw(app: str, problem: dict[str, int], steps: int) -> dict[str, int]:
    return {**problem, STEPS[app]: steps}


# -- the fits (pure: the tests run them on the recorded figures) --------------------------------

def fit_amdahl(one: float, over_one: float, over_two: float,
               twos: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """Amdahl's ``t(k) = S + C / k`` for one iteration: ``S`` = ``over_two`` (an
    iteration's cost besides compute, across 2 places), ``C`` = ``one - over_one``.
    The misses: of ``one`` by ``S + C``, and of each 2-place time of ``twos`` (pairs of
    the time and the ceiling measured beside it) by ``S + C / (2 e)``, ``e`` the
    ceiling (at most 1); ``fit_error`` is the larger of the first and the median of the
    others. ValueError for times that are not positive, an overhead not below its
    time, or a ceiling outside (0, 1.5]."""
    if not (one > 0 and over_one > 0 and over_two > 0 and all(t > 0 for t, _ in twos)):
        raise ValueError(f"times must be positive, got {one!r}, {over_one!r}, {over_two!r}, {twos!r}")
    if over_one >= one:
        raise ValueError(f"the overhead of an iteration ({over_one!r} s) must be below its time "
                         f"({one!r} s): make the problem larger")
    if not all(0 < e <= 1.5 for _, e in twos):
        raise ValueError(f"a ceiling is a ratio in (0, 1.5], got {[e for _, e in twos]!r}")
    serial, compute = over_two, one - over_one
    miss_one = abs(serial + compute - one) / one
    miss_two = [abs(serial + compute / (2 * min(1.0, e)) - t) / t for t, e in twos]
    return {"serial_s": serial, "compute_s": compute, "miss_one": miss_one, "miss_two": miss_two,
            "fit_error": max([miss_one, statistics.median(miss_two)] if twos else [miss_one]),
            "serial_here": serial / (serial + compute)}


def node_serial(serial: float, compute: float, cores: int = NODE_CORES) -> float:
    """Amdahl's serial fraction of one node whose ``cores`` each compute as this
    machine's core does: ``S / (S + C / cores)``."""
    if cores < 1 or serial < 0 or compute <= 0:
        raise ValueError(f"need cores >= 1, serial >= 0, compute > 0; got {cores!r}, {serial!r}, "
                         f"{compute!r}")
    return serial / (serial + compute / cores)


def fit_resize(resizes: list[dict[str, Any]]) -> dict[str, float]:
    """``alpha`` (re-spread of the arrays) and ``b`` (the rest) per node changed from
    orders of one node each (``kind``, ``seconds``, ``move_seconds``, ``wait_seconds``);
    the fit error against the mean grow and the mean shrink."""
    if not resizes or any(r["n"] != 1 for r in resizes) or {r["kind"] for r in resizes} != {"grow", "shrink"}:
        raise ValueError(f"need grow and shrink orders of one node each, got {resizes!r}")
    own = [r["seconds"] - (r["wait_seconds"] or 0.0) for r in resizes]  # not the iteration's end
    moves = [r["move_seconds"] or 0.0 for r in resizes]
    alpha = statistics.fmean(moves)
    b = max(0.0, statistics.fmean(own) - alpha)
    kinds = {k: statistics.fmean(t for t, r in zip(own, resizes, strict=True) if r["kind"] == k)
             for k in ("grow", "shrink")}
    return {"alpha": alpha, "beta": 0.0, "b": b, "grow_s": kinds["grow"], "shrink_s": kinds["shrink"],
            "fit_error": max(abs(alpha + b - t) / t for t in kinds.values()),
            "fit_error_s": max(abs(alpha + b - t) for t in kinds.values())}


# -- the measurements -------------------------------------------------------------------------------

def _iterations(mod: Any, kw: dict[str, int], **options: Any) -> tuple[list[float], dict[str, float]]:
    """One ``run``: the seconds of its iterations but the first, and its values."""
    stamps: list[float] = []
    outcome = mod.run(**kw, on_iteration=lambda done: stamps.append(time.perf_counter()), **options)
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)], outcome.values


def _ceiling(app: str, problem: dict[str, int]) -> tuple[float, float]:
    n = problem["n"]
    if app == "nbody":
        return compute_once(n, 2)
    return bandwidth_once(n, n, 10, app=app == "jacobi")


def _timings(problems: dict[str, tuple[dict[str, int], int]], repeats: int,
             progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """At place 0 of a 2-place run: per app and repeat, the ceiling and an iteration's
    time on 1 and 2 places, of the problem and of the tiny one."""
    here = apgas.here()
    found: dict[str, dict[str, Any]] = {}
    for app, (problem, steps) in problems.items():
        mod = MODULES[app]
        tiny = _kw(app, *TINY)
        mod.sequential(**tiny)  # numba's compilation (or cache), imports
        kw = _kw(app, problem, steps)
        want = mod.sequential(**kw)
        got: dict[str, Any] = {"problem": problem, "steps": steps, "tiny": tiny, "one_s": [],
                               "two_s": [], "over_one_s": [], "over_two_s": [], "alone_s": [],
                               "pair_s": [], "equal": True}
        found[app] = got
        for rep in range(repeats):
            alone, pair = _ceiling(app, problem)
            one, v1 = _iterations(mod, kw, places=[here])
            two, v2 = _iterations(mod, kw)
            over_one, _ = _iterations(mod, tiny, places=[here])
            over_two, _ = _iterations(mod, tiny)
            got["equal"] = got["equal"] and v1 == want and v2 == want
            for key, value in (("one_s", one), ("two_s", two), ("over_one_s", over_one),
                               ("over_two_s", over_two)):
                got[key].append(statistics.median(value))
            got["alone_s"].append(alone)
            got["pair_s"].append(pair)
            progress(f"{app} {problem}, repeat {rep + 1}/{repeats}: an iteration takes "
                     f"{got['one_s'][-1] * 1e3:.1f} ms on 1 place, {got['two_s'][-1] * 1e3:.1f} ms on 2; "
                     f"without compute {got['over_one_s'][-1] * 1e3:.2f} and "
                     f"{got['over_two_s'][-1] * 1e3:.2f} ms; ceiling {alone / (2 * pair):.2f}; "
                     f"values {'equal' if got['equal'] else 'DIFFERENT'}")
    return found


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _resize_main(app: str, kw: dict[str, int], address: str) -> tuple[list[dict[str, Any]], bool]:
    """At place 0 of a malleable 1-place run: grow and shrink by one place between the
    iterations, ``RESIZE_CYCLES`` times; the orders as the app timed them, values equal."""
    host, port = address.rsplit(":", 1)
    mod = MODULES[app]

    def order(done: int) -> None:
        if done <= 2 * RESIZE_CYCLES:
            words = ["grow", "1", f"fit{done}"] if done % 2 else ["shrink", "1"]
            reply = send_order((host, int(port)), words, ORDER_TIMEOUT)
            if not reply or reply[0].startswith("error"):
                raise RuntimeError(f"{app}: order {' '.join(words)!r} answered {reply}")

    outcome = mod.run(**kw, malleable=True, on_iteration=order)
    resizes = [{"kind": r.kind, "n": r.n, "from": r.places_before, "to": r.places_after,
                "seconds": r.seconds, "move_seconds": r.move_seconds, "wait_seconds": r.wait_seconds}
               for r in outcome.resizes]
    return resizes, outcome.values == mod.sequential(**kw)


def _resizes(app: str, problem: dict[str, int]) -> tuple[list[dict[str, Any]], bool]:
    kw = _kw(app, problem, 2 * RESIZE_CYCLES + 1)
    old = os.environ.get("APGAS_LOCAL_HOSTS")
    os.environ["APGAS_LOCAL_HOSTS"] = "*"  # the grown places' host names are this machine
    address = _free_address()
    try:
        return apgas.run(lambda: _resize_main(app, kw, address), places=1, malleable_listen=address)
    finally:
        if old is None:
            os.environ.pop("APGAS_LOCAL_HOSTS", None)
        else:
            os.environ["APGAS_LOCAL_HOSTS"] = old


def measure(mode: str = "full", repeats: int = 3, cores: int = NODE_CORES,
            progress: Callable[[str], None] = log.info) -> dict[str, Any]:
    """The measurements and fits of every app (see the module's docstring)."""
    problems = FIT_PROBLEMS[mode]
    for var in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN"):
        os.environ.pop(var, None)  # the runs take orders from us, not from a scheduler
    timings = apgas.run(lambda: _timings(problems, repeats, progress), places=2)
    apps: dict[str, Any] = {}
    for app, t in timings.items():
        resizes, equal = _resizes(app, t["problem"])
        progress(f"{app}: " + ", ".join(f"{r['kind']} {r['seconds']:.3f} s (data {r['move_seconds'] or 0:.3f} s)"
                                         for r in resizes))
        ceiling = statistics.median(t["alone_s"]) / (2 * statistics.median(t["pair_s"]))
        medians = {f"{key}_median_s": statistics.median(t[f"{key}_s"])
                   for key in ("one", "two", "over_one", "over_two")}
        ceilings = [a / (2 * p) for a, p in zip(t["alone_s"], t["pair_s"], strict=True)]
        fit = fit_amdahl(medians["one_median_s"], medians["over_one_median_s"],
                         medians["over_two_median_s"], list(zip(t["two_s"], ceilings, strict=True)))
        apps[app] = {**t, "equal": t["equal"] and equal, "measured_ceiling": ceiling, **medians,
                     "amdahl": fit,
                     "serial_node": node_serial(fit["serial_s"], fit["compute_s"], cores),
                     "resizes": resizes, "resize": fit_resize(resizes)}
    return {"mode": mode, "repeats": repeats, "node_cores": cores, "apps": apps}


def render(fit: dict[str, Any]) -> str:
    lines = ["| app | n | 1 place | 2 places | overhead, 1 place | overhead, 2 places (S) | "
             "C | ceiling | miss of 1 place | miss of 2 (median) | "
             f"serial here | serial, {fit['node_cores']}-core node | grow | shrink | alpha + b | "
             "resize fit error | values equal |", "| --- " * 17 + "|"]
    for app, a in fit["apps"].items():
        f, r = a["amdahl"], a["resize"]
        lines.append(f"| {app} | {a['problem']['n']} | {a['one_median_s'] * 1e3:.1f} ms | "
                     f"{a['two_median_s'] * 1e3:.1f} ms | {a['over_one_median_s'] * 1e3:.2f} ms | "
                     f"{f['serial_s'] * 1e3:.2f} ms | {f['compute_s'] * 1e3:.1f} ms | "
                     f"{a['measured_ceiling']:.2f} | {f['miss_one']:.1%} | "
                     f"{statistics.median(f['miss_two']):.0%} | "
                     f"{f['serial_here']:.4f} | {a['serial_node']:.4f} | {r['grow_s']:.3f} s | "
                     f"{r['shrink_s']:.3f} s | {r['alpha'] + r['b']:.3f} s | {r['fit_error']:.0%} "
                     f"({r['fit_error_s']:.2f} s) | "
                     f"{a['equal']} |")
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="where dmr_fit.json goes (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the timings (default 3)")
    parser.add_argument("--node-cores", type=int, default=NODE_CORES,
                        help=f"cores of a cluster node, for the extrapolation (default {NODE_CORES})")
    parser.add_argument("--quick", action="store_true", help="smaller problems (a smoke test)")


def check(args: argparse.Namespace) -> str | None:
    if not 1 <= args.repeats <= 20:
        return f"--repeats must be 1..20, got {args.repeats}"
    if not 1 <= args.node_cores <= 1024:
        return f"--node-cores must be 1..1024, got {args.node_cores}"
    return None


@harness("benchmarks._dmr_fit", __doc__, options=options, check=check, loggers=(log.name,))
def main(run: Run) -> int:
    ns = run.args
    began = time.monotonic()
    fit = measure("quick" if ns.quick else "full", ns.repeats, ns.node_cores)
    run.path = ns.out / "dmr_fit.json"
    run.report.update({"command": "python -m benchmarks._dmr_fit " + " ".join(run.argv), "elapsed_seconds": time.monotonic() - began,
                       **fit})
    show(render(fit))
    return 0 if all(a["equal"] for a in fit["apps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
