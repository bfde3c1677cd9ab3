"""The same UTS and Pi work through GLB, Dask distributed and multiprocessing.Pool.

    python -m benchmarks.peers [--quick] [--json FILE]

Dask and the pool get the static splits a user would write: the app's own
``make_static_bag`` cut into one piece per core, and into 8 pieces per core
(so that the pieces even out), each piece run to its end by the same numba
kernel. GLB
balances dynamically. All three run here, one after the other, on 2 cores;
the table gives times and the ratios to GLB.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import machine_info, parse_args, setup_logging, write_json

log = logging.getLogger("benchmarks.peers")

CORES = 2
SPLITS = (CORES, 8 * CORES)


def run_share(app_name: str, params: dict, index: int, count: int) -> Any:
    """One static piece, run to its end with the app's kernel."""
    from benchmarks.__main__ import load_app
    app = load_app(app_name)
    app.warm_up()
    bag = app.make_static_bag(params, index, count)
    result = app.make_result(params)
    while not bag.is_empty():
        bag.process(1 << 20)
    bag.submit(result)
    return result


def fold_all(app_name: str, params: dict, parts: list) -> Any:
    from benchmarks.__main__ import load_app
    total = load_app(app_name).make_result(params)
    for part in parts:
        total.fold(part)
    return total


def with_pool(app_name: str, params: dict, pieces: int) -> tuple[float, Any]:
    with multiprocessing.get_context("spawn").Pool(CORES) as pool:
        pool.starmap(run_share, [(app_name, params, 0, 1 << 30)] * CORES)  # load kernels
        start = time.perf_counter()
        parts = pool.starmap(run_share, [(app_name, params, i, pieces) for i in range(pieces)],
                             chunksize=1)
        seconds = time.perf_counter() - start
    return seconds, fold_all(app_name, params, parts)


def with_dask(app_name: str, params: dict, pieces: int) -> tuple[float, Any]:
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=CORES, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather([client.submit(run_share, app_name, params, 0, 1 << 30, pure=False,
                                     workers=[w]) for w in client.scheduler_info()["workers"]])
        start = time.perf_counter()
        futures = [client.submit(run_share, app_name, params, i, pieces, pure=False) for i in range(pieces)]
        parts = client.gather(futures)
        seconds = time.perf_counter() - start
    return seconds, fold_all(app_name, params, parts)


def with_glb(app_name: str, args: list[str], places: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "benchmarks", app_name, *args, "--places", str(places),
               "--workers", str(workers), "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


CASES = {
    "uts": (["--depth", "13"], ["--depth", "11"]),
    "pi": (["--samples", "4000000000"], ["--samples", "40000000"]),
}


def measure(app_name: str, args: list[str]) -> list[dict]:
    from benchmarks.__main__ import build_parser, load_app
    app = load_app(app_name)
    ns = build_parser({app_name: app}).parse_args([app_name, *args])
    params = app.params(ns)
    rows = []
    for places, workers in ((2, 1), (1, 2)):
        log.info("%s: GLB %d place(s) x %d worker(s)", app_name, places, workers)
        rec = with_glb(app_name, args, places, workers)
        rows.append({"app": app_name, "system": f"GLB {places}x{workers}", "seconds": rec["seconds"],
                     "result": rec["result"], "correct": rec["correct"]})
    for name, fn in (("multiprocessing.Pool", with_pool), ("Dask", with_dask)):
        for pieces in SPLITS:
            log.info("%s: %s, %d pieces", app_name, name, pieces)
            seconds, result = fn(app_name, params, pieces)
            value = app.value(result)
            rows.append({"app": app_name, "system": f"{name} ({pieces} static pieces)", "seconds": seconds,
                         "result": value, "correct": app.check(params, value)})
    best_glb = min(r["seconds"] for r in rows if r["system"].startswith("GLB"))
    for r in rows:
        r["vs_best_glb"] = r["seconds"] / best_glb
    return rows


def render(rows: list[dict]) -> str:
    lines = [f"{'app':<6} {'system':<40} {'seconds':>9} {'x best GLB':>11}  correct"]
    for r in rows:
        lines.append(f"{r['app']:<6} {r['system']:<40} {r['seconds']:>9.3f} {r['vs_best_glb']:>11.2f}  {r['correct']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "python -m benchmarks.peers", __doc__ or "",
                      Path("bench-results/peers.json"), "small sizes: a smoke test")
    setup_logging(log.name)
    rows: list[dict] = []
    for app_name, (full, quick) in CASES.items():
        rows.extend(measure(app_name, quick if args.quick else full))
    table = render(rows)
    print(table)
    write_json(args.json, {"machine": machine_info(), "rows": rows, "cores": CORES, "splits": SPLITS}, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
