"""The UTS kernel: SHA-1 on the node digests and the depth-first walk that counts
nodes, compiled with numba (nogil); the trees it counts are :mod:`.trees`'.

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

Importing compiles nothing: the kernels compile (or load from numba's disk
cache) on first use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

if TYPE_CHECKING:
    from numba.core.typing.templates import Signature

from .trees import (
    BIN,
    CYCLIC,
    EXPDEC,
    FIXED,
    GEO,
    HYBRID,
    LINEAR,
    MAX_CHILDREN,
    SHAPES,
    SHIFT_DEPTH,
    TYPES,
    Tree,
)

__all__ = ["Kernel", "WORDS", "NEVER", "EXPDEC_TABLE", "kernel_of", "index_table", "log_q_at",
           "root", "expand", "next_level"]

NEVER = 1 << 62              # a height no node reaches
EXPDEC_TABLE = 256           # expdec trees have no depth limit: heights past the table compute b_h
WORDS = 6                    # a stack row: digest words 0..4, then the height

_H0, _H1, _H2, _H3, _H4 = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0
_MASK = 0xFFFFFFFF
_PAD = 0x80000000            # the 1 bit that ends a SHA-1 message

#: an integer of the kernels: numba compiles Python ints and numpy's int64 alike as
#: int64, but the type checker reads the kernels as Python, where the two differ
Int = int | np.int64
#: the five words of a SHA-1 state
Digest = tuple[Int, Int, Int, Int, Int]


# -- SHA-1 on int64 values holding 32-bit words ---------------------------------------------

@intrinsic
def _rotl32_intrinsic(typingctx: object, x: types.Type,
                      k: types.Type) -> tuple[Signature, Callable[..., ir.Value]]:
    """Rotate the low 32 bits of ``x`` left by ``k``: one instruction, where numba's
    own shifts would widen to 64 bits and cost three."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context: object, builder: ir.IRBuilder, signature: Signature,
                args: Sequence[ir.Value]) -> ir.Value:
        i32 = ir.IntType(32)
        word = builder.trunc(args[0], i32)
        fshl = builder.module.declare_intrinsic("llvm.fshl", [i32], ir.FunctionType(i32, [i32] * 3))
        rotated = builder.call(fshl, [word, word, builder.trunc(args[1], i32)])
        return builder.zext(rotated, ir.IntType(64))

    return sig, codegen


#: ``_rotl32(x, k)`` as the kernels call it: jitted code calls an intrinsic without the
#: typing context (numba's stub gives the call the definition's own parameters)
_rotl32 = cast(Callable[[Int, Int], np.int64], _rotl32_intrinsic)


@numba.njit(inline="always", cache=True)
def _word(w: np.ndarray, q: np.ndarray, t: int) -> np.int64:
    """Schedule word ``t``: the parent's part XOR the index's part."""
    return np.int64(w[t] ^ q[t])


@numba.njit(cache=True, nogil=True)
def _schedule(w: np.ndarray) -> None:
    """Expand the 16 message words ``w[0:16]`` into the 80 round words."""
    for t in range(16, 80):
        w[t] = _rotl32(np.int64(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]), 1)


@numba.njit(inline="always", cache=True)
def _rounds_0_4(w: np.ndarray, a: Int, b: Int, c: Int, d: Int, e: Int) -> Digest:
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
def _rounds_from(w: np.ndarray, q: np.ndarray, a: Int, b: Int, c: Int, d: Int, e: Int,
                 start: int) -> Digest:
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
def _store(nodes: np.ndarray, row: Int, a: Int, b: Int, c: Int, d: Int, e: Int, height: Int) -> None:
    """Finish a digest (add the initial state) into stack row ``row``."""
    nodes[row, 0] = (_H0 + a) & _MASK
    nodes[row, 1] = (_H1 + b) & _MASK
    nodes[row, 2] = (_H2 + c) & _MASK
    nodes[row, 3] = (_H3 + d) & _MASK
    nodes[row, 4] = (_H4 + e) & _MASK
    nodes[row, 5] = height


@numba.njit(inline="always", cache=True)
def _index_schedule(w: np.ndarray, i: int) -> None:
    """Into ``w``: the schedule of a block whose only nonzero word is word 5 = i."""
    for j in range(16):
        w[j] = 0
    w[5] = i
    _schedule(w)


