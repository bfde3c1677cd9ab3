"""Betweenness centrality (Brandes) of an SSCA2 R-MAT graph, one source vertex per unit.

    python -m glb.apps bc [--scale N] [--seed S] --places P --workers W

The graph has ``2**scale`` vertices and is drawn from ``8 * 2**scale`` R-MAT
edges with probabilities (a, b, c, d) = (0.55, 0.10, 0.10, 0.25), then the
vertex labels are shuffled (as SSCA2 does, so that the hubs are not all at
low numbers). Self-loops are dropped and duplicate edges kept once: the
graph is a simple directed graph, exactly what ``networkx.DiGraph`` builds
from the same edge list, so the scores can be checked against networkx.
SSCA2's per-level noise on the probabilities is left out.

The graph never travels: every place builds it once from (scale, seed) --
the generator is deterministic -- and keeps it in a module-level cache. A bag
carries only the parameters, the ranges of source vertices still to do and
its partial scores (allocated when it first does work, so loot stays small).
Scores are unnormalized directed betweenness, as
``networkx.betweenness_centrality(G, normalized=False)`` gives for a DiGraph.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

import numba
import numpy as np

from glb.bags import RangeBag

from ._app import App, Params

__all__ = ["APP", "BCBag", "BCResult", "Graph", "graph", "reference_scores", "sequential"]

log = logging.getLogger("glb.apps.bc")

EDGE_FACTOR = 8
A, B, C = 0.55, 0.10, 0.10          # d = 0.25
DEFAULT_SCALE = 13
DEFAULT_SEED = 1
MAX_SCALE = 22                      # 32 M edges drawn; BC at that size takes days anyway
CHECK_MAX_SCALE = 10                # networkx reference up to 1024 vertices
TOLERANCE = 1e-9                    # relative (and absolute near zero)


# -- the graph -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Graph:
    """A simple directed graph in CSR form: the out-neighbours of ``v`` are
    ``targets[offsets[v]:offsets[v + 1]]``, sorted."""

    offsets: np.ndarray              # int64, length vertices + 1
    targets: np.ndarray              # int32, length edges

    @property
    def vertices(self) -> int:
        return len(self.offsets) - 1

    @property
    def edges(self) -> int:
        return len(self.targets)


def rmat_edges(scale: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The raw R-MAT edge list (self-loops and duplicates included), labels shuffled.

    Each edge picks one quadrant of the adjacency matrix per level, so one bit
    of its source and one of its target; vectorized over all edges per level.
    """
    rng = np.random.default_rng(seed)
    m = EDGE_FACTOR << scale
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    for bit in range(scale):
        r = rng.random(m)
        lower = r >= A + B                                   # quadrants c, d
        right = ((r >= A) & (r < A + B)) | (r >= A + B + C)  # quadrants b, d
        src |= lower.astype(np.int64) << bit
        dst |= right.astype(np.int64) << bit
    perm = rng.permutation(1 << scale)
    return perm[src], perm[dst]


