"""The annotations and the code's hygiene are checked, as trio, Dask and pyzmq check
theirs: mypy with the configuration in pyproject.toml (strict for apgas and glb),
and ruff with its chosen rules (pyflakes, bugbear, pyupgrade, import order)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.timeout(600)
def test_mypy_passes():
    out = _run("mypy")  # the files and options: pyproject.toml's [tool.mypy]
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


@pytest.mark.timeout(120)
def test_ruff_passes():
    out = _run("ruff", "check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


@pytest.mark.timeout(120)
def test_ruff_checks_every_package_of_ours():
    """A folder ruff excludes by default (``dist``, ``build``) would hide code from the
    lint, as ``apgas/dist`` hid the arrays' 2.6k lines; the arrays are apgas.arrays now."""
    out = _run("ruff", "check", "--no-cache", "--show-files", ".")
    checked = {Path(line.strip()).resolve() for line in out.stdout.splitlines() if line.strip()}
    ours = [p for package in ("apgas", "glb", "launcher", "apgas_scheduler")
            for p in (ROOT / package).rglob("*.py") if "dist" not in p.relative_to(ROOT).parts]
    missed = sorted(str(p.relative_to(ROOT)) for p in ours if p.resolve() not in checked)
    assert not missed, f"ruff skips {len(missed)} file(s) of ours: {missed[:10]}"
    assert any("arrays" in p.parts for p in checked)


@pytest.mark.timeout(60)
def test_the_old_name_of_the_arrays_warns_and_is_the_same_module():
    code = ("import warnings, sys; warnings.simplefilter('error')\n"
            "try:\n    import apgas.dist\nexcept DeprecationWarning as e:\n    print(e)\n"
            "warnings.simplefilter('ignore')\n"
            "import apgas.dist, apgas.arrays, apgas.dist.apps.jacobi as old, apgas.arrays.apps.jacobi as new\n"
            "print(apgas.dist is apgas.arrays, old is new)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["apgas.dist is renamed apgas.arrays; the old name goes in "
                                       "the next release", "True True"], out.stdout
