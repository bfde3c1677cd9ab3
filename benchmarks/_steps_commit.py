"""benchmarks.steps, part 1: what a commit of resilient arrays costs, beside the bare
transfer of the same bytes in the same run, and what it holds in memory.

Runs at place 0 of ``apgas.run(places=P)``. Per size S, :func:`make_arrays` makes the
arrays (``follow=True, resilient=True``, S bytes together) and:

1. **Memory, once, untimed.** The peak resident memory of every place is reset
   (``/proc/self/clear_refs``); a loop of 3 empty steps with ``commit_every=1`` reads
   every place's resident memory inside its last step (one commit's copies held) and
   the peak after the loop; both less the memory before the loop.
2. **Time, ``repeats`` times, the five in turn (rotated from repeat to repeat):**

   - *commit loop*: ``for step in apgas.steps(N, commit_every=1, arrays=...): with
     step: pass``, N = ``steps`` (N commits: before step 0 and after steps 0 .. N-2);
   - *plain loop*: the same with ``commit_every=0`` (one commit, before step 0);
   - *bare send*: one ``finish`` in which every owner but place 0 sends its block of
     every array to its buddy (the place the commit sends it to) as ``async_at``
     messages of ``CHUNK_BYTES`` (as the commit does), each copied there into a buffer
     made and touched beforehand;
   - *bare copy + send*: the same, each owner first copying its blocks into a buffer
     made beforehand and sending that copy (the commit's work without its allocation,
     its per-array ``finish`` and dropping the previous copies);
   - *bare fresh copy + send*: the same into new buffers (``np.array`` of each block
     at its owner, ``np.empty`` at the buddy on the first piece), as the commit
     makes them: the commit's work and allocation, without its bookkeeping. The new
     buffers are dropped after the timing.

   Commit time = (commit loop - plain loop) / (N - 1): what a commit adds to a loop,
   all included (the copies, dropping the previous commit's, the gate). The arrays
   are listed through :class:`~benchmarks._steps_common.Timed`, which also times each
   array's ``_steps_commit`` (the copying alone) and ``_steps_forget`` (the dropping).
   The loopback interface's byte counter is read around each of them: the bytes that
   really travelled per commit, beside those computed from the commit's layout. The
   places talk over TCP here (``same_host=False``), as places of different hosts do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import apgas
from apgas.arrays import BlockArray, at_each
from apgas.arrays._blocks import CHUNK_BYTES
from benchmarks._steps_common import (
    COLS,
    ROW_BYTES,
    Timed,
    loopback_bytes,
    make_arrays,
    memory_everywhere,
    mib,
    owners,
    reset_peak_at,
    spans,
)

__all__ = ["measure_commits", "commit_row", "commit_bytes"]

WHAT = ("commit", "plain", "bare", "bare_copy", "bare_fresh")
MODES = {"bare": "send", "bare_copy": "copy", "bare_fresh": "fresh"}
MEMORY_STEPS = 3


# -- the bare floor, at each place ------------------------------------------------------------------

_bare: dict[tuple[Any, ...], np.ndarray] = {}


def _touched(rows: int) -> np.ndarray:
    buf = np.empty((rows, COLS), np.float64)
    buf.fill(0.0)
    return buf


def bare_reserve_at(arrays: Sequence[BlockArray], buddies: list[dict[int, int]]) -> None:
    """At each place: a buffer for each block it receives as a buddy, and one for a copy
    of each of its own blocks; made and touched, so the timed transfers allocate nothing."""
    me = apgas.here().id
    for a, buddy_of in zip(arrays, buddies, strict=True):
        for owner, start, stop in a.layout:
            if buddy_of.get(owner) == me and stop > start:
                _bare[(a.id, owner)] = _touched(stop - start)
        if len(a.rows()):
            _bare[(a.id, "copy")] = _touched(len(a.rows()))


def bare_release_at() -> None:
    _bare.clear()
    _fresh.clear()


#: ``fresh``: the copies of one transfer, made as it goes (as a commit makes its copies)
_fresh: dict[tuple[Any, ...], np.ndarray] = {}


def bare_drop_fresh_at() -> None:
    _fresh.clear()


def bare_send_at(arrays: Sequence[BlockArray], buddy: int | None, mode: str) -> None:
    """At an owner: send each block to ``buddy`` in messages of ``CHUNK_BYTES``; ``copy``:
    first copy it into its buffer made beforehand and send that copy; ``fresh``: the
    same with a new copy (and new buffers at the buddy), as a commit does."""
    me = apgas.here().id
    step = max(1, CHUNK_BYTES // ROW_BYTES)
    for a in arrays:
        block = a.local()
        if mode == "copy":
            kept = _bare[(a.id, "copy")]
            np.copyto(kept, block)
            block = kept
        elif mode == "fresh":
            block = _fresh[(a.id, "copy")] = np.array(block, order="C")
        if buddy is None:
            continue
        put = _fresh_put if mode == "fresh" else _bare_put
        for lo in range(0, len(block), step):
            apgas.async_at(buddy, put, a.id, me, len(block), lo, block[lo:lo + step])


def _bare_put(aid: Any, owner: int, rows: int, lo: int, piece: np.ndarray) -> None:
    _bare[(aid, owner)][lo:lo + len(piece)] = piece


def _fresh_put(aid: Any, owner: int, rows: int, lo: int, piece: np.ndarray) -> None:
    buf = _fresh.get((aid, owner))
    if buf is None:  # two pieces arriving at once get the same buffer
        buf = _fresh.setdefault((aid, owner), np.empty((rows, *piece.shape[1:]), piece.dtype))
    buf[lo:lo + len(piece)] = piece


# -- what a commit moves and keeps -------------------------------------------------------------------

def commit_bytes(commits: Sequence[Any], places: Sequence[int]) -> dict[str, Any]:
    """From the arrays' commits (``_steps_commit``'s values: tag, layout, buddies): the
    bytes sent to buddies, the bytes copied, and per place what it keeps (its own
    blocks' copies and the blocks it keeps for others)."""
    sent = copied = 0
    own = {p: 0 for p in places}
    kept = {p: 0 for p in places}
    for c in commits:
        for owner, start, stop in c.layout:
            nbytes = (stop - start) * ROW_BYTES
            copied += nbytes
            own[owner] = own.get(owner, 0) + nbytes
            buddy = c.buddies.get(owner)
            if buddy is not None:
                sent += nbytes
                kept[buddy] = kept.get(buddy, 0) + nbytes
    extra = {p: own.get(p, 0) + kept.get(p, 0) for p in places}
    return {"network_bytes": sent, "copied_bytes": copied,
            "buddies": [{str(o): b for o, b in c.buddies.items()} for c in commits],
            "extra_bytes_per_place": {str(p): v for p, v in extra.items()},
            "extra_bytes_max": max(extra.values()), "extra_bytes_total": sum(extra.values())}


# -- the loops ---------------------------------------------------------------------------------------

def _loop(timed: list[Timed], n: int, every: int,
          inside: Callable[[int], None] | None = None) -> tuple[float, int | None]:
    """Seconds of an empty step loop, and the loopback bytes meanwhile."""
    lo = loopback_bytes()
    start = time.perf_counter()
    for step in apgas.steps(n, commit_every=every, arrays=timed):
        with step:
            if inside is not None:
                inside(step.index)
    took = time.perf_counter() - start
    after = loopback_bytes()
    return took, None if lo is None or after is None else after - lo


def _bare_transfer(arrays: list[BlockArray], buddies: dict[int, int], mode: str) -> tuple[float, int | None]:
    lo = loopback_bytes()
    start = time.perf_counter()
    with apgas.finish():
        for o in owners(arrays[0]):
            apgas.async_at(o, bare_send_at, arrays, buddies.get(o), mode)
    took = time.perf_counter() - start
    after = loopback_bytes()
    if mode == "fresh":  # dropped untimed (a commit drops the copies before it later)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, bare_drop_fresh_at)
    return took, None if lo is None or after is None else after - lo


def _memory(timed: list[Timed], places: list[int]) -> dict[str, Any]:
    reset = all(at_each(places, reset_peak_at))
    before = memory_everywhere(places)
    during: dict[int, tuple[int, int]] = {}

    def inside(index: int) -> None:
        if index == MEMORY_STEPS - 1:
            during.update(memory_everywhere(places))

    _loop(timed, MEMORY_STEPS, 1, inside)
    after = memory_everywhere(places)
    held = {p: during[p][0] - before[p][0] for p in places}
    peak = {p: after[p][1] - before[p][0] for p in places} if reset else None
    return {"before_rss": {str(p): before[p][0] for p in places},
            "held_bytes": {str(p): v for p, v in held.items()}, "held_bytes_max": max(held.values()),
            "peak_bytes": None if peak is None else {str(p): v for p, v in peak.items()},
            "peak_bytes_max": None if peak is None else max(peak.values()), "peak_reset": reset}


def measure_commits(sizes: Sequence[int], count: int, steps: int, repeats: int,
                    progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Part 1 at place 0 of a run: one row per size (see the module's docstring)."""
    places = [p.id for p in apgas.places()]
    rows = []
    for size in sizes:
        arrays = make_arrays(size, count)
        events: list[tuple[str, float, float]] = []
        timed = [Timed(a, events) for a in arrays]
        commits: list[Any] = []
        try:
            _loop(timed, 2, 1)  # warm: first messages between the places, the layouts
            commits = [t.last for t in timed]  # the last commit's layout and buddies
            moved = commit_bytes(commits, places)
            memory = _memory(timed, places)
            buddies = commits[0].buddies
            with apgas.finish():
                for p in places:
                    apgas.async_at(p, bare_reserve_at, arrays, [c.buddies for c in commits])
            got: dict[str, list[float]] = {w: [] for w in WHAT}
            lo: dict[str, list[int]] = {w: [] for w in WHAT}
            copies: list[list[float]] = []  # per commit loop, its commits in order
            forgets: list[float] = []
            for rep in range(repeats):
                for what in WHAT[rep % len(WHAT):] + WHAT[:rep % len(WHAT)]:
                    events.clear()
                    if what in ("commit", "plain"):
                        took, nbytes = _loop(timed, steps, 1 if what == "commit" else 0)
                        if what == "commit":
                            copies.append([e - s for s, e in spans(events, "commit", count)])
                            forgets += [e - s for s, e in spans(events, "forget", count)][:-1]
                    else:
                        took, nbytes = _bare_transfer(arrays, buddies, MODES[what])
                    got[what].append(took)
                    if nbytes is not None:
                        lo[what].append(nbytes)
                progress(f"commit {mib(size)} on {len(places)} places, repeat {rep + 1}/{repeats}: "
                         f"commit {(got['commit'][-1] - got['plain'][-1]) / (steps - 1):.3f} s, "
                         f"bare send {got['bare'][-1]:.3f} s")
        finally:
            with apgas.finish():
                for p in places:
                    apgas.async_at(p, bare_release_at)
            for a in arrays:
                a.free()
        rows.append(commit_row(size, len(places), count, steps, got, lo, copies, forgets, moved, memory))
    return rows


def commit_row(size: int, places: int, count: int, steps: int, got: dict[str, list[float]],
               lo: dict[str, list[int]], copies: list[list[float]], forgets: list[float],
               moved: dict[str, Any], memory: dict[str, Any]) -> dict[str, Any]:
    """One table row: the samples and their best and median, the ratios."""
    per = [(c - p) / (steps - 1) for c, p in zip(got["commit"], got["plain"], strict=True)]
    net = moved["network_bytes"]

    def stats(values: list[float]) -> dict[str, float | None]:
        return {"best": min(values) if values else None,
                "median": statistics.median(values) if values else None}

    row: dict[str, Any] = {
        "bytes": size, "places": places, "arrays": count, "steps": steps, **moved,
        "memory": memory, "samples": {**got, "commit_per_step": per, "copies": copies,
                                      "forgets": forgets}}
    row["commit_s"] = stats(per)
    row["copies_s"] = stats([c for loop in copies for c in loop])
    # by place in the loop: the first two commits take memory the process had not held
    # just before; from the third on, each reuses what the one before last freed
    row["copies_by_order_s"] = {"first": stats([loop[0] for loop in copies if loop]),
                                "second": stats([loop[1] for loop in copies if len(loop) > 1]),
                                "later": stats([c for loop in copies for c in loop[2:]])}
    row["forget_s"] = stats(forgets)
    row["bare_s"] = stats(got["bare"])
    row["bare_copy_s"] = stats(got["bare_copy"])
    row["bare_fresh_s"] = stats(got["bare_fresh"])
    for key in ("commit", "bare", "bare_copy", "bare_fresh"):
        secs = row[f"{key}_s"]
        row[f"{key}_gbs"] = {k: (net / v / 1e9 if v and v > 0 else None) for k, v in secs.items()}
    for key in ("bare", "bare_copy", "bare_fresh"):
        row[f"commit_over_{key}"] = {
            k: (row["commit_s"][k] / row[f"{key}_s"][k] if row[f"{key}_s"][k] else None)
            for k in ("best", "median")}
    if lo["commit"] and lo["plain"]:
        row["loopback_bytes_per_commit"] = statistics.median(
            (c - p) / (steps - 1) for c, p in zip(lo["commit"], lo["plain"], strict=True))
    else:
        row["loopback_bytes_per_commit"] = None
    row["loopback_bytes_bare"] = statistics.median(lo["bare"]) if lo["bare"] else None
    return row
