"""The synthetic app (a UTS tree whose nodes sleep): its node count against UTS's,
sequentially and under GLB on 2 to 4 places, its bag against the contract, the
running deadline, and a smoke run of the pieces of benchmarks.balancing (no timings
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import balancing
from benchmarks._common import communicate_or_kill
from glb.apps import synthetic, uts
from glb.apps.cli import build_parser
from glb.testing import check_bag

pytestmark = pytest.mark.timeout(120)

SMALL = {"type": "bin", "b0": 40.0, "q": 0.245, "m": 4, "seed": 11}
TREES = [SMALL, {"type": "bin", "b0": 200.0, "q": 0.2, "m": 4, "seed": 3},
         {"type": "geo", "shape": "fixed", "b0": 4.0, "depth": 5, "seed": 19}]


def p(tree: dict, unit_ms: float = 0.0) -> dict:
    return {**tree, "unit_ms": unit_ms}


def run_cli(*args: str, timeout: float = 100) -> subprocess.CompletedProcess:
    """``python -m glb.apps synthetic ...`` in a session of its own, killed whole on timeout."""
    proc = subprocess.Popen([sys.executable, "-m", "glb.apps", "synthetic", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = communicate_or_kill(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("tree", TREES, ids=["bin-small", "bin-200", "geo-5"])
def test_the_sequential_count_is_the_uts_count(tree):
    assert synthetic.sequential(p(tree, 0.001)).nodes == uts.sequential(tree).nodes
    assert synthetic.APP.check(p(tree), uts.sequential(tree).nodes) is True
    assert synthetic.APP.check(p(tree), uts.sequential(tree).nodes + 1) is False


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 512])
def test_static_pieces_cover_the_tree_once(count):
    total = uts.NodeCount()
    for i in range(count):
        bag = synthetic.make_static_bag(p(TREES[1]), i, count)
        while not bag.is_empty():
            bag.process(synthetic.CHUNK)
        bag.submit(total)
    assert total.nodes == uts.sequential(TREES[1]).nodes
    with pytest.raises(ValueError, match="piece index"):
        synthetic.make_static_bag(p(SMALL), count, count)


def test_the_bag_keeps_the_contract():
    expected = uts.NodeCount(uts.sequential(SMALL).nodes)
    check_bag(lambda: synthetic.make_bag(p(SMALL)), uts.NodeCount, expected=expected,
              max_examples=30, same=lambda a, b: a.nodes == b.nodes)


def test_split_gives_nodes_with_children_and_keeps_the_leaves():
    bag = synthetic.make_bag(p(SMALL))
    bag.process(1)                        # the root: its 40 children on the stack
    piece = bag.split(False)
    assert piece is not None and len(piece) + len(bag) == 40
    tree = uts.tree_of(SMALL)
    assert synthetic.parents(piece.inner.rows(), *uts.kernel_of(tree)).all()
    leaves = synthetic.make_bag(p({**SMALL, "q": 0.0}))
    leaves.process(1)                     # q = 0: all 40 children are leaves
    assert not leaves.is_splittable() and leaves.split(False) is None


def test_pace_sleeps_to_a_running_deadline(monkeypatch):
    """An overshoot shortens the next sleep; rest() starts a new deadline."""
    clock = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        clock[0] += seconds + 0.0004      # every sleep overshoots by 0.4 ms

    monkeypatch.setattr(synthetic, "_now", lambda: clock[0])
    monkeypatch.setattr(synthetic, "_sleep", sleep)
    synthetic.rest()
    for _ in range(3):
        synthetic.pace(0.001)
    assert slept == [0.001, 0.0006, 0.0006]
    assert clock[0] == pytest.approx(100.003 + 0.0004)   # the overshoots did not pile up
    clock[0] += 5.0                                      # idle: never made up for
    synthetic.rest()
    synthetic.pace(0.001)
    assert slept[-1] == 0.001
    synthetic.rest()


def test_parameters():
    parser = build_parser({"synthetic": synthetic.APP})
    assert synthetic.APP.params(parser.parse_args(["synthetic"])) == {**synthetic.DEFAULT_TREE, "unit_ms": 1.0}
    ns = parser.parse_args(["synthetic", "--b0", "50", "--unit-ms", "0.5"])
    assert synthetic.APP.params(ns) == {**synthetic.DEFAULT_TREE, "b0": 50.0, "unit_ms": 0.5}
    ns = parser.parse_args(["synthetic", "--type", "geo", "--depth", "5"])
    assert synthetic.APP.params(ns)["type"] == "geo" and "q" not in synthetic.APP.params(ns)
    with pytest.raises(ValueError, match="--unit-ms"):
        synthetic.APP.params(parser.parse_args(["synthetic", "--unit-ms", "-1"]))


@pytest.mark.parametrize("places, mode", [(2, []), (4, []), (3, ["--static"])])
def test_glb_counts_the_tree_exactly(tmp_path, places, mode):
    out = tmp_path / "r.json"
    proc = run_cli("--b0", "40", "--unit-ms", "0.2", "--places", str(places), *mode, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["result"] == uts.sequential(SMALL).nodes and record["correct"] is True
    assert record["places"] == places and record["params"]["unit_ms"] == 0.2
    stats = record["glb_stats"]
    assert sorted(s["place"] for s in stats) == list(range(places))
    assert sum(s["units"] for s in stats) == record["result"]
    figures = balancing.glb_figures(record["params"], places, bool(mode), stats,
                                    {"n": 8, "w": 3, "lifeline": "hypercube"})
    assert 0 < figures["sim_instant"] <= 1 and figures["idle_s"]["max"] >= figures["idle_s"]["median"]
    assert figures["steals"]["random_failed"] >= 0 and figures["wait_ms"]["samples"] >= 0
    line, = balancing.render_glb([{"places": places, "system": "GLB", **figures}])
    assert "instant steals (model)" in line and "wait for work" in line


# -- the harness's pieces, small and without timings --------------------------------------------

QUICK = {**balancing.QUICK_TREE, "unit_ms": 0.01}


def test_harness_pieces_count_the_tree():
    total = balancing._expected(QUICK)
    assert sum(balancing.run_piece(QUICK, i, 5) for i in range(5)) == total
    stacks, nodes = [synthetic.make_bag(QUICK).inner.rows()], 0
    while stacks:                          # Dask's dynamic tasks, run here one by one
        done, more = balancing.expand(stacks.pop(), QUICK, balancing.CUTOFF, balancing.FANOUT)
        nodes += done
        assert len(more) <= balancing.FANOUT
        stacks.extend(more)
    assert nodes == total
    b = balancing.bounds(QUICK, 4)
    assert b["total"] == total and 0 < b["shape_bound"] <= 1
    assert b["bound_1"] <= 1 and b["largest_piece_8"] >= b["largest_subtree"]


def test_harness_pool_and_dask_smoke():
    total = balancing._expected(QUICK)
    assert [n for _, n in balancing.run_pool(QUICK, 2, (2, 16))] == [total, total]
    if balancing.have_dask():
        static, (seconds, nodes, tasks) = balancing.run_dask(QUICK, 2, (2,))
        assert [n for _, n in static] == [total] and nodes == total and tasks >= 1 and seconds > 0


def test_harness_table_and_json(tmp_path):
    def fake(params, places, dask, ray=True):
        return [{"places": places, "system": "GLB", "pieces": None, "seconds": 1.0, "nodes": 10,
                 "efficiency": 0.9, "bound": None, "correct": True, "shape_bound": 0.5},
                {"places": places, "system": "Dask", "pieces": places, "seconds": 2.0, "nodes": 10,
                 "efficiency": 0.4, "bound": 0.45, "correct": True, "shape_bound": 0.5}]

    out = tmp_path / "b.json"
    assert balancing.main(["--quick", "--json", str(out)], measure_fn=fake) == 0
    report = json.loads(out.read_text())
    assert [r["places"] for r in report["rows"]] == [4, 4, 8, 8]
    assert report["params"]["unit_ms"] == 0.25 and "load_average" in report["machine"]
    table = balancing.render(report["rows"])
    assert "no split of the level beats 0.50" in table and "0.45" in table
    with pytest.raises(SystemExit):
        balancing.parse_args(["--places", "1"])


def test_the_simulation_counts_the_tree_and_stays_below_one():
    from benchmarks._balancing_sim import simulate
    params = {"type": "bin", "b0": 200.0, "q": 0.245, "m": 4, "seed": 11, "unit_ms": 1.0}
    nodes = synthetic.node_count(params)
    for at_once in (True, False):
        r = simulate(params, 8, latency=0.002, at_once=at_once)
        assert r["units"] == nodes
        assert 0 < r["efficiency"] <= 1
    ideal = simulate(params, 8, latency=0.0)
    assert ideal["efficiency"] >= simulate(params, 8, latency=0.02)["efficiency"]


def test_the_model_serves_lifeline_thieves_eagerly_or_at_chunk_ends():
    """Both protocols do all the work; eager serving (the default, as GLB now does) gives
    pieces at registrations and on arriving loot, so lifelines answer more often."""
    from benchmarks._balancing_sim import simulate
    params = {"type": "bin", "b0": 200.0, "q": 0.245, "m": 4, "seed": 11, "unit_ms": 1.0}
    nodes = synthetic.node_count(params)
    runs = {eager: simulate(params, 16, n=32, w=1, lifeline="binary", eager=eager)
            for eager in (True, False)}
    assert all(r["units"] == nodes for r in runs.values())
    assert all(0 < r["efficiency"] <= 1 for r in runs.values())


def test_the_warm_up_leaves_no_deadline_behind():
    """A stale deadline would let the next worker on this thread skip its first sleeps."""
    synthetic.warm_up()
    assert getattr(synthetic._clock, "deadline", None) is None
