"""The DMR applications on apgas.arrays (issue 31): the references against independent
computations, the distributed runs against the references, rigid, under orders and
under orders with a lost place (issue 39: the apps' iterations are apgas.steps, their
arrays resilient)."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from orders import order, random_orders

import apgas
from apgas.arrays import BlockArray
from apgas.arrays.apps import Outcome, Session, _cli, cg, jacobi, nbody, sleep

pytestmark = pytest.mark.usefixtures("no_scheduler")


# --- the references against computations written independently -----------------------------
def test_jacobi_one_and_more_iterations_by_hand():
    # 4 x 4: the interior is (1,1), (1,2), (2,1), (2,2); after one sweep the two under
    # the top row are 1/4, the others 0; the top row sums to 4
    assert jacobi.sequential(4, 0) == {"checksum": 4.0}
    assert jacobi.sequential(4, 1) == {"checksum": 4.5}
    # after two: (1,1) = (1 + 0 + 0 + 1/4) / 4, (2,1) = (1/4 + 0 + 0 + 0) / 4, same on the right
    assert jacobi.sequential(4, 2)["checksum"] == 4 + 2 * (1.25 / 4) + 2 * (0.25 / 4)

    n, k = 6, 7
    grid = [[1.0 if i == 0 else 0.0 for _ in range(n)] for i in range(n)]
    for _ in range(k):
        grid = [[grid[i][j] if i in (0, n - 1) or j in (0, n - 1) else
                 (grid[i - 1][j] + grid[i + 1][j] + grid[i][j - 1] + grid[i][j + 1]) / 4
                 for j in range(n)] for i in range(n)]
    assert math.isclose(jacobi.sequential(n, k)["checksum"], sum(map(sum, grid)), rel_tol=1e-14)


def dense_laplacian(n: int) -> np.ndarray:
    a = np.zeros((n * n, n * n))
    for i in range(n):
        for j in range(n):
            a[i * n + j, i * n + j] = 4
            for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                if 0 <= i + di < n and 0 <= j + dj < n:
                    a[i * n + j, (i + di) * n + j + dj] = -1
    return a


def test_cg_matches_a_dense_cg_and_solves_the_3x3_grid():
    a = dense_laplacian(4)
    b = np.ones(16)
    x, r = np.zeros(16), b.copy()
    p = r.copy()
    residuals = []
    for k in range(1, 7):  # the textbook CG on the dense matrix
        ap = a @ p
        alpha = (r @ r) / (p @ ap)
        x, r_next = x + alpha * p, r - alpha * ap
        p = r_next + (r_next @ r_next) / (r @ r) * p
        r = r_next
        got = cg.sequential(4, k)
        assert math.isclose(got["checksum"], x.sum(), rel_tol=1e-12)
        assert math.isclose(got["residual"], np.linalg.norm(b - a @ x), rel_tol=1e-8,
                            abs_tol=1e-13)  # 0 once converged (by the symmetry, in 3 steps)
        residuals.append(got["residual"])
    assert residuals[-1] < residuals[0] < cg.sequential(4, 0)["residual"] == 4.0  # |b| = 4
    exact = np.linalg.solve(dense_laplacian(3), np.ones(9))
    got = cg.sequential(3, 9)  # CG ends in at most as many steps as unknowns
    assert math.isclose(got["checksum"], exact.sum(), rel_tol=1e-12)
    assert got["residual"] < 1e-12


def test_cg_steps_are_0_once_the_residual_is_exactly_0():
    # 2 x 2: A 1 = 2 1, so the first step lands on x = 1/2 exactly and r = 0; then
    # every step divides 0 by 0, which must give 0, not NaN
    assert cg.sequential(2, 5) == {"checksum": 2.0, "residual": 0.0}

    def main() -> Outcome:
        return cg.run(2, 5)
    assert apgas.run(main, places=3).values == {"checksum": 2.0, "residual": 0.0}


def test_nbody_matches_a_loop_by_loop_computation():
    n, steps, seed, eps, dt = 4, 6, 3, 0.01, 0.001
    x = [list(row) for row in np.random.default_rng(seed).random((n, 3))]
    v = [[0.0] * 3 for _ in range(n)]
    m = 1 / n

    def acc():
        out = []
        for i in range(n):
            a = [0.0] * 3
            for j in range(n):
                if j != i:
                    d = [x[j][k] - x[i][k] for k in range(3)]
                    s = (sum(c * c for c in d) + eps * eps) ** 1.5
                    a = [a[k] + m * d[k] / s for k in range(3)]
            out.append(a)
        return out

    a = acc()
    for _ in range(steps):
        v = [[v[i][k] + dt / 2 * a[i][k] for k in range(3)] for i in range(n)]
        x = [[x[i][k] + dt * v[i][k] for k in range(3)] for i in range(n)]
        a = acc()
        v = [[v[i][k] + dt / 2 * a[i][k] for k in range(3)] for i in range(n)]
    kinetic = sum(0.5 * m * sum(c * c for c in v[i]) for i in range(n))
    potential = -sum(m * m / math.sqrt(sum((x[i][k] - x[j][k]) ** 2 for k in range(3)) + eps * eps)
                     for i in range(n) for j in range(i + 1, n))
    got = nbody.sequential(n, steps, seed)
    assert math.isclose(got["energy"], kinetic + potential, rel_tol=1e-12)
    assert math.isclose(got["checksum"], sum(map(sum, x)), rel_tol=1e-12)
    # leapfrog keeps the energy (the bodies barely move in 6 steps)
    start = nbody.sequential(n, 0, seed)["energy"]
    assert math.isclose(got["energy"], start, rel_tol=1e-6)


def test_sleep_sizes_and_checksum():
    assert [sleep.parse_bytes(t) for t in ("4096", "256M", "1G", "64KiB", "2gb")] == \
        [4096, 256 << 20, 1 << 30, 64 << 10, 2 << 30]
    for bad in ("", "1.5G", "-1", "1X"):
        with pytest.raises(ValueError, match="--bytes"):
            sleep.parse_bytes(bad)
    assert sleep.sequential(2, 0.0, 8000) == {"checksum": 999 * 1000 / 2}
    assert sleep.expected(1 << 30) == (2 ** 27) * (2 ** 27 - 1) / 2


# --- distributed, rigid ------------------------------------------------------------------------
CASES = {
    "jacobi": (jacobi, {"n": 37, "iterations": 25}),
    "cg": (cg, {"n": 23, "iterations": 30}),
    "nbody": (nbody, {"n": 61, "steps": 8, "seed": 5}),
    "sleep": (sleep, {"steps": 3, "seconds": 0.01, "nbytes": 8 * 1001}),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("places", [1, 3])
@pytest.mark.parametrize("app", list(CASES))
def test_distributed_equals_the_reference(app, places):
    module, params = CASES[app]

    def main() -> Outcome:
        return module.run(**params)

    outcome = apgas.run(main, places=places)
    # the same bit for bit: rows are computed alike and the sums add row sums in row order
    assert outcome.values == module.sequential(**params)
    assert (outcome.places, outcome.final_places, outcome.resizes) == (places, places, [])


@pytest.mark.timeout(60)
def test_explicit_places_do_not_follow_and_exclude_malleable():
    def main() -> tuple[Outcome, Outcome]:
        with pytest.raises(ValueError, match="do not pass places"):
            jacobi.run(10, 2, places=[0, 2], malleable=True)
        return jacobi.run(10, 4, places=[2, 0]), cg.run(10, 4, places=[1])

    j, c = apgas.run(main, places=3)
    assert j.values == jacobi.sequential(10, 4)
    assert c.values == cg.sequential(10, 4)


# --- under orders ------------------------------------------------------------------------------
MALLEABLE = {
    "jacobi": (jacobi, {"n": 41, "iterations": 60}),
    "cg": (cg, {"n": 29, "iterations": 60}),
    "nbody": (nbody, {"n": 83, "steps": 40, "seed": 2}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("app", list(MALLEABLE))
def test_random_grows_and_shrinks_change_nothing(app, seed, malleable_address):
    """Random orders land between the iterations (the first half paced so that they
    interleave with them); the values are the reference's."""
    module, params = MALLEABLE[app]
    total = params.get("iterations", params.get("steps"))

    def main() -> tuple[Outcome, list[list[str]]]:
        orders, replies = random_orders(malleable_address, random.Random(seed), f"{app}{seed}")

        def pace(done: int) -> None:
            if done < total // 2 and orders.is_alive():
                time.sleep(0.03)
            elif done == total // 2:
                orders.join(60)  # the rest land here, between two iterations

        return module.run(**params, malleable=True, on_iteration=pace), replies

    outcome, replies = apgas.run(main, places=2)
    want = module.sequential(**params)
    assert outcome.values == want, (outcome.values, want, replies)  # bit for bit
    done = [r for r in replies if not r[0].startswith("error")]
    assert len(replies) >= 3 and done, replies
    assert len(outcome.resizes) == len(done), (outcome.resizes, replies)
    assert all(r.move_seconds is not None and r.wait_seconds is not None and r.commit_seconds is not None
               and r.move_seconds + r.commit_seconds + r.wait_seconds <= r.seconds for r in outcome.resizes)
    assert outcome.final_places == outcome.resizes[-1].places_after


