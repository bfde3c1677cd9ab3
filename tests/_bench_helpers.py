"""What the tests of the harnesses that start places share: a harness run as its own
process group, checked to leave no place and no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import eventually, group_alive, place_processes, wait_gone

ROOT = Path(__file__).resolve().parent.parent


def run_harness(args: list[str], timeout: float) -> str:
    """``python -m ARGS`` without the scheduler's variables, killed whole after ``timeout``
    s; asserts it exits 0 and leaves nothing running, and returns its output."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN")}
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert wait_gone(place_processes(proc.pid), 5.0) == []
    eventually(lambda: not group_alive(proc.pid), "the harness's process group to end", 5.0)
    return stdout
