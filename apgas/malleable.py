"""Malleability: a running program gains and loses places on a scheduler's orders.

Two seams, one on each side of the runtime:

- The program registers a :class:`MalleableHandler` with
  ``apgas.define_malleable_handler``; the runtime calls it before and after
  each change of the places.
- A :class:`MalleableCommunicator` receives the scheduler's orders and calls
  the runtime's side of them, an :class:`Orders` (its ``orders`` attribute),
  which carries them out through the handler; it reports back what the
  runtime tells it. The default, :class:`SocketMalleableCommunicator`, speaks
  the line protocol of ``docs/protocol.md``; others are plugins, found by
  :func:`communicator_class` (``APGAS_COMMUNICATOR``). ``docs/communicators.md``
  is the guide to writing one, with a complete example.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re

from launcher._entry_points import load_entry_point

from ._malleability.base import MalleableCommunicator, MalleableHandler, OrderError, Orders
from ._malleability.socket_communicator import SocketMalleableCommunicator
from .errors import ConfigError

__all__ = ["MalleableHandler", "MalleableCommunicator", "Orders", "SocketMalleableCommunicator",
           "OrderError", "communicator_class"]


def communicator_class(name: str) -> type[MalleableCommunicator]:
    """The communicator class that ``name`` (``APGAS_COMMUNICATOR``) stands for:

    - ``socket`` or "": :class:`SocketMalleableCommunicator`;
    - ``module:Class``: the class ``Class`` of ``module``, imported at place 0
      from ``sys.path`` (where the program's own directory is), for a plugin
      that is not installed as a package;
    - any other name: the entry point of that name in the group
      ``apgas.communicators`` (``slurm`` is one).

    ``ConfigError`` names what is wrong: an unknown name, a module that cannot be
    imported, or an object that is no subclass of :class:`MalleableCommunicator`."""
    if name in ("", "socket"):
        return SocketMalleableCommunicator
    if ":" in name:
        return _class_named(name)
    found = importlib.metadata.entry_points(group="apgas.communicators", name=name)
    for entry in found:
        return _communicator(name, entry.value, load_entry_point(
            entry, ConfigError, f"the communicator {name!r} (APGAS_COMMUNICATOR): "))
    known = ["socket"] + [e.name for e in importlib.metadata.entry_points(group="apgas.communicators")]
    raise ConfigError(f"unknown communicator {name!r} (APGAS_COMMUNICATOR); known: {known}, "
                      "or module:Class")


_MODULE_CLASS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _class_named(name: str) -> type[MalleableCommunicator]:
    """The class of a ``module:Class`` value of ``APGAS_COMMUNICATOR``."""
    if not _MODULE_CLASS.fullmatch(name):
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR) must be a name, or "
                          "module:Class such as file_communicator:FileCommunicator")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR): cannot import "
                          f"{module_name!r}: {e}") from None
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise ConfigError(f"the communicator {name!r} (APGAS_COMMUNICATOR): module "
                          f"{module_name!r} has no {class_name!r}") from None
    return _communicator(name, name, cls)




def _communicator(name: str, where: str, cls: object) -> type[MalleableCommunicator]:
    if not (isinstance(cls, type) and issubclass(cls, MalleableCommunicator)):
        raise ConfigError(f"the communicator {name!r} ({where}, APGAS_COMMUNICATOR) is "
                          f"{cls!r}, not a subclass of apgas.malleable.MalleableCommunicator")
    return cls
