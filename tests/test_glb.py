"""GLB: exact results however the work moves, on 1, 2 and 4 places."""

from __future__ import annotations

import random
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import fast_first

import apgas
from glb import GLB, GLBConfig
from glb._lifelines import lifelines

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from custom_bag import IntegerSum, Sum  # noqa: E402  (the example users read)
from glb_bags import (  # noqa: E402
    CarryingIntervalBag,
    Count,
    GatedBag,
    Total,
    TreeBag,
    X10IntervalBag,
    interval_total,
    tree_nodes,
)
from orders import orders_then_gate, random_orders, send_orders  # noqa: E402

pytestmark = pytest.mark.timeout(120)

N = 200_003
TREE = [(4, 24), (5, 24), (6, 24)]


@pytest.mark.parametrize("places", [1, 2, 4])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_counting_bag_is_exact(places, workers, mode):
    def make_bag(index: int, count: int) -> IntegerSum:
        return IntegerSum(N * index // count, N * (index + 1) // count)

    def main():
        glb = GLB(GLBConfig(n=97, workers=workers))
        if mode == "dynamic":
            total = glb.compute_dynamic(IntegerSum(0, N), Sum())
        else:
            total = glb.compute_static(make_bag, Sum())
        return total.total, total.count, glb.stats()

    total, count, stats = apgas.run(main, places=places, threads=workers + 1)
    assert (total, count) == (N * (N - 1) // 2, N)
    assert [s.place for s in stats] == list(range(places))
    assert sum(s.units for s in stats) == N


def test_uneven_tree_is_exact_and_spread():
    expected = tree_nodes(TREE)

    def main():
        glb = GLB(GLBConfig(n=64, w=2, workers=2))
        total = glb.compute_dynamic(TreeBag(TREE), Count())
        return total.value, glb.stats()

    value, stats = apgas.run(main, places=4, threads=3)
    assert value == expected
    assert sum(s.units for s in stats) == expected
    assert sum(1 for s in stats if s.units > 0) >= 2, str(stats)
    assert "lifeline_won" in str(stats)


def test_binary_lifelines_are_exact():
    expected = tree_nodes(TREE)

    def main():
        glb = GLB(GLBConfig(n=64, workers=1, lifeline="binary", w=1))
        return glb.compute_dynamic(TreeBag(TREE), Count()).value

    assert apgas.run(main, places=4, threads=2) == expected


@pytest.mark.parametrize("strategy", ["hypercube", "binary"])
@pytest.mark.parametrize("count", range(1, 12))
def test_lifeline_graphs_reach_every_place(strategy, count):
    members = [i * 3 for i in range(count)]  # ids with gaps
    edges = {m: lifelines(strategy, members, m) for m in members}
    for m, buddies in edges.items():
        assert m not in buddies and set(buddies) <= set(members)
    # work flows from a victim to the places that have it as a lifeline
    reached, todo = {members[0]}, [members[0]]
    while todo:
        victim = todo.pop()
        for thief, buddies in edges.items():
            if victim in buddies and thief not in reached:
                reached.add(thief)
                todo.append(thief)
    assert reached == set(members)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="GLBConfig.workers must be an integer >= 1, got 0"):
        GLBConfig(workers=0)
    with pytest.raises(ValueError, match="lifeline must be one of"):
        GLBConfig(lifeline="ring")


# -- malleable GLB under random orders -------------------------------------------------------

INTERVALS = [(0, 20_000), (1_000_000, 1_005_000)]
INTERVALS_TOTAL = interval_total(*INTERVALS[0])
INTERVALS_TOTAL.fold(interval_total(*INTERVALS[1]))


def random_orders_work(kind: str, seed: int):
    """The bag, the neutral result, a result -> its value, and the expected value."""
    if kind == "tree":
        roots = [(s, 18) for s in (4, 5, 6, 10)] + [(seed * 13 + k, 18) for k in range(8)]
        return TreeBag(roots, spin=8), Count(), (lambda r: r.value), tree_nodes(roots)
    bag_class = X10IntervalBag if kind == "x10" else CarryingIntervalBag
    return bag_class(INTERVALS, spin=8), Total(), (lambda r: r), INTERVALS_TOTAL


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", fast_first(range(20), 4))
@pytest.mark.parametrize("kind", ["tree", "x10", "carrying"])
def test_malleable_glb_is_exact_under_random_orders(kind, seed, malleable_address, tmp_path):
    """Exact under orders for bags that reset in submit (tree), that do not (x10: written
    as for X10's GLB), and whose pieces carry part of the partial result (carrying).
    The gate holds the computation open until every order is done."""
    bag, neutral, value_of, expected = random_orders_work(kind, seed)
    gate = str(tmp_path / "orders-done")

    def main():
        client, replies = random_orders(malleable_address, random.Random(seed), f"n{seed}", gate)
        glb = GLB(GLBConfig(n=32, w=2, workers=2, malleable=True, seed=seed))
        total = glb.compute_dynamic(GatedBag(bag, gate), neutral)
        client.join(30)
        return value_of(total), glb.stats(), replies

    value, stats, replies = apgas.run(main, places=3, threads=3)
    assert len(replies) >= 3 and all(r and not r[0].startswith("error") for r in replies), replies
    assert value == expected, (replies, str(stats))
    assert sum(s.units for s in stats) == (expected if kind == "tree" else expected.count)


@pytest.mark.timeout(60)
def test_shrink_to_place_zero_alone_and_grow_again(malleable_address, tmp_path):
    address = malleable_address
    gate = str(tmp_path / "orders-done")
    # The held root opens, and its subtree of work (168k nodes: seed 13's has only 2,
    # which left the place added last nothing to do whenever the rest was done by then)
    # appears, only after the last order: the computation cannot end before every order
    # has been carried out, and the new place finds work.
    roots = [(s, 21) for s in (4, 5, 6, 12, 13)] + [(10, 21, gate)]
    expected = tree_nodes(roots)

    def main():
        orders = ("shrink 2", "grow 2 a b", "shrink 1", "shrink 1", "grow 1 c")
        client, replies = orders_then_gate(address, orders, gate)
        glb = GLB(GLBConfig(n=32, workers=2, malleable=True))
        total = glb.compute_dynamic(TreeBag(roots, spin=20), Count())
        client.join(30)
        return total.value, glb.stats(), replies

    value, stats, replies = apgas.run(main, places=3, threads=3)
    host = socket.gethostname()
    assert replies == [[host, host], ["ok grow 2 places 3 4"], ["b"], ["a"], ["ok grow 1 places 5"]]
    assert value == expected
    assert {s.place for s in stats} == {0, 1, 2, 3, 4, 5}
    assert sum(s.units for s in stats) == expected
    assert next(s for s in stats if s.place == 5).units > 0, str(stats)  # a new place gets work


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_shrink_during_the_start_waits_for_it(mode, malleable_address, monkeypatch):
    """A shrink that comes while GLB still spawns its start tasks (slowed down here) waits
    for them: no place leaves before its start task, with its static share, reached it."""
    from glb import _worker

    spawn = apgas.async_at

    def slow_start(place, fn, *args, **kwargs):
        if fn in (_worker.start_dynamic, _worker.start_static) and place != 0:
            time.sleep(0.5)  # the shrink order arrives meanwhile
        return spawn(place, fn, *args, **kwargs)

    monkeypatch.setattr(apgas, "async_at", slow_start)
    replies: list[list[str]] = []

    def make_bag(index: int, count: int) -> IntegerSum:
        return IntegerSum(N * index // count, N * (index + 1) // count)

    def main():
        client = send_orders(malleable_address, ("shrink 1",), replies)
        glb = GLB(GLBConfig(n=97, workers=1, malleable=True))
        if mode == "dynamic":
            total = glb.compute_dynamic(IntegerSum(0, N), Sum())
        else:
            total = glb.compute_static(make_bag, Sum())
        client.join(30)
        return (total.total, total.count), len(apgas.places())

    result, places = apgas.run(main, places=3, threads=2)
    assert replies == [[socket.gethostname()]]
    assert result == (N * (N - 1) // 2, N) and places == 2
