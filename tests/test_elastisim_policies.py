"""``python -m benchmarks.elastisim_policies --quick`` against the real ElastiSim
(built by ``.ci/install-services``; see ``tests/_elastisim.py``): a tiny generated
set, one Kassel original and two of ours, every job completes, the tables and the
JSON say so, and nothing of the runs is left behind (no process, no folder).

The harness runs as a process of its own in a session of its own, killed with its
group if it takes too long."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import _elastisim
import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDER, WHY = _elastisim.find()
TIMEOUT = 240.0

pytestmark = [pytest.mark.skipif(FOLDER is None, reason=WHY or "no ElastiSim"),
              pytest.mark.timeout(TIMEOUT + 60)]


def harness(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Run the harness with ``args`` (its temporary folders under ``tmp_path``)."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.elastisim_policies", *args],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the harness did not end in {TIMEOUT:g} s\n{out}\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: anything it left running
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def leftovers(folder: Path) -> list[str]:
    """The processes still running whose command line names ``folder`` (ElastiSim
    and the algorithms run with their configuration and socket there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_quick_runs_an_original_and_ours_on_a_tiny_set(tmp_path):
    report = tmp_path / "report.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code, out, err = harness(scratch, "--quick", "--jobs", "2", "--timeout", "120", "--json", str(report),
                             "--algorithms", "K:min_agreement", "min-agreement", "lending")
    assert code == 0, f"exit {code}\n{out}\n{err}"
    data = json.loads(report.read_text())
    [jobset] = data["sets"]
    assert jobset["malleable"] == 50 and 2 <= jobset["jobs"] <= 30, jobset
    runs = {r["algorithm"]: r for r in jobset["results"]}
    assert list(runs) == ["K:min_agreement", "min-agreement", "lending"]
    for name, r in runs.items():
        assert r["status"] == "ok" and r["completed"] == jobset["jobs"], (name, r)
        assert r["mean_turnaround"] >= r["mean_wait"] >= 0 and r["makespan"] > 0, (name, r)
        assert r["orders"] is not None and r["reconfigurations"] is not None, (name, r)
    assert runs["lending"]["refused"] == 0 and runs["min-agreement"]["refused"] == 0
    for name in runs:
        assert f"| {name} |" in out
    assert "S1/50%" in out and "[3/3]" in err, err  # the tables, and progress in the log
    assert list(scratch.iterdir()) == [], "the runs' folder was left behind"
    assert leftovers(scratch) == []


def test_a_run_over_its_timeout_is_killed_and_reported(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code, out, err = harness(scratch, "--quick", "--timeout", "0.01", "--algorithms", "K:min_agreement",
                             "lending")
    assert code == 1, f"exit {code}\n{out}\n{err}"
    for name in ("K:min_agreement", "lending"):
        assert f"| {name} | timeout |" in out, out
    assert "did not finish" in err, err
    assert list(scratch.iterdir()) == [], "the runs' folder was left behind"
    assert leftovers(scratch) == []


def test_unknown_algorithm_is_an_error_that_lists_the_known(tmp_path):
    code, out, err = harness(tmp_path, "--quick", "--algorithms", "no-such-policy")
    assert code == 2 and "no-such-policy" in err and "K:min_agreement" in err, err


@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_reconfiguration_cost_is_an_on_reconfiguration_phase_every_resize_pays(tmp_path):
    """``--reconfiguration-cost``: the set's application model gets ElastiSim's
    ``on_reconfiguration`` phase (a data redistribution and computation of about that
    many seconds), a run that reconfigures takes longer than without it, and the
    combiner sets the two costs side by side."""
    reports = {}
    for cost in (0, 300):
        scratch = tmp_path / f"scratch{cost}"
        scratch.mkdir()
        keep, report = tmp_path / f"keep{cost}", tmp_path / f"report{cost}.json"
        code, out, err = harness(scratch, "--quick", "--jobs", "1", "--timeout", "120", "--json",
                                 str(report), "--keep", str(keep), "--reconfiguration-cost",
                                 str(cost), "--algorithms", "K:rigid_easy_backfill", "K:min_agreement")
        assert code == 0, f"exit {code}\n{out}\n{err}"
        assert leftovers(keep) == [] and leftovers(scratch) == []
        model = json.loads((keep / "input-S1-50" / "application_model.json").read_text())
        reports[cost] = data = json.loads(report.read_text())
        assert data["settings"]["reconfiguration_cost"] == cost
        if cost == 0:
            assert "on_reconfiguration" not in model and data["settings"]["reconfiguration_phase"] is None
        else:
            [task] = model["on_reconfiguration"]["tasks"]
            assert task["type"] == "cpu" and task["communication_pattern"] == "ALL_TO_ALL"
            assert task["flops"] == cost * 1e11 and task["bytes"] == f"{cost * 12.5e9!r}*num_nodes"
            assert data["settings"]["reconfiguration_phase"] == model["on_reconfiguration"]
    free, costly = ({r["algorithm"]: r for r in reports[c]["sets"][0]["results"]} for c in (0, 300))
    assert free["K:rigid_easy_backfill"] == costly["K:rigid_easy_backfill"] | {
        "seconds": free["K:rigid_easy_backfill"]["seconds"]}, "a rigid run pays nothing"
    resized = costly["K:min_agreement"]
    assert resized["status"] == "ok" and resized["completed"] == resized["jobs"], resized
    if resized["reconfigurations"]:
        assert resized["mean_turnaround"] > free["K:min_agreement"]["mean_turnaround"]
    from benchmarks._elastisim_reconfig import combine, markdown
    text = markdown(combine([reports[300], reports[0]]))
    assert text.index("## 0 s per reconfiguration") < text.index("## 300 s per reconfiguration")
    assert "| K:min_agreement |" in text


def test_the_kassel_repositorys_own_set_runs_as_it_is(tmp_path):
    """``--input``: the Kassel repository's ``input_files/small`` (8 rigid jobs) under their
    EASY and our sharing, unchanged; a folder that is not an input is refused."""
    small = FOLDER / "MalleableJobScheduling" / "input_files" / "small"
    report = tmp_path / "report.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code, out, err = harness(scratch, "--input", str(small), "--json", str(report),
                             "--algorithms", "K:rigid_easy_backfill", "sharing")
    assert code == 0, f"exit {code}\n{out}\n{err}"
    [jobset] = json.loads(report.read_text())["sets"]
    assert (jobset["name"], jobset["jobs"], jobset["malleable"]) == ("small/0%", 8, 0)
    runs = {r["algorithm"]: r for r in jobset["results"]}
    assert all(r["status"] == "ok" and r["completed"] == 8 for r in runs.values()), runs
    assert list(scratch.iterdir()) == [] and leftovers(scratch) == []
    code, out, err = harness(scratch, "--input", str(tmp_path))
    assert code == 2 and f"--input {tmp_path}: not an ElastiSim input folder" in err, err
