"""UTS: the numba kernel against the published tree sizes and a plain hashlib
reference of uts.c for every tree type, the bag's split/merge invariants, the
command line, and exact GLB runs (dynamic, static, malleable) of the named
sample trees T1..T5."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import pickle
import random
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from glb_bags import GatedBag
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from orders import orders_then_gate, random_orders

import apgas
from glb import GLB, GLBConfig
from glb.apps import uts

pytestmark = pytest.mark.timeout(60)


# -- the reference: uts.c exactly as specified, with hashlib and math -----------------------

def ref_root(seed: int) -> bytes:
    return hashlib.sha1(bytes(16) + seed.to_bytes(4, "big")).digest()


def ref_child(digest: bytes, i: int) -> bytes:
    return hashlib.sha1(digest + i.to_bytes(4, "big")).digest()


def ref_u(digest: bytes) -> float:
    return (int.from_bytes(digest[16:20], "big") & 0x7FFFFFFF) / 2**31


def ref_b(shape: str, b0: float, d: int, h: int) -> float:
    """uts_numChildren_geo's b_i."""
    if h == 0:
        return b0
    if shape == "expdec":
        return b0 * math.pow(h, -math.log(b0) / math.log(d))
    if shape == "cyclic":
        return 0.0 if h > 5 * d else math.pow(b0, math.sin(2.0 * 3.141592653589793 * h / d))
    if shape == "fixed":
        return b0 if h < d else 0.0
    return b0 * (1.0 - h / d)


def ref_children(tree: dict, digest: bytes, h: int) -> int:
    """uts_numChildren: the count, capped at 100 except for a binomial root's."""
    u = ref_u(digest)
    kind = tree.get("type", "geo")
    if kind == "bin" and h == 0:
        return math.floor(tree["b0"])
    if kind == "geo" or (kind == "hybrid" and h < 0.5 * tree["depth"]):
        b = ref_b(tree.get("shape", "fixed"), tree.get("b0", 4.0), tree.get("depth", 13), h)
        n = 0 if b == 0 else math.floor(math.log(1 - u) / math.log(1 - 1 / (1 + b)))
    else:
        n = tree["m"] if u < tree["q"] else 0
    return min(n, 100)


class TooBig(Exception):
    pass


def ref_size(tree: dict, limit: int = 10**6) -> int:
    """Nodes of the tree, every node hashed; TooBig past ``limit`` nodes."""
    stack, count = [(ref_root(tree.get("seed", 19)), 0)], 0
    while stack:
        digest, h = stack.pop()
        count += 1
        if count > limit:
            raise TooBig
        stack.extend((ref_child(digest, i), h + 1) for i in range(ref_children(tree, digest, h)))
    return count


@functools.cache
def geo_size(seed: int, depth: int) -> int:
    """The seed's geometric fixed b0 = 4 tree."""
    return ref_size({"seed": seed, "depth": depth})


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
        assert geo_size(19, depth) == uts.REFERENCE[depth]


@pytest.mark.parametrize("depth", range(1, 11))
def test_kernel_counts_seed_19_exactly(depth):
    expected = uts.REFERENCE.get(depth) or geo_size(19, depth)
    result = uts.APP.sequential(params(depth=depth))
    assert uts.APP.value(result) == uts.APP.units(result) == expected
    assert uts.APP.check(params(depth=depth), expected) is (True if depth in uts.REFERENCE else None)


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 42, 1000, 123_456_789, 2**32 - 1])
def test_kernel_matches_hashlib_on_other_seeds(seed):
    for depth in range(1, 6):
        assert uts.tree_size(seed, depth) == geo_size(seed, depth), (seed, depth)


SMALL = [
    {"type": "geo", "shape": "fixed", "b0": 2.5, "depth": 6, "seed": 0},
    {"type": "geo", "shape": "linear", "b0": 4.0, "depth": 9, "seed": 0},
    {"type": "geo", "shape": "expdec", "b0": 3.0, "depth": 4, "seed": 0},     # height 16
    {"type": "geo", "shape": "cyclic", "b0": 3.0, "depth": 2, "seed": 0},     # height 5 d + 1
    {"type": "bin", "b0": 300.0, "q": 0.2, "m": 4, "seed": 42},               # root indexes past 100
    {"type": "bin", "b0": 7.9, "q": 0.3, "m": 3, "seed": 21},
    {"type": "hybrid", "shape": "linear", "b0": 4.0, "depth": 7, "q": 0.234375, "m": 4, "seed": 0},
    {"type": "hybrid", "shape": "cyclic", "b0": 3.0, "depth": 4, "q": 0.3, "m": 3, "seed": 7},
    {"type": "geo", "shape": "fixed", "b0": 150.0, "depth": 2, "seed": 0},    # counts capped at 100
]