CHAOS = {
    "jacobi": (jacobi, {"n": 41, "iterations": 70}),
    "cg": (cg, {"n": 29, "iterations": 70}),
    "nbody": (nbody, {"n": 83, "steps": 70, "seed": 2}),
    "sleep": (sleep, {"steps": 70, "seconds": 0.01, "nbytes": 8 * 10_001}),
}


class Chaos:
    """A thread at place 0 that, once the loop has run a step (and made its first
    commit), sends random grow and shrink orders and SIGKILLs places other than 0
    (at least one), with random pauses; after a kill it waits until the place is
    known lost. Records what it did. (A shrink while a loss awaits its roll-back is
    refused: its reply is an error.)"""

    def __init__(self, address, seed: int, actions: int = 5) -> None:
        self.address, self.rng, self.actions = address, random.Random(seed), actions
        self.started = threading.Event()
        self.done: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def kinds(self) -> list[str]:
        kinds = [self.rng.choice(["grow", "shrink", "kill"]) for _ in range(self.actions)]
        if "kill" not in kinds:
            kinds[self.rng.randrange(1, self.actions)] = "kill"
        return kinds

    def run(self) -> None:
        self.started.wait(60)
        kinds = self.kinds()
        for k in range(2 * self.actions):
            if not kinds:
                break
            time.sleep(self.rng.uniform(0.02, 0.15))
            kind = kinds.pop(0)
            others = [p.id for p in apgas.places() if p.id != 0]
            if not others:  # place 0 alone: grow first, the kill comes after
                if kind == "kill":
                    kinds.insert(0, kind)
                kind = "grow"
            if kind == "grow":
                reply = order(self.address, f"grow 1 chaos{k}")[0]
            elif kind == "shrink":
                reply = order(self.address, "shrink 1")[0]
            else:
                victim = self.rng.choice(others)
                try:
                    pid = apgas.at(victim, os.getpid)
                except apgas.ApgasError as e:  # it left meanwhile
                    reply = f"not killed: {e}"
                else:
                    os.kill(pid, signal.SIGKILL)
                    deadline = time.monotonic() + 20
                    while victim in [p.id for p in apgas.places()] and time.monotonic() < deadline:
                        time.sleep(0.005)
                    reply = f"killed place {victim}"
            self.done.append(f"{kind}: {reply}")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("app", list(CHAOS))
