"""Balancing beyond the cores: GLB against static splits, Dask and Ray on 8 to 64 workers of sleeping work.

    python -m benchmarks.balancing [--places 8,16,32,64] [--quick] [--json FILE] [--plot FILE]

On 2 cores, GLB against its peers says little: the cores, not the balancing,
are the limit. Here every unit of work sleeps (``glb.apps.synthetic``: each
node of a binomial UTS tree sleeps 1 ms against a running deadline), so 8 to
64 workers fit on 2 cores and *efficiency* = unit time / (workers x wall time)
measures how well the work is spread. For each worker count P:

- **GLB** (``python -m glb.apps synthetic --places P``, one worker a place,
  ``--n 8 --w 3 --lifeline binary``): all work starts at place 0
  (``compute_dynamic``); and **GLB, static start** (``--static``): each place
  starts with the static piece below, then GLB balances.
- **multiprocessing.Pool** and **Dask**, static: the P (and 8 P) pieces of
  ``synthetic.make_static_bag`` (every P-th node of the first level with P
  nodes: the root's 2000 children), each run to its end by the same sleeping
  kernel; P pieces give each worker one, 8 P pieces are handed out as workers
  free up (``chunksize=1``, Dask's own scheduling).
- **Dask, dynamic**: a task takes a stack of nodes and expands up to
  ``CUTOFF`` (256) nodes of it depth first, inline (256 ms of sleep); what is
  left of its stack is split as GLB splits it into up to ``FANOUT`` (8)
  stacks, which the task submits as new tasks (``get_client``) and waits for
  seceded (the pattern of Dask's "launch tasks from tasks"). A subtree of up
  to 256 nodes runs in one task; a bigger one spreads at Dask's task speed.
  256 was the best cutoff at 64 workers in trial runs (64: a 10-minute stall
  once, and 0.22 efficiency; 128: 0.37; 256: 0.38-0.41; 1024: a slow tail);
  a driver loop on the client (``as_completed``) managed 0.07-0.22.
- **Ray, dynamic** (``benchmarks._ray_peers``, a local Ray of P CPUs, so up
  to P worker processes): the same expansion as Dask's in a ``@ray.remote``
  task, which submits its stacks as new tasks and returns (its count, their
  refs); the driver follows the refs with ``ray.wait``. Left out without Ray.

Dask runs 2 worker processes (one a core) of P/2 threads each: the units
sleep (the GIL is free) and the kernel is numba ``nogil``, so a thread is a
full worker here, while 64 worker processes and their nannies would take a
minute to start on 2 cores and load the scheduler with their heartbeats. The
pool runs P processes, GLB P places (processes), as the task says.

A static split cannot beat its largest piece: its efficiency is at most
total / (P x largest piece), printed as the *bound* of each static row, and
no split of that level can beat total / (P x largest subtree below it) (the
*shape bound*, 8.2% of the default tree is one subtree). Every row checks
the node count against the plain UTS kernel. Timings are not asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _ray_peers
from ._balancing_sim import glb_figures, render_glb
from ._common import have_dask, install_hint, with_cli
from ._harness import Column, Harness, Run, Table, show

log = logging.getLogger("benchmarks.balancing")

PLACES = (8, 16, 32, 64)
QUICK_PLACES = (4, 8)
PER_WORKER = (1, 8)                 # static pieces per worker
CUTOFF, FANOUT = 256, 8             # Dask dynamic: nodes a task runs inline, tasks it spawns at most
GLB_ARGS = ("--n", "8", "--w", "3", "--lifeline", "binary")   # model 0.94 at 64 places (docs/results.md)
QUICK_TREE = {"type": "bin", "b0": 200.0, "q": 0.245, "m": 4, "seed": 11}   # 15,849 nodes
DEFAULT_JSON = Path("bench-results/balancing.json")  # docs/results/ only when asked (--json)


# -- the work, in any process -----------------------------------------------------------------

def warm() -> float:
    from glb.apps import synthetic
    return synthetic.warm_up()


def run_piece(params: dict, index: int, count: int) -> int:
    """Static piece ``index`` of ``count``, slept to its end; its node count."""
    from glb.apps import synthetic, uts
    synthetic.rest()   # a new task: no deadline carried over from the last one
    bag, result = synthetic.make_static_bag(params, index, count), uts.NodeCount()
    while not bag.is_empty():
        bag.process(synthetic.CHUNK)
    bag.submit(result)
    return result.nodes


def expand(rows: Any, params: dict, cutoff: int, fanout: int) -> tuple[int, list]:
    """Dask's dynamic task: up to ``cutoff`` nodes of the stack ``rows`` inline, then the
    rest of the stack as up to ``fanout`` stacks for new tasks; (nodes done, stacks)."""
    from glb.apps import synthetic, uts
    synthetic.rest()
    tree = uts.tree_of(synthetic.tree_params(params))
    bag = synthetic.SyntheticBag(uts.UTSBag(tree, rows), synthetic.unit_seconds(params))
    done = bag.process(cutoff)
    stacks = []
    while len(stacks) < fanout - 1 and bag.is_splittable():
        piece = bag.split(False)
        if piece is None:
            break
        stacks.append(piece.inner.rows())
    if not bag.is_empty():
        stacks.append(bag.inner.rows())
    return done, stacks


def expand_tree(rows: Any, params: dict, cutoff: int, fanout: int) -> tuple[int, int]:
    """A Dask task that spawns the rest of its stack as tasks and waits for them
    (seceded, so it holds no worker thread); (nodes, tasks) of its whole subtree."""
    from distributed import get_client, rejoin, secede
    done, stacks = expand(rows, params, cutoff, fanout)
    if not stacks:
        return done, 1
    client = get_client()
    futures = client.map(expand_tree, stacks, params=params, cutoff=cutoff, fanout=fanout, pure=False)
    secede()
    parts = client.gather(futures)
    rejoin()
    return done + sum(n for n, _ in parts), 1 + sum(t for _, t in parts)


# -- the systems -------------------------------------------------------------------------------

def run_glb(params: dict, places: int, static: bool, timeout: float = 900
            ) -> tuple[float, int, bool | None, list[dict] | None]:
    """``python -m glb.apps synthetic`` on ``places`` places; (seconds, nodes, correct,
    ``glb.stats()`` a place)."""
    tree = [a for k, v in params.items() if k not in ("unit_ms",)
            for a in (f"--{k}", f"{v:g}" if isinstance(v, float) else str(v))]
    args = [*tree, "--unit-ms", str(params["unit_ms"]), "--places", str(places), "--workers", "1",
            *GLB_ARGS, *(["--static"] if static else [])]
    env = {**os.environ, "APGAS_JOIN_TIMEOUT": os.environ.get("APGAS_JOIN_TIMEOUT", "300")}
    rec = with_cli("synthetic", args, env=env, timeout=timeout)
    return rec["seconds"], rec["result"], rec["correct"], rec.get("glb_stats")


_BARRIER: Any = None


def _init_pool_worker(barrier: Any) -> None:
    global _BARRIER
    warm()
    _BARRIER = barrier


def _all_ready(_: int) -> None:
    _BARRIER.wait()   # returns once every worker has loaded the kernels


def run_pool(params: dict, workers: int, piece_counts: tuple[int, ...]) -> list[tuple[float, int]]:
    """P pool processes run each split; (seconds, nodes) per piece count."""
    ctx = multiprocessing.get_context("spawn")
    out = []
    with ctx.Pool(workers, initializer=_init_pool_worker, initargs=(ctx.Barrier(workers),)) as pool:
        pool.map(_all_ready, range(workers), chunksize=1)
        for pieces in piece_counts:
            start = time.perf_counter()
            nodes = pool.starmap(run_piece, [(params, i, pieces) for i in range(pieces)], chunksize=1)
            out.append((time.perf_counter() - start, sum(nodes)))
    return out


def run_dask(params: dict, workers: int, piece_counts: tuple[int, ...]) -> tuple[list[tuple[float, int]],
                                                                                 tuple[float, int, int]]:
    """Static splits, then the dynamic tree, on one cluster of ``workers`` threads;
    ([(seconds, nodes) per piece count], (seconds, nodes, tasks) of the dynamic run)."""
    from distributed import Client, LocalCluster

    from glb.apps import synthetic
    procs = 2 if workers % 2 == 0 else 1
    with LocalCluster(n_workers=procs, threads_per_worker=workers // procs, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(warm)
        static = []
        for pieces in piece_counts:
            start = time.perf_counter()
            futures = [client.submit(run_piece, params, i, pieces, pure=False) for i in range(pieces)]
            nodes = sum(client.gather(futures))
            static.append((time.perf_counter() - start, nodes))
        root = synthetic.make_bag(params).inner.rows()
        limit = _limit(params, workers)
        start = time.perf_counter()
        try:
            nodes, tasks = client.submit(expand_tree, root, params, CUTOFF, FANOUT,
                                         pure=False).result(timeout=limit)
        except TimeoutError:
            log.warning("Dask, dynamic: no result after %.0f s; counted as 0 nodes", limit)
            nodes, tasks = 0, 0
        dynamic = (time.perf_counter() - start, nodes, tasks)
    return static, dynamic


# -- the bounds a static split allows ---------------------------------------------------------------

def bounds(params: dict, places: int) -> dict[str, Any]:
    """Total nodes, the largest static piece for each split, and the efficiency each allows."""
    from glb.apps import synthetic, uts
    total = synthetic.node_count(params)
    out: dict[str, Any] = {"total": total}
    for per in PER_WORKER:
        count = per * places
        sizes = [piece_size(params, i, count) for i in range(count)]
        out[f"largest_piece_{per}"] = max(sizes)
        out[f"bound_{per}"] = min(1.0, total / (places * max(sizes)))
    level, above = uts.frontier(synthetic.tree_params(params), places)
    largest = max(subtree_sizes(params, level))
    out["largest_subtree"] = largest
    out["shape_bound"] = min(1.0, total / (places * largest))
    return out


def piece_size(params: dict, index: int, count: int) -> int:
    from glb.apps import synthetic, uts
    bag, result = synthetic.make_static_bag({**params, "unit_ms": 0.0}, index, count), uts.NodeCount()
    while not bag.is_empty():
        bag.process(1 << 30)
    bag.submit(result)
    return result.nodes


def subtree_sizes(params: dict, level: Any) -> list[int]:
    from glb.apps import synthetic, uts
    tree = uts.tree_of(synthetic.tree_params(params))
    sizes = []
    for row in level:
        bag = uts.UTSBag(tree, row[None].copy())
        while not bag.is_empty():
            bag.process(1 << 30)
        sizes.append(bag.count)
    return sizes


# -- the measurement ----------------------------------------------------------------------------------

def measure(params: dict, places: int, dask: bool = True, ray: bool = True) -> list[dict]:
    """Every system on ``places`` workers; one row each."""
    unit = params["unit_ms"] / 1000.0
    expected = _expected(params)
    b = bounds(params, places)
    rows: list[dict] = []

    def row(system: str, pieces: int | None, seconds: float, nodes: int, bound: float | None,
            extra: dict | None = None) -> None:
        rows.append({"places": places, "system": system, "pieces": pieces, "seconds": seconds, "nodes": nodes,
                     "efficiency": nodes * unit / (places * seconds), "bound": bound,
                     "correct": nodes == expected, **(extra or {})})
        log.info("%2d workers  %-28s %8.3f s  efficiency %.3f", places, system, seconds, rows[-1]["efficiency"])

    for static in (False, True):
        seconds, nodes, _, stats = run_glb(params, places, static)
        row("GLB, static start" if static else "GLB", places if static else None, seconds, nodes, None,
            glb_figures(params, places, static, stats, _glb_config()))
    counts = tuple(per * places for per in PER_WORKER)
    for (seconds, nodes), per in zip(run_pool(params, places, counts), PER_WORKER, strict=True):
        row("multiprocessing.Pool", per * places, seconds, nodes, b[f"bound_{per}"])
    if dask:
        static, (seconds, nodes, tasks) = run_dask(params, places, counts)
        for (s, n), per in zip(static, PER_WORKER, strict=True):
            row("Dask", per * places, s, n, b[f"bound_{per}"])
        row("Dask, dynamic", None, seconds, nodes, None, {"tasks": tasks, "cutoff": CUTOFF, "fanout": FANOUT})
    if ray:
        seconds, nodes, tasks = _ray_peers.balancing_run(importlib.import_module("benchmarks.balancing"), params, places, CUTOFF, FANOUT, _limit(params, places))
        row("Ray, dynamic", None, seconds, nodes, None, {"tasks": tasks, "cutoff": CUTOFF, "fanout": FANOUT})
    for r in rows:
        r["shape_bound"] = b["shape_bound"]
    return rows


def _limit(params: dict, workers: int) -> float:
    """Seconds a dynamic run may take: 20 times the perfect balance, and a minute."""
    from glb.apps import synthetic
    return 60 + 20 * synthetic.node_count(params) * synthetic.unit_seconds(params) / workers


def _glb_config() -> dict[str, Any]:
    """GLB_ARGS as the model's keywords (n, w, lifeline)."""
    given = dict(zip(GLB_ARGS[0::2], GLB_ARGS[1::2], strict=True))
    return {"n": int(given["--n"]), "w": int(given["--w"]), "lifeline": given["--lifeline"]}