@numba.njit(cache=True, nogil=True)
def _index_schedules() -> np.ndarray:
    """Row i: the schedule of index i, for every index a capped count reaches."""
    q = np.zeros((MAX_CHILDREN + 1, 80), np.uint32)
    for i in range(MAX_CHILDREN + 1):
        _index_schedule(q[i], i)
    return q


# -- how many children: the tree's parameters in the kernel -----------------------------------

class Kernel(NamedTuple):
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
def log_q_at(shape: int, b0: float, depth: int, height: Int) -> float:
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
def _log_q_table(shape: int, b0: float, depth: int, size: int) -> np.ndarray:
    table = np.empty(size, np.float64)
    for h in range(size):
        table[h] = log_q_at(shape, b0, depth, h)
    return table


@numba.njit(inline="always", cache=True, error_model="numpy")
def _children(h4: Int, height: Int, t: Kernel, log_q: np.ndarray) -> np.int64:
    """How many children a node with last digest word ``h4`` at ``height`` has."""
    u = (h4 & 0x7FFFFFFF) / 2147483648.0
    if height < t.geo_below:
        if height < log_q.shape[0]:
            lq = log_q[height]
        else:
            lq = log_q_at(t.shape, t.b0, t.depth, height)
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
def _parent_block(nodes: np.ndarray, row: Int, w: np.ndarray) -> None:
    """Load a child's message block, minus its index, and expand its schedule."""
    for j in range(5):
        w[j] = nodes[row, j]
    for j in range(5, 16):
        w[j] = 0
    w[6] = _PAD
    w[15] = 24 * 8                # message length in bits
    _schedule(w)


@numba.njit(inline="always", cache=True)
def _push_children(nodes: np.ndarray, top: Int, count: Int, height: Int, w: np.ndarray,
                   q: np.ndarray, spare: np.ndarray) -> None:
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
def root(seed: int, q: np.ndarray) -> np.ndarray:
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
def expand(nodes: np.ndarray, top: Int, limit: Int, t: Kernel, log_q: np.ndarray,
           q: np.ndarray) -> tuple[Int, Int, Int]:
    """Walk the stack ``nodes[:top]`` depth first until ``limit`` nodes are counted
    (at least one node is always expanded) or the stack is empty. A node whose
    children are at height ``t.leaf`` counts them with itself, unhashed.

    Returns (top, nodes counted, rows wanted); rows wanted > 0 means the next
    node's children do not fit: make room for that many more rows, call again.
    """
    w = np.zeros(80, np.uint32)
    spare = np.zeros(80, np.uint32)
    capacity = nodes.shape[0]
    counted: Int = 0
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
def next_level(level: np.ndarray, t: Kernel, log_q: np.ndarray, q: np.ndarray) -> np.ndarray:
    """All children of the rows of ``level`` (whose children are not leaves)."""
    total: Int = 0
    for row in range(level.shape[0]):
        total += _children(np.int64(level[row, 4]), np.int64(level[row, 5]), t, log_q)
    out = np.zeros((total, WORDS), np.uint32)
    w = np.zeros(80, np.uint32)
    spare = np.zeros(80, np.uint32)
    top: Int = 0
    for row in range(level.shape[0]):
        height = np.int64(level[row, 5])
        count = _children(np.int64(level[row, 4]), height, t, log_q)
        if count > 0:
            _parent_block(level, row, w)
            _push_children(out, top, count, height + 1, w, q, spare)
            top += count
    return out


_INDEX: np.ndarray | None = None   # built on first use: importing must not compile


def index_table() -> np.ndarray:
    """The schedules of the child indexes (:func:`_index_schedules`), built once."""
    global _INDEX
    if _INDEX is None:
        _INDEX = _index_schedules()
    return _INDEX


@functools.lru_cache(maxsize=64)
def kernel_of(tree: Tree) -> tuple[Kernel, np.ndarray]:
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
    t = Kernel(geo_below=geo_below, leaf=leaf,
               root_children=int(math.floor(tree.b0)) if kind == BIN else -1,
               q=float(tree.q) if tree.q is not None else 0.0,
               m=int(tree.m) if tree.m is not None else 0,
               shape=shape, b0=float(tree.b0), depth=depth)
    table = _log_q_table(shape, float(tree.b0), depth, size)
    table.flags.writeable = False
    return t, table
