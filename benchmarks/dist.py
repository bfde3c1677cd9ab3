"""Resizing with data: what moving a distributed array costs, against its floors (issue 31).

    python -m benchmarks.dist [--quick | --tiny] [--repeats R] [--json PATH]
                              [--no-redistribution] [--no-actions] [--no-ceiling]
                              [--no-efficiency]

A malleable job's resize is only as cheap as moving its data: this measures
that, for :class:`apgas.arrays.BlockArray`, beside the floors it is judged by.

1. **Redistribution bandwidth.** One ``apgas.run(places=8)``: the 8 places are
   started once, at the beginning, and the arrays are laid over the first P of
   them (``places=[0, ..., P-1]``). That isolates the data movement from the
   starting and stopping of processes (part 2 measures those together, as a
   real order does) and is what a job sees once its new places have joined:
   the places exist, the rows move. Per size S (a float64 array of shape
   ``(S / 8 KiB, 1024)``: 256 MiB, 512 MiB and 1 GiB; ``--quick`` 64 and 128
   MiB) an array is made over place 0 and filled, then redistributed along the
   chain 1->2, 2->4, 4->8, 8->4, 4->2, 2->1 places, each step timed (the
   ``redistribute`` call, both of its ``finish`` blocks). The bytes moved are
   computed from the old and new layouts: the rows whose owner changes (a row
   that stays with its place is not counted, although place 0 copies it into its
   new block). GB/s = bytes moved / time.

   In the same run, beside each step, the **bare floor** moves the same number of bytes with pyzmq alone,
   between place 0's process and a second process (``multiprocessing`` spawn),
   over TCP on the loopback as the places do: zero-copy sends of numpy buffers
   in frames of at most 16 MiB, the receiver keeping every frame (``copy=False``)
   until all have arrived, then answering; timed from the first send to the
   answer. Reported: best and median of the repeats, and the ratio redistribution
   GB/s / bare GB/s (best over best, median over median) against the target 0.5.
   A third figure, **bare signed**, is the same transfer with each frame signed
   at the sender and checked at the receiver as the places' transport does it
   (:mod:`apgas._core.transport`: a BLAKE3 digest of the frame under a keyed
   BLAKE2b MAC): the floor of
   an authenticated transfer, which the ratio to it shows the runtime against.
   The three take turns, rotated from repeat to repeat.

2. **Resize actions with data, as DMR measures them.** A malleable job
   (``apgas.run(places=1, malleable_listen=...)``, every host name local) with a
   handler that releases the newest places, and a ``follow=True`` array of S
   bytes, receives real orders on its order socket (:func:`apgas.order.send_order`,
   the one order client): grow 1, grow 2, grow 4 (1->2->4->8 places), then
   shrink 4, shrink 2, shrink 1 (back to 1). Each order is timed from sending it
   to its complete reply (the connection closed): places started or stopped, the
   array re-spread inside the order (``apgas.lowlevel.on_resize``), the handler's
   calls. Two more resize listeners, one registered before the array's and one
   after, time the re-spread alone ("moving the data"). S = 0 (no array: the
   order path alone), 256 MiB and 1 GiB (``--quick``: 0 and 64 MiB); sizes take
   turns in each repeat. Printed beside DMR's Table 2 (Iserte et al., "DMR API:
   Improving cluster productivity by turning applications into malleable",
   Parallel Computing 2018; ``../shared/papers/dmr-api-slurm-malleability.txt``):
   expand 0.423 s (0.367-0.530), shrink 0.425 s (0.233-0.541) on average with
   synchronous scheduling, over a 400-job workload of CG, Jacobi and N-body on
   MareNostrum (16 cores a node, InfiniBand FDR10), including Slurm's decision.
   Their Flexible Sleep benchmark moves 1 GB per reconfiguration, hence S = 1 GiB.

3. **Memory-bandwidth ceiling** (:func:`bandwidth_ceiling`): a numpy 5-point
   Jacobi sweep, stream-like (reads the grid, writes the next one), on a
   ``4096 x 4096`` grid run alone in one process, and as two processes side by
   side on two halves (2048 rows each), interleaved. The ratio t(alone) / (2 x
   t(pair)) is the parallel efficiency two places can reach on this machine for
   a memory-bound kernel (ideal 1.0; this 2-core machine reached 0.75-0.93): the
   ceiling against which later efficiency figures of such kernels are read.

4. **The applications' efficiency on 2 places** (:mod:`benchmarks._dist_efficiency`):
   Jacobi (a 4000 x 4000 grid, 100 iterations), CG (3000 x 3000 unknowns, 50
   iterations) and N-body (8000 bodies, 25 steps), each ``sequential(...)``
   against ``run(...)`` on 2 places in turn, inside one ``apgas.run(places=2)``
   (the places' start excluded), the values checked equal; efficiency = T_seq /
   (2 x T_2), read against its ceiling: for the memory-bound Jacobi and CG
   part 3's (its kernel and grid), for the compute-bound N-body its own kernel
   alone against two processes on half the bodies each; both measured again at
   the start of every repeat, beside the runs they judge. ``--quick``: 2000,
   1500 and 4000.

Memory: the machine has 24 GiB; a size S needs about 3 S at the peak (the
array, its new blocks while they are assembled, the bare floor's buffers
beside the array) plus 1 GiB of headroom. A size that does not fit in
``MemAvailable`` is skipped with a printed reason. Progress goes to the log
(INFO), the tables to stdout, everything to the JSON file (default
bench-results/dist.json; the committed figures: ``--json docs/results/dist.json``).
Times are reported, never asserted on.
``--tiny`` (16 MiB, one repeat, small grid) is the smoke test of
tests/test_bench_dist.py.

The parts live in package-private modules, this one drives them and keeps
part 1: :mod:`benchmarks._dist_floor` (the bare and signed transfers),
:mod:`benchmarks._dist_actions` (part 2), :mod:`benchmarks._dist_ceiling`
(part 3), :mod:`benchmarks._dist_efficiency` (part 4) and
:mod:`benchmarks._dist_common` (sizes and the arrays' test pattern).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import apgas
from apgas.arrays import BlockArray
from apgas.arrays._layout import Layout, even, overlaps
from benchmarks._common import available_bytes
from benchmarks._dist_actions import DMR_PAPER, DMR_TABLE2, actions, render_actions
from benchmarks._dist_ceiling import bandwidth_ceiling, bandwidth_once, render_ceiling
from benchmarks._dist_common import CHECK_MAX, COLS, ROW_BYTES, GiB, MiB, check, fill_here, mib
from benchmarks._dist_efficiency import efficiency, render_efficiency
from benchmarks._dist_floor import BareFloor
from benchmarks._harness import Run, harness, in_parts

log = logging.getLogger("benchmarks.dist")

PLACES = 8                           # part 1 starts them all at once
TRANSITIONS: tuple[tuple[int, int], ...] = ((1, 2), (2, 4), (4, 8), (8, 4), (4, 2), (2, 1))
RATIO_TARGET = 0.5                   # redistribution GB/s / bare pyzmq GB/s
BARE_CHUNK = 16 * MiB                # frames of the bare floor
PEAK_FACTOR = 3                      # peak memory of a size S: about 3 S ...
HEADROOM = 1 * GiB                   # ... plus this
DEFAULT_JSON = Path("bench-results/dist.json")


@dataclasses.dataclass(frozen=True)
class Params:
    """What one session measures."""

    repeats: int
    sizes: tuple[int, ...]           # part 1, bytes
    action_sizes: tuple[int, ...]    # part 2, bytes (0: no array)
    action_repeats: int
    grid: tuple[int, int]            # part 3: rows, columns of the whole grid
    sweeps: int
    ceiling_repeats: int
    mode: str = "full"               # part 4's sizes (benchmarks._dist_efficiency.SIZES)
    efficiency_repeats: int = 3


def make_params(mode: str, repeats: int | None) -> Params:
    """``full``, ``quick`` or ``tiny``; ``repeats`` overrides every part's repeats."""
    if mode == "tiny":
        p = Params(1, (16 * MiB,), (0, 16 * MiB), 1, (512, 512), 3, 1, mode, 1)
    elif mode == "quick":
        p = Params(3, (64 * MiB, 128 * MiB), (0, 64 * MiB), 2, (2048, 2048), 10, 3, mode, 2)
    else:
        p = Params(5, (256 * MiB, 512 * MiB, GiB), (0, 256 * MiB, GiB), 3, (4096, 4096), 10, 5, mode, 3)
    if repeats is not None:
        p = dataclasses.replace(p, repeats=repeats, action_repeats=repeats, ceiling_repeats=repeats,
                                efficiency_repeats=repeats)
    return p


