"""The report as a person sees it: index.html opened from disk in headless Chromium (tests/browser.py).

No console errors, every <img> loaded, every internal anchor has its target, the first screen (1280×800)
holds the advice sentence, the speedup figure and the four headline numbers (the speedup over torch DDP's
defaults first), the page with its tables collapsed stays under
8,000 px; a screenshot of the first screen is left beside the report (screenshot.png) for a person to see.
"""

from __future__ import annotations

import pandas as pd
import pytest
from browser import view, why_unavailable
from report_fixtures import CPU_ENV, scaling_rows, write_run

from bench.__main__ import main as bench_main
from bench.report.answer_section import headline_numbers
from bench.run_folder import load_run

pytestmark = pytest.mark.skipif(bool(why_unavailable()), reason=why_unavailable() or "browser available")
MAX_HEIGHT_PX = 8000


def test_the_first_screen_answers_and_the_page_is_sound(tmp_path):
    run = write_run(tmp_path / "run", scaling_rows("cpu"), env=CPU_ENV)
    assert bench_main(["advise", str(run), "--target-gpus", "8"]) == 0
    out = tmp_path / "report"
    assert bench_main(["report", str(run), "--out", str(out)]) == 0
    page = view(out / "index.html", out / "screenshot.png")
    assert page.console_errors == []
    assert page.broken_images == []
    assert page.dangling_anchors == []
    assert page.height_px < MAX_HEIGHT_PX
    assert (out / "screenshot.png").stat().st_size > 0
    sentence = (run / "advice" / "advice.md").read_text().splitlines()[2]
    assert sentence.startswith(("Use ", "Keep ", "No advice ")) and sentence in page.first_screen_text
    advice = pd.read_csv(run / "advice" / "advice.csv")
    advice["answer_role"] = advice["answer_role"].fillna("")
    numbers = headline_numbers(load_run(run).results, advice)
    assert len(numbers) == 4 and numbers.iloc[0]["name"] == "speedup over torch DDP's defaults"
    # the speedup over torch DDP's defaults: its figure and its number, both wholly on the first screen
    assert "plots/speedup.png" in page.first_screen_images
    contender = advice[advice["answer_role"] == "contender"].iloc[0]
    assert f"{contender['speedup_vs_baseline']:.2f}×" in page.first_screen_text
    for _, r in numbers.iterrows():  # each figure, its interval and what it is of, on the first screen
        for text in (r["name"], r["value"], r["interval"]):
            assert text in page.first_screen_text, text
    assert "This is a CPU run" in page.first_screen_text
    assert "5 of 20 cells produced no numbers" in page.first_screen_text
