"""UTS: count the nodes of an Unbalanced Tree Search tree with GLB.

    python -m glb.apps uts [--tree T1..T5,T1L,T2L,T3L | --type {bin,geo,hybrid}
                            --shape {linear,expdec,cyclic,fixed} --b0 B --depth D
                            --q Q --m M --seed R] --places P --workers W

The trees of the UTS distribution (Olivier et al., LCPC 2006), node for node.
One module a job:

- :mod:`.trees`: the tree types and shapes, the sample trees and their
  published sizes, a tree from parameters (plain Python);
- :mod:`.kernel`: SHA-1 on the node digests and the depth-first walk that
  counts nodes (numba);
- :mod:`.bag`: the bag (:class:`UTSBag`), the result (:class:`NodeCount`),
  whole and static bags, the count by the kernel alone;
- :mod:`.app`: the command-line options, the check and the warm-up
  (:data:`APP`).

This package re-exports what users and tests need.
"""

from __future__ import annotations

from .app import APP, warm_up
from .bag import INITIAL_ROWS, NodeCount, UTSBag, frontier, make_bag, make_static_bag, sequential, tree_size
from .kernel import EXPDEC_TABLE, NEVER, kernel_of, log_q_at
from .trees import (
                    MAX_CHILDREN,
                    PUBLISHED,
                    REFERENCE,
                    SHAPES,
                    SMALL_TREES,
                    TREES,
                    TYPES,
                    Tree,
                    published,
                    tree_of,
)

__all__ = ["APP", "UTSBag", "NodeCount", "Tree", "TREES", "PUBLISHED", "REFERENCE", "SMALL_TREES",
           "TYPES", "SHAPES", "MAX_CHILDREN", "INITIAL_ROWS", "EXPDEC_TABLE", "NEVER", "tree_size",
           "tree_of", "published", "make_bag", "make_static_bag", "frontier", "sequential", "warm_up",
           "kernel_of", "log_q_at"]