# -- memory ------------------------------------------------------------------------------------

def fitting(sizes: Sequence[int], part: str, skipped: list[dict[str, Any]]) -> list[int]:
    """The sizes whose peak (``PEAK_FACTOR`` x S + ``HEADROOM``) fits in the free memory now;
    the others are printed and recorded in ``skipped``."""
    free = available_bytes()
    kept = []
    for size in sizes:
        need = PEAK_FACTOR * size + HEADROOM
        if free is not None and need > free:
            why = (f"{part}: {mib(size)} skipped: needs about {need / GiB:.1f} GiB "
                   f"({PEAK_FACTOR} x the array + {HEADROOM / GiB:g} GiB), "
                   f"{free / GiB:.1f} GiB available")
            print(why, flush=True)
            log.warning("%s", why)
            skipped.append({"part": part, "bytes": size, "needed": need, "available": free})
        else:
            kept.append(size)
    return kept


# -- the layouts ---------------------------------------------------------------------------------

def moved_rows(old: Layout, new: Layout) -> int:
    """Rows whose owner differs between ``old`` and ``new`` (the rows that travel)."""
    return sum(last - first for pid, start, stop in old
               for qid, first, last, _, _ in overlaps(start, stop, new) if qid != pid)


# -- part 1: redistribution ------------------------------------------------------------------------

