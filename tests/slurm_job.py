"""A program that resizes its own Slurm job (APGAS_COMMUNICATOR=slurm), run by
tests/test_slurm_communicator.py inside ``salloc``. ``MODE`` picks what it does;
files in ``SIGNALS`` (a directory) pace it against the test. It prints one
``RESULT <json>`` line.

- ``glb``: an evolving GLB computation whose work is held (``SIGNALS/go``) until the
  test saw the job reach 3 nodes, and ends in a chain that keeps a single place
  busy, so the idle places are released; the count must be exact.
- ``check``: ``check_status(1, 3)`` (expands onto idle nodes), then, once the test
  queued a job (``SIGNALS/queued``), ``check_status(1, 3)`` again (shrinks for it).
- ``grow``: ``request_grow(N)``, and the request's outcome.
- ``controlled``: a malleable GLB computation (GLB's own handler) of ``UNITS``
  units (each also sleeps ``UNIT_SLEEP`` s) whose work is held until ``SIGNALS/go``, resized by ``apgas-scheduler slurm-controller``
  through the job's Slurm fields; the count must be exact.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from glb_bags import mix  # noqa: E402

import apgas  # noqa: E402

SIGNALS = Path(os.environ.get("SIGNALS", "."))


class Handler(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return list(chosen) if chosen is not None else apgas.places()[-n:]


def wait_for(name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (SIGNALS / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name} signal within {timeout} s")
        time.sleep(0.05)


def signal(name: str) -> None:
    (SIGNALS / name).touch()


def nodes() -> list[str]:
    return [p.host for p in apgas.places()]


class PhasedBag:
    """Held work, then one long chain: ``units`` that any place may take (split in
    halves), done only once the gate file exists (until then a place holding some
    counts as busy), and ``chain`` units in a row that cannot be split, so that in
    the end one place works and the others idle."""

    def __init__(self, units: list[int], chain: int, gate: str, spin: int = 2000,
                 pause: float = 0.0) -> None:
        self.units, self.chain, self.gate, self.spin = units, chain, gate, spin
        self.pause = pause  # s a unit also sleeps: work that takes time, not CPU
        self.count = 0

    def process(self, n: int) -> int:
        if not os.path.exists(self.gate):
            time.sleep(0.002)
            return 0
        done = 0
        while done < n and (self.units or self.chain):
            seed = self.units.pop() if self.units else self.chain
            if not self.units and self.chain and seed == self.chain:
                self.chain -= 1
            for _ in range(self.spin):
                seed = mix(seed)
            if self.pause:
                time.sleep(self.pause)
            self.count += 1
            done += 1
        return done

    def is_empty(self) -> bool:
        return not self.units and not self.chain

    def is_splittable(self) -> bool:
        return len(self.units) >= 2

    def split(self, take_all: bool) -> PhasedBag | None:
        if take_all:
            loot = PhasedBag(self.units, self.chain, self.gate, self.spin, self.pause)
            self.units, self.chain = [], 0
            return loot
        if len(self.units) < 2:
            return None
        half = len(self.units) // 2
        loot = PhasedBag(self.units[:half], 0, self.gate, self.spin, self.pause)
        del self.units[:half]
        return loot

    def merge(self, other: PhasedBag) -> None:
        self.units += other.units
        self.chain += other.chain

    def submit(self, result) -> None:
        result.value += self.count
        self.count = 0


def glb() -> dict:
    from glb_bags import Count

    from glb import GLB, GLBConfig

    units, chain = 600, 2500
    glb = GLB(GLBConfig(n=20, evolving=True, evolving_interval=0.1, evolving_window=3,
                        evolving_backoff=2.0))
    bag = PhasedBag(list(range(units)), chain, str(SIGNALS / "go"))
    total = glb.compute_dynamic(bag, Count()).value
    return {"total": total, "expected": units + chain, "requests": glb.evolver.requests,
            "releases": glb.evolver.releases, "worked": sorted({s.place for s in glb.stats() if s.units}),
            "end": nodes(), "env": os.environ.get("SLURM_JOB_NODELIST")}


def check() -> dict:
    first = apgas.check_status(1, 3)
    after_first = nodes()
    signal("expanded")
    wait_for("queued")
    second = apgas.check_status(1, 3)
    return {"first": first, "after_first": after_first, "second": second, "end": nodes(),
            "env": os.environ.get("SLURM_JOB_NODELIST"), "nnodes": os.environ.get("SLURM_NNODES")}


def grow() -> dict:
    request = apgas.request_grow(int(os.environ.get("N", "1")))
    try:
        added = [p.host for p in request.result(timeout=120)]
        return {"state": request.state, "added": added, "end": nodes()}
    except apgas.GrowRefused as e:
        return {"state": request.state, "reason": request.reason, "error": str(e), "end": nodes()}


def controlled() -> dict:
    from glb_bags import Count

    from glb import GLB, GLBConfig

    units = int(os.environ.get("UNITS", "400"))
    glb = GLB(GLBConfig(n=5, malleable=True))
    bag = PhasedBag(list(range(units)), 0, str(SIGNALS / "go"), spin=20000,
                    pause=float(os.environ.get("UNIT_SLEEP", "0")))
    total = glb.compute_dynamic(bag, Count()).value
    return {"total": total, "expected": units, "end": nodes(),
            "worked": sorted({s.place for s in glb.stats() if s.units})}


def main() -> dict:
    if os.environ["MODE"] not in ("glb", "controlled"):  # GLB registers its own
        apgas.define_malleable_handler(Handler())
    result = {"glb": glb, "check": check, "grow": grow,
              "controlled": controlled}[os.environ["MODE"]]()
    signal("done")
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(apgas.run(main)), flush=True)
