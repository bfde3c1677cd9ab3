"""Per-place statistics of a GLB computation."""

from __future__ import annotations

import dataclasses
import random

__all__ = ["PlaceStats", "GLBStats", "SAMPLES"]

#: latency samples a place keeps per kind (a uniform sample of them all beyond that)
SAMPLES = 2048


@dataclasses.dataclass
class PlaceStats:
    place: int = 0
    units: int = 0               # units processed
    busy_s: float = 0.0          # time inside process()
    random_tried: int = 0        # random steal attempts made
    random_won: int = 0          # of them, with loot
    lifeline_asked: int = 0      # registrations sent to lifelines
    lifeline_won: int = 0        # loot received through lifelines
    loot_given: int = 0          # pieces of work handed to other places
    split_at_once: int = 0       # of them (and local), split off a bag while its worker processed it
    moved_bags: int = 0          # bags sent away because this place was leaving
    moved_results: int = 0       # partial results sent away because this place was leaving
    idle_s: float = 0.0          # worker time without work: workers * elapsed - busy
    waited: int = 0              # dry spells that ended with work (stolen or delivered)
    #: seconds from running dry to holding work again, per spell (a bounded uniform sample)
    waits_s: list[float] = dataclasses.field(default_factory=list)
    #: seconds of each random steal attempt's round trip (a bounded uniform sample)
    steal_rtt_s: list[float] = dataclasses.field(default_factory=list)
    #: resilient GLB: the place was lost. Its row holds what place 0 knew of it from its
    #: last backups: ``units`` are those its restored copies and ended workers hold (the
    #: result counts them); units done after its last backup were redone, and counted,
    #: elsewhere. Its other counts are 0: the place took them along.
    lost: bool = False

    def add(self, other: PlaceStats) -> None:
        for f in dataclasses.fields(self):
            if f.name not in ("place", "lost"):
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def note(self, samples: list[float], value: float, seen: int) -> None:
        """Keep ``value``, the ``seen``-th of its kind, in a uniform sample of at most SAMPLES."""
        if len(samples) < SAMPLES:
            samples.append(value)
        else:
            k = random.randrange(seen)
            if k < SAMPLES:
                samples[k] = value


class GLBStats(list[PlaceStats]):
    """A list of :class:`PlaceStats`, one per place that took part (a lost place's row
    marked ``lost``); prints as a table."""

    COLUMNS = ("place", "units", "busy_s", "idle_s", "random_tried", "random_won",
               "lifeline_asked", "lifeline_won", "loot_given", "split_at_once", "moved_bags",
               "moved_results", "lost")

    def total(self) -> PlaceStats:
        total = PlaceStats(place=-1)
        for s in self:
            total.add(s)
        return total

    def __str__(self) -> str:
        # the ``lost`` column only when a place was lost: a run without losses reads as before
        columns = self.COLUMNS if any(s.lost for s in self) else self.COLUMNS[:-1]
        rows = [[_cell(getattr(s, c)) for c in columns] for s in self]
        total = self.total()
        rows.append(["all"] + [_cell(getattr(total, c)) for c in columns[1:]])
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        line = "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))
        body = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join([line, *body])


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "lost" if value else ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)
