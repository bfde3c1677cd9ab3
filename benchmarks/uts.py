"""UTS: count the nodes of an Unbalanced Tree Search tree with GLB.

    python -m benchmarks uts [--tree T1..T5,T1L,T2L,T3L | --type {bin,geo,hybrid}
                              --shape {linear,expdec,cyclic,fixed} --b0 B --depth D
                              --q Q --m M --seed R] --places P --workers W

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

A bag is an explicit stack of nodes (five digest words and the height per
row, in one uint32 array), walked depth first by a numba kernel that releases
the GIL; the tree's parameters reach it as a tuple of scalars and a table of
log(1 - 1/(1 + b_h)) per height. Where every node of a height has b_h = 0
(heights >= d for ``fixed`` and ``linear``, > 5 d for ``cyclic``) their
parents count them without hashing them: the count is the same. SHA-1
digests are kept as their five big-endian words, so a child's message is the
parent's words, the index, and constant padding: one 64-byte block. Two facts
make the kernel cheap: the message schedule is GF(2)-linear, so the schedule
of a child is the parent's schedule XOR a precomputed table row of the index;
and the first five rounds only see the parent's words, so all siblings share
them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import time
from typing import Any, NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ._app import App

__all__ = ["APP", "UTSBag", "NodeCount", "Tree", "TREES", "PUBLISHED", "REFERENCE", "tree_size"]

log = logging.getLogger("benchmarks.uts")

TYPES = ("bin", "geo", "hybrid")                      # uts.c tree types 0, 1, 2
SHAPES = ("linear", "expdec", "cyclic", "fixed")      # uts.c geometric shapes 0..3
BIN, GEO, HYBRID = 0, 1, 2
LINEAR, EXPDEC, CYCLIC, FIXED = 0, 1, 2, 3
MAX_CHILDREN = 100           # uts.h MAXNUMCHILDREN: only a binomial root may have more
SHIFT_DEPTH = 0.5            # hybrid trees turn binomial at height shiftDepth * d
MAX_DEPTH = 30
MAX_B0 = 1_000_000           # a binomial root has floor(b0) children, all in one bag
MAX_SEED = (1 << 32) - 1     # the seed is hashed as 4 bytes
NEVER = 1 << 62              # a height no node reaches
EXPDEC_TABLE = 256           # expdec trees have no depth limit: heights past the table compute b_h
WORDS = 6                    # a stack row: digest words 0..4, then the height
INITIAL_ROWS = 1024

DEFAULT_TYPE, DEFAULT_SHAPE, DEFAULT_B0, DEFAULT_DEPTH = "geo", "fixed", 4.0, 13
DEFAULT_Q, DEFAULT_M = 15.0 / 64.0, 4                 # uts.c's nonLeafProb and nonLeafBF
REFERENCE_SEED = 19

#: published node counts of the geometric fixed b0 = 4 trees of seed 19 (depth -> nodes)
REFERENCE = {1: 6, 2: 65, 5: 3_987, 8: 257_042, 9: 1_031_269, 10: 4_130_071, 11: 16_526_523,
             12: 66_106_929, 13: 264_459_392, 15: 4_230_646_601}


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

    def params(self) -> dict:
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

_H0, _H1, _H2, _H3, _H4 = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0
_MASK = 0xFFFFFFFF
_PAD = 0x80000000            # the 1 bit that ends a SHA-1 message


# -- SHA-1 on int64 values holding 32-bit words ---------------------------------------------

@intrinsic
def _rotl32(typingctx, x, k):
    """Rotate the low 32 bits of ``x`` left by ``k``: one instruction, where numba's
    own shifts would widen to 64 bits and cost three."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        word = builder.trunc(args[0], i32)
        fshl = builder.module.declare_intrinsic("llvm.fshl", [i32], ir.FunctionType(i32, [i32] * 3))
        rotated = builder.call(fshl, [word, word, builder.trunc(args[1], i32)])
        return builder.zext(rotated, ir.IntType(64))

    return sig, codegen


@numba.njit(inline="always", cache=True)
def _word(w, q, t):
    """Schedule word ``t``: the parent's part XOR the index's part."""
    return np.int64(w[t] ^ q[t])


@numba.njit(cache=True, nogil=True)
def _schedule(w):
    """Expand the 16 message words ``w[0:16]`` into the 80 round words."""
    for t in range(16, 80):
        w[t] = _rotl32(np.int64(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]), 1)