def test_random_orders_and_a_lost_place_change_nothing(app, seed, malleable_address):
    """Random grows, shrinks and SIGKILLs of places other than 0 during the run: a loss
    rolls the arrays back to the last commit (every 4 steps) and the steps since are
    run again (none if the loss came with a commit); the values are still the
    reference's, bit for bit."""
    module, params = CHAOS[app]
    total = params.get("iterations", params.get("steps"))
    seed = seed * 1000 + sum(map(ord, app))

    def main() -> tuple[Outcome, list[str], list[int]]:
        chaos = Chaos(malleable_address, seed)
        chaos.thread.start()
        seen: list[int] = []

        def pace(done: int) -> None:
            seen.append(done)
            chaos.started.set()
            if done >= total - 3:
                chaos.thread.join(40)  # the rest land here; a loss is rolled back after it
            elif chaos.thread.is_alive():
                time.sleep(0.02)

        try:
            outcome = module.run(**params, malleable=True, commit_every=4, resilient=True,
                                 on_iteration=pace)
        finally:
            chaos.started.set()
            chaos.thread.join(40)
        return outcome, chaos.done, seen

    rolled = Records()  # apgas.steps warns of each roll-back (apgas's loggers do not propagate)
    logging.getLogger("apgas.steps").addHandler(rolled)
    try:
        outcome, done, seen = apgas.run(main, places=2)
    finally:
        logging.getLogger("apgas.steps").removeHandler(rolled)
    assert outcome.values == module.sequential(**params), done  # bit for bit
    assert any(d.startswith("kill: killed") for d in done), done
    assert any(r.levelno == logging.WARNING for r in rolled.records), done  # a roll-back
    assert (outcome.repeated > 0) == (seen != list(range(1, total + 1))), (seen, outcome.repeated)
    assert seen[-1] == total and outcome.iterations == total
    orders = [d for d in done if not d.startswith("kill")]
    assert len(outcome.resizes) == sum(not d.split(": ", 1)[1].startswith("error") for d in orders), \
        (outcome.resizes, done)


