"""Pi: the same hits bit for bit however the chunks move (sequential, GLB static, dynamic, malleable)."""

from __future__ import annotations

import argparse
import functools
import math
import socket

import pytest
from glb_bags import GatedBag
from hypothesis import given, settings
from hypothesis import strategies as st
from orders import orders_then_gate

import apgas
from glb import GLB, GLBConfig
from glb.apps import pi
from glb.apps.pi import APP, PiBag, PiResult

pytestmark = pytest.mark.timeout(60)

SMALL = ("--samples", "10_000_019", "--chunk-size", "4096", "--sample-seed", "7")  # a short last chunk


@pytest.fixture(scope="module", autouse=True)
def compiled():
    APP.warm_up()


def args(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    APP.add_arguments(parser)
    return APP.params(parser.parse_args(list(argv)))


def drain(bag: PiBag, n: int) -> PiResult:
    result = PiResult()
    while not bag.is_empty():
        bag.process(n)
    bag.submit(result)
    return result


@pytest.fixture(scope="module")
def small() -> tuple[dict, PiResult]:
    p = args(*SMALL)
    return p, APP.sequential(p)


def test_sequential_estimate_is_within_tolerance(small):
    p, result = small
    assert result.samples == APP.units(result) == 10_000_019
    assert abs(APP.value(result) - math.pi) < 0.003
    assert APP.check(p, APP.value(result)) is True
    assert APP.check(p, math.pi + 0.01) is False


@pytest.mark.parametrize("n", [1, 5, 64, 10**6])
def test_bag_gives_the_same_hits_in_any_chunk_steps(small, n):
    p, expected = small
    result = drain(APP.make_bag(p), n)
    assert (result.hits, result.samples) == (expected.hits, expected.samples)


@pytest.mark.parametrize("count", [1, 3, 4, 7, 5000])
def test_static_shares_cover_every_chunk_once(small, count):
    p, expected = small
    shares = [APP.make_static_bag(p, i, count) for i in range(count)]
    chunks = sorted(c for b in shares for lo, hi in b.ranges for c in range(lo, hi))
    assert chunks == list(range(pi.chunk_count(p["samples"], p["chunk"])))
    total = PiResult()
    for b in shares:
        total.fold(drain(b, 3))
    assert (total.hits, total.samples) == (expected.hits, expected.samples)


def test_streams_depend_on_seed_and_chunk():
    a = pi.hits(1, 0, 8, 1024, 8192)
    assert a == pi.hits(1, 0, 3, 1024, 8192) + pi.hits(1, 3, 8, 1024, 8192)
    assert a != pi.hits(2, 0, 8, 1024, 8192)
    assert pi.hits(1, 0, 1, 1024, 8192) != pi.hits(1, 1, 2, 1024, 8192)
    big = (1 << 64) - 1
    assert 0 < pi.hits(big, 0, 1, 1024, 1024) < 1024


def test_parameters_are_checked_and_named():
    assert args("--samples", "2e8")["samples"] == 200_000_000
    with pytest.raises(ValueError, match=r"--samples .* got 0"):
        args("--samples", "0")
    with pytest.raises(ValueError, match=r"--chunk-size .* got -5"):
        args("--chunk-size", "-5")
    with pytest.raises(ValueError, match=r"--sample-seed .* got -1"):
        args("--sample-seed", "-1")
    with pytest.raises(SystemExit):  # argparse: not a whole number
        args("--samples", "1.5")


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["process", "split", "split_all", "merge"]),
                              st.integers(0, 40)), max_size=40))
def test_split_and_merge_lose_and_duplicate_nothing(ops):
    p = {"samples": 100 * 64 - 17, "chunk": 64, "seed": 3}
    bags = [APP.make_bag(p)]
    done = PiResult()
    for op, k in ops:
        bag = bags[k % len(bags)]
        if op == "process":
            before = bag.remaining()
            assert bag.process(k) == min(k, before) and bag.remaining() == before - min(k, before)
        elif op in ("split", "split_all"):
            before = bag.remaining()
            loot = bag.split(op == "split_all")
            if loot is None:
                assert before < (1 if op == "split_all" else 2)
            else:
                assert loot.remaining() + bag.remaining() == before and loot.partial is None
                bags.append(loot)
        elif len(bags) > 1:
            other = bags.pop()
            if other is not bag:
                bag.merge(other)  # takes the other's hits too (the bag contract)
            else:
                bags.append(other)
    left = sorted(c for b in bags for lo, hi in b.ranges for c in range(lo, hi))
    assert len(left) == len(set(left))
    for b in bags:
        done.fold(drain(b, 7))
    expected = APP.sequential(p)
    assert (done.hits, done.samples) == (expected.hits, expected.samples)


# -- GLB over places ------------------------------------------------------------------------------

@pytest.mark.parametrize("places, workers", [(1, 1), (2, 2)])
def test_glb_hits_are_identical_static_and_dynamic(small, places, workers):
    p, expected = small

    def main():
        glb = GLB(GLBConfig(n=5, workers=workers))
        dynamic = glb.compute_dynamic(APP.make_bag(p), APP.make_result(p))
        dynamic_chunks = sum(s.units for s in glb.stats())
        static = glb.compute_static(functools.partial(APP.make_static_bag, p), APP.make_result(p))
        return dynamic, dynamic_chunks, static

    dynamic, chunks, static = apgas.run(main, places=places, threads=workers + 1)
    for result in (dynamic, static):
        assert (result.hits, result.samples) == (expected.hits, expected.samples)
    assert chunks == pi.chunk_count(p["samples"], p["chunk"])


def test_malleable_glb_hits_are_identical_through_a_shrink_and_a_grow(malleable_address, tmp_path):
    p = args("--samples", "3e8", "--sample-seed", "11")
    gate = str(tmp_path / "orders-done")  # the computation ends only after both orders

    def main():
        client, replies = orders_then_gate(malleable_address, ("shrink 1", "grow 1 a"), gate)
        glb = GLB(GLBConfig(n=8, workers=2, malleable=True))
        result = glb.compute_dynamic(GatedBag(APP.make_bag(p), gate), APP.make_result(p))
        client.join(30)
        return result, glb.stats(), replies

    result, stats, replies = apgas.run(main, places=3, threads=3)
    assert replies == [[socket.gethostname()], ["ok grow 1 places 3"]], replies
    expected = APP.sequential(p)
    assert (result.hits, result.samples) == (expected.hits, expected.samples)
    assert sum(s.units for s in stats) == pi.chunk_count(p["samples"], p["chunk"])
    assert {s.place for s in stats} == {0, 1, 2, 3}, str(stats)
