"""UTS: the numba kernel against the published counts and a plain hashlib
reference, the bag's split/merge invariants, and exact GLB runs (dynamic,
static, malleable)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import pickle
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import apgas
from benchmarks import uts
from glb import GLB, GLBConfig
from orders import send_orders

pytestmark = pytest.mark.timeout(60)


# -- the reference: the tree exactly as specified, with hashlib ------------------------------

def ref_root(seed: int) -> bytes:
    return hashlib.sha1(bytes(16) + seed.to_bytes(4, "big")).digest()


def ref_child(digest: bytes, i: int) -> bytes:
    return hashlib.sha1(digest + i.to_bytes(4, "big")).digest()


def ref_children(digest: bytes) -> int:
    v = int.from_bytes(digest[16:20], "big") & 0x7FFFFFFF
    return math.floor(math.log(1 - v / 2**31) / math.log(4 / 5))


@functools.cache
def ref_size(seed: int, depth: int) -> int:
    """Nodes of the tree: the root counts, at remaining depth 1 children are counted unhashed."""
    stack, count = [(ref_root(seed), depth)], 0
    while stack:
        digest, left = stack.pop()
        n = ref_children(digest)
        count += 1
        if left == 1:
            count += n
        else:
            stack.extend((ref_child(digest, i), left - 1) for i in range(n))
    return count


def params(seed: int = 19, depth: int = 6) -> dict:
    return {"seed": seed, "depth": depth}


def drain(bag: uts.UTSBag, n: int = 1 << 30) -> int:
    """Process ``bag`` to its end; return its count."""
    while not bag.is_empty():
        bag.process(n)
    result = uts.NodeCount()
    bag.submit(result)
    return result.nodes


# -- the kernel ---------------------------------------------------------------------------------

def test_reference_matches_the_published_counts():
    for depth in (1, 2, 5):
        assert ref_size(19, depth) == uts.REFERENCE[depth]


@pytest.mark.parametrize("depth", range(1, 11))
def test_kernel_counts_seed_19_exactly(depth):
    expected = uts.REFERENCE.get(depth) or ref_size(19, depth)
    result = uts.APP.sequential(params(depth=depth))
    assert uts.APP.value(result) == uts.APP.units(result) == expected
    assert uts.APP.check(params(depth=depth), expected) is (True if depth in uts.REFERENCE else None)


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 42, 1000, 123_456_789, 2**32 - 1])
def test_kernel_matches_hashlib_on_other_seeds(seed):
    for depth in range(1, 6):
        assert uts.tree_size(seed, depth) == ref_size(seed, depth), (seed, depth)


def test_root_without_children_is_one_node():
    seed = next(s for s in range(100) if ref_children(ref_root(s)) == 0)
    assert uts.tree_size(seed, 5) == 1
    bag = uts.make_bag(params(seed, 5))
    assert bag.process(10) == 1 and bag.is_empty()


@pytest.mark.parametrize("n", [1, 2, 7, 100, 511])
def test_process_counts_at_most_n(n):
    bag, total = uts.make_bag(params(depth=7)), 0
    while not bag.is_empty():
        done = bag.process(n)
        assert 1 <= done <= max(n, uts.MAX_CHILDREN + 1)
        total += done
    assert total == drain(bag) == ref_size(19, 7)


def test_stack_grows_when_children_do_not_fit():
    """A full stack: the first node's children need room the array does not have."""
    bag = uts.make_bag(params(depth=5))
    copies = uts.INITIAL_ROWS - 1
    bag.merge(uts.UTSBag(np.repeat(bag.rows(), copies, axis=0)))
    assert len(bag) == uts.INITIAL_ROWS
    assert drain(bag, 1000) == (copies + 1) * uts.REFERENCE[5]


# -- the bag ------------------------------------------------------------------------------------

operations = st.lists(st.tuples(st.sampled_from(["process", "split", "split_all", "pickle"]),
                                st.integers(1, 3000)), max_size=25)


@settings(max_examples=60, deadline=None)
@given(seed=st.sampled_from([19, 4, 42]), ops=operations)
def test_split_merge_and_pickle_lose_nothing(seed, ops):
    """Any mix of process, split (kept aside, merged back later) and pickling."""
    bag, aside, counted = uts.make_bag(params(seed, 7)), [], 0
    for op, k in ops:
        if op == "process":
            counted += bag.process(k)
        elif op == "pickle":
            bag = pickle.loads(pickle.dumps(bag))
        else:
            size = len(bag)
            loot = bag.split(op == "split_all")
            if loot is None:
                assert size == 0 if op == "split_all" else size < 2
                continue
            assert loot.count == 0 and len(loot) + len(bag) == size
            if op == "split":
                assert len(loot) == (size + 1) // 2 and not bag.is_empty()
            aside.append(pickle.loads(pickle.dumps(loot)))
            if k % 2:                       # merge some back now, others at the end
                bag.merge(aside.pop())
    for loot in aside:
        bag.merge(loot)
        assert loot.is_empty() and loot.count == 0
    assert drain(bag) == ref_size(seed, 7)


