"""A malleable, resilient solver: 2-D heat diffusion on arrays that follow the places.

    APGAS_MALLEABLE_LISTEN=127.0.0.1:8090 APGAS_LOCAL_HOSTS='*' \\
        python examples/resilient_heat.py --pids heat.pids

then, from another shell, while it runs:

    python -m apgas.order --to 127.0.0.1:8090 grow 2 nodeA nodeB
    python -m apgas.order --to 127.0.0.1:8090 shrink 1
    kill -9 $(tail -1 heat.pids)          # the newest place dies

The iterations are ``apgas.steps``: orders are carried out between two steps,
the grids are committed every ``--commit-every`` steps, and a lost place rolls
them back to the last commit. At the end the program runs the same iterations
in plain numpy, in this process, and prints ``exact: True`` when the two grids
and the step's largest change are equal bit for bit (exit code 1 if not).
With ``--checkpoint DIR`` the commits also go to disk, and a run started again on
DIR (after a kill of the whole program, on any number of places) goes on from the
last of them. ``docs/tutorial-resilient-solver.md`` walks through it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import apgas
from apgas.arrays import BlockArray, at_each

ALPHA = 0.2  # the diffusion number, kappa * dt / dx**2 (stable up to 0.25)
DT = 0.01    # seconds of the plate's time per step


def initial(n: int) -> np.ndarray:
    """An n x n plate at 0 degrees with a hot square (100 degrees) in its middle.
    The edges stay at 0 for good (only the interior is updated)."""
    u = np.zeros((n, n))
    u[n // 4:3 * n // 4, n // 4:3 * n // 4] = 100.0
    return u


def update(h: np.ndarray, out: np.ndarray, first: int, n: int) -> float:
    """The next values of the global rows ``first .. first + len(out)`` of an n x n
    grid into ``out``; ``h`` holds those rows of the current grid with one more row
    above and below (the halo). Only interior points are written. Returns the
    largest change of a point (0.0 if there is none here)."""
    rows = len(out)
    lo = 1 if first == 0 else 0                   # the top edge row stays
    hi = rows - 1 if first + rows == n else rows  # and the bottom one
    if hi <= lo:
        return 0.0
    centre = h[lo + 1:hi + 1, 1:-1]
    d = out[lo:hi, 1:-1]                                   # the interior rows of out:
    np.add(h[lo:hi, 1:-1], h[lo + 2:hi + 2, 1:-1], out=d)  # up + down
    d += h[lo + 1:hi + 1, :-2]                             # + left
    d += h[lo + 1:hi + 1, 2:]                              # + right
    d -= 4.0 * centre                                      # - 4 * centre
    d *= ALPHA                                             # = the change
    change = max(float(d.max()), -float(d.min()))
    d += centre                                            # the new values
    return change


def sweep_at(old: BlockArray, new: BlockArray) -> float:
    """At one place: its rows of ``new`` from ``old``; returns their largest change."""
    h = old.halo(1, copy=False)  # this place's rows of old, and one more above and below
    return update(h, new.local(), old.rows().start, old.shape[0])


class Handler(apgas.MalleableHandler):
    """Gives back the newest places; keeps the places' process ids in a file (``--pids``)."""

    def __init__(self, pids: str | None) -> None:
        self.path = pids
        self.pids = {p.id: apgas.at(p, os.getpid) for p in apgas.places()} if pids else {}
        self.write()

    def write(self) -> None:
        """One pid a line, in place order (place 0 first), replaced in one step."""
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                f.writelines(f"{self.pids[i]}\n" for i in sorted(self.pids))
            os.replace(self.path + ".tmp", self.path)

    def pre_shrink(self, n, chosen=None):
        leaving = chosen or [p for p in apgas.places() if p.id != 0][-n:]
        for p in leaving:  # written before the order's reply goes out
            self.pids.pop(p.id, None)
        self.write()
        return leaving

    def post_grow(self, n, continued, added):
        if self.path:
            self.pids.update({p.id: apgas.at(p, os.getpid) for p in added})
            self.write()
        print(f"grew by {n}: places {[p.id for p in apgas.places()]}", flush=True)

    def post_shrink(self, n, removed):
        print(f"shrank by {n}: places {[p.id for p in apgas.places()]}", flush=True)

    def on_place_lost(self, places):
        for p in places:
            self.pids.pop(p.id, None)
        self.write()
        print(f"lost {places}", flush=True)


def solve(n: int, count: int, commit_every: int, pids: str | None,
          checkpoint: str | None = None) -> tuple[np.ndarray, dict]:
    """The ``count`` steps over the places, at place 0 inside ``apgas.run``."""
    communicator = apgas.define_malleable_handler(Handler(pids))
    if communicator.address is not None:
        print("orders to {}:{}".format(*communicator.address), flush=True)
    u0 = initial(n)
    u = BlockArray.from_array(u0, follow=True, resilient=True)
    v = BlockArray.from_array(u0, follow=True, resilient=True)  # the edges of both stay 0
    state = {"time": 0.0, "change": 0.0}  # the plate's time; the last step's largest change
    last = -1
    for step in apgas.steps(count, commit_every=commit_every, arrays=[u, v], state=state,
                            checkpoint=checkpoint):
        with step:
            if step.resumed:
                print(f"resumed from {checkpoint} at step {step.index}", flush=True)
            elif step.index <= last:
                print(f"step {step.index} again: rolled back to the last commit", flush=True)
            last = step.index
            old, new = (u, v) if step.index % 2 == 0 else (v, u)
            changes = at_each(apgas.places(), sweep_at, old, new)  # one finish
            state["change"] = max(changes)
            state["time"] += DT
            if step.index % 250 == 0:
                print(f"step {step.index}: {len(apgas.places())} places, largest change "
                      f"{state['change']:.3e}", flush=True)
    result = (u, v)[count % 2].gather()
    print(f"{count} steps done on places {[p.id for p in apgas.places()]}", flush=True)
    apgas.disable_malleable_handler()
    u.free()
    v.free()
    return result, state


def sequential(n: int, count: int) -> tuple[np.ndarray, dict]:
    """The same steps on the whole grid in this process, with the same operations."""
    old, new = np.zeros((n + 2, n)), np.zeros((n + 2, n))  # a zero row above and below
    old[1:-1] = new[1:-1] = initial(n)
    state = {"time": 0.0, "change": 0.0}
    for _ in range(count):
        state["change"] = update(old, new[1:-1], 0, n)
        state["time"] += DT
        old, new = new, old
    return old[1:-1].copy(), state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=600, help="grid size N (N x N); default 600")
    parser.add_argument("--steps", type=int, default=1000, help="steps; default 1000")
    parser.add_argument("--commit-every", type=int, default=50,
                        help="steps between two commits; default 50")
    parser.add_argument("--places", type=int, default=2, help="places at the start; default 2")
    parser.add_argument("--pids", metavar="FILE",
                        help="keep the places' process ids here, one a line, place 0 first")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="write the commits to DIR too, and go on from the last one there")
    args = parser.parse_args()
    if args.size < 3 or args.steps < 0 or args.commit_every < 0:
        parser.error("needs --size >= 3, --steps >= 0 and --commit-every >= 0")
    grid, state = apgas.run(lambda: solve(args.size, args.steps, args.commit_every, args.pids,
                                          args.checkpoint), places=args.places)
    reference, expected = sequential(args.size, args.steps)
    exact = np.array_equal(grid, reference) and state == expected
    print(f"largest change in the last step: {state['change']:.6e}")
    print(f"exact: {exact}", flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
