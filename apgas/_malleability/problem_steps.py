"""What defines the problem of an ``apgas.steps`` loop with ``checkpoint=DIR``, so that a
commit of another problem is never resumed (issue 53): ``n`` and the arrays' shapes
and dtypes say too little (the same program with another constant has them all).

The *fingerprint* is a dict of parts, each a label and a digest, kept in each
commit's manifest and compared at a resume; a part that differs is named:

- ``the step function's code``: the code object of the function that runs the loop
  (its bytecode, constants and names, nested code included; not its line numbers);
- ``the value of 'NAME'``: each global it loads and each value its closure holds:
  a function of its own module by its code and values in turn, a module, class or
  function of elsewhere by its name, data by a canonical form (sets sorted, arrays
  by dtype, shape and bytes), anything else by its pickle;
- ``the initial array 'NAME'``: a hash of the listed arrays' rows as the program
  made them, before a resume overwrites them (each place hashes its own rows; the
  sum does not depend on how many places hold them);
- ``the initial state['KEY']``: each value of ``state`` as the program made it.

A value that cannot be told (it does not pickle) is left out, with a warning that
names it and says to pass ``checkpoint_key``, which replaces the fingerprint: it
names the problem, and a key that differs is refused. Arguments of the function
are no part of it (most are the directory, the places, ``commit_every``): a key
names those that define the problem.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._core.refs import GlobalRef
from .._core.runtime import TASK, Finish, current

__all__ = ["UNKNOWN", "KEY", "code_parts", "array_parts", "state_parts", "local_names", "differences"]

log = logging.getLogger("apgas.steps")
UNKNOWN = "?"  # a part no digest can tell: never compared
CODE = "the step function's code"
KEY = "the key"
_LOADS = {"LOAD_GLOBAL", "LOAD_NAME"}
_MASK = (1 << 64) - 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


# -- code and values ---------------------------------------------------------------------
def _code_bytes(code: types.CodeType) -> Iterator[bytes]:
    yield code.co_code
    yield repr(code.co_names).encode()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_bytes(const)
        else:
            yield _canonical(const)


def _globals_loaded(code: types.CodeType) -> list[str]:
    """The global names ``code`` (and the code nested in it) loads, in order, once each."""
    import dis
    names = [i.argval for i in dis.get_instructions(code) if i.opname in _LOADS]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _globals_loaded(const)
    return list(dict.fromkeys(names))


def _canonical(value: Any) -> bytes:
    """Bytes that are the same for equal data in any process (no hash seed in them);
    ValueError for a value that does not pickle."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}".encode()
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}[".encode() + b",".join(map(_canonical, value)) + b"]"
    if isinstance(value, dict):
        return b"dict{" + b",".join(_canonical(k) + b":" + _canonical(v) for k, v in value.items()) + b"}"
    if isinstance(value, (set, frozenset)):
        return b"set{" + b",".join(sorted(map(_canonical, value))) + b"}"
    if callable(getattr(value, "_steps_commit", None)):  # an apgas.arrays.BlockArray
        return f"array:{tuple(value.shape)}:{value.dtype}".encode()
    if hasattr(value, "__array_interface__") and hasattr(value, "tobytes"):  # numpy
        return f"ndarray:{value.dtype}:{value.shape}:".encode() + _sha(value.tobytes()).encode()
    try:
        return pickle.dumps(value, protocol=5)
    except Exception as e:
        raise ValueError(f"{type(value).__name__} does not pickle: {e}") from None


def _value(value: Any, home: dict[str, Any], seen: set[int]) -> bytes:
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}".encode()
    if isinstance(value, types.FunctionType) and value.__globals__ is home:
        if id(value) in seen:
            return f"function:{value.__qualname__}".encode()
        seen.add(id(value))
        cells = [c.cell_contents for c in value.__closure__ or () if _full(c)]
        used = [home[n] for n in _globals_loaded(value.__code__) if n in home]
        return b"".join([*_code_bytes(value.__code__), *(_value(v, home, seen) for v in used + cells)])
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}".encode()
    return _canonical(value)


def _full(cell: Any) -> bool:
    """Whether a closure's cell holds a value yet (a name assigned later does not)."""
    try:
        return cell.cell_contents is not cell
    except ValueError:
        return False


