"""UTS trees: their types and shapes, the sample trees and their published sizes, and
a tree from parameters (validated, errors that name the option).

The trees of the UTS distribution (Olivier et al., LCPC 2006: uts.c, uts.h,
rng/brg_sha1.c), node for node. SHA-1 is the splittable random number
generator: the root's digest is SHA-1(16 zero bytes + seed as 4 big-endian
bytes); child i of a node is SHA-1(node digest + i as 4 big-endian bytes); a
node's random value v is the low 31 bits of digest bytes 16..19 (big-endian)
and u = v / 2^31. The root has height 0, a child the height of its parent + 1.
How many children a node at height h has:

- ``geo`` (uts.c type 1): floor(log(1 - u) / log(1 - 1/(1 + b_h))), geometric
  with mean b_h. b_h = b0 at the root; below it the shape gives it from b0,
  h and the depth limit d (gen_mx): ``linear`` b0 (1 - h/d), ``expdec``
  b0 h^(-log b0 / log d), ``cyclic`` b0^sin(2 pi h / d) (0 beyond 5 d),
  ``fixed`` b0 below d, else 0. A node with b_h = 0 has no children.
- ``bin`` (type 0): the root has floor(b0) children; any other node has m
  children if u < q, else none. There is no depth limit.
- ``hybrid`` (type 2): geometric while h < 0.5 d, binomial below.

Every count but a binomial root's is capped at 100 (MAXNUMCHILDREN). The
root counts as a node, so the result is the tree size as uts.c prints it;
:data:`PUBLISHED` holds the sizes of the distribution's sample trees
(sample_trees.sh) and :data:`REFERENCE` those of the seed-19 geometric
fixed b0 = 4 trees by depth.

This module is plain Python: :mod:`.kernel` counts the nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._app import Params

__all__ = ["Tree", "TREES", "PUBLISHED", "REFERENCE", "SMALL_TREES", "TYPES", "SHAPES", "KEYS",
           "tree_of", "published"]

TYPES = ("bin", "geo", "hybrid")                      # uts.c tree types 0, 1, 2
SHAPES = ("linear", "expdec", "cyclic", "fixed")      # uts.c geometric shapes 0..3
BIN, GEO, HYBRID = 0, 1, 2
LINEAR, EXPDEC, CYCLIC, FIXED = 0, 1, 2, 3
MAX_CHILDREN = 100           # uts.h MAXNUMCHILDREN: only a binomial root may have more
SHIFT_DEPTH = 0.5            # hybrid trees turn binomial at height shiftDepth * d
MAX_DEPTH = 30
MAX_B0 = 1_000_000           # a binomial root has floor(b0) children, all in one bag
MAX_SEED = (1 << 32) - 1     # the seed is hashed as 4 bytes

DEFAULT_TYPE, DEFAULT_SHAPE, DEFAULT_B0, DEFAULT_DEPTH = "geo", "fixed", 4.0, 13
DEFAULT_Q, DEFAULT_M = 15.0 / 64.0, 4                 # uts.c's nonLeafProb and nonLeafBF
REFERENCE_SEED = 19

#: published node counts of the geometric fixed b0 = 4 trees of seed 19 (depth -> nodes)
REFERENCE = {1: 6, 2: 65, 5: 3_987, 8: 257_042, 9: 1_031_269, 10: 4_130_071, 11: 16_526_523,
             12: 66_106_929, 13: 264_459_392, 14: 1_057_675_516, 15: 4_230_646_601}


@dataclasses.dataclass(frozen=True)
class Tree:
    """One UTS tree: ``type`` and the parameters it uses (the others are None)."""

    type: str = DEFAULT_TYPE
    shape: str | None = DEFAULT_SHAPE   # geo, hybrid
    b0: float = DEFAULT_B0
    depth: int | None = DEFAULT_DEPTH   # the depth limit gen_mx: geo, hybrid
    q: float | None = None              # bin, hybrid
    m: int | None = None                # bin, hybrid
    seed: int = REFERENCE_SEED

    def params(self) -> Params:
        """The JSON form: only the parameters this type of tree uses."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _geo(shape: str, b0: float, depth: int, seed: int) -> Tree:
    return Tree("geo", shape, b0, depth, None, None, seed)


