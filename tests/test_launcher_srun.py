"""Places started with srun inside an allocation of a real 3-node Slurm on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, wait_gone

import apgas
from apgas.errors import ApgasError
from benchmarks._common import tagged_results

ROOT = Path(__file__).resolve().parent.parent
PROG = str(Path(__file__).with_name("launch_prog.py"))


def salloc(cluster, *command: str, nodes: int = 3, **env: str) -> subprocess.Popen:
    """Run ``command`` as the batch side of a ``nodes``-node allocation."""
    environ = {**cluster.env, "PYTHONUNBUFFERED": "1", "APGAS_MALLEABLE_LISTEN": "127.0.0.1:0",
               **env}
    return subprocess.Popen(["salloc", f"--nodes={nodes}", "--quiet", "--time=5",
                             "--kill-command=SIGKILL", *command],
                            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def result_of(proc: subprocess.Popen, timeout: float = 90) -> dict:
    """The one RESULT line of a program that exited with 0."""
    results, out, err = tagged_results(proc, "RESULT ", timeout)
    assert proc.returncode == 0 and len(results) == 1, (proc.returncode, out, err[-6000:])
    return results[0]


def nodes(survey: list[dict]) -> list[tuple[int, str | None]]:
    return [(p["place"], p["node"]) for p in survey]


def test_detected_inside_an_allocation_with_one_place_per_node(slurm_cluster):
    result = result_of(salloc(slurm_cluster, sys.executable, PROG))
    start = result["start"]
    assert [(p["place"], p["host"]) for p in start] == [(0, "node1"), (1, "node2"), (2, "node3")]
    assert nodes(start)[1:] == [(1, "node2"), (2, "node3")]  # really srun steps on those nodes
    assert wait_gone([p["pid"] for p in start], 5) == []


def test_places_on_all_three_nodes_then_grow_and_shrink_among_them(slurm_cluster):
    result = result_of(salloc(slurm_cluster, sys.executable, PROG, APGAS_PLACES="4",
                              GROW="node2,node3", SHRINK="1"))
    assert nodes(result["start"])[1:] == [(1, "node2"), (2, "node3"), (3, "node1")]
    assert result["grow_reply"] == ["ok grow 2 places 4 5"]
    assert nodes(result["grown"])[4:] == [(4, "node2"), (5, "node3")]
    assert result["shrink_reply"] == ["node3"]
    assert [p["place"] for p in result["shrunk"]] == [0, 1, 2, 3, 4]
    assert wait_gone([p["pid"] for p in result["grown"]], 5) == []


def test_slurm_refusing_a_node_fails_the_grow_and_keeps_the_table(slurm_cluster):
    result = result_of(salloc(slurm_cluster, sys.executable, PROG, nodes=2, GROW="node3"))
    reply = result["grow_reply"]
    assert len(reply) == 1 and reply[0].startswith(
        "error no place was added: place 2 on host 'node3' exited with code 1 before joining; "
        "it said: | srun: error: Unable to create step"), reply
    assert "Requested node configuration is not available" in reply[0]
    assert result["grown"] == result["start"]


def test_first_start_on_an_unknown_node_is_reported(slurm_cluster):
    proc = salloc(slurm_cluster, sys.executable, PROG, nodes=1, APGAS_HOSTS="node1,node9")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "place 1 on host 'node9' exited with code 1 before joining" in err, err
    assert "Unable to create step" in err


def test_places_exit_when_place_0_dies(slurm_cluster):
    code = ("import apgas, json, os, time\n"
            "def main():\n"
            "    print(json.dumps([apgas.at(p, os.getpid) for p in apgas.places()]), flush=True)\n"
            "    time.sleep(60)\n"
            "apgas.run(main)\n")
    proc = salloc(slurm_cluster, sys.executable, "-c", code)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("["), (line, proc.poll())
        pids = json.loads(line)
        os.kill(pids[0], signal.SIGKILL)
        assert wait_gone(pids[1:], 10) == []  # srun closed their stdin: they ended themselves
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate()
    assert not any(alive(p) for p in pids)


def test_srun_outside_an_allocation_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ApgasError, match=r"place 1 could not be started on host 'node2' by the "
                                         r"srun launcher: .*inside a Slurm allocation"):
        apgas.run(lambda: None, launcher="srun", hosts="localhost,node2")


SCHEDULER_IN_ALLOCATION = """
import json, os, sys, time
sys.path.insert(0, "tests")
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.policies import get_policy
import launcher
nodes = launcher.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
sched = Scheduler(nodes, get_policy("easy"), interval=0.2, output_dir=sys.argv[1],
                  launcher=launcher.detect_launcher(os.environ, mpi=False),
                  socket_path=os.path.join(sys.argv[1], "scheduler.sock")).start()  # not in /tmp
spec = JobSpec("survey", (sys.executable, "tests/launch_prog.py"), "rigid", 2, 2, 60, (), os.getcwd())
ids = [sched.submit(spec), sched.submit(spec)]
while not all(j["state"] in ("done", "failed") for j in sched.status()["jobs"]):
    time.sleep(0.1)
print("STATUS " + json.dumps(sched.status()), flush=True)
sched.shutdown()
"""


def test_the_scheduler_runs_jobs_on_the_nodes_of_an_allocation(slurm_cluster, tmp_path):
    proc = salloc(slurm_cluster, sys.executable, "-c", SCHEDULER_IN_ALLOCATION, str(tmp_path))
    out, err = proc.communicate(timeout=90)
    status = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("STATUS ")]
    assert proc.returncode == 0 and status, (out, err)
    jobs = status[0]["jobs"]
    assert [j["state"] for j in jobs] == ["done", "done"], jobs
    for j in jobs:  # each job's two places ran as srun steps on the two nodes it was given
        result = json.loads((tmp_path / f"job-{j['id']}.out").read_text().split("RESULT ", 1)[1])
        hosts = [p["host"] for p in result["start"]]
        assert [p["node"] for p in result["start"]] == hosts
        assert len(set(hosts)) == 2 and set(hosts) <= {"node1", "node2", "node3"}
