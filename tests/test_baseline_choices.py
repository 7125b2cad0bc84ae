"""benchmarks/baseline_choices.py: reading Inductor's autotuning cache (kept choice, best extern and
Triton times), the table, one repetition through the real subprocess harness on the CPU, and a bad
rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG  # the bundled task at an eighth of its work

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "baseline_choices.py"
sys.path.insert(0, str(REPO / "benchmarks"))

import baseline_choices  # noqa: E402


def test_the_autotuning_cache_gives_each_operations_kept_choice_and_best_times(tmp_path):
    cache = tmp_path / "inductor" / "cache"
    cache.mkdir(parents=True)
    (cache / "0a1b").write_text(json.dumps({
        "convolution": {"[(16, 32, 64, 64)]": {"highest": {
            "aten_convolution-stride=(1, 1)": 0.041, "triton_convolution2d-abc": 0.032,
            "triton_convolution2d-def": 0.290, "triton_convolution2d-bad": float("inf")}}},
        "mm": {"[(2048, 1024)]": {"highest": {"aten_mm-": 0.020}}},
    }))
    (cache / "not-json").write_text("{")
    ops = {o["op"]: o for o in baseline_choices.autotuned_choices(tmp_path / "inductor")}
    conv = ops["convolution"]
    assert conv["kept"] == "triton_convolution2d-abc" and conv["kept_ms"] == 0.032
    assert conv["extern_ms"] == 0.041 and conv["template_ms"] == 0.032
    assert "triton_convolution2d-bad" not in conv["times"]  # a failed choice is not a time
    assert ops["mm"]["template_ms"] is None and ops["mm"]["extern_ms"] == 0.020
    assert baseline_choices.autotuned_choices(tmp_path / "absent") == []
    row = {"rule": "choosers", "rep": 0, "task": "conv", "speedup": 0.126, "status": "ok", "exclusive_s": 5.0,
           "choices": [conv]}
    line = baseline_choices.table([row])[1]
    assert "0.126" in line and "triton_convolution2d-abc" in line and "0.041 / 0.032" in line


@pytest.mark.cpu
def test_a_repetition_judges_each_rules_baselines_and_reads_their_caches(tmp_path):
    out = tmp_path / "choices.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(SMALL_DIAG), "--device", "cpu", "--modes",
                           "compile-default", "--rules", "exclusive,alone", "--reps", "1", "--workers-per-gpu", "1",
                           "--timing-budget", "0.3", "--timing-trials", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["rule"], r["rep"], r["mode"], r["status"]) for r in rows] == [
        ("exclusive", 0, "compile-default", "ok"), ("alone", 0, "compile-default", "ok")], json.dumps(rows)[-3000:]
    assert all(r["choices"] == [] for r in rows)  # compile-default autotunes nothing
    assert "no autotuned operation" in done.stdout


@pytest.mark.cpu
def test_an_unknown_rule_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(SCRIPT), str(SMALL_DIAG), "--rules", "exclusive,loose"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == (
        "baseline_choices: unknown rule(s) loose (known: exclusive, choosers, alone)")
