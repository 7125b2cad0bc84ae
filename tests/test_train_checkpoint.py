"""CPU tier: saves that load.

* DeepSpeed ZeRO-3 (one process on the CPU: every parameter is already partitioned) trains the
  tiny model two steps; the final model and the intermediate checkpoint reload with plain
  transformers, every tensor at its full shape and equal to the trained value gathered from the
  engine (a ``model.save_pretrained`` of the unwrapped model writes zero-size tensors here).
* The same run with LoRA: the saved model is the base with ``B @ A * alpha / r`` added to exactly
  the adapted weights; the LoRA checkpoint is an adapter the ``hf`` policy merges when it loads it.
* A ZeRO-3 config without 16-bit gathering is refused before training; the ``trl:`` block of the
  training configs reaches TRL's classes, which check it.

FSDP is not here: accelerate turns FSDP on only for accelerator devices, never for a CPU process
group (tests/gpu/test_zero3_save_gpu.py runs it on a GPU).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

from checkpoint_jobs import LORA, check_full_model, check_lora_merge, run_job


@pytest.mark.cpu
def test_zero3_final_and_checkpoint_reload_with_full_trained_tensors(tmp_path):
    summary = run_job("zero3", tmp_path, lora=False, env={"CUDA_VISIBLE_DEVICES": ""})
    assert summary["steps"] == 2 and summary["captured"] > 0
    check_full_model(tmp_path)


@pytest.mark.cpu
def test_zero3_lora_merge_and_adapter_checkpoint(tmp_path):
    summary = run_job("zero3", tmp_path, lora=True, env={"CUDA_VISIBLE_DEVICES": ""})
    assert summary["steps"] == 2
    check_lora_merge(tmp_path, LORA["alpha"] / LORA["r"])

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
    from cudal1.train.grpo import grpo_arguments
    from cudal1.train.sft import sft_arguments

    sft = sft_arguments(load_config("sft", "smoke", {"trl": {"max_grad_norm": 0.25, "lr_scheduler_type": "linear"}}), tmp_path)
    assert sft.max_grad_norm == 0.25 and sft.lr_scheduler_type.value == "linear"  # a default cudal1 picks, overridden
    grpo = grpo_arguments(load_config("grpo", "smoke", {"trl": {"vllm_enable_sleep_mode": True, "mask_truncated_completions": True}}),
                          tmp_path)
    assert grpo.vllm_enable_sleep_mode and grpo.mask_truncated_completions
    with pytest.raises(ConfigError, match="not a field of trl.GRPOConfig"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generashuns": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="num_generations is set by cudal1 itself"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generations": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="trl.GRPOConfig refused"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"generation_batch_size": 16, "steps_per_generation": 2}}), tmp_path)
    with pytest.raises(ConfigError, match="mapping"):
        load_config("grpo", "smoke", {"trl": ["max_grad_norm"]})