def _expected(params: dict) -> int:
    from glb.apps import synthetic
    return synthetic.node_count(params)


def render(rows: list[dict]) -> str:
    table = Table([Column("workers", 7), Column("system", 22, left=True, gap="  "), Column("pieces", 6, gap=" "),
                   Column("wall s", 8, ".3f", gap=" "), Column("efficiency", 10, ".2f", gap=" "),
                   Column("static bound", 12, gap=" "), Column("correct", 0, left=True, gap="  ")])
    lines = [table.render([r["places"], r["system"], "" if r["pieces"] is None else str(r["pieces"]), r["seconds"],
                           r["efficiency"], "" if r["bound"] is None else f"{r['bound']:.2f}", r["correct"]]
                          for r in rows)]
    for p in dict.fromkeys(r["places"] for r in rows):
        shape = next(r["shape_bound"] for r in rows if r["places"] == p)
        lines.append(f"{p} workers: no split of the level beats {shape:.2f} (total / (P x largest subtree))")
    return "\n".join([*lines, *render_glb(rows)])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = dict.fromkeys((r["system"], r["pieces"] is not None and r["pieces"] != r["places"]) for r in rows)
    for system, many in keys:
        mine = [r for r in rows if r["system"] == system
                and (r["pieces"] is not None and r["pieces"] != r["places"]) == many]
        label = f"{system} ({'8' if many else '1'} piece{'s' if many else ''}/worker)" \
            if system in ("multiprocessing.Pool", "Dask") else system
        ax.plot([r["places"] for r in mine], [r["efficiency"] for r in mine], marker="o", label=label)
    places = sorted(dict.fromkeys(r["places"] for r in rows))
    ax.plot(places, [next(r["shape_bound"] for r in rows if r["places"] == p) for p in places], "k--",
            label="static split bound (largest subtree)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(places, [str(p) for p in places])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("workers (on 2 cores)")
    ax.set_ylabel("efficiency: unit time / (workers x wall)")
    ax.set_title("Sleeping binomial UTS tree, 1 ms a node")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--places", default=None,
                        help=f"comma-separated worker counts (default {','.join(map(str, PLACES))}; "
                             f"--quick: {','.join(map(str, QUICK_PLACES))})")
    parser.add_argument("--unit-ms", type=float, default=None, help="ms a node sleeps (default 1; --quick 0.25)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a tree of 15,849 nodes, 0.25 ms units, {','.join(map(str, QUICK_PLACES))} "
                             "workers: a smoke test")
    parser.add_argument("--no-dask", action="store_true", help="leave Dask out")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="default: %(default)s")
    parser.add_argument("--plot", type=Path, default=None, help="also draw a PNG here")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    try:
        args.places = ([int(p) for p in args.places.split(",") if p] if args.places
                       else list(QUICK_PLACES if args.quick else PLACES))
    except ValueError:
        return f"--places takes integers, got {args.places!r}"
    if not args.places or min(args.places) < 2:
        return "--places: worker counts of at least 2"
    if args.unit_ms is None:
        args.unit_ms = 0.25 if args.quick else 1.0
    if not args.unit_ms > 0:
        return "--unit-ms must be positive"
    return None