def redistribution(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Part 1, at place 0 of a run of ``PLACES`` places: per size and transition, the
    redistribution's and the bare floor's samples, the bytes moved."""
    samples: dict[tuple[int, int, int], dict[str, list[float]]] = {}
    moved: dict[tuple[int, int, int], int] = {}
    bare = BareFloor()
    try:
        for size in sizes:
            rows = size // ROW_BYTES
            top = max(moved_rows(even(rows, list(range(p))), even(rows, list(range(q))))
                      for p, q in TRANSITIONS) * ROW_BYTES
            bare.reserve(top)
            for rep in range(repeats):
                a = BlockArray.zeros((rows, COLS), np.float64, places=[0])
                fill_here(a)
                for p, q in TRANSITIONS:
                    key = (size, p, q)
                    old, new = a.layout, even(rows, list(range(q)))
                    assert old == even(rows, list(range(p))), old
                    nbytes = moved[key] = moved_rows(old, new) * ROW_BYTES
                    # the three in turn, rotated by repeat: the machine's noise falls on all
                    took: dict[str, float] = {}
                    for what in _rotated(("redistribute", "bare", "mac"), rep):
                        if what == "redistribute":
                            start = time.perf_counter()
                            a.redistribute(list(range(q)))
                            took[what] = time.perf_counter() - start
                        else:
                            took[what] = bare.transfer(nbytes, mac=what == "mac")
                    if size <= CHECK_MAX:
                        check(a)
                    got = samples.setdefault(key, {"redistribute_s": [], "bare_s": [], "mac_s": []})
                    for what, seconds in took.items():
                        got[f"{what}_s"].append(seconds)
                    log.info("%s %d->%d, repeat %d/%d: %s moved; GB/s: redistribute %.2f, bare "
                             "%.2f, bare signed %.2f", mib(size), p, q, rep + 1, repeats, mib(nbytes),
                             *(nbytes / took[w] / 1e9 for w in ("redistribute", "bare", "mac")))
                check(a)
                a.free()
            bare.release()
    finally:
        bare.close()
    return [_bandwidth_row(size, p, q, moved[size, p, q], got)
            for (size, p, q), got in samples.items()]


def _rotated(items: tuple[str, ...], k: int) -> tuple[str, ...]:
    k %= len(items)
    return items[k:] + items[:k]


def _bandwidth_row(size: int, p: int, q: int, nbytes: int, got: dict[str, list[float]]
                   ) -> dict[str, Any]:
    row: dict[str, Any] = {"bytes": size, "from": p, "to": q, "moved_bytes": nbytes, **got}
    for name in ("redistribute", "bare", "mac"):
        times = got[f"{name}_s"]
        row[f"{name}_best_s"] = min(times)
        row[f"{name}_median_s"] = statistics.median(times)
        row[f"{name}_best_gbs"] = nbytes / min(times) / 1e9
        row[f"{name}_median_gbs"] = nbytes / statistics.median(times) / 1e9
    row["ratio_best"] = row["redistribute_best_gbs"] / row["bare_best_gbs"]
    row["ratio_median"] = row["redistribute_median_gbs"] / row["bare_median_gbs"]
    row["meets_target"] = row["ratio_best"] >= RATIO_TARGET
    row["ratio_to_signed_best"] = row["redistribute_best_gbs"] / row["mac_best_gbs"]
    row["ratio_to_signed_median"] = row["redistribute_median_gbs"] / row["mac_median_gbs"]
    return row


def render_bandwidth(rows: list[dict[str, Any]], repeats: int) -> str:
    head = (f"| size | places | moved | redistribute best / median | GB/s best / median | "
            f"bare pyzmq GB/s best / median | ratio best / median (>= {RATIO_TARGET:g}) | "
            f"bare signed GB/s best | ratio to signed best |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {mib(r['bytes'])} | {r['from']}->{r['to']} | {mib(r['moved_bytes'])} | "
            f"{r['redistribute_best_s']:.3f} / {r['redistribute_median_s']:.3f} s | "
            f"{r['redistribute_best_gbs']:.2f} / {r['redistribute_median_gbs']:.2f} | "
            f"{r['bare_best_gbs']:.2f} / {r['bare_median_gbs']:.2f} | "
            f"{r['ratio_best']:.2f} / {r['ratio_median']:.2f} "
            f"({'met' if r['meets_target'] else 'missed'}) | "
            f"{r['mac_best_gbs']:.2f} | {r['ratio_to_signed_best']:.2f} |")
    met = sum(r["meets_target"] for r in rows)
    lines.append(f"\n{repeats} repeat(s), redistribution and the two floors in turn; {PLACES} places "
                 f"started at once, float64 rows of {ROW_BYTES // 1024} KiB; target ratio met by "
                 f"{met} of {len(rows)} transitions; bare signed: the bare floor with every frame "
                 "signed and checked as the places' transport does (BLAKE3 digest, keyed BLAKE2b MAC)")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------

def options(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="64 and 128 MiB, actions with 64 MiB, a 2048 x 2048 grid, fewer repeats")
    size.add_argument("--tiny", action="store_true",
                      help="16 MiB, one repeat, a small grid: a smoke test (tests/test_bench_dist.py)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats of every part (default 5, 3 for the actions and the "
                             "efficiency; --quick 3, 2)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="where to write the results (default: %(default)s)")
    parser.add_argument("--no-redistribution", action="store_true", help="skip part 1")
    parser.add_argument("--no-actions", action="store_true", help="skip part 2")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip part 3 (part 4 measures the ceilings it needs itself)")
    parser.add_argument("--no-efficiency", action="store_true", help="skip part 4")


def _parts(args: argparse.Namespace, params: Params, report: dict[str, Any]) -> Iterator[str]:
    """Run the parts asked for, filling ``report``; yield each part's table."""
    skipped: list[dict[str, Any]] = report["skipped"]
    if not args.no_redistribution:
        sizes = fitting(params.sizes, "redistribution", skipped)
        if sizes:
            log.info("part 1: redistribution of %s over %d places, %d repeat(s)",
                     ", ".join(map(mib, sizes)), PLACES, params.repeats)
            rows = apgas.run(lambda: redistribution(sizes, params.repeats), places=PLACES)
            report["redistribution"] = {"places_started": PLACES, "cols": COLS,
                                        "bare_chunk_bytes": BARE_CHUNK, "target_ratio": RATIO_TARGET,
                                        "rows": rows}
            yield "redistribution bandwidth against bare pyzmq\n" + render_bandwidth(rows, params.repeats)
    if not args.no_actions:
        sizes = [0, *fitting([s for s in params.action_sizes if s], "actions", skipped)]
        log.info("part 2: grow and shrink orders with %s, %d repeat(s)",
                 ", ".join(mib(s) if s else "no array" for s in sizes), params.action_repeats)
        rows = actions(sizes, params.action_repeats)
        report["actions"] = {"sizes": sizes, "rows": rows, "dmr_table2": DMR_TABLE2,
                             "dmr_source": DMR_PAPER}
        yield ("resize actions through the order socket, beside DMR\n"
               + render_actions(rows, sizes, params.action_repeats))
    rows_, cols = params.grid
    if not args.no_ceiling:
        log.info("part 3: memory-bandwidth ceiling, %d x %d grid", rows_, cols)
        ceiling = bandwidth_ceiling(rows_, cols, params.sweeps, params.ceiling_repeats, log.info)
        report["bandwidth_ceiling"] = ceiling
        yield render_ceiling(ceiling)
    if not args.no_efficiency:
        log.info("part 4: Jacobi, CG and N-body on 2 places against sequential, %d repeat(s)",
                 params.efficiency_repeats)
        eff = efficiency(params.mode, params.efficiency_repeats,
                         lambda: bandwidth_once(rows_, cols, params.sweeps), log.info,
                         lambda: bandwidth_once(rows_, cols, params.sweeps, app=True))
        report["efficiency"] = eff
        yield "Jacobi, CG and N-body: efficiency on 2 places\n" + render_efficiency(eff)


@harness("benchmarks.dist", __doc__, options=options, loggers=(log.name,))
def main(run: Run) -> int:
    mode = "tiny" if run.args.tiny else "quick" if run.args.quick else "full"
    params = make_params(mode, run.args.repeats)
    run.report.update({"mode": mode, "params": dataclasses.asdict(params), "command": run.command})
    return in_parts(run, _parts(run.args, params, run.report))


parse_args = main.parse


if __name__ == "__main__":
    sys.exit(main())