@pytest.mark.parametrize("tree", SMALL, ids=lambda t: "-".join(str(v) for v in t.values()))
def test_kernel_matches_hashlib_on_every_tree_type(tree):
    size = ref_size(tree)
    assert 20 < size < 100_000
    assert uts.sequential(tree).nodes == size
    assert uts.APP.check(tree, size) is None
    p = uts.tree_of(tree).params()
    assert p == tree
    assert sum(drain(uts.make_static_bag(p, i, 3)) for i in range(3)) == size


trees = st.one_of(
    st.fixed_dictionaries({"type": st.just("geo"), "shape": st.sampled_from(uts.SHAPES),
                           "b0": st.floats(0.1, 6.0), "depth": st.integers(2, 7),
                           "seed": st.integers(0, 2**32 - 1)}),
    st.fixed_dictionaries({"type": st.just("bin"), "b0": st.floats(0.5, 400.0),
                           "q": st.floats(0.0, 1.0), "m": st.integers(0, 6),
                           "seed": st.integers(0, 2**32 - 1)}),
    st.fixed_dictionaries({"type": st.just("hybrid"), "shape": st.sampled_from(uts.SHAPES),
                           "b0": st.floats(0.1, 6.0), "depth": st.integers(2, 7),
                           "q": st.floats(0.0, 1.0), "m": st.integers(0, 6),
                           "seed": st.integers(0, 2**32 - 1)}))


@settings(max_examples=120, deadline=None)
@given(tree=trees)
def test_kernel_matches_hashlib_on_random_small_trees(tree):
    try:
        size = ref_size(tree, limit=3000)
    except TooBig:
        assume(False)
    assert uts.sequential(tree).nodes == size


def test_leaves_are_counted_unhashed_only_where_b_is_zero():
    """The shortcut's heights: every node there has b_h = 0, the level above does not."""
    for shape, leaf in (("fixed", 7), ("linear", 7), ("cyclic", 36)):
        t, _ = uts.kernel_of(uts.Tree("geo", shape, 3.0, 7, None, None, 1))
        assert t.leaf == leaf and ref_b(shape, 3.0, 7, leaf) == 0 and ref_b(shape, 3.0, 7, leaf - 1) > 0
        if shape != "linear":                 # linear: no node is deeper than the leaves
            assert all(ref_b(shape, 3.0, 7, h) == 0 for h in range(leaf, leaf + 20))
    for tree in (uts.TREES["T3"], uts.TREES["T4"], uts.Tree("geo", "expdec", 4.0, 10, None, None, 1)):
        assert uts.kernel_of(tree)[0].leaf == uts.NEVER


def test_expdec_heights_past_the_table_compute_b():
    tree = uts.Tree("geo", "expdec", 4.0, 3, None, None, 1)
    t, table = uts.kernel_of(tree)
    assert len(table) == uts.EXPDEC_TABLE
    for h in (1, 2, 255, 256, 1000):
        expected = math.log(1 - 1 / (1 + ref_b("expdec", 4.0, 3, h)))
        assert uts.log_q_at(t.shape, t.b0, t.depth, h) == expected


def test_binomial_root_has_floor_b0_children_and_no_cap():
    tree = {"type": "bin", "b0": 250.7, "q": 0.0, "m": 4, "seed": 3}
    assert uts.sequential(tree).nodes == 251
    bag = uts.make_bag(tree)
    assert bag.process(1) == 1 and len(bag) == 250
    assert sorted(bag.rows()[:, 5]) == [1] * 250


def test_root_without_children_is_one_node():
    seed = next(s for s in range(100) if ref_children({}, ref_root(s), 0) == 0)
    assert uts.tree_size(seed, 5) == 1
    bag = uts.make_bag(params(seed, 5))
    assert bag.process(10) == 1 and bag.is_empty()


@pytest.mark.parametrize("name", uts.SMALL_TREES)
def test_named_trees_have_their_published_sizes(name):
    p = uts.TREES[name].params()
    assert uts.sequential(p).nodes == uts.PUBLISHED[name]
    assert uts.APP.check({"tree": name, **p}, uts.PUBLISHED[name]) is True
    assert uts.APP.check(p, uts.PUBLISHED[name] + 1) is False