@numba.njit(inline="always", cache=True)
def _rounds_0_4(w, a, b, c, d, e):
    """The first rounds of a child's block: they see only its parent's words."""
    for t in range(5):
        x = (_rotl32(a, 5) + ((b & c) | (~b & d)) + e + 0x5A827999 + np.int64(w[t])) & _MASK
        e = d
        d = c
        c = _rotl32(b, 30)
        b = a
        a = x
    return a, b, c, d, e


@numba.njit(inline="always", cache=True)
def _rounds_from(w, q, a, b, c, d, e, start):
    """Rounds ``start``..79 of a block whose schedule is ``w`` XOR ``q``; fully
    unrolled by LLVM, the state stays in registers."""
    for t in range(start, 20):
        x = (_rotl32(a, 5) + ((b & c) | (~b & d)) + e + 0x5A827999 + _word(w, q, t)) & _MASK
        e = d
        d = c
        c = _rotl32(b, 30)
        b = a
        a = x
    for t in range(20, 40):
        x = (_rotl32(a, 5) + (b ^ c ^ d) + e + 0x6ED9EBA1 + _word(w, q, t)) & _MASK
        e = d
        d = c
        c = _rotl32(b, 30)
        b = a
        a = x
    for t in range(40, 60):
        x = (_rotl32(a, 5) + ((b & c) | (d & (b | c))) + e + 0x8F1BBCDC + _word(w, q, t)) & _MASK
        e = d
        d = c
        c = _rotl32(b, 30)
        b = a
        a = x
    for t in range(60, 80):
        x = (_rotl32(a, 5) + (b ^ c ^ d) + e + 0xCA62C1D6 + _word(w, q, t)) & _MASK
        e = d
        d = c
        c = _rotl32(b, 30)
        b = a
        a = x
    return a, b, c, d, e


@numba.njit(inline="always", cache=True)
def _store(nodes, row, a, b, c, d, e, height):
    """Finish a digest (add the initial state) into stack row ``row``."""
    nodes[row, 0] = (_H0 + a) & _MASK
    nodes[row, 1] = (_H1 + b) & _MASK
    nodes[row, 2] = (_H2 + c) & _MASK
    nodes[row, 3] = (_H3 + d) & _MASK
    nodes[row, 4] = (_H4 + e) & _MASK
    nodes[row, 5] = height


@numba.njit(inline="always", cache=True)
def _index_schedule(w, i):
    """Into ``w``: the schedule of a block whose only nonzero word is word 5 = i."""
    for j in range(16):
        w[j] = 0
    w[5] = i
    _schedule(w)


@numba.njit(cache=True, nogil=True)
def _index_schedules():
    """Row i: the schedule of index i, for every index a capped count reaches."""
    q = np.zeros((MAX_CHILDREN + 1, 80), np.uint32)
    for i in range(MAX_CHILDREN + 1):
        _index_schedule(q[i], i)
    return q


# -- how many children: the tree's parameters in the kernel -----------------------------------

class _Kernel(NamedTuple):
    """A tree as the kernel sees it (plain scalars; numba types it as a tuple)."""

    geo_below: int       # heights below this are geometric, the others binomial
    leaf: int            # nodes at this height or deeper have no children (b_h = 0)
    root_children: int   # floor(b0) for a binomial root, else -1
    q: float
    m: int
    shape: int           # for geometric heights past the table (expdec only)
    b0: float
    depth: int


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _log_q(shape, b0, depth, height):
    """log(1 - p) of a geometric node at ``height``, p = 1 / (1 + b_h), computed as
    uts.c does it (``uts_numChildren_geo``), in doubles."""
    b = b0
    if height > 0:
        if shape == EXPDEC:
            b = b0 * math.pow(float(height), -math.log(b0) / math.log(float(depth)))
        elif shape == CYCLIC:
            if height > 5 * depth:
                b = 0.0
            else:
                b = math.pow(b0, math.sin(2.0 * 3.141592653589793 * float(height) / float(depth)))
        elif shape == FIXED:
            b = b0 if height < depth else 0.0
        else:
            b = b0 * (1.0 - float(height) / float(depth))
    p = 1.0 / (1.0 + b)
    return math.log(1.0 - p)      # -inf where b_h = 0: then every u gives 0 children


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _log_q_table(shape, b0, depth, size):
    table = np.empty(size, np.float64)
    for h in range(size):
        table[h] = _log_q(shape, b0, depth, h)
    return table


