"""Steps: what commits, recovery and ``with step:`` cost (issue 39).

    python -m benchmarks.steps [--quick] [--json PATH] [--no-commit] [--no-recovery] [--no-overhead]
                               [--sizes 256,1024] [--places 2,4] [--arrays 2] [--commit-steps 6]
                               [--repeats 5] [--recovery-size 256] [--recovery-places 4]
                               [--recovery-repeats 5] [--overhead-places 2] [--overhead-repeats 10]
                               [--empty-steps 100000] [--jacobi-n 4000] [--iterations 100]

Three parts, in one run, each a table:

1. **Commits** (:mod:`benchmarks._steps_commit`). For each number of places P
   (``--places``, one ``apgas.run(places=P)`` each) and each size S (``--sizes``, in
   MiB: the float64 arrays together, split over ``--arrays`` arrays made with
   ``follow=True, resilient=True``): the time of a commit as an empty step loop
   pays it, (loop with ``commit_every=1`` - loop with ``commit_every=0``) / (N - 1)
   for N = ``--commit-steps``, beside the bare transfer of the same bytes in the
   same run (every owner but place 0 sending its blocks to its buddy in
   ``CHUNK_BYTES`` messages of ``async_at``; the same after copying them locally
   into buffers made beforehand; the same into new buffers, as a commit makes its
   copies), the five in turn, ``--repeats`` times. Also the bytes a commit sends
   (computed from its layout, and measured on the loopback interface), the extra
   memory per place (computed: each place's copy of its blocks plus the blocks it
   keeps as a buddy; measured: resident memory while a commit is held, and its peak
   over commits).
2. **Recovery** (:mod:`benchmarks._steps_recovery`): from a SIGKILL of a place other
   than 0, inside a step, to the body of the next step running on the survivors,
   with ``--recovery-size`` MiB of arrays on ``--recovery-places`` places, broken
   down into detection, unwinding, restore, re-commit and the rest; a fresh
   ``apgas.run`` per repetition, the victim taking turns over places 1 .. P-1; the
   arrays' contents checked exact afterwards.
3. **Overhead** (:mod:`benchmarks._steps_overhead`): ``with step:`` around an empty
   step (``--empty-steps`` steps against a plain ``for`` loop) and around a Jacobi
   iteration (``--jacobi-n``, ``--iterations`` per loop; a plain loop against the
   steps loop with ``commit_every=0`` and with ``commit_every=10``), the variants
   in turn on the same ``--overhead-places`` places, ``--overhead-repeats`` times.
   Target:
   ``with step:`` at most 2% of the iteration without commits.

Progress goes to the log (INFO, one line per measurement with the time left), the
tables to stdout, everything to the JSON file (default ``bench-results/steps.json``;
the committed figures: ``--json docs/results/steps.json``). Sizes whose peak does
not fit in ``MemAvailable`` are skipped with a printed reason. Times are reported,
never asserted on. ``--quick`` (8 MiB, one repeat, a 400 x 400 grid; about half a
minute) is the smoke test of tests/test_bench_steps.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apgas
from benchmarks._common import positive_ints
from benchmarks._harness import Run, harness, in_parts
from benchmarks._steps_commit import measure_commits
from benchmarks._steps_common import GiB, MiB, Progress, fits, mib
from benchmarks._steps_overhead import JACOBI_VARIANTS, empty_steps, jacobi_loops
from benchmarks._steps_recovery import COMMIT_EVERY, PHASES, recover_once, recovery_row

log = logging.getLogger("benchmarks.steps")

DEFAULT_JSON = Path("bench-results/steps.json")
TARGET = 0.02                        # with step: at most 2% of a Jacobi iteration
KILL_AT = 3                          # recovery: the step in which the victim is killed
RECOVERY_STEPS = 6


@dataclasses.dataclass(frozen=True)
class Params:
    """What one session measures."""

    sizes: tuple[int, ...]           # part 1, bytes of arrays in all
    places: tuple[int, ...]          # part 1
    arrays: int
    commit_steps: int
    repeats: int                     # part 1
    recovery_size: int
    recovery_places: int
    recovery_repeats: int
    overhead_places: int
    overhead_repeats: int
    empty_steps: int
    jacobi_n: int
    iterations: int


def make_params(args: argparse.Namespace) -> Params:
    """The defaults of the mode, overridden by the options given."""
    if args.quick:
        p = Params((8 * MiB,), (2, 4), 2, 3, 1, 8 * MiB, 4, 1, 2, 1, 2000, 400, 20)
    else:
        p = Params((256 * MiB, 1024 * MiB), (2, 4), 2, 6, 5, 256 * MiB, 4, 5, 2, 10, 100_000, 4000, 100)
    given = {"sizes": tuple(s * MiB for s in args.sizes) if args.sizes else None,
             "places": tuple(args.places) if args.places else None, "arrays": args.arrays,
             "commit_steps": args.commit_steps, "repeats": args.repeats,
             "recovery_size": args.recovery_size * MiB if args.recovery_size else None,
             "recovery_places": args.recovery_places, "recovery_repeats": args.recovery_repeats,
             "overhead_places": args.overhead_places, "overhead_repeats": args.overhead_repeats,
             "empty_steps": args.empty_steps,
             "jacobi_n": args.jacobi_n, "iterations": args.iterations}
    return dataclasses.replace(p, **{k: v for k, v in given.items() if v is not None})


# -- tables -------------------------------------------------------------------------------------------

def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s" if value >= 0.01 else f"{value * 1e3:.2f} ms"


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _b(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= GiB:
        return f"{value / GiB:.4g} GiB"
    return f"{value / MiB:.4g} MiB" if abs(value) >= MiB else f"{value / 1024:.0f} KiB"


def render_commits(rows: list[dict[str, Any]]) -> str:
    def cell(r: dict[str, Any], key: str) -> str:
        return f"{_s(r[f'{key}_s']['median'])} ({_x(r[f'{key}_gbs']['median'])} GB/s)"

    lines = ["| arrays | places | sent per commit | commit (GB/s) [best] | copying: 2nd commit of a loop / later | "
             "bare send (GB/s) | bare copy + send | bare fresh copy + send | commit / bare send | "
             "commit / bare copy + send | commit / bare fresh |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {mib(r['bytes'])} | {r['places']} | {_b(r['network_bytes'])} | "
            f"{cell(r, 'commit')} [{_s(r['commit_s']['best'])}] | "
            f"{_s(r['copies_by_order_s']['second']['median'])} / {_s(r['copies_by_order_s']['later']['median'])} | "
            f"{cell(r, 'bare')} | {cell(r, 'bare_copy')} | {cell(r, 'bare_fresh')} | "
            f"{_x(r['commit_over_bare']['median'])} | {_x(r['commit_over_bare_copy']['median'])} | "
            f"{_x(r['commit_over_bare_fresh']['median'])} |")
    lines += ["", "| arrays | places | sent to buddies (computed) | on the loopback (measured) | "
              "copied at the owners | extra memory per place, computed (most) | "
              "held while a commit stands, measured (most) | peak over commits, measured (most) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        m = r["memory"]
        lines.append(
            f"| {mib(r['bytes'])} | {r['places']} | {_b(r['network_bytes'])} | "
            f"{_b(r['loopback_bytes_per_commit'])} | {_b(r['copied_bytes'])} | "
            f"{_b(r['extra_bytes_max'])} | {_b(m['held_bytes_max'])} | {_b(m['peak_bytes_max'])} |")
    if rows:
        r = rows[0]
        lines.append(f"\nmedians of {len(r['samples']['commit'])} repeat(s), the five in turn, [best]; commit = "
                     f"(loop of {r['steps']} empty steps with commit_every=1 - the same with "
                     f"commit_every=0) / {r['steps'] - 1}; GB/s of the bytes sent per commit; "
                     f"{r['arrays']} float64 array(s) with follow=True, resilient=True")
    return "\n".join(lines)


def render_recovery(row: dict[str, Any]) -> str:
    ph = row["phases_median_s"]
    lines = ["| arrays | places | repetitions | SIGKILL to the next step, median (min - max) | "
             + " | ".join(PHASES) + " | restore sends | exact |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in PHASES) + " | --- | --- |",
             f"| {mib(row['bytes'])} | {row['places']} | {row['repetitions']} | "
             f"{_s(row['recovery_median_s'])} ({_s(row['recovery_min_s'])} - {_s(row['recovery_max_s'])}) | "
             + " | ".join(_s(ph[k]) for k in PHASES)
             + f" | {_b(row['restore_network_bytes_median'])} | {'yes' if row['all_exact'] else 'NO'} |",
             f"\nmedians per phase (they need not add up to the median total); victims {row['victims']}; "
             f"detection: the kill to the step's finish failing (the death declared: "
             f"apgas.lowlevel.watch_deaths told after {_s(row['watchers_told_median_s'])})"]
    return "\n".join(lines)


def render_overhead(out: dict[str, Any]) -> str:
    lines = ["| loop | per step: mean | typical (median gap) | mean over plain | typical over plain |",
             "| --- | --- | --- | --- | --- |"]
    e = out.get("empty")
    if e:
        lines.append(f"| empty: `for i in range(N): pass` | {e['plain_s']['median'] * 1e6:.3f} us | | | |")
        lines.append(f"| empty: `for step in apgas.steps(N): with step: pass` | "
                     f"{e['steps_s']['median'] * 1e6:.2f} us | | +{e['overhead_s']['median'] * 1e6:.2f} us "
                     "| |")
    j = out.get("jacobi")
    if j:
        names = {"plain": "plain loop", "steps_c0": "steps, commit_every=0",
                 "steps_c10": "steps, commit_every=10"}
        for v in JACOBI_VARIANTS:
            mean, typical = j.get(f"{v}_over_plain"), j.get(f"{v}_typical_over_plain")
            lines.append(f"| Jacobi n={j['n']}, {j['places']} places: {names[v]} | "
                         f"{j[f'{v}_s']['median'] * 1e3:.2f} ms | {j[f'{v}_typical_s']['median'] * 1e3:.2f} ms | "
                         + (f"{(mean['median_of_pairs'] - 1) * 100:+.1f}% | "
                            f"{(typical['median_of_pairs'] - 1) * 100:+.1f}% |" if mean and typical else " | |"))
    share = out.get("with_step_share")
    if e and j and share is not None:
        lines.append(f"\nmedians of {e['repeats']} (empty, {e['steps']:,} steps) and {j['repeats']} (Jacobi, "
                     f"{j['iterations']} iterations a loop) repeats, the variants in turn; over plain: "
                     "median of the repeats' ratios; Jacobi's typical iteration: the median time "
                     "between two iterations' starts (commits and bursts left out)")
        lines.append(f"`with step:` ({e['overhead_s']['median'] * 1e6:.2f} us, from the empty steps) is "
                     f"{share * 100:.3f}% of a typical Jacobi iteration without commits (target <= "
                     f"{TARGET * 100:g}%: {'met' if share <= TARGET else 'missed'})")
    return "\n".join(lines)


# -- the parts ------------------------------------------------------------------------------------------

def _victims(places: int, repeats: int) -> list[int]:
    return [1 + r % (places - 1) for r in range(repeats)]


def _recovery(p: Params, report: dict[str, Any], progress: Callable[[str], None]) -> str:
    size, places = p.recovery_size, p.recovery_places
    log.info("part 2: recovery with %s on %d places, %d repetition(s)", mib(size), places,
             p.recovery_repeats)
    report["load_average_at_start_of"]["recovery"] = os.getloadavg()
    runs = []
    for k, victim in enumerate(_victims(places, p.recovery_repeats)):
        runs.append(apgas.run(lambda v=victim: recover_once(size, p.arrays, v, KILL_AT, RECOVERY_STEPS),
                              places=places))
        r = runs[-1]
        progress(f"recovery {k + 1}/{p.recovery_repeats}: place {victim} killed, next step after "
                 f"{r['recovery_s']:.3f} s (restore {r['phases_s']['restore']:.3f} s), exact {r['exact']}")
    row = recovery_row(runs)
    row.update(kill_at=KILL_AT, steps=RECOVERY_STEPS, commit_every=COMMIT_EVERY,
               heartbeat=os.environ.get("APGAS_HEARTBEAT"))
    report["recovery"] = row
    return "from a SIGKILL to the next step on the survivors\n" + render_recovery(row)


def _parts(args: argparse.Namespace, p: Params, report: dict[str, Any]) -> Iterator[str]:
    skipped: list[dict[str, Any]] = report["skipped"]
    loads: dict[str, Any] = report.setdefault("load_average_at_start_of", {})
    total = ((0 if args.no_commit else len(p.sizes) * len(p.places) * p.repeats)
             + (0 if args.no_recovery else p.recovery_repeats)
             + (0 if args.no_overhead else 2 * p.overhead_repeats))
    progress = Progress(total).step
    if not args.no_commit:
        rows: list[dict[str, Any]] = []
        for places in p.places:
            sizes = [s for s in p.sizes if fits(s, places, "commits", skipped)]
            if not sizes:
                continue
            log.info("part 1: commits of %s on %d places, %d repeat(s)", ", ".join(map(mib, sizes)),
                     places, p.repeats)
            loads[f"commits_{places}"] = os.getloadavg()
            # over TCP, as between hosts: the loopback's counter then sees every byte the
            # commits move (the same-host path's Unix streams would bypass it)
            rows += apgas.run(lambda s=sizes: measure_commits(s, p.arrays, p.commit_steps, p.repeats,
                                                              progress), places=places, same_host=False)
        report["commits"] = {"rows": rows}
        yield "commits against the bare transfer of their bytes\n" + render_commits(rows)
    if not args.no_recovery and fits(p.recovery_size, p.recovery_places, "recovery", skipped):
        yield _recovery(p, report, progress)
    if not args.no_overhead:
        log.info("part 3: with step around %d empty steps and Jacobi n=%d on %d places, %d repeat(s)",
                 p.empty_steps, p.jacobi_n, p.overhead_places, p.overhead_repeats)
        loads["overhead"] = os.getloadavg()

        def overhead() -> dict[str, Any]:
            return {"empty": empty_steps(p.empty_steps, p.overhead_repeats, progress),
                    "jacobi": jacobi_loops(p.jacobi_n, p.iterations, p.overhead_repeats, progress)}

        out = apgas.run(overhead, places=p.overhead_places)
        out["with_step_share"] = (out["empty"]["overhead_s"]["median"]
                                  / out["jacobi"]["plain_typical_s"]["median"])
        out["target"] = TARGET
        out["meets_target"] = out["with_step_share"] <= TARGET
        report["overhead"] = out
        yield "the cost of with step\n" + render_overhead(out)


# -- command line ----------------------------------------------------------------------------------------

INT_OPTIONS = (  # option, its lowest value, its help
    ("--arrays", 1, "arrays the size is split over (default 2)"),
    ("--commit-steps", 2, "part 1: empty steps per loop (default 6)"),
    ("--recovery-size", 1, "part 2: MiB of arrays (default 256)"),
    ("--recovery-places", 2, "part 2: places (default 4)"),
    ("--recovery-repeats", 1, "part 2: repetitions (default 5)"),
    ("--overhead-places", 1, "part 3: places (default 2)"),
    ("--overhead-repeats", 1, "part 3: repeats (default 10; --quick 1)"),
    ("--empty-steps", 1, "part 3: steps of the empty loops (default 100000)"),
    ("--jacobi-n", 3, "part 3: the grid is n x n (default 4000)"),
    ("--iterations", 1, "part 3: Jacobi iterations per loop (default 100)"))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="8 MiB, one repeat, a 400 x 400 grid: a smoke test (tests/test_bench_steps.py)")
    parser.add_argument("--repeats", type=int, help="part 1: repeats (default 5; --quick 1)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="where to write the results (default: %(default)s)")
    parser.add_argument("--sizes", type=positive_ints, help="part 1: MiB of arrays in all (default 256,1024)")
    parser.add_argument("--places", type=positive_ints, help="part 1: numbers of places (default 2,4)")
    for flag, _, text in INT_OPTIONS:
        parser.add_argument(flag, type=int, help=text)
    for part, name in enumerate(("commit", "recovery", "overhead"), 1):
        parser.add_argument(f"--no-{name}", action="store_true", help=f"skip part {part}")


def check(args: argparse.Namespace) -> str | None:
    for flag, low, _ in INT_OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < low:
            return f"{flag} must be at least {low}, got {value}"
    if args.places and min(args.places) < 2:
        return "--places: a commit needs at least 2 places (a buddy)"
    return None


@harness("benchmarks.steps", __doc__, options=options, check=check, loggers=(log.name,))
def main(run: Run) -> int:
    params = make_params(run.args)
    run.report.update({"mode": "quick" if run.args.quick else "full", "params": dataclasses.asdict(params),
                       "command": run.command})
    return in_parts(run, _parts(run.args, params, run.report))


parse_args = main.parse


if __name__ == "__main__":
    sys.exit(main())
