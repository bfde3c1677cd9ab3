"""The scheduler's old name, kept as an alias of :mod:`apgas_scheduler` for one release.

``scheduler`` is taken on PyPI, so the package moved to ``apgas_scheduler``.
``import scheduler``, ``from scheduler.policies import ...`` and
``python -m scheduler ...`` still work and warn; they go away in 0.3.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

warnings.warn("the package 'scheduler' is now 'apgas_scheduler'; the old name goes away in 0.3",
              DeprecationWarning, stacklevel=2)

from apgas_scheduler import *  # noqa: E402,F401,F403
from apgas_scheduler import __all__  # noqa: E402,F401


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``scheduler.X`` to the module ``apgas_scheduler.X`` itself (not a copy)."""

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name.startswith(__name__ + ".") and name != __name__ + ".__main__":
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module("apgas_scheduler" + spec.name[len(__name__):])

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name already."""


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
