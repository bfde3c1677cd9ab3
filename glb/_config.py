"""GLB configuration."""

from __future__ import annotations

import dataclasses

__all__ = ["GLBConfig"]

LIFELINES = ("hypercube", "binary")


@dataclasses.dataclass(frozen=True)
class GLBConfig:
    """How GLB balances work.

    ``n``: units per ``process`` call (between two checks for hungry thieves);
    ``w``: random steal attempts of an idle place before it sets its lifelines;
    ``workers``: worker tasks per place (give the runtime at least as many threads);
    ``lifeline``: ``hypercube`` or ``binary``, the graph of lifelines over the
    positions of the live places; ``malleable``: register GLB's own
    MalleableHandler while computing, so the computation takes grow and shrink orders.
    """

    n: int = 511
    w: int = 3
    workers: int = 1
    lifeline: str = "hypercube"
    malleable: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("n", 1), ("w", 0), ("workers", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"GLBConfig.{name} must be an integer >= {low}, got {value!r}")
        if self.lifeline not in LIFELINES:
            raise ValueError(f"GLBConfig.lifeline must be one of {LIFELINES}, got {self.lifeline!r}")