def test_published_sizes_are_the_distributions():
    """sample_trees.sh of the UTS distribution, and T1 is the depth-10 seed-19 tree."""
    assert uts.PUBLISHED == {"T1": 4130071, "T5": 4147582, "T2": 4117769, "T3": 4112897,
                             "T4": 4132453, "T1L": 102181082, "T2L": 96793510, "T3L": 111345631}
    assert uts.PUBLISHED["T1"] == uts.REFERENCE[10] and uts.TREES["T1"] == uts.tree_of(params(depth=10))


@pytest.mark.parametrize("n", [1, 2, 7, 100, 511])
def test_process_counts_at_most_n(n):
    bag, total = uts.make_bag(params(depth=7)), 0
    while not bag.is_empty():
        done = bag.process(n)
        assert 1 <= done <= max(n, uts.MAX_CHILDREN + 1)
        total += done
    assert total == drain(bag) == geo_size(19, 7)


def test_stack_grows_when_children_do_not_fit():
    """A full stack: the first node's children need room the array does not have."""
    bag = uts.make_bag(params(depth=5))
    copies = uts.INITIAL_ROWS - 1
    bag.merge(uts.UTSBag(bag.tree, np.repeat(bag.rows(), copies, axis=0)))
    assert len(bag) == uts.INITIAL_ROWS
    assert drain(bag, 1000) == (copies + 1) * uts.REFERENCE[5]


def test_stack_grows_for_a_binomial_root():
    """The root alone, with more children than the initial array has rows."""
    tree = {"type": "bin", "b0": 3 * uts.INITIAL_ROWS + 0.5, "q": 0.0, "m": 1, "seed": 2}
    bag = uts.make_bag(tree)
    assert bag.process(1) == 1 and len(bag) == 3 * uts.INITIAL_ROWS
    assert drain(bag, 10) == 3 * uts.INITIAL_ROWS + 1


# -- the bag ------------------------------------------------------------------------------------

operations = st.lists(st.tuples(st.sampled_from(["process", "split", "split_all", "pickle"]),
                                st.integers(1, 3000)), max_size=25)
bag_trees = [params(19, 7), params(4, 7), params(42, 7),
             {"type": "bin", "b0": 40.0, "q": 0.124875, "m": 8, "seed": 42},
             {"type": "hybrid", "shape": "linear", "b0": 4.0, "depth": 8, "q": 0.234375, "m": 4, "seed": 1}]


@settings(max_examples=60, deadline=None)
@given(tree=st.sampled_from(bag_trees), ops=operations)
def test_split_merge_and_pickle_lose_nothing(tree, ops):
    """Any mix of process, split (kept aside, merged back later) and pickling."""
    bag, aside, counted = uts.make_bag(tree), [], 0
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
    assert drain(bag) == _sizes(tuple(sorted(tree.items())))


@functools.cache
def _sizes(items: tuple) -> int:
    return ref_size(dict(items))


def test_split_gives_away_every_other_node():
    bag = uts.make_bag(params(depth=8))
    bag.process(50)
    rows = bag.rows()
    loot = bag.split(False)
    assert (loot.rows() == rows[0::2]).all() and (bag.rows() == rows[1::2]).all()
    # both halves keep nodes from the top (big subtrees) of the stack: small heights
    assert loot.rows()[:, 5].min() <= bag.rows()[:, 5].max()
    assert loot.tree == bag.tree


def test_merge_refuses_another_tree():
    bag = uts.make_bag(params(depth=4))
    with pytest.raises(ValueError, match="cannot merge"):
        bag.merge(uts.make_bag(params(depth=5)))


def test_splittable_only_with_two_nodes():
    bag = uts.make_bag(params(depth=3))
    assert not bag.is_splittable() and bag.split(False) is None
    all_of_it = bag.split(True)
    assert bag.is_empty() and bag.split(True) is None
    assert drain(all_of_it) == geo_size(19, 3)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 16, 100])
def test_static_bags_cover_the_tree_once(count):
    p = params(depth=7)
    assert sum(drain(uts.make_static_bag(p, i, count)) for i in range(count)) == geo_size(19, 7)


