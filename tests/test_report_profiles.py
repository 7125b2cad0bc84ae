"""report.profiles: the kernel breakdowns (reference against best, stacked bars) and the roofline
plot, from profiles recorded with a run's verdicts; rendered as HTML, and in headless Chromium."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from cudal1.profile import BoundClass, KernelStat, Profiles, ProfileStatus, ProgramProfile
from cudal1.profile.rules import derive
from cudal1.report.load import load_runs
from cudal1.report.profiles import kernel_bars, profile_section, roofline
from cudal1.store import RunStore
from report_data import make_run

pytest.importorskip("matplotlib")

H200_BW, H200_FP32 = 4.8e12, 67e12


def _program(kernels: list[tuple[str, float, int]], bytes_moved: int, flops: int, gpu: bool = True) -> ProgramProfile:
    total = sum(t for _, t, _ in kernels)
    p = ProgramProfile(status=ProfileStatus.OK, device="cuda" if gpu else "cpu", call_us=total * 1.1, busy_us=total,
                       kernels=[KernelStat(n, c, t, t / c, t / total) for n, t, c in kernels])
    return derive(p, bytes_moved, flops, H200_BW if gpu else None, H200_FP32 if gpu else None)


REF = [("ampere_sgemm_128x64_nn", 800.0, 1), ("void at::native::vectorized_elementwise_kernel<4, Add>", 150.0, 3),
       ("void at::native::reduce_kernel<512, 1>", 60.0, 1)] + [(f"small_kernel_{i}", 5.0, 1) for i in range(6)]
BEST = [("fused_gemm_bias_relu", 400.0, 1), ("Memcpy DtoD (Device -> Device)", 20.0, 1)]


def _profiled_run(tmp_path: Path, gpu: bool = True) -> Path:
    """The report tests' synthetic run, with profiles on level1/1's anchor and best candidate."""
    run = make_run(tmp_path / "run")
    with RunStore(run / "cudal1.sqlite") as store:
        evals = [r for r in store.evaluations() if r.task_name == "1_Diag"]
        anchor = next(r for r in evals if r.speedup == 1.0)
        best = next(r for r in evals if r.speedup == 2.0)
        ref = _program(REF, 2**31, 2**32, gpu)  # 2 FLOP/byte: under half the H200 fp32 ridge (14)
        anchor.profile = Profiles(reference=ref, candidate=ref)
        best.profile = Profiles(reference=ref, candidate=_program(BEST, 2**31, 2**32, gpu))
        store.record_evaluation(anchor)
        store.record_evaluation(best)
    return run


def _doc(run: Path):
    from cudal1.report.document import build_report

    data = load_runs([run])
    return build_report(data), data


def test_only_tasks_with_profiles_get_a_breakdown(tmp_path):
    doc, data = _doc(_profiled_run(tmp_path))
    section = profile_section(doc, data)
    assert [t["task"] for t in section["tasks"]] == ["level1/1"]
    (t,) = section["tasks"]
    assert t["reference"].startswith("1.14 ms call, busy 90.9%, 11 launches") and "memory-bound" in t["reference"]
    assert "launches" in t["best"] and t["bars"].startswith("<svg") and section["roofline"].startswith("<svg")
    assert section["note"] == ""


def test_a_run_without_profiles_shows_no_section(tmp_path):
    doc, data = _doc(make_run(tmp_path / "run"))
    assert profile_section(doc, data) == {"roofline": "", "tasks": [], "note": ""}


def test_bars_stack_the_top_kernels_and_the_rest(tmp_path):
    svg = kernel_bars(_program(REF, 1, 1), _program(BEST, 1, 1))
    # 6 named segments + "other kernels" for the reference, 2 for the best: 9 bars in all
    assert len(re.findall(r'<g id="patch_\d+">', svg)) >= 9
    assert "other kernels" in svg and "fused_gemm_bias_relu" in svg and "ampere_sgemm_128x64_nn" in svg
    assert kernel_bars(None, None) == ""


def test_roofline_draws_both_ceilings_on_the_gpu_and_none_on_the_cpu(tmp_path):
    gpu = roofline([("t", _program(REF, 2**26, 2**36), _program(BEST, 2**26, 2**36))])
    assert "peak bandwidth 4.8 TB/s" in gpu and "peak 67 TFLOP/s" in gpu and "t reference" in gpu and "t best" in gpu
    cpu = roofline([("t", _program(REF, 2**26, 2**36, gpu=False), None)])
    assert cpu.startswith("<svg") and "peak" not in cpu
    no_flops = ProgramProfile(status=ProfileStatus.OK, call_us=1.0, busy_us=1.0, bound=BoundClass.MEMORY)
    assert roofline([("t", no_flops, None)]) == ""


def test_the_html_report_has_the_section(tmp_path):
    run = _profiled_run(tmp_path)
    page = tmp_path / "report.html"
    assert cli_main(["report", str(run), "--out", str(page)]) == 0
    html = page.read_text()
    assert html.count('id="profiles"') == 1 and "Kernel profiles" in html and "information, never part of a verdict" \
        in html
    assert html.index('id="profiles"') < html.index('id="environment"')


# boxes in the profiles section that run past the viewport's right edge (the page must not scroll sideways)
OVERFLOW_JS = """() => {
  const vw = document.documentElement.clientWidth;
  return Array.from(document.querySelectorAll('#profiles *')).filter(el => {
    const r = el.getBoundingClientRect();
    return r.width && r.right > vw + 1;
  }).map(el => el.tagName.toLowerCase()).slice(0, 10);
}"""


def chromium() -> str | None:
    """Debian's chromium (or $CUDAL1_CHROMIUM), as tests/test_report_browser.py finds it."""
    import shutil

    for name in (os.environ.get("CUDAL1_CHROMIUM"), "chromium", "chromium-headless-shell", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.mark.cpu
@pytest.mark.skipif(chromium() is None, reason="no Chromium binary (apt-get install chromium)")
def test_the_section_renders_in_headless_chromium(tmp_path):
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "report.html"
    assert cli_main(["report", str(_profiled_run(tmp_path)), "--out", str(page_file)]) == 0
    shots = Path(os.environ.get("CUDAL1_REPORT_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            for width in (1280, 800):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(page_file.as_uri())
                section = page.locator("#profiles")
                assert section.count() == 1
                svgs = section.locator("svg")
                assert svgs.count() == 2  # the roofline and one task's bars
                for i in range(svgs.count()):
                    box = svgs.nth(i).bounding_box()
                    assert box and box["width"] > 300 and box["height"] > 100, box
                assert page.evaluate(OVERFLOW_JS) == []
                section.screenshot(path=str(shots / f"profiles_{width}.png"))
                page.close()
        finally:
            browser.close()
