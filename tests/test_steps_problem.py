"""A step checkpoint of another problem is refused, naming what differs (issue 53,
item 3): the same program with another constant, other code or other input data
once resumed a directory it had not written and returned a wrong result.

The programs are a user's: ``apgas.run`` of a main that makes a followed, resilient
array and runs ``apgas.steps(..., checkpoint=DIR)``; a first run stops after a few
steps (as if killed), the second is the one that must refuse or resume."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import apgas
from apgas.arrays import BlockArray, at_each

pytestmark = pytest.mark.timeout(90)


def add(a: BlockArray, k: float) -> None:
    a.local()[...] += k


def program(folder, k: float, data, stop: int | None = None, key: str | None = None):
    """``a`` starts as the input ``data`` (a file) and gets ``k`` added each step; a
    run that ``stop``s early (an argument, as what steers a run and not the problem)."""
    main = main_of(folder, k, data, key)
    return lambda: main(stop)


def main_of(folder, k: float, data, key: str | None):
    def main(stop: int | None):
        a = BlockArray.from_array(np.load(data), follow=True, resilient=True)
        named = {"checkpoint_key": key} if key else {}
        for step in apgas.steps(8, commit_every=2, arrays=[a], checkpoint=folder, **named):
            with step:
                at_each(apgas.places(), add, a, k)
            if step.index == stop:
                break
        result = a.gather()
        a.free()
        return result
    return main


def other_code(folder, k: float, data):
    def main():  # the same, but for a step that adds k twice
        a = BlockArray.from_array(np.load(data), follow=True, resilient=True)
        for step in apgas.steps(8, commit_every=2, arrays=[a], checkpoint=folder):
            with step:
                at_each(apgas.places(), add, a, k * 2)
        a.free()
    return main


def locked(folder, data):
    lock = threading.Lock()  # does not pickle: no fingerprint tells it apart

    def main():
        a = BlockArray.from_array(np.load(data), follow=True, resilient=True)
        for step in apgas.steps(2, arrays=[a], checkpoint=folder):
            with step, lock:
                at_each(apgas.places(), add, a, 1.0)
        a.free()
    return main


def refusal(main) -> str:
    with pytest.raises(apgas.ApgasError, match="holds a commit of another problem") as e:
        apgas.run(main, places=2)
    return str(e.value)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.npy"
    np.save(path, np.arange(40.0).reshape(20, 2))
    return path


def test_a_commit_of_another_constant_code_or_input_is_refused_naming_it(tmp_path, data):
    folder = tmp_path / "ckpt"
    apgas.run(program(folder, 8.0, data, stop=4), places=2)
    said = refusal(program(folder, 5.0, data))
    assert "the value of 'k' differs" in said and "checkpoint_key" in said, said
    assert "the step function's code differs" in refusal(other_code(folder, 8.0, data))
    np.save(data, np.arange(40.0).reshape(20, 2) + 1)
    said = refusal(program(folder, 8.0, data))
    assert "): the initial array 'a' differs. Use another" in said, said  # that alone
    np.save(data, np.arange(40.0).reshape(20, 2))
    result = apgas.run(program(folder, 8.0, data), places=3)  # the same problem resumes
    np.testing.assert_array_equal(result, np.arange(40.0).reshape(20, 2) + 64)


def test_a_key_names_the_problem_where_values_cannot(tmp_path, data, apgas_caplog):
    folder = tmp_path / "ckpt"
    apgas.run(program(folder, 8.0, data, stop=2, key="k=8"), places=2)
    assert "the key differs: 'k=8' vs 'k=5'" in refusal(program(folder, 5.0, data, key="k=5"))
    result = apgas.run(program(folder, 8.0, data, key="k=8"), places=2)
    np.testing.assert_array_equal(result, np.arange(40.0).reshape(20, 2) + 64)
    apgas.run(locked(tmp_path / "other", data), places=1)
    warned = [r.getMessage() for r in apgas_caplog.records if "cannot be told" in r.getMessage()]
    assert warned and "'lock'" in warned[0] and 'checkpoint_key="..."' in warned[0], warned
