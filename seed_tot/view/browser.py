"""Open a written page in headless Chromium (Selenium): the page's tests, its load-time benchmark
and the README screenshot all look at it the way a person would, from disk.

Chromium is the system browser (Debian's `chromium` and `chromium-driver` packages); nothing is
downloaded. Every background service that would reach the network is switched off, so the
requests the page itself makes are the only ones in the log.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver",)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
         "--disable-extensions")


def find_chromium() -> tuple[str, str] | None:
    """(browser, driver) paths, or None when either is not installed (`$CHROMIUM`/`$CHROMEDRIVER` win)."""
    browser = _which(os.environ.get("CHROMIUM"), BROWSER_NAMES)
    driver = _which(os.environ.get("CHROMEDRIVER"), DRIVER_NAMES)
    return (browser, driver) if browser and driver else None


def _which(given: str | None, names: tuple[str, ...]) -> str | None:
    if given:  # an explicit choice is used or reported missing, never replaced by another install
        return shutil.which(given)
    return next(filter(None, map(shutil.which, names)), None)


def missing_reason() -> str | None:
    """Why the browser checks cannot run here, or None when they can. Only a missing browser is a
    reason: selenium is in the `test` extra, so its absence is an install error, not a skip."""
    if find_chromium() is None:
        return ("no chromium and chromedriver found on PATH (apt-get install chromium chromium-driver, "
                "or set CHROMIUM and CHROMEDRIVER)")
    return None


@contextmanager
def headless_chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A Selenium driver on a fresh profile; its browser and performance logs are recorded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise RuntimeError(missing_reason() or "chromium not found")
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="seed-tot-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        # The browser starts on its own new-tab page, which differs between Chromium builds (some load
        # chrome-untrusted:// parts and images); leave it and drop its log lines, so the logs begin
        # at the first page the caller opens.
        driver.get("about:blank")
        driver.get_log("performance")
        driver.get_log("browser")
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, path: str | Path, fragment: str = "") -> None:
    """Load the page from disk and wait until its script has drawn the list (body[data-ready])."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(path).resolve().as_uri() + fragment)
    WebDriverWait(driver, 120).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


# Schemes the browser serves from itself (its new-tab page and that page's parts, e.g.
# chrome-untrusted://new-tab-page/...); none leaves the machine.
BROWSER_INTERNAL_SCHEMES = ("chrome://", "chrome-untrusted://", "chrome-search://", "chrome-extension://",
                            "devtools://")


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser asked for since the last call (from the DevTools network events),
    except those of the browser's own pages (BROWSER_INTERNAL_SCHEMES)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return [url for url in urls if not url.startswith(BROWSER_INTERNAL_SCHEMES)]
