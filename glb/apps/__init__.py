"""The GLB applications: kernels, bags and results that users and tests import, and one
command line to run them.

    python -m glb.apps {uts,nqueens,bc,pi,synthetic} [app options] --places P --workers W

- :mod:`glb.apps.uts`: count the nodes of an Unbalanced Tree Search tree (UTS);
- :mod:`glb.apps.nqueens`: count the solutions of the N-Queens problem;
- :mod:`glb.apps.bc`: betweenness centrality of an SSCA2 R-MAT graph;
- :mod:`glb.apps.pi`: a Monte Carlo estimate of pi;
- :mod:`glb.apps.synthetic`: a UTS tree whose nodes sleep, to measure balancing beyond the cores.

Their kernels are compiled with numba, so this package needs the ``apps`` extra
(numpy and numba): ``pip install "apgas[apps]"``. The runtime (``apgas``) and
the GLB library itself (``glb``) do not. Each application module defines
``APP`` (see :mod:`glb.apps.cli`), which the command line drives.
"""

from __future__ import annotations

import importlib.util

APPS = ("uts", "nqueens", "bc", "pi", "synthetic")

__all__ = ["APPS"]

_missing = [name for name in ("numpy", "numba") if importlib.util.find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"glb.apps needs {' and '.join(_missing)}, which the runtime does not install: "
        'pip install "apgas[apps]"', name=_missing[0])
