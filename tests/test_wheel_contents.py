"""What the wheel holds, found the way setuptools finds it (its package discovery with
pyproject.toml's include and exclude), without building: the packages users import
and nothing else. ``.ci/wheel-check`` builds the real wheel, installs it and runs it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {"apgas", "apgas_scheduler", "glb", "launcher"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def wheel_packages() -> set[str]:
    """The packages ``[tool.setuptools.packages.find]`` gives (namespaces on by default,
    as setuptools reads it from pyproject.toml)."""
    find = dict(pyproject()["tool"]["setuptools"]["packages"]["find"])
    finder = setuptools.find_namespace_packages if find.pop("namespaces", True) else setuptools.find_packages
    return set(finder(where=str(ROOT / find.pop("where", ["."])[0]), **find))


def test_the_wheel_holds_the_four_public_packages_only():
    """``benchmarks`` and ``tests`` are the repository's: in users' site-packages they
    would shadow distributions of the same name."""
    assert {name.split(".")[0] for name in wheel_packages()} == PUBLIC


def test_every_subpackage_of_the_public_ones_is_in_the_wheel():
    regular = {".".join(init.parent.relative_to(ROOT).parts)
               for package in PUBLIC for init in (ROOT / package).rglob("__init__.py")}
    assert regular - wheel_packages() == set()


def test_the_harnesses_stay_in_the_repository():
    assert (ROOT / "benchmarks" / "__init__.py").exists()
    assert not {name for name in wheel_packages() if name.split(".")[0] in ("benchmarks", "tests")}


def test_licence_fields_are_the_current_ones():
    """An SPDX ``license`` string and ``license-files`` (a table ``license`` is deprecated
    and warns when building); setuptools reads them from version 77 on."""
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").exists()
    assert "setuptools>=77" in "".join(pyproject()["build-system"]["requires"]).replace(" ", "")
