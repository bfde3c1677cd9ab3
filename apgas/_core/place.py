"""The :class:`Place` value."""

from __future__ import annotations

import dataclasses

__all__ = ["Place"]


@dataclasses.dataclass(frozen=True, order=True)
class Place:
    """A place: ``id`` is never reused; ``host`` is the host name as it was given."""

    id: int
    host: str = dataclasses.field(default="", compare=False)

    def __repr__(self) -> str:
        return f"Place({self.id}, {self.host!r})"

    def __index__(self) -> int:
        return self.id
