"""UTS: count the nodes of an Unbalanced Tree Search tree with GLB.

    python -m benchmarks uts [--seed S] [--depth D] --places P --workers W

The tree is geometric with branching factor b = 4 and SHA-1 as splittable
random number generator. The root's digest is SHA-1(16 zero bytes + seed as
4 big-endian bytes); child i of a node is SHA-1(node digest + i as 4 big-endian
bytes). A node has floor(log(1 - v / 2^31) / log(4/5)) children, where v is
the low 31 bits of digest bytes 16..19 (big-endian). The root has remaining
depth ``depth`` and counts as a node; a node at remaining depth 1 adds its
children to the count without hashing them. Every node of the tree is counted
once, so the result is an exact node count.

A bag is an explicit stack of nodes (five digest words and the remaining
depth per row, in one uint32 array), walked depth first by a numba kernel that
releases the GIL. SHA-1 digests are kept as their five big-endian words, so a
child's message is the parent's words, the index, and constant padding: one
64-byte block. Two facts make the kernel cheap: the message schedule is
GF(2)-linear, so the schedule of a child is the parent's schedule XOR a
precomputed table row of the index; and the first five rounds only see the
parent's words, so all siblings share them.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ._app import App

__all__ = ["APP", "UTSBag", "NodeCount", "tree_size"]

log = logging.getLogger("benchmarks.uts")

MAX_CHILDREN = 96            # children when v = 2^31 - 1: the most a node can have
MAX_DEPTH = 30
MAX_SEED = (1 << 32) - 1     # the seed is hashed as 4 bytes
WORDS = 6                    # a stack row: digest words 0..4, then the remaining depth
INITIAL_ROWS = 1024
LOG_Q = math.log(4.0 / 5.0)  # geometric distribution with mean b = 4

#: published node counts for seed 19 (depth -> nodes)
REFERENCE = {1: 6, 2: 65, 5: 3_987, 8: 257_042, 9: 1_031_269, 10: 4_130_071, 11: 16_526_523,
             12: 66_106_929, 13: 264_459_392, 15: 4_230_646_601}
REFERENCE_SEED = 19

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
def _store(nodes, row, a, b, c, d, e, depth):
    """Finish a digest (add the initial state) into stack row ``row``."""
    nodes[row, 0] = (_H0 + a) & _MASK
    nodes[row, 1] = (_H1 + b) & _MASK
    nodes[row, 2] = (_H2 + c) & _MASK
    nodes[row, 3] = (_H3 + d) & _MASK
    nodes[row, 4] = (_H4 + e) & _MASK
    nodes[row, 5] = depth


@numba.njit(cache=True, nogil=True)
def _index_schedules():
    """Row i: the schedule of a block whose only nonzero word is word 5 = i."""
    q = np.zeros((MAX_CHILDREN + 1, 80), np.uint32)
    for i in range(MAX_CHILDREN + 1):
        q[i, 5] = i
        _schedule(q[i])
    return q


@numba.njit(inline="always", cache=True)
def _children(h4):
    """How many children a node with last digest word ``h4`` has."""
    v = h4 & 0x7FFFFFFF
    return math.floor(math.log(1.0 - v / 2147483648.0) / LOG_Q)


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
def _push_children(nodes, top, count, depth, w, q):
    """Hash children 0..count-1 of the block in ``w`` into rows top..top+count-1."""
    a, b, c, d, e = _rounds_0_4(w, _H0, _H1, _H2, _H3, _H4)   # shared by the siblings
    for i in range(count):
        ca, cb, cc, cd, ce = _rounds_from(w, q[i], a, b, c, d, e, 5)
        _store(nodes, top + i, ca, cb, cc, cd, ce, depth)


@numba.njit(cache=True, nogil=True)
def _root(seed, depth, q):
    """A one-row stack holding the root."""
    nodes = np.zeros((1, WORDS), np.uint32)
    w = np.zeros(80, np.uint32)
    w[4] = seed
    w[5] = _PAD
    w[15] = 20 * 8
    _schedule(w)
    a, b, c, d, e = _rounds_from(w, q[0], _H0, _H1, _H2, _H3, _H4, 0)
    _store(nodes, 0, a, b, c, d, e, depth)
    return nodes


@numba.njit(cache=True, nogil=True)
def _expand(nodes, top, limit, q):
    """Walk the stack ``nodes[:top]`` depth first until ``limit`` nodes are counted
    (at least one node is always expanded) or the stack is empty.

    Returns (top, nodes counted, full); ``full`` means the next node's children
    do not fit: grow the array and call again.
    """
    w = np.zeros(80, np.uint32)
    capacity = nodes.shape[0]
    counted = 0
    while top > 0:
        depth = np.int64(nodes[top - 1, 5])
        count = _children(np.int64(nodes[top - 1, 4]))
        units = 1 + count if depth <= 1 else 1
        if counted > 0 and counted + units > limit:
            break
        if depth > 1 and top - 1 + count > capacity:
            return top, counted, True
        top -= 1
        counted += units
        if depth > 1 and count > 0:
            _parent_block(nodes, top, w)
            _push_children(nodes, top, count, depth - 1, w, q)
            top += count
    return top, counted, False


@numba.njit(cache=True, nogil=True)
def _next_level(level, q):
    """All children of the rows of ``level`` (each at remaining depth >= 2)."""
    total = 0
    for row in range(level.shape[0]):
        total += _children(np.int64(level[row, 4]))
    out = np.zeros((total, WORDS), np.uint32)
    w = np.zeros(80, np.uint32)
    top = 0
    for row in range(level.shape[0]):
        count = _children(np.int64(level[row, 4]))
        if count > 0:
            _parent_block(level, row, w)
            _push_children(out, top, count, np.int64(level[row, 5]) - 1, w, q)
            top += count
    return out


_INDEX: np.ndarray | None = None   # built on first use: importing must not compile


def _index() -> np.ndarray:
    global _INDEX
    if _INDEX is None:
        _INDEX = _index_schedules()
    return _INDEX


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
    """A stack of tree nodes still to expand and the nodes counted so far.

    ``process(n)`` counts at most ``n`` nodes (at least one node is expanded, and
    a node at remaining depth 1 counts with its children) and returns how many.
    """

    def __init__(self, rows: np.ndarray | None = None, count: int = 0) -> None:
        rows = np.zeros((0, WORDS), np.uint32) if rows is None else rows
        self._nodes = np.zeros((max(INITIAL_ROWS, 2 * len(rows)), WORDS), np.uint32)
        self._nodes[:len(rows)] = rows
        self._top = len(rows)
        self.count = count

    # pickling sends the live rows only
    def __getstate__(self) -> dict[str, Any]:
        return {"rows": self.rows(), "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rows"], state["count"])

    def rows(self) -> np.ndarray:
        """A copy of the nodes still to expand, oldest first."""
        return self._nodes[:self._top].copy()

    def __len__(self) -> int:
        return self._top

    def process(self, n: int) -> int:
        done = 0
        while True:
            self._top, counted, full = _expand(self._nodes, self._top, n - done, _index())
            done += counted
            if not full or done >= n:
                break
            self._reserve(MAX_CHILDREN)
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
            loot, self._top = UTSBag(self.rows()), 0
            return loot
        if self._top < 2:
            return None
        stack = self._nodes[:self._top]
        loot = UTSBag(stack[0::2].copy())
        kept = stack[1::2].copy()
        self._nodes[:len(kept)] = kept
        self._top = len(kept)
        return loot

    def merge(self, other: "UTSBag") -> None:
        """Take all of ``other``'s nodes and count, leaving it empty."""
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


