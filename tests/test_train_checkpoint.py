"""Saves that load, under two processes (gloo) on the CPU, and the checks before training.

* DeepSpeed ZeRO-3 and FSDP2 (``tests/checkpoint_jobs.py``, two ranks under ``torchrun``; FSDP2 on
  a CPU group as accelerate runs it on a GPU group): the tiny model trains four steps, the final
  model reloads with plain transformers, every tensor at its full shape and equal to the trained
  value gathered from the engine (ZeRO-3's last checkpoint too; FSDP2's checkpoints are sharded, for
  ``--resume``).  A second run resumed from the mid-run checkpoint (step 2) trains steps 3 and 4
  only and ends with the same weights as the uninterrupted run, tensor by tensor: the step, the
  optimizer and scheduler state and the data order were restored.
* The same engines with LoRA: the saved model is the base with ``B @ A * alpha / r`` of the
  gathered adapters added to exactly the adapted weights; an intermediate ZeRO-3 LoRA checkpoint
  is an adapter the ``hf`` policy merges when it loads it.
* A ZeRO-3 config without 16-bit gathering is refused before training; the ``trl:`` block of the
  training configs reaches TRL's classes, which check it.

DeepSpeed's CPU communication op is built once per session first (conftest ``deepspeed_cpu_ops``),
outside the jobs' time limits.  The same saves in bf16 on a GPU, in one process:
``tests/gpu/test_zero3_save_gpu.py``.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("trl")

from checkpoint_jobs import LORA, check_full_model, check_lora_merge, check_same_weights, run_job

CPU = {"CUDA_VISIBLE_DEVICES": ""}
ENGINES = ["zero3", "fsdp2"]


@pytest.fixture
def engine_ready(request):
    """The engine's package, and for DeepSpeed its CPU op built (the session fixture)."""
    if request.param == "zero3":
        pytest.importorskip("deepspeed")
        request.getfixturevalue("deepspeed_cpu_ops")
    return request.param


@pytest.mark.cpu
@pytest.mark.parametrize("engine_ready", ENGINES, indirect=True)
def test_two_process_save_reloads_and_a_mid_run_resume_continues_exactly(tmp_path, engine_ready):
    engine = engine_ready
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    summary = run_job(engine, run, lora=False, procs=2, steps=4, save_steps=2, env=CPU)
    assert (summary["world_size"], summary["processes"], summary["steps"]) == (2, 2, 4)
    assert summary["deepspeed" if engine == "zero3" else "fsdp2"]  # the engine really held the parameters
    check_full_model(run, checkpoints=("checkpoint-4",) if engine == "zero3" else ())

    # interrupted after step 2: its later checkpoint and final model never written
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "sft" / "checkpoint-4")
    for name in ("model.safetensors", "config.json"):
        (resumed / "sft" / name).unlink()
    (resumed / "captured.safetensors").unlink()
    again = run_job(engine, resumed, lora=False, procs=2, steps=4, save_steps=2, env=CPU, resume=True)
    assert again["resumed_from"].endswith("checkpoint-2") and again["steps"] == 4 and again["steps_run"] == 2
    assert check_same_weights(run / "captured.safetensors", resumed / "captured.safetensors") == 27
    check_full_model(resumed, checkpoints=())


@pytest.mark.cpu
@pytest.mark.parametrize("engine_ready", ENGINES, indirect=True)
def test_two_process_lora_save_is_the_merged_gathered_adapter(tmp_path, engine_ready):
    summary = run_job(engine_ready, tmp_path, lora=True, procs=2, steps=2, save_steps=1, env=CPU)
    assert summary["world_size"] == 2 and summary["steps"] == 2 and summary["captured"] == 27 + 8  # 4 adapted x (A, B)
    check_lora_merge(tmp_path, LORA["alpha"] / LORA["r"])
    if engine_ready != "zero3":
        return
    # an intermediate LoRA checkpoint is an adapter; the hf policy merges it when it loads it
    from cudal1.policy.hf_policy import HFPolicy
    from cudal1.prompts import build_prompt
    from cudal1.train import smoke
    from cudal1.train.checkpoint import is_adapter_dir

    ckpt = tmp_path / "sft" / "checkpoint-2"
    assert is_adapter_dir(ckpt)
    policy = HFPolicy(model_path=str(ckpt), max_tokens=4, temperature=0.0, device="cpu")
    try:
        [[completion]] = policy.generate([build_prompt(smoke.smoke_task(), [], "CPU")], 1)
    finally:
        policy.close()
    assert not completion.error
    assert not hasattr(policy._model, "peft_config")  # merged into a plain model


def test_zero3_without_16bit_gathering_is_refused_before_training(tmp_path, monkeypatch):
    from cudal1.train.checkpoint import CheckpointError, check_engine

    class Plugin:
        deepspeed_config = {"zero_optimization": {"stage": 3}}

    class State:
        deepspeed_plugin = Plugin()

    class Trainer:
        class accelerator:
            state = State()

    with pytest.raises(CheckpointError, match="zero3_save_16bit_model"):
        check_engine(Trainer())
    Plugin.deepspeed_config = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
    check_engine(Trainer())
    Plugin.deepspeed_config = {"zero_optimization": {"stage": 2}}
    check_engine(Trainer())


def test_trl_block_reaches_trls_classes(tmp_path):
    from cudal1.config import ConfigError
    from cudal1.train.config import load_config
    from cudal1.train.stages.grpo import grpo_arguments
    from cudal1.train.stages.sft import sft_arguments

    sft = sft_arguments(
        load_config("sft", "smoke", {"trl": {"max_grad_norm": 0.25, "lr_scheduler_type": "linear"}}), tmp_path
    )
    assert sft.max_grad_norm == 0.25 and sft.lr_scheduler_type.value == "linear"  # a default cudal1 picks, overridden
    grpo = grpo_arguments(
        load_config("grpo", "smoke", {"trl": {"vllm_enable_sleep_mode": True, "mask_truncated_completions": True}}),
        tmp_path,
    )
    assert grpo.vllm_enable_sleep_mode and grpo.mask_truncated_completions
    with pytest.raises(ConfigError, match="not a field of trl.GRPOConfig"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generashuns": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="num_generations is set by cudal1 itself"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generations": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="trl.GRPOConfig refused"):
        grpo_arguments(
            load_config("grpo", "smoke", {"trl": {"generation_batch_size": 16, "steps_per_generation": 2}}), tmp_path
        )
    with pytest.raises(ConfigError, match="mapping"):
        load_config("grpo", "smoke", {"trl": ["max_grad_norm"]})
