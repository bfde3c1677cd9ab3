"""benchmarks.steps_checkpoint: with tiny sizes it measures both write modes beside dd,
writes the JSON it promises, leaves no place and no file behind (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bench_helpers import run_harness

from benchmarks import steps_checkpoint

pytestmark = pytest.mark.timeout(120)


def test_options_and_their_defaults():
    quick = steps_checkpoint.parse_args(["--quick"])
    assert (quick.size, quick.places, quick.repeats) == (32 << 20, [2], 1)
    full = steps_checkpoint.parse_args([])
    assert (full.size, full.places, full.repeats, full.arrays) == (1 << 30, [2, 4], 3, 2)
    assert full.json == Path("bench-results/steps_checkpoint.json")
    with pytest.raises(SystemExit):
        steps_checkpoint.parse_args(["--size", "0"])


def test_a_tiny_run_writes_the_promised_json_and_leaves_nothing(tmp_path):
    out = tmp_path / "ckpt.json"
    target = tmp_path / "disk"
    stdout = run_harness(["benchmarks.steps_checkpoint", "--size", "4", "--places", "2,3", "--repeats", "2",
                          "--dir", str(target), "--json", str(out)], 110)
    assert list(target.iterdir()) == []  # its folder, the commits and dd's file are gone

    report = json.loads(out.read_text())
    assert {"machine", "mode", "params", "command", "dir", "filesystem", "rows",
            "fastest_mode"} <= set(report)
    assert report["dir"].startswith(str(target)) and report["filesystem"]["free_bytes"] > 0
    rows = report["rows"]
    assert [(r["places"], r["bytes"], r["arrays"]) for r in rows] == [(2, 4 << 20, 2), (3, 4 << 20, 2)]
    for r in rows:
        assert len(r["dd"]) == 2 and all(d["write"]["bytes"] == 4 << 20 for d in r["dd"])
        assert r["dd_write_s"]["median"] > 0 and r["dd_read_s"]["median"] > 0
        for mode in ("parallel", "gathered"):
            m = r[mode]
            for key in ("files_s", "resume_cold_s", "resume_warm_s", "resume_cold_files_s"):
                assert m[key]["median"] > 0 and len(m[key]["samples"]) == 2, (mode, key)
            assert len(m["commit_s"]["samples"]) == 2  # a difference: its sign is not asserted
    assert set(report["fastest_mode"]) == {"2", "3"}
    assert "commits to disk and resumes, beside dd" in stdout and "| gathered |" in stdout
