"""The pieces of an ElastiSim input that :mod:`.elastisim_jobs` reads before the jobs:
the formulas of application models (the part of exprtk that job models use, as
ElastiSim substitutes arguments into them) and the platform's compute nodes.

A ``cpu`` task's ``flops`` formula is computed by replacing each job argument's
name in its text by its value (``Utility::applyArguments``: names in sorted order,
values as ``std::to_string`` prints them, so a float has six decimals), then
``num_nodes`` by the job's node count, and evaluating the result (exprtk)."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import operator
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

__all__ = ["ElastiSimInputError", "Platform", "read_platform", "evaluate", "argument_text",
           "substitute", "at_nodes", "stoi", "show"]


class ElastiSimInputError(ValueError):
    """An ElastiSim input that cannot be read, or whose jobs our simulator
    cannot represent; the message names the file, the job and the value."""


def show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- formulas (the part of exprtk that job models use) --------------------------------------

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.Mod: math.fmod}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min, "max": max, "abs": abs, "sqrt": math.sqrt, "exp": math.exp, "log": math.log,
    "log2": math.log2, "log10": math.log10, "floor": math.floor, "ceil": math.ceil,
    "pow": math.pow}


def evaluate(text: str, where: str = "formula") -> float:
    """The value of an exprtk formula made of numbers, ``+ - * / % ^`` (``^`` is a
    power, taken as Python's ``**``), parentheses and ``min max abs sqrt exp log log2 log10 floor ceil pow``:
    what ElastiSim's job models use. Anything else (a name left unreplaced, say)
    raises :class:`ElastiSimInputError` naming ``where`` and the text, as
    ElastiSim stops with "Performance model ... not valid"."""
    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ElastiSimInputError(f"{where}: {show(text)} is not a formula") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
                and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _FUNCTIONS and not node.keywords and node.args:
            return float(_FUNCTIONS[node.func.id](*(value(a) for a in node.args)))
        if isinstance(node, ast.Name):
            raise ElastiSimInputError(f"{where}: {text!r} has the name {node.id!r}, which is "
                                      "neither a job argument nor num_nodes")
        raise ElastiSimInputError(f"{where}: {text!r} uses {ast.unparse(node)!r}, which this "
                                  "reader does not evaluate")

    try:
        result = value(tree.body)
    except ElastiSimInputError:
        raise
    except (ArithmeticError, ValueError, TypeError, RecursionError) as e:
        raise ElastiSimInputError(f"{where}: {show(text)} cannot be evaluated ({e})") from None
    if not math.isfinite(result):
        raise ElastiSimInputError(f"{where}: {text!r} is {result}")
    return result


def argument_text(value: Any, where: str) -> str:
    """An argument's value as ElastiSim writes it into formulas (``readStringMap``)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ElastiSimInputError(f"{where} is {show(value)}: ElastiSim takes strings and "
                                  "numbers only")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ElastiSimInputError(f"{where} is {value}")
        return f"{value:f}"  # std::to_string(double): "%f"
    return str(value)


def substitute(text: str, arguments: Mapping[str, str]) -> str:
    """``Utility::applyArguments``: each argument's name replaced by its value, the
    names in sorted order (a std::map), wherever the name occurs in the text."""
    for name in sorted(arguments):
        value = arguments[name]
        text = re.sub(name, lambda _m: value, text)  # noqa: B023 (used at once)
    return text


def at_nodes(text: str, nodes: int) -> str:
    """``Utility::evaluateFormula``'s substitutions (no GPUs: ``num_gpus*`` are 0)."""
    text = re.sub("num_nodes", str(nodes), text)
    text = re.sub("num_gpus_per_node", "0", text)
    return re.sub("num_gpus", "0", text)


def stoi(text: str, where: str) -> int:
    """``std::stoi``: the leading integer of ``text``; none is ElastiSim's crash."""
    m = re.match(r"\s*([+-]?\d+)", text)
    if not m:
        raise ElastiSimInputError(f"{where}: {text!r} does not start with an integer "
                                  "(ElastiSim reads it with std::stoi)")
    return int(m.group(1))


