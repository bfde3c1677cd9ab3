"""Run one of the DMR applications.

    python -m apgas.arrays.apps {jacobi,cg,nbody,sleep} [app options] [--places P]
                              [--malleable] [--check] [--commit-every K]
                              [--resilient] [--sequential] [--json]

Prints the run (places at the start and the end, time), one line per resize,
with ``--json`` one JSON object on one line, and last the values, one per line
(``checksum S``, ``residual R``, ``energy E``, floats at full precision), so
that a script reads them from the last lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
from types import ModuleType
from typing import Any

import apgas

from . import APPS, Outcome, mark

__all__ = ["load", "build_parser", "main"]

log = logging.getLogger("apgas.arrays.apps")


def load(name: str) -> ModuleType:
    """The module of application ``name`` (one of :data:`APPS`)."""
    return importlib.import_module(f"apgas.arrays.apps.{name}")


def build_parser(prog: str = "python -m apgas.arrays.apps") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="app", required=True, metavar="{" + ",".join(APPS) + "}")
    for name in APPS:
        module = load(name)
        p = sub.add_parser(name, help=(module.__doc__ or name).split("\n")[0])
        module.add_arguments(p)
        p.add_argument("--places", type=int, default=None,
                       help="places (processes); default: APGAS_PLACES, else 1")
        p.add_argument("--malleable", action="store_true",
                       help="take grow/shrink orders between iterations (APGAS_MALLEABLE_LISTEN)")
        p.add_argument("--check", action="store_true",
                       help="also ask the scheduler every few iterations, with DMR's sizes "
                            f"{module.CHECK} (min, max, preferred, factor); needs APGAS_SCHEDULER")
        p.add_argument("--check-every", type=int, default=module.CHECK_EVERY, metavar="K",
                       help=f"iterations between two checks; default {module.CHECK_EVERY}")
        p.add_argument("--commit-every", type=int, default=module.COMMIT_EVERY, metavar="K",
                       help="iterations between two commits of the arrays (copies for roll-back "
                            "after a lost place); 0: only before the first and after each order; "
                            f"default {module.COMMIT_EVERY}")
        p.add_argument("--resilient", action="store_true",
                       help="keep copies of the arrays at the commits, so that a lost place "
                            "(not place 0) rolls the run back to the last commit instead of "
                            "ending it; costs a copy of each block at its place and at a buddy, "
                            "and the time of the commits")
        p.add_argument("--sequential", action="store_true",
                       help="run the plain numpy reference in this process instead")
        p.add_argument("--json", action="store_true", help="also print one JSON object (one line)")
    return parser


def _distributed(module: ModuleType, params: dict[str, Any], ns: argparse.Namespace) -> Outcome:
    def main() -> Outcome:
        if ns.malleable or ns.check:
            log.warning("malleable: orders to the address in APGAS_MALLEABLE_LISTEN (%s)",
                        os.environ.get("APGAS_MALLEABLE_LISTEN", "a free port; set it to choose"))
        outcome: Outcome = module.run(**params, malleable=ns.malleable,
                                      check_sizes=module.CHECK if ns.check else None,
                                      check_every=ns.check_every,
                                      commit_every=ns.commit_every, resilient=ns.resilient)
        return outcome

    return apgas.run(main, places=ns.places)


def main(argv: list[str] | None = None, prog: str = "python -m apgas.arrays.apps") -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    module = load(ns.app)
    if ns.places is not None and ns.places < 1:
        parser.error(f"--places must be >= 1, got {ns.places}")
    if ns.check_every < 1:
        parser.error(f"--check-every must be >= 1, got {ns.check_every}")
    if ns.commit_every < 0:
        parser.error(f"--commit-every must be >= 0, got {ns.commit_every}")
    if ns.check and not os.environ.get("APGAS_SCHEDULER"):
        parser.error("--check asks a scheduler (apgas.check_status), but APGAS_SCHEDULER is not "
                     "set: submit the program as a job of our scheduler")
    if ns.sequential and (ns.malleable or ns.check or ns.places not in (None, 1)):
        parser.error("--sequential runs in this process alone: no --places, --malleable or --check")
    try:
        params = module.parameters(ns)
    except ValueError as e:
        parser.error(str(e))
    if ns.sequential:
        start = mark()
        values: dict[str, float] = module.sequential(**params)
        outcome = Outcome(values, mark() - start, 1, 1, 0, [])
    else:
        outcome = _distributed(module, params, ns)
    shown = " ".join(f"{k}={v}" for k, v in params.items())
    print(f"{ns.app} {shown}: {'sequential' if ns.sequential else 'distributed'}, "
          f"{outcome.places} place(s)"
          + (f" (at the end {outcome.final_places})" if outcome.final_places != outcome.places else "")
          + f", {outcome.seconds:.3f} s"
          + (f", {outcome.repeated} iteration(s) repeated after lost places" if outcome.repeated else ""),
          flush=True)
    for r in outcome.resizes:
        moved = "?" if r.move_seconds is None else f"{r.move_seconds:.3f} s"
        committed = "" if r.commit_seconds is None else f", committed in {r.commit_seconds:.3f} s"
        waited = "" if not r.wait_seconds else f", after at most {r.wait_seconds:.3f} s for the iteration"
        print(f"resize {r.kind} {r.n}: {r.places_before} -> {r.places_after} place(s) in "
              f"{r.seconds:.3f} s (data moved in {moved}{committed}{waited})")
    if ns.json:
        record = {"app": ns.app, "params": params,
                  "mode": "sequential" if ns.sequential else "distributed",
                  "malleable": bool(ns.malleable or ns.check), "check": bool(ns.check),
                  "results": outcome.values, "seconds": outcome.seconds,
                  "places": outcome.places, "final_places": outcome.final_places,
                  "commit_every": ns.commit_every, "resilient": ns.resilient,
                  "repeated": outcome.repeated,
                  "resizes": [dataclasses.asdict(r) for r in outcome.resizes]}
        print(json.dumps(record))
    for key, value in outcome.values.items():
        print(f"{key} {float(value)!r}")
    sys.stdout.flush()
    return 0
