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
from conftest import eventually, fast_first
from orders import Newest, order

import apgas
from apgas._core.runtime import current
from apgas.arrays import BlockArray, _blocks

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("no_scheduler")]


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
                    # the next loss after the copies are rebuilt: one before is a loss of a
                    # place and its buddy at once, which the test of that case covers
                    self.stop.wait(0.5)
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
                if step.index + 1 >= least and not chaos.thread.is_alive() \
                        and not step.rolled_back:
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


@pytest.mark.parametrize("seed", fast_first([11, 12, 13, 14], 2))
def test_a_data_parallel_loop_is_exact_under_orders_and_kills(malleable_address, seed):
    indices, done = run_loop(malleable_address, seed, kills=True, commit_every=2)
    assert len(done) == 6, done
    if any(d.startswith("kill: killed") for d in done):  # a loss repeats the steps since the commit
        assert indices != list(range(len(indices))), (indices, done)


def test_a_loss_during_a_commit_rolls_back_to_the_commit_before(malleable_address, monkeypatch):
    x = np.arange(300.0 * 3).reshape(300, 3)
    commits = []
    original = BlockArray._steps_commit

    def commit_with_a_loss(self, tag):
        commits.append(tag)
        if len(commits) == 3:  # the third commit: a place dies as it begins
            os.kill(apgas.at(2, os.getpid), signal.SIGKILL)
        return original(self, tag)

    monkeypatch.setattr(BlockArray, "_steps_commit", commit_with_a_loss)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.from_array(x, follow=True, resilient=True)
        st = {"steps": []}
        indices = []
        for step in apgas.steps(12, commit_every=4, arrays=[a], state=st):
            with step:
                indices.append(step.index)
                one_iteration(a)
                st["steps"].append(step.index)
        try:
            return a.gather(), st, indices, [p.id for p in apgas.places()]
        finally:
            a.free()

    result, st, indices, live = apgas.run(main, places=3)
    np.testing.assert_array_equal(result, x + 12)
    assert st["steps"] == list(range(12))  # state rolled back with the arrays
    # commits before steps 0, 4 and (failing) 8: steps 4-7 run again, then a new commit
    assert indices == [*range(8), *range(4, 12)], indices
    assert live == [0, 1]


def test_a_place_lost_with_its_buddy_is_a_clear_error(malleable_address):
    x = np.arange(40.0)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.from_array(x, follow=True, resilient=True)  # blocks of 10 on 0..3
        pids = {p.id: apgas.at(p, os.getpid) for p in apgas.places()}
        with pytest.raises(apgas.ApgasError) as caught:
            for step in apgas.steps(5, arrays=[a]):
                with step:
                    if step.index == 2:  # place 1's buddy is place 2: both go at once
                        os.kill(pids[1], signal.SIGKILL)
                        os.kill(pids[2], signal.SIGKILL)
                    one_iteration(a)
        a.free()
        return str(caught.value)

    message = apgas.run(main, places=4)
    assert "cannot be rolled back: rows 10:20 (place 1 and its buddy, place 2) were lost" in message


def test_a_grow_that_fails_never_stops_the_steps(malleable_address):
    """A grow starts its places before it waits for the step: one that fails ends
    while the step still runs (here the step waits for its reply: were the grow
    waiting for the step, this would hang)."""
    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.zeros((64,), follow=True, resilient=True)
        replies = []

        def failing_grow():
            os.environ["APGAS_LOCAL_HOSTS"] = ""  # nohost.invalid is no host of this machine
            try:
                replies.append(order(malleable_address, "grow 1 nohost.invalid"))
            finally:
                os.environ["APGAS_LOCAL_HOSTS"] = "*"

        for step in apgas.steps(10, arrays=[a]):
            with step:
                if step.index == 5:
                    t = threading.Thread(target=failing_grow)
                    t.start()
                    t.join(30)
                    assert not t.is_alive(), "the failing grow waited for the step"
                one_iteration(a)
        total = a.gather().sum()
        a.free()
        return replies[0], total, [p.id for p in apgas.places()]

    reply, total, live = apgas.run(main, places=2)
    assert reply[0].startswith("error no place was added") and "nohost.invalid" in reply[0], reply
    assert total == 64 * 10
    assert live == [0, 1]


