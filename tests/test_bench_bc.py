"""Betweenness centrality: networkx's scores, sequentially and however GLB moves the work."""

from __future__ import annotations

import argparse
import functools
import pickle
import socket
import threading

import numpy as np
import pytest
from glb_bags import GatedBag
from orders import orders_then_gate

import apgas
from glb import GLB, GLBConfig
from glb.apps import bc
from glb.testing import check_bag

pytestmark = pytest.mark.timeout(120)

SMALL = [(6, 1), (6, 2), (7, 3), (8, 4)]


@functools.cache
def reference(scale: int, seed: int) -> np.ndarray:
    return bc.reference_scores(scale, seed)


@functools.cache
def sequential(scale: int, seed: int) -> np.ndarray:
    return bc.sequential({"scale": scale, "seed": seed}).array()


def assert_scores(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=bc.TOLERANCE, atol=bc.TOLERANCE)


# -- the graph ---------------------------------------------------------------------------

@pytest.mark.parametrize("scale,seed", SMALL)
def test_graph_is_simple_and_deterministic(scale, seed):
    g = bc.build_graph(scale, seed)
    again = bc.build_graph(scale, seed)
    assert np.array_equal(g.offsets, again.offsets) and np.array_equal(g.targets, again.targets)
    n = 1 << scale
    assert g.vertices == n and g.offsets[0] == 0 and g.offsets[-1] == g.edges
    assert 0 < g.edges <= bc.EDGE_FACTOR * n
    for v in range(n):
        row = g.targets[g.offsets[v]:g.offsets[v + 1]]
        assert np.all(np.diff(row) > 0), "targets sorted, each once"
        assert v not in row, "no self-loop"
    other = bc.build_graph(scale, seed + 100)
    assert not np.array_equal(g.targets, other.targets[:g.edges])


def test_graph_is_cached_per_place():
    assert bc.graph(5, 9) is bc.graph(5, 9)
    assert bc.graph(5, 9) is not bc.graph(5, 10)


# -- the kernel alone ----------------------------------------------------------------------

@pytest.mark.parametrize("scale,seed", SMALL)
def test_sequential_equals_networkx(scale, seed):
    params = {"scale": scale, "seed": seed}
    result = bc.sequential(params)
    assert bc.units(result) == 1 << scale
    assert_scores(result.array(), reference(scale, seed))
    assert bc.check(params, bc.value(result)) is True


def test_chunks_and_threads_give_the_same_scores():
    """Any cut of the sources, on concurrent threads (own scratch each), adds up the same."""
    scale, seed = 8, 4
    bags = [bc.make_static_bag({"scale": scale, "seed": seed}, i, 4) for i in range(4)]

    def drain(bag: bc.BCBag) -> None:
        while not bag.is_empty():
            bag.process(7)

    threads = [threading.Thread(target=drain, args=(b,)) for b in bags]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    result = bc.make_result({"scale": scale, "seed": seed})
    for bag in bags:
        bag.submit(result)
    assert result.sources == 1 << scale
    assert_scores(result.array(), reference(scale, seed))


def test_check_and_value():
    params = {"scale": 6, "seed": 1}
    value = bc.value(bc.sequential(params))
    assert set(value) == {"sources", "sum", "max", "argmax", "checksum"}
    assert bc.check(params, value) is True
    assert bc.check(params, {**value, "checksum": value["checksum"] * (1 + 1e-6)}) is False
    assert bc.check(params, {**value, "sources": 1}) is False
    assert bc.check({"scale": 11, "seed": 1}, value) is None


def test_params_are_validated():
    parser = argparse.ArgumentParser()
    bc.add_arguments(parser)
    ns = parser.parse_args([])
    assert bc.params(ns) == {"scale": bc.DEFAULT_SCALE, "seed": bc.DEFAULT_SEED}
    with pytest.raises(ValueError, match=r"--scale must be an integer from 1 to 22, got 0"):
        bc.params(parser.parse_args(["--scale", "0"]))
    with pytest.raises(ValueError, match=r"--scale .* got 40"):
        bc.params(parser.parse_args(["--scale", "40"]))
    with pytest.raises(ValueError, match=r"--seed must be an integer >= 0, got -3"):
        bc.params(parser.parse_args(["--seed", "-3"]))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 64, 100])
def test_static_bags_cover_each_source_once(count):
    params = {"scale": 6, "seed": 1}
    sources = sorted(s for i in range(count)
                     for lo, hi in bc.make_static_bag(params, i, count).ranges for s in range(lo, hi))
    assert sources == list(range(64))


