"""benchmarks/builtin_kernelbench.py on the CPU: the selection rules (stride with offset,
exclusions, recorded per task with the task sources), and end to end: the search, a torch.compile
baseline on the same judge, the re-timing of the winner and the best compile mode (``--confirm``),
the store snapshot a later call resumes from, a report recomputed from the run directory, and
the earlier configuration's files kept when the judge's settings change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "builtin_kernelbench.py"
FIXTURES = REPO / "tests" / "fixtures" / "rewrite"
# the fast preset at the CPU corpora's timing (tests/conftest.py, cpu_judge_config): what is asserted is which
# chain won and that every verdict and re-timing was made, not how precisely they were timed
JUDGE = ["--preset", "fast", "--timing-budget", "0.5", "--timing-trials", "20"]


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDAL1_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def test_selection_rules_offsets_and_exclusions(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import builtin_kernelbench as bk

    suite = tmp_path / "suite"
    suite.mkdir()
    for path in sorted(FIXTURES.glob("*.py")):  # seven tasks
        (suite / path.name).write_text(path.read_text())
    every = [t.task_id for t in bk.select([str(suite)], ["all"], set(), None)[0]]
    assert len(every) == 7
    tasks, rules = bk.select([str(suite)], ["stride:3+1"], set(), None)
    assert [t.task_id for t in tasks] == every[1::3]
    (tmp_path / "design.txt").write_text(f"# used to design the passes\n{every[4]}  # a comment\n")
    tasks, rules = bk.select(
        [str(suite)], ["stride:3+1", "stride:2+1"], bk.read_exclusions([str(tmp_path / "design.txt")]), None
    )
    assert [t.task_id for t in tasks] == [every[1], every[3], every[5]]  # union of both rules, minus the excluded
    assert rules[every[1]] == ["stride:3+1", "stride:2+1"] and rules[every[3]] == ["stride:2+1"]
    bk.save_selection(tmp_path, tasks, rules)
    again, again_rules = bk.load_selection(tmp_path)  # the run directory carries the sources: no dataset needed
    assert [(t.task_id, t.hash) for t in again] == [(t.task_id, t.hash) for t in tasks] and again_rules == rules


@pytest.mark.cpu
def test_benchmark_searches_times_modes_confirms_snapshots_and_reports(tmp_path):
    out = tmp_path / "kb"
    modes = "compile-default,compile-max-autotune-no-cudagraphs"
    done = run([str(SMALL_DIAG), "--rounds", "1", "--samples", "1", "--device", "cpu", "--modes", modes,
                "--workers-per-gpu", "1", *JUDGE, "--out", str(out), "--confirm"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] == 1 and report["unfinished"] == [] and report["degenerate"] == []
    row = report["rows"][0]
    # how much faster depends on the machine's load; that the algebraic rewrite won, verified and
    # re-timed, and that the compile baselines were timed by the same judge, does not
    assert row["best_passes"] == "algebraic" and row["best"] > 0
    assert row["mode_status"] == {"compile-default": "ok", "compile-max-autotune-no-cudagraphs": "ok"}
    assert row["mode_source"] == dict.fromkeys(modes.split(","), "baseline")  # one sample: algebraic alone
    assert row["best_confirmed"]["status"] == "ok" and row["mode_confirmed"]["status"] == "ok"
    assert set(json.loads((out / "confirm.json").read_text())) == {f"diag_matmul|{row['best_hash']}",
                                                                     f"diag_matmul|mode:{row['best_mode']}"}
    assert report["over"]["compile-default"]["n"] == 1 and report["per_chain"]["algebraic"]["ok"] == 1
    batches = json.loads((out / "run.json").read_text())["batches"]
    # the max-autotune baseline in the search's batch (--baselines-along); compile-default's after
    # the search (it may have stood in), with the re-timing: one batch
    assert {b["what"] for b in batches} == {"search", "baselines+confirm"} and all(
        "gpu_idle_share" in b for b in batches)
    assert [b.get("along", 0) for b in batches] == [1, 0] and batches[0]["jobs"] == 3  # anchor, candidate, baseline
    assert "baselines and re-timing of 1 task(s) in one batch" in done.stdout
    assert all(0.0 <= b["lanes_unused_share"] <= 1.0 for b in batches)  # each lane's tail included
    assert float(report["cost"]["running_s"]["1"]) > 0  # the verdicts' spans from the store
    # the cost: every batch stamped with its call, GPUs and levers; the call's finished task counted
    assert {(b["call"], b["gpus"], b["levers"]) for b in batches} == {(batches[0]["call"], 1, "on")}
    assert [c["finished"] for c in report["cost"]["calls"]] == [1] and report["cost"]["tasks"] == 1
    assert report["cost"]["per_task"]["diag_matmul"]["baselines"]["verdicts"] == 2
    assert report["cost"]["per_task"]["diag_matmul"]["confirm"]["verdicts"] == 2  # re-timings carry their phases
    assert report["losses"] == [] or report["losses"][0]["reason"] in ("host", "slower", "no_pass")
    assert "cost, lease-held seconds per task" in done.stdout and "Where a compile mode beat" in done.stdout
    text = (out / "report.md").read_text()
    assert (
        "builtin over the best compile mode" in text
        and text == done.stdout[done.stdout.index(text.splitlines()[0]) :].rstrip() + "\n"
    )
    headers = [line.split()[0] for line in text.splitlines() if line.startswith(("task ", "chain ", "figure "))]
    assert headers == ["task", "chain", "figure"]  # per task first, the summary table last
    assert "diag_matmul" in (out / "report.html").read_text()
    # the gzipped store is the run: without the plain file, a report-only call restores and reads it
    (out / "cudal1.sqlite").unlink()
    assert (out / "rewrites.tgz").exists() and (out / "cudal1.sqlite.gz").exists()
    again = run([str(SMALL_DIAG), "--device", "cpu", "--modes", modes, *JUDGE, "--out", str(out),
                 "--report-only"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["rows"] == report["rows"]
    # the staged code resumes what the joined batch left: here, both re-timings once more
    (out / "confirm.json").unlink()
    staged = run([str(SMALL_DIAG), "--rounds", "1", "--samples", "1", "--device", "cpu", "--modes", modes,
                  "--workers-per-gpu", "1", *JUDGE, "--out", str(out), "--confirm", "--finish", "staged"],
                 tmp_path)
    assert staged.returncode == 0, staged.stderr[-3000:]
    assert "confirming 1 winner(s) and re-timing 1 best compile mode(s)" in staged.stdout
    assert set(json.loads((out / "confirm.json").read_text())) == {f"diag_matmul|{row['best_hash']}",
                                                                     f"diag_matmul|mode:{row['best_mode']}"}
    assert json.loads((out / "run.json").read_text())["batches"][-1]["what"] == "confirm"


@pytest.mark.cpu
def test_a_run_without_the_anchor_finishes_its_tasks_on_their_candidates_alone(tmp_path):
    """``--no-anchor``: the search judges no reference as itself (one job per task fewer), and the
    task still finishes and enters the figures."""
    import sqlite3

    from cudal1.tasks import load_task_file
    from cudal1.types import reference_candidate

    out = tmp_path / "kb"
    done = run([str(SMALL_DIAG), "--rounds", "1", "--samples", "1", "--device", "cpu", "--modes", "none",
                "--workers-per-gpu", "1", *JUDGE, "--out", str(out), "--no-anchor"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] == 1 and report["unfinished"] == []
    assert report["rows"][0]["best_passes"] == "algebraic" and report["rows"][0]["judged"]
    with sqlite3.connect(out / "cudal1.sqlite") as db:
        judged = {h for (h,) in db.execute("select candidate_hash from evaluations")}
    assert len(judged) == 1 and reference_candidate(load_task_file(SMALL_DIAG)).hash not in judged


def test_another_judge_config_keeps_the_earlier_configurations_files_beside_the_new_ones(tmp_path, monkeypatch,
                                                                                       capsys):
    """Resumed with another timing budget, the judge's config hash changes, so the run judges
    afresh under it (verdicts are keyed by that hash), and the earlier configuration's files are
    kept as NAME.1.EXT beside the new ones, not mixed in."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import builtin_kernelbench as bk
    from cudal1.config import EvalConfig, write_config_file

    first = EvalConfig.preset("fast").replace(device="cpu")
    write_config_file(tmp_path, judge=first)
    for name in bk.PER_CONFIG:
        (tmp_path / name).write_text(json.dumps(name))
    bk.keep_earlier_config(tmp_path, first, False)  # the same judge: nothing moves
    cheaper = first.replace(timing_budget_s=0.5, timing_trials=20)
    assert cheaper.hash() != first.hash()
    bk.keep_earlier_config(tmp_path, cheaper, True)  # a report-only call never moves them
    assert not (tmp_path / "config.1.yaml").exists() and capsys.readouterr().out == ""
    bk.keep_earlier_config(tmp_path, cheaper, False)
    assert "judge.timing_budget_s: 1.5 -> 0.5" in capsys.readouterr().out
    assert "timing_budget_s: 1.5" in (tmp_path / "config.1.yaml").read_text()
    for name in bk.PER_CONFIG:
        assert not (tmp_path / name).exists() and json.loads((tmp_path / bk._numbered(name, 1)).read_text()) == name
    write_config_file(tmp_path, judge=cheaper)  # the new configuration's run, then a third one
    bk.keep_earlier_config(tmp_path, first, False)
    assert "timing_budget_s: 0.5" in (tmp_path / "config.2.yaml").read_text()


