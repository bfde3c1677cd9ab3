"""The same UTS and Pi work through GLB, Dask distributed, Ray and multiprocessing.Pool.

    python -m benchmarks.peers [--trees T1,T3] [--apps uts,pi] [--quick] [--json FILE]

Dask and the pool get the static splits a user would write: the app's own
``make_static_bag`` cut into one piece per core, and into 8 pieces per core
(so that the pieces even out), each piece run to its end by the same numba
kernel. GLB balances dynamically. All run here, one after the other, on
2 cores, beside the kernel alone on one core; the table gives times and the
ratios to the best GLB run, and a summary line per case the best static split
over the best GLB run.

UTS runs the named sample trees of the UTS distribution (``--trees``, default
T1 and T3). A static split of a UTS tree hands out the nodes of a level near
the root (for a binomial tree, the root's 2000 children); in the geometric T1
the subtrees even out, while in the binomial T3 one child of the root holds
58% of the tree (99% in T3L), so a static split cannot beat that one piece.

Ray (``benchmarks._ray_peers``, a local Ray of 2 CPUs) runs the same static
pieces as tasks, and for UTS also dynamic tasks: a task counts up to 2^18
nodes of its stack inline (6 ms of T1L, 50 ms of T3L; 2^16 took twice as
long on T1L and T3L, 2^20 as long as 2^18), splits the rest as GLB splits a bag
into up to 8 stacks, submits a task for each and returns (its count, their
refs); the driver follows the refs with ``ray.wait``. Without Ray its rows
are left out, and the JSON says why (``ray_skipped``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from . import _ray_peers
from ._common import have_dask, install_hint, with_cli
from ._harness import Column, Run, Table, harness, show

log = logging.getLogger("benchmarks.peers")

CORES = 2
SPLITS = (CORES, 8 * CORES)
DEFAULT_TREES = ("T1", "T3")
APPS = ("uts", "pi")
PI_SAMPLES = (4_000_000_000, 40_000_000)   # full, --quick


def run_share(app_name: str, params: dict, index: int, count: int) -> Any:
    """One static piece, run to its end with the app's kernel."""
    from glb.apps.cli import load_app
    app = load_app(app_name)
    if app_name not in _WARM:     # once per process: warm_up also counts a small tree
        warm(app_name)
    bag = app.make_static_bag(params, index, count)
    result = app.make_result(params)
    while not bag.is_empty():
        bag.process(1 << 20)
    bag.submit(result)
    return result


_WARM: set[str] = set()


def warm(app_name: str) -> float:
    """Compile or load the app's kernels in this process."""
    from glb.apps.cli import load_app
    seconds = load_app(app_name).warm_up()
    _WARM.add(app_name)
    return seconds


def fold_all(app_name: str, params: dict, parts: list) -> Any:
    from glb.apps.cli import load_app
    total = load_app(app_name).make_result(params)
    for part in parts:
        total.fold(part)
    return total


_BARRIER: Any = None


def _init_pool_worker(app_name: str, barrier: Any) -> None:
    global _BARRIER
    warm(app_name)
    _BARRIER = barrier


def _all_ready(_: int) -> None:
    """Returns once every worker of the pool runs it: each has loaded the kernels."""
    _BARRIER.wait()


def with_pool(app_name: str, params: dict, pieces: int) -> tuple[float, Any]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(CORES, initializer=_init_pool_worker, initargs=(app_name, ctx.Barrier(CORES))) as pool:
        pool.map(_all_ready, range(CORES), chunksize=1)
        start = time.perf_counter()
        parts = pool.starmap(run_share, [(app_name, params, i, pieces) for i in range(pieces)],
                             chunksize=1)
        seconds = time.perf_counter() - start
    return seconds, fold_all(app_name, params, parts)


def with_dask(app_name: str, params: dict, pieces: int) -> tuple[float, Any]:
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=CORES, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather([client.submit(warm, app_name, pure=False, workers=[w])
                       for w in client.scheduler_info()["workers"]])
        start = time.perf_counter()
        futures = [client.submit(run_share, app_name, params, i, pieces, pure=False) for i in range(pieces)]
        parts = client.gather(futures)
        seconds = time.perf_counter() - start
    return seconds, fold_all(app_name, params, parts)


def cases(trees: list[str], apps: list[str], quick: bool) -> list[tuple[str, str, list[str]]]:
    """(label, app, CLI arguments) of each case to measure."""
    out = []
    if "uts" in apps:
        out.extend((f"uts {name}", "uts", ["--tree", name]) for name in trees)
    if "pi" in apps:
        out.append(("pi", "pi", ["--samples", str(PI_SAMPLES[1] if quick else PI_SAMPLES[0])]))
    return out


