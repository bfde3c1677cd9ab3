"""DMR's workload study (issue 33): the generator, the fitted job models, the simulated
study at a small size and a live batch of tiny real jobs under the scheduler."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from apgas_scheduler.sim import dmr_workload as dw
from apgas_scheduler.sim.simulator import runtime_on
from benchmarks import _dmr_fit, _eval_dmr

ROOT = Path(__file__).resolve().parent.parent
FIT = ROOT / "docs" / "results" / "dmr_fit.json"


# -- the generator -----------------------------------------------------------------------------

def test_sizes_are_table_1s_and_fixed_jobs_run_at_the_maximum():
    flexible = dw.dmr_workload(3, 300)
    fixed = dw.dmr_workload(3, 300, flexible=False)
    for f, r in zip(flexible, fixed, strict=True):
        low, high, pref = dw.TABLE1[f.name]
        assert (f.cls, f.min_nodes, f.max_nodes, f.preferred) == ("malleable", low, high, pref)
        assert (r.cls, r.min_nodes, r.max_nodes, r.preferred) == ("rigid", high, high, high)
    assert {j.name for j in flexible} == set(dw.APPS)
    at_pref = dw.dmr_workload(3, 50, flexible=False, fixed_at="preferred")
    assert all(j.min_nodes == j.max_nodes == dw.TABLE1[j.name][2] for j in at_pref)


def test_fixed_and_flexible_differ_only_in_class_and_bounds():
    """Same ids, applications, submissions and models; the same run time on any size."""
    flexible = dw.dmr_workload(7, 60)
    fixed = dw.dmr_workload(7, 60, flexible=False)
    for f, r in zip(flexible, fixed, strict=True):
        assert (f.id, f.name, f.submit, f.serial) == (r.id, r.name, r.submit, r.serial)
        for k in range(1, 33):
            assert runtime_on(f, k, f.runtime, "amdahl") == pytest.approx(
                runtime_on(r, k, r.runtime, "amdahl"), rel=1e-12)
        top = dw.TABLE1[f.name][1]
        assert runtime_on(r, top, r.runtime, "amdahl") == pytest.approx(dw.DMR_FIXED_EXECUTION)


def test_poisson_arrivals_and_equal_shares():
    jobs = dw.dmr_workload(11, 20_000)
    gaps = [b.submit - a.submit for a, b in zip(jobs, jobs[1:], strict=False)]
    assert jobs[0].submit == 0.0 and all(g >= 0 for g in gaps)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(dw.ARRIVAL_MEAN, rel=0.03)  # 4 standard errors
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, rel=0.05)  # exponential gaps
    shares = Counter(j.name for j in jobs)
    assert all(abs(shares[app] / len(jobs) - 1 / 3) < 0.015 for app in dw.APPS), shares
    assert [j.id for j in jobs[:3]] == [1, 2, 3]


def test_seeds_reproduce_and_differ():
    assert dw.dmr_workload(5, 40) == dw.dmr_workload(5, 40)
    assert dw.dmr_workload(5, 40) != dw.dmr_workload(6, 40)
    assert dw.dmr_workload(5, 0) == []


def test_smaller_clusters_and_scales_keep_factor_reachable_sizes():
    assert dw.sizes("cg", 64) == (2, 32, 8)
    assert dw.sizes("cg", 24) == (2, 16, 8)  # 24 = 8 * 3 is no power of 2 away from 8
    assert dw.sizes("cg", 24, factor=1) == (2, 24, 8)
    assert dw.sizes("nbody", 12) == (1, 8, 1)
    assert dw.sizes("cg", 8, scale=8) == (1, 4, 1)
    assert dw.sizes("nbody", 8, scale=8) == (1, 2, 1)


@pytest.mark.parametrize("call, message", [
    (lambda: dw.dmr_workload(0, -1), "jobs must be a whole number in [0, 1000000], got -1"),
    (lambda: dw.dmr_workload(0, "5"), "got '5'"),  # type: ignore[arg-type]
    (lambda: dw.dmr_workload(0, 5, nodes=4), "nodes=4 is too few"),
    (lambda: dw.dmr_workload(0, 5, arrival_mean=0.0), "arrival_mean must be in (0, 1e7] seconds, got 0.0"),
    (lambda: dw.dmr_workload(0, 5, arrival_mean=float("nan")), "got nan"),
    (lambda: dw.dmr_workload(0, 5, factor=0), "factor must be a whole number in [1, 64], got 0"),
    (lambda: dw.dmr_workload(0, 5, fixed_at="min"), "fixed_at must be 'max' or 'preferred', got 'min'"),
    (lambda: dw.dmr_workload(0, 5, models={"cg": dw.MODELS["cg"]}), "missing or wrong: ['jacobi', 'nbody']"),
    (lambda: dw.dmr_workload(0, 5, estimate_factor=0.5), "estimate_factor must be in [1, 1000], got 0.5"),
    (lambda: dw.sizes("lu"), "unknown application 'lu'"),
    (lambda: dw.JobModel(1.0, 10.0), "serial fraction must be in [0, 1), got 1.0"),
    (lambda: dw.JobModel(0.1, float("inf")), "seconds must be positive and finite, got inf"),
    (lambda: dw.JobModel(0.1, 10.0, alpha=-1.0), "alpha must be >= 0 and finite, got -1.0"),
])
def test_bad_input_is_refused_naming_the_value(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_the_one_resize_cost_is_the_mean_of_the_apps():
    cost = dw.reconfig()
    per_app = [dw.MODELS[a].alpha + dw.MODELS[a].b for a in dw.APPS]
    assert cost.cost(8, 9) == pytest.approx(statistics.fmean(per_app))
    assert cost.cost(32, 8) == pytest.approx(24 * statistics.fmean(per_app))
    errors = dw.reconfig_errors()
    assert set(errors) == set(dw.APPS)
    for app, own in zip(dw.APPS, per_app, strict=True):  # at most 0.19 s a node, as the docstring says
        assert errors[app] * own == pytest.approx(abs(statistics.fmean(per_app) - own))
        assert errors[app] * own <= 0.19


# -- the fit ----------------------------------------------------------------------------------

def test_the_fits_on_made_up_figures():
    fit = _dmr_fit.fit_amdahl(0.100, 0.001, 0.004, [(0.054, 1.0), (0.104, 0.5)])
    assert fit["serial_s"] == 0.004 and fit["compute_s"] == pytest.approx(0.099)
    assert fit["miss_one"] == pytest.approx(0.03)
    assert fit["miss_two"] == pytest.approx([abs(0.0535 - 0.054) / 0.054, abs(0.103 - 0.104) / 0.104])
    assert _dmr_fit.node_serial(0.004, 0.099, 16) == pytest.approx(0.004 / (0.004 + 0.099 / 16))
    with pytest.raises(ValueError, match="must be below its time"):
        _dmr_fit.fit_amdahl(0.001, 0.002, 0.001)
    with pytest.raises(ValueError, match=r"ratio in \(0, 1.5\], got \[2.0\]"):
        _dmr_fit.fit_amdahl(0.1, 0.001, 0.002, [(0.05, 2.0)])
    orders = [{"kind": "grow", "n": 1, "seconds": 0.3, "move_seconds": 0.1, "wait_seconds": 0.0},
              {"kind": "shrink", "n": 1, "seconds": 0.1, "move_seconds": 0.1, "wait_seconds": 0.0}]
    r = _dmr_fit.fit_resize(orders)
    assert (r["alpha"], r["b"]) == pytest.approx((0.1, 0.1)) and r["fit_error"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="grow and shrink orders of one node"):
        _dmr_fit.fit_resize(orders[:1])


def test_the_models_are_the_recorded_fit_and_give_its_times_back():
    """The generator's default models are the figures of docs/results/dmr_fit.json
    (rounded), and the fitted model gives the measured times back within the error
    it states."""
    fit = json.loads(FIT.read_text())
    assert fit["node_cores"] == 16 and set(fit["apps"]) == set(dw.APPS)
    for app, a in fit["apps"].items():
        assert a["equal"], app
        ceilings = [x / (2 * y) for x, y in zip(a["alone_s"], a["pair_s"], strict=True)]
        again = _dmr_fit.fit_amdahl(a["one_median_s"], a["over_one_median_s"], a["over_two_median_s"],
                                    list(zip(a["two_s"], ceilings, strict=True)))
        assert again.keys() == a["amdahl"].keys()
        assert all(again[k] == pytest.approx(v) for k, v in a["amdahl"].items())
        s, c, err = again["serial_s"], again["compute_s"], again["fit_error"]
        assert abs(s + c - a["one_median_s"]) / a["one_median_s"] <= err + 1e-12
        misses = sorted(abs(s + c / (2 * min(1.0, e)) - t) / t for t, e in zip(a["two_s"], ceilings, strict=True))
        assert statistics.median(misses) <= err + 1e-12
        model = dw.MODELS[app]
        assert model.serial == pytest.approx(_dmr_fit.node_serial(s, c, 16), abs=5e-5)
        # the model's speed-up from 1 to 2 nodes is the fitted one with 16 cores a node
        assert model.time(1, 32) / model.time(2, 32) == pytest.approx(
            (s + c / 16) / (s + c / 32), rel=1e-3)
        resize = _dmr_fit.fit_resize(a["resizes"])
        assert (model.alpha, model.b) == pytest.approx((resize["alpha"], resize["b"]), abs=5e-4)


# -- the studies ------------------------------------------------------------------------------

def test_the_simulated_study_at_20_jobs():
    """Flexible jobs wait less than fixed ones and complete sooner (the fitted models
    scale sub-linearly, so a job shrunk to its preferred size loses little), and are
    resized; fixed jobs never are."""
    study = _eval_dmr.simulate_study(sizes=(20,), seeds=2, nodes=64)
    row = study["20"]
    assert row["flexible"]["mean_wait"] < row["fixed"]["mean_wait"]
    assert row["flexible"]["mean_completion"] < row["fixed"]["mean_completion"]
    assert row["flexible"]["resizes"] > 0 and row["fixed"]["resizes"] == 0
    assert "dmr" not in row and "| 20 | fixed |" in _eval_dmr.render_sim(study)
    assert _eval_dmr.simulate_study(sizes=(50,), seeds=1)["50"]["dmr"]["fixed"]["mean_wait"] == 4115.02


TINY = {"cg": {"n": 40, "iterations": 30}, "jacobi": {"n": 50, "iterations": 60},
        "nbody": {"n": 100, "steps": 8}}


@pytest.mark.timeout(60)
def test_a_live_batch_of_tiny_real_jobs_is_checked():
    """Three tiny flexible jobs of the mix on 4 virtual nodes under the live scheduler
    with policy dmr: all end done, each printed value equals its app's reference."""
    jobs = dw.dmr_workload(1, 3, nodes=4, scale=16, arrival_mean=0.3)
    run = _eval_dmr.live_batch(jobs, True, nodes=4, problems=TINY, timeout=25)
    assert run["failures"] == [] and run["checked"] == 3, run["failures"]
    assert run["by_state"] == {"done": 3} and run["overlaps"] == 0
    assert all(r["class"] == "malleable" and r["results"] for r in run["jobs"])
    assert run["node_seconds"] > 0 and run["mean_completion"] >= run["mean_execution"]


def test_a_job_with_bad_check_sizes_is_refused():
    with pytest.raises(SystemExit, match="got '4,2,1,2'"):
        _eval_dmr.job_main(["cg", "4,2,1,2", "--n", "10"])
    with pytest.raises(SystemExit, match="got '1,2'"):
        _eval_dmr.job_main(["cg", "1,2"])
