"""apgas.steps(..., checkpoint=DIR): commits on disk survive the whole program.

The program of the kill tests is written as a user writes one: a heat-like
stencil on two followed, resilient BlockArrays that take turns, scalars in
``state``, a commit every few steps, and ``checkpoint=DIR``. It runs as its own
process group, which is SIGKILLed whole (place 0 and every place) at random
moments, also while a commit is being written; run again on the same DIR, on
another number of places, it ends with the sequential result, bit for bit.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import fast_first

import apgas
from apgas.arrays import BlockArray

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent


def eventually(predicate, what: str, timeout: float):
    """As conftest's (not imported: the places import this module, for its functions,
    and conftest's imports would slow every start of places)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value

KERNEL = '''
import numpy as np

ALPHA = 0.2

def initial(rows, cols):
    u = np.zeros((rows, cols))
    u[rows // 4:3 * rows // 4] = np.arange(cols) % 7 * 10.0
    return u

def update(h, out):
    """The next values of the rows of out from h (the same rows with one more above and
    below); the largest change."""
    d = h[:-2] + h[2:]
    d -= 2.0 * h[1:-1]
    d *= ALPHA
    np.add(h[1:-1], d, out=out)
    return float(np.abs(d).max()) if len(d) else 0.0
'''

PROGRAM = KERNEL + '''
import json, sys
import apgas
from apgas.arrays import BlockArray, at_each

def sweep_at(old, new):
    return update(old.halo(1, copy=False), new.local())

def main(folder, rows, cols, count, commit_every, mode):
    u = BlockArray.from_array(initial(rows, cols), follow=True, resilient=True)
    v = BlockArray.zeros((rows, cols), follow=True, resilient=True)
    state = {"time": 0.0, "change": 0.0, "runs": []}
    for step in apgas.steps(count, commit_every=commit_every, arrays=[u, v], state=state,
                            checkpoint=folder, checkpoint_mode=mode):
        with step:
            if step.resumed:
                print(f"resumed at {step.index}", flush=True)
            old, new = (u, v) if step.index % 2 == 0 else (v, u)
            state["change"] = max(at_each(apgas.places(), sweep_at, old, new))
            state["time"] += 0.01
            state["runs"].append(step.index)
    result = (u, v)[count % 2].gather()
    u.free()
    v.free()
    return result, state

folder, out, places, rows, cols, count, every, mode = sys.argv[1:]
result, state = apgas.run(lambda: main(folder, int(rows), int(cols), int(count), int(every), mode),
                          places=int(places))
np.save(out + ".npy", result)
with open(out + ".json", "w") as f:
    json.dump(state, f)
print("done", flush=True)
'''

ROWS, COLS, COUNT = 60, 8, 30


def sequential(rows: int, cols: int, count: int) -> tuple[np.ndarray, dict]:
    kernel: dict = {}
    exec(KERNEL, kernel)
    old, new = np.zeros((rows + 2, cols)), np.zeros((rows + 2, cols))
    old[1:-1] = kernel["initial"](rows, cols)
    state = {"time": 0.0, "change": 0.0, "runs": list(range(count))}
    for _ in range(count):
        state["change"] = kernel["update"](old, new[1:-1])
        state["time"] += 0.01
        old, new = new, old
    return old[1:-1].copy(), state


