"""CPU tier: the HTML report rendered in a real headless Chromium (Debian's ``chromium`` package,
driven by Playwright): it loads with no network request and no console error, the plots and
tables are laid out, a task's details open, and a screenshot is taken.  Skipped only when no
Chromium binary is installed (``apt-get install chromium``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from report_data import make_run

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)


def chromium() -> str | None:
    for name in (os.environ.get("CUDAL1_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.mark.skipif(chromium() is None, reason="no Chromium binary (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "report.html"
    assert cli_main(["report", str(make_run(tmp_path / "run")), "--out", str(page_file)]) == 0
    shot = tmp_path / "report.png"
    requests, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            assert page.title().startswith("cudal1 report")
            headings = page.locator("h2").all_inner_texts()
            assert headings[:7] == ["Summary", "Against baselines", "Plots", "Verdicts", "Techniques", "Tasks", "Environment"]
            boxes = [page.locator("svg.plot").nth(i).bounding_box() for i in range(page.locator("svg.plot").count())]
            assert len(boxes) >= 4 and all(b and b["width"] > 300 and b["height"] > 100 for b in boxes), boxes
            # the summary row: 4 tasks attempted, 3 with a verified candidate, geomean 1.44
            row = page.locator("tr.total td").all_inner_texts()
            assert row[:4] == ["all", "4", "3", "1.50"] and row[6] == "2.00", row
            assert "1.44×" in page.locator(".cards").inner_text()
            # the plots' text stays text: a level label inside the distribution plot
            assert page.locator("svg.plot text", has_text="level1").count() >= 1
            # details of a task open and show the diff
            page.locator("details.task summary", has_text="level1/1").first.click()
            diff = page.locator("details.task[open] pre.diff").first
            assert diff.is_visible() and "A.unsqueeze(1) * B" in diff.inner_text()
            env = page.locator("#environment").inner_text()
            assert "NVIDIA H200" in env
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert requests == [page_file.as_uri()], requests  # nothing fetched but the page itself
    assert errors == []
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.width == 1280 and img.height > 2000
    colours = img.resize((160, 400)).getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 50  # not a blank page