def simple_edges(scale: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The edges of the simple graph: no self-loops, each (u, v) once, sorted by (u, v)."""
    n = 1 << scale
    src, dst = rmat_edges(scale, seed)
    keep = src != dst
    keys = np.unique(src[keep] * n + dst[keep])
    return keys // n, keys % n


def build_graph(scale: int, seed: int) -> Graph:
    """The CSR graph of (scale, seed), the same at every place."""
    n = 1 << scale
    src, dst = simple_edges(scale, seed)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=offsets[1:])
    return Graph(offsets, dst.astype(np.int32))


_graphs: dict[tuple[int, int], Graph] = {}
_graphs_lock = threading.Lock()


def graph(scale: int, seed: int) -> Graph:
    """This place's copy of the graph, built on first use (the lock keeps
    concurrent workers from building it twice)."""
    key = (scale, seed)
    with _graphs_lock:
        if key not in _graphs:
            start = time.perf_counter()
            g = _graphs[key] = build_graph(scale, seed)
            log.debug("graph scale %d seed %d: %d vertices, %d edges, built in %.3f s",
                      scale, seed, g.vertices, g.edges, time.perf_counter() - start)
        return _graphs[key]


# -- the kernel ------------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
def _brandes(offsets: np.ndarray, targets: np.ndarray, lo: int, hi: int, scores: np.ndarray,
             order: np.ndarray, dist: np.ndarray, sigma: np.ndarray, delta: np.ndarray) -> None:
    """Add the dependencies of the sources ``lo..hi-1`` to ``scores``.

    ``order`` is the BFS queue; read backwards it is Brandes' stack, so one
    array serves both. Instead of predecessor lists, a vertex's dependency
    sums over its out-neighbours one BFS level deeper (its DAG successors).
    The scratch arrays must come in reset (dist -1, sigma and delta 0) and
    are left so: only the vertices reached are touched and reset.
    """
    for s in range(lo, hi):
        order[0] = s
        dist[s] = 0
        sigma[s] = 1.0
        head, tail = 0, 1
        while head < tail:                      # BFS: distances and path counts
            v = order[head]
            head += 1
            dw = dist[v] + 1
            for e in range(offsets[v], offsets[v + 1]):
                w = targets[e]
                if dist[w] < 0:
                    dist[w] = dw
                    order[tail] = w
                    tail += 1
                if dist[w] == dw:
                    sigma[w] += sigma[v]
        for i in range(tail - 1, 0, -1):        # deepest first; order[0] is s itself
            v = order[i]
            dw = dist[v] + 1
            acc = 0.0
            for e in range(offsets[v], offsets[v + 1]):
                w = targets[e]
                if dist[w] == dw:
                    acc += (1.0 + delta[w]) / sigma[w]
            delta[v] = sigma[v] * acc
            scores[v] += delta[v]
        for i in range(tail):
            v = order[i]
            dist[v] = -1
            sigma[v] = 0.0
            delta[v] = 0.0


@dataclasses.dataclass
class Scratch:
    """One thread's reset work arrays for the kernel."""

    order: np.ndarray
    dist: np.ndarray
    sigma: np.ndarray
    delta: np.ndarray

    @classmethod
    def allocate(cls, n: int) -> Scratch:
        return cls(np.zeros(n, np.int32), np.full(n, -1, np.int32), np.zeros(n), np.zeros(n))


_local = threading.local()


def scratch(n: int) -> Scratch:
    """This thread's scratch for graphs of ``n`` vertices: GLB workers run the
    kernel concurrently (it releases the GIL), so each needs its own."""
    cache: dict[int, Scratch] | None = getattr(_local, "scratch", None)
    if cache is None:
        cache = _local.scratch = {}
    if n not in cache:
        cache[n] = Scratch.allocate(n)
    return cache[n]


def accumulate(g: Graph, lo: int, hi: int, scores: np.ndarray) -> None:
    """Run the kernel for the sources ``lo..hi-1`` into ``scores``."""
    s = scratch(g.vertices)
    _brandes(g.offsets, g.targets, lo, hi, scores, s.order, s.dist, s.sigma, s.delta)


# -- result and bag ----------------------------------------------------------------------

def _added(total: np.ndarray | None, part: np.ndarray | None) -> np.ndarray | None:
    """``total + part``, in place in ``total``; None stands for no scores yet."""
    if part is None:
        return total
    if total is None:
        return part
    total += part
    return total


class BCResult:
    """Scores summed over the sources done; the array appears with the first scores."""

    def __init__(self, vertices: int) -> None:
        self.vertices = vertices
        self.scores: np.ndarray | None = None
        self.sources = 0

    def add(self, scores: np.ndarray | None, sources: int) -> None:
        """Add ``scores`` (taken over, not copied) from ``sources`` sources."""
        self.scores = _added(self.scores, scores)
        self.sources += sources

    def fold(self, other: BCResult) -> None:
        self.add(None if other.scores is None else other.scores.copy(), other.sources)

    def array(self) -> np.ndarray:
        """The scores of all vertices (zeros if nothing was done)."""
        return self.scores if self.scores is not None else np.zeros(self.vertices)


class BCBag(RangeBag):
    """Source ranges ``[lo, hi)`` still to do, and the scores of those done."""

    def __init__(self, scale: int, seed: int, ranges: Iterable[tuple[int, int]] = ()) -> None:
        super().__init__(ranges=ranges)
        self.scale = scale
        self.seed = seed

    def work(self, lo: int, hi: int) -> BCResult:
        """The scores of sources ``lo..hi-1``."""
        g = graph(self.scale, self.seed)
        result = BCResult(g.vertices)
        scores = np.zeros(g.vertices)
        accumulate(g, lo, hi, scores)
        result.add(scores, hi - lo)
        return result

    def process(self, n: int) -> int:
        """As ``RangeBag.process``, but the kernel adds straight into the bag's partial
        scores: no array to allocate, fold and drop per call, so a small ``n`` (short
        calls, quick answers to thieves) costs next to nothing."""
        blocks = self._take(n)
        if not blocks:
            return 0
        g = graph(self.scale, self.seed)
        if self.partial is None:
            self.partial = BCResult(g.vertices)
        part = self.partial
        if part.scores is None:
            part.scores = np.zeros(g.vertices)
        done = 0
        for lo, hi in blocks:
            accumulate(g, lo, hi, part.scores)
            done += hi - lo
        part.sources += done
        return done


