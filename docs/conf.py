"""Sphinx configuration of the apgas documentation.

Build with ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html``;
``tests/test_docs.py`` runs the same build and fails on any warning.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document the working tree, installed or not

project = "apgas"
author = "the apgas authors"
copyright = "the apgas authors, MIT licence"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "results/*.md"]  # tables the harnesses write; pages include them

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Offline and quiet: no intersphinx (no network), no nitpicking of every type name.
nitpicky = False
autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# Optional dependencies the documented modules may import lazily.
autodoc_mock_imports: list[str] = []

html_theme = "furo"
html_title = "apgas"
html_static_path: list[str] = []
