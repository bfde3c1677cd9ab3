"""GLB checkpoints (issue 41): a run whose whole process group is SIGKILLed at random
moments, also while snapshots are being written, resumes from its directory, on
another number of places, to the exact result; a damaged newest snapshot is not
loaded (the one before it is); a directory of another problem is refused; a
user's bag, a static start, grow and shrink orders and resilient mode all keep
it exact. Seeded: a failing case runs again the same way."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import place_processes

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
UTS12 = 66106929  # nodes of the geometric tree of depth 12, seed 19 (glb.apps.uts)


def snapshots(directory: Path) -> list[Path]:
    return sorted(directory.glob("glb-*.snapshot"))


def start(argv: list[str], out: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A run in a process group of its own (so that all of it can be killed at once)."""
    return subprocess.Popen(argv, stdout=out.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})},
                            start_new_session=True)


def kill_whole(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group (place 0 and every place it started), then make
    sure nothing of it is left: places that were being forked may have another group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
    for pid in place_processes(proc.pid):
        os.kill(pid, signal.SIGKILL)


def kill_during(proc: subprocess.Popen, directory: Path, rng: random.Random,
                after: int = 1, timeout: float = 60) -> bool:
    """Kill the run at a random moment once ``after`` new snapshots were written; False if
    it ended first (then it ran to its end)."""
    seen = {p.name for p in snapshots(directory)}
    new: set[str] = set()  # accumulated: only the two newest snapshots stay on disk
    deadline = time.monotonic() + timeout
    while len(new) < after:
        new |= {p.name for p in snapshots(directory)} - seen
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, "no snapshot was written"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    if proc.poll() is not None:
        return False
    kill_whole(proc)
    return True


def uts_run(directory: Path, places: int, json_out: Path, interval: float = 0.05,
            depth: int = 12) -> list[str]:
    return [sys.executable, "-m", "glb.apps", "uts", "--depth", str(depth), "--places", str(places),
            "--checkpoint", str(directory), "--checkpoint-interval", str(interval),
            "--json", str(json_out)]


@pytest.mark.parametrize("seed", range(2))
def test_a_run_killed_whole_resumes_on_other_places_to_the_exact_result(seed, tmp_path):
    rng = random.Random(seed)
    ck, record = tmp_path / "ck", tmp_path / "run.json"
    kills = 0
    for places in (2, 3):
        proc = start(uts_run(ck, places, record), tmp_path / f"run-{places}.out")
        kills += kill_during(proc, ck, rng)
    last = start(uts_run(ck, 1 + seed, record), tmp_path / "last.out")
    assert last.wait(120) == 0, (tmp_path / "last.out").read_text()[-3000:]
    out = json.loads(record.read_text())
    assert out["result"] == UTS12 and out["correct"], out
    assert kills >= 1
    assert out["checkpoints"]["resumed_from"] is not None, out["checkpoints"]
    assert not list(ck.glob(".*.tmp"))


def test_kills_while_snapshots_are_written_lose_nothing(tmp_path):
    """Snapshots every 10 ms: most kills land during a write (or between its rename and
    the removal of the older ones)."""
    rng = random.Random(7)
    ck, record = tmp_path / "ck", tmp_path / "run.json"
    for k in range(4):
        proc = start(uts_run(ck, 2, record, interval=0.01), tmp_path / f"run-{k}.out")
        kill_during(proc, ck, rng, after=2)
    last = start(uts_run(ck, 2, record, interval=0.01), tmp_path / "last.out")
    assert last.wait(120) == 0, (tmp_path / "last.out").read_text()[-3000:]
    out = json.loads(record.read_text())
    assert out["result"] == UTS12 and out["correct"], out


def test_a_damaged_newest_snapshot_is_not_loaded_the_one_before_is(tmp_path):
    ck, record = tmp_path / "ck", tmp_path / "run.json"
    proc = start(uts_run(ck, 2, record), tmp_path / "first.out")
    assert kill_during(proc, ck, random.Random(3), after=3), "the run ended before the kill"
    newest, before = snapshots(ck)[-1], snapshots(ck)[-2]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn
    last = start(uts_run(ck, 2, record), tmp_path / "last.out")
    assert last.wait(120) == 0, (tmp_path / "last.out").read_text()[-3000:]
    out = json.loads(record.read_text())
    assert out["result"] == UTS12 and out["correct"], out
    assert out["checkpoints"]["resumed_from"] == int(before.stem.split("-")[1]), out["checkpoints"]
    assert f"{newest} is not whole, not used" in (tmp_path / "last.out").read_text()


def test_the_same_run_again_returns_its_result_at_once(tmp_path):
    ck, record = tmp_path / "ck", tmp_path / "run.json"
    for _ in range(2):
        proc = start(uts_run(ck, 2, record, interval=5), tmp_path / "run.out")
        assert proc.wait(120) == 0, (tmp_path / "run.out").read_text()[-3000:]
        out = json.loads(record.read_text())
        assert out["result"] == UTS12 and out["correct"], out
    assert out["checkpoints"]["written"] == 0 and out["glb_stats"] == [], out


PROGRAM = '''
import os, random, sys, threading
import apgas
from glb import GLB, GLBConfig
from glb_bags import Total, X10IntervalBag
from orders import random_orders

LO, HI = 0, int(sys.argv[2])

def make(i, count):  # a user's bag, the X10 way: an interval of numbers to sum
    return X10IntervalBag([(HI * i // count, HI * (i + 1) // count)], spin=2)

def main():
    if os.environ.get("ORDERS"):
        random_orders(("127.0.0.1", int(os.environ["ORDERS"])), random.Random(1), "g")
    glb = GLB(GLBConfig(checkpoint=sys.argv[1], checkpoint_interval=0.05, n=64,
                        malleable=bool(os.environ.get("ORDERS")),
                        resilient=bool(os.environ.get("RESILIENT"))))
    if os.environ.get("STATIC"):
        result = glb.compute_static(make, Total())
    else:
        result = glb.compute_dynamic(X10IntervalBag([(LO, HI)], spin=2), Total())
    print("RESULT", result.value, result.count, glb.checkpoints.resumed_from, flush=True)

apgas.run(main, places=int(sys.argv[3]), threads=2)
'''


def user_program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(PROGRAM))
    return path


