"""The documentation builds with Sphinx, every warning an error.

Runs the documented command, ``.venv/bin/sphinx-build -W --keep-going -b html docs
docs/_build/html``, into a temporary directory, so a broken page, link or docstring of
a documented module fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_SECONDS = 180
pytestmark = pytest.mark.timeout(BUILD_SECONDS + 20)


def sphinx_build() -> list[str]:
    """The sphinx-build of this interpreter's environment (``.venv/bin/sphinx-build``)."""
    beside = Path(sys.executable).with_name("sphinx-build")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("sphinx-build")
    if found is None:
        pytest.fail('sphinx-build is missing: install the docs extra (pip install -e ".[docs]"; '
                    'the dev extra includes it)')
    return [found]


def test_the_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    command = [*sphinx_build(), "-W", "--keep-going", "-b", "html", "docs", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=BUILD_SECONDS)
    report = f"{' '.join(command)} exited {done.returncode}\n{done.stderr}\n{done.stdout[-3000:]}"
    assert done.returncode == 0, report
    assert "WARNING" not in done.stderr and "ERROR" not in done.stderr, report
    for page in ("index", "getting-started", "glb", "api/apgas", "api/glb", "api/launcher",
                 "api/scheduler", "protocol", "design", "results"):
        assert (out / f"{page}.html").exists(), f"{page}.html was not built\n{report}"
