"""The constructs of docs/design.md, section 2 over real place processes."""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest

import apgas
from apgas import DeadPlaceError, MultipleException, RemoteError

pytestmark = pytest.mark.timeout(60)

# --- task functions (module level: they pickle by reference) ---------------------
_counter = 0
_lock = threading.Lock()


def bump(n: int = 1) -> None:
    global _counter
    with _lock:
        _counter += n


def take_count() -> int:
    global _counter
    with _lock:
        value, _counter = _counter, 0
    return value


def total_count() -> int:
    return sum(apgas.at(p, take_count) for p in apgas.places())


def spawn_tree(depth: int, fanout: int) -> None:
    """Each task bumps its place's counter and spawns ``fanout`` children round the places."""
    bump()
    if depth == 0:
        return
    ps = apgas.places()
    me = ps.index(apgas.here())
    for i in range(fanout):
        apgas.async_at(ps[(me + i + 1) % len(ps)], spawn_tree, depth - 1, fanout)


def append_home(ref: apgas.GlobalRef, make_value) -> None:
    """Compute a value here, append it to the list ``ref`` points to at its home."""
    value = make_value()
    apgas.at(ref.home, lambda: ref.get().append(value))


def tree_size(depth: int, fanout: int) -> int:
    return sum(fanout ** d for d in range(depth + 1))


# --- tests ---------------------------------------------------------------------
def test_hello_on_four_places():
    def main():
        seen = []
        ref = apgas.GlobalRef(seen)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, append_home, ref, lambda: (apgas.here().id, os.getpid()))
        return apgas.places(), seen

    places, seen = apgas.run(main, places=4)
    assert [p.id for p in places] == [0, 1, 2, 3]
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3]
    assert len({pid for _, pid in seen}) == 4  # four processes
    assert dict(seen)[0] == os.getpid()


def test_nested_finish_three_levels_exact_count():
    def main():
        with apgas.finish():
            apgas.async_at(apgas.place(1), spawn_tree, 3, 3)
        return total_count()

    assert apgas.run(main, places=4) == tree_size(3, 3)


def test_finish_inside_remote_task_waits_for_its_own_tasks():
    def inner() -> int:
        with apgas.finish():  # a finish whose home is place 2
            for p in apgas.places():
                apgas.async_at(p, spawn_tree, 2, 2)
        return 1

    def main():
        n = apgas.at(apgas.place(2), inner)
        return n, total_count()

    assert apgas.run(main, places=3) == (1, 3 * tree_size(2, 2))


def test_ten_thousand_tasks_one_finish():
    def main():
        ps = apgas.places()
        with apgas.finish():
            for i in range(10_000):
                apgas.async_at(ps[i % 4], bump)
        return total_count()

    assert apgas.run(main, places=4, threads=2) == 10_000


def test_async_local_and_run_waits_for_unfinished_tasks():
    def main():
        for _ in range(10):
            apgas.async_(bump)
            apgas.async_at(apgas.place(1), bump)
        # no finish: run() itself waits

    apgas.run(main, places=2)
    assert take_count() == 10


def test_at_returns_values_and_raises_the_remote_exception():
    def main():
        assert apgas.at(apgas.place(1), lambda: apgas.here().id) == 1
        assert apgas.at(apgas.place(0), lambda x: x * 2, 21) == 42
        with pytest.raises(ZeroDivisionError) as info:
            apgas.at(apgas.place(2), lambda: 1 / 0)
        notes = "\n".join(info.value.__notes__)
        assert "raised at place 2" in notes and "remote traceback" in notes
        assert "ZeroDivisionError" in info.value.remote_traceback
        return apgas.at(apgas.place(1), apgas.at, apgas.place(2), apgas.at, apgas.place(0), os.getpid)

    assert apgas.run(main, places=3) == os.getpid()


def test_nested_at_does_not_starve_a_single_worker():
    def ping(depth: int) -> int:
        if depth == 0:
            return apgas.here().id
        target = apgas.place(1 - apgas.here().id)
        return apgas.at(target, ping, depth - 1)

    assert apgas.run(lambda: apgas.at(apgas.place(1), ping, 6), places=2, threads=1) == 1


def test_global_ref_round_trip():
    def main():
        obj = {"a": 1}
        ref = apgas.GlobalRef(obj)
        back = apgas.at(apgas.place(2), lambda r: r, ref)
        assert back == ref and back.home == apgas.here()
        assert back.get() is obj
        with pytest.raises(apgas.ApgasError, match="dereferenced at place 1"):
            apgas.at(apgas.place(1), ref.get)
        assert apgas.at(apgas.place(1), lambda: apgas.at(ref.home, lambda: ref.get()["a"])) == 1

    apgas.run(main, places=3)