def result_of(out: Path) -> tuple[int, int]:
    line = next(x for x in out.read_text().splitlines() if x.startswith("RESULT"))
    return int(line.split()[1]), int(line.split()[2])


@pytest.mark.parametrize("mode", ["static", "resilient", "malleable"])
def test_a_users_bag_resumes_exact(mode, tmp_path, monkeypatch):
    from glb_bags import interval_total
    from orders import free_port

    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    port = free_port()
    env = {"static": {"STATIC": "1"}, "resilient": {"RESILIENT": "1"},
           "malleable": {"ORDERS": str(port), "APGAS_MALLEABLE_LISTEN": f"127.0.0.1:{port}"}}[mode]
    prog, ck, hi = user_program(tmp_path), tmp_path / "ck", 400_000
    proc = start([sys.executable, str(prog), str(ck), str(hi), "3"], tmp_path / "first.out", env)
    killed = kill_during(proc, ck, random.Random(11), after=3)
    last = start([sys.executable, str(prog), str(ck), str(hi), "2"], tmp_path / "last.out",
                 {k: v for k, v in env.items() if k == "STATIC"})
    assert last.wait(120) == 0, (tmp_path / "last.out").read_text()[-3000:]
    expected = interval_total(0, hi)
    assert result_of(tmp_path / "last.out") == (expected.value, expected.count)
    assert killed, "the first run ended before the kill"


def test_a_directory_of_another_problem_is_refused(tmp_path):
    prog, ck = user_program(tmp_path), tmp_path / "ck"
    first = subprocess.run([sys.executable, str(prog), str(ck), "20000", "2"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert first.returncode == 0, first.stderr[-3000:]
    other = subprocess.run([sys.executable, str(prog), str(ck), "30000", "2"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert other.returncode != 0
    assert f"the GLB checkpoint directory {ck} holds a snapshot of another problem" in other.stderr
    app = subprocess.run(uts_run(ck, 1, tmp_path / "x.json"), cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert app.returncode != 0 and "another problem" in app.stderr  # GLB's own check
    ck2 = tmp_path / "ck2"
    assert subprocess.run(uts_run(ck2, 1, tmp_path / "y.json", depth=10), cwd=ROOT,
                          capture_output=True, timeout=120).returncode == 0
    refused = subprocess.run(uts_run(ck2, 1, tmp_path / "z.json"), cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2
    assert f"the checkpoint directory {ck2} holds snapshots of uts" in refused.stderr
    assert "'depth': 10" in refused.stderr and "'depth': 12" in refused.stderr
