"""Per-place statistics of a GLB computation."""

from __future__ import annotations

import dataclasses

__all__ = ["PlaceStats", "GLBStats"]


@dataclasses.dataclass
class PlaceStats:
    place: int = 0
    units: int = 0               # units processed
    busy_s: float = 0.0          # time inside process()
    random_tried: int = 0        # random steal attempts made
    random_won: int = 0          # of them, with loot
    lifeline_won: int = 0        # loot received through lifelines
    loot_given: int = 0          # pieces of work handed to other places
    moved_bags: int = 0          # bags sent away because this place was leaving
    moved_results: int = 0       # partial results sent away because this place was leaving
    idle_s: float = 0.0          # worker time without work: workers * elapsed - busy

    def add(self, other: PlaceStats) -> None:
        for f in dataclasses.fields(self):
            if f.name != "place":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class GLBStats(list[PlaceStats]):
    """A list of :class:`PlaceStats`, one per place that took part; prints as a table."""

    COLUMNS = ("place", "units", "busy_s", "idle_s", "random_tried", "random_won",
               "lifeline_won", "loot_given", "moved_bags", "moved_results")

    def total(self) -> PlaceStats:
        total = PlaceStats(place=-1)
        for s in self:
            total.add(s)
        return total

    def __str__(self) -> str:
        rows = [[_cell(getattr(s, c)) for c in self.COLUMNS] for s in self]
        total = self.total()
        rows.append(["all"] + [_cell(getattr(total, c)) for c in self.COLUMNS[1:]])
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(self.COLUMNS)]
        line = "  ".join(c.rjust(w) for c, w in zip(self.COLUMNS, widths, strict=True))
        body = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join([line, *body])


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