def test_check_status_and_release_places_inside_a_step_act_at_its_end(fake_scheduler, monkeypatch):
    from apgas.testing import FakeScheduler  # noqa: F401  (the fixture makes one)

    monkeypatch.setenv("APGAS_CHECK_INHIBIT", "0")

    def script(message, fake):
        if message.startswith("Evolving;Check"):
            fake.later("grow 1 nodeX")
            return "expand 3"
        return None

    fake_scheduler(script)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.zeros((30,), follow=True, resilient=True)
        seen = []
        for step in apgas.steps(40, arrays=[a]):
            with step:
                before = [p.id for p in apgas.places()]
                if step.index == 1:
                    assert apgas.check_status(1, 3) == 2  # answered; the grow waits for the step
                if step.index == 2 and len(before) == 2:  # the grow came, or it waits for
                    eventually(current().gate.wanted, "the grow order at the gate")  # this end
                if step.index == 20:
                    hosts = apgas.release_places([before[-1]])  # leaves at the step's end
                    assert hosts == [apgas.place(before[-1]).host]
                one_iteration(a)
                time.sleep(0.01)
                assert [p.id for p in apgas.places()] == before  # nothing changed in the step
                seen.append(len(before))
        total = a.gather().sum()
        a.free()
        return seen, total

    seen, total = apgas.run(main, places=2)
    assert total == 30 * 40
    assert seen[:2] == [2, 2] and 3 in seen[2:4], seen  # the grow came after the step that asked
    assert seen[-1] == 2, seen  # the release was carried out


def test_followed_arrays_without_steps_stay_exact_under_orders(malleable_address):
    """The issue's first program, without steps: one finish per iteration, a halo
    stencil in two finishes; orders wait for the top-level finishes to end."""
    x = np.arange(200.0 * 5).reshape(200, 5)

    def stencil(u: BlockArray, v: BlockArray) -> None:
        h = u.halo(1)
        time.sleep(0.002)
        v.local()[:] = (h[:-2] + h[2:]) * 0.5

    def copy_back(u: BlockArray, v: BlockArray) -> None:
        u.local()[:] = v.local()

    def reference(n):
        u = x.copy()
        for _ in range(n):
            h = np.vstack([np.zeros((1, 5)), u, np.zeros((1, 5))])
            u = (h[:-2] + h[2:]) * 0.5
        return u

    def main():
        apgas.define_malleable_handler(Newest())
        u = BlockArray.from_array(x, follow=True)
        v = BlockArray.zeros(x.shape, follow=True)
        chaos = Chaos(malleable_address, 5, kills=False)
        chaos.thread.start()
        n = 0
        while n < 30 or chaos.thread.is_alive():
            for fn in (stencil, copy_back):
                with apgas.finish():
                    for p in apgas.places():
                        apgas.async_at(p, fn, u, v)
            n += 1
        chaos.thread.join()
        result = u.gather()
        u.free()
        v.free()
        return result, n, chaos.done

    result, n, done = apgas.run(main, places=2)
    np.testing.assert_array_equal(result, reference(n))
    assert len(done) == 6 and not any(": error" in d for d in done), done


def test_a_place_list_read_before_a_shrink_says_what_happened(malleable_address):
    def main():
        apgas.define_malleable_handler(Newest())
        stale = apgas.places()
        order(malleable_address, "shrink 1")
        with pytest.raises(apgas.MultipleException) as caught:
            with apgas.finish():
                for p in stale:
                    apgas.async_at(p, time.sleep, 0)
        return [str(e) for e in caught.value.exceptions]

    errors = apgas.run(main, places=3)
    assert any("has left (shrink)" in e and "apgas.steps" in e for e in errors), errors


