"""benchmarks.dist part 2: grow and shrink orders of a malleable job whose array
follows the places, timed from the order to its reply, beside DMR's Table 2."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import apgas
from apgas import lowlevel
from apgas.arrays import BlockArray
from apgas.order import send_order
from benchmarks._dist_common import COLS, ROW_BYTES, check, fill_here, mib

__all__ = ["ORDERS", "DMR_PAPER", "DMR_TABLE2", "actions", "render_actions"]

log = logging.getLogger("benchmarks.dist")

ORDERS: tuple[tuple[str, int, int], ...] = (   # (verb, n, places after)
    ("grow", 1, 2), ("grow", 2, 4), ("grow", 4, 8),
    ("shrink", 4, 4), ("shrink", 2, 2), ("shrink", 1, 1))
ORDER_TIMEOUT_S = 300.0

DMR_PAPER = ("S. Iserte, R. Mayo, E. S. Quintana-Orti, V. Beltran, A. J. Pena: DMR API: Improving "
             "cluster productivity by turning applications into malleable, Parallel Computing "
             "(2018), Table 2 (../shared/papers/dmr-api-slurm-malleability.txt)")
#: DMR's Table 2: actions of a 400-job workload (s), synchronous and asynchronous scheduling
DMR_TABLE2: dict[str, dict[str, dict[str, float]]] = {
    "expand": {"synchronous": {"quantity": 50, "min": 0.367, "max": 0.530, "average": 0.423,
                               "std": 0.146},
               "asynchronous": {"quantity": 107, "min": 0.366, "max": 40.418, "average": 8.820,
                                "std": 12.688}},
    "shrink": {"synchronous": {"quantity": 194, "min": 0.233, "max": 0.541, "average": 0.425,
                               "std": 0.498},
               "asynchronous": {"quantity": 303, "min": 0.334, "max": 0.555, "average": 0.422,
                                "std": 0.049}},
    "no action": {"synchronous": {"min": 0.0010, "max": 0.2078, "average": 0.0094, "std": 0.0102},
                  "asynchronous": {"min": 0.0003, "max": 0.1140, "average": 0.0137,
                                   "std": 0.0112}},
}



class _Newest(apgas.MalleableHandler):
    """Releases the newest places."""

    def pre_shrink(self, n: int, chosen: list[apgas.Place] | None = None) -> list[apgas.Place]:
        return apgas.places()[-n:]


class _Clock:
    """A resize listener that notes when it is called (inside the order, at place 0)."""

    def __init__(self) -> None:
        self.at = 0.0

    def after_grow(self, added: list[apgas.Place]) -> None:
        self.at = time.perf_counter()

    def before_shrink(self, leaving: list[apgas.Place]) -> None:
        self.at = time.perf_counter()


def _actions_main(sizes: Sequence[int], repeats: int) -> dict[int, dict[str, dict[str, list[float]]]]:
    """Part 2, at place 0 of a malleable run of 1 place: per size and order, the order's
    wall time and the re-spread's."""
    communicator = apgas.define_malleable_handler(_Newest())
    address = getattr(communicator, "address", None)  # the socket communicator's
    if address is None:
        raise RuntimeError(f"the communicator {communicator!r} takes no orders on a socket")
    before, after = _Clock(), _Clock()
    lowlevel.on_resize(before)   # before the arrays' follower (made with the first array) ...
    found: dict[int, dict[str, dict[str, list[float]]]] = {}
    hosts = 0
    timed = False  # whether ``after`` listens (once the follower does)
    for rep in range(repeats):
        for size in sizes:
            a: BlockArray | None = None
            if size:
                a = BlockArray.zeros((size // ROW_BYTES, COLS), np.float64, follow=True)
                fill_here(a)
                if not timed:
                    lowlevel.on_resize(after)   # ... and after it
                    timed = True
            for verb, n, then in ORDERS:
                words = [verb, str(n)]
                if verb == "grow":
                    words += [f"dist{hosts + i}" for i in range(n)]
                    hosts += n
                before.at = after.at = 0.0
                start = time.perf_counter()
                reply = send_order(address, words, ORDER_TIMEOUT_S)
                took = time.perf_counter() - start
                if not reply or reply[0].startswith("error") or len(apgas.places()) != then:
                    raise RuntimeError(f"order {' '.join(words)!r}: reply {reply}, "
                                       f"{len(apgas.places())} places, expected {then}")
                moving = after.at - before.at if a is not None and after.at and before.at else None
                got = found.setdefault(size, {}).setdefault(f"{verb} {n}", {"order_s": [], "data_s": []})
                got["order_s"].append(took)
                if moving is not None:
                    got["data_s"].append(moving)
                log.info("%s, %s %d (-> %d places), repeat %d/%d: %.3f s%s", mib(size) if size
                         else "no array", verb, n, then, rep + 1, repeats, took,
                         "" if moving is None else f", of which moving the data {moving:.3f} s")
            if a is not None:
                check(a)
                a.free()
    return found


def actions(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Part 2 in a run of its own (malleable, every host name this machine)."""
    old = os.environ.get("APGAS_LOCAL_HOSTS")
    os.environ["APGAS_LOCAL_HOSTS"] = "*"
    try:
        found = apgas.run(lambda: _actions_main(sizes, repeats), places=1,
                          malleable_listen="127.0.0.1:0")
    finally:
        if old is None:
            os.environ.pop("APGAS_LOCAL_HOSTS", None)
        else:
            os.environ["APGAS_LOCAL_HOSTS"] = old
    rows = []
    for verb, n, then in ORDERS:
        key = f"{verb} {n}"
        row: dict[str, Any] = {"order": key, "from": then - n if verb == "grow" else then + n,
                               "to": then, "dmr": DMR_TABLE2["expand" if verb == "grow" else "shrink"]
                               ["synchronous"], "sizes": {}}
        for size in sizes:
            got = found[size][key]
            row["sizes"][str(size)] = {
                "order_s": got["order_s"], "order_median_s": statistics.median(got["order_s"]),
                "order_best_s": min(got["order_s"]), "data_s": got["data_s"],
                "data_median_s": statistics.median(got["data_s"]) if got["data_s"] else None}
        rows.append(row)
    return rows


def render_actions(rows: list[dict[str, Any]], sizes: Sequence[int], repeats: int) -> str:
    cols = [("no array" if s == 0 else f"{mib(s)}: order (moving the data)") for s in sizes]
    lines = ["| order | places | " + " | ".join(cols) + " | DMR Table 2, sync.: average (min-max) |",
             "| --- | --- | " + " | ".join("---" for _ in cols) + " | --- |"]
    for r in rows:
        cells = []
        for s in sizes:
            f = r["sizes"][str(s)]
            cell = f"{f['order_median_s']:.3f} s"
            if f["data_median_s"] is not None:
                cell += f" ({f['data_median_s']:.3f} s)"
            cells.append(cell)
        d = r["dmr"]
        lines.append(f"| {r['order']} | {r['from']}->{r['to']} | " + " | ".join(cells) +
                     f" | {'expand' if r['order'].startswith('grow') else 'shrink'} "
                     f"{d['average']:.3f} s ({d['min']:.3f}-{d['max']:.3f}) |")
    lines.append(f"\nmedians of {repeats} repeat(s); order sent to its complete reply; DMR: "
                 "400-job workload on MareNostrum, Slurm's decision included (Iserte et al., "
                 "Parallel Computing 2018, Table 2)")
    return "\n".join(lines)