#: the UTS distribution's sample trees (sample_trees.sh) and their published sizes
TREES = {
    "T1": _geo("fixed", 4.0, 10, 19),
    "T5": _geo("linear", 4.0, 20, 34),
    "T2": _geo("cyclic", 6.0, 16, 502),
    "T3": Tree("bin", None, 2000.0, None, 0.124875, 8, 42),
    "T4": Tree("hybrid", "linear", 6.0, 16, 0.234375, 4, 1),
    "T1L": _geo("fixed", 4.0, 13, 29),
    "T2L": _geo("cyclic", 7.0, 23, 220),
    "T3L": Tree("bin", None, 2000.0, None, 0.200014, 5, 7),
}
PUBLISHED = {"T1": 4_130_071, "T5": 4_147_582, "T2": 4_117_769, "T3": 4_112_897, "T4": 4_132_453,
             "T1L": 102_181_082, "T2L": 96_793_510, "T3L": 111_345_631}
SMALL_TREES = ("T1", "T2", "T3", "T4", "T5")


# -- the tree from parameters ----------------------------------------------------------------

KEYS = ("type", "shape", "b0", "depth", "q", "m", "seed")
_USES = {"bin": {"type", "b0", "q", "m", "seed"},
         "geo": {"type", "shape", "b0", "depth", "seed"},
         "hybrid": set(KEYS)}


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def tree_of(params: Params) -> Tree:
    """The tree ``params`` describe, validated; errors name the option and the value.

    ``{"tree": "T3"}`` is a named sample tree (other keys must agree with it);
    otherwise missing keys take the defaults (a geometric fixed tree, b0 4,
    depth 13, seed 19; q 15/64 and m 4 for binomial parts), and a key the
    type does not use is refused.
    """
    unknown = set(params) - set(KEYS) - {"tree"}
    if unknown:
        raise ValueError(f"UTS has no parameter {sorted(unknown)[0]!r}; it knows tree, "
                         + ", ".join(KEYS))
    if params.get("tree") is not None:
        name = params["tree"]
        if name not in TREES:
            raise ValueError(f"unknown UTS tree --tree {name!r}: choose from {', '.join(TREES)}")
        tree = TREES[name]
        for key in set(params) - {"tree"}:
            if params[key] != getattr(tree, key):
                raise ValueError(f"--tree {name} has --{key} {getattr(tree, key)}, got --{key} "
                                 f"{params[key]!r}: a named tree fixes all its parameters")
        return tree
    kind = params.get("type", DEFAULT_TYPE)
    if kind not in TYPES:
        raise ValueError(f"UTS --type must be one of {', '.join(TYPES)}, got {kind!r}")
    for key in set(params) - _USES[kind]:
        if params[key] is not None:
            raise ValueError(f"UTS --{key} {params[key]} does not apply to --type {kind} "
                             f"(it uses {', '.join('--' + k for k in KEYS if k in _USES[kind])})")
    uses = _USES[kind]
    shape = params.get("shape", DEFAULT_SHAPE) if "shape" in uses else None
    b0 = params.get("b0", DEFAULT_B0)
    depth = params.get("depth", DEFAULT_DEPTH) if "depth" in uses else None
    q = params.get("q", DEFAULT_Q) if "q" in uses else None
    m = params.get("m", DEFAULT_M) if "m" in uses else None
    seed = params.get("seed", REFERENCE_SEED)
    if shape is not None and shape not in SHAPES:
        raise ValueError(f"UTS --shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    if not _is_real(b0) or not 0 < b0 <= MAX_B0:
        raise ValueError(f"UTS --b0 (branching factor) must be a number in (0, {MAX_B0}], got {b0!r}")
    if depth is not None and (not _is_int(depth) or not 1 <= depth <= MAX_DEPTH):
        raise ValueError(f"UTS --depth must be an integer from 1 to {MAX_DEPTH}, got {depth!r}")
    if q is not None and (not _is_real(q) or not 0.0 <= q <= 1.0):
        raise ValueError(f"UTS --q (probability of children) must be in [0, 1], got {q!r}")
    if m is not None and (not _is_int(m) or m < 0):
        raise ValueError(f"UTS --m (children of a binomial node) must be an integer >= 0, got {m!r}")
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"UTS --seed must be an integer from 0 to {MAX_SEED} (4 bytes), got {seed!r}")
    return Tree(kind, shape, float(b0), None if depth is None else int(depth),
                None if q is None else float(q), None if m is None else int(m), int(seed))


def published(params: Params) -> int | None:
    """The published size of the tree ``params`` describe, or None if there is none."""
    tree = tree_of(params)
    for name, named in TREES.items():
        if tree == named:
            return PUBLISHED[name]
    if tree.depth is not None and tree == _geo("fixed", 4.0, tree.depth, REFERENCE_SEED):
        return REFERENCE.get(tree.depth)
    return None
