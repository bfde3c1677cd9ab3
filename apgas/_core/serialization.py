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
import linecache
import os
import pickle
import types
from collections import ChainMap
from collections.abc import Sequence
from typing import Any, cast

import cloudpickle
from cloudpickle import cloudpickle as _cp

__all__ = ["dumps", "dumps_call", "unpicklable", "loads", "OOB_MIN_BYTES"]

#: buffers smaller than this are pickled in band (a separate frame costs more)
OOB_MIN_BYTES = 64 * 1024


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_NESTING = 2  # (fn, (args...), {kwargs}): the arguments sit two levels down
_BY_REFERENCE_MAX = 4096
_by_reference: dict[types.FunctionType, bool] = {}  # functions cloudpickle saves by name
#: cloudpickle's registry of modules pickled by value, as it was when ``_by_reference`` was filled
_by_value_modules: frozenset[str] | None = None


def _saved_by_reference(fn: types.FunctionType) -> bool:
    """Whether cloudpickle saves ``fn`` by its module and name (cached per function)."""
    global _by_value_modules
    registered: set[str] | frozenset[str] = getattr(_cp, "_PICKLE_BY_VALUE_MODULES", frozenset())
    # register_pickle_by_value changes the answers; compared by content, not size: one
    # module registered as another leaves it is a change of the same size
    if registered != _by_value_modules:
        _by_reference.clear()
        _by_value_modules = frozenset(registered)
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
    if kind is types.BuiltinFunctionType:  # os.getpid, abs: by name, unless bound to an object
        return obj.__self__ is None or type(obj.__self__) is types.ModuleType
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


def _code_reduce(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object (a function of ``__main__``, a lambda,
    a closure), keeping its file name. cloudpickle writes ``<dynamic-code>`` in its
    place (for payloads alike wherever the code was defined), so a remote traceback
    read ``File "<dynamic-code>", line 5``; with the file it names the user's file
    and line, and its source text when the file is there at the place too."""
    reduced = _cp._code_reduce(code)
    try:
        make, args = reduced
        at = next(i for i, a in enumerate(args) if isinstance(a, str) and a == "<dynamic-code>")
    except (TypeError, ValueError, StopIteration):  # another cloudpickle: its reduction as it is
        return reduced
    args = (*args[:at], code.co_filename, *args[at + 1:])
    lines = _unfiled_source(code.co_filename)
    if lines is None:
        return make, args
    return _code_with_source, (make, args, code.co_filename, lines)


_UNFILED_MAX = 1024  # file names remembered as on disk or not
_on_disk: dict[str, bool] = {}


def _unfiled_source(filename: str) -> tuple[str, ...] | None:
    """The source lines of a file that exists only in ``linecache`` (a notebook cell,
    an IPython input), which a place cannot read; None for a file on disk."""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) < 3:
        return None
    on_disk = _on_disk.get(filename)
    if on_disk is None:
        if len(_on_disk) >= _UNFILED_MAX:
            _on_disk.clear()
        on_disk = _on_disk[filename] = os.path.exists(filename)
    return None if on_disk else tuple(entry[2])


def _code_with_source(make: Any, args: tuple[Any, ...], filename: str,
                      lines: tuple[str, ...]) -> types.CodeType:
    """Unpickle a code object of a cell, and give the place the cell's text, so that a
    traceback made there shows the lines (``linecache``: kept, never checked on disk)."""
    if filename not in linecache.cache:
        linecache.cache[filename] = (sum(map(len, lines)), None, list(lines), filename)
    return cast(types.CodeType, make(*args))


class _Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]
    """cloudpickle's pickler, with the code objects' file names kept (:func:`_code_reduce`)."""

    dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.CloudPickler.dispatch_table)


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
    _Pickler(out, protocol=5, buffer_callback=keep_large).dump(obj)
    return [out.getbuffer(), *buffers]


def loads(body: Any, buffers: Sequence[Any] = ()) -> Any:
    return pickle.loads(body, buffers=buffers)


def dumps_call(call: str, place: int, fn: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> list[bytes | memoryview]:
    """:func:`dumps` of ``(fn, args, kwargs)``; if that fails, the error names the call
    (``apgas.at(place 1, use)``) and what could not be pickled (:func:`unpicklable`).
    Each part is tried alone only then: no cost when the call pickles."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as e:
        parts = [("the function", fn), *((f"argument {i}", a) for i, a in enumerate(args, 1)),
                 *((f"keyword argument {k}", v) for k, v in kwargs.items())]
        part, value = next(((part, v) for part, v in parts if not _pickles(v)),
                           ("its arguments together", None))
        raise unpicklable(e, f"{call}(place {place}, {function_name(fn)})", part, value) from e


def unpicklable(error: Exception, call: str, part: str, value: Any) -> Exception:
    """``error`` (which pickling ``value``, ``part`` of ``call``, raised) said again as
    ``apgas.at(place 1, use): argument 1 (a _thread.lock) cannot be pickled: <error>``.

    The same for an argument and for a value returned (``part`` ``its return value``).
    The exception is of ``error``'s type (TypeError, pickle.PicklingError...) if that
    type takes a message alone; otherwise ``error`` itself, the message as a note."""
    kind = "" if value is None else f" (a {type_name(value)})"
    message = f"{call}: {part}{kind} cannot be pickled: {error}"
    try:
        said = type(error)(message)
        if str(said) == message:
            return said
    except Exception:
        pass
    error.add_note(message)
    return error


def _pickles(value: Any) -> bool:
    try:
        dumps(value)
        return True
    except Exception:
        return False


def function_name(fn: Any) -> str:
    """``use``, ``Solver.step``; ``repr`` of a callable without a qualified name."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else repr(fn)


def type_name(value: Any) -> str:
    """``_thread.lock``, ``int``: the type's qualified name, its module unless builtins."""
    kind = type(value)
    module = getattr(kind, "__module__", "builtins")
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
