"""benchmarks.steps_checkpoint: with tiny sizes it measures both write modes beside dd,
writes the JSON it promises, leaves no place and no file behind (no timing is asserted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eventually, place_processes, wait_gone

from benchmarks import steps_checkpoint

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


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
    env = {k: v for k, v in os.environ.items()
           if k not in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN")}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.steps_checkpoint", "--size", "4",
                             "--places", "2,3", "--repeats", "2", "--dir", str(target),
                             "--json", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=110)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert wait_gone(place_processes(proc.pid), 5.0) == []
    eventually(lambda: not _group_alive(proc.pid), "the harness's process group to end", 5.0)
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
