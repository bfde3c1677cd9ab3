"""Chaos tests of resilient GLB: places other than 0 are SIGKILLed at random moments
(during steals, lifeline deliveries and backups), one after the other or together,
and every application and users' X10-style bags still give the exact result.

Each run holds its computation open with a gate at place 0 (``GatedBag``) until the
kills are done, so a kill always lands while GLB computes, however loaded the
machine. Seeded: a failing case runs again the same way.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import fast_first
from glb_bags import (
    CarryingIntervalBag,
    Count,
    GatedBag,
    Total,
    TreeBag,
    X10IntervalBag,
    interval_total,
    tree_nodes,
)
from orders import random_orders

import apgas
from glb import GLB, GLBConfig
from glb.apps import bc, nqueens, pi, uts

pytestmark = pytest.mark.timeout(120)


class Case:
    """An application: its bag, neutral result, reference result and equality."""

    def __init__(self, make_bag: Callable[[], Any], make_result: Callable[[], Any],
                 reference: Callable[[], Any], same: Callable[[Any, Any], bool]) -> None:
        self.make_bag, self.make_result = make_bag, make_result
        self.reference, self.same = reference, same


UTS = {"seed": 19, "depth": 10}
NQ = {"n": 10, "threshold": 5}
BC = {"scale": 8, "seed": 2}
PI = {"samples": 40_000_000, "chunk": 65536, "seed": 5}
INTERVAL = (0, 150_000)

CASES = {
    "uts": Case(lambda: uts.make_bag(UTS), uts.NodeCount, lambda: uts.sequential(UTS),
                lambda a, b: a.nodes == b.nodes),
    "nqueens": Case(lambda: nqueens.make_bag(NQ), nqueens.NQueensResult,
                    lambda: nqueens.sequential(NQ), lambda a, b: a.solutions == b.solutions),
    "bc": Case(lambda: bc.make_bag(BC), lambda: bc.make_result(BC), lambda: bc.sequential(BC),
               lambda a, b: a.sources == b.sources and np.allclose(a.array(), b.array())),
    "pi": Case(lambda: pi.make_bag(PI), pi.PiResult, lambda: pi.sequential(PI),
               lambda a, b: (a.hits, a.samples) == (b.hits, b.samples)),
    "x10 bag": Case(lambda: X10IntervalBag([INTERVAL], spin=2), Total,
                    lambda: interval_total(*INTERVAL), lambda a, b: a == b),
    "carrying bag": Case(lambda: CarryingIntervalBag([INTERVAL], spin=2), Total,
                         lambda: interval_total(*INTERVAL), lambda a, b: a == b),
    "tree bag": Case(lambda: TreeBag([(3, 11), (7, 10)]), Count,
                     lambda: Count(tree_nodes([(3, 11), (7, 10)])), lambda a, b: a.value == b.value),
}


def killing(seed: int, kills: int, gate: Path, together: bool = False,
            started: Callable[[], bool] = lambda: True) -> threading.Thread:
    """A thread at place 0 that SIGKILLs ``kills`` random places other than 0 at random
    moments once ``started()`` (all at once with ``together``), then opens ``gate``."""
    rng = random.Random(seed)
    pids = {p.id: apgas.at(p, os.getpid) for p in apgas.places()[1:]}
    victims = rng.sample(sorted(pids), kills)

    def run() -> None:
        try:
            deadline = time.monotonic() + 30
            while not started() and time.monotonic() < deadline:
                time.sleep(0.005)
            for k, victim in enumerate(victims):
                if not (together and k):
                    time.sleep(rng.uniform(0.05, 0.6))
                os.kill(pids[victim], signal.SIGKILL)
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            gate.touch()
    thread = threading.Thread(target=run, name="killer", daemon=True)
    thread.start()
    return thread


def resilient_run(case: Case, seed: int, kills: int, tmp_path: Path, places: int = 4,
                  workers: int = 1, together: bool = False, static: bool = False
                  ) -> tuple[Any, Any, int]:
    gate = tmp_path / f"gate-{seed}"

    def main() -> tuple[Any, Any, int]:
        config = GLBConfig(resilient=True, workers=workers, seed=seed, n=64,
                           backup_interval=0.05)
        glb = GLB(config)
        # kills while GLB watches for deaths: one before its computation started (while its
        # kernels compile, say) would be a place lost before, not during, the computation
        killer = killing(seed, kills, gate, together,
                         lambda: glb._recovery is not None and glb._recovery._stop is not None)
        if static:
            def make(i: int, count: int) -> Any:
                inner = X10IntervalBag([(INTERVAL[1] * i // count, INTERVAL[1] * (i + 1) // count)],
                                       spin=2)
                return GatedBag(inner, str(gate) if i == 0 else None)
            result = glb.compute_static(make, Total())
        else:
            result = glb.compute_dynamic(GatedBag(case.make_bag(), str(gate)), case.make_result())
        killer.join()
        assert glb.resilience is not None
        return result, glb.resilience, len(apgas.places())

    return apgas.run(main, places=places, threads=workers + 1)


@pytest.mark.parametrize("seed", fast_first(range(3), 1))
@pytest.mark.parametrize("name", CASES)
def test_killed_places_lose_nothing(name: str, seed: int, tmp_path: Path) -> None:
    case = CASES[name]
    kills = 1 + seed % 2
    result, resilience, left = resilient_run(case, seed, kills, tmp_path)
    assert case.same(result, case.reference()), (name, seed, result)
    assert resilience.places_lost == kills
    assert left == 4 - kills


@pytest.mark.parametrize("seed", range(2))
def test_three_places_killed_together_with_two_workers_each(seed: int, tmp_path: Path) -> None:
    case = CASES["x10 bag"]
    result, resilience, left = resilient_run(case, 10 + seed, 3, tmp_path, workers=2, together=True)
    assert result == case.reference()
    assert (resilience.places_lost, left) == (3, 1)


@pytest.mark.parametrize("seed", range(2))
def test_a_static_computation_loses_nothing(seed: int, tmp_path: Path) -> None:
    result, resilience, _ = resilient_run(CASES["x10 bag"], 20 + seed, 2, tmp_path, static=True)
    assert result == interval_total(*INTERVAL)
    assert resilience.places_lost == 2


def test_without_losses_nothing_is_restored(tmp_path: Path) -> None:
    case = CASES["x10 bag"]
    result, resilience, left = resilient_run(case, 0, 0, tmp_path)
    assert result == case.reference()
    assert (resilience.places_lost, resilience.restored, resilience.rounds, left) == (0, 0, 1, 4)
    assert resilience.backups > 0 and resilience.pieces > 0


def test_plain_glb_still_fails_clearly_when_a_place_dies(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    def main() -> None:
        killer = killing(1, 1, gate)
        try:
            GLB(GLBConfig(n=64)).compute_dynamic(GatedBag(X10IntervalBag([INTERVAL], spin=2), str(gate)),
                                                 Total())
        finally:
            killer.join()

    with pytest.raises((apgas.MultipleException, apgas.DeadPlaceError)) as info:
        apgas.run(main, places=3, threads=2)
    errors = info.value.exceptions if isinstance(info.value, apgas.MultipleException) else [info.value]
    assert any(isinstance(e, apgas.DeadPlaceError) for e in errors)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("seed", range(int(os.environ.get("STRESS_SEEDS", 3))))
def test_kills_during_random_grows_and_shrinks_lose_nothing(seed: int, malleable_address,
                                                             tmp_path: Path) -> None:
    """Random grow and shrink orders and, meanwhile, SIGKILLs of random places other than 0;
    an order may fail when its place is killed under it, the result may not."""
    gate = tmp_path / "gate"
    rng = random.Random(seed)

    def kill_some() -> None:
        for _ in range(2):
            time.sleep(rng.uniform(0.05, 0.5))
            others = [p for p in apgas.places() if p.id != 0]
            if len(others) > 1:
                try:
                    os.kill(apgas.at(rng.choice(others), os.getpid), signal.SIGKILL)
                except apgas.DeadPlaceError:
                    pass  # left or died meanwhile

    def main() -> tuple[Any, Any, list[list[str]]]:
        orders, replies = random_orders(malleable_address, random.Random(seed), f"r{seed}")
        killer = threading.Thread(target=kill_some, daemon=True)
        killer.start()

        def open_gate() -> None:
            orders.join(60)
            killer.join(60)
            gate.touch()
        threading.Thread(target=open_gate, daemon=True).start()
        config = GLBConfig(resilient=True, malleable=True, n=64, seed=seed, backup_interval=0.05)
        glb = GLB(config)
        result = glb.compute_dynamic(GatedBag(X10IntervalBag([INTERVAL], spin=2), str(gate)), Total())
        return result, glb.resilience, replies

    result, resilience, replies = apgas.run(main, places=3, threads=2)
    assert result == interval_total(*INTERVAL), (replies, resilience)
    assert len(replies) >= 3, replies


def _store_with_a_leaving_place() -> Any:
    """Place 0's store after place 1 backed up a bag and ended one worker (done 5)."""
    from glb._resilience import Store, _blob

    store = Store(1, Total(), lambda *args: None)
    store.backup(1, (1, 1), _blob(X10IntervalBag([(0, 10)])), [])
    store.end(1, (1, 2), _blob(Total(5, 1)), [])
    return store


def test_a_place_that_left_and_then_died_is_counted_once_by_its_leave() -> None:
    """The leave's answer is in hand when place 1 is declared dead: the answer counts,
    the store restores nothing (else its work would count twice)."""
    store = _store_with_a_leaving_place()
    assert store.retire(1)
    assert not store.recover(1)
    assert (store.records, store.pieces, store.restored_result) == ({}, {}, Total())


def test_a_place_declared_dead_before_its_leave_is_handled_is_restored_once() -> None:
    """Place 1 is declared dead after it answered the leave but before place 0 took the
    answer: the store restores its copies, and the answer must be dropped."""
    store = _store_with_a_leaving_place()
    assert store.recover(1)
    assert store.retire(1) is False
    assert store.restored_result == Total(5, 1)
    assert [p.kind for p in store.pieces.values()] == ["bag"]