def measure(label: str, app_name: str, args: list[str], dask: bool = True, ray: bool = True) -> list[dict]:
    from glb.apps.cli import build_parser, load_app
    app = load_app(app_name)
    ns = build_parser({app_name: app}).parse_args([app_name, *args])
    params = app.params(ns)
    rows = []

    def row(system: str, kind: str, seconds: float, value: Any, correct: bool | None, **extra: Any) -> None:
        rows.append({"case": label, "app": app_name, "params": params, "system": system, "kind": kind,
                     "seconds": seconds, "result": value, "correct": correct, **extra})

    log.info("%s: the kernel alone on one core", label)
    rec = with_cli(app_name, [*args, "--sequential"])
    row("kernel alone (1 core)", "sequential", rec["seconds"], rec["result"], rec["correct"])
    for places, workers in ((2, 1), (1, 2)):
        log.info("%s: GLB %d place(s) x %d worker(s)", label, places, workers)
        rec = with_cli(app_name, [*args, "--places", str(places), "--workers", str(workers)])
        row(f"GLB {places}x{workers}", "glb", rec["seconds"], rec["result"], rec["correct"])
    peers = [("multiprocessing.Pool", with_pool)] + ([("Dask", with_dask)] if dask else [])
    for name, fn in peers:
        for pieces in SPLITS:
            log.info("%s: %s, %d pieces", label, name, pieces)
            seconds, result = fn(app_name, params, pieces)
            value = app.value(result)
            row(f"{name} ({pieces} static pieces)", "static", seconds, value, app.check(params, value))
    if ray:
        log.info("%s: Ray, static pieces%s", label, " and dynamic tasks" if app_name == "uts" else "")
        for system, kind, seconds, result, extra in _ray_peers.peer_runs(importlib.import_module("benchmarks.peers"), app_name, params, SPLITS, CORES):
            value = app.value(result)
            row(system, kind, seconds, value, app.check(params, value), **extra)
    best_glb = min(r["seconds"] for r in rows if r["kind"] == "glb")
    for r in rows:
        r["vs_best_glb"] = r["seconds"] / best_glb
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per case: the best GLB run, the best static split, and their ratio (> 1: GLB is faster)."""
    out = []
    for label in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == label]
        glb = min((r for r in mine if r["kind"] == "glb"), key=lambda r: r["seconds"])
        static = min((r for r in mine if r["kind"] == "static"), key=lambda r: r["seconds"], default=None)
        seq = next((r for r in mine if r["kind"] == "sequential"), None)
        dyn = min((r for r in mine if r["kind"] == "dynamic"), key=lambda r: r["seconds"], default=None)
        out.append({
            "case": label, "best_glb": glb["system"], "best_glb_seconds": glb["seconds"],
            "best_static": static and static["system"], "best_static_seconds": static and static["seconds"],
            "best_static_over_best_glb": static and static["seconds"] / glb["seconds"],
            "glb_speedup_over_kernel": seq and seq["seconds"] / glb["seconds"],
            "best_dynamic": dyn and dyn["system"], "best_dynamic_seconds": dyn and dyn["seconds"],
            "best_dynamic_over_best_glb": dyn and dyn["seconds"] / glb["seconds"],
            "all_correct": all(r["correct"] is not False for r in mine),
        })
    return out


TABLE = Table([Column("case", 9, left=True), Column("system", 40, left=True, gap=" "),
               Column("seconds", 9, ".3f", gap=" "), Column("x best GLB", 11, ".2f", gap=" "),
               Column("correct", 0, left=True, gap="  ")])


def render(rows: list[dict], summary: list[dict]) -> str:
    lines = [TABLE.render([r["case"], r["system"], r["seconds"], r["vs_best_glb"], r["correct"]] for r in rows), ""]
    for s in summary:
        static = ("no static run" if s["best_static"] is None else
                  f"best static split ({s['best_static']}) {s['best_static_seconds']:.3f} s = "
                  f"{s['best_static_over_best_glb']:.2f}x the best GLB ({s['best_glb']}) "
                  f"{s['best_glb_seconds']:.3f} s")
        speedup = "" if s["glb_speedup_over_kernel"] is None else \
            f"; GLB speed-up over the kernel alone {s['glb_speedup_over_kernel']:.2f}"
        dynamic = "" if not s.get("best_dynamic") else (
            f"; {s['best_dynamic']} {s['best_dynamic_seconds']:.3f} s = "
            f"{s['best_dynamic_over_best_glb']:.2f}x the best GLB")
        lines.append(f"{s['case']}: {static}{speedup}{dynamic}")
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trees", default=",".join(DEFAULT_TREES),
                        help="comma-separated named UTS trees (T1..T5, T1L, T2L, T3L; default %(default)s)")
    parser.add_argument("--apps", default=",".join(APPS), help="comma-separated: uts,pi (default %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/peers.json"),
                        help="where to write the results (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer Pi samples: a smoke test")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the lists of trees and apps."""
    from glb.apps.uts.trees import TREES
    args.trees = [t for t in args.trees.split(",") if t]
    args.apps = [a for a in args.apps.split(",") if a]
    for name in args.trees:
        if name not in TREES:
            return f"--trees: unknown UTS tree {name!r}; choose from {', '.join(TREES)}"
    for app in args.apps:
        if app not in APPS:
            return f"--apps: unknown app {app!r}; choose from {', '.join(APPS)}"
    if not args.apps or ("uts" in args.apps and not args.trees):
        return "nothing to measure: give --apps and, for uts, --trees"
    return None


@harness("benchmarks.peers", __doc__, repeats=False, options=options,
         check=check, needs=lambda args: ["numba"], loggers=(log.name,))
def main(run: Run) -> int:
    args = run.args
    dask = have_dask()
    if not dask:
        log.warning("no Dask rows: they need %s", install_hint(["distributed"]))
    ray = not (_ray_peers.SKIPPED or args.no_ray)
    if _ray_peers.SKIPPED and not args.no_ray:
        log.warning("no Ray rows: %s", _ray_peers.SKIPPED)
    rows: list[dict] = []
    for label, app_name, app_args in cases(args.trees, args.apps, args.quick):
        rows.extend(measure(label, app_name, app_args, dask, ray))
    summary = summarize(rows)
    show(render(rows, summary))
    run.report.update({"command": run.command, "rows": rows, "summary": summary, "cores": CORES,
                       "splits": SPLITS, "ray_skipped": "--no-ray" if args.no_ray else _ray_peers.SKIPPED})
    return 0 if all(s["all_correct"] for s in summary) else 1


parse_args = main.parse


if __name__ == "__main__":
    sys.exit(main())
