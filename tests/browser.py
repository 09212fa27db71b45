"""Open a report's index.html in headless Chromium (Debian's chromium + chromedriver, through Selenium) and
read back what a person would see: console errors, images that did not load, internal anchors without a
target, the text of the first screen (1280×800) and the page height with every <details> closed.

`why_unavailable()` says why no browser can be driven here ('' when one can), so a test can skip with it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
WINDOW = (1280, 800)


def _which(names) -> str | None:
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def why_unavailable() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e .[dev])"
    if not _which(CHROMIUM) or not _which(CHROMEDRIVER):
        return "Debian's chromium and chromium-driver are not installed (.ci/run installs them as root)"
    return ""


@dataclass
class PageView:
    console_errors: list[str]
    broken_images: list[str]
    dangling_anchors: list[str]
    first_screen_text: str
    height_px: int


def view(index: Path, screenshot: Path | None = None) -> PageView:
    """Load `index` from disk and read it back; save the first screen to `screenshot` when given."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _which(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(_which(CHROMEDRIVER)), options=options)
    try:
        driver.set_window_size(*WINDOW)
        driver.get(Path(index).resolve().as_uri())
        # the viewport, not the window, is the first screen: make it 1280×800
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        driver.set_window_size(2 * WINDOW[0] - inner[0], 2 * WINDOW[1] - inner[1])
        broken = driver.execute_script(
            "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
            ".map(i => i.getAttribute('src'))")
        dangling = driver.execute_script(
            "return Array.from(document.querySelectorAll('a[href^=\"#\"]')).map(a => a.getAttribute('href'))"
            ".filter(h => !document.getElementById(decodeURIComponent(h.slice(1))))")
        driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = false)")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        first = driver.execute_script(
            "const out = []; const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
            "while (walk.nextNode()) { const n = walk.currentNode; if (!n.textContent.trim()) continue;"
            "const r = n.parentElement.getBoundingClientRect();"
            f"if (r.bottom > 0 && r.top < {WINDOW[1]} && r.width > 0) out.push(n.textContent); }}"
            "return out.join(' ')")
        if screenshot is not None:
            driver.save_screenshot(str(screenshot))
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        return PageView(errors, broken, dangling, " ".join(first.split()), int(height))
    finally:
        driver.quit()
