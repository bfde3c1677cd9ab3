"""benchmarks.peers: its options, the static splits through a process pool and
Dask on a small UTS tree, and the table and summary it prints."""

from __future__ import annotations

import pytest

from benchmarks import peers
from glb.apps import uts

pytestmark = pytest.mark.timeout(60)

SMALL = {"seed": 19, "depth": 6}


def test_options():
    args = peers.parse_args([])
    assert args.trees == ["T1", "T3"] and args.apps == ["uts", "pi"] and not args.quick
    args = peers.parse_args(["--trees", "T3L", "--apps", "uts", "--quick"])
    assert args.trees == ["T3L"] and args.apps == ["uts"] and args.quick
    assert peers.cases(["T1", "T3"], ["uts", "pi"], True) == [
        ("uts T1", "uts", ["--tree", "T1"]), ("uts T3", "uts", ["--tree", "T3"]),
        ("pi", "pi", ["--samples", "40000000"])]


@pytest.mark.parametrize("argv, words", [
    (["--trees", "T9"], "--trees: unknown UTS tree 'T9'"),
    (["--apps", "fft"], "--apps: unknown app 'fft'"),
    (["--trees", ""], "nothing to measure"),
])
def test_bad_options(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        peers.parse_args(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("pieces", [2, 5])
def test_pool_runs_the_static_pieces_exactly(pieces):
    seconds, total = peers.with_pool("uts", SMALL, pieces)
    assert seconds > 0 and total.nodes == uts.sequential(SMALL).nodes


def test_dask_runs_the_static_pieces_exactly():
    pytest.importorskip("distributed")
    seconds, total = peers.with_dask("uts", {"tree": "T3"}, 3)
    assert seconds > 0 and total.nodes == uts.PUBLISHED["T3"]


def test_summary_and_table():
    def row(case, system, kind, seconds, correct=True):
        return {"case": case, "system": system, "kind": kind, "seconds": seconds, "correct": correct,
                "result": 1, "vs_best_glb": 1.0}

    rows = [row("uts T3", "kernel alone (1 core)", "sequential", 4.0),
            row("uts T3", "GLB 2x1", "glb", 2.5), row("uts T3", "GLB 1x2", "glb", 2.0),
            row("uts T3", "Dask (2 static pieces)", "static", 3.9),
            row("uts T3", "multiprocessing.Pool (16 static pieces)", "static", 3.0),
            row("pi", "GLB 2x1", "glb", 1.0), row("pi", "GLB 1x2", "glb", 1.0, None)]
    summary = peers.summarize(rows)
    assert summary[0] == {"case": "uts T3", "best_glb": "GLB 1x2", "best_glb_seconds": 2.0,
                          "best_static": "multiprocessing.Pool (16 static pieces)",
                          "best_static_seconds": 3.0, "best_static_over_best_glb": 1.5,
                          "glb_speedup_over_kernel": 2.0, "best_dynamic": None, "best_dynamic_seconds": None,
                          "best_dynamic_over_best_glb": None, "all_correct": True}
    assert summary[1]["best_static"] is None and summary[1]["glb_speedup_over_kernel"] is None
    table = peers.render(rows, summary)
    assert "uts T3: best static split (multiprocessing.Pool (16 static pieces)) 3.000 s = 1.50x" in table
    assert "GLB speed-up over the kernel alone 2.00" in table and "pi: no static run" in table
    rows[-1]["correct"] = False
    assert peers.summarize(rows)[1]["all_correct"] is False
