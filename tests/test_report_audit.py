"""Unit tier: a verify run's audit (``verify_report.json`` beside the store) in every report format:
the JSON document's ``audit`` (records sorted, ratios, class counts per level), the Markdown
tables, the HTML section with its claimed-vs-measured scatter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from cudal1.report.verify import summarize
from report_data import make_run

# written out of order: level1/10 before level1/2 (numeric problem ids), the level-less task first
ROWS = [
    {
        "task": "mytask", "level": None, "class": "verified", "claimed": None, "measured": 1.3,
        "status": "ok", "flags": [],
    },
    {
        "task": "level1/10", "level": 1, "class": "verified", "claimed": 2.0, "measured": 1.9, "status": "ok",
        "flags": ["no_custom_kernel"],
    },
    {
        "task": "level3/3", "level": 3, "class": "degenerate_task", "claimed": 4.0, "measured": 2.0,
        "status": "ok", "flags": ["degenerate_task"],
    },
    {
        "task": "level1/2", "level": 1, "class": "slower_than_claimed", "claimed": 3.0, "measured": 1.5,
        "status": "ok", "flags": ["high_variance"],
    },
    {
        "task": "level2/1", "level": 2, "class": "incorrect", "claimed": 1.2, "measured": None,
        "status": "incorrect", "flags": ["value_mismatch"],
    },
    {
        "task": "level1/1", "level": 1, "class": "missing_code", "claimed": None, "measured": None,
        "status": None, "flags": [],
    },
]
ORDER = ["level1/1", "level1/2", "level1/10", "level2/1", "level3/3", "mytask"]


def _audited_run(tmp_path: Path, **extra) -> Path:
    run = make_run(tmp_path / "run")
    report = {
        "summary": summarize(ROWS), "records": ROWS, "environment": None, "config": {},
        "file": "release.jsonl", **extra,
    }
    (run / "verify_report.json").write_text(json.dumps(report))
    return run


def _json(run: Path, capsys) -> dict:
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    return json.loads([line for line in capsys.readouterr().out.splitlines() if line.strip()][-1])


def test_json_audit_records(tmp_path, capsys):
    audit = _json(_audited_run(tmp_path), capsys)["audit"]
    assert audit["file"] == "release.jsonl" and audit["summary"]["classes"]["verified"] == 2  # kept as written
    assert audit["slack"] == 0.8  # none in the report: verify's default
    assert [r["task"] for r in audit["records"]] == ORDER
    by_task = {r["task"]: r for r in audit["records"]}
    assert set(by_task["level1/2"]) == {"task", "level", "class", "claimed", "measured", "ratio", "status", "flags"}
    assert by_task["level1/2"]["ratio"] == pytest.approx(0.5)
    assert by_task["level1/10"]["ratio"] == pytest.approx(0.95)
    assert by_task["level3/3"]["ratio"] == pytest.approx(0.5) and by_task["level3/3"]["class"] == "degenerate_task"
    assert by_task["mytask"]["ratio"] is None and by_task["mytask"]["level"] is None  # no claim
    assert by_task["level2/1"]["ratio"] is None and by_task["level2/1"]["status"] == "incorrect"  # nothing measured
    assert by_task["level1/1"] == {"task": "level1/1", "level": 1, "class": "missing_code", "claimed": None,
                                   "measured": None, "ratio": None, "status": None, "flags": []}
    assert audit["per_level"] == {
        "level1": {"verified": 1, "slower_than_claimed": 1, "missing_code": 1},
        "level2": {"incorrect": 1},
        "level3": {"degenerate_task": 1},
        "other": {"verified": 1},
    }


def test_json_audit_without_per_level_counts_records(tmp_path, capsys):
    run = _audited_run(tmp_path, slack=0.6)
    report = json.loads((run / "verify_report.json").read_text())
    del report["summary"]["per_level"]
    (run / "verify_report.json").write_text(json.dumps(report))
    audit = _json(run, capsys)["audit"]
    assert audit["slack"] == 0.6
    assert audit["per_level"]["level1"] == {"verified": 1, "slower_than_claimed": 1, "missing_code": 1}
    assert audit["per_level"]["other"] == {"verified": 1}


def test_markdown_audit(tmp_path, capsys):
    assert cli_main(["report", str(_audited_run(tmp_path)), "--format", "md"]) == 0
    md = capsys.readouterr().out
    md = md[md.index("## Audit against published claims"):md.index("## Environment")]
    assert "| class | level1 | level2 | level3 | other | all |" in md
    assert "| verified | 1 | 0 | 0 | 1 | 2 |" in md
    assert "| missing_code | 1 | 0 | 0 | 0 | 1 |" in md
    assert "| task | class | claimed | measured | ratio | flags |" in md
    rows = re.findall(r"^\| (level\d/\d+|mytask) \|.*$", md, re.M)
    assert rows == ORDER
    assert "| level1/2 | slower_than_claimed | 3.00 | 1.50 | 0.500 | high_variance |" in md
    assert "| level2/1 | incorrect | 1.20 | - | - | value_mismatch |" in md
    assert "| level1/1 | missing_code | - | - | - | - |" in md
    assert "| mytask | verified | - | 1.30 | - | - |" in md


def test_html_audit_section(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli_main(["report", str(_audited_run(tmp_path, slack=0.6)), "--out", str(out)]) == 0
    page = out.read_text()
    assert '<a href="#audit">' in page
    section = page[page.index('<section id="audit">'):]
    section = section[:section.index("</section>")]
    assert "Audit against published claims" in section
    svg = section[section.index("<svg"):section.index("</svg>")]
    # text stays text: axis labels, the two lines and one legend entry per plotted class
    for text in ("claimed speedup (log)", "measured speedup (log)", "measured = claimed", "measured = 0.6 × claimed",
                 "verified (1)", "slower_than_claimed (1)", "degenerate_task (1)"):
        assert text in svg, text
    assert "incorrect (" not in svg and "missing_code (" not in svg  # nothing measured: not plotted
    body = section[section.index("<tbody>"):section.index("</tbody>")]
    rows = re.findall(r"<tr><td class=\"l\">([^<]+)</td>", body)
    assert rows == ORDER
    assert re.search(
        r'level1/2</td>.*?slower_than_claimed</td>\s*<td>3\.00</td><td>1\.50</td>\s*<td class="bad">0\.500</td>',
        body,
        re.S,
    )
    assert re.search(r'level1/10</td>.*?<td class="">0\.950</td>', body, re.S)  # above the 0.6 slack
    # class counts per level: verified is 1 in level1, 1 in other, 2 in all
    assert re.search(r"verified</td>\s*<td>1</td><td>0</td><td>0</td><td>1</td><td><b>2</b></td>", section)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page)


def test_no_audit_section_without_verify_report(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli_main(["report", str(make_run(tmp_path / "run")), "--out", str(out)]) == 0
    assert 'id="audit"' not in out.read_text()
    assert "audit" not in _json(tmp_path / "run", capsys)
