"""N-Queens: exact counts from the kernel, from GLB (dynamic, static, malleable), and the bag protocol."""

from __future__ import annotations

import argparse
import functools
import socket

import numpy as np
import pytest
from glb_bags import GatedBag
from hypothesis import given, settings
from hypothesis import strategies as st
from orders import orders_then_gate

import apgas
from glb import GLB, GLBConfig
from glb.apps import nqueens
from glb.apps.nqueens import APP, REFERENCE, NQueensBag, NQueensResult, prefixes

pytestmark = pytest.mark.timeout(60)

SIZES = range(8, 13)


@pytest.fixture(scope="module", autouse=True)
def compiled():
    APP.warm_up()


def args(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    APP.add_arguments(parser)
    return APP.params(parser.parse_args(list(argv)))


def drain(bag: NQueensBag, n: int = 7) -> NQueensResult:
    result = NQueensResult()
    while not bag.is_empty():
        bag.process(n)
    bag.submit(result)
    return result


@pytest.mark.parametrize("n", SIZES)
def test_sequential_kernel_is_exact(n):
    p = args("-n", str(n))
    value = APP.value(APP.sequential(p))
    assert value == REFERENCE[n]
    assert APP.check(p, value) is True
    assert APP.check(p, value + 1) is False


@pytest.mark.parametrize("t", [0, 1, 3, 6, 8])
def test_every_threshold_gives_the_same_count(t):
    p = args("-n", "8", "-t", str(t))
    assert drain(APP.make_bag(p)).solutions == 92


def test_prefixes_are_valid_placements():
    tasks = prefixes(8, 3)
    assert tasks.shape == (len(tasks), 4) and len(np.unique(tasks, axis=0)) == len(tasks)
    assert all(bin(cols).count("1") == 3 for cols in tasks[:, nqueens.COLS])
    assert set(tasks[:, nqueens.ROW]) == {3}
    assert np.all(tasks < 1 << 8)


@pytest.mark.parametrize("count", [1, 3, 4, 7])
def test_static_shares_cover_every_prefix_once(count):
    p = args("-n", "9", "-t", "3")
    shares = [APP.make_static_bag(p, i, count) for i in range(count)]
    together = np.concatenate([b.tasks for b in shares])
    assert sorted(map(tuple, together)) == sorted(map(tuple, prefixes(9, 3)))
    assert sum(drain(b).solutions for b in shares) == 352


def test_bad_parameters_name_the_value():
    with pytest.raises(ValueError, match=r"-n .* got 0"):
        args("-n", "0")
    with pytest.raises(ValueError, match=r"-n .* got 31"):
        args("-n", "31")
    with pytest.raises(ValueError, match=r"-t .* 0\.\.8 .* got 9"):
        args("-n", "8", "-t", "9")
    with pytest.raises(ValueError, match=r"-t .* got -1"):
        args("-t", "-1")
    assert APP.check(args("-n", "25"), 1) is None  # no reference


def test_c_reference_agrees():
    measured = nqueens.c_reference_seconds(10)
    if measured is None:
        pytest.skip("no C compiler")
    count, seconds = measured
    assert count == 724 and seconds > 0


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["process", "split", "split_all", "merge"]),
                              st.integers(0, 40)), max_size=40))
def test_split_and_merge_lose_and_duplicate_nothing(ops):
    start = prefixes(8, 3)
    bags = [NQueensBag(8, start.copy())]
    done = NQueensResult()
    for op, k in ops:
        bag = bags[k % len(bags)]
        if op == "process":
            before = len(bag.tasks)
            assert bag.process(k) == min(k, before) and len(bag.tasks) == before - min(k, before)
        elif op in ("split", "split_all"):
            before = len(bag.tasks)
            loot = bag.split(op == "split_all")
            if loot is None:
                assert before < (1 if op == "split_all" else 2)
            else:
                assert len(loot.tasks) + len(bag.tasks) == before and loot.solutions == 0
                bags.append(loot)
        elif len(bags) > 1:
            other = bags.pop()
            if other is not bag:
                bag.merge(other)
                other.submit(done)  # the loser keeps its solutions: they must still be counted
            else:
                bags.append(other)
    left = np.concatenate([b.tasks for b in bags])
    for b in bags:
        b.submit(done)
    assert done.tasks + len(left) == len(start)
    assert done.solutions + drain(NQueensBag(8, left)).solutions == 92


def test_read_only_loot_is_solved():  # loot arriving out of band may be read-only
    tasks = prefixes(9, 2)
    tasks.flags.writeable = False
    assert drain(NQueensBag(9, tasks)).solutions == 352


def test_process_counts_prefixes():
    bag = NQueensBag(8, prefixes(8, 2))
    size = len(bag.tasks)
    assert bag.process(5) == 5 and len(bag.tasks) == size - 5
    assert bag.process(10**6) == size - 5 and bag.is_empty() and bag.process(3) == 0
    assert bag.split(False) is None and bag.split(True) is None


# -- GLB over places ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_glb_on_two_places_is_exact(mode):
    def main():
        found = {}
        for n in SIZES:
            p = args("-n", str(n), "-t", "3")
            glb = GLB(GLBConfig(n=4, workers=2))
            if mode == "dynamic":
                result = glb.compute_dynamic(APP.make_bag(p), APP.make_result(p))
            else:
                result = glb.compute_static(functools.partial(APP.make_static_bag, p), APP.make_result(p))
            found[n] = (APP.value(result), result.tasks, sum(s.units for s in glb.stats()))
        return found

    found = apgas.run(main, places=2, threads=3)
    for n in SIZES:
        tasks = len(prefixes(n, 3))
        assert found[n] == (REFERENCE[n], tasks, tasks), n


def test_malleable_glb_is_exact_through_a_shrink_and_a_grow(malleable_address, tmp_path):
    p = args("-n", "15", "-t", "4")
    gate = str(tmp_path / "orders-done")  # the computation ends only after both orders

    def main():
        client, replies = orders_then_gate(malleable_address, ("shrink 1", "grow 1 a"), gate)
        glb = GLB(GLBConfig(n=8, workers=2, malleable=True))
        result = glb.compute_dynamic(GatedBag(APP.make_bag(p), gate), APP.make_result(p))
        client.join(30)
        return APP.value(result), result.tasks, glb.stats(), replies

    value, tasks, stats, replies = apgas.run(main, places=3, threads=3)
    assert replies == [[socket.gethostname()], ["ok grow 1 places 3"]], replies
    assert value == REFERENCE[15]
    assert tasks == sum(s.units for s in stats) == len(prefixes(15, 4))
    assert {s.place for s in stats} == {0, 1, 2, 3}, str(stats)
