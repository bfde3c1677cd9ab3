"""The one application CLI: python -m glb.apps {uts,nqueens,bc,pi} (and its old name,
python -m benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

KEYS = {"benchmark", "params", "places", "workers", "result", "correct", "seconds", "total_seconds",
        "throughput", "units", "warm_up_seconds"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glb.apps", *args], capture_output=True, text=True,
                          timeout=110)


@pytest.mark.parametrize("app, size, expected", [
    ("uts", ["--depth", "8"], 257_042),
    ("nqueens", ["-n", "10", "-t", "3"], 724),
])
def test_record_of_a_glb_run(tmp_path, app, size, expected):
    out = tmp_path / "r.json"
    proc = run(app, *size, "--places", "2", "--workers", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert KEYS <= set(record)
    assert record["result"] == expected and isinstance(record["result"], int)
    assert record["correct"] is True and record["places"] == 2
    assert 0 < record["seconds"] <= record["total_seconds"]
    assert set(record["warm_up_seconds"]) == {"0", "1"}
    assert "correct True" in proc.stdout


def test_sequential_run(tmp_path):
    out = tmp_path / "r.json"
    proc = run("pi", "--samples", "1000000", "--sequential", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["mode"] == "sequential" and record["correct"] is True
    assert abs(record["result"] - 3.14159) < 0.01


def test_bad_parameters_are_refused():
    proc = run("uts", "--depth", "-3")
    assert proc.returncode == 2 and "-3" in proc.stderr
    proc = run("nqueens", "-n", "12", "--places", "0")
    assert proc.returncode == 2 and "--places and --workers must be >= 1" in proc.stderr
    proc = run("fft")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_evolving_without_a_scheduler_is_refused(monkeypatch):
    monkeypatch.delenv("APGAS_SCHEDULER", raising=False)
    proc = run("uts", "--depth", "8", "--evolving")
    assert proc.returncode == 2
    assert "--evolving asks a scheduler for places, but APGAS_SCHEDULER is not set" in proc.stderr
    proc = run("uts", "--depth", "8", "--evolving", "--malleable")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_the_old_name_still_runs_an_app_and_says_it_moved():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "pi", "--samples", "100000", "--sequential"],
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert "python -m glb.apps" in proc.stderr.splitlines()[0] and "correct True" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "pi", "--help"], capture_output=True,
                          text=True, timeout=110)
    assert proc.returncode == 0 and "usage: python -m glb.apps pi" in proc.stdout


def test_versus_refuses_a_bad_revision_and_bad_counts(tmp_path):
    run = [sys.executable, "-m", "benchmarks.versus"]
    out = subprocess.run([*run, "no-such-rev-xyz", "--json", str(tmp_path / "v.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot check out 'no-such-rev-xyz'" in out.stderr
    out = subprocess.run([*run, "HEAD", "--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "at least 1" in out.stderr