@pytest.mark.parametrize("p", [params(depth=13), {"tree": "T3"}, {"tree": "T2"}], ids=str)
def test_static_bag_with_huge_worker_count_is_cheap(p):
    start = time.perf_counter()
    bag = uts.make_static_bag(p, 0, 1 << 30)
    assert time.perf_counter() - start < 10.0  # not a loop over the 2**30 workers
    assert 0 < len(bag) <= 1


def test_static_bags_of_a_binomial_tree_cover_it_once():
    p = {"type": "bin", "b0": 200.0, "q": 0.1, "m": 8, "seed": 42}
    size = ref_size(p)
    assert size > 500
    for count in (2, 7, 2000):
        assert sum(drain(uts.make_static_bag(p, i, count)) for i in range(count)) == size


# -- the application ---------------------------------------------------------------------------

def parse(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    uts.APP.add_arguments(parser)
    return uts.APP.params(parser.parse_args(list(argv)))


def test_params_defaults_and_explicit_trees():
    default = {"type": "geo", "shape": "fixed", "b0": 4.0, "depth": 13, "seed": 19}
    assert parse() == default
    assert parse("--depth", "4", "--seed", "7") == {**default, "depth": 4, "seed": 7}
    assert parse("--type", "bin", "--b0", "2000", "--q", "0.124875", "--m", "8", "--seed", "42") \
        == {"type": "bin", "b0": 2000.0, "q": 0.124875, "m": 8, "seed": 42}
    assert parse("--type", "hybrid", "--shape", "linear", "--depth", "16", "--b0", "6", "--seed", "1") \
        == {"type": "hybrid", "shape": "linear", "b0": 6.0, "depth": 16, "q": 0.234375, "m": 4, "seed": 1}
    assert parse("--tree", "T3") == {"tree": "T3", "type": "bin", "b0": 2000.0, "q": 0.124875, "m": 8,
                                     "seed": 42}
    for name in uts.TREES:      # every named tree's parameters are accepted as explicit ones
        explicit = uts.TREES[name].params()
        argv = [a for k, v in explicit.items() for a in (f"--{k}", str(v))]
        assert parse(*argv) == explicit and uts.published(explicit) == uts.PUBLISHED[name]


@pytest.mark.parametrize("argv, words", [
    (["--tree", "T3", "--seed", "7"], ["--tree T3", "--seed 7"]),
    (["--tree", "T1", "--depth", "10"], ["--tree T1", "--depth 10"]),
    (["--tree", "T9"], ["--tree", "'T9'"]),
    (["--depth", "0"], ["--depth", "0"]),
    (["--depth", "31"], ["--depth", "31"]),
    (["--seed", "-1"], ["--seed", "-1"]),
    (["--seed", str(2**32)], ["--seed", str(2**32)]),
    (["--type", "bin", "--q", "1.5"], ["--q", "1.5"]),
    (["--type", "hybrid", "--q", "-0.1"], ["--q", "-0.1"]),
    (["--type", "bin", "--q", "nan"], ["--q", "nan"]),
    (["--type", "bin", "--m", "-1"], ["--m", "-1"]),
    (["--b0", "0"], ["--b0", "0"]),
    (["--b0", "-2"], ["--b0", "-2"]),
    (["--b0", "inf"], ["--b0", "inf"]),
    (["--type", "bin", "--depth", "5"], ["--depth 5", "--type bin"]),
    (["--type", "bin", "--shape", "fixed"], ["--shape fixed", "--type bin"]),
    (["--q", "0.5"], ["--q 0.5", "--type geo"]),
])
def test_bad_options_are_refused_by_name(argv, words):
    with pytest.raises(ValueError) as err:
        parse(*argv)
    for word in words:
        assert word in str(err.value)


def test_params_dicts_are_validated():
    assert uts.tree_of({"tree": "T3", "seed": 42}) == uts.TREES["T3"]
    for bad, word in (({"tree": "T3", "seed": 43}, "--seed"), ({"depth": 2.5}, "--depth"),
                      ({"type": "ternary"}, "--type"), ({"shape": "round"}, "--shape"),
                      ({"branching": 3}, "branching"), ({"type": "bin", "m": 1.5}, "--m")):
        with pytest.raises(ValueError, match=word):
            uts.make_bag(bad)


def test_check_and_warm_up():
    assert uts.APP.check(params(depth=13), 264_459_392) is True
    assert uts.APP.check(params(depth=13), 264_459_391) is False
    assert uts.APP.check(params(seed=20, depth=13), 1) is None
    assert uts.APP.check(params(depth=14), 1_057_675_516) is True  # counted here, sequentially
    assert uts.APP.check(params(depth=16), 1) is None  # no reference
    assert uts.APP.check({"type": "geo", "shape": "linear", "depth": 13, "seed": 19}, 1) is None
    assert uts.APP.check({"tree": "T3L"}, 111_345_631) is True
    assert uts.APP.warm_up() >= 0.0
    assert uts.APP.unit_name == "nodes" and uts.APP.name == "uts"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glb.apps", "uts", *args], capture_output=True,
                          text=True, timeout=100)


