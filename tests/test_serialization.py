"""The wire's pickling: the C pickler's fast path writes exactly what cloudpickle would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

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


def case_id(obj) -> str:
    """``repr(obj)`` without addresses (``<function module_function>``): pytest-xdist runs
    the tests only if every worker collected the same ids, and an address differs from
    process to process (``Different tests were collected between gw0 and gw1``)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


@pytest.mark.parametrize("obj", PLAIN + GENERAL[1:], ids=case_id)
def test_the_bytes_are_cloudpickles(obj):
    body, *buffers = ser.dumps(obj)
    if not buffers:
        assert bytes(body) == cloudpickle.dumps(obj, protocol=5)
    assert repr(ser.loads(body, buffers)) == repr(obj)


@pytest.mark.parametrize("obj", PLAIN, ids=case_id)
def test_plain_messages_take_the_fast_path(obj):
    assert ser._plain(obj)


@pytest.mark.parametrize("obj", [*GENERAL, ([].append, (1,), {})], ids=case_id)
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


def parametrized_ids() -> list[str]:
    """The ids of this module's parametrized tests, as pytest makes them."""
    ids = []
    for name, test in sorted(globals().items()):
        for mark in getattr(test, "pytestmark", ()):
            if mark.name == "parametrize":
                make = mark.kwargs.get("ids", repr)
                ids += [f"{name}[{make(value)}]" for value in mark.args[1]]
    return ids


def test_another_process_collects_the_same_ids():
    """Each pytest-xdist worker collects the suite itself; the run stops at collection,
    every test unrun, unless all collected the same ids (with ``ids=repr``, a function's
    address: ``module_function at 0x7f9883f0b7e0`` here, ``...0x7f47d5c94680`` there)."""
    here = Path(__file__).resolve()
    code = (f"import json, sys; sys.path.insert(0, {str(here.parent)!r}); "
            f"import {here.stem} as t; print(json.dumps(t.parametrized_ids()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=here.parent.parent, timeout=60, check=True).stdout
    ids = parametrized_ids()
    assert len(ids) == len(PLAIN + GENERAL[1:]) + len(PLAIN) + len(GENERAL) + 1
    assert json.loads(out) == ids


def test_a_module_registered_as_another_leaves_is_seen(tmp_path, monkeypatch):
    """The cache of functions saved by name is dropped when cloudpickle's registry of
    modules pickled by value changes, also when its size does not: one module is
    registered in the call that takes another off."""
    (tmp_path / "byvalue_a.py").write_text("def g():\n    return 7\n")
    (tmp_path / "byvalue_b.py").write_text("def h():\n    return 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import byvalue_a
    import byvalue_b

    message = (byvalue_a.g, (), {})
    registered = [byvalue_b]
    cloudpickle.register_pickle_by_value(byvalue_b)
    try:
        assert ser._plain(message)  # cached as saved by name
        cloudpickle.unregister_pickle_by_value(byvalue_b)
        registered = []
        cloudpickle.register_pickle_by_value(byvalue_a)
        registered = [byvalue_a]
        assert not ser._plain(message)  # cloudpickle now saves it by value
        body, *buffers = ser.dumps(message)
        assert b"byvalue_a\x94\x8c\x01g" not in bytes(body)  # not a reference to byvalue_a.g
        clone = ser.loads(body, buffers)[0]
        assert clone is not byvalue_a.g and clone() == 7
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop("byvalue_a", None)
        sys.modules.pop("byvalue_b", None)
