"""Growing and shrinking a running job on the test Slurm, by plain Slurm commands.

This is the reference the runtime's Slurm resizing follows:

grow job A by one node:
    salloc --no-shell -N1 --exclusive --dependency=expand:A   -> job B, on a node A lacks
    scontrol update jobid=B NumNodes=0                         (B gives its node up...)
    scancel B
    scontrol update jobid=A NumNodes=ALL                       (...and A takes it)
shrink job A:
    scontrol update jobid=A NumNodes=N                         (keeps A's first N nodes)
    scontrol update jobid=A NodeList=<nodes to keep>           (or names them)

An expand job lands on a node A lacks only when it cannot share A's: A and B
``--exclusive`` (or B ``--exclude=<A's nodes>``); a plain ``salloc -N1`` B goes
on A's node when it has a free CPU (the test nodes have 8).  Run by A's own
processes (``$SLURM_JOBID`` set), every update also writes
``slurm_job_<id>_resize.sh`` in the working directory: the new values of the
SLURM_* node variables the process has, which srun reads (before sourcing it
``srun -N2`` in a grown job says "Only allocated 1 nodes asked for 2").

Repeated resizes need accounting by slurmdbd (``SlurmCluster.resizable``): with
accounting_storage/none the first resize works and every later update of the job
fails with "Job update not available right now, the DB index is being set".
slurmctld itself retries that for 5 s before answering; the updates here retry
it for another 10 s.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.timeout(180)

NOT_YET = "Job update not available right now"
_names = itertools.count()


class Jobs:
    """Jobs of one test on the session's cluster, cancelled when the test ends."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.name = f"resize-test-{next(_names)}"

    def run(self, *args: str, timeout: float = 30, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(args, check=False, env=kwargs.pop("env", self.cluster.env),
                                cwd=kwargs.pop("cwd", self.cluster.workdir),
                                capture_output=True, text=True, timeout=timeout, **kwargs)
        if check:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    def allocate(self, *options: str) -> int:
        """``salloc --no-shell`` one node (plus ``options``): the new job's id, once it runs."""
        result = self.run("salloc", "--no-shell", "-N1", "--time=5", "--immediate=20",
                          f"--job-name={self.name}", *options)
        found = re.search(r"Granted job allocation (\d+)", result.stderr)
        assert found, result.stderr
        return int(found.group(1))

    def update(self, job: int, *fields: str, **kwargs) -> subprocess.CompletedProcess[str]:
        """``scontrol update jobid=job fields``, again while the job's DB index is being set."""
        deadline = time.monotonic() + 10
        while True:
            result = self.run("scontrol", "update", f"jobid={job}", *fields, check=False,
                              **kwargs)
            if NOT_YET not in result.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result.returncode == 0, (job, fields, result.stdout, result.stderr)
        return result

    def nodes(self, job: int) -> list[str]:
        """The nodes job ``job`` holds now."""
        fields = self.fields(job)
        assert fields["JobState"] == "RUNNING", fields
        names = self.run("scontrol", "show", "hostnames", fields["NodeList"]).stdout.split()
        assert len(names) == int(fields["NumNodes"]), fields
        return names

    def fields(self, job: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (values without spaces)."""
        out = self.run("scontrol", "show", "job", "--oneliner", str(job)).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def grow(self, job: int, *options: str) -> int:
        """Add one node to ``job`` through an expand job; return that helper job's id."""
        helper = self.allocate(f"--dependency=expand:{job}", *options)
        self.update(helper, "NumNodes=0")
        self.run("scancel", str(helper), check=False)  # already gone: harmless
        self.update(job, "NumNodes=ALL")
        return helper

    def cancel_all(self) -> None:
        self.run("scancel", f"--name={self.name}", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = self.run("squeue", "--noheader", f"--name={self.name}", "--format=%i",
                            check=False).stdout.split()
            if not left and all(s == "idle" for s in self.cluster.node_states().values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs {left} or busy nodes left: {self.cluster.node_states()}")


@pytest.fixture
def jobs(slurm_cluster):
    if not slurm_cluster.resizable:
        pytest.skip(slurm_cluster.not_resizable)
    made = Jobs(slurm_cluster)
    try:
        yield made
    finally:
        made.cancel_all()


def test_a_job_grows_and_shrinks_again_and_again(jobs):
    job = jobs.allocate("--exclusive")
    [first] = jobs.nodes(job)
    for _ in range(3):
        jobs.grow(job, "--exclusive")
        grown = jobs.nodes(job)
        assert len(grown) == 2 and grown[0] == first and first not in grown[1:], grown
        assert jobs.fields(job)["NumCPUs"] == "16"
        jobs.update(job, "NumNodes=1")
        assert jobs.nodes(job) == [first]
        assert jobs.fields(job)["NumCPUs"] == "8"


def test_a_job_grows_to_every_node_and_keeps_the_nodes_it_names(jobs):
    job = jobs.allocate("--exclusive")
    jobs.grow(job, "--exclusive")
    jobs.grow(job, "--exclusive")
    every = jobs.nodes(job)
    assert sorted(every) == sorted(jobs.cluster.nodes)
    # Shrinking by NodeList keeps exactly the named nodes, not just the first ones.
    keep = [every[0], every[2]]
    jobs.update(job, f"NodeList={','.join(keep)}")
    assert jobs.nodes(job) == keep
    jobs.update(job, f"NodeList={every[2]}")
    assert jobs.nodes(job) == [every[2]]
    jobs.grow(job, "--exclusive")
    assert len(jobs.nodes(job)) == 2


def test_an_expand_job_shares_the_node_of_a_job_that_leaves_cpus_free(jobs):
    job = jobs.allocate()  # one CPU of a node with 8
    [first] = jobs.nodes(job)
    helper = jobs.allocate(f"--dependency=expand:{job}")
    assert jobs.nodes(helper) == [first]  # no new node: merging it adds a CPU, not a node
    jobs.run("scancel", str(helper))
    # Excluding the job's nodes gets a new one.
    jobs.grow(job, f"--exclude={first}")
    grown = jobs.nodes(job)
    assert len(grown) == 2 and grown[0] == first, grown
    jobs.update(job, "NumNodes=1")
    assert jobs.nodes(job) == [first]


INSIDE = r"""
set -u
job=$SLURM_JOBID
env | grep '^SLURM_' | sort > before.env
helper=$(salloc --no-shell -N1 --exclusive --time=5 --immediate=20 --job-name="$NAME" \
         --dependency=expand:$job 2>&1 | sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
echo "HELPER $helper"
scontrol update jobid=$helper NumNodes=0
scancel $helper
scontrol update jobid=$job NumNodes=ALL
echo "STALE $(srun -N2 --overlap true 2>&1)"
. ./slurm_job_${job}_resize.sh
env | grep '^SLURM_' | sort > grown.env
echo "GROWN $(srun -N2 --overlap printenv SLURMD_NODENAME | sort | tr '\n' ' ')"
scontrol update jobid=$job NumNodes=1
. ./slurm_job_${job}_resize.sh
env | grep '^SLURM_' | sort > shrunk.env
echo "SHRUNK $(srun --overlap printenv SLURMD_NODENAME)"
"""


def _env(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_the_job_itself_resizes_and_gets_its_new_environment_from_scontrol(jobs, tmp_path):
    (tmp_path / "inside.sh").write_text(INSIDE)
    result = jobs.run("salloc", "-N1", "--exclusive", "--time=5", "--kill-command=SIGKILL",
                      f"--job-name={jobs.name}", "bash", "inside.sh", cwd=tmp_path, timeout=120,
                      env={**jobs.cluster.env, "NAME": jobs.name})
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    job = int(re.search(r"Granted job allocation (\d+)", result.stderr).group(1))
    helper = int(lines["HELPER"])
    # scontrol writes a script for every job it updates, the helper's included.
    assert {p.name for p in tmp_path.glob("slurm_job_*")} == {
        f"slurm_job_{j}_resize.{s}" for j in (job, helper) for s in ("sh", "csh")}
    # srun believes the stale SLURM_* variables...
    assert "Only allocated 1 nodes asked for 2" in lines["STALE"], result
    before, grown, shrunk = (_env(tmp_path / f"{n}.env") for n in ("before", "grown", "shrunk"))
    first = before["SLURM_JOB_NODELIST"]
    # ...and the script puts the new ones in.
    nodes = lines["GROWN"].split()
    assert len(nodes) == 2 and first in nodes, result
    assert grown["SLURM_JOB_NUM_NODES"] == grown["SLURM_NNODES"] == "2"
    assert grown["SLURM_JOB_CPUS_PER_NODE"] == "8(x2)"
    assert sorted(jobs.run("scontrol", "show", "hostnames",
                           grown["SLURM_JOB_NODELIST"]).stdout.split()) == sorted(nodes)
    assert "SLURM_TASKS_PER_NODE" in before and "SLURM_TASKS_PER_NODE" not in grown
    assert lines["SHRUNK"] == first, result
    assert shrunk["SLURM_JOB_NODELIST"] == shrunk["SLURM_NODELIST"] == first
    assert shrunk["SLURM_JOB_NUM_NODES"] == "1" and shrunk["SLURM_JOB_CPUS_PER_NODE"] == "8"