# -- the application ------------------------------------------------------------------------

def _tree(params: dict) -> tuple[int, int]:
    """(seed, depth) of ``params``, validated."""
    seed, depth = params["seed"], params["depth"]
    if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"UTS depth must be an integer from 1 to {MAX_DEPTH}, got {depth!r}")
    if not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"UTS seed must be an integer from 0 to {MAX_SEED} (4 bytes), got {seed!r}")
    return seed, depth


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=REFERENCE_SEED,
                        help=f"root seed, 0..2^32-1 (default {REFERENCE_SEED})")
    parser.add_argument("--depth", type=int, default=13,
                        help=f"tree depth, 1..{MAX_DEPTH} (default 13: 264 M nodes)")


def _params(ns: argparse.Namespace) -> dict:
    params = {"seed": ns.seed, "depth": ns.depth}
    _tree(params)
    return params


def make_bag(params: dict) -> UTSBag:
    """The bag holding the root: all the work."""
    seed, depth = _tree(params)
    return UTSBag(_root(seed, depth, _index()))


def frontier(params: dict, width: int) -> tuple[np.ndarray, int]:
    """Expand whole levels from the root until at least ``width`` nodes (or the last
    level that still hashes); returns that level and the nodes above it."""
    seed, depth = _tree(params)
    level, above = _root(seed, depth, _index()), 0
    while 0 < len(level) < width and depth >= 2:
        level, above, depth = _next_level(level, _index()), above + len(level), depth - 1
    return level, above


FRONTIER_PER_WORKER = 16
MAX_FRONTIER = 1 << 14       # make_static_bag(p, 0, 2^30) must stay cheap


def make_static_bag(params: dict, index: int, count: int) -> UTSBag:
    """Worker ``index`` of ``count``: every count-th node of a frontier level; worker 0
    also holds the count of the nodes above the frontier. Each worker builds the
    same frontier, so together they cover the tree exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"worker index must be in [0, {count}), got {index}")
    level, above = frontier(params, min(FRONTIER_PER_WORKER * count, MAX_FRONTIER))
    return UTSBag(level[index::count].copy(), above if index == 0 else 0)


def sequential(params: dict) -> NodeCount:
    """The kernel alone, in this thread: no runtime, no splitting."""
    bag, result = make_bag(params), NodeCount()
    while not bag.is_empty():
        bag.process(1 << 62)
    bag.submit(result)
    return result


def tree_size(seed: int, depth: int) -> int:
    """Nodes of the tree, counted by the kernel."""
    return sequential({"seed": seed, "depth": depth}).nodes


def _check(params: dict, value: Any) -> bool | None:
    if params.get("seed") != REFERENCE_SEED or params.get("depth") not in REFERENCE:
        return None
    return value == REFERENCE[params["depth"]]


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