def test_place_local_one_instance_per_place():
    def main():
        handle = apgas.PlaceLocal.make(apgas.places(), lambda: {"place": apgas.here().id, "items": []})
        assert len(pickle.dumps(handle)) < 100  # travels as its id
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, lambda: handle.get()["items"].append(apgas.here().id))
        return [apgas.at(p, lambda: handle.get()) for p in apgas.places()]

    got = apgas.run(main, places=3)
    assert got == [{"place": i, "items": [i]} for i in range(3)]


def test_place_local_missing_at_a_place():
    def main():
        handle = apgas.PlaceLocal.make([apgas.place(1)], list)
        assert apgas.at(apgas.place(1), handle.get) == []
        with pytest.raises(apgas.ApgasError, match="no instance at place 2"):
            apgas.at(apgas.place(2), handle.get)

    apgas.run(main, places=3)


def test_hundred_megabyte_array_round_trip():
    def main():
        data = np.random.default_rng(7).random(100 * 2**20 // 8)
        back = apgas.at(apgas.place(1), lambda a: (a * 2, float(a.sum())), data)
        return data, back

    data, (doubled, remote_sum) = apgas.run(main, places=2)
    assert doubled.shape == data.shape and np.array_equal(doubled, data * 2)
    assert remote_sum == float(data.sum())


def fail_here(kind: str) -> None:
    raise {"value": ValueError, "key": KeyError}[kind](f"failed at {apgas.here().id}")


def test_exceptions_from_every_place_are_collected():
    def main():
        with pytest.raises(MultipleException) as info:
            with apgas.finish():
                for p in apgas.places():
                    apgas.async_at(p, fail_here, "value")
                    apgas.async_at(p, fail_here, "key")
                    apgas.async_at(p, bump)
        return info.value, total_count()

    group, ok = apgas.run(main, places=4)
    assert ok == 4
    assert len(group.exceptions) == 8
    assert sorted(type(e).__name__ for e in group.exceptions) == ["KeyError"] * 4 + ["ValueError"] * 4
    for e in group.exceptions:
        place_id = int(str(e).strip("'").rsplit(" ", 1)[1])
        assert f"raised at place {place_id} " in e.__notes__[0]
        assert "pid " in e.__notes__[0] and "host " in e.__notes__[0]


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_unpicklable() -> None:
    raise Unpicklable("cannot travel")


def test_unpicklable_exception_arrives_as_stand_in():
    def main():
        with pytest.raises(MultipleException) as info:
            with apgas.finish():
                apgas.async_at(apgas.place(1), raise_unpicklable)
        with pytest.raises(RemoteError) as direct:
            apgas.at(apgas.place(1), raise_unpicklable)
        return info.value.exceptions, direct.value

    (standin,), direct = apgas.run(main, places=2)
    for e in (standin, direct):
        assert isinstance(e, RemoteError)
        assert e.type_name == "Unpicklable" and e.message == "cannot travel"
        assert "raise_unpicklable" in e.remote_traceback
        assert "raised at place 1" in e.__notes__[0]


def test_body_exception_joins_the_group():
    def main():
        with pytest.raises(MultipleException) as info:
            with apgas.finish():
                apgas.async_at(apgas.place(1), fail_here, "key")
                raise RuntimeError("body")
        return sorted(type(e).__name__ for e in info.value.exceptions)

    assert apgas.run(main, places=2) == ["KeyError", "RuntimeError"]


def test_main_exception_propagates_from_run():
    with pytest.raises(LookupError, match="from main"):
        apgas.run(lambda: (_ for _ in ()).throw(LookupError("from main")), places=2)


def test_unknown_place_raises_dead_place_error_at_once():
    def main():
        for bad in (7, apgas.Place(9, "x")):
            with pytest.raises(DeadPlaceError, match="no such place"):
                apgas.async_at(bad, bump)
        with pytest.raises(DeadPlaceError):
            apgas.at(5, bump)
        with pytest.raises(DeadPlaceError):
            apgas.place(3)
        with pytest.raises(TypeError, match="expected a Place"):
            apgas.async_at("one", bump)

    apgas.run(main, places=2)


def test_uncounted_and_immediate_tasks_run():
    def main():
        done = threading.Event()
        ref = apgas.GlobalRef(done)
        apgas.uncounted_async_at(apgas.place(1), lambda: apgas.immediate_async_at(
            ref.home, lambda: ref.get().set()))
        return done.wait(10)

    assert apgas.run(main, places=2) is True


def test_constructs_outside_run_say_so():
    with pytest.raises(apgas.NotRunningError, match="apgas.run"):
        apgas.here()
    with pytest.raises(apgas.NotRunningError):
        apgas.async_at(0, bump)


def test_runs_one_after_another_in_one_process():
    for n in (1, 2, 3):
        assert apgas.run(lambda: len(apgas.places()), places=n) == n
