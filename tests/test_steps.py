"""apgas.steps: orders wait for the step, commits keep copies, losses roll back.

The programs here are written as users write theirs: a followed array, a
handler that gives back the newest places, one finish per iteration over
``apgas.places()``. Orders and SIGKILLs come from a thread of the test at
random moments (seeded); the result must equal numpy's, bit for bit.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from orders import order

import apgas
from apgas.dist import BlockArray, _blocks

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    for var in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR"):
        monkeypatch.delenv(var, raising=False)


class Newest(apgas.MalleableHandler):
    """Gives back the newest places, as most users' handlers do."""

    def pre_shrink(self, n, chosen=None):
        if chosen is not None:
            return chosen
        return [p for p in apgas.places() if p.id != 0][-n:]


def add_one(a: BlockArray) -> None:
    block = a.local()
    time.sleep(0.002)  # a step takes some time: orders and kills land inside steps
    block += 1.0


def one_iteration(a: BlockArray) -> None:
    with apgas.finish():
        for p in apgas.places():
            apgas.async_at(p, add_one, a)


class Chaos:
    """A thread at place 0 that sends random orders and (``kills``) SIGKILLs places
    other than 0, until stopped; records what it did."""

    def __init__(self, address, seed: int, kills: bool, orders: int = 6, pause=(0.05, 0.3)) -> None:
        self.address, self.rng, self.kills = address, random.Random(seed), kills
        self.orders, self.pause = orders, pause
        self.done: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        host = 0
        for _ in range(self.orders):
            if self.stop.wait(self.rng.uniform(*self.pause)):
                return
            count = len(apgas.places())
            kind = self.rng.choice(["grow", "shrink", "kill"] if self.kills else ["grow", "shrink"])
            if count <= 2:
                kind = "grow"
            if kind == "grow":
                host += 1
                reply = order(self.address, f"grow 1 node{host}")
            elif kind == "shrink":
                reply = order(self.address, "shrink 1")
            else:
                victim = self.rng.choice([p.id for p in apgas.places() if p.id != 0])
                try:
                    os.kill(apgas.at(victim, os.getpid), signal.SIGKILL)
                except apgas.ApgasError as e:  # it left meanwhile
                    reply = [f"kill {victim}: {e}"]
                else:
                    reply = [f"killed {victim}"]
            self.done.append(f"{kind}: {reply[0]}")


def run_loop(address, seed: int, kills: bool, least: int = 40, commit_every: int = 3):
    """At least ``least`` steps, and on until the chaos thread is done; the result
    must be numpy's for the steps run."""
    x = np.arange(600 * 4, dtype=np.float64).reshape(600, 4)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.from_array(x, follow=True, resilient=True)
        st = {"sum": 0}
        chaos = Chaos(address, seed, kills)
        chaos.thread.start()
        indices = []
        try:
            for step in apgas.steps(100_000, commit_every=commit_every, arrays=[a], state=st):
                with step:
                    indices.append(step.index)
                    one_iteration(a)
                    st["sum"] += step.index
                if step.index + 1 >= least and not chaos.thread.is_alive():
                    break
        finally:
            chaos.stop.set()
            chaos.thread.join(60)
        result = a.gather()
        a.free()
        assert not _blocks._entries and not _blocks._saved and not _blocks._copies
        return result, st, indices, chaos.done

    result, st, indices, done = apgas.run(main, places=3)
    n = indices[-1] + 1
    np.testing.assert_array_equal(result, x + n)
    assert st["sum"] == sum(range(n))
    return indices, done


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_data_parallel_loop_is_exact_under_random_orders(malleable_address, seed):
    indices, done = run_loop(malleable_address, seed, kills=False)
    assert indices == list(range(len(indices)))  # no loss: no step runs twice
    assert all(not d.split(": ", 1)[1].startswith("error") for d in done), done
    assert len(done) == 6, done  # every order was carried out, none starved


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_a_data_parallel_loop_is_exact_under_orders_and_kills(malleable_address, seed):
    indices, done = run_loop(malleable_address, seed, kills=True, commit_every=2)
    assert len(done) == 6, done
    if any(d.startswith("kill: killed") for d in done):  # a loss repeats the steps since the commit
        assert indices != list(range(len(indices))), (indices, done)