@numba.njit(inline="always", cache=True, error_model="numpy")
def _children(h4, height, t, log_q):
    """How many children a node with last digest word ``h4`` at ``height`` has."""
    u = (h4 & 0x7FFFFFFF) / 2147483648.0
    if height < t.geo_below:
        if height < log_q.shape[0]:
            lq = log_q[height]
        else:
            lq = _log_q(t.shape, t.b0, t.depth, height)
        x = math.log(1.0 - u) / lq
        if x >= MAX_CHILDREN:
            return np.int64(MAX_CHILDREN)
        return np.int64(math.floor(x))
    if height == 0 and t.root_children >= 0:
        return np.int64(t.root_children)
    if u < t.q:
        return np.int64(min(t.m, MAX_CHILDREN))
    return np.int64(0)


@numba.njit(inline="always", cache=True)
def _parent_block(nodes, row, w):
    """Load a child's message block, minus its index, and expand its schedule."""
    for j in range(5):
        w[j] = nodes[row, j]
    for j in range(5, 16):
        w[j] = 0
    w[6] = _PAD
    w[15] = 24 * 8                # message length in bits
    _schedule(w)


@numba.njit(inline="always", cache=True)
def _push_children(nodes, top, count, height, w, q, spare):
    """Hash children 0..count-1 of the block in ``w`` into rows top..top+count-1.
    Indexes past the table (a binomial root's) get their schedule in ``spare``."""
    a, b, c, d, e = _rounds_0_4(w, _H0, _H1, _H2, _H3, _H4)   # shared by the siblings
    for i in range(count):
        if i < q.shape[0]:
            ca, cb, cc, cd, ce = _rounds_from(w, q[i], a, b, c, d, e, 5)
        else:
            _index_schedule(spare, i)
            ca, cb, cc, cd, ce = _rounds_from(w, spare, a, b, c, d, e, 5)
        _store(nodes, top + i, ca, cb, cc, cd, ce, height)


@numba.njit(cache=True, nogil=True)
def _root(seed, q):
    """A one-row stack holding the root (height 0)."""
    nodes = np.zeros((1, WORDS), np.uint32)
    w = np.zeros(80, np.uint32)
    w[4] = seed
    w[5] = _PAD
    w[15] = 20 * 8
    _schedule(w)
    a, b, c, d, e = _rounds_from(w, q[0], _H0, _H1, _H2, _H3, _H4, 0)
    _store(nodes, 0, a, b, c, d, e, 0)
    return nodes


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _expand(nodes, top, limit, t, log_q, q):
    """Walk the stack ``nodes[:top]`` depth first until ``limit`` nodes are counted
    (at least one node is always expanded) or the stack is empty. A node whose
    children are at height ``t.leaf`` counts them with itself, unhashed.

    Returns (top, nodes counted, rows wanted); rows wanted > 0 means the next
    node's children do not fit: make room for that many more rows, call again.
    """
    w = np.zeros(80, np.uint32)
    spare = np.zeros(80, np.uint32)
    capacity = nodes.shape[0]
    counted = 0
    while top > 0:
        height = np.int64(nodes[top - 1, 5])
        count = _children(np.int64(nodes[top - 1, 4]), height, t, log_q)
        last = height + 1 >= t.leaf
        units = 1 + count if last else 1
        if counted > 0 and counted + units > limit:
            break
        if not last and top - 1 + count > capacity:
            return top, counted, count
        top -= 1
        counted += units
        if not last and count > 0:
            _parent_block(nodes, top, w)
            _push_children(nodes, top, count, height + 1, w, q, spare)
            top += count
    return top, counted, 0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _next_level(level, t, log_q, q):
    """All children of the rows of ``level`` (whose children are not leaves)."""
    total = 0
    for row in range(level.shape[0]):
        total += _children(np.int64(level[row, 4]), np.int64(level[row, 5]), t, log_q)
    out = np.zeros((total, WORDS), np.uint32)
    w = np.zeros(80, np.uint32)
    spare = np.zeros(80, np.uint32)
    top = 0
    for row in range(level.shape[0]):
        height = np.int64(level[row, 5])
        count = _children(np.int64(level[row, 4]), height, t, log_q)
        if count > 0:
            _parent_block(level, row, w)
            _push_children(out, top, count, height + 1, w, q, spare)
            top += count
    return out


_INDEX: np.ndarray | None = None   # built on first use: importing must not compile


def _index() -> np.ndarray:
    global _INDEX
    if _INDEX is None:
        _INDEX = _index_schedules()
    return _INDEX


