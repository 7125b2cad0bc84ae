"""benchmarks/baseline_choices.py: reading Inductor's autotuning cache (kept choice, best extern and
Triton times), the table, each rule's batches and lease with the judge stood in (a compile on the
CPU costs ~20 s and no lease applies there), and a bad rule."""

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
    (cache / "9f8e").write_text(json.dumps({"cache": {"bmm": {"[(8, 64, 64)]": {"highest": {  # torch 2.11's layout
        "aten_bmm-": 0.011, "triton_bmm-x": 0.013}}}}}))
    ops = {o["op"]: o for o in baseline_choices.autotuned_choices(tmp_path / "inductor")}
    conv = ops["convolution"]
    assert conv["kept"] == "triton_convolution2d-abc" and conv["kept_ms"] == 0.032
    assert conv["extern_ms"] == 0.041 and conv["template_ms"] == 0.032
    assert "triton_convolution2d-bad" not in conv["times"]  # a failed choice is not a time
    assert ops["mm"]["template_ms"] is None and ops["mm"]["extern_ms"] == 0.020
    assert ops["bmm"]["kept"] == "aten_bmm-" and ops["bmm"]["inputs"] == "[(8, 64, 64)]"
    assert ops["bmm"]["precision"] == "highest"
    assert baseline_choices.autotuned_choices(tmp_path / "absent") == []
    row = {"rule": "choosers", "rep": 0, "task": "conv", "speedup": 0.126, "status": "ok", "exclusive_s": 5.0,
           "choices": [conv]}
    line = baseline_choices.table([row])[1]
    assert "0.126" in line and "triton_convolution2d-abc" in line and "0.041 / 0.032" in line


def test_each_rule_judges_its_batches_under_its_lease_and_reads_each_tasks_own_cache(tmp_path, monkeypatch):
    import cudal1.harness as harness
    from cudal1.harness.build import baseline_dir
    from cudal1.types import EvalResult, Status, Task

    tasks = [Task(name=n, source=f"# {n}\nclass Model: pass\n") for n in ("conv", "gemm")]
    mode = "compile-max-autotune-no-cudagraphs"
    batches = []

    def judged(batch, modes, config, plan=None):  # stands in for the judge: one verdict per job, a cache per task
        batches.append(([t.name for t in batch], config.baseline_lease, config.baseline_cache, config.workers_per_gpu))
        for t in batch:
            cache = baseline_dir(Path(config.cache_dir), t.source, plan.arch_list) / "inductor" / "cache"
            cache.mkdir(parents=True)
            (cache / "h").write_text(json.dumps({t.name: {"k": {"p": {f"aten_{t.name}": 0.04, "triton_x": 0.03}}}}))
        return {(t.hash, m): EvalResult(status=Status.OK, speedup=0.5, figures={"exclusive_before_timing_s": 1.5})
                for t in batch for m in modes}

    monkeypatch.setattr(harness, "measure_baselines", judged)
    alone = baseline_choices.run_rule("alone", tasks, [mode], 2, tmp_path / "a", 0.5, 30, device="cpu")
    together = baseline_choices.run_rule("exclusive", tasks, [mode], 2, tmp_path / "b", 0.5, 30, device="cpu")
    assert batches == [(["conv"], "choosers", True, 2), (["gemm"], "choosers", True, 2),
                       (["conv", "gemm"], "exclusive", True, 2)]
    for rows in (alone, together):
        assert [(r["task"], r["mode"], r["speedup"], r["exclusive_s"]) for r in rows] == [
            ("conv", mode, 0.5, 1.5), ("gemm", mode, 0.5, 1.5)]
        assert [[o["op"] for o in r["choices"]] for r in rows] == [["conv"], ["gemm"]]  # each task's own cache
        assert all(r["choices"][0]["kept"] == "triton_x" for r in rows)


def test_a_jobs_neighbours_are_counted_only_while_it_compiles_or_checks(tmp_path):
    own = [("setup", 0.0, 1.0), ("compile", 1.0, 3.0), ("correctness", 3.0, 4.0), ("timing", 4.0, 9.0)]
    other = [("import", 0.0, 2.0), ("compile_cpu", 2.0, 3.5), ("timing", 3.5, 9.0)]
    assert baseline_choices.beside(own, [other]) == {"import": 1.0, "compile_cpu": 1.5, "timing": 0.5}
    assert baseline_choices.beside(own, []) == {}
    row = {"rule": "choosers", "rep": 0, "task": "conv", "speedup": 0.5, "status": "ok", "exclusive_s": 1.0,
           "choices": [], "beside": {"timing": 0.5, "compile_cpu": 1.5}}
    assert baseline_choices.table([row])[2].endswith("compile_cpu 1.50s, timing 0.50s")


def test_timelines_are_recorded_by_task_hash_and_mode_and_the_runner_is_restored():
    from types import SimpleNamespace

    from cudal1.harness.parent.evaluator import Evaluator

    original = Evaluator._run
    outcome = SimpleNamespace(timeline=[("compile", 1.0, 2.0)])
    try:
        Evaluator._run = lambda self, job, *a, **k: outcome  # the job runner stood in
        stood_in = Evaluator._run
        with baseline_choices.recording_timelines() as timelines:
            task = SimpleNamespace(name="conv", hash="c0")
            assert Evaluator._run(None, SimpleNamespace(task=task, baseline_mode="compile-default")) is outcome
            Evaluator._run(None, SimpleNamespace(task=task, baseline_mode=None))  # a candidate: not a baseline
        assert timelines == {("c0", "compile-default"): [("compile", 1.0, 2.0)]}
        assert Evaluator._run is stood_in
    finally:
        Evaluator._run = original


@pytest.mark.cpu
def test_an_unknown_rule_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(SCRIPT), str(SMALL_DIAG), "--rules", "exclusive,loose"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == (
        "baseline_choices: unknown rule(s) loose (known: exclusive, choosers, alone)")
