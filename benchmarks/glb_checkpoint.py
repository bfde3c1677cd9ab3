"""What GLB checkpoints cost, and what a resume takes.

    python -m benchmarks.glb_checkpoint [--depth D] [--places P] [--repeats R] [--quick] [--json FILE]

UTS (depth 14 by default, the geometric tree of ``glb.apps.uts``) on P places
(default 3) x 1 worker, R times each, the modes interleaved in every repeat so
that the machine's noise falls on all of them alike:

- ``plain``: no checkpoint;
- ``checkpoint 10 s`` and ``checkpoint 1 s``: ``--checkpoint DIR
  --checkpoint-interval S`` (snapshots written to a temporary directory);

the overhead is the median computation time against plain's (target: at most
3% at 10 s). Each checkpointing run reports how many snapshots it wrote, the
size of the last one, place 0's pauses and the time spent writing. Then a
run with 1 s snapshots is SIGKILLed whole halfway, and run again on the same
directory: the resume time (reading the newest snapshot and handing its work
to the places) and that run's length. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Column, Run, Table, Text, harness, show

log = logging.getLogger("benchmarks.glb_checkpoint")
ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.03


def uts(depth: int, places: int, record: Path, checkpoint: Path | None = None,
        interval: float = 10.0) -> list[str]:
    argv = [sys.executable, "-m", "glb.apps", "uts", "--depth", str(depth), "--places",
            str(places), "--json", str(record)]
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint), "--checkpoint-interval", str(interval)]
    return argv


def run(argv: list[str], record: Path, timeout: float = 900) -> dict[str, Any]:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "APGAS_LOG_LEVEL": "WARNING"})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(record.read_text())
    if out["correct"] is False:  # None: no published count (depth 14); the runs must agree
        raise RuntimeError(f"{' '.join(argv)}: wrong result {out['result']}")
    return out


def killed_halfway(argv: list[str], after: float) -> None:
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


TABLE = Table([Column("mode", 18, left=True), Column("seconds", 9, ".2f", "s"), Column("ratio", 8, ".3f"),
               Column("snapshots", 11, "g"), Column("bytes", 9, "g"), Column("pause", 9, ".1f", "ms"),
               Column("write", 9, ".1f", "ms")])


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--depth", type=int, default=None,
                        help="the UTS tree's depth (default 14, or 12 with --quick)")
    parser.add_argument("--places", type=int, default=3, help="places (default 3)")


@harness("benchmarks.glb_checkpoint", __doc__, Path("bench-results/glb_checkpoint.json"),
         "depth 12, one repeat", options=options)
def main(job: Run) -> int:
    known = job.args
    depth = known.depth or (12 if known.quick else 14)
    repeats = known.repeats or (1 if known.quick else 3)
    modes = {"plain": None, "checkpoint 10 s": 10.0, "checkpoint 1 s": 1.0}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="apgas-glbck-") as tmp:
        work = Path(tmp)
        for r in range(repeats):
            for mode, interval in modes.items():
                ck = work / f"ck-{r}-{mode.replace(' ', '')}" if interval else None
                out = run(uts(depth, known.places, work / "run.json", ck, interval or 0), work / "run.json")
                runs[mode].append({"seconds": out["seconds"], "checkpoints": out["checkpoints"],
                                   "result": out["result"]})
                log.info("repeat %d, %s: %.2f s", r + 1, mode, out["seconds"])
        results = {x["result"] for items in runs.values() for x in items}
        if len(results) != 1:
            raise RuntimeError(f"the runs disagree on the result: {sorted(results)}")
        plain = statistics.median(x["seconds"] for x in runs["plain"])
        killed_dir = work / "resume"
        halfway = plain / 2 + 2.0  # the places' start, then half the computation
        killed_halfway(uts(depth, known.places, work / "k.json", killed_dir, 1.0), halfway)
        t0 = time.perf_counter()
        resumed = run(uts(depth, known.places, work / "r.json", killed_dir, 1.0), work / "r.json")
        resumed_wall = time.perf_counter() - t0
    rows: dict[str, Any] = {}
    for mode, items in runs.items():
        seconds = statistics.median(x["seconds"] for x in items)
        ck = [x["checkpoints"] for x in items if x["checkpoints"]]
        rows[mode] = {"median_s": seconds, "ratio": seconds / plain,
                      "samples_s": [x["seconds"] for x in items]}
        if ck:
            rows[mode].update(
                snapshots=statistics.median(c["written"] for c in ck),
                snapshot_bytes=statistics.median(c["last_bytes"] for c in ck),
                pause_ms_each=statistics.median(1e3 * c["pause_s"] / max(1, c["written"]) for c in ck),
                write_ms_each=statistics.median(1e3 * c["write_s"] / max(1, c["written"]) for c in ck))
    report = job.report
    report.update({"depth": depth, "places": known.places,
              "repeats": repeats, "target": TARGET, "rows": rows,
              "resume": {"killed_after_s": halfway, "resumed_from": resumed["checkpoints"]["resumed_from"],
                         "resume_s": resumed["checkpoints"]["resume_s"],
                         "resumed_run_s": resumed["seconds"], "resumed_wall_s": resumed_wall,
                         "correct": resumed["result"] in results}})
    lines = []
    for mode, row in rows.items():
        verdict = ""
        if mode == "checkpoint 10 s":
            verdict = "  (target <= 1.03: " + ("met)" if row["ratio"] <= TARGET else "missed)")
        extra = [row[k] for k in ("snapshots", "snapshot_bytes", "pause_ms_each", "write_ms_each")
                 ] if "snapshots" in row else []
        lines.append([mode, row["median_s"], row["ratio"], *extra, Text(verdict)])
    res = report["resume"]
    show(f"\nUTS depth {depth}, {known.places} places x 1 worker, medians of {repeats}", TABLE.render(lines),
         f"killed whole after {res['killed_after_s']:.1f} s, resumed from snapshot "
         f"{res['resumed_from']}: reading and handing out {1e3 * res['resume_s']:.1f} ms, the "
         f"resumed computation {res['resumed_run_s']:.2f} s (correct: {res['correct']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
