"""The exceptions of the APGAS runtime.

Every error the runtime raises is an :class:`ApgasError`; task failures are
collected by their ``finish`` into a :class:`MultipleException`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar, overload

__all__ = [
    "ApgasError",
    "ConfigError",
    "DeadPlaceError",
    "LimitError",
    "MultipleException",
    "RemoteError",
    "NotRunningError",
]


class ApgasError(RuntimeError):
    """Base class of the runtime's own errors."""


class ConfigError(ApgasError, ValueError):
    """A configuration value (keyword argument or ``APGAS_*`` variable) is invalid."""


class LimitError(ApgasError):
    """A limit of the operating system or of a library (open descriptors, ZeroMQ
    sockets, processes, memory) would be passed: raised before places start.

    ``limit`` names it (``RLIMIT_NOFILE``, ``ZMQ_MAX_SOCKETS``, ``RLIMIT_NPROC``,
    ``kernel.pid_max``, ``MemAvailable``), ``value`` is its value; the message says
    what the run needs and how to raise the limit."""

    def __init__(self, limit: str, value: int, message: str) -> None:
        self.limit = limit
        self.value = value
        self.message = message
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (LimitError, (self.limit, self.value, self.message), self.__dict__)


class NotRunningError(ApgasError):
    """An APGAS construct was used outside of ``apgas.run``."""


class DeadPlaceError(ApgasError):
    """A task was spawned at, or waited on, a place that has left or died."""

    def __init__(self, place_id: int, reason: str = "") -> None:
        self.place_id = place_id
        self.reason = reason
        text = f"place {place_id} is dead or has left the computation"
        super().__init__(f"{text}: {reason}" if reason else text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeadPlaceError, (self.place_id, self.reason), self.__dict__)


class RemoteError(ApgasError):
    """Stand-in for a remote exception that could not be pickled.

    Keeps the original class name, message and traceback text.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.remote_traceback = traceback_text
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteError, (self.type_name, self.message, self.remote_traceback), self.__dict__)


_E = TypeVar("_E", bound=Exception)
_B = TypeVar("_B", bound=BaseException)


class MultipleException(ExceptionGroup[Exception]):
    """The exceptions of the tasks of one ``finish`` (an :class:`ExceptionGroup`).

    Each inner exception carries PEP 678 notes naming the place, host and pid
    where it was raised, and the remote traceback text in
    ``remote_traceback``.
    """

    def __new__(cls, message: str, exceptions: Sequence[Exception]) -> Self:
        return super().__new__(cls, message, exceptions)

    # split() and subgroup() (and so ``except*``) rebuild the group with derive():
    # keep it a MultipleException. They pass only this group's own exceptions, but
    # derive() is public: a BaseException among them makes a BaseExceptionGroup,
    # as ExceptionGroup.derive does, not a TypeError.
    @overload
    def derive(self, excs: Sequence[_E], /) -> ExceptionGroup[_E]: ...
    @overload
    def derive(self, excs: Sequence[_B], /) -> BaseExceptionGroup[_B]: ...
    def derive(self, excs: Sequence[BaseException], /) -> BaseExceptionGroup[BaseException]:
        exceptions = [e for e in excs if isinstance(e, Exception)]
        if len(exceptions) < len(excs):
            return BaseExceptionGroup(self.message, excs)
        return MultipleException(self.message, exceptions)