def _guarded_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The script's module with its judging stubbed out (``judged`` gets one entry per call that
    reaches the search), a one-task suite and a run folder: for the checks ``main`` makes before
    judging."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import builtin_kernelbench as bk

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / SMALL_DIAG.name).write_text(SMALL_DIAG.read_text())
    judged: list = []
    monkeypatch.setattr(bk, "search", lambda *a, **k: judged.append(a))
    monkeypatch.setattr(bk, "report", lambda *a, **k: None)
    monkeypatch.setattr(bk, "_finished", lambda *a, **k: 0)
    monkeypatch.setattr(bk, "_gpus", lambda args: 1)
    monkeypatch.setattr(bk.faulthandler, "dump_traceback_later", lambda *a, **k: None)  # pytest's stderr has no fileno
    return bk, suite, tmp_path / "run", judged


def test_a_run_judged_on_one_gpu_is_not_resumed_on_another_unless_asked(tmp_path, monkeypatch, capsys):
    """A resumed call on a GPU other than the one the run's verdicts name stops at once with one
    line (rc 2) before judging anything: it would judge every verdict again on this GPU, and a
    lent machine of the wrong kind costs its whole call otherwise.  ``--other-gpu`` goes on."""
    import sqlite3

    bk, suite, out, judged = _guarded_main(tmp_path, monkeypatch)
    assert bk.judged_gpus(out) == set()  # nothing judged yet: any GPU starts it
    out.mkdir()
    with sqlite3.connect(out / bk.STORE) as db:
        db.execute("CREATE TABLE environments (key TEXT PRIMARY KEY, json TEXT)")
        db.executemany("INSERT INTO environments VALUES (?, ?)",
                       [("a", json.dumps({"gpu_name": "NVIDIA H200"})),
                        ("b", json.dumps({"device": "cpu", "gpu_name": None}))])
    db.close()
    assert bk.judged_gpus(out) == {"NVIDIA H200"}
    monkeypatch.setattr(bk, "this_gpu", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(sys, "argv", ["builtin_kernelbench.py", str(suite), "--out", str(out), "--modes", "none"])
    assert bk.main() == 2 and judged == []
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {out} was judged on NVIDIA H200, this machine has NVIDIA H100 80GB HBM3: resume it there, "
                   "or pass --other-gpu to judge the run again here"]
    monkeypatch.setattr(bk, "this_gpu", lambda: "NVIDIA H200")
    assert bk.main() == 0 and len(judged) == 1  # the same GPU: it goes on
    monkeypatch.setattr(bk, "this_gpu", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--other-gpu"])
    assert bk.main() == 0 and len(judged) == 2


def test_a_sample_too_large_for_the_gpu_stops_before_judging(tmp_path, monkeypatch, capsys):
    """``--min-gpu-gib``: on a card with less memory a call stops at once with one line (rc 2),
    ``--other-gpu`` or not, before judging anything (the stride-5 sample's level1/38 and level1/63
    ran out of memory alone on an 80 GB H100); a card with enough goes on, and a report judges nothing."""
    bk, suite, out, judged = _guarded_main(tmp_path, monkeypatch)
    monkeypatch.setattr(bk, "this_gpu", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(bk, "this_gpu_gib", lambda: 79.18)
    argv = ["builtin_kernelbench.py", str(suite), "--out", str(out), "--modes", "none", "--device", "cuda",
            "--min-gpu-gib", "100"]
    for extra in ([], ["--other-gpu"]):
        monkeypatch.setattr(sys, "argv", argv + extra)
        assert bk.main() == 2 and judged == []
        assert capsys.readouterr().err.strip().splitlines() == [
            "error: this sample needs a GPU of at least 100 GiB (--min-gpu-gib), this machine's NVIDIA H100 80GB "
            "HBM3 has 79.2 GiB: its largest tasks would end out of memory"]
    monkeypatch.setattr(bk, "this_gpu_gib", lambda: None)  # no GPU at all: the same stop
    monkeypatch.setattr(bk, "this_gpu", lambda: None)
    monkeypatch.setattr(sys, "argv", argv)
    assert bk.main() == 2 and judged == [] and "this machine's no GPU has 0.0 GiB" in capsys.readouterr().err
    monkeypatch.setattr(bk, "this_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(bk, "this_gpu_gib", lambda: 139.8)
    assert bk.main() == 0 and len(judged) == 1


def test_a_call_cut_while_it_writes_the_report_still_packs_every_verdict(tmp_path, monkeypatch, capsys):
    """``--pack`` writes the state before the report and again after it: SIGINT (the call's
    timeout) during the report ends the call with one line and rc 130, and the archive already
    holds the run's store and run record, whole; a call that ends normally packs its report too."""
    import tarfile

    bk, suite, out, judged = _guarded_main(tmp_path, monkeypatch)
    archive = tmp_path / "out" / "state.tgz"
    monkeypatch.setattr(bk, "this_gpu", lambda: None)

    def cut_report(out, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(bk, "report", cut_report)
    monkeypatch.setattr(sys, "argv", ["builtin_kernelbench.py", str(suite), "--out", str(out), "--modes", "none",
                                      "--pack", str(archive)])
    assert bk.main() == 130 and len(judged) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == ("cut short while writing the report: the verdicts are kept (and packed); --report-only "
                         "writes it")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"tasks.jsonl", "run.json"} <= names and "report.md" not in names
    assert not archive.with_name("state.tgz.partial").exists()

    def full_report(out, *a, **k):
        (out / "report.md").write_text("report")

    monkeypatch.setattr(bk, "report", full_report)
    assert bk.main() == 0
    with tarfile.open(archive) as tar:
        assert "report.md" in tar.getnames() and tar.extractfile("report.md").read() == b"report"
