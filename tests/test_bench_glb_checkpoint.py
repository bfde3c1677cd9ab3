"""The GLB checkpoint and containment-scan harnesses run small and write their JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent


def test_glb_checkpoint_harness_quick(tmp_path):
    out = tmp_path / "ck.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.glb_checkpoint", "--quick",
                           "--depth", "10", "--places", "2", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["rows"]) == {"plain", "checkpoint 10 s", "checkpoint 1 s"}
    assert report["rows"]["checkpoint 1 s"]["snapshots"] >= 1  # the final one at least
    assert report["resume"]["correct"] is True
    assert "UTS depth 10" in proc.stdout and "resumed" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the harness starts another user's processes: root")
def test_containment_scan_harness(tmp_path):
    out = tmp_path / "scan.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.containment_scan", "--foreign", "20",
                           "--env-kb", "4", "--repeats", "3", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows["fallback"]["foreign_counted"] == 0 and rows["fallback"]["members"] >= 2
    assert rows["environ (before issue 40)"]["members"] >= 20  # the old rule counted them all
