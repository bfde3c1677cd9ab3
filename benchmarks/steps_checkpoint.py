"""Steps on disk: what a commit to ``checkpoint=DIR`` and a resume cost, beside ``dd`` (issue 41).

    python -m benchmarks.steps_checkpoint [--quick] [--json PATH] [--dir DIR] [--size MiB]
                                          [--arrays 2] [--places 2,4] [--repeats 3]

For each number of places P (``--places``, one ``apgas.run(places=P)`` each), at
place 0, ``--arrays`` float64 arrays of ``--size`` MiB together (``follow=True,
resilient=True``, filled) and, ``--repeats`` times, the two write modes in turn
(rotated from repeat to repeat):

- **dd**: ``dd if=/dev/zero of=DIR/dd bs=1M count=SIZE conv=fsync``, the disk's own
  write speed for the same bytes on the same filesystem, in the same run; and
  ``dd if=DIR/dd of=/dev/null bs=1M iflag=direct``, its read speed.
- **commit to disk**, per mode (``parallel``: each place writes its blocks;
  ``gathered``: place 0 writes them all): a loop of 2 empty steps with
  ``commit_every=1`` and ``checkpoint=`` a fresh folder in DIR (3 commits on disk:
  before step 0, after step 0, the final one; 2 in memory), less the same loop
  without ``checkpoint``, divided by 3: what a commit to disk adds to a loop, all
  included (block files and their checksums, fsyncs, ``state`` and the manifest,
  renames, removing the commit before the one before). The block files alone
  (``_steps_write`` of each array, timed around the call) are shown beside it.
- **resume**: a loop of the same problem started on that folder, which loads the
  final commit and yields no step: from ``apgas.steps`` to the loop's end. *Cold*:
  the commit's files dropped from the page cache first (``posix_fadvise
  DONTNEED``; no root needed, other files untouched), *warm*: read again at once.
  The arrays' sums are checked after each resume.

The tables go to stdout, everything to the JSON file (default
``bench-results/steps_checkpoint.json``; the committed figures:
``--json docs/results/steps_checkpoint.json``). ``--quick`` (32 MiB on 2 places, one
repeat) is the smoke test of tests/test_bench_steps_checkpoint.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apgas
from apgas.arrays import BlockArray
from benchmarks._common import positive_ints, scheduler_env_aside
from benchmarks._harness import Run, harness, show
from benchmarks._steps_common import MiB, expected_sum, make_arrays, mib

log = logging.getLogger("benchmarks.steps_checkpoint")

DEFAULT_JSON = Path("bench-results/steps_checkpoint.json")
MODES = ("parallel", "gathered")
LOOP_STEPS = 2
DISK_COMMITS = LOOP_STEPS + 1  # before step 0, after step 0, the final one


class Timed:
    """Stands for a BlockArray in a loop's ``arrays``; times its writes and reads to disk."""

    def __init__(self, array: BlockArray, events: list[tuple[str, float]]) -> None:
        self.array, self.events = array, events
        self.resilient, self.shape, self.dtype = array.resilient, array.shape, array.dtype

    def _steps_commit(self, tag: int) -> Any:
        return self.array._steps_commit(tag)

    def _steps_forget(self, keep: int | None) -> None:
        self.array._steps_forget(keep)

    def _steps_restore(self, commit: Any) -> None:
        self.array._steps_restore(commit)

    def _steps_write(self, folder: str, k: int, mode: str) -> list[dict[str, Any]]:
        start = time.perf_counter()
        try:
            return self.array._steps_write(folder, k, mode)
        finally:
            self.events.append(("write", time.perf_counter() - start))

    def _steps_read(self, folder: str, files: list[dict[str, Any]], mode: str) -> None:
        start = time.perf_counter()
        try:
            self.array._steps_read(folder, files, mode)
        finally:
            self.events.append(("read", time.perf_counter() - start))


# -- measurements, at place 0 ---------------------------------------------------------------

