"""benchmarks.steps: its smallest configuration runs the three parts, writes the JSON it
promises and leaves no place behind (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bench_helpers import run_harness

from benchmarks import _steps_recovery, steps
from benchmarks._steps_commit import commit_bytes
from benchmarks._steps_common import ROW_BYTES, peak_estimate

pytestmark = pytest.mark.timeout(180)


class _Commit:
    def __init__(self, layout, buddies):
        self.layout, self.buddies = layout, buddies


def test_a_commit_sends_every_block_but_place_0s_to_its_buddy():
    layout = ((0, 0, 4), (1, 4, 8), (2, 8, 12), (3, 12, 16))
    moved = commit_bytes([_Commit(layout, {1: 2, 2: 3, 3: 0})], [0, 1, 2, 3])
    block = 4 * ROW_BYTES
    assert moved["network_bytes"] == 3 * block and moved["copied_bytes"] == 4 * block
    assert moved["extra_bytes_per_place"] == {"0": 2 * block, "1": block, "2": 2 * block, "3": 2 * block}
    assert moved["extra_bytes_max"] == 2 * block
    # a restore over 0, 2, 3 after place 1 was lost: its rows come from place 2
    sent = _steps_recovery.restore_network_bytes([_Commit(layout, {1: 2, 2: 3, 3: 0})], {1}, [0, 2, 3])
    assert 0 < sent < 16 * ROW_BYTES
    assert peak_estimate(1 << 30, 4) > peak_estimate(1 << 30, 2) > 4 * (1 << 30)


def test_options_override_the_modes_defaults():
    p = steps.make_params(steps.parse_args(["--quick", "--sizes", "4,16", "--places", "3"]))
    assert p.sizes == (4 << 20, 16 << 20) and p.places == (3,) and p.repeats == 1
    full = steps.make_params(steps.parse_args([]))
    assert full.sizes == (256 << 20, 1 << 30) and full.places == (2, 4) and full.jacobi_n == 4000
    with pytest.raises(SystemExit):
        steps.parse_args(["--places", "1"])
    assert steps.parse_args([]).json == Path("bench-results/steps.json")


def test_quick_run_writes_the_promised_json_and_leaves_nothing(tmp_path):
    out = tmp_path / "steps.json"
    stdout = run_harness(["benchmarks.steps", "--quick", "--json", str(out)], 170)

    report = json.loads(out.read_text())
    assert {"machine", "mode", "params", "command", "skipped", "commits", "recovery",
            "overhead"} <= set(report)
    assert report["mode"] == "quick" and report["skipped"] == []
    assert set(report["load_average_at_start_of"]) == {"commits_2", "commits_4", "recovery", "overhead"}

    rows = report["commits"]["rows"]
    assert [(r["places"], r["bytes"]) for r in rows] == [(2, 8 << 20), (4, 8 << 20)]
    for r in rows:
        assert r["network_bytes"] == r["bytes"] * (r["places"] - 1) // r["places"]
        assert r["copied_bytes"] == r["bytes"]
        assert r["extra_bytes_max"] > 0 and r["memory"]["held_bytes_max"] > 0
        for key in ("commit_s", "copies_s", "bare_s", "bare_copy_s", "bare_fresh_s", "commit_gbs",
                    "bare_gbs", "commit_over_bare", "commit_over_bare_copy", "commit_over_bare_fresh"):
            assert r[key]["median"] > 0, key
        assert r["loopback_bytes_per_commit"] is None or r["loopback_bytes_per_commit"] > 0

    rec = report["recovery"]
    assert rec["all_exact"] is True and rec["places"] == 4 and rec["repetitions"] == 1
    assert rec["recovery_median_s"] > 0
    assert set(rec["phases_median_s"]) == set(_steps_recovery.PHASES)
    for phase in ("detection", "restore", "recommit"):
        assert rec["phases_median_s"][phase] > 0, phase
    run = rec["runs"][0]
    assert run["places_after"] == 3 and run["rolled_back_to"] == 2 and run["exact"] is True

    over = report["overhead"]
    assert over["empty"]["steps_s"]["median"] > 0 and over["empty"]["plain_s"]["median"] > 0
    jac = over["jacobi"]
    assert jac["same_checksums"] is True
    for v in ("plain", "steps_c0", "steps_c10"):
        assert jac[f"{v}_s"]["median"] > 0 and jac[f"{v}_typical_s"]["median"] > 0
    assert over["with_step_share"] > 0 and isinstance(over["meets_target"], bool)
    for title in ("commits against the bare transfer", "from a SIGKILL to the next step",
                  "the cost of with step"):
        assert title in stdout