# -- the platform ------------------------------------------------------------------------------

_SPEED_UNITS = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                "Z": 1e21, "Y": 1e24}
_SPEED_WORDS = {"kilo": "k", "mega": "M", "giga": "G", "tera": "T", "peta": "P", "exa": "E",
                "zetta": "Z", "yotta": "Y"}
_SPEED = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*\Z")


@dataclasses.dataclass(frozen=True)
class Platform:
    """The compute nodes of a SimGrid platform as ElastiSim sees them: every host
    that is not the batch system's or a PFS host."""

    nodes: int
    speed: float  # flop/s of one node (one core: a task is one activity)
    path: Path


def _speed(text: str, pstate: int, where: str) -> float:
    states = text.split(",")
    if not 0 <= pstate < len(states):
        raise ElastiSimInputError(f"{where}: pstate {pstate} of speed {text!r} does not exist")
    m = _SPEED.match(states[pstate])
    unit = m.group(2) if m else ""
    for word, prefix in _SPEED_WORDS.items():
        if unit.lower().startswith(word):
            unit = prefix + unit[len(word):]
    for suffix in ("flops", "f"):
        if unit.endswith(suffix):
            unit = unit[: -len(suffix)]
            break
    else:
        if unit:
            unit = "?"
    if not m or unit not in _SPEED_UNITS:
        raise ElastiSimInputError(f"{where}: speed {text!r} is not a SimGrid speed (a number "
                                  "with f, kf, Mf, Gf, Tf, ...)")
    return float(m.group(1)) * _SPEED_UNITS[unit]


def _radical(text: str, where: str) -> int:
    count = 0
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ElastiSimInputError(f"{where}: radical {text!r} is not a list of numbers "
                                      "and ranges a-b")
        count += 1 if m.group(2) is None else int(m.group(2)) - int(m.group(1)) + 1
    return count


def read_platform(path: str | PathLike[str]) -> Platform:
    """The compute nodes of the platform file ``path`` (``<host>``, ``<cluster>`` and
    ``<cabinet>`` elements, less those with the property ``batch_system`` or
    ``pfs_host``), which must all have the same speed."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise ElastiSimInputError(f"{path}: not a readable platform file ({e})") from None
    speeds: dict[float, int] = {}
    for element in root.iter():
        if element.tag not in ("host", "cluster", "cabinet"):
            continue
        props = {p.get("id"): p.get("value") for p in element.findall("prop")}
        if props.get("batch_system") == "true" or props.get("pfs_host") == "true":
            continue
        name = element.get("id", "?")
        where = f"{path}: {element.tag} {name!r}"
        text = element.get("speed")
        if text is None:
            raise ElastiSimInputError(f"{where} has no speed")
        try:
            pstate = int(element.get("pstate", "0"))
        except ValueError:
            raise ElastiSimInputError(f"{where}: pstate {element.get('pstate')!r} is not an "
                                      "integer") from None
        speed = _speed(text, pstate, where)
        if not speed > 0:
            raise ElastiSimInputError(f"{where}: a compute node of speed {text!r} never ends a task")
        count = 1 if element.tag == "host" else _radical(element.get("radical", ""), where)
        speeds[speed] = speeds.get(speed, 0) + count
    if not speeds:
        raise ElastiSimInputError(f"{path}: no compute hosts (every host is the batch "
                                  "system's or a PFS host)")
    if len(speeds) > 1:
        listed = ", ".join(f"{n} at {s:g} flop/s" for s, n in sorted(speeds.items()))
        raise ElastiSimInputError(f"{path}: compute nodes of different speeds ({listed}); our "
                                  "simulator's nodes are all alike")
    (speed, nodes), = speeds.items()
    return Platform(nodes, speed, path)
