"""``benchmarks.evaluation --published`` (issue 45): the verdict of a case, and a
miniature of the whole run on one real trace (skipped without ``../shared/traces``)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import _eval_published as ep
from benchmarks.simspeed import TRACES_DIR


def figures(turnaround: float, resizes: int) -> dict:
    return {"jobs": 10, "mean_turnaround": turnaround, "reconfigurations": resizes, "makespan": 10.0,
            "mean_wait": 1.0, "utilization": 0.5, "by_class": {}}


def runs(lending: float, lending_resizes: int) -> dict:
    out = {p: figures(10.0 + i, 100) for i, p in enumerate(ep.PUBLISHED)}
    out["malleable"] = figures(9.0, 50)  # the best published one here
    out["thrifty"] = figures(9.5, 20)
    out["lending"] = figures(12.0, 30)
    out["sharing"] = figures(lending, lending_resizes)
    return out


@pytest.mark.parametrize("turnaround, resizes, ahead, within, won", [
    (8.0, 40, True, True, True),
    (8.0, 51, True, False, False),   # more resizes than minAgree
    (9.0, 10, False, True, False),   # a tie is no lead
    (9.5, 10, False, True, False),
])
def test_verdict(turnaround, resizes, ahead, within, won):
    v = ep.verdict(runs(turnaround, resizes))
    assert v["best_published"] == "malleable"
    assert (v["ahead"], v["within_budget"], v["won"]) == (ahead, within, won)
    assert v["vs_best_pct"] == pytest.approx(100 * (turnaround - 9.0) / 9.0)
    # each resize beyond minAgree's 50: the job-seconds of turnaround it saved (10 jobs)
    assert v["saved_per_extra_resize_s"] == (None if within else pytest.approx((9.0 - turnaround) * 10 / (resizes - 50)))


def test_an_earlier_report_is_reused_for_the_runs_it_holds(tmp_path):
    case = ep.Case("A", 0.2, 1)
    path = tmp_path / "evaluation_published.json"
    path.write_text(json.dumps({"trace_jobs": 25, "cases": [
        {**case._asdict(), "label": case.label, "runs": {"easy": figures(5.0, 0)}}]}))
    known = ep.reusable(path, 25)
    assert known == {case: {"easy": figures(5.0, 0)}}
    # every policy is known: nothing is simulated (the directory does not even exist)
    assert ep.evaluate(tmp_path / "none", 25, [case], 1, ("easy",), known=known) == known
    with pytest.raises(SystemExit, match="its runs are of the first 25 jobs, not 100"):
        ep.reusable(path, 100)


def test_the_cases_are_the_grid_then_the_variations():
    cases = ep.cases(["A"])
    assert [(c.share, c.seed) for c in cases[:6]] == [(s, d) for s in (0.2, 0.5, 1.0) for d in (1, 2)]
    assert all(not c.varied for c in cases[:6]) and all(c.varied for c in cases[6:])
    assert len({(c.share, c.seed, c.arrivals, c.cost) for c in cases}) == len(cases)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (TRACES_DIR / "KTH-SP2-1996-2.1-cln.swf.gz").exists(),
                    reason=f"the archive traces are not in {TRACES_DIR}")
def test_a_miniature_run_writes_its_table_json_and_figure(tmp_path, capsys):
    from benchmarks._harness import Run

    class Harness:
        log = None

    run = Run(Harness(), argparse.Namespace(), [], {"machine": {"cores": 2}}, None)  # type: ignore[arg-type]
    assert ep.main(run, tmp_path, None, 25, 2, traces=["KTH-SP2"]) == 0
    report = json.loads((tmp_path / "evaluation_published.json").read_text())
    assert len(report["cases"]) == 12
    for case in report["cases"]:
        assert set(case["runs"]) == {"rigid-easy", *ep.PUBLISHED, *ep.OURS}
        assert all(r["jobs"] == 25 for r in case["runs"].values())
        assert case["runs"]["easy"]["reconfigurations"] == 0
    text = (tmp_path / "evaluation_published.md").read_text()
    assert "Sharing is first in" in text and "Zojer et al." in text
    assert (tmp_path / "evaluation_published.png").stat().st_size > 1000
