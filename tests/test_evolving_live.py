"""Real evolving programs (apgas, real places) under the live scheduler: they ask
for places, release one, and ask DMR-style what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from apgas_scheduler.jobs import JobSpec
from apgas_scheduler.live.daemon import Scheduler
from apgas_scheduler.metrics import compute_metrics, read_events
from apgas_scheduler.policies import get_policy

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

PROLOGUE = '''
import json, os, sys, time
from pathlib import Path
import apgas

class Handler(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return chosen if chosen is not None else apgas.places()[-n:]

OUT = Path(os.environ["RESULT"])
record = {}

def save(**items):
    record.update(items)
    partial = OUT.with_suffix(".partial")      # the test reads OUT while we write:
    partial.write_text(json.dumps(record))     # it sees a whole file or none
    os.replace(partial, OUT)

def wait_file(name, timeout=60):
    deadline = time.monotonic() + timeout
    while not (OUT.parent / name).exists():
        assert time.monotonic() < deadline, f"no {name} file"
        time.sleep(0.05)

def everywhere():
    return [apgas.at(p, lambda: apgas.here().id) for p in apgas.places()]
'''


@pytest.fixture
def live(tmp_path, monkeypatch):
    """A scheduler in this process on node0..node{n-1} (all this machine)."""
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    running: list[Scheduler] = []

    def start(nodes: int, policy: str) -> Scheduler:
        sched = Scheduler([f"node{i}" for i in range(nodes)],
                          get_policy(policy, resize_interval=0.5), events=tmp_path / "events.jsonl",
                          interval=0.2, output_dir=tmp_path / "out",
                          state_dir=tmp_path / f"state-{len(running)}")
        running.append(sched.start())
        return sched

    yield start
    for sched in running:
        sched.shutdown()
        for thread in list(sched._threads):
            thread.join(10)


def program(tmp_path: Path, body: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(PROLOGUE + textwrap.dedent(body))
    return path


def evolving_job(path: Path, tmp_path: Path, min_nodes: int = 1, max_nodes: int = 4,
                 **env: str) -> JobSpec:
    env = {"RESULT": str(tmp_path / "result.json"), "APGAS_THREADS": "2", **env}
    return JobSpec("evolving", (PY, str(path)), "evolving", min_nodes, max_nodes, 90.0,
                   tuple(sorted(env.items())), str(ROOT))


def states(sched: Scheduler) -> dict[int, dict]:
    return {j["id"]: j for j in sched.status()["jobs"]}


def wait_until(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ended(sched: Scheduler, *ids: int) -> dict[int, dict]:
    wait_until(lambda: all(states(sched)[i]["state"] not in ("queued", "running") for i in ids),
               90, f"jobs {ids} to end")
    return states(sched)


def result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "result.json").read_text())


def check_pool(sched: Scheduler, tmp_path: Path) -> dict:
    assert all(n["job"] is None for n in sched.status()["nodes"])
    metrics = compute_metrics(read_events(tmp_path / "events.jsonl"))
    assert metrics["max_overlap_violations"] == 0
    return metrics


def test_a_program_asks_for_two_places_and_gets_them(live, tmp_path):
    sched = live(4, "evolving")
    path = program(tmp_path, '''
        def main():
            apgas.define_malleable_handler(Handler())
            request = apgas.request_grow(2)
            added = request.result(timeout=60)
            save(granted=[p.host for p in added], ids=everywhere())
            beyond = apgas.request_grow(5)   # holds 3 of at most 4
            beyond.wait(30)
            save(beyond=[beyond.state, beyond.reason], places=len(apgas.places()))
        apgas.run(main)
    ''')
    job_id = sched.submit(evolving_job(path, tmp_path))
    jobs = ended(sched, job_id)
    assert jobs[job_id]["state"] == "done", (jobs, (tmp_path / "out" / f"job-{job_id}.err").read_text())
    out = result(tmp_path)
    assert sorted(out["granted"]) == ["node1", "node2"] and out["ids"] == [0, 1, 2]
    assert out["beyond"][0] == "refused" and "at most 4" in out["beyond"][1], out
    assert out["places"] == 3
    assert jobs[job_id]["grows"] >= 1
    check_pool(sched, tmp_path)


def test_a_released_place_goes_back_to_the_pool(live, tmp_path):
    sched = live(3, "evolving")
    path = program(tmp_path, '''
        def main():
            apgas.define_malleable_handler(Handler())
            hosts = apgas.release_places([apgas.places()[-1]])
            save(released=hosts, ids=everywhere())
            wait_file("seen")
        apgas.run(main)
    ''')
    job_id = sched.submit(evolving_job(path, tmp_path, min_nodes=3, max_nodes=3))
    wait_until(lambda: (tmp_path / "result.json").exists(), what="the release")
    out = result(tmp_path)
    assert out["released"] == ["node2"] and out["ids"] == [0, 1]
    wait_until(lambda: {n["name"]: n["job"] for n in sched.status()["nodes"]}["node2"] is None,
               10, "node2 to be free")
    assert states(sched)[job_id]["nodes"] == ["node0", "node1"]
    other = sched.submit(JobSpec("rigid", (PY, "-c", "pass"), "rigid", 1, 1, 30.0, (), str(ROOT)))
    jobs = ended(sched, other)
    assert jobs[other]["state"] == "done" and jobs[other]["start"] is not None
    (tmp_path / "seen").write_text("")
    jobs = ended(sched, job_id)
    assert jobs[job_id]["state"] == "done"
    check_pool(sched, tmp_path)


@pytest.mark.parametrize("policy", ["evolving", "dmr"])
def test_check_status_expands_when_idle_and_shrinks_for_a_queued_job(live, tmp_path, policy):
    sched = live(4, policy)
    path = program(tmp_path, '''
        def main():
            apgas.define_malleable_handler(Handler())
            grown = apgas.check_status(1, 4)          # idle nodes, nobody waits: expand
            save(grown=grown, ids=everywhere())
            inhibited = apgas.check_status(1, 4)      # within APGAS_CHECK_INHIBIT: a no-op
            save(inhibited=inhibited)
            wait_file("queued")
            time.sleep(1.0)                           # the inhibition period ends
            shrunk = apgas.check_status(1, 4)         # a queued job could start: shrink
            save(shrunk=shrunk, after=everywhere())
            wait_file("rigid-started")                # ends only once the test saw it
        apgas.run(main)
    ''')
    job_id = sched.submit(evolving_job(path, tmp_path, APGAS_CHECK_INHIBIT="1"))
    wait_until(lambda: "inhibited" in result(tmp_path) if (tmp_path / "result.json").exists()
               else False, what="the first checks")
    out = result(tmp_path)
    assert out["grown"] == 4 and out["ids"] == [0, 1, 2, 3] and out["inhibited"] == 4
    rigid = sched.submit(JobSpec("rigid", (PY, "-c", "pass"), "rigid", 2, 2, 30.0, (), str(ROOT)))
    assert states(sched)[rigid]["state"] == "queued"
    (tmp_path / "queued").write_text("")
    # the rigid job starts while the evolving job still runs: on the nodes it released
    wait_until(lambda: states(sched)[rigid]["state"] != "queued", what="the rigid job to start")
    assert states(sched)[job_id]["state"] == "running"
    (tmp_path / "rigid-started").write_text("")
    jobs = ended(sched, job_id, rigid)
    assert jobs[job_id]["state"] == "done" and jobs[rigid]["state"] == "done", jobs
    out = result(tmp_path)
    assert out["shrunk"] == 2 and len(out["after"]) == 2
    assert jobs[rigid]["start"] < jobs[job_id]["end"]
    check_pool(sched, tmp_path)


def test_requests_under_a_policy_that_grants_none(live, tmp_path):
    sched = live(2, "easy")
    path = program(tmp_path, '''
        def main():
            apgas.define_malleable_handler(Handler())
            request = apgas.request_grow(1)
            request.wait(30)
            try:
                apgas.check_status(1, 2)
                check = "answered"
            except apgas.ApgasError as e:
                check = str(e)
            save(request=[request.state, request.reason], check=check, ids=everywhere())
        apgas.run(main)
    ''')
    job_id = sched.submit(evolving_job(path, tmp_path, max_nodes=2))
    jobs = ended(sched, job_id)
    assert jobs[job_id]["state"] == "done"
    out = result(tmp_path)
    assert out["request"][0] == "refused" and "policy easy" in out["request"][1]
    assert "policy easy" in out["check"] and out["ids"] == [0]
    check_pool(sched, tmp_path)


def test_the_example_runs(tmp_path):
    env = {k: v for k, v in os.environ.items()  # as a newcomer runs it
           if k not in ("APGAS_SCHEDULER", "APGAS_LOCAL_HOSTS")}
    done = subprocess.run([PY, str(ROOT / "examples" / "evolving.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every step's result was exact" in done.stdout
    assert "asked for 5 more: refused" in done.stdout
