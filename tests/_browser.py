"""A headless Chromium driven by selenium, for the tests that look at pages.

Debian's ``chromium`` and ``chromium-driver`` (``.ci/install-services``) and
selenium (the ``dev`` extra) are needed; without them the tests skip, saying
which is missing. The driver is given by path, so selenium never tries to
download one. One browser serves a test module and is quit after it.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

__all__ = ["browser", "find_browser"]

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def find_browser() -> tuple[str, str] | str:
    """(browser, driver) paths, or the reason the browser tests cannot run."""
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


@pytest.fixture(scope="module")
def browser():
    """A selenium WebDriver on headless Chromium, 1400x1000."""
    found = find_browser()
    if isinstance(found, str):
        pytest.skip(found)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = found
    profile = tempfile.mkdtemp(prefix="apgas-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-extensions", "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    web = webdriver.Chrome(options=options, service=Service(driver))
    web.set_page_load_timeout(20)
    try:
        yield web
    finally:
        web.quit()
        shutil.rmtree(profile, ignore_errors=True)