def tree_params(quick: bool, unit_ms: float) -> dict:
    from glb.apps import synthetic
    return {**(QUICK_TREE if quick else synthetic.DEFAULT_TREE), "unit_ms": unit_ms}


def session(run: Run, measure_fn: Callable[..., list[dict]] = measure) -> int:
    args = run.args
    dask = have_dask() and not args.no_dask
    if not dask and not args.no_dask:
        log.warning("no Dask rows (or --no-dask): they need %s", install_hint(["distributed"]))
    params = tree_params(args.quick, args.unit_ms)
    ray = not (_ray_peers.SKIPPED or args.no_ray)
    if _ray_peers.SKIPPED and not args.no_ray:
        log.warning("no Ray rows: %s", _ray_peers.SKIPPED)
    rows: list[dict] = []
    for places in args.places:
        rows.extend(measure_fn(params, places, dask) if ray else measure_fn(params, places, dask, ray=False))
    show(render(rows))
    run.report.update({"load_average_after": os.getloadavg(), "command": run.command, "params": params,
                       "glb_args": list(GLB_ARGS), "cutoff": CUTOFF, "fanout": FANOUT, "rows": rows,
                       "ray_skipped": "--no-ray" if args.no_ray else _ray_peers.SKIPPED})
    if args.plot:
        plot(rows, args.plot)
        log.info("wrote %s", args.plot)
    return 0 if all(r["correct"] for r in rows) else 1


HARNESS = Harness("benchmarks.balancing", __doc__ or "", session, DEFAULT_JSON, "", repeats=False,
                  options=options, check=check, loggers=(log.name,),
                  needs=lambda args: ["numba", *(["matplotlib"] if args.plot else [])])
parse_args = HARNESS.parse


def main(argv: list[str] | None = None, measure_fn: Callable[..., list[dict]] = measure) -> int:
    """The harness; ``measure_fn`` stands in for :func:`measure` in tests."""
    return dataclasses.replace(HARNESS, measure=lambda run: session(run, measure_fn))(argv)


if __name__ == "__main__":
    sys.exit(main())