@pytest.mark.timeout(60)
def test_flexible_sleep_moves_its_data_on_every_resize(malleable_address):
    lines = {1: "grow 2 nodeA nodeB", 2: "shrink 3", 3: "grow 1 nodeC"}

    def main() -> tuple[Outcome, list[list[int]]]:
        seen: list[list[int]] = []

        def resize(done: int) -> None:
            if done in lines:
                assert not order(malleable_address, lines[done])[0].startswith("error")
                seen.append([p.id for p in apgas.places()])
        return sleep.run(5, 0.05, 8 * 10_000, malleable=True, on_iteration=resize), seen

    outcome, seen = apgas.run(main, places=2)
    assert seen == [[0, 1, 2, 3], [0], [0, 4]]
    assert outcome.values == sleep.sequential(0, 0.0, 8 * 10_000)
    assert [(r.kind, r.n, r.places_before, r.places_after) for r in outcome.resizes] == \
        [("grow", 2, 2, 4), ("shrink", 3, 4, 1), ("grow", 1, 1, 2)]
    assert (outcome.places, outcome.final_places) == (2, 2)


@pytest.mark.timeout(60)
def test_an_order_that_comes_during_an_iteration_waits_for_its_end(malleable_address):
    """The session's loop is apgas.steps: a grow sent during a step starts its place but
    adds it, and re-spreads the array, only at the step's end; the session times it."""
    def main() -> tuple[tuple, tuple, list[int], tuple, list[list[str]], list, float]:
        session = Session(malleable=True)
        session.start()
        a = BlockArray.zeros(12, follow=True, resilient=True)
        session.ready([a])
        replies: list[list[str]] = []
        grow = threading.Thread(target=lambda: replies.append(order(malleable_address, "grow 1 nodeA")))
        began = time.perf_counter()
        for step in session.steps(apgas.steps(2, arrays=[a]), 2):
            with step:
                if step.index == 0:
                    before = a.layout
                    grow.start()
                    time.sleep(1.5)  # the new place starts meanwhile, but does not join ...
                    during = a.layout
                    places = [p.id for p in apgas.places()]
                    took = time.perf_counter() - began
        grow.join(30)
        after = a.layout
        session.close()
        a.free()
        return before, during, places, after, replies, session.resizes, took

    before, during, places, after, replies, resizes, took = apgas.run(main, places=2)
    assert replies and replies[0][0].startswith("ok"), replies
    assert before == during == ((0, 0, 6), (1, 6, 12)) and places == [0, 1]  # ... until the step ends
    assert after == ((0, 0, 4), (1, 4, 8), (2, 8, 12))
    [r] = resizes
    assert (r.kind, r.n, r.places_before, r.places_after) == ("grow", 1, 2, 3)
    # it waited for the step (at most its length), then moved the array and committed it
    assert 0 < r.wait_seconds <= took + 1.0 and r.move_seconds is not None
    assert r.commit_seconds is not None and r.move_seconds + r.commit_seconds + r.wait_seconds <= r.seconds