def test_steps_say_what_was_wrong(malleable_address):
    def main():
        for bad, kind, text in [
            (dict(n=-1), ValueError, "n must be an integer >= 0, got -1"),
            (dict(n=3, start=4), ValueError, "start 4 is beyond n 3"),
            (dict(n=3, commit_every=1.5), ValueError, "commit_every must be an integer"),
            (dict(n=3, arrays=[np.zeros(3)]), TypeError, "arrays must be a list of apgas.arrays"),
            (dict(n=3, state=[1]), TypeError, "state must be a dict"),
            (dict(n=3, checkpoint="ckpt", checkpoint_mode="fast"), ValueError,
             "checkpoint_mode must be one of parallel, gathered"),
        ]:
            with pytest.raises(kind, match=text):
                apgas.steps(**bad)
        with pytest.raises(apgas.ApgasError, match=r"state\['lock'\] cannot be pickled"):
            for step in apgas.steps(2, state={"ok": 1, "lock": threading.Lock()}):
                with step:
                    pass
        with pytest.raises(apgas.ApgasError, match="was not run: write the loop's body"):
            for _step in apgas.steps(2):
                pass
        with pytest.raises(KeyError, match="mine"):  # a program's own error ends the loop as is
            for step in apgas.steps(3):
                with step:
                    raise KeyError("mine")
        indices = [step.index for step in apgas.steps(3, start=1) if step.__enter__()
                   and not step.__exit__(None, None, None)]
        assert indices == [1, 2]
        with pytest.raises(apgas.ApgasError, match="call it after the step"):
            for step in apgas.steps(1):
                with step:
                    apgas.disable_malleable_handler()

        def elsewhere():
            try:
                apgas.steps(1)
            except apgas.ApgasError as e:
                return str(e)
            return "no error"

        return apgas.at(1, elsewhere)

    assert ("apgas.steps: malleability is steered from place 0, where orders are carried out; "
            "this is place 1") in apgas.run(main, places=2)


def test_a_call_back_to_place_0_inside_a_step_never_waits_for_an_order(malleable_address):
    """A task calls ``at(0, ...)`` while an order waits for the step: the call is part
    of the step's computation and must not wait for the order (which waits for it)."""
    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.zeros((8,), follow=True)
        lines: list[str] = []
        ref = apgas.GlobalRef(lines)
        shrink = threading.Thread(target=order, args=(malleable_address, "shrink 1"))

        def report() -> None:
            time.sleep(0.3)  # the shrink is waiting for the step by now
            me = apgas.here().id
            apgas.at(ref.home, lambda: ref.get().append(f"from {me}"))

        for step in apgas.steps(2, arrays=[a]):
            with step:
                if step.index == 0:
                    shrink.start()
                with apgas.finish():
                    for p in apgas.places():
                        apgas.async_at(p, report)
        shrink.join(30)
        a.free()
        return sorted(lines), [p.id for p in apgas.places()]

    lines, live = apgas.run(main, places=3)
    assert lines == ["from 0", "from 0", "from 1", "from 1", "from 2"]
    assert live == [0, 1]


def test_a_stopped_place_is_lost_by_its_silence_and_rolled_back(malleable_address, monkeypatch):
    monkeypatch.setenv("APGAS_HEARTBEAT", "0.2:2")  # silent for 2 s: lost
    x = np.arange(90.0)

    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.from_array(x, follow=True, resilient=True)
        pid = apgas.at(2, os.getpid)
        indices = []
        try:
            for step in apgas.steps(8, commit_every=2, arrays=[a]):
                with step:
                    indices.append(step.index)
                    if step.index == 5 and not step.rolled_back and 2 in [p.id for p in apgas.places()]:
                        os.kill(pid, signal.SIGSTOP)
                    one_iteration(a)
            return a.gather(), indices, [p.id for p in apgas.places()]
        finally:
            a.free()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    result, indices, live = apgas.run(main, places=3)
    np.testing.assert_array_equal(result, x + 8)
    assert indices == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7], indices
    assert live == [0, 1]
