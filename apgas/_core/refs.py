"""References that travel between places: :class:`GlobalRef` and :class:`PlaceLocal`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar, cast

from ..errors import ApgasError
from .place import Place
from .runtime import TASK, Finish, current

__all__ = ["GlobalRef", "PlaceLocal"]

T = TypeVar("T")


class GlobalRef(Generic[T]):
    """A reference to ``obj`` that can be sent anywhere and dereferenced at home.

    The object stays alive at its home until :meth:`free` is called there.
    """

    __slots__ = ("_home", "_key")

    def __init__(self, obj: T) -> None:
        rt = current()
        self._home = rt.here
        self._key = rt.next_id()
        rt.global_refs[self._key] = obj

    @property
    def home(self) -> Place:
        return self._home

    def get(self) -> T:
        rt = current()
        if rt.id != self._home.id:
            raise ApgasError(f"GlobalRef of place {self._home.id} dereferenced at place {rt.id}; "
                             f"use apgas.at(ref.home, ...) to reach it")
        try:
            return cast(T, rt.global_refs[self._key])  # the table holds every place's refs: Any
        except KeyError:
            raise ApgasError(f"GlobalRef {self._key} of place {self._home.id} was freed") from None

    def free(self) -> None:
        """Drop the home's reference (call at home)."""
        rt = current()
        if rt.id == self._home.id:
            rt.global_refs.pop(self._key, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_global_ref, (self._home, self._key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GlobalRef) and (self._home.id, self._key) == (other._home.id, other._key)

    def __hash__(self) -> int:
        return hash((self._home.id, self._key))

    def __repr__(self) -> str:
        return f"GlobalRef(home={self._home.id}, key={self._key})"


def _rebuild_global_ref(home: Place, key: int) -> GlobalRef[Any]:
    ref = GlobalRef.__new__(GlobalRef)
    ref._home = home
    ref._key = key
    return ref


class PlaceLocal(Generic[T]):
    """One instance per place under one global id; the handle pickles as its id."""

    __slots__ = ("_key",)

    def __init__(self, key: tuple[int, int]) -> None:
        self._key = key

    @classmethod
    def make(cls, places: Iterable[Place | int], factory: Callable[[], T]) -> PlaceLocal[T]:
        """Run ``factory()`` at each of ``places`` and return the handle."""
        rt = current()
        handle: PlaceLocal[T] = cls((rt.id, rt.next_id()))
        with Finish(solo=True):
            for p in places:
                rt.spawn(p, _store, (handle._key, factory), {}, TASK)
        return handle

    def get(self) -> T:
        """This place's instance."""
        rt = current()
        try:
            return cast(T, rt.place_locals[self._key])  # the table holds every PlaceLocal's: Any
        except KeyError:
            raise ApgasError(f"PlaceLocal {self._key} has no instance at place {rt.id}; "
                             "it was made for other places") from None

    def destroy(self) -> None:
        """Drop this place's instance."""
        current().place_locals.pop(self._key, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlaceLocal, (self._key,))

    def __repr__(self) -> str:
        return f"PlaceLocal{self._key}"


def _store(key: tuple[int, int], factory: Callable[[], Any]) -> None:
    current().place_locals[key] = factory()
