"""Pickling for the wire: protocol 5, cloudpickle for closures and ``__main__``.

Large buffers (numpy arrays) travel out of band as their own frames, so an
array is neither copied into the pickle stream nor out of it.

Most messages are a module-level function with a few numbers, or a reply
such as ``(True, None)``. For those (:func:`_plain`) the C pickler writes
exactly the bytes cloudpickle would, five times faster: cloudpickle's
per-object hook is what costs, and it would decline every object there.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Sequence
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

__all__ = ["dumps", "loads", "OOB_MIN_BYTES"]

#: buffers smaller than this are pickled in band (a separate frame costs more)
OOB_MIN_BYTES = 64 * 1024


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_NESTING = 2  # (fn, (args...), {kwargs}): the arguments sit two levels down
_BY_REFERENCE_MAX = 4096
_by_reference: dict[types.FunctionType, bool] = {}  # functions cloudpickle saves by name
_by_value_modules = -1  # size of cloudpickle's registry of modules pickled by value, when cached


def _saved_by_reference(fn: types.FunctionType) -> bool:
    """Whether cloudpickle saves ``fn`` by its module and name (cached per function)."""
    global _by_value_modules
    registered = len(getattr(_cp, "_PICKLE_BY_VALUE_MODULES", ()))
    if registered != _by_value_modules:  # register_pickle_by_value changes the answers
        _by_reference.clear()
        _by_value_modules = registered
    if fn in _by_reference:
        return True
    try:
        by_name = bool(_cp._should_pickle_by_reference(fn))
    except Exception:  # another cloudpickle: take the general path
        return False
    if by_name and len(_by_reference) < _BY_REFERENCE_MAX:
        _by_reference[fn] = True
    return by_name


def _plain(obj: Any, depth: int = _NESTING) -> bool:
    """True if the C pickler writes ``obj`` as cloudpickle would: scalars, and
    tuples, lists and dicts of them (nested up to ``depth``) and of functions saved by name."""
    kind = type(obj)
    if kind in _SCALARS:
        return True
    if kind is types.FunctionType:
        return _saved_by_reference(obj)
    if not depth:
        return False
    if kind is tuple or kind is list:
        for item in obj:
            if not _plain(item, depth - 1):
                return False
        return True
    if kind is dict:
        for key, value in obj.items():
            if not (_plain(key, 0) and _plain(value, depth - 1)):
                return False
        return True
    return False


def dumps(obj: Any) -> list[bytes | memoryview]:
    """Return ``[body, *buffers]``: the pickle stream and its out-of-band buffers."""
    if _plain(obj):
        return [pickle.dumps(obj, 5)]
    buffers: list[memoryview] = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OOB_MIN_BYTES:
            return True  # in band
        buffers.append(view)
        return False

    out = io.BytesIO()
    cloudpickle.CloudPickler(out, protocol=5, buffer_callback=keep_large).dump(obj)
    return [out.getbuffer(), *buffers]


def loads(body: Any, buffers: Sequence[Any] = ()) -> Any:
    return pickle.loads(body, buffers=buffers)