def test_split_gives_away_every_other_node():
    bag = uts.make_bag(params(depth=8))
    bag.process(50)
    rows = bag.rows()
    loot = bag.split(False)
    assert (loot.rows() == rows[0::2]).all() and (bag.rows() == rows[1::2]).all()
    # both halves keep nodes from the top (big subtrees) of the stack
    assert loot.rows()[:, 5].max() >= bag.rows()[:, 5].min()


def test_splittable_only_with_two_nodes():
    bag = uts.make_bag(params(depth=3))
    assert not bag.is_splittable() and bag.split(False) is None
    all_of_it = bag.split(True)
    assert bag.is_empty() and bag.split(True) is None
    assert drain(all_of_it) == ref_size(19, 3)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 16, 100])
def test_static_bags_cover_the_tree_once(count):
    p = params(depth=7)
    assert sum(drain(uts.make_static_bag(p, i, count)) for i in range(count)) == ref_size(19, 7)


def test_static_bag_with_huge_worker_count_is_cheap():
    start = time.perf_counter()
    bag = uts.make_static_bag(params(depth=13), 0, 1 << 30)
    assert time.perf_counter() - start < 2.0
    assert 0 < len(bag) <= 1


# -- the application ---------------------------------------------------------------------------

def parse(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    uts.APP.add_arguments(parser)
    return uts.APP.params(parser.parse_args(list(argv)))


def test_params_defaults_and_validation():
    assert parse() == {"seed": 19, "depth": 13}
    assert parse("--depth", "4", "--seed", "7") == {"seed": 7, "depth": 4}
    for argv, bad in ((["--depth", "0"], "0"), (["--depth", "31"], "31"),
                      (["--seed", "-1"], "-1"), (["--seed", str(2**32)], str(2**32))):
        with pytest.raises(ValueError, match=bad):
            parse(*argv)


def test_check_and_warm_up():
    assert uts.APP.check(params(depth=13), 264_459_392) is True
    assert uts.APP.check(params(depth=13), 264_459_391) is False
    assert uts.APP.check(params(seed=20, depth=13), 1) is None
    assert uts.APP.check(params(depth=14), 1) is None
    assert uts.APP.warm_up() >= 0.0
    assert uts.APP.unit_name == "nodes" and uts.APP.name == "uts"


# -- GLB ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_glb_on_two_places_is_exact(mode):
    p = params(depth=9)

    def main():
        uts.warm_up()
        glb = GLB(GLBConfig(n=511, workers=2))
        if mode == "dynamic":
            total = glb.compute_dynamic(uts.APP.make_bag(p), uts.APP.make_result(p))
        else:
            total = glb.compute_static(lambda i, k: uts.APP.make_static_bag(p, i, k),
                                       uts.APP.make_result(p))
        return uts.APP.value(total), glb.stats()

    value, stats = apgas.run(main, places=2, threads=3)
    assert value == uts.REFERENCE[9]
    assert [s.place for s in stats] == [0, 1]
    if mode == "dynamic":                   # every node is counted by some process() call
        assert sum(s.units for s in stats) == uts.REFERENCE[9]


def test_malleable_glb_grows_and_shrinks_exactly(malleable_address):
    """Shrink first (it takes milliseconds), then grow: the grow is sure to be ordered
    while the computation (a few seconds on 2 cores) still runs, and the new place
    joins it through its lifelines."""
    address = malleable_address
    p = params(depth=12)
    replies: list[list[str]] = []
    computed = threading.Event()

    def main():
        uts.warm_up()
        # stops waiting if the run ends before it takes orders: the assert says so
        client = send_orders(address, ("shrink 1", "grow 1 a"), replies, stop=computed, timeout=30)
        glb = GLB(GLBConfig(n=1024, workers=1, malleable=True))
        total = glb.compute_dynamic(uts.APP.make_bag(p), uts.APP.make_result(p))
        computed.set()
        client.join(30)
        return uts.APP.value(total), glb.stats()

    value, stats = apgas.run(main, places=3, threads=2)
    assert replies == [[socket.gethostname()], ["ok grow 1 places 3"]], replies
    assert value == uts.REFERENCE[12]
    assert {s.place for s in stats} == {0, 1, 2, 3}
    assert sum(s.units for s in stats) == uts.REFERENCE[12]
