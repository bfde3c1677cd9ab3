"""The slurm communicator's parts that need no Slurm: its errors and what it reads
from Slurm's output (the real Slurm runs in tests/test_slurm_communicator.py)."""

from __future__ import annotations

import pytest

from apgas.errors import ConfigError
from apgas_scheduler import slurm
from apgas_scheduler.slurm import commands as slurmctl


class Runtime:
    """Just what the communicator reads of the runtime's orders and config."""

    def status(self):
        return "malleable", []


def config():
    from apgas._core.config import load_config

    return load_config(environ={})


def test_outside_a_slurm_job_it_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="works inside a Slurm job .sbatch or salloc., and "
                                          "SLURM_JOB_ID is not set"):
        slurm.SlurmCommunicator(Runtime(), config())


def test_a_slurm_without_job_expansion_grows_by_companions_unless_expansion_is_asked_for(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(slurmctl, "run", lambda *args, **kw:
                        "SchedulerParameters     = bf_continue\n" if "config" in args else
                        "JobId=7 JobState=RUNNING NodeList=node1 Partition=debug\n")
    assert slurm.SlurmCommunicator(Runtime(), config()).grow_by == "companion"
    from apgas._core.config import load_config

    with pytest.raises(ConfigError, match=r"SchedulerParameters=permit_job_expansion"):
        slurm.SlurmCommunicator(Runtime(), load_config(environ={"APGAS_SLURM_GROW": "expand"}))
    with pytest.raises(ConfigError, match="APGAS_SLURM_GROW must be expand or companion, got 'x'"):
        load_config(environ={"APGAS_SLURM_GROW": "x"})


def test_without_slurm_commands_it_says_which(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="scontrol not found"):
        slurm.SlurmCommunicator(Runtime(), config())


def test_slurm_time_limits_in_seconds():
    assert slurmctl._seconds("5:00") == 300
    assert slurmctl._seconds("1:02:03") == 3723
    assert slurmctl._seconds("2-00:00:10") == 2 * 86400 + 10
    assert slurmctl._seconds("UNLIMITED") == 365 * 86400


def test_the_resize_script_becomes_environment_changes(monkeypatch, tmp_path):
    def fake_run(*args, cwd=None, **kw):
        (tmp_path / "seen").write_text(" ".join(args))
        from pathlib import Path
        Path(cwd, "slurm_job_7_resize.sh").write_text(
            'export SLURM_NODELIST="node[1-2]"\nexport SLURM_JOB_NUM_NODES="2"\n'
            "export SLURM_JOB_CPUS_PER_NODE='8(x2)'\nunset SLURM_TASKS_PER_NODE\n")
        return ""

    monkeypatch.setattr(slurmctl, "run", fake_run)
    assert slurmctl.update_job("7", "NumNodes=ALL") == {
        "SLURM_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)", "SLURM_TASKS_PER_NODE": None}
    assert (tmp_path / "seen").read_text() == "scontrol update JobId=7 NumNodes=ALL"


def test_updates_slurm_is_not_ready_for_are_retried_then_reported(monkeypatch, tmp_path):
    script = tmp_path / "scontrol"
    count = tmp_path / "count"
    script.write_text(f"#!/bin/sh\necho x >> {count}\n"
                      "echo 'Job update not available right now, the DB index is being set, "
                      "try again in a bit' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurmctl.SlurmError, match="scontrol update JobId=7 NumNodes=ALL failed: "
                                                  "Job update not available right now"):
        slurmctl.run("scontrol", "update", "JobId=7", "NumNodes=ALL", retry_for=0.5)
    assert len(count.read_text().split()) >= 3
