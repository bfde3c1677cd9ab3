"""Run one GLB benchmark application.

    python -m glb.apps {uts,nqueens,bc,pi,synthetic} [app options] --places P --workers W
                       [--sequential] [--static] [--malleable | --evolving] [--resilient]
                       [--checkpoint DIR [--checkpoint-interval S]] [--json FILE]

Prints the result, whether it is correct against a known reference, the time of
the computation alone and the throughput; ``--json`` writes one record. Under the
ElasticJobScheduler it also prints the Java GLB's ``Initialization time (s);`` line,
which EJS's analysis script reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import apgas
from apgas import ejs
from glb import GLB, GLBConfig

from . import APPS
from ._app import App, Params

__all__ = ["APPS", "App", "load_app", "build_parser", "run_glb", "main"]

log = logging.getLogger("glb.apps")


def load_app(name: str) -> App:
    """The ``APP`` of application ``name`` (one of :data:`APPS`)."""
    app = importlib.import_module(f"glb.apps.{name}").APP
    assert isinstance(app, App), f"glb.apps.{name}.APP is {app!r}, not an App"
    return app


def build_parser(apps: dict[str, App], prog: str = "python -m glb.apps") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="app", required=True, metavar="{" + ",".join(apps) + "}")
    for name, app in apps.items():
        p = sub.add_parser(name, help=f"the {name} benchmark")
        app.add_arguments(p)
        p.add_argument("--places", type=int, default=None,
                       help="places (processes); default: APGAS_PLACES, one per host slot or "
                            "MPI rank, else 1")
        p.add_argument("--workers", type=int, default=1, help="GLB workers per place; default 1")
        p.add_argument("--sequential", action="store_true", help="run the kernel alone on one core")
        p.add_argument("--static", action="store_true", help="static initial distribution")
        mode = p.add_mutually_exclusive_group()
        mode.add_argument("--malleable", action="store_true",
                          help="take grow/shrink orders while computing (socket communicator)")
        mode.add_argument("--evolving", action="store_true",
                          help="also ask the scheduler for places when busy and release idle "
                               "ones (needs APGAS_SCHEDULER: run it as an evolving job)")
        p.add_argument("--resilient", action="store_true",
                       help="survive the loss of places other than 0 with the exact result "
                            "(place 0 keeps backups of the others' work)")
        p.add_argument("--checkpoint", type=Path, default=None, metavar="DIR",
                       help="write a snapshot of the computation to DIR every "
                            "--checkpoint-interval seconds; a run started on a DIR holding one "
                            "of the same problem resumes from it (docs/glb.md, Checkpoints)")
        p.add_argument("--checkpoint-interval", type=float, default=60.0, metavar="S",
                       help="seconds between two snapshots (default: %(default)s)")
        p.add_argument("--n", type=int, default=None, help="GLB units per process() call")
        p.add_argument("--w", type=int, default=3, help="GLB random steal attempts")
        p.add_argument("--lifeline", default="hypercube", choices=("hypercube", "binary"))
        p.add_argument("--json", type=Path, default=None, help="write one JSON record here")
    return parser


def _warm_up_here(name: str) -> tuple[int, float]:
    return apgas.here().id, load_app(name).warm_up()


def run_glb(app: App, params: Params, ns: argparse.Namespace) -> dict[str, Any]:
    """The computation under apgas.run; returns the measured record fields."""
    def main() -> dict[str, Any]:
        begin = time.perf_counter()
        first_places = len(apgas.places())
        first = _warm_up_here(app.name)  # place 0 compiles or loads the kernels first ...
        with apgas.finish():             # ... the others then load them from the disk cache
            loads: list[tuple[int, float]] = []
            ref = apgas.GlobalRef(loads)
            for p in apgas.places()[1:]:
                apgas.async_at(p, lambda r=ref: _report_warm_up(r, app.name))
        warm = dict([first, *loads])
        config = GLBConfig(n=ns.n or app.default_n, w=ns.w, workers=ns.workers, lifeline=ns.lifeline,
                           malleable=ns.malleable, evolving=ns.evolving, resilient=ns.resilient,
                           checkpoint=os.fspath(ns.checkpoint) if ns.checkpoint else None,
                           checkpoint_interval=ns.checkpoint_interval)
        glb = GLB(config)
        if ns.malleable:
            log.warning("malleable: %s", _where_orders_go())
        start = time.perf_counter()
        if ns.static:
            result = glb.compute_static(lambda i, k: app.make_static_bag(params, i, k), app.make_result(params))
        else:
            result = glb.compute_dynamic(app.make_bag(params), app.make_result(params))
        seconds = time.perf_counter() - start
        stats = glb.stats()
        print(stats, file=sys.stderr)
        resilience = dataclasses.asdict(glb.resilience) if glb.resilience is not None else None
        checkpoints, resumed = _checkpoint_record(glb)
        return {"result_obj": result, "resumed_obj": resumed, "seconds": seconds,
                "warm_up_seconds": warm,
                "init_seconds": start - begin, "resilience": resilience,
                "checkpoints": checkpoints,
                "glb_stats": [dataclasses.asdict(s) for s in stats],
                "places": first_places, "final_places": len(apgas.places())}

    # forked places (those a grow adds too) come with the app imported and its kernels loaded
    preload = os.environ.get("APGAS_PRELOAD") or f"glb.apps.{app.name}:warm_up"
    return apgas.run(main, places=ns.places, threads=ns.workers + 1, preload=preload)


def _where_orders_go() -> str:
    """Where the job listens for orders: the port it bound, not APGAS_MALLEABLE_LISTEN's
    request (port 0, as a scheduler asks, is any free port). Starts the communicator
    GLB would start a moment later."""
    from apgas.lowlevel import listen_for_orders

    address = listen_for_orders().address
    if address is None:
        return "orders come through the communicator of APGAS_COMMUNICATOR"
    return "orders to {}:{} (APGAS_MALLEABLE_LISTEN chooses it)".format(*address)


def _checkpoint_record(glb: GLB) -> tuple[dict[str, Any] | None, Any]:
    """The checkpoints' statistics for the JSON record, and the result of the snapshot
    the run resumed from (None if it did not): the work done before this run."""
    stats = glb.checkpoints
    if stats is None:
        return None, None
    fields = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)
              if f.name != "resumed_result"}
    return fields, stats.resumed_result


def _resumed_line(record: dict[str, Any], before: int, units: int) -> str | None:
    """``resumed from snapshot K (X% done)``, if the run resumed from one."""
    seq = (record.get("checkpoints") or {}).get("resumed_from")
    if seq is None:
        return None
    share = 100.0 * before / units if units else 100.0
    return f"resumed from snapshot {seq} ({share:.1f}% done)"


def claim_checkpoint_dir(directory: Path, app: str, params: Params, static: bool) -> None:
    """Record in ``directory`` (made if missing) which problem its snapshots are of:
    the app, its parameters and its mode; ValueError naming both if it holds
    another's. GLB itself refuses a snapshot of another problem too (by its
    fingerprint); this says which one in the app's terms."""
    from apgas.lowlevel import read_sealed, write_atomically
    from apgas.serving import make_trusted_dir

    path = make_trusted_dir(directory, "the checkpoint directory") / "app.json"
    mine = {"app": app, "params": params, "mode": "static" if static else "dynamic"}
    if path.exists():
        held = json.loads(read_sealed(path))
        if held != mine:
            raise ValueError(f"the checkpoint directory {directory} holds snapshots of {held['app']} "
                             f"{held['params']} ({held['mode']}), not of {app} {params} "
                             f"({mine['mode']}); give another directory, or remove it to start "
                             "afresh")
        return
    write_atomically(path, json.dumps(mine, sort_keys=True).encode())


