"""GLB configuration."""

from __future__ import annotations

import dataclasses
import os

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

    ``evolving``: also steer the place count itself (needs a scheduler, see
    ``apgas.request_grow``). Every ``evolving_interval`` seconds place 0 samples
    the load of each place (the share of its workers that hold work); when the
    mean stays at or above ``evolving_high`` for ``evolving_window`` samples in a
    row it asks for one more place, when it stays at or below ``evolving_low`` it
    releases the least loaded place. After a refused request it waits
    ``evolving_backoff`` seconds before it asks again.

    ``resilient``: survive the loss of any places but place 0 with the exact
    result: place 0 keeps a backup of every other worker's bag, written at least
    every ``backup_interval`` seconds of work and whenever work leaves the bag,
    and restores a lost place's work at the live places (docs/glb.md, "Resilience").

    ``checkpoint``: a directory where place 0 writes a consistent snapshot of the
    computation every ``checkpoint_interval`` seconds, so that it survives the
    loss of place 0 too: a run started on a directory that holds a snapshot of
    the same problem resumes from it, on any number of places, and gives the
    exact result (docs/glb.md, "Checkpoints"). The snapshot is the store that
    ``resilient`` keeps, so a checkpointing run keeps it too (its workers back up
    every ``checkpoint_interval`` seconds unless ``resilient`` asks for more), and
    survives the loss of other places as well.
    """

    n: int = 511
    w: int = 3
    workers: int = 1
    lifeline: str = "hypercube"
    malleable: bool = False
    seed: int = 0
    evolving: bool = False
    evolving_high: float = 0.9
    evolving_low: float = 0.5
    evolving_interval: float = 0.25
    evolving_window: int = 4
    evolving_backoff: float = 10.0
    resilient: bool = False
    backup_interval: float = 0.5
    checkpoint: str | None = None
    checkpoint_interval: float = 60.0

    def __post_init__(self) -> None:
        for name, low in (("n", 1), ("w", 0), ("workers", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"GLBConfig.{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.evolving_window, int) or self.evolving_window < 1:
            raise ValueError(f"GLBConfig.evolving_window must be an integer >= 1, "
                             f"got {self.evolving_window!r}")
        if not 0 <= self.evolving_low < self.evolving_high <= 1:
            raise ValueError(f"GLBConfig needs 0 <= evolving_low < evolving_high <= 1, got "
                             f"{self.evolving_low!r} and {self.evolving_high!r}")
        if self.checkpoint is not None:
            if not isinstance(self.checkpoint, (str, os.PathLike)) or not os.fspath(self.checkpoint):
                raise ValueError(f"GLBConfig.checkpoint must be a directory path, got "
                                 f"{self.checkpoint!r}")
            object.__setattr__(self, "checkpoint", os.fspath(self.checkpoint))
        for name in ("evolving_interval", "evolving_backoff", "backup_interval",
                     "checkpoint_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GLBConfig.{name} must be a positive number of seconds, "
                                 f"got {getattr(self, name)!r}")
        if self.lifeline not in LIFELINES:
            raise ValueError(f"GLBConfig.lifeline must be one of {LIFELINES}, got {self.lifeline!r}")

    @property
    def keeps_copies(self) -> bool:
        """Whether place 0 keeps the store of copies (``resilient`` or ``checkpoint``)."""
        return self.resilient or self.checkpoint is not None

    @property
    def effective_backup_interval(self) -> float:
        """Seconds of work between two backups of a worker's bag."""
        return self.backup_interval if self.resilient else self.checkpoint_interval