def code_parts(frame: types.FrameType) -> dict[str, str]:
    """The parts of the function running in ``frame``: its code, and the globals it
    loads and its closure's values, as they are now."""
    code, home = frame.f_code, frame.f_globals
    parts = {CODE: _sha(b"".join(_code_bytes(code)))}
    named = {n: home[n] for n in _globals_loaded(code) if n in home}
    named.update((n, frame.f_locals[n]) for n in code.co_freevars if n in frame.f_locals)
    for name, value in named.items():
        try:
            parts[f"the value of {name!r}"] = _sha(_value(value, home, set()))
        except (ValueError, RecursionError) as e:
            parts[f"the value of {name!r}"] = UNKNOWN
            log.warning("apgas.steps: the value of %r (%s) cannot be told from another's, so a "
                        "commit of a problem that differs in it would be resumed: pass "
                        "checkpoint_key=\"...\" naming the problem (the values it depends on)",
                        name, e)
    return parts


def state_parts(state: dict[str, Any] | None) -> dict[str, str]:
    parts = {}
    for key, value in (state or {}).items():
        try:
            parts[f"the initial state[{key!r}]"] = _sha(_canonical(value))
        except ValueError:
            parts[f"the initial state[{key!r}]"] = UNKNOWN  # the first commit says why
    return parts


# -- the arrays' rows, hashed where they are -----------------------------------------------
def _mix(z: Any) -> Any:
    """splitmix64's finalizer, on an array of uint64 (wrapping)."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


def block_hash(a: Any) -> int:
    """At a place: the sum over this place's rows of a mix of each 8-byte word and its
    global position, mod 2^64. Summed over the places, it is the same for the same rows
    however they are spread."""
    import numpy as np
    rows, block = a.rows(), a.local()
    if not len(rows):
        return 0
    raw = np.ascontiguousarray(block).view(np.uint8).reshape(len(rows), -1)
    if raw.shape[1] % 8:
        raw = np.pad(raw, ((0, 0), (0, -raw.shape[1] % 8)))
    words = raw.view("<u8").reshape(-1)
    first = rows.start * (raw.shape[1] // 8)
    total = 0
    for lo in range(0, len(words), 1 << 20):
        chunk = words[lo:lo + (1 << 20)]
        pos = np.arange(first + lo, first + lo + len(chunk), dtype=np.uint64)
        total += int(_mix(chunk + pos * np.uint64(0x9E3779B97F4A7C15)).sum(dtype=np.uint64))
    return total & _MASK


def array_parts(arrays: Sequence[Any], names: Callable[[int, Any], str]) -> dict[str, str]:
    """The initial arrays' parts; ``names(k, a)`` says what the program calls array k."""
    parts = {}
    for k, a in enumerate(arrays):
        if not all(hasattr(a, name) for name in ("layout", "rows", "local")):
            parts[f"the initial array {names(k, a)}"] = UNKNOWN  # not a BlockArray's face
            continue
        held = [pid for pid, start, stop in a.layout if stop > start]
        parts[f"the initial array {names(k, a)}"] = f"{_hash_at(held, a):016x}"
    return parts


def _hash_at(place_ids: list[int], a: Any) -> int:
    """The sum of ``block_hash(a)`` at the places, hashed at all of them at once."""
    sums: list[int] = []
    ref = GlobalRef(sums)
    try:
        with Finish():
            for pid in place_ids:
                current().spawn(pid, _hash_and_reply, (ref, a), {}, TASK)
    finally:
        ref.free()
    return sum(sums) & _MASK


def _hash_and_reply(ref: GlobalRef[list[int]], a: Any) -> None:
    value = block_hash(a)
    current().spawn(ref.home, _add, (ref, value), {}, TASK)


def _add(ref: GlobalRef[list[int]], value: int) -> None:
    ref.get().append(value)


def local_names(frame: types.FrameType, arrays: Sequence[Any]) -> Callable[[int, Any], str]:
    """Array k as the program calls it (its local or global name), else ``k``."""
    found = {id(v): n for n, v in {**frame.f_globals, **frame.f_locals}.items()
             if any(v is a for a in arrays)}
    return lambda k, a: repr(found[id(a)]) if id(a) in found else str(k)


# -- comparing ------------------------------------------------------------------------------
def differences(there: dict[str, str] | None, here: dict[str, str]) -> list[str]:
    """What differs between a commit's fingerprint and this loop's, in words."""
    if there is None:
        return []  # a commit of a version that kept none: checked by n, shapes, dtypes
    if (KEY in there) != (KEY in here):
        which = (f"the key {there[KEY]!r}" if KEY in there else "no key") + " there, " + \
                (f"the key {here[KEY]!r}" if KEY in here else "no key") + " here"
        return [f"the problem is named differently: {which}"]
    out = []
    for label in dict.fromkeys([*there, *here]):
        a, b = there.get(label), here.get(label)
        if label == KEY and a != b:
            out.append(f"the key differs: {a!r} vs {b!r}")
        elif a is None or b is None:
            out.append(f"{label} is {'here' if a is None else 'there'} only")
        elif a != b and UNKNOWN not in (a, b):
            out.append(f"{label} differs")
    return out
