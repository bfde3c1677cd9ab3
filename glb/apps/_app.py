"""The shape every GLB benchmark application has, so one CLI drives them all.

Each application module (``glb.apps.uts`` and so on) defines ``APP``, an
:class:`App`. Bags and results follow the ``glb`` protocols and must pickle.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["App", "Params"]

#: an application's parameters, from its ``params``: JSON-able, the same at every place
Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class App:
    name: str
    #: adds the application's own options (``--depth``, ``-n`` ...) to a parser
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: the parsed namespace -> a JSON-able dict of parameters (validated, clear errors)
    params: Callable[[argparse.Namespace], Params]
    #: params -> the bag holding all the work (for ``compute_dynamic``)
    make_bag: Callable[[Params], Any]
    #: params, worker index, worker count -> that worker's share (``compute_static``)
    make_static_bag: Callable[[Params, int, int], Any]
    #: params -> the neutral result
    make_result: Callable[[Params], Any]
    #: params -> the result computed by the kernel alone on one core, no runtime
    sequential: Callable[[Params], Any]
    #: a result -> the JSON value printed and stored (an int for UTS and N-Queens)
    value: Callable[[Any], Any]
    #: a result -> units of work done (nodes, solutions searched, sources, samples)
    units: Callable[[Any], int]
    #: params, value -> True/False against a known reference, or None if there is none
    check: Callable[[Params, Any], bool | None]
    #: compiles (or loads from the on-disk cache) every kernel; returns seconds taken
    warm_up: Callable[[], float]
    #: what a unit is, for the throughput line ("nodes", "samples" ...)
    unit_name: str = "units"
    #: GLB's ``n`` (units per ``process`` call) unless ``--n`` says otherwise
    default_n: int = 511
