"""Resilient GLB across the hosts of the virtual cluster (``tests/vcluster.py``):
a host crashes and another falls off the network while GLB counts; the count
stays exact on the hosts left, and nothing of the lost places stays anywhere."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually
from test_cross_host import ROOT, ssh_env, strays

from benchmarks._common import tagged_results

PROG = str(Path(__file__).resolve().parent / "resilient_prog.py")

pytestmark = pytest.mark.timeout(180)


def test_a_crashed_host_and_a_cut_off_one_lose_nothing_of_a_resilient_count(vcluster, tmp_path):
    vc = vcluster
    gate = tmp_path / "gate"
    env = ssh_env(vc, APGAS_HOSTS="vh1,vh2,vh3,vh4", APGAS_INTERFACE="*", APGAS_HEARTBEAT="0.5:3",
                  APGAS_THREADS="2", GATE=str(gate))
    proc = vc.exec("vh1", [sys.executable, PROG], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "RUNNING"
        time.sleep(1.0)  # the work has spread over the hosts (no event says so; the checks
        # below hold either way, this only makes the losses hit work in flight)
        vc.kill_host("vh3")  # every process there: the place, its ssh session, sshd
        time.sleep(0.3)
        vc.link_down("vh4")
        while (line := proc.stdout.readline()) and line.strip() != "PLACES 2":
            pass  # until place 0 has declared both dead: the count is still held open then
        gate.touch()
        results, out, err = tagged_results(proc, "RESULT ", 90)
        assert proc.returncode == 0 and len(results) == 1, (out, err[-5000:])
        result = results[0]
        assert result["total"] == result["expected"], result
        assert result["lost"] == 2 and result["hosts"] == ["vh1", "vh2"], result
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
        vc.link_up("vh4")
        vc.revive_host("vh3")
    eventually(lambda: strays(vc) == {}, "nothing left on any host", 30)
