"""Open a report's index.html in headless Chromium (Debian's chromium + chromedriver, through Selenium) and
read back what a person would see: console errors, images that did not load, internal anchors without a
target, the text of the first screen (1280×800) and the images wholly on it, and the page height with every
<details> closed.

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
    first_screen_images: list[str]


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
        images = driver.execute_script(
            "return Array.from(document.images).filter(i => { const r = i.getBoundingClientRect();"
            f" return r.top >= 0 && r.bottom <= {WINDOW[1]} && r.width > 0; }})"
            ".map(i => i.getAttribute('src'))")
        if screenshot is not None:
            driver.save_screenshot(str(screenshot))
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        return PageView(errors, broken, dangling, " ".join(first.split()), int(height), images)
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    """`python tests/browser.py REPORT_DIR [SCREENSHOT]`: the checks on a report made by hand (e.g. the
    `default` preset's run), printed; exit 1 when one fails."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python tests/browser.py REPORT_DIR [SCREENSHOT.png]", file=sys.stderr)
        return 2
    why = why_unavailable()
    if why:
        print(f"no browser: {why}", file=sys.stderr)
        return 2
    page = view(Path(args[0]) / "index.html", Path(args[1]) if len(args) > 1 else None)
    print(f"console errors: {page.console_errors or 'none'}")
    print(f"broken images: {page.broken_images or 'none'}")
    print(f"dangling anchors: {page.dangling_anchors or 'none'}")
    print(f"page height with every table collapsed: {page.height_px:,} px (1280-px-wide window)")
    print(f"first screen: {page.first_screen_text[:400]}…")
    return 1 if page.console_errors or page.broken_images or page.dangling_anchors else 0


if __name__ == "__main__":
    raise SystemExit(main())
