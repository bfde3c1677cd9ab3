"""Steals while a worker processes: a bag that opts in (``concurrent_split``) is split at
once by a steal request, exactly, under random delays; a bag that does not opt in is
never touched while its ``process`` runs; resilient GLB never splits concurrently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import apgas
from glb import GLB, GLBConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glb_bags import Count, GuardedTreeBag, LockedTreeBag, OptedInGuardedTreeBag, tree_nodes  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TREE = [(4, 16), (5, 16)]   # 9,557 nodes


def _run(bag_class, places: int, workers: int, seed: int, **config):
    def main():
        glb = GLB(GLBConfig(n=16, w=2, workers=workers, seed=seed, **config))
        value = glb.compute_dynamic(bag_class(TREE), Count()).value
        return value, glb.stats()
    return apgas.run(main, places=places, threads=workers + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_an_opting_in_bag_is_split_at_once_and_stays_exact(workers):
    expected = tree_nodes(TREE)
    at_once = 0
    for seed in range(3):
        value, stats = _run(LockedTreeBag, 4, workers, seed)
        assert value == expected, f"seed {seed}"
        total = stats.total()
        assert total.units == expected
        assert total.random_won <= total.random_tried
        at_once += total.split_at_once
    assert at_once > 0, "no steal was served while a worker processed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_bag_that_does_not_opt_in_is_never_touched_during_process(workers):
    expected = tree_nodes(TREE)
    for seed in range(2):
        value, stats = _run(GuardedTreeBag, 4, workers, seed)
        assert value == expected, f"seed {seed}"
        assert stats.total().split_at_once == 0
        assert sum(1 for s in stats if s.units) >= 2, str(stats)


@pytest.mark.timeout(120)
def test_the_guard_sees_a_split_during_process_once_the_bag_opts_in():
    """The control case: the opt-in takes effect, so the guarded test above is not vacuous."""
    with pytest.raises(apgas.MultipleException) as caught:
        for seed in range(5):
            _run(OptedInGuardedTreeBag, 4, 1, seed)
    assert any("called while process" in str(e) for e in caught.value.exceptions)


@pytest.mark.timeout(120)
def test_resilient_glb_does_not_split_concurrently():
    value, stats = _run(LockedTreeBag, 3, 1, 0, resilient=True)
    assert value == tree_nodes(TREE)
    assert stats.total().split_at_once == 0


@pytest.mark.timeout(120)
def test_steal_statistics_are_recorded():
    value, stats = _run(LockedTreeBag, 4, 1, 1)
    assert value == tree_nodes(TREE)
    total = stats.total()
    assert total.waited == sum(s.waited for s in stats)
    assert len(total.waits_s) <= total.waited and all(x >= 0 for x in total.waits_s)
    assert len(total.steal_rtt_s) <= total.random_tried and all(x >= 0 for x in total.steal_rtt_s)
    assert total.lifeline_won <= total.lifeline_asked + total.moved_bags
    assert "split_at_once" in str(stats)