@functools.lru_cache(maxsize=64)
def _kernel(tree: Tree) -> tuple[_Kernel, np.ndarray]:
    """The kernel's view of ``tree``: its scalars and its log(1 - p) table per height."""
    kind = TYPES.index(tree.type)
    shape = SHAPES.index(tree.shape) if tree.shape is not None else FIXED
    depth = tree.depth if tree.depth is not None else 1
    geo_below, leaf, size = 0, NEVER, 0
    if kind == GEO:
        geo_below = NEVER
        leaf = {FIXED: depth, LINEAR: depth, CYCLIC: 5 * depth + 1}.get(shape, NEVER)
        size = leaf if leaf != NEVER else EXPDEC_TABLE
    elif kind == HYBRID:
        geo_below = 0
        while geo_below < SHIFT_DEPTH * depth:   # uts.c: height < shiftDepth * gen_mx
            geo_below += 1
        size = geo_below
    t = _Kernel(geo_below=geo_below, leaf=leaf,
                root_children=int(math.floor(tree.b0)) if kind == BIN else -1,
                q=float(tree.q) if tree.q is not None else 0.0,
                m=int(tree.m) if tree.m is not None else 0,
                shape=shape, b0=float(tree.b0), depth=depth)
    table = _log_q_table(shape, float(tree.b0), depth, size)
    table.flags.writeable = False
    return t, table


# -- the bag and the result ------------------------------------------------------------------

class NodeCount:
    """Nodes counted; folds by addition, so in any order."""

    def __init__(self, nodes: int = 0) -> None:
        self.nodes = nodes

    def fold(self, other: "NodeCount") -> None:
        self.nodes += other.nodes

    def __repr__(self) -> str:
        return f"NodeCount({self.nodes})"


