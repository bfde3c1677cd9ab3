"""A client's request line, parsed within bounds.

A request is one JSON object on one line (``{"op": "status"}``). Whoever can
reach the scheduler's port can send one, so :func:`parse_request` refuses,
before ``json`` sees it: a line over :data:`MAX_REQUEST` bytes, and nesting
deeper than :data:`MAX_DEPTH` (counted without recursion, so a 200,000-deep
array is refused quickly instead of ending in a RecursionError); and while
parsing: ``Infinity``, ``NaN``, a number too big for a float (``1e400``) and
integers of more than :data:`MAX_DIGITS` digits. Each refusal is a
:class:`RequestError` (a ValueError) that says what was wrong. The values in
the object are checked by whoever uses them (``parse_job`` for a job).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

__all__ = ["parse_request", "RequestError", "MAX_REQUEST", "MAX_DEPTH", "MAX_DIGITS"]

MAX_REQUEST = 1 << 20
"""Bytes in one request line, its newline not counted."""
MAX_DEPTH = 32
"""Arrays and objects nested in each other, the request's own object counted."""
MAX_DIGITS = 64
"""Digits of an integer in a request (ids and node counts need a handful)."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class RequestError(ValueError):
    """A request line that is refused; the message says why."""


def parse_request(line: str | bytes, *, max_bytes: int = MAX_REQUEST,
                  max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object on ``line``; RequestError (a ValueError) saying what is wrong."""
    if isinstance(line, (bytes, bytearray)):
        if len(line) > max_bytes:
            raise RequestError(f"request of {len(line)} bytes; at most {max_bytes} are taken")
        try:
            text = bytes(line).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(f"request is not UTF-8 (byte {e.start})") from None
    elif isinstance(line, str):
        size = len(line) if len(line) > max_bytes else len(line.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise RequestError(f"request of {size} bytes; at most {max_bytes} are taken")
        text = line
    else:
        raise TypeError(f"a request line is str or bytes, got {type(line).__name__}")
    text = text.strip()
    if not text:
        raise RequestError("empty request; expected a JSON object such as {\"op\": \"status\"}")
    depth = nesting(text)
    if depth > max_depth:
        raise RequestError(f"request nested deeper than {max_depth} levels (arrays and objects "
                           f"within each other: {depth})")
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RequestError:
        raise
    except RecursionError:  # not expected after the depth check; never a traceback though
        raise RequestError(f"request nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"request is not valid JSON: {e.msg} at column {e.colno}") from None
    except ValueError as e:  # e.g. Python's limit on the digits of an int
        raise RequestError(f"request is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise RequestError(f"a request is a JSON object such as {{\"op\": \"status\"}}, "
                           f"got a JSON {type(value).__name__}")
    return value


def nesting(text: str) -> int:
    """How deeply arrays and objects nest in the JSON ``text`` (0: a scalar).

    Brackets inside strings do not count; no recursion, and the work is done by
    ``re`` and ``itertools`` (a megabyte of brackets takes milliseconds). For
    text that is not JSON the number is a guess, and ``json`` refuses the text."""
    brackets = _BRACKET.findall(_STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _constant(name: str) -> Any:
    raise RequestError(f"request carries {name}; only finite numbers are taken")


def _float(word: str) -> float:
    value = float(word)
    if not math.isfinite(value):
        raise RequestError(f"request carries the number {_cut(word)}, too big for a float; "
                           "only finite numbers are taken")
    return value


def _int(word: str) -> int:
    digits = len(word.lstrip("-"))
    if digits > MAX_DIGITS:
        raise RequestError(f"request carries an integer of {digits} digits ({_cut(word)}); "
                           f"at most {MAX_DIGITS} are taken")
    return int(word)


def _cut(word: str, limit: int = 40) -> str:
    return word if len(word) <= limit else f"{word[:limit]}..."
