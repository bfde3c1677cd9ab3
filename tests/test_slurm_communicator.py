"""APGAS_COMMUNICATOR=slurm on the real 3-node test Slurm: programs grow and shrink
their own Slurm job (tests/slurm_job.py), and Slurm's view follows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually
from test_launcher_srun import result_of

from launcher import expand_hostlist

ROOT = Path(__file__).resolve().parent.parent
PROG = str(Path(__file__).with_name("slurm_job.py"))

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def slurm(slurm_cluster):
    """The session's Slurm, idle, and able to resize jobs (else the test skips)."""
    if not slurm_cluster.resizable:  # the reason names what is missing (slurmdbd, MariaDB)
        pytest.skip(f"the test Slurm cannot resize jobs: {slurm_cluster.not_resizable}")
    eventually(lambda: set(slurm_cluster.node_states().values()) == {"idle"},
               "every node of the test Slurm idle")
    yield slurm_cluster
    slurm_cluster.run("scancel", f"--partition={slurm_cluster.partition}")


def start(cluster, signals: Path, mode: str, **env: str) -> subprocess.Popen:
    """``slurm_job.py`` in MODE in a 1-node exclusive allocation, one place per node."""
    environ = {**cluster.env, "PYTHONUNBUFFERED": "1", "APGAS_COMMUNICATOR": "slurm",
               "APGAS_SLURM_GROW_TIMEOUT": "3", "APGAS_CHECK_INHIBIT": "0",
               "APGAS_LOG_LEVEL": "INFO", "MODE": mode, "SIGNALS": str(signals), **env}
    return subprocess.Popen(["salloc", "--nodes=1", "--ntasks-per-node=1", "--exclusive", "--quiet", "--time=10",
                             "--job-name=apgas-resized", "--kill-command=SIGKILL",
                             sys.executable, PROG],
                            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def job_nodes(cluster, name: str = "apgas-resized") -> int | None:
    """How many nodes squeue shows for the job called ``name`` (None: no such job)."""
    out = cluster.run("squeue", "--noheader", f"--name={name}", "--states=R",
                      "--format=%D").stdout.split()
    return int(out[0]) if out else None


def test_an_evolving_glb_job_grows_from_one_to_three_nodes_and_back(slurm, tmp_path):
    proc = start(slurm, tmp_path, "glb")
    seen = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            count = job_nodes(slurm)
            if count is not None and (not seen or seen[-1] != count):
                seen.append(count)
            if count == 3:
                break
            time.sleep(0.1)
    finally:
        (tmp_path / "go").touch()
    while proc.poll() is None:
        count = job_nodes(slurm)
        if count is not None and seen[-1] != count:
            seen.append(count)
        time.sleep(0.1)
    result = result_of(proc)
    assert result["total"] == result["expected"]
    assert result["requests"] >= 2 and len(result["worked"]) >= 2, result
    assert result["releases"] >= 2, result
    # 1 -> 2 -> 3 nodes while the work is wide, back to 1 in the chain (where the one
    # busy place may ask again: GLB asks whenever every place is busy).
    assert seen[:3] == [1, 2, 3] and 1 in seen[3:], seen
    assert sorted(expand_hostlist(result["env"])) == sorted(result["end"]), result


def test_check_status_expands_onto_idle_nodes_and_shrinks_for_a_pending_job(slurm, tmp_path):
    proc = start(slurm, tmp_path, "check")
    waiting = None
    try:
        eventually(lambda: (tmp_path / "expanded").exists() or proc.poll() is not None,
                   "the first check_status", 60)
        assert job_nodes(slurm) == 3
        submitted = slurm.run("sbatch", "--parsable", "--nodes=1", "--exclusive",
                              "--job-name=waiting", "--time=5", f"--output={tmp_path}/w.out",
                              "--wrap=sleep 300")
        assert submitted.returncode == 0, submitted.stderr
        waiting = submitted.stdout.strip().split(";")[0]
        eventually(lambda: "Resources" in slurm.run(
            "squeue", "--noheader", f"--jobs={waiting}", "--format=%r").stdout,
            "the queued job waiting for resources")
        (tmp_path / "queued").touch()
        result = result_of(proc)
        assert result["first"] == 3 and sorted(result["after_first"]) == ["node1", "node2", "node3"]
        assert result["second"] == 2 and len(result["end"]) == 2
        assert result["nnodes"] == "2"
        eventually(lambda: slurm.run("squeue", "--noheader", f"--jobs={waiting}",
                                     "--format=%t").stdout.strip() == "R",
                   "the queued job running on the node given back")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        if waiting:
            slurm.run("scancel", waiting)


def test_a_grow_slurm_cannot_meet_is_refused_with_its_reason_and_leaves_nothing(slurm, tmp_path):
    result = result_of(start(slurm, tmp_path, "grow", N="3"))
    assert result["state"] == "refused" and len(result["end"]) == 1
    assert "Slurm gave no 3 node(s) within 3 s" in result["reason"], result
    jobs = slurm.run("squeue", "--noheader", "--format=%j %t").stdout
    assert "apgas-expand" not in jobs, jobs


def test_outside_a_slurm_job_the_error_says_so(slurm, tmp_path):
    env = {k: v for k, v in slurm.env.items() if not k.startswith("SLURM_JOB")}
    done = subprocess.run([sys.executable, PROG], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**env, "APGAS_COMMUNICATOR": "slurm", "MODE": "grow",
                                           "SIGNALS": str(tmp_path)})
    assert done.returncode != 0
    assert "APGAS_COMMUNICATOR=slurm works inside a Slurm job" in done.stderr, done.stderr[-3000:]
