"""The wire's pickling: the C pickler's fast path writes exactly what cloudpickle would."""

from __future__ import annotations

import os
import sys
import types

import cloudpickle
import numpy as np
import pytest

from apgas._core import serialization as ser


def module_function(x: int = 0) -> int:
    return x + 1


PLAIN = [
    (module_function, (), {}),
    (module_function, (1, 2.5, "x", b"y", None, True, 3j), {"k": 3}),
    (True, None),
    (False, "text"),
    ({1: 2, 3: 4}, {}, []),  # a finish report: per-place counts
    (os.getpid, (), {}),  # a module's builtin: by name
    (abs, (-1,), {}),
]
GENERAL = [
    (lambda: 1, (), {}),  # by value
    (module_function, ((1, (2, 3)),), {}),  # deeper than the fast path looks
    (module_function, (np.arange(3),), {}),
    ({1: [2]}, {}, [ValueError("x")]),  # a report with an exception
]


@pytest.mark.parametrize("obj", PLAIN + GENERAL[1:], ids=repr)
def test_the_bytes_are_cloudpickles(obj):
    body, *buffers = ser.dumps(obj)
    if not buffers:
        assert bytes(body) == cloudpickle.dumps(obj, protocol=5)
    assert repr(ser.loads(body, buffers)) == repr(obj)


@pytest.mark.parametrize("obj", PLAIN, ids=repr)
def test_plain_messages_take_the_fast_path(obj):
    assert ser._plain(obj)


@pytest.mark.parametrize("obj", [*GENERAL, ([].append, (1,), {})], ids=repr)
def test_others_take_cloudpickle(obj):  # a builtin bound to an object: the object goes too
    assert not ser._plain(obj)


def test_a_main_function_is_sent_by_value():
    main = types.ModuleType("__main__")
    exec("def f():\n    return 42\n", main.__dict__)
    fn = main.f
    assert fn.__module__ == "__main__"
    assert not ser._plain((fn, (), {}))
    body, *buffers = ser.dumps((fn, (), {}))
    assert b"__main__\x94\x8c\x01f" not in bytes(body)  # not a reference to __main__.f
    assert ser.loads(body, buffers)[0]() == 42


def test_registering_a_module_by_value_is_seen_at_once(tmp_path, monkeypatch):
    (tmp_path / "byvalue_mod.py").write_text("def g():\n    return 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import byvalue_mod

    try:
        assert ser._plain((byvalue_mod.g, (), {}))  # cached as saved by name
        cloudpickle.register_pickle_by_value(byvalue_mod)
        assert not ser._plain((byvalue_mod.g, (), {}))
        body, *buffers = ser.dumps((byvalue_mod.g, (), {}))
        # cloudpickle's bytes by value, but for the file name it keeps (not <dynamic-code>)
        assert b"<dynamic-code>" in cloudpickle.dumps((byvalue_mod.g, (), {}), protocol=5)
        assert b"<dynamic-code>" not in bytes(body)
        clone = ser.loads(body, buffers)[0]
        assert clone is not byvalue_mod.g and clone() == 7
        assert clone.__code__.co_filename == str(tmp_path / "byvalue_mod.py")
    finally:
        cloudpickle.unregister_pickle_by_value(byvalue_mod)
        sys.modules.pop("byvalue_mod", None)