def _report_warm_up(ref: apgas.GlobalRef[list[tuple[int, float]]], name: str) -> None:
    item = _warm_up_here(name)
    apgas.at(ref.home, lambda: ref.get().append(item))


def main(argv: list[str] | None = None, prog: str = "python -m glb.apps") -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    apps = {name: load_app(name) for name in APPS}
    parser = build_parser(apps, prog)
    ns = parser.parse_args(argv)
    app = apps[ns.app]
    if (ns.places is not None and ns.places < 1) or ns.workers < 1:
        parser.error(f"--places and --workers must be >= 1, got {ns.places} and {ns.workers}")
    if ns.evolving and not os.environ.get("APGAS_SCHEDULER"):
        parser.error("--evolving asks a scheduler for places, but APGAS_SCHEDULER is not set: "
                     "submit it as an evolving job (python -m apgas_scheduler submit)")
    try:
        params = app.params(ns)
    except ValueError as e:
        parser.error(str(e))
    if ns.checkpoint_interval <= 0:
        parser.error(f"--checkpoint-interval must be a positive number of seconds, got "
                     f"{ns.checkpoint_interval}")
    if ns.checkpoint is not None and not ns.sequential:
        try:
            claim_checkpoint_dir(ns.checkpoint, app.name, params, ns.static)
        except (ValueError, OSError) as e:
            parser.error(str(e))
    total_start = time.perf_counter()
    before = 0  # units done before this run (a resume's snapshot)
    if ns.sequential:
        warm = {"sequential": app.warm_up()}
        start = time.perf_counter()
        result = app.sequential(params)
        seconds = time.perf_counter() - start
        places, workers, final = 1, 1, 1
    else:
        record = run_glb(app, params, ns)
        result, seconds, warm = record["result_obj"], record["seconds"], record["warm_up_seconds"]
        if record["resumed_obj"] is not None:
            before = app.units(record["resumed_obj"])
        places, workers, final = record["places"], ns.workers, record["final_places"]
        if ejs.started_by_ejs(os.environ):
            # as the Java GLB prints it after the computation: the set-up from the places'
            # start to the computation's (the app's kernels at every place, GLB's object)
            print(ejs.initialization_line(record["init_seconds"]), flush=True)
    value = app.value(result)
    units = app.units(result)
    correct = app.check(params, value)
    done = units - before  # this run's work: a resume's snapshot had done the rest
    out = {
        "benchmark": app.name, "params": params, "places": places, "final_places": final,
        "workers": workers,
        "mode": "sequential" if ns.sequential else ("static" if ns.static else "dynamic"),
        "malleable": bool(ns.malleable), "evolving": bool(ns.evolving), "resilient": bool(ns.resilient),
        "resilience": record.get("resilience") if not ns.sequential else None,
        "checkpoints": record.get("checkpoints") if not ns.sequential else None,
        # per place: units, steals (random and lifeline, tried and won), idle time, latency samples
        "glb_stats": record.get("glb_stats") if not ns.sequential else None,
        "result": value, "correct": correct,
        "seconds": seconds, "total_seconds": time.perf_counter() - total_start,
        "units": units, "unit_name": app.unit_name,
        "units_before_resume": before, "units_this_run": done,
        "throughput": done / seconds if seconds > 0 else None,
        "warm_up_seconds": warm,
    }
    print(f"{app.name} {params}: result {value}  correct {correct}")
    resumed = None if ns.sequential else _resumed_line(record, before, units)
    if resumed:
        print(f"{resumed}; the throughput counts this run's {done:,} {app.unit_name} alone")
    print(f"time {seconds:.3f} s (computation), {out['total_seconds']:.3f} s (whole run); "
          f"{out['throughput']:,.0f} {app.unit_name}/s on {places} place(s)"
          f"{f' (at the end {final})' if final != places else ''} x {workers} worker(s)")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(out, indent=2, default=str))
    return 0 if correct is not False else 1


if __name__ == "__main__":
    sys.exit(main())
