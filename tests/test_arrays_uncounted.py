"""Writes to a followed array by tasks that no finish waits for, while orders re-spread it
(issue 53, item 2): each write is kept or fails with a clear error, never lost in silence."""

from __future__ import annotations

import random
import threading

import pytest
from orders import Newest, order

import apgas
from apgas.arrays import BlockArray, _blocks
from apgas.arrays._layout import even

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_scheduler")]

ROWS = 48


class Acks:
    """At place 0: the writes' answers (None, or the error a write raised), by row."""

    def __init__(self, n: int) -> None:
        self.errors: dict[int, str | None] = {}
        self.n = n
        self.lock = threading.Lock()
        self.all_in = threading.Event()
        self.inside = threading.Event()  # a write is under way (row -1)

    def answer(self, i: int, error: str | None) -> None:
        if i < 0:
            self.inside.set()
            return
        with self.lock:
            self.errors[i] = error
            if len(self.errors) == self.n:
                self.all_in.set()


def _answer(ref: apgas.GlobalRef[Acks], i: int, error: str | None) -> None:
    ref.get().answer(i, error)


def put(a: BlockArray, i: int, ref: apgas.GlobalRef[Acks]) -> None:
    """An uncounted task, as a user writes one: write row i here, say how it went."""
    error = None
    try:
        with a.writing(i) as row:
            row[0] = i + 1.0
    except apgas.ApgasError as e:
        error = str(e)
    apgas.uncounted_async_at(0, _answer, ref, i, error)


def writes_racing_a_shrink(address, a: BlockArray, seed: int) -> dict[int, str | None]:
    """Write every row of ``a`` with uncounted tasks, each sent to the row's owner; a
    shrink order comes after the write of a row chosen by ``seed``. The writes' errors."""
    acks = Acks(ROWS)
    ref = apgas.GlobalRef(acks)
    when = random.Random(seed).randrange(ROWS)
    shrink = threading.Thread(target=order, args=(address, "shrink 1"))
    try:
        for i in range(ROWS):
            if i == when:
                shrink.start()
            owner = next(pid for pid, start, stop in a.layout if start <= i < stop)
            try:
                apgas.uncounted_async_at(owner, put, a, i, ref)
            except apgas.DeadPlaceError as e:  # the owner left meanwhile: clear as well
                acks.answer(i, str(e))
        shrink.join()
        assert acks.all_in.wait(60), f"answers for {len(acks.errors)} of {ROWS} writes"
    finally:
        ref.free()
    return acks.errors


def check_round(a: BlockArray, errors: dict[int, str | None]) -> int:
    """Every write that answered without an error is in the array; every error is clear.
    Returns the number of errors."""
    got = a.gather()
    for i, error in errors.items():
        if error is None:
            assert got[i] == i + 1.0, (i, got[i])
        else:
            assert ("array (0," in error and "re-spread over the places by an order" in error) \
                or ("left" in error and "shrink" in error), error
    return sum(e is not None for e in errors.values())


def rounds(address, seeds: range) -> list[int]:
    """Per seed: grow 1, then writes racing a shrink 1; the errors of each round."""
    apgas.define_malleable_handler(Newest())
    counts = []
    for seed in seeds:
        assert order(address, "grow 1 nodeA")[0].startswith("ok")
        a = BlockArray.zeros(ROWS, follow=True)
        errors = writes_racing_a_shrink(address, a, seed)
        assert a.layout == even(ROWS, [p.id for p in apgas.places()])
        counts.append(check_round(a, errors))
        a.free()
    return counts


def test_uncounted_writes_racing_shrinks_are_kept_or_fail_clearly(malleable_address):
    counts = apgas.run(lambda: rounds(malleable_address, range(20)), places=2)
    assert len(counts) == 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_uncounted_writes_racing_shrinks_long(malleable_address):
    counts = apgas.run(lambda: rounds(malleable_address, range(100, 300)), places=2)
    assert len(counts) == 200


def wait_for_the_move_then_write(a: BlockArray, i: int, ref: apgas.GlobalRef[Acks]) -> None:
    """Inside writing(): tell place 0, wait until a re-spread waits for this write, write."""
    with a.writing(i) as row:
        apgas.uncounted_async_at(0, _answer, ref, -1, None)
        e = _blocks.entry(a.id)
        with _blocks._moved:
            moving = _blocks._moved.wait_for(lambda: e.moving, 60)
        row[0] = 7.0 if moving else -1.0
    apgas.uncounted_async_at(0, _answer, ref, i, None)


def test_a_shrink_waits_for_a_write_under_way_and_keeps_it(malleable_address):
    def main():
        apgas.define_malleable_handler(Newest())
        a = BlockArray.zeros(9, follow=True)
        acks = Acks(1)
        ref = apgas.GlobalRef(acks)
        apgas.uncounted_async_at(2, wait_for_the_move_then_write, a, 8, ref)
        assert acks.inside.wait(60)
        reply = order(malleable_address, "shrink 1")
        assert not reply[0].startswith("error"), reply
        assert acks.all_in.wait(60)
        ref.free()
        assert a.layout == even(9, [0, 1])
        got = a.gather()
        a.free()
        return got

    got = apgas.run(main, places=3)
    assert got[8] == 7.0 and not got[:8].any()  # written during the move, now at place 1


def local_in_an_uncounted_task(a: BlockArray, ref: apgas.GlobalRef[Acks]) -> None:
    try:
        a.local()[0] = 1.0
        error = None
    except apgas.ApgasError as e:
        error = str(e)
    apgas.uncounted_async_at(0, _answer, ref, 0, error)


def test_local_of_a_followed_array_in_an_uncounted_task_says_to_use_writing():
    def main():
        a = BlockArray.zeros(4, follow=True)
        acks = Acks(1)
        ref = apgas.GlobalRef(acks)
        apgas.uncounted_async_at(1, local_in_an_uncounted_task, a, ref)
        assert acks.all_in.wait(60)
        ref.free()
        with apgas.finish():  # inside a finish local() is the block, as ever
            apgas.async_at(1, lambda: a.local().__setitem__(0, 2.0))
        got = a.gather()
        a.free()
        return acks.errors[0], got

    error, got = apgas.run(main, places=2)
    assert "local() in a task that no finish waits for" in error and "a.writing(rows)" in error
    assert error.startswith("BlockArray(id=(0, ") and list(got) == [0, 0, 2, 0]


def test_writing_names_the_array_when_the_rows_are_elsewhere():
    def main():
        a = BlockArray.zeros(4, follow=True)
        with pytest.raises(apgas.ApgasError, match=r"array \(0, \d+\) .*writing rows 3:4, which are not"):
            with a.writing(3):
                pass
        with a.writing(slice(0, 2)) as rows:
            rows[:] = 5.0
        with pytest.raises(IndexError):
            a.writing(4)
        got = a.gather()
        a.free()
        return got

    assert list(apgas.run(main, places=2)) == [5, 5, 0, 0]
