"""CPU tier: the HTML report rendered in a real headless Chromium (Debian's ``chromium`` or
``chromium-headless-shell`` package, or ``$CUDAL1_CHROMIUM``, driven by Playwright), at 1280 and
800 px: it loads with no network request and no console error; nothing runs off the page or out
of its card; the plots and tables are laid out; the environment is a table of short rows and
counts one environment; no table repeats a row; baselines carry plain names; a task's name is
shown once; the builtin policy's pass list is labelled as such; an ``evaluate`` run shows its
rates and pass@k.  Screenshots of both widths are written (to ``$CUDAL1_REPORT_SHOTS`` when set,
to look at).  Skipped only when no Chromium binary is installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from report_data import add_evaluation, make_run

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

CHROMIUM_NAMES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome", "headless_shell")
WIDTHS = (1280, 800)

# Elements whose box runs past the viewport's right edge, or past the right edge of the card or
# section holding them, unless a scrolling (or clipping) box between them keeps it inside.
OVERFLOW_JS = """() => {
  const vw = document.documentElement.clientWidth;
  const scrolls = (el, stop) => {
    for (let p = el.parentElement; p && p !== stop; p = p.parentElement) {
      if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const out = [];
  const name = el => el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).split(' ')[0] : '');
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > vw + 1 && !scrolls(el, null)) out.push(name(el) + ' right ' + Math.round(r.right));
  }
  for (const box of document.querySelectorAll('details.task, main > section, .card')) {
    const edge = box.getBoundingClientRect().right + 1;
    for (const el of box.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.width && r.right > edge && !scrolls(el, box)) out.push(name(el) + ' out of ' + name(box));
    }
  }
  return {scroll: document.documentElement.scrollWidth, vw: vw, out: out.slice(0, 10)};
}"""

DUPLICATE_ROWS_JS = """() => Array.from(document.querySelectorAll('table')).flatMap(t => {
  const rows = Array.from(t.querySelectorAll('tr')).map(r => r.innerText.trim());
  return rows.filter((r, i) => rows.indexOf(r) !== i);
})"""


def chromium() -> str | None:
    for name in (os.environ.get("CUDAL1_CHROMIUM"), *CHROMIUM_NAMES):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.mark.skipif(
    chromium() is None, reason="no Chromium binary (apt-get install chromium-headless-shell, or chromium)"
)
def test_report_renders_in_headless_chromium(tmp_path: Path):
    from playwright.sync_api import sync_playwright

    run = make_run(tmp_path / "run")
    evaluation = add_evaluation(run)
    page_file = tmp_path / "report.html"
    assert cli_main(["report", str(run), "--out", str(page_file)]) == 0
    shots = Path(os.environ.get("CUDAL1_REPORT_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    requests, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.on("request", lambda r: requests.append(r.url))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(page_file.as_uri())
                page.wait_for_load_state("load")
                if width == WIDTHS[0]:
                    _content(page, evaluation)
                for details in page.locator("details.task").all():  # the widest content: code side by side
                    details.evaluate("e => e.open = true")
                overflow = page.evaluate(OVERFLOW_JS)
                assert overflow["scroll"] <= width and overflow["out"] == [], (width, overflow)
                boxes = [b for b in (p.bounding_box() for p in page.locator("svg.plot").all()) if b]
                assert len(boxes) >= 4 and all(b["width"] > 300 and b["height"] > 100 for b in boxes), boxes
                _screenshot(page, shots / f"report-{width}.png")
                page.close()
        finally:
            browser.close()
    assert set(requests) == {page_file.as_uri()}, requests  # nothing fetched but the page itself
    assert errors == []
    from PIL import Image

    for width in WIDTHS:
        img = Image.open(shots / f"report-{width}.png").convert("RGB")
        assert img.width == width and img.height > 2000
        colours = img.resize((160, 400)).getcolors(maxcolors=1 << 16)
        assert colours is not None and len(colours) > 50  # not a blank page


def _screenshot(page, path: Path, attempts: int = 3) -> None:
    """A full-page screenshot.  On a loaded machine a headless shell now and then answers "Unable to
    capture screenshot" for a tall page (its compositor missed the capture's deadline): wait and
    ask again, the last time with the viewport grown to the whole page."""
    import time

    from playwright.sync_api import Error

    for attempt in range(attempts):
        try:
            if attempt == attempts - 1:
                page.set_viewport_size({"width": page.viewport_size["width"],
                                        "height": page.evaluate("document.documentElement.scrollHeight")})
                page.screenshot(path=str(path))
            else:
                page.screenshot(path=str(path), full_page=True)
            return
        except Error:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)


def _content(page, evaluation: dict) -> None:
    assert page.title().startswith("cudal1 report")
    headings = page.locator("h2").all_inner_texts()
    assert headings[:8] == ["Summary", "Evaluation", "Against baselines", "Plots", "Verdicts", "Techniques", "Tasks",
                            "Environment"], headings
    # the summary row: 4 tasks attempted, 3 with a verified candidate, geomean 1.32 over all 4 (the unsolved one at
    # 1.0x, the default convention; 1.44 over the 3 solved ones, shown beside); one row per group
    row = page.locator("tr.total td").first.locator("xpath=..").locator("td").all_inner_texts()
    assert row[:4] == ["all", "4", "3", "1.38"] and row[6] == "2.00", row
    assert "1.32×" in page.locator(".cards").inner_text()
    assert page.evaluate(DUPLICATE_ROWS_JS) == []
    # an evaluate run: its rates and pass@k, as evaluation.json holds them
    ev = page.locator("#evaluation").inner_text()
    assert "pass@1" in ev and "pass@4" in ev and f"{round(100 * evaluation['ok_rate'])}%" in ev, ev
    # baselines by plain names, not registry keys
    base = page.locator("#baselines table").inner_text()
    assert "torch.compile, default mode" in base and "compile-default" not in base, base
    assert page.locator("svg.plot text", has_text="level1").count() >= 1  # the plots' text stays text
    # a task's name once; the builtin policy's pass list labelled as such, and no label taken from it
    mytask = page.locator("details.task", has_text="mytask").first
    assert mytask.locator("summary").inner_text().count("mytask") == 1
    mytask.locator("summary").click()
    titles = mytask.locator("h3").all_inner_texts()
    assert "Passes the builtin policy applied (its own account, not a model's analysis)" in titles, titles
    assert "Model's analysis" not in titles
    tags = page.locator("#tasks tr", has_text="mytask").locator(".tag").all_inner_texts()
    assert "operation_fusion" not in tags and "algebraic_shortcut" in tags, tags
    page.locator("details.task summary", has_text="level1/1").first.click()
    diff = page.locator("details.task[open] pre.diff").first
    assert diff.is_visible() and "A.unsqueeze(1) * B" in diff.inner_text()
    # the environment: one environment, every entry a short row of its own
    env = page.locator("#environment")
    assert "NVIDIA H200" in env.inner_text() and "These runs hold" not in env.inner_text()
    assert "isolation: netns" in env.locator("table.env th").all_inner_texts()
    assert not any("{" in c for c in env.locator("table.env td").all_inner_texts())
