"""Errors name what went wrong (issue 42, item 4): a value that cannot be pickled
names the call, the function and the argument (or the return value); a remote
traceback names the user's file and line, not cloudpickle's ``<dynamic-code>``."""

from __future__ import annotations

import pickle
import threading

import pytest

import apgas
import apgas.lowlevel
from apgas._core import serialization as ser

pytestmark = pytest.mark.timeout(60)

LOCK = "cannot pickle '_thread.lock' object"


def use(*args, **kwargs):
    return len(args) + len(kwargs)


def gives_a_lock():
    return threading.Lock()


def caught(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001  (the test looks at whatever it is)
        return e
    raise AssertionError("no error")


def test_unpicklable_arguments_and_values_name_the_call_the_function_and_which():
    def main():
        one = apgas.place(1)
        errors = {
            "positional": caught(lambda: apgas.at(one, use, 1, threading.Lock())),
            "keyword": caught(lambda: apgas.at(one, use, 1, guard=threading.Lock())),
            "result": caught(lambda: apgas.at(one, gives_a_lock)),
            "immediate": caught(lambda: apgas.lowlevel.immediate_at(1, use, threading.Lock())),
            "uncounted": caught(lambda: apgas.uncounted_async_at(one, use, threading.Lock())),
        }
        with pytest.raises(apgas.MultipleException) as multiple:
            with apgas.finish():  # the task is not counted: the finish ends
                apgas.async_at(one, use, threading.Lock())
        errors["async_at"] = multiple.value.exceptions[0]
        return errors, apgas.at(one, use, 1)  # the places are well after all that

    errors, after = apgas.run(main, places=2, threads=1)
    assert after == 1
    assert all(isinstance(e, TypeError) for e in errors.values()), errors
    assert str(errors["positional"]) == \
        f"apgas.at(place 1, use): argument 2 (a _thread.lock) cannot be pickled: {LOCK}"
    assert str(errors["keyword"]) == \
        f"apgas.at(place 1, use): keyword argument guard (a _thread.lock) cannot be pickled: {LOCK}"
    assert str(errors["result"]) == (f"apgas.at(place 1, gives_a_lock): its return value "
                                     f"(a _thread.lock) cannot be pickled: {LOCK}")
    assert "raised at place 1" in errors["result"].__notes__[0]
    assert str(errors["immediate"]).startswith(
        "apgas.lowlevel.immediate_at(place 1, use): argument 1 (a _thread.lock)")
    assert str(errors["uncounted"]).startswith(
        "apgas.uncounted_async_at(place 1, use): argument 1 (a _thread.lock)")
    assert str(errors["async_at"]).startswith(
        "apgas.async_at(place 1, use): argument 1 (a _thread.lock)")


def test_the_message_is_of_the_original_type_and_keeps_it_as_cause():
    with pytest.raises(TypeError, match=r"^apgas.at\(place 3, use\): argument 1 ") as raised:
        ser.dumps_call("apgas.at", 3, use, (threading.Lock(),), {})
    assert isinstance(raised.value.__cause__, TypeError) and str(raised.value.__cause__) == LOCK

    class Stubborn(pickle.PicklingError):
        def __init__(self):
            super().__init__("no")

    class Refuses:
        def __reduce__(self):
            raise Stubborn()

    with pytest.raises(Stubborn) as raised:  # cannot take a message: noted instead
        ser.dumps_call("apgas.at", 3, use, (), {"x": Refuses()})
    assert raised.value.__notes__ == [
        "apgas.at(place 3, use): keyword argument x (a test_error_messages."
        "test_the_message_is_of_the_original_type_and_keeps_it_as_cause.<locals>.Refuses) "
        "cannot be pickled: no"]


def test_a_function_that_cannot_be_pickled_is_named_as_such():
    lock = threading.Lock()

    def holds():
        return lock

    with pytest.raises(TypeError, match=r"\(place 1, test_a_function.*<locals>\.holds\): the function "
                                        r"\(a function\) cannot be pickled"):
        ser.dumps_call("apgas.at", 1, holds, (), {})


FAILS = """\
import apgas
import apgas.lowlevel


def fails_here(n):
    total = n + 1
    raise ValueError(f"bad {total}")


def main():
    return apgas.at(apgas.place(1), fails_here, 1)


apgas.run(main, places=2, threads=1)
"""


def test_a_remote_traceback_names_the_scripts_file_and_line(script, tmp_path):
    proc = script(FAILS)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "ValueError: bad 2" in err, err
    remote = err[err.index("remote traceback:"):]
    lines = (tmp_path / "prog.py").read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "raise ValueError" in text)
    assert f'File "{tmp_path / "prog.py"}", line {line}, in fails_here' in remote, err
    assert 'raise ValueError(f"bad {total}")' in remote, err  # the source line too
    assert "<dynamic-code>" not in err


def test_a_function_pickled_by_value_keeps_its_file_and_line():
    def local():
        return 1

    body, *buffers = ser.dumps(local)
    clone = ser.loads(body, buffers)
    assert clone.__code__.co_filename == __file__
    assert clone.__code__.co_firstlineno == local.__code__.co_firstlineno