# -- the application ---------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=int, default=DEFAULT_SCALE,
                        help=f"2**scale vertices, 8 * 2**scale R-MAT edges (default {DEFAULT_SCALE})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"seed of the graph generator (default {DEFAULT_SEED})")


def params(ns: argparse.Namespace) -> Params:
    scale, seed = ns.scale, ns.seed
    if not isinstance(scale, int) or isinstance(scale, bool) or not 1 <= scale <= MAX_SCALE:
        raise ValueError(f"--scale must be an integer from 1 to {MAX_SCALE}, got {scale!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    return {"scale": scale, "seed": seed}


def make_bag(p: Params) -> BCBag:
    return BCBag(p["scale"], p["seed"], [(0, 1 << p["scale"])])


def make_static_bag(p: Params, index: int, count: int) -> BCBag:
    """Worker ``index`` of ``count``: a contiguous slice; the slices tile all sources."""
    n = 1 << p["scale"]
    return BCBag(p["scale"], p["seed"], [(n * index // count, n * (index + 1) // count)])


def make_result(p: Params) -> BCResult:
    return BCResult(1 << p["scale"])


def sequential(p: Params) -> BCResult:
    """All sources in one kernel call (the graph is built here, as in a GLB run)."""
    bag = make_bag(p)
    bag.process(1 << p["scale"])
    result = make_result(p)
    bag.submit(result)
    return result


def checksum_weights(n: int) -> np.ndarray:
    """Per-vertex weights, so a checksum notices scores put on the wrong vertex."""
    return (np.arange(n) % 97 + 1).astype(np.float64)


def summarize(scores: np.ndarray, sources: int) -> dict[str, Any]:
    top = int(np.argmax(scores))
    return {"sources": sources, "sum": float(scores.sum()), "max": float(scores[top]),
            "argmax": top, "checksum": float(scores @ checksum_weights(len(scores)))}


def value(result: BCResult) -> dict[str, Any]:
    """A JSON summary (the whole array would flood the printed line); the
    full array stays in ``result.array()``."""
    return summarize(result.array(), result.sources)


def units(result: BCResult) -> int:
    return result.sources


def networkx_graph(scale: int, seed: int) -> Any:
    """The same graph as a ``networkx.DiGraph`` (isolated vertices included)."""
    import networkx as nx
    g = nx.DiGraph()
    g.add_nodes_from(range(1 << scale))
    src, dst = simple_edges(scale, seed)
    g.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return g


def reference_scores(scale: int, seed: int) -> np.ndarray:
    """Scores by networkx (slow: small scales only)."""
    import networkx as nx
    bc = nx.betweenness_centrality(networkx_graph(scale, seed), normalized=False)
    return np.array([bc[v] for v in range(1 << scale)])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def check(p: Params, got: dict[str, Any]) -> bool | None:
    """Against networkx for scale <= 10. Only the summary reaches here, so
    every field is compared (the checksum catches scores on the wrong vertex)
    and the reported argmax must hold a maximal score (ties may pick another)."""
    if p["scale"] > CHECK_MAX_SCALE:
        return None
    ref = reference_scores(p["scale"], p["seed"])
    want = summarize(ref, 1 << p["scale"])
    return (got["sources"] == want["sources"] and close(got["sum"], want["sum"])
            and close(got["max"], want["max"]) and close(got["checksum"], want["checksum"])
            and 0 <= got["argmax"] < len(ref) and close(float(ref[got["argmax"]]), want["max"]))


def warm_up() -> float:
    """Compile the kernel, or load it from numba's on-disk cache."""
    start = time.perf_counter()
    g = build_graph(3, 0)
    accumulate(g, 0, g.vertices, np.zeros(g.vertices))
    return time.perf_counter() - start


APP = App(name="bc", add_arguments=add_arguments, params=params, make_bag=make_bag,
          make_static_bag=make_static_bag, make_result=make_result, sequential=sequential,
          value=value, units=units, check=check, warm_up=warm_up, unit_name="sources",
          # sources per process call: about 3 ms at scale 13, the longest a thief waits
          # for loot (16 made it wait 10-25 ms, at the start and at each steal)
          default_n=4)
