"""The old name of :mod:`apgas.arrays`, kept for one release.

``apgas.dist`` was renamed because build tools and linters take a ``dist/``
folder for build output (ruff skipped the arrays' files). Importing it, or any
``apgas.dist.X``, warns once and gives the very module of ``apgas.arrays``
(``apgas.dist.apps is apgas.arrays.apps``), so isinstance checks and module
state are shared.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from apgas import arrays as _arrays

warnings.warn("apgas.dist is renamed apgas.arrays; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

_OLD, _NEW = "apgas.dist.", "apgas.arrays."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``apgas.dist.X`` as the module ``apgas.arrays.X`` itself."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(_NEW + spec.name[len(_OLD):])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran under its new name already."""


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = _arrays
