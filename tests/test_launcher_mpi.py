"""Places from mpiexec ranks (mpi4py and mpich from PyPI; skipped when not installed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, wait_gone

from benchmarks import mpi_exits
from benchmarks._common import tagged_results

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                        os.environ.get("PATH", "")]))
if MPIEXEC is None:
    pytest.skip("mpiexec not found (pip install mpich)", allow_module_level=True)

PROG = str(Path(__file__).with_name("launch_prog.py"))
ROOT = Path(__file__).resolve().parent.parent


def mpiexec(n: int, *args: str, **env: str) -> subprocess.Popen:
    environ = {**os.environ, "APGAS_LOCAL_HOSTS": "*", "APGAS_MALLEABLE_LISTEN": "127.0.0.1:0",
               "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, *args], cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[dict, str]:
    results, out, err = tagged_results(proc, "RESULT ", timeout)
    assert proc.returncode == 0 and len(results) == 1, (proc.returncode, out, err)
    assert "BAD TERMINATION" not in err, err
    return results[0], err


def pids(survey: list[dict]) -> list[int]:
    return [p["pid"] for p in survey]


def test_every_rank_is_a_place_and_only_rank_0_runs_main():
    result, _ = finish(mpiexec(3, PROG))
    start = result["start"]
    assert [p["place"] for p in start] == [0, 1, 2]
    assert [p["rank"] for p in start] == ["0", "1", "2"]
    assert len(set(pids(start))) == 3
    assert wait_gone(pids(start), 5) == []


def test_growth_goes_through_the_local_launcher_and_shrink_removes_grown_places():
    result, _ = finish(mpiexec(2, PROG, GROW="hostA,hostB", SHRINK="1"))
    assert result["grow_reply"] == ["ok grow 2 places 2 3"]
    grown = result["grown"]
    assert [(p["place"], p["host"]) for p in grown[2:]] == [(2, "hostA"), (3, "hostB")]
    assert all(p["rank"] is None for p in grown[2:])  # not MPI ranks: plain places
    assert all(p["ppid"] == grown[0]["pid"] for p in grown[2:])  # started by rank 0
    assert result["shrink_reply"] == ["hostB"]
    assert [p["place"] for p in result["shrunk"]] == [0, 1, 2]
    assert wait_gone(pids(grown), 5) == []


def test_ranks_cannot_be_removed():
    result, err = finish(mpiexec(2, PROG, GROW="hostA", SHRINK="2"))
    assert result["shrink_reply"] == [
        "error cannot shrink by 2: places [1] are mpiexec ranks, which stay until the job "
        "ends; only places started by a grow can leave"]
    assert [p["place"] for p in result["shrunk"]] == [0, 1, 2]


def test_place_count_that_contradicts_mpiexec_is_refused():
    proc = mpiexec(2, "-c", "import apgas; apgas.run(print, places=3)")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "APGAS_PLACES" not in err and "places is 3 but mpiexec started 2 rank(s)" in err


def test_killed_rank_0_ends_every_rank(tmp_path):
    code = ("import apgas, json, os, time\n"
            "def main():\n"
            "    print('PIDS', json.dumps([apgas.at(p, os.getpid) for p in apgas.places()]), flush=True)\n"
            "    time.sleep(60)\n"
            "apgas.run(main)\n")
    proc = mpiexec(3, "-c", code)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PIDS "), (line, proc.stderr.read() if proc.poll() is not None else "")
        ranks = json.loads(line[5:])
        os.kill(ranks[0], signal.SIGKILL)
        proc.wait(timeout=20)  # mpiexec notices and ends the job
        assert wait_gone(ranks, 10) == []
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert not any(alive(p) for p in ranks)


SECOND_RUN = """
import apgas
print("FIRST", apgas.run(lambda: len(apgas.places())), flush=True)
try:
    apgas.run(lambda: len(apgas.places()))
except apgas.ApgasError as e:
    print("REFUSED", e, flush=True)
"""


def test_a_second_run_under_mpiexec_is_refused_at_once():
    proc = mpiexec(2, "-c", SECOND_RUN)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert "FIRST 2" in out, (out, err)
    assert "REFUSED under mpiexec the ranks serve the first apgas.run() only" in out, (out, err)


# Hydra's proxy SIGKILLs the ranks still running as soon as one rank ends without
# telling it (PMI finalize, sent by MPICH from a C atexit handler); a rank killed
# before its own finalize made the job exit 9 after a correct run (issue 13).

def test_every_rank_tells_the_process_manager_it_finalized():
    outcome = mpi_exits.run_once(MPIEXEC, 3)
    assert outcome.code == 0 and outcome.answered, outcome.stderr_tail
    assert outcome.missing_finalize == [], outcome


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_hundred_runs_in_a_row_exit_0():
    outcomes = mpi_exits.run_many(100, 3)
    bad = [(i, o, o.stderr_tail) for i, o in enumerate(outcomes, 1) if not o.clean]
    assert bad == []
