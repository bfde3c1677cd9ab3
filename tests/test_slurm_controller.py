"""``apgas-scheduler slurm-controller`` on a real 4-node test Slurm: our policy shrinks
a malleable GLB job so that a rigid job starts, grows it back afterwards, and leaves
alone the jobs that did not opt in and the orders nobody but the operator may give."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from _slurm import SlurmUnavailable, start_slurm
from conftest import eventually

ROOT = Path(__file__).resolve().parent.parent
PROG = str(Path(__file__).with_name("slurm_job.py"))

#: one worker runs them all: the cluster (slurmctld, slurmdbd, mariadb, four slurmds)
#: then starts once per run, not once on each worker that got one of the tests
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("slurm-controller")]


@pytest.fixture(scope="module")
def cluster():
    """Four nodes of two CPUs, in a directory others may enter (the forgery tests run
    Slurm's commands as nobody), able to resize jobs (slurmdbd), else the tests skip."""
    work = Path(tempfile.mkdtemp(prefix="apgas-ctl-"))  # the tests' temporary directory: 1777
    work.chmod(0o755)
    try:
        made = start_slurm(work, nodes=4, cpus=2)
    except SlurmUnavailable as e:
        pytest.skip(str(e))
    try:
        if not made.resizable:
            pytest.skip(f"the test Slurm cannot resize jobs: {made.not_resizable}")
        yield made
    finally:
        made.stop()


@pytest.fixture
def slurm(cluster):
    """The cluster, idle. A 1-4 node job starts on the nodes Slurm's scheduler sees free,
    and nodes of a job just cancelled may look idle to sinfo before they are to the
    scheduler: a 4-node job that runs to its end first shows that all four are."""
    eventually(lambda: set(cluster.node_states().values()) == {"idle"}, "every node idle")
    submit(cluster, "barrier", "--nodes=4", "--exclusive", "--time=1", "--wrap=true")
    eventually(lambda: "barrier" not in squeue(cluster), "the barrier job through", 60)
    eventually(lambda: set(cluster.node_states().values()) == {"idle"}, "every node idle")
    yield cluster
    cluster.run("scancel", "--partition=debug")
    eventually(lambda: not cluster.run("squeue", "--noheader").stdout.strip(), "no job left", 30)


def squeue(cluster) -> dict[str, dict]:
    """Every job by name, as ``squeue --json`` shows it (ended ones left out)."""
    out = cluster.run("squeue", "--json").stdout
    return {j["name"]: j for j in json.loads(out)["jobs"]
            if j["job_state"] in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED")}


def submit(cluster, name: str, *options: str, env: dict | None = None, cwd: Path = ROOT,
           user: str | None = None) -> int:
    if not any(o.startswith("--output=") for o in options):
        options = (*options, "--output=/dev/null")  # nothing in the checkout
    done = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", *options],
                          env={**cluster.env, **(env or {})}, cwd=cwd, capture_output=True,
                          text=True, timeout=30, user=user)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def malleable_job(cluster, tmp: Path, poll: str = "0", grow: str = "expand") -> int:
    """slurm_job.py's ``controlled`` GLB job on 1-4 whole nodes, one place per node."""
    env = {"APGAS_SLURM_GROW": grow, "APGAS_COMMUNICATOR": "slurm", "APGAS_SLURM_POLL": poll, "APGAS_LOG_LEVEL": "INFO",
           "APGAS_SLURM_GROW_TIMEOUT": "20", "MODE": "controlled", "SIGNALS": str(tmp),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    script = f"exec {sys.executable} {PROG}"
    return submit(cluster, "malleable", "--nodes=1-4", "--exclusive",
                  f"--output={tmp / 'malleable.out'}", "--time=10", f"--wrap={script}",
                  env=env)


class Controller:
    """The controller as an operator runs it, stopped (SIGTERM) at the end of the test."""

    def __init__(self, cluster, tmp: Path, *options: str) -> None:
        self.log = tmp / "controller.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "apgas_scheduler", "slurm-controller", *options],
                env=cluster.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.log.read_text()


def held(cluster, job: int) -> int:
    """The nodes job ``job`` holds, with those of its companion allocations."""
    jobs = squeue(cluster)
    return sum(j["node_count"] for j in jobs.values() if j["job_state"] == "RUNNING"
               and (j["job_id"] == job or j["name"] == f"apgas-companion-{job}"))


@pytest.mark.parametrize("grow", ["expand", "companion"])
def test_thrifty_shrinks_a_malleable_job_for_a_rigid_one_and_grows_it_back(slurm, tmp_path, grow):
    """Grown back by Slurm's job expansion (22.05 and on, undocumented since 21.08),
    or by a companion allocation (where Slurm does not permit expansion)."""
    tmp_path.chmod(0o777)
    malleable = malleable_job(slurm, tmp_path, grow=grow)
    eventually(lambda: squeue(slurm).get("malleable", {}).get("comment") == "apgas ready 0",
               "the malleable job on 4 nodes, taking orders", 90)
    assert squeue(slurm)["malleable"]["node_count"] == 4
    controller = Controller(slurm, tmp_path, "--policy", "thrifty", "--interval", "1",
                            "--resize-interval", "2")
    try:
        submitted = time.time()
        submit(slurm, "rigid", "--nodes=2", "--exclusive", "--time=1", "--wrap=sleep 5")
        rigid = eventually(lambda: (j := squeue(slurm).get("rigid")) and j["job_state"] == "RUNNING"
                           and j, "the rigid job running", 60)
        waited = rigid["start_time"] - rigid["submit_time"]
        assert waited <= 40, f"the rigid job waited {waited} s (submitted at {submitted:.0f})"
        seen = squeue(slurm)["malleable"]
        assert seen["node_count"] == 2 and seen["comment"] == "apgas done 1", seen
        assert seen["admin_comment"] == "apgas-order 1 shrink 2"
        # the rigid job ends: the idle nodes go back to the malleable job
        eventually(lambda: held(slurm, malleable) == 4, "the malleable job back on 4 nodes", 90)
        companions = [j for j in squeue(slurm).values() if j["name"].startswith("apgas-companion")]
        assert len(companions) == (grow == "companion"), companions
        (tmp_path / "go").touch()
        eventually(lambda: "malleable" not in squeue(slurm), "the malleable job ended", 120)
        eventually(lambda: not squeue(slurm), "its companion allocations gone", 30)

    finally:
        (tmp_path / "go").touch()
        log = controller.stop()
    out = (tmp_path / "malleable.out").read_text()
    [line] = [x for x in out.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["total"] == result["expected"], out[-3000:]
    assert len(result["end"]) == 4, result
    assert f"job {malleable} (malleable, 4 node(s)): apgas-order 1 shrink 2" in log, log
    assert f"job {malleable} (malleable, 2 node(s)): apgas-order 2 grow 2" in log, log
    print(f"\nthe rigid job started {waited} s after its submission")


def test_a_job_that_did_not_opt_in_is_never_resized(slurm, tmp_path):
    job = submit(slurm, "plain", "--nodes=1-4", "--exclusive", "--time=5", "--wrap=sleep 120",
                 "--comment=apgas is not running here")
    eventually(lambda: squeue(slurm).get("plain", {}).get("job_state") == "RUNNING", "running", 30)
    before = squeue(slurm)["plain"]["node_count"]
    assert before >= 3, f"Slurm started the 1-4 node job on {before} node(s) of 4 idle ones"
    submit(slurm, "rigid", f"--nodes={6 - before}", "--exclusive", "--time=1", "--wrap=sleep 1")
    controller = Controller(slurm, tmp_path, "--policy", "thrifty", "--interval", "0.5")
    try:
        time.sleep(5)  # ten passes
    finally:
        log = controller.stop()
    jobs = squeue(slurm)
    assert jobs["plain"]["node_count"] == before and jobs["plain"]["admin_comment"] == "", jobs["plain"]
    assert jobs["rigid"]["job_state"] == "PENDING"
    assert f"job {job}" not in log and "apgas-order" not in log, log


@pytest.mark.skipif(os.geteuid() != 0, reason="runs Slurm's commands as nobody: needs root")
def test_orders_written_by_users_are_refused_by_slurm(slurm, tmp_path):
    tmp_path.chmod(0o777)
    malleable = malleable_job(slurm, tmp_path, poll="1")
    eventually(lambda: squeue(slurm).get("malleable", {}).get("comment") == "apgas ready 0",
               "the malleable job taking orders", 90)

    def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env=slurm.env, cwd="/", capture_output=True, text=True,
                              timeout=30, user="nobody")

    # another user: Slurm refuses to let them write the order, or to wake the job
    forged = as_nobody("scontrol", "update", f"JobId={malleable}",
                       "AdminComment=apgas-order 7 shrink 3")
    assert forged.returncode != 0 and "denied" in forged.stderr.lower(), forged
    comment = as_nobody("scontrol", "update", f"JobId={malleable}", "Comment=apgas ready 0")
    assert comment.returncode != 0, comment
    # a user's own job: they may write its Comment, never its AdminComment
    own = submit(slurm, "own", "--nodes=1", "--time=1", "--wrap=sleep 60", cwd=Path("/"),
                 user="nobody")
    assert as_nobody("scontrol", "update", f"JobId={own}", "Comment=apgas ready 0").returncode == 0
    forged = as_nobody("scontrol", "update", f"JobId={own}", "AdminComment=apgas-order 1 grow 3")
    assert forged.returncode != 0 and "denied" in forged.stderr.lower(), forged
    # and what a job's user writes in its Comment is never read as an order, even a
    # text that scontrol show job would print like the AdminComment field
    slurm.run("scontrol", "update", f"JobId={malleable}",
              "Comment=x AdminComment=apgas-order 9 shrink 3")
    slurm.run("scancel", "--signal=URG", "--full", str(malleable))
    time.sleep(3)  # three polls of the job
    jobs = squeue(slurm)
    assert jobs["malleable"]["node_count"] == 4 and jobs["malleable"]["admin_comment"] == ""
    (tmp_path / "go").touch()
    eventually(lambda: "malleable" not in squeue(slurm), "the malleable job ended", 120)
    out = (tmp_path / "malleable.out").read_text()
    assert "order from slurm-controller" not in out, out[-3000:]