@pytest.mark.timeout(120)
def test_cli_counts_t3_on_two_places(tmp_path):
    out = tmp_path / "r.json"
    proc = cli("--tree", "T3", "--places", "2", "--workers", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["result"] == 4_112_897 and record["correct"] is True
    assert record["params"] == {"tree": "T3", "type": "bin", "b0": 2000.0, "q": 0.124875, "m": 8, "seed": 42}
    assert "correct True" in proc.stdout


@pytest.mark.timeout(120)
def test_cli_refuses_bad_options():
    proc = cli("--tree", "T3", "--seed", "7")
    assert proc.returncode == 2 and "--tree T3 cannot be combined with --seed 7" in proc.stderr
    proc = cli("--type", "bin", "--q", "2")
    assert proc.returncode == 2 and "--q" in proc.stderr and "2.0" in proc.stderr
    proc = cli("--type", "tree")
    assert proc.returncode == 2 and "argument --type: invalid choice: 'tree'" in proc.stderr


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


@pytest.mark.timeout(120)
def test_glb_counts_the_named_trees_on_two_places_with_two_workers():
    def main():
        uts.warm_up()
        counts = {}
        for name in uts.SMALL_TREES:
            p = {"tree": name}
            glb = GLB(GLBConfig(n=2048, workers=2))
            total = glb.compute_dynamic(uts.APP.make_bag(p), uts.APP.make_result(p))
            counts[name] = (uts.APP.value(total), sum(s.units for s in glb.stats()),
                            sorted({s.place for s in glb.stats()}))
        return counts

    counts = apgas.run(main, places=2, threads=3)
    assert counts == {name: (uts.PUBLISHED[name], uts.PUBLISHED[name], [0, 1]) for name in uts.SMALL_TREES}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", uts.SMALL_TREES)
def test_malleable_glb_counts_named_trees_exactly_under_random_orders(name, malleable_address,
                                                                       tmp_path):
    """Random grow and shrink orders while GLB counts the tree; the gate holds the
    computation open until every order is done, however loaded the machine."""
    gate = str(tmp_path / "orders-done")

    def main():
        uts.warm_up()
        client, replies = random_orders(malleable_address, random.Random(name), name, gate)
        p = {"tree": name}
        glb = GLB(GLBConfig(n=256, workers=1, malleable=True, seed=len(name)))
        total = glb.compute_dynamic(GatedBag(uts.APP.make_bag(p), gate), uts.APP.make_result(p))
        client.join(30)
        return uts.APP.value(total), glb.stats(), replies

    value, stats, replies = apgas.run(main, places=3, threads=2)
    assert len(replies) >= 3 and all(r and not r[0].startswith("error") for r in replies), replies
    assert value == uts.PUBLISHED[name], (replies, str(stats))
    assert sum(s.units for s in stats) == uts.PUBLISHED[name]


def test_malleable_glb_grows_and_shrinks_exactly(malleable_address, tmp_path):
    """A shrink, then a grow, while GLB counts; the new place joins through its lifelines."""
    p = params(depth=10)
    gate = str(tmp_path / "orders-done")

    def main():
        uts.warm_up()
        client, replies = orders_then_gate(malleable_address, ("shrink 1", "grow 1 a"), gate)
        glb = GLB(GLBConfig(n=1024, workers=1, malleable=True))
        total = glb.compute_dynamic(GatedBag(uts.APP.make_bag(p), gate), uts.APP.make_result(p))
        client.join(30)
        return uts.APP.value(total), glb.stats(), replies

    value, stats, replies = apgas.run(main, places=3, threads=2)
    assert replies == [[socket.gethostname()], ["ok grow 1 places 3"]], replies
    assert value == uts.REFERENCE[10]
    assert {s.place for s in stats} == {0, 1, 2, 3}
    assert sum(s.units for s in stats) == uts.REFERENCE[10]
