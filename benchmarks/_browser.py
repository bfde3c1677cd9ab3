"""A headless Chromium driven by selenium (Debian's ``chromium`` and
``chromium-driver``, selenium from PyPI), for the tests and benchmarks that
look at pages. The driver is given by path, so selenium never downloads one."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["find_browser", "headless_chromium"]

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def find_browser() -> tuple[str, str] | str:
    """(browser, driver) paths, or the reason no page can be opened here."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    binary = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = next((p for p in map(shutil.which, DRIVER) if p), None)
    if binary is None or driver is None:
        missing = [name for name, path in (("chromium", binary), ("chromium-driver", driver))
                   if path is None]
        return (f"no headless browser: {' and '.join(missing)} not installed "
                "(.ci/install-services installs them)")
    return binary, driver


@contextlib.contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A selenium WebDriver on a headless Chromium with a fresh profile, quit
    (with every process it started) on leaving; RuntimeError if there is none."""
    found = find_browser()
    if isinstance(found, str):
        raise RuntimeError(found)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = found
    profile = tempfile.mkdtemp(prefix="apgas-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-extensions", f"--window-size={width},{height}",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    web = webdriver.Chrome(options=options, service=Service(driver))
    web.set_page_load_timeout(20)
    try:
        yield web
    finally:
        web.quit()
        shutil.rmtree(profile, ignore_errors=True)