@pytest.mark.timeout(60)
def test_check_asks_with_dmrs_sizes_and_the_answers_resize_the_run(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")
    answers = iter(["expand 4", "shrink 2"])

    def script(message, fake):
        if not message.startswith("Evolving;Check"):
            return None
        answer = next(answers, "none")
        fake.later({"expand 4": "grow 2 nodeA nodeB", "shrink 2": "shrink 2"}.get(answer, "status"))
        return answer

    fake = fake_scheduler(script)

    def main() -> Outcome:
        return cg.run(20, 35, malleable=False, check_sizes=cg.CHECK, check_every=10)

    outcome = apgas.run(main, places=2)
    assert fake.messages("Evolving;Check") == ["Evolving;Check;2;32;8;2"] * 3  # after 10, 20, 30
    assert [(r.kind, r.places_before, r.places_after) for r in outcome.resizes] == \
        [("grow", 2, 4), ("shrink", 4, 2)]
    assert outcome.values == cg.sequential(20, 35)


# --- the command line --------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_the_command_line_prints_json_and_the_values_last():
    proc = subprocess.run([sys.executable, "-m", "apgas.arrays.apps", "cg", "--n", "20", "--iterations",
                           "15", "--places", "2", "--json"], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    record = json.loads(next(line for line in lines if line.startswith("{")))
    assert lines[-2].startswith("checksum ") and lines[-1].startswith("residual ")
    printed = {k: float(v) for k, v in (line.split() for line in lines[-2:])}
    assert printed == record["results"]
    assert printed == cg.sequential(20, 15)
    assert (record["app"], record["params"], record["places"], record["final_places"]) == \
        ("cg", {"n": 20, "iterations": 15}, 2, 2)
    assert record["resizes"] == [] and record["seconds"] > 0
    assert (record["commit_every"], record["resilient"], record["repeated"]) == (cg.COMMIT_EVERY, False, 0)


@pytest.mark.parametrize(("argv", "message"), [
    (["jacobi", "--n", "1"], "--n >= 3"),
    (["cg", "--iterations", "-1"], "--iterations >= 0"),
    (["nbody", "--n", "1"], "--n >= 2 bodies"),
    (["sleep", "--bytes", "12X"], "--bytes takes a size"),
    (["sleep", "--seconds", "-1"], "--seconds >= 0"),
    (["jacobi", "--places", "0"], "--places must be >= 1"),
    (["nbody", "--commit-every", "-1"], "--commit-every must be >= 0"),
    (["cg", "--check"], "APGAS_SCHEDULER is not set"),
])
def test_bad_input_is_refused_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        _cli.main(argv)
    assert exited.value.code != 0
    assert message in capsys.readouterr().err


def test_jacobi_kernels_numba_and_numpy_give_the_same_bits() -> None:
    """The compiled sweep (when numba is there) makes the numpy form's additions in
    the same order: results must not depend on which kernel a machine has."""
    from apgas.arrays.apps import jacobi

    rng = np.random.default_rng(3)
    h = rng.random((40, 33))
    a, b = np.zeros((38, 33)), np.zeros((38, 33))
    jacobi._sweep_numpy(h, a, 0, 38)
    jacobi._sweep(h, b, 0, 38)
    assert np.array_equal(a, b)
    assert jacobi.KERNELS in ("numba", "numpy")
