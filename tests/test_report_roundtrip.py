"""CPU tier: a real run end to end through the report layer.  ``optimize`` (builtin policy, CPU
judge) on a user's own task → ``export --format cuda-l1`` → ``verify`` re-judges the exported
file → ``report`` of the verify run (with its audit classes) → ``compare`` of the export with the
verify report.  Also ``optimize --report-to`` without the tracker installed, and the tracker
callback's figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG, cli_env, last_json, run_cli, small_config
from cudal1.cli.main import main as cli_main
from cudal1.releases import Record
from cudal1.report.trackers import TrackerLogger, TrackerUnavailable, check_tracker
from cudal1.report.verify import classify
from cudal1.types import EvalResult, Status

REPO = Path(__file__).resolve().parents[1]
TASK = SMALL_DIAG
SMALL_CONFIG = small_config(timeout_s=120.0)
SLACK = 0.2  # verify --slack: measured >= SLACK x claimed is verified


def cli(args: list, tmp_path: Path) -> subprocess.CompletedProcess:
    return run_cli(args, cli_env(tmp_path / "cache"), tmp_path, timeout=600)


@pytest.mark.cpu
def test_optimize_export_verify_report_compare(tmp_path: Path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_CONFIG)
    run = tmp_path / "run"
    done = cli(["optimize", TASK, "--rounds", "1", "--samples", "1", "--passes", "algebraic", "--config", config,
                "--out", run, "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_json(done.stdout)["tasks"][0]["best_speedup"] > 1.0

    exported = tmp_path / "best.jsonl"
    done = cli(["export", run, "--format", "cuda-l1", "--out", exported], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = [json.loads(line) for line in exported.read_text().splitlines()]
    assert record["level_id"] is None and record["task_id"] == "diag_matmul" and record["ref_code"] == TASK.read_text()
    assert "unsqueeze" in record["custom_code"] and record["score_default"] > 1.0

    verified = tmp_path / "verify"
    done = cli(["verify", exported, "--config", config, "--out", verified, "--slack", str(SLACK), "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    audit = json.loads((verified / "verify_report.json").read_text())
    (row,) = audit["records"]
    assert row["task"] == "diag_matmul" and row["status"] == "ok" and row["measured"] > 1.0
    # Whether a second measurement lands within SLACK of the first depends on the load of both runs,
    # not on the code: the class must be the rule's (test_verify_classes_by_the_slack) for the two
    # recorded figures, and every later step must carry that class.
    assert audit["slack"] == SLACK and row["claimed"] == record["score_default"]
    expected = "verified" if row["measured"] >= SLACK * row["claimed"] else "slower_than_claimed"
    classes = {expected: 1}
    assert row["class"] == expected and last_json(done.stdout)["classes"] == classes

    done = cli(["report", verified, "--format", "json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = last_json(done.stdout)
    assert doc["summary"]["tasks"] == 1 and doc["summary"]["ok"] == 1
    assert doc["tasks"][0]["task"] == "diag_matmul" and doc["audit"]["summary"]["classes"] == classes
    assert "algebraic_shortcut" in doc["tasks"][0]["techniques"]

    done = cli(["compare", exported, verified / "verify_report.json", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cmp = last_json(done.stdout)
    assert cmp["common"]["tasks"] == 1 and cmp["tasks"][0]["a"] == record["score_default"]


def test_verify_classes_by_the_slack():
    """The audit class of an ok re-judging: verified down to SLACK x the claim, slower below it
    (no claim: verified); what the end-to-end test's class is checked against."""
    rec = Record(key="diag_matmul", level=None, task=None, code="class ModelNew: ...", claimed=20.0)

    def ok(measured: float) -> EvalResult:
        return EvalResult(Status.OK, speedup=measured)

    assert classify(rec, ok(20.0 * SLACK), SLACK) == "verified"
    assert classify(rec, ok(20.0 * SLACK - 0.01), SLACK) == "slower_than_claimed"
    assert classify(rec, ok(20.0 * SLACK - 0.01), SLACK / 2) == "verified"  # the slack given is the one used
    assert classify(rec, ok(0.5), SLACK) == "slower_than_claimed"
    assert classify(Record("t", None, None, "code", claimed=None), ok(0.5), SLACK) == "verified"
    assert classify(rec, EvalResult(Status.INCORRECT), SLACK) == "incorrect"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_report_to_missing_tracker_is_one_line_exit_2(tmp_path, capsys):
    rc = cli_main(["optimize", str(TASK), "--report-to", "wandb", "--device", "cpu", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cudal1: error: --report-to wandb needs wandb: pip install wandb"]
    assert not (tmp_path / "o" / "cudal1.sqlite").exists()  # nothing judged
    with pytest.raises(ValueError, match="unknown tracker"):
        check_tracker("neptune")
    assert issubclass(TrackerUnavailable, ImportError)


def test_tracker_logger_figures():
    class Recorder:
        def __init__(self):
            self.logged, self.closed = [], False

        def log(self, metrics, step):
            self.logged.append((step, metrics))

        def close(self):
            self.closed = True

    rec = Recorder()
    logger = TrackerLogger(rec, anchors={"ref-a"})
    logger(EvalResult(Status.OK, task_hash="a", candidate_hash="ref-a", speedup=1.3))  # the reference round
    logger(EvalResult(Status.OK, task_hash="a", speedup=4.0))
    logger(EvalResult(Status.INCORRECT, task_hash="b"))
    logger(EvalResult(Status.OK, task_hash="b", speedup=0.5))  # slower than the reference: counts 1.0
    logger(EvalResult(Status.OK, task_hash="c", speedup=9.0, flags=["degenerate_task"]))  # never a best
    logger.close({"geomean_best_speedup": 2.0})
    assert [s for s, _ in rec.logged] == [1, 2, 3, 4, 5, 5]
    assert rec.logged[0][1]["ok"] == 0 and "speedup" not in rec.logged[0][1]  # not a candidate
    step4 = rec.logged[3][1]
    assert step4["speedup"] == 0.5 and step4["ok"] == 2 and step4["judged"] == 4
    assert step4["geomean_best_so_far"] == pytest.approx(2.0)  # sqrt(4 * 1)
    step5 = rec.logged[4][1]
    assert step5["tasks_with_ok"] == 2 and step5["geomean_best_so_far"] == pytest.approx(4.0 ** (1 / 3))
    assert rec.logged[-1] == (5, {"geomean_best_speedup": 2.0}) and rec.closed


def test_tracker_failure_never_stops_the_search():
    class Broken:
        def log(self, metrics, step):
            raise RuntimeError("tracker down")

        def close(self):
            raise RuntimeError("still down")

    logger = TrackerLogger(Broken())
    logger(EvalResult(Status.OK, task_hash="a", speedup=2.0))
    logger(EvalResult(Status.OK, task_hash="a", speedup=3.0))
    logger.close(None)
    assert logger.judged == 2 and logger.best == {"a": 3.0}
