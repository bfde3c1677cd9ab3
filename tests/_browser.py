"""The ``browser`` fixture: a headless Chromium (``benchmarks._browser``) for
the tests that look at pages; they skip, saying what is missing, without one."""

from __future__ import annotations

import pytest

from benchmarks._browser import find_browser, headless_chromium

__all__ = ["browser"]


@pytest.fixture(scope="module")
def browser():
    """A selenium WebDriver on headless Chromium, 1400x1000, one per test module."""
    found = find_browser()
    if isinstance(found, str):
        pytest.skip(found)
    with headless_chromium() as web:
        yield web
