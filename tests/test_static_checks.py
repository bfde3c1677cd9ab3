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
