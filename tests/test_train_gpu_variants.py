"""CPU tier: what ``benchmarks/train_gpu.py`` adds for its GPU run, checked without a GPU.

* The CUDA (``load_inline``) and Triton programs of ``benchmarks/train_gpu_programs.py`` parse,
  survive the answer format the tiny model is primed on, and are classified by ``program_kind``;
  the tokenizer's fixed strings and the priming records can include them (the CPU smokes do not).
* ``train_gpu.py``'s helpers: per-kind rollout counts from a run store, the one-line summaries
  ``gpu_checks.sh train`` prints.
* Single-process ``dist.describe()`` and the smoke judge's device plan on the CPU.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cudal1.train import smoke

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def _train_gpu():
    return _load("train_gpu_bench", ROOT / "benchmarks" / "train_gpu.py")


programs = _load("train_gpu_programs", ROOT / "benchmarks" / "train_gpu_programs.py")


def test_gpu_variants_parse_and_are_classified():
    from cudal1.prompts import parse_response

    assert set(programs.GPU_VARIANTS) == {"cuda_row_scale", "triton_row_scale"}
    for name, code in programs.GPU_VARIANTS.items():
        ast.parse(code)
        parsed = parse_response(smoke.short_answer(code))
        assert parsed.code and "class ModelNew" in parsed.code
        assert programs.program_kind(parsed.code) == name.split("_")[0]
    assert (
        "__global__ void row_scale_vec4" in programs.CUDA_ROW_SCALE
        and "C10_CUDA_KERNEL_LAUNCH_CHECK" in programs.CUDA_ROW_SCALE
    )
    assert "@triton.jit" in programs.TRITON_ROW_SCALE
    assert all(programs.program_kind(c) == "pytorch" for c in [*smoke.VARIANTS.values(), *smoke.CHEATS.values()])
    assert programs.program_kind(None) == "none"
    # the CPU smokes' variant set is unchanged
    assert not set(programs.GPU_VARIANTS) & set(smoke.VARIANTS)


def test_priming_can_include_gpu_variants():
    task = smoke.smoke_task()
    answers = {**smoke.VARIANTS, **programs.GPU_VARIANTS}
    records = smoke.priming_records(
        task,
        40,
        answers=answers,
        exemplars={k: (v, (3.0, 5.0)) for k, v in programs.GPU_VARIANTS.items()},
        max_exemplars=2,
    )
    assert {r["variant"] for r in records} & set(programs.GPU_VARIANTS)
    prompts = " ".join(m["content"] for r in records for m in r["messages"] if m["role"] == "user")
    assert "load_inline" in prompts or "triton.jit" in prompts  # GPU programs shown as exemplars too
    fixed = smoke.fixed_strings(records, programs=list(programs.GPU_VARIANTS.values()))
    assert "        return _ext.row_scale(A, B)\n" in fixed
    assert "@triton.jit\n" in fixed
    assert "@triton.jit\n" not in smoke.fixed_strings(records)  # default: as before


def test_rollout_kinds_counts_per_kind_and_status(tmp_path):
    from cudal1.store import RunStore
    from cudal1.types import Candidate

    tg = _train_gpu()
    task = smoke.smoke_task()
    store = RunStore(tmp_path / "cudal1.sqlite")
    try:
        for code in (
            programs.CUDA_ROW_SCALE, programs.TRITON_ROW_SCALE, smoke.VARIANTS["broadcast"],
            programs.CUDA_ROW_SCALE,
        ):
            cand = Candidate(code, task_hash=task.hash, label="grpo")
            store.add_candidate(cand, task.hash, {"round": 1, "policy": "grpo"})
            store.record_response(task.hash, 1, "grpo", {}, "text", "", cand.hash)
        store.record_response(task.hash, 1, "grpo", {}, "no code", "", None, problem="no code block")
        store.record_response(task.hash, 0, "warmup", {}, "no code", "", None, problem="no code block")
    finally:
        store.close()
    kinds = tg.rollout_kinds(tmp_path / "cudal1.sqlite", "nohash")
    assert kinds["cuda"]["rollouts"] == 2 and kinds["cuda"]["distinct"] == 1
    assert kinds["triton"]["rollouts"] == 1 and kinds["pytorch"]["rollouts"] == 1
    assert kinds["none"] == {"rollouts": 1, "distinct": 0, "status": {"format": 1}, "custom_kernel_ok": 0}
    assert kinds["cuda"]["status"] == {"unjudged": 2}  # warm-up responses are not GRPO rollouts


def test_summaries_for_the_gpu_session(tmp_path):
    tg = _train_gpu()
    log = tmp_path / "a.log"
    summary = {
        "out": "x", "steps": 2, "reward_mean": [-1.0, 0.5], "judged": {"ok": 3}, "judge_device": "cuda",
        "judge_gpus": [0],
        "distributed": {
            "world_size": 2,
            "backend": "nccl",
            "ranks": [{"rank": 0, "device": "cuda:0"}, {"rank": 1, "device": "cuda:1"}],
        },
    }
    log.write_text("noise\n{'loss': 1}\n" + json.dumps(summary) + "\n")
    line = tg.summarize_log(log)
    assert "reward_mean -1.000 -> 0.500" in line and "backend=nccl" in line and "'cuda:1'" in line
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert "RuntimeError: boom" in tg.summarize_log(log)
    res = {
        "reward_first_third": -0.5, "reward_last_third": 0.2, "reward_rose": True, "steps": 3,
        "rollouts_per_min": 100.0, "fresh_evaluations_per_min": 10.0, "peak_gpu_memory_gb": 0.2,
        "warmup_s": 40.0,
        "warmup": [{"variant": "cuda_row_scale", "kind": "cuda", "status": "ok"}],
        "rollout_kinds": {"cuda": {"rollouts": 4, "status": {"ok": 4}}},
    }
    (tmp_path / "r.json").write_text(json.dumps(res))
    line = tg.summarize_json(tmp_path / "r.json")
    assert "rose=True" in line and "'cuda_row_scale': 'ok'" in line and "cuda': '4(ok:4)'" in line


def test_describe_and_judge_plan_in_one_process(monkeypatch):
    from cudal1.train import dist
    from cudal1.train.smoke.stages import judge_plan

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    d = dist.describe()
    assert d["world_size"] == 1 and d["backend"] is None and len(d["ranks"]) == 1
    assert judge_plan(smoke.smoke_judge_config("cpu")) == (None, "CPU")


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")
def test_train_gpu_summarize_json_of_a_missing_file_prints_a_line(capsys):
    tg = _train_gpu()
    assert tg.main(["--summarize-json", "/nonexistent/train_gpu.json"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == ["no train_gpu.json"]
