"""benchmarks.dist: its smallest configuration runs every part and writes the JSON it promises
(no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apgas.arrays._layout import even
from benchmarks import _dist_actions, dist

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


def test_moved_rows_counts_the_rows_that_change_owner():
    assert dist.moved_rows(even(8, [0]), even(8, [0, 1])) == 4
    assert dist.moved_rows(even(8, [0, 1]), even(8, [0, 1, 2, 3])) == 6
    assert dist.moved_rows(even(8, [0, 1, 2, 3]), even(8, [0, 1])) == 6
    assert dist.moved_rows(even(8, [0, 1]), even(8, [0, 1])) == 0


def test_tiny_run_writes_valid_json(tmp_path):
    out = tmp_path / "dist.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.dist", "--tiny", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "mode", "params", "skipped", "redistribution", "actions",
            "bandwidth_ceiling"} <= set(report)
    assert report["mode"] == "tiny" and report["skipped"] == []

    red = report["redistribution"]
    assert red["target_ratio"] == 0.5
    assert [(r["from"], r["to"]) for r in red["rows"]] == list(dist.TRANSITIONS)
    for r in red["rows"]:
        assert r["moved_bytes"] > 0
        for key in ("redistribute_best_gbs", "bare_best_gbs", "mac_best_gbs", "ratio_best",
                    "ratio_median", "ratio_to_signed_best"):
            assert r[key] > 0, key
        assert isinstance(r["meets_target"], bool)

    act = report["actions"]
    assert act["sizes"] == [0, 16 * dist.MiB]
    assert [r["order"] for r in act["rows"]] == [f"{v} {n}" for v, n, _ in _dist_actions.ORDERS]
    for r in act["rows"]:
        assert r["dmr"]["average"] in (0.423, 0.425)
        assert r["sizes"]["0"]["order_median_s"] > 0 and r["sizes"]["0"]["data_median_s"] is None
        assert r["sizes"][str(16 * dist.MiB)]["data_median_s"] > 0
    assert act["dmr_table2"]["expand"]["synchronous"]["average"] == 0.423

    ceiling = report["bandwidth_ceiling"]
    assert ceiling["ratio"] > 0 and ceiling["alone_median_s"] > 0 and ceiling["pair_median_s"] > 0
    assert "DMR Table 2" in proc.stdout and "ratio" in proc.stdout

    eff = report["efficiency"]
    assert [r["app"] for r in eff["rows"]] == ["jacobi", "cg", "nbody"]
    assert eff["bandwidth_ceiling"]["ratio"] > 0 and eff["compute_ceiling"]["ratio"] > 0
    assert len(eff["bandwidth_ceiling"]["alone_s"]) == eff["repeats"]
    for r in eff["rows"]:
        assert r["equal"] is True, r
        for key in ("seq_best_s", "two_best_s", "efficiency_best", "efficiency_median", "ceiling",
                    "of_ceiling_best", "of_ceiling_median"):
            assert r[key] > 0, key
    assert "efficiency on 2 places" in proc.stdout


def test_no_efficiency_skips_part_4(tmp_path):
    out = tmp_path / "dist.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.dist", "--tiny", "--no-redistribution",
                           "--no-actions", "--no-ceiling", "--no-efficiency", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "efficiency" not in report and "bandwidth_ceiling" not in report


def test_sizes_that_do_not_fit_are_skipped(monkeypatch, capsys):
    monkeypatch.setattr(dist, "available_bytes", lambda: 2 * dist.GiB)
    skipped: list = []
    assert dist.fitting([64 * dist.MiB, dist.GiB], "redistribution", skipped) == [64 * dist.MiB]
    assert skipped[0]["bytes"] == dist.GiB
    assert "1 GiB skipped" in capsys.readouterr().out
