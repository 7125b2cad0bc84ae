"""Unit tier: ``cudal1 report`` / ``export`` / ``compare`` over a synthetic run store (nothing
judged): the JSON and Markdown contracts, the self-contained HTML page, bad input."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from report_data import ENV, make_run

FAST_KEYS = ["0", "1.0", "1.2", "1.5", "2.0"]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run")


def _last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.strip()][-1])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("cudal1: error: ")
    return err[0]


def test_json_contract(run, capsys):
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    doc = _last_json(capsys.readouterr().out)
    assert {"summary", "levels", "baselines", "tasks", "techniques", "environment"} <= set(doc)
    s = doc["summary"]
    for key in ("tasks", "ok", "mean", "median", "geomean", "max", "p25", "p75", "fast_p"):
        assert key in s
    assert list(s["fast_p"]) == FAST_KEYS
    # hand-computed (see test_report_data): bests 2.0, none, 1.005, 1.5; level2/2 degenerate apart
    assert (s["tasks"], s["ok"], s["degenerate"]) == (4, 3, 1)
    # the default convention (all-tasks): the unsolved task at 1.0; the solved-only figures beside, labelled
    assert s["conventions"] == "all-tasks" and s["n"] == 4
    assert s["geomean"] == pytest.approx((2.0 * 1.005 * 1.5) ** (1 / 4)) and s["median"] == pytest.approx(1.2525)
    solved = doc["conventions"]["measured"]
    assert solved["geomean"] == pytest.approx((2.0 * 1.005 * 1.5) ** (1 / 3)) and solved["n"] == 3
    assert solved["max"] == 2.0 and solved["p25"] == pytest.approx(1.2525) and solved["p75"] == pytest.approx(1.75)
    # fast_p counts a task only when the best's 95% CI (here speedup x 0.95-1.05) is above p: 1.005x
    # (CI 0.955-1.055) is not faster with confidence; by the point value (KernelBench's) it is
    assert s["fast_p"] == pytest.approx({"0": 0.75, "1.0": 0.5, "1.2": 0.5, "1.5": 0.25, "2.0": 0.0})
    assert s["fast_p_point"] == pytest.approx({"0": 0.75, "1.0": 0.75, "1.2": 0.5, "1.5": 0.25, "2.0": 0.0})
    assert (s["faster"], s["faster_point"]) == (2, 3)
    assert s["statuses"] == {
        "ok": 5, "compile_error": 1, "incorrect": 1, "timeout": 1, "rejected": 1,
    }  # anchors left out
    assert s["flags"]["side_stream"] == 1 and s["flags"]["degenerate_task"] == 1
    assert set(doc["levels"]) == {"level1", "level2", "other"} and doc["levels"]["level1"]["tasks"] == 2
    assert doc["levels"]["level1"]["statuses"] == {"ok": 2, "compile_error": 1, "incorrect": 1, "timeout": 1}
    assert doc["levels"]["level2"]["statuses"] == {"ok": 1, "rejected": 1}  # level2/2 (degenerate) apart
    comp = doc["baselines"]["compile-default"]  # recorded under the old name "compile"
    assert comp["tasks"] == 2 and comp["geomean"] == pytest.approx(((2.0 / 1.6) * (1.005 / 0.9)) ** 0.5)
    tasks = {t["task"]: t for t in doc["tasks"]}
    assert list(tasks) == ["level1/1", "level1/2", "level2/1", "level2/2", "mytask"]
    for t in doc["tasks"]:
        assert {"task", "level", "best_speedup", "best_candidate", "statuses", "techniques"} <= set(t)
    assert tasks["level1/1"]["best_speedup"] == 2.0 and len(tasks["level1/1"]["best_candidate"]) == 64
    assert tasks["level1/1"]["faster"] and not tasks["level1/1"]["uncertain"]
    assert tasks["level2/1"]["uncertain"] and not tasks["level2/1"]["faster"]  # 1.005x, CI 0.955-1.055
    assert tasks["level1/2"]["best_speedup"] is None and tasks["level1/2"]["best_candidate"] is None
    assert tasks["level2/2"]["degenerate"] and tasks["level2/2"]["best_speedup"] is None
    assert tasks["level1/1"]["statuses"] == {"ok": 2, "compile_error": 1}
    assert "algebraic_shortcut" in tasks["level1/1"]["techniques"]  # diag(A) @ B became a broadcast
    tech = doc["techniques"]["torch_compile"]
    assert set(tech) == {"candidates", "verified", "tasks", "median_speedup"}
    assert tech["verified"] == 1 and tech["median_speedup"] == pytest.approx(0.8)
    assert doc["environment"]["gpu_name"] == ENV.gpu_name
    assert doc["rejected"] == [
        {
            "task": "level2/1", "candidate": doc["rejected"][0]["candidate"], "flags": ["side_stream"],
            "message": "candidate work escaped the calling stream",
        }
    ]
    assert doc["degenerate"] == ["level2/2"]
    assert [r["round"] for r in doc["rounds"]] == [0, 1, 2]
    assert doc["rounds"][1]["geomean_best_so_far"] == pytest.approx(
        (1.0 * 1.0 * 1.005 * 1.5) ** 0.25
    )  # 0.8 and none -> 1.0
    assert doc["conventions"]["cuda-l1"]["n"] == 4


def test_json_cuda_l1_conventions(run, capsys):
    assert cli_main(["report", str(run), "--format", "json", "--conventions", "cuda-l1"]) == 0
    s = _last_json(capsys.readouterr().out)["summary"]
    assert s["conventions"] == "cuda-l1" and s["mean"] == pytest.approx((2.0 + 1.0 + 1.0 + 1.5) / 4)


def test_markdown(run, capsys):
    assert cli_main(["report", str(run), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# cudal1 report")
    assert "| group | tasks | ok | mean | median | geomean | max | p25 | p75 | fast_0 | fast_1.0 |" in md
    # all tasks, the unsolved one at 1.0x (the default convention); the solved-only figures beside, labelled
    assert re.search(
        r"\| all \| 4 \| 3 \| 1\.38 \| 1\.25 \| 1\.32 \| 2\.00 \| 1\.00 \| 1\.62 \| 75% \| 50% \| 50% \| 25% \| 0% \|",
        md,
    ), md
    assert "Under the `measured` conventions: n 3, mean 1.50, median 1.50, geomean 1.44" in md
    assert "by the point value alone: 3" in md and "fast_1.0 75%" in md  # KernelBench's fast_p beside ours
    assert "| level2/1 | 1.00x? |" in md and "| level1/1 | 2.00x |" in md  # the CI of 1.005x includes 1.0
    assert "## Rejected candidates" in md and "side_stream" in md
    assert "NVIDIA H200" in md


def test_html_is_self_contained(run, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli_main(["report", str(run), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 4
    for pattern in (
        r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", r"<script", r"<link", r"@import",
        r"url\(\s*['\"]?https?:",
    ):
        assert not re.search(pattern, page, re.I), pattern
    for text in ("Summary", "Against baselines", "Techniques", "level1/1", "side_stream", "NVIDIA H200",
                 "Diff (reference → best)", "We fuse the ops", "degenerate"):
        assert text in page, text
    # the per-task diff shows the rewrite
    assert re.search(r'class="del">-\s+return torch\.diag\(A\) @ B', page)
    assert re.search(r'class="add">\+\s+return A\.unsqueeze\(1\) \* B', page)


def test_bad_input_one_line_exit_2(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "no run at" in _one_line_error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    from cudal1.store import RunStore

    RunStore(empty / "cudal1.sqlite").close()
    assert cli_main(["report", str(empty), "--format", "json"]) == 2
    assert "holds no judged candidate" in _one_line_error(capsys)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    assert cli_main(["report", str(junk), "--format", "md"]) == 2
    assert "cannot read run store" in _one_line_error(capsys)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE x (a)").connection.close()
    assert cli_main(["report", str(other), "--format", "json"]) == 2
    _one_line_error(capsys)
    assert cli_main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "x.jsonl")]) == 2
    _one_line_error(capsys)
    assert cli_main(["compare", str(tmp_path / "missing"), str(junk)]) == 2
    _one_line_error(capsys)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert cli_main(["compare", str(bad), str(bad)]) == 2
    assert "not JSON" in _one_line_error(capsys)
    assert not (tmp_path / "missing").exists()  # reporting never creates a store


def test_export_cuda_l1_records(run, tmp_path, capsys):
    out = tmp_path / "export.jsonl"
    assert cli_main(["export", str(run), "--format", "cuda-l1", "--out", str(out), "--json"]) == 0
    assert _last_json(capsys.readouterr().out) == {"records": 5, "with_code": 3, "out": str(out)}
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    by = {(r["level_id"], r["task_id"]): r for r in recs}
    first = by[(1, 1)]
    assert {"level_id", "task_id", "ref_code", "custom_code", "score_default"} <= set(first)
    assert first["score_default"] == 2.0 and first["score_torch_compile_default"] == pytest.approx(2.0 / 1.6)
    assert "A.unsqueeze(1) * B" in first["custom_code"] and "torch.diag" in first["ref_code"]
    assert by[(1, 2)]["custom_code"] is None and "score_default" not in by[(1, 2)]
    assert by[(2, 2)]["custom_code"] is None  # degenerate: nothing to publish
    mine = by[(None, "mytask")]
    assert mine["task_name"] == "mytask" and mine["score_default"] == 1.5
    # what cudal1 verify reads back: the same tasks (same source, same hash), code and claims
    from cudal1.report.load import load_runs
    from cudal1.report.verify import read_records

    back = read_records(out)
    assert [r.key for r in back] == ["level1/1", "level1/2", "level2/1", "level2/2", "mytask"]
    assert [r.task.hash for r in back] == [t.task.hash for t in load_runs([run]).tasks]
    assert back[0].claimed == 2.0 and back[0].claims["torch_compile_default"] == pytest.approx(1.25)
    assert back[1].code is None and back[4].task.level is None and back[4].task.task_id == "mytask"


def test_compare_run_with_its_export_and_release(run, tmp_path, capsys):
    exported = tmp_path / "export.jsonl"
    assert cli_main(["export", str(run), "--out", str(exported)]) == 0
    capsys.readouterr()
    assert cli_main(["compare", str(run), str(exported), "--json"]) == 0
    doc = _last_json(capsys.readouterr().out)
    assert doc["common"]["tasks"] == 4 and doc["common"]["ties"] == 4  # the export carries the run's own figures
    assert doc["a"]["kind"] == "run" and doc["b"]["kind"] == "release"
    # a "published" file claiming more on one task and less on another
    recs = [json.loads(line) for line in exported.read_text().splitlines()]
    for r in recs:
        if r["task_id"] == 1 and r["level_id"] == 1:
            r["score_default"] = 3.0
        if r["task_id"] == "mytask":
            r["score_default"] = 1.2
    published = tmp_path / "published.jsonl"
    published.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert cli_main(["compare", str(run), str(published), "--json"]) == 0
    doc = _last_json(capsys.readouterr().out)
    rows = {r["task"]: r for r in doc["tasks"]}
    assert rows["level1/1"]["b_over_a"] == pytest.approx(1.5) and rows["mytask"]["b_over_a"] == pytest.approx(0.8)
    assert (doc["common"]["b_wins"], doc["common"]["b_losses"], doc["common"]["ties"]) == (1, 1, 2)
    assert cli_main(["compare", str(run), str(published)]) == 0
    text = capsys.readouterr().out
    assert "level1/1" in text and "B faster on 1" in text
    assert cli_main(["compare", str(run), str(published), "--format", "md"]) == 0
    assert "| task | A x | B x | B / A |" in capsys.readouterr().out


def test_compare_verify_report(tmp_path, capsys):
    report = tmp_path / "verify_report.json"
    report.write_text(json.dumps({"records": [
        {"task": "level1/1", "level": 1, "class": "verified", "status": "ok", "measured": 2.0},
        {"task": "level1/2", "level": 1, "class": "incorrect", "status": "incorrect", "measured": None},
        {"task": "level1/3", "level": 1, "class": "degenerate_task", "status": "ok", "measured": 9.0}]}))
    assert cli_main(["compare", str(report), str(report), "--json"]) == 0
    doc = _last_json(capsys.readouterr().out)
    assert doc["a"]["tasks"] == 2 and doc["a"]["ok"] == 1 and doc["common"]["ties"] == 2


def test_number_format():
    from cudal1.report.markdown import fmt, md_table

    assert [fmt(x) for x in (123.4, 99.96, 1.005, 2.0, 0.955, 0.0001, 3, None)] == \
        ["123", "100", "1.00", "2.00", "0.955", "0.0001", "3", "-"]
    assert fmt(0.75, pct=True) == "75%" and fmt(None, pct=True) == "-"
    assert md_table(["a", "b"], [[1.5, "x|y"]]) == "| a | b |\n|---|---|\n| 1.50 | x\\|y |"


def test_the_analysis_check_line_of_a_candidate():
    from cudal1.report.html import analysis_check

    check = {"present": True, "score": 0.5, "names_best": True, "cites_speedups": False, "reasons": True}
    assert analysis_check({"analysis_check": check}) == ("analysis check: score 0.500; names the best earlier program; "
                                                         "gives reasons")
    assert analysis_check({}) == "" and analysis_check({"analysis_check": {"present": False}}) == ""


def test_one_group_has_one_row_and_one_environment(tmp_path, capsys):
    """A run of one level's tasks: the summary shows the "all" row alone (the level's row would
    repeat it), and verdicts whose isolation details name their own job directories are one
    environment."""
    from report_data import SPEC

    run = make_run(tmp_path / "one", [row for row in SPEC if row[1] == 2])
    assert cli_main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert '<td class="l">all</td>' in page and '<td class="l">level2</td>' not in page
    assert "These runs hold" not in page and "Every verdict (3) was measured in this environment" in page
    assert cli_main(["report", str(run), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "| all |" in md and "| level2 |" not in md
    assert "| isolation: netns | applied: own network namespace, no interface up |" in md
    assert max(len(line) for line in md.splitlines()) < 300  # no environment dumped on one line
    assert cli_main(["report", str(run), "--json"]) == 0
    envs = _last_json(capsys.readouterr().out)["environments"]
    assert len(envs) == 1 and envs[0]["verdicts"] == 3 and envs[0]["gpu_name"] == ENV.gpu_name


def test_the_best_is_the_program_optimize_keeps(tmp_path, capsys):
    """Per task, verified candidates faster with confidence come first, then the highest speedup:
    a confirmed 1.5x beats a 2.2x whose CI includes 1.0, as in optimize's best/."""
    from cudal1.search import reference_candidate
    from cudal1.store import RunStore
    from cudal1.types import Candidate, EvalResult, Status, Task

    task = Task(name="t", source="class Model: pass\n")
    out = tmp_path / "run"
    out.mkdir()
    with RunStore(out / "cudal1.sqlite") as store:
        store.add_task(task)
        for code, speedup, ci in (("anchor", 1.0, (0.9, 1.1)), ("sure", 1.5, (1.3, 1.7)), ("maybe", 2.2, (0.8, 3.2))):
            cand = reference_candidate(task) if code == "anchor" else Candidate(f"# {code}\n", task_hash=task.hash)
            store.add_candidate(cand, task.hash, {"round": 0 if code == "anchor" else 1})
            store.record_evaluation(
                EvalResult(
                    Status.OK, task_hash=task.hash, candidate_hash=cand.hash, speedup=speedup, speedup_ci=ci,
                    environment=ENV,
                )
            )
    assert cli_main(["report", str(out), "--json"]) == 0
    (row,) = _last_json(capsys.readouterr().out)["tasks"]
    assert (row["best_speedup"], row["faster"], row["candidates"]) == (1.5, True, 2)


