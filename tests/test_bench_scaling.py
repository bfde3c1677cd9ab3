"""benchmarks.scaling: interleaved rounds, the machine's ceiling, efficiency, the others' load."""

from __future__ import annotations

import pytest

from benchmarks import scaling

pytestmark = pytest.mark.timeout(120)


def test_each_round_runs_every_configuration_once_in_a_rotating_order():
    runs = scaling.plan(["uts", "bc"], 3)
    per_round = len(scaling.configs()) * 2
    assert len(runs) == 3 * per_round
    for r in range(3):
        this = [(app, cfg) for k, app, cfg in runs if k == r]
        assert sorted(this) == sorted((a, c) for a in ("uts", "bc") for c in scaling.configs())
    firsts = [next(cfg for k, app, cfg in runs if k == r and app == "uts") for r in range(3)]
    assert len(set(firsts)) == 3  # no configuration always runs first
    assert (scaling.PAIR, 1, 1) not in scaling.configs(pair=False)


def test_efficiency_from_medians_and_the_two_copies(monkeypatch):
    seconds = {(scaling.SEQUENTIAL, 1, 1): [10.0, 11.0, 9.0], (scaling.PAIR, 1, 1): [10.5] * 3,
               ("glb", 1, 1): [10.0] * 3, ("glb", 1, 2): [5.0] * 3, ("glb", 2, 1): [5.2, 50.0, 5.3]}
    seen: dict = {}

    def fake_run(app, args, copies=1):
        if "--sequential" in args:
            cfg = (scaling.PAIR if copies == 2 else scaling.SEQUENTIAL, 1, 1)
        else:
            cfg = ("glb", int(args[args.index("--places") + 1]), int(args[args.index("--workers") + 1]))
        k = seen[cfg] = seen.get(cfg, -1) + 1
        return {"seconds": seconds[cfg][k], "units": 100, "unit_name": "nodes", "correct": True,
                "result": 100, "others_cores": 0.9 if seconds[cfg][k] > 20 else 0.05}

    monkeypatch.setattr(scaling, "run_once", fake_run)
    rows = scaling.measure(["uts"], quick=True, repeats=3)
    by = {(r["run"], r["places"], r["workers"]): r for r in rows}
    assert by[(scaling.SEQUENTIAL, 1, 1)]["seconds"] == 10.0
    assert by[(scaling.PAIR, 1, 1)]["efficiency"] == pytest.approx(10 / 10.5)
    assert by[(scaling.SEQUENTIAL, 1, 1)]["efficiency"] == pytest.approx(1.0)
    assert by[("glb", 1, 2)]["efficiency"] == pytest.approx(1.0)
    two = by[("glb", 2, 1)]  # the crowded run (others took 0.9 cores) is left out of the median
    assert two["efficiency"] == pytest.approx(10 / (2 * 5.25)) and two["calm_samples"] == 2
    assert two["median_all"] == 5.3 and two["others_cores"] == [0.05, 0.9, 0.05]
    assert by[(scaling.SEQUENTIAL, 1, 1)]["calm_samples"] == 3
    assert "sequential x2" in scaling.render(rows)


def test_a_run_records_the_cores_others_used():
    record = scaling.run_once("uts", ["--depth", "4", "--sequential"])
    assert record["correct"] is not False and record["others_cores"] >= 0.0


def test_waiting_for_a_quiet_machine_is_bounded():
    assert scaling.wait_quiet(0.0) == pytest.approx(0.0, abs=0.05)
    assert scaling.wait_quiet(0.5) < 2 * scaling.QUIET_WINDOW + 0.5


def test_efficiency_splits_into_the_time_inside_process_and_the_kernels_speed(monkeypatch):
    """efficiency = kernel_speed x in_process: the share of cores x seconds the workers
    spent inside ``process`` (the places' busy_s), from the GLB run's own statistics."""
    def fake_run(app, args, copies=1):
        record = {"units": 100, "unit_name": "nodes", "correct": True, "result": 100,
                  "others_cores": 0.0}
        if "--sequential" in args:
            return {**record, "seconds": 10.0}
        places = int(args[args.index("--places") + 1])
        workers = int(args[args.index("--workers") + 1])
        # 2 x 5.5 core-seconds, 5.2 of each inside process (the kernel: 10 / 10.4 as fast)
        seconds = 10.0 / (places * workers) * 1.1
        busy = 10.4 / places
        return {**record, "seconds": seconds,
                "glb_stats": [{"place": p, "busy_s": busy} for p in range(places)]}

    monkeypatch.setattr(scaling, "run_once", fake_run)
    rows = scaling.measure(["uts"], quick=True, repeats=1, pair=False)
    by = {(r["run"], r["places"], r["workers"]): r for r in rows}
    assert by[(scaling.SEQUENTIAL, 1, 1)]["in_process"] is None
    assert by[(scaling.SEQUENTIAL, 1, 1)]["kernel_speed"] is None
    for cfg in (("glb", 1, 2), ("glb", 2, 1)):
        row = by[cfg]
        assert row["efficiency"] == pytest.approx(1 / 1.1)
        assert row["in_process"] == pytest.approx(10.4 / 11.0)
        assert row["kernel_speed"] == pytest.approx(10 / 10.4)
        assert row["kernel_speed"] * row["in_process"] == pytest.approx(row["efficiency"])
    assert "in process" in scaling.render(rows) and "94.5%" in scaling.render(rows)
