"""``apgas-scheduler elastisim`` against the real ElastiSim (built by
``.ci/install-services``; see ``tests/_elastisim.py``): our policies schedule the
Kassel group's small input and a generated set of about 100 rigid, moldable and
malleable jobs, every job completes, and ElastiSim never has to refuse or abort on
an answer (the bridge refuses none of the policies' decisions either).

Each run is ElastiSim and the subcommand, each a process in a group of its own in
the test's folder, ended (with the groups) whatever happens."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _elastisim
import pytest

from apgas_scheduler.policies import policy_names

ROOT = Path(__file__).resolve().parent.parent
FOLDER, WHY = _elastisim.find()
RUN_TIMEOUT = 600.0

pytestmark = [pytest.mark.skipif(FOLDER is None, reason=WHY or "no ElastiSim"),
              pytest.mark.timeout(RUN_TIMEOUT + 120)]

#: the policies that run in every test run; the others run with -m slow (each run takes
#: 3 to 7 s, most of it ElastiSim's)
CORE = ("fcfs", "easy", "malleable", "lending", "mebf", "min-agreement", "pref-common-pool",
        "avg-steal-agreement")
POLICIES = [p if p in CORE else pytest.param(p, marks=pytest.mark.slow) for p in policy_names()]


def node_speed(platform: Path) -> float:
    """The compute nodes' flop/s in a SimGrid platform file of the Kassel inputs."""
    speeds = [float(s) for s in re.findall(r'<cluster\b[^>]*\bspeed="([0-9.eE+-]+)f"',
                                           platform.read_text())]
    assert speeds, f"no cluster speed in {platform}"
    return speeds[0]


def simulate(folder: Path, source: Path, policy: str) -> tuple[dict, list[dict[str, str]], int]:
    """Run ElastiSim on the input ``source`` with ``policy`` deciding, in ``folder``:
    the bridge's counts, ElastiSim's job statistics and how many jobs it was given."""
    assert FOLDER is not None and _elastisim is not None
    folder.mkdir()
    config = _elastisim.prepare_input(folder, source)
    settings = json.loads(config.read_text())
    jobs = len(json.loads(Path(settings["jobs_file"]).read_text())["jobs"])
    stats = folder / "stats.json"
    sim = _elastisim.run_elastisim(FOLDER / "build" / "elastisim", config)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    with open(folder / "bridge.log", "wb") as out:
        bridge = subprocess.Popen(
            [sys.executable, "-m", "apgas_scheduler", "elastisim", "--policy", policy,
             "--url", settings["zmq_url"], "--stats", str(stats),
             "--node-speed", repr(node_speed(Path(settings["platform_file"])))],
            cwd=config.parent, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
    try:
        try:
            code = bridge.wait(RUN_TIMEOUT)
            sim.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{policy}: the run did not end in {RUN_TIMEOUT:g} s; "
                        f"bridge: {_tail(folder / 'bridge.log')}; "
                        f"ElastiSim: {_tail(folder / 'elastisim.log')}")
    finally:
        _elastisim.stop(bridge)
        _elastisim.stop(sim)
    said = f"bridge: {_tail(folder / 'bridge.log')}\nElastiSim: {_tail(folder / 'elastisim.log')}"
    assert code == 0 and sim.returncode == 0, f"{policy}: exit {code} and {sim.returncode}\n{said}"
    with open(settings["job_statistics"], newline="") as f:
        rows = list(csv.DictReader(f))
    return json.loads(stats.read_text()), rows, jobs


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


def check(policy: str, stats: dict, rows: list[dict[str, str]], jobs: int) -> None:
    assert len(rows) == jobs, f"{policy}: {len(rows)} of {jobs} job(s) in the statistics"
    unfinished = [r["ID"] for r in rows if r["Status"] != "completed"]
    assert not unfinished, f"{policy}: job(s) {unfinished} did not complete"
    assert stats["finalized"] and stats["refused"] == 0, stats
    assert stats["decisions"]["start"] == jobs, stats


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_the_kassel_small_input(tmp_path, policy):
    assert FOLDER is not None
    source = FOLDER / _elastisim.KASSEL / "input_files" / "small"
    check(policy, *simulate(tmp_path / "run", source, policy))


def generate(tmp_path: Path) -> Path:
    """About 100 jobs (half rigid, a quarter each moldable and malleable, the
    generator's shares) on 16 nodes over a day, with the Kassel generator."""
    assert FOLDER is not None
    scripts = FOLDER / _elastisim.KASSEL / "scripts" / "input_generation"
    out = tmp_path / "generated"
    subprocess.run([sys.executable, str(scripts / "jsonGenerator.py"), "-q", "-d", str(out),
                    "--seed", "S1", "--total_time", "86400", "--num_cluster_nodes", "16",
                    "--flops_range", "1e13,3.8e15", "--dividation_split_time", "600"],
                   check=True, timeout=120, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                   capture_output=True)
    jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    assert 90 <= len(jobs) <= 120 and {j["type"] for j in jobs} == {"RIGID", "MOLDABLE", "MALLEABLE"}
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_finishes_a_generated_set_of_100_jobs(tmp_path, policy):
    stats, rows, jobs = simulate(tmp_path / "run", generate(tmp_path), policy)
    check(policy, stats, rows, jobs)
    if policy in ("malleable", "lending", "min-agreement"):  # they resize the malleable jobs
        assert stats["decisions"]["grow"] + stats["decisions"]["shrink"] > 0, stats