def test_an_evaluate_run_shows_its_rates_and_pass_at_k(run, capsys):
    from report_data import add_evaluation

    evaluation = add_evaluation(run)
    assert cli_main(["report", str(run), "--json"]) == 0
    (shown,) = _last_json(capsys.readouterr().out)["evaluations"]
    assert shown["pass"] == {k: evaluation[k] for k in ("pass@1", "pass@2", "pass@4")}
    for key in ("compile_rate", "correct_rate", "ok_rate", "fast_p", "fast_p_point", "samples_per_task", "speedup"):
        assert shown[key] == evaluation[key], key
    assert cli_main(["report", str(run), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## Evaluation: " in md and "| pass@1 | pass@2 | pass@4 |" in md


def test_report_labels_are_cudal1_analyzes(run, tmp_path, capsys):
    """The report's technique labels of a task's best are what ``cudal1 analyze BEST --reference
    TASK`` prints; the builtin policy's pass list (which mentions fusion) adds none."""
    from cudal1.report.load import load_runs

    assert cli_main(["report", str(run), "--json"]) == 0
    rows = {t["task"]: t for t in _last_json(capsys.readouterr().out)["tasks"]}
    by_id = {rec.task.task_id: rec for rec in load_runs([run]).tasks}
    for task_id in ("mytask", "level1/1"):  # the builtin's candidate, and a model's (its analysis given too)
        rec = by_id[task_id]
        best = next(c for c in rec.candidates if c.hash == rows[task_id]["best_candidate"])
        (tmp_path / "best.py").write_text(best.source)
        (tmp_path / "ref.py").write_text(rec.task.source)
        (tmp_path / "analysis.txt").write_text(best.analysis)
        args = ["analyze", str(tmp_path / "best.py"), "--reference", str(tmp_path / "ref.py"), "--json"]
        if task_id != "mytask":
            args += ["--analysis", str(tmp_path / "analysis.txt")]
        assert cli_main(args) == 0
        assert rows[task_id]["techniques"] == _last_json(capsys.readouterr().out)["techniques"], task_id
    assert "operation_fusion" not in rows["mytask"]["techniques"]
