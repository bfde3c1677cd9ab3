"""UTS as a GLB application: its command-line options, parameters, check against the
published sizes and warm-up, gathered in :data:`APP` for ``python -m glb.apps uts``."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from .._app import App, Params
from .bag import NodeCount, make_bag, make_static_bag, sequential
from .trees import (
    DEFAULT_B0,
    DEFAULT_DEPTH,
    DEFAULT_M,
    DEFAULT_Q,
    DEFAULT_SHAPE,
    DEFAULT_TYPE,
    KEYS,
    MAX_B0,
    MAX_DEPTH,
    PUBLISHED,
    REFERENCE,
    REFERENCE_SEED,
    SHAPES,
    TREES,
    TYPES,
    published,
    tree_of,
)

__all__ = ["APP", "warm_up"]

log = logging.getLogger("glb.apps.uts")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", default=None, metavar="NAME",
                        help="a sample tree of the UTS distribution: " + ", ".join(
                            f"{name} ({PUBLISHED[name]:,} nodes)" for name in TREES)
                        + "; not with the options below")
    parser.add_argument("--type", default=None, choices=TYPES,
                        help=f"bin(omial), geo(metric) or hybrid (default {DEFAULT_TYPE})")
    parser.add_argument("--shape", default=None, choices=SHAPES,
                        help=f"geometric shape of b_h over the heights (default {DEFAULT_SHAPE})")
    parser.add_argument("--b0", type=float, default=None,
                        help=f"root branching factor, 0 < b0 <= {MAX_B0} (default {DEFAULT_B0:g})")
    parser.add_argument("--depth", type=int, default=None,
                        help=f"depth limit gen_mx of geo and hybrid trees, 1..{MAX_DEPTH} "
                             f"(default {DEFAULT_DEPTH}: 264 M nodes with the other defaults)")
    parser.add_argument("--q", type=float, default=None,
                        help=f"probability that a binomial node has children, 0..1 (default {DEFAULT_Q})")
    parser.add_argument("--m", type=int, default=None,
                        help=f"children of a binomial node that has any (default {DEFAULT_M})")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"root seed, 0..2^32-1 (default {REFERENCE_SEED})")


def _params(ns: argparse.Namespace) -> Params:
    given = {k: getattr(ns, k) for k in KEYS if getattr(ns, k, None) is not None}
    if ns.tree is not None:
        if ns.tree not in TREES:
            raise ValueError(f"unknown UTS tree --tree {ns.tree!r}: choose from {', '.join(TREES)}")
        if given:
            extra = " ".join(f"--{k} {v}" for k, v in given.items())
            raise ValueError(f"--tree {ns.tree} cannot be combined with {extra}: "
                             "a named tree fixes all its parameters")
        return {"tree": ns.tree, **TREES[ns.tree].params()}
    return tree_of(given).params()


def _check(params: Params, value: Any) -> bool | None:
    expected = published(params)
    return None if expected is None else value == expected


def warm_up() -> float:
    """Compile or load every kernel by counting a small tree both ways; seconds taken."""
    start = time.perf_counter()
    params = {"seed": REFERENCE_SEED, "depth": 5}
    if sequential(params).nodes != REFERENCE[5]:
        raise RuntimeError("the UTS kernel miscounts the reference tree (seed 19, depth 5)")
    make_static_bag(params, 0, 2)
    seconds = time.perf_counter() - start
    log.debug("UTS kernels ready in %.3f s", seconds)
    return seconds


APP = App(
    name="uts",
    add_arguments=_add_arguments,
    params=_params,
    make_bag=make_bag,
    make_static_bag=make_static_bag,
    make_result=lambda params: NodeCount(),
    sequential=sequential,
    value=lambda result: result.nodes,
    units=lambda result: result.nodes,
    check=_check,
    warm_up=warm_up,
    unit_name="nodes",
    # nodes per process call: about 0.6-1 ms of kernel between two checks for thieves. Each
    # call costs about 4 us of Python and dispatch, so 8192 (0.15-0.25 ms) lost 2-3% of
    # the kernel's time; a thief now waits at most one such call for its loot.
    default_n=32768,
)
