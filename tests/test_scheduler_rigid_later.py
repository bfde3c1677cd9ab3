"""A malleable job that registered and then went rigid
(``apgas.disable_malleable_handler()``) has answered the ``--register-timeout``:
it runs to its end, it is not killed for never having registered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eventually
from test_scheduler_restart import Daemon

pytestmark = pytest.mark.timeout(60)

JOB = '''
import time
import apgas

class Handler(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]

def main():
    apgas.define_malleable_handler(Handler())
    apgas.disable_malleable_handler()  # rigid from now on, as the tutorial's solver
    time.sleep(4)                      # works past the register timeout (2 s)

apgas.run(main)
'''


class ShortRegister(Daemon):
    """The daemon with a register timeout of 2 s."""

    def start(self) -> ShortRegister:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apgas_scheduler", "serve", "--nodes", self.nodes, "--port",
             str(self.port), "--policy", "malleable", "--interval", "0.2", "--register-timeout", "2",
             "--output-dir", str(self.tmp / "out"), "--state-dir", str(self.tmp / "state"),
             "--socket", str(self.tmp / "s.sock")],
            env={**os.environ, "APGAS_LOCAL_HOSTS": "*"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "listening" in self.proc.stdout.readline()
        return self


@pytest.fixture
def daemon(tmp_path: Path):
    d = ShortRegister(tmp_path)
    yield d.start()
    d.stop()


def test_a_job_that_went_rigid_is_not_killed_at_the_register_timeout(daemon, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    job = daemon.request("submit", job={"name": "rigid-later", "class": "malleable", "min_nodes": 1,
                                        "max_nodes": 2, "walltime": 60, "cwd": str(tmp_path),
                                        "command": [sys.executable, "job.py"]})["id"]
    end = eventually(lambda: (j := daemon.jobs()[job])["state"] not in ("queued", "running") and j,
                     "the job to end")
    assert (end["state"], end["reason"]) == ("done", "")
