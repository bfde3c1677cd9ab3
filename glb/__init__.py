"""Lifeline-based global load balancing (GLB) on the APGAS runtime.

>>> from glb import GLB, GLBConfig
>>> glb = GLB(GLBConfig(n=511, w=3, workers=2, lifeline="hypercube"))
>>> total = glb.compute_dynamic(bag, result)      # doctest: +SKIP
>>> print(glb.stats())                            # doctest: +SKIP
"""

from ._config import GLBConfig
from ._contract import BagContractError
from ._glb import GLB, Bag, Result
from ._stats import GLBStats, PlaceStats

__all__ = ["GLB", "GLBConfig", "Bag", "Result", "GLBStats", "PlaceStats", "BagContractError"]
