"""How fast a running GLB computation takes in new places, beside the bare place start.

    python -m benchmarks.glb_grow [--app uts] [--app-args '--depth 15'] [--grow 3]
        [--repeats 5] [--json FILE] [--quick]

Each repeat runs two jobs, one after the other: the app with its modules
preloaded into the fork template (``glb.apps``' default, ``APGAS_PRELOAD``)
and without (``APGAS_PRELOAD=json``: nothing the places would not import
anyway). Each starts ``python -m glb.apps APP ... --malleable --places 1`` with
``APGAS_TIMELINE`` (:mod:`apgas._timeline.recorder`) and one GLB worker, waits until it
takes orders and computes, sends ``grow K`` and, 3 s later, ``shrink K`` (so
that the new places' load samples reach the timeline), then ends the job. From
the client and the timeline it takes:

* the grow order as the client saw it (to the ``ok grow`` reply);
* the runtime's share: starting the places (``placeStart``, the floor: what
  any malleable program pays) and GLB's ``postGrow`` (wiring the new places
  in: each imports the bag's modules, the app's numba kernels included);
* for each new place, the time from joining to its first processed unit.

Medians over the repeats; times are reported, never asserted on.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from apgas.order import send_order

from ._common import communicate_or_kill
from ._harness import Column, Run, Table, Text, harness, show

ROOT = Path(__file__).resolve().parent.parent


def _free_address() -> tuple[str, int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]


def _wait_computing(address: tuple[str, int], proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended before it took orders: {proc.communicate()[1][-500:]}")
        try:
            if send_order(address, "status", 5)[0].startswith("status malleable"):
                time.sleep(0.3)  # GLB has started computing
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the job did not take orders within {timeout} s")


VARIANTS = {"preloaded": None, "not preloaded": "json"}  # APGAS_PRELOAD (None: the app's default)


def one_grow(args: argparse.Namespace, directory: Path, preload: str | None) -> dict[str, Any]:
    address = _free_address()
    timeline = directory / "timeline.jsonl"
    timeline.unlink(missing_ok=True)
    env = {**os.environ, "APGAS_LOCAL_HOSTS": "*", "APGAS_MALLEABLE_LISTEN": "{}:{}".format(*address),
           "APGAS_TIMELINE": str(timeline), "APGAS_THREADS": "2"}
    env.pop("APGAS_PRELOAD", None)
    if preload is not None:
        env["APGAS_PRELOAD"] = preload
    proc = subprocess.Popen([sys.executable, "-m", "glb.apps", args.app, *shlex.split(args.app_args),
                             "--malleable", "--places", "1", "--workers", "1"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _wait_computing(address, proc)
        names = " ".join(f"g{i}" for i in range(args.grow))
        began = time.monotonic()
        reply = send_order(address, f"grow {args.grow} {names}", 120)
        client = time.monotonic() - began
        if not reply or not reply[0].startswith("ok grow"):
            raise RuntimeError(f"the grow failed: {reply}")
        time.sleep(3.0)
        send_order(address, f"shrink {args.grow}", 120)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        communicate_or_kill(proc, 30)
    events = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    return {"client_s": client, **_from_timeline(events)}


def _from_timeline(events: list[dict[str, Any]]) -> dict[str, Any]:
    grow = next(e for e in events if e["event"] == "order" and e["order"] == "grow")
    phases = {(e["phase"], e.get("source", "APGAS")): e["seconds"] for e in events
              if e["event"] == "phase" and e["order"] == "grow"}
    joined = {e["place"]: e["t"] for e in events if e["event"] == "join"}
    first: dict[int, float] = {}
    for e in sorted((e for e in events if e["event"] == "load"), key=lambda e: e["t"]):
        if e["processed"] > 0 and e["place"] in grow["places"]:
            first.setdefault(e["place"], e["t"] - joined[e["place"]])
    return {"order_s": grow["seconds"], "place_start_s": phases[("placeStart", "APGAS")],
            "glb_post_grow_s": phases[("postGrow", "GLB")],
            "first_work_s": sorted(first.values()), "places_working": len(first)}


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {"client_s": median("client_s"), "order_s": median("order_s"),
            "place_start_s": median("place_start_s"), "glb_post_grow_s": median("glb_post_grow_s"),
            "first_work_median_s": statistics.median(t for r in runs for t in r["first_work_s"]),
            "first_work_last_s": statistics.median(max(r["first_work_s"], default=float("nan"))
                                                   for r in runs)}


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", default="uts")
    parser.add_argument("--app-args", default="--depth 15", help="the app's size options")
    parser.add_argument("--grow", type=int, default=3, help="places to add")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench-results/glb_grow.json"))
    parser.add_argument("--quick", action="store_true", help="2 repeats")


@harness("benchmarks.glb_grow", __doc__, Path("bench-results/glb_grow.json"), "2 repeats", options=options,
         needs=lambda args: ["numba"], loggers=(), whole_doc=True)
def main(run: Run) -> None:
    args = run.args
    if args.quick:
        args.repeats = 2
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="apgas-glb-grow-") as tmp:
        for k in range(args.repeats):
            for name, preload in VARIANTS.items():  # interleaved: both see the same machine
                runs[name].append(one_grow(args, Path(tmp), preload))
                r = runs[name][-1]
                show(f"repeat {k + 1}, {name}: grow {r['client_s']:.3f} s, place start "
                     f"{r['place_start_s']:.3f} s, GLB post-grow {r['glb_post_grow_s']:.3f} s, "
                     f"first work {', '.join(f'{t:.2f}' for t in r['first_work_s'])} s")
    summary = {name: _summary(rs) for name, rs in runs.items()}
    table = Table([Column("", 34, left=True), *(Column(name, 16, ".3f", " s") for name in VARIANTS)],
                  title=f"\n{args.app} {args.app_args}: grow by {args.grow} from 1 place, median of {args.repeats}")
    rows: list[list[Any]] = [[label, *(summary[n][key] for n in VARIANTS)] for label, key in (
        ("grow order (client)", "client_s"), ("  places started (the floor)", "place_start_s"),
        ("  GLB wires them in (postGrow)", "glb_post_grow_s"),
        ("new place: join to first work", "first_work_median_s"), ("  the last new place", "first_work_last_s"))]
    rows.append(["grow order / place start", *(Text(f"{summary[n]['client_s'] / summary[n]['place_start_s']:>15.1f}x")
                                               for n in VARIANTS)])
    show(table.render(rows))
    run.report.update(app=args.app, app_args=args.app_args, grow=args.grow, repeats=args.repeats,
                      summary=summary, runs=runs)


if __name__ == "__main__":
    sys.exit(main())
