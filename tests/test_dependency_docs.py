"""The dependency lists of the README and docs/getting-started.md say what
pyproject.toml installs (issue 42: they had drifted apart)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def name(requirement: str) -> str:
    """``dask[distributed]>=2023.1`` -> ``dask``."""
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def mentioned(text: str, package: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(package)}(?![\w-])", text, re.IGNORECASE) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_runtime_dependencies_are_all_named(doc):
    sentence = next(line for line in doc.read_text().splitlines() if "needs only" in line)
    for requirement in PROJECT["dependencies"]:
        assert mentioned(sentence, name(requirement)), (doc.name, requirement, sentence)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_each_extra_row_names_what_it_installs(doc):
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `(\w+)` \| ([^|]+)\|", doc.read_text(), re.MULTILINE)}
    for extra, requirements in PROJECT["optional-dependencies"].items():
        assert extra in rows, f"{doc.name} has no row for the extra {extra!r}"
        for requirement in requirements:
            package = name(requirement)
            if package == "apgas":  # another extra, named by its own name
                for inner in re.findall(r"\[(.+)\]", requirement)[0].split(","):
                    assert mentioned(rows[extra], inner.strip()), (doc.name, extra, inner)
                continue
            assert mentioned(rows[extra], package), (doc.name, extra, package, rows[extra])