def dd(args: list[str]) -> dict[str, float]:
    """One dd run: its bytes and seconds, as it reports them, and the wall time around it."""
    start = time.perf_counter()
    out = subprocess.run(["dd", *args], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    m = re.search(r"^(\d+) bytes.* copied, ([\d.]+) s", out.stderr, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"cannot read dd's report: {out.stderr!r}")
    nbytes, seconds = int(m.group(1)), float(m.group(2))
    return {"bytes": nbytes, "seconds": seconds, "wall_s": wall, "gbs": nbytes / seconds / 1e9}


def dd_pair(folder: Path, size: int) -> tuple[dict[str, float], dict[str, float]]:
    target = folder / "dd"
    try:
        write = dd(["if=/dev/zero", f"of={target}", "bs=1M", f"count={size // MiB}", "conv=fsync"])
        read = dd([f"if={target}", "of=/dev/null", "bs=1M", "iflag=direct"])
    finally:
        target.unlink(missing_ok=True)
    return write, read


def drop_cache(folder: Path) -> None:
    """The files under ``folder`` out of the page cache (they are written and fsynced)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def empty_loop(arrays: Sequence[Any], steps: int, **kw: Any) -> float:
    start = time.perf_counter()
    for step in apgas.steps(steps, arrays=arrays, **kw):
        with step:
            pass
    return time.perf_counter() - start


def measure(folder: Path, size: int, count: int, repeats: int,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """At place 0 of a run: the dd runs and, per mode, the commits and resumes."""
    places = len(apgas.places())
    arrays = make_arrays(size, count)
    nbytes = sum(a.dtype.itemsize * a.shape[0] * a.shape[1] for a in arrays)
    events: list[tuple[str, float]] = []
    timed = [Timed(a, events) for a in arrays]
    samples: dict[str, list[float]] = {}
    dd_runs = []
    try:
        for r in range(repeats):
            write, read = dd_pair(folder, nbytes)
            dd_runs.append({"write": write, "read": read})
            samples.setdefault("dd_write_s", []).append(write["seconds"])
            samples.setdefault("dd_read_s", []).append(read["seconds"])
            for mode in MODES[r % 2:] + MODES[:r % 2]:
                plain = empty_loop(arrays, LOOP_STEPS, commit_every=1)
                where = folder / f"ckpt-{mode}-{r}"
                events.clear()
                disk = empty_loop(timed, LOOP_STEPS, commit_every=1, checkpoint=where,
                                  checkpoint_mode=mode)
                writes = [t for what, t in events if what == "write"]
                files = [sum(writes[i:i + count]) for i in range(0, len(writes), count)]
                for warmth in ("cold", "warm"):
                    if warmth == "cold":
                        drop_cache(where)
                    events.clear()
                    took = empty_loop(timed, LOOP_STEPS, checkpoint=where, checkpoint_mode=mode)
                    samples.setdefault(f"{mode}_resume_{warmth}_s", []).append(took)
                    samples.setdefault(f"{mode}_resume_{warmth}_files_s", []).append(
                        sum(t for what, t in events if what == "read"))
                    for k, a in enumerate(arrays):
                        if a.sum() != expected_sum(a, k, 0):
                            raise RuntimeError(f"{a!r} is wrong after the {warmth} resume ({mode})")
                shutil.rmtree(where)
                commit = (disk - plain) / DISK_COMMITS
                samples.setdefault(f"{mode}_commit_s", []).append(commit)
                samples.setdefault(f"{mode}_files_s", []).append(statistics.median(files))
                progress(f"{places} places, repeat {r + 1}/{repeats}, {mode}: commit to disk "
                         f"{commit:.3f} s (dd {write['seconds']:.3f} s), resume cold "
                         f"{samples[f'{mode}_resume_cold_s'][-1]:.3f} s")
    finally:
        for a in arrays:
            a.free()
    return row(places, nbytes, count, samples, dd_runs)


def _stats(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def row(places: int, nbytes: int, count: int, samples: dict[str, list[float]],
        dd_runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"places": places, "bytes": nbytes, "arrays": count, "dd": dd_runs,
                           "dd_write_s": _stats(samples["dd_write_s"]),
                           "dd_read_s": _stats(samples["dd_read_s"])}
    dd_write = out["dd_write_s"]["median"]
    for mode in MODES:
        m = {key[len(mode) + 1:]: _stats(v) for key, v in samples.items() if key.startswith(mode)}
        commit = m["commit_s"]["median"]
        m["commit_gbs"] = nbytes / commit / 1e9 if commit > 0 else None
        m["commit_over_dd"] = commit / dd_write if dd_write > 0 else None
        out[mode] = m
    return out


# -- tables and the run -----------------------------------------------------------------------

def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| arrays | places | write mode | commit to disk (GB/s) | block files | "
             "dd write, same bytes (GB/s) | commit / dd | resume, cold | resume, warm | "
             "dd read (direct) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        dd_w, dd_r = r["dd_write_s"]["median"], r["dd_read_s"]["median"]
        for mode in MODES:
            m = r[mode]
            lines.append(
                f"| {mib(r['bytes'])} in {r['arrays']} | {r['places']} | {mode} | "
                f"{_s(m['commit_s']['median'])} ({_x(m['commit_gbs'])}) | {_s(m['files_s']['median'])} | "
                f"{_s(dd_w)} ({r['bytes'] / dd_w / 1e9:.2f}) | {_x(m['commit_over_dd'])} | "
                f"{_s(m['resume_cold_s']['median'])} | {_s(m['resume_warm_s']['median'])} | "
                f"{_s(dd_r)} |")
    if rows:
        n = len(rows[0]["dd_write_s"]["samples"])
        lines.append(f"\nmedians of {n} repeat(s), the modes in turn; commit = (loop of "
                     f"{LOOP_STEPS} empty steps, commit_every=1, checkpoint=DIR - the same without "
                     f"checkpoint) / {DISK_COMMITS} commits on disk; block files: the arrays' "
                     "_steps_write alone; resume: a loop started on the final commit (it loads it "
                     "and yields no step), cold after posix_fadvise(DONTNEED) of its files")
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="32 MiB on 2 places, one repeat: a smoke test")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="where to write the results (default: %(default)s)")
    parser.add_argument("--dir", type=Path,
                        help="the filesystem to measure: a directory made in it (default: in /tmp)")
    parser.add_argument("--size", type=int, help="MiB of arrays in all (default 1024; --quick 32)")
    parser.add_argument("--arrays", type=int, default=2, help="arrays the size is split over (default 2)")
    parser.add_argument("--places", type=positive_ints, help="numbers of places (default 2,4; --quick 2)")
    parser.add_argument("--repeats", type=int, help="repeats (default 3; --quick 1)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options; else the defaults of the mode filled in."""
    for name in ("size", "arrays", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name} must be at least 1, got {value}"
    args.size = (args.size or (32 if args.quick else 1024)) * MiB
    args.places = args.places or ([2] if args.quick else [2, 4])
    args.repeats = args.repeats or (1 if args.quick else 3)
    return None


@harness("benchmarks.steps_checkpoint", __doc__, options=options, check=check,
         loggers=(log.name,))
def main(run: Run) -> int:
    args, report = run.args, run.report
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="apgas-ckpt-bench-", dir=args.dir or "/tmp"))
    report.update({
        "mode": "quick" if args.quick else "full",
        "params": {"bytes": args.size, "arrays": args.arrays, "places": args.places,
                   "repeats": args.repeats, "loop_steps": LOOP_STEPS, "disk_commits": DISK_COMMITS},
        "command": run.command, "dir": str(folder), "filesystem": filesystem(folder)})
    total = len(args.places) * args.repeats * len(MODES)
    done = [0]

    def progress(what: str) -> None:
        done[0] += 1
        log.info("[%d/%d] %s", done[0], total, what)

    rows = []
    try:
        with scheduler_env_aside(log):
            for places in args.places:
                log.info("%s in %d arrays on %d places, %d repeat(s), in %s", mib(args.size),
                         args.arrays, places, args.repeats, folder)
                rows.append(apgas.run(lambda: measure(folder, args.size, args.arrays, args.repeats,
                                                      progress), places=places))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report["rows"] = rows
    report["fastest_mode"] = {str(r["places"]): min(MODES, key=lambda m: r[m]["commit_s"]["median"])
                              for r in rows}
    show("\ncommits to disk and resumes, beside dd\n" + render(rows))
    return 0


parse_args = main.parse


def filesystem(folder: Path) -> dict[str, Any]:
    """The mount that holds ``folder``: its device, type and free bytes."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mount, kind = line.split()[:3]
                if str(folder).startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[1]):
                    best = (dev, mount, kind)
    except OSError:
        pass
    st = os.statvfs(folder)
    return {"device": best[0], "mount": best[1], "type": best[2], "free_bytes": st.f_bavail * st.f_frsize}


if __name__ == "__main__":
    sys.exit(main())
