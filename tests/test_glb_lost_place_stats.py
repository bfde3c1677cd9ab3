"""``glb.stats()`` after a resilient run that lost a place (issue 42, item 5): the
lost place has a row, marked lost, with the units of its work that the result
holds (what its last backups and ends told place 0), so the "all" row's units are
the result's: for UTS, its nodes.

Place 2 is SIGKILLed once place 0's store holds backups of a million units of its
work (so the row is not empty), while a gate at
place 0 (``GatedBag``, as in test_glb_resilient.py) holds the computation open.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from glb_bags import GatedBag

import apgas
from glb import GLB, GLBConfig, GLBStats, _resilience
from glb.apps import uts

pytestmark = pytest.mark.timeout(180)

UTS = {"seed": 19, "depth": 12}
VICTIM = 2
BACKED_UP = 1_000_000  # units of the victim's work place 0 holds when it is killed


def _backed_up(place: int) -> int:
    """The units of ``place``'s work that place 0's store (of the running computation)
    holds: in backups and from ended workers."""
    for store in list(_resilience._stores.values()):
        with store.lock:
            return (sum(units for key, units in store.units.items() if key[0] == place)
                    + store.done_units.get(place, 0))
    return 0


def _kill_after_backup(pid: int, gate: Path) -> threading.Thread:
    def run() -> None:
        try:
            deadline = time.monotonic() + 60
            while _backed_up(VICTIM) < BACKED_UP and time.monotonic() < deadline:
                time.sleep(0.005)
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        finally:
            gate.touch()
    thread = threading.Thread(target=run, name="killer", daemon=True)
    thread.start()
    return thread


def test_a_lost_place_has_a_row_and_the_units_add_up(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    def main() -> tuple[int, GLBStats, int]:
        pid = apgas.at(apgas.place(VICTIM), os.getpid)
        glb = GLB(GLBConfig(resilient=True, workers=1, seed=7, n=512, backup_interval=0.05))
        killer = _kill_after_backup(pid, gate)
        result: Any = glb.compute_dynamic(GatedBag(uts.make_bag(UTS), str(gate)),
                                          uts.NodeCount())
        killer.join()
        assert glb.resilience is not None
        return result.nodes, glb.stats(), glb.resilience.places_lost

    nodes, stats, lost = apgas.run(main, places=4, threads=2)
    assert nodes == uts.sequential(UTS).nodes
    assert lost == 1
    rows = {s.place: s for s in stats}
    assert sorted(rows) == [0, 1, 2, 3], str(stats)
    assert rows[VICTIM].lost, str(stats)
    assert not any(rows[p].lost for p in (0, 1, 3)), str(stats)
    assert rows[VICTIM].units >= BACKED_UP, str(stats)  # killed after backups of its work
    assert stats.total().units == sum(s.units for s in stats) == nodes, str(stats)
    table = str(stats).splitlines()
    assert table[0].split()[-1] == "lost"
    assert table[1 + [s.place for s in stats].index(VICTIM)].split()[-1] == "lost"
    assert table[-1].split()[0] == "all" and table[-1].split()[1] == str(nodes)