@pytest.fixture
def program(tmp_path):
    """Start the program as its own process group; every group is killed at the end."""
    path = tmp_path / "heat.py"
    path.write_text(PROGRAM)
    groups: list[subprocess.Popen] = []

    def start(folder: Path, places: int, every: int, delay: float = 0.0, mode: str = "parallel",
              out: str = "out") -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items()
               if k not in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR", "APGAS_MALLEABLE_LISTEN")}
        env["PYTHONUNBUFFERED"] = "1"
        if delay:
            env["APGAS_TEST_CHECKPOINT_DELAY"] = str(delay)
        proc = subprocess.Popen(
            [sys.executable, str(path), str(folder), str(tmp_path / out), str(places), str(ROWS),
             str(COLS), str(COUNT), str(every), mode],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        groups.append(proc)
        return proc

    yield start
    for proc in groups:
        kill_group(proc)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the program's whole process group (place 0 and its places); wait for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
    eventually(lambda: not group_alive(proc.pid), "the killed process group to end", 10.0)


def finish(proc: subprocess.Popen, tmp_path: Path, out: str = "out") -> tuple[np.ndarray, dict, str]:
    stdout, stderr = proc.communicate(timeout=40)
    assert proc.returncode == 0, stderr[-3000:]
    eventually(lambda: not group_alive(proc.pid), "the program's process group to end", 10.0)
    with open(tmp_path / f"{out}.json") as f:
        state = json.load(f)
    return np.load(tmp_path / f"{out}.npy"), state, stdout


def check_exact(result: np.ndarray, state: dict) -> None:
    reference, expected = sequential(ROWS, COLS, COUNT)
    np.testing.assert_array_equal(result, reference)
    assert state["time"] == expected["time"] and state["change"] == expected["change"]
    assert state["runs"] == expected["runs"]  # every step once: the state came back with the rows


def commits(folder: Path) -> list[str]:
    return sorted(e for e in os.listdir(folder) if e.startswith("commit-"))


@pytest.mark.parametrize("seed", fast_first([1, 2, 3, 4], 2))
def test_killed_whole_at_random_moments_it_resumes_exact(program, tmp_path, seed):
    rng = random.Random(seed)
    folder = tmp_path / "ckpt"
    kills = []
    for _ in range(1 + seed % 2):  # killed once or twice
        proc = program(folder, rng.choice([2, 3]), rng.choice([1, 2, 3]), delay=0.03,
                       mode=rng.choice(["parallel", "gathered"]))
        time.sleep(rng.uniform(0.8, 2.5))
        kill_group(proc)
        kills.append(sorted(os.listdir(folder)) if folder.exists() else None)
    proc = program(folder, rng.choice([1, 2, 4]), rng.choice([1, 3]))
    result, state, stdout = finish(proc, tmp_path)
    check_exact(result, state)
    assert len(commits(folder)) <= 2 and not [e for e in os.listdir(folder) if e.startswith(".tmp-")]
    # the run again: nothing to do, the same values
    again, state2, stdout2 = finish(program(folder, 2, 1), tmp_path)
    check_exact(again, state2)
    assert "resumed" not in stdout2, (stdout2, kills)


def test_killed_while_a_commit_is_written_it_resumes_from_the_one_before(program, tmp_path):
    folder = tmp_path / "ckpt"
    proc = program(folder, 3, 2, delay=0.4)

    def writing() -> bool:  # a commit after the first, with a block file in its folder
        if not folder.exists() or not commits(folder):
            return False
        return any(e.startswith(".tmp-") and any(n.endswith(".bin") for n in os.listdir(folder / e))
                   for e in os.listdir(folder))

    eventually(writing, "a commit being written", 30.0)
    kill_group(proc)
    before = commits(folder)
    torn = [e for e in os.listdir(folder) if e.startswith(".tmp-")]
    assert before and torn, os.listdir(folder)
    assert not (folder / torn[0] / "manifest.json").exists()
    result, state, stdout = finish(program(folder, 2, 2), tmp_path)
    check_exact(result, state)
    assert f"resumed at {int(before[-1].split('-')[1])}" in stdout, (stdout, before)
    assert not [e for e in os.listdir(folder) if e.startswith(".tmp-")]  # cleaned up


# -- in this process: torn commits, other problems ------------------------------------------

def add_one(a: BlockArray) -> None:
    a.local()[...] += 1.0


def accumulate(folder, n: int, stop: int | None = None, rows: int = 50, mode: str = "parallel",
               dtype=np.float64):
    """At place 0: ``a`` (rows x 3) gets +1 each step, ``state['sum']`` the step indices;
    ``stop``: break after that step (no final commit). The steps run, ``a`` and state."""
    x = np.arange(rows * 3, dtype=dtype).reshape(rows, 3)
    a = BlockArray.from_array(x, follow=True, resilient=True)
    st = {"sum": 0}
    ran = []
    for step in apgas.steps(n, commit_every=2, arrays=[a], state=st, checkpoint=folder,
                            checkpoint_mode=mode):
        with step:
            ran.append(step.index)
            with apgas.finish():
                for p in apgas.places():
                    apgas.async_at(p, add_one, a)
            st["sum"] += step.index
        if step.index == stop:
            break
    result = a.gather()
    a.free()
    return ran, result, st


def expect(result, st, n: int, rows: int = 50) -> None:
    np.testing.assert_array_equal(result, np.arange(rows * 3.0).reshape(rows, 3) + n)
    assert st["sum"] == sum(range(n))


@pytest.mark.parametrize(("damage", "mode"), [("truncate a block file", "parallel"),
                                              ("delete the manifest", "gathered"),
                                              ("flip a byte of a block file", "gathered"),
                                              ("flip a byte of a block file", "parallel"),
                                              ("delete the state", "parallel")])
def test_a_torn_commit_is_never_loaded_the_one_before_is(tmp_path, damage, mode, capfd):
    folder = tmp_path / "ckpt"
    ran, _, _ = apgas.run(lambda: accumulate(folder, 10, stop=6, mode=mode), places=3)
    assert ran == list(range(7)) and commits(folder) == ["commit-000000000004", "commit-000000000006"]
    newest = folder / "commit-000000000006"
    block = sorted(newest.glob("a0.*.bin"))[-1]
    if damage == "truncate a block file":
        os.truncate(block, block.stat().st_size - 8)
    elif damage == "delete the manifest":
        (newest / "manifest.json").unlink()
    elif damage == "flip a byte of a block file":
        data = bytearray(block.read_bytes())
        data[len(data) // 2] ^= 0x40
        block.write_bytes(bytes(data))
    else:
        (newest / "state.pickle").unlink()
    ran, result, st = apgas.run(lambda: accumulate(folder, 10, mode=mode), places=2)
    assert ran == list(range(4, 10)), ran  # from the commit before the torn one
    expect(result, st, 10)
    assert "is torn and is not loaded" in capfd.readouterr().err
    assert commits(folder) == ["commit-000000000008", "commit-000000000010"]


def test_a_finished_loop_resumes_on_any_places_and_run_again_yields_no_step(tmp_path):
    folder = tmp_path / "ckpt"
    ran, _, _ = apgas.run(lambda: accumulate(folder, 12, stop=4), places=3)
    assert ran == list(range(5))
    ran, result, st = apgas.run(lambda: accumulate(folder, 12, stop=8, mode="gathered"), places=4)
    assert ran == list(range(4, 9))
    ran, result, st = apgas.run(lambda: accumulate(folder, 12), places=1)
    assert ran == list(range(8, 12))
    expect(result, st, 12)
    assert commits(folder)[-1] == "commit-000000000012"
    ran, result, st = apgas.run(lambda: accumulate(folder, 12), places=2)
    assert ran == []  # done: the final arrays and state, no step
    expect(result, st, 12)


def test_a_directory_of_another_problem_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    apgas.run(lambda: accumulate(folder, 10, stop=3), places=2)

    def refused(**kw):
        try:
            accumulate(folder, **kw)
        except apgas.ApgasError as e:
            return str(e)
        return "no error"

    for kw, diff in [({"n": 12}, "n is 10 there, 12 here"),
                     ({"n": 10, "rows": 40}, "array 0 is (50, 3) float64 there, (40, 3) float64 here"),
                     ({"n": 10, "dtype": np.float32}, "(50, 3) float64 there, (50, 3) float32 here")]:
        message = apgas.run(lambda kw=kw: refused(**kw), places=2)
        assert f"checkpoint directory {folder} holds a commit of another problem" in message, message
        assert diff in message, message
    ran, result, st = apgas.run(lambda: accumulate(folder, 10), places=2)  # the right one resumes
    assert ran == list(range(4, 10))  # steps 0-3 ran, and the commit after them stands
    expect(result, st, 10)


def test_a_directory_in_use_is_refused_and_a_bad_mode_is_an_error(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(apgas.ApgasError, match="is used by another running loop"):
            apgas.run(lambda: accumulate(folder, 4), places=1)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="checkpoint_mode must be one of parallel, gathered"):
        apgas.steps(3, checkpoint=folder, checkpoint_mode="fast")


def test_a_place_lost_rolls_back_in_memory_and_the_disk_goes_on(tmp_path, malleable_address):
    folder = tmp_path / "ckpt"
    x = np.arange(90.0)

    def main():
        a = BlockArray.from_array(x, follow=True, resilient=True)
        pid = apgas.at(2, os.getpid)
        ran = []
        for step in apgas.steps(8, commit_every=2, arrays=[a], checkpoint=folder):
            with step:
                ran.append(step.index)
                if step.index == 5 and not step.rolled_back and len(apgas.places()) == 3:
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(0.5)
                with apgas.finish():
                    for p in apgas.places():
                        apgas.async_at(p, add_one, a)
        result = a.gather()
        a.free()
        return ran, result

    ran, result = apgas.run(main, places=3)
    np.testing.assert_array_equal(result, x + 8)
    assert ran == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7], ran
    assert commits(folder) == ["commit-000000000006", "commit-000000000008"]
    ran, result = apgas.run(main, places=3)
    assert ran == [] and np.array_equal(result, x + 8)