class UTSBag:
    """A stack of nodes of ``tree`` still to expand and the nodes counted so far.

    ``process(n)`` counts at most ``n`` nodes (at least one node is expanded, and
    a node whose children are leaves counts with them) and returns how many.
    """

    def __init__(self, tree: Tree, rows: np.ndarray | None = None, count: int = 0) -> None:
        rows = np.zeros((0, WORDS), np.uint32) if rows is None else rows
        self.tree = tree
        self._kernel, self._log_q = _kernel(tree)
        self._nodes = np.zeros((max(INITIAL_ROWS, 2 * len(rows)), WORDS), np.uint32)
        self._nodes[:len(rows)] = rows
        self._top = len(rows)
        self.count = count

    # pickling sends the tree and the live rows only
    def __getstate__(self) -> dict[str, Any]:
        return {"tree": self.tree, "rows": self.rows(), "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["tree"], state["rows"], state["count"])

    def rows(self) -> np.ndarray:
        """A copy of the nodes still to expand, oldest first."""
        return self._nodes[:self._top].copy()

    def __len__(self) -> int:
        return self._top

    def process(self, n: int) -> int:
        done = 0
        while True:
            self._top, counted, wanted = _expand(self._nodes, self._top, n - done,
                                                 self._kernel, self._log_q, _index())
            done += counted
            if not wanted or done >= n:
                break
            self._reserve(wanted)
        self.count += done
        return done

    def is_empty(self) -> bool:
        return self._top == 0

    def is_splittable(self) -> bool:
        return self._top >= 2

    def split(self, take_all: bool) -> "UTSBag | None":
        """Give away every other node of the stack (so both sides keep shallow nodes
        with big subtrees and deep ones alike), or all of it; never the count."""
        if take_all:
            if self._top == 0:
                return None
            loot, self._top = UTSBag(self.tree, self.rows()), 0
            return loot
        if self._top < 2:
            return None
        stack = self._nodes[:self._top]
        loot = UTSBag(self.tree, stack[0::2].copy())
        kept = stack[1::2].copy()
        self._nodes[:len(kept)] = kept
        self._top = len(kept)
        return loot

    def merge(self, other: "UTSBag") -> None:
        """Take all of ``other``'s nodes and count, leaving it empty."""
        if other.tree != self.tree:
            raise ValueError(f"cannot merge nodes of {other.tree} into a bag of {self.tree}")
        self._reserve(other._top)
        self._nodes[self._top:self._top + other._top] = other._nodes[:other._top]
        self._top += other._top
        self.count += other.count
        other._top, other.count = 0, 0

    def submit(self, result: NodeCount) -> None:
        result.nodes += self.count
        self.count = 0

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` more rows."""
        need = self._top + rows
        if need > len(self._nodes):
            grown = np.zeros((max(need, 2 * len(self._nodes)), WORDS), np.uint32)
            grown[:self._top] = self._nodes[:self._top]
            self._nodes = grown


# -- the tree from parameters ----------------------------------------------------------------

_KEYS = ("type", "shape", "b0", "depth", "q", "m", "seed")
_USES = {"bin": {"type", "b0", "q", "m", "seed"},
         "geo": {"type", "shape", "b0", "depth", "seed"},
         "hybrid": set(_KEYS)}


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _tree(params: dict) -> Tree:
    """The tree ``params`` describe, validated; errors name the option and the value.

    ``{"tree": "T3"}`` is a named sample tree (other keys must agree with it);
    otherwise missing keys take the defaults (a geometric fixed tree, b0 4,
    depth 13, seed 19; q 15/64 and m 4 for binomial parts), and a key the
    type does not use is refused.
    """
    unknown = set(params) - set(_KEYS) - {"tree"}
    if unknown:
        raise ValueError(f"UTS has no parameter {sorted(unknown)[0]!r}; it knows tree, "
                         + ", ".join(_KEYS))
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
                             f"(it uses {', '.join('--' + k for k in _KEYS if k in _USES[kind])})")
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


def _params(ns: argparse.Namespace) -> dict:
    given = {k: getattr(ns, k) for k in _KEYS if getattr(ns, k, None) is not None}
    if ns.tree is not None:
        if ns.tree not in TREES:
            raise ValueError(f"unknown UTS tree --tree {ns.tree!r}: choose from {', '.join(TREES)}")
        if given:
            extra = " ".join(f"--{k} {v}" for k, v in given.items())
            raise ValueError(f"--tree {ns.tree} cannot be combined with {extra}: "
                             "a named tree fixes all its parameters")
        return {"tree": ns.tree, **TREES[ns.tree].params()}
    return _tree(given).params()


def make_bag(params: dict) -> UTSBag:
    """The bag holding the root: all the work."""
    tree = _tree(params)
    return UTSBag(tree, _root(tree.seed, _index()))


FRONTIER_PER_WORKER = 16
MAX_FRONTIER = 1 << 14       # make_static_bag(p, 0, 2^30) must stay cheap ...
MAX_ABOVE = 1 << 16          # ... also where levels never get that wide (binomial trees)


def frontier(params: dict, width: int) -> tuple[np.ndarray, int]:
    """Expand whole levels from the root until one has at least ``width`` nodes (or
    the last level whose children are hashed, or ``MAX_ABOVE`` nodes above it);
    returns that level and the count of the nodes above it."""
    tree = _tree(params)
    t, log_q = _kernel(tree)
    level, above, height = _root(tree.seed, _index()), 0, 0
    while 0 < len(level) < width and height + 1 < t.leaf and above < MAX_ABOVE:
        level, above, height = _next_level(level, t, log_q, _index()), above + len(level), height + 1
    return level, above


def make_static_bag(params: dict, index: int, count: int) -> UTSBag:
    """Worker ``index`` of ``count``: every count-th node of a frontier level; worker 0
    also holds the count of the nodes above the frontier. Each worker builds the
    same frontier, so together they cover the tree exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"worker index must be in [0, {count}), got {index}")
    level, above = frontier(params, min(FRONTIER_PER_WORKER * count, MAX_FRONTIER))
    return UTSBag(_tree(params), level[index::count].copy(), above if index == 0 else 0)


def sequential(params: dict) -> NodeCount:
    """The kernel alone, in this thread: no runtime, no splitting."""
    bag, result = make_bag(params), NodeCount()
    while not bag.is_empty():
        bag.process(1 << 62)
    bag.submit(result)
    return result


def tree_size(seed: int, depth: int) -> int:
    """Nodes of the geometric fixed b0 = 4 tree of ``seed`` and ``depth``, counted by the kernel."""
    return sequential({"seed": seed, "depth": depth}).nodes


def published(params: dict) -> int | None:
    """The published size of the tree ``params`` describe, or None if there is none."""
    tree = _tree(params)
    for name, named in TREES.items():
        if tree == named:
            return PUBLISHED[name]
    if tree == _geo("fixed", 4.0, tree.depth, REFERENCE_SEED):
        return REFERENCE.get(tree.depth)
    return None


def _check(params: dict, value: Any) -> bool | None:
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
    default_n=8192,  # nodes per process call: about 0.15 ms of kernel between two checks
)