def test_warm_up_and_empty_bags():
    assert bc.warm_up() >= 0.0
    empty = bc.make_static_bag({"scale": 6, "seed": 1}, 0, 1 << 30)
    assert empty.is_empty() and empty.process(100) == 0 and empty.split(False) is None


# -- split and merge -----------------------------------------------------------------------

def covered(bags: list[bc.BCBag]) -> list[int]:
    return sorted(s for b in bags for lo, hi in b.ranges for s in range(lo, hi))


def test_the_bag_keeps_the_contract():
    params = {"scale": 5, "seed": 3}
    check_bag(lambda: bc.make_bag(params), lambda: bc.make_result(params),
              same=lambda a, b: a.sources == b.sources and np.allclose(a.array(), b.array()),
              expected=bc.sequential(params), max_examples=80)


def test_split_moves_sources_and_never_scores():
    bag = bc.make_bag({"scale": 5, "seed": 3})
    bag.process(3)
    before = covered([bag])
    loot = bag.split(False)
    assert loot.partial is None and sorted(covered([bag, loot])) == before
    assert len(set(covered([bag, loot]))) == len(before)


def test_process_adds_into_the_bags_one_array():
    """process() adds each call's scores into the bag's one partial array (none allocated
    per call, so small calls cost nothing) and counts what work() would have given."""
    bag = bc.make_bag({"scale": 6, "seed": 2})
    assert bag.process(5) == 5
    scores = bag.partial.scores
    assert bag.process(7) == 7 and bag.partial.scores is scores and bag.partial.sources == 12
    assert_scores(scores, bag.work(0, 12).array())  # the sources taken: 0..4, then 5..11
    loot = bag.split(False)
    other = bc.make_bag({"scale": 6, "seed": 2})
    other.ranges, other._left = [], 0
    other.merge(loot)
    other.process(64)
    bag.merge(other)  # the merged partial scores are added, not lost
    while not bag.is_empty():
        bag.process(3)
    result = bc.make_result({"scale": 6, "seed": 2})
    bag.submit(result)
    assert result.sources == 64
    assert_scores(result.array(), sequential(6, 2))


def test_loot_is_small():
    bag = bc.make_bag({"scale": 12, "seed": 1})
    bag.process(1)
    loot = bag.split(False)
    assert bag.partial is not None and len(pickle.dumps(loot)) < 300


# -- on GLB ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_glb_equals_networkx(mode):
    params = {"scale": 8, "seed": 4}

    def main():
        glb = GLB(GLBConfig(n=5, workers=2))
        result = bc.make_result(params)
        if mode == "dynamic":
            total = glb.compute_dynamic(bc.make_bag(params), result)
        else:
            total = glb.compute_static(lambda i, k: bc.make_static_bag(params, i, k), result)
        return total, glb.stats()

    total, stats = apgas.run(main, places=2, threads=3)
    assert bc.units(total) == 256 and sum(s.units for s in stats) == 256
    if mode == "static":  # dynamically, place 0 may well finish 256 sources alone
        assert all(s.units > 0 for s in stats), str(stats)
    assert_scores(total.array(), reference(*params.values()))
    assert bc.check(params, bc.value(total)) is True


@pytest.mark.timeout(60)
def test_malleable_glb_grows_and_shrinks_to_the_same_scores(malleable_address, tmp_path):
    params = {"scale": 12, "seed": 2}
    bc.warm_up()  # the kernel in numba's disk cache, so new places only load it
    want = sequential(*params.values())
    address = malleable_address
    gate = str(tmp_path / "orders-done")  # the computation ends only after both orders

    def main():
        client, replies = orders_then_gate(address, ("shrink 1", "grow 1 a"), gate)
        glb = GLB(GLBConfig(n=8, workers=2, malleable=True))
        total = glb.compute_dynamic(GatedBag(bc.make_bag(params), gate), bc.make_result(params))
        client.join(30)
        return total, glb.stats(), len(apgas.places()), replies

    total, stats, places, replies = apgas.run(main, places=2, threads=3)
    host = socket.gethostname()
    assert replies == [[host], ["ok grow 1 places 2"]], replies
    assert places == 2
    assert {s.place for s in stats} == {0, 1, 2}
    assert bc.units(total) == 1 << 12 and sum(s.units for s in stats) == 1 << 12
    assert_scores(total.array(), want)
