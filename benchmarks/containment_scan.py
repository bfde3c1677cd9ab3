"""What one scan for a job's processes costs while other users run many processes.

    python -m benchmarks.containment_scan [--foreign N] [--env-kb K] [--repeats R] [--json FILE]

Starts ``N`` processes (default 1,000) of another user (``nobody``; as root
only), each holding an environment of ``K`` KiB (default 64) that carries a
job's tag, as an attacker would; then one job of ours (``containment.start``,
a shell and a child), with a cgroup where one can be made and without. Times
R scans (:func:`containment.members`) of each kind, and beside them, in the
same run, the scan of the earlier rule (every process's environment read, to
find the tag), which issue 40 replaced. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from apgas_scheduler.live import containment
from benchmarks._common import median, percentile
from benchmarks._harness import Column, Run, Table, harness, show, skipped

log = logging.getLogger("benchmarks.containment_scan")


def environ_scan(tag: str) -> set[int]:
    """The earlier rule, for comparison: every process whose environment holds the tag."""
    entry = f"{containment.TAG_ENV}={tag}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.add(int(name))
        except OSError:
            pass
    return found


def timed(scan: Any, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scan()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


TABLE = Table([Column("rule", 28, left=True), Column("found", 7), Column("foreign", 9),
               Column("median", 10, ".2f", "ms"), Column("p90", 10, ".2f", "ms")])


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--foreign", type=int, default=1000,
                        help="the other user's processes (default 1000)")
    parser.add_argument("--env-kb", type=int, default=64,
                        help="KiB of environment each of them holds (default 64)")


@harness("benchmarks.containment_scan", __doc__, Path("bench-results/containment_scan.json"),
         "20 scans, 200 processes", options=options)
def main(run: Run) -> int:
    known = run.args
    if os.geteuid() != 0:
        show("skipped: needs root, to start the other user's processes")
        run.path = None
        return 0
    repeats = known.repeats or (20 if known.quick else 50)
    foreign = 200 if known.quick else known.foreign
    padding = "x" * (known.env_kb * 1024)
    jobs = {"cgroup": None if containment.cgroup_base() is not None else "no writable cgroup2",
            "fallback": None}
    report = run.report
    report.update(foreign=foreign, env_kib=known.env_kb, repeats=repeats, rows={})
    handles: list[containment.Handle] = []
    squatters: list[subprocess.Popen] = []
    try:
        for kind, why_not in jobs.items():
            if why_not:
                report["rows"][kind] = {"skipped": why_not}
                continue
            handles.append(containment.start(
                f"bench-{kind}", ["/bin/sh", "-c", "sleep 600 & sleep 600"],
                cgroup=kind == "cgroup", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        tag = handles[0].identity["tag"]
        log.info("starting %d processes of nobody's, %d KiB of environment each", foreign,
                 known.env_kb)
        for _ in range(foreign):
            squatters.append(subprocess.Popen(
                ["/bin/sleep", "600"], user="nobody", start_new_session=True, cwd="/",
                env={"PAD": padding, containment.TAG_ENV: tag}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for h in handles:
            kind = "cgroup" if h.identity["cgroup"] else "fallback"
            found = containment.members(h.identity)
            times = timed(lambda h=h: containment.members(h.identity), repeats)
            report["rows"][kind] = {"members": len(found), "median_ms": median(times),
                                    "p90_ms": percentile(times, 90), "samples_ms": times,
                                    "foreign_counted": len(found & {p.pid for p in squatters})}
        times = timed(lambda: environ_scan(tag), repeats)
        report["rows"]["environ (before issue 40)"] = {
            "members": len(environ_scan(tag)), "median_ms": median(times),
            "p90_ms": percentile(times, 90), "samples_ms": times}
    finally:
        for p in squatters:
            p.kill()
        for p in squatters:
            p.wait()
        for h in handles:
            containment.kill(h.identity, 0.0)
            h.proc.wait()
    show(f"\none scan with {foreign} foreign processes ({known.env_kb} KiB environments), "
         f"{repeats} repeats",
         TABLE.render(skipped(kind, row["skipped"], "  ") if "skipped" in row else
                      [kind, row["members"], row.get("foreign_counted", "-"), row["median_ms"], row["p90_ms"]]
                      for kind, row in report["rows"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
