"""Issue 41, item 3 under Slurm: a GLB program that checkpoints, submitted with
``sbatch --requeue`` and the checkpoint directory on its command line, is
requeued with ``scontrol requeue`` while it runs, starts again, resumes from its
snapshot and ends with the exact result (docs/schedulers.md, "Requeue under
Slurm"). On the real 3-node test Slurm (tests/_slurm.py); skipped without one."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually

ROOT = Path(__file__).resolve().parent.parent
UTS_RESULT = 66106929  # UTS geometric, depth 12

pytestmark = pytest.mark.timeout(300)


def job_field(cluster, job_id: str, name: str) -> str | None:
    """A field of ``scontrol show job`` (None once Slurm has forgotten the job)."""
    shown = cluster.run("scontrol", "show", "job", job_id)
    found = re.search(rf"\b{name}=(\S*)", shown.stdout) if shown.returncode == 0 else None
    return found.group(1) if found else None


def test_a_checkpointing_batch_job_requeued_by_scontrol_ends_exact(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    ckpt, record, out = tmp_path / "ckpt", tmp_path / "uts.json", tmp_path / "slurm.out"
    script = tmp_path / "uts.sh"
    script.write_text(
        "#!/bin/sh\n"
        'echo "run ${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"\n'
        f"exec {sys.executable} -m glb.apps uts --depth 12 --places 1 --checkpoint {ckpt} "
        f"--checkpoint-interval 0.05 --json {record}\n")
    submitted = cluster.run("sbatch", "--parsable", "--requeue", "--open-mode=append",
                            "--nodes=1", "--job-name=apgas-requeue", f"--output={out}",
                            f"--chdir={ROOT}", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        eventually(lambda: list(ckpt.glob("glb-*.snapshot")), "the job's first snapshot", 90)
        assert not record.exists()  # the first run has not ended
        requeued = cluster.run("scontrol", "requeue", job_id)
        if requeued.returncode != 0:
            pytest.skip(f"the test Slurm does not requeue: {requeued.stderr.strip()}")
        eventually(lambda: job_field(cluster, job_id, "Restarts") == "1", "Slurm counts a restart")
        # Slurm holds a requeued batch job for a while (Reason=BeginTime, about two minutes
        # here); the operator may let it go at once, as the test does
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job_field(cluster, job_id, "JobState") in (
                "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"):
            time.sleep(0.2)
        if job_field(cluster, job_id, "Reason") == "BeginTime":
            cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        eventually(lambda: record.exists() and job_field(cluster, job_id, "JobState")
                   in (None, "COMPLETED"), "the requeued job ends", 180)
    finally:
        cluster.run("scancel", job_id)
    result = json.loads(record.read_text())
    assert result["correct"] is True and result["result"] == UTS_RESULT, result
    assert result["checkpoints"]["resumed_from"] is not None, result["checkpoints"]
    text = out.read_text()
    assert "run 0 on " in text and "run 1 on " in text, text  # both runs, appended
    assert "DUE TO JOB REQUEUE" in text and f"result {UTS_RESULT}" in text, text
